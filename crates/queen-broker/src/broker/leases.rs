//! Lease extension: a slow consumer keeps the partitions it holds.

use queen_store::StoreError;
use queen_store::cursors::{self, LeaseExtension};
use uuid::Uuid;

use super::Broker;
use super::BrokerError;

/// Extends a live lease on every partition it covers, to `seconds` from now (the queue's lease
/// time when `None`), never shortening it: looked for on its partitions when this broker granted
/// it, otherwise everywhere.
pub async fn extend(broker: &Broker, lease_id: Uuid, seconds: Option<i32>) -> Result<LeaseExtension, BrokerError> {
    let partitions = broker.deliveries.partitions_of(lease_id);
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    Ok(cursors::extend_lease(&client, lease_id, partitions.as_deref().map(Vec::as_slice), seconds).await?)
}
