//! Delivery guarantees: an ack commits only what the group received, and a message whose
//! deliveries keep failing, by failed acks or by leases running out, ends in the dead-letter queue.

use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp};

async fn push_n(app: &TestApp, queue: &str, n: i64) {
    let items: Vec<Value> = (1..=n)
        .map(|i| json!({"queue": queue, "partition": "p", "transactionId": format!("m{i}"), "payload": {"n": i}}))
        .collect();
    app.push(Value::Array(items)).await;
}

/// Acknowledges one message of the partition by transaction id, without a lease.
async fn ack_unfenced(app: &TestApp, partition_id: &Value, transaction_id: &str, status: &str) -> Value {
    let ack = json!({"transactionId": transaction_id, "partitionId": partition_id, "status": status,
                     "consumerGroup": "g"});
    let answer = app.post("/api/v1/ack", &ack).await;
    assert_eq!(answer.status, reqwest::StatusCode::OK, "{answer:?}");
    answer.body[0].clone()
}

#[actix_web::test]
async fn an_ack_without_a_lease_cannot_commit_past_what_the_group_received() {
    let app = TestApp::spawn().await;
    push_n(&app, "received", 3).await;
    let first = app.pop("queue/received", "batch=1&consumerGroup=g").await.messages();
    assert_eq!(app.ack_all(&first, "completed", Some("g")).await[0]["success"], true);
    let partition_id = &first[0]["partitionId"];

    for status in ["completed", "dlq", "failed"] {
        let verdict = ack_unfenced(&app, partition_id, "m3", status).await;
        assert_eq!(verdict["success"], false, "{status} of a message never delivered: {verdict}");
        let error = verdict["error"].as_str().unwrap_or_default();
        assert!(error.contains("never received"), "{error}");
    }
    assert_eq!(app.count("SELECT count(*) FROM queen.log_dlq").await, 0, "nothing dead-lettered");
    let rest = app.pop("queue/received", "batch=10&consumerGroup=g").await;
    assert_eq!(rest.transaction_ids(), vec!["m2", "m3"], "the group still gets the message it never received");

    // Once delivered (and the lease given back), the same unfenced ack commits.
    let retried = app.ack_all(&rest.messages()[..1], "retry", Some("g")).await;
    assert_eq!(retried[0]["success"], true);
    assert_eq!(ack_unfenced(&app, partition_id, "m3", "completed").await["success"], true);
    assert_eq!(app.pop("queue/received", "batch=10&consumerGroup=g").await.messages().len(), 0);
}

#[actix_web::test]
async fn a_message_whose_leases_keep_expiring_is_dead_lettered_after_the_retry_limit() {
    const LIMIT: i64 = 2;
    let app = TestApp::spawn().await;
    app.configure("poison", json!({"leaseTime": 1, "retryLimit": LIMIT})).await;
    push_n(&app, "poison", 2).await;
    // A consumer that crashes on m1 every time: it never acknowledges, so each lease runs out.
    // A long poll answers as soon as the running lease has expired.
    for delivery in 1..=LIMIT + 1 {
        let answer = app.pop("queue/poison", "batch=1&consumerGroup=g&wait=true&timeout=5000").await;
        let messages = answer.messages();
        assert_eq!(answer.transaction_ids(), vec!["m1"], "delivery {delivery}");
        assert_eq!(messages[0]["deliveryAttempt"], delivery, "delivery {delivery}");
    }
    let next = app.pop("queue/poison", "batch=1&consumerGroup=g&wait=true&timeout=5000").await;
    assert_eq!(next.transaction_ids(), vec!["m2"], "the partition moved on");
    assert_eq!(next.messages()[0]["deliveryAttempt"], 1);

    let dlq = app.get("/api/v1/dlq?queue=poison").await;
    assert_eq!(dlq.body["total"], 1, "{dlq:?}");
    let letter = &dlq.body["messages"][0];
    assert_eq!(letter["transactionId"], "m1");
    assert_eq!(letter["data"], json!({"n": 1}), "the payload is copied");
    assert_eq!(letter["errorMessage"], "lease expired 3 times");
    assert_eq!(letter["retryCount"], LIMIT, "retried LIMIT times after its first delivery");
    assert_eq!(letter["consumerGroup"], "g");
    assert_eq!(app.metric("queen_messages_dead_lettered_total{queue=\"poison\"}").await, 1.0);
}

