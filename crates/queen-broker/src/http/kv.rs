//! `POST /api/v1/kv`: a batch of key/value operations; also the parser and the rendering of a
//! transaction's `kv` rider, and the refusal envelope the key/value and lock routes share.
//!
//! The HTTP status says whether the call happened; what each operation did is a field of its
//! result, index-aligned with the operations, in a 200. A refusal names the field and writes
//! nothing: `{"error": "<code>", "code", "reason": "<field>", "detail"}`.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError, web};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::value::RawValue;

use super::body::{JsonObject, JsonStrings, MAX_NESTING, NoQuery, nests_deeper_than, read_body};
use super::timestamp;
use crate::broker::kv::{
    self, Batch, BatchRefusal, Change, Expiry, OpResult, Operation, Outcome, PrefixRead, Verdict, Write,
};
use crate::broker::{Broker, BrokerError, locks};
use crate::error::ApiError;
use crate::names;

/// The deepest a value may nest: a `getMany` or `getPrefix` answer carries it five levels down.
const MAX_VALUE_NESTING: usize = MAX_NESTING - 5;

pub async fn handle(broker: web::Data<Broker>, _: NoQuery, payload: web::Payload) -> Result<HttpResponse, StateError> {
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let body = JsonObject::parse_body(&body, false)?;
    only(&body, &["operations"], "a key/value call", "kv_unknown_field")?;
    let batch = parse_batch(&body, "operations", Rider::No)?;
    match kv::apply(&broker, &batch).await? {
        Outcome::Applied(results) => {
            let results = results.iter().map(OpJson::of).collect::<Result<Vec<_>, _>>()?;
            Ok(HttpResponse::Ok().json(Results { results }))
        }
        // Nothing applied, so no result to align: an error the client raises (as a `KvError`
        // whose code is `kv_precondition`), with what the operation found.
        Outcome::Aborted { index, verdict } => Ok(HttpResponse::Conflict().json(Aborted {
            ok: false,
            success: false,
            error: "kv_precondition",
            code: "kv_precondition",
            precondition: Precondition::of(index, &verdict)?,
        })),
    }
}

/// A refusal (400) of a key/value or lock call: the stable `code`, the field it is about
/// (`reason`) and what is wrong with it (`detail`). Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: &'static str,
    pub field: String,
    pub detail: String,
}

impl Refusal {
    pub fn new(code: &'static str, field: impl Into<String>, detail: impl Into<String>) -> Refusal {
        Refusal { code, field: field.into(), detail: detail.into() }
    }
}

/// What the key/value and lock routes fail with: their own refusals, or any error of the API.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{}: {}", .0.code, .0.detail)]
    Refused(Refusal),
    #[error(transparent)]
    Api(#[from] ApiError),
}

impl From<Refusal> for StateError {
    fn from(refusal: Refusal) -> Self {
        StateError::Refused(refusal)
    }
}

impl From<BrokerError> for StateError {
    fn from(e: BrokerError) -> Self {
        StateError::Api(e.into())
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RefusalBody<'a> {
    success: bool,
    error: &'a str,
    code: &'a str,
    reason: &'a str,
    detail: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<String>,
}

impl ResponseError for StateError {
    fn status_code(&self) -> StatusCode {
        match self {
            StateError::Refused(_) => StatusCode::BAD_REQUEST,
            StateError::Api(e) => e.status_code(),
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            StateError::Refused(Refusal { code, field, detail }) => HttpResponse::BadRequest().json(RefusalBody {
                success: false,
                error: code,
                code,
                reason: field,
                detail,
                request_id: super::request_id::current(),
            }),
            StateError::Api(e) => e.error_response(),
        }
    }
}

/// Whether the operations ride in a transaction, where a read whose cost the caller does not bound
/// (`getPrefix`) is refused: the transaction holds its locks meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rider {
    No,
    Yes,
}

