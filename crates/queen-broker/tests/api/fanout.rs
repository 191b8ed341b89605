//! Fan-out: the rows of the fan-out seed's "What to expect" table, and what a group costs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, ack_body};

async fn push(app: &TestApp, queue: &str, partitions: &[&str], per_partition: usize) {
    let mut items = Vec::new();
    for partition in partitions {
        for i in 0..per_partition {
            items.push(json!({"queue": queue, "partition": partition, "payload": {"p": partition, "i": i}}));
        }
    }
    app.push(Value::Array(items)).await;
}

/// What every broker writes on its own timer (`stats.sample_interval_seconds`), whatever the
/// clients do: its heartbeat, its traffic and the fleet's lag. The first beat of a broker just
/// started may land in the middle of a test.
const HEARTBEAT_TABLES: [&str; 3] = ["brokers", "lag_samples", "traffic_samples"];

/// Row counts of every table of the schema, but the heartbeat's.
async fn row_counts(app: &TestApp) -> BTreeMap<String, i64> {
    let db = app.db.connect().await;
    let tables: Vec<String> = db
        .query("SELECT tablename::text FROM pg_tables WHERE schemaname = 'queen' ORDER BY 1", &[])
        .await
        .expect("tables")
        .iter()
        .map(|r| r.get(0))
        .filter(|table: &String| !HEARTBEAT_TABLES.contains(&table.as_str()))
        .collect();
    let mut counts = BTreeMap::new();
    for table in tables {
        let count: i64 = db.query_one(&format!("SELECT count(*) FROM queen.{table}"), &[]).await.expect("count").get(0);
        counts.insert(table, count);
    }
    counts
}

#[actix_web::test]
async fn ten_groups_cost_one_cursor_row_per_partition_each_and_no_other_write() {
    const GROUPS: usize = 10;
    let app = TestApp::spawn().await;
    push(&app, "fan", &["a", "b", "c"], 20).await;
    let before = row_counts(&app).await;
    let segment_bodies: i64 = app.count("SELECT sum(length(body))::bigint FROM queen.log_segments").await;

    for g in 0..GROUPS {
        let mut received = 0;
        loop {
            let answer = app.pop("queue/fan", &format!("batch=100&partitions=3&consumerGroup=g{g}")).await;
            if answer.status == StatusCode::NO_CONTENT {
                break;
            }
            let messages = answer.messages();
            received += messages.len();
            app.ack_all(&messages, "completed", Some(&format!("g{g}"))).await;
        }
        assert_eq!(received, 60, "group g{g} receives every message");
    }

    let after = row_counts(&app).await;
    assert_eq!(after["log_segments"], before["log_segments"], "segment rows are shared");
    assert_eq!(app.count("SELECT sum(length(body))::bigint FROM queen.log_segments").await, segment_bodies);
    assert_eq!(after["log_message_ids"], before["log_message_ids"]);
    assert_eq!(after["log_consumers"] - before["log_consumers"], (GROUPS * 3) as i64, "one cursor per partition");
    assert_eq!(
        after["consumer_groups_metadata"] - before["consumer_groups_metadata"],
        GROUPS as i64,
        "one registration per (queue, group), as the seeds specify"
    );
    let grown: BTreeSet<&String> = after.keys().filter(|t| after[*t] != before[*t]).collect();
    assert_eq!(grown, BTreeSet::from([&"log_consumers".to_owned(), &"consumer_groups_metadata".to_owned()]));
    let per_group: Vec<i64> = app
        .db
        .connect()
        .await
        .query("SELECT count(*) FROM queen.log_consumers GROUP BY consumer_group", &[])
        .await
        .expect("cursors")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(per_group, vec![3; GROUPS]);
}

#[actix_web::test]
async fn a_second_group_added_to_a_live_queue_reads_the_backlog_independently() {
    let app = TestApp::spawn().await;
    push(&app, "live", &["p"], 5).await;
    let first = app.pop("queue/live", "batch=10&consumerGroup=first").await.messages();
    app.ack_all(&first, "completed", Some("first")).await;
    push(&app, "live", &["p"], 2).await;
    assert_eq!(app.pop("queue/live", "batch=10&consumerGroup=second").await.messages().len(), 7);
    assert_eq!(app.pop("queue/live", "batch=10&consumerGroup=first").await.messages().len(), 2);
}

