//! Timers: messages scheduled for later. Scheduling, rescheduling and cancelling change rows of
//! `queen.timers` (in one transaction per batch, or in a transaction bundle's); the sweeper
//! (`crate::services::timers`) delivers due timers through [`fire_due`], which appends them the
//! way a transaction's pushes are appended (dedup, encryption, `maxSize`, creation limits, the
//! announcement that wakes long polls) and deletes them in the same transaction as their append.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use queen_store::StoreError;
use queen_store::log::{Appended, Destination, append_in_transaction};
use queen_store::queues::{self, Queue};
use queen_store::timers::{self, Cancelled, ClaimedTimer, NewTimer, RetryPolicy, Scheduled, StoredTimer, TimerKey};
use uuid::Uuid;

use super::push::{Admission, PushItem, append_policy, resolve, shares_of};
use super::{Broker, BrokerError};
use crate::actors::coordinator::DataAvailable;

/// Most timers one claim of a sweep takes.
pub const SWEEP_BATCH: usize = 256;

/// How long a claim keeps other sweepers (and cancels) off a timer: far longer than delivering a
/// batch takes. A broker that dies holding claims delays their timers by at most this much.
const CLAIM_MS: i64 = 30_000;

/// The wait after a timer's first failed delivery; it doubles with each failure after, up to
/// [`MAX_BACKOFF_MS`].
const FIRST_BACKOFF_MS: i64 = 1_000;
const MAX_BACKOFF_MS: i64 = 60_000;

/// A timer to schedule: a push that waits until it is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleTimer {
    pub queue: String,
    pub timer_key: String,
    pub partition: String,
    /// The delivered message's transaction id.
    pub txn: String,
    /// The message's data as JSON text (sealed by [`seal_payloads`] for an encrypted queue).
    pub payload: Vec<u8>,
    /// From now; 0 or less is due at once.
    pub delay_ms: i64,
    /// `producerSub`: the scheduling token's subject with auth on, else none.
    pub producer: Option<String>,
}

/// A pending timer to cancel; with `txn`, only if it is the timer of that txn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelTimer {
    pub queue: String,
    pub timer_key: String,
    pub txn: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimerOp {
    Schedule(ScheduleTimer),
    Cancel(CancelTimer),
}

impl TimerOp {
    pub fn queue(&self) -> &str {
        match self {
            TimerOp::Schedule(op) => &op.queue,
            TimerOp::Cancel(op) => &op.queue,
        }
    }

    fn key(&self) -> (&str, &str) {
        match self {
            TimerOp::Schedule(op) => (&op.queue, &op.timer_key),
            TimerOp::Cancel(op) => (&op.queue, &op.timer_key),
        }
    }
}

