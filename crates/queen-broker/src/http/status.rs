//! Dashboard reads: `/api/v1/resources/...`, `/api/v1/status/...` and the message listing. Every
//! answer comes from the queue, partition and cursor rows (and, for lag, one index probe per
//! cursor), never from a scan of message history.

use std::collections::BTreeMap;
use std::time::Instant;

use actix_web::{HttpRequest, HttpResponse, web};
use queen_store::groups::CursorLag;
use queen_store::stats::{LabelStats, Overview, PartitionStats, QueueLabel, QueueStats};
use serde::Serialize;
use serde_json::{Map, Value};

use super::body::{NoQuery, query_int, strict_query};
use super::{StoredMessageJson, Timestamp, timestamp};
use crate::broker::fleet::{self, HistoryPoint, MAX_HISTORY_MINUTES};
use crate::broker::stats::{self, QueueFilter, QueueStatus};
use crate::broker::{Broker, messages, queue_options};
use crate::error::ApiError;
use crate::names::{self, NameKind};

/// Most rows a listing returns.
const MAX_PAGE: u64 = 1000;

/// When the process started, for the status's uptime.
static STARTED: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

/// Sets the start time now, so uptime counts from the broker's start rather than its first read.
pub fn mark_start() {
    std::sync::LazyLock::force(&STARTED);
}

/// The query of a paged listing: `limit`, `offset` and the route's `filters`, nothing else.
fn page(
    req: &HttpRequest,
    default_limit: u64,
    filters: &[&str],
) -> Result<(BTreeMap<String, String>, i64, i64), ApiError> {
    let query = strict_query(req, &[&["limit", "offset"], filters].concat())?;
    let limit = query_int(&query, "limit", 1, MAX_PAGE)?.unwrap_or(default_limit) as i64;
    let offset = query_int(&query, "offset", 0, i64::MAX as u64)?.unwrap_or(0) as i64;
    Ok((query, limit, offset))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OverviewJson {
    queues: i64,
    partitions: i64,
    messages: MessagesJson,
    consumer_groups: i64,
    active_leases: i64,
    dead_letters: i64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MessagesJson {
    pushed: i64,
    stored: i64,
}

impl From<Overview> for OverviewJson {
    fn from(o: Overview) -> Self {
        OverviewJson {
            queues: o.queues,
            partitions: o.partitions,
            messages: MessagesJson { pushed: o.messages_pushed, stored: o.messages_stored },
            consumer_groups: o.consumer_groups,
            active_leases: o.active_leases,
            dead_letters: o.dead_letters,
        }
    }
}

pub async fn overview(broker: web::Data<Broker>, _: NoQuery) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(OverviewJson::from(stats::overview(&broker).await?)))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct QueueJson {
    id: i64,
    name: String,
    namespace: Option<String>,
    task: Option<String>,
    partitions: i64,
    messages: MessagesJson,
    last_push_at: Option<String>,
    created_at: String,
    options: Map<String, Value>,
}

impl From<QueueStats> for QueueJson {
    fn from(q: QueueStats) -> Self {
        QueueJson {
            options: queue_options::echo(&q.queue.options),
            id: q.queue.id,
            name: q.queue.name,
            namespace: q.queue.namespace,
            task: q.queue.task,
            partitions: q.partitions,
            messages: MessagesJson { pushed: q.messages_pushed, stored: q.messages_stored },
            last_push_at: q.last_push_at.map(timestamp),
            created_at: timestamp(q.created_at),
        }
    }
}

/// What a page of queues may be filtered by: a `namespace`, a `task`, and a `search` text their
/// names hold (the official client's `list_queues(search=)`).
const QUEUE_FILTERS: &[&str] = &["namespace", "task", "search"];

/// A page of queues, filtered as [`QUEUE_FILTERS`] says.
fn queue_filter(query: &BTreeMap<String, String>, limit: i64, offset: i64) -> QueueFilter<'_> {
    let filter = |name: &str| query.get(name).map(String::as_str);
    QueueFilter { namespace: filter("namespace"), task: filter("task"), search: filter("search"), limit, offset }
}

/// `GET /resources/queues?namespace=&task=&search=&limit=&offset=`.
pub async fn queues(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let (query, limit, offset) = page(&req, 100, QUEUE_FILTERS)?;
    let found = stats::queues(&broker, &queue_filter(&query, limit, offset)).await?;
    let queues: Vec<QueueJson> = found.into_iter().map(QueueJson::from).collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "queues": queues, "limit": limit, "offset": offset })))
}

