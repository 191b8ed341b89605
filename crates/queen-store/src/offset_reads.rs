//! Reads by offset: where partitions stand and which segments a read from an offset covers
//! (`POST /api/v1/fetch`), and the partitions of a queue written since a time, with the time up
//! to which that answer is complete (`POST /api/v1/partitions/changed`). Nothing here takes a
//! lock, a lease or moves a cursor; the segments themselves are read through
//! [`crate::segment_cache::SegmentCache::read`].

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;

use crate::StoreError;

/// What one read by offset asks of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadTarget<'a> {
    pub queue: &'a str,
    pub partition: &'a str,
    /// The first offset to read.
    pub offset: i64,
    /// The most decoded segment bytes to plan for: segments are taken while the bytes before them
    /// are fewer (so the segment holding `offset` always is).
    pub budget: i64,
}

/// Where a partition's log stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionLog {
    pub id: i64,
    /// The offset of the newest record; 0 when nothing was ever written.
    pub last_offset: i64,
    /// The oldest offset retention kept (`last_offset + 1` when it kept nothing).
    pub retained_from: i64,
}

/// A segment a read covers, from the one holding the offset asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedSegment {
    pub end_offset: i64,
    /// Decoded bytes of the segments of the plan up to and including this one.
    pub bytes_through: i64,
}

/// The answer of [`plan_reads`] for one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadPlan {
    /// `None` when the queue or the partition does not exist.
    pub partition: Option<PartitionLog>,
    /// In offset order; empty when the offset is not stored (below the watermark, past the end).
    pub segments: Vec<PlannedSegment>,
}

/// For each target, in order: its partition's log, and the segments from the one holding the
/// offset on, while the decoded bytes before them stay under the target's budget, at most
/// `max_segments`. One statement. Per target, the primary key `(partition_id, base_offset)` is
/// probed for the segment holding the offset (the newest one starting at or before it), then once
/// per following segment (segments are contiguous: the next starts one past the end of the one
/// before), and the walk stops where the budget does: the cost grows with what is read, never
/// with the partition's history. A single snapshot: the partition row and its segments agree.
pub async fn plan_reads(
    client: &impl GenericClient,
    targets: &[ReadTarget<'_>],
    max_segments: i64,
) -> Result<Vec<ReadPlan>, StoreError> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let statement = client
        .prepare_cached(
            "SELECT p.id, p.last_offset, p.retained_from, w.ends, w.bytes
               FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])
                    WITH ORDINALITY AS r(queue, partition, first, budget, ord)
               LEFT JOIN queen.queues q ON q.name = r.queue
               LEFT JOIN queen.partitions p ON p.queue_id = q.id AND p.name = r.partition
               LEFT JOIN LATERAL (
                   WITH RECURSIVE walk (base_offset, end_offset, bytes_through, taken) AS (
                       (SELECT h.base_offset, h.end_offset, h.raw_length::bigint, 1
                          FROM queen.log_segments h
                         WHERE h.partition_id = p.id AND h.base_offset <= r.first
                           AND r.first BETWEEN p.retained_from AND p.last_offset
                         ORDER BY h.base_offset DESC LIMIT 1)
                       UNION ALL
                       SELECT s.base_offset, s.end_offset, w.bytes_through + s.raw_length, w.taken + 1
                         FROM walk w
                         JOIN queen.log_segments s ON s.partition_id = p.id AND s.base_offset = w.end_offset + 1
                        WHERE w.bytes_through < r.budget AND w.taken < $5::bigint
                   )
                   SELECT array_agg(end_offset ORDER BY base_offset) AS ends,
                          array_agg(bytes_through ORDER BY base_offset) AS bytes
                     FROM walk
               ) w ON true
              ORDER BY r.ord",
        )
        .await?;
    let queues: Vec<&str> = targets.iter().map(|t| t.queue).collect();
    let partitions: Vec<&str> = targets.iter().map(|t| t.partition).collect();
    let offsets: Vec<i64> = targets.iter().map(|t| t.offset).collect();
    let budgets: Vec<i64> = targets.iter().map(|t| t.budget).collect();
    let rows = client.query(&statement, &[&queues, &partitions, &offsets, &budgets, &max_segments]).await?;
    Ok(rows
        .iter()
        .map(|row| {
            let partition = row.get::<_, Option<i64>>(0).map(|id| PartitionLog {
                id,
                last_offset: row.get(1),
                retained_from: row.get(2),
            });
            let ends: Vec<i64> = row.get::<_, Option<Vec<i64>>>(3).unwrap_or_default();
            let bytes: Vec<i64> = row.get::<_, Option<Vec<i64>>>(4).unwrap_or_default();
            let segments = ends
                .into_iter()
                .zip(bytes)
                .map(|(end_offset, bytes_through)| PlannedSegment { end_offset, bytes_through })
                .collect();
            ReadPlan { partition, segments }
        })
        .collect())
}

/// One page of a queue's partitions, asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangedQuery<'a> {
    pub queue: &'a str,
    /// Only partitions whose newest segment was written at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only partitions with a larger id (the cursor of the previous page; 0 for the first).
    pub after: i64,
    pub limit: i64,
}

