//! Reading request bodies and query strings into clear 4xx errors.

use std::borrow::{Borrow, Cow};
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::{Path, Url};
use actix_web::error::PayloadError;
use actix_web::web::{Bytes, BytesMut, Payload};
use actix_web::{FromRequest, HttpRequest};
use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, NaiveTime, Utc};
use futures::future::{Ready, ready};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeOwned, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use tokio::time::{Instant, timeout_at};

use crate::broker::Broker;
use crate::error::ApiError;
use crate::names::{self, NameKind};
use crate::pressure::{Bound, Held};

/// A request body, holding its bytes' place in the broker's bound on bodies in flight until the
/// request is done with it.
pub struct Body {
    bytes: Bytes,
    _place: Held,
}

impl std::ops::Deref for Body {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Reads the whole body, refusing (413) one larger than `limit` bytes, (503) one whose bytes
/// would take the broker past `limits.body_bytes_in_flight`, the bound on body bytes held across
/// requests, and (408) one that has not arrived whole within `http.request_body_timeout_ms` of
/// the handler starting to read it (actix bounds only the head; a client trickling its body would
/// otherwise hold its connection, and its bytes' place, for as long as it likes). Bytes are
/// counted as they arrive; a refused body is read to its end without being kept (within the same
/// deadline), so that the client gets the answer (the server would otherwise close the connection
/// on a body left unread, and the client could see the connection reset instead).
pub async fn read_body(payload: Payload, limit: usize, broker: &Broker) -> Result<Body, ApiError> {
    let timeout = Duration::from_millis(broker.config.http.request_body_timeout_ms);
    read_within(payload, limit, timeout, &broker.body_bytes).await
}

async fn read_within<S>(
    mut payload: S,
    limit: usize,
    timeout: Duration,
    in_flight: &Arc<Bound>,
) -> Result<Body, ApiError>
where
    S: Stream<Item = Result<Bytes, PayloadError>> + Unpin,
{
    let deadline = Instant::now() + timeout;
    let late =
        || ApiError::RequestTimeout(format!("the request body did not arrive within {} ms", timeout.as_millis()));
    let mut body = BytesMut::new();
    let mut place = in_flight.hold(0)?;
    while let Some(chunk) = timeout_at(deadline, payload.next()).await.map_err(|_| late())? {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("could not read the request body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge(format!("the request body exceeds the limit of {limit} bytes")));
        }
        if let Err(refused) = place.grow(chunk.len()) {
            let mut read = body.len() + chunk.len();
            drop((body, place));
            let drain = async {
                while let Some(Ok(chunk)) = payload.next().await {
                    read += chunk.len();
                    if read > limit {
                        break;
                    }
                }
            };
            let _ = timeout_at(deadline, drain).await;
            return Err(refused.into());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Body { bytes: body.freeze(), _place: place })
}

/// Holds the place of `bytes` a request decompressed out of its body in the same bound as the
/// body's bytes (503 when they would take the broker past it): a compressed body costs what it
/// inflates to, not what it weighed on the wire. `already` is what the request holds besides
/// (its body, what it decompressed before): a request that could not be held even alone is a
/// 413, since retrying it would never help.
pub fn hold_decompressed(broker: &Broker, already: usize, bytes: usize) -> Result<Held, ApiError> {
    let most = broker.config.limits.body_bytes_in_flight;
    if already.saturating_add(bytes) > most {
        return Err(ApiError::PayloadTooLarge(format!(
            "the request holds {} bytes with what it decompresses, more than limits.body_bytes_in_flight ({most}) \
             lets one request hold; send it in smaller requests",
            already.saturating_add(bytes)
        )));
    }
    Ok(broker.body_bytes.hold(bytes)?)
}

/// `T` read from a JSON object only. serde's derived structs also take an array of their members
/// in order, which the member-by-member reading of a body refuses; a typed fast path reads its
/// structs through this, so that it takes nothing that reading would not.
pub struct ObjectOnly<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Object<T> {
            type Value = T;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        deserializer.deserialize_map(Object(PhantomData)).map(ObjectOnly)
    }
}

/// The deepest a request body may nest arrays and objects: what `serde_json` reads. Members are
/// kept as raw JSON, which is read without a depth limit, and parts of a body are stored and
/// served again at the same depth (payloads in pop answers): a deeper body would be accepted and
/// then answered as JSON that readers with a depth or recursion limit (`serde_json`, Python's
/// `json`) cannot read, which no consumer could get past.
pub const MAX_NESTING: usize = 127;

/// The deepest a message's data may nest when it does not arrive inside a push body (a timer's
/// base64 payload): what a push can carry, which keeps a pop answer (`{"messages": [{"data": ...}]}`)
/// within [`MAX_NESTING`].
pub const MAX_DATA_NESTING: usize = MAX_NESTING - 3;

/// Whether arrays and objects nest in JSON text more than `limit` levels deep, strings skipped
/// (the syntax is not checked).
pub fn nests_deeper_than(text: &[u8], limit: usize) -> bool {
    // Nesting past `limit` takes more than `limit` opening brackets. Counting them is a
    // branch-free pass that settles nearly every body; the walk that follows strings branches on
    // every byte.
    let openers = text.iter().filter(|&&byte| byte == b'[' || byte == b'{').count();
    openers > limit && deepest_exceeds(text, limit)
}

fn deepest_exceeds(text: &[u8], limit: usize) -> bool {
    let mut depth = 0usize;
    let mut strings = JsonStrings::default();
    for &byte in text {
        if strings.holds(byte) {
            continue;
        }
        match byte {
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Where the strings of JSON text are, for a walk over its bytes that skips them.
#[derive(Default)]
pub struct JsonStrings {
    in_string: bool,
    escaped: bool,
}

impl JsonStrings {
    /// Whether `byte`, the walk's next, belongs to a string (its quotes included).
    pub fn holds(&mut self, byte: u8) -> bool {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if byte == b'\\' {
                self.escaped = true;
            } else if byte == b'"' {
                self.in_string = false;
            }
            true
        } else {
            self.in_string = byte == b'"';
            self.in_string
        }
    }
}

/// The query string, refusing (400) a parameter the route does not take rather than ignoring it.
pub fn strict_query(req: &actix_web::HttpRequest, known: &[&str]) -> Result<BTreeMap<String, String>, ApiError> {
    let query = query_pairs(req.query_string())?;
    if let Some(unknown) = query.keys().find(|key| !known.contains(&key.as_str())) {
        let takes = if known.is_empty() { "no query parameters".to_owned() } else { known.join(", ") };
        return Err(ApiError::bad_request(format!(
            "unknown query parameter \"{}\"; this route takes {takes}",
            names::quoted_member(unknown)
        )));
    }
    Ok(query)
}

/// A route that reads no query string: one with a parameter is refused (400) by [`strict_query`]
/// rather than ignored.
pub struct NoQuery;

impl FromRequest for NoQuery {
    type Error = ApiError;
    type Future = Ready<Result<NoQuery, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        ready(strict_query(req, &[]).map(|_| NoQuery))
    }
}

/// The body of a route that reads none: nothing, or an object without members (`{}`, which the
/// official JavaScript client sends); anything else is refused (400) rather than ignored.
pub async fn no_members(payload: Payload, broker: &Broker) -> Result<(), ApiError> {
    let body = read_body(payload, broker.config.http.max_body_bytes, broker).await?;
    JsonObject::parse_body(&body, true)?.takes_only(&[])
}

/// A JSON object whose members are kept as raw JSON, so each can be checked (and payloads kept
/// as they were sent) on its own.
pub struct JsonObject<'a> {
    members: BTreeMap<JsonStr<'a>, &'a RawValue>,
    path: ObjectPath,
}

/// A JSON string borrowed from the body where it holds no escapes (most member names and
/// values), so reading one costs no allocation.
#[derive(Clone, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
struct JsonStr<'a>(#[serde(borrow)] Cow<'a, str>);

