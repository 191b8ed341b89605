//! Transactions: acknowledgements and pushes applied in one PostgreSQL transaction, all or
//! nothing (the seeds' "chain the stages": ack stage one, push stage two).

use std::collections::BTreeMap;
use std::sync::Arc;

use queen_store::StoreError;
use queen_store::ack_rules::AckVerdict;
use queen_store::cursors::{AckOutcome, AckRequest};
use queen_store::log::{Appended, Destination, NewMessage, append_in_transaction};
use queen_store::queues::{self, Queue};

use super::Broker;
use super::BrokerError;
use super::ack::refusal_text;
use super::kv::{self, Outcome};
use super::push::{PushItem, Pushed, QueueShare, append_policy, shares_of, wanted_of};
use super::timers::{self, TimerOp, TimerResult};
use crate::actors::coordinator::DataAvailable;

/// One operation of a bundle, in the caller's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    Ack(AckRequest),
    Push(Vec<PushItem>),
}

/// A transaction as received: its operations in the caller's order, and the leases it requires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub operations: Vec<Operation>,
    /// Every one must be live when the bundle commits; acks that name no lease of their own are
    /// fenced by them.
    pub required_leases: Vec<uuid::Uuid>,
    /// The `kv` rider: key/value operations applied in the same PostgreSQL transaction.
    pub kv: Option<kv::Batch>,
    /// The `timers` rider: timers scheduled and cancelled in the same PostgreSQL transaction.
    pub timers: Vec<TimerOp>,
}

/// What one entry of the results (every ack and every pushed item, in operation order, then each
/// operation of the `kv` rider, then each of the `timers` rider) became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    Ack { request: AckRequest, outcome: AckOutcome },
    Push(Pushed),
    Kv(kv::OpResult),
    Timer(TimerResult),
}

