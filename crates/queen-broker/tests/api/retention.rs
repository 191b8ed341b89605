//! Retention, partition clean-up, queue deletion, and the lock that lets one broker run each
//! maintenance pass. Segment ages are set in the database (the windows are seconds to days long);
//! passes run every 100 ms.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

async fn app() -> TestApp {
    TestApp::spawn_with(|config| config.maintenance.interval_ms = 100).await
}

/// Pushes one segment of `n` messages named `<label>-<i>` to `queue`/`partition`.
async fn segment(app: &TestApp, queue: &str, partition: &str, label: &str, n: usize) {
    let items: Vec<Value> = (0..n)
        .map(|i| json!({"queue": queue, "partition": partition, "transactionId": format!("{label}-{i}"), "payload": {"label": label, "i": i}}))
        .collect();
    app.push(Value::Array(items)).await;
}

/// Makes every segment of the queue with a base offset below `below` an hour old.
pub(crate) async fn age(app: &TestApp, queue: &str, below: i64) {
    app.db
        .connect()
        .await
        .execute(
            "UPDATE queen.log_segments s SET created_at = s.created_at - interval '1 hour'
               FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
              WHERE s.partition_id = p.id AND q.name = $1 AND s.base_offset < $2",
            &[&queue, &below],
        )
        .await
        .expect("ageing segments");
}

