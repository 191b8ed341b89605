//! Transactions: ack stage one and push stage two in one PostgreSQL transaction, all or nothing.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

fn ack_op(message: &Value, group: Option<&str>) -> Value {
    let mut op = json!({"type": "ack", "transactionId": message["transactionId"], "partitionId": message["partitionId"],
                        "status": "completed", "leaseId": message["leaseId"]});
    if let Some(group) = group {
        op["consumerGroup"] = json!(group);
    }
    op
}

async fn committed(app: &TestApp, queue: &str, partition: &str) -> i64 {
    app.count(&format!(
        "SELECT c.committed FROM queen.log_consumers c JOIN queen.partitions p ON p.id = c.partition_id
           JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = '{queue}' AND p.name = '{partition}'"
    ))
    .await
}

async fn segments_of(app: &TestApp, queue: &str) -> i64 {
    app.count(&format!(
        "SELECT count(*) FROM queen.log_segments s JOIN queen.partitions p ON p.id = s.partition_id
           JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = '{queue}'"
    ))
    .await
}

#[actix_web::test]
async fn a_committed_transaction_acks_stage_one_and_pushes_stage_two_together() {
    let app = TestApp::spawn().await;
    app.push_one("stage-one", "p", "order-1", json!({"v": 1})).await;
    let message = app.pop("queue/stage-one", "batch=1").await.messages().remove(0);
    let bundle = json!({
        "operations": [ack_op(&message, None),
                       {"type": "push", "items": [{"queue": "stage-two", "transactionId": "order-1-billed", "payload": {"v": 2}}]}],
        "requiredLeases": [message["leaseId"]],
    });
    let answer = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["success"], true);
    let results = answer.body["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "one result per ack and per pushed item, in order");
    assert_eq!(results[0]["success"], true);
    assert_eq!(results[1]["status"], "queued");

    assert_eq!(committed(&app, "stage-one", "p").await, 1, "stage one was acknowledged");
    let pushed = app
        .count("SELECT p.last_offset FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'stage-two'")
        .await;
    assert_eq!(pushed, 1, "stage two was pushed");
    assert_eq!(app.pop("queue/stage-two", "batch=1").await.messages()[0]["data"], json!({"v": 2}));
}

#[actix_web::test]
async fn a_transaction_with_an_ack_under_an_expired_lease_rolls_back_whole() {
    let app = TestApp::spawn().await;
    app.post("/api/v1/configure", &json!({"queue": "short", "options": {"leaseTime": 1}})).await;
    app.push_one("short", "p", "a", json!("a")).await;
    app.push_one("long", "p", "b", json!("b")).await;
    let a = app.pop("queue/short", "batch=1").await.messages().remove(0);
    let b = app.pop("queue/long", "batch=1").await.messages().remove(0);
    // a's lease runs out and another consumer takes a.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if app.pop("queue/short", "batch=1&wait=true&timeout=500").await.status == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "a was never redelivered");
    }
    let bundle = json!({
        "operations": [ack_op(&a, None), ack_op(&b, None),
                       {"type": "push", "items": [{"queue": "next", "transactionId": "n", "payload": 1},
                                                  {"queue": "long", "partition": "fresh", "transactionId": "f",
                                                   "payload": 2}]}],
        "requiredLeases": [a["leaseId"], b["leaseId"]],
    });
    let answer = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{answer:?}");
    assert_eq!(answer.body["success"], false);
    assert!(answer.body["error"].as_str().is_some_and(|e| e.contains("rolled back")), "{answer:?}");

    assert_eq!(committed(&app, "long", "p").await, 0, "b's ack did not happen");
    assert_eq!(segments_of(&app, "next").await, 0, "the push did not happen");
    // Nor did the creation of what it would have pushed to.
    assert_eq!(app.get("/api/v1/resources/queues/next").await.status, StatusCode::NOT_FOUND);
    let fresh = "SELECT count(*) FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                  WHERE q.name = 'long' AND p.name = 'fresh'";
    assert_eq!(app.count(fresh).await, 0, "the refused bundle created a partition");
    let alone = app.ack_all(&[b], "completed", None).await;
    assert_eq!(alone[0]["success"], true, "b's lease is still good");
}