/// A partition as a discovery page lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangedPartition {
    pub id: i64,
    pub name: String,
    pub last_offset: i64,
    pub retained_from: i64,
    /// When its newest segment was written; `None` when nothing ever was.
    pub last_write_at: Option<DateTime<Utc>>,
}

/// The answer to one [`ChangedQuery`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangedPage {
    UnknownQueue,
    /// In id (creation) order; `more` when partitions past the last one also match.
    Partitions {
        partitions: Vec<ChangedPartition>,
        more: bool,
    },
}

/// The time up to which every write is visible: no transaction that is still open, or starts
/// later, can commit a segment (or a partition's `last_segment_at`) stamped before it.
///
/// An append stamps its segment with `clock_timestamp()` under the partition row lock, inside
/// its transaction (`log::append`), and commits later; a transaction stamps nothing before it
/// starts. So the bound is the start of the oldest transaction open on this database now, or now
/// when there is none: PostgreSQL reports every session's transaction start in
/// `pg_stat_activity` from the moment the transaction begins until after its commit is visible. A
/// session whose activity is not tracked (`track_activities` off) counts from its own start, a
/// safe if pessimistic bound. Sessions of other roles show no times: they are not the broker's
/// and are not counted. Must be read *before* the snapshot that lists the partitions: a
/// transaction that commits in between is then either still counted here or visible there.
async fn safe_time(client: &impl GenericClient) -> Result<DateTime<Utc>, StoreError> {
    let statement = client
        .prepare_cached(
            "SELECT LEAST(now(), min(COALESCE(a.xact_start, CASE WHEN a.state = 'disabled' THEN a.backend_start END)))
               FROM pg_stat_activity a
              WHERE a.datname = current_database() AND a.backend_type = 'client backend'",
        )
        .await?;
    Ok(client.query_one(&statement, &[]).await?.get(0))
}

/// The [`safe_time`] of the answer, then one page per query: the queue's partitions after the
/// cursor, written at or after `since`, in id order. One statement for the pages: per query, a
/// range scan of `partitions (queue_id, id)` from the cursor (the `since` filter reads each
/// partition row of the range, not an index: `last_segment_at` changes with every push, and an
/// index on it would cost every push its heap-only update).
pub async fn changed_since(
    client: &impl GenericClient,
    queries: &[ChangedQuery<'_>],
) -> Result<(DateTime<Utc>, Vec<ChangedPage>), StoreError> {
    let safe_time = safe_time(client).await?;
    if queries.is_empty() {
        return Ok((safe_time, Vec::new()));
    }
    let statement = client
        .prepare_cached(
            "SELECT r.ord, q.id IS NOT NULL, p.id, p.name, p.last_offset, p.retained_from, p.last_segment_at
               FROM unnest($1::text[], $2::timestamptz[], $3::bigint[], $4::bigint[])
                    WITH ORDINALITY AS r(queue, since, after, page, ord)
               LEFT JOIN queen.queues q ON q.name = r.queue
               LEFT JOIN LATERAL (
                   SELECT p.id, p.name, p.last_offset, p.retained_from, p.last_segment_at
                     FROM queen.partitions p
                    WHERE p.queue_id = q.id AND p.id > r.after
                      AND (r.since IS NULL OR p.last_segment_at >= r.since)
                    ORDER BY p.id
                    LIMIT r.page + 1
               ) p ON true
              ORDER BY r.ord, p.id",
        )
        .await?;
    let queues: Vec<&str> = queries.iter().map(|q| q.queue).collect();
    let since: Vec<Option<DateTime<Utc>>> = queries.iter().map(|q| q.since).collect();
    let after: Vec<i64> = queries.iter().map(|q| q.after).collect();
    let limits: Vec<i64> = queries.iter().map(|q| q.limit).collect();
    let rows = client.query(&statement, &[&queues, &since, &after, &limits]).await?;
    let mut pages: Vec<ChangedPage> = queries.iter().map(|_| ChangedPage::UnknownQueue).collect();
    for row in &rows {
        // The ordinality counts from 1.
        let Some(index) = usize::try_from(row.get::<_, i64>(0) - 1).ok().filter(|i| *i < pages.len()) else {
            continue;
        };
        if !row.get::<_, bool>(1) {
            continue;
        }
        let page = &mut pages[index];
        if *page == ChangedPage::UnknownQueue {
            *page = ChangedPage::Partitions { partitions: Vec::new(), more: false };
        }
        let ChangedPage::Partitions { partitions, more } = page else { continue };
        // A queue without (matching) partitions comes as one row without a partition.
        let Some(id) = row.get::<_, Option<i64>>(2) else { continue };
        // One row past the limit says that there is more.
        if partitions.len() as i64 >= queries[index].limit {
            *more = true;
            continue;
        }
        partitions.push(ChangedPartition {
            id,
            name: row.get(3),
            last_offset: row.get(4),
            retained_from: row.get(5),
            last_write_at: row.get(6),
        });
    }
    Ok((safe_time, pages))
}
