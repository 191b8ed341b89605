//! One broker of three loses its LISTEN connection while another pushes: the announcements it
//! misses must not strand a long poll parked on it.

use std::time::{Duration, Instant};

use queen_testkit::{BrokerProcess, TestDatabase, metric_at};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_postgres::Client;

use crate::load::{Plan, Workload};
use crate::support::{assert_running, listen_backends, queen_binary, start_brokers};

/// How soon the long poll must be answered after the cut: the listener reconnects after its
/// first backoff step (100 ms), then every parked pop looks again.
const RECHECK_BOUND: Duration = Duration::from_secs(5);

/// Waits until the database has `count` LISTEN backends, and returns them.
async fn until_listening(db: &Client, count: usize) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pids: Vec<i32> = listen_backends(db).await.into_iter().map(|(pid, _)| pid).collect();
        if pids.len() == count {
            return pids;
        }
        assert!(Instant::now() < deadline, "{count} LISTEN connections expected, found {pids:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_broker_that_loses_its_listen_connection_still_answers_its_parked_long_poll() {
    let db = TestDatabase::create("chaos_lost_listen").await;
    let sql = db.connect().await;
    // The first broker alone, to learn which LISTEN backend is its own.
    let first = BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &[]).await;
    let [first_listener] = until_listening(&sql, 1).await[..] else { unreachable!("one listener") };
    let mut brokers = vec![first];
    brokers.extend(start_brokers(db.url(), 2, &[]).await);
    let others: Vec<i32> = until_listening(&sql, 3).await.into_iter().filter(|pid| *pid != first_listener).collect();
    let bases: Vec<String> = brokers.iter().map(BrokerProcess::url).collect();
    // Consumers pop without parking, so that the first broker's parked pops are the test's own.
    let workload = Workload::start(Plan { long_poll: false, ..Plan::new(bases.clone(), "fleet") }).await;
    workload.until_acknowledged(200, Duration::from_secs(60)).await;

    let http = queen_testkit::http().timeout(Duration::from_secs(30)).build().expect("a client");
    let parked = {
        let url = format!("{}/api/v1/pop/queue/missed?consumerGroup=watch&wait=true&timeout=20000", bases[0]);
        let http = http.clone();
        tokio::spawn(async move { http.get(url).send().await.expect("the long poll is answered") })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric_at(&http, &bases[0], "queen_long_poll_waiters").await < 1.0 {
        assert!(Instant::now() < deadline, "the long poll never parked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let cut: bool = sql
        .query_one("SELECT pg_terminate_backend($1)", &[&first_listener])
        .await
        .expect("pg_terminate_backend")
        .get(0);
    assert!(cut, "the first broker's LISTEN backend was terminated");
    let cut_at = Instant::now();
    // Pushed through another broker at once: its announcement reaches the first broker while it
    // is not listening, or not at all. The first broker finds the message only because, listening
    // again, it drops every view it had (its empty-scan watermark for the group included) and
    // has its parked pops look again.
    let push =
        json!({"items": [{"queue": "missed", "partition": "p", "transactionId": "late", "payload": "while cut"}]});
    let pushed = http.post(format!("{}/api/v1/push", bases[1])).json(&push).send().await.expect("push");
    assert_eq!(pushed.status(), StatusCode::CREATED);

    let answer = parked.await.expect("the long poll task");
    let answered_after = cut_at.elapsed();
    assert_eq!(answer.status(), StatusCode::OK, "the parked long poll got the message");
    let body: Value = answer.json().await.expect("a pop answer");
    assert_eq!(body["messages"][0]["transactionId"], "late");
    assert!(answered_after < RECHECK_BOUND, "answered {answered_after:?} after the cut");
    println!("lost LISTEN: the parked long poll was answered {answered_after:?} after the cut");

    // The first broker listens again; the others never stopped.
    let now = until_listening(&sql, 3).await;
    assert!(!now.contains(&first_listener), "a new LISTEN connection replaced the cut one");
    assert!(others.iter().all(|pid| now.contains(pid)), "the other brokers kept theirs");

    let ledger = workload.finish(&sql, Duration::from_secs(60)).await;
    println!("lost LISTEN: {}", ledger.summary());
    ledger.verify(&sql).await;
    assert_running(&mut brokers).await;
}
