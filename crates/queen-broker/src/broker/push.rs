//! Push: resolve each item's queue and partition (creating them on first use), hand each
//! partition's share to its writer, and answer per item in request order. While push maintenance
//! is on, a push is journaled instead (`super::push_buffer`).

use std::collections::HashMap;
use std::sync::Arc;

use queen_store::StoreError;
use queen_store::log::{AppendPolicy, Appended, Destination, NewMessage, ReceivedFrame, append_in_transaction};
use queen_store::queues::{self, Queue};
use uuid::Uuid;

use super::Broker;
use super::BrokerError;
use crate::actors::WorkError;
use crate::actors::coordinator::DataAvailable;
use crate::actors::partition_writer::{Reserved, WriteTarget};

/// One validated push item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushItem {
    pub queue: String,
    pub partition: String,
    pub transaction_id: String,
    pub trace_id: Option<Uuid>,
    /// `producerSub`: the pushing token's subject with auth on, else none (never the body's).
    pub producer: Option<String>,
    /// Minted when the push is accepted; a duplicate is answered with the original's instead.
    pub message_id: Uuid,
    /// The message's data as JSON text.
    pub payload: Vec<u8>,
    /// Its frame in a segment the producer compressed (a binary push's frames group), which the
    /// log stores as received when it appends that segment's messages whole.
    pub received: Option<ReceivedFrame>,
}

impl PushItem {
    /// The message to append.
    pub fn to_message(&self) -> NewMessage {
        NewMessage {
            message_id: self.message_id,
            transaction_id: self.transaction_id.clone(),
            trace_id: self.trace_id,
            producer: self.producer.clone(),
            payload: self.payload.clone(),
            received: self.received.clone(),
        }
    }
}

/// What became of one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    pub transaction_id: String,
    pub partition_id: i64,
    pub outcome: Appended,
}

/// What became of a push request: written to the log, or (push maintenance) journaled whole.
#[derive(Debug)]
pub enum PushResults {
    Stored(Vec<Pushed>),
    Buffered(Vec<PushItem>),
}

/// Pushes the items: to the journal while pushes go there, to the log otherwise.
pub async fn push(broker: &Broker, items: Vec<PushItem>) -> Result<PushResults, BrokerError> {
    if broker.maintenance.pushes_to_journal()
        && !items.is_empty()
        && super::push_buffer::journal(broker, &items).await?
    {
        return Ok(PushResults::Buffered(items));
    }
    write(broker, &items, Admission::Checked).await.map(PushResults::Stored)
}

/// Whether a write may be refused for a queue's `maxSize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A producer's push: a queue with a size takes it only if it fits.
    Checked,
    /// Pushes the broker already accepted (replayed from the journal): written whatever the
    /// depth, since they were answered.
    Accepted,
}

/// Items of one queue, by partition, each with the indices of its items in the request.
pub(super) type QueueShare = (String, Vec<(String, Vec<usize>)>);

/// A capped queue's share (a queue with a `maxSize`), written in one transaction with the other
/// capped queues' under their capacity locks.
struct CappedShare<'a> {
    queue: &'a Queue,
    /// Each partition's name, id and messages.
    partitions: Vec<(&'a str, i64, Vec<NewMessage>)>,
    policy: AppendPolicy,
}

/// Writes the items to the log. Items of one partition keep their order and land in one segment
/// (or, when other pushes to the partition are fused with them, in one segment with those). A
/// place is taken with the writer of every partition before anything is written, so a push that
/// one writer cannot take is refused whole ([`BrokerError::Overloaded`]). Any storage failure fails
/// the whole request: a client retry is safe, since the items already written come back as
/// duplicates of themselves. Under [`Admission::Checked`], the shares of queues with a `maxSize`
/// are written first, together, all or none: a queue that cannot take its share whole refuses
/// the request before anything of it is written ([`BrokerError::QueueFull`]). The queues and
/// partitions the request would create must all fit within the creation limits
/// ([`BrokerError::LimitReached`]: nothing is created or written).
pub async fn write(broker: &Broker, items: &[PushItem], admission: Admission) -> Result<Vec<Pushed>, BrokerError> {
    let shares = shares_of(items);
    let resolved = resolve(broker, &shares, admission).await?;
    let messages = |indices: &[usize]| -> Vec<NewMessage> { indices.iter().map(|&i| items[i].to_message()).collect() };
    let is_capped = |queue: &Queue| queue.options.max_size > 0 && admission == Admission::Checked;
    let mut capped = Vec::new();
    let mut through_writers = Vec::new();
    for ((_, partitions), (queue, ids)) in shares.iter().zip(&resolved) {
        let policy = append_policy(broker, queue)?;
        if is_capped(queue) {
            let partitions = partitions
                .iter()
                .zip(ids)
                .map(|((name, indices), &id)| (name.as_str(), id, messages(indices)))
                .collect();
            capped.push(CappedShare { queue, partitions, policy });
        } else {
            let name: Arc<str> = Arc::from(queue.name.as_str());
            let target = |partition_id| WriteTarget { queue_id: queue.id, queue: Arc::clone(&name), partition_id };
            let places: Vec<Reserved<'_>> =
                ids.iter().map(|&id| broker.writers.reserve(&target(id))).collect::<Result<_, _>>()?;
            through_writers.push((queue, partitions, places, policy));
        }
    }

    let mut written_capped = write_capped(broker, capped).await?.into_iter();
    let appends = through_writers.into_iter().map(|(queue, partitions, places, policy)| {
        let messages = &messages;
        let appends = places.into_iter().zip(partitions).map(move |(place, (partition, indices))| {
            write_partition(broker, queue, partition, place, messages(indices), policy.clone())
        });
        futures::future::try_join_all(appends)
    });
    let mut written_by_writers = futures::future::try_join_all(appends).await?.into_iter();
    let written = resolved.iter().map(|(queue, _)| {
        if is_capped(queue) { written_capped.next() } else { written_by_writers.next() }.unwrap_or_default()
    });

    let mut results: Vec<Option<Pushed>> = vec![None; items.len()];
    let partitions = shares.iter().flat_map(|(_, partitions)| partitions);
    for ((_, indices), (partition_id, outcomes)) in partitions.zip(written.flatten()) {
        for (&index, outcome) in indices.iter().zip(outcomes) {
            let transaction_id = items[index].transaction_id.clone();
            results[index] = Some(Pushed { transaction_id, partition_id, outcome });
        }
    }
    // Every item belongs to exactly one partition, and every partition's write answered all its
    // items.
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| BrokerError::Internal("a push item was left without an outcome".into())))
        .collect()
}

