//! `POST /api/v1/transaction`: acks and pushes, all or nothing.

use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use serde::Serialize;
use uuid::Uuid;

use super::ack::{AckResult, lease_id, parse_ack};
use super::body::{JsonObject, read_body};
use super::push::{ItemResult, parse_item};
use crate::broker::Broker;
use crate::broker::transaction::{Applied, Operation, TransactionError, execute};
use crate::error::ApiError;
use crate::names::{self, NameKind};

pub async fn handle(
    broker: web::Data<Broker>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    if req.content_type() == "application/x-queen-push" {
        return Err(ApiError::bad_request("binary transaction bodies are not supported by this broker; send JSON"));
    }
    let body = read_body(payload, broker.config.http.max_body_bytes).await?;
    let operations = parse_bundle(&body, broker.config.push.max_items)?;
    let transaction_id = Uuid::now_v7();
    match execute(&broker, operations).await {
        Ok(applied) => {
            let results: Vec<EntryResult<'_>> = applied
                .iter()
                .enumerate()
                .map(|(index, entry)| match entry {
                    Applied::Ack { request, outcome } => EntryResult::Ack(AckResult::new(index, request, outcome)),
                    Applied::Push(pushed) => EntryResult::Push(ItemResult::new(index, pushed)),
                })
                .collect();
            Ok(HttpResponse::Ok().json(Committed { success: true, transaction_id, results }))
        }
        Err(TransactionError::RolledBack(reason)) => Ok(HttpResponse::Conflict().json(RolledBack {
            success: false,
            transaction_id,
            error: format!("transaction rolled back: {reason}"),
            code: "rolled_back",
        })),
        Err(TransactionError::Api(e)) => Err(e),
    }
}

/// The operations of a body, checked; one bad operation refuses the whole bundle.
fn parse_bundle(body: &[u8], max_items: usize) -> Result<Vec<Operation>, ApiError> {
    let body = JsonObject::parse_body(body, false)?;
    for rider in ["kv", "timers"] {
        if body.raw(rider).is_some() {
            return Err(ApiError::bad_request(format!(
                "{rider} operations in transactions are not supported by this broker"
            )));
        }
    }
    let operations = body.objects("operations")?.ok_or_else(|| ApiError::bad_request("operations is required"))?;
    if operations.is_empty() {
        return Err(ApiError::bad_request("operations must not be empty"));
    }
    // A bundle naming exactly one lease lends it to acks that name none.
    let required: Vec<String> = match body.raw("requiredLeases") {
        None => Vec::new(),
        Some(raw) => serde_json::from_str(raw.get())
            .map_err(|_| ApiError::bad_request("requiredLeases must be an array of lease ids"))?,
    };
    let lent = match required.as_slice() {
        [only] => Some(
            uuid::Uuid::parse_str(only)
                .map_err(|_| ApiError::bad_request(format!("requiredLeases: {only:?} is not a lease id")))?,
        ),
        _ => None,
    };
    let mut items = 0;
    operations
        .iter()
        .map(|operation| match operation.required_string("type")?.as_str() {
            "ack" => {
                let group = operation.string("consumerGroup")?;
                let group = names::group_or_queue_mode(group.as_deref()).to_owned();
                names::check(NameKind::ConsumerGroup, &operation.name_of("consumerGroup"), &group)
                    .map_err(ApiError::BadRequest)?;
                let mut ack = parse_ack(operation, &group)?;
                if lease_id(operation)?.is_none() {
                    ack.lease_id = lent;
                }
                Ok(Operation::Ack(ack))
            }
            "push" => {
                let pushed = operation
                    .objects("items")?
                    .ok_or_else(|| ApiError::bad_request(format!("{} is required", operation.name_of("items"))))?;
                items += pushed.len();
                if pushed.is_empty() || items > max_items {
                    return Err(ApiError::bad_request(format!(
                        "{} must hold 1 to {max_items} items in all",
                        operation.name_of("items")
                    )));
                }
                Ok(Operation::Push(pushed.iter().map(parse_item).collect::<Result<_, _>>()?))
            }
            other => Err(ApiError::bad_request(format!(
                "{} must be `ack` or `push`, not {other:?}",
                operation.name_of("type")
            ))),
        })
        .collect()
}

#[derive(Serialize)]
#[serde(untagged)]
enum EntryResult<'a> {
    Ack(AckResult<'a>),
    Push(ItemResult<'a>),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Committed<'a> {
    success: bool,
    transaction_id: Uuid,
    results: Vec<EntryResult<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RolledBack {
    success: bool,
    transaction_id: Uuid,
    error: String,
    code: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(body: &str) -> String {
        match parse_bundle(body.as_bytes(), 100) {
            Err(ApiError::BadRequest(message)) => message,
            other => panic!("{body}: expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn bundles_are_checked_whole() {
        assert_eq!(refused("{}"), "operations is required");
        assert_eq!(refused(r#"{"operations": []}"#), "operations must not be empty");
        assert!(refused(r#"{"operations": [{"type": "nap"}]}"#).starts_with("operations[0].type"));
        assert!(refused(r#"{"operations": [{"type": "ack", "partitionId": "1"}]}"#).contains("transactionId"));
        assert!(refused(r#"{"operations": [{"type": "push", "items": [{"queue": ""}]}]}"#).contains("queue"));
        assert!(refused(r#"{"operations": [{"type": "push", "items": []}], "kv": []}"#).starts_with("kv"));
    }

    #[test]
    fn a_single_required_lease_is_lent_to_acks_without_one() {
        let lease = "0192f0c4-0000-7000-8000-000000000001";
        let body = format!(
            r#"{{"operations": [{{"type": "ack", "transactionId": "t", "partitionId": "1"}}], "requiredLeases": ["{lease}"]}}"#
        );
        let operations = parse_bundle(body.as_bytes(), 10).unwrap();
        let Operation::Ack(ack) = &operations[0] else { panic!("an ack") };
        assert_eq!(ack.lease_id, Some(Uuid::parse_str(lease).unwrap()));
    }
}
