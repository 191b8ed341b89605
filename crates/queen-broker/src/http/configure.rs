//! `POST /api/v1/configure`: create a queue or change its options.

use actix_web::{HttpResponse, web};
use queen_store::queues::Queue;
use serde::Serialize;
use serde_json::{Map, Value};

use super::authorize::Caller;
use super::body::{JsonObject, NoQuery, read_body};
use crate::broker::queues::{Configure, configure};
use crate::broker::{Broker, queue_options};
use crate::error::ApiError;
use crate::names::{self, NameKind};

pub async fn handle(
    broker: web::Data<Broker>,
    _: NoQuery,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let body = JsonObject::parse_body(&body, false)?;
    body.takes_only(&["queue", "namespace", "task", "options"])?;
    let queue = body.required_string("queue")?;
    names::check_new(NameKind::Queue, "queue", &queue).map_err(ApiError::BadRequest)?;
    caller.check_queues([queue.as_str()])?;
    let options: Map<String, Value> = match body.raw("options") {
        None => Map::new(),
        Some(raw) => {
            // Read as an object first, so that an option given twice is refused by name.
            body.object("options")?;
            serde_json::from_str(raw.get()).map_err(|_| ApiError::bad_request("options must be a JSON object"))?
        }
    };
    let request = Configure { namespace: label(&body, "namespace")?, task: label(&body, "task")?, options };
    if let Some(namespace) = &request.namespace {
        caller.check_namespace(&queue, namespace)?;
    }
    let stored = configure(&broker, &queue, &request).await?;
    Ok(HttpResponse::Ok().json(Configured::from(&stored)))
}

fn label(body: &JsonObject<'_>, key: &str) -> Result<Option<String>, ApiError> {
    let value = body.string(key)?;
    if let Some(value) = &value {
        // No pop can select an empty one, and it would replace the one the queue's name gives.
        if value.is_empty() {
            return Err(ApiError::BadRequest(format!("{key} must not be empty (leave it out to keep the stored one)")));
        }
        names::check_label(key, value).map_err(ApiError::BadRequest)?;
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
    /// Every option with its effective value.
    options: Map<String, Value>,
}

impl<'a> From<&'a Queue> for Configured<'a> {
    fn from(queue: &'a Queue) -> Self {
        Configured {
            configured: true,
            queue_id: queue.id,
            queue: &queue.name,
            namespace: queue.namespace.as_deref(),
            task: queue.task.as_deref(),
            options: queue_options::echo(&queue.options),
        }
    }
}
