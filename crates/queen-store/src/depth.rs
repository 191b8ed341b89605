//! A queue's backlog for one consumer group, per partition: what is pending past the group's
//! cursor, what a live lease holds, and what could be served now. Watermark arithmetic over the
//! partition and cursor rows; only a queue with `delayedProcessing` pays an index probe per
//! partition whose newest messages are still inside the delay.

use deadpool_postgres::GenericClient;

use crate::StoreError;
use crate::groups::LAG_MESSAGES;

/// One partition's backlog for the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionDepth {
    pub partition_id: i64,
    pub partition: String,
    /// Messages past the group's cursor (or past where it would start, without one).
    pub pending: i64,
    /// Of those, the ones a live lease of the group holds.
    pub processing: i64,
    /// Of those, the ones the group could be served now: none while a live lease holds the
    /// partition (the claim takes no cursor under a lease), the window is open or a retry delay
    /// holds it, and none inside the delay.
    pub ready: i64,
}

/// The queue's backlog for the group: totals over every partition, and one page of partitions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueDepth {
    /// The group is registered on the queue as conflating.
    pub conflation: bool,
    pub pending: i64,
    pub processing: i64,
    pub ready: i64,
    /// Partitions with anything pending.
    pub partitions_pending: i64,
    /// Partitions with anything ready.
    pub partitions_ready: i64,
    pub total_partitions: i64,
    /// The page asked for, in partition name order.
    pub partitions: Vec<PartitionDepth>,
}

/// The backlog of `group` on the queue. A partition the group has no cursor on counts from where
/// the group would start there: its registration's start (as `cursors::ensure_cursors` seeds a
/// cursor), or the oldest retained message for queue mode and an unregistered group (the
/// default, `all`). `limit`/`offset` page the partitions listed; the totals cover them all.
pub async fn queue_depth(
    client: &impl GenericClient,
    queue_id: i64,
    group: &str,
    limit: i64,
    offset: i64,
) -> Result<QueueDepth, StoreError> {
    let sql = format!(
        concat!(
            "WITH place AS (
             SELECT p.id, p.name, {LAG_MESSAGES} AS pending,
                    -- Where the pending messages start after.
                    GREATEST(c.committed, p.retained_from - 1) AS done,
                    -- The last offset of the live lease's span, if one is live.
                    CASE WHEN lc.lease_expires_at > now() THEN LEAST(lc.leased_until, p.last_offset) END AS leased_until,
                    -- Served nothing now: a live lease holds the partition (one lease per cursor),
                    -- the partition's window is open, or a failure's retry delay holds it.
                    COALESCE(lc.lease_expires_at > now() OR lc.retry_at > now(), false)
                        OR (q.window_buffer_seconds > 0
                            AND p.last_segment_at > now() - q.window_buffer_seconds * interval '1 second') AS held,
                    -- The last offset the delay lets be served (the claim's rule).
                    ",
            delay_visible_until_sql!(),
            " AS visible_until
               FROM queen.queues q
               JOIN queen.partitions p ON p.queue_id = q.id
               LEFT JOIN queen.log_consumers lc ON lc.partition_id = p.id AND lc.consumer_group = $2::text
               LEFT JOIN queen.consumer_groups_metadata m ON m.queue_name = q.name AND m.consumer_group = $2::text
              CROSS JOIN LATERAL (SELECT COALESCE(lc.committed, ",
            group_start_sql!("COALESCE(m.subscription_mode, 'all')", "m.subscription_from"),
            ") AS committed) c
              WHERE q.id = $1::bigint
         ), counted AS (
             SELECT id, name, pending,
                    GREATEST(COALESCE(leased_until, 0) - done, 0) AS processing,
                    CASE WHEN held THEN 0 ELSE GREATEST(visible_until - GREATEST(done, leased_until), 0) END AS ready
               FROM place
         ), totals AS (
             SELECT COALESCE(sum(pending), 0)::bigint AS pending, COALESCE(sum(processing), 0)::bigint AS processing,
                    COALESCE(sum(ready), 0)::bigint AS ready, count(*) FILTER (WHERE pending > 0) AS partitions_pending,
                    count(*) FILTER (WHERE ready > 0) AS partitions_ready, count(*) AS partitions
               FROM counted
         )
         SELECT t.pending, t.processing, t.ready, t.partitions_pending, t.partitions_ready, t.partitions,
                COALESCE((SELECT m.conflation FROM queen.consumer_groups_metadata m JOIN queen.queues q ON q.name = m.queue_name
                           WHERE q.id = $1::bigint AND m.consumer_group = $2::text), false),
                page.id, page.name, page.pending, page.processing, page.ready
           FROM totals t
           LEFT JOIN LATERAL (SELECT * FROM counted ORDER BY name LIMIT $3::bigint OFFSET $4::bigint) page ON true
          ORDER BY page.name"
        ),
        LAG_MESSAGES = LAG_MESSAGES
    );
    let rows = client.query(&sql, &[&queue_id, &group, &limit, &offset]).await?;
    let Some(first) = rows.first() else { return Ok(QueueDepth::default()) };
    let partitions = rows
        .iter()
        .filter_map(|row| {
            Some(PartitionDepth {
                partition_id: row.get::<_, Option<i64>>(7)?,
                partition: row.get(8),
                pending: row.get(9),
                processing: row.get(10),
                ready: row.get(11),
            })
        })
        .collect();
    Ok(QueueDepth {
        pending: first.get(0),
        processing: first.get(1),
        ready: first.get(2),
        partitions_pending: first.get(3),
        partitions_ready: first.get(4),
        total_partitions: first.get(5),
        conflation: first.get(6),
        partitions,
    })
}