#[derive(Debug, thiserror::Error)]
pub enum TransactionError {
    /// A part of the bundle was refused; nothing of it happened.
    #[error("transaction rolled back: {0}")]
    RolledBack(String),
    /// A `required` operation of the `kv` rider failed; nothing of the bundle happened. `index` is
    /// the operation's place among the results (after every ack and pushed item).
    #[error("transaction rolled back: the key/value precondition at {index} failed")]
    KvPrecondition { index: usize, verdict: kv::Verdict },
    #[error(transparent)]
    Failed(#[from] BrokerError),
}

impl From<StoreError> for TransactionError {
    fn from(e: StoreError) -> Self {
        TransactionError::Failed(e.into())
    }
}

/// Runs the bundle. Its `kv` rider is judged first, then its required leases are checked;
/// acknowledgements are applied next, the `timers` rider after them, and pushes last, partition by
/// partition in id order: the results do not depend on that order, and every transaction taking
/// key/value row locks before cursor locks before creation locks before timer row locks before
/// capacity locks before partition locks (in a fixed order each) keeps concurrent bundles from
/// deadlocking. The queues and partitions its pushes create are created in its transaction,
/// after its acks, so a bundle that rolls back leaves none. A bundle that would take a queue past
/// its `maxSize` rolls back with [`BrokerError::QueueFull`]; one whose pushes would create queues
/// or partitions past a creation limit rolls back with [`BrokerError::LimitReached`].
pub async fn execute(broker: &Broker, bundle: Bundle) -> Result<Vec<Applied>, TransactionError> {
    let Bundle { operations, required_leases, kv, timers: mut timer_ops } = bundle;
    let mut acks = Vec::new();
    let mut items = Vec::new();
    // For each entry of the results: which ack or which pushed item it is.
    let mut order = Vec::new();
    for operation in operations {
        match operation {
            Operation::Ack(request) => {
                order.push(Entry::Ack(acks.len()));
                acks.push(request);
            }
            Operation::Push(pushed) => {
                for item in pushed {
                    order.push(Entry::Item(items.len()));
                    items.push(item);
                }
            }
        }
    }
    // Its acks need the database, so the bundle cannot wait in the journal; and its pushes must
    // not overtake buffered ones.
    if !items.is_empty() && broker.maintenance.pushes_to_journal() {
        return Err(BrokerError::Unavailable(
            "push maintenance is on: a transaction that pushes is refused until it ends and buffered pushes are \
             replayed; retry later"
                .into(),
        )
        .into());
    }
    // Queues and partitions the bundle pushes to are created in its transaction (so a bundle that
    // rolls back leaves none behind), all of them or none within the creation limits.
    let shares = shares_of(&items);
    let wanted = wanted_of(&shares);
    let mut known = broker.names.known(&broker.pool, &wanted).await?;
    timers::seal_payloads(broker, &mut timer_ops).await?;

    // The required leases' partitions, when this broker granted every one of them.
    let known_partitions: Option<Vec<Vec<i64>>> = required_leases
        .iter()
        .map(|lease| broker.deliveries.partitions_of(*lease).map(|partitions| partitions.to_vec()))
        .collect();
    // The whole transaction is bounded, its commit with it; the bundle sent again after an
    // unanswered commit finds its pushes duplicates, its acks no-ops or its required leases no
    // longer live.
    let written = broker
        .write_within("a transaction", async |client| -> Result<Written, TransactionError> {
            let tx = client.transaction().await.map_err(StoreError::from)?;
            // The rider's key locks come first, before any cursor or partition lock, in every
            // bundle; a lost guard costs no ack or push work.
            let kv_results = match &kv {
                None => Vec::new(),
                Some(batch) => match kv::apply_in(&tx, batch).await? {
                    Outcome::Applied(results) => results,
                    Outcome::Aborted { index, verdict } => {
                        return Err(TransactionError::KvPrecondition { index: order.len() + index, verdict });
                    }
                },
            };
            // Before the acks: an ack that completes its lease's span releases the lease.
            let not_live =
                queen_store::cursors::not_live_leases(&tx, &required_leases, known_partitions.as_deref()).await?;
            let not_live_refusal = || {
                let leases: Vec<String> = not_live.iter().map(ToString::to_string).collect();
                TransactionError::RolledBack(format!(
                    "required lease {} is not live (expired, released or unknown)",
                    leases.join(", ")
                ))
            };
            // A required lease that is not live may be one this very bundle ended, its first copy
            // committed and its answer lost: the bundle is then answered as applied when all of it
            // already is (every ack a no-op under its own lease, every push a duplicate), and
            // rolled back otherwise. Riders cannot be told applied from not: such a bundle is not.
            let again = !not_live.is_empty();
            if again && (kv.is_some() || !timer_ops.is_empty()) {
                return Err(not_live_refusal());
            }
            let queen_store::cursors::AckBatch { outcomes, released } =
                queen_store::cursors::acknowledge(&tx, std::slice::from_ref(&acks), broker.cipher.as_deref(), !again)
                    .await?;
            let ack_outcomes = outcomes.into_iter().next().unwrap_or_default();
            if again && ack_outcomes.iter().any(|outcome| outcome.verdict != AckVerdict::Noop) {
                return Err(not_live_refusal());
            }
            let refused = acks.iter().zip(&ack_outcomes).find_map(|(request, outcome)| match outcome.verdict {
                AckVerdict::Refused(refusal) => Some((request, refusal, outcome.committed)),
                _ => None,
            });
            if let Some((request, refusal, committed)) = refused {
                let reason = refusal_text(refusal, request, committed);
                return Err(TransactionError::RolledBack(format!(
                    "the ack of {:?} in partition {} was refused: {reason}",
                    request.transaction_id, request.partition_id
                )));
            }
            // What the pushes need is created after the cursor locks (a queue's deletion takes its
            // cursors before its row, which a partition created in it holds) and before the rest.
            if !known.is_complete() {
                match known.create_in(&tx, &wanted, Some(broker.config.limits.creation())).await {
                    // A cached queue deleted since: looked up afresh next time.
                    Err(StoreError::Missing(_)) => {
                        wanted.iter().for_each(|(queue, _)| broker.names.forget_queue(queue));
                        let text = "a queue of the transaction was deleted; retry the transaction";
                        return Err(BrokerError::Unavailable(text.into()).into());
                    }
                    created => created?,
                }
            }
            let placed = Placed::of(&shares, &known.resolution()?, items.len());
            // Timer row locks (in key order) after the cursor locks and before the capacity and partition
            // locks, the order in which the timer sweeper takes the last three.
            let timer_results = timers::apply_in(&tx, &timer_ops).await?;

            // Capacity locks in queue id order, before any partition lock, as capped pushes take them.
            let mut depths = BTreeMap::new();
            for queue in placed.queues.values().filter(|queue| queue.options.max_size > 0) {
                queues::lock_capacity(&tx, queue.id).await?;
                depths.insert(queue.id, queues::unconsumed_depth(&tx, queue).await?);
            }
            let mut pushed: Vec<Option<Pushed>> = vec![None; items.len()];
            for (&(partition_id, queue_id), indices) in &placed.by_partition {
                let messages: Vec<NewMessage> = indices.iter().map(|&i| items[i].to_message()).collect();
                let destination = Destination { queue_id, queue: &items[indices[0]].queue, partition_id };
                let policy = append_policy(broker, &placed.queues[&queue_id])?;
                let appended = match append_in_transaction(&tx, destination, &messages, &policy).await {
                    Ok(appended) => appended,
                    // Deleted since it was resolved, as a push's partition can be: resolved afresh next time.
                    Err(StoreError::Missing(_)) => {
                        let partition = &items[indices[0]].partition;
                        broker.names.forget_partition(queue_id, partition);
                        return Err(BrokerError::Unavailable(format!(
                            "partition {partition:?} was deleted; retry the transaction"
                        ))
                        .into());
                    }
                    Err(e) => return Err(e.into()),
                };
                for (&i, outcome) in indices.iter().zip(appended.outcomes) {
                    pushed[i] = Some(Pushed { transaction_id: items[i].transaction_id.clone(), partition_id, outcome });
                }
            }
            if again && pushed.iter().flatten().any(|p| matches!(p.outcome, Appended::Queued { .. })) {
                return Err(not_live_refusal());
            }
            for (queue_id, depth) in depths {
                let adding = placed
                    .partition_of
                    .iter()
                    .zip(&pushed)
                    .filter(|((queue, _), pushed)| {
                        *queue == queue_id && matches!(pushed, Some(Pushed { outcome: Appended::Queued { .. }, .. }))
                    })
                    .count() as i64;
                let queue = &placed.queues[&queue_id];
                if super::push::overflows(depth, adding, queue.options.max_size) {
                    let (queue, max_size) = (queue.name.clone(), queue.options.max_size);
                    return Err(BrokerError::QueueFull { queue, depth, max_size, adding }.into());
                }
            }
            tx.commit().await.map_err(|e| StoreError::from(e).of_commit("a transaction commit"))?;
            Ok(Written { kv_results, released, ack_outcomes, timer_results, by_partition: placed.by_partition, pushed })
        })
        .await?
        .1;
    let Written { kv_results, released, ack_outcomes, timer_results, by_partition, mut pushed } = written?;
    broker.names.remember(&known);
    timers::wake_sweeper(broker, &timer_ops, &timer_results);
    for (&(partition_id, queue_id), indices) in &by_partition {
        let (mut queued, mut duplicates, mut bytes) = (0, 0, 0);
        for &index in indices {
            match &pushed[index] {
                Some(Pushed { outcome: Appended::Queued { .. }, .. }) => {
                    queued += 1;
                    bytes += items[index].payload.len() as u64;
                }
                Some(_) => duplicates += 1,
                None => {}
            }
        }
        let queue = &items[indices[0]].queue;
        broker.metrics.record_append(queue, queued, duplicates, bytes);
        broker.announcer.announce(DataAvailable { queue: Arc::from(queue.as_str()), queue_id, partition_id });
    }
    for work in released {
        broker.announcer.announce(DataAvailable::from(work));
    }
    let statuses: Vec<_> = acks.iter().map(|a| a.status).collect();
    super::ack::record(&broker.metrics, &statuses, &ack_outcomes);
    let mut acks = acks.into_iter().zip(ack_outcomes).map(Some).collect::<Vec<_>>();
    let mut applied = order
        .into_iter()
        .map(|entry| match entry {
            Entry::Ack(i) => acks[i].take().map(|(request, outcome)| Applied::Ack { request, outcome }),
            Entry::Item(i) => pushed[i].take().map(Applied::Push),
        })
        .map(|applied| applied.ok_or_else(|| BrokerError::Internal("a transaction entry has no outcome".into()).into()))
        .collect::<Result<Vec<_>, TransactionError>>()?;
    applied.extend(kv_results.into_iter().map(Applied::Kv));
    applied.extend(timer_results.into_iter().map(Applied::Timer));
    Ok(applied)
}

/// What the bundle's PostgreSQL transaction wrote, for its answer and announcements.
struct Written {
    kv_results: Vec<kv::OpResult>,
    ack_outcomes: Vec<AckOutcome>,
    /// Partitions where a lease the acks released left messages.
    released: Vec<queen_store::cursors::ReleasedWork>,
    timer_results: Vec<TimerResult>,
    /// Each partition pushed to, (partition id, queue id), with the indices of its items.
    by_partition: BTreeMap<(i64, i64), Vec<usize>>,
    pushed: Vec<Option<Pushed>>,
}

/// Where the bundle's items go, once its queues and partitions are known.
struct Placed {
    /// For each item: its queue's id and its partition's id.
    partition_of: Vec<(i64, i64)>,
    /// The queues pushed to, for their options.
    queues: BTreeMap<i64, Arc<Queue>>,
    /// Each partition pushed to, (partition id, queue id), with the indices of its items, in
    /// partition id order: the order partition locks are taken in.
    by_partition: BTreeMap<(i64, i64), Vec<usize>>,
}

impl Placed {
    fn of(shares: &[QueueShare], resolved: &super::names_cache::Resolution, items: usize) -> Self {
        let mut partition_of = vec![(0, 0); items];
        let mut queues = BTreeMap::new();
        for ((_, partitions), (queue, ids)) in shares.iter().zip(resolved) {
            for ((_, indices), &partition_id) in partitions.iter().zip(ids) {
                for &index in indices {
                    partition_of[index] = (queue.id, partition_id);
                }
            }
            queues.insert(queue.id, Arc::clone(queue));
        }
        let mut by_partition: BTreeMap<(i64, i64), Vec<usize>> = BTreeMap::new();
        for (index, &(queue_id, partition_id)) in partition_of.iter().enumerate() {
            by_partition.entry((partition_id, queue_id)).or_default().push(index);
        }
        Self { partition_of, queues, by_partition }
    }
}

#[derive(Debug, Clone, Copy)]
enum Entry {
    Ack(usize),
    Item(usize),
}