/// Waits until `sql` counts `expected`, or fails after 10 s.
pub(crate) async fn until_count(app: &TestApp, sql: &str, expected: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let count = app.count(sql).await;
        if count == expected {
            return;
        }
        assert!(Instant::now() < deadline, "{sql}: {count}, expected {expected}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until at least `passes` more maintenance passes have run.
async fn passes(app: &TestApp, passes: i64) {
    let ran = app.count("SELECT count(*) FROM queen.maintenance_runs").await;
    until_count_at_least(app, "SELECT count(*) FROM queen.maintenance_runs", ran + passes).await;
}

async fn until_count_at_least(app: &TestApp, sql: &str, at_least: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.count(sql).await < at_least {
        assert!(Instant::now() < deadline, "{sql} never reached {at_least}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn segments_of(queue: &str) -> String {
    format!(
        "SELECT count(*) FROM queen.log_segments s JOIN queen.partitions p ON p.id = s.partition_id
           JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = '{queue}'"
    )
}

#[actix_web::test]
async fn by_age_whole_segments_older_than_the_window_go_read_or_not() {
    let app = app().await;
    app.configure("aged", json!({"retentionEnabled": true, "retentionSeconds": 600})).await;
    segment(&app, "aged", "p", "old", 3).await;
    segment(&app, "aged", "p", "new", 2).await;
    // A group that read nothing, and a dead letter of the old segment.
    let first = app.pop("queue/aged", "batch=1&consumerGroup=reader").await.messages();
    app.ack_all(&first, "dlq", Some("reader")).await;
    age(&app, "aged", 4).await;

    until_count(&app, &segments_of("aged"), 1).await;
    assert_eq!(
        app.count("SELECT retained_from FROM queen.partitions").await,
        4,
        "the watermark is the oldest survivor"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM queen.log_message_ids WHERE transaction_id LIKE 'old-%'").await,
        0,
        "the transaction ids of deleted segments go too"
    );
    assert_eq!(app.count("SELECT count(*) FROM queen.log_message_ids").await, 2);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_dlq").await, 1, "dead letters are never touched");
    // A cursor below the watermark reads from the watermark, without error.
    let rest = app.pop("queue/aged", "batch=10&consumerGroup=reader").await;
    assert_eq!(rest.transaction_ids(), vec!["new-0", "new-1"]);
    // A new `all` group starts at the oldest surviving segment.
    let fresh = app.pop("queue/aged", "batch=10&consumerGroup=late").await;
    assert_eq!(fresh.transaction_ids(), vec!["new-0", "new-1"]);
    // A seek below the watermark lands there too.
    let seek =
        app.post("/api/v1/consumer-groups/late/queues/aged/seek", &json!({"timestamp": "2001-01-01T00:00:00Z"})).await;
    assert_eq!(seek.body["partitions"][0]["committed"], 3);
    // A duplicate check no longer knows the deleted ids: retention bounds dedup too.
    assert_eq!(app.push_one("aged", "p", "old-0", json!(1)).await["status"], "queued");
}

#[actix_web::test]
async fn consumed_only_retention_is_held_by_the_slowest_group() {
    let app = app().await;
    app.configure("consumed", json!({"retentionEnabled": true, "completedRetentionSeconds": 600})).await;
    for label in ["a", "b", "c"] {
        segment(&app, "consumed", "p", label, 2).await;
    }
    segment(&app, "consumed", "untouched", "u", 2).await;
    let fast = app.pop("queue/consumed/partition/p", "batch=10&consumerGroup=fast").await.messages();
    app.ack_all(&fast, "completed", Some("fast")).await;
    let slow = app.pop("queue/consumed/partition/p", "batch=3&consumerGroup=slow").await.messages();
    app.ack_all(&slow, "completed", Some("slow")).await;
    age(&app, "consumed", i64::MAX).await;

    // The slow group committed offset 3: segment a (1-2) is consumed by everyone, b (3-4) is not;
    // of the four segments (a, b, c and u), a goes.
    until_count(&app, &segments_of("consumed"), 3).await;
    passes(&app, 2).await;
    let db = app.db.connect().await;
    let rows =
        db.query("SELECT name, retained_from FROM queen.partitions ORDER BY name", &[]).await.expect("partitions");
    let watermarks: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(watermarks, vec![("p".to_owned(), 3), ("untouched".to_owned(), 1)], "no cursors: everything is kept");
    assert_eq!(
        app.pop("queue/consumed/partition/p", "batch=10&consumerGroup=slow").await.transaction_ids(),
        vec!["b-1", "c-0", "c-1"]
    );
}

/// A group registered on the queue holds the floor of a partition it has no cursor on yet (it
/// will read it from where it starts), and so does queue mode once it reads the queue: a
/// partition that one group read whole is not consumed by every group.
#[actix_web::test]
async fn consumed_only_retention_keeps_what_a_registered_group_or_queue_mode_has_not_reached() {
    let app = app().await;
    for queue in ["registered", "queue-mode"] {
        app.configure(queue, json!({"retentionEnabled": true, "completedRetentionSeconds": 600})).await;
        segment(&app, queue, "first", "f", 2).await;
    }
    // `late` reads the first partition of one queue, queue mode that of the other; then they stop.
    let late = app.pop("queue/registered/partition/first", "batch=10&consumerGroup=late").await.messages();
    app.ack_all(&late, "completed", Some("late")).await;
    let unnamed = app.pop("queue/queue-mode/partition/first", "batch=10").await.messages();
    app.ack_all(&unnamed, "completed", None).await;
    // Both queues' second partitions are read whole by `eager` alone.
    for queue in ["registered", "queue-mode"] {
        segment(&app, queue, "second", "s", 2).await;
        let eager = app.pop(&format!("queue/{queue}/partition/second"), "batch=10&consumerGroup=eager").await;
        app.ack_all(&eager.messages(), "completed", Some("eager")).await;
    }
    age(&app, "registered", i64::MAX).await;
    age(&app, "queue-mode", i64::MAX).await;
    passes(&app, 3).await;

    // Every first partition is held by `eager`, registered on both queues; every second one by
    // the reader that has not reached it.
    assert_eq!(app.count(&segments_of("registered")).await, 2, "nothing of `registered` went");
    assert_eq!(app.count(&segments_of("queue-mode")).await, 2, "nothing of `queue-mode` went");
    let caught_up = app.pop("queue/registered/partition/second", "batch=10&consumerGroup=late").await;
    assert_eq!(caught_up.transaction_ids(), vec!["s-0", "s-1"]);
    let caught_up = app.pop("queue/queue-mode/partition/second", "batch=10").await;
    assert_eq!(caught_up.transaction_ids(), vec!["s-0", "s-1"]);
}

/// Queue mode holds a partition's floor by its cursor once it has one there, as a group does: what
/// the unnamed consumers completed goes, and the partition they have not reached yet stays.
#[actix_web::test]
async fn consumed_only_retention_frees_what_queue_mode_completed() {
    let app = app().await;
    app.configure("unnamed", json!({"retentionEnabled": true, "completedRetentionSeconds": 600})).await;
    for label in ["a", "b"] {
        segment(&app, "unnamed", "read", label, 2).await;
    }
    segment(&app, "unnamed", "unread", "u", 2).await;
    let read = app.pop("queue/unnamed/partition/read", "batch=3").await.messages();
    app.ack_all(&read, "completed", None).await;
    age(&app, "unnamed", i64::MAX).await;

    // Queue mode committed offset 3 of `read`: segment a (1-2) is consumed, b (3-4) is not, and
    // `unread` is held at its oldest message.
    until_count(&app, &segments_of("unnamed"), 2).await;
    passes(&app, 2).await;
    assert_eq!(app.count(&segments_of("unnamed")).await, 2, "b and u are kept");
    assert_eq!(app.pop("queue/unnamed/partition/read", "batch=10").await.transaction_ids(), vec!["b-1"]);
    assert_eq!(app.pop("queue/unnamed/partition/unread", "batch=10").await.transaction_ids(), vec!["u-0", "u-1"]);
}

/// A pass plans its trims once, and a trim of a backlog takes a while: each batch finds the
/// partition's floor again, so a group that seeks back meanwhile keeps what it seeks to.
#[actix_web::test]
async fn a_group_seeking_back_during_a_trim_keeps_what_the_trim_had_not_reached() {
    let app = TestApp::spawn_with(|config| {
        config.maintenance.interval_ms = 100;
        config.maintenance.batch_segments = 1;
    })
    .await;
    app.configure("replayed", json!({"retentionEnabled": true, "completedRetentionSeconds": 600})).await;
    let first = app.push_one("replayed", "p", "a-0", json!(1)).await;
    for label in ["b", "c"] {
        segment(&app, "replayed", "p", label, 1).await;
    }
    let event = json!({"transactionId": "a-0", "partitionId": first["partition_id"], "traceNames": ["t"], "data": {}});
    assert_eq!(app.post("/api/v1/traces", &event).await.status, StatusCode::CREATED);
    let read = app.pop("queue/replayed", "batch=10&consumerGroup=g").await.messages();
    app.ack_all(&read, "completed", Some("g")).await;

    // The first batch (segment a) waits on a-0's trace event; meanwhile g seeks to the start.
    let holder = app.db.connect().await;
    holder.batch_execute("BEGIN; SELECT * FROM queen.message_traces FOR UPDATE").await.expect("holding the event");
    age(&app, "replayed", i64::MAX).await;
    until_count(&app, &waiting_in("DELETE FROM queen.message_traces"), 1).await;
    let seek = json!({"timestamp": "2000-01-01T00:00:00Z"});
    let sought = app.post("/api/v1/consumer-groups/g/queues/replayed/seek", &seek).await;
    assert_eq!(sought.status, StatusCode::OK, "{:?}", sought.body);
    holder.batch_execute("COMMIT").await.expect("releasing the event");

    // Segment a was in the batch under way; b and c were planned to go and stay.
    until_count(&app, &segments_of("replayed"), 2).await;
    passes(&app, 2).await;
    assert_eq!(app.count(&segments_of("replayed")).await, 2, "nothing past the floor g sought to went");
    let replayed = app.pop("queue/replayed", "batch=10&consumerGroup=g").await;
    assert_eq!(replayed.transaction_ids(), vec!["b-0", "c-0"]);
}

/// A trim that cannot finish (its partition's row held through every try) is left for the next
/// pass, and the pass goes on with the partitions after it.
#[actix_web::test]
async fn a_trim_that_cannot_finish_does_not_hold_up_the_other_partitions() {
    let app = app().await;
    app.configure("held", json!({"retentionEnabled": true, "retentionSeconds": 600})).await;
    segment(&app, "held", "first", "f", 1).await;
    segment(&app, "held", "second", "s", 1).await;
    let holder = app.db.connect().await;
    holder
        .batch_execute("BEGIN; SELECT * FROM queen.partitions WHERE name = 'first' FOR UPDATE")
        .await
        .expect("holding the first partition's row");
    age(&app, "held", i64::MAX).await;

    let of_partition = |name: &str| {
        format!(
            "SELECT count(*) FROM queen.log_segments s JOIN queen.partitions p ON p.id = s.partition_id
              WHERE p.name = '{name}'"
        )
    };
    until_count(&app, &of_partition("second"), 0).await;
    assert_eq!(app.count(&of_partition("first")).await, 1, "the held partition keeps its segment meanwhile");
    holder.batch_execute("COMMIT").await.expect("releasing the row");
    until_count(&app, &of_partition("first"), 0).await;
}

/// Retention by age removes what a lagging group had yet to read; the group's next claim passes
/// it, so the new head's failures count against that message and its retry limit.
#[actix_web::test]
async fn after_retention_passes_a_lagging_cursor_the_new_heads_failures_count_toward_its_retry_limit() {
    let app = app().await;
    app.configure(
        "poison",
        json!({"retentionEnabled": true, "retentionSeconds": 600, "retryLimit": 1, "retryDelay": 0}),
    )
    .await;
    segment(&app, "poison", "p", "read", 1).await;
    let read = app.pop("queue/poison", "batch=1&consumerGroup=g").await.messages();
    app.ack_all(&read, "completed", Some("g")).await;
    segment(&app, "poison", "p", "unread", 1).await;
    age(&app, "poison", i64::MAX).await;
    until_count(&app, &segments_of("poison"), 0).await;

    segment(&app, "poison", "p", "bad", 1).await;
    for attempt in 1..=2 {
        let popped = app.pop("queue/poison", "batch=1&consumerGroup=g&wait=true&timeout=5000").await;
        assert_eq!(popped.transaction_ids(), vec!["bad-0"], "attempt {attempt}");
        assert_eq!(popped.messages()[0]["deliveryAttempt"], attempt);
        app.ack_all(&popped.messages(), "failed", Some("g")).await;
    }
    let letters = app.get("/api/v1/dlq?queue=poison&consumerGroup=g").await;
    assert_eq!(letters.body["messages"].as_array().map(Vec::len), Some(1), "{letters:?}");
    assert_eq!(app.pop("queue/poison", "batch=1&consumerGroup=g").await.status, StatusCode::NO_CONTENT);
}

#[actix_web::test]
async fn with_retention_off_everything_is_kept() {
    let app = app().await;
    app.configure("forever", json!({"retentionSeconds": 1, "completedRetentionSeconds": 1})).await;
    segment(&app, "forever", "p", "x", 2).await;
    let read = app.pop("queue/forever", "batch=10").await.messages();
    app.ack_all(&read, "completed", None).await;
    age(&app, "forever", i64::MAX).await;
    passes(&app, 3).await;
    assert_eq!(app.count(&segments_of("forever")).await, 1, "retention is opt-in");
}

#[actix_web::test]
async fn an_empty_partition_idle_past_the_cleanup_age_is_deleted_with_its_cursors() {
    let app = app().await;
    app.configure("tidy", json!({"retentionEnabled": true, "retentionSeconds": 60})).await;
    segment(&app, "tidy", "gone", "g", 2).await;
    segment(&app, "tidy", "recent", "r", 2).await;
    segment(&app, "tidy", "full", "f", 2).await;
    for partition in ["gone", "recent"] {
        let read = app.pop(&format!("queue/tidy/partition/{partition}"), "batch=10&consumerGroup=c").await.messages();
        app.ack_all(&read, "completed", Some("c")).await;
    }
    let db = app.db.connect().await;
    // Everything of `gone` and `recent` is retained away; `full` keeps its data.
    db.batch_execute(
        "UPDATE queen.log_segments s SET created_at = now() - interval '40 days'
           FROM queen.partitions p WHERE s.partition_id = p.id AND p.name IN ('gone', 'recent');",
    )
    .await
    .expect("ageing");
    until_count(&app, &segments_of("tidy"), 1).await;
    // Idle for 40 days: `gone` (no push, no consumer activity); `recent` was read a moment ago.
    db.batch_execute(
        "UPDATE queen.partitions SET created_at = now() - interval '40 days', last_segment_at = now() - interval '40 days';
         UPDATE queen.log_consumers c SET created_at = now() - interval '40 days',
                last_claimed_at = now() - interval '40 days', last_consumed_at = now() - interval '40 days'
           FROM queen.partitions p WHERE c.partition_id = p.id AND p.name = 'gone';",
    )
    .await
    .expect("idling");
    until_count(&app, "SELECT count(*) FROM queen.partitions WHERE name = 'gone'", 0).await;
    passes(&app, 2).await;
    let left: Vec<String> = db
        .query("SELECT name FROM queen.partitions ORDER BY name", &[])
        .await
        .expect("partitions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, vec!["full", "recent"]);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_consumers").await, 1, "its cursors went with it");
    assert_eq!(
        app.count("SELECT partitions_deleted FROM queen.maintenance_runs WHERE partitions_deleted > 0").await,
        1
    );
    // A push to the name starts the partition afresh.
    assert_eq!(app.push_one("tidy", "gone", "again", json!(1)).await["offset"], 1);
}

#[actix_web::test]
async fn deleting_a_queue_removes_everything_of_it() {
    let app = app().await;
    segment(&app, "doomed", "p", "d", 3).await;
    let read = app.pop("queue/doomed", "batch=1&consumerGroup=g&subscriptionMode=all").await.messages();
    app.ack_all(&read, "dlq", Some("g")).await;
    let deleted = app.delete("/api/v1/resources/queues/doomed").await;
    assert_eq!(deleted.body["deleted"], true);
    for table in [
        "queues",
        "partitions",
        "log_segments",
        "log_message_ids",
        "log_consumers",
        "consumer_groups_metadata",
        "log_dlq",
    ] {
        assert_eq!(
            app.count(&format!("SELECT count(*) FROM queen.{table}")).await,
            0,
            "queen.{table} keeps rows of a deleted queue"
        );
    }
    segment(&app, "doomed", "p", "d", 1).await;
    let fresh = app.pop("queue/doomed", "batch=10&consumerGroup=g&subscriptionMode=new").await;
    assert_eq!(fresh.status, StatusCode::NO_CONTENT, "the group registers afresh on the new queue");
}

#[actix_web::test]
async fn while_another_session_holds_the_maintenance_lock_the_broker_skips_its_passes() {
    let app = app().await;
    let holder = app.db.connect().await;
    // Held as another broker mid-pass would hold it; taken once the broker's own pass (if one is
    // running) has finished, so every pass from here on must skip.
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&queen_store::retention::MAINTENANCE_LOCK_KEY])
        .await
        .expect("lock");
    let runs_before = app.count("SELECT count(*) FROM queen.maintenance_runs").await;
    let skipped = "queen_maintenance_passes_total{outcome=\"skipped\"}";
    app.configure("locked", json!({"retentionEnabled": true, "retentionSeconds": 60})).await;
    segment(&app, "locked", "p", "l", 2).await;
    age(&app, "locked", i64::MAX).await;
    let skipped_before = app.metric(skipped).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.metric(skipped).await < skipped_before + 3.0 {
        assert!(Instant::now() < deadline, "the broker never skipped a pass");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(app.count(&segments_of("locked")).await, 1, "nothing was deleted while the lock was held");
    assert_eq!(
        app.count("SELECT count(*) FROM queen.maintenance_runs").await,
        runs_before,
        "no pass ran while the lock was held"
    );
    holder.execute("SELECT pg_advisory_unlock_all()", &[]).await.expect("unlock");
    until_count(&app, &segments_of("locked"), 0).await;
}

#[actix_web::test]
async fn two_brokers_on_one_database_never_run_a_pass_at_the_same_time() {
    let app = app().await;
    TestApp::spawn_on(&app.db, |config| config.maintenance.interval_ms = 100).await;
    app.configure("shared", json!({"retentionEnabled": true, "retentionSeconds": 60})).await;
    for round in 0..20 {
        segment(&app, "shared", &format!("p{round}"), "s", 1).await;
    }
    age(&app, "shared", i64::MAX).await;
    until_count(&app, &segments_of("shared"), 0).await;
    until_count_at_least(&app, "SELECT count(DISTINCT broker) FROM queen.maintenance_runs", 2).await;
    let overlapping = app
        .count(
            "SELECT count(*) FROM queen.maintenance_runs a JOIN queen.maintenance_runs b
               ON a.id < b.id AND a.started_at < b.finished_at AND b.started_at < a.finished_at",
        )
        .await;
    assert_eq!(overlapping, 0, "two passes ran at once");
    assert_eq!(
        app.count("SELECT sum(segments_deleted)::bigint FROM queen.maintenance_runs").await,
        20,
        "each segment deleted once"
    );
}

/// Queue `queue`, written straight to the tables: its partition `p` (the database's first, whose
/// id is 1) retained from `first`, with a one-message segment at each offset `g` from `first` to
/// `last`, its body the SQL `body` (of `g`).
async fn segments_written_directly(db: &tokio_postgres::Client, queue: &str, first: i64, last: i64, body: &str) {
    db.batch_execute(&format!(
        "INSERT INTO queen.queues (name) VALUES ('{queue}');
         INSERT INTO queen.partitions (queue_id, name, last_offset, retained_from)
              SELECT id, 'p', {last}, {first} FROM queen.queues WHERE name = '{queue}';
         INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, created_at, frame_count, raw_length, body)
              SELECT p.id, g, g, now(), 1, 0, {body} FROM queen.partitions p, generate_series({first}, {last}) g;"
    ))
    .await
    .expect("segments");
}

#[actix_web::test]
async fn a_trim_walks_from_the_watermark_not_through_deleted_history() {
    let app = app().await;
    let db = app.db.connect().await;
    // A partition with a long history, most of it already retained away.
    segments_written_directly(&db, "history", 19_000, 20_000, "'\\x00'").await;
    db.batch_execute("ANALYZE queen.log_segments").await.expect("statistics");
    let plan: Vec<String> = db
        .query(
            &format!("EXPLAIN {}", queen_store::retention::TRIM_SQL),
            &[&1_i64, &19_000_i64, &19_500_i64, &1000_i64, &queen_store::retention::TRIM_BATCH_BYTES],
        )
        .await
        .expect("a plan")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(
        plan.contains("Index Cond") && plan.contains("base_offset >= "),
        "the scan must start at the watermark through the index:\n{plan}"
    );
    assert!(!plan.contains("Seq Scan"), "no sequential scan:\n{plan}");
}

/// A trim batch reads its segments' bodies whole (for their transaction ids): it stops at
/// `TRIM_BATCH_BYTES` of them, past the first, whatever its segment count allows.
#[actix_web::test]
async fn a_trim_batch_reads_a_bounded_number_of_bytes() {
    let app = app().await;
    let db = app.db.connect().await;
    // Five segments of 6 MiB bodies, then one of 20 MiB.
    let body = "convert_to(repeat('x', CASE WHEN g = 6 THEN 20 ELSE 6 END * 1048576), 'UTF8')";
    segments_written_directly(&db, "large", 1, 6, body).await;
    let bytes = queen_store::retention::TRIM_BATCH_BYTES;
    let batch = |from: i64| {
        let db = &db;
        async move {
            db.batch_execute("BEGIN").await.expect("a transaction");
            let rows = db
                .query(queen_store::retention::TRIM_SQL, &[&1_i64, &from, &7_i64, &1000_i64, &bytes])
                .await
                .expect("a batch");
            db.batch_execute("ROLLBACK").await.expect("rolled back");
            rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>()
        }
    };
    assert_eq!(batch(1).await, vec![1, 2], "12 MiB in two segments; a third would pass 16 MiB");
    assert_eq!(batch(5).await, vec![5], "the 20 MiB one waits for a batch of its own");
    assert_eq!(batch(6).await, vec![6], "a batch takes its first segment whatever its size");
}

#[actix_web::test]
async fn a_message_dead_lettered_after_retention_removed_it_is_recorded_without_its_payload() {
    let app = app().await;
    app.configure("raced", json!({"retentionEnabled": true, "retentionSeconds": 600, "retryLimit": 0})).await;
    segment(&app, "raced", "p", "m", 1).await;
    let delivered = app.pop("queue/raced", "batch=1&consumerGroup=g").await.messages();

    // The ack resolves the message, then waits for the cursor, which the test holds; meanwhile
    // retention removes the message's segment.
    let holder = app.db.connect().await;
    holder.batch_execute("BEGIN; SELECT * FROM queen.log_consumers FOR UPDATE").await.expect("holding the cursor");
    let failed = json!({"acknowledgments": [{"transactionId": "m-0", "partitionId": delivered[0]["partitionId"],
                        "leaseId": delivered[0]["leaseId"], "status": "failed", "error": "crashed"}],
                        "consumerGroup": "g"});
    let ack = actix_web::rt::spawn(app.http.post(app.url("/api/v1/ack/batch")).json(&failed).send());
    until_count(&app, &waiting_in(""), 1).await;
    age(&app, "raced", 2).await;
    until_count(&app, &segments_of("raced"), 0).await;
    holder.batch_execute("COMMIT").await.expect("releasing the cursor");

    let verdicts: Value = ack.await.expect("the ack task").expect("the ack").json().await.expect("JSON");
    assert_eq!((&verdicts[0]["success"], &verdicts[0]["dlq"]), (&json!(true), &json!(true)), "{verdicts}");
    let dlq = app.get("/api/v1/dlq?queue=raced").await;
    assert_eq!(dlq.body["total"], 1, "never dropped silently: {dlq:?}");
    let letter = &dlq.body["messages"][0];
    assert_eq!(letter["transactionId"], "m-0");
    assert_eq!(letter["data"], Value::Null);
    assert_eq!(letter["errorMessage"], "crashed; payload unavailable (retained)");
    let partition = letter["partitionId"].as_str().expect("partitionId");
    let retry = app.post(&format!("/api/v1/messages/{partition}/m-0/retry"), &json!({})).await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "nothing to push again: {retry:?}");
}