/// A page of one label's values, each with its queues' sizes: `{<key>: [{<field>, queues, ...}]}`.
async fn label_page(
    broker: &Broker,
    req: &HttpRequest,
    label: QueueLabel,
    (key, field): (&str, &str),
) -> Result<HttpResponse, ApiError> {
    let (_, limit, offset) = page(req, 100, &[])?;
    let found = stats::queues_by_label(broker, label, limit, offset).await?;
    let values: Vec<Value> = found
        .into_iter()
        .map(|LabelStats { value, queues, partitions, messages_pushed, messages_stored, last_push_at }| {
            serde_json::json!({
                field: value,
                "queues": queues,
                "partitions": partitions,
                "messages": MessagesJson { pushed: messages_pushed, stored: messages_stored },
                "lastPushAt": last_push_at.map(timestamp),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ key: values, "limit": limit, "offset": offset })))
}

/// `GET /resources/namespaces?limit=&offset=`: every namespace a queue carries, by name.
pub async fn namespaces(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    label_page(&broker, &req, QueueLabel::Namespace, ("namespaces", "namespace")).await
}

/// `GET /resources/tasks?limit=&offset=`: every task a queue carries, by name.
pub async fn tasks(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    label_page(&broker, &req, QueueLabel::Task, ("tasks", "task")).await
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartitionJson {
    id: String,
    queue: String,
    name: String,
    last_offset: i64,
    retained_from: i64,
    messages_stored: i64,
    created_at: String,
    last_push_at: Option<String>,
}

impl From<PartitionStats> for PartitionJson {
    fn from(p: PartitionStats) -> Self {
        PartitionJson {
            id: p.id.to_string(),
            queue: p.queue,
            name: p.name,
            last_offset: p.last_offset,
            retained_from: p.retained_from,
            messages_stored: (p.last_offset - p.retained_from + 1).max(0),
            created_at: timestamp(p.created_at),
            last_push_at: p.last_push_at.map(timestamp),
        }
    }
}

/// `GET /resources/partitions?queue=&limit=&offset=`: the most recently pushed first.
pub async fn partitions(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let (query, limit, offset) = page(&req, 100, &["queue"])?;
    let found = stats::partitions(&broker, query.get("queue").map(String::as_str), limit, offset).await?;
    let partitions: Vec<PartitionJson> = found.into_iter().map(PartitionJson::from).collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "partitions": partitions, "limit": limit, "offset": offset })))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusJson {
    status: &'static str,
    broker: String,
    version: &'static str,
    uptime_seconds: f64,
    #[serde(flatten)]
    overview: OverviewJson,
}

/// `GET /status`: the broker and its data at a glance.
pub async fn status(broker: web::Data<Broker>, _: NoQuery) -> Result<HttpResponse, ApiError> {
    let overview = stats::overview(&broker).await?;
    Ok(HttpResponse::Ok().json(StatusJson {
        status: "ok",
        broker: broker.broker_id.clone(),
        version: env!("CARGO_PKG_VERSION"),
        uptime_seconds: STARTED.elapsed().as_secs_f64(),
        overview: overview.into(),
    }))
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct GroupLagJson {
    name: String,
    partitions: usize,
    lag_messages: i64,
    lag_seconds: f64,
    active_leases: usize,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct QueueStatusJson {
    #[serde(flatten)]
    queue: QueueJson,
    consumer_groups: Vec<GroupLagJson>,
}

/// Per queue: the groups reading it and their lag.
fn lag_by_queue(lags: &[CursorLag]) -> BTreeMap<&str, BTreeMap<&str, GroupLagJson>> {
    let mut queues: BTreeMap<&str, BTreeMap<&str, GroupLagJson>> = BTreeMap::new();
    for cursor in lags {
        let group = queues.entry(&cursor.queue).or_default().entry(&cursor.group).or_default();
        group.partitions += 1;
        group.lag_messages += cursor.lag_messages;
        group.lag_seconds = group.lag_seconds.max(cursor.lag_seconds);
        group.active_leases += usize::from(cursor.lease_expires_at.is_some());
    }
    queues
}

fn with_groups(queue: QueueStats, lags: &mut BTreeMap<&str, BTreeMap<&str, GroupLagJson>>) -> QueueStatusJson {
    let groups = lags
        .remove(queue.queue.name.as_str())
        .unwrap_or_default()
        .into_iter()
        .map(|(name, lag)| GroupLagJson { name: name.to_owned(), ..lag })
        .collect();
    QueueStatusJson { queue: queue.into(), consumer_groups: groups }
}

/// `GET /status/queues`: every queue with its size and its groups' lag.
pub async fn queue_statuses(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let (query, limit, offset) = page(&req, 100, QUEUE_FILTERS)?;
    let (found, lags) = stats::queues_with_lag(&broker, &queue_filter(&query, limit, offset)).await?;
    let mut by_queue = lag_by_queue(&lags);
    let queues: Vec<QueueStatusJson> = found.into_iter().map(|q| with_groups(q, &mut by_queue)).collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "queues": queues, "limit": limit, "offset": offset })))
}