#[actix_web::test]
async fn a_group_whose_handler_keeps_failing_stalls_only_its_own_cursor() {
    let app = TestApp::spawn().await;
    app.post("/api/v1/configure", &json!({"queue": "poison", "options": {"retryLimit": 1}})).await;
    push(&app, "poison", &["p"], 3).await;
    let healthy = app.pop("queue/poison", "batch=10&consumerGroup=healthy").await.messages();
    app.ack_all(&healthy, "completed", Some("healthy")).await;

    // The failing group's first message fails on every delivery: its retry budget runs out.
    for delivery in 1..=2 {
        let batch = app.pop("queue/poison", "batch=1&consumerGroup=failing").await.messages();
        assert_eq!(batch[0]["data"]["i"], 0, "delivery {delivery} is the poison message again");
        app.ack_all(&batch, "failed", Some("failing")).await;
    }
    let next = app.pop("queue/poison", "batch=10&consumerGroup=failing").await.messages();
    assert_eq!(next.len(), 2, "after its retry budget the group moves past the message");
    assert_eq!(app.count("SELECT count(*) FROM queen.log_dlq WHERE consumer_group = 'failing'").await, 1);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_dlq WHERE consumer_group = 'healthy'").await, 0);
    assert_eq!(app.count("SELECT committed FROM queen.log_consumers WHERE consumer_group = 'healthy'").await, 3);
}

/// The broker commits the acks of every group together when they meet; one group's ack held up
/// (its cursor locked, here by the test) holds up no other group's.
#[actix_web::test]
async fn an_ack_held_up_on_one_groups_cursor_holds_up_no_other_groups_ack() {
    let app = TestApp::spawn().await;
    push(&app, "shared", &["p"], 1).await;
    let held = app.pop("queue/shared", "batch=1&consumerGroup=held").await.messages();
    let free = app.pop("queue/shared", "batch=1&consumerGroup=free").await.messages();

    let holder = app.hold_cursor("held").await;
    let held_ack = app.ack_all(&held, "completed", Some("held"));
    let meanwhile = async {
        app.until_waiting_for_a_lock("queen.log_consumers", "the held group's ack never waited for its cursor").await;
        let free_ack =
            tokio::time::timeout(Duration::from_secs(5), app.ack_all(&free, "completed", Some("free"))).await;
        let free_ack = free_ack.expect("the other group's ack waited for the held one");
        holder.batch_execute("ROLLBACK").await.expect("the lock released");
        free_ack
    };
    let (held_ack, free_ack) = futures::join!(held_ack, meanwhile);
    assert_eq!(free_ack[0]["success"], true, "{free_ack:?}");
    assert_eq!(held_ack[0]["success"], true, "once its cursor is free: {held_ack:?}");
}

/// A commit held up past `database.lock_timeout_ms` on one group's cursor fails that group's ack
/// (503) and no other group's, whichever acks it was committed together with.
#[actix_web::test]
async fn an_ack_that_times_out_on_one_groups_cursor_fails_no_other_groups_ack() {
    one_group_acks_past_the_lock_timeout("completed").await;
}

/// The same with the held group's ack in the full rules: the others' acks, committed by the first
/// statement of the commit that then failed, are answered as committed by their calls.
#[actix_web::test]
async fn an_ack_that_times_out_in_the_full_rules_leaves_the_others_committed_acks_answered() {
    one_group_acks_past_the_lock_timeout("failed").await;
}

