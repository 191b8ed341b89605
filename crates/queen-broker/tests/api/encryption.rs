//! `encryptionEnabled`: with the broker's key (`QUEEN_ENCRYPTION_KEY`), an encrypted queue's
//! segments, dead letters and buffered pushes are stored sealed (AES-256-GCM) and every read gives
//! the plain data back. The tests look at the bytes PostgreSQL and the journal hold.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

const KEY: &str = "7f3c9a1e5b2d4f6081a3c5e7092b4d6f8a1c3e5f7092b4d6e8f0a2c4e6081b3d";

/// A payload whose text must never be found at rest.
fn secret(n: i64) -> Value {
    json!({"card": format!("SECRET-MARKER-{n}")})
}

async fn encrypted_app() -> TestApp {
    TestApp::spawn_with(|config| config.encryption.key = Some(KEY.into())).await
}

/// Whether any of the bytes the query returns holds the marker.
async fn stored_in_plain_text(app: &TestApp, sql: &str) -> bool {
    let rows = app.db.connect().await.query(sql, &[]).await.expect("stored bytes");
    assert!(!rows.is_empty(), "{sql} found nothing to look at");
    rows.iter().any(|row| row.get::<_, Vec<u8>>(0).windows(13).any(|w| w == b"SECRET-MARKER"))
}

#[actix_web::test]
async fn an_encrypted_queue_is_sealed_at_rest_and_read_back_in_plain() {
    let app = encrypted_app().await;
    let configured = app.configure("vault", json!({"encryptionEnabled": true, "retryLimit": 0})).await;
    assert_eq!(configured["options"]["encryptionEnabled"], true);
    let pushed = app.push_one("vault", "p", "t1", secret(1)).await;
    app.push_one("vault", "p", "t2", secret(2)).await;
    let bundle = json!({"operations": [{"type": "push", "items": [
        {"queue": "vault", "partition": "p", "transactionId": "t3", "payload": secret(3)}]}]});
    assert_eq!(app.post("/api/v1/transaction", &bundle).await.status, StatusCode::OK);
    assert!(!stored_in_plain_text(&app, "SELECT body FROM queen.log_segments").await, "segments are sealed");

    let partition = pushed["partition_id"].as_str().expect("partition_id");
    let read = app.get(&format!("/api/v1/messages/{partition}/t1")).await;
    assert_eq!(read.body["data"], secret(1));
    let listed = app.get("/api/v1/messages?queue=vault&limit=10").await;
    assert_eq!(listed.body["messages"].as_array().map(Vec::len), Some(3), "{listed:?}");

    // Popped in plain; the failed one is dead-lettered (retryLimit 0), sealed at rest too.
    let popped = app.pop("queue/vault", "batch=10").await.messages();
    let data: Vec<Value> = popped.iter().map(|m| m["data"].clone()).collect();
    assert_eq!(data, vec![secret(1), secret(2), secret(3)]);
    app.ack_all(&popped[..1], "failed", None).await;
    assert!(!stored_in_plain_text(&app, "SELECT payload FROM queen.log_dlq").await, "dead letters are sealed");
    let letters = app.get("/api/v1/dlq?queue=vault").await;
    assert_eq!(letters.body["messages"][0]["data"], secret(1));

    // Back from the DLQ as a new message, sealed again, and served in plain.
    let retried = app.post(&format!("/api/v1/messages/{partition}/t1/retry"), &json!({})).await;
    assert_eq!(retried.status, StatusCode::OK, "{retried:?}");
    assert!(!stored_in_plain_text(&app, "SELECT body FROM queen.log_segments").await);
    let again = app.pop("queue/vault", "batch=10&consumerGroup=late&subscriptionMode=all").await;
    assert_eq!(again.messages().last().map(|m| m["data"].clone()), Some(secret(1)));
}