/// The operations in member `field` of `body`, checked: one bad operation refuses them all.
pub fn parse_batch(body: &JsonObject<'_>, field: &str, rider: Rider) -> Result<Batch, Refusal> {
    let invalid = |e: ApiError| Refusal::new("kv_invalid_body", body.name_of(field), e.to_string());
    let operations = body.objects(field).map_err(invalid)?.ok_or_else(|| {
        Refusal::new("kv_invalid_body", body.name_of(field), format!("{} is required", body.name_of(field)))
    })?;
    if operations.is_empty() {
        return Err(Refusal::new(
            "kv_invalid_body",
            body.name_of(field),
            format!("{} must not be empty", body.name_of(field)),
        ));
    }
    if operations.len() > kv::MAX_OPERATIONS {
        let refused = BatchRefusal::TooManyOperations(operations.len());
        return Err(Refusal::new(
            "kv_too_many_operations",
            body.name_of(field),
            format!("{}: {refused}", body.name_of(field)),
        ));
    }
    let parsed = operations
        .read()
        .map_err(invalid)?
        .iter()
        .map(|operation| parse_operation(operation, rider))
        .collect::<Result<Vec<_>, _>>()?;
    Batch::new(parsed).map_err(|refused| {
        let (code, field) = match &refused {
            BatchRefusal::TooManyOperations(_) => ("kv_too_many_operations", body.name_of(field)),
            BatchRefusal::TooManyKeys(_) => ("kv_too_many_keys", body.name_of(field)),
            BatchRefusal::DuplicateKey { index, .. } => {
                ("kv_duplicate_key", format!("{}[{index}]", body.name_of(field)))
            }
        };
        Refusal::new(code, field.clone(), format!("{field}: {refused}"))
    })
}

/// Refuses a member `object` (an operation, or the body) does not have, naming it.
pub fn only(object: &JsonObject<'_>, allowed: &[&str], op: &str, code: &'static str) -> Result<(), Refusal> {
    match object.member_outside(allowed) {
        None => Ok(()),
        Some(member) => {
            let field = object.name_of(&names::quoted_member(member));
            Err(Refusal::new(
                code,
                field.clone(),
                format!("{field} is not a field of {op} (its fields: {})", allowed.join(", ")),
            ))
        }
    }
}

/// Reading one operation's fields (of the key/value or the lock routes) into refusals that name
/// them, with `invalid_code`.
pub struct Fields<'o, 'a> {
    object: &'o JsonObject<'a>,
    invalid_code: &'static str,
}

impl<'o, 'a> Fields<'o, 'a> {
    pub fn new(object: &'o JsonObject<'a>, invalid_code: &'static str) -> Self {
        Fields { object, invalid_code }
    }

    pub fn invalid(&self, key: &str, detail: impl Into<String>) -> Refusal {
        Refusal::new(self.invalid_code, self.object.name_of(key), detail)
    }

    pub fn typed<T>(&self, key: &str, value: Result<Option<T>, ApiError>) -> Result<Option<T>, Refusal> {
        value.map_err(|e| self.invalid(key, e.to_string()))
    }

    pub fn required<T>(&self, key: &str, value: Option<T>) -> Result<T, Refusal> {
        value.ok_or_else(|| self.invalid(key, format!("{} is required", self.object.name_of(key))))
    }

    /// A namespace, key, prefix or cursor: not empty, not too long, no control characters.
    pub fn name(&self, key: &str, max_bytes: usize) -> Result<Option<String>, Refusal> {
        let Some(value) = self.typed(key, self.object.string(key))? else { return Ok(None) };
        let field = self.object.name_of(key);
        if value.is_empty() || value.len() > max_bytes {
            return Err(self.invalid(key, format!("{field} must be 1 to {max_bytes} bytes long")));
        }
        if value.chars().any(char::is_control) {
            return Err(self.invalid(key, format!("{field} must not contain control characters")));
        }
        Ok(Some(value))
    }

    pub fn required_name(&self, key: &str, max_bytes: usize) -> Result<String, Refusal> {
        let value = self.name(key, max_bytes)?;
        self.required(key, value)
    }

