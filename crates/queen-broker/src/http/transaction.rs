//! `POST /api/v1/transaction`: acks and pushes, all or nothing, with the `kv` and `timers` riders;
//! a JSON body, or the binary QTB1 body (`super::binary_push`).

use std::sync::Arc;

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;
use uuid::Uuid;

use queen_store::ack_rules::LeaseFence;

use super::ack::{ACK_MEMBERS, AckResult, parse_ack};
use super::authorize::Caller;
use super::binary_push::{self, Limits, TransactionCounts};
use super::body::{JsonObject, NoQuery, hold_decompressed, read_body};
use super::kv::{OpJson, Precondition, Rider, parse_batch};
use super::push::{ItemResult, parse_item, stamp};
use super::timers::{TimerResultJson, parse_rider};
use crate::broker::Broker;
use crate::broker::push::PushItem;
use crate::broker::transaction::{Applied, Bundle, Operation, TransactionError, execute};
use crate::error::ApiError;
use crate::names::{self, NameKind};

pub async fn handle(
    broker: web::Data<Broker>,
    _: NoQuery,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let binary = binary_push::is_binary(&req, &body, binary_push::TRANSACTION_MAGIC)
        .then(|| binary_push::parse_transaction(&body, Limits::of(&broker.config)))
        .transpose()?;
    let frames = binary.as_ref().map_or(0, |binary| binary.decompressed_bytes);
    let _decompressed = binary.as_ref().map(|_| hold_decompressed(&broker, body.len(), frames)).transpose()?;
    let held = body.len() + frames;
    // A binary body's head is the JSON body without its pushes; an empty one is `{}`.
    let body = JsonObject::parse_body(binary.as_ref().map_or(&body[..], |binary| binary.head), binary.is_some())?;
    let counts_only = binary.as_ref().is_some_and(|binary| binary.counts_only);
    let mut bundle = parse_bundle(&body, broker.config.push.max_items, binary.map(|binary| binary.items))?;
    // The `timers` rider is read with the broker's limits, which `parse_bundle` does not know.
    let (timers, _timer_payloads) = parse_rider(&body, &broker, held)?;
    bundle.timers = timers;
    super::timers::stamp(&caller, &mut bundle.timers)?;
    let mut acked = Vec::new();
    for operation in &mut bundle.operations {
        match operation {
            Operation::Push(items) => stamp(&caller, items)?,
            Operation::Ack(ack) => acked.push(ack.partition_id),
        }
    }
    caller.check_partitions(&broker, &acked).await?;
    // Key/value state belongs to no queue: a token confined to queues may not touch it, here as on
    // `/api/v1/kv`.
    if bundle.kv.is_some() && caller.0.as_ref().is_some_and(|identity| identity.is_scoped()) {
        return Err(ApiError::Forbidden("a token confined to queues may not use the kv rider".into()));
    }
    let transaction_id = Uuid::now_v7();
    match execute(&broker, bundle).await {
        Ok(applied) => {
            // Counted instead (binary flag 0x02), pushes and acks have no results of their own.
            let counts = counts_only.then(|| TransactionCounts::of(&applied));
            let results = applied
                .iter()
                .enumerate()
                .filter(|(_, entry)| !counts_only || matches!(entry, Applied::Kv(_) | Applied::Timer(_)))
                .map(|(index, entry)| {
                    Ok(match entry {
                        Applied::Ack { request, outcome } => EntryResult::Ack(AckResult::new(index, request, outcome)),
                        Applied::Push(pushed) => EntryResult::Push(ItemResult::new(index, pushed)),
                        Applied::Kv(result) => EntryResult::Kv(OpJson::of(result)?),
                        Applied::Timer(result) => EntryResult::Timer(TimerResultJson::new(Some(index), result)),
                    })
                })
                .collect::<Result<Vec<_>, ApiError>>()?;
            Ok(HttpResponse::Ok().json(Committed { success: true, transaction_id, counts, results }))
        }
        Err(TransactionError::RolledBack(reason)) => Ok(HttpResponse::Conflict().json(RolledBack {
            success: false,
            transaction_id,
            error: format!("transaction rolled back: {reason}"),
            code: "rolled_back",
        })),
        // Returned, not raised, by the official client: the expected end of a redelivery whose
        // marker exists, or of a step whose lock guard no longer holds.
        Err(ref error @ TransactionError::KvPrecondition { index, ref verdict }) => {
            Ok(HttpResponse::Ok().json(KvRolledBack {
                success: false,
                transaction_id,
                error: error.to_string(),
                precondition: Precondition::of(index, verdict)?,
            }))
        }
        Err(TransactionError::Failed(e)) => Err(e.into()),
    }
}

