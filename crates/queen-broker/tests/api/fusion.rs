//! Push: fusion of concurrent pushes into segments, dense offsets, dedup.

use std::collections::BTreeSet;

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

#[actix_web::test]
async fn concurrent_pushes_to_one_partition_fuse_into_fewer_segments_with_dense_offsets() {
    const PUSHES: usize = 250;
    let app = TestApp::spawn().await;
    let pushes = (0..PUSHES).map(|i| {
        let body = json!({"items": [{"queue": "fused", "partition": "p", "transactionId": format!("t-{i}"), "payload": {"i": i}}]});
        let app = &app;
        async move { app.post("/api/v1/push", &body).await }
    });
    let answers = join_all(pushes).await;

    let mut offsets = BTreeSet::new();
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer.status, StatusCode::CREATED, "push {i}: {answer:?}");
        let items = answer.body.as_array().expect("an array");
        assert_eq!(items.len(), 1, "push {i} answered once per item");
        assert_eq!(items[0]["status"], "queued", "push {i}");
        assert_eq!(items[0]["transaction_id"], format!("t-{i}"));
        assert!(offsets.insert(items[0]["offset"].as_i64().expect("an offset")), "offset given twice");
    }
    let expected: BTreeSet<i64> = (1..=PUSHES as i64).collect();
    assert_eq!(offsets, expected, "answered offsets are exactly 1..N");

    let db = app.db.connect().await;
    let segments = db
        .query(
            "SELECT base_offset, end_offset, frame_count, created_at FROM queen.log_segments ORDER BY base_offset",
            &[],
        )
        .await
        .expect("segments");
    assert!(segments.len() < PUSHES, "{} segments for {PUSHES} pushes: nothing was fused", segments.len());
    let mut next = 1;
    let mut previous_created_at = None;
    for segment in &segments {
        let (base, end, frames): (i64, i64, i32) = (segment.get(0), segment.get(1), segment.get(2));
        let created_at: chrono::DateTime<chrono::Utc> = segment.get(3);
        assert_eq!(base, next, "segments are contiguous, without gap or overlap");
        assert_eq!(end - base + 1, i64::from(frames));
        assert!(previous_created_at <= Some(created_at), "created_at never decreases along offsets");
        previous_created_at = Some(created_at);
        next = end + 1;
    }
    assert_eq!(next, PUSHES as i64 + 1);
    let stored: Vec<i64> = db
        .query("SELECT message_offset FROM queen.log_message_ids ORDER BY message_offset", &[])
        .await
        .expect("ids")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(stored, (1..=PUSHES as i64).collect::<Vec<_>>(), "the transaction-id index holds 1..N");
    assert_eq!(app.count("SELECT last_offset FROM queen.partitions").await, PUSHES as i64);
}

