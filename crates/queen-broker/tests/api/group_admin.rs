//! Group administration: listing with lag, one group, lagging groups, deletion.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

async fn push(app: &TestApp, queue: &str, count: usize) {
    let items: Vec<Value> =
        (0..count).map(|i| json!({"queue": queue, "partition": "p", "payload": {"i": i}})).collect();
    app.push(Value::Array(items)).await;
}

fn group<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array().expect("a list").iter().find(|g| g["name"] == name).unwrap_or_else(|| panic!("{name} in {list}"))
}

#[actix_web::test]
async fn the_group_list_shows_every_group_with_its_lag_per_queue() {
    let app = TestApp::spawn().await;
    push(&app, "orders", 5).await;
    push(&app, "invoices", 2).await;
    let billing = app.pop("queue/orders", "batch=2&consumerGroup=billing").await.messages();
    app.ack_all(&billing, "completed", Some("billing")).await;
    app.pop("queue/invoices", "batch=10&consumerGroup=billing&autoAck=true").await;
    app.pop("queue/orders", "batch=1&consumerGroup=analytics&subscriptionMode=new").await;

    let list = app.get("/api/v1/consumer-groups").await;
    assert_eq!(list.status, StatusCode::OK);
    let billing = group(&list.body, "billing");
    let orders = billing["queues"].as_array().expect("queues").iter().find(|q| q["queue"] == "orders").expect("orders");
    assert_eq!(orders["lagMessages"], 3);
    assert_eq!(orders["partitions"], 1);
    assert_eq!(billing["totalLag"], 3, "invoices has no lag");
    assert_eq!(group(&list.body, "analytics")["totalLag"], 0, "`new` skipped the backlog");
    assert_eq!(group(&list.body, "analytics")["queues"][0]["subscriptionMode"], "new");

    let one = app.get("/api/v1/consumer-groups/billing").await;
    assert_eq!(one.status, StatusCode::OK);
    assert_eq!(one.body["name"], "billing");
    assert_eq!(one.body["partitions"].as_array().expect("partitions").len(), 2);
    assert_eq!(app.get("/api/v1/consumer-groups/nobody").await.status, StatusCode::NOT_FOUND);
}

/// A partition first pushed to after the group's last pop has no cursor of the group yet; its
/// messages still count in the group's lag, as in its depth.
#[actix_web::test]
async fn a_partition_the_group_has_not_reached_yet_counts_in_its_lag() {
    let app = TestApp::spawn().await;
    push(&app, "feed", 2).await;
    let read = app.pop("queue/feed", "batch=10&consumerGroup=reader").await.messages();
    app.ack_all(&read, "completed", Some("reader")).await;
    let later: Vec<Value> =
        (0..5).map(|i| json!({"queue": "feed", "partition": "later", "payload": {"i": i}})).collect();
    app.push(Value::Array(later)).await;

    let list = app.get("/api/v1/consumer-groups").await;
    assert_eq!(group(&list.body, "reader")["totalLag"], 5, "{}", list.body);
    let one = app.get("/api/v1/consumer-groups/reader").await;
    let partitions = one.body["partitions"].as_array().expect("partitions");
    let later = partitions.iter().find(|p| p["partition"] == "later").unwrap_or_else(|| panic!("{}", one.body));
    assert_eq!(later["lagMessages"], 5, "{later}");
    let depth = app.get("/api/v1/resources/queues/feed/depth?group=reader").await;
    assert_eq!(depth.body["pending"], 5, "depth agrees: {}", depth.body);
    let status = app.get("/api/v1/status/queues").await;
    let feed = status.body["queues"].as_array().expect("queues").iter().find(|q| q["name"] == "feed").cloned();
    assert!(feed.is_some_and(|feed| feed.to_string().contains("\"reader\"")), "{}", status.body);
}

