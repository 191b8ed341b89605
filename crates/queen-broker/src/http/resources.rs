//! `GET` and `DELETE /api/v1/resources/queues/{queue}`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;
use serde_json::{Map, Value};

use super::body::NoQuery;
use crate::broker::{Broker, queue_options, queues};
use crate::error::ApiError;
use crate::names::NameKind;

fn queue_name(req: &HttpRequest) -> Result<String, ApiError> {
    super::body::path_name(req, "queue", NameKind::Queue)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct QueueInfo {
    id: i64,
    name: String,
    namespace: Option<String>,
    task: Option<String>,
    options: Map<String, Value>,
    partitions: i64,
    messages: i64,
}

pub async fn get_queue(broker: web::Data<Broker>, _: NoQuery, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let name = queue_name(&req)?;
    let (queue, size) = queues::describe(&broker, &name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("queue {name:?} not found")))?;
    Ok(HttpResponse::Ok().json(QueueInfo {
        id: queue.id,
        name: queue.name.clone(),
        namespace: queue.namespace.clone(),
        task: queue.task.clone(),
        options: queue_options::echo(&queue.options),
        partitions: size.partitions,
        messages: size.messages,
    }))
}

#[derive(Serialize)]
struct Deleted {
    deleted: bool,
    queue: String,
    existed: bool,
}

pub async fn delete_queue(broker: web::Data<Broker>, _: NoQuery, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let name = queue_name(&req)?;
    let existed = queues::delete(&broker, &name).await?;
    Ok(HttpResponse::Ok().json(Deleted { deleted: true, queue: name, existed }))
}
