//! What dashboards read: counts and sizes from the queue and partition rows, never from the
//! message history (which may be billions of offsets long).

use crate::StoreError;
use crate::queues::{QUEUE_COLUMNS, Queue, queue_from_row};
use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;

/// The sizes of a set of partitions `p`, in this order: how many, messages ever pushed to them
/// (a partition cleaned up or a queue deleted takes its count with it), messages still stored,
/// and the last push.
const PARTITION_SIZES: &str = "count(p.id), COALESCE(sum(p.last_offset), 0)::bigint,
        COALESCE(sum(GREATEST(p.last_offset - p.retained_from + 1, 0)), 0)::bigint,
        max(p.last_segment_at)";

/// The whole broker's data at a glance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overview {
    pub queues: i64,
    pub partitions: i64,
    /// Messages ever pushed to the partitions there are now (the sum of their last offsets: a
    /// partition cleaned up or a queue deleted takes its count with it).
    pub messages_pushed: i64,
    /// Messages still stored (not yet retained away).
    pub messages_stored: i64,
    pub consumer_groups: i64,
    pub active_leases: i64,
    pub dead_letters: i64,
}

pub async fn overview(client: &impl GenericClient) -> Result<Overview, StoreError> {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM queen.queues),
                    count(*),
                    COALESCE(sum(last_offset), 0)::bigint,
                    COALESCE(sum(GREATEST(last_offset - retained_from + 1, 0)), 0)::bigint,
                    (SELECT count(DISTINCT consumer_group) FROM queen.log_consumers),
                    (SELECT count(*) FROM queen.log_consumers WHERE lease_expires_at > now()),
                    (SELECT count(*) FROM queen.log_dlq)
               FROM queen.partitions",
            &[],
        )
        .await?;
    Ok(Overview {
        queues: row.get(0),
        partitions: row.get(1),
        messages_pushed: row.get(2),
        messages_stored: row.get(3),
        consumer_groups: row.get(4),
        active_leases: row.get(5),
        dead_letters: row.get(6),
    })
}

/// A queue with its size.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueStats {
    pub queue: Queue,
    pub created_at: DateTime<Utc>,
    pub partitions: i64,
    pub messages_pushed: i64,
    pub messages_stored: i64,
    pub last_push_at: Option<DateTime<Utc>>,
}

/// Queues by name, filtered by namespace and task, paged.
pub async fn queues(
    client: &impl GenericClient,
    name: Option<&str>,
    namespace: Option<&str>,
    task: Option<&str>,
    search: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<Vec<QueueStats>, StoreError> {
    let sql = format!(
        "SELECT q.*, s.* FROM (
             SELECT {QUEUE_COLUMNS}, created_at FROM queen.queues
              WHERE ($1::text IS NULL OR name = $1)
                AND ($2::text IS NULL OR namespace = $2)
                AND ($3::text IS NULL OR task = $3)
                AND ($4::text IS NULL OR strpos(lower(name), lower($4)) > 0)
              ORDER BY name
              LIMIT $5 OFFSET $6) q
         CROSS JOIN LATERAL (
             SELECT {PARTITION_SIZES} FROM queen.partitions p WHERE p.queue_id = q.id) s
         ORDER BY q.name"
    );
    let rows = client.query(&sql, &[&name, &namespace, &task, &search, &limit, &offset]).await?;
    Ok(rows
        .iter()
        .map(|row| QueueStats {
            queue: queue_from_row(row),
            created_at: row.get(20),
            partitions: row.get(21),
            messages_pushed: row.get(22),
            messages_stored: row.get(23),
            last_push_at: row.get(24),
        })
        .collect())
}

/// A label queues can carry, to group them by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueLabel {
    Namespace,
    Task,
}

/// The queues that carry one value of a label, with their sizes summed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelStats {
    pub value: String,
    pub queues: i64,
    pub partitions: i64,
    pub messages_pushed: i64,
    pub messages_stored: i64,
    pub last_push_at: Option<DateTime<Utc>>,
}

/// Every value of `label` some queue carries, by value, paged; queues without it are left out.
pub async fn queues_by_label(
    client: &impl GenericClient,
    label: QueueLabel,
    limit: i64,
    offset: i64,
) -> Result<Vec<LabelStats>, StoreError> {
    // The column comes from the enum, never from a caller's text.
    let column = match label {
        QueueLabel::Namespace => "namespace",
        QueueLabel::Task => "task",
    };
    let sql = format!(
        "SELECT q.{column}, count(DISTINCT q.id), {PARTITION_SIZES}
           FROM queen.queues q LEFT JOIN queen.partitions p ON p.queue_id = q.id
          WHERE q.{column} IS NOT NULL
          GROUP BY q.{column}
          ORDER BY q.{column}
          LIMIT $1 OFFSET $2"
    );
    let rows = client.query(&sql, &[&limit, &offset]).await?;
    Ok(rows
        .iter()
        .map(|row| LabelStats {
            value: row.get(0),
            queues: row.get(1),
            partitions: row.get(2),
            messages_pushed: row.get(3),
            messages_stored: row.get(4),
            last_push_at: row.get(5),
        })
        .collect())
}

/// A partition with its offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionStats {
    pub id: i64,
    pub queue: String,
    pub name: String,
    pub last_offset: i64,
    pub retained_from: i64,
    pub created_at: DateTime<Utc>,
    pub last_push_at: Option<DateTime<Utc>>,
}

/// Partitions (of one queue, when named), the most recently pushed first, paged.
pub async fn partitions(
    client: &impl GenericClient,
    queue: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<Vec<PartitionStats>, StoreError> {
    let rows = client
        .query(
            "SELECT p.id, q.name, p.name, p.last_offset, p.retained_from, p.created_at, p.last_segment_at
               FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
              WHERE $1::text IS NULL OR q.name = $1
              ORDER BY p.last_segment_at DESC NULLS LAST, p.id
              LIMIT $2 OFFSET $3",
            &[&queue, &limit, &offset],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| PartitionStats {
            id: row.get(0),
            queue: row.get(1),
            name: row.get(2),
            last_offset: row.get(3),
            retained_from: row.get(4),
            created_at: row.get(5),
            last_push_at: row.get(6),
        })
        .collect())
}

/// What maintenance did over the last `hours`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaintenanceSummary {
    pub passes: i64,
    pub segments_deleted: i64,
    pub messages_deleted: i64,
    pub partitions_deleted: i64,
    pub last_pass_at: Option<DateTime<Utc>>,
}

pub async fn maintenance(client: &impl GenericClient, hours: f64) -> Result<MaintenanceSummary, StoreError> {
    let row = client
        .query_one(
            "SELECT count(*), COALESCE(sum(segments_deleted), 0)::bigint, COALESCE(sum(messages_deleted), 0)::bigint,
                    COALESCE(sum(partitions_deleted), 0)::bigint, max(finished_at)
               FROM queen.maintenance_runs WHERE started_at > now() - $1 * interval '1 hour'",
            &[&hours],
        )
        .await?;
    Ok(MaintenanceSummary {
        passes: row.get(0),
        segments_deleted: row.get(1),
        messages_deleted: row.get(2),
        partitions_deleted: row.get(3),
        last_pass_at: row.get(4),
    })
}
