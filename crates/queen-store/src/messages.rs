//! Reading one message back by (partition id, transaction id), with every group's progress on it.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use queen_log::FrameOwned;

use crate::StoreError;
use crate::log::{Span, read_spans};

/// One group's progress on a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupProgress {
    pub group: String,
    /// The group's cursor has passed the message.
    pub consumed: bool,
    /// When the live lease that holds the message runs out, if one does.
    pub lease_expires_at: Option<DateTime<Utc>>,
}

/// A stored message with where it lives and who has consumed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub queue: String,
    pub namespace: Option<String>,
    pub task: Option<String>,
    pub partition: String,
    pub partition_id: i64,
    pub offset: i64,
    pub created_at: DateTime<Utc>,
    pub frame: FrameOwned,
    /// One entry per group with a cursor on the partition, queue mode included.
    pub groups: Vec<GroupProgress>,
}

/// The message, or `None` when the partition holds no such transaction id (or retention removed
/// the message).
pub async fn find(
    client: &impl GenericClient,
    partition_id: i64,
    transaction_id: &str,
) -> Result<Option<StoredMessage>, StoreError> {
    let Some(row) = client
        .query_opt(
            "SELECT m.message_offset, p.name, q.name, q.namespace, q.task
               FROM queen.log_message_ids m
               JOIN queen.partitions p ON p.id = m.partition_id
               JOIN queen.queues q ON q.id = p.queue_id
              WHERE m.partition_id = $1 AND m.transaction_id = $2",
            &[&partition_id, &transaction_id],
        )
        .await?
    else {
        return Ok(None);
    };
    let offset: i64 = row.get(0);
    let segments = read_spans(client, &[Span { partition_id, first: offset, last: offset }]).await?;
    let found = segments.iter().find_map(|segment| {
        let index = usize::try_from(offset - segment.base_offset).ok()?;
        let frame = segment.frames.frames().nth(index)?.ok()?;
        Some((segment.created_at, frame.to_owned()))
    });
    let Some((created_at, frame)) = found else { return Ok(None) };
    let groups = client
        .query(
            "SELECT consumer_group, committed >= $2,
                    CASE WHEN committed < $2 AND lease_expires_at > now() AND leased_until >= $2
                         THEN lease_expires_at END
               FROM queen.log_consumers WHERE partition_id = $1 ORDER BY consumer_group",
            &[&partition_id, &offset],
        )
        .await?
        .iter()
        .map(|row| GroupProgress { group: row.get(0), consumed: row.get(1), lease_expires_at: row.get(2) })
        .collect();
    Ok(Some(StoredMessage {
        queue: row.get(2),
        namespace: row.get(3),
        task: row.get(4),
        partition: row.get(1),
        partition_id,
        offset,
        created_at,
        frame,
        groups,
    }))
}
