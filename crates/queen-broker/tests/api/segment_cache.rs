//! The segment cache: pops of a few messages from a large segment slice it from memory, serve
//! exactly what a read from the database would, and never serve what was deleted.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::retention;

const HITS: &str = "queen_segment_cache_hits_total";
const MISSES: &str = "queen_segment_cache_misses_total";

/// Pushes one segment of `n` messages, `{"label", "i"}`, with transaction ids `<label>-<i>`.
async fn segment(app: &TestApp, queue: &str, label: &str, n: usize) {
    let items: Vec<Value> = (0..n)
        .map(|i| json!({"queue": queue, "partition": "p", "transactionId": format!("{label}-{i}"), "payload": {"label": label, "i": i}}))
        .collect();
    app.push(Value::Array(items)).await;
}

/// Pops `batch` at a time with autoAck until the partition is empty; every `i` received, in order.
async fn pop_all(app: &TestApp, queue: &str, batch: usize) -> Vec<i64> {
    let mut received = Vec::new();
    loop {
        let answer = app.pop(&format!("queue/{queue}/partition/p"), &format!("batch={batch}&autoAck=true")).await;
        if answer.status == StatusCode::NO_CONTENT {
            return received;
        }
        let got = answer.data_ints("i");
        assert!(!got.is_empty() && got.len() <= batch, "{answer:?}");
        received.extend(got);
    }
}

#[actix_web::test]
async fn pops_of_one_go_through_a_large_segment_in_order_reading_it_once() {
    let app = TestApp::spawn().await;
    segment(&app, "big", "m", 1000).await;
    assert_eq!(pop_all(&app, "big", 1).await, (0..1000).collect::<Vec<_>>());
    assert_eq!(app.metric(MISSES).await, 1.0, "the segment is read from the database once");
    assert_eq!(app.metric(HITS).await, 999.0, "and sliced from memory by every later pop");
    // Its only reader is past it: the cache let it go.
    assert_eq!(app.metric("queen_segment_cache_segments").await, 0.0);
    assert_eq!(app.metric("queen_segment_cache_bytes").await, 0.0);
}

#[actix_web::test]
async fn a_message_lookup_leaves_no_reader_inside_a_segment() {
    let app = TestApp::spawn().await;
    segment(&app, "looked", "m", 100).await;
    let partition = "queue/looked/partition/p";
    let first = app.pop(partition, "batch=40&autoAck=true").await;
    assert_eq!(first.data_ints("i"), (0..40).collect::<Vec<_>>());
    let partition_id = first.messages()[0]["partitionId"].as_str().expect("partitionId").to_owned();
    // The segment's first message, looked up while the consumer is inside the segment.
    let looked = app.get(&format!("/api/v1/messages/{partition_id}/m-0")).await;
    assert_eq!(looked.status, StatusCode::OK, "{looked:?}");
    assert_eq!(app.metric(MISSES).await, 1.0, "the lookup was served from the cache");
    assert_eq!(app.pop(partition, "batch=100&autoAck=true").await.data_ints("i"), (40..100).collect::<Vec<_>>());
    assert_eq!(app.metric("queen_segment_cache_segments").await, 0.0, "the consumer was its only reader");
}

#[actix_web::test]
async fn a_segment_stays_held_while_a_group_is_inside_it() {
    let app = TestApp::spawn().await;
    segment(&app, "shared", "m", 100).await;
    let partition = "queue/shared/partition/p";
    let pop = |group: &'static str, batch: usize| {
        let app = &app;
        async move {
            let answer = app.pop(partition, &format!("batch={batch}&autoAck=true&consumerGroup={group}")).await;
            answer.data_ints("i")
        }
    };
    assert_eq!(pop("a", 40).await, (0..40).collect::<Vec<_>>());
    assert_eq!(pop("b", 10).await, (0..10).collect::<Vec<_>>());
    // Group a reads to the end; b is still inside, so the segment stays for it.
    assert_eq!(pop("a", 100).await, (40..100).collect::<Vec<_>>());
    assert_eq!(app.metric("queen_segment_cache_segments").await, 1.0);
    assert_eq!(pop("b", 100).await, (10..100).collect::<Vec<_>>());
    assert_eq!(app.metric(MISSES).await, 1.0, "read from the database once for both groups");
    assert_eq!(app.metric("queen_segment_cache_segments").await, 0.0, "and let go when both were past it");
}

