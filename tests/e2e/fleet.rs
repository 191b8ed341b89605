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
    let http = queen_testkit::http().build().expect("an HTTP client");
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

/// Push number `batch` of messages `m<n>` (payload `n`), `size` of them, spread over `partitions`
/// partitions of `queue`.
fn numbered_push(queue: &str, batch: usize, size: usize, partitions: usize) -> Value {
    let items: Vec<Value> = (batch * size..(batch + 1) * size)
        .map(|n| json!({"queue": queue, "partition": format!("p{}", n % partitions), "transactionId": format!("m{n}"), "payload": n}))
        .collect();
    json!({ "items": items })
}

/// An ack batch completing every message of a pop answer, under its lease.
fn ack_all(messages: &[Value], group: &str) -> Value {
    let acks: Vec<Value> = messages
        .iter()
        .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}))
        .collect();
    json!({"acknowledgments": acks, "consumerGroup": group})
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
    let http = queen_testkit::http().timeout(Duration::from_secs(10)).build().expect("a client");
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
                let body = numbered_push("fleet", batch, 10, 8);
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
                    let ack = ack_all(&messages, group);
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

/// The brokers a load balancer sends to: one slot per broker, empty while it is replaced.
#[derive(Clone)]
struct Rotation(Arc<std::sync::RwLock<Vec<Option<String>>>>);

impl Rotation {
    fn live(&self) -> Vec<String> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).iter().flatten().cloned().collect()
    }

    fn set(&self, slot: usize, base: Option<String>) {
        self.0.write().unwrap_or_else(|p| p.into_inner())[slot] = base;
    }
}

/// Sends to the live brokers in turn from `turn`, as a load balancer does: a request that gets no
/// answer or a 5xx goes to the next one, until one answers.
async fn balanced(
    http: &reqwest::Client,
    rotation: &Rotation,
    turn: usize,
    request: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
) -> reqwest::Response {
    let deadline = Instant::now() + Duration::from_secs(30);
    for attempt in turn.. {
        let live = rotation.live();
        match request(http, &live[attempt % live.len()]).send().await {
            Ok(response) if !response.status().is_server_error() => return response,
            _ => assert!(Instant::now() < deadline, "no broker answered for 30 s"),
        }
    }
    unreachable!("the loop returns or fails")
}

const ROLLING_MESSAGES: usize = 600;
const ROLLING_GROUPS: [&str; 2] = ["a", "b"];

/// What the consumers of one group saw.
#[derive(Default)]
struct GroupLedger {
    /// The `deliveryAttempt` of every delivery of each transaction id.
    deliveries: HashMap<String, Vec<i64>>,
    acked: BTreeSet<String>,
    /// Acknowledgements refused: transaction id and error.
    refused: Vec<(String, String)>,
}

