//! `POST /api/v1/configure`: create a queue or change its options.

use actix_web::{HttpResponse, web};
use queen_store::queues::Queue;
use serde::Serialize;
use serde_json::{Map, Value};

use super::authorize::Caller;
use super::body::{JsonObject, read_body};
use crate::broker::queues::{Configure, configure};
use crate::broker::{Broker, queue_options};
use crate::error::ApiError;
use crate::names::{self, NameKind};

pub async fn handle(
    broker: web::Data<Broker>,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let body = JsonObject::parse_body(&body, false)?;
    let queue = body.required_string("queue")?;
    names::check(NameKind::Queue, "queue", &queue).map_err(ApiError::BadRequest)?;
    caller.check_queues([queue.as_str()])?;
    let options: Map<String, Value> = match body.raw("options") {
        None => Map::new(),
        Some(raw) => {
            serde_json::from_str(raw.get()).map_err(|_| ApiError::bad_request("options must be a JSON object"))?
        }
    };
    if let Some((key, _)) = options.iter().find(|(key, value)| holds_nul(key, value)) {
        return Err(ApiError::bad_request(format!(
            "options.{} must not contain the character U+0000, which PostgreSQL cannot store",
            key.escape_debug()
        )));
    }
    let request = Configure { namespace: label(&body, "namespace")?, task: label(&body, "task")?, options };
    let stored = configure(&broker, &queue, &request).await?;
    Ok(HttpResponse::Ok().json(Configured::from(&stored)))
}

/// Whether an option's name or value holds U+0000 anywhere: PostgreSQL's `jsonb`, where unknown
/// options are kept, cannot store it, and the write would fail.
fn holds_nul(key: &str, value: &Value) -> bool {
    key.contains('\0')
        || match value {
            Value::String(text) => text.contains('\0'),
            Value::Array(items) => items.iter().any(|item| holds_nul("", item)),
            Value::Object(members) => members.iter().any(|(key, member)| holds_nul(key, member)),
            _ => false,
        }
}

fn label(body: &JsonObject<'_>, key: &str) -> Result<Option<String>, ApiError> {
    let value = body.string(key)?;
    if let Some(value) = &value
        && (value.len() > names::MAX_NAME_BYTES || value.chars().any(char::is_control))
    {
        return Err(ApiError::bad_request(format!(
            "{key} must be at most {} bytes without control characters",
            names::MAX_NAME_BYTES
        )));
    }
    Ok(value)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Configured<'a> {
    configured: bool,
    queue_id: i64,
    queue: &'a str,
    namespace: Option<&'a str>,
    task: Option<&'a str>,
    /// Every option with its effective value, unknown ones as configured.
    options: Map<String, Value>,
    /// The options the broker stores and echoes but does not act on.
    ignored_options: Vec<&'a str>,
}

impl<'a> From<&'a Queue> for Configured<'a> {
    fn from(queue: &'a Queue) -> Self {
        Configured {
            configured: true,
            queue_id: queue.id,
            queue: &queue.name,
            namespace: queue.namespace.as_deref(),
            task: queue.task.as_deref(),
            options: queue_options::echo(queue),
            ignored_options: queue_options::ignored(queue),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::holds_nul;

    #[test]
    fn nul_characters_are_found_in_option_names_and_values_at_any_depth() {
        assert!(holds_nul("x\0", &json!(1)));
        assert!(holds_nul("x", &json!({"a": [1, {"b\0": 2}]})));
        assert!(holds_nul("x", &json!([["\u{0}"]])));
        assert!(!holds_nul("x", &json!({"a": ["\\0", "\u{1}", 0]})));
    }
}