#[actix_web::test]
async fn without_the_cache_pops_of_one_serve_the_same_reading_the_segment_each_time() {
    let app = TestApp::spawn_with(|config| config.pop.segment_cache_bytes = 0).await;
    segment(&app, "big", "m", 1000).await;
    assert_eq!(pop_all(&app, "big", 1).await, (0..1000).collect::<Vec<_>>());
    assert_eq!(app.metric(MISSES).await, 1000.0);
    assert_eq!(app.metric(HITS).await, 0.0);
    assert_eq!(app.metric("queen_segment_cache_bytes").await, 0.0);
}

#[actix_web::test]
async fn pops_of_one_go_from_segment_to_segment() {
    let app = TestApp::spawn().await;
    for label in ["a", "b", "c"] {
        segment(&app, "steps", label, 10).await;
    }
    // Each pop at the start of a segment finds the previous one held and this one not.
    assert_eq!(pop_all(&app, "steps", 1).await, (0..30).map(|i| i % 10).collect::<Vec<_>>());
    assert_eq!(app.metric(MISSES).await, 3.0);
    assert_eq!(app.metric(HITS).await, 27.0);
}

#[actix_web::test]
async fn spans_across_segment_boundaries_are_served_whole_and_in_order() {
    let app = TestApp::spawn().await;
    for label in ["a", "b", "c"] {
        segment(&app, "spans", label, 10).await;
    }
    // Batches of 4 start and end inside segments: each pop joins pieces held in memory with
    // pieces read from the database.
    let received = pop_all(&app, "spans", 4).await;
    assert_eq!(received, (0..30).map(|i| i % 10).collect::<Vec<_>>());
    assert_eq!(app.metric(MISSES).await, 3.0, "each segment is read once");
    assert!(app.metric(HITS).await >= 5.0);
}

#[actix_web::test]
async fn a_recreated_queue_is_served_its_own_messages_not_the_deleted_ones() {
    let app = TestApp::spawn().await;
    segment(&app, "again", "old", 100).await;
    let first = app.pop("queue/again/partition/p", "batch=1&autoAck=true").await;
    assert_eq!(first.data_ints("i"), [0]);
    assert_eq!(app.delete("/api/v1/resources/queues/again").await.body["deleted"], true);

    // The same queue, partition, transaction ids and offsets, other messages.
    segment(&app, "again", "new", 100).await;
    for expected in 0..3 {
        let answer = app.pop("queue/again/partition/p", "batch=1&autoAck=true").await;
        assert_eq!(answer.messages()[0]["data"], json!({"label": "new", "i": expected}), "{answer:?}");
    }
    let partition = partition_id(&app, "again").await;
    let message = app.get(&format!("/api/v1/messages/{partition}/new-50")).await;
    assert_eq!(message.body["data"], json!({"label": "new", "i": 50}), "{message:?}");
}

async fn partition_id(app: &TestApp, queue: &str) -> String {
    let sql = format!(
        "SELECT p.id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = '{queue}'"
    );
    app.count(&sql).await.to_string()
}

#[actix_web::test]
async fn messages_retention_deleted_are_never_served_from_memory() {
    let app = TestApp::spawn_with(|config| config.maintenance.interval_ms = 100).await;
    app.configure("kept", json!({"retentionEnabled": true, "retentionSeconds": 600})).await;
    segment(&app, "kept", "old", 10).await;
    // The group reads into the old segment, which the cache now holds, and so does a lookup.
    let read = app.pop("queue/kept/partition/p", "batch=1&consumerGroup=g&autoAck=true").await;
    assert_eq!(read.data_ints("i"), [0]);
    let partition = partition_id(&app, "kept").await;
    let lookup = format!("/api/v1/messages/{partition}/old-5");
    assert_eq!(app.get(&lookup).await.status, StatusCode::OK);
    segment(&app, "kept", "new", 10).await;

    retention::age(&app, "kept", 2).await;
    retention::until_count(&app, "SELECT count(*) FROM queen.log_segments WHERE base_offset = 1", 0).await;

    // The group's next message, and a new group's first, are the oldest ones still stored.
    let next = app.pop("queue/kept/partition/p", "batch=3&consumerGroup=g&autoAck=true").await;
    assert_eq!(next.messages()[0]["data"], json!({"label": "new", "i": 0}), "{next:?}");
    let fresh = app.pop("queue/kept/partition/p", "batch=3&consumerGroup=h&autoAck=true").await;
    assert_eq!(fresh.messages()[0]["data"], json!({"label": "new", "i": 0}), "{fresh:?}");
    assert_eq!(app.get(&lookup).await.status, StatusCode::NOT_FOUND);
}

