//! Trace events attached to messages: recording one, reading a message's events, a name's
//! events and the names in use, and removing the events of messages retention removed.
//!
//! An event is keyed by its message's place in the log, `(partition_id, message_offset)`, so the
//! events of a message come from one index range and go with the message: retention deletes those
//! below a partition's new watermark in the transaction that moves it ([`delete_retained`]), and a
//! deleted partition takes its events by cascade. Nothing on the push, pop or ack path touches
//! these tables.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::StoreError;

/// An event to record on the message `transaction_id` of `partition_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTrace<'a> {
    pub partition_id: i64,
    pub transaction_id: &'a str,
    pub consumer_group: &'a str,
    pub event_type: &'a str,
    /// Distinct, non-empty names.
    pub names: &'a [String],
    /// A JSON object as text.
    pub data: &'a str,
}

/// A recorded event's id, its message's offset and when it was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub id: i64,
    pub offset: i64,
    pub created_at: DateTime<Utc>,
}

/// Records the event, or `None` when the partition holds no such message (never pushed, or
/// retention or a deletion removed it). The message's transaction-id entry is locked (`FOR KEY
/// SHARE`) until the event commits, so a retention pass removing the message waits for it and then
/// removes the event too, rather than leaving it behind below the watermark.
pub async fn record(client: &impl GenericClient, trace: &NewTrace<'_>) -> Result<Option<Recorded>, StoreError> {
    let statement = client
        .prepare_cached(
            "WITH message AS (
                 SELECT m.partition_id, m.message_offset, m.transaction_id, m.message_id
                   FROM queen.partitions p JOIN queen.log_message_ids m ON m.partition_id = p.id
                  WHERE p.id = $1::bigint AND m.transaction_id = $2::text
                    -- The partition row first, then the id, in the order a partition's deletion
                    -- takes them, so that one of the two waits for the other instead of both
                    -- deadlocking. Pushes and retention update the partition row without touching
                    -- its key, which a KEY SHARE lock lets them do at once.
                    FOR KEY SHARE OF p, m
             ), event AS (
                 INSERT INTO queen.message_traces
                        (partition_id, message_offset, transaction_id, message_id, consumer_group, event_type,
                         trace_names, data)
                 SELECT partition_id, message_offset, transaction_id, message_id, $3::text, $4::text,
                        $5::text[], $6::text::json
                   FROM message
              RETURNING id, message_offset, created_at
             ), named AS (
                 INSERT INTO queen.message_trace_names (name, trace_id, partition_id)
                 SELECT name, event.id, $1::bigint FROM event CROSS JOIN unnest($5::text[]) AS name
             )
             SELECT id, message_offset, created_at FROM event",
        )
        .await?;
    let row = client
        .query_opt(
            &statement,
            &[
                &trace.partition_id,
                &trace.transaction_id,
                &trace.consumer_group,
                &trace.event_type,
                &trace.names,
                &trace.data,
            ],
        )
        .await?;
    Ok(row.map(|row| Recorded { id: row.get(0), offset: row.get(1), created_at: row.get(2) }))
}

/// A recorded event with its message's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    pub id: i64,
    pub queue: String,
    pub partition: String,
    pub partition_id: i64,
    pub offset: i64,
    pub transaction_id: String,
    pub message_id: Uuid,
    pub consumer_group: String,
    pub event_type: String,
    pub names: Vec<String>,
    /// The JSON object as it was sent.
    pub data: String,
    pub created_at: DateTime<Utc>,
}

/// The columns of [`TraceEvent`], over `t` (the event), `p` (its partition) and `q` (its queue).
const EVENT_COLUMNS: &str = "t.id, q.name, p.name, t.partition_id, t.message_offset, t.transaction_id, t.message_id,
        t.consumer_group, t.event_type, t.trace_names, t.data::text, t.created_at";

fn event_from_row(row: &Row) -> TraceEvent {
    TraceEvent {
        id: row.get(0),
        queue: row.get(1),
        partition: row.get(2),
        partition_id: row.get(3),
        offset: row.get(4),
        transaction_id: row.get(5),
        message_id: row.get(6),
        consumer_group: row.get(7),
        event_type: row.get(8),
        names: row.get(9),
        data: row.get(10),
        created_at: row.get(11),
    }
}

/// Which page of a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub limit: i64,
    pub offset: i64,
}

/// A page of the message's events, oldest first (the order they happened in), and how many it
/// has in all; `None` when the partition holds no such message (or retention removed it). The
/// message is the one its transaction id names now: under a dedup window that may be a newer
/// message than the one an older event was recorded on.
pub async fn of_message(
    client: &impl GenericClient,
    partition_id: i64,
    transaction_id: &str,
    page: Page,
) -> Result<Option<(Vec<TraceEvent>, i64)>, StoreError> {
    let found = client
        .query_opt(
            "SELECT message_offset FROM queen.log_message_ids
              WHERE partition_id = $1::bigint AND transaction_id = $2::text",
            &[&partition_id, &transaction_id],
        )
        .await?;
    let Some(found) = found else { return Ok(None) };
    let offset: i64 = found.get(0);
    let sql = format!(
        "SELECT {EVENT_COLUMNS}
           FROM queen.message_traces t
           JOIN queen.partitions p ON p.id = t.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE t.partition_id = $1::bigint AND t.message_offset = $2::bigint
          ORDER BY t.id
          LIMIT $3::bigint OFFSET $4::bigint"
    );
    let rows = client.query(&sql, &[&partition_id, &offset, &page.limit, &page.offset]).await?;
    let total = if rows.len() < page.limit as usize && (page.offset == 0 || !rows.is_empty()) {
        // The page reached the end: it says how many there are.
        page.offset + rows.len() as i64
    } else {
        client
            .query_one(
                "SELECT count(*) FROM queen.message_traces WHERE partition_id = $1::bigint AND message_offset = $2::bigint",
                &[&partition_id, &offset],
            )
            .await?
            .get(0)
    };
    Ok(Some((rows.iter().map(event_from_row).collect(), total)))
}

