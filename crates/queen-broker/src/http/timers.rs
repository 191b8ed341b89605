//! Timers: `POST /api/v1/timers` (schedule, reschedule and cancel, index-aligned results),
//! `DELETE /api/v1/timers/{queue}/{key}` (cancel), `GET /api/v1/timers/{queue}/{key}` (peek) and
//! `GET /api/v1/timers/{queue}` (a keyset page). The operations are also the transaction's
//! `timers` rider ([`parse_rider`]).

use actix_web::{HttpRequest, HttpResponse, web};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use queen_store::timers::{StoredTimer, TimerState};
use serde::Serialize;
use serde::de::IgnoredAny;
use uuid::Uuid;

use super::authorize::Caller;
use super::body::{
    JsonObject, MAX_DATA_NESTING, NoQuery, hold_decompressed, nests_deeper_than, path_name, path_param, read_body,
    strict_query,
};
use super::timestamp;
use crate::broker::Broker;
use crate::broker::timers::{self, CancelTimer, ScheduleTimer, TimerOp, TimerOutcome, TimerResult};
use crate::error::ApiError;
use crate::names::{self, DEFAULT_PARTITION, MAX_NAME_BYTES, NameKind};
use crate::pressure::Held;

/// The longest delay a timer may be scheduled with: ten years.
const MAX_DELAY_MS: i64 = 10 * 365 * 24 * 3600 * 1000;

/// Rows of a list page: at most, and when the caller names no limit.
const MAX_PAGE: i64 = 1000;
const DEFAULT_PAGE: i64 = 100;

/// Fields of an operation the broker sets itself. A caller sending one is refused, rather than
/// have it ignored: the producer and tenant come from the token, the message id is minted, and a
/// due time is only ever relative (`delayMs`).
const SERVER_OWNED: &[&str] = &[
    "producerSub",
    "producer_sub",
    "messageId",
    "message_id",
    "tenant",
    "tenantId",
    "tenant_id",
    "deliverAt",
    "deliver_at",
    "delaySeconds",
    "delay_seconds",
    "attempts",
    "claimToken",
    "claim_token",
    "claimedUntil",
    "claimed_until",
];

const SCHEDULE_FIELDS: &[&str] = &["op", "queue", "timerKey", "payload", "payloadZstd", "delayMs", "txn", "partition"];
const CANCEL_FIELDS: &[&str] = &["op", "queue", "timerKey", "txn"];

pub async fn batch(
    broker: web::Data<Broker>,
    _: NoQuery,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let held = body.len();
    let body = JsonObject::parse_body(&body, false)?;
    body.takes_only(&["operations"])?;
    let (mut ops, _decompressed) = parse_ops(&body, "operations", &broker, held)?
        .ok_or_else(|| ApiError::bad_request("operations is required"))?;
    if ops.is_empty() {
        return Err(ApiError::bad_request("operations must not be empty"));
    }
    stamp(&caller, &mut ops)?;
    let results = timers::apply(&broker, ops).await?;
    let results: Vec<TimerResultJson<'_>> = results.iter().map(|result| TimerResultJson::new(None, result)).collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "results": results })))
}

/// Cancels the pending timer of the key; with `?txn=`, only if it is that txn's timer.
pub async fn cancel(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let (queue, timer_key) = timer_of(&req)?;
    let txn = strict_query(&req, &["txn"])?.remove("txn");
    if let Some(txn) = &txn {
        names::check(NameKind::TransactionId, "txn", txn).map_err(ApiError::BadRequest)?;
    }
    let result = timers::cancel(&broker, CancelTimer { queue, timer_key, txn }).await?;
    Ok(HttpResponse::Ok().json(TimerResultJson::new(None, &result)))
}

/// The pending timer of the key as stored; a miss is `{"found": false}`, HTTP 200.
pub async fn peek(broker: web::Data<Broker>, _: NoQuery, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let (queue, timer_key) = timer_of(&req)?;
    Ok(match timers::find(&broker, &queue, &timer_key).await? {
        Some(timer) => HttpResponse::Ok().json(Peeked { found: true, timer: TimerJson::from(&timer) }),
        None => HttpResponse::Ok().json(serde_json::json!({ "found": false })),
    })
}

