//! A queue's backlog for one consumer group (queue mode by default), per partition.

use queen_store::StoreError;
use queen_store::depth::{self, QueueDepth};

use super::{Broker, BrokerError};

/// The backlog of `group` on the queue, its partitions paged by `limit`/`offset`; `None` when the
/// queue does not exist.
pub async fn queue_depth(
    broker: &Broker,
    queue: &str,
    group: &str,
    limit: i64,
    offset: i64,
) -> Result<Option<QueueDepth>, BrokerError> {
    let Some(queue) = broker.names.queue(&broker.pool, queue).await? else { return Ok(None) };
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    Ok(Some(depth::queue_depth(&client, queue.id, group, limit, offset).await?))
}
