//! `GET /api/v1/messages/{partitionId}/{transactionId}`: one message and every group's progress.

use actix_web::{HttpRequest, HttpResponse, web};
use queen_store::messages::{GroupProgress, StoredMessage};
use serde::Serialize;
use serde_json::value::RawValue;

use super::body::{NoQuery, path_param};
use super::{StoredMessageJson, Timestamp, timestamp};
use crate::broker::{Broker, messages};
use crate::error::ApiError;

/// The partition id of a message route.
pub fn partition_id(req: &HttpRequest) -> Result<i64, ApiError> {
    let raw = req.match_info().get("partition_id").unwrap_or_default();
    raw.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| ApiError::bad_request(format!("{raw:?} is not a partition id")))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GroupJson<'a> {
    name: &'a str,
    consumed: bool,
    lease_expires_at: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageJson<'a> {
    #[serde(flatten)]
    stored: StoredMessageJson<'a>,
    namespace: Option<&'a str>,
    task: Option<&'a str>,
    /// `completed` when every group with a cursor on the partition, or registered on the queue,
    /// has passed the message, `processing` while a lease holds it, `pending` otherwise.
    status: &'static str,
    consumer_groups: Vec<GroupJson<'a>>,
}

fn status(groups: &[GroupProgress]) -> &'static str {
    if !groups.is_empty() && groups.iter().all(|g| g.consumed) {
        "completed"
    } else if groups.iter().any(|g| g.lease_expires_at.is_some()) {
        "processing"
    } else {
        "pending"
    }
}

pub async fn get(broker: web::Data<Broker>, _: NoQuery, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let partition_id = partition_id(&req)?;
    let transaction_id = path_param(req.match_info(), "transaction_id")?;
    let message: StoredMessage = messages::find(&broker, partition_id, &transaction_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no message {transaction_id:?} in partition {partition_id}")))?;
    let json = String::from_utf8(message.frame.payload.clone())
        .map_err(|_| ApiError::Internal(format!("message {transaction_id:?} is not UTF-8 JSON")))?;
    let data = RawValue::from_string(json).map_err(|e| ApiError::Internal(format!("message is not JSON: {e}")))?;
    Ok(HttpResponse::Ok().json(MessageJson {
        stored: StoredMessageJson {
            id: message.frame.message_id,
            transaction_id: &message.frame.transaction_id,
            trace_id: message.frame.trace_id,
            producer_sub: message.frame.producer.as_deref(),
            queue: &message.queue,
            partition: &message.partition,
            partition_id,
            offset: message.offset,
            created_at: Timestamp(message.created_at),
            data: &data,
        },
        namespace: message.namespace.as_deref(),
        task: message.task.as_deref(),
        status: status(&message.groups),
        consumer_groups: message
            .groups
            .iter()
            .map(|g| GroupJson {
                name: &g.group,
                consumed: g.consumed,
                lease_expires_at: g.lease_expires_at.map(timestamp),
            })
            .collect(),
    }))
}