#[tokio::test]
async fn a_rolling_restart_under_steady_consumption_redelivers_nothing() {
    let db = TestDatabase::create("e2e_rolling").await;
    let mut brokers = start_brokers(&db, 3).await;
    let rotation = Rotation(Arc::new(std::sync::RwLock::new(brokers.iter().map(|b| Some(b.url())).collect())));
    // No idle connections kept: a broker that got SIGTERM is done as soon as its requests are
    // answered, while consumers still work on what it leased them.
    let http =
        queen_testkit::http().timeout(Duration::from_secs(10)).pool_max_idle_per_host(0).build().expect("a client");
    let configure = json!({"queue": "rolling", "options": {"leaseTime": 60}});
    let configured =
        balanced(&http, &rotation, 0, |http, base| http.post(format!("{base}/api/v1/configure")).json(&configure));
    assert_eq!(configured.await.status(), StatusCode::OK);

    let ledger: Arc<Mutex<HashMap<&'static str, GroupLedger>>> = Arc::new(Mutex::new(HashMap::new()));
    let produced = Arc::new(AtomicBool::new(false));
    // Producers push at a steady rate for about as long as the restarts take.
    let producer = {
        let (http, rotation, produced) = (http.clone(), rotation.clone(), Arc::clone(&produced));
        tokio::spawn(async move {
            let mut pace = tokio::time::interval(Duration::from_millis(150));
            for batch in 0..ROLLING_MESSAGES / 15 {
                pace.tick().await;
                let body = numbered_push("rolling", batch, 15, 6);
                // A push that got no answer is sent again elsewhere: its transaction ids make that safe.
                let pushed = balanced(&http, &rotation, batch, |http, base| {
                    http.post(format!("{base}/api/v1/push")).json(&body)
                })
                .await;
                assert_eq!(pushed.status(), StatusCode::CREATED);
            }
            produced.store(true, Ordering::SeqCst);
        })
    };

    let mut consumers = Vec::new();
    for (g, group) in ROLLING_GROUPS.into_iter().enumerate() {
        for c in 0..4 {
            let (http, rotation, ledger, produced) =
                (http.clone(), rotation.clone(), Arc::clone(&ledger), Arc::clone(&produced));
            consumers.push(tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(120);
                let mut turn = g * 4 + c;
                loop {
                    let acked = ledger.lock().await.get(group).map_or(0, |l| l.acked.len());
                    if produced.load(Ordering::SeqCst) && acked == ROLLING_MESSAGES {
                        return;
                    }
                    assert!(Instant::now() < deadline, "group {group} did not finish: {acked} acked");
                    turn += 1;
                    let query = format!("batch=50&wait=true&timeout=1000&consumerGroup={group}");
                    let popped = balanced(&http, &rotation, turn, |http, base| {
                        http.get(format!("{base}/api/v1/pop/queue/rolling?{query}"))
                    })
                    .await;
                    if popped.status() == StatusCode::NO_CONTENT {
                        continue;
                    }
                    assert_eq!(popped.status(), StatusCode::OK);
                    let body: Value = popped.json().await.expect("a pop answer");
                    let messages = body["messages"].as_array().cloned().unwrap_or_default();
                    {
                        let mut ledger = ledger.lock().await;
                        let deliveries = &mut ledger.entry(group).or_default().deliveries;
                        for m in &messages {
                            let id = m["transactionId"].as_str().unwrap_or_default().to_owned();
                            deliveries.entry(id).or_default().push(m["deliveryAttempt"].as_i64().unwrap_or(0));
                        }
                    }
                    // The consumer's work, longer than a broker takes to stop: when one stops, some
                    // consumer almost always holds a lease it granted.
                    tokio::time::sleep(Duration::from_secs(4)).await;
                    let ack = ack_all(&messages, group);
                    let acked = balanced(&http, &rotation, turn + 1, |http, base| {
                        http.post(format!("{base}/api/v1/ack/batch")).json(&ack)
                    })
                    .await;
                    assert_eq!(acked.status(), StatusCode::OK);
                    let results: Vec<Value> = acked.json().await.expect("ack results");
                    let mut ledger = ledger.lock().await;
                    let ledger = ledger.entry(group).or_default();
                    for (m, result) in messages.iter().zip(&results) {
                        let id = m["transactionId"].as_str().unwrap_or_default().to_owned();
                        if result["success"] == true {
                            ledger.acked.insert(id);
                        } else {
                            ledger.refused.push((id, result["error"].to_string()));
                        }
                    }
                }
            }));
        }
    }

    // Replace the brokers one by one while the consumers run: each leaves the rotation and gets
    // SIGTERM at once, and its replacement joins; the next goes once consumption has moved on.
    let acked_so_far =
        |ledger: &HashMap<&'static str, GroupLedger>| ledger.values().map(|l| l.acked.len()).sum::<usize>();
    for (slot, broker) in brokers.iter_mut().enumerate() {
        let target = ledger.lock().await.values().map(|l| l.acked.len()).sum::<usize>() + 100;
        let deadline = Instant::now() + Duration::from_secs(60);
        while acked_so_far(&*ledger.lock().await) < target {
            assert!(Instant::now() < deadline, "consumption stalled before restarting broker {slot}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        rotation.set(slot, None);
        broker.signal(Signal::SIGTERM);
        let status = broker.wait(Duration::from_secs(30)).await.expect("the broker exits after SIGTERM");
        assert!(status.success(), "broker {slot} exited with {status:?}; log:\n{}", broker.log().join("\n"));
        *broker = BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &[]).await;
        rotation.set(slot, Some(broker.url()));
    }

    producer.await.expect("the producer");
    for consumer in consumers {
        consumer.await.expect("a consumer");
    }
    let ledger = ledger.lock().await;
    let all: BTreeSet<String> = (0..ROLLING_MESSAGES).map(|n| format!("m{n}")).collect();
    for group in ROLLING_GROUPS {
        let ledger = &ledger[group];
        let delivered: BTreeSet<String> = ledger.deliveries.keys().cloned().collect();
        assert_eq!(delivered, all, "group {group} lost {:?}", all.difference(&delivered).collect::<Vec<_>>());
        assert_eq!(ledger.acked, all, "group {group}: every message acknowledged");
        assert!(ledger.refused.is_empty(), "group {group}: acknowledgements refused: {:?}", ledger.refused);
        let again: Vec<(&String, &Vec<i64>)> =
            ledger.deliveries.iter().filter(|(_, attempts)| attempts.as_slice() != [1]).collect();
        assert!(again.is_empty(), "group {group}: redelivered (transaction id, delivery attempts): {again:?}");
    }
}

/// The state `/api/v1/status/brokers` at `base` gives the broker listening on `port`.
async fn listed_state(http: &reqwest::Client, base: &str, port: u16) -> Option<String> {
    let answer: Value = http.get(format!("{base}/api/v1/status/brokers")).send().await.ok()?.json().await.ok()?;
    let brokers = answer["brokers"].as_array()?;
    let listed = brokers.iter().find(|b| b["id"].as_str().is_some_and(|id| id.contains(&format!(":{port}:"))))?;
    listed["state"].as_str().map(str::to_owned)
}

async fn listed_states(http: &reqwest::Client, base: &str, ports: &[u16]) -> Vec<String> {
    let mut states = Vec::new();
    for &port in ports {
        states.push(listed_state(http, base, port).await.unwrap_or_default());
    }
    states
}

#[tokio::test]
async fn the_fleet_list_tells_a_stopped_broker_from_a_missing_one() {
    let db = TestDatabase::create("e2e_fleet_list").await;
    let beat = [("QUEEN_STATS__SAMPLE_INTERVAL_SECONDS", "1")];
    let mut brokers = Vec::new();
    for _ in 0..3 {
        brokers.push(BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &beat).await);
    }
    let http = queen_testkit::http().build().expect("an HTTP client");
    let watcher = brokers[0].url();
    let ports: Vec<u16> = brokers.iter().map(BrokerProcess::port).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while listed_states(&http, &watcher, &ports).await != ["live", "live", "live"] {
        assert!(Instant::now() < deadline, "every broker is listed live");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // One shuts down gracefully and says so; another is killed and stops beating.
    brokers[1].signal(Signal::SIGTERM);
    assert!(brokers[1].wait(Duration::from_secs(30)).await.is_some_and(|s| s.success()), "a clean exit");
    brokers[2].signal(Signal::SIGKILL);
    brokers[2].wait(Duration::from_secs(10)).await.expect("killed");
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen != ["live", "stopped", "missing"] {
        assert!(Instant::now() < deadline, "the list shows the stop and the kill, last seen {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen = listed_states(&http, &watcher, &ports).await;
    }
}
