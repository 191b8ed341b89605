//! Queues and partitions: creation on first use, configuration, lookup, deletion.

use std::sync::LazyLock;

use deadpool_postgres::GenericClient;
use tokio_postgres::error::SqlState;

use crate::events::{self, Event};
use crate::{Creation, LimitReached, StoreError};

/// The per-queue options the broker acts on, as stored (a new queue gets the columns' defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueOptions {
    pub lease_time_seconds: i32,
    /// A message is delivered at most `retry_limit + 1` times before it is given up on.
    pub retry_limit: i32,
    /// After a `failed` ack, the partition is not served to the group for this long.
    pub retry_delay_ms: i32,
    /// Namespace/task pops serve higher-priority queues first.
    pub priority: i32,
    /// A message becomes visible this long after it was pushed.
    pub delayed_processing_seconds: i32,
    /// A partition is served only after it has been quiet (no push) this long.
    pub window_buffer_seconds: i32,
    /// Most unconsumed messages the queue may hold; 0 = no limit.
    pub max_size: i64,
    /// Messages older than this are never delivered; 0 = no limit.
    pub ttl_seconds: i32,
    /// The same as `ttl_seconds`, under upstream's other name; the smaller of the two wins.
    pub max_wait_seconds: i32,
    /// Whether the broker dead-letters automatically at all (exhausted and expired messages).
    pub dead_letter_queue: bool,
    /// Whether a message that exhausted its retries is dead-lettered (or dropped).
    pub dlq_after_max_retries: bool,
    pub retention_enabled: bool,
    pub retention_seconds: i32,
    pub completed_retention_seconds: i32,
    /// Segment bodies of the queue are sealed (AES-256-GCM) at rest.
    pub encryption_enabled: bool,
    /// How long a transaction id is remembered for dedup; 0 = as long as its message is retained.
    pub dedup_window_seconds: i32,
}

impl QueueOptions {
    /// The age (seconds) past which a message is not delivered: the smaller of `ttl` and
    /// `maxWaitTimeSeconds` that is set; `None` when neither is.
    pub fn expiry_seconds(&self) -> Option<i32> {
        [self.ttl_seconds, self.max_wait_seconds].into_iter().filter(|s| *s > 0).min()
    }
}

/// New values for some options; `None` leaves the stored value as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueOptionsPatch {
    pub lease_time_seconds: Option<i32>,
    pub retry_limit: Option<i32>,
    pub retry_delay_ms: Option<i32>,
    pub priority: Option<i32>,
    pub delayed_processing_seconds: Option<i32>,
    pub window_buffer_seconds: Option<i32>,
    pub max_size: Option<i64>,
    pub ttl_seconds: Option<i32>,
    pub max_wait_seconds: Option<i32>,
    pub dead_letter_queue: Option<bool>,
    pub dlq_after_max_retries: Option<bool>,
    pub retention_enabled: Option<bool>,
    pub retention_seconds: Option<i32>,
    pub completed_retention_seconds: Option<i32>,
    pub encryption_enabled: Option<bool>,
    pub dedup_window_seconds: Option<i32>,
}

/// A queue as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Queue {
    pub id: i64,
    pub name: String,
    pub namespace: Option<String>,
    pub task: Option<String>,
    pub options: QueueOptions,
}

/// The columns [`queue_from_row`] reads, in its order.
pub(crate) const QUEUE_COLUMNS: &str = "id, name, namespace, task, lease_time_seconds, retry_limit, retry_delay_ms, \
     priority, delayed_processing_seconds, window_buffer_seconds, max_size, ttl_seconds, max_wait_seconds, \
     dead_letter_queue, dlq_after_max_retries, retention_enabled, retention_seconds, completed_retention_seconds, \
     encryption_enabled, dedup_window_seconds";