/// A consumer whose lease ran out while another consumer took its message over and acknowledged
/// it: its bundle must not push on that work. As a single ack the late ack is a no-op; in a
/// bundle it rolls the bundle back, though no `requiredLeases` names the dead lease.
#[actix_web::test]
async fn a_bundle_acking_a_message_another_consumer_committed_after_its_lease_ran_out_rolls_back() {
    let app = TestApp::spawn().await;
    app.post("/api/v1/configure", &json!({"queue": "handoff", "options": {"leaseTime": 1}})).await;
    app.push_one("handoff", "p", "job", json!("job")).await;
    let stalled = app.pop("queue/handoff", "batch=1").await.messages().remove(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let taken_over = loop {
        let answer = app.pop("queue/handoff", "batch=1&wait=true&timeout=500").await;
        if answer.status == StatusCode::OK {
            break answer.messages().remove(0);
        }
        assert!(Instant::now() < deadline, "the job was never delivered again");
    };
    assert_eq!(app.ack_all(&[taken_over], "completed", None).await[0]["success"], true);
    assert_eq!(committed(&app, "handoff", "p").await, 1);

    let bundle = json!({
        "operations": [ack_op(&stalled, None),
                       {"type": "push", "items": [{"queue": "handoff-done", "transactionId": "job-done", "payload": 1}]}],
    });
    let answer = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{answer:?}");
    let error = answer.body["error"].as_str().unwrap_or_default();
    assert!(error.contains("rolled back") && error.contains("expired lease"), "{error}");
    assert_eq!(segments_of(&app, "handoff-done").await, 0, "the push did not happen");
}

#[actix_web::test]
async fn a_transactional_push_is_idempotent() {
    let app = TestApp::spawn().await;
    let bundle = json!({"operations": [{"type": "push", "items": [{"queue": "idem", "partition": "p", "transactionId": "once", "payload": 1}]}],
                        "requiredLeases": []});
    let first = app.post("/api/v1/transaction", &bundle).await;
    let second = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!((first.status, second.status), (StatusCode::OK, StatusCode::OK));
    assert_eq!(first.body["results"][0]["status"], "queued");
    assert_eq!(second.body["results"][0]["status"], "duplicate");
    assert_eq!(second.body["results"][0]["message_id"], first.body["results"][0]["message_id"]);
    assert_eq!(app.pop("queue/idem", "batch=10").await.messages().len(), 1);
}

/// A bundle whose answer was lost after it committed is sent again: its ack ended the lease the
/// bundle requires, so the second copy finds it not live. All of it is in place already (the ack
/// a no-op under its own lease, the push a duplicate), so it is answered as applied, not told it
/// rolled back; a bundle that would change anything under that lease still rolls back.
#[actix_web::test]
async fn a_bundle_sent_again_after_it_committed_is_answered_as_applied() {
    let app = TestApp::spawn().await;
    app.push_one("again-in", "p", "job", json!(1)).await;
    let message = app.pop("queue/again-in", "batch=1").await.messages().remove(0);
    let bundle = |transaction_id: &str| {
        json!({
            "operations": [ack_op(&message, None),
                           {"type": "push", "items": [{"queue": "again-out", "transactionId": transaction_id, "payload": 2}]}],
            "requiredLeases": [message["leaseId"]],
        })
    };
    let first = app.post("/api/v1/transaction", &bundle("job-done")).await;
    assert_eq!((first.status, &first.body["results"][1]["status"]), (StatusCode::OK, &json!("queued")), "{first:?}");

    let again = app.post("/api/v1/transaction", &bundle("job-done")).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!((&again.body["results"][0]["success"], &again.body["results"][0]["noop"]), (&json!(true), &json!(true)));
    assert_eq!(again.body["results"][1]["status"], "duplicate");
    assert_eq!(again.body["results"][1]["message_id"], first.body["results"][1]["message_id"]);

    let other = app.post("/api/v1/transaction", &bundle("another")).await;
    assert_eq!(other.status, StatusCode::CONFLICT, "a new push under the ended lease: {other:?}");
    assert!(other.body["error"].as_str().is_some_and(|e| e.contains("not live")), "{other:?}");
    assert_eq!(app.pop("queue/again-out", "batch=10").await.messages().len(), 1, "stored once");
    assert_eq!(committed(&app, "again-in", "p").await, 1);
}

#[actix_web::test]
async fn bad_bundles_are_refused_and_write_nothing() {
    let app = TestApp::spawn().await;
    for (bundle, mentions) in [
        (json!({}), "operations"),
        (json!({"operations": []}), "operations"),
        (json!({"operations": [{"type": "teleport"}]}), "type"),
        (json!({"operations": [{"type": "push", "items": [{"queue": "x"}]}], "kv": []}), "kv"),
    ] {
        let answer = app.post("/api/v1/transaction", &bundle).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bundle}");
        assert!(answer.body["error"].as_str().is_some_and(|e| e.contains(mentions)), "{answer:?}");
    }
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 0);
}

