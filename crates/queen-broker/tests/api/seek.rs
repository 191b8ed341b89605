//! Seek: every row of the replay seed's "What to expect" table, and its refusals.

use chrono::{Duration, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp};

/// Pushes `count` messages to one partition in one push (one segment); returns their results.
async fn push_segment(app: &TestApp, queue: &str, first: usize, count: usize) -> Vec<Value> {
    let items: Vec<Value> = (first..first + count)
        .map(|i| json!({"queue": queue, "partition": "p", "transactionId": format!("m{i}"), "payload": {"i": i}}))
        .collect();
    app.push(Value::Array(items)).await
}

async fn seek(app: &TestApp, group: &str, queue: &str, body: Value) -> Answer {
    app.post(&format!("/api/v1/consumer-groups/{group}/queues/{queue}/seek"), &body).await
}

/// A group that has consumed and acknowledged everything of three two-message segments.
async fn consumed_queue(app: &TestApp, queue: &str, group: &str) -> Vec<Vec<Value>> {
    let mut segments = Vec::new();
    for s in 0..3 {
        segments.push(push_segment(app, queue, s * 2, 2).await);
    }
    let all = app.pop(&format!("queue/{queue}"), &format!("batch=10&consumerGroup={group}")).await.messages();
    assert_eq!(all.len(), 6);
    app.ack_all(&all, "completed", Some(group)).await;
    assert_eq!(
        app.pop(&format!("queue/{queue}"), &format!("consumerGroup={group}")).await.status,
        StatusCode::NO_CONTENT
    );
    segments
}

#[actix_web::test]
async fn to_end_lands_at_the_last_offset_releases_the_lease_and_resets_retries() {
    let app = TestApp::spawn().await;
    push_segment(&app, "end", 0, 5).await;
    let leased = app.pop("queue/end", "batch=2&consumerGroup=g").await.messages();
    app.ack_all(&leased[..1], "failed", Some("g")).await;
    let again = app.pop("queue/end", "batch=2&consumerGroup=g").await.messages();
    assert_eq!(app.count("SELECT retry_count::bigint FROM queen.log_consumers").await, 1);

    let answer = seek(&app, "g", "end", json!({"toEnd": true})).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["success"], true);
    assert_eq!(answer.body["seekToEnd"], true);
    assert_eq!((answer.body["queue"].as_str(), answer.body["queueName"].as_str()), (Some("end"), Some("end")));
    assert_eq!(answer.body["partitions"][0]["committed"], 5);
    let db = app.db.connect().await;
    let row = db
        .query_one(
            "SELECT committed, lease_expires_at IS NULL, retry_count, redelivery_count FROM queen.log_consumers",
            &[],
        )
        .await
        .expect("the cursor");
    assert_eq!(row.get::<_, i64>(0), 5);
    assert!(row.get::<_, bool>(1), "the live lease was released");
    assert_eq!((row.get::<_, i32>(2), row.get::<_, i32>(3)), (0, 0), "retry state reset");

    // The abandoned batch lies below the new position: its acks are refused as an expired lease
    // (the seeds), not told they are done, and change nothing.
    let late = app.ack_all(&again, "completed", Some("g")).await;
    let refused = |r: &serde_json::Value| {
        r["success"] == false && r["error"].as_str().is_some_and(|e| e.contains("expired lease"))
    };
    assert!(late.iter().all(refused), "{late:?}");
    assert_eq!(app.count("SELECT committed FROM queen.log_consumers").await, 5);
    assert_eq!(app.pop("queue/end", "consumerGroup=g").await.status, StatusCode::NO_CONTENT, "everything was skipped");
    push_segment(&app, "end", 5, 1).await;
    assert_eq!(app.pop("queue/end", "batch=10&consumerGroup=g").await.data_ints("i"), vec![5], "only later pushes");
}

#[actix_web::test]
async fn a_timestamp_inside_retained_history_lands_below_the_first_segment_at_or_after_it() {
    let app = TestApp::spawn().await;
    let segments = consumed_queue(&app, "replay", "g").await;
    let second = app.segment_time(&segments[1][0]).await;
    // Any time after the first segment and up to the second lands on the second.
    for at in [second, second - Duration::microseconds(1)] {
        let answer = seek(&app, "g", "replay", json!({"timestamp": at.to_rfc3339()})).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.body["partitions"][0]["committed"], 2, "just below segment 2 (offsets 3-4)");
    }
    let replayed = app.pop("queue/replay", "batch=10&consumerGroup=g").await;
    assert_eq!(replayed.data_ints("i"), vec![2, 3, 4, 5], "the very next pop replays from the segment, in order");
    let first = replayed.messages()[0].clone();
    assert_eq!(first["transactionId"], "m2", "a replay carries the same transaction id");
    assert_eq!(first["data"], json!({"i": 2}), "and the same data");
    assert_eq!(
        app.pop("queue/replay", "consumerGroup=other").await.messages().len(),
        1,
        "another group is not moved by the seek"
    );
}