    fn integer(&self, key: &str) -> Result<Option<i64>, Refusal> {
        self.typed(key, self.object.integer(key))
    }

    /// An integer in `min..=max`.
    pub fn bounded(&self, key: &str, min: i64, max: i64) -> Result<Option<i64>, Refusal> {
        let value = self.integer(key)?;
        match value {
            Some(n) if !(min..=max).contains(&n) => {
                Err(self.invalid(key, format!("{} must be from {min} to {max}, not {n}", self.object.name_of(key))))
            }
            _ => Ok(value),
        }
    }

    /// `expect`: a version from `min`, or absent. An explicit `null` is refused rather than read
    /// as absent: a caller who wrote `expect` meant to fence the write, and an unconditional one
    /// would overwrite what it meant to protect.
    fn expect(&self, min: i64) -> Result<Option<i64>, Refusal> {
        if self.object.raw_or_null("expect").is_some_and(|raw| raw.get() == "null") {
            let field = self.object.name_of("expect");
            let detail = format!("{field} must be a version, not null (omit it for an unconditional write)");
            return Err(self.invalid("expect", detail));
        }
        self.bounded("expect", min, i64::MAX)
    }

    /// A boolean; absent is false.
    fn flag(&self, key: &str) -> Result<bool, Refusal> {
        match self.typed(key, self.object.boolean(key))? {
            None | Some(false) => Ok(false),
            Some(true) => Ok(true),
        }
    }

    /// Exactly one of `ttlSeconds` and `forever: true`.
    fn expiry(&self) -> Result<Expiry, Refusal> {
        let seconds = self.bounded("ttlSeconds", 1, kv::MAX_TTL_SECONDS)?;
        let forever = match self.typed("forever", self.object.boolean("forever"))? {
            Some(false) => {
                let field = self.object.name_of("forever");
                return Err(self.invalid("forever", format!("{field} must be true when given; omit it otherwise")));
            }
            forever => forever.is_some(),
        };
        let field = self.object.name_of("ttlSeconds");
        match (seconds, forever) {
            (Some(seconds), false) => Ok(Expiry::Seconds(seconds)),
            (None, true) => Ok(Expiry::Forever),
            (Some(_), true) => Err(Refusal::new(
                "kv_expiry_not_specified",
                field.clone(),
                format!("{field}: give exactly one of ttlSeconds and forever: true, not both"),
            )),
            (None, false) => Err(Refusal::new(
                "kv_expiry_not_specified",
                field.clone(),
                format!(
                    "{field}: a write must say how long the key lives: ttlSeconds (seconds above 0) or forever: true"
                ),
            )),
        }
    }
}

/// The members each operation may have.
const GET_FIELDS: &[&str] = &["op", "ns", "key"];
const GET_MANY_FIELDS: &[&str] = &["op", "ns", "keys"];
const GET_PREFIX_FIELDS: &[&str] = &["op", "ns", "prefix", "after", "limit", "keysOnly"];
const PUT_FIELDS: &[&str] = &["op", "ns", "key", "value", "ttlSeconds", "forever", "expect", "required"];
const PUT_IF_ABSENT_FIELDS: &[&str] = &["op", "ns", "key", "value", "ttlSeconds", "forever", "required"];
const DELETE_FIELDS: &[&str] = &["op", "ns", "key", "expect", "required"];
const CHECK_FIELDS: &[&str] = &["op", "ns", "key", "expect", "required"];
const INCR_FIELDS: &[&str] = &["op", "ns", "key", "delta", "min", "max", "ttlSeconds", "forever", "required"];

