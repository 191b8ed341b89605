//! Slow and oversized clients against a real broker, spoken to over raw TCP: a head or a body
//! trickled a byte at a time, bodies and heads past the limits, a thousand idle connections, and
//! more slow clients than there are workers. None of them may keep the broker from serving
//! everyone else, and each is cut off within its configured bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use queen_testkit::{BrokerProcess, TestDatabase};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::task::JoinHandle;

use crate::support::queen_binary;

/// The head and body timeouts most of these brokers run with.
const HEAD_TIMEOUT: Duration = Duration::from_millis(2000);
const BODY_TIMEOUT: Duration = Duration::from_millis(2000);
/// How late past its bound the broker may cut a slow client off: two busy cores run the broker,
/// PostgreSQL and the test.
const SLACK: Duration = Duration::from_millis(2500);
/// How long a normal request may take while the broker is beset (it is served, not timed).
const SERVED_WITHIN: Duration = Duration::from_secs(5);
/// The pause between trickled bytes.
const TRICKLE: Duration = Duration::from_millis(200);
const MAX_BODY_BYTES: usize = 64 * 1024;
/// How early actix may time a head out: it reckons the deadline from a clock it updates every
/// 500 ms, so a head timeout can fire up to that much (and a little more on a busy worker) before
/// its full length has passed.
const ACTIX_CLOCK: Duration = Duration::from_millis(750);

fn millis(duration: Duration) -> String {
    duration.as_millis().to_string()
}

/// A broker with two workers, `MAX_BODY_BYTES` and the given head and body timeouts, and `extra`
/// settings.
async fn broker(label: &str, head: Duration, body: Duration, extra: &[(&str, &str)]) -> (TestDatabase, BrokerProcess) {
    let db = TestDatabase::create(label).await;
    let (head, body, max_body) = (millis(head), millis(body), MAX_BODY_BYTES.to_string());
    let mut settings = vec![
        ("QUEEN_HTTP__WORKERS", "2"),
        ("QUEEN_HTTP__REQUEST_HEAD_TIMEOUT_MS", head.as_str()),
        ("QUEEN_HTTP__REQUEST_BODY_TIMEOUT_MS", body.as_str()),
        ("QUEEN_HTTP__MAX_BODY_BYTES", max_body.as_str()),
    ];
    settings.retain(|(key, _)| !extra.iter().any(|(k, _)| k == key));
    settings.extend_from_slice(extra);
    let broker = BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &settings).await;
    (db, broker)
}

/// What a raw client saw of the broker's answer.
#[derive(Debug)]
struct Answer {
    /// The status of the answer, if one came.
    status: Option<u16>,
    head: String,
    body: Vec<u8>,
    /// When the first byte of the answer came.
    answered: Option<Instant>,
    /// When the broker closed the connection (end of stream or reset), if it did in time.
    closed: Option<Instant>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

/// Reads what the broker sends until it closes the connection, at most until `until`. With
/// `whole_answer`, stops as soon as one complete answer (head and `Content-Length` body) is in,
/// without waiting for the close.
async fn read_answer(reader: &mut OwnedReadHalf, until: Instant, whole_answer: bool) -> Answer {
    let mut bytes = Vec::new();
    let (mut answered, mut closed) = (None, None);
    let mut buf = [0u8; 16 * 1024];
    loop {
        if whole_answer && complete(&bytes) {
            break;
        }
        match tokio::time::timeout_at(until.into(), reader.read(&mut buf)).await {
            Err(_) => break,
            Ok(Ok(0) | Err(_)) => {
                closed = Some(Instant::now());
                break;
            }
            Ok(Ok(n)) => {
                answered.get_or_insert_with(Instant::now);
                bytes.extend_from_slice(&buf[..n]);
            }
        }
    }
    let split = bytes.windows(4).position(|w| w == b"\r\n\r\n");
    let (head, body) = match split {
        Some(at) => (String::from_utf8_lossy(&bytes[..at]).into_owned(), bytes[at + 4..].to_vec()),
        None => (String::from_utf8_lossy(&bytes).into_owned(), Vec::new()),
    };
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok());
    Answer { status, head, body, answered, closed }
}

/// Whether `bytes` hold a whole answer: its head, and as much body as its `Content-Length` says.
fn complete(bytes: &[u8]) -> bool {
    let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else { return false };
    let head = String::from_utf8_lossy(&bytes[..at]).to_ascii_lowercase();
    let length = head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok());
    length.is_some_and(|length: usize| bytes.len() >= at + 4 + length)
}

