//! `POST /api/v1/locks`: lock operations, one result per operation, in order. A lock someone else
//! holds, or a token that is no longer the permit's, is a verdict in a 200; a malformed operation
//! refuses the call (see [`super::kv`] for the refusal body).

use actix_web::{HttpResponse, web};
use serde::Serialize;

use super::authorize::Caller;
use super::body::{JsonObject, NoQuery, read_body};
use super::kv::{Fields, Refusal, StateError, only};
use super::timestamp;
use crate::broker::Broker;
use crate::broker::kv::MAX_TTL_SECONDS;
use crate::broker::locks::{self, Holder, LockOp, LockOutcome, Permit};

/// Most operations one call holds.
const MAX_OPERATIONS: usize = 256;

pub async fn handle(
    broker: web::Data<Broker>,
    _: NoQuery,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, StateError> {
    let holder = caller.permit_holder()?;
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let body = JsonObject::parse_body(&body, false)?;
    only(&body, &["operations"], "a locks call", "lock_unknown_field")?;
    let operations = parse_operations(&body)?;
    let outcomes = locks::run(&broker, holder, &operations).await?;
    let results: Vec<ResultJson<'_>> = outcomes.iter().map(ResultJson::of).collect();
    Ok(HttpResponse::Ok().json(Results { results }))
}

fn parse_operations(body: &JsonObject<'_>) -> Result<Vec<LockOp>, Refusal> {
    let field = "operations";
    let operations = body
        .objects(field)
        .map_err(|e| Refusal::new("lock_invalid_body", field, e.to_string()))?
        .ok_or_else(|| Refusal::new("lock_invalid_body", field, "operations is required"))?;
    if operations.is_empty() || operations.len() > MAX_OPERATIONS {
        return Err(Refusal::new(
            "lock_invalid_body",
            field,
            format!("operations must hold 1 to {MAX_OPERATIONS} operations, not {}", operations.len()),
        ));
    }
    let operations = operations.read().map_err(|e| Refusal::new("lock_invalid_body", field, e.to_string()))?;
    operations.iter().map(parse_operation).collect()
}

fn parse_operation(object: &JsonObject<'_>) -> Result<LockOp, Refusal> {
    let fields = Fields::new(object, "lock_invalid_field");
    let required = |key: &str, min: i64, max: i64| {
        let value = fields.bounded(key, min, max)?;
        fields.required(key, value)
    };
    let name = || -> Result<String, Refusal> {
        let name = fields.required_name("name", locks::MAX_NAME_BYTES)?;
        locks::check_name(&name)
            .map_err(|why| fields.invalid("name", format!("{}: a lock's name {why}", object.name_of("name"))))?;
        Ok(name)
    };
    let owner = || fields.name("owner", locks::MAX_OWNER_BYTES);
    let slot = || -> Result<u32, Refusal> {
        Ok(fields.bounded("slot", 0, i64::from(locks::MAX_LIMIT) - 1)?.map_or(0, |slot| slot as u32))
    };
    let op = fields.typed("op", object.string("op"))?;
    let op = fields.required("op", op)?;
    let allowed = |fields: &[&str]| only(object, fields, &op, "lock_unknown_field");
    match op.as_str() {
        "acquire" => {
            allowed(&["op", "name", "ttlSeconds", "owner", "limit"])?;
            Ok(LockOp::Acquire {
                name: name()?,
                ttl_seconds: required("ttlSeconds", 1, MAX_TTL_SECONDS)?,
                owner: owner()?,
                limit: fields.bounded("limit", 1, i64::from(locks::MAX_LIMIT))?.map_or(1, |limit| limit as u32),
            })
        }
        "renew" => {
            allowed(&["op", "name", "token", "ttlSeconds", "slot", "owner"])?;
            Ok(LockOp::Renew {
                name: name()?,
                token: required("token", 1, i64::MAX)?,
                ttl_seconds: required("ttlSeconds", 1, MAX_TTL_SECONDS)?,
                slot: slot()?,
                owner: owner()?,
            })
        }
        "release" => {
            allowed(&["op", "name", "token", "slot"])?;
            Ok(LockOp::Release { name: name()?, token: required("token", 1, i64::MAX)?, slot: slot()? })
        }
        "get" => {
            allowed(&["op", "name"])?;
            Ok(LockOp::Get { name: name()? })
        }
        other => Err(Refusal::new(
            "lock_unknown_op",
            object.name_of("op"),
            format!("{} must be acquire, renew, release or get, not {other:?}", object.name_of("op")),
        )),
    }
}

#[derive(Serialize)]
struct Results<'a> {
    results: Vec<ResultJson<'a>>,
}

/// The operation a holder adds to a transaction's `kv` rider so that it commits only while the
/// permit is still its own: a required check of the permit's row at its token.
#[derive(Serialize)]
struct GuardJson {
    op: &'static str,
    ns: &'static str,
    key: String,
    expect: i64,
    required: bool,
}

impl GuardJson {
    fn of(permit: &Permit) -> GuardJson {
        GuardJson { op: "check", ns: locks::NAMESPACE, key: permit.key(), expect: permit.token, required: true }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HolderJson<'a> {
    slot: u32,
    owner: &'a str,
    token: i64,
    since: String,
    expires_at: Option<String>,
    renewed_at: String,
}

fn holders(holders: &[Holder]) -> Vec<HolderJson<'_>> {
    holders
        .iter()
        .map(|holder| HolderJson {
            slot: holder.slot,
            owner: &holder.owner,
            token: holder.token,
            since: timestamp(holder.since),
            expires_at: holder.expires_at.map(timestamp),
            renewed_at: timestamp(holder.renewed_at),
        })
        .collect()
}

#[derive(Serialize)]
#[serde(untagged, rename_all_fields = "camelCase")]
enum ResultJson<'a> {
    Acquired { acquired: bool, slot: u32, token: i64, owner: &'a str, guard: GuardJson, already: bool },
    NotAcquired { acquired: bool, reason: &'static str, holders: Vec<HolderJson<'a>> },
    Renewed { renewed: bool, slot: u32, token: i64, guard: GuardJson },
    NotRenewed { renewed: bool, reason: &'static str, holders: Vec<HolderJson<'a>> },
    Released { released: bool },
    NotReleased { released: bool, reason: &'static str },
    State { held: bool, holders: Vec<HolderJson<'a>> },
}

impl<'a> ResultJson<'a> {
    fn of(outcome: &'a LockOutcome) -> Self {
        match outcome {
            LockOutcome::Acquired { permit, already } => ResultJson::Acquired {
                acquired: true,
                slot: permit.slot,
                token: permit.token,
                owner: &permit.owner,
                guard: GuardJson::of(permit),
                already: *already,
            },
            LockOutcome::Held { holders: held } => {
                ResultJson::NotAcquired { acquired: false, reason: "held", holders: holders(held) }
            }
            LockOutcome::Renewed { permit } => ResultJson::Renewed {
                renewed: true,
                slot: permit.slot,
                token: permit.token,
                guard: GuardJson::of(permit),
            },
            LockOutcome::RenewLost { holders: held } => {
                ResultJson::NotRenewed { renewed: false, reason: "lost", holders: holders(held) }
            }
            LockOutcome::Released => ResultJson::Released { released: true },
            LockOutcome::ReleaseLost => ResultJson::NotReleased { released: false, reason: "lost" },
            LockOutcome::State { holders: held } => {
                ResultJson::State { held: !held.is_empty(), holders: holders(held) }
            }
        }
    }
}
