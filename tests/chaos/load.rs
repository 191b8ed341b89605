//! Producers and consumers that keep going through faults, as the official client does:
//! a push that gets no answer, or a 5xx, is sent again with the same transaction ids (to
//! another broker when there are several); consumers long-poll, ack what they got, and carry on
//! after errors. Everything they are told goes into the [`Ledger`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::ledger::{AckSeen, Ledger, all_consumed};

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Brokers to send to, in turn.
    pub bases: Vec<String>,
    pub queue: &'static str,
    pub partitions: usize,
    pub groups: Vec<&'static str>,
    pub producers: usize,
    pub consumers_per_group: usize,
    /// Messages per push.
    pub push_size: usize,
    /// Pause between a producer's pushes, which bounds the load on a shared machine.
    pub pause: Duration,
    /// The queue's lease time, seconds: how soon a delivery cut by a fault is delivered again.
    pub lease_seconds: u32,
    /// Whether consumers long-poll; without, they pop and pause when there is nothing (so that
    /// the brokers' count of parked long polls is the test's own).
    pub long_poll: bool,
}

impl Plan {
    pub fn new(bases: Vec<String>, queue: &'static str) -> Plan {
        Plan {
            bases,
            queue,
            partitions: 4,
            groups: vec!["g1", "g2"],
            producers: 3,
            consumers_per_group: 2,
            push_size: 3,
            pause: Duration::from_millis(5),
            lease_seconds: 2,
            long_poll: true,
        }
    }
}

/// Producers and consumers at work.
pub struct Workload {
    plan: Plan,
    ledger: Arc<Ledger>,
    producing: Arc<AtomicBool>,
    consuming: Arc<AtomicBool>,
    producers: Vec<JoinHandle<()>>,
    consumers: Vec<JoinHandle<()>>,
}

/// A client whose requests end (with an error the caller retries) when a broker stalls.
fn client() -> reqwest::Client {
    queen_testkit::http()
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .expect("an HTTP client")
}

/// How long a failed request waits before it is sent again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