async fn connect(broker: &BrokerProcess) -> (OwnedReadHalf, OwnedWriteHalf) {
    TcpStream::connect(("127.0.0.1", broker.port())).await.expect("a connection to the broker").into_split()
}

/// A client writing `bytes` one at a time, `TRICKLE` apart, until they run out or the broker
/// stops taking them, then holding the connection open: the broker is the one to close it.
struct Trickle {
    task: JoinHandle<()>,
    sent: Arc<AtomicUsize>,
}

impl Trickle {
    fn start(mut writer: OwnedWriteHalf, bytes: Vec<u8>) -> Trickle {
        let sent = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&sent);
        let task = tokio::spawn(async move {
            for byte in bytes {
                if writer.write_all(&[byte]).await.is_err() {
                    break;
                }
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(TRICKLE).await;
            }
            std::future::pending::<()>().await;
        });
        Trickle { task, sent }
    }

    /// How many bytes the broker has taken so far.
    fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }
}

impl Drop for Trickle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A request head that never ends: a header whose value goes on and on.
fn endless_head() -> Vec<u8> {
    let mut head = b"POST /api/v1/push HTTP/1.1\r\nHost: localhost\r\nX-Slow: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 10_000));
    head
}

fn push_head(content_length: usize) -> Vec<u8> {
    format!(
        "POST /api/v1/push HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {content_length}\r\n\r\n"
    )
    .into_bytes()
}

/// One push and the pop of it, by an ordinary client; returns how long the two took.
async fn push_and_pop(http: &reqwest::Client, base: &str, queue: &str, id: &str) -> Duration {
    let started = Instant::now();
    let body = json!({"items": [{"queue": queue, "transactionId": id, "payload": {"id": id}}]});
    let pushed = http.post(format!("{base}/api/v1/push")).json(&body).send().await.expect("push");
    assert_eq!(pushed.status(), StatusCode::CREATED, "{:?}", pushed.text().await);
    let popped = http.get(format!("{base}/api/v1/pop/queue/{queue}?batch=1&autoAck=true")).send().await.expect("pop");
    assert_eq!(popped.status(), StatusCode::OK);
    let popped: Value = popped.json().await.expect("a pop answer");
    assert_eq!(popped["messages"][0]["transactionId"], id, "{popped}");
    started.elapsed()
}

/// An ordinary HTTP client, opening a fresh connection for every request: each is accepted and
/// served beside the slow ones (and none races the broker closing a kept-alive connection that
/// sat idle past its keep-alive while the test waited).
fn client() -> reqwest::Client {
    queen_testkit::http().timeout(Duration::from_secs(30)).pool_max_idle_per_host(0).build().expect("an HTTP client")
}

/// Raises this process's soft limit on open files to its hard limit, as the broker does for
/// itself, so that a thousand connections fit where the soft limit is 1024.
fn raise_open_file_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("the open-file limit");
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("the soft open-file limit can be raised");
    }
    hard
}

/// The soft and hard limits on open files of process `pid`, from `/proc/<pid>/limits`.
fn open_file_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("the broker's limits");
    let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("an open-file limit");
    let mut values = line["Max open files".len()..].split_whitespace().map(|v| v.parse().unwrap_or(u64::MAX));
    (values.next().expect("a soft limit"), values.next().expect("a hard limit"))
}

#[tokio::test]
async fn slow_headers_are_answered_408_and_closed_within_the_head_timeout() {
    let (_db, broker) = broker("chaos_slow_head", HEAD_TIMEOUT, BODY_TIMEOUT, &[]).await;
    // Timed from before the connection is made: the broker's clock cannot start earlier.
    let connecting = Instant::now();
    let (mut reader, writer) = connect(&broker).await;
    let sender = Trickle::start(writer, endless_head());
    let answer = read_answer(&mut reader, connecting + HEAD_TIMEOUT + SLACK, false).await;
    let sent = sender.sent();
    drop(sender);
    let answered = answer.answered.expect("an answer").duration_since(connecting);
    let closed = answer.closed.expect("the broker closes the connection").duration_since(connecting);
    eprintln!("slow head: {sent} bytes trickled, 408 after {answered:?}, closed after {closed:?}");
    assert_eq!(answer.status, Some(408), "{answer:?}");
    assert!(sent >= 5, "the head was trickled ({sent} bytes), and each byte did not restart the timeout");
    assert!(answered >= HEAD_TIMEOUT - ACTIX_CLOCK, "cut off early, after {answered:?}");
    assert!(closed < HEAD_TIMEOUT + SLACK, "closed after {closed:?}");
}