/// A lease that ran out over a message the next pop gave up on: the late `completed` of its
/// consumer is refused as an expired lease, not answered done while the message is dead-lettered.
#[actix_web::test]
async fn a_late_ack_of_a_message_given_up_after_its_lease_ran_out_is_refused() {
    let app = TestApp::spawn().await;
    app.configure("given-up", json!({"leaseTime": 1, "retryLimit": 0})).await;
    push_n(&app, "given-up", 1).await;
    let crashed = app.pop("queue/given-up", "batch=1&consumerGroup=g").await.messages();
    assert_eq!(crashed.len(), 1);
    let dead_lettered = || async { app.get("/api/v1/dlq?queue=given-up").await.body["total"] == 1 };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !dead_lettered().await {
        assert!(std::time::Instant::now() < deadline, "the message was never given up");
        // Past the lease, a pop gives the message up and finds nothing else.
        assert_eq!(
            app.pop("queue/given-up", "batch=1&consumerGroup=g&wait=true&timeout=1500").await.messages().len(),
            0
        );
    }
    let late = app.ack_all(&crashed, "completed", Some("g")).await;
    assert_eq!(late[0]["success"], false, "{late:?}");
    assert!(late[0]["error"].as_str().is_some_and(|e| e.contains("invalid or expired lease")), "{late:?}");
}