/// The operations of a body, checked; one bad operation refuses the whole bundle. An ack that
/// names no lease of its own is fenced by the bundle's `requiredLeases` when there are any. A
/// binary body's `pushed` items (its groups) follow the operations of its head, which has no push
/// operations of its own.
fn parse_bundle(body: &JsonObject<'_>, max_items: usize, pushed: Option<Vec<PushItem>>) -> Result<Bundle, ApiError> {
    body.takes_only(&["operations", "requiredLeases", "kv", "timers"])?;
    let kv = match body.raw("kv") {
        None => None,
        Some(_) => Some(
            parse_batch(body, "kv", Rider::Yes)
                .map_err(|refused| ApiError::BadRequest(format!("{} ({})", refused.detail, refused.code)))?,
        ),
    };
    let operations = match (body.objects("operations")?, &pushed) {
        (Some(operations), _) => operations.read_at_most(max_items, "operations")?,
        (None, Some(_)) => Vec::new(),
        (None, None) => return Err(ApiError::bad_request("operations is required")),
    };
    // A bundle of key/value or timer operations alone is a bundle (a guarded step may only write
    // state, or only schedule).
    let pushes_nothing = pushed.as_ref().is_none_or(Vec::is_empty);
    if operations.is_empty() && kv.is_none() && body.raw("timers").is_none() && pushes_nothing {
        return Err(ApiError::bad_request("operations must not be empty"));
    }
    let required: Vec<String> = match body.raw("requiredLeases") {
        None => Vec::new(),
        Some(raw) => serde_json::from_str(raw.get())
            .map_err(|_| ApiError::bad_request("requiredLeases must be an array of lease ids"))?,
    };
    let mut required_leases = required
        .iter()
        .map(|lease| {
            Uuid::parse_str(lease)
                .map_err(|_| ApiError::bad_request(format!("requiredLeases: {lease:?} is not a lease id")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    required_leases.sort_unstable();
    required_leases.dedup();
    let unfenced =
        if required_leases.is_empty() { LeaseFence::Unfenced } else { LeaseFence::AnyOf(required_leases.clone()) };
    let mut items = 0;
    let mut operations = operations
        .iter()
        .map(|operation| match operation.required_string("type")?.as_str() {
            "ack" => {
                operation.takes_only(&[&["type", "consumerGroup"], ACK_MEMBERS].concat())?;
                let group = operation.text("consumerGroup")?;
                let group: Arc<str> = names::group_or_queue_mode(group.as_deref()).into();
                names::check(NameKind::ConsumerGroup, operation.member("consumerGroup"), &group)
                    .map_err(ApiError::BadRequest)?;
                let mut ack = parse_ack(operation, &group)?;
                if ack.fence == LeaseFence::Unfenced {
                    ack.fence = unfenced.clone();
                }
                Ok(Operation::Ack(ack))
            }
            "push" if pushed.is_some() => Err(ApiError::bad_request(format!(
                "{}: the head of a binary transaction has no push operations; its pushes are its groups",
                operation.name_of("type")
            ))),
            "push" => {
                operation.takes_only(&["type", "items"])?;
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
                Ok(Operation::Push(pushed.read()?.iter().map(parse_item).collect::<Result<_, _>>()?))
            }
            other => Err(ApiError::bad_request(format!(
                "{} must be `ack` or `push`, not {other:?}",
                operation.name_of("type")
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    operations.extend(pushed.filter(|items| !items.is_empty()).map(Operation::Push));
    Ok(Bundle { operations, required_leases, kv, timers: Vec::new() })
}

#[derive(Serialize)]
#[serde(untagged)]
enum EntryResult<'a> {
    Ack(AckResult<'a>),
    Push(ItemResult<'a>),
    Kv(OpJson<'a>),
    Timer(TimerResultJson<'a>),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Committed<'a> {
    success: bool,
    transaction_id: Uuid,
    #[serde(flatten)]
    counts: Option<TransactionCounts>,
    results: Vec<EntryResult<'a>>,
}

/// A bundle a `kv` rider operation stopped: `reason: "kv_precondition"` and where and why.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KvRolledBack<'a> {
    success: bool,
    transaction_id: Uuid,
    error: String,
    #[serde(flatten)]
    precondition: Precondition<'a>,
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
        match JsonObject::parse_body(body.as_bytes(), false).and_then(|body| parse_bundle(&body, 100, None)) {
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
    fn acks_without_a_lease_are_fenced_by_the_required_leases() {
        let (one, two) = ("0192f0c4-0000-7000-8000-000000000001", "0192f0c4-0000-7000-8000-000000000002");
        let body = format!(
            r#"{{"operations": [{{"type": "ack", "transactionId": "t", "partitionId": "1"}},
                                {{"type": "ack", "transactionId": "u", "partitionId": "2", "leaseId": "{one}"}}],
                "requiredLeases": ["{two}", "{one}", "{two}"]}}"#
        );
        let bundle = parse_bundle(&JsonObject::parse_body(body.as_bytes(), false).unwrap(), 10, None).unwrap();
        let leases = vec![Uuid::parse_str(one).unwrap(), Uuid::parse_str(two).unwrap()];
        assert_eq!(bundle.required_leases, leases, "sorted, without repeats");
        let fences: Vec<&LeaseFence> = bundle
            .operations
            .iter()
            .map(|op| match op {
                Operation::Ack(ack) => &ack.fence,
                Operation::Push(_) => panic!("only acks"),
            })
            .collect();
        assert_eq!(fences, vec![&LeaseFence::AnyOf(leases.clone()), &LeaseFence::Lease(leases[0])]);
        assert!(refused(r#"{"operations": [{"type": "ack", "transactionId": "t", "partitionId": "1"}], "requiredLeases": ["x"]}"#).starts_with("requiredLeases"));
    }
}
