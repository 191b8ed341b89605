//! Where a group starts: the subscription table of the fan-out seed, the durable registration,
//! and changing the stored subscription.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

async fn push(app: &TestApp, queue: &str, partition: &str, ids: std::ops::Range<i64>) -> Vec<Value> {
    let items: Vec<Value> = ids
        .map(|i| json!({"queue": queue, "partition": partition, "transactionId": format!("{partition}-{i}"), "payload": {"i": i}}))
        .collect();
    app.push(Value::Array(items)).await
}

#[actix_web::test]
async fn a_new_group_by_default_reads_everything_retained_and_registers() {
    let app = TestApp::spawn().await;
    push(&app, "all", "p", 0..5).await;
    assert_eq!(app.pop("queue/all", "batch=10&consumerGroup=fresh").await.data_ints("i"), vec![0, 1, 2, 3, 4]);
    let row = app
        .db
        .connect()
        .await
        .query_one("SELECT subscription_mode, subscription_from IS NULL FROM queen.consumer_groups_metadata", &[])
        .await
        .expect("the first pop wrote the registration");
    assert_eq!((row.get::<_, String>(0), row.get::<_, bool>(1)), ("all".to_owned(), true));
}

#[actix_web::test]
async fn a_new_group_with_new_skips_the_backlog_and_sees_later_pushes() {
    let app = TestApp::spawn().await;
    push(&app, "new", "p", 0..5).await;
    let first = app.pop("queue/new", "batch=10&consumerGroup=n&subscriptionMode=new").await;
    assert_eq!(first.status, StatusCode::NO_CONTENT, "the backlog is skipped");
    push(&app, "new", "p", 5..6).await;
    assert_eq!(app.pop("queue/new", "batch=10&consumerGroup=n&subscriptionMode=new").await.data_ints("i"), vec![5]);
    let now = app.pop("queue/new", "batch=10&consumerGroup=from-now&subscriptionFrom=now").await;
    assert_eq!(now.status, StatusCode::NO_CONTENT, "subscriptionFrom=now is `new`");
}

#[actix_web::test]
async fn a_new_group_from_a_timestamp_starts_at_the_first_segment_at_or_after_it() {
    let app = TestApp::spawn().await;
    push(&app, "ts", "p", 0..3).await;
    let later = push(&app, "ts", "p", 3..5).await;
    let at = app.segment_time(&later[0]).await;
    let query = format!("batch=10&consumerGroup=f&subscriptionFrom={}", at.to_rfc3339().replace('+', "%2B"));
    assert_eq!(app.pop("queue/ts", &query).await.data_ints("i"), vec![3, 4]);
}

#[actix_web::test]
async fn a_partition_created_after_registration_is_read_from_the_stored_start() {
    let app = TestApp::spawn().await;
    push(&app, "later", "a", 0..3).await;
    let first = app.pop("queue/later", "batch=10&consumerGroup=n&subscriptionMode=new").await;
    assert_eq!(first.status, StatusCode::NO_CONTENT);
    // A partition born after the group registered: its whole backlog is after the start.
    push(&app, "later", "b", 10..13).await;
    assert_eq!(app.pop("queue/later", "batch=10&consumerGroup=n").await.data_ints("i"), vec![10, 11, 12]);
    // Even on a queue that did not exist at the group's first pop.
    let empty = app.pop("queue/not-yet", "batch=10&consumerGroup=n&subscriptionMode=new").await;
    assert_eq!(empty.status, StatusCode::NO_CONTENT);
    push(&app, "not-yet", "p", 20..22).await;
    assert_eq!(
        app.pop("queue/not-yet", "batch=10&consumerGroup=n&subscriptionMode=new").await.data_ints("i"),
        vec![20, 21]
    );
}

#[actix_web::test]
async fn a_groups_start_is_fixed_at_its_first_pop_and_a_cursor_is_never_reseeded() {
    let app = TestApp::spawn().await;
    push(&app, "fixed", "p", 0..3).await;
    assert_eq!(
        app.pop("queue/fixed", "batch=10&consumerGroup=g&subscriptionMode=new").await.status,
        StatusCode::NO_CONTENT
    );
    // Asking for `all` later changes nothing: the registration and the cursor stand.
    assert_eq!(
        app.pop("queue/fixed", "batch=10&consumerGroup=g&subscriptionMode=all").await.status,
        StatusCode::NO_CONTENT
    );
    push(&app, "fixed", "q", 5..7).await;
    assert_eq!(
        app.pop("queue/fixed", "batch=10&consumerGroup=g&subscriptionMode=all").await.data_ints("i"),
        vec![5, 6]
    );
}

#[actix_web::test]
async fn updating_the_subscription_moves_no_cursor_but_sets_where_new_partitions_start() {
    let app = TestApp::spawn().await;
    push(&app, "sub", "a", 0..3).await;
    let messages = app.pop("queue/sub", "batch=10&consumerGroup=g").await.messages();
    app.ack_all(&messages, "completed", Some("g")).await;
    push(&app, "sub", "b", 10..12).await;
    let later_in_b = push(&app, "sub", "b", 12..14).await;
    let at = app.segment_time(&later_in_b[0]).await;

    let answer =
        app.post("/api/v1/consumer-groups/g/subscription", &json!({"subscriptionTimestamp": at.to_rfc3339()})).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["rowsUpdated"], 1);
    assert_eq!(
        app.count("SELECT committed FROM queen.log_consumers WHERE consumer_group = 'g'").await,
        3,
        "no cursor moved"
    );
    // Partition b has no cursor for g yet: it starts at the new time.
    assert_eq!(app.pop("queue/sub", "batch=10&consumerGroup=g").await.data_ints("i"), vec![12, 13]);

    let missing = app.post("/api/v1/consumer-groups/g/subscription", &json!({})).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    let unknown = app
        .post("/api/v1/consumer-groups/nobody/subscription", &json!({"subscriptionTimestamp": at.to_rfc3339()}))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
}