/// A queue from the first columns of a row selected with [`QUEUE_COLUMNS`].
pub(crate) fn queue_from_row(row: &tokio_postgres::Row) -> Queue {
    Queue {
        id: row.get(0),
        name: row.get(1),
        namespace: row.get(2),
        task: row.get(3),
        options: QueueOptions {
            lease_time_seconds: row.get(4),
            retry_limit: row.get(5),
            retry_delay_ms: row.get(6),
            priority: row.get(7),
            delayed_processing_seconds: row.get(8),
            window_buffer_seconds: row.get(9),
            max_size: row.get(10),
            ttl_seconds: row.get(11),
            max_wait_seconds: row.get(12),
            dead_letter_queue: row.get(13),
            dlq_after_max_retries: row.get(14),
            retention_enabled: row.get(15),
            retention_seconds: row.get(16),
            completed_retention_seconds: row.get(17),
            encryption_enabled: row.get(18),
            dedup_window_seconds: row.get(19),
        },
    }
}

/// The namespace and task a queue gets when it is created without them: the first two
/// dot-separated parts of its name (`billing.invoices.eu` is namespace `billing`, task `invoices`).
pub fn derived_namespace_task(name: &str) -> (Option<&str>, Option<&str>) {
    let mut parts = name.split('.');
    match (parts.next(), parts.next()) {
        (Some(ns), Some(task)) if !ns.is_empty() && !task.is_empty() => (Some(ns), Some(task)),
        _ => (None, None),
    }
}

/// Creates the queue (within `max_queues`, see [`create_queues`]) or updates its options, merging:
/// options the request does not name keep their stored values. Every broker is told the queue
/// changed. Returns the queue as stored afterwards.
pub async fn configure_queue(
    client: &mut deadpool_postgres::Client,
    name: &str,
    namespace: Option<&str>,
    task: Option<&str>,
    patch: &QueueOptionsPatch,
    max_queues: i64,
) -> Result<Queue, StoreError> {
    let tx = client.transaction().await?;
    if find_queue(&tx, name).await?.is_none() {
        create_queues(&tx, &[name], max_queues).await?;
    }
    let sql = format!(
        "UPDATE queen.queues SET
             namespace = COALESCE($2, namespace),
             task = COALESCE($3, task),
             lease_time_seconds = COALESCE($4, lease_time_seconds),
             retry_limit = COALESCE($5, retry_limit),
             retry_delay_ms = COALESCE($6, retry_delay_ms),
             priority = COALESCE($7, priority),
             delayed_processing_seconds = COALESCE($8, delayed_processing_seconds),
             window_buffer_seconds = COALESCE($9, window_buffer_seconds),
             max_size = COALESCE($10, max_size),
             ttl_seconds = COALESCE($11, ttl_seconds),
             max_wait_seconds = COALESCE($12, max_wait_seconds),
             dead_letter_queue = COALESCE($13, dead_letter_queue),
             dlq_after_max_retries = COALESCE($14, dlq_after_max_retries),
             retention_enabled = COALESCE($15, retention_enabled),
             retention_seconds = COALESCE($16, retention_seconds),
             completed_retention_seconds = COALESCE($17, completed_retention_seconds),
             encryption_enabled = COALESCE($18, encryption_enabled),
             dedup_window_seconds = COALESCE($19, dedup_window_seconds),
             updated_at = now()
          WHERE name = $1
      RETURNING {QUEUE_COLUMNS}"
    );
    let row = tx
        .query_one(
            &sql,
            &[
                &name,
                &namespace,
                &task,
                &patch.lease_time_seconds,
                &patch.retry_limit,
                &patch.retry_delay_ms,
                &patch.priority,
                &patch.delayed_processing_seconds,
                &patch.window_buffer_seconds,
                &patch.max_size,
                &patch.ttl_seconds,
                &patch.max_wait_seconds,
                &patch.dead_letter_queue,
                &patch.dlq_after_max_retries,
                &patch.retention_enabled,
                &patch.retention_seconds,
                &patch.completed_retention_seconds,
                &patch.encryption_enabled,
                &patch.dedup_window_seconds,
            ],
        )
        .await?;
    let queue = queue_from_row(&row);
    events::publish(&tx, &Event::QueueChanged { queue_id: queue.id, queue: queue.name.clone() }).await?;
    tx.commit().await?;
    Ok(queue)
}