/// What one timer operation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimerOutcome {
    /// No timer was pending under the key; this one is.
    Scheduled {
        txn: String,
        message_id: Uuid,
        deliver_at: DateTime<Utc>,
    },
    /// It replaced the timer pending under the key.
    Rescheduled {
        txn: String,
        message_id: Uuid,
        deliver_at: DateTime<Utc>,
    },
    Cancelled {
        txn: String,
    },
    /// Nothing is pending under the key (it may have been delivered); `txn` as the caller named it.
    Absent {
        txn: Option<String>,
    },
    /// The timer under the key is being delivered; nothing changed. `txn` is that timer's.
    TooLate {
        txn: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerResult {
    pub queue: String,
    pub timer_key: String,
    pub outcome: TimerOutcome,
}

/// Applies the operations in one transaction, within [`Broker::write_within`]'s bound; one
/// result per operation, in their order.
pub async fn apply(broker: &Broker, mut ops: Vec<TimerOp>) -> Result<Vec<TimerResult>, BrokerError> {
    seal_payloads(broker, &mut ops).await?;
    let applying = async |client: &mut deadpool_postgres::Object| -> Result<Vec<TimerResult>, BrokerError> {
        let tx = client.transaction().await.map_err(StoreError::from)?;
        let results = apply_in(&tx, &ops).await?;
        tx.commit().await.map_err(|e| StoreError::from(e).of_commit("a timer commit"))?;
        Ok(results)
    };
    let results = broker.write_within("a timers batch", applying).await?.1?;
    wake_sweeper(broker, &ops, &results);
    Ok(results)
}

/// Seals the payloads of timers for encrypted queues, as they are then stored (a broker without
/// the key refuses, rather than store plain text). A queue that does not exist yet is not
/// encrypted: it will be created with default options.
pub(super) async fn seal_payloads(broker: &Broker, ops: &mut [TimerOp]) -> Result<(), BrokerError> {
    let mut encrypted: HashMap<String, bool> = HashMap::new();
    for op in ops {
        let TimerOp::Schedule(timer) = op else { continue };
        let seal = match encrypted.get(&timer.queue) {
            Some(&seal) => seal,
            None => {
                let queue = broker.names.queue(&broker.pool, &timer.queue).await?;
                let seal = queue.is_some_and(|queue| queue.options.encryption_enabled);
                encrypted.insert(timer.queue.clone(), seal);
                seal
            }
        };
        if seal {
            let cipher = broker.cipher.as_ref().ok_or_else(|| StoreError::NoEncryptionKey {
                subject: format!("queue {:?} (a timer's payload)", timer.queue),
            })?;
            timer.payload = cipher.seal(&timer.payload).map_err(StoreError::from)?;
        }
    }
    Ok(())
}

/// Applies the operations in the caller's transaction. They lock their rows in key order,
/// whatever their order in the request, as every transaction that locks several timers does.
pub(super) async fn apply_in(
    tx: &deadpool_postgres::Transaction<'_>,
    ops: &[TimerOp],
) -> Result<Vec<TimerResult>, StoreError> {
    let mut order: Vec<usize> = (0..ops.len()).collect();
    order.sort_by(|&a, &b| ops[a].key().cmp(&ops[b].key()));
    let mut outcomes = vec![None; ops.len()];
    for i in order {
        outcomes[i] = Some(match &ops[i] {
            TimerOp::Schedule(timer) => schedule_one(tx, timer).await?,
            TimerOp::Cancel(cancel) => cancel_one(tx, cancel).await?,
        });
    }
    Ok(ops
        .iter()
        .zip(outcomes)
        .filter_map(|(op, outcome)| {
            let (queue, timer_key) = op.key();
            outcome.map(|outcome| TimerResult { queue: queue.to_owned(), timer_key: timer_key.to_owned(), outcome })
        })
        .collect())
}

async fn schedule_one(
    client: &impl deadpool_postgres::GenericClient,
    timer: &ScheduleTimer,
) -> Result<TimerOutcome, StoreError> {
    let new = NewTimer {
        queue: &timer.queue,
        timer_key: &timer.timer_key,
        partition: &timer.partition,
        txn: &timer.txn,
        message_id: queen_log::new_message_id(),
        payload: &timer.payload,
        producer: timer.producer.as_deref(),
        delay_ms: timer.delay_ms,
    };
    let txn = timer.txn.clone();
    Ok(match timers::schedule(client, &new).await? {
        Scheduled::Created { message_id, deliver_at } => TimerOutcome::Scheduled { txn, message_id, deliver_at },
        Scheduled::Replaced { message_id, deliver_at } => TimerOutcome::Rescheduled { txn, message_id, deliver_at },
        Scheduled::BeingDelivered { txn } => TimerOutcome::TooLate { txn },
    })
}

async fn cancel_one(
    client: &impl deadpool_postgres::GenericClient,
    cancel: &CancelTimer,
) -> Result<TimerOutcome, StoreError> {
    Ok(match timers::cancel(client, &cancel.queue, &cancel.timer_key, cancel.txn.as_deref()).await? {
        Cancelled::Cancelled { txn } => TimerOutcome::Cancelled { txn },
        Cancelled::Absent => TimerOutcome::Absent { txn: cancel.txn.clone() },
        Cancelled::BeingDelivered { txn } => TimerOutcome::TooLate { txn },
    })
}

/// Tells this broker's sweeper when the earliest timer the committed operations scheduled is due,
/// so it is delivered then rather than at the sweeper's next idle probe.
pub(super) fn wake_sweeper(broker: &Broker, ops: &[TimerOp], results: &[TimerResult]) {
    let earliest = ops
        .iter()
        .zip(results)
        .filter_map(|(op, result)| match (op, &result.outcome) {
            (TimerOp::Schedule(timer), TimerOutcome::Scheduled { .. } | TimerOutcome::Rescheduled { .. }) => {
                Some(timer.delay_ms.max(0))
            }
            _ => None,
        })
        .min();
    if let Some(delay_ms) = earliest {
        broker.timer_alarm.set(Instant::now() + Duration::from_millis(delay_ms.unsigned_abs()));
    }
}

/// Cancels a pending timer (the `DELETE` route), in a statement of its own.
pub async fn cancel(broker: &Broker, cancel: CancelTimer) -> Result<TimerResult, BrokerError> {
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    let outcome = cancel_one(&client, &cancel).await?;
    Ok(TimerResult { queue: cancel.queue, timer_key: cancel.timer_key, outcome })
}

/// The pending timer of the key, as stored.
pub async fn find(broker: &Broker, queue: &str, timer_key: &str) -> Result<Option<StoredTimer>, BrokerError> {
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    Ok(timers::find(&client, queue, timer_key).await?)
}

/// Up to `limit` pending timers of the queue in key order after `after` (fewer once their
/// payloads reach `pop.max_answer_bytes`, at least one), and whether more follow.
pub async fn list(
    broker: &Broker,
    queue: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<StoredTimer>, bool), BrokerError> {
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    let max_bytes = i64::try_from(broker.config.pop.max_answer_bytes).unwrap_or(i64::MAX);
    Ok(timers::list(&client, queue, after, limit as i64, max_bytes).await?)
}

/// How long until the earliest timer a sweeper may take is due (zero when one is due now); `None`
/// when no timer waits.
pub async fn next_due(broker: &Broker) -> Result<Option<Duration>, BrokerError> {
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    let due_in_ms = timers::next_due_in_ms(&client).await?;
    Ok(due_in_ms.map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0)))
}

