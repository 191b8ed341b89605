//! When a pushed message may be served: `delayedProcessing` (a message is visible that long after
//! its push), `windowBuffer` (a partition is served once it has been quiet that long) and
//! `retryDelay` (a failed message waits that long). Delays of an hour are made to pass by ageing
//! segments in the database; the one-second delays really elapse, to show that a parked long poll
//! wakes for them without a push.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::TestApp;
use crate::long_poll::{push_once_parked, until_parked};

/// Moves the partition's segments and its last push `age` into the past.
async fn age_partition(app: &TestApp, queue: &str, partition: &str, age: &str) {
    let sql = "WITH target AS (
                   SELECT p.id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                    WHERE q.name = $1 AND p.name = $2),
               segments AS (
                   UPDATE queen.log_segments SET created_at = created_at - $3::text::interval
                    WHERE partition_id IN (SELECT id FROM target))
               UPDATE queen.partitions SET last_segment_at = last_segment_at - $3::text::interval
                WHERE id IN (SELECT id FROM target)";
    app.db.connect().await.execute(sql, &[&queue, &partition, &age]).await.expect("age the partition");
}

#[actix_web::test]
async fn a_delayed_message_is_served_once_its_delay_has_passed_and_wakes_a_long_poll() {
    let app = TestApp::spawn().await;
    app.configure("later", json!({"delayedProcessing": 1})).await;
    let pushed_at = Instant::now();
    app.push_one("later", "p", "m", json!("m")).await;
    assert_eq!(app.pop("queue/later", "batch=1").await.status, StatusCode::NO_CONTENT, "not visible yet");

    // No push comes: the parked pop must wake by itself when the message becomes visible.
    let answer = app.pop("queue/later", "batch=1&wait=true&timeout=10000").await;
    let waited = pushed_at.elapsed();
    assert_eq!(answer.transaction_ids(), vec!["m"]);
    assert!(waited >= Duration::from_millis(900), "served {waited:?} after the push, inside its delay");
    assert!(waited < Duration::from_secs(5), "served only {waited:?} after the push");
}

#[actix_web::test]
async fn a_delay_holds_back_only_the_messages_inside_it_and_a_change_applies_to_stored_ones() {
    let app = TestApp::spawn().await;
    app.configure("mixed", json!({"delayedProcessing": 3600})).await;
    app.push_one("mixed", "old", "old-1", json!(1)).await;
    app.push_one("mixed", "split", "split-1", json!(2)).await;
    age_partition(&app, "mixed", "old", "2 hours").await;
    age_partition(&app, "mixed", "split", "2 hours").await;
    app.push_one("mixed", "split", "split-2", json!(3)).await;
    app.push_one("mixed", "fresh", "fresh-1", json!(4)).await;

    // The old partition and the first half of the split one; neither recent message.
    let first = app.pop("queue/mixed", "batch=10&partitions=10").await;
    let mut served = first.transaction_ids();
    served.sort();
    assert_eq!(served, vec!["old-1", "split-1"]);
    app.ack_all(&first.messages(), "completed", None).await;
    assert_eq!(app.pop("queue/mixed/partition/fresh", "batch=10").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.pop("queue/mixed", "batch=10&partitions=10&consumerGroup=g").await.messages().len(), 2);

    app.configure("mixed", json!({"delayedProcessing": 0})).await;
    let mut rest = app.pop("queue/mixed", "batch=10&partitions=10").await.transaction_ids();
    rest.sort();
    assert_eq!(rest, vec!["fresh-1", "split-2"], "the shorter delay applies to what was already stored");
}

#[actix_web::test]
async fn a_delay_the_broker_has_not_heard_of_yet_still_holds_back_what_it_covers() {
    let app = TestApp::spawn().await;
    app.push_one("unaware", "old", "old-1", json!(1)).await;
    app.push_one("unaware", "fresh", "fresh-1", json!(2)).await;
    // Another group's pop has the broker know the queue as it is: without rules.
    let warm = app.pop("queue/unaware", "batch=10&partitions=10&consumerGroup=warm").await;
    assert_eq!(warm.messages().len(), 2);

    // A delay set behind the broker's back, as a configure on another broker whose notice has not
    // arrived yet: the fresh partition's message is inside it, the old one's is not.
    let set_delay = "UPDATE queen.queues SET delayed_processing_seconds = 3600 WHERE name = 'unaware'";
    app.db.connect().await.execute(set_delay, &[]).await.expect("set the delay");
    age_partition(&app, "unaware", "old", "2 hours").await;
    let served = app.pop("queue/unaware", "batch=10&partitions=10&consumerGroup=g").await;
    assert_eq!(served.transaction_ids(), vec!["old-1"], "nothing inside the delay is served early");
}