#[actix_web::test]
async fn a_timestamp_older_than_everything_retained_replays_from_the_oldest_retained_segment() {
    let app = TestApp::spawn().await;
    consumed_queue(&app, "old", "g").await;
    // Retention has removed the first segment: the oldest retained one starts at offset 3.
    app.db
        .connect()
        .await
        .batch_execute(
            "DELETE FROM queen.log_segments WHERE base_offset = 1;
             UPDATE queen.partitions SET retained_from = 3;",
        )
        .await
        .expect("simulated retention");
    let answer = seek(&app, "g", "old", json!({"timestamp": "2001-01-01T00:00:00Z"})).await;
    assert_eq!(answer.body["partitions"][0]["committed"], 2, "just below the oldest retained segment");
    assert_eq!(app.pop("queue/old", "batch=10&consumerGroup=g").await.data_ints("i"), vec![2, 3, 4, 5]);
}

#[actix_web::test]
async fn a_timestamp_in_the_future_behaves_like_to_end() {
    let app = TestApp::spawn().await;
    push_segment(&app, "future", 0, 3).await;
    let future = (Utc::now() + Duration::days(1)).to_rfc3339();
    let answer = seek(&app, "g", "future", json!({"timestamp": future})).await;
    assert_eq!(answer.body["partitions"][0]["committed"], 3);
    assert_eq!(app.pop("queue/future", "consumerGroup=g").await.status, StatusCode::NO_CONTENT);
}

#[actix_web::test]
async fn an_empty_body_on_the_partition_route_means_to_end_and_the_queue_route_refuses_it() {
    let app = TestApp::spawn().await;
    let pushed = push_segment(&app, "empty", 0, 3).await;
    let partition = pushed[0]["partition_id"].as_str().expect("id").to_owned();
    let answer = app.post_raw(&format!("/api/v1/consumer-groups/g/queues/empty/partitions/{partition}/seek"), "").await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["partitions"][0]["committed"], 3);
    assert_eq!(answer.body["partitionsUpdated"], 1);

    let refused = app.post_raw("/api/v1/consumer-groups/g/queues/empty/seek", "").await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.body["error"], "Must specify toEnd=true or a timestamp");
    let neither = seek(&app, "g", "empty", json!({})).await;
    assert_eq!(neither.status, StatusCode::BAD_REQUEST);
    assert_eq!(neither.body["error"], "Must specify toEnd=true or a timestamp");
    // A toEnd that is not a boolean is refused, not read as false beside a timestamp.
    let mistyped = seek(&app, "g", "empty", json!({"toEnd": "yes", "timestamp": "2026-01-01T00:00:00Z"})).await;
    assert_eq!(mistyped.status, StatusCode::BAD_REQUEST, "{mistyped:?}");
    assert!(mistyped.body["error"].as_str().is_some_and(|e| e.contains("toEnd")), "{mistyped:?}");
}

#[actix_web::test]
async fn a_seek_on_a_queue_without_partitions_is_not_a_silent_success() {
    let app = TestApp::spawn().await;
    let missing = seek(&app, "g", "nowhere", json!({"toEnd": true})).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.body["success"], false);
    assert_eq!(missing.body["error"], "Queue not found or has no partitions");
    app.post("/api/v1/configure", &json!({"queue": "configured-only"})).await;
    let empty = seek(&app, "g", "configured-only", json!({"toEnd": true})).await;
    assert_eq!(empty.body["error"], "Queue not found or has no partitions");
}

#[actix_web::test]
async fn a_seek_positions_a_group_that_has_never_run() {
    let app = TestApp::spawn().await;
    push_segment(&app, "fresh", 0, 4).await;
    let answer = seek(&app, "late-starter", "fresh", json!({"toEnd": true})).await;
    assert_eq!(answer.body["partitionsUpdated"], 1);
    assert_eq!(
        app.count("SELECT count(*) FROM queen.log_consumers WHERE consumer_group = 'late-starter'").await,
        1,
        "the seek created the cursor"
    );
    push_segment(&app, "fresh", 4, 1).await;
    assert_eq!(app.pop("queue/fresh", "batch=10&consumerGroup=late-starter").await.data_ints("i"), vec![4]);
}

