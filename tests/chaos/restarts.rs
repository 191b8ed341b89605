//! PostgreSQL restarted under load, three times in a row, while long polls are parked.

use std::time::{Duration, Instant};

use queen_testkit::{BrokerProcess, metric_at};
use reqwest::StatusCode;
use serde_json::json;

use crate::cluster::{DATABASE, Single};
use crate::load::{Plan, Workload};
use crate::support::{assert_running, start_brokers};

/// Long polls parked on each broker in each round.
const PARKED: usize = 4;

/// How long they wait: longer than an outage of the test lasts.
const LONG_POLL: Duration = Duration::from_secs(8);

/// Waits until `/ready` of `base` answers `status`.
async fn until_ready_is(http: &reqwest::Client, base: &str, status: StatusCode) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(answer) = http.get(format!("{base}/ready")).send().await
            && answer.status() == status
        {
            return;
        }
        assert!(Instant::now() < deadline, "{base}/ready never answered {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `base` has at least `count` long polls parked.
async fn until_parked(http: &reqwest::Client, base: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric_at(http, base, "queen_long_poll_waiters").await < count as f64 {
        assert!(Instant::now() < deadline, "{count} long polls never parked on {base}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Parks `PARKED` long polls on the empty queue `queue` of broker `b` at `base`, each in a group
/// of its own; each resolves to its answer's status.
fn park(http: &reqwest::Client, b: usize, base: &str, queue: &str) -> Vec<tokio::task::JoinHandle<StatusCode>> {
    (0..PARKED)
        .map(|i| {
            let url = format!(
                "{base}/api/v1/pop/queue/{queue}?consumerGroup=b{b}-{i}&wait=true&timeout={}",
                LONG_POLL.as_millis()
            );
            let http = http.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let status = http.get(url).send().await.expect("a parked long poll is answered").status();
                let took = started.elapsed();
                assert!(took < LONG_POLL + Duration::from_secs(5), "a long poll was answered after {took:?}");
                status
            })
        })
        .collect()
}

#[tokio::test]
async fn three_restarts_under_load_answer_every_parked_long_poll_and_lose_nothing() {
    let mut pg = Single::start("restarts", &[]).await;
    let mut brokers = start_brokers(&pg.url(), 2, &[]).await;
    let bases: Vec<String> = brokers.iter().map(BrokerProcess::url).collect();
    let http = queen_testkit::http().timeout(Duration::from_secs(40)).build().expect("a client");
    let workload = Workload::start(Plan { long_poll: false, ..Plan::new(bases.clone(), "restarts") }).await;
    workload.until_acknowledged(100, Duration::from_secs(60)).await;

    for round in 0..3 {
        let mut parked = Vec::new();
        for (b, base) in bases.iter().enumerate() {
            parked.extend(park(&http, b, base, &format!("idle{round}")));
            until_parked(&http, base, PARKED).await;
        }
        // A crash in the first round, clean restarts after it.
        if round == 0 {
            pg.server.kill().await;
        } else {
            pg.server.stop().await;
        }
        for base in &bases {
            until_ready_is(&http, base, StatusCode::SERVICE_UNAVAILABLE).await;
        }
        pg.server.start_again().await;
        for base in &bases {
            until_ready_is(&http, base, StatusCode::OK).await;
        }
        let statuses = futures::future::join_all(parked).await;
        for status in statuses {
            let status = status.expect("a long poll task");
            assert!(
                status == StatusCode::NO_CONTENT || status == StatusCode::OK,
                "round {round}: a parked long poll was answered {status}"
            );
        }
        // Long polls park again, and a push wakes them.
        let queue = format!("woken{round}");
        let again: Vec<_> = bases.iter().enumerate().map(|(b, base)| park(&http, b, base, &queue)).collect();
        for base in &bases {
            until_parked(&http, base, PARKED).await;
        }
        let wake = json!({"items": [{"queue": queue, "transactionId": format!("wake{round}"), "payload": round}]});
        let pushed = http.post(format!("{}/api/v1/push", bases[0])).json(&wake).send().await.expect("push");
        assert_eq!(pushed.status(), StatusCode::CREATED);
        for (b, polls) in again.into_iter().enumerate() {
            for status in futures::future::join_all(polls).await {
                let status = status.expect("a long poll task");
                assert_eq!(status, StatusCode::OK, "round {round}: a re-parked poll on broker {b} was woken");
            }
        }
        workload.until_acknowledged(100, Duration::from_secs(60)).await;
    }

    let db = pg.server.connect(DATABASE).await;
    let ledger = workload.finish(&db, Duration::from_secs(90)).await;
    println!("restarts: {}", ledger.summary());
    ledger.verify(&db).await;
    assert_running(&mut brokers).await;
}