#[actix_web::test]
async fn failed_acks_and_expired_leases_count_together_and_the_attempt_count_is_the_fleets() {
    let app = TestApp::spawn().await;
    let other = TestApp::spawn_on(&app.db, |_| {}).await;
    app.configure("mixed", json!({"leaseTime": 1, "retryLimit": 2})).await;
    push_n(&app, "mixed", 2).await;
    let long_poll = "batch=1&consumerGroup=g&wait=true&timeout=5000";

    // Delivery 1 on this broker, acknowledged as failed.
    let first = app.pop("queue/mixed", long_poll).await.messages();
    assert_eq!(first[0]["deliveryAttempt"], 1);
    assert_eq!(app.ack_all(&first, "failed", Some("g")).await[0]["success"], true);
    // Delivery 2 on the other broker, left to expire; delivery 3 back here, left to expire too.
    let second: Value = app
        .http
        .get(format!("{other}/api/v1/pop/queue/mixed?{long_poll}"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("a pop on the other broker")
        .json()
        .await
        .expect("JSON");
    assert_eq!(second["messages"][0]["transactionId"], "m1");
    assert_eq!(second["messages"][0]["deliveryAttempt"], 2, "counted across brokers");
    let third = app.pop("queue/mixed", long_poll).await;
    assert_eq!(third.transaction_ids(), vec!["m1"]);
    assert_eq!(third.messages()[0]["deliveryAttempt"], 3);

    assert_eq!(app.pop("queue/mixed", long_poll).await.transaction_ids(), vec!["m2"]);
    let dlq = app.get("/api/v1/dlq?queue=mixed").await;
    assert_eq!(dlq.body["messages"][0]["errorMessage"], "failed 3 times: 1 failed ack, lease expired 2 times");
}

#[actix_web::test]
async fn a_queue_that_does_not_dead_letter_drops_a_message_whose_leases_keep_expiring() {
    let app = TestApp::spawn().await;
    app.configure("dropping", json!({"leaseTime": 1, "retryLimit": 0, "dlqAfterMaxRetries": false})).await;
    push_n(&app, "dropping", 2).await;
    let long_poll = "batch=1&consumerGroup=g&wait=true&timeout=5000";
    assert_eq!(app.pop("queue/dropping", long_poll).await.transaction_ids(), vec!["m1"]);
    assert_eq!(app.pop("queue/dropping", long_poll).await.transaction_ids(), vec!["m2"]);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_dlq").await, 0);
    assert_eq!(app.metric("queen_messages_dropped_total{queue=\"dropping\"}").await, 1.0);
}

#[actix_web::test]
async fn a_pop_that_cannot_read_what_it_claimed_gives_the_lease_back_uncounted() {
    let app = TestApp::spawn().await;
    app.configure("unreadable", json!({"retryLimit": 0})).await;
    push_n(&app, "unreadable", 2).await;
    app.db.connect().await.batch_execute("UPDATE queen.log_segments SET body = '\\x00'").await.expect("corrupting");

    let failed = app.pop("queue/unreadable", "batch=1&consumerGroup=g").await;
    assert_eq!(failed.status, reqwest::StatusCode::INTERNAL_SERVER_ERROR, "{failed:?}");
    let live_leases = "SELECT count(*) FROM queen.log_consumers WHERE lease_expires_at > now()";
    assert_eq!(app.count(live_leases).await, 0, "nobody got the message: no lease holds the partition");
    assert_eq!(app.count("SELECT head_attempts::bigint FROM queen.log_consumers").await, 0, "no delivery counted");
    // The next consumer is not kept waiting for a lease: it meets the same fault at once.
    let again = app.pop("queue/unreadable", "batch=1&consumerGroup=g").await;
    assert_eq!(again.status, reqwest::StatusCode::INTERNAL_SERVER_ERROR, "{again:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.log_dlq").await, 0, "nothing given up on");
}

/// The partitions of the messages a pop answered, in order, without repeats.
fn partitions_of(answer: &[Value]) -> Vec<String> {
    let mut partitions: Vec<String> = Vec::new();
    for message in answer {
        let partition = message["partition"].as_str().expect("partition").to_owned();
        if partitions.last() != Some(&partition) {
            partitions.push(partition);
        }
    }
    partitions
}

#[actix_web::test]
async fn queue_wide_pops_serve_the_longest_unserved_partition_first_and_reach_a_new_one() {
    let app = TestApp::spawn().await;
    let items = |partition: &str, n: i64| -> Value {
        let item = |i| {
            json!({"queue": "turns", "partition": partition, "transactionId": format!("{partition}{i}"),
                   "payload": {"n": i}})
        };
        Value::Array((1..=n).map(item).collect())
    };
    app.push(items("a", 30)).await;
    app.push(items("b", 30)).await;
    // One partition per pop: both always have more, so each pop takes the one the group was
    // served longest ago, and the two take turns.
    let mut served = Vec::new();
    for _ in 0..6 {
        let answer = app.pop("queue/turns", "batch=5&partitions=1&consumerGroup=g").await.messages();
        assert_eq!(answer.len(), 5, "a pop of one partition takes five of its messages");
        served.extend(partitions_of(&answer));
        app.ack_all(&answer, "completed", Some("g")).await;
    }
    assert!(served.windows(2).all(|pair| pair[0] != pair[1]), "the two partitions take turns: {served:?}");

    // A partition the group has never read, among partitions that always have more: it is
    // served by the next pops, not after the others drain.
    app.push(items("c", 1)).await;
    let mut next = Vec::new();
    for _ in 0..2 {
        let answer = app.pop("queue/turns", "batch=5&partitions=1&consumerGroup=g").await.messages();
        next.extend(partitions_of(&answer));
        app.ack_all(&answer, "completed", Some("g")).await;
    }
    assert!(next.contains(&"c".to_owned()), "the new partition was served within two pops: {next:?}");
}

/// Two pops of one group at once, over eight partitions of `per_partition` messages each: what
/// each was answered, checked to share no message and no partition.
async fn two_concurrent_pops(per_partition: i64, query: &str) -> (Vec<Value>, Vec<Value>) {
    let app = TestApp::spawn().await;
    for partition in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        let item = |i| {
            json!({"queue": "shared", "partition": partition, "transactionId": format!("{partition}{i}"),
                   "payload": {"n": i}})
        };
        app.push(Value::Array((1..=per_partition).map(item).collect())).await;
    }
    let (first, second) = tokio::join!(app.pop("queue/shared", query), app.pop("queue/shared", query));
    let (first, second) = (first.messages(), second.messages());
    let mut taken: Vec<String> = first.iter().chain(&second).map(|m| m["transactionId"].to_string()).collect();
    let answered = taken.len();
    taken.sort();
    taken.dedup();
    assert_eq!(taken.len(), answered, "no message went to both");
    let (one, other) = (partitions_of(&first), partitions_of(&second));
    assert!(one.iter().all(|p| !other.contains(p)), "each partition went to one pop: {one:?} {other:?}");
    (first, second)
}

