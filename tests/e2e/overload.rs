//! A broker pushed past what it can commit refuses work instead of growing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use queen_testkit::{BrokerProcess, TestDatabase, metric_at};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::support::queen_binary;

/// Producers pushing at once, each this many pushes one after the other, every push `ITEMS`
/// payloads of `PAYLOAD_BYTES`: 100 bodies of 800 KiB arrive together, 80 MiB, ten times the
/// bound on bodies in flight.
const PRODUCERS: usize = 100;
const PUSHES_EACH: usize = 3;
const ITEMS: usize = 16;
const PAYLOAD_BYTES: usize = 50 * 1024;
const BODY_BYTES_IN_FLIGHT: usize = 8 * 1024 * 1024;
/// The stated bound on how much the broker's resident memory may grow under this load: the
/// bodies it holds, a few copies of each while they are parsed and fused into segments (about
/// 40 MiB at most), and the HTTP server's read buffers of each connection (at most 160 KiB each,
/// 16 MiB), with room for the allocator. A broker that queues every push grows with all the
/// bodies sent at once (by 260 to 300 MiB here).
const MEMORY_GROWTH_BOUND_KIB: u64 = 128 * 1024;
const BOUNDS: [&str; 6] =
    ["body_bytes", "long_polls", "coordinator", "push_journal", "partition_writer", "group_leases"];

/// A field of `/proc/<pid>/status`, in KiB.
fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the broker's status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

#[derive(Default)]
struct Outcomes {
    /// Transaction ids of the pushes answered 201.
    accepted: BTreeSet<String>,
    /// Refused pushes (503 or 429).
    refused: usize,
}

#[tokio::test]
async fn a_broker_pushed_past_what_it_can_commit_refuses_work_and_stays_within_its_memory_bound() {
    let db = TestDatabase::create("e2e_overload").await;
    let bytes_in_flight = BODY_BYTES_IN_FLIGHT.to_string();
    let settings = [
        ("QUEEN_LIMITS__BODY_BYTES_IN_FLIGHT", bytes_in_flight.as_str()),
        ("QUEEN_HTTP__MAX_BODY_BYTES", "1048576"),
        ("QUEEN_PUSH__WRITER_MAILBOX", "4"),
    ];
    let broker = BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &settings).await;
    let (base, pid) = (broker.url(), broker.pid().expect("the broker runs"));
    // A fresh connection for every push: on a loaded machine this test's one thread can leave a
    // kept-alive connection idle past the broker's keep-alive (5 s), and the broker then closes
    // it just as the next push is written on it. That is the client's race, not a push the
    // broker failed to answer, which is what the test looks for.
    let http =
        queen_testkit::http().timeout(Duration::from_secs(120)).pool_max_idle_per_host(0).build().expect("a client");
    // Warm up (the first push creates the queue), then take the broker's size before the load.
    let first = json!({"items": [{"queue": "overload", "partition": "p0", "transactionId": "warm-up", "payload": 0}]});
    assert_eq!(http.post(format!("{base}/api/v1/push")).json(&first).send().await.expect("push").status(), 201);
    let before = memory_kib(pid, "VmRSS");

    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    outcomes.lock().await.accepted.insert("warm-up".into());
    let payload = Arc::new("x".repeat(PAYLOAD_BYTES));
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let (http, base, outcomes, payload) = (http.clone(), base.clone(), Arc::clone(&outcomes), Arc::clone(&payload));
        producers.push(tokio::spawn(async move {
            for push in 0..PUSHES_EACH {
                let ids: Vec<String> = (0..ITEMS).map(|i| format!("p{p}-{push}-{i}")).collect();
                let items: Vec<Value> = ids
                    .iter()
                    .map(|id| json!({"queue": "overload", "partition": format!("p{}", p % 4), "transactionId": id, "payload": *payload}))
                    .collect();
                let answer = http.post(format!("{base}/api/v1/push")).json(&json!({"items": items})).send().await;
                let answer = answer.expect("the broker answers every push");
                let status = answer.status();
                let retry_after = answer.headers().get("retry-after").map(|v| v.as_bytes().to_vec());
                let body: Value = answer.json().await.expect("a JSON answer");
                let mut outcomes = outcomes.lock().await;
                match status {
                    StatusCode::CREATED => {
                        assert!(body.as_array().is_some_and(|r| r.iter().all(|r| r["status"] == "queued")), "{body}");
                        outcomes.accepted.extend(ids);
                    }
                    StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
                        assert_eq!(body["code"], "overloaded", "{body}");
                        assert_eq!(retry_after.as_deref(), Some(&b"1"[..]), "a refusal says when to retry");
                        outcomes.refused += 1;
                    }
                    other => panic!("push answered {other}: {body}"),
                }
            }
        }));
    }
    for producer in producers {
        producer.await.expect("a producer");
    }
    let peak = memory_kib(pid, "VmHWM");

    let outcomes = outcomes.lock().await;
    assert!(outcomes.refused > 0, "no push was refused: the broker queued everything");
    assert!(outcomes.accepted.len() > 1, "the broker took no push under load");
    let mut counted = 0.0;
    for bound in BOUNDS {
        counted += metric_at(&http, &base, &format!("queen_overload_refusals_total{{bound=\"{bound}\"}}")).await;
    }
    assert_eq!(counted as usize, outcomes.refused, "every refusal is counted by its bound");

    // Every push answered 201 is in the log, and nothing of a refused one.
    let mut stored = BTreeSet::new();
    loop {
        let popped = http
            .get(format!("{base}/api/v1/pop/queue/overload?batch=100&partitions=4&autoAck=true"))
            .send()
            .await
            .expect("pop");
        if popped.status() == StatusCode::NO_CONTENT {
            break;
        }
        let body: Value = popped.json().await.expect("a pop answer");
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        stored.extend(messages.iter().map(|m| m["transactionId"].as_str().unwrap_or_default().to_owned()));
    }
    let lost: Vec<&String> = outcomes.accepted.difference(&stored).collect();
    assert!(lost.is_empty(), "{} pushes answered 201 are not in the log: {lost:?}", lost.len());
    let extra: Vec<&String> = stored.difference(&outcomes.accepted).collect();
    assert!(extra.is_empty(), "refused pushes were written: {extra:?}");

    let growth = peak.saturating_sub(before);
    eprintln!(
        "{} pushes taken, {} refused; resident memory {before} KiB before the load, peak {peak} KiB",
        outcomes.accepted.len() / ITEMS,
        outcomes.refused
    );
    assert!(
        growth < MEMORY_GROWTH_BOUND_KIB,
        "the broker grew by {growth} KiB under load (bound {MEMORY_GROWTH_BOUND_KIB} KiB; {before} KiB before, peak {peak} KiB)"
    );
}
