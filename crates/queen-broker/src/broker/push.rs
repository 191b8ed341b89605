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

/// How one queue's share is written.
enum Route<'a> {
    /// Through the partition writers, with a place taken with each partition's (in the share's
    /// order).
    Writers(Vec<Reserved<'a>>),
    /// In one transaction under the queue's capacity lock (a queue with a `maxSize`).
    Capped,
}

/// Writes the items to the log. Items of one partition keep their order and land in one segment
/// (or, when other pushes to the partition are fused with them, in one segment with those). A
/// place is taken with the writer of every partition before anything is written, so a push that
/// one writer cannot take is refused whole ([`BrokerError::Overloaded`]). Any storage failure fails
/// the whole request: a client retry is safe, since the items already written come back as
/// duplicates of themselves. Under [`Admission::Checked`], a queue with a `maxSize` takes its
/// share of the request whole or not at all ([`BrokerError::QueueFull`]), and the queues and
/// partitions the request would create must all fit within the creation limits
/// ([`BrokerError::LimitReached`]: nothing is created or written).
pub async fn write(broker: &Broker, items: &[PushItem], admission: Admission) -> Result<Vec<Pushed>, BrokerError> {
    let shares = shares_of(items);
    let resolved = resolve(broker, &shares, admission).await?;
    let mut routes = Vec::with_capacity(shares.len());
    for (queue, partition_ids) in &resolved {
        let route = if queue.options.max_size > 0 && admission == Admission::Checked {
            Route::Capped
        } else {
            let name: Arc<str> = Arc::from(queue.name.as_str());
            let target = |partition_id| WriteTarget { queue_id: queue.id, queue: Arc::clone(&name), partition_id };
            let places = partition_ids.iter().map(|&id| broker.writers.reserve(&target(id)));
            Route::Writers(places.collect::<Result<_, _>>()?)
        };
        routes.push((append_policy(broker, queue)?, route));
    }

    let messages = |indices: &[usize]| -> Vec<NewMessage> { indices.iter().map(|&i| items[i].to_message()).collect() };
    let writes = shares.iter().zip(&resolved).zip(routes).map(|(((_, partitions), (queue, ids)), (policy, route))| {
        let messages = &messages;
        async move {
            match route {
                Route::Capped => {
                    let shares =
                        partitions.iter().zip(ids).map(|((name, indices), &id)| (name.as_str(), id, messages(indices)));
                    write_capped(broker, queue, shares.collect(), &policy).await
                }
                Route::Writers(places) => {
                    let appends = places.into_iter().zip(partitions).map(|(place, (partition, indices))| {
                        write_partition(broker, queue, partition, place, messages(indices), policy.clone())
                    });
                    futures::future::try_join_all(appends).await
                }
            }
        }
    });
    let written = futures::future::try_join_all(writes).await?;

    let mut results: Vec<Option<Pushed>> = vec![None; items.len()];
    let partitions = shares.iter().flat_map(|(_, partitions)| partitions);
    for ((_, indices), (partition_id, outcomes)) in partitions.zip(written.into_iter().flatten()) {
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

/// Each share's queue and the ids of its partitions, creating them on first use, all of them or
/// none, within the creation limits ([`BrokerError::LimitReached`] when a producer's push would
/// pass one). Pushes replayed from the journal were answered already: they are written whatever
/// the limits say (dropping them would lose acknowledged messages, and refusing them would stop
/// the replay), with a warning.
pub(super) async fn resolve(
    broker: &Broker,
    shares: &[QueueShare],
    admission: Admission,
) -> Result<Vec<(Arc<Queue>, Vec<i64>)>, BrokerError> {
    let wanted: Vec<(&str, Vec<&str>)> = shares
        .iter()
        .map(|(queue, partitions)| (queue.as_str(), partitions.iter().map(|(name, _)| name.as_str()).collect()))
        .collect();
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

/// Appends to a queue with a `maxSize`, in one transaction under the queue's capacity lock:
/// every partition's messages, or none when the new ones would take the queue's unconsumed depth
/// past its size. Duplicates add nothing, so a retried push of stored messages always fits.
async fn write_capped(
    broker: &Broker,
    queue: &Queue,
    shares: Vec<(&str, i64, Vec<NewMessage>)>,
    policy: &AppendPolicy,
) -> Result<Vec<(i64, Vec<Appended>)>, BrokerError> {
    let mut client = broker.pool.get().await.map_err(StoreError::from)?;
    let tx = client.transaction().await.map_err(StoreError::from)?;
    queues::lock_capacity(&tx, queue.id).await?;
    let depth = queues::unconsumed_depth(&tx, queue).await?;
    // Partition locks in id order, as every transaction that takes several does.
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by_key(|&i| shares[i].1);
    let mut outcomes = vec![Vec::new(); shares.len()];
    for i in order {
        let (partition, partition_id, messages) = &shares[i];
        let destination = Destination { queue_id: queue.id, queue: &queue.name, partition_id: *partition_id };
        match append_in_transaction(&tx, destination, messages, policy).await {
            Ok(appended) => outcomes[i] = appended.outcomes,
            Err(StoreError::Missing(_)) => {
                broker.names.forget_partition(queue.id, partition);
                return Err(BrokerError::Unavailable(format!("partition {partition:?} was deleted; retry the push")));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let queued = |outcomes: &[Appended]| outcomes.iter().filter(|o| matches!(o, Appended::Queued { .. })).count();
    let adding: usize = outcomes.iter().map(|o| queued(o)).sum();
    if depth + adding as i64 > queue.options.max_size {
        // Dropping the transaction rolls it back: nothing of the push is written.
        return Err(BrokerError::QueueFull {
            queue: queue.name.clone(),
            depth,
            max_size: queue.options.max_size,
            adding: adding as i64,
        });
    }
    tx.commit().await.map_err(StoreError::from)?;
    let metrics = &broker.metrics;
    metrics.messages_pushed.inc_by(&queue.name, adding as u64);
    let total: usize = outcomes.iter().map(Vec::len).sum();
    metrics.duplicates.inc_by(&queue.name, (total - adding) as u64);
    for ((_, partition_id, _), appended) in shares.iter().zip(&outcomes) {
        if queued(appended) > 0 {
            let name = Arc::from(queue.name.as_str());
            broker.announcer.announce(DataAvailable { queue: name, queue_id: queue.id, partition_id: *partition_id });
        }
    }
    Ok(shares.iter().map(|(_, partition_id, _)| *partition_id).zip(outcomes).collect())
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
