//! Reading request bodies and query strings into clear 4xx errors.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use actix_web::web::{Bytes, BytesMut, Payload};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use crate::error::ApiError;
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

/// Reads the whole body, refusing (413) one larger than `limit` bytes, and (503) one whose bytes
/// would take the broker past `in_flight`, the bound on body bytes held across requests. Bytes
/// are counted as they arrive; a refused body is read to its end without being kept, so that the
/// client gets the answer (the server would otherwise close the connection on a body left unread,
/// and the client could see the connection reset instead).
pub async fn read_body(mut payload: Payload, limit: usize, in_flight: &Arc<Bound>) -> Result<Body, ApiError> {
    let mut body = BytesMut::new();
    let mut place = in_flight.hold(0)?;
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("could not read the request body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge(format!("the request body exceeds the limit of {limit} bytes")));
        }
        if let Err(refused) = place.grow(chunk.len()) {
            let mut read = body.len() + chunk.len();
            drop((body, place));
            while let Some(Ok(chunk)) = payload.next().await {
                read += chunk.len();
                if read > limit {
                    break;
                }
            }
            return Err(refused.into());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Body { bytes: body.freeze(), _place: place })
}

/// A JSON object whose members are kept as raw JSON, so each can be checked (and payloads kept
/// as they were sent) on its own.
pub struct JsonObject<'a> {
    members: BTreeMap<Cow<'a, str>, &'a RawValue>,
    /// How errors name this object, e.g. `items[2]`; empty for the body itself.
    path: String,
}

impl<'a> JsonObject<'a> {
    /// Parses a request body that must be a JSON object. An empty body is `{}` when
    /// `empty_is_object` (routes where the client sends no body for no options).
    pub fn parse_body(body: &'a [u8], empty_is_object: bool) -> Result<Self, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            if empty_is_object {
                return Ok(Self { members: BTreeMap::new(), path: String::new() });
            }
            return Err(ApiError::bad_request("the request body is empty; a JSON object is required"));
        }
        let members = serde_json::from_slice(body).map_err(|e| {
            if e.is_data() {
                ApiError::bad_request("the request body must be a JSON object")
            } else {
                ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
            }
        })?;
        Ok(Self { members, path: String::new() })
    }

    /// A member's name as errors report it, e.g. `items[2].queue`.
    pub fn name_of(&self, key: &str) -> String {
        if self.path.is_empty() { key.to_owned() } else { format!("{}.{key}", self.path) }
    }

    /// Whether the object has no members at all.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
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
        self.typed(key, "a string")
    }

    pub fn required_string(&self, key: &str) -> Result<String, ApiError> {
        self.string(key)?.ok_or_else(|| ApiError::bad_request(format!("{} is required", self.name_of(key))))
    }

    pub fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        self.typed(key, "true or false")
    }

    pub fn integer(&self, key: &str) -> Result<Option<i64>, ApiError> {
        self.typed(key, "an integer")
    }

    /// A member that must be an array of objects.
    pub fn objects(&self, key: &str) -> Result<Option<Vec<JsonObject<'a>>>, ApiError> {
        let Some(raw) = self.raw(key) else { return Ok(None) };
        let name = self.name_of(key);
        let elements: Vec<&'a RawValue> = serde_json::from_str(raw.get())
            .map_err(|_| ApiError::bad_request(format!("{name} must be an array of objects")))?;
        elements
            .into_iter()
            .enumerate()
            .map(|(i, raw)| Self::nested(raw, format!("{name}[{i}]")))
            .collect::<Result<_, _>>()
            .map(Some)
    }

    fn nested(raw: &'a RawValue, path: String) -> Result<Self, ApiError> {
        let members = serde_json::from_str(raw.get())
            .map_err(|_| ApiError::bad_request(format!("{path} must be a JSON object")))?;
        Ok(Self { members, path })
    }
}

/// The query string as key/value pairs (form-decoded: `+` is a space).
pub fn query_pairs(query: &str) -> Result<BTreeMap<String, String>, ApiError> {
    actix_web::web::Query::<BTreeMap<String, String>>::from_query(query)
        .map(actix_web::web::Query::into_inner)
        .map_err(|e| ApiError::bad_request(format!("malformed query string: {e}")))
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
