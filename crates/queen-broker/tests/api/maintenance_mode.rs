//! Maintenance mode: while push maintenance is on, pushes are accepted into the broker's journal
//! and nothing reaches the log; when it ends, everything buffered is delivered, in order per
//! partition, exactly once. While pop maintenance is on, pops answer paused. The switches hold
//! for the whole fleet and survive restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp};

const PUSH_SWITCH: &str = "/api/v1/system/maintenance";
const POP_SWITCH: &str = "/api/v1/system/maintenance/pop";

/// How long a condition the broker reaches on its own (a drain, a notice) may take.
const DEADLINE: Duration = Duration::from_secs(20);

async fn switch(app: &TestApp, route: &str, enabled: bool) -> Value {
    let answer = app.post(route, &json!({ "enabled": enabled })).await;
    assert_eq!(answer.status, StatusCode::OK, "{route} answered {answer:?}");
    answer.body
}

/// Polls `probe` until it holds, failing the test after [`DEADLINE`].
async fn eventually<F, Fut>(what: &str, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + DEADLINE;
    while !probe().await {
        assert!(Instant::now() < deadline, "gave up waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn buffered_messages(base: &str) -> Value {
    journal_status(base).await["bufferedMessages"].clone()
}

/// The push maintenance switch's status: the journal's count and health.
async fn journal_status(base: &str) -> Value {
    queen_testkit::http()
        .build()
        .expect("a client")
        .get(format!("{base}{PUSH_SWITCH}"))
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("a JSON status")
}

/// Pops the queue's partition until it is empty, acknowledging each batch; every transaction id,
/// in delivery order.
async fn drain_partition(app: &TestApp, queue: &str, partition: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let answer = app.pop(&format!("queue/{queue}/partition/{partition}"), "batch=50").await;
        if answer.status == StatusCode::NO_CONTENT {
            return seen;
        }
        app.ack_all(&answer.messages(), "completed", None).await;
        seen.extend(answer.transaction_ids());
    }
}

fn item(queue: &str, partition: &str, transaction_id: &str, n: i64) -> Value {
    json!({"queue": queue, "partition": partition, "transactionId": transaction_id, "payload": {"n": n}})
}

#[actix_web::test]
async fn the_switches_answer_their_state_and_refuse_bad_bodies_without_writing() {
    let app = TestApp::spawn().await;
    let status = app.get(PUSH_SWITCH).await;
    assert_eq!(status.status, StatusCode::OK);
    assert_eq!(status.body["maintenanceMode"], false);
    assert_eq!(status.body["popMaintenanceMode"], false);
    assert_eq!(status.body["bufferedMessages"], 0);
    assert_eq!(status.body["bufferHealthy"], true);
    assert!(status.body["bufferDirectory"].as_str().is_some_and(|dir| dir.contains("test-buffers")), "{status:?}");

    let on = switch(&app, PUSH_SWITCH, true).await;
    assert_eq!((&on["maintenanceMode"], &on["popMaintenanceMode"]), (&json!(true), &json!(false)));
    let both = switch(&app, POP_SWITCH, true).await;
    assert_eq!((&both["maintenanceMode"], &both["popMaintenanceMode"]), (&json!(true), &json!(true)));
    assert_eq!(app.get(POP_SWITCH).await.body, both, "either route reports both switches");
    let revision = "SELECT max((value->>'revision')::bigint) FROM queen.system_state";
    let before = app.count(revision).await;

    for route in [PUSH_SWITCH, POP_SWITCH] {
        for (body, names) in [
            ("", "empty"),
            ("{", "not valid JSON"),
            ("[true]", "must be a JSON object"),
            ("{}", "enabled is required"),
            (r#"{"enabled": null}"#, "enabled is required"),
            (r#"{"enabled": "false"}"#, "enabled must be true or false"),
            (r#"{"enabled": 0}"#, "enabled must be true or false"),
        ] {
            let answer: Answer = app.post_raw(route, body).await;
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{route} with {body:?}");
            let error = answer.body["error"].as_str().unwrap_or_default();
            assert!(error.contains(names), "{route} with {body:?}: {error}");
        }
        let answer = app.delete(route).await;
        assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    }
    assert_eq!(app.count(revision).await, before, "nothing was written");
    assert_eq!(app.get(PUSH_SWITCH).await.body, both, "nothing changed");
}

#[actix_web::test]
async fn pushes_are_buffered_while_push_maintenance_is_on_and_delivered_in_order_once_it_ends() {
    let app = TestApp::spawn().await;
    app.push_one("orders", "eu", "before", json!(0)).await;
    switch(&app, PUSH_SWITCH, true).await;

    // Requests of one and of several items, interleaving two partitions.
    let mut answered = BTreeMap::new();
    for n in 1..=12 {
        let items: Vec<Value> = (0..n % 3 + 1)
            .map(|k| {
                let partition = if (n + k) % 2 == 0 { "eu" } else { "us" };
                item("orders", partition, &format!("t{n}-{k}"), n * 10 + k)
            })
            .collect();
        for (index, result) in app.push(json!(items)).await.into_iter().enumerate() {
            assert_eq!(result["index"], index);
            assert_eq!(result["status"], "buffered", "{result}");
            assert_eq!(result["transaction_id"], items[index]["transactionId"]);
            assert_eq!(result["queue"], "orders");
            assert_eq!(result["partition"], items[index]["partition"]);
            let partition = result["partition"].as_str().unwrap_or_default().to_owned();
            let transaction_id = result["transaction_id"].as_str().unwrap_or_default().to_owned();
            answered.insert(transaction_id, (partition, result["message_id"].clone()));
        }
    }
    let buffered = answered.len() as i64;
    assert_eq!(app.count("SELECT count(*) FROM queen.log_segments").await, 1, "only the push made before");
    assert_eq!(app.get(PUSH_SWITCH).await.body["bufferedMessages"], buffered);
    assert_eq!(app.pop("queue/orders", "batch=100&consumerGroup=early").await.messages().len(), 1);

    let bundle = json!({"operations": [{"type": "push", "items": [item("orders", "eu", "in-a-bundle", 1)]}]});
    let refused = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE, "{refused:?}");
    assert!(refused.body["error"].as_str().is_some_and(|e| e.contains("push maintenance")), "{refused:?}");

    switch(&app, PUSH_SWITCH, false).await;
    eventually("the journal is drained", || async { buffered_messages(&app.base).await == 0 }).await;
    let after = app.push_one("orders", "eu", "after", json!(99)).await;
    assert_eq!(after["status"], "queued", "pushes go to the log again");

    for partition in ["eu", "us"] {
        let delivered = drain_partition(&app, "orders", partition).await;
        let mut expected: Vec<String> =
            answered.iter().filter(|(_, (p, _))| p == partition).map(|(t, _)| t.clone()).collect();
        // Pushed in request order: t1-0, t1-1, t2-0, ..., t12-0 (the map sorts t10 before t2).
        expected.sort_by_key(|t| {
            let (n, k) = t[1..].split_once('-').expect("tN-K");
            (n.parse::<u32>().expect("N"), k.parse::<u32>().expect("K"))
        });
        if partition == "eu" {
            expected.insert(0, "before".into());
            expected.push("after".into());
        }
        assert_eq!(delivered, expected, "partition {partition}: every message once, in push order");
    }
    let partition_id = after["partition_id"].as_str().expect("partition_id");
    for (transaction_id, (partition, message_id)) in &answered {
        if partition == "eu" {
            let message = app.get(&format!("/api/v1/messages/{partition_id}/{transaction_id}")).await;
            assert_eq!(&message.body["id"], message_id, "the message id answered while buffering is the stored one");
        }
    }
}

#[actix_web::test]
async fn buffered_duplicates_behave_like_any_duplicate_once_replayed() {
    let app = TestApp::spawn().await;
    let original = app.push_one("dedup", "p", "a", json!("first a")).await;
    switch(&app, PUSH_SWITCH, true).await;
    app.push_one("dedup", "p", "a", json!("second a")).await;
    let first_b = app.push_one("dedup", "p", "b", json!("first b")).await;
    let second_b = app.push_one("dedup", "p", "b", json!("second b")).await;
    assert_eq!((&first_b["status"], &second_b["status"]), (&json!("buffered"), &json!("buffered")));
    switch(&app, PUSH_SWITCH, false).await;
    eventually("the journal is drained", || async { buffered_messages(&app.base).await == 0 }).await;

    let popped = app.pop("queue/dedup", "batch=10").await;
    assert_eq!(popped.transaction_ids(), ["a", "b"]);
    let messages = popped.messages();
    let data: Vec<&Value> = messages.iter().map(|m| &m["data"]).collect();
    assert_eq!(data, [&json!("first a"), &json!("first b")], "the first of each transaction id wins");
    assert_eq!(messages[0]["id"], original["message_id"]);
    assert_eq!(messages[1]["id"], first_b["message_id"]);
    let again = app.push_one("dedup", "p", "b", json!("third b")).await;
    assert_eq!(again["status"], "duplicate");
    assert_eq!(again["message_id"], first_b["message_id"], "a duplicate answers with the replayed message's id");
}

#[actix_web::test]
async fn pop_maintenance_answers_paused_at_once_and_releases_a_long_poll_when_it_ends() {
    let app = TestApp::spawn().await;
    app.push_one("paused", "p", "m1", json!(1)).await;
    switch(&app, POP_SWITCH, true).await;

    for query in ["batch=1", "batch=1&wait=false", "batch=1&wait=true&timeout=200"] {
        let started = Instant::now();
        let answer = app.pop("queue/paused", query).await;
        assert_eq!(answer.status, StatusCode::OK, "{query}");
        assert_eq!(answer.body, json!({"success": true, "messages": [], "paused": true}), "{query}");
        if query.contains("wait=true") {
            assert!(started.elapsed() >= Duration::from_millis(200), "a long poll waits out its timeout");
        }
    }
    let partition = app.pop("queue/paused/partition/p", "batch=1").await;
    assert_eq!(partition.body["paused"], true, "the partition route too");

    let long_poll = {
        let (http, url) = (app.http.clone(), app.url("/api/v1/pop/queue/paused?batch=1&wait=true&timeout=30000"));
        actix_web::rt::spawn(async move {
            let started = Instant::now();
            let answer = http.get(url).send().await.expect("the long poll");
            (answer.status(), answer.json::<Value>().await.unwrap_or(Value::Null), started.elapsed())
        })
    };
    eventually("the long poll is held", || async { app.metric("queen_paused_long_polls").await >= 1.0 }).await;
    switch(&app, POP_SWITCH, false).await;
    let (status, body, waited) = long_poll.await.expect("the long poll answers");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["messages"][0]["transactionId"], "m1", "{body}");
    assert!(waited < Duration::from_secs(10), "answered when pop maintenance ended, not at its timeout");
    assert_eq!(app.metric("queen_paused_long_polls").await, 0.0);
}

#[actix_web::test]
async fn a_switch_set_on_one_broker_holds_on_every_broker_and_survives_restarts() {
    let app = TestApp::spawn().await;
    let other = TestApp::spawn_on(&app.db, |_| {}).await;
    let http = queen_testkit::http().build().expect("an HTTP client");
    let status_of = |base: String| {
        let http = http.clone();
        async move {
            http.get(format!("{base}{PUSH_SWITCH}")).send().await.expect("GET").json::<Value>().await.expect("JSON")
        }
    };

    switch(&app, PUSH_SWITCH, true).await;
    switch(&app, POP_SWITCH, true).await;
    eventually("the other broker applies both switches", || async {
        let status = status_of(other.clone()).await;
        status["maintenanceMode"] == true && status["popMaintenanceMode"] == true
    })
    .await;
    let push = json!({"items": [item("fleet", "p", "via-other", 1)]});
    let pushed: Value =
        http.post(format!("{other}/api/v1/push")).json(&push).send().await.expect("push").json().await.expect("JSON");
    assert_eq!(pushed[0]["status"], "buffered", "the other broker buffers: {pushed}");
    let popped: Value =
        http.get(format!("{other}/api/v1/pop/queue/fleet")).send().await.expect("pop").json().await.expect("JSON");
    assert_eq!(popped["paused"], true, "the other broker's pops pause");

    let later = TestApp::spawn_on(&app.db, |_| {}).await;
    let status = status_of(later).await;
    assert_eq!((&status["maintenanceMode"], &status["popMaintenanceMode"]), (&json!(true), &json!(true)), "persisted");

    switch(&app, PUSH_SWITCH, false).await;
    switch(&app, POP_SWITCH, false).await;
    eventually("the other broker drains its journal", || async {
        let status = status_of(other.clone()).await;
        status["maintenanceMode"] == false && status["bufferedMessages"] == 0
    })
    .await;
    assert_eq!(app.pop("queue/fleet", "batch=10").await.transaction_ids(), ["via-other"]);
}

/// A database that went back (restored from a backup, or failed over to a standby that missed
/// the latest change) holds older switches than the broker applied. Once the broker listens
/// again it reads them and applies them, though their revision is below the one it held, rather
/// than keep a switch the fleet's database no longer has until it restarts.
#[actix_web::test]
async fn switches_the_database_went_back_to_apply_once_the_broker_listens_again() {
    let app = TestApp::spawn().await;
    switch(&app, POP_SWITCH, true).await;
    assert_eq!(app.get(POP_SWITCH).await.body["popMaintenanceMode"], true);
    // The rows as they were before the switch, as a restore would leave them: no notice.
    app.db
        .connect()
        .await
        .batch_execute("DELETE FROM queen.system_state WHERE key IN ('pop_maintenance', 'push_maintenance')")
        .await
        .expect("the switches gone back");
    let killed = app
        .count(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = 'queen-listen') killed",
        )
        .await;
    assert_eq!(killed, 1, "the broker's LISTEN connection was cut");
    eventually("the broker applies the switches the database went back to", || async {
        app.get(POP_SWITCH).await.body["popMaintenanceMode"] == false
    })
    .await;
    assert_eq!(app.pop("queue/back", "batch=1").await.status, StatusCode::NO_CONTENT, "pops are not paused");
}

/// The issue's test: a producer at a steady rate and a consumer; push maintenance on for a couple
/// of seconds and off again; every produced message is received exactly once.
#[actix_web::test]
async fn a_steady_producer_and_a_consumer_lose_and_repeat_nothing_across_maintenance() {
    const QUEUE: &str = "steady";
    let app = TestApp::spawn().await;
    let producing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));

    let producer = {
        let (http, url, producing) = (app.http.clone(), app.url("/api/v1/push"), producing.clone());
        actix_web::rt::spawn(async move {
            let mut statuses: BTreeMap<String, String> = BTreeMap::new();
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            let mut n = 0;
            while producing.load(std::sync::atomic::Ordering::SeqCst) {
                tick.tick().await;
                n += 1;
                let transaction_id = format!("m{n}");
                let body = json!({"items": [item(QUEUE, &format!("p{}", n % 3), &transaction_id, n)]});
                let answer = http.post(&url).json(&body).send().await.expect("push");
                assert_eq!(answer.status(), StatusCode::CREATED);
                let results: Value = answer.json().await.expect("JSON");
                statuses.insert(transaction_id, results[0]["status"].as_str().unwrap_or_default().to_owned());
            }
            statuses
        })
    };
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, i64)>::new()));
    let consumer = {
        let (http, base, received, producing) =
            (app.http.clone(), app.base.clone(), received.clone(), producing.clone());
        actix_web::rt::spawn(async move {
            let pop = format!("{base}/api/v1/pop/queue/{QUEUE}?batch=20&wait=true&timeout=300");
            let mut idle_after_stop = 0;
            while idle_after_stop < 3 {
                let answer = http.get(&pop).send().await.expect("pop");
                if answer.status() == StatusCode::NO_CONTENT {
                    idle_after_stop += usize::from(!producing.load(std::sync::atomic::Ordering::SeqCst));
                    continue;
                }
                let body: Value = answer.json().await.expect("JSON");
                let messages = body["messages"].as_array().cloned().unwrap_or_default();
                let acks: Vec<Value> = messages
                    .iter()
                    .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "completed"}))
                    .collect();
                let acked = http
                    .post(format!("{base}/api/v1/ack/batch"))
                    .json(&json!({"acknowledgments": acks}))
                    .send()
                    .await
                    .expect("ack");
                assert_eq!(acked.status(), StatusCode::OK);
                let mut received = received.lock().expect("the list");
                received.extend(messages.iter().map(|m| {
                    (m["transactionId"].as_str().unwrap_or_default().to_owned(), m["data"]["n"].as_i64().unwrap_or(0))
                }));
            }
        })
    };

    eventually("the consumer receives", || async { !received.lock().expect("the list").is_empty() }).await;
    switch(&app, PUSH_SWITCH, true).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    switch(&app, PUSH_SWITCH, false).await;
    eventually("the journal is drained", || async { buffered_messages(&app.base).await == 0 }).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    producing.store(false, std::sync::atomic::Ordering::SeqCst);
    let statuses = producer.await.expect("the producer");
    consumer.await.expect("the consumer");

    let received = received.lock().expect("the list").clone();
    let buffered = statuses.values().filter(|s| *s == "buffered").count();
    assert!(buffered >= 20, "about two seconds of pushes were buffered, not {buffered}");
    assert!(statuses.values().all(|s| s == "buffered" || s == "queued"), "{statuses:?}");
    let produced: BTreeSet<&String> = statuses.keys().collect();
    let mut counts: BTreeMap<&String, usize> = BTreeMap::new();
    for (transaction_id, _) in &received {
        *counts.entry(transaction_id).or_default() += 1;
    }
    let missing: Vec<_> = produced.iter().filter(|t| !counts.contains_key(**t)).collect();
    let repeated: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(missing.is_empty() && repeated.is_empty(), "missing {missing:?}, repeated {repeated:?}");
    assert_eq!(counts.len(), produced.len(), "nothing that was not produced");
    for partition in 0..3 {
        let order: Vec<i64> = received.iter().map(|(_, n)| *n).filter(|n| n % 3 == partition).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "partition p{partition} in push order: {order:?}");
    }
}

