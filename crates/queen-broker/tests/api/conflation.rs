//! Conflation: a conflating group is served only the newest visible message of a partition, the
//! choice is stored at the group's registration, and every answer to a pop that asks carries the
//! echo the client checks.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp};

/// Pushes `count` messages `{prefix}{i}` to the partition, one call each (one segment each).
async fn push_series(app: &TestApp, queue: &str, partition: &str, prefix: &str, range: std::ops::Range<u32>) {
    for i in range {
        app.push_one(queue, partition, &format!("{prefix}{i}"), json!({"i": i})).await;
    }
}

fn echo(answer: &Answer) -> (Value, Value) {
    (answer.body["conflation"].clone(), answer.body["conflationConflict"].clone())
}

#[actix_web::test]
async fn a_conflating_group_gets_the_newest_message_and_its_ack_retires_the_rest() {
    let app = TestApp::spawn().await;
    push_series(&app, "prices", "eur", "m", 0..10).await;
    let query = "batch=10&consumerGroup=ticker&conflation=true&subscriptionMode=all";

    let first = app.pop("queue/prices", query).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.transaction_ids(), vec!["m9"], "only the newest of ten");
    assert_eq!(echo(&first), (json!(true), Value::Null));
    let acked = app.ack_all(&first.messages(), "completed", Some("ticker")).await;
    assert_eq!(acked[0]["success"], true, "{acked:?}");

    let empty = app.pop("queue/prices", query).await;
    assert_eq!(empty.status, StatusCode::OK, "an empty answer to a conflating pop is a body, not a 204");
    assert_eq!(empty.messages(), Vec::<Value>::new());
    assert_eq!(echo(&empty), (json!(true), Value::Null));

    push_series(&app, "prices", "eur", "m", 10..13).await;
    assert_eq!(app.pop("queue/prices", query).await.transaction_ids(), vec!["m12"]);
    let lag = app.get("/api/v1/consumer-groups/ticker").await;
    assert_eq!(lag.body["queues"][0]["conflation"], true, "{:?}", lag.body);
    assert_eq!(lag.body["partitions"][0]["lagMessages"], 1, "behind the cursor: only the delivered one, {lag:?}");

    // Another group reads the same log in full.
    let all = app.pop("queue/prices", "batch=100&consumerGroup=audit&subscriptionMode=all").await;
    assert_eq!(all.transaction_ids().len(), 13);
    assert_eq!(echo(&all), (Value::Null, Value::Null), "no echo for a pop that did not ask");
}

#[actix_web::test]
async fn each_claimed_partition_delivers_its_newest_message() {
    let app = TestApp::spawn().await;
    for partition in ["a", "b", "c"] {
        push_series(&app, "fx", partition, partition, 0..4).await;
    }
    let answer = app.pop("queue/fx", "batch=10&partitions=3&consumerGroup=g&conflation=true").await;
    let mut got = answer.transaction_ids();
    got.sort();
    assert_eq!(got, vec!["a3", "b3", "c3"]);
    let leases: std::collections::BTreeSet<String> =
        answer.messages().iter().map(|m| m["leaseId"].as_str().expect("a lease").to_owned()).collect();
    assert_eq!(leases.len(), 1, "one lease for the claimed partitions");
}