#[actix_web::test]
async fn concurrent_pops_of_a_group_each_fill_their_batch_from_partitions_the_other_left() {
    // Each batch needs two partitions' worth; whichever pop claims first, the other finds two
    // more partitions past the ones just taken.
    let (first, second) = two_concurrent_pops(30, "batch=60&partitions=10&consumerGroup=g").await;
    assert_eq!((first.len(), second.len()), (60, 60), "both pops filled their batch");
}

#[actix_web::test]
async fn concurrent_pops_of_a_group_each_take_their_partitions_when_the_batch_is_not_the_limit() {
    // Eight messages in all cannot fill a batch of 100: the partition limit is what stops each
    // pop, and neither holds more partitions than it takes.
    let (first, second) = two_concurrent_pops(1, "batch=100&partitions=2&consumerGroup=g").await;
    assert_eq!((first.len(), second.len()), (2, 2), "both pops took two partitions");
}

/// Pushes five messages of about 30 KB to each of partitions `a` and `b` of `queue`: one segment
/// each, more than a 64 KiB answer holds.
async fn push_large(app: &TestApp, queue: &str) {
    let large = "x".repeat(30_000);
    for partition in ["a", "b"] {
        let items: Vec<Value> = (1..=5)
            .map(|i| {
                json!({"queue": queue, "partition": partition, "transactionId": format!("{partition}{i}"),
                            "payload": large})
            })
            .collect();
        app.push(Value::Array(items)).await;
    }
}

/// A pop hands out at most `pop.max_answer_bytes` of payload, and at least one message: here
/// three messages of a batch of ten. What it claimed past them is not kept from the group: the
/// other partition's lease goes back at once, so another consumer is served it, and the ack of
/// the three ends the lease, so the rest follows. Each message is delivered once.
#[actix_web::test]
async fn a_pop_cut_by_its_byte_bound_keeps_nothing_it_did_not_hand_out_from_the_group() {
    let app = TestApp::spawn_with(|config| config.pop.max_answer_bytes = 64 * 1024).await;
    push_large(&app, "large").await;
    let query = "batch=10&partitions=2&consumerGroup=g";
    let first = app.pop("queue/large", query).await;
    assert_eq!(first.transaction_ids(), vec!["a1", "a2", "a3"], "as much as 64 KiB holds");
    let second = app.pop("queue/large", query).await;
    assert_eq!(second.transaction_ids(), vec!["b1", "b2", "b3"], "the partition the first pop left");
    assert!(app.pop("queue/large", query).await.messages().is_empty(), "the rest is leased to the two");

    let mut delivered = [first.transaction_ids(), second.transaction_ids()].concat();
    app.ack_all(&first.messages(), "completed", Some("g")).await;
    app.ack_all(&second.messages(), "completed", Some("g")).await;
    let rest = app.pop("queue/large", query).await;
    assert_eq!(rest.transaction_ids(), vec!["a4", "a5"], "the acks ended the leases");
    app.ack_all(&rest.messages(), "completed", Some("g")).await;
    delivered.extend(rest.transaction_ids());
    let last = app.pop("queue/large", query).await;
    app.ack_all(&last.messages(), "completed", Some("g")).await;
    delivered.extend(last.transaction_ids());
    assert_eq!(delivered, ["a1", "a2", "a3", "b1", "b2", "b3", "a4", "a5", "b4", "b5"]);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_consumers WHERE lease_expires_at IS NOT NULL").await, 0);
    assert_eq!(app.count("SELECT sum(retry_count) FROM queen.log_consumers").await, 0, "no delivery failed");
}