/// A drain stopped midway (push maintenance on again, a restart) goes on after the records it had
/// put in the log, which it recorded beside the file: replayed again, they would be stored twice
/// once retention had taken their first copies, and their ids, away.
#[actix_web::test]
async fn a_drain_goes_on_after_the_records_an_earlier_drain_put_in_the_log() {
    use queen_log::{Frame, JOURNAL_MAGIC, JournalEntry, encode_record};

    let dir = queen_testkit::target_dir().join("test-buffers").join(uuid::Uuid::new_v4().simple().to_string());
    std::fs::create_dir_all(&dir).expect("the journal directory");
    let mut journal = JOURNAL_MAGIC.to_vec();
    for transaction_id in ["first", "second", "third"] {
        let frame =
            Frame { message_id: uuid::Uuid::now_v7(), trace_id: None, transaction_id, producer: None, payload: b"1" };
        encode_record(&[JournalEntry { queue: "resumed", partition: "p", frame }], &mut journal).expect("a record");
    }
    let file = dir.join("00000000000000000001.journal");
    std::fs::write(&file, journal).expect("the journal file");
    // What a drain stopped after its first batch (of one record) leaves.
    std::fs::write(dir.join("00000000000000000001.journal.replayed"), "1").expect("the drain's progress");

    let app = TestApp::spawn_with(|config| config.buffer.dir = dir.clone()).await;
    eventually("the journal file is drained", || {
        let file = file.clone();
        async move { !file.exists() }
    })
    .await;
    assert_eq!(drain_partition(&app, "resumed", "p").await, ["second", "third"]);
    assert!(!dir.join("00000000000000000001.journal.replayed").exists(), "the progress goes with its file");
    assert_eq!(buffered_messages(&app.base).await, 0);
}

