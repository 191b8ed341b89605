//! Data lifetime: retention of whole segments, clean-up of empty idle partitions, and the
//! advisory lock that lets one broker of a fleet run each maintenance pass.
//!
//! Retention is opt-in per queue (`retention_enabled`) and has two rules:
//! - by age (`retention_seconds`): segments created before the window are deleted whether or not
//!   any group read them;
//! - consumed only (`completed_retention_seconds`): segments created before the window are
//!   deleted once every group has passed them: each cursor of the partition (`MIN(committed)`),
//!   each group registered on the queue without a cursor there yet (where it will start), and
//!   queue mode once it reads the queue (from the oldest message). The slowest holds the floor,
//!   and a partition nobody reads keeps everything.
//!
//! Segments go from the low end only; `retained_from` (the retention watermark) moves to the
//! oldest surviving segment, and the transaction-id index entries and trace events of deleted
//! segments go with them. Every lookup starts at the watermark, so a pass never walks deleted
//! history. Dead letters are never touched.

use deadpool_postgres::GenericClient;
use tokio_postgres::error::SqlState;

use crate::StoreError;
use crate::log::MAX_SEGMENT_RAW_BYTES;

/// Session advisory lock serialising maintenance passes across brokers ("queenmnt").
pub const MAINTENANCE_LOCK_KEY: i64 = 0x7175_6565_6e6d_6e74;

/// Takes the maintenance lock if no other session holds it. Session-scoped: release it with
/// [`unlock`] on the same connection (a broker that dies releases it with its session).
pub async fn try_lock(client: &impl GenericClient) -> Result<bool, StoreError> {
    Ok(client.query_one("SELECT pg_try_advisory_lock($1)", &[&MAINTENANCE_LOCK_KEY]).await?.get(0))
}

pub async fn unlock(client: &impl GenericClient) -> Result<(), StoreError> {
    client.execute("SELECT pg_advisory_unlock($1)", &[&MAINTENANCE_LOCK_KEY]).await?;
    Ok(())
}

/// A partition whose retained history shrinks: segments from `retained_from` up to (not
/// including) `new_retained_from` go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trim {
    pub partition_id: i64,
    pub retained_from: i64,
    pub new_retained_from: i64,
}

/// The partitions of retention-enabled queues that have segments to delete, with the new
/// watermark each gets (`queue_mode_group`: the group of consumers that name none). Index probes
/// only: the first segment created in the window (through `(partition_id, created_at)`) and the
/// segment holding the slowest position's next offset (through the primary key), both from the
/// watermark up.
pub async fn trims(client: &impl GenericClient, queue_mode_group: &str) -> Result<Vec<Trim>, StoreError> {
    bounds(client, queue_mode_group, None).await
}

/// What [`trims`] finds of one partition now.
async fn trim_of(
    client: &impl GenericClient,
    queue_mode_group: &str,
    partition_id: i64,
) -> Result<Option<Trim>, StoreError> {
    Ok(bounds(client, queue_mode_group, Some(partition_id)).await?.pop())
}