#[tokio::test]
async fn a_slow_body_is_cut_off_with_408_within_the_body_timeout() {
    let (_db, broker) = broker("chaos_slow_body", HEAD_TIMEOUT, BODY_TIMEOUT, &[]).await;
    let body = json!({"items": [{"queue": "slow-body", "transactionId": "t", "payload": "x".repeat(1000)}]});
    let body = serde_json::to_vec(&body).expect("JSON");
    let (mut reader, mut writer) = connect(&broker).await;
    // Timed from before the head is sent: the body's deadline cannot start earlier.
    let head_sent = Instant::now();
    writer.write_all(&push_head(body.len())).await.expect("the head");
    let sender = Trickle::start(writer, body);
    let answer = read_answer(&mut reader, head_sent + BODY_TIMEOUT + SLACK, false).await;
    let sent = sender.sent();
    drop(sender);
    let answered = answer.answered.expect("an answer").duration_since(head_sent);
    let closed = answer.closed.expect("the broker closes the connection").duration_since(head_sent);
    eprintln!("slow body: {sent} bytes trickled, 408 after {answered:?}, closed after {closed:?}");
    assert_eq!(answer.status, Some(408), "{answer:?}");
    assert!(sent >= 5, "the body was trickled ({sent} bytes)");
    let error = answer.json();
    assert_eq!(error["code"], "request_timeout", "{error}");
    assert_eq!(error["error"], format!("the request body did not arrive within {} ms", BODY_TIMEOUT.as_millis()));
    assert!(answer.head.to_ascii_lowercase().contains("connection: close"), "{}", answer.head);
    assert!(answered >= BODY_TIMEOUT, "cut off early, after {answered:?}");
    assert!(closed < BODY_TIMEOUT + SLACK, "closed after {closed:?}");
    // Nothing of the cut-off push was written.
    let popped = client().get(format!("{}/api/v1/pop/queue/slow-body?batch=1", broker.url())).send().await;
    assert_eq!(popped.expect("pop").status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn a_slow_chunked_body_is_cut_off_with_408_within_the_body_timeout() {
    let (_db, broker) = broker("chaos_slow_chunked", HEAD_TIMEOUT, BODY_TIMEOUT, &[]).await;
    let (mut reader, mut writer) = connect(&broker).await;
    let head = "POST /api/v1/push HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    let head_sent = Instant::now();
    writer.write_all(head.as_bytes()).await.expect("the head");
    // One-byte chunks of a body that never ends.
    let chunks: Vec<u8> = std::iter::repeat_n(&b"1\r\n \r\n"[..], 1000).flatten().copied().collect();
    let sender = Trickle::start(writer, chunks);
    let answer = read_answer(&mut reader, head_sent + BODY_TIMEOUT + SLACK, true).await;
    let answered = answer.answered.expect("an answer").duration_since(head_sent);
    eprintln!("slow chunked body: 408 after {answered:?}");
    assert_eq!(answer.status, Some(408), "{answer:?}");
    assert_eq!(answer.json()["code"], "request_timeout");
    assert!(answered >= BODY_TIMEOUT, "cut off early, after {answered:?}");
    assert!(answered < BODY_TIMEOUT + SLACK, "answered after {answered:?}");
    // The connection itself is not closed: actix drains a refused chunked body for as long as its
    // client keeps sending or keeps the connection open (see docs/architecture.md).
    drop(sender);
}

#[tokio::test]
async fn an_oversized_content_length_is_refused_413_without_tying_up_the_worker() {
    // One worker: the request served meanwhile is served by the worker holding the oversized one.
    let (_db, broker) =
        broker("chaos_oversized_length", HEAD_TIMEOUT, Duration::from_secs(20), &[("QUEEN_HTTP__WORKERS", "1")]).await;
    let length = 16 * MAX_BODY_BYTES;
    let (mut reader, mut writer) = connect(&broker).await;
    writer.write_all(&push_head(length)).await.expect("the head");
    writer.write_all(&vec![b' '; 1024]).await.expect("the start of the body");
    // The oversized push is under way on the only worker; another client is served meanwhile.
    let took = push_and_pop(&client(), &broker.url(), "beside-oversized", "meanwhile").await;
    eprintln!("oversized upload under way: a push and a pop took {took:?}");
    assert!(took < SERVED_WITHIN, "took {took:?}");
    // The rest of the body, at full speed: refused once it passes the limit.
    let started = Instant::now();
    let sender = tokio::spawn(async move {
        let _ = writer.write_all(&vec![b' '; length - 1024]).await;
        writer
    });
    let answer = read_answer(&mut reader, started + Duration::from_secs(10), false).await;
    let answered = answer.answered.expect("an answer").duration_since(started);
    eprintln!(
        "oversized Content-Length: {:?} after {answered:?}, closed: {:?}",
        answer.status,
        answer.closed.map(|c| c - started)
    );
    assert_eq!(answer.status, Some(413), "{answer:?}");
    let error = answer.json();
    assert_eq!(error["code"], "payload_too_large", "{error}");
    assert_eq!(error["error"], format!("the request body exceeds the limit of {MAX_BODY_BYTES} bytes"));
    assert!(answer.closed.is_some(), "the broker closes a connection whose body it did not read");
    drop(sender.await);
}

#[tokio::test]
async fn an_oversized_chunked_body_is_refused_413() {
    let (_db, broker) = broker("chaos_oversized_chunked", HEAD_TIMEOUT, BODY_TIMEOUT, &[]).await;
    let (mut reader, mut writer) = connect(&broker).await;
    let head = "POST /api/v1/push HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    writer.write_all(head.as_bytes()).await.expect("the head");
    let started = Instant::now();
    // 8 KiB chunks, four times the limit in all, then the body's end.
    let sender = tokio::spawn(async move {
        let chunk = [format!("{:x}\r\n", 8192).into_bytes(), vec![b' '; 8192], b"\r\n".to_vec()].concat();
        for _ in 0..4 * MAX_BODY_BYTES / 8192 {
            if writer.write_all(&chunk).await.is_err() {
                return writer;
            }
        }
        let _ = writer.write_all(b"0\r\n\r\n").await;
        writer
    });
    let answer = read_answer(&mut reader, started + Duration::from_secs(10), true).await;
    let answered = answer.answered.expect("an answer").duration_since(started);
    eprintln!("oversized chunked body: {:?} after {answered:?}", answer.status);
    assert_eq!(answer.status, Some(413), "{answer:?}");
    assert_eq!(answer.json()["code"], "payload_too_large");
    drop(sender.await);
}

#[tokio::test]
async fn oversized_headers_are_refused_quickly_and_the_connection_closed() {
    // A long head timeout, so that a refusal cannot be the head timeout's 408.
    let head_timeout = Duration::from_secs(20);
    let (_db, broker) = broker("chaos_oversized_head", head_timeout, BODY_TIMEOUT, &[]).await;
    let (mut reader, mut writer) = connect(&broker).await;
    let mut head = b"GET /health HTTP/1.1\r\nHost: localhost\r\n".to_vec();
    // 1 MiB of headers, eight times what actix buffers of a head (128 KiB).
    for i in 0..1024 {
        head.extend(format!("X-Big-{i}: {}\r\n", "a".repeat(1000)).into_bytes());
    }
    head.extend(b"\r\n");
    let started = Instant::now();
    let sender = tokio::spawn(async move {
        let _ = writer.write_all(&head).await;
        writer
    });
    let answer = read_answer(&mut reader, started + Duration::from_secs(10), false).await;
    let closed = answer.closed.map(|c| c.duration_since(started));
    eprintln!(
        "oversized head: {:?} after {:?}, closed after {closed:?}",
        answer.status,
        answer.answered.map(|a| a - started)
    );
    let status = answer.status.expect("an answer, not a reset");
    assert!((400..500).contains(&status) && status != 408, "answered {status}: {answer:?}");
    assert!(closed.is_some_and(|c| c < Duration::from_secs(5)), "closed after {closed:?}");
    drop(sender.await);
    // And the broker still serves.
    let health = client().get(format!("{}/health", broker.url())).send().await.expect("health");
    assert_eq!(health.status(), StatusCode::OK);
}

#[tokio::test]
async fn idle_connections_by_the_thousand_do_not_keep_a_client_from_being_served_and_are_closed() {
    const IDLE: usize = 1000;
    // A longer head timeout than the others: opening a thousand connections takes a while on a
    // busy machine, and they must still be open when the normal client is served.
    let head_timeout = Duration::from_secs(5);
    // Started before this process raises its own limit, so that the broker inherits the soft
    // limit the tests were given (1024 on many machines) and has to raise its own.
    let (_db, broker) = broker("chaos_idle", head_timeout, BODY_TIMEOUT, &[]).await;
    let hard = raise_open_file_limit();
    assert!(hard > IDLE as u64 + 100, "the hard open-file limit ({hard}) is too low for {IDLE} connections");
    let (soft, broker_hard) = open_file_limits(broker.pid().expect("the broker runs"));
    assert_eq!(soft, broker_hard, "the broker raised its soft open-file limit to its hard limit");
    assert!(soft > IDLE as u64 + 100, "the broker's open-file limit ({soft}) is too low for {IDLE} connections");
    let started = Instant::now();
    let mut idle = Vec::with_capacity(IDLE);
    for i in 0..IDLE {
        let connecting = Instant::now();
        let (reader, mut writer) = connect(&broker).await;
        // Half send nothing, half the start of a head.
        if i % 2 == 1 {
            writer.write_all(b"GET /api/v1/pop/queue/idle HTTP/1.1\r\nHost: qu").await.expect("a partial head");
        }
        idle.push((reader, writer, connecting, Instant::now()));
    }
    eprintln!("{IDLE} idle connections opened in {:?}", started.elapsed());

    let http = client();
    let took = push_and_pop(&http, &broker.url(), "beside-idle", "served").await;
    eprintln!("with {IDLE} idle connections open: a push and a pop took {took:?}");
    assert!(took < SERVED_WITHIN, "took {took:?}");
    let still_open = idle.iter().filter(|(.., opened)| opened.elapsed() < head_timeout).count();
    assert!(still_open > IDLE / 2, "only {still_open} idle connections were still within their head timeout");

    // Every idle connection is then closed by the broker, answered 408, within the head timeout.
    let mut latest = Duration::ZERO;
    let mut waits = Vec::new();
    for (mut reader, writer, connecting, opened) in idle {
        waits.push(tokio::spawn(async move {
            let answer = read_answer(&mut reader, opened + head_timeout + SLACK + Duration::from_secs(3), false).await;
            drop(writer);
            let closed = answer.closed.map(|closed| (closed.duration_since(connecting), closed.duration_since(opened)));
            (answer.status, closed)
        }));
    }
    let mut timed_out = 0;
    for wait in waits {
        let (status, closed) = wait.await.expect("a reader");
        let (since_connecting, closed) =
            closed.unwrap_or_else(|| panic!("an idle connection was left open (answer {status:?})"));
        assert!(since_connecting >= head_timeout - ACTIX_CLOCK, "closed early, after {since_connecting:?}");
        latest = latest.max(closed);
        timed_out += usize::from(status == Some(408));
    }
    eprintln!(
        "all {IDLE} idle connections closed by the broker, the last {latest:?} after it opened; {timed_out} answered 408"
    );
    assert!(latest < head_timeout + SLACK + Duration::from_secs(3), "the last closed after {latest:?}");
    assert_eq!(timed_out, IDLE, "every idle connection is answered 408");
    // The broker still serves once they are gone.
    push_and_pop(&http, &broker.url(), "beside-idle", "after").await;
}

#[tokio::test]
async fn slow_clients_outnumbering_the_workers_do_not_stall_them() {
    // Two workers, sixteen slow clients: half trickle a head, half a body. Timeouts long enough
    // that they are all still trickling while the normal client is served.
    const SLOW: usize = 16;
    let timeout = Duration::from_secs(30);
    let (_db, broker) = broker("chaos_slow_many", timeout, timeout, &[]).await;
    let mut slow = Vec::new();
    for i in 0..SLOW {
        let (reader, mut writer) = connect(&broker).await;
        let bytes = if i % 2 == 0 {
            endless_head()
        } else {
            writer.write_all(&push_head(10_000)).await.expect("the head");
            vec![b' '; 10_000]
        };
        slow.push((reader, Trickle::start(writer, bytes)));
    }
    let http = client();
    let mut slowest = Duration::ZERO;
    for round in 0..10 {
        let took = push_and_pop(&http, &broker.url(), "beside-slow", &format!("r{round}")).await;
        assert!(took < SERVED_WITHIN, "round {round} took {took:?}");
        slowest = slowest.max(took);
    }
    eprintln!("{SLOW} slow clients on 2 workers: 10 pushes and pops, the slowest pair {slowest:?}");
    // The slow clients go on trickling (the rounds above may take less than one trickle): each
    // sends its next byte, and none was answered or closed.
    for (i, (mut reader, sender)) in slow.into_iter().enumerate() {
        let deadline = Instant::now() + 10 * TRICKLE;
        while sender.sent() < 2 {
            assert!(Instant::now() < deadline, "slow client {i} trickled {} bytes", sender.sent());
            tokio::time::sleep(TRICKLE / 4).await;
        }
        let answer = read_answer(&mut reader, Instant::now() + Duration::from_millis(10), false).await;
        assert!(answer.answered.is_none() && answer.closed.is_none(), "slow client {i}: {answer:?}");
    }
}
