//! Transactions: ack stage one and push stage two in one PostgreSQL transaction, all or nothing.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

fn ack_op(message: &Value, group: Option<&str>) -> Value {
    let mut op = json!({"type": "ack", "transactionId": message["transactionId"], "partitionId": message["partitionId"],
                        "status": "completed", "leaseId": message["leaseId"]});
    if let Some(group) = group {
        op["consumerGroup"] = json!(group);
    }
    op
}

#[actix_web::test]
async fn a_committed_transaction_acks_stage_one_and_pushes_stage_two_together() {
    let app = TestApp::spawn().await;
    app.push_one("stage-one", "p", "order-1", json!({"v": 1})).await;
    let message = app.pop("queue/stage-one", "batch=1").await.messages().remove(0);
    let bundle = json!({
        "operations": [ack_op(&message, None),
                       {"type": "push", "items": [{"queue": "stage-two", "transactionId": "order-1-billed", "payload": {"v": 2}}]}],
        "requiredLeases": [message["leaseId"]],
    });
    let answer = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["success"], true);
    let results = answer.body["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "one result per ack and per pushed item, in order");
    assert_eq!(results[0]["success"], true);
    assert_eq!(results[1]["status"], "queued");

    let db = app.db.connect().await;
    let committed: i64 = db
        .query_one(
            "SELECT c.committed FROM queen.log_consumers c JOIN queen.partitions p ON p.id = c.partition_id
               JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'stage-one'",
            &[],
        )
        .await
        .expect("stage one's cursor")
        .get(0);
    assert_eq!(committed, 1, "stage one was acknowledged");
    let pushed: i64 = db
        .query_one(
            "SELECT p.last_offset FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'stage-two'",
            &[],
        )
        .await
        .expect("stage two's partition")
        .get(0);
    assert_eq!(pushed, 1, "stage two was pushed");
    assert_eq!(app.pop("queue/stage-two", "batch=1").await.messages()[0]["data"], json!({"v": 2}));
}

#[actix_web::test]
async fn a_transaction_with_an_ack_under_an_expired_lease_rolls_back_whole() {
    let app = TestApp::spawn().await;
    app.post("/api/v1/configure", &json!({"queue": "short", "options": {"leaseTime": 1}})).await;
    app.push_one("short", "p", "a", json!("a")).await;
    app.push_one("long", "p", "b", json!("b")).await;
    let a = app.pop("queue/short", "batch=1").await.messages().remove(0);
    let b = app.pop("queue/long", "batch=1").await.messages().remove(0);
    // a's lease runs out and another consumer takes a.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if app.pop("queue/short", "batch=1&wait=true&timeout=500").await.status == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "a was never redelivered");
    }
    let bundle = json!({
        "operations": [ack_op(&a, None), ack_op(&b, None),
                       {"type": "push", "items": [{"queue": "next", "transactionId": "n", "payload": 1}]}],
        "requiredLeases": [a["leaseId"], b["leaseId"]],
    });
    let answer = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{answer:?}");
    assert_eq!(answer.body["success"], false);
    assert!(answer.body["error"].as_str().is_some_and(|e| e.contains("rolled back")), "{answer:?}");

    let db = app.db.connect().await;
    let long_cursor: i64 = db
        .query_one(
            "SELECT c.committed FROM queen.log_consumers c JOIN queen.partitions p ON p.id = c.partition_id
               JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'long'",
            &[],
        )
        .await
        .expect("b's cursor")
        .get(0);
    assert_eq!(long_cursor, 0, "b's ack did not happen");
    assert_eq!(
        app.count(
            "SELECT count(*) FROM queen.log_segments s JOIN queen.partitions p ON p.id = s.partition_id
                     JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'next'"
        )
        .await,
        0,
        "the push did not happen"
    );
    let alone = app.ack_all(&[b], "completed", None).await;
    assert_eq!(alone[0]["success"], true, "b's lease is still good");
}

#[actix_web::test]
async fn a_transactional_push_is_idempotent() {
    let app = TestApp::spawn().await;
    let bundle = json!({"operations": [{"type": "push", "items": [{"queue": "idem", "partition": "p", "transactionId": "once", "payload": 1}]}],
                        "requiredLeases": []});
    let first = app.post("/api/v1/transaction", &bundle).await;
    let second = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!((first.status, second.status), (StatusCode::OK, StatusCode::OK));
    assert_eq!(first.body["results"][0]["status"], "queued");
    assert_eq!(second.body["results"][0]["status"], "duplicate");
    assert_eq!(second.body["results"][0]["message_id"], first.body["results"][0]["message_id"]);
    assert_eq!(app.pop("queue/idem", "batch=10").await.messages().len(), 1);
}

#[actix_web::test]
async fn bad_bundles_are_refused_and_write_nothing() {
    let app = TestApp::spawn().await;
    for (bundle, mentions) in [
        (json!({}), "operations"),
        (json!({"operations": []}), "operations"),
        (json!({"operations": [{"type": "teleport"}]}), "type"),
        (json!({"operations": [{"type": "push", "items": [{"queue": "x"}]}], "kv": []}), "kv"),
    ] {
        let answer = app.post("/api/v1/transaction", &bundle).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bundle}");
        assert!(answer.body["error"].as_str().is_some_and(|e| e.contains(mentions)), "{answer:?}");
    }
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 0);
}