/// [`trims`], of every partition or of `only`.
async fn bounds(
    client: &impl GenericClient,
    queue_mode_group: &str,
    only: Option<i64>,
) -> Result<Vec<Trim>, StoreError> {
    let rows = client
        .query(
            concat!(
                "WITH retaining AS (
                 SELECT q.id, q.name, q.retention_seconds, q.completed_retention_seconds FROM queen.queues q
                  WHERE q.retention_enabled AND (q.retention_seconds > 0 OR q.completed_retention_seconds > 0)
             ), queue_mode AS (
                 -- Consumed-only queues read in queue mode, which will read every partition from
                 -- its oldest message (a probe per partition until one has its cursor).
                 SELECT r.id AS queue_id FROM retaining r
                  WHERE r.completed_retention_seconds > 0
                    AND EXISTS (SELECT 1 FROM queen.partitions p
                                  JOIN queen.log_consumers c ON c.partition_id = p.id AND c.consumer_group = $1
                                 WHERE p.queue_id = r.id)
             ), candidate AS (
                 SELECT p.id, p.retained_from, p.last_offset, q.retention_seconds, q.completed_retention_seconds,
                        (SELECT min(positions.at) FROM (
                             -- An auto-acked claim of the last minute counts from where it
                             -- started: its pop may still move the cursor back to hand out the
                             -- rest later (what its answer's byte bound left out).
                             SELECT CASE WHEN c.lease_expires_at IS NULL AND c.leased_until < c.committed
                                              AND c.last_claimed_at > now() - interval '1 minute'
                                         THEN c.leased_until ELSE c.committed END AS at
                               FROM queen.log_consumers c WHERE c.partition_id = p.id
                             UNION ALL
                             SELECT ",
                group_start_sql!("m.subscription_mode", "m.subscription_from"),
                "
                               FROM queen.consumer_groups_metadata m
                              WHERE m.queue_name = q.name
                                AND NOT EXISTS (SELECT 1 FROM queen.log_consumers c
                                                 WHERE c.partition_id = p.id AND c.consumer_group = m.consumer_group)
                             UNION ALL
                             SELECT p.retained_from - 1 WHERE q.id IN (SELECT queue_id FROM queue_mode)
                                AND NOT EXISTS (SELECT 1 FROM queen.log_consumers c
                                                 WHERE c.partition_id = p.id AND c.consumer_group = $1)
                         ) positions) AS floor
                   FROM retaining q
                   JOIN queen.partitions p ON p.queue_id = q.id
                  WHERE p.last_offset >= p.retained_from AND ($2::bigint IS NULL OR p.id = $2)
             ), bounds AS (
                 SELECT c.*,
                        -- By age: up to the first segment created inside the window.
                        CASE WHEN c.retention_seconds > 0 THEN COALESCE(
                            (SELECT s.base_offset FROM queen.log_segments s
                              WHERE s.partition_id = c.id AND s.base_offset >= c.retained_from
                                AND s.created_at >= now() - c.retention_seconds * interval '1 second'
                              ORDER BY s.created_at, s.base_offset LIMIT 1),
                            c.last_offset + 1)
                        ELSE c.retained_from END AS by_age,
                        -- Consumed only: up to the first segment inside the window, and never past
                        -- the segment holding the slowest cursor's next offset.
                        CASE WHEN c.completed_retention_seconds > 0 AND c.floor IS NOT NULL THEN LEAST(
                            COALESCE(
                                (SELECT s.base_offset FROM queen.log_segments s
                                  WHERE s.partition_id = c.id AND s.base_offset >= c.retained_from
                                    AND s.created_at >= now() - c.completed_retention_seconds * interval '1 second'
                                  ORDER BY s.created_at, s.base_offset LIMIT 1),
                                c.last_offset + 1),
                            CASE WHEN c.floor >= c.last_offset THEN c.last_offset + 1 ELSE COALESCE(
                                (SELECT max(s.base_offset) FROM queen.log_segments s
                                  WHERE s.partition_id = c.id AND s.base_offset >= c.retained_from
                                    AND s.base_offset <= c.floor + 1),
                                c.retained_from) END)
                        ELSE c.retained_from END AS by_consumption
                   FROM candidate c
             )
             SELECT id, retained_from, GREATEST(by_age, by_consumption) FROM bounds
              WHERE GREATEST(by_age, by_consumption) > retained_from
              ORDER BY id"
            ),
            &[&queue_mode_group, &only],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| Trim { partition_id: row.get(0), retained_from: row.get(1), new_retained_from: row.get(2) })
        .collect())
}

/// Deletes the next batch of a trim: `$1` partition, `$2`..`$3` the offsets, at most `$4`
/// segments and, past the first, `$5` bytes of bodies (which the trim reads whole, for their
/// transaction ids: segments of a few MiB each would otherwise put gigabytes in memory at once).
/// The range starts at the watermark, so the walk never touches deleted history (public so that
/// tests can show its plan). A body's length is read from its header, without reading it.
pub const TRIM_SQL: &str = "DELETE FROM queen.log_segments
  WHERE partition_id = $1 AND base_offset >= $2
    AND base_offset < LEAST($3, COALESCE(
        (SELECT w.base_offset FROM (
             SELECT s.base_offset, row_number() OVER (ORDER BY s.base_offset) AS n,
                    sum(octet_length(s.body)) OVER (ORDER BY s.base_offset) AS bytes
               FROM queen.log_segments s
              WHERE s.partition_id = $1 AND s.base_offset >= $2
              ORDER BY s.base_offset LIMIT $4::bigint + 1) w
          WHERE w.n > $4::bigint OR (w.n > 1 AND w.bytes > $5::bigint)
          ORDER BY w.base_offset LIMIT 1), $3))
