//! Many consumers of one group acking, failing and dying at random over many partitions: every
//! message ends either committed exactly once or dead-lettered, none lost, none skipped.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

const PARTITIONS: usize = 8;
const PER_PARTITION: usize = 40;
const CONSUMERS: u64 = 4;
const RETRY_LIMIT: i64 = 2;

/// A small deterministic generator, so a failing run can be replayed.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn is_poison(i: usize) -> bool {
    i % 13 == 5
}

/// What the consumers saw: how often each message was committed by one of their acks.
#[derive(Default)]
struct Ledger {
    committed: HashMap<String, u32>,
}

async fn all_consumed(app: &TestApp) -> bool {
    let lagging = app
        .count(
            "SELECT count(*) FROM queen.partitions p
               LEFT JOIN queen.log_consumers c ON c.partition_id = p.id AND c.consumer_group = 'g'
              WHERE c.committed IS DISTINCT FROM p.last_offset",
        )
        .await;
    lagging == 0
}

async fn consumer(app: &TestApp, seed: u64, ledger: &Mutex<Ledger>, deadline: Instant) {
    let mut rng = XorShift(seed);
    while Instant::now() < deadline {
        let answer = app.pop("queue/chaos", "batch=10&partitions=2&consumerGroup=g&wait=true&timeout=300").await;
        if answer.status == StatusCode::NO_CONTENT {
            if all_consumed(app).await {
                return;
            }
            continue;
        }
        let roll = rng.below(100);
        if roll < 10 {
            // This consumer dies with its batch: the lease runs out and another one gets it.
            continue;
        }
        let mut acks = Vec::new();
        let mut failed_partitions = HashSet::new();
        for message in answer.messages() {
            let partition = message["partitionId"].as_str().unwrap_or_default().to_owned();
            if failed_partitions.contains(&partition) {
                continue; // redelivered with the failed one
            }
            let status = if message["data"]["poison"] == true {
                "failed"
            } else if roll < 25 && rng.below(4) == 0 {
                if rng.below(2) == 0 { "failed" } else { "retry" }
            } else {
                "completed"
            };
            if status != "completed" {
                failed_partitions.insert(partition);
            }
            acks.push(json!({"transactionId": message["transactionId"], "partitionId": message["partitionId"],
                             "leaseId": message["leaseId"], "status": status, "error": "chaos"}));
        }
        let results = app.post("/api/v1/ack/batch", &json!({"acknowledgments": acks, "consumerGroup": "g"})).await;
        assert_eq!(results.status, StatusCode::OK, "{results:?}");
        let mut ledger = ledger.lock().expect("the ledger");
        for (ack, result) in acks.iter().zip(results.body.as_array().expect("verdicts")) {
            if ack["status"] == "completed" && result["success"] == true && result["noop"] == false {
                *ledger.committed.entry(ack["transactionId"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
            }
        }
    }
}

#[actix_web::test]
async fn random_acks_failures_and_crashes_lose_and_skip_nothing() {
    let app = TestApp::spawn().await;
    app.post("/api/v1/configure", &json!({"queue": "chaos", "options": {"leaseTime": 1, "retryLimit": RETRY_LIMIT}}))
        .await;
    let mut all = BTreeSet::new();
    let mut poison = BTreeSet::new();
    for p in 0..PARTITIONS {
        let items: Vec<Value> = (0..PER_PARTITION)
            .map(|i| {
                let transaction_id = format!("p{p}-m{i}");
                all.insert(transaction_id.clone());
                if is_poison(i) {
                    poison.insert(transaction_id.clone());
                }
                json!({"queue": "chaos", "partition": format!("p{p}"), "transactionId": transaction_id,
                       "payload": {"i": i, "poison": is_poison(i)}})
            })
            .collect();
        app.push(Value::Array(items)).await;
    }

    let ledger = Mutex::new(Ledger::default());
    let deadline = Instant::now() + Duration::from_secs(90);
    let consumers = (0..CONSUMERS).map(|c| consumer(&app, 0x9E37_79B9_7F4A_7C15 ^ (c + 1), &ledger, deadline));
    futures::future::join_all(consumers).await;
    assert!(all_consumed(&app).await, "the consumers did not finish before the deadline");

    let dead: BTreeSet<String> = app
        .db
        .connect()
        .await
        .query("SELECT transaction_id FROM queen.log_dlq WHERE consumer_group = 'g'", &[])
        .await
        .expect("dead letters")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let committed = ledger.into_inner().expect("the ledger").committed;
    for (transaction_id, times) in &committed {
        assert_eq!(*times, 1, "{transaction_id} was committed {times} times");
    }
    let committed: BTreeSet<String> = committed.into_keys().collect();
    assert!(
        committed.is_disjoint(&dead),
        "committed and dead-lettered: {:?}",
        committed.intersection(&dead).collect::<Vec<_>>()
    );
    let accounted: BTreeSet<String> = committed.union(&dead).cloned().collect();
    assert_eq!(accounted, all, "lost or skipped: {:?}", all.difference(&accounted).collect::<Vec<_>>());
    assert!(poison.is_subset(&dead), "a poison message escaped the dead-letter queue");
    let redelivered = app.count("SELECT sum(redelivery_count)::bigint FROM queen.log_consumers").await;
    assert!(redelivered > 0, "no consumer died mid-batch: the run tested less than it claims");
}
