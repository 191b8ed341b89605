//! Consumer groups as a whole: registration of where a group starts, seek, subscription
//! changes, deletion, and lag.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use crate::cursors::CursorSeed;
use crate::{Creation, LimitReached, StoreError};

/// Records where `group` starts on `queue` and whether it conflates, unless it already has a
/// registration: the first pop of a (queue, group) pair decides, and later requests with other
/// settings change nothing. `new` is stored as the registration time, so partitions created later
/// are read from then.
pub async fn register(
    client: &impl GenericClient,
    queue: &str,
    group: &str,
    seed: CursorSeed,
    conflation: bool,
) -> Result<(), StoreError> {
    let (mode, from): (&str, Option<DateTime<Utc>>) = match seed {
        CursorSeed::Oldest => ("all", None),
        CursorSeed::End => ("new", None),
        CursorSeed::From(at) => ("timestamp", Some(at)),
    };
    let statement = client
        .prepare_cached(
            "INSERT INTO queen.consumer_groups_metadata
                    (queue_name, consumer_group, subscription_mode, subscription_from, conflation)
             VALUES ($1, $2, $3, CASE WHEN $3 = 'new' THEN now() ELSE $4 END, $5)
             ON CONFLICT (queue_name, consumer_group) DO NOTHING",
        )
        .await?;
    client.execute(&statement, &[&queue, &group, &mode, &from, &conflation]).await?;
    Ok(())
}

/// When the group was first registered for `new` messages on one of `queues`, if it was.
pub async fn earliest_new_registration(
    client: &impl GenericClient,
    queues: &[&str],
    group: &str,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let row = client
        .query_one(
            "SELECT min(subscription_from) FROM queen.consumer_groups_metadata
              WHERE consumer_group = $1 AND queue_name = ANY($2) AND subscription_mode = 'new'",
            &[&group, &queues],
        )
        .await?;
    Ok(row.get(0))
}

/// Which of `queues` the group is registered on as conflating (see [`register`]); a queue it has
/// no registration on is not.
pub async fn conflating(client: &impl GenericClient, queues: &[&str], group: &str) -> Result<Vec<String>, StoreError> {
    let statement = client
        .prepare_cached(
            "SELECT queue_name FROM queen.consumer_groups_metadata
              WHERE queue_name = ANY($1::text[]) AND consumer_group = $2 AND conflation",
        )
        .await?;
    Ok(client.query(&statement, &[&queues, &group]).await?.iter().map(|row| row.get(0)).collect())
}

/// The class of the group-creation locks ("qgrp"); the object is the hash of the queue's name
/// (`hashtext`), since a group registers on a queue by name, even before the queue exists.
const GROUP_CREATION_LOCK_CLASS: i32 = 0x7167_7270;

/// The queues among `queues` the group has no registration on.
pub async fn unregistered(
    client: &impl GenericClient,
    queues: &[&str],
    group: &str,
) -> Result<Vec<String>, StoreError> {
    let statement = client
        .prepare_cached(
            "SELECT q FROM unnest($1::text[]) AS q
              WHERE NOT EXISTS (SELECT 1 FROM queen.consumer_groups_metadata m
                                 WHERE m.queue_name = q AND m.consumer_group = $2)",
        )
        .await?;
    Ok(client.query(&statement, &[&queues, &group]).await?.iter().map(|row| row.get(0)).collect())
}