static ENSURE_QUEUE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH created AS (
             INSERT INTO queen.queues (name, namespace, task) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO NOTHING RETURNING {QUEUE_COLUMNS})
         SELECT * FROM created UNION ALL SELECT {QUEUE_COLUMNS} FROM queen.queues WHERE name = $1 LIMIT 1"
    )
});

/// The queue, created with default options if it does not exist.
pub async fn ensure_queue(client: &impl GenericClient, name: &str) -> Result<Queue, StoreError> {
    let (namespace, task) = derived_namespace_task(name);
    let statement = client.prepare_cached(&ENSURE_QUEUE_SQL).await?;
    // A queue created by a concurrent transaction that committed after this statement's snapshot
    // makes both branches come back empty; the next attempt sees it.
    for _ in 0..3 {
        if let Some(row) = client.query_opt(&statement, &[&name, &namespace, &task]).await? {
            return Ok(queue_from_row(&row));
        }
    }
    Err(StoreError::Missing("queue"))
}

/// The partition's id, creating it if it does not exist. [`StoreError::Missing`] when the queue
/// itself is gone (deleted concurrently).
pub async fn ensure_partition(client: &impl GenericClient, queue_id: i64, name: &str) -> Result<i64, StoreError> {
    let statement = client
        .prepare_cached(
            "WITH named AS (
                 INSERT INTO queen.partition_names (queue_id, name, partition_id)
                 VALUES ($1, $2, nextval(pg_get_serial_sequence('queen.partitions', 'id')))
                 ON CONFLICT (queue_id, name) DO NOTHING RETURNING partition_id
             ), created AS (
                 INSERT INTO queen.partitions (id, queue_id, name) OVERRIDING SYSTEM VALUE
                 SELECT partition_id, $1, $2 FROM named RETURNING id
             )
             SELECT id FROM created
             UNION ALL SELECT partition_id FROM queen.partition_names WHERE queue_id = $1 AND name = $2 LIMIT 1",
        )
        .await?;
    for _ in 0..3 {
        match client.query_opt(&statement, &[&queue_id, &name]).await {
            Ok(Some(row)) => return Ok(row.get(0)),
            Ok(None) => continue,
            Err(e) if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) => return Err(StoreError::Missing("queue")),
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Missing("partition"))
}

/// The most the fleet creates (`limits.max_*`), counted in PostgreSQL at creation time; 0 = no
/// limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CreationLimits {
    pub queues: i64,
    pub partitions_per_queue: i64,
    /// Named consumer groups of one queue (queue mode is not counted).
    pub groups_per_queue: i64,
}

/// The class of the creation locks: queues ("qnew", object 0) and one queue's partitions
/// ("qpar", the queue id wrapped to 32 bits as object). Transaction advisory locks: held until
/// the creating transaction ends, so the count a creation is checked against holds every
/// creation committed before it, on any broker.
const QUEUE_CREATION_LOCK_CLASS: i32 = 0x716e_6577;
const PARTITION_CREATION_LOCK_CLASS: i32 = 0x7170_6172;

/// The queues of these names that exist, in no particular order.
pub async fn find_queues(client: &impl GenericClient, names: &[&str]) -> Result<Vec<Queue>, StoreError> {
    static SQL: LazyLock<String> =
        LazyLock::new(|| format!("SELECT {QUEUE_COLUMNS} FROM queen.queues WHERE name = ANY($1)"));
    let statement = client.prepare_cached(&SQL).await?;
    Ok(client.query(&statement, &[&names]).await?.iter().map(queue_from_row).collect())
}

/// The names once each, in one order for every creator, so that two creations cannot wait on
/// each other's rows or locks in a cycle.
pub(crate) fn creation_order<'a>(names: &[&'a str]) -> Vec<&'a str> {
    let mut names = names.to_vec();
    names.sort_unstable();
    names.dedup();
    names
}

