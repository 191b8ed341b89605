//! The failure path: every ack status, the retry limit, dead letters and their re-queuing.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

async fn push_n(app: &TestApp, queue: &str, n: i64) {
    let items: Vec<Value> = (1..=n)
        .map(|i| json!({"queue": queue, "partition": "p", "transactionId": format!("m{i}"), "payload": {"n": i}}))
        .collect();
    app.push(Value::Array(items)).await;
}

/// Acks each message with its own status (`None` leaves it out), as one call.
async fn ack_each(app: &TestApp, messages: &[Value], statuses: &[Option<&str>], group: Option<&str>) -> Vec<Value> {
    let acks: Vec<Value> = messages
        .iter()
        .zip(statuses)
        .filter_map(|(m, status)| {
            status.map(|status| {
                json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                       "status": status, "error": format!("{status} by the test")})
            })
        })
        .collect();
    let answer = app.post("/api/v1/ack/batch", &json!({"acknowledgments": acks, "consumerGroup": group})).await;
    assert_eq!(answer.status, StatusCode::OK);
    answer.body.as_array().cloned().expect("an array")
}

async fn cursor(app: &TestApp) -> (i64, i64, i64) {
    let row = app
        .db
        .connect()
        .await
        .query_one("SELECT committed, retry_count::bigint, redelivery_count::bigint FROM queen.log_consumers", &[])
        .await
        .expect("one cursor");
    (row.get(0), row.get(1), row.get(2))
}

#[actix_web::test]
async fn failed_pulls_back_before_the_message_even_past_later_completions() {
    let app = TestApp::spawn().await;
    push_n(&app, "failed", 5).await;
    let messages = app.pop("queue/failed", "batch=5").await.messages();
    let results = ack_each(
        &app,
        &messages,
        &[Some("completed"), Some("failed"), Some("completed"), Some("completed"), Some("completed")],
        None,
    )
    .await;
    assert_eq!(results.len(), 5, "one verdict per item");
    assert_eq!(results[1]["success"], true);
    assert_eq!(results[1]["leaseReleased"], true);
    assert!(results[2..].iter().all(|r| r["success"] == false), "completions behind the failure do not count");
    assert_eq!(cursor(&app).await, (1, 1, 0), "committed just before the failure, one retry counted");
    // Available again at once, to any consumer of the group: the lease was released.
    let again = app.pop("queue/failed", "batch=10").await;
    assert_eq!(again.transaction_ids(), vec!["m2", "m3", "m4", "m5"]);
    assert_eq!(again.messages()[0]["data"], json!({"n": 2}), "a redelivery carries the same data");
}

#[actix_web::test]
async fn retry_pulls_back_without_counting() {
    let app = TestApp::spawn().await;
    push_n(&app, "retry", 3).await;
    let messages = app.pop("queue/retry", "batch=3").await.messages();
    ack_each(&app, &messages, &[Some("completed"), Some("retry"), None], None).await;
    assert_eq!(cursor(&app).await, (1, 0, 0));
    assert_eq!(app.pop("queue/retry", "batch=10").await.transaction_ids(), vec!["m2", "m3"]);
}

#[actix_web::test]
async fn dlq_dead_letters_the_message_now_and_the_next_one_is_delivered() {
    let app = TestApp::spawn().await;
    push_n(&app, "dlq", 3).await;
    let messages = app.pop("queue/dlq", "batch=1").await.messages();
    let results = ack_each(&app, &messages, &[Some("dlq")], None).await;
    assert_eq!((&results[0]["success"], &results[0]["dlq"]), (&json!(true), &json!(true)));
    assert_eq!(results[0]["leaseReleased"], true, "its lease covered that message alone");
    assert_eq!(app.count("SELECT count(*) FROM queen.log_dlq").await, 1);
    assert_eq!(app.pop("queue/dlq", "batch=1").await.transaction_ids(), vec!["m2"]);
}