impl Workload {
    /// Configures the queue (retries without a dead letter in sight: a fault may expire a lease
    /// many times) and starts producers and consumers.
    pub async fn start(plan: Plan) -> Workload {
        let http = client();
        let options = json!({"queue": plan.queue, "options": {"leaseTime": plan.lease_seconds, "retryLimit": 1000}});
        let answer = http.post(format!("{}/api/v1/configure", plan.bases[0])).json(&options).send().await;
        assert_eq!(answer.expect("configure").status(), StatusCode::OK, "the queue is configured");

        let ledger = Arc::new(Ledger::new(plan.queue, plan.groups.clone()));
        let (producing, consuming) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicBool::new(true)));
        let producers = (0..plan.producers)
            .map(|p| tokio::spawn(produce(plan.clone(), p, http.clone(), Arc::clone(&ledger), Arc::clone(&producing))))
            .collect();
        let mut consumers = Vec::new();
        for group in &plan.groups {
            for c in 0..plan.consumers_per_group {
                let (plan, http, ledger, consuming) =
                    (plan.clone(), http.clone(), Arc::clone(&ledger), Arc::clone(&consuming));
                consumers.push(tokio::spawn(consume(plan, group, c, http, ledger, consuming)));
            }
        }
        Workload { plan, ledger, producing, consuming, producers, consumers }
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Waits until `more` pushes beyond those acknowledged now are acknowledged.
    pub async fn until_acknowledged(&self, more: usize, limit: Duration) {
        let target = self.ledger.acknowledged_count() + more;
        let deadline = Instant::now() + limit;
        while self.ledger.acknowledged_count() < target {
            assert!(Instant::now() < deadline, "fewer than {more} pushes acknowledged within {limit:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops producing (each producer first gets its last push acknowledged), waits until every
    /// group has committed everything stored, then stops the consumers. `db` reads the queue's
    /// database (the current primary).
    pub async fn finish(self, db: &tokio_postgres::Client, limit: Duration) -> Arc<Ledger> {
        let deadline = Instant::now() + limit;
        self.producing.store(false, Ordering::SeqCst);
        for producer in self.producers {
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::timeout(left, producer)
                .await
                .expect("a producer got its last push acknowledged in time")
                .expect("a producer");
        }
        loop {
            if all_consumed(db, self.plan.queue, &self.plan.groups).await.expect("the groups' cursors") {
                break;
            }
            assert!(Instant::now() < deadline, "the groups did not consume everything within {limit:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.consuming.store(false, Ordering::SeqCst);
        for consumer in self.consumers {
            consumer.await.expect("a consumer");
        }
        self.ledger
    }
}

async fn produce(plan: Plan, producer: usize, http: reqwest::Client, ledger: Arc<Ledger>, producing: Arc<AtomicBool>) {
    let mut attempt = producer;
    for push in 0.. {
        if !producing.load(Ordering::SeqCst) {
            return;
        }
        let items: Vec<Value> = (0..plan.push_size)
            .map(|i| {
                let id = format!("p{producer}-{push}-{i}");
                json!({
                    "queue": plan.queue,
                    "partition": format!("part{}", (push * plan.push_size + i) % plan.partitions),
                    "transactionId": id,
                    "payload": {"id": id, "push": push},
                })
            })
            .collect();
        for item in &items {
            ledger.attempted(item["transactionId"].as_str().expect("an id"), &item["payload"]);
        }
        let body = json!({ "items": items });
        // Until the broker says what became of it: the same ids each time.
        loop {
            let base = &plan.bases[attempt % plan.bases.len()];
            let sent = Instant::now();
            match http.post(format!("{base}/api/v1/push")).json(&body).send().await {
                Ok(answer) if answer.status() == StatusCode::CREATED => {
                    let results: Value = answer.json().await.expect("a push answer is whole");
                    for (item, result) in items.iter().zip(results.as_array().expect("one result per item")) {
                        let status = result["status"].as_str().unwrap_or_default();
                        assert!(matches!(status, "queued" | "duplicate"), "push answered {result}");
                        ledger.acknowledged(item["transactionId"].as_str().expect("an id"), sent);
                    }
                    break;
                }
                Ok(answer) => {
                    let status = answer.status();
                    let text = answer.text().await.unwrap_or_default();
                    assert!(
                        status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS,
                        "a push answered {status}: {text}"
                    );
                }
                Err(_) => {}
            }
            attempt += 1;
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        tokio::time::sleep(plan.pause).await;
    }
}

async fn consume(
    plan: Plan,
    group: &'static str,
    consumer: usize,
    http: reqwest::Client,
    ledger: Arc<Ledger>,
    consuming: Arc<AtomicBool>,
) {
    let mut attempt = consumer;
    while consuming.load(Ordering::SeqCst) {
        let base = &plan.bases[attempt % plan.bases.len()];
        let wait = if plan.long_poll { "&wait=true&timeout=1000" } else { "" };
        let pop = format!("{base}/api/v1/pop/queue/{}?batch=20&consumerGroup={group}{wait}", plan.queue);
        let messages = match http.get(pop).send().await {
            Ok(answer) if answer.status() == StatusCode::OK => {
                let body: Value = answer.json().await.expect("a pop answer is whole");
                body["messages"].as_array().cloned().unwrap_or_default()
            }
            Ok(answer) if answer.status() == StatusCode::NO_CONTENT => {
                if !plan.long_poll {
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                continue;
            }
            Ok(answer) => {
                let status = answer.status();
                let text = answer.text().await.unwrap_or_default();
                assert!(status == StatusCode::SERVICE_UNAVAILABLE, "a pop answered {status}: {text}");
                attempt += 1;
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
            Err(_) => {
                attempt += 1;
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
        };
        let delivered: Vec<_> = messages.iter().map(|message| ledger.delivered(group, message)).collect();
        let acks: Vec<Value> = delivered
            .iter()
            .map(|d| json!({"transactionId": d.transaction_id, "partitionId": d.partition_id, "leaseId": d.lease_id, "status": "completed"}))
            .collect();
        let body = json!({"acknowledgments": acks, "consumerGroup": group});
        let verdicts: Vec<AckSeen> = match http.post(format!("{base}/api/v1/ack/batch")).json(&body).send().await {
            Ok(answer) if answer.status() == StatusCode::OK => {
                let results: Value = answer.json().await.expect("an ack answer is whole");
                let results = results.as_array().cloned().unwrap_or_default();
                assert_eq!(results.len(), delivered.len(), "one verdict per ack");
                results
                    .iter()
                    .map(|result| match (result["success"].as_bool(), result["noop"].as_bool()) {
                        (Some(true), Some(true)) => AckSeen::Noop,
                        (Some(true), _) => AckSeen::Committed,
                        _ => AckSeen::Cut,
                    })
                    .collect()
            }
            Ok(answer) => {
                let status = answer.status();
                let text = answer.text().await.unwrap_or_default();
                assert!(status == StatusCode::SERVICE_UNAVAILABLE, "an ack answered {status}: {text}");
                vec![AckSeen::Cut; delivered.len()]
            }
            Err(_) => vec![AckSeen::Cut; delivered.len()],
        };
        for (d, verdict) in delivered.iter().zip(verdicts) {
            ledger.ack(group, &d.transaction_id, verdict);
        }
    }
}