/// Admits `group` as a consumer group of `queue`, within `max` (0 = no limit): a group that
/// exists there already (registered, or with a cursor on one of its partitions) always is, a new
/// one only while the queue has fewer than `max` groups (`uncounted`, queue mode, never counts).
/// Checked under the queue's group-creation lock, held until the caller's transaction ends: the
/// caller then creates what makes the group exist (its registration, its cursors) in that
/// transaction, so the next admission counts it, on whichever broker. A group that does not fit
/// is [`StoreError::LimitReached`], and the caller's transaction must be rolled back.
pub async fn admit(
    tx: &deadpool_postgres::Transaction<'_>,
    queue: &str,
    group: &str,
    uncounted: &str,
    max: i64,
) -> Result<(), StoreError> {
    if max <= 0 {
        return Ok(());
    }
    // A group that exists takes no lock; a new one is checked again under it, since another
    // broker may have admitted it meanwhile.
    if is_group_of(tx, queue, group).await? {
        return Ok(());
    }
    tx.execute("SELECT pg_advisory_xact_lock($1, hashtext($2::text))", &[&GROUP_CREATION_LOCK_CLASS, &queue]).await?;
    if is_group_of(tx, queue, group).await? {
        return Ok(());
    }
    let count = tx
        .prepare_cached(
            "SELECT count(*) FROM (
                 SELECT consumer_group FROM queen.consumer_groups_metadata WHERE queue_name = $1
                 UNION
                 SELECT c.consumer_group FROM queen.log_consumers c
                   JOIN queen.partitions p ON p.id = c.partition_id
                   JOIN queen.queues q ON q.id = p.queue_id
                  WHERE q.name = $1
             ) g WHERE g.consumer_group <> $2",
        )
        .await?;
    let held: i64 = tx.query_one(&count, &[&queue, &uncounted]).await?.get(0);
    if held >= max {
        let queue = Some(queue.to_owned());
        return Err(LimitReached { what: Creation::Groups, queue, held, adding: 1, max }.into());
    }
    Ok(())
}

/// Whether the group exists on the queue: registered there, or with a cursor on one of its
/// partitions.
async fn is_group_of(tx: &deadpool_postgres::Transaction<'_>, queue: &str, group: &str) -> Result<bool, StoreError> {
    let statement = tx
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM queen.consumer_groups_metadata WHERE queue_name = $1 AND consumer_group = $2)
                 OR EXISTS (SELECT 1 FROM queen.log_consumers c
                              JOIN queen.partitions p ON p.id = c.partition_id
                              JOIN queen.queues q ON q.id = p.queue_id
                             WHERE q.name = $1 AND c.consumer_group = $2)",
        )
        .await?;
    Ok(tx.query_one(&statement, &[&queue, &group]).await?.get(0))
}

/// Registers the group (see [`register`]) on every one of `queues`, each admitted within `max`
/// (see [`admit`]), in one transaction: on all of them, or, when one has no room for another
/// group, on none.
pub async fn register_within(
    client: &mut deadpool_postgres::Client,
    queues: &[&str],
    group: &str,
    seed: CursorSeed,
    conflation: bool,
    uncounted: &str,
    max: i64,
) -> Result<(), StoreError> {
    let tx = client.transaction().await?;
    // The locks in one order, whoever takes several.
    for queue in crate::queues::creation_order(queues) {
        admit(&tx, queue, group, uncounted, max).await?;
        register(&tx, queue, group, seed, conflation).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Where a seek moves a cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekTarget {
    /// The partition's last offset: skip everything pending.
    End,
    /// Just below the first segment created at or after the time (the partition's end when none
    /// is; the oldest retained segment when the time is older than all of them).
    Time(DateTime<Utc>),
}

/// One cursor a seek set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeekedPartition {
    pub partition_id: i64,
    pub partition: String,
    pub committed: i64,
}

/// Moves the group's cursor on every partition of the queue (or just `only_partition`). On each
/// partition it sets `committed`, releases any live lease (the lease id stays, so the abandoned
/// batch's acks are refused as an expired lease), resets the retry and redelivery counters, and
/// creates the cursor when the group has none. The timestamp walk starts at the retention
/// watermark and is segment-granular.
pub async fn seek(
    client: &impl GenericClient,
    queue_id: i64,
    only_partition: Option<i64>,
    group: &str,
    target: SeekTarget,
) -> Result<Vec<SeekedPartition>, StoreError> {
    let (to_end, at): (bool, Option<DateTime<Utc>>) = match target {
        SeekTarget::End => (true, None),
        SeekTarget::Time(at) => (false, Some(at)),
    };
    let statement = client
        .prepare_cached(
            "WITH target AS (
                 SELECT p.id, p.name,
                        CASE WHEN $4 THEN p.last_offset
                             ELSE COALESCE(
                                 (SELECT s.base_offset - 1 FROM queen.log_segments s
                                   WHERE s.partition_id = p.id AND s.created_at >= $5 AND s.base_offset >= p.retained_from
                                   ORDER BY s.created_at, s.base_offset LIMIT 1),
                                 p.last_offset)
                        END AS committed
                   FROM queen.partitions p
                  WHERE p.queue_id = $1 AND ($2::bigint IS NULL OR p.id = $2)
             ), moved AS (
                 INSERT INTO queen.log_consumers AS c (partition_id, consumer_group, committed)
                 SELECT id, $3, committed FROM target
                 ON CONFLICT (partition_id, consumer_group) DO UPDATE
                    SET committed = EXCLUDED.committed,
                        -- What the group received before a backward seek is to be received
                        -- again: an ack without a lease cannot commit it before then.
                        delivered_until = EXCLUDED.committed,
                        lease_expires_at = NULL,
                        leased_until = NULL,
                        retry_count = 0,
                        redelivery_count = 0,
                        head_attempts = 0,
                        head_expiries = 0,
                        retry_at = NULL
                 RETURNING c.partition_id, c.committed
             )
             SELECT m.partition_id, t.name, m.committed FROM moved m JOIN target t ON t.id = m.partition_id
              ORDER BY t.name",
        )
        .await?;
    let rows = match client.query(&statement, &[&queue_id, &only_partition, &group, &to_end, &at]).await {
        // The queue was deleted while the seek waited for its cursors.
        Err(e) if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) => return Err(StoreError::Missing("queue")),
        rows => rows?,
    };
    Ok(rows
        .iter()
        .map(|row| SeekedPartition { partition_id: row.get(0), partition: row.get(1), committed: row.get(2) })
        .collect())
}