#[actix_web::test]
async fn a_seek_during_an_in_flight_batch_rejects_that_batchs_ack_as_an_expired_lease() {
    let app = TestApp::spawn().await;
    push_segment(&app, "inflight", 0, 3).await;
    let in_flight = app.pop("queue/inflight", "batch=3&consumerGroup=g").await.messages();
    let answer = seek(&app, "g", "inflight", json!({"timestamp": "2001-01-01T00:00:00Z"})).await;
    assert_eq!(answer.body["partitions"][0]["committed"], 0);
    let acks = app.ack_all(&in_flight, "completed", Some("g")).await;
    assert!(acks.iter().all(|a| a["success"] == false), "{acks:?}");
    assert!(acks[0]["error"].as_str().is_some_and(|e| e.contains("expired lease")), "{acks:?}");
    let again = app.pop("queue/inflight", "batch=3&consumerGroup=g").await;
    assert_eq!(again.data_ints("i"), vec![0, 1, 2], "the new position is served at once");
}

/// An ack that names no lease may commit what the group was delivered; after a backward seek,
/// what it was delivered before the seek is to come again, and such an ack of it (sent late, say)
/// must not skip the replay.
#[actix_web::test]
async fn after_a_backward_seek_an_ack_without_a_lease_cannot_skip_the_replay() {
    let app = TestApp::spawn().await;
    consumed_queue(&app, "replayed", "g").await;
    let answer = seek(&app, "g", "replayed", json!({"timestamp": "2001-01-01T00:00:00Z"})).await;
    assert_eq!(answer.body["partitions"][0]["committed"], 0);
    let partition = answer.body["partitions"][0]["partitionId"].clone();
    let late =
        app.post("/api/v1/ack", &json!({"transactionId": "m5", "partitionId": partition, "consumerGroup": "g"})).await;
    assert_eq!(late.body[0]["success"], false, "{late:?}");
    assert!(late.body[0]["error"].as_str().is_some_and(|e| e.contains("never received")), "{late:?}");
    assert_eq!(app.pop("queue/replayed", "batch=10&consumerGroup=g").await.data_ints("i"), vec![0, 1, 2, 3, 4, 5]);
}

#[actix_web::test]
async fn a_backward_seek_wakes_a_waiting_consumer() {
    let app = TestApp::spawn().await;
    consumed_queue(&app, "wake", "g").await;
    let waiting = app.pop("queue/wake", "batch=10&consumerGroup=g&wait=true&timeout=20000");
    let seeking = async {
        crate::long_poll::until_parked(&app, 1).await;
        seek(&app, "g", "wake", json!({"timestamp": "2001-01-01T00:00:00Z"})).await
    };
    let started = std::time::Instant::now();
    let (woken, _) = futures::join!(waiting, seeking);
    assert_eq!(woken.data_ints("i").len(), 6);
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "woken by the seek, not the timeout");
}

/// A seek that meets the queue's deletion (here held uncommitted by the test's own session until
/// the seek waits on it) finds no queue once it is gone: 404, as a seek after it, not a 500.
#[actix_web::test]
async fn a_seek_racing_the_queues_deletion_answers_not_found() {
    let app = TestApp::spawn().await;
    push_segment(&app, "going", 0, 2).await;
    let group = "racer";
    assert_eq!(seek(&app, group, "going", json!({"toEnd": true})).await.status, StatusCode::OK);

    let deleting = app.db.connect().await;
    deleting.batch_execute("BEGIN; DELETE FROM queen.queues WHERE name = 'going'").await.expect("the deletion");
    let seeking = async { seek(&app, group, "going", json!({"timestamp": "2001-01-01T00:00:00Z"})).await };
    let committing = async {
        app.until_waiting_for_a_lock("log_consumers", "the seek waits for the deletion").await;
        deleting.batch_execute("COMMIT").await.expect("the deletion commits");
    };
    let (answer, ()) = futures::join!(seeking, committing);
    assert_eq!(answer.status, StatusCode::NOT_FOUND, "{answer:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.log_consumers").await, 0, "no cursor left behind");
}
