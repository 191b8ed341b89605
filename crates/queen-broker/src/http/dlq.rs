//! Dead letters: `GET /api/v1/dlq`, and re-queuing or deleting the dead letters of a message
//! (`POST` / `DELETE /api/v1/messages/{partitionId}/{transactionId}/retry`).

use actix_web::{HttpRequest, HttpResponse, web};
use queen_store::dlq::{DeadLetter, DeadLetterFilter, Requeue};
use queen_store::log::Appended;
use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::body::{NoQuery, no_members, path_param, query_int, strict_query, time_range};
use super::messages::partition_id;
use super::timestamp;
use crate::broker::{Broker, BrokerError, messages};
use crate::error::ApiError;

/// Most dead letters one page holds.
const MAX_PAGE: u64 = 1000;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeadLetterJson {
    /// The message's id, as on delivery; null, with the data and the creation time, when
    /// retention removed the message before it was copied.
    id: Option<Uuid>,
    dead_letter_id: i64,
    transaction_id: Option<String>,
    trace_id: Option<Uuid>,
    producer_sub: Option<String>,
    queue: String,
    partition: String,
    partition_id: String,
    offset: i64,
    consumer_group: String,
    error_message: Option<String>,
    retry_count: i32,
    data: Option<Box<RawValue>>,
    created_at: Option<String>,
    failed_at: String,
}

impl TryFrom<DeadLetter> for DeadLetterJson {
    type Error = ApiError;

    fn try_from(d: DeadLetter) -> Result<Self, ApiError> {
        let data = d
            .payload
            .map(|payload| {
                let json = String::from_utf8(payload)
                    .map_err(|_| ApiError::Internal("a dead letter is not UTF-8 JSON".into()))?;
                RawValue::from_string(json).map_err(|e| ApiError::Internal(format!("a dead letter is not JSON: {e}")))
            })
            .transpose()?;
        Ok(DeadLetterJson {
            id: d.message_id,
            dead_letter_id: d.id,
            transaction_id: d.transaction_id,
            trace_id: d.trace_id,
            producer_sub: d.producer,
            queue: d.queue,
            partition: d.partition,
            partition_id: d.partition_id.to_string(),
            offset: d.offset,
            consumer_group: d.consumer_group,
            error_message: d.error,
            retry_count: d.retry_count,
            data,
            created_at: d.created_at.map(timestamp),
            failed_at: timestamp(d.failed_at),
        })
    }
}

#[derive(Serialize)]
struct Page {
    messages: Vec<DeadLetterJson>,
    total: i64,
    limit: i64,
    offset: i64,
}

/// Dead letters, newest first, filtered by `queue`, `consumerGroup`, `partition` (name) and
/// `from`/`to` (when they failed), paged with `limit` (default 100; above 1000, 1000, as the C++
/// Queen caps it: the official client shows any refusal here as an empty list) and `offset`.
pub async fn list(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let query = strict_query(&req, &["queue", "consumerGroup", "partition", "from", "to", "limit", "offset"])?;
    let (from, to) = time_range(&query)?;
    let filter = DeadLetterFilter {
        queue: query.get("queue").cloned(),
        consumer_group: query.get("consumerGroup").cloned(),
        partition: query.get("partition").cloned(),
        from,
        to,
        limit: query_int(&query, "limit", 1, u64::MAX)
            .map_err(|_| {
                let given = query.get("limit").map_or("", String::as_str);
                ApiError::bad_request(format!(
                    "limit must be a whole number from 1 (past {MAX_PAGE}, read as {MAX_PAGE}), not {given:?}"
                ))
            })?
            .map_or(100, |limit| limit.min(MAX_PAGE)) as i64,
        offset: query_int(&query, "offset", 0, i64::MAX as u64)?.unwrap_or(0) as i64,
    };
    let (letters, total) = messages::dead_letters(&broker, &filter).await?;
    let messages = letters.into_iter().map(DeadLetterJson::try_from).collect::<Result<_, _>>()?;
    Ok(HttpResponse::Ok().json(Page { messages, total, limit: filter.limit, offset: filter.offset }))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Moved {
    success: bool,
    result: &'static str,
    queue: String,
    partition_id: String,
    transaction_id: String,
    message_id: Uuid,
    offset: i64,
    dead_letters: u64,
}

/// Puts the message's dead letters back into its partition as one new message.
pub async fn retry(
    broker: web::Data<Broker>,
    _: NoQuery,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let partition = partition_id(&req)?;
    let transaction_id = path_param(req.match_info(), "transaction_id")?;
    no_members(payload, &broker).await?;
    let moved = match messages::requeue(&broker, partition, &transaction_id).await? {
        Requeue::Moved(moved) => moved,
        Requeue::NoDeadLetter => {
            return Err(ApiError::NotFound(format!(
                "no dead letter for message {transaction_id:?} of partition {partition}"
            )));
        }
        Requeue::PayloadRetained => {
            return Err(ApiError::Conflict(format!(
                "the dead letters of message {transaction_id:?} of partition {partition} have no payload to push \
                 again: {}",
                queen_store::cursors::PAYLOAD_RETAINED
            )));
        }
        Requeue::QueueFull { queue, depth, max_size } => {
            return Err(BrokerError::QueueFull { queue, depth, max_size, adding: 1 }.into());
        }
    };
    let (result, offset, message_id) = match moved.outcome {
        Appended::Queued { offset, message_id } => ("moved", offset, message_id),
        Appended::Duplicate { offset, message_id } => ("duplicate", offset, message_id),
    };
    Ok(HttpResponse::Ok().json(Moved {
        success: true,
        result,
        queue: moved.queue,
        partition_id: moved.partition_id.to_string(),
        transaction_id: moved.transaction_id,
        message_id,
        offset,
        dead_letters: moved.dead_letters,
    }))
}

/// Deletes the message's dead letters (never the message itself: the log is immutable).
pub async fn delete(broker: web::Data<Broker>, _: NoQuery, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let partition = partition_id(&req)?;
    let transaction_id = path_param(req.match_info(), "transaction_id")?;
    let deleted = messages::delete_dead_letters(&broker, partition, &transaction_id).await?;
    if deleted == 0 {
        return Err(ApiError::NotFound(format!(
            "no dead letter for message {transaction_id:?} of partition {partition}"
        )));
    }
    Ok(HttpResponse::Ok().json(serde_json::json!({"success": true, "deletedDeadLetters": deleted})))
}