/// The queue's pending timers in key order, after the key `after` (exclusive), at most `limit`
/// (clamped to 1..=1000, 100 by default).
pub async fn list(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let queue = path_name(&req, "queue", NameKind::Queue)?;
    let query = strict_query(&req, &["limit", "after"])?;
    let limit = match query.get("limit") {
        None => DEFAULT_PAGE,
        Some(text) => text
            .parse::<i64>()
            .or_else(|e| match e.kind() {
                // An integer past i64 is far past the page's most, to which it is clamped.
                std::num::IntErrorKind::PosOverflow => Ok(MAX_PAGE),
                std::num::IntErrorKind::NegOverflow => Ok(1),
                _ => Err(ApiError::bad_request(format!("limit must be an integer, not {text:?}"))),
            })?
            .clamp(1, MAX_PAGE),
    };
    let after = query.get("after").filter(|after| !after.is_empty());
    let (rows, truncated) = timers::list(&broker, &queue, after.map(String::as_str), limit as usize).await?;
    let next_after = if truncated { rows.last().map(|timer| timer.timer_key.as_str()) } else { None };
    Ok(HttpResponse::Ok().json(Page { rows: rows.iter().map(TimerJson::from).collect(), truncated, next_after }))
}

/// The timer a path names: its queue (one segment, `/` sent as `%2F`) and its key (the rest of
/// the path, `/` kept).
fn timer_of(req: &HttpRequest) -> Result<(String, String), ApiError> {
    let queue = path_name(req, "queue", NameKind::Queue)?;
    let timer_key = path_param(req.match_info(), "key")?;
    check_timer_key("key", &timer_key)?;
    Ok((queue, timer_key))
}

/// A timer key is 1 to 255 bytes without control characters. It may contain `/` (it travels
/// unescaped in the path), but not at its start or twice in a row: the path would be merged into
/// another key's before it is routed. Nor may a segment between its `/`s be `.` or `..`: URL
/// libraries (the official client's httpx) resolve those away, and a cancel of `a/../b` would
/// cancel `b`.
fn check_timer_key(field: &str, key: &str) -> Result<(), ApiError> {
    let problem = if key.is_empty() {
        "must not be empty".to_owned()
    } else if key.len() > MAX_NAME_BYTES {
        format!("is {} bytes long; at most {MAX_NAME_BYTES} are allowed", key.len())
    } else if key.chars().any(char::is_control) {
        "must not contain control characters".to_owned()
    } else if key.starts_with('/') || key.contains("//") {
        "must not start with '/' or contain '//'".to_owned()
    } else if key.split('/').any(|segment| segment == "." || segment == "..") {
        "must not have '.' or '..' between its '/'s (a path resolves them away)".to_owned()
    } else {
        return Ok(());
    };
    Err(ApiError::bad_request(format!("{field}: the timer key {problem}")))
}

/// The transaction's `timers` rider: absent (or `null`) when the bundle has no timer operation.
/// With the place its decompressed payloads hold, to be kept while the bundle runs; `already`
/// is what the bundle holds besides.
pub fn parse_rider(
    body: &JsonObject<'_>,
    broker: &Broker,
    already: usize,
) -> Result<(Vec<TimerOp>, Option<Held>), ApiError> {
    let (ops, held) = parse_ops(body, "timers", broker, already)?.unzip();
    let ops = ops.unwrap_or_default();
    if body.raw("timers").is_some() && ops.is_empty() {
        return Err(ApiError::bad_request("timers must not be empty; leave it out when there are no timer operations"));
    }
    Ok((ops, held))
}

/// Checks that the caller may act on every operation's queue, and records it as the producer of
/// the messages its timers will deliver.
pub fn stamp(caller: &Caller, ops: &mut [TimerOp]) -> Result<(), ApiError> {
    caller.check_queues(ops.iter().map(TimerOp::queue))?;
    if let Some(producer) = caller.subject() {
        for op in ops {
            if let TimerOp::Schedule(timer) = op {
                timer.producer = Some(producer.to_owned());
            }
        }
    }
    Ok(())
}

/// What the payloads of one request sent compressed may decompress to, in all: as much as a body
/// may weigh (`http.max_body_bytes`), as for a binary push's frames. Without a bound across the
/// operations, a few kilobytes of zstd frames would make the broker hold gigabytes.
struct Inflation {
    max: usize,
    left: usize,
}

