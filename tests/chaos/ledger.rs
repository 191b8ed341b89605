//! The per-message ledger: what producers were told and what consumers were given, checked
//! against each other and against the database once the faults are over.
//!
//! The promises it checks:
//! - every push answered `queued` or `duplicate` is stored, once (a retry with the same
//!   transaction id never makes a second copy), and nothing is stored that was not pushed;
//! - every stored message is delivered to every group, with the payload it was pushed with, and
//!   committed once: a group gets a message again only after a delivery whose ack did not
//!   succeed (cut by the fault, or its lease lost), never after a successful one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::Value;
use tokio_postgres::Client;

/// What one group saw of one message.
#[derive(Debug, Default, Clone)]
struct Seen {
    deliveries: u32,
    /// Acks that committed the message (`success` and not `noop`).
    commits: u32,
    /// Deliveries whose ack did not succeed: no answer, an error, or `success: false`.
    cut: u32,
    /// Deliveries after the message was committed by a successful ack.
    after_commit: u32,
    /// Payloads delivered that differ from the one pushed.
    wrong_payload: u32,
}

#[derive(Debug, Default)]
struct State {
    /// Transaction id → payload, for every push a producer sent (answered or not).
    attempted: HashMap<String, Value>,
    /// Transaction id → when the request that was answered `queued` or `duplicate` was sent.
    acknowledged: HashMap<String, Instant>,
    /// Deliveries of transaction ids no producer pushed.
    unknown: Vec<String>,
    /// (group, transaction id) → what the group saw.
    seen: HashMap<(String, String), Seen>,
}

/// A message as a consumer was given it.
#[derive(Debug, Clone)]
pub struct Delivered {
    pub transaction_id: String,
    pub partition_id: String,
    pub lease_id: Option<String>,
}

/// How the ack of one delivered message ended, as the consumer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckSeen {
    /// `success: true`, `noop: false`: this ack moved the cursor.
    Committed,
    /// `success: true`, `noop: true`: already committed (an earlier ack whose answer was lost).
    Noop,
    /// No answer, an error status, or `success: false`.
    Cut,
}

/// The ledger of one queue's messages and the groups that consume it.
#[derive(Debug)]
pub struct Ledger {
    queue: &'static str,
    groups: Vec<&'static str>,
    state: Mutex<State>,
}

