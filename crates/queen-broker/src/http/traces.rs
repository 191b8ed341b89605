//! Trace events: `POST /api/v1/traces` records one on a message (what the consume loop's
//! `trace(...)` sends), and `GET /api/v1/traces/{partitionId}/{transactionId}`,
//! `/traces/by-name/{name}` and `/traces/names` read them back.
//!
//! Limits on an event: at most [`MAX_TRACE_NAMES`] names, each, like the event type, 1 to 255
//! bytes without control characters; `data` a JSON object of at most [`MAX_DATA_BYTES`] bytes.

use std::collections::BTreeMap;

use actix_web::{HttpRequest, HttpResponse, web};
use queen_store::traces::{NameFilter, NewTrace, Page, TraceEvent, TraceName};
use serde::Serialize;
use serde_json::value::RawValue;

use super::ack::partition_id as body_partition_id;
use super::authorize::Caller;
use super::body::{
    JsonObject, MAX_DATA_NESTING, NoQuery, nests_deeper_than, path_param, query_int, read_body, strict_query,
    time_range,
};
use super::messages::partition_id as path_partition_id;
use super::timestamp;
use crate::broker::{Broker, traces};
use crate::error::ApiError;
use crate::names::{self, NameKind};

/// Most names one event carries.
const MAX_TRACE_NAMES: usize = 32;
/// Largest `data` object, as JSON text.
const MAX_DATA_BYTES: usize = 64 * 1024;
/// Largest request body: the data, its names and the message's address, with room to spare.
const MAX_BODY_BYTES: usize = 256 * 1024;
/// Most events or names one page holds.
const MAX_PAGE: u64 = 1000;

/// A trace name or event type: 1 to [`MAX_NAME_BYTES`] bytes, no control characters.
fn check_label(field: &str, value: &str) -> Result<(), ApiError> {
    if value.is_empty() {
        return Err(ApiError::bad_request(format!("{field} must not be empty")));
    }
    names::check_label(field, value).map_err(ApiError::BadRequest)
}

/// `traceNames`: absent or `null` for none, else an array of names; repeats count once.
fn trace_names(body: &JsonObject<'_>) -> Result<Vec<String>, ApiError> {
    let Some(raw) = body.raw("traceNames") else { return Ok(Vec::new()) };
    let elements: Vec<serde_json::Value> = serde_json::from_str(raw.get())
        .map_err(|_| ApiError::bad_request("traceNames must be an array of strings or null"))?;
    if elements.len() > MAX_TRACE_NAMES {
        return Err(ApiError::bad_request(format!(
            "traceNames has {} names; at most {MAX_TRACE_NAMES} are allowed",
            elements.len()
        )));
    }
    let mut names: Vec<String> = Vec::with_capacity(elements.len());
    for (i, element) in elements.into_iter().enumerate() {
        let field = format!("traceNames[{i}]");
        let serde_json::Value::String(name) = element else {
            return Err(ApiError::bad_request(format!("{field} must be a string")));
        };
        check_label(&field, &name)?;
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Ok(names)
}

/// `data`: a JSON object, kept as it was sent.
fn data<'a>(body: &JsonObject<'a>) -> Result<&'a RawValue, ApiError> {
    let data = body.raw("data").ok_or_else(|| ApiError::bad_request("data is required: a JSON object"))?;
    if !data.get().starts_with('{') {
        return Err(ApiError::bad_request("data must be a JSON object"));
    }
    // Read back inside `{"traces": [{"data": ...}]}`, as deep as a message's data in a pop answer.
    if nests_deeper_than(data.get().as_bytes(), MAX_DATA_NESTING) {
        return Err(ApiError::bad_request(format!(
            "data nests arrays and objects more than {MAX_DATA_NESTING} levels deep"
        )));
    }
    if data.get().len() > MAX_DATA_BYTES {
        return Err(ApiError::bad_request(format!(
            "data is {} bytes of JSON; at most {MAX_DATA_BYTES} are allowed",
            data.get().len()
        )));
    }
    Ok(data)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RecordedJson<'a> {
    success: bool,
    id: i64,
    partition_id: String,
    transaction_id: &'a str,
    offset: i64,
    created_at: String,
}

/// `POST /api/v1/traces`: records an event on the message; 404 when the partition holds no such
/// message. The client may send it again after a lost answer, which records it twice.
pub async fn record(
    broker: web::Data<Broker>,
    _: NoQuery,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, MAX_BODY_BYTES.min(broker.config.http.max_body_bytes), &broker).await?;
    let body = JsonObject::parse_body(&body, false)?;
    body.takes_only(&["transactionId", "partitionId", "consumerGroup", "traceNames", "eventType", "data"])?;
    let partition_id = body_partition_id(&body)?;
    let transaction_id = body.required_string("transactionId")?;
    names::check(NameKind::TransactionId, "transactionId", &transaction_id).map_err(ApiError::BadRequest)?;
    let group = body.string("consumerGroup")?;
    let group = names::group_or_queue_mode(group.as_deref());
    names::check(NameKind::ConsumerGroup, "consumerGroup", group).map_err(ApiError::BadRequest)?;
    let named = trace_names(&body)?;
    let event_type = body.string("eventType")?.unwrap_or_else(|| "info".to_owned());
    check_label("eventType", &event_type)?;
    let data = data(&body)?;
    caller.check_partitions(&broker, &[partition_id]).await?;
    let trace = NewTrace {
        partition_id,
        transaction_id: &transaction_id,
        consumer_group: group,
        event_type: &event_type,
        names: &named,
        data: data.get(),
    };
    let recorded = traces::record(&broker, &trace)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no message {transaction_id:?} in partition {partition_id}")))?;
    Ok(HttpResponse::Created().json(RecordedJson {
        success: true,
        id: recorded.id,
        partition_id: partition_id.to_string(),
        transaction_id: &transaction_id,
        offset: recorded.offset,
        created_at: timestamp(recorded.created_at),
    }))
}

