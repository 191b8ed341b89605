//! `maxSize`: a push that would take a queue's unconsumed depth (past its slowest group) above
//! the limit is refused with 429 and writes nothing; 0 is no limit.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp};

fn item(queue: &str, partition: &str, transaction_id: &str) -> Value {
    json!({"queue": queue, "partition": partition, "transactionId": transaction_id, "payload": transaction_id})
}

async fn push_items(app: &TestApp, items: Vec<Value>) -> Answer {
    app.post("/api/v1/push", &json!({ "items": items })).await
}

async fn stored(app: &TestApp, queue: &str) -> i64 {
    app.count(&format!(
        "SELECT COALESCE(sum(p.last_offset), 0)::bigint FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
          WHERE q.name = '{queue}'"
    ))
    .await
}

fn assert_full(answer: &Answer, queue: &str, depth: i64) {
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS, "{answer:?}");
    assert_eq!(answer.body["code"], "queue_full");
    assert_eq!(answer.body["queue"], queue);
    assert_eq!(answer.body["depth"], depth);
    let error = answer.body["error"].as_str().unwrap_or_default();
    assert!(error.contains(queue) && error.contains(&format!("{depth} messages are unconsumed")), "{error}");
}

#[actix_web::test]
async fn a_full_queue_refuses_a_push_with_429_and_takes_more_as_consumers_catch_up() {
    let app = TestApp::spawn().await;
    app.configure("bounded", json!({"maxSize": 3})).await;
    let fits = push_items(&app, vec![item("bounded", "p", "a"), item("bounded", "p", "b"), item("bounded", "p", "c")]);
    assert_eq!(fits.await.status, StatusCode::CREATED);

    let refused = app.http.post(app.url("/api/v1/push")).json(&json!({"items": [item("bounded", "p", "d")]}));
    let refused = refused.send().await.expect("push");
    assert_eq!(refused.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    assert_full(&push_items(&app, vec![item("bounded", "p", "d")]).await, "bounded", 3);
    assert_eq!(stored(&app, "bounded").await, 3, "nothing written");

    // A retried push of what is stored adds nothing, so it fits.
    let again = push_items(&app, vec![item("bounded", "p", "c")]).await;
    assert_eq!((again.status, again.body[0]["status"].clone()), (StatusCode::CREATED, json!("duplicate")));

    let two = app.pop("queue/bounded", "batch=2").await.messages();
    app.ack_all(&two, "completed", None).await;
    let room = push_items(&app, vec![item("bounded", "p", "d"), item("bounded", "q", "e")]).await;
    assert_eq!(room.status, StatusCode::CREATED, "{room:?}");
    assert_full(&push_items(&app, vec![item("bounded", "q", "f")]).await, "bounded", 3);
}

/// A queue can hold more than its `maxSize` (lowered since, or a group sought back): a push of
/// what is stored still adds nothing, alone or in a transaction, and is answered `duplicate`,
/// not refused as if it were new.
#[actix_web::test]
async fn a_retried_push_is_a_duplicate_even_in_a_queue_over_its_size() {
    let app = TestApp::spawn().await;
    app.configure("shrunk", json!({"maxSize": 5})).await;
    let items = vec![item("shrunk", "p", "a"), item("shrunk", "p", "b"), item("shrunk", "p", "c")];
    assert_eq!(push_items(&app, items).await.status, StatusCode::CREATED);
    app.configure("shrunk", json!({"maxSize": 2})).await;

    let again = push_items(&app, vec![item("shrunk", "p", "c")]).await;
    assert_eq!((again.status, again.body[0]["status"].clone()), (StatusCode::CREATED, json!("duplicate")), "{again:?}");
    let bundle = json!({"operations": [{"type": "push", "items": [item("shrunk", "p", "b")]}]});
    let in_a_bundle = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!(in_a_bundle.status, StatusCode::OK, "{in_a_bundle:?}");
    assert_full(&push_items(&app, vec![item("shrunk", "p", "d")]).await, "shrunk", 3);
    assert_eq!(stored(&app, "shrunk").await, 3, "nothing added");
}

#[actix_web::test]
async fn a_refused_push_writes_none_of_its_partitions() {
    let app = TestApp::spawn().await;
    app.configure("spread", json!({"maxSize": 4})).await;
    push_items(&app, vec![item("spread", "p1", "x")]).await;
    let items = (0..4).map(|i| item("spread", &format!("p{}", i % 3), &format!("m{i}"))).collect();
    assert_full(&push_items(&app, items).await, "spread", 1);
    assert_eq!(stored(&app, "spread").await, 1);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_message_ids").await, 1);
}

/// A push spanning queues, one of them full, is refused whole: neither the queues without a
/// size nor another capped queue with room keep their share, so the producer's 429 means
/// nothing of it was stored.
#[actix_web::test]
async fn a_push_refused_by_one_full_queue_writes_nothing_to_the_others() {
    let app = TestApp::spawn().await;
    app.configure("full", json!({"maxSize": 1})).await;
    app.configure("roomy", json!({"maxSize": 10})).await;
    push_items(&app, vec![item("full", "p", "first")]).await;
    push_items(&app, vec![item("open", "p", "seed")]).await;
    let items = vec![item("open", "p", "a"), item("roomy", "p", "b"), item("full", "p", "c"), item("open", "q", "d")];
    assert_full(&push_items(&app, items).await, "full", 1);
    assert_eq!((stored(&app, "open").await, stored(&app, "roomy").await, stored(&app, "full").await), (1, 0, 1));

    // With room, the same push goes through whole, each item answered in request order.
    let first = app.pop("queue/full", "batch=1").await.messages();
    app.ack_all(&first, "completed", None).await;
    let items = vec![item("open", "p", "a"), item("roomy", "p", "b"), item("full", "p", "c"), item("open", "q", "d")];
    let pushed = push_items(&app, items).await;
    assert_eq!(pushed.status, StatusCode::CREATED, "{pushed:?}");
    let answered: Vec<&str> = (0..4).map(|i| pushed.body[i]["transaction_id"].as_str().unwrap_or_default()).collect();
    assert_eq!(answered, ["a", "b", "c", "d"]);
    assert_eq!((stored(&app, "open").await, stored(&app, "roomy").await, stored(&app, "full").await), (3, 1, 2));
}

#[actix_web::test]
async fn the_slowest_group_holds_the_depth_including_a_registered_group_that_never_read() {
    let app = TestApp::spawn().await;
    app.configure("shared", json!({"maxSize": 2})).await;
    // `slow` registers before anything is pushed, reading from the beginning, then reads nothing.
    assert_eq!(app.pop("queue/shared", "consumerGroup=slow&subscriptionMode=all").await.status, StatusCode::NO_CONTENT);
    push_items(&app, vec![item("shared", "p", "a"), item("shared", "p", "b")]).await;
    let fast = app.pop("queue/shared", "batch=10&consumerGroup=fast").await.messages();
    app.ack_all(&fast, "completed", Some("fast")).await;
    assert_full(&push_items(&app, vec![item("shared", "p", "c")]).await, "shared", 2);

    let slow = app.pop("queue/shared", "batch=10&consumerGroup=slow").await.messages();
    app.ack_all(&slow, "completed", Some("slow")).await;
    assert_eq!(push_items(&app, vec![item("shared", "p", "c")]).await.status, StatusCode::CREATED);
}

#[actix_web::test]
async fn a_transaction_that_would_overfill_a_queue_rolls_back() {
    let app = TestApp::spawn().await;
    app.configure("tx-bounded", json!({"maxSize": 1})).await;
    push_items(&app, vec![item("tx-bounded", "p", "in")]).await;
    push_items(&app, vec![item("source", "p", "s")]).await;
    let message = app.pop("queue/source", "batch=1").await.messages().remove(0);
    let bundle = json!({"operations": [
        {"type": "ack", "transactionId": "s", "partitionId": message["partitionId"], "leaseId": message["leaseId"]},
        {"type": "push", "items": [item("tx-bounded", "p", "over")]}]});
    assert_full(&app.post("/api/v1/transaction", &bundle).await, "tx-bounded", 1);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_consumers WHERE committed > 0").await, 0, "the ack too");
}

#[actix_web::test]
async fn a_size_set_on_one_broker_binds_the_pushes_of_another_at_once() {
    let app = TestApp::spawn().await;
    let other = TestApp::spawn_on(&app.db, |_| {}).await;
    let push_there = |id: String| {
        let body = json!({"items": [item("fleet-bounded", "p", &id)]});
        app.http.post(format!("{other}/api/v1/push")).json(&body).send()
    };
    // The other broker has the queue cached, without a size.
    assert_eq!(push_there("first".into()).await.expect("push").status(), StatusCode::CREATED);
    app.configure("fleet-bounded", json!({"maxSize": 1})).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    for attempt in 0.. {
        let status = push_there(format!("more-{attempt}")).await.expect("push").status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        assert!(Instant::now() < deadline, "the other broker kept taking pushes past the size");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix_web::test]
async fn concurrent_pushes_never_take_a_queue_past_its_size() {
    let app = TestApp::spawn().await;
    app.configure("contended", json!({"maxSize": 20})).await;
    let pushes = (0..40).map(|i| push_items(&app, vec![item("contended", &format!("p{}", i % 8), &format!("m{i}"))]));
    let answers = futures::future::join_all(pushes).await;
    let accepted = answers.iter().filter(|a| a.status == StatusCode::CREATED).count();
    let refused = answers.iter().filter(|a| a.status == StatusCode::TOO_MANY_REQUESTS).count();
    assert_eq!((accepted, refused), (20, 20), "{answers:?}");
    assert_eq!(stored(&app, "contended").await, 20);
}

#[actix_web::test]
async fn pushes_accepted_during_maintenance_are_replayed_even_past_the_size() {
    let app = TestApp::spawn().await;
    app.configure("bounded-buffer", json!({"maxSize": 1})).await;
    assert_eq!(app.post("/api/v1/system/maintenance", &json!({"enabled": true})).await.status, StatusCode::OK);
    for id in ["a", "b", "c"] {
        let answer = push_items(&app, vec![item("bounded-buffer", "p", id)]).await;
        assert_eq!(answer.body[0]["status"], "buffered", "{answer:?}");
    }
    app.post("/api/v1/system/maintenance", &json!({"enabled": false})).await;
    // They were answered, so they are written though the queue holds only one.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stored(&app, "bounded-buffer").await < 3 {
        assert!(Instant::now() < deadline, "the replay stopped at the queue's size");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
