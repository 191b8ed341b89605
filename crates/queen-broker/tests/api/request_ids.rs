//! Every answer names its request; a fault inside the broker reaches the client as a stable code,
//! a short text and that name, never as the database's own words.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

fn request_id(response: &reqwest::Response) -> String {
    let header = response.headers().get("x-request-id").expect("an X-Request-Id header");
    header.to_str().expect("ASCII").to_owned()
}

#[actix_web::test]
async fn every_answer_carries_a_request_id_and_a_callers_own_is_kept() {
    let app = TestApp::spawn().await;
    let push = json!({"items": [{"queue": "ids", "payload": 1}]});
    let answers = [
        app.http.post(app.url("/api/v1/push")).json(&push).send().await.expect("push"),
        app.http.get(app.url("/api/v1/pop/queue/ids?batch=1")).send().await.expect("pop"),
        app.http.get(app.url("/api/v1/no-such-route")).send().await.expect("404"),
        app.http.post(app.url("/api/v1/push")).body("not json").send().await.expect("400"),
        app.http.get(app.url("/health")).send().await.expect("health"),
    ];
    let mut seen = std::collections::HashSet::new();
    for response in &answers {
        assert!(seen.insert(request_id(response)), "a fresh id per request");
    }
    let bad = app.http.post(app.url("/api/v1/push")).body("not json").send().await.expect("400");
    let id = request_id(&bad);
    let body: Value = bad.json().await.expect("JSON");
    assert_eq!(body["requestId"], id.as_str(), "an error body names its request");

    let traced = app.http.get(app.url("/health")).header("x-request-id", "lb-7f3a.1").send().await.expect("health");
    assert_eq!(request_id(&traced), "lb-7f3a.1");
    let odd = app.http.get(app.url("/health")).header("x-request-id", "two words").send().await.expect("health");
    assert_ne!(request_id(&odd), "two words", "an unusable id is replaced");
}

#[actix_web::test]
async fn a_database_fault_answers_a_stable_code_without_the_databases_text() {
    let app = TestApp::spawn().await;
    // A fault the broker does not expect: the dead-letter table is gone.
    app.db.connect().await.batch_execute("ALTER TABLE queen.log_dlq RENAME TO log_dlq_moved").await.expect("rename");
    let response = app.http.get(app.url("/api/v1/dlq")).send().await.expect("GET");
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let id = request_id(&response);
    let text = response.text().await.expect("a body");
    let body: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(body["code"], "internal");
    assert_eq!(body["requestId"], id.as_str());
    for leak in ["log_dlq", "relation", "does not exist", "SQL", "db error"] {
        assert!(!text.contains(leak), "{leak:?} leaked: {text}");
    }
}