RETURNING base_offset, end_offset, frame_count, body";

/// The most bytes of segment bodies one trim batch reads (at least one segment, whatever its size).
pub const TRIM_BATCH_BYTES: i64 = 16 << 20;

/// What a trim removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trimmed {
    pub segments: u64,
    pub messages: u64,
}

/// How long a trim batch waits for its partition's row before it starts over (see [`apply_trim`]).
const PARTITION_ROW_WAIT: &str = "SET LOCAL lock_timeout = '100ms'";

/// Batches of one trim started over in a row before it gives up until the next pass.
const BATCH_TRIES: u32 = 5;

/// Deletes the segments of `trim`, `batch` segments (and at most [`TRIM_BATCH_BYTES`] of bodies
/// past the first) per transaction, each transaction also
/// deleting their transaction ids (read from the bodies, opened with `keys` when sealed) and
/// moving the watermark past them.
///
/// Each batch first finds the partition's bound again and goes no further than it: a trim of a
/// large backlog takes a while, and meanwhile a group may seek back or start from the oldest
/// message, lowering the consumed-only floor the pass planned with (`queue_mode_group` as for
/// [`trims`]).
///
/// The watermark moves last, so the partition's row, which every push to the partition updates,
/// is held only for the commit and not through the deletes. A push holds that row while it
/// inserts its transaction ids, though, and one reusing an id this batch deleted waits for the
/// batch: a lock cycle, which PostgreSQL would break only after its deadlock timeout (a second)
/// by failing either side. So the batch waits briefly for the row, and when that is not enough it
/// rolls back, letting the push go first, and starts over.
pub async fn apply_trim(
    client: &mut deadpool_postgres::Client,
    trim: Trim,
    batch: i64,
    keys: Option<&queen_log::Cipher>,
    queue_mode_group: &str,
) -> Result<Trimmed, StoreError> {
    let max_bytes = TRIM_BATCH_BYTES;
    let mut trimmed = Trimmed::default();
    let mut tries = 0;
    loop {
        tries += 1;
        let tx = client.transaction().await?;
        let Some(now) = trim_of(&tx, queue_mode_group, trim.partition_id).await? else {
            tx.commit().await?;
            break;
        };
        let upto = now.new_retained_from.min(trim.new_retained_from);
        let bounds: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&trim.partition_id, &now.retained_from, &upto, &batch, &max_bytes];
        let segments = tx.query(TRIM_SQL, &bounds).await?;
        if segments.is_empty() {
            tx.commit().await?;
            break;
        }
        let mut transaction_ids: Vec<String> = Vec::new();
        let mut unreadable: Vec<(i64, i64)> = Vec::new();
        let mut last_end = 0;
        for row in &segments {
            let (base, end, count): (i64, i64, i32) = (row.get(0), row.get(1), row.get(2));
            last_end = last_end.max(end);
            let body: &[u8] = row.get(3);
            let frames = crate::log::opened(body, keys)
                .and_then(|body| queen_log::decode_segment(&body, count.max(0) as usize, MAX_SEGMENT_RAW_BYTES));
            match frames {
                Ok(frames) => {
                    transaction_ids.extend(frames.frames().filter_map(Result::ok).map(|f| f.transaction_id.to_owned()))
                }
                Err(e) => {
                    tracing::warn!(partition_id = trim.partition_id, base, error = %e, "retaining away an unreadable segment");
                    unreadable.push((base, end));
                }
            }
        }
        // Guarded by offset: under a dedup window a later message may hold the same id now.
        let mut messages = tx
            .execute(
                "DELETE FROM queen.log_message_ids
                  WHERE partition_id = $1 AND transaction_id = ANY($2) AND message_offset <= $3",
                &[&trim.partition_id, &transaction_ids, &last_end],
            )
            .await?;
        for (base, end) in unreadable {
            // Its ids cannot be read, so find them by offset (a scan of this partition's ids).
            messages += tx
                .execute(
                    "DELETE FROM queen.log_message_ids WHERE partition_id = $1 AND message_offset BETWEEN $2 AND $3",
                    &[&trim.partition_id, &base, &end],
                )
                .await?;
        }
        // The trace events of the removed messages go with them.
        crate::traces::delete_retained(&tx, trim.partition_id, last_end + 1).await?;
        tx.batch_execute(PARTITION_ROW_WAIT).await?;
        let watermark = tx
            .execute(
                "UPDATE queen.partitions SET retained_from = GREATEST(retained_from, $2) WHERE id = $1",
                &[&trim.partition_id, &(last_end + 1)],
            )
            .await;
        match watermark {
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) && tries < BATCH_TRIES => {
                tx.rollback().await?;
                continue;
            }
            result => result?,
        };
        tx.commit().await?;
        tries = 0;
        trimmed.segments += segments.len() as u64;
        trimmed.messages += messages;
    }
    Ok(trimmed)
}