/// One group's cursor on one partition: how far behind it is and who holds the partition.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CursorJson<'a> {
    group: &'a str,
    partition: &'a str,
    partition_id: String,
    committed: i64,
    last_offset: i64,
    lag_messages: i64,
    lag_seconds: f64,
    lease_id: Option<uuid::Uuid>,
    lease_expires_at: Option<String>,
}

impl<'a> From<&'a CursorLag> for CursorJson<'a> {
    fn from(c: &'a CursorLag) -> Self {
        CursorJson {
            group: &c.group,
            partition: &c.partition,
            partition_id: c.partition_id.to_string(),
            committed: c.committed,
            last_offset: c.last_offset,
            lag_messages: c.lag_messages,
            lag_seconds: c.lag_seconds,
            lease_id: c.lease_id,
            lease_expires_at: c.lease_expires_at.map(timestamp),
        }
    }
}

/// `GET /status/queues/{queue}`: one queue, its partitions, its groups' lag, and every group's
/// cursor on every partition.
pub async fn queue_status(broker: web::Data<Broker>, _: NoQuery, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let name = super::body::path_name(&req, "queue", NameKind::Queue)?;
    let QueueStatus { queue, partitions, lags } = stats::queue_status(&broker, &name, MAX_PAGE as i64)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("queue {name:?} not found")))?;
    let cursors: Vec<CursorJson<'_>> = lags.iter().map(CursorJson::from).collect();
    let mut by_queue = lag_by_queue(&lags);
    let partitions: Vec<PartitionJson> = partitions.into_iter().map(PartitionJson::from).collect();
    let status = with_groups(queue, &mut by_queue);
    Ok(HttpResponse::Ok().json(serde_json::json!({ "queue": status, "partitions": partitions, "cursors": cursors })))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BrokerJson {
    id: String,
    version: String,
    started_at: String,
    last_seen_at: String,
    state: &'static str,
    buffered_messages: i64,
    buffer_healthy: bool,
    /// The broker that answers.
    #[serde(rename = "self")]
    is_self: bool,
}

/// `GET /status/brokers`: the brokers of the fleet heard of in the last hour, and the fleet's
/// maintenance switches.
pub async fn brokers(broker: web::Data<Broker>, _: NoQuery) -> Result<HttpResponse, ApiError> {
    let (seen, modes) = fleet::brokers(&broker).await?;
    let brokers: Vec<BrokerJson> = seen
        .into_iter()
        .map(|b| BrokerJson {
            is_self: b.id == broker.broker_id,
            id: b.id,
            version: b.version,
            started_at: timestamp(b.started_at),
            last_seen_at: timestamp(b.seen_at),
            state: b.state.name(),
            buffered_messages: b.buffered_messages,
            buffer_healthy: b.buffer_healthy,
        })
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "heartbeatSeconds": broker.config.stats.sample_interval_seconds,
        "maintenance": { "push": modes.push_maintenance, "pop": modes.pop_maintenance },
        "brokers": brokers,
    })))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HistoryPointJson {
    at: String,
    pushed: i64,
    delivered: i64,
    acked: i64,
    failed: i64,
    dead_lettered: i64,
    lag_messages: Option<i64>,
    lag_seconds: Option<f64>,
}

impl From<HistoryPoint> for HistoryPointJson {
    fn from(p: HistoryPoint) -> Self {
        HistoryPointJson {
            at: timestamp(p.at),
            pushed: p.traffic.pushed,
            delivered: p.traffic.delivered,
            acked: p.traffic.acked,
            failed: p.traffic.failed,
            dead_lettered: p.traffic.dead_lettered,
            lag_messages: p.lag.map(|(messages, _)| messages),
            lag_seconds: p.lag.map(|(_, seconds)| seconds),
        }
    }
}

