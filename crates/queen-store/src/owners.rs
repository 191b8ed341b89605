//! Which queue a partition or a lease belongs to: what authorizing a token confined to queue
//! name prefixes asks before a request that names only partition ids or a lease id.

use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::StoreError;

/// The names of the queues of these partitions, each once.
pub async fn queues_of_partitions(client: &impl GenericClient, partitions: &[i64]) -> Result<Vec<String>, StoreError> {
    let rows = client
        .query(
            "SELECT DISTINCT q.name FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
              WHERE p.id = ANY($1)",
            &[&partitions],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// The names of the queues whose partitions hold the lease (live or not), each once.
pub async fn queues_of_lease(client: &impl GenericClient, lease: Uuid) -> Result<Vec<String>, StoreError> {
    let rows = client
        .query(
            "SELECT DISTINCT q.name FROM queen.log_consumers c
               JOIN queen.partitions p ON p.id = c.partition_id
               JOIN queen.queues q ON q.id = p.queue_id
              WHERE c.lease_id = $1",
            &[&lease],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}