/// Seven groups ack one message each at once; group `held`, acking with `held_status`, finds its
/// cursor locked past the lock timeout.
async fn one_group_acks_past_the_lock_timeout(held_status: &str) {
    let app = TestApp::spawn_with(|config| config.database.lock_timeout_ms = 300).await;
    push(&app, "shared", &["p"], 1).await;
    let groups = ["free0", "held", "free1", "free2", "free3", "free4", "free5"];
    let mut deliveries = Vec::new();
    for group in groups {
        deliveries.push(app.pop("queue/shared", &format!("batch=1&consumerGroup={group}")).await.messages());
    }
    let mut locker = app.db.connect().await;
    let lock = locker.transaction().await.expect("a transaction");
    let cursor = "SELECT 1 FROM queen.log_consumers WHERE consumer_group = 'held' FOR UPDATE";
    assert_eq!(lock.execute(cursor, &[]).await.expect("the lock"), 1);
    let acks = groups.iter().zip(&deliveries).map(|(group, messages)| {
        let status = if *group == "held" { held_status } else { "completed" };
        let body = ack_body(messages, status, Some(group));
        let app = &app;
        async move { app.post("/api/v1/ack/batch", &body).await }
    });
    let answers = futures::future::join_all(acks).await;
    lock.rollback().await.expect("the lock released");
    for (group, answer) in groups.iter().zip(&answers) {
        if *group == "held" {
            assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
        } else {
            assert_eq!(answer.status, StatusCode::OK, "{group}: {answer:?}");
            assert_eq!(answer.body[0]["success"], true, "{group}: {answer:?}");
            assert_eq!(answer.body[0]["noop"], false, "{group}: committed by this call: {answer:?}");
        }
    }
}

/// Locks group `g`'s cursor on `partition` of `parted` in a transaction of its own.
async fn lock_cursor<'a>(locker: &'a mut tokio_postgres::Client, partition: &str) -> tokio_postgres::Transaction<'a> {
    let lock = locker.transaction().await.expect("a transaction");
    let cursor = "SELECT 1 FROM queen.log_consumers c JOIN queen.partitions p ON p.id = c.partition_id
                   WHERE p.name = $1 AND c.consumer_group = 'g' FOR UPDATE OF c";
    assert_eq!(lock.execute(cursor, &[&partition]).await.expect("the lock"), 1);
    lock
}

/// A group's batch of two calls, the first completing what its lease delivered (committed on its
/// own, in the batch's first statement) and the second failing in the full rules: the first call
/// is answered as committed, only the second gets the error, and the lease the first released
/// wakes the group's waiting consumer at once.
#[actix_web::test]
async fn acks_committed_before_their_batch_failed_are_answered_and_wake_the_group() {
    // Long enough for the test to queue two calls behind the first, held on a cursor lock.
    let app = TestApp::spawn_with(|config| config.database.lock_timeout_ms = 4_000).await;
    push(&app, "parted", &["r", "q"], 1).await;
    push(&app, "parted", &["p"], 2).await;
    let mut leased = Vec::new();
    for partition in ["r", "p", "q"] {
        let route = format!("queue/parted/partition/{partition}");
        leased.push(app.pop(&route, "batch=1&consumerGroup=g&wait=false").await.messages().remove(0));
    }
    let (mut locker_r, mut locker_q) = (app.db.connect().await, app.db.connect().await);
    let lock_r = lock_cursor(&mut locker_r, "r").await;
    let lock_q = lock_cursor(&mut locker_q, "q").await;
    let calls = [("completed", &leased[0]), ("completed", &leased[1]), ("failed", &leased[2])]
        .map(|(status, message)| ack_body(std::slice::from_ref(message), status, Some("g")));
    let waiting = app.pop("queue/parted", "batch=10&consumerGroup=g&wait=true&timeout=60000");
    let acks = async {
        crate::long_poll::until_parked(&app, 1).await;
        // The group's first call is committed alone, held on r's cursor, while the next two wait
        // in the group's actor to go out together.
        let first = app.post("/api/v1/ack/batch", &calls[0]);
        let next_two = async {
            app.until_waiting_for_a_lock("UPDATE queen.log_consumers", "the first call waits for r's cursor").await;
            let second = app.post("/api/v1/ack/batch", &calls[1]);
            let third = app.post("/api/v1/ack/batch", &calls[2]);
            let release_r = async {
                let queued = r#"queen_actor_queued_requests{actor="group_leases"}"#;
                let two_queued = || async { app.metric(queued).await >= 2.0 };
                crate::kv::until(Duration::from_secs(10), "two calls queued behind the first", two_queued).await;
                lock_r.rollback().await.expect("r's cursor released");
            };
            let (second, third, ()) = futures::join!(second, third, release_r);
            (second, third)
        };
        let (first, (second, third)) = futures::join!(first, next_two);
        (first, second, third)
    };
    let woken = async { tokio::time::timeout(Duration::from_secs(15), waiting).await };
    let ((first, second, third), woken) = futures::join!(acks, woken);
    lock_q.rollback().await.expect("q's cursor released");
    for (call, answer) in [("first", &first), ("second", &second)] {
        assert_eq!(answer.status, StatusCode::OK, "{call}: {answer:?}");
        assert_eq!(answer.body[0]["success"], true, "{call}: {answer:?}");
        assert_eq!(answer.body[0]["noop"], false, "{call}: committed by this call: {answer:?}");
    }
    assert_eq!(third.status, StatusCode::SERVICE_UNAVAILABLE, "{third:?}");
    let woken = woken.expect("the waiting consumer was not woken by the lease the second call released");
    assert_eq!(woken.data_ints("i"), vec![1], "p's second message: {woken:?}");
    let again = app.post("/api/v1/ack/batch", &calls[2]).await;
    assert_eq!(again.body[0]["success"], true, "the failed call goes through once q's cursor is free: {again:?}");
}