#[actix_web::test]
async fn a_group_that_only_sought_takes_a_subscription_update_for_partitions_to_come() {
    let app = TestApp::spawn().await;
    push(&app, "sought", "a", 0..3).await;
    let sought = app.post("/api/v1/consumer-groups/g/queues/sought/seek", &json!({"toEnd": true})).await;
    assert_eq!(sought.status, StatusCode::OK, "{sought:?}");
    push(&app, "sought", "b", 10..12).await;
    let later_in_b = push(&app, "sought", "b", 12..14).await;
    let at = app.segment_time(&later_in_b[0]).await;

    let answer =
        app.post("/api/v1/consumer-groups/g/subscription", &json!({"subscriptionTimestamp": at.to_rfc3339()})).await;
    assert_eq!(answer.status, StatusCode::OK, "the group has cursors on a queue: {answer:?}");
    assert_eq!(answer.body["queues"], json!(["sought"]), "{answer:?}");
    // Its cursor on a stays at the end; b, which it has never read, starts at the new time.
    push(&app, "sought", "a", 3..4).await;
    let mut read = app.pop("queue/sought", "batch=10&consumerGroup=g").await.data_ints("i");
    read.extend(app.pop("queue/sought", "batch=10&consumerGroup=g").await.data_ints("i"));
    read.sort_unstable();
    assert_eq!(read, vec![3, 12, 13]);

    // Queue mode has cursors too, but no start to change: it always reads from the oldest message.
    app.pop("queue/sought", "batch=10").await;
    let queue_mode = app
        .post("/api/v1/consumer-groups/__QUEUE_MODE__/subscription", &json!({"subscriptionTimestamp": at.to_rfc3339()}))
        .await;
    assert_eq!(queue_mode.status, StatusCode::BAD_REQUEST, "{queue_mode:?}");
    assert_eq!(
        app.count("SELECT count(*) FROM queen.consumer_groups_metadata WHERE consumer_group = '__QUEUE_MODE__'").await,
        0
    );
}

/// A `new` group waiting on a queue that is deleted meanwhile (its registration with it) gets
/// what a push that creates the queue again brings: the group subscribed before that push.
#[actix_web::test]
async fn a_new_group_waiting_through_its_queues_deletion_gets_the_push_that_creates_it_again() {
    let app = TestApp::spawn().await;
    app.push_one("orders", "p", "m0", json!(0)).await;
    let waiting = app.pop("queue/orders", "batch=10&wait=true&timeout=5000&consumerGroup=g&subscriptionMode=new");
    let meanwhile = async {
        crate::long_poll::until_parked(&app, 1).await;
        assert_eq!(app.delete("/api/v1/resources/queues/orders").await.status, StatusCode::OK);
        app.push_one("orders", "p", "m1", json!(1)).await;
    };
    let (answer, ()) = tokio::join!(waiting, meanwhile);
    assert_eq!(answer.transaction_ids(), vec!["m1"]);
}

/// A `new` group on a queue of many partitions with history makes its cursors (at their ends) a
/// few partitions per look, and a long poll goes on looking: a message waiting on a partition it
/// has not reached yet is served without another push to wake it.
#[actix_web::test]
async fn a_new_group_reaches_a_message_past_many_partitions_it_starts_at_the_end_of() {
    let app = TestApp::spawn().await;
    for i in 0..40 {
        app.push_one("wide", &format!("p{i:02}"), &format!("old-{i}"), json!(i)).await;
    }
    let first = app.pop("queue/wide", "batch=10&consumerGroup=g&subscriptionMode=new").await;
    assert_eq!(first.status, StatusCode::NO_CONTENT, "{first:?}");
    app.push_one("wide", "p39", "fresh", json!("fresh")).await;
    let started = std::time::Instant::now();
    let served = app.pop("queue/wide", "batch=10&wait=true&timeout=10000&consumerGroup=g").await;
    assert_eq!(served.transaction_ids(), vec!["fresh"]);
    // Not at the long poll's last look, at its timeout.
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "served after {:?}", started.elapsed());
}

/// `pop.default_subscription_mode = "new"` (upstream's `DEFAULT_SUBSCRIPTION_MODE`): a new group
/// whose first pop names no mode skips the backlog; one that names `all` still reads it.
#[actix_web::test]
async fn the_configured_default_mode_starts_a_group_that_names_none() {
    let app = TestApp::spawn_with(|config| config.pop.default_subscription_mode = "new".into()).await;
    app.push_one("defaulted", "p", "old", json!(1)).await;
    let first = app.pop("queue/defaulted", "batch=10&consumerGroup=fresh").await;
    assert!(first.messages().is_empty(), "the backlog is skipped: {first:?}");
    app.push_one("defaulted", "p", "new", json!(2)).await;
    assert_eq!(app.pop("queue/defaulted", "batch=10&consumerGroup=fresh").await.transaction_ids(), vec!["new"]);
    let all = app.pop("queue/defaulted", "batch=10&consumerGroup=replay&subscriptionMode=all").await;
    assert_eq!(all.transaction_ids(), vec!["old", "new"]);
}