#[actix_web::test]
async fn the_choice_made_at_registration_wins_and_a_conflicting_ask_is_echoed() {
    let app = TestApp::spawn().await;
    push_series(&app, "q", "p", "m", 0..3).await;

    // Registered conflating: a later pop that does not ask is still served the newest.
    let first = app.pop("queue/q", "batch=10&consumerGroup=latest&conflation=true").await;
    assert_eq!(first.transaction_ids(), vec!["m2"]);
    app.ack_all(&first.messages(), "completed", Some("latest")).await;
    push_series(&app, "q", "p", "m", 3..5).await;
    let plain = app.pop("queue/q", "batch=10&consumerGroup=latest").await;
    assert_eq!(plain.transaction_ids(), vec!["m4"]);
    assert_eq!(echo(&plain), (Value::Null, Value::Null));

    // Registered without: asking later is refused in the echo, and every message is served.
    app.pop("queue/q", "batch=1&consumerGroup=everything&subscriptionMode=new").await;
    push_series(&app, "q", "p", "m", 5..7).await;
    let asked = app.pop("queue/q", "batch=10&consumerGroup=everything&conflation=true").await;
    assert_eq!(asked.transaction_ids(), vec!["m5", "m6"]);
    assert_eq!(echo(&asked), (Value::Null, json!(true)));
    let drained = app.pop("queue/q", "batch=10&consumerGroup=everything&conflation=true&wait=false").await;
    assert_eq!(drained.status, StatusCode::OK);
    assert_eq!(echo(&drained), (Value::Null, json!(true)), "the conflict is echoed on empty answers too");

    // An answer given before the pop looks (pop maintenance) echoes the registration too.
    let switch = "/api/v1/system/maintenance/pop";
    assert_eq!(app.post(switch, &json!({"enabled": true})).await.status, StatusCode::OK);
    for group in ["everything", "latest"] {
        let paused = app.pop("queue/q", &format!("batch=10&consumerGroup={group}&conflation=true&wait=false")).await;
        assert_eq!(paused.body["paused"], true, "{:?}", paused.body);
        let expected = if group == "latest" { (json!(true), Value::Null) } else { (Value::Null, json!(true)) };
        assert_eq!(echo(&paused), expected, "{group}: {:?}", paused.body);
    }
    assert_eq!(app.post(switch, &json!({"enabled": false})).await.status, StatusCode::OK);
}

#[actix_web::test]
async fn a_failed_or_expired_delivery_comes_back_as_the_newest_message() {
    let app = TestApp::spawn().await;
    push_series(&app, "retries", "p", "m", 0..3).await;
    let query = "batch=10&consumerGroup=g&conflation=true&leaseSeconds=1";
    let first = app.pop("queue/retries", query).await;
    assert_eq!(first.transaction_ids(), vec!["m2"]);
    app.ack_all(&first.messages(), "failed", Some("g")).await;

    let again = app.pop("queue/retries", query).await;
    assert_eq!(again.transaction_ids(), vec!["m2"], "a failed delivery is served again");
    assert_eq!(again.messages()[0]["deliveryAttempt"], 2);

    // A newer message while the lease runs out: that one is served, as a first delivery.
    push_series(&app, "retries", "p", "m", 3..4).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let after = loop {
        let answer = app.pop("queue/retries", query).await;
        if !answer.messages().is_empty() || std::time::Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(after.transaction_ids(), vec!["m3"]);
    assert_eq!(after.messages()[0]["deliveryAttempt"], 1, "a new head: its counters start over");
}

#[actix_web::test]
async fn conflation_needs_a_group_and_refuses_auto_ack() {
    let app = TestApp::spawn().await;
    push_series(&app, "refused", "p", "m", 0..2).await;
    let without_group = app.pop("queue/refused", "conflation=true").await;
    assert_eq!(without_group.status, StatusCode::BAD_REQUEST);
    assert!(without_group.body["error"].as_str().unwrap_or_default().contains("consumerGroup"), "{without_group:?}");
    let auto_ack = app.pop("queue/refused", "conflation=true&consumerGroup=g&autoAck=true").await;
    assert_eq!(auto_ack.status, StatusCode::BAD_REQUEST);
    assert!(auto_ack.body["error"].as_str().unwrap_or_default().contains("autoAck"), "{auto_ack:?}");
    let bad = app.pop("queue/refused", "conflation=maybe&consumerGroup=g").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(app.count("SELECT count(*) FROM queen.consumer_groups_metadata").await, 0, "nothing registered");
    assert_eq!(app.count("SELECT count(*) FROM queen.log_consumers").await, 0, "no cursor");
}