impl Borrow<str> for JsonStr<'_> {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// An object's members by name, and the first name it gives twice: serde's own map would keep
/// the last value without a word, and which of two values the client meant is a guess.
struct Members<'a> {
    by_name: BTreeMap<JsonStr<'a>, &'a RawValue>,
    repeated: Option<JsonStr<'a>>,
}

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Collect;
        impl<'de> Visitor<'de> for Collect {
            type Value = Members<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Members<'de>, M::Error> {
                let mut members = Members { by_name: BTreeMap::new(), repeated: None };
                while let Some((name, value)) = map.next_entry::<JsonStr<'de>, &'de RawValue>()? {
                    match members.by_name.entry(name) {
                        Entry::Vacant(slot) => {
                            slot.insert(value);
                        }
                        Entry::Occupied(taken) => {
                            members.repeated.get_or_insert_with(|| taken.key().clone());
                        }
                    }
                }
                Ok(members)
            }
        }
        deserializer.deserialize_map(Collect)
    }
}

/// Where an object sits in the request body, as errors name it. An array's elements share its
/// name, and an element's (`items[2]`) is only written out when an error needs it.
enum ObjectPath {
    Body,
    Element { array: Arc<str>, index: usize },
    Member(Arc<str>),
}

impl fmt::Display for ObjectPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Body => Ok(()),
            Self::Element { array, index } => write!(f, "{array}[{index}]"),
            Self::Member(name) => f.write_str(name),
        }
    }
}