#[actix_web::test]
async fn lagging_lists_groups_whose_oldest_unread_message_is_old_enough() {
    let app = TestApp::spawn().await;
    push(&app, "slow", 3).await;
    app.pop("queue/slow", "batch=1&consumerGroup=l&autoAck=true").await;
    let default = app.get("/api/v1/consumer-groups/lagging").await;
    assert_eq!(default.status, StatusCode::OK, "not read as a group named `lagging`");
    assert_eq!(default.body, json!([]), "nothing is an hour old");
    let deadline = Instant::now() + Duration::from_secs(10);
    let lagging = loop {
        let answer = app.get("/api/v1/consumer-groups/lagging?minLagSeconds=1").await;
        if answer.body.as_array().is_some_and(|a| !a.is_empty()) || Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let entry = &lagging.body[0];
    assert_eq!(entry["consumerGroup"], "l");
    assert_eq!(entry["lagMessages"], 2);
    assert!(entry["lagSeconds"].as_f64().is_some_and(|s| s >= 1.0));
}

#[actix_web::test]
async fn a_deleted_group_starts_over_from_its_subscription() {
    let app = TestApp::spawn().await;
    push(&app, "again", 4).await;
    push(&app, "elsewhere", 2).await;
    for queue in ["again", "elsewhere"] {
        let messages = app.pop(&format!("queue/{queue}"), "batch=10&consumerGroup=d").await.messages();
        app.ack_all(&messages, "completed", Some("d")).await;
    }
    let deleted = app.delete("/api/v1/consumer-groups/d").await;
    assert_eq!(deleted.status, StatusCode::OK);
    assert_eq!(deleted.body["deletedPartitions"], 2);
    assert_eq!(deleted.body["metadataDeleted"], true);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_consumers").await, 0);
    assert_eq!(app.pop("queue/again", "batch=10&consumerGroup=d&subscriptionMode=all").await.messages().len(), 4);
}

#[actix_web::test]
async fn deleting_a_group_on_one_queue_leaves_its_other_queues_alone() {
    let app = TestApp::spawn().await;
    push(&app, "one", 2).await;
    push(&app, "two", 2).await;
    for queue in ["one", "two"] {
        let messages = app.pop(&format!("queue/{queue}"), "batch=10&consumerGroup=d").await.messages();
        app.ack_all(&messages, "completed", Some("d")).await;
    }
    let deleted = app.delete("/api/v1/consumer-groups/d/queues/one").await;
    assert_eq!(deleted.body["deletedPartitions"], 1);
    assert_eq!(app.pop("queue/one", "batch=10&consumerGroup=d").await.messages().len(), 2, "re-consumed");
    assert_eq!(app.pop("queue/two", "batch=10&consumerGroup=d").await.status, StatusCode::NO_CONTENT, "untouched");
}

#[actix_web::test]
async fn deleting_a_group_but_keeping_its_registration_restarts_it_from_the_stored_start() {
    let app = TestApp::spawn().await;
    push(&app, "kept", 3).await;
    assert_eq!(
        app.pop("queue/kept", "batch=10&consumerGroup=k&subscriptionMode=new").await.status,
        StatusCode::NO_CONTENT
    );
    push(&app, "kept", 2).await;
    let deleted = app.delete("/api/v1/consumer-groups/k?deleteMetadata=false").await;
    assert_eq!(deleted.body["metadataDeleted"], false);
    // Re-registering is not possible while the registration stands: `all` is ignored.
    let again = app.pop("queue/kept", "batch=10&consumerGroup=k&subscriptionMode=all").await;
    assert_eq!(again.messages().len(), 2, "from the registration time, not from the start");
}

#[actix_web::test]
async fn a_group_deleted_during_a_batch_refuses_that_batchs_acks() {
    let app = TestApp::spawn().await;
    push(&app, "gone", 2).await;
    let in_flight = app.pop("queue/gone", "batch=2&consumerGroup=x").await.messages();
    app.delete("/api/v1/consumer-groups/x").await;
    let acks = app.ack_all(&in_flight, "completed", Some("x")).await;
    assert!(acks.iter().all(|a| a["success"] == false), "{acks:?}");
}
