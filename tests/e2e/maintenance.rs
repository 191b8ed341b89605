//! Push maintenance across a crash: a broker killed with SIGKILL while buffering loses no push it
//! answered; a new broker on the same journal directory replays every one of them exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use queen_testkit::{BrokerProcess, TestDatabase, target_dir};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::queen_binary;

const QUEUE: &str = "crash";
const PRODUCERS: usize = 4;
/// Pushes answered before the kill.
const ANSWERED: usize = 200;

async fn set_push_maintenance(http: &reqwest::Client, base: &str, enabled: bool) {
    let answer = http
        .post(format!("{base}/api/v1/system/maintenance"))
        .json(&json!({ "enabled": enabled }))
        .send()
        .await
        .expect("the maintenance switch");
    assert_eq!(answer.status(), StatusCode::OK);
}

async fn buffered_messages(http: &reqwest::Client, base: &str) -> i64 {
    let status: Value =
        http.get(format!("{base}/api/v1/system/maintenance")).send().await.expect("GET").json().await.expect("JSON");
    status["bufferedMessages"].as_i64().expect("bufferedMessages")
}

#[tokio::test]
async fn a_broker_killed_while_buffering_loses_no_answered_push() {
    let db = TestDatabase::create("e2e_maintenance").await;
    let buffer = target_dir().join(format!("e2e-buffer-{}", uuid::Uuid::new_v4().simple()));
    let buffer_arg = buffer.to_string_lossy().into_owned();
    let args = ["--database-url", db.url(), "--buffer-dir", &buffer_arg];
    let mut first = BrokerProcess::start(queen_binary(), &args, &[]).await;
    let http = queen_testkit::http().timeout(Duration::from_secs(30)).build().expect("a client");
    set_push_maintenance(&http, &first.url(), true).await;

    // Producers push until the kill cuts them off; only what was answered counts.
    let answered: Arc<Mutex<Vec<String>>> = Arc::default();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|producer| {
            let (http, base, answered) = (http.clone(), first.url(), Arc::clone(&answered));
            tokio::spawn(async move {
                for n in 0.. {
                    let transaction_id = format!("w{producer}-{n}");
                    let item = json!({"queue": QUEUE, "partition": format!("p{producer}"),
                                      "transactionId": transaction_id, "payload": {"n": n}});
                    let Ok(answer) =
                        http.post(format!("{base}/api/v1/push")).json(&json!({"items": [item]})).send().await
                    else {
                        return;
                    };
                    let Ok(results) = answer.json::<Value>().await else { return };
                    assert_eq!(results[0]["status"], "buffered", "{results}");
                    answered.lock().expect("the ledger").push(transaction_id);
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered.lock().expect("the ledger").len() < ANSWERED {
        assert!(Instant::now() < deadline, "the producers did not get {ANSWERED} answers");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.signal(Signal::SIGKILL);
    assert!(first.wait(Duration::from_secs(10)).await.is_some(), "the broker died");
    for producer in producers {
        producer.await.expect("a producer");
    }
    let answered: BTreeSet<String> = answered.lock().expect("the ledger").iter().cloned().collect();
    let client = db.connect().await;
    let segments: i64 = client.query_one("SELECT count(*) FROM queen.log_segments", &[]).await.expect("count").get(0);
    assert_eq!(segments, 0, "nothing reached the log while buffering");

    // A new broker on the same journal: still in push maintenance, it keeps what it found.
    let second = BrokerProcess::start(queen_binary(), &args, &[]).await;
    let base = second.url();
    let found = buffered_messages(&http, &base).await;
    assert!(found >= answered.len() as i64, "found {found} buffered messages, {} were answered", answered.len());
    set_push_maintenance(&http, &base, false).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while buffered_messages(&http, &base).await > 0 {
        assert!(Instant::now() < deadline, "the journal was not drained; log:\n{}", second.log().join("\n"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut delivered: BTreeMap<String, usize> = BTreeMap::new();
    let mut order: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    loop {
        let answer =
            http.get(format!("{base}/api/v1/pop/queue/{QUEUE}?batch=100&autoAck=true")).send().await.expect("pop");
        if answer.status() == StatusCode::NO_CONTENT {
            break;
        }
        let body: Value = answer.json().await.expect("JSON");
        for message in body["messages"].as_array().expect("messages") {
            let transaction_id = message["transactionId"].as_str().expect("transactionId").to_owned();
            *delivered.entry(transaction_id).or_default() += 1;
            let partition = message["partition"].as_str().expect("partition").to_owned();
            order.entry(partition).or_default().push(message["data"]["n"].as_i64().expect("n"));
        }
    }
    let missing: Vec<&String> = answered.iter().filter(|t| !delivered.contains_key(*t)).collect();
    let repeated: Vec<(&String, &usize)> = delivered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(missing.is_empty(), "answered pushes lost: {missing:?}");
    assert!(repeated.is_empty(), "delivered twice: {repeated:?}");
    // A push cut by the kill may have been written without its answer; nothing else may appear.
    assert!(delivered.len() <= answered.len() + PRODUCERS, "{} delivered", delivered.len());
    for (partition, numbers) in order {
        assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{partition} in push order: {numbers:?}");
    }
    drop(second);
    std::fs::remove_dir_all(&buffer).expect("the journal directory can be removed");
}

/// A broker told to stop while it replays its journal (push maintenance just ended) finishes the
/// replay before it exits, within its shutdown bound: a pod's journal is lost with it, and the
/// pushes it answered `buffered` would be lost with the journal.
#[tokio::test]
async fn a_broker_stopped_while_it_replays_its_journal_finishes_the_replay() {
    const BUFFERED: usize = 300;
    let db = TestDatabase::create("e2e_stop_replaying").await;
    let buffer = target_dir().join(format!("e2e-buffer-{}", uuid::Uuid::new_v4().simple()));
    let buffer_arg = buffer.to_string_lossy().into_owned();
    let args = ["--database-url", db.url(), "--buffer-dir", &buffer_arg];
    // One message a replay step: the replay takes a while.
    let mut broker = BrokerProcess::start(queen_binary(), &args, &[("QUEEN_BUFFER__DRAIN_BATCH_MESSAGES", "1")]).await;
    let http = queen_testkit::http().timeout(Duration::from_secs(30)).build().expect("a client");
    let base = broker.url();
    set_push_maintenance(&http, &base, true).await;
    let items: Vec<Value> = (0..BUFFERED)
        .map(|n| json!({"queue": QUEUE, "partition": format!("p{}", n % 4), "transactionId": format!("b{n}"), "payload": n}))
        .collect();
    for chunk in items.chunks(50) {
        let answer = http.post(format!("{base}/api/v1/push")).json(&json!({ "items": chunk })).send().await;
        let results: Value = answer.expect("a push").json().await.expect("JSON");
        assert!(results.as_array().expect("results").iter().all(|r| r["status"] == "buffered"), "{results}");
    }
    set_push_maintenance(&http, &base, false).await;
    broker.signal(Signal::SIGTERM);
    let status = broker.wait(Duration::from_secs(60)).await.expect("the broker exits");
    assert!(status.success(), "exit status {status:?}; log:\n{}", broker.log().join("\n"));

    let client = db.connect().await;
    let stored: i64 = client.query_one("SELECT count(*) FROM queen.log_message_ids", &[]).await.expect("count").get(0);
    assert_eq!(stored, BUFFERED as i64, "the replay stopped with the broker; log:\n{}", broker.log().join("\n"));
    std::fs::remove_dir_all(&buffer).expect("the journal directory can be removed");
}