/// A pop whose answer's byte bound (`pop.max_answer_bytes`) is reached in its first segment
/// decodes none of the segments after it.
#[actix_web::test]
async fn a_pop_cut_by_its_byte_bound_decodes_no_segment_past_it() {
    let app = TestApp::spawn_with(|config| config.pop.max_answer_bytes = 64 * 1024).await;
    let large = "x".repeat(30_000);
    for segment in 0..3 {
        let items: Vec<Value> = (0..5)
            .map(|i| json!({"queue": "large", "partition": "p", "transactionId": format!("{segment}-{i}"), "payload": large}))
            .collect();
        app.push(Value::Array(items)).await;
    }
    let answer = app.pop("queue/large/partition/p", "batch=15&autoAck=true").await;
    assert_eq!(answer.transaction_ids(), vec!["0-0", "0-1", "0-2"]);
    assert_eq!(app.metric(MISSES).await, 1.0, "one segment read from the database");
}

/// A pop whose read stops decoding at its byte bound inside a stretch it reads from the database
/// leaves out a later segment the cache holds: handed out, it would be delivered past messages
/// the pop never read, and their ack would lose them.
#[actix_web::test]
async fn a_pop_cut_by_its_byte_bound_takes_no_cached_segment_past_the_cut() {
    let app = TestApp::spawn_with(|config| config.pop.max_answer_bytes = 64 * 1024).await;
    let large = "x".repeat(10_000);
    // Segments of offsets 1-10 (100 KB, past the bound), 11-12 and 13-17.
    for (first, last) in [(1, 10), (11, 12), (13, 17)] {
        let items: Vec<Value> = (first..=last)
            .map(|i| json!({"queue": "cut", "partition": "p", "transactionId": format!("m{i}"), "payload": large}))
            .collect();
        app.push(Value::Array(items)).await;
    }
    // Group `h` stands after offset 12, and `g` inside the first segment, after offset 5.
    let partition = partition_id(&app, "cut").await;
    let cursors = format!(
        "INSERT INTO queen.log_consumers (partition_id, consumer_group, committed) VALUES ({partition}, 'h', 12), ({partition}, 'g', 5)"
    );
    app.db.connect().await.batch_execute(&cursors).await.expect("the cursors");
    // `h` leaves the last segment in the cache, and nothing else.
    let warm = app.pop("queue/cut/partition/p", "batch=1&consumerGroup=h&autoAck=true").await;
    assert_eq!(warm.transaction_ids(), vec!["m13"]);

    let first = app.pop("queue/cut/partition/p", "batch=20&consumerGroup=g").await;
    assert_eq!(first.transaction_ids(), vec!["m6", "m7", "m8", "m9", "m10"], "what the read decoded, and no more");
    app.ack_all(&first.messages(), "completed", Some("g")).await;
    let rest = app.pop("queue/cut/partition/p", "batch=20&consumerGroup=g").await;
    assert_eq!(rest.transaction_ids(), vec!["m11", "m12", "m13", "m14", "m15", "m16", "m17"]);
}

/// A listing of a queue's newest messages reads only the segments that hold them, not the tails
/// of every recently pushed partition: here the newest three messages of twenty partitions of
/// two segments each.
#[actix_web::test]
async fn a_listing_reads_only_the_segments_that_hold_the_newest_messages() {
    let app = TestApp::spawn().await;
    for partition in 0..20 {
        for label in ["a", "b"] {
            app.push_one("wide", &format!("p{partition}"), &format!("p{partition}-{label}"), json!(partition)).await;
        }
    }
    let listed = async |query: &str| -> Vec<String> {
        let answer = app.get(&format!("/api/v1/messages?queue=wide&{query}")).await;
        let messages = answer.body["messages"].as_array().cloned().unwrap_or_else(|| panic!("messages: {answer:?}"));
        messages.iter().filter_map(|m| m["transactionId"].as_str().map(str::to_owned)).collect()
    };
    let before = app.metric(MISSES).await;
    assert_eq!(listed("limit=3").await, ["p19-b", "p19-a", "p18-b"], "newest first");
    assert_eq!(app.metric(MISSES).await - before, 3.0, "three segments read, of the forty");
    assert_eq!(listed("limit=2&offset=3").await, ["p18-a", "p17-b"]);
}
