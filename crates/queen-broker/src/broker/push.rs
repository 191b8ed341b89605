//! Push: resolve each item's queue and partition (creating them on first use), hand each
//! partition's share to its writer, and answer per item in request order. While push maintenance
//! is on, a push is journaled instead (`super::push_buffer`).

use std::collections::HashMap;
use std::sync::Arc;

use queen_store::log::{Appended, NewMessage};
use uuid::Uuid;

use super::Broker;
use crate::actors::WorkError;
use crate::actors::partition_writer::WriteTarget;
use crate::error::ApiError;

/// One validated push item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushItem {
    pub queue: String,
    pub partition: String,
    pub transaction_id: String,
    pub trace_id: Option<Uuid>,
    /// Minted when the push is accepted; a duplicate is answered with the original's instead.
    pub message_id: Uuid,
    /// The message's data as JSON text.
    pub payload: Vec<u8>,
}

impl PushItem {
    /// The message to append.
    pub fn to_message(&self) -> NewMessage {
        NewMessage {
            message_id: self.message_id,
            transaction_id: self.transaction_id.clone(),
            trace_id: self.trace_id,
            payload: self.payload.clone(),
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
pub async fn push(broker: &Broker, items: Vec<PushItem>) -> Result<PushResults, ApiError> {
    if broker.maintenance.pushes_to_journal()
        && !items.is_empty()
        && super::push_buffer::journal(broker, &items).await?
    {
        return Ok(PushResults::Buffered(items));
    }
    write(broker, &items).await.map(PushResults::Stored)
}

/// Writes the items to the log. Items of one partition keep their order and land in one segment
/// (or, when other pushes to the partition are fused with them, in one segment with those). Any
/// storage failure fails the whole request: a client retry is safe, since the items already
/// written come back as duplicates of themselves.
pub async fn write(broker: &Broker, items: &[PushItem]) -> Result<Vec<Pushed>, ApiError> {
    // Items grouped by partition, keeping each item's index in the request.
    let mut groups: Vec<((String, String), Vec<usize>)> = Vec::new();
    let mut group_of: HashMap<(&str, &str), usize> = HashMap::new();
    for (index, item) in items.iter().enumerate() {
        let key = (item.queue.as_str(), item.partition.as_str());
        let group = *group_of.entry(key).or_insert_with(|| {
            groups.push(((item.queue.clone(), item.partition.clone()), Vec::new()));
            groups.len() - 1
        });
        groups[group].1.push(index);
    }

    let writes = groups.iter().map(|((queue, partition), indices)| {
        let messages: Vec<NewMessage> = indices.iter().map(|&i| items[i].to_message()).collect();
        write_partition(broker, queue, partition, messages)
    });
    let written = futures::future::try_join_all(writes).await?;

    let mut results: Vec<Option<Pushed>> = vec![None; items.len()];
    for ((_, indices), (partition_id, outcomes)) in groups.iter().zip(written) {
        for (&index, outcome) in indices.iter().zip(outcomes) {
            let transaction_id = items[index].transaction_id.clone();
            results[index] = Some(Pushed { transaction_id, partition_id, outcome });
        }
    }
    // Every item belongs to exactly one group, and every group's write answered all its items.
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| ApiError::Internal("a push item was left without an outcome".into())))
        .collect()
}

/// Appends to one partition. A queue deleted since its id was cached is resolved (and so
/// created) again once; one deleted while the append was queued fails the request with a 503,
/// which the client retries.
async fn write_partition(
    broker: &Broker,
    queue: &str,
    partition: &str,
    messages: Vec<NewMessage>,
) -> Result<(i64, Vec<Appended>), ApiError> {
    let mut queue_id = broker.names.ensure_queue(&broker.pool, queue).await?.id;
    let partition_id = match broker.names.ensure_partition(&broker.pool, queue_id, partition).await {
        Err(queen_store::StoreError::Missing(_)) => {
            broker.names.forget_queue(queue);
            queue_id = broker.names.ensure_queue(&broker.pool, queue).await?.id;
            broker.names.ensure_partition(&broker.pool, queue_id, partition).await?
        }
        other => other?,
    };
    let target = WriteTarget { queue_id, queue: Arc::from(queue), partition_id };
    match broker.writers.append(&target, messages).await {
        Ok(outcomes) => Ok((partition_id, outcomes)),
        Err(e) => {
            if matches!(e, WorkError::Gone(_)) {
                broker.names.forget_queue(queue);
                broker.names.forget_partition(queue_id, partition);
            }
            Err(e.into())
        }
    }
}