/// Which of a name's events to list: recorded within `from`..=`to` (either may be open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameFilter {
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub page: Page,
}

/// A page of the events carrying `name`, newest first, across every queue, and how many match in
/// all. The page walks the name's index backwards; the count walks the name's whole range of it.
pub async fn by_name(
    client: &impl GenericClient,
    name: &str,
    filter: &NameFilter,
) -> Result<(Vec<TraceEvent>, i64), StoreError> {
    let sql = format!(
        "SELECT {EVENT_COLUMNS}
           FROM queen.message_trace_names n
           JOIN queen.message_traces t ON t.partition_id = n.partition_id AND t.id = n.trace_id
           JOIN queen.partitions p ON p.id = t.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE n.name = $1::text
            AND ($2::timestamptz IS NULL OR t.created_at >= $2::timestamptz)
            AND ($3::timestamptz IS NULL OR t.created_at <= $3::timestamptz)
          ORDER BY n.trace_id DESC
          LIMIT $4::bigint OFFSET $5::bigint"
    );
    let (from, to, page) = (filter.from, filter.to, filter.page);
    let rows = client.query(&sql, &[&name, &from, &to, &page.limit, &page.offset]).await?;
    let total = if rows.len() < page.limit as usize && (page.offset == 0 || !rows.is_empty()) {
        page.offset + rows.len() as i64
    } else {
        client
            .query_one(
                "SELECT count(*) FROM queen.message_trace_names n
                  WHERE n.name = $1::text
                    AND (($2::timestamptz IS NULL AND $3::timestamptz IS NULL)
                         OR EXISTS (SELECT 1 FROM queen.message_traces t
                                     WHERE t.partition_id = n.partition_id AND t.id = n.trace_id
                                       AND ($2::timestamptz IS NULL OR t.created_at >= $2::timestamptz)
                                       AND ($3::timestamptz IS NULL OR t.created_at <= $3::timestamptz)))",
                &[&name, &from, &to],
            )
            .await?
            .get(0)
    };
    Ok((rows.iter().map(event_from_row).collect(), total))
}

/// A trace name in use: how many events carry it and when the newest was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceName {
    pub name: String,
    pub events: i64,
    pub last_event_at: DateTime<Utc>,
}

/// A page of the names in use, in name order, those containing `search` (ignoring case) when
/// given. The names are walked one distinct name at a time through the name index (one probe
/// each, never a pass over every event), and only as far as the page needs; only the listed
/// names' events are counted (not those of the names an offset skips).
pub async fn names(
    client: &impl GenericClient,
    search: Option<&str>,
    page: Page,
) -> Result<Vec<TraceName>, StoreError> {
    let rows = client
        .query(
            "WITH RECURSIVE walked(name) AS (
                 (SELECT name FROM queen.message_trace_names ORDER BY name LIMIT 1)
                 UNION ALL
                 SELECT (SELECT n.name FROM queen.message_trace_names n WHERE n.name > w.name ORDER BY n.name LIMIT 1)
                   FROM walked w WHERE w.name IS NOT NULL
             ), page AS (
                 -- The walk yields names in ascending order: the page is cut from it unsorted
                 -- (a sort would walk every name first), and only its names are counted below.
                 SELECT name FROM walked
                  WHERE name IS NOT NULL AND ($1::text IS NULL OR strpos(lower(name), lower($1::text)) > 0)
                  LIMIT $2::bigint OFFSET $3::bigint
             )
             SELECT w.name, counted.events, newest.created_at
               FROM page w
              CROSS JOIN LATERAL (SELECT count(*) AS events FROM queen.message_trace_names n WHERE n.name = w.name) counted
              CROSS JOIN LATERAL (
                  SELECT t.created_at FROM queen.message_trace_names n JOIN queen.message_traces t ON t.partition_id = n.partition_id AND t.id = n.trace_id
                   WHERE n.name = w.name ORDER BY n.trace_id DESC LIMIT 1) newest
              ORDER BY w.name",
            &[&search, &page.limit, &page.offset],
        )
        .await?;
    Ok(rows.iter().map(|row| TraceName { name: row.get(0), events: row.get(1), last_event_at: row.get(2) }).collect())
}

/// Deletes the partition's events of messages below `retained_from` (its new retention
/// watermark), with their names; how many. Part of the transaction that moves the watermark.
pub async fn delete_retained(
    client: &impl GenericClient,
    partition_id: i64,
    retained_from: i64,
) -> Result<u64, StoreError> {
    Ok(client
        .execute(
            "DELETE FROM queen.message_traces WHERE partition_id = $1::bigint AND message_offset < $2::bigint",
            &[&partition_id, &retained_from],
        )
        .await?)
}