fn parse_operation(object: &JsonObject<'_>, rider: Rider) -> Result<Operation, Refusal> {
    let fields = Fields::new(object, "kv_invalid_field");
    let op = fields.typed("op", object.string("op"))?;
    let op = fields.required("op", op)?;
    let allowed = |allowed| only(object, allowed, &op, "kv_unknown_field");
    let ns = || fields.required_name("ns", kv::MAX_NAMESPACE_BYTES);
    let key = || fields.required_name("key", kv::MAX_KEY_BYTES);
    let write = |change| -> Result<Operation, Refusal> {
        let ns = ns()?;
        if ns == locks::NAMESPACE && !matches!(change, Change::Check { .. }) {
            return Err(Refusal::new(
                "kv_namespace_reserved",
                object.name_of("ns"),
                format!(
                    "{}: namespace {:?} holds the locks' permits; change them through /api/v1/locks",
                    object.name_of("ns"),
                    locks::NAMESPACE
                ),
            ));
        }
        Ok(Operation::Write(Write { ns, key: key()?, change, required: fields.flag("required")? }))
    };
    match op.as_str() {
        "get" => {
            allowed(GET_FIELDS)?;
            Ok(Operation::Get { ns: ns()?, key: key()? })
        }
        "getMany" => {
            allowed(GET_MANY_FIELDS)?;
            Ok(Operation::GetMany { ns: ns()?, keys: fields.keys()? })
        }
        "getPrefix" => {
            allowed(GET_PREFIX_FIELDS)?;
            if rider == Rider::Yes {
                return Err(Refusal::new(
                    "kv_op_not_allowed",
                    object.name_of("op"),
                    format!(
                        "{}: getPrefix is not allowed in a transaction, which holds its locks while it reads: the \
                         caller sets no bound on its cost; use getMany",
                        object.name_of("op")
                    ),
                ));
            }
            let ns = ns()?;
            if fields.typed("prefix", object.string("prefix"))?.is_none_or(|prefix| prefix.is_empty()) {
                return Err(Refusal::new(
                    "kv_prefix_required",
                    object.name_of("prefix"),
                    format!("{} must not be empty: a namespace is not listed whole", object.name_of("prefix")),
                ));
            }
            let prefix = fields.required_name("prefix", kv::MAX_KEY_BYTES)?;
            // Clamped, never refused: the caller cannot know the broker's ceiling.
            let limit = fields.integer("limit")?;
            let limit = limit.map_or(kv::DEFAULT_PREFIX_LIMIT, |n| n.clamp(1, kv::MAX_PREFIX_LIMIT as i64) as usize);
            let after = fields.name("after", kv::MAX_KEY_BYTES)?;
            Ok(Operation::GetPrefix(PrefixRead { ns, prefix, after, limit, keys_only: fields.flag("keysOnly")? }))
        }
        "put" | "putIfAbsent" => {
            let (fields_of_op, expect) =
                if op == "put" { (PUT_FIELDS, fields.expect(0)?) } else { (PUT_IF_ABSENT_FIELDS, Some(0)) };
            allowed(fields_of_op)?;
            let value = fields.value()?;
            write(Change::Put { value, expiry: fields.expiry()?, expect })
        }
        "delete" => {
            allowed(DELETE_FIELDS)?;
            // 0 would be "must not exist": a delete of nothing.
            write(Change::Delete { expect: fields.expect(1)? })
        }
        "check" => {
            allowed(CHECK_FIELDS)?;
            let expect = fields.expect(0)?.ok_or_else(|| {
                Refusal::new(
                    "kv_expect_required",
                    object.name_of("expect"),
                    format!(
                        "{}: check needs expect, the version the key must be at (0: the key must not exist)",
                        object.name_of("expect")
                    ),
                )
            })?;
            write(Change::Check { expect })
        }
        "incr" => {
            allowed(INCR_FIELDS)?;
            let delta = fields.integer("delta")?.unwrap_or(1);
            let (min, max) = (fields.integer("min")?, fields.integer("max")?);
            if let (Some(min), Some(max)) = (min, max)
                && min > max
            {
                return Err(fields.invalid("min", format!("{} ({min}) is above max ({max})", object.name_of("min"))));
            }
            write(Change::Incr { delta, min, max, expiry: fields.expiry()? })
        }
        other => Err(Refusal::new(
            "kv_unknown_op",
            object.name_of("op"),
            format!(
                "{} must be get, getMany, getPrefix, put, putIfAbsent, delete, check or incr, not {other:?}",
                object.name_of("op")
            ),
        )),
    }
}