/// A member's name as errors report it, e.g. `items[2].queue`; see [`JsonObject::member`].
pub struct MemberName<'o> {
    path: &'o ObjectPath,
    key: &'o str,
}

impl fmt::Display for MemberName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path {
            ObjectPath::Body => f.write_str(self.key),
            path => write!(f, "{path}.{}", self.key),
        }
    }
}

/// An array member of a body, counted; its elements are read on demand.
pub struct Objects<'a> {
    raw: &'a RawValue,
    array: Arc<str>,
    len: usize,
}

impl<'a> Objects<'a> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every element, when there are at most `max` (`what` names them in the refusal).
    pub fn read_at_most(&self, max: usize, what: &str) -> Result<Vec<JsonObject<'a>>, ApiError> {
        if self.len > max {
            let (array, len) = (&self.array, self.len);
            return Err(ApiError::bad_request(format!("{array} holds {len} {what}; at most {max} are allowed")));
        }
        self.read()
    }

    /// Every element, each of which must be an object.
    pub fn read(&self) -> Result<Vec<JsonObject<'a>>, ApiError> {
        let elements: Vec<&'a RawValue> = serde_json::from_str(self.raw.get())
            .map_err(|_| ApiError::bad_request(format!("{} must be an array of objects", self.array)))?;
        elements
            .into_iter()
            .enumerate()
            .map(|(index, raw)| JsonObject::nested(raw, ObjectPath::Element { array: self.array.clone(), index }))
            .collect()
    }
}

/// The number of elements of a JSON array, read without keeping any.
struct ElementCount(usize);

impl<'de> Deserialize<'de> for ElementCount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Counting;
        impl<'de> Visitor<'de> for Counting {
            type Value = ElementCount;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ElementCount, A::Error> {
                let mut count = 0;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    count += 1;
                }
                Ok(ElementCount(count))
            }
        }
        deserializer.deserialize_seq(Counting)
    }
}

