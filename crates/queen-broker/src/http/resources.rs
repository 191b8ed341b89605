//! `GET` and `DELETE /api/v1/resources/queues/{queue}`.

use actix_web::{HttpRequest, HttpResponse, web};
use queen_store::queues;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::broker::Broker;
use crate::error::ApiError;
use crate::names::{self, NameKind};

fn queue_name(req: &HttpRequest) -> Result<String, ApiError> {
    let queue = req.match_info().get("queue").unwrap_or_default().to_owned();
    names::check(NameKind::Queue, "queue", &queue).map_err(ApiError::BadRequest)?;
    Ok(queue)
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

pub async fn get_queue(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let name = queue_name(&req)?;
    let client = broker.pool.get().await.map_err(queen_store::StoreError::from)?;
    let queue = queues::find_queue(&client, &name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("queue {name:?} not found")))?;
    let size = queues::queue_size(&client, queue.id).await?;
    Ok(HttpResponse::Ok().json(QueueInfo {
        id: queue.id,
        name: queue.name,
        namespace: queue.namespace,
        task: queue.task,
        options: queue.options,
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

pub async fn delete_queue(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let name = queue_name(&req)?;
    let client = broker.pool.get().await.map_err(queen_store::StoreError::from)?;
    let existed = queues::delete_queue(&client, &name).await?;
    broker.names.forget_queue(&name);
    let queue = name.clone();
    // The queue's registrations went with it; forget that they were written.
    let _ = broker.registered.invalidate_entries_if(move |(registered_queue, _), _| *registered_queue == queue);
    Ok(HttpResponse::Ok().json(Deleted { deleted: true, queue: name, existed }))
}