/// What one [`fire_due`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub claimed: usize,
    pub delivered: usize,
    pub failed: usize,
}

/// A claimed timer on its way to its partition.
struct Firing {
    key: TimerKey,
    /// The message it becomes (its payload opened).
    item: PushItem,
    /// Its payload was stored sealed: its queue was encrypted when it was scheduled.
    sealed: bool,
}

/// Claims up to [`SWEEP_BATCH`] due timers (within `push.max_segment_bytes` of payloads, at least
/// one) and delivers them, one transaction per destination
/// partition that appends the partition's timers (each with its txn as transaction id) and
/// deletes them. A timer that cannot be delivered (its queue full or not creatable, its payload
/// unreadable here, ...) is kept, its failed attempt counted with the error, and tried again
/// later. Fails only when the database does: the claims then lapse and the timers are claimed
/// again.
///
/// One partition per transaction: a delivery then holds one partition lock at a time, as a
/// partition writer does, and cannot deadlock with pops and bundles that lock several.
pub async fn fire_due(broker: &Broker) -> Result<Swept, BrokerError> {
    let token = Uuid::now_v7();
    let claimed = {
        let client = broker.pool.get().await.map_err(StoreError::from)?;
        // A sweep's timers of one partition become one segment: bounded by bytes as pushes
        // fused into one are.
        let max_bytes = i64::try_from(broker.config.push.max_segment_bytes).unwrap_or(i64::MAX);
        timers::claim(&client, token, CLAIM_MS, SWEEP_BATCH as i64, max_bytes).await?
    };
    if claimed.is_empty() {
        return Ok(Swept::default());
    }
    let mut failures: Vec<(TimerKey, String)> = Vec::new();
    let mut firing = Vec::with_capacity(claimed.len());
    for timer in claimed.iter().cloned() {
        let key: TimerKey = (timer.queue.clone(), timer.timer_key.clone());
        let sealed = queen_log::is_sealed(&timer.payload);
        match queen_store::log::opened(&timer.payload, broker.cipher.as_deref()) {
            Ok(payload) => {
                let payload = payload.into_owned();
                firing.push(Firing { key, item: message_of(timer, payload), sealed });
            }
            Err(e) => failures.push((key, format!("the payload cannot be opened: {e}"))),
        }
    }

    // Where each timer goes, queue by queue, creating queues and partitions as a push does: a
    // queue that cannot be created fails its own timers, not the others.
    let items: Vec<PushItem> = firing.iter().map(|timer| timer.item.clone()).collect();
    let mut by_partition: BTreeMap<i64, (Arc<Queue>, Vec<usize>)> = BTreeMap::new();
    for share in shares_of(&items) {
        match resolve(broker, std::slice::from_ref(&share), Admission::Checked).await {
            Ok(resolved) => {
                let Some((queue, ids)) = resolved.into_iter().next() else { continue };
                for ((_, indices), partition_id) in share.1.into_iter().zip(ids) {
                    // Scheduled on an encrypted queue that is not encrypted now (deleted and
                    // created again with default options): its payload is not stored in plain.
                    let (plain, kept): (Vec<usize>, Vec<usize>) =
                        indices.into_iter().partition(|&i| firing[i].sealed && !queue.options.encryption_enabled);
                    let refusal = format!(
                        "the timer was scheduled on an encrypted queue, and queue {:?} is not encrypted now: its \
                         payload is not stored in plain text",
                        queue.name
                    );
                    failures.extend(plain.iter().map(|&i| (firing[i].key.clone(), refusal.clone())));
                    if !kept.is_empty() {
                        by_partition.insert(partition_id, (Arc::clone(&queue), kept));
                    }
                }
            }
            Err(e @ (BrokerError::Unavailable(_) | BrokerError::Overloaded(_))) => return Err(e),
            Err(e) => {
                let message = e.to_string();
                let indices = share.1.iter().flat_map(|(_, indices)| indices);
                failures.extend(indices.map(|&i| (firing[i].key.clone(), message.clone())));
            }
        }
    }

    // Counted as each partition's delivery commits: a later partition that fails leaves the
    // counts of those before it.
    let mut swept = Swept { claimed: claimed.len(), ..Swept::default() };
    for (partition_id, (queue, indices)) in by_partition {
        let timers: Vec<&Firing> = indices.iter().map(|&i| &firing[i]).collect();
        let (delivered, failed) = deliver_to_partition(broker, token, &queue, partition_id, &timers).await?;
        broker.metrics.timers_delivered.inc_by(delivered as u64);
        broker.metrics.timer_delivery_failures.inc_by(failed as u64);
        swept.delivered += delivered;
        swept.failed += failed;
    }
    if !failures.is_empty() {
        let client = broker.pool.get().await.map_err(StoreError::from)?;
        let failed = timers::record_failures(&client, token, &failures, retry_policy(broker)).await?;
        broker.metrics.timer_delivery_failures.inc_by(failed.len() as u64);
        swept.failed += failed.len();
        log_failures(&failed, &failures);
    }
    Ok(swept)
}

