//! Consumer groups and leases: fan-out, independent cursors, exclusive partitions, expiry.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp};

async fn push_three(app: &TestApp, queue: &str) {
    let items: Vec<Value> = (0..3)
        .map(|i| json!({"queue": queue, "partition": "p", "transactionId": format!("m{i}"), "payload": i}))
        .collect();
    app.push(Value::Array(items)).await;
}

#[actix_web::test]
async fn queue_mode_and_two_named_groups_each_receive_every_message() {
    let app = TestApp::spawn().await;
    push_three(&app, "fan").await;
    for group in ["", "&consumerGroup=billing", "&consumerGroup=analytics"] {
        let answer = app.pop("queue/fan", &format!("batch=10{group}")).await;
        assert_eq!(answer.transaction_ids(), vec!["m0", "m1", "m2"], "group {group:?}");
        let expected = if group.is_empty() { "__QUEUE_MODE__" } else { &group["&consumerGroup=".len()..] };
        assert!(answer.messages().iter().all(|m| m["consumerGroup"] == expected));
    }
    assert_eq!(app.count("SELECT count(*) FROM queen.log_consumers").await, 3, "one cursor per group");
}

#[actix_web::test]
async fn the_literal_queue_mode_group_is_the_unnamed_consumer() {
    let app = TestApp::spawn().await;
    push_three(&app, "literal").await;
    let messages = app.pop("queue/literal", "batch=10&consumerGroup=__QUEUE_MODE__").await.messages();
    app.ack_all(&messages, "completed", None).await;
    assert_eq!(app.pop("queue/literal", "batch=10").await.status, StatusCode::NO_CONTENT);
}

#[actix_web::test]
async fn one_groups_acks_do_not_move_another_groups_cursor() {
    let app = TestApp::spawn().await;
    push_three(&app, "cursors").await;
    let billing = app.pop("queue/cursors", "batch=10&consumerGroup=billing").await.messages();
    let analytics = app.pop("queue/cursors", "batch=10&consumerGroup=analytics").await.messages();
    assert_eq!(analytics.len(), 3);
    app.ack_all(&billing, "completed", Some("billing")).await;

    let db = app.db.connect().await;
    let cursor = |group: &'static str| {
        let db = &db;
        async move {
            db.query_one("SELECT committed FROM queen.log_consumers WHERE consumer_group = $1", &[&group])
                .await
                .expect("a cursor")
                .get::<_, i64>(0)
        }
    };
    assert_eq!(cursor("billing").await, 3);
    assert_eq!(cursor("analytics").await, 0, "analytics has acknowledged nothing");
    // An ack naming the wrong group cannot commit for the group that holds the lease: under
    // billing's cursor, analytics' lease is not its own.
    let wrong = app.ack_all(&analytics, "completed", Some("billing")).await;
    assert!(
        wrong.iter().all(|r| r["success"] == false && r["error"].as_str().is_some_and(|e| e.contains("lease"))),
        "{wrong:?}"
    );
    assert_eq!(cursor("analytics").await, 0);
    assert_eq!(app.pop("queue/cursors", "batch=10&consumerGroup=billing").await.status, StatusCode::NO_CONTENT);
}

#[actix_web::test]
async fn while_a_lease_is_live_the_groups_other_consumers_get_nothing_from_the_partition() {
    let app = TestApp::spawn().await;
    push_three(&app, "exclusive").await;
    let first = app.pop("queue/exclusive", "batch=1&consumerGroup=g").await;
    assert_eq!(first.transaction_ids(), vec!["m0"]);
    let second = app.pop("queue/exclusive", "batch=1&consumerGroup=g").await;
    assert_eq!(second.status, StatusCode::NO_CONTENT, "the partition is leased: {second:?}");
    let partition = app.pop("queue/exclusive/partition/p", "batch=1&consumerGroup=g").await;
    assert_eq!(partition.status, StatusCode::NO_CONTENT, "the partition route respects the lease too");
    let other_group = app.pop("queue/exclusive", "batch=1&consumerGroup=h").await;
    assert_eq!(other_group.transaction_ids(), vec!["m0"], "leases are per group");

    app.ack_all(&first.messages(), "completed", Some("g")).await;
    let next = app.pop("queue/exclusive", "batch=1&consumerGroup=g").await;
    assert_eq!(next.transaction_ids(), vec!["m1"], "the ack released the partition");
}

/// Pops until something comes back, or fails after `limit`.
async fn pop_until_delivered(app: &TestApp, route: &str, query: &str, limit: Duration) -> Answer {
    let deadline = Instant::now() + limit;
    loop {
        let answer = app.pop(route, &format!("{query}&wait=true&timeout=500")).await;
        if answer.status == StatusCode::OK {
            return answer;
        }
        assert!(Instant::now() < deadline, "nothing was delivered within {limit:?}");
    }
}

#[actix_web::test]
async fn an_expired_lease_delivers_the_messages_again_under_a_new_lease() {
    let app = TestApp::spawn().await;
    let configured = app.post("/api/v1/configure", &json!({"queue": "expiry", "options": {"leaseTime": 1}})).await;
    assert_eq!(configured.body["configured"], true);
    push_three(&app, "expiry").await;
    let popped_at = Instant::now();
    let first = app.pop("queue/expiry", "batch=3&consumerGroup=g").await.messages();
    assert_eq!(first.len(), 3);

    let again = pop_until_delivered(&app, "queue/expiry", "batch=3&consumerGroup=g", Duration::from_secs(10)).await;
    assert!(popped_at.elapsed() >= Duration::from_millis(900), "redelivered before the lease ran out");
    let second = again.messages();
    assert_eq!(again.transaction_ids(), vec!["m0", "m1", "m2"]);
    assert_ne!(second[0]["leaseId"], first[0]["leaseId"]);
    assert_eq!(second[0]["deliveryAttempt"], 2);
    assert_eq!(second[0]["data"], first[0]["data"], "a redelivery carries the same data");

    let stale = app.ack_all(&first, "completed", Some("g")).await;
    assert!(stale.iter().all(|r| r["success"] == false), "the expired lease's ack is refused: {stale:?}");
    assert!(stale[0]["error"].as_str().is_some_and(|e| e.contains("lease")));
    let fresh = app.ack_all(&second, "completed", Some("g")).await;
    assert!(fresh.iter().all(|r| r["success"] == true), "{fresh:?}");
    assert_eq!(app.count("SELECT redelivery_count::bigint FROM queen.log_consumers").await, 1, "the expiry is counted");
}