/// The request's items grouped by queue, then by partition, in order of first appearance.
pub(super) fn shares_of(items: &[PushItem]) -> Vec<QueueShare> {
    let mut shares: Vec<QueueShare> = Vec::new();
    let mut place: HashMap<(&str, &str), (usize, usize)> = HashMap::new();
    for (index, item) in items.iter().enumerate() {
        let key = (item.queue.as_str(), item.partition.as_str());
        let (queue, partition) = *place.entry(key).or_insert_with(|| {
            let queue = match shares.iter().position(|(name, _)| *name == item.queue) {
                Some(queue) => queue,
                None => {
                    shares.push((item.queue.clone(), Vec::new()));
                    shares.len() - 1
                }
            };
            shares[queue].1.push((item.partition.clone(), Vec::new()));
            (queue, shares[queue].1.len() - 1)
        });
        shares[queue].1[partition].1.push(index);
    }
    shares
}

/// The queue and partition names of the shares, as the names cache takes them.
pub(super) fn wanted_of(shares: &[QueueShare]) -> Vec<(&str, Vec<&str>)> {
    shares
        .iter()
        .map(|(queue, partitions)| (queue.as_str(), partitions.iter().map(|(name, _)| name.as_str()).collect()))
        .collect()
}

/// Each share's queue and the ids of its partitions, creating them on first use, all of them or
/// none, within the creation limits ([`BrokerError::LimitReached`] when a producer's push would
/// pass one). Pushes replayed from the journal were answered already: they are written whatever
/// the limits say (dropping them would lose acknowledged messages, and refusing them would stop
/// the replay), with a warning.
pub(super) async fn resolve(
    broker: &Broker,
    shares: &[QueueShare],
    admission: Admission,
) -> Result<super::names_cache::Resolution, BrokerError> {
    let wanted = wanted_of(shares);
    let limits = broker.config.limits.creation();
    match broker.names.resolve(&broker.pool, &wanted, Some(limits)).await {
        Err(StoreError::LimitReached(reached)) if admission == Admission::Accepted => {
            let refusal = BrokerError::LimitReached(reached);
            tracing::warn!(limit = %refusal, "pushes replayed from the journal create past a creation limit");
            Ok(broker.names.resolve(&broker.pool, &wanted, None).await?)
        }
        resolved => Ok(resolved?),
    }
}

