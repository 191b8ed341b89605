//! `POST /api/v1/configure`: create a queue or change its options.

use actix_web::{HttpResponse, web};
use queen_store::queues::{Queue, QueueOptionsPatch, configure_queue};
use serde::Serialize;
use serde_json::{Map, Value};

use super::body::{JsonObject, read_body};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::names::{self, NameKind};

pub async fn handle(broker: web::Data<Broker>, payload: web::Payload) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, broker.config.http.max_body_bytes).await?;
    let body = JsonObject::parse_body(&body, false)?;
    let queue = body.required_string("queue")?;
    names::check(NameKind::Queue, "queue", &queue).map_err(ApiError::BadRequest)?;
    let namespace = label(&body, "namespace")?;
    let task = label(&body, "task")?;
    let options: Map<String, Value> = match body.raw("options") {
        None => Map::new(),
        Some(raw) => {
            serde_json::from_str(raw.get()).map_err(|_| ApiError::bad_request("options must be a JSON object"))?
        }
    };
    let patch = options_patch(&options)?;
    let client = broker.pool.get().await.map_err(queen_store::StoreError::from)?;
    let stored = configure_queue(&client, &queue, namespace.as_deref(), task.as_deref(), &patch, &options).await?;
    Ok(HttpResponse::Ok().json(Configured::from(&stored)))
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

fn int_option(options: &Map<String, Value>, key: &str, min: i64) -> Result<Option<i32>, ApiError> {
    match options.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_i64()
            .filter(|v| *v >= min && *v <= i64::from(i32::MAX))
            .map(|v| Some(v as i32))
            .ok_or_else(|| ApiError::bad_request(format!("options.{key} must be an integer of at least {min}"))),
    }
}

/// The options the broker acts on, checked. Other keys are stored and echoed as they are.
fn options_patch(options: &Map<String, Value>) -> Result<QueueOptionsPatch, ApiError> {
    let retention_enabled = match options.get("retentionEnabled") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => return Err(ApiError::bad_request("options.retentionEnabled must be true or false")),
    };
    if options.get("encryptionEnabled") == Some(&Value::Bool(true)) {
        return Err(ApiError::bad_request(
            "options.encryptionEnabled: encryption at rest is not supported by this broker",
        ));
    }
    let priority = match options.get("priority") {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            value
                .as_i64()
                .and_then(|v| i32::try_from(v).ok())
                .ok_or_else(|| ApiError::bad_request("options.priority must be an integer"))?,
        ),
    };
    Ok(QueueOptionsPatch {
        lease_time_seconds: int_option(options, "leaseTime", 1)?,
        retry_limit: int_option(options, "retryLimit", 0)?,
        delayed_processing_seconds: int_option(options, "delayedProcessing", 0)?,
        window_buffer_seconds: int_option(options, "windowBuffer", 0)?,
        retention_enabled,
        retention_seconds: int_option(options, "retentionSeconds", 0)?,
        completed_retention_seconds: int_option(options, "completedRetentionSeconds", 0)?,
        priority,
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Configured<'a> {
    configured: bool,
    queue_id: i64,
    queue: &'a str,
    namespace: Option<&'a str>,
    task: Option<&'a str>,
    options: &'a Map<String, Value>,
}

impl<'a> From<&'a Queue> for Configured<'a> {
    fn from(queue: &'a Queue) -> Self {
        Configured {
            configured: true,
            queue_id: queue.id,
            queue: &queue.name,
            namespace: queue.namespace.as_deref(),
            task: queue.task.as_deref(),
            options: &queue.options,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn the_client_defaults_are_accepted() {
        let defaults = options(
            r#"{"leaseTime": 300, "retryLimit": 3, "priority": 0, "delayedProcessing": 0, "windowBuffer": 0,
                "maxSize": 0, "retentionSeconds": 0, "completedRetentionSeconds": 0, "encryptionEnabled": false}"#,
        );
        let patch = options_patch(&defaults).unwrap();
        assert_eq!(patch.lease_time_seconds, Some(300));
        assert_eq!(patch.retry_limit, Some(3));
        assert_eq!(patch.retention_enabled, None);
    }

    #[test]
    fn bad_option_values_are_named() {
        for (json, field) in [
            (r#"{"leaseTime": 0}"#, "options.leaseTime"),
            (r#"{"leaseTime": "300"}"#, "options.leaseTime"),
            (r#"{"retryLimit": -1}"#, "options.retryLimit"),
            (r#"{"retryLimit": 1.5}"#, "options.retryLimit"),
            (r#"{"retentionEnabled": "yes"}"#, "options.retentionEnabled"),
        ] {
            match options_patch(&options(json)) {
                Err(ApiError::BadRequest(message)) => assert!(message.starts_with(field), "{message}"),
                other => panic!("{json}: expected a 400, got {other:?}"),
            }
        }
    }
}