/// A journal file this broker can never replay as it is (its payloads sealed with a key it does not
/// hold: it ran with one when it buffered them) is set aside as `.held`, not retried for ever with
/// every later push waiting behind it: the file after it is replayed, new pushes reach the log,
/// and the set-aside file keeps its acknowledged pushes on disk for the operator.
#[actix_web::test]
async fn a_journal_file_that_cannot_be_replayed_is_set_aside_and_the_rest_goes_on() {
    use queen_log::{Cipher, Frame, JOURNAL_MAGIC, JournalEntry, encode_record};

    let dir = queen_testkit::target_dir().join("test-buffers").join(uuid::Uuid::new_v4().simple().to_string());
    std::fs::create_dir_all(&dir).expect("the journal directory");
    let cipher = Cipher::from_hex(&"ab".repeat(32)).expect("a key");
    let file = |sequence: u64, transaction_id: &str, payload: &[u8]| {
        let mut journal = JOURNAL_MAGIC.to_vec();
        let frame = Frame { message_id: uuid::Uuid::now_v7(), trace_id: None, transaction_id, producer: None, payload };
        encode_record(&[JournalEntry { queue: "held", partition: "p", frame }], &mut journal).expect("a record");
        let path = dir.join(format!("{sequence:020}.journal"));
        std::fs::write(&path, &journal).expect("a journal file");
        (path, journal)
    };
    let (sealed, sealed_bytes) = file(1, "sealed", &cipher.seal(b"1").expect("sealed"));
    let (plain, _) = file(2, "plain", b"2");

    let app = TestApp::spawn_with(|config| config.buffer.dir = dir.clone()).await;
    eventually("the journal is drained", || async { buffered_messages(&app.base).await == 0 }).await;
    assert_eq!(app.push(json!([item("held", "p", "after", 3)])).await[0]["status"], "queued");
    assert_eq!(drain_partition(&app, "held", "p").await, ["plain", "after"]);
    assert!(!sealed.exists() && !plain.exists());
    let held = dir.join("00000000000000000001.journal.held");
    assert_eq!(std::fs::read(&held).expect("the file set aside"), sealed_bytes, "kept as it was");
    // Drained to 0, and still not healthy: acknowledged pushes wait on the operator.
    assert_eq!(journal_status(&app.base).await["bufferHealthy"], false);
    assert_eq!(app.metric("queen_push_journal_files_set_aside").await, 1.0);
}