impl Ledger {
    pub fn new(queue: &'static str, groups: Vec<&'static str>) -> Ledger {
        Ledger { queue, groups, state: Mutex::default() }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A producer is about to send `transaction_id` with `payload` (first try or a retry).
    pub fn attempted(&self, transaction_id: &str, payload: &Value) {
        self.state().attempted.entry(transaction_id.to_owned()).or_insert_with(|| payload.clone());
    }

    /// The broker answered the push of `transaction_id`, sent at `sent`, with `queued` or
    /// `duplicate`.
    pub fn acknowledged(&self, transaction_id: &str, sent: Instant) {
        self.state().acknowledged.entry(transaction_id.to_owned()).or_insert(sent);
    }

    /// The transaction ids acknowledged so far.
    pub fn acknowledged_ids(&self) -> HashSet<String> {
        self.state().acknowledged.keys().cloned().collect()
    }

    /// The pushes acknowledged by a request sent at `since` or later. A request sent earlier may
    /// be answered later, and its transaction may have begun before a fault did.
    pub fn acknowledged_ids_sent_since(&self, since: Instant) -> HashSet<String> {
        self.state().acknowledged.iter().filter(|(_, sent)| **sent >= since).map(|(id, _)| id.clone()).collect()
    }

    pub fn acknowledged_count(&self) -> usize {
        self.state().acknowledged.len()
    }

    /// `group` was given `message` (a pop answer's item).
    pub fn delivered(&self, group: &str, message: &Value) -> Delivered {
        let transaction_id = message["transactionId"].as_str().unwrap_or_default().to_owned();
        let mut state = self.state();
        let expected = state.attempted.get(&transaction_id).cloned();
        if expected.is_none() {
            state.unknown.push(transaction_id.clone());
        }
        let seen = state.seen.entry((group.to_owned(), transaction_id.clone())).or_default();
        seen.deliveries += 1;
        if seen.commits > 0 {
            seen.after_commit += 1;
        }
        if expected.is_some_and(|payload| payload != message["data"]) {
            seen.wrong_payload += 1;
        }
        Delivered {
            transaction_id,
            partition_id: message["partitionId"].as_str().unwrap_or_default().to_owned(),
            lease_id: message["leaseId"].as_str().map(str::to_owned),
        }
    }

    /// How the ack of a delivery of `transaction_id` to `group` ended.
    pub fn ack(&self, group: &str, transaction_id: &str, outcome: AckSeen) {
        let mut state = self.state();
        let seen = state.seen.entry((group.to_owned(), transaction_id.to_owned())).or_default();
        match outcome {
            AckSeen::Committed => seen.commits += 1,
            AckSeen::Noop => {}
            AckSeen::Cut => seen.cut += 1,
        }
    }

    /// Counts of what was recorded, for the test's report.
    pub fn summary(&self) -> Summary {
        let state = self.state();
        Summary {
            attempted: state.attempted.len(),
            acknowledged: state.acknowledged.len(),
            deliveries: state.seen.values().map(|seen| u64::from(seen.deliveries)).sum(),
            redeliveries: state.seen.values().map(|seen| u64::from(seen.deliveries.saturating_sub(1))).sum(),
        }
    }

    /// Checks every promise against the queue's database, read through `db`; panics with every
    /// violation found.
    pub async fn verify(&self, db: &Client) {
        self.check(db, Acks::Durable).await;
    }

    async fn check(&self, db: &Client, acks: Acks) {
        let stored = stored_messages(db, self.queue).await;
        let copies = extra_copies(db, self.queue).await;
        let state = self.state();
        let mut report = String::new();
        let lost: Vec<&String> = state.acknowledged.keys().filter(|id| !stored.contains_key(*id)).collect();
        let foreign: Vec<&String> = stored.keys().filter(|id| !state.attempted.contains_key(*id)).collect();
        note(&mut report, "acknowledged pushes that are not stored", &lost);
        note(&mut report, "stored messages no producer pushed", &foreign);
        note(&mut report, "partitions with more frames than messages (two copies)", &copies);
        note(&mut report, "deliveries of messages no producer pushed", &state.unknown);
        for group in &self.groups {
            let mut missing = Vec::new();
            let mut twice = Vec::new();
            let mut unexplained = Vec::new();
            let mut wrong = Vec::new();
            for id in stored.keys() {
                let seen = state.seen.get(&((*group).to_owned(), id.clone())).cloned().unwrap_or_default();
                if seen.deliveries == 0 {
                    missing.push(id);
                }
                if acks == Acks::Durable && (seen.commits > 1 || seen.after_commit > 0) {
                    twice.push(format!("{id} ({seen:?})"));
                }
                // Each delivery after the first follows one whose ack did not succeed.
                if acks == Acks::Durable && seen.deliveries > seen.cut + 1 {
                    unexplained.push(format!("{id} ({seen:?})"));
                }
                if seen.wrong_payload > 0 {
                    wrong.push(id);
                }
            }
            note(&mut report, &format!("group {group}: stored messages never delivered"), &missing);
            note(&mut report, &format!("group {group}: messages committed twice or delivered after a commit"), &twice);
            note(&mut report, &format!("group {group}: redeliveries with no failed ack before them"), &unexplained);
            note(&mut report, &format!("group {group}: deliveries with another payload than pushed"), &wrong);
        }
        assert!(report.is_empty(), "the ledger does not balance:\n{report}");
    }

    /// As [`Ledger::verify`] after a failover to a standby that may have missed the last
    /// acknowledged pushes and acks (asynchronous replication): lost pushes are counted, not
    /// failed, and a message may be committed again when its first commit was lost; every other
    /// promise is checked on what is stored. Returns the acknowledged pushes that were lost.
    pub async fn verify_allowing_loss(&self, db: &Client) -> Vec<String> {
        let stored = stored_messages(db, self.queue).await;
        let lost: Vec<String> = {
            let mut state = self.state();
            let lost: Vec<String> = state.acknowledged.keys().filter(|id| !stored.contains_key(*id)).cloned().collect();
            for id in &lost {
                state.acknowledged.remove(id);
            }
            // What the lost primary delivered is gone with it: only what is stored is checked.
            state.seen.retain(|(_, id), _| stored.contains_key(id));
            lost
        };
        self.check(db, Acks::MayBeLost).await;
        lost
    }
}

/// Whether a successful ack is known to last (so a redelivery after it is a violation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acks {
    Durable,
    MayBeLost,
}