/// Sets the group's stored start time on every queue it is registered on or has cursors on (a
/// group that only ever sought there is registered by it, not conflating). Existing cursors do
/// not move; the queues whose registration changed come back, in name order.
pub async fn update_subscription(
    client: &impl GenericClient,
    group: &str,
    from: DateTime<Utc>,
) -> Result<Vec<String>, StoreError> {
    let rows = client
        .query(
            "INSERT INTO queen.consumer_groups_metadata (queue_name, consumer_group, subscription_mode, subscription_from)
             SELECT queue_name, $1, 'timestamp', $2
               FROM (SELECT queue_name FROM queen.consumer_groups_metadata WHERE consumer_group = $1
                     UNION
                     SELECT q.name FROM queen.log_consumers c
                       JOIN queen.partitions p ON p.id = c.partition_id
                       JOIN queen.queues q ON q.id = p.queue_id
                      WHERE c.consumer_group = $1) AS known
              ORDER BY queue_name
             ON CONFLICT (queue_name, consumer_group) DO UPDATE
                SET subscription_mode = 'timestamp', subscription_from = $2, updated_at = now()
          RETURNING queue_name",
            &[&group, &from],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// What deleting a group removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDeleted {
    /// Cursor rows dropped.
    pub deleted_partitions: u64,
    pub metadata_deleted: u64,
    /// Queues the group had cursors or a registration on.
    pub queues: Vec<String>,
}

/// Drops the group's cursors (and with them its leases) on every queue, or on `queue` only, and
/// its registrations when `delete_metadata`.
pub async fn delete_group(
    client: &impl GenericClient,
    group: &str,
    queue: Option<&str>,
    delete_metadata: bool,
) -> Result<GroupDeleted, StoreError> {
    let rows = client
        .query(
            "WITH cursors AS (
                 DELETE FROM queen.log_consumers c USING queen.partitions p, queen.queues q
                  WHERE c.consumer_group = $1 AND p.id = c.partition_id AND q.id = p.queue_id
                    AND ($2::text IS NULL OR q.name = $2)
              RETURNING q.name
             ), registrations AS (
                 DELETE FROM queen.consumer_groups_metadata
                  WHERE $3 AND consumer_group = $1 AND ($2::text IS NULL OR queue_name = $2)
              RETURNING queue_name
             )
             SELECT 'cursor', name FROM cursors UNION ALL SELECT 'registration', queue_name FROM registrations",
            &[&group, &queue, &delete_metadata],
        )
        .await?;
    let mut deleted = GroupDeleted { deleted_partitions: 0, metadata_deleted: 0, queues: Vec::new() };
    for row in &rows {
        let kind: &str = row.get(0);
        if kind == "cursor" {
            deleted.deleted_partitions += 1;
        } else {
            deleted.metadata_deleted += 1;
        }
        deleted.queues.push(row.get(1));
    }
    deleted.queues.sort();
    deleted.queues.dedup();
    Ok(deleted)
}

