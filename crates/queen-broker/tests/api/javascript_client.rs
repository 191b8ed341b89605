//! The request bodies the official JavaScript client (`queen-mq`, `client-v2`) sends, member for
//! member as its source builds them. It is not on the npm registry this project's machines reach,
//! so it cannot run here the way the Python client does (`tests/compat`); these bodies stand in for
//! it. Every member it may send is one the broker reads, so none is refused.

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::TestApp;

/// `QUEUE_DEFAULTS`, which the client sends as the options of every queue it creates.
fn queue_defaults() -> Value {
    json!({
        "leaseTime": 300, "retryLimit": 3, "priority": 0, "delayedProcessing": 0, "windowBuffer": 0,
        "maxSize": 0, "retentionSeconds": 0, "completedRetentionSeconds": 0, "encryptionEnabled": false,
    })
}

fn ok(answer: &crate::helpers::Answer, status: StatusCode) {
    assert_eq!(answer.status, status, "{answer:?}");
}

#[actix_web::test]
async fn the_bodies_the_javascript_client_sends_are_accepted_and_act() {
    let app = TestApp::spawn().await;
    // `create()`: all four members, `null` where not set.
    let body = json!({"queue": "js", "namespace": null, "task": null, "options": queue_defaults()});
    assert_eq!(app.post("/api/v1/configure", &body).await.body["configured"], true);

    // `push()`: `partition` always, a minted UUIDv7 when the caller gives no transaction id,
    // `traceId` only when it is a UUID.
    let first = Uuid::now_v7().to_string();
    let pushed = app
        .push(json!([
            {"queue": "js", "partition": "Default", "payload": {"n": 1}, "transactionId": first,
             "traceId": Uuid::new_v4().to_string()},
            {"queue": "js", "partition": "Default", "payload": null, "transactionId": "js-2"},
            {"queue": "js", "partition": "Default", "payload": {"n": 3}, "transactionId": "js-3"},
        ]))
        .await;
    assert!(pushed.iter().all(|p| p["status"] == "queued"), "{pushed:?}");

    let popped = app.pop("queue/js", "batch=3&wait=false&consumerGroup=g").await;
    let messages = popped.messages();
    assert_eq!(messages.len(), 3, "{popped:?}");
    let partition = messages[0]["partitionId"].clone();
    let lease = messages[0]["leaseId"].as_str().expect("a lease").to_owned();

    // `renew()`: an empty object.
    let renewed = app.post(&format!("/api/v1/lease/{lease}/extend"), &json!({})).await;
    assert_eq!(renewed.body["success"], true, "{renewed:?}");

    // A consumed message's `trace()`: every member, `traceNames` null when none was named.
    let trace = json!({"transactionId": "js-2", "partitionId": partition, "consumerGroup": "g",
                       "traceNames": null, "eventType": "info", "data": {"step": 1}});
    ok(&app.post("/api/v1/traces", &trace).await, StatusCode::CREATED);

    // `ack(message)`: `error` and `consumerGroup` always present, `leaseId` when the message has one.
    let ack = json!({"transactionId": first, "partitionId": partition, "status": "completed", "error": null,
                     "consumerGroup": "g", "leaseId": lease});
    let acked = app.post("/api/v1/ack", &ack).await;
    assert_eq!(acked.body[0]["success"], true, "{acked:?}");

    // A transaction: an ack with its lease and group, a push whose items name no partition, and
    // the acks' leases in `requiredLeases`.
    let transaction = json!({
        "operations": [
            {"type": "ack", "transactionId": "js-2", "partitionId": partition, "status": "completed",
             "consumerGroup": "g", "leaseId": lease},
            {"type": "push", "items": [{"queue": "js-next", "payload": {"from": "js-2"}, "transactionId": "js-next-1"}]},
        ],
        "requiredLeases": [lease],
    });
    let committed = app.post("/api/v1/transaction", &transaction).await;
    assert_eq!(committed.body["success"], true, "{committed:?}");

    // `ack([messages])`: the group once, at the top; `error` in every element.
    let batch = json!({"acknowledgments": [{"transactionId": "js-3", "partitionId": partition, "status": "completed",
                                           "error": null, "leaseId": lease}],
                       "consumerGroup": "g"});
    let acked = app.post("/api/v1/ack/batch", &batch).await;
    assert_eq!(acked.body[0]["success"], true, "{acked:?}");
    let left = app.pop("queue/js", "batch=3&wait=false&consumerGroup=g").await;
    assert!(left.messages().is_empty(), "every message of the group was acknowledged: {left:?}");

    // Queue mode: `consumerGroup` is sent as null, not left out.
    let popped = app.pop("queue/js-next", "batch=1&wait=false").await;
    let next = &popped.messages()[0];
    assert_eq!(next["data"], json!({"from": "js-2"}), "{popped:?}");
    let batch = json!({"acknowledgments": [{"transactionId": "js-next-1", "partitionId": next["partitionId"],
                                           "status": "completed", "error": null, "leaseId": next["leaseId"]}],
                       "consumerGroup": null});
    let acked = app.post("/api/v1/ack/batch", &batch).await;
    assert_eq!(acked.body[0]["success"], true, "{acked:?}");

    // The admin calls: a subscription update and a seek to the end.
    let subscription = json!({"subscriptionTimestamp": "2026-01-01T00:00:00.000Z"});
    ok(&app.post("/api/v1/consumer-groups/g/subscription", &subscription).await, StatusCode::OK);
    ok(&app.post("/api/v1/consumer-groups/g/queues/js/seek", &json!({"toEnd": true})).await, StatusCode::OK);
}
