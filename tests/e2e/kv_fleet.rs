//! Compare-and-set on one key from writers on three real `queen` processes over one database.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use queen_testkit::{BrokerProcess, TestDatabase};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::queen_binary;

const BROKERS: usize = 3;
const WRITERS_PER_BROKER: usize = 3;
const GOAL: i64 = 1000;

/// One key/value operation through `base`; its result.
async fn kv(http: &reqwest::Client, base: &str, operation: Value) -> Value {
    let response = http
        .post(format!("{base}/api/v1/kv"))
        .json(&json!({ "operations": [operation] }))
        .send()
        .await
        .expect("a kv call");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body: Value = response.json().await.expect("a JSON answer");
    body["results"][0].take()
}

/// Writers on every broker read the counter and write it back one higher, expecting the version
/// they read, retrying when another writer got there first, until the counter reads 1,000. Every
/// CAS that applied must have taken the next version with the next count: none lost, none applied
/// twice, no version skipped.
#[tokio::test]
async fn read_then_cas_increments_through_three_brokers_take_every_version_once() {
    let db = TestDatabase::create("e2e_kv_fleet").await;
    let mut brokers = Vec::new();
    for _ in 0..BROKERS {
        brokers.push(BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &[]).await);
    }
    let http = queen_testkit::http().build().expect("an HTTP client");
    let created = kv(
        &http,
        &brokers[0].url(),
        json!({"op": "put", "ns": "fleet", "key": "counter", "value": 0, "forever": true}),
    )
    .await;
    let start = created["version"].as_i64().expect("a version");

    // version -> (count written, broker that wrote it)
    let applied: Arc<Mutex<BTreeMap<i64, (i64, usize)>>> = Arc::default();
    let mut writers = Vec::new();
    for (broker, process) in brokers.iter().enumerate() {
        for _ in 0..WRITERS_PER_BROKER {
            let (http, base, applied) = (http.clone(), process.url(), Arc::clone(&applied));
            writers.push(tokio::spawn(async move {
                let mut conflicts = 0u64;
                loop {
                    let seen = kv(&http, &base, json!({"op": "get", "ns": "fleet", "key": "counter"})).await;
                    let (count, version) = (seen["value"].as_i64().unwrap(), seen["version"].as_i64().unwrap());
                    if count >= GOAL {
                        return conflicts;
                    }
                    let cas = json!({"op": "put", "ns": "fleet", "key": "counter", "value": count + 1,
                                     "forever": true, "expect": version});
                    let result = kv(&http, &base, cas).await;
                    if result["applied"] == true {
                        let new_version = result["version"].as_i64().unwrap();
                        let previous = applied.lock().unwrap().insert(new_version, (count + 1, broker));
                        assert!(previous.is_none(), "version {new_version} applied twice");
                    } else {
                        assert_eq!(result["reason"], "version", "{result}");
                        conflicts += 1;
                    }
                }
            }));
        }
    }
    let mut conflicts = 0;
    for writer in writers {
        conflicts += writer.await.expect("a writer");
    }

    let applied = applied.lock().unwrap().clone();
    assert_eq!(applied.len() as i64, GOAL, "exactly one applied CAS per increment");
    let versions: Vec<i64> = applied.keys().copied().collect();
    assert_eq!(versions, (start + 1..=start + GOAL).collect::<Vec<_>>(), "the version history has no gap");
    assert!(applied.iter().all(|(version, (count, _))| version - start == *count), "each CAS wrote the next count");
    for broker in 0..BROKERS {
        assert!(applied.values().any(|(_, by)| *by == broker), "broker {broker} applied some increments");
    }
    assert!(conflicts > 0, "the writers did contend (otherwise this tested nothing)");
    for process in &brokers {
        let last = kv(&http, &process.url(), json!({"op": "get", "ns": "fleet", "key": "counter"})).await;
        assert_eq!((last["value"].clone(), last["version"].clone()), (json!(GOAL), json!(start + GOAL)));
    }
}
