//! What authorizing a token confined to queue name prefixes needs to know: which queues a
//! request's partitions or lease belong to. Asked only for confined tokens.

use queen_store::owners::PartitionOwners;
use uuid::Uuid;

use super::{Broker, BrokerError};

/// The queues the partitions belong to, and the partitions that belong to none.
pub async fn queues_of_partitions(broker: &Broker, partitions: &[i64]) -> Result<PartitionOwners, BrokerError> {
    let client = broker.pool.get().await.map_err(queen_store::StoreError::from)?;
    Ok(queen_store::owners::queues_of_partitions(&client, partitions).await?)
}

/// The names of the queues whose partitions the lease covers.
pub async fn queues_of_lease(broker: &Broker, lease: Uuid) -> Result<Vec<String>, BrokerError> {
    let client = broker.pool.get().await.map_err(queen_store::StoreError::from)?;
    Ok(queen_store::owners::queues_of_lease(&client, lease).await?)
}