/// The timer operations of the array `key`, checked, and the place their decompressed payloads
/// hold in the broker's bound on body bytes; one bad operation refuses them all.
fn parse_ops(
    body: &JsonObject<'_>,
    key: &str,
    broker: &Broker,
    already: usize,
) -> Result<Option<(Vec<TimerOp>, Held)>, ApiError> {
    let Some(ops) = body.objects(key)? else { return Ok(None) };
    let max = broker.config.http.max_body_bytes;
    let mut inflation = Inflation { max, left: max };
    let ops = ops
        .read_at_most(broker.config.push.max_items, "timer operations")?
        .iter()
        .map(|op| parse_op(op, &mut inflation))
        .collect::<Result<_, _>>()?;
    Ok(Some((ops, hold_decompressed(broker, already, max - inflation.left)?)))
}

fn parse_op(op: &JsonObject<'_>, inflation: &mut Inflation) -> Result<TimerOp, ApiError> {
    let kind = op.required_string("op")?;
    let allowed = match kind.as_str() {
        "schedule" | "reschedule" => SCHEDULE_FIELDS,
        "cancel" => CANCEL_FIELDS,
        other => {
            return Err(ApiError::bad_request(format!(
                "{} must be `schedule`, `reschedule` or `cancel`, not {other:?}",
                op.name_of("op")
            )));
        }
    };
    for field in op.keys() {
        if SERVER_OWNED.contains(&field) || field.starts_with('_') {
            return Err(ApiError::bad_request(format!(
                "{} is set by the broker and cannot be sent: the producer comes from the token, the message id is \
                 minted, and the due time is only ever relative (delayMs)",
                op.name_of(&names::quoted_member(field))
            )));
        }
        if !allowed.contains(&field) {
            return Err(ApiError::bad_request(format!(
                "{} is not a field of a {kind} operation",
                op.name_of(&names::quoted_member(field))
            )));
        }
    }
    let checked = |kind, key: &str, value: String| {
        names::check_new(kind, op.member(key), &value).map(|()| value).map_err(ApiError::BadRequest)
    };
    let queue = checked(NameKind::Queue, "queue", op.required_string("queue")?)?;
    let timer_key = op.required_string("timerKey")?;
    check_timer_key(&op.name_of("timerKey"), &timer_key)?;
    let txn = op.string("txn")?.map(|txn| checked(NameKind::TransactionId, "txn", txn)).transpose()?;
    if kind == "cancel" {
        return Ok(TimerOp::Cancel(CancelTimer { queue, timer_key, txn }));
    }
    let partition =
        checked(NameKind::Partition, "partition", op.string("partition")?.unwrap_or_else(|| DEFAULT_PARTITION.into()))?;
    let delay_ms = op.integer("delayMs")?.ok_or_else(|| {
        ApiError::bad_request(format!("{} is required: when, in milliseconds from now", op.name_of("delayMs")))
    })?;
    if delay_ms > MAX_DELAY_MS {
        return Err(ApiError::bad_request(format!(
            "{} must be at most {MAX_DELAY_MS} (ten years), not {delay_ms}",
            op.name_of("delayMs")
        )));
    }
    let payload = payload_of(op, inflation)?;
    Ok(TimerOp::Schedule(ScheduleTimer {
        queue,
        timer_key,
        partition,
        txn: txn.unwrap_or_else(|| queen_log::new_message_id().to_string()),
        payload,
        delay_ms,
        producer: None,
    }))
}

