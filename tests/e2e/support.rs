//! What the end-to-end tests share.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{Value, json};

/// The broker binary cargo built for these tests.
pub fn queen_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// Pushes one message and pops it back through the broker at `base`, checking both answers.
pub async fn round_trip(base: &str, queue: &str) {
    let http = queen_testkit::http().build().expect("an HTTP client");
    let pushed = http
        .post(format!("{base}/api/v1/push"))
        .json(&json!({"items": [{"queue": queue, "partition": "p", "transactionId": "e2e", "payload": {"ok": true}}]}))
        .send()
        .await
        .expect("push");
    assert_eq!(pushed.status(), StatusCode::CREATED);
    let popped = http.get(format!("{base}/api/v1/pop/queue/{queue}?batch=1")).send().await.expect("pop");
    assert_eq!(popped.status(), StatusCode::OK);
    let body: Value = popped.json().await.expect("JSON");
    assert_eq!(body["messages"][0]["transactionId"], "e2e");
    assert_eq!(body["messages"][0]["data"], json!({"ok": true}));
}