/// One cursor of a group with its lag.
#[derive(Debug, Clone, PartialEq)]
pub struct CursorLag {
    pub group: String,
    pub queue: String,
    pub partition: String,
    pub partition_id: i64,
    pub committed: i64,
    pub last_offset: i64,
    /// Messages stored past the cursor.
    pub lag_messages: i64,
    /// Age of the oldest message past the cursor; 0 when there is none.
    pub lag_seconds: f64,
    /// The live lease on the partition, if any: its id and expiry.
    pub lease_id: Option<Uuid>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub total_consumed: i64,
    pub last_consumed_at: Option<DateTime<Utc>>,
    pub retry_count: i32,
    pub redelivery_count: i32,
}

/// Every cursor `c` with its partition `p`, queue `q`, and `oldest`: the segment holding its
/// first unread message (no row when nothing is unread), found through the primary key, so
/// reading lag costs an index probe per cursor, never a walk of the messages.
///
/// A registered group's cursor on a partition it has none on yet (cursors are made when a pop
/// reaches the partition, so one pushed to after the group fell behind has none) counts from
/// where the group would start there, as queue depth counts it: a group that stopped reading
/// must not show less lag than it has. A group reading a queue without a registration there
/// (queue mode, which is never registered; a group whose registration was deleted) counts from
/// the oldest retained message, where such a group starts.
pub(crate) const CURSORS_WITH_OLDEST_UNREAD: &str = concat!(
    "(SELECT consumer_group, partition_id, committed, lease_id, lease_expires_at, total_consumed,
            last_consumed_at, retry_count, redelivery_count
       FROM queen.log_consumers
     UNION ALL
     SELECT m.consumer_group, p.id, ",
    group_start_sql!("m.subscription_mode", "m.subscription_from"),
    ", NULL::uuid, NULL::timestamptz, 0::bigint, NULL::timestamptz, 0, 0
       FROM queen.consumer_groups_metadata m
       JOIN queen.queues rq ON rq.name = m.queue_name
       JOIN queen.partitions p ON p.queue_id = rq.id
      WHERE NOT EXISTS (SELECT 1 FROM queen.log_consumers lc
                         WHERE lc.partition_id = p.id AND lc.consumer_group = m.consumer_group)
     UNION ALL
     SELECT g.consumer_group, p.id, p.retained_from - 1,
            NULL::uuid, NULL::timestamptz, 0::bigint, NULL::timestamptz, 0, 0
       FROM (SELECT DISTINCT lc.consumer_group, lp.queue_id
               FROM queen.log_consumers lc JOIN queen.partitions lp ON lp.id = lc.partition_id) g
       JOIN queen.queues gq ON gq.id = g.queue_id
       JOIN queen.partitions p ON p.queue_id = g.queue_id
      WHERE NOT EXISTS (SELECT 1 FROM queen.consumer_groups_metadata m
                         WHERE m.queue_name = gq.name AND m.consumer_group = g.consumer_group)
        AND NOT EXISTS (SELECT 1 FROM queen.log_consumers lc
                         WHERE lc.partition_id = p.id AND lc.consumer_group = g.consumer_group)
    ) c
       JOIN queen.partitions p ON p.id = c.partition_id
       JOIN queen.queues q ON q.id = p.queue_id
       LEFT JOIN LATERAL (
           SELECT s.created_at FROM queen.log_segments s
            WHERE s.partition_id = p.id AND p.last_offset > GREATEST(c.committed, p.retained_from - 1)
              AND s.base_offset <= GREATEST(c.committed, p.retained_from - 1) + 1
            ORDER BY s.base_offset DESC LIMIT 1
       ) oldest ON true"
);
/// Messages stored past the cursor, over [`CURSORS_WITH_OLDEST_UNREAD`].
pub(crate) const LAG_MESSAGES: &str = "GREATEST(p.last_offset - GREATEST(c.committed, p.retained_from - 1), 0)";
/// Age in seconds of the first unread message, 0 when there is none.
pub(crate) const LAG_SECONDS: &str = "COALESCE(EXTRACT(EPOCH FROM now() - oldest.created_at)::float8, 0)";