/// The payload as the message's data: base64 of a JSON document, or with `payloadZstd` of a zstd
/// frame of one (decompressed here, so that the delivered message is JSON like any other).
fn payload_of(op: &JsonObject<'_>, inflation: &mut Inflation) -> Result<Vec<u8>, ApiError> {
    let field = op.name_of("payload");
    let encoded = op.required_string("payload")?;
    let bytes = BASE64
        .decode(encoded.as_bytes())
        .map_err(|e| ApiError::bad_request(format!("{field} must be base64 (of the message's JSON): {e}")))?;
    let json = if op.boolean("payloadZstd")?.unwrap_or(false) {
        let declared = zstd::zstd_safe::get_frame_content_size(&bytes)
            .ok()
            .flatten()
            .ok_or_else(|| ApiError::bad_request(format!("{field} is not a zstd frame that declares its size")))?;
        if declared > inflation.left as u64 {
            let Inflation { max, left } = inflation;
            return Err(ApiError::bad_request(format!(
                "{field} decompresses to {declared} bytes; a request's compressed payloads may decompress to \
                 {max} bytes in all (http.max_body_bytes), and {left} are left"
            )));
        }
        inflation.left -= declared as usize;
        queen_log::zstd_contexts::decompress(&bytes, declared as usize)
            .map_err(|e| ApiError::bad_request(format!("{field} is not a valid zstd frame: {e}")))?
    } else {
        bytes
    };
    // The data becomes a message, which pops serve inside their answer: it must not nest deeper
    // than a push may (checked before parsing, which has no depth limit of its own here).
    if nests_deeper_than(&json, MAX_DATA_NESTING) {
        return Err(ApiError::bad_request(format!(
            "{field} nests arrays and objects more than {MAX_DATA_NESTING} levels deep"
        )));
    }
    serde_json::from_slice::<IgnoredAny>(&json)
        .map_err(|e| ApiError::bad_request(format!("{field} must encode a JSON document (the message's data): {e}")))?;
    Ok(json)
}

/// One operation's result. In a transaction's results it carries its `index` in the flat index
/// space; the standalone answers are index-aligned without one.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimerResultJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<usize>,
    ok: bool,
    status: &'static str,
    queue: &'a str,
    timer_key: &'a str,
    txn: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deliver_at: Option<String>,
}

impl<'a> TimerResultJson<'a> {
    pub fn new(index: Option<usize>, result: &'a TimerResult) -> Self {
        let (ok, status, txn, scheduled) = match &result.outcome {
            TimerOutcome::Scheduled { txn, message_id, deliver_at } => {
                (true, "scheduled", Some(txn), Some((message_id, deliver_at)))
            }
            TimerOutcome::Rescheduled { txn, message_id, deliver_at } => {
                (true, "rescheduled", Some(txn), Some((message_id, deliver_at)))
            }
            TimerOutcome::Cancelled { txn } => (true, "cancelled", Some(txn), None),
            TimerOutcome::Absent { txn } => (false, "absent", txn.as_ref(), None),
            TimerOutcome::TooLate { txn } => (false, "too_late", Some(txn), None),
        };
        TimerResultJson {
            index,
            ok,
            status,
            queue: &result.queue,
            timer_key: &result.timer_key,
            txn: txn.map(String::as_str),
            message_id: scheduled.map(|(id, _)| *id),
            deliver_at: scheduled.map(|(_, at)| timestamp(*at)),
        }
    }
}

/// A stored timer, its payload as stored (base64; sealed when `encrypted`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TimerJson<'a> {
    queue: &'a str,
    timer_key: &'a str,
    partition: &'a str,
    txn: &'a str,
    message_id: Uuid,
    payload: String,
    encrypted: bool,
    deliver_at: String,
    /// `pending`, `delivering`, `retrying` (a delivery failed) or `held` (attempts spent).
    state: &'static str,
    attempts: i32,
    last_error: Option<&'a str>,
    /// When the next delivery attempt may be made; null when held.
    next_attempt_at: Option<String>,
    producer_sub: Option<&'a str>,
    created_at: String,
    updated_at: String,
}

impl<'a> From<&'a StoredTimer> for TimerJson<'a> {
    fn from(timer: &'a StoredTimer) -> Self {
        TimerJson {
            queue: &timer.queue,
            timer_key: &timer.timer_key,
            partition: &timer.partition,
            txn: &timer.txn,
            message_id: timer.message_id,
            payload: BASE64.encode(&timer.payload),
            encrypted: queen_log::is_sealed(&timer.payload),
            deliver_at: timestamp(timer.deliver_at),
            state: match timer.state {
                TimerState::Pending => "pending",
                TimerState::Delivering => "delivering",
                TimerState::Retrying => "retrying",
                TimerState::Held => "held",
            },
            attempts: timer.attempts,
            last_error: timer.last_error.as_deref(),
            next_attempt_at: timer.fire_at.map(timestamp),
            producer_sub: timer.producer.as_deref(),
            created_at: timestamp(timer.created_at),
            updated_at: timestamp(timer.updated_at),
        }
    }
}