impl<'a> JsonObject<'a> {
    /// Parses a request body that must be a JSON object. An empty body is `{}` when
    /// `empty_is_object` (routes where the client sends no body for no options).
    pub fn parse_body(body: &'a [u8], empty_is_object: bool) -> Result<Self, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            if empty_is_object {
                return Ok(Self { members: BTreeMap::new(), path: ObjectPath::Body });
            }
            return Err(ApiError::bad_request("the request body is empty; a JSON object is required"));
        }
        if nests_deeper_than(body, MAX_NESTING) {
            return Err(ApiError::bad_request(format!(
                "the request body nests arrays and objects more than {MAX_NESTING} levels deep"
            )));
        }
        let members = serde_json::from_slice(body).map_err(|e| {
            if e.is_data() {
                ApiError::bad_request("the request body must be a JSON object")
            } else {
                ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
            }
        })?;
        Self::of(members, ObjectPath::Body)
    }

    /// The object, unless it gives a member twice.
    fn of(members: Members<'a>, path: ObjectPath) -> Result<Self, ApiError> {
        let object = Self { members: members.by_name, path };
        match members.repeated {
            Some(name) => Err(ApiError::bad_request(format!(
                "{} is given more than once",
                object.name_of(&names::quoted_member(&name.0))
            ))),
            None => Ok(object),
        }
    }

    /// A member's name as errors report it, e.g. `items[2].queue`, written out only when shown.
    pub fn member<'o>(&'o self, key: &'o str) -> MemberName<'o> {
        MemberName { path: &self.path, key }
    }

    /// [`Self::member`] as a string.
    pub fn name_of(&self, key: &str) -> String {
        self.member(key).to_string()
    }

    /// Whether the object has no members at all.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The names of the object's members, in name order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.members.keys().map(|key| key.0.as_ref())
    }

    /// The first member (in name order) that is not one of `takes`.
    pub fn member_outside(&self, takes: &[&str]) -> Option<&str> {
        self.keys().find(|key| !takes.contains(key))
    }

    /// Refuses (400) a member that is not one of `takes`, naming it and them: the broker reads
    /// only those, and a member it would skip must not look accepted (a misspelt `leaseID`, say,
    /// would otherwise leave an ack unfenced without a word).
    pub fn takes_only(&self, takes: &[&str]) -> Result<(), ApiError> {
        let Some(key) = self.member_outside(takes) else { return Ok(()) };
        let whose = match self.path {
            ObjectPath::Body => "the body".to_owned(),
            ref element => element.to_string(),
        };
        let members = if takes.is_empty() { "no members".to_owned() } else { takes.join(", ") };
        Err(ApiError::bad_request(format!(
            "{} is not a member the broker reads here; {whose} takes {members}",
            self.name_of(&names::quoted_member(key))
        )))
    }

    /// The member as raw JSON; `None` when absent or `null`.
    pub fn raw(&self, key: &str) -> Option<&'a RawValue> {
        self.members.get(key).copied().filter(|raw| raw.get() != "null")
    }

    /// The member as raw JSON, `null` included; `None` only when absent.
    pub fn raw_or_null(&self, key: &str) -> Option<&'a RawValue> {
        self.members.get(key).copied()
    }

    fn typed<T: DeserializeOwned>(&self, key: &str, expected: &str) -> Result<Option<T>, ApiError> {
        self.raw(key)
            .map(|raw| {
                serde_json::from_str(raw.get())
                    .map_err(|_| ApiError::bad_request(format!("{} must be {expected}", self.name_of(key))))
            })
            .transpose()
    }

    pub fn string(&self, key: &str) -> Result<Option<String>, ApiError> {
        Ok(self.text(key)?.map(Cow::into_owned))
    }

    /// A string member, borrowed from the body unless it holds escapes.
    pub fn text(&self, key: &str) -> Result<Option<Cow<'a, str>>, ApiError> {
        self.raw(key)
            .map(|raw| {
                serde_json::from_str::<JsonStr<'a>>(raw.get())
                    .map(|text| text.0)
                    .map_err(|_| ApiError::bad_request(format!("{} must be a string", self.member(key))))
            })
            .transpose()
    }

    pub fn required_string(&self, key: &str) -> Result<String, ApiError> {
        self.required_text(key).map(Cow::into_owned)
    }

    /// A string member that must be there, borrowed from the body unless it holds escapes.
    pub fn required_text(&self, key: &str) -> Result<Cow<'a, str>, ApiError> {
        self.text(key)?.ok_or_else(|| ApiError::bad_request(format!("{} is required", self.member(key))))
    }

    pub fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        self.typed(key, "true or false")
    }

    pub fn integer(&self, key: &str) -> Result<Option<i64>, ApiError> {
        self.typed(key, "an integer")
    }

    /// A member that must be an object, its own members read as the body's are.
    pub fn object(&self, key: &str) -> Result<Option<JsonObject<'a>>, ApiError> {
        let Some(raw) = self.raw(key) else { return Ok(None) };
        Self::nested(raw, ObjectPath::Member(self.name_of(key).into())).map(Some)
    }

    /// A member that must be an array of objects: counted now, its elements read by
    /// [`Objects::read`] once the caller has checked how many there are (a body of millions of
    /// tiny elements would otherwise cost a map each before its count is refused).
    pub fn objects(&self, key: &str) -> Result<Option<Objects<'a>>, ApiError> {
        let Some(raw) = self.raw(key) else { return Ok(None) };
        let array: Arc<str> = self.name_of(key).into();
        let not_an_array = || ApiError::bad_request(format!("{array} must be an array of objects"));
        let ElementCount(len) = serde_json::from_str(raw.get()).map_err(|_| not_an_array())?;
        Ok(Some(Objects { raw, array, len }))
    }

    fn nested(raw: &'a RawValue, path: ObjectPath) -> Result<Self, ApiError> {
        let members = serde_json::from_str(raw.get())
            .map_err(|_| ApiError::bad_request(format!("{path} must be a JSON object")))?;
        Self::of(members, path)
    }
}

