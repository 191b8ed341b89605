//! Reading one message back by (partition id, transaction id), with every group's progress on it.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use queen_log::FrameOwned;

use crate::StoreError;
use crate::log::Span;
use crate::segment_cache::{ReadEnd, SegmentCache};
use queen_log::Cipher;

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
    /// One entry per group with a cursor on the partition (queue mode included), or registered
    /// on the queue without one there.
    pub groups: Vec<GroupProgress>,
}

/// The message (its segment read through `segments`, opened with `keys` when sealed), or `None`
/// when the partition holds no such transaction id (or retention removed the message).
pub async fn find(
    client: &impl GenericClient,
    partition_id: i64,
    transaction_id: &str,
    segments: &SegmentCache,
    keys: Option<&Cipher>,
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
    let read =
        segments.read(client, &[Span { partition_id, first: offset, last: offset }], keys, ReadEnd::Anywhere).await?;
    let found = read.iter().find_map(|segment| {
        let (_, frame) = segment.frames_in(offset, offset).next()?;
        Some((segment.created_at, frame.ok()?.to_owned()))
    });
    let Some((created_at, frame)) = found else { return Ok(None) };
    // A registered group with no cursor on the partition yet (cursors are made when a pop reaches
    // it) has consumed the message only if it starts after it.
    let groups = client
        .query(
            concat!(
                "SELECT consumer_group, committed >= $2,
                        CASE WHEN committed < $2 AND lease_expires_at > now() AND leased_until >= $2
                             THEN lease_expires_at END
                   FROM queen.log_consumers WHERE partition_id = $1
                 UNION ALL
                 SELECT m.consumer_group, ",
                group_start_sql!("m.subscription_mode", "m.subscription_from"),
                " >= $2, NULL::timestamptz
                   FROM queen.partitions p
                   JOIN queen.queues q ON q.id = p.queue_id
                   JOIN queen.consumer_groups_metadata m ON m.queue_name = q.name
                  WHERE p.id = $1
                    AND NOT EXISTS (SELECT 1 FROM queen.log_consumers lc
                                     WHERE lc.partition_id = p.id AND lc.consumer_group = m.consumer_group)
                  ORDER BY 1"
            ),
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

/// A message of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedMessage {
    pub partition: String,
    pub partition_id: i64,
    pub offset: i64,
    pub created_at: DateTime<Utc>,
    pub frame: FrameOwned,
}

/// Partitions a listing reads at most, the most recently pushed first.
const LISTED_PARTITIONS: i64 = 50;

/// The newest `limit` messages of the queue (of one partition, when named) after the newest
/// `offset`, newest first. Looks at the last segments of the most recently pushed partitions,
/// through the primary key (or `segments`), and reads only those that hold the newest
/// `limit + offset` of them: a message's time is its segment's, so ranking the segments ranks
/// their messages (every segment as new as the last one needed is read too, so that ties are
/// ranked as before).
pub async fn newest(
    client: &impl GenericClient,
    queue: &str,
    partition: Option<&str>,
    (limit, offset): (i64, i64),
    segments: &SegmentCache,
    keys: Option<&Cipher>,
) -> Result<Vec<ListedMessage>, StoreError> {
    // The newest `offset` are passed over: each partition is read that much further back.
    let reach = limit.saturating_add(offset);
    let rows = client
        .query(
            "WITH parts AS (
                 SELECT p.id, p.name, GREATEST(p.retained_from, p.last_offset - $3 + 1) AS first, p.last_offset AS last
                   FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                  WHERE q.name = $1 AND ($2::text IS NULL OR p.name = $2) AND p.last_offset >= p.retained_from
                  ORDER BY p.last_segment_at DESC NULLS LAST, p.id
                  LIMIT $4
             ), tails AS (
                 SELECT parts.id, parts.name, s.created_at,
                        GREATEST(s.base_offset, parts.first) AS first, LEAST(s.end_offset, parts.last) AS last
                   FROM parts CROSS JOIN LATERAL (
                        SELECT base_offset, end_offset, created_at FROM queen.log_segments
                         WHERE partition_id = parts.id AND end_offset >= parts.first AND base_offset <= parts.last
                         ORDER BY base_offset DESC LIMIT $3) s
             ), ranked AS (
                 SELECT *, sum(last - first + 1) OVER (ORDER BY created_at DESC, last DESC, id
                                                       ROWS UNBOUNDED PRECEDING) - (last - first + 1) AS newer
                   FROM tails
             )
             SELECT id, name, min(first), max(last) FROM ranked
              WHERE created_at >= (SELECT min(created_at) FROM ranked WHERE newer < $3)
              GROUP BY id, name",
            &[&queue, &partition, &reach, &LISTED_PARTITIONS],
        )
        .await?;
    let names: std::collections::HashMap<i64, String> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    let spans: Vec<Span> =
        rows.iter().map(|row| Span { partition_id: row.get(0), first: row.get(2), last: row.get(3) }).collect();
    let mut listed = Vec::new();
    for segment in segments.read(client, &spans, keys, ReadEnd::Anywhere).await? {
        let Some(span) = spans.iter().find(|s| s.partition_id == segment.partition_id) else { continue };
        for (offset, frame) in segment.frames_in(span.first, span.last) {
            let Ok(frame) = frame else { break };
            listed.push(ListedMessage {
                partition: names.get(&segment.partition_id).cloned().unwrap_or_default(),
                partition_id: segment.partition_id,
                offset,
                created_at: segment.created_at,
                frame: frame.to_owned(),
            });
        }
    }
    listed.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.offset.cmp(&a.offset)));
    let skipped = usize::try_from(offset).unwrap_or(0).min(listed.len());
    listed.drain(..skipped);
    listed.truncate(usize::try_from(limit).unwrap_or(0));
    Ok(listed)
}
