//! Messages read back, and dead letters: one message by (partition id, transaction id), the newest
//! of a queue, a page of dead letters, re-queuing and deleting them. Sealed bytes are opened with
//! the broker's key.

use std::sync::Arc;

use deadpool_postgres::Object;
use queen_store::StoreError;
use queen_store::dlq::{self, DeadLetter, DeadLetterFilter, Requeue};
use queen_store::messages::{self, ListedMessage, StoredMessage};

use super::Broker;
use super::BrokerError;
use crate::actors::coordinator::DataAvailable;

/// The message with every group's progress on it; `None` when the partition holds no such
/// transaction id (or retention removed it).
pub async fn find(
    broker: &Broker,
    partition_id: i64,
    transaction_id: &str,
) -> Result<Option<StoredMessage>, BrokerError> {
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    Ok(messages::find(&client, partition_id, transaction_id, &broker.segments, broker.cipher.as_deref()).await?)
}

/// The newest `limit` messages of the queue (of one partition, when named), newest first.
pub async fn newest(
    broker: &Broker,
    queue: &str,
    partition: Option<&str>,
    page: (i64, i64),
) -> Result<Vec<ListedMessage>, BrokerError> {
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    Ok(messages::newest(&client, queue, partition, page, &broker.segments, broker.cipher.as_deref()).await?)
}

/// A page of dead letters (fewer once their payloads reach `pop.max_answer_bytes`, at least one)
/// and how many match in all.
pub async fn dead_letters(broker: &Broker, filter: &DeadLetterFilter) -> Result<(Vec<DeadLetter>, i64), BrokerError> {
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    let max_bytes = i64::try_from(broker.config.pop.max_answer_bytes).unwrap_or(i64::MAX);
    Ok(dlq::list(&client, filter, broker.cipher.as_deref(), max_bytes).await?)
}

/// Moves the message's dead letters back into its partition as one new message, announced like
/// a push.
pub async fn requeue(broker: &Broker, partition_id: i64, transaction_id: &str) -> Result<Requeue, BrokerError> {
    let limits = broker.config.limits.creation();
    let requeue =
        async |c: &mut Object| dlq::requeue(c, partition_id, transaction_id, broker.cipher.as_deref(), limits).await;
    let moved = broker.write_within("a dead letter's retry", requeue).await?.1?;
    if let Requeue::Moved(moved) = &moved {
        let queued = u64::from(matches!(moved.outcome, queen_store::log::Appended::Queued { .. }));
        broker.metrics.record_append(&moved.queue, queued, 1 - queued, moved.payload_bytes as u64);
        let queue = Arc::from(moved.queue.as_str());
        broker.announcer.announce(DataAvailable { queue, queue_id: moved.queue_id, partition_id: moved.partition_id });
    }
    Ok(moved)
}

/// Deletes the message's dead letters; how many there were.
pub async fn delete_dead_letters(broker: &Broker, partition_id: i64, transaction_id: &str) -> Result<u64, BrokerError> {
    let delete = async |c: &mut Object| dlq::delete(&*c, partition_id, transaction_id).await;
    Ok(broker.write_within("a dead letter's deletion", delete).await?.1?)
}