/// Creates those of the named queues that do not exist (with default options), all of them or
/// none: with `max > 0` only if the fleet then holds at most `max` queues, counted under the
/// fleet's queue-creation lock, so two brokers cannot both take the last place. The lock is held
/// until the caller's transaction ends; a creation that does not fit is
/// [`StoreError::LimitReached`], and the caller's transaction must then be rolled back. Returns
/// every named queue, in no particular order.
pub async fn create_queues(
    tx: &deadpool_postgres::Transaction<'_>,
    names: &[&str],
    max: i64,
) -> Result<Vec<Queue>, StoreError> {
    let names = creation_order(names);
    if names.is_empty() {
        return Ok(Vec::new());
    }
    if max > 0 {
        tx.execute("SELECT pg_advisory_xact_lock($1, 0)", &[&QUEUE_CREATION_LOCK_CLASS]).await?;
    }
    let (namespaces, tasks): (Vec<Option<&str>>, Vec<Option<&str>>) =
        names.iter().map(|name| derived_namespace_task(name)).unzip();
    let statement = tx
        .prepare_cached(
            "WITH wanted AS (
                 SELECT w.name, w.namespace, w.task, w.ord
                   FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS w(name, namespace, task, ord)
                  WHERE NOT EXISTS (SELECT 1 FROM queen.queues q WHERE q.name = w.name)
             ), verdict AS (
                 SELECT count(*) AS adding,
                        CASE WHEN $4::bigint > 0 THEN (SELECT count(*) FROM queen.queues) ELSE 0 END AS held
                   FROM wanted
             ), created AS (
                 INSERT INTO queen.queues (name, namespace, task)
                 SELECT w.name, w.namespace, w.task FROM wanted w, verdict v
                  WHERE $4 = 0 OR v.held + v.adding <= $4
                  ORDER BY w.ord
                 ON CONFLICT (name) DO NOTHING
             )
             SELECT held, adding FROM verdict",
        )
        .await?;
    let row = tx.query_one(&statement, &[&names, &namespaces, &tasks, &max]).await?;
    let (held, adding): (i64, i64) = (row.get(0), row.get(1));
    if max > 0 && held + adding > max {
        return Err(LimitReached { what: Creation::Queues, queue: None, held, adding, max }.into());
    }
    let queues = find_queues(tx, &names).await?;
    if queues.len() < names.len() {
        // Deleted again by a concurrent transaction.
        return Err(StoreError::Missing("queue"));
    }
    Ok(queues)
}

/// The partitions of these names that exist in the queue: (name, id), in no particular order.
pub async fn find_partitions(
    client: &impl GenericClient,
    queue_id: i64,
    names: &[&str],
) -> Result<Vec<(String, i64)>, StoreError> {
    let statement = client
        .prepare_cached("SELECT name, partition_id FROM queen.partition_names WHERE queue_id = $1 AND name = ANY($2)")
        .await?;
    Ok(client.query(&statement, &[&queue_id, &names]).await?.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// Creates those of the named partitions of the queue that do not exist, all of them or none:
/// with `max > 0` only if the queue then holds at most `max` partitions, counted under the
/// queue's partition-creation lock (held until the caller's transaction ends). A creation that
/// does not fit is [`StoreError::LimitReached`]; [`StoreError::Missing`] when the queue itself
/// is gone. Either way the caller's transaction must be rolled back. Returns every named
/// partition as (name, id), in no particular order.
pub async fn create_partitions(
    tx: &deadpool_postgres::Transaction<'_>,
    queue_id: i64,
    queue: &str,
    names: &[&str],
    max: i64,
) -> Result<Vec<(String, i64)>, StoreError> {
    let names = creation_order(names);
    if names.is_empty() {
        return Ok(Vec::new());
    }
    if max > 0 {
        tx.execute("SELECT pg_advisory_xact_lock($1, $2)", &[&PARTITION_CREATION_LOCK_CLASS, &(queue_id as i32)])
            .await?;
    }
    let statement = tx
        .prepare_cached(
            "WITH wanted AS (
                 SELECT w.name, w.ord FROM unnest($2::text[]) WITH ORDINALITY AS w(name, ord)
                  WHERE NOT EXISTS (SELECT 1 FROM queen.partition_names n WHERE n.queue_id = $1 AND n.name = w.name)
             ), verdict AS (
                 SELECT count(*) AS adding,
                        CASE WHEN $3::bigint > 0
                             THEN (SELECT count(*) FROM queen.partition_names WHERE queue_id = $1) ELSE 0 END AS held
                   FROM wanted
             ), named AS (
                 INSERT INTO queen.partition_names (queue_id, name, partition_id)
                 SELECT $1, w.name, nextval(pg_get_serial_sequence('queen.partitions', 'id')) FROM wanted w, verdict v
                  WHERE $3 = 0 OR v.held + v.adding <= $3
                  ORDER BY w.ord
                 ON CONFLICT (queue_id, name) DO NOTHING
              RETURNING name, partition_id
             ), created AS (
                 INSERT INTO queen.partitions (id, queue_id, name) OVERRIDING SYSTEM VALUE
                 SELECT partition_id, $1, name FROM named
             )
             SELECT held, adding FROM verdict",
        )
        .await?;
    let row = match tx.query_one(&statement, &[&queue_id, &names, &max]).await {
        Ok(row) => row,
        Err(e) if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) => return Err(StoreError::Missing("queue")),
        Err(e) => return Err(e.into()),
    };
    let (held, adding): (i64, i64) = (row.get(0), row.get(1));
    if max > 0 && held + adding > max {
        let queue = Some(queue.to_owned());
        return Err(LimitReached { what: Creation::Partitions, queue, held, adding, max }.into());
    }
    let partitions = find_partitions(tx, queue_id, &names).await?;
    if partitions.len() < names.len() {
        return Err(StoreError::Missing("partition"));
    }
    Ok(partitions)
}