/// The same with `autoAck`, which commits at delivery: the cursor moves only past what the pop
/// handed out, and no message is lost.
#[actix_web::test]
async fn an_auto_acked_pop_cut_by_its_byte_bound_commits_only_what_it_handed_out() {
    let app = TestApp::spawn_with(|config| config.pop.max_answer_bytes = 64 * 1024).await;
    push_large(&app, "large").await;
    let mut delivered = Vec::new();
    loop {
        let answer = app.pop("queue/large", "batch=10&partitions=2&consumerGroup=g&autoAck=true").await;
        if answer.messages().is_empty() {
            break;
        }
        assert!(answer.messages().len() <= 3, "{:?}", answer.transaction_ids());
        delivered.extend(answer.transaction_ids());
    }
    delivered.sort();
    assert_eq!(delivered, ["a1", "a2", "a3", "a4", "a5", "b1", "b2", "b3", "b4", "b5"]);
}

/// One message larger than the bound is still handed out, alone.
#[actix_web::test]
async fn a_message_larger_than_the_byte_bound_is_handed_out_alone() {
    let app = TestApp::spawn_with(|config| config.pop.max_answer_bytes = 1024).await;
    push_large(&app, "large").await;
    let answer = app.pop("queue/large", "batch=10&consumerGroup=g").await;
    assert_eq!(answer.transaction_ids(), vec!["a1"]);
}

/// What a cut pop did not hand out is not counted as delivered to the group: an ack without a
/// lease of it is refused, after a leased pop (cut, or given back whole) as after an auto-acked
/// one.
#[actix_web::test]
async fn an_ack_without_a_lease_cannot_commit_what_a_cut_pop_did_not_hand_out() {
    let app = TestApp::spawn_with(|config| config.pop.max_answer_bytes = 64 * 1024).await;
    push_large(&app, "large").await;
    let first = app.pop("queue/large", "batch=10&partitions=2&consumerGroup=g").await.messages();
    assert_eq!(first.len(), 3, "a1..a3");
    app.ack_all(&first, "completed", Some("g")).await;
    // `a` was cut after a3, `b` given back whole.
    for (partition, never_handed_out) in [("a", "a5"), ("b", "b5")] {
        let id = app.count(&format!("SELECT id FROM queen.partitions WHERE name = '{partition}'")).await;
        let verdict = ack_unfenced(&app, &json!(id.to_string()), never_handed_out, "completed").await;
        assert_eq!(verdict["success"], false, "{partition}: {verdict}");
        assert!(verdict["error"].as_str().unwrap_or_default().contains("never received"), "{verdict}");
    }

    let auto = app.pop("queue/large", "batch=10&consumerGroup=auto&autoAck=true").await.messages();
    assert_eq!(auto.len(), 3);
    let ack = json!({"transactionId": "a5", "partitionId": auto[0]["partitionId"], "status": "completed",
                     "consumerGroup": "auto"});
    let verdict = app.post("/api/v1/ack", &ack).await.body[0].clone();
    assert_eq!(verdict["success"], false, "{verdict}");
    assert!(verdict["error"].as_str().unwrap_or_default().contains("never received"), "{verdict}");
}

