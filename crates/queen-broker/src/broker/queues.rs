//! Queue administration: configure (create or change options), read, delete.

use std::sync::Arc;

use deadpool_postgres::Object;
use queen_store::StoreError;
use queen_store::queues::{self, Queue, QueueSize};
use serde_json::{Map, Value};

use super::BrokerError;
use super::{Broker, queue_options};

/// What a configure request names besides the queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Configure {
    pub namespace: Option<String>,
    pub task: Option<String>,
    /// As the client sent them; each is checked by [`queue_options::parse`].
    pub options: Map<String, Value>,
}

/// Creates the queue (within `limits.max_queues`) or merges options into it. Every broker forgets what it cached of the queue,
/// so a changed option acts at once, on messages already stored too.
pub async fn configure(broker: &Broker, name: &str, request: &Configure) -> Result<Queue, BrokerError> {
    let patch = queue_options::parse(&request.options)?;
    if patch.encryption_enabled == Some(true) && broker.cipher.is_none() {
        return Err(BrokerError::invalid(
            "options.encryptionEnabled: this broker has no encryption key; set QUEEN_ENCRYPTION_KEY (or \
             encryption.key) to 64 hexadecimal characters, the same on every broker",
        ));
    }
    let (namespace, task) = (request.namespace.as_deref(), request.task.as_deref());
    let max_queues = broker.config.limits.creation().queues;
    let configuring =
        async |c: &mut Object| queues::configure_queue(c, name, namespace, task, &patch, max_queues).await;
    let queue = broker.write_within("a queue's configuration", configuring).await?.1?;
    broker.names.forget_queue(name);
    Ok(queue)
}

/// The queue with its size; `None` when it does not exist.
pub async fn describe(broker: &Broker, name: &str) -> Result<Option<(Arc<Queue>, QueueSize)>, BrokerError> {
    let Some(queue) = broker.names.queue(&broker.pool, name).await? else { return Ok(None) };
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    let size = queues::queue_size(&client, queue.id).await?;
    Ok(Some((queue, size)))
}

/// Deletes the queue and everything of it, and its metric series; whether it existed. (Other
/// brokers remove its series when they hear of the deletion.)
pub async fn delete(broker: &Broker, name: &str) -> Result<bool, BrokerError> {
    let existed = broker
        .write_within("a queue's deletion", async |c: &mut Object| queues::delete_queue(c, name).await)
        .await?
        .1?;
    broker.names.forget_queue(name);
    if existed {
        broker.metrics.forget_queue(name);
    }
    let queue = name.to_owned();
    // The queue's registrations went with it; forget that they were written.
    let _ = broker.registered.invalidate_entries_if(move |(registered_queue, _), _| *registered_queue == queue);
    Ok(existed)
}