pub async fn find_queue(client: &impl GenericClient, name: &str) -> Result<Option<Queue>, StoreError> {
    static SQL: LazyLock<String> =
        LazyLock::new(|| format!("SELECT {QUEUE_COLUMNS} FROM queen.queues WHERE name = $1"));
    let statement = client.prepare_cached(&SQL).await?;
    Ok(client.query_opt(&statement, &[&name]).await?.as_ref().map(queue_from_row))
}

/// The queues of a namespace and/or task (either may be left open), highest priority first,
/// then by name.
pub async fn queues_of(
    client: &impl GenericClient,
    namespace: Option<&str>,
    task: Option<&str>,
) -> Result<Vec<Queue>, StoreError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {QUEUE_COLUMNS} FROM queen.queues
              WHERE ($1::text IS NULL OR namespace = $1) AND ($2::text IS NULL OR task = $2)
              ORDER BY priority DESC, name"
        )
    });
    let statement = client.prepare_cached(&SQL).await?;
    Ok(client.query(&statement, &[&namespace, &task]).await?.iter().map(queue_from_row).collect())
}

pub async fn find_partition(client: &impl GenericClient, queue_id: i64, name: &str) -> Result<Option<i64>, StoreError> {
    let statement = client
        .prepare_cached("SELECT partition_id FROM queen.partition_names WHERE queue_id = $1 AND name = $2")
        .await?;
    Ok(client.query_opt(&statement, &[&queue_id, &name]).await?.map(|row| row.get(0)))
}

