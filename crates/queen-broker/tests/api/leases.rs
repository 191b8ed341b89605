//! Leases: extension keeps a slow consumer's work, expiry hands it to another consumer.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::TestApp;

#[actix_web::test]
async fn a_slow_consumer_keeps_its_lease_alive_by_extending_it() {
    let app = TestApp::spawn().await;
    app.post("/api/v1/configure", &json!({"queue": "slow", "options": {"leaseTime": 1}})).await;
    app.push_one("slow", "p", "work", json!(1)).await;
    let messages = app.pop("queue/slow", "batch=1&consumerGroup=g").await.messages();
    let lease = messages[0]["leaseId"].as_str().expect("lease").to_owned();
    // Three times the lease time passes while the consumer extends it before each expiry.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let extended = app.post(&format!("/api/v1/lease/{lease}/extend"), &json!({})).await;
        assert_eq!(extended.body["success"], true, "{extended:?}");
        let rival = app.pop("queue/slow", "batch=1&consumerGroup=g").await;
        assert_eq!(rival.status, StatusCode::NO_CONTENT, "the work stays with its consumer");
    }
    let acked = app.ack_all(&messages, "completed", Some("g")).await;
    assert_eq!(acked[0]["success"], true);
}

#[actix_web::test]
async fn a_consumer_that_dies_mid_batch_loses_it_to_another_and_the_expiry_counts_as_a_failure() {
    let app = TestApp::spawn().await;
    app.post("/api/v1/configure", &json!({"queue": "crash", "options": {"leaseTime": 1, "retryLimit": 1}})).await;
    app.push(json!([{"queue": "crash", "transactionId": "x", "payload": 1}, {"queue": "crash", "transactionId": "y", "payload": 2}]))
        .await;
    let dead = app.pop("queue/crash", "batch=2&consumerGroup=g").await.messages();
    assert_eq!(dead.len(), 2);
    // The consumer never comes back: another one waits and gets the batch once the lease is over.
    let taken = app.pop("queue/crash", "batch=2&consumerGroup=g&wait=true&timeout=5000").await;
    assert_eq!(taken.transaction_ids(), vec!["x", "y"]);
    assert_eq!(taken.messages()[0]["deliveryAttempt"], 2);
    let row = app
        .db
        .connect()
        .await
        .query_one("SELECT retry_count, redelivery_count FROM queen.log_consumers", &[])
        .await
        .expect("the cursor");
    assert_eq!((row.get::<_, i32>(0), row.get::<_, i32>(1)), (1, 1), "the expiry is a failed delivery of x");
    assert_eq!(app.count("SELECT count(*) FROM queen.log_dlq").await, 0, "one failure is within a retry limit of 1");
    let expired =
        app.post(&format!("/api/v1/lease/{}/extend", dead[0]["leaseId"].as_str().expect("lease")), &json!({})).await;
    assert_eq!(expired.body["success"], false, "an expired lease cannot be revived");
    // Its partition is leased again, so no cursor records the old lease: 404, saying why.
    assert_eq!(expired.status, StatusCode::NOT_FOUND, "{expired:?}");
    assert!(expired.body["error"].as_str().is_some_and(|e| e.contains("leased again")), "{expired:?}");
}

/// An extension without `seconds` (how the official clients renew, on a timer of their own) gives
/// at least upstream's 60 s, however short the queue's lease.
#[actix_web::test]
async fn an_extension_without_seconds_gives_at_least_a_minute() {
    let app = TestApp::spawn().await;
    app.post("/api/v1/configure", &json!({"queue": "brief", "options": {"leaseTime": 1}})).await;
    app.push_one("brief", "p", "work", json!(1)).await;
    let messages = app.pop("queue/brief", "batch=1&consumerGroup=g").await.messages();
    let lease = messages[0]["leaseId"].as_str().expect("lease").to_owned();
    let extended = app.post(&format!("/api/v1/lease/{lease}/extend"), &json!({})).await;
    assert_eq!(extended.body["success"], true, "{extended:?}");
    let left = app.count("SELECT extract(epoch FROM lease_expires_at - now())::bigint FROM queen.log_consumers").await;
    assert!((55..=60).contains(&left), "{left} s left");
    let asked = app.post(&format!("/api/v1/lease/{lease}/extend"), &json!({"seconds": 120})).await;
    assert_eq!(asked.body["success"], true);
    let left = app.count("SELECT extract(epoch FROM lease_expires_at - now())::bigint FROM queen.log_consumers").await;
    assert!((115..=120).contains(&left), "{left} s left: seconds asked for are given");
}