/// A broker started over a journal directory holding a file set aside by an earlier run says so.
#[actix_web::test]
async fn a_file_set_aside_by_an_earlier_run_keeps_the_journal_unhealthy() {
    let dir = queen_testkit::target_dir().join("test-buffers").join(uuid::Uuid::new_v4().simple().to_string());
    std::fs::create_dir_all(&dir).expect("the journal directory");
    std::fs::write(dir.join("00000000000000000001.journal.held"), b"set aside").expect("a file set aside");
    let app = TestApp::spawn_with(|config| config.buffer.dir = dir.clone()).await;
    let status = journal_status(&app.base).await;
    assert_eq!((status["bufferedMessages"].as_u64(), status["bufferHealthy"].as_bool()), (Some(0), Some(false)));
    assert_eq!(app.metric("queen_push_journal_files_set_aside").await, 1.0);
    assert_eq!(app.push(json!([item("fresh", "p", "t", 1)])).await[0]["status"], "queued", "pushes go on");
}

/// A journal directory holding a drain's progress left by an earlier file of the name the next
/// file gets (a crash between deleting a drained file and its progress, then a journal started
/// afresh): the new file's records are not taken as replayed, and all reach the log.
#[actix_web::test]
async fn a_progress_left_by_an_earlier_file_of_the_same_name_skips_nothing() {
    let dir = queen_testkit::target_dir().join("test-buffers").join(uuid::Uuid::new_v4().simple().to_string());
    std::fs::create_dir_all(&dir).expect("the journal directory");
    std::fs::write(dir.join("00000000000000000001.journal.replayed"), "5").expect("a stale progress");
    let app = TestApp::spawn_with(|config| config.buffer.dir = dir.clone()).await;
    switch(&app, PUSH_SWITCH, true).await;
    let items: Vec<Value> = (1..=3).map(|n| item("fresh", "p", &format!("t{n}"), n)).collect();
    let pushed = app.push(json!(items)).await;
    assert!(pushed.iter().all(|result| result["status"] == "buffered"), "{pushed:?}");
    switch(&app, PUSH_SWITCH, false).await;
    eventually("the journal is drained", || async { buffered_messages(&app.base).await == 0 }).await;
    assert_eq!(drain_partition(&app, "fresh", "p").await, ["t1", "t2", "t3"]);
}

