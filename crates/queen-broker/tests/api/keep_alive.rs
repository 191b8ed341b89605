//! Kept-alive connections: the broker closes an idle one only after clients and load balancers
//! would have closed it (`http.keep_alive_seconds`), so none of them sends a request on a
//! connection the broker is closing, which the client would see as a failed call.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::TestApp;

/// Sends `GET /health` on the connection and reads the answer's head and body; `None` when the
/// broker closed the connection instead of answering.
async fn health(socket: &mut TcpStream, host: &str) -> Option<String> {
    let request = format!("GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n");
    socket.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                .and_then(|v| v.parse::<usize>().ok())
                .expect("a content-length");
            if body.len() >= length {
                return Some(head.to_owned());
            }
        }
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
        }
    }
}

#[actix_web::test]
async fn a_connection_idle_past_the_clients_idle_timeout_is_still_served() {
    let app = TestApp::spawn().await;
    let host = app.base.trim_start_matches("http://");
    let mut socket = TcpStream::connect(host).await.expect("a connection");
    let first = health(&mut socket, host).await.expect("an answer");
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    // httpx keeps an idle connection for 5 s, and actix's own default closed one after 5 s: a
    // client reusing its connection at 5 s raced the broker closing it. Idle past both.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let second = health(&mut socket, host).await.expect("the idle connection was closed");
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
}

#[actix_web::test]
async fn an_idle_connection_is_closed_after_the_keep_alive() {
    let app = TestApp::spawn_with(|config| config.http.keep_alive_seconds = 1).await;
    let host = app.base.trim_start_matches("http://");
    let mut socket = TcpStream::connect(host).await.expect("a connection");
    health(&mut socket, host).await.expect("an answer");
    let mut byte = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut byte)).await;
    assert!(matches!(closed, Ok(Ok(0))), "the broker kept the idle connection open: {closed:?}");
}