#[derive(Serialize)]
struct Peeked<'a> {
    found: bool,
    #[serde(flatten)]
    timer: TimerJson<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Page<'a> {
    rows: Vec<TimerJson<'a>>,
    truncated: bool,
    next_after: Option<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(json: &str) -> Result<TimerOp, ApiError> {
        let body = JsonObject::parse_body(json.as_bytes(), false).expect("an object");
        parse_op(&body, &mut Inflation { max: 1 << 20, left: 1 << 20 })
    }

    fn refusal(json: &str) -> String {
        match op(json) {
            Err(ApiError::BadRequest(message)) => message,
            other => panic!("{json}: expected a 400, got {other:?}"),
        }
    }

    /// `{"json": 1}` in base64.
    const PAYLOAD: &str = "eyJqc29uIjogMX0=";

    #[test]
    fn a_schedule_is_read_with_its_defaults() {
        let parsed = op(&format!(
            r#"{{"op": "schedule", "queue": "q", "timerKey": "a/b", "payload": "{PAYLOAD}", "delayMs": -5}}"#
        ));
        let TimerOp::Schedule(timer) = parsed.expect("valid") else { panic!("a schedule") };
        assert_eq!((timer.partition.as_str(), timer.delay_ms), ("Default", -5));
        assert_eq!(timer.payload, br#"{"json": 1}"#);
        assert!(Uuid::parse_str(&timer.txn).is_ok(), "a txn is minted when none is sent");
    }

    #[test]
    fn a_zstd_payload_is_decompressed_and_checked() {
        let frame = zstd::bulk::compress(br#"[1, 2]"#, 1).expect("compress");
        let body = format!(
            r#"{{"op": "schedule", "queue": "q", "timerKey": "k", "payload": "{}", "payloadZstd": true, "delayMs": 0}}"#,
            BASE64.encode(&frame)
        );
        let TimerOp::Schedule(timer) = op(&body).expect("valid") else { panic!("a schedule") };
        assert_eq!(timer.payload, b"[1, 2]");
        let plain = format!(
            r#"{{"op": "schedule", "queue": "q", "timerKey": "k", "payload": "{PAYLOAD}", "payloadZstd": true, "delayMs": 0}}"#
        );
        assert!(refusal(&plain).contains("zstd"));
    }

    #[test]
    fn bad_operations_are_named() {
        let base = |extra: &str| {
            format!(
                r#"{{"op": "schedule", "queue": "q", "timerKey": "k", "payload": "{PAYLOAD}", "delayMs": 1{extra}}}"#
            )
        };
        assert!(refusal(&base(r#", "producerSub": "me""#)).starts_with("producerSub is set by the broker"));
        assert!(refusal(&base(r#", "_secret": 1"#)).starts_with("_secret is set by the broker"));
        assert!(refusal(&base(r#", "deliverAt": "2030-01-01T00:00:00Z""#)).starts_with("deliverAt"));
        assert!(refusal(&base(r#", "priority": 1"#)).starts_with("priority is not a field"));
        assert!(refusal(r#"{"op": "snooze"}"#).starts_with("op must be"));
        assert!(
            refusal(&format!(r#"{{"op": "schedule", "queue": "q", "timerKey": "k", "payload": "{PAYLOAD}"}}"#))
                .starts_with("delayMs is required")
        );
        assert!(
            refusal(r#"{"op": "schedule", "queue": "q", "timerKey": "k", "payload": "%%%", "delayMs": 1}"#)
                .starts_with("payload must be base64")
        );
        // "not json" in base64.
        assert!(
            refusal(r#"{"op": "schedule", "queue": "q", "timerKey": "k", "payload": "bm90IGpzb24=", "delayMs": 1}"#)
                .contains("JSON document")
        );
        assert!(refusal(&base(r#", "partition": "a/b""#)).starts_with("partition"));
        assert!(refusal(r#"{"op": "cancel", "queue": "q", "timerKey": "//k"}"#).starts_with("timerKey"));
        assert!(
            refusal(r#"{"op": "cancel", "queue": "q", "timerKey": "k", "payload": "x"}"#)
                .starts_with("payload is not a field of a cancel")
        );
        assert!(
            refusal(&format!(
                r#"{{"op": "schedule", "queue": "q", "timerKey": "k", "payload": "{PAYLOAD}", "delayMs": 1e20}}"#
            ))
            .starts_with("delayMs must be an integer")
        );
        assert!(refusal(&base("000000000000")).starts_with("delayMs must be at most"));
    }
}