/// The message a timer becomes.
fn message_of(timer: ClaimedTimer, payload: Vec<u8>) -> PushItem {
    PushItem {
        queue: timer.queue,
        partition: timer.partition,
        transaction_id: timer.txn,
        trace_id: None,
        producer: timer.producer,
        message_id: timer.message_id,
        payload,
        received: None,
    }
}

/// Delivers claimed timers of one partition in one transaction: those still claimed by `token`
/// are locked, appended (as many as a capped queue has room for) and deleted; the others that
/// cannot be appended have a failed attempt counted. How many were delivered and how many failed.
async fn deliver_to_partition(
    broker: &Broker,
    token: Uuid,
    queue: &Queue,
    partition_id: i64,
    timers: &[&Firing],
) -> Result<(usize, usize), BrokerError> {
    let mut client = broker.pool.get().await.map_err(StoreError::from)?;
    let mut tx = client.transaction().await.map_err(StoreError::from)?;
    let keys: Vec<TimerKey> = timers.iter().map(|timer| timer.key.clone()).collect();
    // Claims lost since (to a cancel, a reschedule, or another sweeper after they lapsed) are not
    // this delivery's: their timers are left alone.
    let ours: HashSet<TimerKey> = timers::lock_claimed(&tx, token, &keys).await?.into_iter().collect();
    let mut take: Vec<&Firing> = timers.iter().copied().filter(|timer| ours.contains(&timer.key)).collect();
    let mut failures: Vec<(TimerKey, String)> = Vec::new();
    if queue.options.max_size > 0 {
        // Under the queue's capacity lock, as capped pushes take it (before the partition's).
        queues::lock_capacity(&tx, queue.id).await?;
        let depth = queues::unconsumed_depth(&tx, queue).await?;
        let fits = usize::try_from(queue.options.max_size - depth).unwrap_or(0).min(take.len());
        let over = take.split_off(fits);
        let full = BrokerError::QueueFull {
            queue: queue.name.clone(),
            depth,
            max_size: queue.options.max_size,
            adding: over.len() as i64,
        };
        failures.extend(over.iter().map(|timer| (timer.key.clone(), full.to_string())));
    }
    let mut queued = 0;
    // The payload bytes of what the append took, for the push metrics.
    let mut bytes = 0;
    let mut delivered: Vec<TimerKey> = Vec::new();
    if !take.is_empty() {
        match append(broker, &mut tx, queue, partition_id, &take).await? {
            Ok(count) => {
                queued = count;
                bytes = take.iter().map(|timer| timer.item.payload.len()).sum::<usize>();
                delivered.extend(take.iter().map(|timer| timer.key.clone()));
            }
            Err(error) => failures.extend(take.iter().map(|timer| (timer.key.clone(), error.clone()))),
        }
    }
    timers::delete_delivered(&tx, token, &delivered).await?;
    let failed = timers::record_failures(&tx, token, &failures, retry_policy(broker)).await?;
    tx.commit().await.map_err(StoreError::from)?;
    let duplicates = (delivered.len() - queued) as u64;
    broker.metrics.record_append(&queue.name, queued as u64, duplicates, bytes as u64);
    if queued > 0 {
        broker.announcer.announce(DataAvailable {
            queue: Arc::from(queue.name.as_str()),
            queue_id: queue.id,
            partition_id,
        });
    }
    log_failures(&failed, &failures);
    Ok((delivered.len(), failed.len()))
}