#[actix_web::test]
async fn a_segment_holds_the_pushed_messages_in_offset_order() {
    let app = TestApp::spawn().await;
    let items: Vec<Value> =
        (0..5).map(|i| json!({"queue": "log", "transactionId": format!("m{i}"), "payload": {"n": i}})).collect();
    app.push(Value::Array(items)).await;
    let row = app
        .db
        .connect()
        .await
        .query_one("SELECT body, frame_count FROM queen.log_segments", &[])
        .await
        .expect("one segment for one push");
    let body: Vec<u8> = row.get(0);
    let count: i32 = row.get(1);
    let segment = queen_log::decode_segment(&body, count as usize, 1 << 20).expect("a valid segment");
    let frames: Vec<(String, String)> = segment
        .frames()
        .map(|f| {
            let f = f.expect("a frame");
            (f.transaction_id.to_owned(), String::from_utf8(f.payload.to_vec()).expect("UTF-8"))
        })
        .collect();
    let expected: Vec<(String, String)> = (0..5).map(|i| (format!("m{i}"), format!(r#"{{"n":{i}}}"#))).collect();
    assert_eq!(frames, expected);
}

#[actix_web::test]
async fn a_transaction_id_pushed_twice_to_a_partition_is_a_duplicate_with_the_original_id() {
    let app = TestApp::spawn().await;
    let first = app.push_one("dedup", "0", "dup", json!({"v": 1})).await;
    assert_eq!(first["status"], "queued");
    let second = app.push_one("dedup", "0", "dup", json!({"v": 2})).await;
    assert_eq!(second["status"], "duplicate");
    assert_eq!(second["message_id"], first["message_id"], "a duplicate answers with the original message id");
    assert_eq!(second["offset"], first["offset"]);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_segments").await, 1, "the duplicate wrote nothing");
    assert_eq!(app.count("SELECT last_offset FROM queen.partitions").await, 1);

    let elsewhere = app.push_one("dedup", "1", "dup", json!({"v": 3})).await;
    assert_eq!(elsewhere["status"], "queued", "dedup is per partition");
    assert_ne!(elsewhere["message_id"], first["message_id"]);

    let popped = app.pop("queue/dedup", "batch=10&partitions=2").await;
    let mut data: Vec<i64> = popped.messages().iter().map(|m| m["data"]["v"].as_i64().expect("v")).collect();
    data.sort();
    assert_eq!(data, vec![1, 3], "only the two queued messages exist");
}

#[actix_web::test]
async fn a_transaction_id_repeated_inside_one_push_is_a_duplicate_of_the_first() {
    let app = TestApp::spawn().await;
    let results = app
        .push(json!([
            {"queue": "dedup", "transactionId": "x", "payload": 1},
            {"queue": "dedup", "transactionId": "y", "payload": 2},
            {"queue": "dedup", "transactionId": "x", "payload": 3},
        ]))
        .await;
    let statuses: Vec<&str> = results.iter().map(|r| r["status"].as_str().expect("status")).collect();
    assert_eq!(statuses, vec!["queued", "queued", "duplicate"]);
    assert_eq!(results[2]["message_id"], results[0]["message_id"]);
    assert_eq!(app.count("SELECT last_offset FROM queen.partitions").await, 2);
}

#[actix_web::test]
async fn a_push_to_several_partitions_answers_in_item_order() {
    let app = TestApp::spawn().await;
    let results = app
        .push(json!([
            {"queue": "multi", "partition": "a", "transactionId": "1", "payload": 1},
            {"queue": "multi", "partition": "b", "transactionId": "2", "payload": 2},
            {"queue": "other", "partition": "a", "transactionId": "3", "payload": 3},
            {"queue": "multi", "partition": "a", "transactionId": "4", "payload": 4},
        ]))
        .await;
    let ids: Vec<&str> = results.iter().map(|r| r["transaction_id"].as_str().expect("id")).collect();
    assert_eq!(ids, vec!["1", "2", "3", "4"]);
    assert_eq!(results[0]["partition_id"], results[3]["partition_id"]);
    assert_eq!((results[0]["offset"].as_i64(), results[3]["offset"].as_i64()), (Some(1), Some(2)));
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 2, "queues are created by their first push");
    assert_eq!(app.count("SELECT count(*) FROM queen.partitions").await, 3);
}

/// Live partition writers of the broker.
async fn live_writers(app: &TestApp) -> f64 {
    app.metric("queen_actors{actor=\"partition_writer\"}").await
}

/// Partition writers the broker has started.
async fn writers_started(app: &TestApp) -> f64 {
    app.metric("queen_actors_started_total{actor=\"partition_writer\"}").await
}

#[actix_web::test]
async fn a_partitions_writer_stops_once_its_pushes_are_answered_and_pushes_racing_its_stop_are_all_written() {
    const PRODUCERS: usize = 4;
    const PUSHES: usize = 100;
    let app = TestApp::spawn().await;
    // Each producer waits for its answer before the next push, so the writer often drains and
    // stops just as another producer's push reaches it.
    let producers = (0..PRODUCERS).map(|producer| {
        let app = &app;
        async move {
            let mut offsets = Vec::new();
            for n in 0..PUSHES {
                let item = json!({"queue": "churn", "partition": "p", "transactionId": format!("{producer}-{n}"), "payload": n});
                let answer = app.post("/api/v1/push", &json!({"items": [item]})).await;
                assert_eq!(answer.status, StatusCode::CREATED, "producer {producer}, push {n}: {answer:?}");
                assert_eq!(answer.body[0]["status"], "queued");
                offsets.push(answer.body[0]["offset"].as_i64().expect("an offset"));
            }
            offsets
        }
    });
    let offsets: BTreeSet<i64> = join_all(producers).await.into_iter().flatten().collect();
    let total = (PRODUCERS * PUSHES) as i64;
    assert_eq!(offsets, (1..=total).collect::<BTreeSet<_>>(), "every push written once, offsets dense");
    assert_eq!(app.count("SELECT last_offset FROM queen.partitions").await, total);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while live_writers(&app).await > 0.0 {
        assert!(std::time::Instant::now() < deadline, "the writer is still live with nothing to write");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[actix_web::test]
async fn a_writer_idle_time_keeps_a_partitions_writer_between_pushes() {
    let app = TestApp::spawn_with(|config| config.push.writer_idle_seconds = 60).await;
    app.push_one("kept", "p", "1", json!(1)).await;
    // Without the idle time the writer stops as soon as the push is answered; watched for a
    // second, this one stays.
    let watched_until = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while std::time::Instant::now() < watched_until {
        assert_eq!(live_writers(&app).await, 1.0, "the writer stopped within its idle time");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    app.push_one("kept", "p", "2", json!(2)).await;
    assert_eq!(writers_started(&app).await, 1.0, "the first push's writer took the second push");
}

#[actix_web::test]
async fn without_an_idle_time_each_push_after_a_pause_starts_a_new_writer() {
    let app = TestApp::spawn().await;
    for n in 1..=2 {
        app.push_one("churn", "p", &n.to_string(), json!(n)).await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while live_writers(&app).await > 0.0 {
            assert!(std::time::Instant::now() < deadline, "the writer is still live with nothing to write");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    assert_eq!(writers_started(&app).await, 2.0, "a writer per push, each stopped once it was answered");
}