/// Deletes the queue with everything of it: its cursors, then its partitions, segments and
/// transaction ids (by cascade), the groups' registrations and the dead letters (by name), and
/// tells every broker. Whether it existed.
pub async fn delete_queue(client: &mut deadpool_postgres::Client, name: &str) -> Result<bool, StoreError> {
    let tx = client.transaction().await?;
    // The cursors first, then the partitions (through the queue's cascade): the order a bundle
    // locks them in, acking before it pushes. The other order deadlocks with such a bundle.
    tx.execute(
        "DELETE FROM queen.log_consumers c USING queen.partitions p, queen.queues q
          WHERE q.name = $1 AND p.queue_id = q.id AND c.partition_id = p.id",
        &[&name],
    )
    .await?;
    let deleted = tx
        .query_opt(
            "WITH registrations AS (DELETE FROM queen.consumer_groups_metadata WHERE queue_name = $1),
                  dead_letters AS (DELETE FROM queen.log_dlq WHERE queue_name = $1)
             DELETE FROM queen.queues WHERE name = $1 RETURNING id",
            &[&name],
        )
        .await?;
    if let Some(row) = &deleted {
        events::publish(&tx, &Event::QueueChanged { queue_id: row.get(0), queue: name.to_owned() }).await?;
    }
    tx.commit().await?;
    Ok(deleted.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_and_task_come_from_a_dotted_name() {
        assert_eq!(derived_namespace_task("billing.invoices.eu"), (Some("billing"), Some("invoices")));
        assert_eq!(derived_namespace_task("billing.invoices"), (Some("billing"), Some("invoices")));
        assert_eq!(derived_namespace_task("orders"), (None, None));
        assert_eq!(derived_namespace_task(".x"), (None, None));
    }
}

/// Takes the queue's capacity lock until the end of the caller's transaction: pushes to a queue
/// with a `maxSize` check its depth and append under it, one at a time, so two of them cannot
/// both fit into the last free place.
pub async fn lock_capacity(tx: &deadpool_postgres::Transaction<'_>, queue_id: i64) -> Result<(), StoreError> {
    tx.execute("SELECT pg_advisory_xact_lock($1, $2)", &[&CAPACITY_LOCK_CLASS, &(queue_id as i32)]).await?;
    Ok(())
}

/// The class of [`lock_capacity`]'s advisory locks ("qcap"); the queue id (wrapped to 32 bits)
/// is the object, so two queues share a lock only when their ids are 2^32 apart.
pub const CAPACITY_LOCK_CLASS: i32 = 0x7163_6170;

/// Messages of the queue that a group that counts has not consumed: past the slowest position,
/// on each partition, of the groups with a cursor there and the groups registered on the queue
/// (where they start, when they have no cursor there yet); a partition nobody reads counts whole.
/// On a queue whose messages expire (`ttl`, `maxWaitTimeSeconds`), those past the age count for
/// no group: every group skips them when it pops, so a queue whose consumers are away holds them
/// without their filling it.
pub async fn unconsumed_depth(client: &impl GenericClient, queue: &Queue) -> Result<i64, StoreError> {
    let statement = client
        .prepare_cached(concat!(
            "SELECT COALESCE(sum(p.last_offset - GREATEST(p.retained_from - 1, f.floor, e.expired_end)), 0)::bigint
               FROM queen.partitions p
              CROSS JOIN LATERAL (
                  SELECT COALESCE(min(positions.at), p.retained_from - 1) AS floor FROM (
                      SELECT c.committed AS at FROM queen.log_consumers c WHERE c.partition_id = p.id
                      UNION ALL
                      SELECT ",
            group_start_sql!("m.subscription_mode", "m.subscription_from"),
            "
                        FROM queen.consumer_groups_metadata m
                       WHERE m.queue_name = $2
                         AND NOT EXISTS (SELECT 1 FROM queen.log_consumers c
                                          WHERE c.partition_id = p.id AND c.consumer_group = m.consumer_group)
                  ) positions
              ) f
              CROSS JOIN LATERAL (
                  SELECT (SELECT s.end_offset FROM queen.log_segments s
                           WHERE $3::int > 0 AND s.partition_id = p.id
                             AND s.created_at < now() - $3::int * interval '1 second'
                           ORDER BY s.created_at DESC, s.base_offset DESC LIMIT 1) AS expired_end
              ) e
              WHERE p.queue_id = $1",
        ))
        .await?;
    let expiry = queue.options.expiry_seconds().unwrap_or(0);
    Ok(client.query_one(&statement, &[&queue.id, &queue.name, &expiry]).await?.get(0))
}

/// Size of a queue, from the partition rows alone (no scan of message history).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSize {
    pub partitions: i64,
    /// Messages still stored, across partitions.
    pub messages: i64,
}

pub async fn queue_size(client: &impl GenericClient, queue_id: i64) -> Result<QueueSize, StoreError> {
    let row = client
        .query_one(
            "SELECT count(*), COALESCE(sum(last_offset - retained_from + 1), 0)::bigint
               FROM queen.partitions WHERE queue_id = $1",
            &[&queue_id],
        )
        .await?;
    Ok(QueueSize { partitions: row.get(0), messages: row.get(1) })
}
