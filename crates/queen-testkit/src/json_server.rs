//! A tiny HTTP server on 127.0.0.1 that answers every request with one JSON document, which the
//! test may replace at any time: a JWKS for the broker to fetch, say.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves until dropped.
pub struct JsonServer {
    url: String,
    body: Arc<Mutex<String>>,
    requests: Arc<Mutex<u64>>,
    task: tokio::task::JoinHandle<()>,
}

impl JsonServer {
    /// Starts serving `body` at `http://127.0.0.1:<port>/<path>` (any path is answered).
    pub async fn start(path: &str, body: String) -> JsonServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
        let url = format!("http://{}/{}", listener.local_addr().expect("an address"), path.trim_start_matches('/'));
        let body = Arc::new(Mutex::new(body));
        let requests = Arc::new(Mutex::new(0));
        let (served, counted) = (Arc::clone(&body), Arc::clone(&requests));
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (served, counted) = (Arc::clone(&served), Arc::clone(&counted));
                tokio::spawn(async move {
                    // One request per connection; its headers end with an empty line.
                    let mut request = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&chunk[..n]),
                        }
                    }
                    *counted.lock().expect("the count") += 1;
                    let body = served.lock().expect("the body").clone();
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        JsonServer { url, body, requests, task }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Serves `body` from now on.
    pub fn set(&self, body: String) {
        *self.body.lock().expect("the body") = body;
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        *self.requests.lock().expect("the count")
    }
}

impl Drop for JsonServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