/// A file of another format in the directory (another version's journal) is neither replayed
/// nor deleted as empty: it is left for whoever can read it, and the journal goes on beside it.
#[actix_web::test]
async fn a_journal_file_of_another_format_is_left_in_place() {
    let dir = queen_testkit::target_dir().join("test-buffers").join(uuid::Uuid::new_v4().simple().to_string());
    std::fs::create_dir_all(&dir).expect("the journal directory");
    let foreign = dir.join("00000000000000000001.journal");
    let bytes = b"QJRNL-9 records of a format this broker does not know".to_vec();
    std::fs::write(&foreign, &bytes).expect("a foreign journal file");
    let app = TestApp::spawn_with(|config| config.buffer.dir = dir.clone()).await;
    assert_eq!(buffered_messages(&app.base).await, 0, "nothing of it counted");
    switch(&app, PUSH_SWITCH, true).await;
    assert_eq!(app.push(json!([item("beside", "p", "t1", 1)])).await[0]["status"], "buffered");
    switch(&app, PUSH_SWITCH, false).await;
    eventually("the journal is drained", || async { buffered_messages(&app.base).await == 0 }).await;
    assert_eq!(drain_partition(&app, "beside", "p").await, ["t1"]);
    assert_eq!(std::fs::read(&foreign).expect("still there"), bytes);
}

