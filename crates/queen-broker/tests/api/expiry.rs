//! Giving up on messages: `ttl` / `maxWaitTimeSeconds` (a group is never served a message older
//! than that; it skips it, or dead-letters it with the reason) and `deadLetterQueue` /
//! `dlqAfterMaxRetries` (whether a message that exhausted its retries is dead-lettered or
//! dropped). Ages of hours are made by moving segments into the past in the database.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

/// Moves the segments of the queue's partition holding offsets up to `last` `age` into the past.
async fn age_offsets(app: &TestApp, queue: &str, partition: &str, last: i64, age: &str) {
    let sql = "UPDATE queen.log_segments s SET created_at = s.created_at - $4::text::interval
                 FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                WHERE s.partition_id = p.id AND q.name = $1 AND p.name = $2 AND s.base_offset <= $3";
    app.db.connect().await.execute(sql, &[&queue, &partition, &last, &age]).await.expect("age the segments");
}

async fn push_each(app: &TestApp, queue: &str, partition: &str, ids: &[&str]) {
    for id in ids {
        app.push_one(queue, partition, id, json!(id)).await;
    }
}

async fn dead_letters(app: &TestApp, queue: &str) -> Vec<Value> {
    let page = app.get(&format!("/api/v1/dlq?queue={queue}&limit=1000")).await;
    assert_eq!(page.status, StatusCode::OK, "{page:?}");
    page.body["messages"].as_array().cloned().unwrap_or_default()
}

#[actix_web::test]
async fn a_group_skips_messages_older_than_the_ttl_and_they_are_counted() {
    let app = TestApp::spawn().await;
    app.configure("fresh-only", json!({"ttl": 3600, "deadLetterQueue": false})).await;
    push_each(&app, "fresh-only", "p", &["old-1", "old-2", "new-1"]).await;
    age_offsets(&app, "fresh-only", "p", 2, "2 hours").await;

    assert_eq!(app.pop("queue/fresh-only", "batch=10").await.transaction_ids(), vec!["new-1"]);
    let named = app.pop("queue/fresh-only", "batch=10&consumerGroup=audit&subscriptionMode=all").await;
    assert_eq!(named.transaction_ids(), vec!["new-1"], "every group");
    assert_eq!(app.metric(r#"queen_messages_expired_total{queue="fresh-only"}"#).await, 4.0, "two per group");
    assert!(dead_letters(&app, "fresh-only").await.is_empty(), "deadLetterQueue is off: skipped only");
    let cursors = app.count("SELECT count(*) FROM queen.log_consumers WHERE committed >= 2").await;
    assert_eq!(cursors, 2, "both groups' cursors moved past the expired messages");
}

#[actix_web::test]
async fn expired_messages_are_dead_lettered_with_the_reason_and_the_smaller_limit_wins() {
    let app = TestApp::spawn().await;
    app.configure("waits", json!({"ttl": 86400, "maxWaitTimeSeconds": 3600})).await;
    push_each(&app, "waits", "p", &["stale", "recent"]).await;
    age_offsets(&app, "waits", "p", 1, "2 hours").await;

    assert_eq!(app.pop("queue/waits", "batch=10").await.transaction_ids(), vec!["recent"]);
    let letters = dead_letters(&app, "waits").await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0]["transactionId"], "stale");
    assert_eq!(letters[0]["data"], "stale");
    let error = letters[0]["errorMessage"].as_str().unwrap_or_default();
    assert!(error.contains("expired") && error.contains("maxWaitTimeSeconds of 3600"), "{error}");
}

#[actix_web::test]
async fn a_long_expired_backlog_is_dead_lettered_whole() {
    let app = TestApp::spawn().await;
    app.configure("backlog", json!({"ttl": 60})).await;
    let items: Vec<Value> = (0..1200)
        .map(|i| json!({"queue": "backlog", "partition": "p", "transactionId": format!("b{i}"), "payload": i}))
        .collect();
    app.push(json!(items)).await;
    app.push_one("backlog", "p", "live", json!("live")).await;
    age_offsets(&app, "backlog", "p", 1200, "1 hour").await;

    assert_eq!(app.pop("queue/backlog", "batch=10").await.transaction_ids(), vec!["live"]);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_dlq WHERE queue_name = 'backlog'").await, 1200);
}

#[actix_web::test]
async fn without_a_ttl_old_history_is_still_served() {
    let app = TestApp::spawn().await;
    push_each(&app, "history", "p", &["ancient"]).await;
    age_offsets(&app, "history", "p", 1, "400 days").await;
    assert_eq!(app.pop("queue/history", "batch=10").await.transaction_ids(), vec!["ancient"]);
    assert_eq!(app.metric(r#"queen_messages_expired_total{queue="history"}"#).await, 0.0);
}

#[actix_web::test]
async fn a_queue_that_does_not_dead_letter_drops_an_exhausted_message() {
    let app = TestApp::spawn().await;
    for (queue, options) in [
        ("no-dlq", json!({"retryLimit": 0, "deadLetterQueue": false})),
        ("no-dlq-after-retries", json!({"retryLimit": 0, "dlqAfterMaxRetries": false})),
    ] {
        app.configure(queue, options).await;
        push_each(&app, queue, "p", &["poison", "next"]).await;
        let first = app.pop(&format!("queue/{queue}"), "batch=1").await.messages();
        let verdict = app.ack_all(&first, "failed", None).await.remove(0);
        assert_eq!(
            (verdict["success"].clone(), verdict["dropped"].clone(), verdict["dlq"].clone()),
            (json!(true), json!(true), json!(false))
        );
        assert_eq!(app.pop(&format!("queue/{queue}"), "batch=10").await.transaction_ids(), vec!["next"], "{queue}");
        assert!(dead_letters(&app, queue).await.is_empty(), "{queue}");
        assert_eq!(app.metric(&format!(r#"queen_messages_dropped_total{{queue="{queue}"}}"#)).await, 1.0);
    }
    // The default still dead-letters, as the clients' tests expect.
    push_each(&app, "default-dlq", "p", &["poison"]).await;
    app.configure("default-dlq", json!({"retryLimit": 0})).await;
    let first = app.pop("queue/default-dlq", "batch=1").await.messages();
    assert_eq!(app.ack_all(&first, "failed", None).await[0]["dlq"], true);
    assert_eq!(dead_letters(&app, "default-dlq").await.len(), 1);
}

/// Messages past the age every group skips do not fill a capped queue whose consumers are away:
/// they count for no group, so a push after them is taken while fresh ones still fill it.
#[actix_web::test]
async fn expired_messages_do_not_count_against_the_queues_size() {
    let app = TestApp::spawn().await;
    app.configure("capped", json!({"maxSize": 2, "ttl": 60})).await;
    push_each(&app, "capped", "p", &["old-1", "old-2"]).await;
    let full = app.post("/api/v1/push", &json!({"items": [{"queue": "capped", "partition": "p", "payload": 1}]})).await;
    assert_eq!(full.status, StatusCode::TOO_MANY_REQUESTS, "two fresh messages fill it: {full:?}");

    age_offsets(&app, "capped", "p", 2, "1 hour").await;
    push_each(&app, "capped", "p", &["new-1", "new-2"]).await;
    let full = app.post("/api/v1/push", &json!({"items": [{"queue": "capped", "partition": "p", "payload": 3}]})).await;
    assert_eq!(full.status, StatusCode::TOO_MANY_REQUESTS, "the two fresh ones fill it again: {full:?}");
    assert_eq!(app.pop("queue/capped", "batch=10").await.transaction_ids(), vec!["new-1", "new-2"]);
}