/// Appends the timers' messages under a savepoint, so that a failed append undoes only itself and
/// the transaction goes on to count the failed attempts: how many were new messages, or why the
/// append failed. Fails outright only when the database is unavailable.
async fn append(
    broker: &Broker,
    tx: &mut deadpool_postgres::Transaction<'_>,
    queue: &Queue,
    partition_id: i64,
    timers: &[&Firing],
) -> Result<Result<usize, String>, BrokerError> {
    let policy = match append_policy(broker, queue) {
        Ok(policy) => policy,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let messages: Vec<_> = timers.iter().map(|timer| timer.item.to_message()).collect();
    let destination = Destination { queue_id: queue.id, queue: &queue.name, partition_id };
    let savepoint = tx.transaction().await.map_err(StoreError::from)?;
    match append_in_transaction(&savepoint, destination, &messages, &policy).await {
        Ok(appended) => {
            savepoint.commit().await.map_err(StoreError::from)?;
            Ok(Ok(appended.outcomes.iter().filter(|o| matches!(o, Appended::Queued { .. })).count()))
        }
        // The database away, read-only or out of disk: no fault of the timers, whose attempts are
        // not spent on it (they would be held for good once the outage outlasted them).
        Err(e) if e.is_unavailable() || matches!(e, StoreError::WritesRefused { .. }) => Err(e.into()),
        Err(e) => {
            savepoint.rollback().await.map_err(StoreError::from)?;
            if let StoreError::Missing(_) = e {
                // Deleted since it was resolved: resolve it again next time.
                broker.names.forget_queue(&queue.name);
                if let Some(timer) = timers.first() {
                    broker.names.forget_partition(queue.id, &timer.item.partition);
                }
            }
            Ok(Err(failure_text(&e)))
        }
    }
}

/// What a timer's `lastError` says of a failed append. A statement PostgreSQL refused is named by
/// its SQLSTATE (its text, logged here, stays out of the API).
fn failure_text(e: &StoreError) -> String {
    match e {
        StoreError::Db(db) => {
            tracing::warn!(error = ?db, "a timer's append was refused");
            let code = db.code().map_or("unknown", |code| code.code());
            format!("PostgreSQL refused the append (SQLSTATE {code})")
        }
        other => other.to_string(),
    }
}

fn log_failures(failed: &[timers::FailedTimer], failures: &[(TimerKey, String)]) {
    let errors: HashMap<&TimerKey, &str> = failures.iter().map(|(key, error)| (key, error.as_str())).collect();
    for timer in failed {
        let ((queue, key), error) = (&timer.key, errors.get(&timer.key).copied().unwrap_or_default());
        if timer.held {
            tracing::error!(
                queue,
                key,
                attempts = timer.attempts,
                error,
                "a timer's delivery attempts are spent: it is held until rescheduled"
            );
        } else {
            tracing::warn!(
                queue,
                key,
                attempts = timer.attempts,
                error,
                "a timer could not be delivered; it will be tried again"
            );
        }
    }
}

fn retry_policy(broker: &Broker) -> RetryPolicy {
    RetryPolicy {
        max_attempts: i32::try_from(broker.config.timers.max_attempts).unwrap_or(i32::MAX),
        first_backoff_ms: FIRST_BACKOFF_MS,
        max_backoff_ms: MAX_BACKOFF_MS,
    }
}