/// An auto-acked pop cut by its byte bound whose cursor another pop of the group moved on
/// meanwhile (here the test, while the pop waited to read its segments) cannot move it back:
/// it hands out everything it committed, rather than lose the rest.
#[actix_web::test]
async fn an_auto_acked_pop_whose_cursor_moved_on_hands_out_all_it_committed() {
    let app = TestApp::spawn_with(|config| config.pop.max_answer_bytes = 64 * 1024).await;
    let large = "x".repeat(30_000);
    let items: Vec<Value> = (1..=10)
        .map(|i| json!({"queue": "moved", "partition": "p", "transactionId": format!("m{i}"), "payload": large}))
        .collect();
    app.push(Value::Array(items)).await;
    // The group's cursor, made by a first pop that reads no segment (nor caches one).
    let none = app.pop("queue/moved", "batch=1&consumerGroup=g&autoAck=true&subscriptionMode=new").await;
    assert!(none.messages().is_empty(), "{none:?}");
    app.db.connect().await.batch_execute("UPDATE queen.log_consumers SET committed = 0").await.expect("rewound");

    let mut locker = app.db.connect().await;
    let lock = locker.transaction().await.expect("a transaction");
    lock.batch_execute("LOCK TABLE queen.log_segments IN ACCESS EXCLUSIVE MODE").await.expect("the lock");
    let popped = app.pop("queue/moved", "batch=5&consumerGroup=g&autoAck=true");
    let meanwhile = async {
        app.until_waiting_for_a_lock("queen.log_segments", "the pop never read its segments").await;
        // Another pop of the group took 6 and 7.
        let moved = "UPDATE queen.log_consumers SET committed = 7 WHERE consumer_group = 'g'";
        app.db.connect().await.batch_execute(moved).await.expect("moved on");
        lock.rollback().await.expect("the lock released");
    };
    let (popped, ()) = futures::join!(popped, meanwhile);
    assert_eq!(popped.transaction_ids(), vec!["m1", "m2", "m3", "m4", "m5"], "past the bound, and nothing lost");
    let next = app.pop("queue/moved", "batch=1&consumerGroup=g&autoAck=true").await;
    assert_eq!(next.transaction_ids(), vec!["m8"]);
}

/// An auto-acked pop commits its whole claim at once and moves the cursor back over what its byte
/// bound left out. Consumed-message retention that trims in between (here run by the test while
/// the pop waits to read) must not take that rest: it counts the claim from where it started,
/// and the rest is delivered next, nothing lost.
/// A broker, and its pop of four 600-byte messages of partition `p` of `queue` as group `g`
/// (auto-acked or leased), cut by a 1024-byte answer bound after the second, whose take-back of
/// the rest finds the group's cursor locked (an ack transaction holding it): PostgreSQL refuses
/// it after the 500 ms lock timeout. The cursor's lock is released once the answer is in.
async fn pop_whose_take_back_is_refused(queue: &str, query: &str) -> (TestApp, Answer) {
    let app = TestApp::spawn_with(|config| {
        config.pop.max_answer_bytes = 1024;
        config.database.lock_timeout_ms = 500;
    })
    .await;
    for i in 1..=4 {
        app.push_one(queue, "p", &format!("m{i}"), json!({"pad": "x".repeat(600)})).await;
    }
    // The group's cursor, made by a first pop that reads no segment, then set to the start.
    let none = app.pop(&format!("queue/{queue}"), "batch=1&consumerGroup=g&autoAck=true&subscriptionMode=new").await;
    assert!(none.messages().is_empty(), "{none:?}");
    app.db.connect().await.batch_execute("UPDATE queen.log_consumers SET committed = 0").await.expect("rewound");

    let reads = app.db.connect().await;
    reads.batch_execute("BEGIN; LOCK TABLE queen.log_segments IN ACCESS EXCLUSIVE MODE").await.expect("the lock");
    let route = format!("queue/{queue}");
    let popped = app.pop(&route, query);
    let locking = async {
        app.until_waiting_for_a_lock("queen.log_segments", "the pop never read its segments").await;
        // The claim committed: its cursor is taken now, then the pop may read.
        let cursor = app.hold_cursor("g").await;
        reads.batch_execute("COMMIT").await.expect("the segments released");
        cursor
    };
    let (popped, cursor) = futures::join!(popped, locking);
    cursor.batch_execute("ROLLBACK").await.expect("the cursor released");
    (app, popped)
}