/// Every cursor (of `group`, on one of `queues`, when given) with its lag, ordered by group,
/// queue and partition name.
pub async fn cursor_lags(
    client: &impl GenericClient,
    group: Option<&str>,
    queues: Option<&[&str]>,
) -> Result<Vec<CursorLag>, StoreError> {
    let sql = format!(
        "SELECT c.consumer_group, q.name, p.name, p.id, c.committed, p.last_offset,
                {LAG_MESSAGES}, {LAG_SECONDS},
                CASE WHEN c.lease_expires_at > now() THEN c.lease_id END,
                CASE WHEN c.lease_expires_at > now() THEN c.lease_expires_at END,
                c.total_consumed, c.last_consumed_at, c.retry_count, c.redelivery_count
           FROM {CURSORS_WITH_OLDEST_UNREAD}
          WHERE ($1::text IS NULL OR c.consumer_group = $1) AND ($2::text[] IS NULL OR q.name = ANY($2))
          ORDER BY c.consumer_group, q.name, p.name"
    );
    let rows = client.query(&sql, &[&group, &queues]).await?;
    Ok(rows
        .iter()
        .map(|row| CursorLag {
            group: row.get(0),
            queue: row.get(1),
            partition: row.get(2),
            partition_id: row.get(3),
            committed: row.get(4),
            last_offset: row.get(5),
            lag_messages: row.get(6),
            lag_seconds: row.get(7),
            lease_id: row.get(8),
            lease_expires_at: row.get(9),
            total_consumed: row.get(10),
            last_consumed_at: row.get(11),
            retry_count: row.get(12),
            redelivery_count: row.get(13),
        })
        .collect())
}

/// A group's lag on a queue: its cursors' lags summed, and the oldest unread message's age.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueLag {
    pub group: String,
    pub queue: String,
    pub lag_messages: i64,
    pub lag_seconds: f64,
}

/// The lag of every group on every queue it has cursors on or is registered on (see
/// [`CURSORS_WITH_OLDEST_UNREAD`]), summed by PostgreSQL: what a metrics scrape reports, in a row
/// per group and queue however many partitions the queues have. The statement is stopped by
/// PostgreSQL past `timeout`: a caller that gave up waiting on the client side would otherwise
/// hand the connection back to the pool still busy with it.
pub async fn queue_lags(
    client: &mut deadpool_postgres::Client,
    timeout: std::time::Duration,
) -> Result<Vec<QueueLag>, StoreError> {
    let sql = format!(
        "SELECT c.consumer_group, q.name, sum({LAG_MESSAGES})::int8, max({LAG_SECONDS})
           FROM {CURSORS_WITH_OLDEST_UNREAD}
          GROUP BY c.consumer_group, q.name"
    );
    let tx = client.transaction().await?;
    tx.execute("SELECT set_config('statement_timeout', $1, true)", &[&format!("{}ms", timeout.as_millis())]).await?;
    let rows = tx.query(&sql, &[]).await?;
    tx.commit().await?;
    Ok(rows
        .iter()
        .map(|row| QueueLag { group: row.get(0), queue: row.get(1), lag_messages: row.get(2), lag_seconds: row.get(3) })
        .collect())
}

/// A group's registration on a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub group: String,
    pub queue: String,
    pub mode: String,
    pub from: Option<DateTime<Utc>>,
    /// Served only the newest message of each partition.
    pub conflation: bool,
    pub created_at: DateTime<Utc>,
}

pub async fn registrations(client: &impl GenericClient, group: Option<&str>) -> Result<Vec<Registration>, StoreError> {
    let rows = client
        .query(
            "SELECT consumer_group, queue_name, subscription_mode, subscription_from, created_at, conflation
               FROM queen.consumer_groups_metadata
              WHERE $1::text IS NULL OR consumer_group = $1
              ORDER BY consumer_group, queue_name",
            &[&group],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| Registration {
            group: row.get(0),
            queue: row.get(1),
            mode: row.get(2),
            from: row.get(3),
            conflation: row.get(5),
            created_at: row.get(4),
        })
        .collect())
}