/// The counts [`Ledger::summary`] reports.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub attempted: usize,
    pub acknowledged: usize,
    pub deliveries: u64,
    pub redeliveries: u64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Summary { attempted, acknowledged, deliveries, redeliveries } = self;
        write!(
            f,
            "{attempted} messages pushed, {acknowledged} acknowledged; {deliveries} deliveries, {redeliveries} of them again"
        )
    }
}

fn note(report: &mut String, what: &str, items: &[impl std::fmt::Display]) {
    if items.is_empty() {
        return;
    }
    let sample: Vec<String> = items.iter().take(20).map(ToString::to_string).collect();
    let _ = writeln!(
        report,
        "- {what}: {} ({}{})",
        items.len(),
        sample.join(", "),
        if items.len() > 20 { ", ..." } else { "" }
    );
}

/// Transaction id → partition name of every message stored in `queue`.
async fn stored_messages(db: &Client, queue: &str) -> BTreeMap<String, String> {
    db.query(
        "SELECT m.transaction_id, p.name FROM queen.log_message_ids m
           JOIN queen.partitions p ON p.id = m.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE q.name = $1",
        &[&queue],
    )
    .await
    .expect("the stored message ids")
    .iter()
    .map(|row| (row.get(0), row.get(1)))
    .collect()
}

/// Partitions of `queue` whose segments hold another number of frames than it has message ids
/// (a second copy of a message would show here).
pub async fn extra_copies(db: &Client, queue: &str) -> Vec<String> {
    db.query(
        "SELECT p.name || ': ' || frames || ' frames, ' || ids || ' ids'
           FROM queen.partitions p
           JOIN queen.queues q ON q.id = p.queue_id
           CROSS JOIN LATERAL (SELECT coalesce(sum(frame_count), 0) AS frames FROM queen.log_segments s WHERE s.partition_id = p.id) f
           CROSS JOIN LATERAL (SELECT count(*) AS ids FROM queen.log_message_ids m WHERE m.partition_id = p.id) i
          WHERE q.name = $1 AND frames <> ids",
        &[&queue],
    )
    .await
    .expect("frames and ids per partition")
    .iter()
    .map(|row| row.get(0))
    .collect()
}

/// Whether every group of `groups` has committed everything stored in `queue`.
pub async fn all_consumed(db: &Client, queue: &str, groups: &[&str]) -> Result<bool, tokio_postgres::Error> {
    let groups: Vec<String> = groups.iter().map(|&g| g.to_owned()).collect();
    let row = db
        .query_one(
            "SELECT count(*) FILTER (WHERE c.committed IS NULL OR c.committed < p.last_offset)
               FROM queen.partitions p
               JOIN queen.queues q ON q.id = p.queue_id
               CROSS JOIN unnest($2::text[]) AS g(name)
               LEFT JOIN queen.log_consumers c ON c.partition_id = p.id AND c.consumer_group = g.name
              WHERE q.name = $1 AND p.last_offset > 0",
            &[&queue, &groups],
        )
        .await?;
    Ok(row.get::<_, i64>(0) == 0)
}