#[actix_web::test]
async fn an_auto_acked_pop_whose_cursor_cannot_move_back_hands_out_the_rest() {
    let (app, popped) = pop_whose_take_back_is_refused("undone", "batch=4&consumerGroup=g&autoAck=true").await;
    assert_eq!(
        popped.transaction_ids(),
        vec!["m1", "m2", "m3", "m4"],
        "committed for the group, so handed out past the bound rather than lost"
    );
    let next = app.pop("queue/undone", "batch=4&consumerGroup=g&autoAck=true").await;
    assert!(next.messages().is_empty(), "delivered once: {next:?}");
}

#[actix_web::test]
async fn a_leased_pop_whose_cut_is_refused_for_now_cuts_its_lease_later() {
    let (app, popped) = pop_whose_take_back_is_refused("cut", "batch=4&consumerGroup=g").await;
    assert_eq!(popped.transaction_ids(), vec!["m1", "m2"], "the 1024-byte bound reached in the second");
    // Tried again once the cursor is free, the lease ends at what was handed out, so acking
    // that releases it: the group gets the rest now, not when the 300 s lease runs out.
    let acked = app.ack_all(&popped.messages(), "completed", Some("g")).await;
    assert!(acked.iter().all(|a| a["success"] == true), "{acked:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let rest = loop {
        let rest = app.pop("queue/cut", "batch=4&consumerGroup=g").await.transaction_ids();
        if !rest.is_empty() {
            break rest;
        }
        assert!(std::time::Instant::now() < deadline, "the rest stayed leased");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(rest, vec!["m3", "m4"]);
}

#[actix_web::test]
async fn consumed_retention_during_an_auto_acked_pop_keeps_what_the_pop_gives_back() {
    let app = TestApp::spawn_with(|config| {
        config.pop.max_answer_bytes = 1024;
        config.maintenance.interval_ms = 3_600_000;
    })
    .await;
    app.configure("trimmed", json!({"retentionEnabled": true, "completedRetentionSeconds": 1})).await;
    for i in 1..=4 {
        app.push_one("trimmed", "p", &format!("m{i}"), json!({"pad": "x".repeat(600)})).await;
    }
    let aged = "SELECT count(*) FROM queen.log_segments WHERE created_at < now() - interval '1 second'";
    crate::kv::until(std::time::Duration::from_secs(10), "the segments age past the window", || async {
        app.count(aged).await == 4
    })
    .await;

    // The group's cursor, made by a first pop that reads no segment, then set to the start.
    let none = app.pop("queue/trimmed", "batch=1&consumerGroup=g&autoAck=true&subscriptionMode=new").await;
    assert!(none.messages().is_empty(), "{none:?}");
    app.db.connect().await.batch_execute("UPDATE queen.log_consumers SET committed = 0").await.expect("rewound");

    let mut trimmer = app.store_connection("trimmer").await;
    trimmer.batch_execute("BEGIN; LOCK TABLE queen.log_segments IN ACCESS EXCLUSIVE MODE").await.expect("the lock");
    let popped = app.pop("queue/trimmed", "batch=4&consumerGroup=g&autoAck=true");
    let trimming = async {
        app.until_waiting_for_a_lock("queen.log_segments", "the pop never read its segments").await;
        // A maintenance pass, on the session holding the lock; its commit lets the pop read.
        let trims = queen_store::retention::trims(&trimmer, "__QUEUE_MODE__").await.expect("the plan");
        for trim in trims {
            queen_store::retention::apply_trim(&mut trimmer, trim, 1000, None, "__QUEUE_MODE__").await.expect("a trim");
        }
        trimmer.batch_execute("COMMIT").await.expect("the lock released");
    };
    let (popped, ()) = futures::join!(popped, trimming);
    assert_eq!(popped.transaction_ids(), vec!["m1", "m2"], "the 1024-byte bound reached in the second");
    let mut rest = Vec::new();
    loop {
        let next = app.pop("queue/trimmed", "batch=4&consumerGroup=g&autoAck=true").await;
        if next.messages().is_empty() {
            break;
        }
        rest.extend(next.transaction_ids());
    }
    assert_eq!(rest, vec!["m3", "m4"], "what the pop gave back was not trimmed");
}
