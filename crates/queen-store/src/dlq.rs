//! Dead letters: listing them, re-queuing one as a new message, deleting them.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use std::borrow::Cow;
use std::sync::Arc;

use queen_log::Cipher;

use crate::log::{AppendPolicy, Appended, Destination, NewMessage, append_in_transaction, opened};
use crate::queues::CreationLimits;
use crate::{StoreError, queues};

/// One dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub id: i64,
    pub queue: String,
    pub partition: String,
    pub partition_id: i64,
    pub consumer_group: String,
    pub offset: i64,
    /// `None`, like the transaction id (when it was not known either), the payload and the
    /// creation time, when retention removed the message before it was copied.
    pub message_id: Option<Uuid>,
    pub transaction_id: Option<String>,
    pub trace_id: Option<Uuid>,
    /// `producerSub` of the message.
    pub producer: Option<String>,
    /// The message's data as JSON text.
    pub payload: Option<Vec<u8>>,
    pub error: Option<String>,
    pub retry_count: i32,
    pub created_at: Option<DateTime<Utc>>,
    pub failed_at: DateTime<Utc>,
}

/// Which dead letters to list; every filter is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterFilter {
    pub queue: Option<String>,
    pub consumer_group: Option<String>,
    pub partition: Option<String>,
    /// Failed at or after.
    pub from: Option<DateTime<Utc>>,
    /// Failed at or before.
    pub to: Option<DateTime<Utc>>,
    pub limit: i64,
    pub offset: i64,
}

/// A page of dead letters, newest first, with how many match in all; payloads stored sealed are
/// opened with `keys`. The page ends before its payloads pass `max_bytes` (it holds at least one
/// dead letter), so a page of large messages is not read whole.
pub async fn list(
    client: &impl GenericClient,
    filter: &DeadLetterFilter,
    keys: Option<&Cipher>,
    max_bytes: i64,
) -> Result<(Vec<DeadLetter>, i64), StoreError> {
    let rows = client
        .query(
            "SELECT id, queue_name, partition_name, partition_id, consumer_group, message_offset, message_id,
                    transaction_id, trace_id, payload, error_message, retry_count, message_created_at, failed_at,
                    total, producer_sub
               FROM (SELECT *, sum(octet_length(payload)) OVER w AS through, row_number() OVER w AS place
                       FROM (SELECT *, count(*) OVER () AS total FROM queen.log_dlq
                              WHERE ($1::text IS NULL OR queue_name = $1)
                                AND ($2::text IS NULL OR consumer_group = $2)
                                AND ($3::text IS NULL OR partition_name = $3)
                                AND ($4::timestamptz IS NULL OR failed_at >= $4)
                                AND ($5::timestamptz IS NULL OR failed_at <= $5)
                              ORDER BY failed_at DESC, id DESC
                              LIMIT $6 OFFSET $7) page
                     WINDOW w AS (ORDER BY failed_at DESC, id DESC ROWS UNBOUNDED PRECEDING)) counted
              WHERE through <= $8 OR place = 1
              ORDER BY failed_at DESC, id DESC",
            &[
                &filter.queue,
                &filter.consumer_group,
                &filter.partition,
                &filter.from,
                &filter.to,
                &filter.limit,
                &filter.offset,
                &max_bytes,
            ],
        )
        .await?;
    let total = match rows.first() {
        Some(row) => row.get(14),
        // An offset past the end returns no rows; count the matches on their own then.
        None if filter.offset > 0 => {
            client
                .query_one(
                    "SELECT count(*) FROM queen.log_dlq
                      WHERE ($1::text IS NULL OR queue_name = $1) AND ($2::text IS NULL OR consumer_group = $2)
                        AND ($3::text IS NULL OR partition_name = $3)
                        AND ($4::timestamptz IS NULL OR failed_at >= $4) AND ($5::timestamptz IS NULL OR failed_at <= $5)",
                    &[&filter.queue, &filter.consumer_group, &filter.partition, &filter.from, &filter.to],
                )
                .await?
                .get(0)
        }
        None => 0,
    };
    let letters = rows
        .iter()
        .map(|row| {
            let id: i64 = row.get(0);
            let payload =
                row.get::<_, Option<&[u8]>>(9).map(|stored| dead_letter_payload(id, stored, keys)).transpose()?;
            Ok(DeadLetter {
                id,
                queue: row.get(1),
                partition: row.get(2),
                partition_id: row.get(3),
                consumer_group: row.get(4),
                offset: row.get(5),
                message_id: row.get(6),
                transaction_id: row.get(7),
                trace_id: row.get(8),
                producer: row.get(15),
                payload: payload.map(Cow::into_owned),
                error: row.get(10),
                retry_count: row.get(11),
                created_at: row.get(12),
                failed_at: row.get(13),
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok((letters, total))
}

/// A dead letter's payload as it was pushed: opened when it was stored sealed.
fn dead_letter_payload<'a>(id: i64, stored: &'a [u8], keys: Option<&Cipher>) -> Result<Cow<'a, [u8]>, StoreError> {
    if queen_log::is_sealed(stored) && keys.is_none() {
        return Err(StoreError::NoEncryptionKey { subject: format!("dead letter {id}") });
    }
    opened(stored, keys).map_err(|source| StoreError::SealedDeadLetter { id, source })
}

/// What re-queuing a dead letter did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requeued {
    pub queue: String,
    pub queue_id: i64,
    pub partition_id: i64,
    /// The new message's transaction id: `dlq:<dead-letter id>`.
    pub transaction_id: String,
    pub outcome: Appended,
    /// Dead letters of the message that were removed (one per group that gave up on it).
    pub dead_letters: u64,
    /// The length of the message's data.
    pub payload_bytes: usize,
}

/// What re-queuing the dead letters of a message found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requeue {
    Moved(Requeued),
    /// The message has no dead letter.
    NoDeadLetter,
    /// Its dead letters were recorded after retention removed the message: nothing to push.
    PayloadRetained,
    /// The queue holds its `maxSize` messages (counted as a push counts them): nothing moved.
    QueueFull {
        queue: String,
        depth: i64,
        max_size: i64,
    },
}