/// A drain's batch of one partition becomes one segment, so it is bounded by bytes as fused
/// pushes are (`push.max_segment_bytes`): a journal of large payloads writes segments readers
/// can decode, not one of everything buffered, and no batch goes past the bound.
#[actix_web::test]
async fn a_drain_writes_segments_no_larger_than_a_push_would() {
    let app = TestApp::spawn_with(|config| config.push.max_segment_bytes = 1024).await;
    switch(&app, PUSH_SWITCH, true).await;
    let large = "x".repeat(400);
    for n in 1..=3 {
        let pushed = app
            .push(json!([{"queue": "large", "partition": "p", "transactionId": format!("t{n}"), "payload": large}]))
            .await;
        assert_eq!(pushed[0]["status"], "buffered");
    }
    switch(&app, PUSH_SWITCH, false).await;
    eventually("the journal is drained", || async { buffered_messages(&app.base).await == 0 }).await;
    // 400 bytes and 400 more stay within 1024, and 400 more would pass it: the first two, then
    // the third.
    assert_eq!(app.count("SELECT count(*) FROM queen.log_segments").await, 2);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_segments WHERE frame_count = 2").await, 1);
    assert_eq!(drain_partition(&app, "large", "p").await, ["t1", "t2", "t3"]);
}

/// A push larger than the whole journal would be refused as the journal being full however empty
/// it is, and retried for nothing: it is a 400 naming `buffer.max_bytes`, nothing is journaled,
/// and smaller pushes are still taken.
#[actix_web::test]
async fn a_push_larger_than_the_whole_journal_is_refused_as_such() {
    let app = TestApp::spawn_with(|config| {
        config.buffer.file_max_bytes = 4096;
        config.buffer.max_bytes = 4096;
    })
    .await;
    switch(&app, PUSH_SWITCH, true).await;
    let large = json!({"items": [item("huge", "p", "large", 0), {
        "queue": "huge", "partition": "p", "transactionId": "too-large", "payload": "x".repeat(5000)}]});
    let refused = app.post("/api/v1/push", &large).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    let error = refused.body["error"].as_str().unwrap_or_default();
    assert!(error.contains("buffer.max_bytes = 4096"), "{error}");
    assert_eq!(app.get(PUSH_SWITCH).await.body["bufferedMessages"], 0, "nothing of it was journaled");
    let small = app.push(json!([item("huge", "p", "small", 1)])).await;
    assert_eq!(small[0]["status"], "buffered", "{small:?}");
    switch(&app, PUSH_SWITCH, false).await;
    eventually("the journal is drained", || async { buffered_messages(&app.base).await == 0 }).await;
    assert_eq!(drain_partition(&app, "huge", "p").await, ["small"]);
}