#[actix_web::test]
async fn late_and_unknown_acks_get_the_contracts_verdicts() {
    let app = TestApp::spawn().await;
    push_n(&app, "late", 3).await;
    let messages = app.pop("queue/late", "batch=3").await.messages();
    ack_each(&app, &messages[1..2], &[Some("completed")], None).await;
    let late_failed = ack_each(&app, &messages[..1], &[Some("failed")], None).await;
    assert_eq!(late_failed[0]["success"], false);
    assert!(late_failed[0]["error"].as_str().is_some_and(|e| e.contains("committed")), "{late_failed:?}");
    let late_completed = ack_each(&app, &messages[..1], &[Some("completed")], None).await;
    assert_eq!((&late_completed[0]["success"], &late_completed[0]["noop"]), (&json!(true), &json!(true)));
    let ghost =
        json!({"transactionId": "ghost", "partitionId": messages[0]["partitionId"], "leaseId": messages[0]["leaseId"]});
    let unknown = app.post("/api/v1/ack", &ghost).await;
    assert_eq!(unknown.status, StatusCode::OK);
    assert!(unknown.body[0]["error"].as_str().is_some_and(|e| e.contains("unresolvable")));
    let in_range = ack_each(&app, &messages[2..], &[Some("completed")], None).await;
    assert_eq!((&in_range[0]["success"], &in_range[0]["noop"]), (&json!(true), &json!(false)), "the lease survived");
}

#[actix_web::test]
async fn past_the_retry_limit_a_message_is_dead_lettered_after_limit_plus_one_deliveries() {
    const LIMIT: usize = 2;
    let app = TestApp::spawn().await;
    app.post("/api/v1/configure", &json!({"queue": "budget", "options": {"retryLimit": LIMIT}})).await;
    push_n(&app, "budget", 2).await;
    for delivery in 1..=LIMIT + 1 {
        let messages = app.pop("queue/budget", "batch=1&consumerGroup=g").await.messages();
        assert_eq!(messages[0]["transactionId"], "m1", "delivery {delivery}");
        assert_eq!(messages[0]["deliveryAttempt"], delivery as i64);
        let results = ack_each(&app, &messages, &[Some("failed")], Some("g")).await;
        assert_eq!(results[0]["dlq"], json!(delivery == LIMIT + 1), "dead-lettered on delivery {delivery}");
        assert_eq!(results[0]["leaseReleased"], true, "a failure ends the lease, dead-lettered or not");
    }
    assert_eq!(app.pop("queue/budget", "batch=1&consumerGroup=g").await.transaction_ids(), vec!["m2"]);

    let dlq = app.get("/api/v1/dlq?queue=budget").await;
    assert_eq!(dlq.body["total"], 1);
    let letter = &dlq.body["messages"][0];
    assert_eq!(letter["transactionId"], "m1");
    assert_eq!(letter["data"], json!({"n": 1}), "the payload is copied");
    assert_eq!(letter["errorMessage"], "failed by the test");
    assert_eq!(letter["retryCount"], LIMIT as i64, "retried LIMIT times after its first delivery");
    assert_eq!(letter["consumerGroup"], "g");
    assert_eq!(letter["offset"], 1);
    assert_eq!(letter["partition"], "p");

    // A failed ack need not give an error (`ack(message, False)`): the dead letter still says why.
    let messages = app.pop("queue/budget", "batch=1&consumerGroup=silent").await.messages();
    app.post("/api/v1/configure", &json!({"queue": "budget", "options": {"retryLimit": 0}})).await;
    assert_eq!(app.ack_all(&messages, "failed", Some("silent")).await[0]["dlq"], true);
    let dlq = app.get("/api/v1/dlq?queue=budget&consumerGroup=silent").await;
    assert_eq!(dlq.body["messages"][0]["errorMessage"], "failed once; the last failed ack gave no error");
}