/// An ack operation as the official clients send it in a bundle spanning several leases: no
/// `leaseId` of its own, the leases named in the bundle's `requiredLeases`.
fn unfenced_ack_op(message: &Value) -> Value {
    json!({"type": "ack", "transactionId": message["transactionId"], "partitionId": message["partitionId"],
           "status": "completed"})
}

#[actix_web::test]
async fn acks_without_their_own_lease_commit_under_the_bundles_required_leases() {
    let app = TestApp::spawn().await;
    app.push_one("multi-a", "p1", "a1", json!(1)).await;
    app.push_one("multi-a", "p2", "a2", json!(2)).await;
    app.push_one("multi-b", "p1", "b1", json!(3)).await;
    let first = app.pop("queue/multi-a/partition/p1", "batch=1").await.messages().remove(0);
    let second = app.pop("queue/multi-a/partition/p2", "batch=1").await.messages().remove(0);
    let third = app.pop("queue/multi-b", "batch=1").await.messages().remove(0);
    let leases: Vec<&Value> = vec![&first["leaseId"], &second["leaseId"], &third["leaseId"]];
    assert_ne!(leases[0], leases[1], "each pop has its own lease");

    let bundle = json!({
        "operations": [unfenced_ack_op(&first), unfenced_ack_op(&second), unfenced_ack_op(&third),
                       {"type": "push", "items": [{"queue": "multi-next", "payload": 4}]}],
        "requiredLeases": leases,
    });
    let answer = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["success"], true);
    assert_eq!(
        (committed(&app, "multi-a", "p1").await, committed(&app, "multi-a", "p2").await),
        (1, 1),
        "both partitions of the first queue were acknowledged"
    );
    assert_eq!(committed(&app, "multi-b", "p1").await, 1, "and the other queue's");
    assert_eq!(app.pop("queue/multi-next", "batch=10").await.messages().len(), 1);
}

