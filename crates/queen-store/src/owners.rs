//! Which queue a partition or a lease belongs to: what authorizing a token confined to queue
//! name prefixes asks before a request that names only partition ids or a lease id.

use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::StoreError;

/// Who owns a set of partitions.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PartitionOwners {
    /// The names of their queues, each once.
    pub queues: Vec<String>,
    /// The partitions no queue has: never made, or cleaned up since (their dead letters stay).
    pub unknown: Vec<i64>,
}

/// The queues of these partitions, and the partitions none has.
pub async fn queues_of_partitions(
    client: &impl GenericClient,
    partitions: &[i64],
) -> Result<PartitionOwners, StoreError> {
    let rows = client
        .query(
            "SELECT DISTINCT x.id, q.name FROM unnest($1::bigint[]) AS x(id)
               LEFT JOIN queen.partitions p ON p.id = x.id LEFT JOIN queen.queues q ON q.id = p.queue_id",
            &[&partitions],
        )
        .await?;
    let mut owners = PartitionOwners::default();
    for row in &rows {
        match row.get::<_, Option<String>>(1) {
            Some(queue) if !owners.queues.contains(&queue) => owners.queues.push(queue),
            Some(_) => {}
            None => owners.unknown.push(row.get(0)),
        }
    }
    Ok(owners)
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