/// Backends of the test database waiting for a lock while running a statement that contains `sql`
/// (any statement for `""`).
pub(crate) fn waiting_in(sql: &str) -> String {
    format!(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%{sql}%'"
    )
}

#[actix_web::test]
async fn a_push_reusing_an_id_that_a_trim_is_deleting_is_stored_and_the_trim_still_completes() {
    let app = app().await;
    let options = json!({"retentionEnabled": true, "retentionSeconds": 600, "dedupWindowSeconds": 60});
    app.configure("reused", options).await;
    let first = app.push_one("reused", "p", "order-7", json!(1)).await;
    let event =
        json!({"transactionId": "order-7", "partitionId": first["partition_id"], "traceNames": ["t"], "data": {}});
    assert_eq!(app.post("/api/v1/traces", &event).await.status, StatusCode::CREATED);

    // The message's trace event, locked here, holds the trim after it deleted the message's id.
    let holder = app.db.connect().await;
    holder.batch_execute("BEGIN; SELECT * FROM queen.message_traces FOR UPDATE").await.expect("holding the event");
    age(&app, "reused", 2).await;
    until_count(&app, &waiting_in("DELETE FROM queen.message_traces"), 1).await;

    // The push holds the partition's row and waits for the id; the trim, released, wants the row.
    let second = app.push_one("reused", "p", "order-7", json!(2));
    let release = async {
        until_count(&app, &waiting_in("INSERT INTO queen.log_message_ids"), 1).await;
        holder.batch_execute("COMMIT").await.expect("releasing the event");
    };
    let (second, ()) = tokio::join!(second, release);
    assert_eq!(second["status"], "queued", "past the dedup window the id is new: {second}");

    until_count(&app, &segments_of("reused"), 1).await;
    let partition = second["partition_id"].as_str().expect("partition_id");
    let message = app.get(&format!("/api/v1/messages/{partition}/order-7")).await;
    assert_eq!(message.body["data"], 2, "the id names the new message");
    assert_eq!(app.push_one("reused", "p", "order-7", json!(3)).await["status"], "duplicate");
    let served = app.pop("queue/reused", "batch=10").await;
    assert_eq!(served.transaction_ids(), vec!["order-7"]);
    assert_eq!(served.messages()[0]["data"], 2);
}

/// A claim that meets no segment (retention removed its span after the claim read the watermark,
/// played here by deleting the segment under it) hands nothing out and keeps no lease: the group's
/// next pop is served what came after.
#[actix_web::test]
async fn a_claim_whose_span_retention_removed_keeps_no_lease() {
    let app = TestApp::spawn_with(|config| config.pop.segment_cache_bytes = 0).await;
    segment(&app, "raced", "p", "gone", 2).await;
    let db = app.db.connect().await;
    db.execute("DELETE FROM queen.log_segments", &[]).await.expect("removing the segment");
    let emptied = app.pop("queue/raced", "batch=10&consumerGroup=g").await;
    assert_eq!(emptied.status, StatusCode::NO_CONTENT, "{emptied:?}");
    segment(&app, "raced", "p", "next", 1).await;
    let served = app.pop("queue/raced", "batch=10&consumerGroup=g").await;
    assert_eq!(served.transaction_ids(), vec!["next-0"], "{served:?}");
}
