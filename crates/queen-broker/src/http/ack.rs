//! `POST /api/v1/ack` and `POST /api/v1/ack/batch`: per-item verdicts, HTTP 200.

use std::borrow::Cow;
use std::sync::Arc;

use actix_web::{HttpResponse, web};
use queen_store::ack_rules::{AckStatus, AckVerdict, LeaseFence};
use queen_store::cursors::{AckOutcome, AckRequest};
use serde::Serialize;
use uuid::Uuid;

use super::authorize::Caller;
use super::body::{JsonObject, NoQuery, read_body};
use crate::broker::Broker;
use crate::broker::ack::{acknowledge, refusal_text, status_label};
use crate::error::ApiError;
use crate::names::{self, NameKind};

pub async fn single(
    broker: web::Data<Broker>,
    _: NoQuery,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let body = JsonObject::parse_body(&body, false)?;
    body.takes_only(&[ACK_MEMBERS, &["consumerGroup"]].concat())?;
    let group = group_of(&body)?;
    let request = parse_ack(&body, &group)?;
    caller.check_partitions(&broker, &[request.partition_id]).await?;
    answer(&broker, &group, vec![request]).await
}

pub async fn batch(
    broker: web::Data<Broker>,
    _: NoQuery,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let body = JsonObject::parse_body(&body, false)?;
    body.takes_only(&["acknowledgments", "consumerGroup"])?;
    let group = group_of(&body)?;
    let items = body.objects("acknowledgments")?.ok_or_else(|| ApiError::bad_request("acknowledgments is required"))?;
    if items.is_empty() {
        return Err(ApiError::bad_request("acknowledgments must not be empty"));
    }
    let requests = items
        .iter()
        .map(|item| item.takes_only(ACK_MEMBERS).and_then(|()| parse_ack(item, &group)))
        .collect::<Result<Vec<_>, _>>()?;
    let partitions: Vec<i64> = requests.iter().map(|request| request.partition_id).collect();
    caller.check_partitions(&broker, &partitions).await?;
    answer(&broker, &group, requests).await
}

async fn answer(broker: &Broker, group: &str, requests: Vec<AckRequest>) -> Result<HttpResponse, ApiError> {
    let started = std::time::Instant::now();
    let echo = requests.clone();
    let outcomes = acknowledge(broker, group, requests).await?;
    broker.metrics.ack_duration.observe(started.elapsed().as_secs_f64());
    let results: Vec<AckResult<'_>> = echo
        .iter()
        .zip(&outcomes)
        .enumerate()
        .map(|(index, (request, outcome))| AckResult::new(index, request, outcome))
        .collect();
    Ok(HttpResponse::Ok().json(results))
}

fn group_of(body: &JsonObject<'_>) -> Result<Arc<str>, ApiError> {
    let group = body.text("consumerGroup")?;
    let group = names::group_or_queue_mode(group.as_deref());
    names::check(NameKind::ConsumerGroup, body.member("consumerGroup"), group).map_err(ApiError::BadRequest)?;
    Ok(group.into())
}

/// Partition ids are sent as strings (as pops hand them out) or numbers.
pub fn partition_id(item: &JsonObject<'_>) -> Result<i64, ApiError> {
    let field = item.member("partitionId");
    let raw = item.raw("partitionId").ok_or_else(|| ApiError::bad_request(format!("{field} is required")))?;
    let text = match raw.get().starts_with('"') {
        true => item.text("partitionId")?.unwrap_or_default(),
        false => Cow::Borrowed(raw.get()),
    };
    text.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| ApiError::bad_request(format!("{field} must be a partition id, not {}", raw.get())))
}

/// A lease id, when the item names one: absent, `null` and `""` mean none.
pub fn lease_id(item: &JsonObject<'_>) -> Result<Option<Uuid>, ApiError> {
    match item.text("leaseId")? {
        None => Ok(None),
        Some(lease) if lease.is_empty() => Ok(None),
        Some(lease) => Uuid::parse_str(&lease)
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("{} is not a lease id: {lease:?}", item.member("leaseId")))),
    }
}

pub fn status(item: &JsonObject<'_>) -> Result<AckStatus, ApiError> {
    match item.text("status")?.as_deref() {
        None | Some("completed" | "success") => Ok(AckStatus::Completed),
        Some("failed") => Ok(AckStatus::Failed),
        Some("retry") => Ok(AckStatus::Retry),
        Some("dlq") => Ok(AckStatus::DeadLetter),
        Some(other) => Err(ApiError::bad_request(format!(
            "{} must be one of completed, failed, retry, dlq; not {other:?}",
            item.member("status")
        ))),
    }
}

/// The members [`parse_ack`] reads; the group is the caller's to read (a batch names it once).
pub const ACK_MEMBERS: &[&str] = &["transactionId", "partitionId", "status", "error", "leaseId"];

/// One acknowledgement of a request body, for `group`, fenced by the lease it names.
pub fn parse_ack(item: &JsonObject<'_>, group: &Arc<str>) -> Result<AckRequest, ApiError> {
    let transaction_id = item.required_text("transactionId")?;
    names::check(NameKind::TransactionId, item.member("transactionId"), &transaction_id)
        .map_err(ApiError::BadRequest)?;
    Ok(AckRequest {
        partition_id: partition_id(item)?,
        transaction_id: Arc::from(transaction_id.as_ref()),
        offset: None,
        status: status(item)?,
        fence: lease_id(item)?.map_or(LeaseFence::Unfenced, LeaseFence::Lease),
        consumer_group: Arc::clone(group),
        error: item.string("error")?.map(storable_text),
    })
}

/// An ack's `error` as PostgreSQL can store it: `text` cannot hold U+0000, so each one becomes
/// U+FFFD. The error is a diagnostic (often a stack trace) that ends up in the dead letter; an ack
/// is not refused over it, or a consumer whose failures carry a NUL could never give up on its
/// message.
fn storable_text(text: String) -> String {
    if text.contains('\0') { text.replace('\0', "\u{FFFD}") } else { text }
}

/// One item's verdict as the client reads it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AckResult<'a> {
    index: usize,
    transaction_id: &'a str,
    #[serde(serialize_with = "super::id_text")]
    partition_id: i64,
    consumer_group: &'a str,
    status: &'static str,
    success: bool,
    noop: bool,
    lease_released: bool,
    dlq: bool,
    /// Given up on without a dead letter (the queue does not dead-letter exhausted messages);
    /// present only then.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    dropped: bool,
    error: Option<String>,
}

impl<'a> AckResult<'a> {
    pub fn new(index: usize, request: &'a AckRequest, outcome: &AckOutcome) -> Self {
        let (lease_released, dlq) = match outcome.verdict {
            AckVerdict::Committed { lease_released } => (lease_released, false),
            AckVerdict::Requeued { .. } => (true, false),
            AckVerdict::DeadLettered => (false, true),
            AckVerdict::Dropped | AckVerdict::Noop | AckVerdict::Refused(_) => (false, false),
        };
        let error = match outcome.verdict {
            AckVerdict::Refused(refusal) => Some(refusal_text(refusal, request, outcome.committed)),
            _ => None,
        };
        AckResult {
            index,
            transaction_id: &request.transaction_id,
            partition_id: request.partition_id,
            consumer_group: &request.consumer_group,
            status: status_label(request.status),
            success: outcome.verdict.is_success(),
            noop: outcome.verdict == AckVerdict::Noop,
            lease_released,
            dlq,
            dropped: outcome.verdict == AckVerdict::Dropped,
            error,
        }
    }
}