#[actix_web::test]
async fn without_a_key_encryption_is_refused_and_never_silently_plain() {
    let app = TestApp::spawn().await;
    let answer =
        app.post("/api/v1/configure", &json!({"queue": "naked", "options": {"encryptionEnabled": true}})).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    assert!(answer.body["error"].as_str().is_some_and(|e| e.contains("no encryption key")), "{answer:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 0);

    // A broker with the key encrypts a queue; one without it refuses to write or read it.
    let keyed = TestApp::spawn_on(&app.db, |config| config.encryption.key = Some(KEY.into())).await;
    let body = json!({"queue": "shared-vault", "options": {"encryptionEnabled": true}});
    assert_eq!(app.http.post(format!("{keyed}/api/v1/configure")).json(&body).send().await.unwrap().status(), 200);
    let item = json!({"items": [{"queue": "shared-vault", "payload": secret(9)}]});
    assert_eq!(app.http.post(format!("{keyed}/api/v1/push")).json(&item).send().await.unwrap().status(), 201);
    let refused = app.post("/api/v1/push", &item).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE, "{refused:?}");
    assert!(refused.body["error"].as_str().is_some_and(|e| e.contains("no encryption key")));
    let unreadable = app.pop("queue/shared-vault", "batch=1").await;
    assert_eq!(unreadable.status, StatusCode::SERVICE_UNAVAILABLE, "{unreadable:?}");
    assert!(!stored_in_plain_text(&app, "SELECT body FROM queen.log_segments").await);

    // Nor does an `autoAck` pop lose the message, though its claim committed the group's cursor:
    // the cursor moves back, and the broker with the key delivers it.
    let auto = "batch=1&consumerGroup=auto&autoAck=true";
    let unread = app.pop("queue/shared-vault", auto).await;
    assert_eq!(unread.status, StatusCode::SERVICE_UNAVAILABLE, "{unread:?}");
    let url = format!("{keyed}/api/v1/pop/queue/shared-vault?{auto}");
    let delivered: Value = app.http.get(url).send().await.unwrap().json().await.unwrap();
    assert_eq!(delivered["messages"][0]["data"], secret(9), "{delivered}");

    // Nor does it take them into its journal during push maintenance, where they would sit in
    // plain text and never replay: it knows the queue is encrypted.
    let (on, off) = (json!({"enabled": true}), json!({"enabled": false}));
    assert_eq!(app.post("/api/v1/system/maintenance", &on).await.status, StatusCode::OK);
    let journaled = app.post("/api/v1/push", &item).await;
    assert_eq!(journaled.status, StatusCode::SERVICE_UNAVAILABLE, "{journaled:?}");
    assert!(journaled.body["error"].as_str().is_some_and(|e| e.contains("no encryption key")), "{journaled:?}");
    assert_eq!(app.post("/api/v1/system/maintenance", &off).await.status, StatusCode::OK);
}

#[actix_web::test]
async fn buffered_pushes_are_sealed_in_the_journal_too() {
    let app = encrypted_app().await;
    app.configure("journaled-vault", json!({"encryptionEnabled": true})).await;
    let on = app.post("/api/v1/system/maintenance", &json!({"enabled": true})).await;
    assert_eq!(on.status, StatusCode::OK, "{on:?}");
    let buffered = app.push_one("journaled-vault", "p", "b1", secret(7)).await;
    assert_eq!(buffered["status"], "buffered");
    let dir = std::path::PathBuf::from(on.body["bufferDirectory"].as_str().expect("bufferDirectory"));
    let mut journaled = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the journal directory") {
        journaled.extend(std::fs::read(entry.expect("an entry").path()).expect("a journal file"));
    }
    assert!(journaled.windows(4).any(|w| w == b"QSE1"), "a sealed payload is in the journal");
    assert!(!journaled.windows(13).any(|w| w == b"SECRET-MARKER"), "no plain text in the journal");

    app.post("/api/v1/system/maintenance", &json!({"enabled": false})).await;
    let popped = app.pop("queue/journaled-vault", "batch=1&wait=true&timeout=10000").await;
    assert_eq!(popped.messages()[0]["data"], secret(7));
    assert!(!stored_in_plain_text(&app, "SELECT body FROM queen.log_segments").await);
}
