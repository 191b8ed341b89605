//! Idle connections: the client closes one before the far end forgets it.
//!
//! The far end here is a stand-in, not a broker: a balancer (or NAT) that drops a connection idle
//! past its timeout without telling either side, and resets it when a request comes. A broker
//! closes an idle connection with a FIN, which the client's pool notices while the connection is
//! idle; what fails a call is the connection forgotten silently, or closed just as the call goes out.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use queen_client::{Client, RetryPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// How long the stand-in keeps an idle connection.
const FAR_END_IDLE: Duration = Duration::from_secs(1);

/// A far end answering `/health`, which forgets a connection idle for [`FAR_END_IDLE`]: the next
/// request on it is answered with a reset. Its URL, and how many connections it has accepted.
async fn forgetful_far_end() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("an address"));
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(stream));
        }
    });
    (url, accepted)
}

async fn serve(mut stream: TcpStream) {
    let mut last_answer: Option<Instant> = None;
    let mut head = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let Ok(read) = stream.read(&mut buffer).await else { return };
        if read == 0 {
            return;
        }
        head.extend_from_slice(&buffer[..read]);
        if !head.windows(4).any(|w| w == b"\r\n\r\n") {
            continue;
        }
        head.clear();
        if last_answer.is_some_and(|at| at.elapsed() >= FAR_END_IDLE) {
            // Forgotten: a reset, as from a balancer that no longer knows the connection.
            let _ = stream.set_zero_linger();
            return;
        }
        let body = r#"{"status":"healthy","database":"connected","version":"stand-in"}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        last_answer = Some(Instant::now());
    }
}

fn client(url: &str, idle: Option<Duration>) -> Client {
    let builder = Client::builder().url(url).retry_policy(RetryPolicy::default().with_max_attempts(1));
    let builder = match idle {
        Some(idle) => builder.idle_timeout(idle),
        None => builder,
    };
    builder.build().expect("a client")
}

#[tokio::test]
async fn a_connection_idle_past_the_clients_idle_timeout_is_not_reused() {
    let (url, accepted) = forgetful_far_end().await;
    let client = client(&url, Some(Duration::from_millis(300)));
    client.health().await.expect("the first call");
    // Idle past the client's timeout, and past the far end's.
    tokio::time::sleep(FAR_END_IDLE + Duration::from_millis(500)).await;
    let health = client.health().await.expect("the call after the idle time, on a new connection");
    assert_eq!(health.status, "healthy");
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "the idle connection was closed, not reused");
}

#[tokio::test]
async fn a_connection_kept_past_the_far_ends_idle_timeout_fails_the_call_that_reuses_it() {
    // What the idle timeout is for: kept longer than the far end keeps it (the default, 30 s, is
    // longer than this stand-in's 1 s), the connection is reused, and the call on it fails.
    let (url, accepted) = forgetful_far_end().await;
    let client = client(&url, None);
    client.health().await.expect("the first call");
    tokio::time::sleep(FAR_END_IDLE + Duration::from_millis(500)).await;
    assert!(client.health().await.is_err(), "a call on a forgotten connection fails");
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "the forgotten connection was reused");
}
