//! A broker per test, in-process on a database of its own, and what the tests share.

use std::future::Future;
use std::time::Duration;

use queen_broker::config::Config;
use queen_client::{Client, Pop, RetryPolicy};
use queen_testkit::TestDatabase;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// How long a condition may take to come true before a test fails.
pub const DEADLINE: Duration = Duration::from_secs(15);

/// A broker running on this test's thread, on a fresh database.
pub struct TestBroker {
    pub url: String,
    pub db: TestDatabase,
}

fn test_label() -> String {
    std::thread::current().name().unwrap_or("client").rsplit("::").next().unwrap_or("client").to_owned()
}

impl TestBroker {
    pub async fn start() -> TestBroker {
        Self::start_with(|_| {}).await
    }

    /// A broker whose configuration `tweak` adjusts first.
    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> TestBroker {
        let db = TestDatabase::create(&format!("client_{}", test_label())).await;
        let url = serve(&db, tweak).await;
        TestBroker { url, db }
    }

    /// Another broker on this one's database (a fleet of two); its URL.
    pub async fn another(&self, tweak: impl FnOnce(&mut Config)) -> String {
        serve(&self.db, tweak).await
    }

    /// A client of this broker, with retries that keep the tests fast.
    pub fn client(&self) -> Client {
        client_of(&[&self.url])
    }
}

/// Starts a broker on `db`; its URL.
pub async fn serve(db: &TestDatabase, tweak: impl FnOnce(&mut Config)) -> String {
    queen_testkit::in_process::serve(db, tweak).await
}

/// A client of `urls` (in failover order) whose retries wait little.
pub fn client_of(urls: &[&str]) -> Client {
    Client::builder()
        .urls(urls.iter().copied())
        .timeout(Duration::from_secs(20))
        .retry_policy(RetryPolicy::default().with_backoff(Duration::from_millis(50), Duration::from_secs(2)))
        .build()
        .expect("a client")
}

/// A URL nothing listens on: connections to it are refused.
pub async fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("an address"));
    drop(listener);
    url
}

/// Waits until `check` holds, polling; fails the test after [`DEADLINE`].
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + DEADLINE;
    while !check().await {
        assert!(Instant::now() < deadline, "gave up waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An empty, non-waiting pop answers nothing.
pub async fn nothing_left(client: &Client, pop: Pop) -> bool {
    client.pop(&pop.no_wait()).await.expect("a pop").is_empty()
}

/// A TCP forwarder in front of a broker: a stand-in for the broker that can die. Stopping it
/// closes its port (new connections are refused) and resets the connections it carries.
pub struct Proxy {
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
        Self::serve(listener, target, forward)
    }

    /// A forwarder on a given port (one a killed proxy had: the broker "comes back").
    pub async fn start_on(port: &str, target: &str) -> Proxy {
        let deadline = Instant::now() + DEADLINE;
        loop {
            match TcpListener::bind(format!("127.0.0.1:{port}")).await {
                Ok(listener) => return Self::serve(listener, target, forward),
                Err(e) => assert!(Instant::now() < deadline, "cannot bind port {port} again: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A forwarder that loses every answer: the request reaches the broker, which acts on it,
    /// and the connection is closed as the answer starts coming back.
    pub async fn losing_answers(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
        Self::serve(listener, target, lose_the_answer)
    }

    /// Accepts connections on `listener`, each relayed to `target` by `relay`.
    fn serve<Relay, Relayed>(listener: TcpListener, target: &str, relay: Relay) -> Proxy
    where
        Relay: Fn(TcpStream, TcpStream) -> Relayed + Copy + Send + 'static,
        Relayed: Future<Output = ()> + Send + 'static,
    {
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        let target = target.trim_start_matches("http://").to_owned();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                let target = target.clone();
                connections.spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(&target).await {
                        relay(inbound, outbound).await;
                    }
                });
            }
        });
        Proxy { url, task }
    }

    /// The broker behind it "dies": the port closes, open connections are cut.
    pub async fn kill(&mut self) {
        self.task.abort();
        // Cancelled once awaited: the listener and every connection are closed by then.
        let _ = (&mut self.task).await;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Both ways, as they come.
async fn forward(mut client: TcpStream, mut broker: TcpStream) {
    let _ = tokio::io::copy_bidirectional(&mut client, &mut broker).await;
}

/// The request to the broker, and nothing back: the first byte of the answer says the broker has
/// acted, and the client's connection is then closed.
async fn lose_the_answer(client: TcpStream, broker: TcpStream) {
    use tokio::io::AsyncReadExt;
    let (mut from_client, _to_client) = client.into_split();
    let (mut from_broker, mut to_broker) = broker.into_split();
    let forwarding = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_client, &mut to_broker).await;
    });
    let _ = from_broker.read(&mut [0; 1]).await;
    // Both halves of the client's connection dropped: it is closed.
    forwarding.abort();
    let _ = forwarding.await;
}