impl Fields<'_, '_> {
    /// `keys`: a non-empty array of keys.
    fn keys(&self) -> Result<Vec<String>, Refusal> {
        let field = self.object.name_of("keys");
        let raw = self.object.raw("keys").ok_or_else(|| self.invalid("keys", format!("{field} is required")))?;
        let keys: Vec<String> = serde_json::from_str(raw.get())
            .map_err(|_| self.invalid("keys", format!("{field} must be an array of strings")))?;
        if keys.is_empty() {
            return Err(self.invalid("keys", format!("{field} must not be empty")));
        }
        for (i, key) in keys.iter().enumerate() {
            if key.is_empty() || key.len() > kv::MAX_KEY_BYTES || key.chars().any(char::is_control) {
                let element = format!("{field}[{i}]");
                return Err(Refusal::new(
                    "kv_invalid_field",
                    element.clone(),
                    format!("{element} must be 1 to {} bytes long, without control characters", kv::MAX_KEY_BYTES),
                ));
            }
        }
        Ok(keys)
    }

    /// `value`: any JSON, `null` included, as sent.
    fn value(&self) -> Result<String, Refusal> {
        let field = self.object.name_of("value");
        let raw = self
            .object
            .raw_or_null("value")
            .ok_or_else(|| self.invalid("value", format!("{field} is required (null is a value)")))?;
        if raw.get().len() > kv::MAX_VALUE_BYTES {
            return Err(Refusal::new(
                "kv_value_too_large",
                field.clone(),
                format!("{field} is {} bytes of JSON; at most {} are allowed", raw.get().len(), kv::MAX_VALUE_BYTES),
            ));
        }
        // Read back inside `{"results": [{"rows": [{"value": ...}]}]}`, five levels down: a value
        // no deeper than keeps that answer within what JSON readers take.
        if nests_deeper_than(raw.get().as_bytes(), MAX_VALUE_NESTING) {
            return Err(Refusal::new(
                "kv_value_too_deep",
                field.clone(),
                format!("{field} nests arrays and objects more than {MAX_VALUE_NESTING} levels deep"),
            ));
        }
        // What PostgreSQL's jsonb cannot hold is refused here rather than failing the batch: a
        // NUL character, a lone surrogate, a number no float can hold (the last two do not parse).
        let storable = serde_json::from_str::<serde_json::Value>(raw.get()).is_ok_and(|value| !holds_nul(&value));
        if !storable {
            return Err(self.invalid(
                "value",
                format!(
                    "{field} cannot be stored: it holds a NUL character, a lone surrogate or a number out of range"
                ),
            ));
        }
        // jsonb keeps a number's scale and writes it out in full: 8 bytes of `1e-16000` read back
        // as 16,002, and a value within the bound could read back as a hundred megabytes.
        let Some(read_back) = text_as_read_back(raw.get().as_bytes()) else {
            return Err(self.invalid(
                "value",
                format!(
                    "{field} cannot be stored: it holds a number with more than {NUMERIC_MAX_FRACTION_DIGITS} digits \
                     after the decimal point"
                ),
            ));
        };
        if read_back > kv::MAX_VALUE_BYTES {
            return Err(Refusal::new(
                "kv_value_too_large",
                field.clone(),
                format!(
                    "{field} reads back as {read_back} bytes of JSON (PostgreSQL writes its numbers' exponents out \
                     in digits); at most {} are allowed",
                    kv::MAX_VALUE_BYTES
                ),
            ));
        }
        Ok(raw.get().to_owned())
    }
}

/// The most digits after the point PostgreSQL's numeric holds: a jsonb number past it fails the
/// statement ("value overflows numeric format").
const NUMERIC_MAX_FRACTION_DIGITS: usize = 16_383;