/// One event as the reads render it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TraceJson {
    id: i64,
    queue: String,
    partition: String,
    partition_id: String,
    /// The message's offset in its partition.
    offset: i64,
    transaction_id: String,
    message_id: uuid::Uuid,
    consumer_group: String,
    event_type: String,
    trace_names: Vec<String>,
    data: Box<RawValue>,
    created_at: String,
}

impl TryFrom<TraceEvent> for TraceJson {
    type Error = ApiError;

    fn try_from(event: TraceEvent) -> Result<Self, ApiError> {
        let data = RawValue::from_string(event.data)
            .map_err(|e| ApiError::Internal(format!("trace event {} is not JSON: {e}", event.id)))?;
        Ok(TraceJson {
            id: event.id,
            queue: event.queue,
            partition: event.partition,
            partition_id: event.partition_id.to_string(),
            offset: event.offset,
            transaction_id: event.transaction_id,
            message_id: event.message_id,
            consumer_group: event.consumer_group,
            event_type: event.event_type,
            trace_names: event.names,
            data,
            created_at: timestamp(event.created_at),
        })
    }
}

fn rendered(events: Vec<TraceEvent>) -> Result<Vec<TraceJson>, ApiError> {
    events.into_iter().map(TraceJson::try_from).collect()
}

/// `limit` (1 to 1000, `default` when absent) and `offset`.
fn page_of(query: &BTreeMap<String, String>, default: u64) -> Result<Page, ApiError> {
    let limit = query_int(query, "limit", 1, MAX_PAGE)?.unwrap_or(default) as i64;
    let offset = query_int(query, "offset", 0, i64::MAX as u64)?.unwrap_or(0) as i64;
    Ok(Page { limit, offset })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageTraces<'a> {
    partition_id: String,
    transaction_id: &'a str,
    traces: Vec<TraceJson>,
    total: i64,
    limit: i64,
    offset: i64,
}

/// `GET /api/v1/traces/{partitionId}/{transactionId}?limit=&offset=`: the message's events,
/// oldest first (default and most 1000 a page); 404 when the partition holds no such message.
pub async fn of_message(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let partition_id = path_partition_id(&req)?;
    let transaction_id = path_param(req.match_info(), "transaction_id")?;
    let page = page_of(&strict_query(&req, &["limit", "offset"])?, MAX_PAGE)?;
    let (events, total) = traces::of_message(&broker, partition_id, &transaction_id, page)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no message {transaction_id:?} in partition {partition_id}")))?;
    Ok(HttpResponse::Ok().json(MessageTraces {
        partition_id: partition_id.to_string(),
        transaction_id: &transaction_id,
        traces: rendered(events)?,
        total,
        limit: page.limit,
        offset: page.offset,
    }))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NamedTraces<'a> {
    name: &'a str,
    traces: Vec<TraceJson>,
    total: i64,
    limit: i64,
    offset: i64,
}

/// `GET /api/v1/traces/by-name/{name}?limit=&offset=&from=&to=`: the events carrying the name,
/// across queues, newest first (default 100, at most 1000 a page); `from`/`to` bound when they
/// were recorded. A name nothing carries has no events (200).
pub async fn by_name(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let name = path_param(req.match_info(), "name")?;
    check_label("the trace name", &name)?;
    let query = strict_query(&req, &["limit", "offset", "from", "to"])?;
    let (from, to) = time_range(&query)?;
    let filter = NameFilter { from, to, page: page_of(&query, 100)? };
    let (events, total) = traces::by_name(&broker, &name, &filter).await?;
    Ok(HttpResponse::Ok().json(NamedTraces {
        name: &name,
        traces: rendered(events)?,
        total,
        limit: filter.page.limit,
        offset: filter.page.offset,
    }))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NameJson {
    name: String,
    events: i64,
    last_event_at: String,
}

impl From<TraceName> for NameJson {
    fn from(n: TraceName) -> Self {
        NameJson { name: n.name, events: n.events, last_event_at: timestamp(n.last_event_at) }
    }
}

/// `GET /api/v1/traces/names?search=&limit=&offset=`: the names in use, in name order, with how
/// many events carry each and when the newest was recorded; `search` keeps the names containing
/// it, ignoring case (default 100, at most 1000 a page).
pub async fn names(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let query = strict_query(&req, &["limit", "offset", "search"])?;
    let page = page_of(&query, 100)?;
    let search = query.get("search").map(String::as_str).filter(|search| !search.is_empty());
    if let Some(search) = search {
        check_label("search", search)?;
    }
    let listed = traces::names(&broker, search, page).await?;
    let names: Vec<NameJson> = listed.into_iter().map(NameJson::from).collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "names": names, "limit": page.limit, "offset": page.offset })))
}