/// `GET /status/history?minutes=60`: the fleet's traffic and consumer lag per sample interval.
pub async fn history(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let query = strict_query(&req, &["minutes"])?;
    let minutes = query_int(&query, "minutes", 1, MAX_HISTORY_MINUTES)?.unwrap_or(60);
    let (interval, points) = fleet::history(&broker, minutes).await?;
    let (from, to) = match (points.first(), points.last()) {
        (Some(first), Some(last)) => (Some(timestamp(first.at)), Some(timestamp(last.at))),
        _ => (None, None),
    };
    let points: Vec<HistoryPointJson> = points.into_iter().map(HistoryPointJson::from).collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "intervalSeconds": interval.as_secs(),
        "from": from,
        "to": to,
        "points": points,
    })))
}

/// `GET /status/analytics`: this broker's traffic since it started (from its counters), the
/// data's totals, and what maintenance removed in the last day.
pub async fn analytics(broker: web::Data<Broker>, _: NoQuery) -> Result<HttpResponse, ApiError> {
    let (overview, maintenance) = stats::with_maintenance(&broker, 24.0).await?;
    let metrics = &broker.metrics;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "broker": {
            "id": broker.broker_id,
            "uptimeSeconds": STARTED.elapsed().as_secs_f64(),
            "messagesPushed": metrics.messages_pushed.total(),
            "messagesDelivered": metrics.messages_delivered.total(),
            "messagesAcked": metrics.messages_acked.total(),
            "messagesFailed": metrics.messages_failed.total(),
            "messagesDeadLettered": metrics.messages_dead_lettered.total(),
            "segmentsWritten": metrics.segments_written.get(),
        },
        "totals": OverviewJson::from(overview),
        "maintenanceLastDay": {
            "passes": maintenance.passes,
            "segmentsDeleted": maintenance.segments_deleted,
            "messagesDeleted": maintenance.messages_deleted,
            "partitionsDeleted": maintenance.partitions_deleted,
            "lastPassAt": maintenance.last_pass_at.map(timestamp),
        },
    })))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListedJson<'a> {
    #[serde(flatten)]
    stored: StoredMessageJson<'a>,
}

/// `GET /messages?queue=&partition=&limit=&offset=`: the newest messages of a queue (default
/// 20), newest first, after the newest `offset`, within the newest 1000 (`limit + offset`), read
/// from the last segments of its most recently pushed partitions.
pub async fn list_messages(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let query = strict_query(&req, &["queue", "partition", "limit", "offset"])?;
    let queue = query.get("queue").ok_or_else(|| ApiError::bad_request("queue is required"))?;
    names::check(NameKind::Queue, "queue", queue).map_err(ApiError::BadRequest)?;
    let limit = query_int(&query, "limit", 1, MAX_PAGE)?.unwrap_or(20) as i64;
    let offset = query_int(&query, "offset", 0, MAX_PAGE)?.unwrap_or(0) as i64;
    if limit + offset > MAX_PAGE as i64 {
        return Err(ApiError::bad_request(format!(
            "limit + offset must be at most {MAX_PAGE}: the listing pages through the newest {MAX_PAGE} messages"
        )));
    }
    let partition = query.get("partition").map(String::as_str);
    let listed = messages::newest(&broker, queue, partition, (limit, offset)).await?;
    let data: Vec<Box<serde_json::value::RawValue>> = listed
        .iter()
        .map(|m| {
            let text = String::from_utf8(m.frame.payload.clone())
                .map_err(|_| ApiError::Internal("a stored message is not UTF-8 JSON".into()))?;
            serde_json::value::RawValue::from_string(text)
                .map_err(|e| ApiError::Internal(format!("a stored message is not JSON: {e}")))
        })
        .collect::<Result<_, _>>()?;
    let messages: Vec<ListedJson<'_>> = listed
        .iter()
        .zip(&data)
        .map(|(m, data)| ListedJson {
            stored: StoredMessageJson {
                id: m.frame.message_id,
                transaction_id: &m.frame.transaction_id,
                trace_id: m.frame.trace_id,
                producer_sub: m.frame.producer.as_deref(),
                queue,
                partition: &m.partition,
                partition_id: m.partition_id,
                offset: m.offset,
                created_at: Timestamp(m.created_at),
                data,
            },
        })
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "messages": messages, "limit": limit, "offset": offset })))
}