/// Moves the dead letters of a message back into its partition as one new message (transaction
/// id `dlq:<lowest dead-letter id>`, same data: opened with `keys` when sealed, and sealed again
/// when the queue is encrypted), removing them, in one transaction. Two messages may share the
/// transaction id (one pushed again past its queue's dedup window): the earlier one's dead
/// letters are moved, and the later one's stay for the next retry. The new message reaches every
/// group of the queue, like any push. A queue or partition removed since is created again,
/// within `limits`.
pub async fn requeue(
    client: &mut deadpool_postgres::Client,
    partition_id: i64,
    transaction_id: &str,
    keys: Option<&Cipher>,
    limits: CreationLimits,
) -> Result<Requeue, StoreError> {
    let tx = client.transaction().await?;
    let rows = tx
        .query(
            "DELETE FROM queen.log_dlq
              WHERE partition_id = $1 AND transaction_id = $2 AND payload IS NOT NULL
                AND message_offset = (SELECT min(message_offset) FROM queen.log_dlq
                                       WHERE partition_id = $1 AND transaction_id = $2 AND payload IS NOT NULL)
          RETURNING id, queue_name, partition_name, trace_id, payload, producer_sub",
            &[&partition_id, &transaction_id],
        )
        .await?;
    let Some(first) = rows.iter().min_by_key(|row| row.get::<_, i64>(0)) else {
        let without_payload = tx
            .query_opt(
                "SELECT 1 FROM queen.log_dlq WHERE partition_id = $1 AND transaction_id = $2 LIMIT 1",
                &[&partition_id, &transaction_id],
            )
            .await?;
        return Ok(if without_payload.is_some() { Requeue::PayloadRetained } else { Requeue::NoDeadLetter });
    };
    let (id, queue, partition): (i64, String, String) = (first.get(0), first.get(1), first.get(2));
    // The partition may have been cleaned up since: re-create it (and its queue) by name.
    let settings = match queues::find_queue(&tx, &queue).await? {
        Some(found) => found,
        None => {
            let created = queues::create_queues(&tx, &[&queue], limits.queues).await?;
            created.into_iter().next().ok_or(StoreError::Missing("queue"))?
        }
    };
    let queue_id = settings.id;
    if settings.options.max_size > 0 {
        // Under the queue's capacity lock, as capped pushes take it (before the partition's).
        queues::lock_capacity(&tx, queue_id).await?;
        let depth = queues::unconsumed_depth(&tx, &settings).await?;
        if depth >= settings.options.max_size {
            return Ok(Requeue::QueueFull { queue, depth, max_size: settings.options.max_size });
        }
    }
    let seal = match (settings.options.encryption_enabled, keys) {
        (false, _) => None,
        (true, Some(cipher)) => Some(Arc::new(cipher.clone())),
        (true, None) => return Err(StoreError::NoEncryptionKey { subject: format!("queue {queue:?}") }),
    };
    let target = match queues::find_partition(&tx, queue_id, &partition).await? {
        Some(id) => id,
        None => {
            let created =
                queues::create_partitions(&tx, queue_id, &queue, &[&partition], limits.partitions_per_queue).await?;
            created.first().map(|(_, id)| *id).ok_or(StoreError::Missing("partition"))?
        }
    };
    let new_transaction_id = format!("dlq:{id}");
    let payload = dead_letter_payload(id, first.get(4), keys)?;
    let payload_bytes = payload.len();
    let message = NewMessage {
        message_id: queen_log::new_message_id(),
        transaction_id: new_transaction_id.clone(),
        trace_id: first.get(3),
        producer: first.get(5),
        payload: payload.into_owned(),
        received: None,
    };
    let destination = Destination { queue_id, queue: &queue, partition_id: target };
    // Its transaction id is new by construction, so no dedup window matters.
    let policy = AppendPolicy { dedup_window_seconds: 0, seal };
    let appended = append_in_transaction(&tx, destination, std::slice::from_ref(&message), &policy).await?;
    tx.commit().await?;
    let outcome = appended.outcomes.into_iter().next().ok_or(StoreError::Missing("append outcome"))?;
    Ok(Requeue::Moved(Requeued {
        queue,
        queue_id,
        partition_id: target,
        transaction_id: new_transaction_id,
        outcome,
        dead_letters: rows.len() as u64,
        payload_bytes,
    }))
}

/// Deletes the dead letters of a message; how many there were.
pub async fn delete(client: &impl GenericClient, partition_id: i64, transaction_id: &str) -> Result<u64, StoreError> {
    Ok(client
        .execute(
            "DELETE FROM queen.log_dlq WHERE partition_id = $1 AND transaction_id = $2",
            &[&partition_id, &transaction_id],
        )
        .await?)
}
