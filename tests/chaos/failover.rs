//! Failover to a standby under load: the standby falls a second behind, the primary is stopped
//! hard and the standby promoted; the brokers find the new primary through their multi-host URL
//! (`target_session_attrs=read-write`) by themselves.

use std::time::{Duration, Instant};

use queen_testkit::BrokerProcess;
use reqwest::StatusCode;
use serde_json::json;

use crate::cluster::{DATABASE, Pair, Replication};
use crate::load::{Plan, Workload};
use crate::support::{assert_running, start_brokers};

/// The reconnection bound the brokers must meet after a promotion.
const RECONNECT_BOUND: Duration = Duration::from_secs(10);

/// How long the standby is kept behind before the primary fails.
const STANDBY_LAG: Duration = Duration::from_secs(1);

/// What one failover run measured.
struct Failover {
    /// Per broker: from the promotion to its first acknowledged push.
    reconnect: Vec<Duration>,
    /// Acknowledged pushes missing after the failover.
    lost: Vec<String>,
    /// Pushes acknowledged while the standby was kept behind (including answers under way when
    /// it began, whose commits it had received).
    acknowledged_while_behind: usize,
    acknowledged: usize,
}

async fn fail_over(replication: Replication) -> Failover {
    let label = format!("failover_{replication:?}").to_lowercase();
    let pair = Pair::start(&label, replication).await;
    let mut brokers = start_brokers(&pair.url(), 2, &[]).await;
    let bases: Vec<String> = brokers.iter().map(BrokerProcess::url).collect();
    let workload = Workload::start(Plan::new(bases.clone(), "failover")).await;
    workload.until_acknowledged(300, Duration::from_secs(60)).await;

    // The standby falls behind (as over a slow network) and the primary fails: what it
    // acknowledged meanwhile exists only on it. With synchronous replication a commit waits for
    // the standby, so nothing can be acknowledged meanwhile.
    pair.stall_standby().await;
    let replicated = workload.ledger().acknowledged_ids();
    tokio::time::sleep(STANDBY_LAG).await;
    pair.primary.kill().await;
    pair.cut_replication();
    let acknowledged_while_behind = workload.ledger().acknowledged_count() - replicated.len();
    pair.standby.promote().await;
    let promoted = Instant::now();
    let http = queen_testkit::http().timeout(Duration::from_secs(5)).build().expect("a client");
    let mut reconnect = Vec::new();
    for (b, base) in bases.iter().enumerate() {
        for attempt in 0.. {
            let probe =
                json!({"items": [{"queue": "probe", "transactionId": format!("b{b}-{attempt}"), "payload": 1}]});
            let answer = http.post(format!("{base}/api/v1/push")).json(&probe).send().await;
            if answer.is_ok_and(|answer| answer.status() == StatusCode::CREATED) {
                break;
            }
            assert!(promoted.elapsed() < Duration::from_secs(60), "broker {b} never wrote to the new primary");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        reconnect.push(promoted.elapsed());
    }
    let new_primary = pair.standby.connect(DATABASE).await;
    // Both brokers listen again, on the new primary.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listening: i64 = new_primary
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'queen-listen'",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        if listening == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the brokers did not LISTEN on the new primary ({listening})");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Consumers resume: more is pushed and everything is consumed.
    workload.until_acknowledged(200, Duration::from_secs(60)).await;
    let ledger = workload.finish(&new_primary, Duration::from_secs(90)).await;
    // Sent after the promotion, a push can only have been written on the new primary.
    let sent_after_promotion = ledger.acknowledged_ids_sent_since(promoted);
    let summary = ledger.summary();
    println!("failover ({replication:?}): {summary}");
    let acknowledged = summary.acknowledged;
    let lost = match replication {
        Replication::Synchronous => {
            ledger.verify(&new_primary).await;
            Vec::new()
        }
        Replication::Asynchronous => ledger.verify_allowing_loss(&new_primary).await,
    };
    let wrongly_lost: Vec<&String> = lost.iter().filter(|id| replicated.contains(*id)).collect();
    assert!(wrongly_lost.is_empty(), "pushes the standby had received were lost: {wrongly_lost:?}");
    // Nor is one the new primary took (served over by cached segments of the old one, say).
    let lost_after: Vec<&String> = lost.iter().filter(|id| sent_after_promotion.contains(*id)).collect();
    assert!(lost_after.is_empty(), "pushes acknowledged after the promotion were lost: {lost_after:?}");
    assert_running(&mut brokers).await;
    Failover { reconnect, lost, acknowledged_while_behind, acknowledged }
}