#[actix_web::test]
async fn a_required_lease_that_is_not_live_rolls_the_bundle_back() {
    let app = TestApp::spawn().await;
    app.post("/api/v1/configure", &json!({"queue": "brief", "options": {"leaseTime": 1}})).await;
    app.push_one("brief", "p", "x", json!("x")).await;
    app.push_one("steady", "p", "y", json!("y")).await;
    let x = app.pop("queue/brief", "batch=1").await.messages().remove(0);
    let y = app.pop("queue/steady", "batch=1").await.messages().remove(0);
    // x's lease runs out; nobody takes x again, so the ack alone would be unfenced-legal.
    let expired = Instant::now() + Duration::from_secs(10);
    while app.count("SELECT count(*) FROM queen.log_consumers WHERE lease_expires_at > now()").await > 1 {
        assert!(Instant::now() < expired, "x's lease never ran out");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bundle = json!({"operations": [unfenced_ack_op(&y)], "requiredLeases": [x["leaseId"], y["leaseId"]]});
    let answer = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{answer:?}");
    let error = answer.body["error"].as_str().unwrap_or_default();
    assert!(error.contains("rolled back") && error.contains(x["leaseId"].as_str().unwrap()), "{error}");
    assert_eq!(committed(&app, "steady", "p").await, 0, "y's ack did not happen");
}

#[actix_web::test]
async fn an_unfenced_ack_of_a_partition_held_under_another_lease_rolls_the_bundle_back() {
    let app = TestApp::spawn().await;
    app.push_one("held", "p1", "m1", json!(1)).await;
    app.push_one("held", "p2", "m2", json!(2)).await;
    let mine = app.pop("queue/held/partition/p1", "batch=1").await.messages().remove(0);
    let theirs = app.pop("queue/held/partition/p2", "batch=1").await.messages().remove(0);
    // Only my lease is required, but the bundle also acks the partition another consumer holds.
    let bundle = json!({"operations": [unfenced_ack_op(&mine), unfenced_ack_op(&theirs)],
                        "requiredLeases": [mine["leaseId"]]});
    let answer = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{answer:?}");
    assert!(answer.body["error"].as_str().is_some_and(|e| e.contains("requiredLeases")), "{answer:?}");
    assert_eq!((committed(&app, "held", "p1").await, committed(&app, "held", "p2").await), (0, 0));

    // Without requiredLeases, an ack without a lease keeps the old rule: refused while leased...
    let bare = json!({"operations": [unfenced_ack_op(&mine)]});
    assert_eq!(app.post("/api/v1/transaction", &bare).await.status, StatusCode::CONFLICT);
    // ...and accepted with the lease of the delivery.
    let fenced = json!({"operations": [ack_op(&mine, None)]});
    assert_eq!(app.post("/api/v1/transaction", &fenced).await.status, StatusCode::OK);
}

/// A transaction that appended to a partition holds the partition's append lock until it ends;
/// meanwhile a pop of a group new to the partition creates its cursor there, whose foreign key
/// takes a key-share lock on the same row. The append lock must not block that: when it did, a
/// bundle appending to two partitions and a pop creating cursors on both deadlocked.
#[actix_web::test]
async fn a_transaction_appending_to_a_partition_does_not_hold_up_a_new_groups_cursor_there() {
    use queen_store::log::{AppendPolicy, NewMessage, append_in_transaction};

    let app = TestApp::spawn().await;
    app.push_one("busy", "p", "committed", json!(1)).await;
    let destination = app.destination("busy", "p").await;
    let mut pusher = app.store_connection("appending").await;
    let held = pusher.transaction().await.expect("a transaction");
    let message = NewMessage {
        message_id: uuid::Uuid::now_v7(),
        transaction_id: "in-flight".into(),
        trace_id: None,
        producer: None,
        payload: b"2".to_vec(),
        received: None,
    };
    append_in_transaction(&held, destination, &[message], &AppendPolicy::default()).await.expect("the append");

    let pop = app.pop("queue/busy", "batch=10&consumerGroup=newcomer&subscriptionMode=all");
    let answer = tokio::time::timeout(Duration::from_secs(5), pop).await.expect("the pop is not held up");
    assert_eq!(answer.transaction_ids(), vec!["committed"], "{answer:?}");
    held.commit().await.expect("the append commits");
    app.ack_all(&answer.messages(), "completed", Some("newcomer")).await;
    let next = app.pop("queue/busy", "batch=10&consumerGroup=newcomer").await;
    assert_eq!(next.transaction_ids(), vec!["in-flight"], "{next:?}");
}

/// Deleting a queue takes its cursors before its row and partitions, the order a bundle takes them
/// in (a partition the bundle creates holds the queue's row), so a deletion that meets a bundle on
/// the queue waits for it instead of deadlocking with it.
#[actix_web::test]
async fn a_queue_deleted_while_a_bundle_acks_and_pushes_on_it_waits_for_the_bundle_instead_of_deadlocking() {
    let app = TestApp::spawn().await;
    // A capped queue: a bundle pushing to it takes the queue's capacity lock between its cursor
    // and its partition, which lets the test stop it there.
    app.configure("capped", json!({"maxSize": 100})).await;
    app.push_one("capped", "p", "order-1", json!(1)).await;
    let message = app.pop("queue/capped", "batch=1").await.messages().remove(0);
    let push = json!({"type": "push", "items": [
        {"queue": "capped", "partition": "p", "transactionId": "order-2", "payload": 2},
        {"queue": "capped", "partition": "fresh", "transactionId": "order-3", "payload": 3},
    ]});
    let bundle = json!({"operations": [ack_op(&message, None), push]});
    let queue_id = app.count("SELECT id FROM queen.queues WHERE name = 'capped'").await;
    let holder = app.db.connect().await;
    holder
        .execute("SELECT pg_advisory_lock($1, $2)", &[&queen_store::queues::CAPACITY_LOCK_CLASS, &(queue_id as i32)])
        .await
        .expect("holding the capacity lock");

    let sent = app.post("/api/v1/transaction", &bundle);
    let deleted = async {
        // The bundle holds the cursor and waits for the capacity lock; the deletion then waits
        // for the bundle. Deleting the partition before the cursor would leave the bundle, once
        // let go, waiting for the partition the deletion holds: a deadlock.
        crate::retention::until_count(&app, &crate::retention::waiting_in("pg_advisory_xact_lock"), 1).await;
        let deletion = app.delete("/api/v1/resources/queues/capped");
        let let_go = async {
            crate::retention::until_count(&app, &crate::retention::waiting_in(""), 2).await;
            holder.execute("SELECT pg_advisory_unlock_all()", &[]).await.expect("unlock");
        };
        tokio::join!(deletion, let_go).0
    };
    let (bundle_answer, deletion_answer) = tokio::join!(sent, deleted);
    assert_eq!(bundle_answer.status, StatusCode::OK, "{bundle_answer:?}");
    assert_eq!(deletion_answer.status, StatusCode::OK, "{deletion_answer:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.queues WHERE name = 'capped'").await, 0);
    assert_eq!(
        app.count("SELECT count(*) FROM queen.partitions").await,
        0,
        "the bundle's partitions, the one it created too, went with the queue"
    );
}

