//! A fleet of real `queen` processes over one database.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use queen_testkit::{BrokerProcess, TestDatabase, metric_at};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::support::queen_binary;

async fn start_brokers(db: &TestDatabase, n: usize) -> Vec<BrokerProcess> {
    let mut brokers = Vec::new();
    for _ in 0..n {
        brokers.push(BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &[]).await);
    }
    brokers
}

#[tokio::test]
async fn a_pop_waiting_on_one_broker_is_answered_by_a_push_on_another() {
    let db = TestDatabase::create("e2e_cross_poll").await;
    let brokers = start_brokers(&db, 2).await;
    let (a, b) = (brokers[0].url(), brokers[1].url());
    let http = reqwest::Client::new();
    let waiting = http.get(format!("{b}/api/v1/pop/queue/cross?batch=1&wait=true&timeout=20000")).send();
    let push = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while metric_at(&http, &b, "queen_long_poll_waiters").await < 1.0 {
            assert!(Instant::now() < deadline, "the pop never parked on broker B");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pushed = http
            .post(format!("{a}/api/v1/push"))
            .json(&json!({"items": [{"queue": "cross", "transactionId": "hello", "payload": "from A"}]}))
            .send()
            .await
            .expect("push to A");
        assert_eq!(pushed.status(), StatusCode::CREATED);
        Instant::now()
    };
    let (answer, pushed_at) = futures::join!(waiting, push);
    let latency = pushed_at.elapsed();
    let answer: Value = answer.expect("B answers").json().await.expect("a JSON pop answer");
    assert_eq!(answer["messages"][0]["transactionId"], "hello");
    assert!(latency < Duration::from_secs(1), "B answered {latency:?} after A's push: a NOTIFY round trip, not a poll");
}

const MESSAGES: usize = 600;
const GROUPS: [&str; 3] = ["g1", "g2", "g3"];

/// What the fleet run saw.
#[derive(Default)]
struct Ledger {
    /// Per group: deliveries of each transaction id.
    deliveries: HashMap<&'static str, HashMap<String, usize>>,
    /// Per group: transaction ids whose delivery or ack was cut by the kill.
    cut: HashMap<&'static str, BTreeSet<String>>,
}

/// Sends to the brokers in turn from `start`, skipping ones that do not answer; `None` if none did.
async fn round_robin(
    http: &reqwest::Client,
    bases: &[String],
    start: usize,
    request: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
) -> Option<(usize, reqwest::Response)> {
    for step in 0..bases.len() {
        let index = (start + step) % bases.len();
        match request(http, &bases[index]).send().await {
            Ok(response) if !response.status().is_server_error() => return Some((index, response)),
            _ => continue,
        }
    }
    None
}