#[actix_web::test]
async fn dead_letters_can_be_filtered_and_paged() {
    let app = TestApp::spawn().await;
    for (queue, partition, group) in [("a", "p1", "g1"), ("a", "p2", "g1"), ("a", "p1", "g2"), ("b", "p1", "g1")] {
        app.push(json!([{"queue": queue, "partition": partition, "payload": 1}])).await;
        let messages = app
            .pop(&format!("queue/{queue}/partition/{partition}"), &format!("consumerGroup={group}"))
            .await
            .messages();
        ack_each(&app, &messages, &[Some("dlq")], Some(group)).await;
    }
    let total = |path: &'static str| {
        let app = &app;
        async move { app.get(path).await.body["total"].as_i64().expect("total") }
    };
    assert_eq!(total("/api/v1/dlq").await, 4);
    assert_eq!(total("/api/v1/dlq?queue=a").await, 3);
    assert_eq!(total("/api/v1/dlq?queue=a&consumerGroup=g1").await, 2);
    assert_eq!(total("/api/v1/dlq?queue=a&partition=p1").await, 2);
    assert_eq!(total("/api/v1/dlq?to=2001-01-01T00:00:00Z").await, 0);
    assert_eq!(total("/api/v1/dlq?from=2001-01-01T00:00:00Z").await, 4);
    // Times as Python writes them without a zone are UTC; a date alone is its midnight.
    assert_eq!(total("/api/v1/dlq?from=2001-01-01T00:00:00.250000").await, 4);
    assert_eq!(total("/api/v1/dlq?to=2001-01-01").await, 0);
    let first = app.get("/api/v1/dlq?limit=3").await;
    let second = app.get("/api/v1/dlq?limit=3&offset=3").await;
    assert_eq!(first.body["messages"].as_array().map(Vec::len), Some(3));
    assert_eq!(second.body["messages"].as_array().map(Vec::len), Some(1));
    assert_eq!(second.body["total"], 4);
    assert_eq!(app.get("/api/v1/dlq?limit=0").await.status, StatusCode::BAD_REQUEST);
    // Past the page's bound the page is capped, and the answer says so.
    let capped = app.get("/api/v1/dlq?limit=5000").await;
    assert_eq!(
        (capped.status, &capped.body["limit"], &capped.body["total"]),
        (StatusCode::OK, &json!(1000), &json!(4))
    );
    assert_eq!(app.get("/api/v1/dlq?from=yesterday").await.status, StatusCode::BAD_REQUEST);
}

/// A page of dead letters ends once its payloads reach `pop.max_answer_bytes` (at least one
/// dead letter): paging on by what came back reaches every one, once, newest first.
#[actix_web::test]
async fn a_page_of_large_dead_letters_is_bounded_by_bytes() {
    let app = TestApp::spawn_with(|config| config.pop.max_answer_bytes = 1024).await;
    for n in 0..4 {
        app.push_one("heavy", "p", &format!("h{n}"), json!({"n": n, "pad": "x".repeat(600)})).await;
        let messages = app.pop("queue/heavy", "consumerGroup=g").await.messages();
        ack_each(&app, &messages, &[Some("dlq")], Some("g")).await;
    }
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let page = app.get(&format!("/api/v1/dlq?queue=heavy&limit=100&offset={}", seen.len())).await;
        let letters = page.body["messages"].as_array().cloned().unwrap_or_else(|| panic!("messages: {page:?}"));
        assert_eq!((letters.len(), &page.body["total"]), (1, &json!(4)), "one 600-byte payload per page: {page:?}");
        seen.extend(letters.iter().map(|letter| letter["data"]["n"].clone()));
    }
    assert_eq!(seen, [json!(3), json!(2), json!(1), json!(0)], "every dead letter once, newest first");
}

#[actix_web::test]
async fn a_dead_letter_can_be_requeued_as_a_new_message_once() {
    let app = TestApp::spawn().await;
    push_n(&app, "requeue", 1).await;
    let messages = app.pop("queue/requeue", "batch=1&consumerGroup=g").await.messages();
    ack_each(&app, &messages, &[Some("dlq")], Some("g")).await;
    let path = format!("/api/v1/messages/{}/m1/retry", messages[0]["partitionId"].as_str().expect("id"));
    let moved = app.post_raw(&path, "").await;
    assert_eq!(moved.status, StatusCode::OK, "{moved:?}");
    assert_eq!(moved.body["result"], "moved");
    assert!(moved.body["transactionId"].as_str().is_some_and(|t| t.starts_with("dlq:")));
    assert_eq!(app.count("SELECT count(*) FROM queen.log_dlq").await, 0);

    let again = app.pop("queue/requeue", "batch=1&consumerGroup=g").await.messages();
    assert_eq!(again[0]["transactionId"], moved.body["transactionId"], "it arrives as a new message");
    assert_eq!(again[0]["data"], json!({"n": 1}));
    assert_eq!(app.post_raw(&path, "").await.status, StatusCode::NOT_FOUND, "a dead letter moves once");
}

#[actix_web::test]
async fn dead_letters_can_be_deleted_and_the_message_stays_in_the_log() {
    let app = TestApp::spawn().await;
    push_n(&app, "forget", 1).await;
    let messages = app.pop("queue/forget", "batch=1").await.messages();
    ack_each(&app, &messages, &[Some("dlq")], None).await;
    let path = format!("/api/v1/messages/{}/m1", messages[0]["partitionId"].as_str().expect("id"));
    assert_eq!(app.delete(&path).await.body["deletedDeadLetters"], 1);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_dlq").await, 0);
    assert_eq!(app.get(&path).await.status, StatusCode::OK, "the log is immutable");
    assert_eq!(app.delete(&path).await.status, StatusCode::NOT_FOUND);
}