/// About how long `json` is as PostgreSQL's jsonb writes it back (never less): each number as
/// numeric prints it, every digit its exponent stands for written out, the rest as it is. `None`
/// when a number has more digits after the point than numeric holds.
fn text_as_read_back(json: &[u8]) -> Option<usize> {
    let (mut length, mut at) = (0usize, 0);
    let mut strings = JsonStrings::default();
    while at < json.len() {
        let byte = json[at];
        if !strings.holds(byte) && (byte == b'-' || byte.is_ascii_digit()) {
            let number = json[at..].iter().take_while(|b| matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'));
            let end = at + number.count();
            let digits = NumericDigits::of(&json[at..end]);
            if digits.fraction > NUMERIC_MAX_FRACTION_DIGITS {
                return None;
            }
            length = length.saturating_add(digits.printed());
            at = end;
            continue;
        }
        length += 1;
        at += 1;
    }
    Some(length)
}

/// The digits of a JSON number as numeric keeps it: its sign, its integer digits with the
/// exponent added, and its fraction digits with the exponent taken away.
struct NumericDigits {
    sign: usize,
    whole: usize,
    fraction: usize,
}

impl NumericDigits {
    fn of(number: &[u8]) -> Self {
        let text = std::str::from_utf8(number).unwrap_or_default();
        let (mantissa, exponent) = text.split_once(['e', 'E']).unwrap_or((text, "0"));
        let exponent: i64 = exponent.parse().unwrap_or(if exponent.starts_with('-') { i64::MIN } else { i64::MAX });
        let (sign, mantissa) = mantissa.strip_prefix('-').map_or((0, mantissa), |rest| (1, rest));
        let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let count = |digits: i64| usize::try_from(digits).unwrap_or(usize::MAX);
        NumericDigits {
            sign,
            whole: count((whole.len() as i64).saturating_add(exponent).max(1)),
            fraction: count((fraction.len() as i64).saturating_sub(exponent).max(0)),
        }
    }

    /// Its length as numeric prints it.
    fn printed(&self) -> usize {
        let point = usize::from(self.fraction > 0);
        self.whole.saturating_add(self.fraction).saturating_add(point).saturating_add(self.sign)
    }
}

fn holds_nul(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(text) => text.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(holds_nul),
        serde_json::Value::Object(members) => members.iter().any(|(key, item)| key.contains('\0') || holds_nul(item)),
        _ => false,
    }
}

#[derive(Serialize)]
struct Results<T> {
    results: Vec<T>,
}

/// Stored JSON text, served as it is.
fn raw_json(text: &str) -> Result<Box<RawValue>, ApiError> {
    RawValue::from_string(text.to_owned()).map_err(|e| ApiError::Internal(format!("a stored value is not JSON: {e}")))
}

fn time(at: Option<DateTime<Utc>>) -> Option<String> {
    at.map(timestamp)
}

/// A live key, as reads return it (`found` only in a `get`'s answer, `value` not when keys only
/// were asked for).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RowJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    found: Option<bool>,
    key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<Box<RawValue>>,
    version: i64,
    expires_at: Option<String>,
    updated_at: String,
}

impl<'a> RowJson<'a> {
    fn of(entry: &'a queen_store::kv::Entry) -> Result<Self, ApiError> {
        Ok(RowJson {
            found: None,
            key: &entry.key,
            value: entry.value.as_deref().map(raw_json).transpose()?,
            version: entry.version,
            expires_at: time(entry.expires_at),
            updated_at: timestamp(entry.updated_at),
        })
    }
}

/// What a write or check did.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerdictJson<'a> {
    applied: bool,
    key: &'a str,
    value: Option<Box<RawValue>>,
    version: i64,
    expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
}

impl<'a> VerdictJson<'a> {
    fn of(verdict: &'a Verdict) -> Result<Self, ApiError> {
        Ok(VerdictJson {
            applied: verdict.applied,
            key: &verdict.key,
            value: verdict.value.as_deref().map(raw_json).transpose()?,
            version: verdict.version,
            expires_at: time(verdict.expires_at),
            reason: verdict.reason.map(kv::Reason::as_str),
        })
    }
}