#[tokio::test]
async fn three_brokers_lose_nothing_when_one_is_killed_mid_run() {
    let db = TestDatabase::create("e2e_fleet").await;
    let mut brokers = start_brokers(&db, 3).await;
    let bases: Vec<String> = brokers.iter().map(BrokerProcess::url).collect();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("a client");
    let configured = http
        .post(format!("{}/api/v1/configure", bases[0]))
        .json(&json!({"queue": "fleet", "options": {"leaseTime": 2}}))
        .send()
        .await
        .expect("configure");
    assert_eq!(configured.status(), StatusCode::OK);

    let pushed = Arc::new(AtomicUsize::new(0));
    let produced = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let killed = Arc::new(AtomicUsize::new(usize::MAX));

    let producer = {
        let (http, bases, pushed, produced) = (http.clone(), bases.clone(), Arc::clone(&pushed), Arc::clone(&produced));
        tokio::spawn(async move {
            for batch in 0..MESSAGES / 10 {
                let items: Vec<Value> = (0..10)
                    .map(|i| {
                        let n = batch * 10 + i;
                        json!({"queue": "fleet", "partition": format!("p{}", n % 8), "transactionId": format!("m{n}"), "payload": n})
                    })
                    .collect();
                let body = json!({"items": items});
                // A push cut by the kill is sent again elsewhere: dedup makes that safe.
                let sent = round_robin(&http, &bases, batch, |http, base| {
                    http.post(format!("{base}/api/v1/push")).json(&body)
                })
                .await;
                let (_, response) = sent.expect("some broker takes the push");
                assert_eq!(response.status(), StatusCode::CREATED);
                pushed.fetch_add(10, Ordering::SeqCst);
            }
            produced.store(true, Ordering::SeqCst);
        })
    };

    let mut consumers = Vec::new();
    for (g, group) in GROUPS.into_iter().enumerate() {
        for c in 0..2 {
            let (http, bases, ledger, produced, killed) =
                (http.clone(), bases.clone(), Arc::clone(&ledger), Arc::clone(&produced), Arc::clone(&killed));
            consumers.push(tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(90);
                let mut turn = g * 2 + c;
                loop {
                    assert!(Instant::now() < deadline, "group {group} did not finish");
                    turn += 1;
                    let query = format!("batch=20&partitions=2&wait=true&timeout=500&consumerGroup={group}");
                    let Some((served_by, response)) = round_robin(&http, &bases, turn, |http, base| {
                        http.get(format!("{base}/api/v1/pop/queue/fleet?{query}"))
                    })
                    .await
                    else {
                        continue;
                    };
                    if response.status() == StatusCode::NO_CONTENT {
                        let seen = ledger.lock().await.deliveries.get(group).map_or(0, HashMap::len);
                        if produced.load(Ordering::SeqCst) && seen == MESSAGES {
                            return;
                        }
                        continue;
                    }
                    let Ok(body) = response.json::<Value>().await else { continue };
                    let messages = body["messages"].as_array().cloned().unwrap_or_default();
                    let acks: Vec<Value> = messages
                        .iter()
                        .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}))
                        .collect();
                    let ack = json!({"acknowledgments": acks, "consumerGroup": group});
                    let acked = round_robin(&http, &bases, turn + 1, |http, base| {
                        http.post(format!("{base}/api/v1/ack/batch")).json(&ack)
                    })
                    .await;
                    let ack_went_through = match acked {
                        Some((_, response)) => response
                            .json::<Value>()
                            .await
                            .ok()
                            .and_then(|v| v.as_array().map(|a| a.iter().all(|r| r["success"] == true)))
                            .unwrap_or(false),
                        None => false,
                    };
                    let mut ledger = ledger.lock().await;
                    for m in &messages {
                        let id = m["transactionId"].as_str().unwrap_or_default().to_owned();
                        *ledger.deliveries.entry(group).or_default().entry(id.clone()).or_default() += 1;
                        if !ack_went_through || served_by == killed.load(Ordering::SeqCst) {
                            ledger.cut.entry(group).or_default().insert(id);
                        }
                    }
                }
            }));
        }
    }

    // Kill the second broker a third of the way through the run.
    while pushed.load(Ordering::SeqCst) < MESSAGES / 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    killed.store(1, Ordering::SeqCst);
    brokers[1].signal(Signal::SIGKILL);
    assert!(brokers[1].wait(Duration::from_secs(10)).await.is_some(), "the broker died");

    producer.await.expect("the producer");
    for consumer in consumers {
        consumer.await.expect("a consumer");
    }
    let ledger = ledger.lock().await;
    let all: BTreeSet<String> = (0..MESSAGES).map(|n| format!("m{n}")).collect();
    for group in GROUPS {
        let deliveries = &ledger.deliveries[group];
        let consumed: BTreeSet<String> = deliveries.keys().cloned().collect();
        assert_eq!(consumed, all, "group {group} lost {:?}", all.difference(&consumed).collect::<Vec<_>>());
        let duplicated: Vec<&String> = deliveries.iter().filter(|(_, n)| **n > 1).map(|(id, _)| id).collect();
        let cut = ledger.cut.get(group).cloned().unwrap_or_default();
        let unexplained: Vec<&&String> = duplicated.iter().filter(|id| !cut.contains(**id)).collect();
        assert!(unexplained.is_empty(), "group {group}: duplicates no cut lease explains: {unexplained:?}");
        eprintln!(
            "group {group}: {} messages, {} delivered twice or more, all after a lease the kill cut",
            consumed.len(),
            duplicated.len()
        );
    }
    let client = db.connect().await;
    let offsets: i64 =
        client.query_one("SELECT sum(last_offset)::bigint FROM queen.partitions", &[]).await.expect("offsets").get(0);
    assert_eq!(offsets, MESSAGES as i64, "no message was stored twice");
}