impl Failover {
    /// Prints what was measured, and checks the reconnection bound.
    fn report(&self, replication: Replication) {
        println!(
            "failover ({replication:?} standby {STANDBY_LAG:?} behind): brokers wrote again {:?} after the \
             promotion; {} pushes acknowledged, {} of them while the standby was behind, {} lost",
            self.reconnect,
            self.acknowledged,
            self.acknowledged_while_behind,
            self.lost.len()
        );
        for (b, took) in self.reconnect.iter().enumerate() {
            assert!(*took < RECONNECT_BOUND, "broker {b} took {took:?} to reach the new primary");
        }
    }
}

#[tokio::test]
async fn failover_to_a_synchronous_standby_loses_no_acknowledged_push() {
    fail_over(Replication::Synchronous).await.report(Replication::Synchronous);
}

/// With asynchronous replication, the pushes acknowledged inside the replication lag are lost
/// with the primary, and only those; every other promise holds. The standby is held a second
/// behind so that the lag is measurable on loopback; the count is reported (see README).
#[tokio::test]
async fn failover_to_a_lagging_asynchronous_standby_loses_only_what_it_had_not_received() {
    let run = fail_over(Replication::Asynchronous).await;
    run.report(Replication::Asynchronous);
    assert!(!run.lost.is_empty(), "acknowledged pushes the standby never received cannot survive it");
}

/// How soon a push whose commit waits on a silent synchronous standby is answered: twice the 5 s
/// floor of the broker's bound on an append, and slack for two busy cores.
const SILENT_STANDBY_BOUND: Duration = Duration::from_secs(15);

/// A synchronous standby that stops answering: PostgreSQL never times out a commit, so without a
/// bound of the broker's own a push would wait for as long as the standby stays silent. It is
/// answered 503 instead (whether it was stored is unknown), and once the standby answers again
/// the push sent again is stored once.
#[tokio::test]
async fn a_push_whose_commit_waits_on_a_silent_standby_is_answered_503_and_stored_once() {
    let pair = Pair::start("silent_standby", Replication::Synchronous).await;
    let envs = [("QUEEN_DATABASE__STATEMENT_TIMEOUT_MS", "1000"), ("QUEEN_DATABASE__LOCK_TIMEOUT_MS", "1000")];
    let mut brokers = start_brokers(&pair.url(), 1, &envs).await;
    let url = format!("{}/api/v1/push", brokers[0].url());
    let http = queen_testkit::http().timeout(Duration::from_secs(60)).build().expect("a client");
    let push = |id: &str| {
        let item = json!({"queue": "silent", "partition": "p", "transactionId": id, "payload": id});
        http.post(&url).json(&json!({ "items": [item] })).send()
    };
    assert_eq!(push("before").await.expect("an answer").status(), StatusCode::CREATED);

    pair.stall_standby().await;
    let sent = Instant::now();
    let stalled = push("during").await.expect("an answer, not the client giving up");
    let took = sent.elapsed();
    assert_eq!(stalled.status(), StatusCode::SERVICE_UNAVAILABLE, "{:?}", stalled.text().await);
    assert!(took < SILENT_STANDBY_BOUND, "answered after {took:?}");

    // The standby answers again, and the commit it held goes through.
    pair.resume_standby();
    let primary = pair.primary.connect(DATABASE).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let again = loop {
        let answer = push("during").await.expect("an answer");
        if answer.status() == StatusCode::CREATED {
            break answer.json::<serde_json::Value>().await.expect("JSON");
        }
        assert!(Instant::now() < deadline, "the push never went through: {}", answer.status());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let status = again[0]["status"].as_str().unwrap_or_default().to_owned();
    assert!(status == "duplicate" || status == "queued", "{again}");
    let stored: i64 = primary
        .query_one("SELECT count(*) FROM queen.log_message_ids WHERE transaction_id = 'during'", &[])
        .await
        .expect("a count")
        .get(0);
    assert_eq!(stored, 1, "stored once, whether the first commit went through or not");
    assert_running(&mut brokers).await;
}