/// Two messages sharing a transaction id (the second pushed past the dedup window), both dead-
/// lettered: each retry moves one of them back, the earlier first, and neither is lost.
#[actix_web::test]
async fn dead_letters_of_two_messages_sharing_an_id_are_retried_one_message_at_a_time() {
    let app = TestApp::spawn().await;
    app.configure("twice", json!({"dedupWindowSeconds": 60})).await;
    let first = app.push_one("twice", "p", "x", json!(1)).await;
    crate::queue_options::age_queue(&app, "twice", "2 hours").await;
    assert_eq!(app.push_one("twice", "p", "x", json!(2)).await["status"], "queued");
    let popped = app.pop("queue/twice", "batch=10").await.messages();
    assert_eq!(popped.len(), 2);
    for message in popped.chunks(1) {
        app.ack_all(message, "dlq", None).await;
    }
    let partition = first["partition_id"].as_str().expect("partition_id");
    let retry = format!("/api/v1/messages/{partition}/x/retry");
    for _ in 0..2 {
        let retried = app.post(&retry, &json!({})).await;
        assert_eq!(retried.status, StatusCode::OK, "{retried:?}");
        assert_eq!(retried.body["deadLetters"], 1, "{retried:?}");
    }
    assert_eq!(app.post(&retry, &json!({})).await.status, StatusCode::NOT_FOUND, "none is left");
    let requeued = app.pop("queue/twice", "batch=10").await.messages();
    let data: Vec<&Value> = requeued.iter().map(|m| &m["data"]).collect();
    assert_eq!(data, [1, 2]);
}

/// A retried dead letter is a push to its queue: past `maxSize` it is refused as a push is, and
/// stays in the DLQ until there is room.
#[actix_web::test]
async fn a_dead_letter_retry_into_a_full_queue_is_refused_and_kept() {
    let app = TestApp::spawn().await;
    app.configure("capped", json!({"maxSize": 1})).await;
    let first = app.push_one("capped", "p", "x", json!(1)).await;
    let popped = app.pop("queue/capped", "batch=1").await.messages();
    app.ack_all(&popped, "dlq", None).await;
    app.push_one("capped", "p", "y", json!(2)).await;

    let retry = format!("/api/v1/messages/{}/x/retry", first["partition_id"].as_str().expect("partition_id"));
    let refused = app.post(&retry, &json!({})).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{refused:?}");
    assert_eq!(refused.body["code"], "queue_full", "{refused:?}");
    let y = app.pop("queue/capped", "batch=10").await.messages();
    assert_eq!(y.len(), 1);
    app.ack_all(&y, "completed", None).await;
    let moved = app.post(&retry, &json!({})).await;
    assert_eq!((moved.status, &moved.body["deadLetters"]), (StatusCode::OK, &json!(1)), "{moved:?}");
}

/// Acks must be idempotent (a client resends one whose answer it lost): a `failed` or a `dlq` sent
/// again is answered as the first was applied, a no-op, and counts nothing twice.
#[actix_web::test]
async fn a_nack_sent_again_is_answered_as_applied_and_counted_once() {
    let app = TestApp::spawn().await;
    app.post("/api/v1/configure", &json!({"queue": "resent", "options": {"retryLimit": 3}})).await;
    app.push_one("resent", "p", "m", json!(1)).await;
    let delivered = app.pop("queue/resent", "batch=1&consumerGroup=g").await.messages();
    for attempt in 0..2 {
        let answer = app.ack_all(&delivered, "failed", Some("g")).await;
        assert_eq!(answer[0]["success"], true, "attempt {attempt}: {answer:?}");
    }
    assert_eq!(app.count("SELECT retry_count::bigint FROM queen.log_consumers").await, 1, "one failure counted");

    let again = app.pop("queue/resent", "batch=1&consumerGroup=g").await.messages();
    assert_eq!(again[0]["transactionId"], "m", "delivered again");
    for attempt in 0..2 {
        let answer = app.ack_all(&again, "dlq", Some("g")).await;
        assert_eq!(answer[0]["success"], true, "attempt {attempt}: {answer:?}");
    }
    assert_eq!(app.count("SELECT count(*) FROM queen.log_dlq").await, 1, "dead-lettered once");
}