/// Appends to queues with a `maxSize`, in one transaction under their capacity locks: every
/// share's messages, or none when a queue's new ones would take its unconsumed depth past its
/// size. Duplicates add nothing, so a retried push of stored messages always fits. Per share, each
/// partition's id and outcomes.
async fn write_capped(
    broker: &Broker,
    shares: Vec<CappedShare<'_>>,
) -> Result<Vec<Vec<(i64, Vec<Appended>)>>, BrokerError> {
    if shares.is_empty() {
        return Ok(Vec::new());
    }
    let queued = |outcomes: &[Appended]| outcomes.iter().filter(|o| matches!(o, Appended::Queued { .. })).count();
    // The whole transaction is bounded, its commit with it: the push sent again after an
    // unanswered commit finds its items duplicates if it went through.
    let outcomes = broker
        .write_within("a push's transaction", async |client| -> Result<Vec<Vec<Vec<Appended>>>, BrokerError> {
            let tx = client.transaction().await.map_err(StoreError::from)?;
            // Capacity locks in queue id order, before any partition lock, as transactions take them.
            let mut by_queue: Vec<usize> = (0..shares.len()).collect();
            by_queue.sort_by_key(|&q| shares[q].queue.id);
            let mut depths = vec![0; shares.len()];
            for &q in &by_queue {
                queues::lock_capacity(&tx, shares[q].queue.id).await?;
                depths[q] = queues::unconsumed_depth(&tx, shares[q].queue).await?;
            }
            // Partition locks in id order, as every transaction that takes several does.
            let mut order: Vec<(usize, usize)> = shares
                .iter()
                .enumerate()
                .flat_map(|(q, share)| (0..share.partitions.len()).map(move |p| (q, p)))
                .collect();
            order.sort_by_key(|&(q, p)| shares[q].partitions[p].1);
            let mut outcomes: Vec<Vec<Vec<Appended>>> =
                shares.iter().map(|s| vec![Vec::new(); s.partitions.len()]).collect();
            for (q, p) in order {
                let CappedShare { queue, partitions, policy } = &shares[q];
                let (partition, partition_id, messages) = &partitions[p];
                let destination = Destination { queue_id: queue.id, queue: &queue.name, partition_id: *partition_id };
                match append_in_transaction(&tx, destination, messages, policy).await {
                    Ok(appended) => outcomes[q][p] = appended.outcomes,
                    Err(StoreError::Missing(_)) => {
                        broker.names.forget_partition(queue.id, partition);
                        return Err(BrokerError::Unavailable(format!(
                            "partition {partition:?} was deleted; retry the push"
                        )));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            for ((share, depth), outcomes) in shares.iter().zip(&depths).zip(&outcomes) {
                let adding = outcomes.iter().map(|o| queued(o)).sum::<usize>() as i64;
                if overflows(*depth, adding, share.queue.options.max_size) {
                    // Dropping the transaction rolls it back: nothing of the push is written.
                    let (queue, max_size) = (share.queue.name.clone(), share.queue.options.max_size);
                    return Err(BrokerError::QueueFull { queue, depth: *depth, max_size, adding });
                }
            }
            tx.commit().await.map_err(|e| StoreError::from(e).of_commit("a push commit"))?;
            Ok(outcomes)
        })
        .await?
        .1?;
    let metrics = &broker.metrics;
    for (share, outcomes) in shares.iter().zip(&outcomes) {
        let name = &share.queue.name;
        for ((_, partition_id, messages), appended) in share.partitions.iter().zip(outcomes) {
            let (adding, bytes) = queen_store::log::stored(messages, appended);
            metrics.record_append(name, adding, appended.len() as u64 - adding, bytes);
            // Duplicates too, as the partition writer does: the resend of an unanswered push.
            let queue = Arc::from(name.as_str());
            let queue_id = share.queue.id;
            broker.announcer.announce(DataAvailable { queue, queue_id, partition_id: *partition_id });
        }
    }
    let ids = |share: &CappedShare<'_>| share.partitions.iter().map(|(_, id, _)| *id).collect::<Vec<_>>();
    Ok(shares.iter().zip(outcomes).map(|(share, outcomes)| ids(share).into_iter().zip(outcomes).collect()).collect())
}

/// Whether a push adding `adding` new messages to a capped queue holding `depth` unconsumed ones
/// goes past its `max_size`. One that adds nothing (every item a duplicate: the resend of an
/// unanswered push) fits even a queue over its size, lowered since or sought back into.
pub(super) fn overflows(depth: i64, adding: i64, max_size: i64) -> bool {
    adding > 0 && depth + adding > max_size
}

/// How appends to the queue treat what they write: its dedup window, and its key when it is
/// encrypted (a broker without the key refuses, rather than write plain text).
pub fn append_policy(broker: &Broker, queue: &Queue) -> Result<AppendPolicy, BrokerError> {
    let seal = match (queue.options.encryption_enabled, &broker.cipher) {
        (false, _) => None,
        (true, Some(cipher)) => Some(Arc::clone(cipher)),
        (true, None) => {
            return Err(StoreError::NoEncryptionKey { subject: format!("queue {:?}", queue.name) }.into());
        }
    };
    Ok(AppendPolicy { dedup_window_seconds: queue.options.dedup_window_seconds, seal })
}

/// Appends to one partition of the queue through its writer, where the push holds a place. A
/// queue or partition deleted while the append was queued fails the request with a 503, which
/// the client retries.
async fn write_partition(
    broker: &Broker,
    queue: &Queue,
    partition: &str,
    place: Reserved<'_>,
    messages: Vec<NewMessage>,
    policy: AppendPolicy,
) -> Result<(i64, Vec<Appended>), BrokerError> {
    let partition_id = place.partition_id();
    match place.append(messages, policy).await {
        Ok(outcomes) => Ok((partition_id, outcomes)),
        Err(e) => {
            if matches!(e, WorkError::Gone(_)) {
                broker.names.forget_queue(&queue.name);
                broker.names.forget_partition(queue.id, partition);
            }
            Err(e.into())
        }
    }
}
