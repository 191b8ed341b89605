//! Queues and partitions: creation on first use, configuration, lookup, deletion.

use deadpool_postgres::GenericClient;
use serde_json::{Map, Value};
use tokio_postgres::error::SqlState;

use crate::StoreError;

/// The per-queue options the broker acts on. `None` leaves the stored value as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueOptionsPatch {
    pub lease_time_seconds: Option<i32>,
    pub retry_limit: Option<i32>,
    pub delayed_processing_seconds: Option<i32>,
    pub window_buffer_seconds: Option<i32>,
    pub retention_enabled: Option<bool>,
    pub retention_seconds: Option<i32>,
    pub completed_retention_seconds: Option<i32>,
    pub priority: Option<i32>,
}

/// A queue as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Queue {
    pub id: i64,
    pub name: String,
    pub namespace: Option<String>,
    pub task: Option<String>,
    pub lease_time_seconds: i32,
    pub retry_limit: i32,
    pub delayed_processing_seconds: i32,
    pub window_buffer_seconds: i32,
    pub retention_enabled: bool,
    pub retention_seconds: i32,
    pub completed_retention_seconds: i32,
    pub priority: i32,
    /// Every option as configured, echoed back by configure.
    pub options: Map<String, Value>,
}

const QUEUE_COLUMNS: &str = "id, name, namespace, task, lease_time_seconds, retry_limit, delayed_processing_seconds, \
     window_buffer_seconds, retention_enabled, retention_seconds, completed_retention_seconds, priority, options";

fn queue_from_row(row: &tokio_postgres::Row) -> Queue {
    let options: Value = row.get(12);
    Queue {
        id: row.get(0),
        name: row.get(1),
        namespace: row.get(2),
        task: row.get(3),
        lease_time_seconds: row.get(4),
        retry_limit: row.get(5),
        delayed_processing_seconds: row.get(6),
        window_buffer_seconds: row.get(7),
        retention_enabled: row.get(8),
        retention_seconds: row.get(9),
        completed_retention_seconds: row.get(10),
        priority: row.get(11),
        options: match options {
            Value::Object(map) => map,
            _ => Map::new(),
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

/// Creates the queue or updates its options, merging: options the request does not name keep
/// their stored values. Returns the queue as stored afterwards.
pub async fn configure_queue(
    client: &impl GenericClient,
    name: &str,
    namespace: Option<&str>,
    task: Option<&str>,
    patch: &QueueOptionsPatch,
    options: &Map<String, Value>,
) -> Result<Queue, StoreError> {
    let (derived_ns, derived_task) = derived_namespace_task(name);
    let options = Value::Object(options.clone());
    let sql = format!(
        "INSERT INTO queen.queues AS q (name, namespace, task, lease_time_seconds, retry_limit,
             delayed_processing_seconds, window_buffer_seconds, retention_enabled, retention_seconds,
             completed_retention_seconds, priority, options)
         VALUES ($1, COALESCE($2, $3), COALESCE($4, $5), COALESCE($6, 300), COALESCE($7, 3), COALESCE($8, 0),
             COALESCE($9, 0), COALESCE($10, false), COALESCE($11, 0), COALESCE($12, 0), COALESCE($13, 0), $14)
         ON CONFLICT (name) DO UPDATE SET
             namespace = COALESCE($2, q.namespace),
             task = COALESCE($4, q.task),
             lease_time_seconds = COALESCE($6, q.lease_time_seconds),
             retry_limit = COALESCE($7, q.retry_limit),
             delayed_processing_seconds = COALESCE($8, q.delayed_processing_seconds),
             window_buffer_seconds = COALESCE($9, q.window_buffer_seconds),
             retention_enabled = COALESCE($10, q.retention_enabled),
             retention_seconds = COALESCE($11, q.retention_seconds),
             completed_retention_seconds = COALESCE($12, q.completed_retention_seconds),
             priority = COALESCE($13, q.priority),
             options = q.options || $14,
             updated_at = now()
         RETURNING {QUEUE_COLUMNS}"
    );
    let row = client
        .query_one(
            &sql,
            &[
                &name,
                &namespace,
                &derived_ns,
                &task,
                &derived_task,
                &patch.lease_time_seconds,
                &patch.retry_limit,
                &patch.delayed_processing_seconds,
                &patch.window_buffer_seconds,
                &patch.retention_enabled,
                &patch.retention_seconds,
                &patch.completed_retention_seconds,
                &patch.priority,
                &options,
            ],
        )
        .await?;
    Ok(queue_from_row(&row))
}

/// The queue's id, creating the queue with default options if it does not exist.
pub async fn ensure_queue(client: &impl GenericClient, name: &str) -> Result<i64, StoreError> {
    let (namespace, task) = derived_namespace_task(name);
    let statement = client
        .prepare_cached(
            "WITH created AS (
                 INSERT INTO queen.queues (name, namespace, task) VALUES ($1, $2, $3)
                 ON CONFLICT (name) DO NOTHING RETURNING id)
             SELECT id FROM created UNION ALL SELECT id FROM queen.queues WHERE name = $1 LIMIT 1",
        )
        .await?;
    // A queue created by a concurrent transaction that committed after this statement's snapshot
    // makes both branches come back empty; the next attempt sees it.
    for _ in 0..3 {
        if let Some(row) = client.query_opt(&statement, &[&name, &namespace, &task]).await? {
            return Ok(row.get(0));
        }
    }
    Err(StoreError::Missing("queue"))
}

/// The partition's id, creating it if it does not exist. [`StoreError::Missing`] when the queue
/// itself is gone (deleted concurrently).
pub async fn ensure_partition(client: &impl GenericClient, queue_id: i64, name: &str) -> Result<i64, StoreError> {
    let statement = client
        .prepare_cached(
            "WITH created AS (
                 INSERT INTO queen.partitions (queue_id, name) VALUES ($1, $2)
                 ON CONFLICT (queue_id, name) DO NOTHING RETURNING id)
             SELECT id FROM created UNION ALL SELECT id FROM queen.partitions WHERE queue_id = $1 AND name = $2 LIMIT 1",
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

pub async fn find_queue(client: &impl GenericClient, name: &str) -> Result<Option<Queue>, StoreError> {
    let sql = format!("SELECT {QUEUE_COLUMNS} FROM queen.queues WHERE name = $1");
    Ok(client.query_opt(&sql, &[&name]).await?.as_ref().map(queue_from_row))
}

pub async fn find_partition(client: &impl GenericClient, queue_id: i64, name: &str) -> Result<Option<i64>, StoreError> {
    let statement = client.prepare_cached("SELECT id FROM queen.partitions WHERE queue_id = $1 AND name = $2").await?;
    Ok(client.query_opt(&statement, &[&queue_id, &name]).await?.map(|row| row.get(0)))
}

/// Deletes the queue with everything of it: partitions, segments, transaction ids and cursors
/// (by cascade), the groups' registrations and the dead letters (by name). Whether it existed.
pub async fn delete_queue(client: &impl GenericClient, name: &str) -> Result<bool, StoreError> {
    let row = client
        .query_one(
            "WITH registrations AS (DELETE FROM queen.consumer_groups_metadata WHERE queue_name = $1),
                  dead_letters AS (DELETE FROM queen.log_dlq WHERE queue_name = $1),
                  queue AS (DELETE FROM queen.queues WHERE name = $1 RETURNING id)
             SELECT count(*) FROM queue",
            &[&name],
        )
        .await?;
    Ok(row.get::<_, i64>(0) > 0)
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