/// Acks of several groups committed together: each call gets its own outcomes back.
#[actix_web::test]
async fn concurrent_acks_of_many_groups_each_get_their_own_outcomes() {
    let app = TestApp::spawn().await;
    push(&app, "many", &["p"], 3).await;
    let groups: Vec<String> = (0..8).map(|g| format!("g{g}")).collect();
    let mut deliveries = Vec::new();
    for group in &groups {
        deliveries.push(app.pop("queue/many", &format!("batch=3&consumerGroup={group}")).await.messages());
    }
    // Odd groups ack under a lease that is not theirs, and are refused; even groups complete.
    let acks = groups.iter().zip(&deliveries).enumerate().map(|(g, (group, messages))| {
        let mut messages = messages.clone();
        if g % 2 == 1 {
            messages.iter_mut().for_each(|m| m["leaseId"] = json!(uuid::Uuid::now_v7().to_string()));
        }
        let app = &app;
        async move { app.ack_all(&messages, "completed", Some(group)).await }
    });
    let answers = futures::future::join_all(acks).await;
    for (g, answer) in answers.iter().enumerate() {
        assert_eq!(answer.len(), 3, "group g{g}: {answer:?}");
        assert!(answer.iter().all(|a| a["success"] == (g % 2 == 0)), "group g{g}: {answer:?}");
    }
    let committed = "SELECT count(*) FROM queen.log_consumers WHERE committed = 3";
    assert_eq!(app.count(committed).await, 4, "the even groups' cursors, and only theirs, moved");
    let batches = app.metric("queen_ack_commit_batches_sum").await;
    let commits = app.metric("queen_ack_commit_batches_count").await;
    assert_eq!(batches, 8.0, "each group's batch counted once, in the commit that took it");
    assert!((1.0..=8.0).contains(&commits), "{commits} commits");
}

#[actix_web::test]
async fn consumers_of_one_group_claim_different_partitions() {
    let app = TestApp::spawn().await;
    push(&app, "spread", &["a", "b", "c"], 2).await;
    let mut partitions = BTreeSet::new();
    let mut leases = BTreeSet::new();
    for _ in 0..3 {
        let answer = app.pop("queue/spread", "batch=10&consumerGroup=workers").await;
        let messages = answer.messages();
        let claimed: BTreeSet<&str> = messages.iter().map(|m| m["partition"].as_str().expect("partition")).collect();
        assert_eq!(claimed.len(), 1, "one partition per pop");
        assert!(partitions.insert(claimed.into_iter().next().expect("one").to_owned()), "a partition claimed twice");
        leases.insert(answer.body["leaseId"].as_str().expect("lease").to_owned());
    }
    assert_eq!(partitions.len(), 3);
    assert_eq!(leases.len(), 3);
    assert_eq!(app.pop("queue/spread", "batch=10&consumerGroup=workers").await.status, StatusCode::NO_CONTENT);
}