#[actix_web::test]
async fn a_window_serves_a_partition_whole_once_it_has_been_quiet() {
    let app = TestApp::spawn().await;
    app.configure("burst", json!({"windowBuffer": 1})).await;
    for i in 0..3 {
        app.push_one("burst", "p", &format!("b{i}"), json!(i)).await;
    }
    let last_push = Instant::now();
    app.push_one("burst", "other", "o", json!("o")).await;
    assert_eq!(app.pop("queue/burst/partition/p", "batch=10").await.status, StatusCode::NO_CONTENT);

    let answer = app.pop("queue/burst/partition/p", "batch=10&wait=true&timeout=10000").await;
    let waited = last_push.elapsed();
    assert_eq!(answer.transaction_ids(), vec!["b0", "b1", "b2"], "the whole burst, together");
    assert!(waited >= Duration::from_millis(900), "served {waited:?} after the last push, inside the window");
    assert!(waited < Duration::from_secs(5), "served only {waited:?} after the last push");

    // A push reopens the partition's window.
    app.configure("burst", json!({"windowBuffer": 3600})).await;
    age_partition(&app, "burst", "other", "2 hours").await;
    assert_eq!(app.pop("queue/burst", "batch=10").await.transaction_ids(), vec!["o"], "a quiet partition");
    app.push_one("burst", "other", "o2", json!("o2")).await;
    assert_eq!(app.pop("queue/burst", "batch=10").await.status, StatusCode::NO_CONTENT, "its window is open again");
}

#[actix_web::test]
async fn a_failed_message_is_not_served_again_before_the_retry_delay() {
    let app = TestApp::spawn().await;
    app.configure("patient", json!({"retryDelay": 800, "retryLimit": 5})).await;
    app.push_one("patient", "p", "m", json!("m")).await;
    app.push_one("patient", "q", "n", json!("n")).await;
    let first = app.pop("queue/patient/partition/p", "batch=1").await.messages();
    let failed_at = Instant::now();
    assert_eq!(app.ack_all(&first, "failed", None).await[0]["success"], true);
    assert_eq!(app.pop("queue/patient/partition/p", "batch=1").await.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.pop("queue/patient", "batch=1").await.transaction_ids(),
        vec!["n"],
        "the other partition is served meanwhile"
    );

    let again = app.pop("queue/patient", "batch=1&wait=true&timeout=10000").await;
    let waited = failed_at.elapsed();
    assert_eq!(again.transaction_ids(), vec!["m"]);
    assert_eq!(again.messages()[0]["deliveryAttempt"], 2);
    assert!(waited >= Duration::from_millis(700), "redelivered {waited:?} after the failure");
    assert!(waited < Duration::from_secs(5), "redelivered only {waited:?} after the failure");

    // `retry` is not a failure: no delay.
    assert_eq!(app.ack_all(&again.messages(), "retry", None).await[0]["success"], true);
    assert_eq!(app.pop("queue/patient", "batch=1").await.transaction_ids(), vec!["m"]);
}

#[actix_web::test]
async fn a_long_poll_waiting_out_a_held_partition_takes_a_push_to_another_at_once() {
    let app = TestApp::spawn().await;
    app.configure("lanes", json!({"retryDelay": 60000})).await;
    app.push_one("lanes", "held", "h", json!("h")).await;
    let popped = app.pop("queue/lanes", "batch=1").await.messages();
    app.ack_all(&popped, "failed", None).await;
    let waiting = app.pop("queue/lanes", "batch=1&wait=true&timeout=20000");
    let (answer, pushed_at) = futures::join!(waiting, push_once_parked(&app, "lanes", "open", "o"));
    assert_eq!(answer.transaction_ids(), vec!["o"]);
    assert!(pushed_at.elapsed() < Duration::from_secs(2), "the held partition kept the other waiting");
}

#[actix_web::test]
async fn a_long_poll_held_by_a_window_is_served_as_soon_as_the_window_is_shortened() {
    let app = TestApp::spawn().await;
    app.configure("reopened", json!({"windowBuffer": 3600})).await;
    app.push_one("reopened", "p", "w", json!("w")).await;
    let waiting = app.pop("queue/reopened", "batch=1&wait=true&timeout=20000");
    let change = async {
        until_parked(&app, 1).await;
        let changed_at = Instant::now();
        app.configure("reopened", json!({"windowBuffer": 0})).await;
        changed_at
    };
    let (answer, changed_at) = futures::join!(waiting, change);
    assert_eq!(answer.transaction_ids(), vec!["w"]);
    assert!(changed_at.elapsed() < Duration::from_secs(2), "served {:?} after the change", changed_at.elapsed());
}