/// The result of one operation.
#[derive(Serialize)]
#[serde(untagged, rename_all_fields = "camelCase")]
pub enum OpJson<'a> {
    Found(RowJson<'a>),
    Missing { found: bool, key: &'a str },
    Many { rows: Vec<RowJson<'a>>, missing: &'a [String], truncated: bool },
    Page { rows: Vec<RowJson<'a>>, truncated: bool, next_after: Option<&'a str> },
    Write(VerdictJson<'a>),
}

impl<'a> OpJson<'a> {
    pub fn of(result: &'a OpResult) -> Result<Self, ApiError> {
        let rows = |rows: &'a [queen_store::kv::Entry]| rows.iter().map(RowJson::of).collect::<Result<Vec<_>, _>>();
        Ok(match result {
            OpResult::Get { entry: Some(entry), .. } => {
                OpJson::Found(RowJson { found: Some(true), ..RowJson::of(entry)? })
            }
            OpResult::Get { key, entry: None } => OpJson::Missing { found: false, key },
            OpResult::GetMany { rows: found, missing, truncated } => {
                OpJson::Many { rows: rows(found)?, missing, truncated: *truncated }
            }
            OpResult::GetPrefix { rows: found, truncated, next_after } => {
                OpJson::Page { rows: rows(found)?, truncated: *truncated, next_after: next_after.as_deref() }
            }
            OpResult::Write(verdict) => OpJson::Write(VerdictJson::of(verdict)?),
        })
    }
}

/// A batch aborted by a `required` operation: where (`failedIndex`, in the answer's index space),
/// why (`kvReason`), and the key as the operation found it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Precondition<'a> {
    reason: &'static str,
    failed_index: usize,
    kv_reason: Option<&'static str>,
    key: &'a str,
    value: Option<Box<RawValue>>,
    version: i64,
}

impl<'a> Precondition<'a> {
    pub fn of(failed_index: usize, verdict: &'a Verdict) -> Result<Self, ApiError> {
        Ok(Precondition {
            reason: "kv_precondition",
            failed_index,
            kv_reason: verdict.reason.map(kv::Reason::as_str),
            key: &verdict.key,
            value: verdict.value.as_deref().map(raw_json).transpose()?,
            version: verdict.version,
        })
    }
}

/// The standalone answer to an aborted batch (409): `ok: false` and no results, since nothing
/// applied.
#[derive(Serialize)]
struct Aborted<'a> {
    ok: bool,
    success: bool,
    error: &'static str,
    code: &'static str,
    #[serde(flatten)]
    precondition: Precondition<'a>,
}

#[cfg(test)]
mod tests {
    use super::text_as_read_back;

    #[test]
    fn numbers_count_as_numeric_writes_them_and_strings_as_they_are() {
        for (json, read_back) in [
            (r#"{"a": 1}"#, 8),
            ("-12.50", 6),
            ("1e3", 4),
            ("1.5e-3", 6),
            ("[1e-16000]", 16_004),
            (r#""1e-16000 \" 1e9""#, 17),
        ] {
            assert_eq!(text_as_read_back(json.as_bytes()), Some(read_back), "{json}");
        }
        assert!(text_as_read_back(b"1e99999999999999999999999").is_some_and(|n| n > 1 << 40), "an exponent past i64");
    }

    #[test]
    fn a_number_with_more_fraction_digits_than_numeric_holds_has_no_read_back() {
        let written_out = format!("0.{}1", "0".repeat(16_382));
        assert_eq!(text_as_read_back(written_out.as_bytes()), Some(16_385), "16,383 digits after the point");
        for json in ["1e-16384", "[1, 0.1e-16383]", "1e-99999999999999999999999", &format!("{written_out}0")] {
            assert_eq!(text_as_read_back(json.as_bytes()), None, "{json}");
        }
    }
}
