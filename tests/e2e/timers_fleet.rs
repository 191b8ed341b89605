//! Timers on a fleet of real `queen` processes over one database: every timer is delivered exactly
//! once whichever broker it was scheduled through and whichever sweeps it, and timers that fell due
//! while every broker was down are delivered by the first broker to start.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use nix::sys::signal::Signal;
use queen_testkit::{BrokerProcess, TestDatabase};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::queen_binary;

async fn start_broker(db: &TestDatabase) -> BrokerProcess {
    BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &[]).await
}

/// Schedule operations for timers `first..first + count` of `queue`: key and txn `t<n>`, payload
/// `n`, spread over four partitions, due `delay_ms(n)` from now.
fn schedules(queue: &str, first: usize, count: usize, delay_ms: impl Fn(usize) -> i64) -> Vec<Value> {
    (first..first + count)
        .map(|n| {
            json!({"op": "schedule", "queue": queue, "timerKey": format!("t{n}"), "txn": format!("t{n}"),
                   "partition": format!("p{}", n % 4), "payload": BASE64.encode(n.to_string()), "delayMs": delay_ms(n)})
        })
        .collect()
}

/// Schedules the operations in batches of ten, the batches spread round robin over `bases`, all
/// at once; every operation must be answered `scheduled`.
async fn schedule_through(http: &reqwest::Client, bases: &[String], ops: Vec<Value>) {
    let requests = ops.chunks(10).enumerate().map(|(i, batch)| {
        let url = format!("{}/api/v1/timers", bases[i % bases.len()]);
        let body = json!({ "operations": batch });
        async move {
            let answer = http.post(url).json(&body).send().await.expect("schedule");
            assert_eq!(answer.status(), StatusCode::OK);
            let answer: Value = answer.json().await.expect("JSON");
            for result in answer["results"].as_array().expect("results") {
                assert_eq!(result["status"], "scheduled", "{result}");
            }
        }
    });
    futures::future::join_all(requests).await;
}

/// Pops `queue` (auto-acknowledged, so nothing is delivered twice by a lease running out) through
/// `bases` in turn until `expected` messages came or `within` passed, then once more on every
/// broker to catch any extra delivery; how many times each transaction id was delivered.
async fn deliveries(
    http: &reqwest::Client,
    bases: &[String],
    queue: &str,
    expected: usize,
    within: Duration,
) -> BTreeMap<String, usize> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let deadline = Instant::now() + within;
    let pop = |base: &String| {
        http.get(format!("{base}/api/v1/pop/queue/{queue}?batch=100&partitions=4&autoAck=true&wait=true&timeout=500"))
            .send()
    };
    let mut turn = 0;
    let record = |body: Value, seen: &mut BTreeMap<String, usize>| {
        for message in body["messages"].as_array().into_iter().flatten() {
            *seen.entry(message["transactionId"].as_str().expect("a transaction id").to_owned()).or_default() += 1;
        }
    };
    while seen.values().sum::<usize>() < expected && Instant::now() < deadline {
        let answer = pop(&bases[turn % bases.len()]).await.expect("pop");
        turn += 1;
        if answer.status() == StatusCode::OK {
            record(answer.json().await.expect("JSON"), &mut seen);
        }
    }
    for base in bases {
        let answer = pop(base).await.expect("pop");
        if answer.status() == StatusCode::OK {
            record(answer.json().await.expect("JSON"), &mut seen);
        }
    }
    seen
}

fn assert_each_once(seen: &BTreeMap<String, usize>, count: usize) {
    let missing: Vec<String> = (0..count).map(|n| format!("t{n}")).filter(|txn| !seen.contains_key(txn)).collect();
    let repeated: Vec<(&String, &usize)> = seen.iter().filter(|(_, times)| **times != 1).collect();
    assert!(missing.is_empty(), "{} timers were never delivered: {missing:?}", missing.len());
    assert!(repeated.is_empty(), "timers delivered more than once: {repeated:?}");
    assert_eq!(seen.len(), count, "nothing else was delivered: {seen:?}");
}

async fn pending_timers(db: &TestDatabase) -> i64 {
    db.connect().await.query_one("SELECT count(*) FROM queen.timers", &[]).await.expect("count").get(0)
}

#[tokio::test]
async fn three_brokers_deliver_every_timer_once_whoever_scheduled_it() {
    const TIMERS: usize = 300;
    let db = TestDatabase::create("e2e_timers_fleet").await;
    let mut brokers = Vec::new();
    for _ in 0..3 {
        brokers.push(start_broker(&db).await);
    }
    let bases: Vec<String> = brokers.iter().map(BrokerProcess::url).collect();
    let http = queen_testkit::http().build().expect("an HTTP client");
    // Due from at once to 1.5 s on, so that the three sweepers compete for due timers throughout.
    schedule_through(&http, &bases, schedules("fleet-timers", 0, TIMERS, |n| (n % 16) as i64 * 100)).await;

    let seen = deliveries(&http, &bases, "fleet-timers", TIMERS, Duration::from_secs(60)).await;
    assert_each_once(&seen, TIMERS);
    assert_eq!(pending_timers(&db).await, 0, "every delivered timer is gone");
    for broker in &brokers {
        let failures: Vec<String> =
            broker.log().into_iter().filter(|line| line.contains("timer") && line.contains("WARN")).collect();
        assert!(failures.is_empty(), "a broker failed to deliver: {failures:?}");
    }
}

#[tokio::test]
async fn timers_that_fell_due_while_every_broker_was_down_fire_when_one_starts() {
    const TIMERS: usize = 100;
    let db = TestDatabase::create("e2e_timers_late").await;
    let mut brokers = Vec::new();
    for _ in 0..3 {
        brokers.push(start_broker(&db).await);
    }
    let bases: Vec<String> = brokers.iter().map(BrokerProcess::url).collect();
    let http = queen_testkit::http().build().expect("an HTTP client");
    // Due in 5 s: the brokers are stopped well before (a graceful stop takes a second or two).
    schedule_through(&http, &bases, schedules("late-timers", 0, TIMERS, |_| 5_000)).await;
    for broker in &brokers {
        broker.signal(Signal::SIGTERM);
    }
    for broker in &mut brokers {
        assert!(broker.wait(Duration::from_secs(30)).await.is_some_and(|s| s.success()), "a clean exit");
    }
    assert_eq!(pending_timers(&db).await, TIMERS as i64, "stopped before they were due");
    // Until every one of them is due, by the database's clock.
    let client = db.connect().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = client
            .query_one("SELECT count(*) FROM queen.timers WHERE deliver_at > now()", &[])
            .await
            .expect("count")
            .get(0);
        if waiting == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the timers never fell due");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let started = Instant::now();
    let broker = start_broker(&db).await;
    let seen = deliveries(&http, &[broker.url()], "late-timers", TIMERS, Duration::from_secs(30)).await;
    assert_each_once(&seen, TIMERS);
    assert!(started.elapsed() < Duration::from_secs(15), "delivered {:?} after the start", started.elapsed());
    assert_eq!(pending_timers(&db).await, 0);
}