/// A partition removed by clean-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedPartition {
    pub queue: String,
    pub queue_id: i64,
    pub partition: String,
}

/// Deletes (with every group's cursor on them) up to `limit` partitions that are empty
/// (everything retained away, or never written) and have been idle, without pushes or consumer
/// activity, for `idle_days`.
pub async fn clean_up_partitions(
    client: &impl GenericClient,
    idle_days: f64,
    limit: i64,
) -> Result<Vec<RemovedPartition>, StoreError> {
    let rows = client
        .query(
            "WITH idle AS (
                 SELECT p.id FROM queen.partitions p
                  WHERE p.last_offset < p.retained_from
                    AND COALESCE(p.last_segment_at, p.created_at) < now() - $1 * interval '1 day'
                    AND p.created_at < now() - $1 * interval '1 day'
                    AND NOT EXISTS (
                        SELECT 1 FROM queen.log_consumers c
                         WHERE c.partition_id = p.id
                           AND (c.lease_expires_at > now()
                                OR GREATEST(c.created_at, c.last_claimed_at, c.last_consumed_at)
                                   >= now() - $1 * interval '1 day'))
                  ORDER BY p.id
                  LIMIT $2
                    FOR UPDATE SKIP LOCKED
             ), removed AS (
                 DELETE FROM queen.partitions p USING idle, queen.queues q
                  WHERE p.id = idle.id AND q.id = p.queue_id
                    -- A push that got in first made it non-empty again.
                    AND p.last_offset < p.retained_from
              RETURNING q.name AS queue, q.id AS queue_id, p.name AS partition
             ), unnamed AS (
                 DELETE FROM queen.partition_names n USING removed r
                  WHERE n.queue_id = r.queue_id AND n.name = r.partition
             )
             SELECT queue, queue_id, partition FROM removed",
            &[&idle_days, &limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| RemovedPartition { queue: row.get(0), queue_id: row.get(1), partition: row.get(2) })
        .collect())
}

/// Records a pass in `queen.maintenance_runs`, pruning the log's week-old rows.
pub async fn record_run(
    client: &impl GenericClient,
    broker: &str,
    started_at: chrono::DateTime<chrono::Utc>,
    trimmed: Trimmed,
    partitions_deleted: u64,
) -> Result<(), StoreError> {
    client
        .execute(
            "WITH pruned AS (DELETE FROM queen.maintenance_runs WHERE started_at < now() - interval '7 days')
             INSERT INTO queen.maintenance_runs (broker, started_at, segments_deleted, messages_deleted, partitions_deleted)
             VALUES ($1, $2, $3, $4, $5)",
            &[&broker, &started_at, &(trimmed.segments as i64), &(trimmed.messages as i64), &(partitions_deleted as i64)],
        )
        .await?;
    Ok(())
}