/// The query string as key/value pairs (form-decoded: `+` is a space); a parameter given twice is
/// refused (400) rather than one of its values ignored.
pub fn query_pairs(query: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let pairs = actix_web::web::Query::<Vec<(String, String)>>::from_query(query)
        .map(actix_web::web::Query::into_inner)
        .map_err(|e| ApiError::bad_request(format!("malformed query string: {e}")))?;
    let mut query = BTreeMap::new();
    for (key, value) in pairs {
        if key.contains('\0') || value.contains('\0') {
            return Err(nul_refused(&format!("query parameter \"{}\"", names::quoted_member(&key))));
        }
        // Which of two values would act is a guess the client did not ask for, as with a
        // duplicate member of a JSON body.
        match query.entry(key) {
            Entry::Vacant(slot) => {
                slot.insert(value);
            }
            Entry::Occupied(taken) => {
                return Err(ApiError::bad_request(format!(
                    "query parameter \"{}\" is given more than once",
                    names::quoted_member(taken.key())
                )));
            }
        }
    }
    Ok(query)
}

/// A listing's `from` and `to`, each optional.
pub type TimeRange = (Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// The `from` and `to` times of the query string, each optional, read by [`iso_time`]; `from`
/// after `to` is refused rather than answered with an empty page.
pub fn time_range(query: &BTreeMap<String, String>) -> Result<TimeRange, ApiError> {
    let time = |key: &str| query.get(key).map(|text| iso_time(key, text)).transpose();
    let (from, to) = (time("from")?, time("to")?);
    if from.zip(to).is_some_and(|(from, to)| from > to) {
        return Err(ApiError::bad_request("from must not be after to"));
    }
    Ok((from, to))
}

/// A query parameter that must be `true` or `false` (`1`/`0` accepted too).
pub fn query_bool(query: &BTreeMap<String, String>, key: &str) -> Result<Option<bool>, ApiError> {
    query
        .get(key)
        .map(|value| match value.as_str() {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            other => Err(ApiError::bad_request(format!("{key} must be true or false, not {other:?}"))),
        })
        .transpose()
}

/// A query parameter that must be an integer in `min..=max`.
pub fn query_int(query: &BTreeMap<String, String>, key: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
    query
        .get(key)
        .map(|value| {
            value.parse::<u64>().ok().filter(|n| (min..=max).contains(n)).ok_or_else(|| {
                ApiError::bad_request(format!("{key} must be an integer from {min} to {max}, not {value:?}"))
            })
        })
        .transpose()
}

/// A time a client sent as `field`, in ISO-8601: with an offset; without one, taken as UTC (what
/// Python's `datetime.utcnow().isoformat()` gives), with `T` or a space between date and time; or
/// a date alone, its midnight UTC. A time PostgreSQL cannot hold (before 4713 BC, or past
/// 294275 AD) is refused like any text that is no time.
pub fn iso_time(field: &str, text: &str) -> Result<DateTime<Utc>, ApiError> {
    DateTime::parse_from_rfc3339(text)
        .map(|at| at.with_timezone(&Utc))
        .or_else(|_| NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f").map(|at| at.and_utc()))
        .or_else(|_| NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f").map(|at| at.and_utc()))
        .or_else(|_| NaiveDate::parse_from_str(text, "%Y-%m-%d").map(|day| day.and_time(NaiveTime::MIN).and_utc()))
        .map_err(|_| ApiError::bad_request(format!("{field} must be an ISO-8601 timestamp, not {text:?}")))
        .and_then(|at| {
            if (-4712..=294_275).contains(&at.year()) {
                Ok(at)
            } else {
                Err(ApiError::bad_request(format!(
                    "{field} {text:?} is outside what PostgreSQL holds (4713 BC to 294275 AD)"
                )))
            }
        })
}

/// Path parameter `name` as the client meant it. actix decodes a matched path except `%25`,
/// `%2B` and `%2F` (so that they cannot change how it splits); they are decoded here, so that a
/// name holding `%`, `+` or `/` is the same in a path as in a body.
pub fn path_param(path: &Path<Url>, name: &str) -> Result<String, ApiError> {
    let raw = path.get(name).unwrap_or_default();
    let value = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(Cow::into_owned)
        .map_err(|_| ApiError::bad_request(format!("{name} in the path is not UTF-8 once decoded")))?;
    if value.contains('\0') {
        return Err(nul_refused(&format!("{name} in the path")));
    }
    Ok(value)
}

/// PostgreSQL's text holds no NUL character, so a name or filter holding one could match nothing
/// and would fail the statement that carried it.
fn nul_refused(what: &str) -> ApiError {
    ApiError::bad_request(format!("{what} holds a NUL character, which no name or value may hold"))
}

/// A queue, partition or group name from the request's path, decoded ([`path_param`]) and
/// checked.
pub fn path_name(req: &HttpRequest, name: &str, kind: NameKind) -> Result<String, ApiError> {
    let value = path_param(req.match_info(), name)?;
    names::check(kind, name, &value).map_err(ApiError::BadRequest)?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use futures::stream;

    use super::*;
    use crate::metrics::Metrics;
    use crate::pressure::Limited;

    #[test]
    fn times_without_an_offset_are_utc_and_a_date_is_its_midnight() {
        let utc: DateTime<Utc> = "2026-01-02T03:04:05.5Z".parse().unwrap();
        assert_eq!(iso_time("since", "2026-01-02T03:04:05.500000Z").unwrap(), utc);
        assert_eq!(iso_time("since", "2026-01-02T04:04:05.5+01:00").unwrap(), utc);
        assert_eq!(iso_time("since", "2026-01-02T03:04:05.5").unwrap(), utc);
        assert_eq!(iso_time("since", "2026-01-02 03:04:05.5").unwrap(), utc);
        let midnight: DateTime<Utc> = "2026-01-02T00:00:00Z".parse().unwrap();
        assert_eq!(iso_time("since", "2026-01-02").unwrap(), midnight);
        assert!(iso_time("since", "0000-06-01").is_ok() && iso_time("since", "9999-12-31").is_ok());
        let far = ["-5000-01-01", "-4713-01-01T00:00:00", "+300000-01-01 00:00:00"];
        for bad in ["yesterday", "2026-13-02", "2026-01-02T25:00:00", "1767323045", ""].into_iter().chain(far) {
            assert!(iso_time("since", bad).unwrap_err().to_string().starts_with("since"), "{bad:?}");
        }
    }

    fn in_flight(limit: usize) -> Arc<Bound> {
        Bound::new(Limited::BodyBytes, limit, &Metrics::new(10))
    }

    #[test]
    fn nesting_counts_brackets_outside_strings() {
        let nested = |depth: usize| format!("{}1{}", "[{\"a\":".repeat(depth / 2), "}]".repeat(depth / 2));
        assert!(!nests_deeper_than(nested(10).as_bytes(), 10));
        assert!(nests_deeper_than(nested(12).as_bytes(), 10));
        // More brackets than the limit, but side by side or inside strings: shallow.
        assert!(!nests_deeper_than("[[],[],[],[],[],[]]".as_bytes(), 3));
        assert!(!nests_deeper_than(r#"["[[[[", {"k": "{{{{\"[["}]"#.as_bytes(), 3));
        assert!(nests_deeper_than(r#"["\\", [[["x"]]]]"#.as_bytes(), 3));
    }

    /// Member names and strings are read the same whether they borrow from the body or hold
    /// escapes, a nested object is named by its place in the body, and a name given twice,
    /// however spelt, is refused by that name.
    #[test]
    fn members_are_found_by_name_however_they_are_spelt_and_named_by_their_place() {
        let body = br#"{"acks": [{"st\u0061tus": "fa\u0069led", "leaseId": "x"}, {"status": "dlq"}]}"#;
        let object = JsonObject::parse_body(body, false).expect("an object");
        let items = object.objects("acks").expect("an array").expect("present").read().expect("objects");
        assert_eq!(items[0].text("status").expect("a string").as_deref(), Some("failed"));
        assert!(matches!(items[0].text("leaseId").expect("a string"), Some(Cow::Borrowed("x"))));
        assert_eq!(items[1].string("status").expect("a string").as_deref(), Some("dlq"));
        assert_eq!(items[1].member("status").to_string(), "acks[1].status");
        let twice = JsonObject::parse_body(br#"{"acks": [{}, {"status": "dlq", "st\u0061tus": "retry"}]}"#, false)
            .expect("an object");
        let refused = twice.objects("acks").expect("an array").expect("present").read().err().expect("a member twice");
        assert_eq!(refused.to_string(), "acks[1].status is given more than once");
        let refused = JsonObject::parse_body(br#"{"acks": [], "acks": []}"#, false).err().expect("a member twice");
        assert_eq!(refused.to_string(), "acks is given more than once");
        assert_eq!(object.member("acks").to_string(), "acks");
        let refused = items[0].takes_only(&["status"]).expect_err("leaseId is not taken");
        assert_eq!(refused.to_string(), "acks[0].leaseId is not a member the broker reads here; acks[0] takes status");
        let nested = JsonObject::parse_body(br#"{"acks": [{}, 1]}"#, false).expect("an object");
        let read = nested.objects("acks").expect("an array").expect("present").read();
        assert_eq!(read.err().expect("not an object").to_string(), "acks[1] must be a JSON object");
        let counted = JsonObject::parse_body(br#"{"acks": [{}, 1, [2], "x"]}"#, false).expect("an object");
        assert_eq!(counted.objects("acks").expect("an array").expect("present").len(), 4, "counted, not read");
        let scalar = JsonObject::parse_body(br#"{"acks": {"a": 1}}"#, false).expect("an object");
        assert_eq!(scalar.objects("acks").err().expect("not an array").to_string(), "acks must be an array of objects");
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_within_the_timeout_is_a_408_and_gives_its_bytes_back() {
        let bound = in_flight(1024);
        let trickle = stream::iter([Ok(Bytes::from_static(b"{\"items\""))]).chain(stream::pending());
        let started = Instant::now();
        let error = read_within(trickle, 1024, Duration::from_millis(100), &bound).await.err().expect("a timeout");
        assert!(matches!(error, ApiError::RequestTimeout(_)), "{error:?}");
        assert_eq!(error.to_string(), "the request body did not arrive within 100 ms");
        assert!(started.elapsed() < Duration::from_secs(5), "cut off at the deadline");
        assert_eq!(bound.held(), 0, "the bytes read are given back");
    }

    #[tokio::test]
    async fn the_deadline_is_for_the_whole_body_not_each_chunk() {
        let bound = in_flight(1024);
        // Each chunk comes well within the timeout, the whole body does not.
        let slow = stream::unfold(0, |sent| async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            Some((Ok::<_, PayloadError>(Bytes::from_static(b" ")), sent + 1))
        });
        let error =
            read_within(Box::pin(slow), 1024, Duration::from_millis(200), &bound).await.err().expect("a timeout");
        assert!(matches!(error, ApiError::RequestTimeout(_)), "{error:?}");
    }

    #[tokio::test]
    async fn a_whole_body_within_the_limits_is_read() {
        let bound = in_flight(1024);
        let chunks = stream::iter([Ok(Bytes::from_static(b"{}")), Ok(Bytes::from_static(b" "))]);
        let body = read_within(chunks, 1024, Duration::from_secs(5), &bound).await.expect("a body");
        assert_eq!(&*body, b"{} ");
        assert_eq!(bound.held(), 3, "held while the request has it");
        let chunks = stream::iter([Ok(Bytes::from(vec![b' '; 2000]))]);
        let error = read_within(chunks, 1024, Duration::from_secs(5), &bound).await.err().expect("too large");
        assert!(matches!(error, ApiError::PayloadTooLarge(_)), "{error:?}");
    }
}