/// PostgreSQL ends a deadlock by failing one side's transaction. A bundle failed that way wrote
/// nothing and would go through on its own, so it is answered 503 (retry later), not 500, and the
/// same bundle sent again commits.
#[actix_web::test]
async fn a_bundle_ended_as_a_deadlocks_victim_is_answered_503_and_commits_when_sent_again() {
    let app = TestApp::spawn().await;
    app.push_one("stage-one", "p", "order-1", json!(1)).await;
    app.push_one("stage-two", "p", "order-0-billed", json!(0)).await;
    let message = app.pop("queue/stage-one", "batch=1").await.messages().remove(0);
    let push = json!({"type": "push", "items": [{"queue": "stage-two", "partition": "p", "transactionId": "order-1-billed", "payload": 1}]});
    let bundle = json!({"operations": [ack_op(&message, None), push]});

    // Another session holds stage two's partition, which the bundle locks after stage one's
    // cursor; once the bundle waits for it, the session asks for that cursor: a cycle, in which
    // PostgreSQL fails whoever checks for a deadlock first, the bundle, which waited first (the
    // session checks only after 10 s, so a busy machine cannot make it the first).
    let holder = app.db.connect().await;
    holder
        .batch_execute(
            "SET deadlock_timeout = '10s';
             BEGIN; UPDATE queen.partitions p SET last_offset = last_offset FROM queen.queues q
                     WHERE q.id = p.queue_id AND q.name = 'stage-two'",
        )
        .await
        .expect("holding the partition");
    let sent = app.post("/api/v1/transaction", &bundle);
    let close_the_cycle = async {
        let waiting = crate::retention::waiting_in("FROM queen.partitions WHERE id = $1 FOR NO KEY UPDATE");
        crate::retention::until_count(&app, &waiting, 1).await;
        holder
            .batch_execute("SELECT * FROM queen.log_consumers FOR UPDATE")
            .await
            .expect("the cursor, after the bundle");
        holder.batch_execute("ROLLBACK").await.expect("rollback");
    };
    let (answer, ()) = tokio::join!(sent, close_the_cycle);
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
    assert!(answer.body["error"].as_str().is_some_and(|e| e.contains("retry later")), "{answer:?}");
    assert_eq!(committed(&app, "stage-one", "p").await, 0, "the ack was rolled back");
    let stage_two = "SELECT p.last_offset FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                      WHERE q.name = 'stage-two'";
    assert_eq!(app.count(stage_two).await, 1, "the push was rolled back");

    let again = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!(committed(&app, "stage-one", "p").await, 1);
    let billed = app.pop("queue/stage-two", "batch=10").await;
    assert_eq!(billed.transaction_ids(), vec!["order-0-billed", "order-1-billed"]);
}

/// A transaction id pushed again after its dedup window names several messages. An ack that names
/// it and is resolved by looking the id up (as a bundle's acks are, and any ack that reaches
/// another broker than the one that delivered) means the earliest the group has not consumed,
/// as the delivering broker would say, not the latest copy: acking the latest would commit the
/// messages between, unprocessed.
#[actix_web::test]
async fn an_ack_naming_an_id_pushed_again_past_its_window_commits_only_the_unconsumed_copy() {
    let app = TestApp::spawn().await;
    app.configure("reused", json!({"dedupWindowSeconds": 60})).await;
    app.push_one("reused", "p", "order-1", json!(1)).await;
    app.push_one("reused", "p", "between", json!(2)).await;
    for copy in [3, 4] {
        crate::queue_options::age_queue(&app, "reused", "2 hours").await;
        assert_eq!(app.push_one("reused", "p", "order-1", json!(copy)).await["status"], "queued", "copy {copy}");
    }
    let popped = app.pop("queue/reused", "batch=10").await.messages();
    let data: Vec<&Value> = popped.iter().map(|m| &m["data"]).collect();
    assert_eq!(data, [1, 2, 3, 4]);

    for (message, reached) in popped.iter().zip(1..) {
        let answer = app.post("/api/v1/transaction", &json!({"operations": [ack_op(message, None)]})).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(committed(&app, "reused", "p").await, reached, "the ack of {}", message["data"]);
    }
}
