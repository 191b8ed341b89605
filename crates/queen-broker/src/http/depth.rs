//! `GET /api/v1/resources/queues/{queue}/depth[?group=]`: a queue's backlog for one consumer
//! group (queue mode without one), in total and per partition.

use actix_web::{HttpRequest, HttpResponse, web};
use queen_store::depth::PartitionDepth;
use serde::Serialize;

use super::body::{path_name, query_int, strict_query};
use crate::broker::{Broker, depth};
use crate::error::ApiError;
use crate::names::{self, NameKind};

/// Most partitions one answer lists (the totals cover every partition).
const MAX_PAGE: u64 = 1000;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartitionJson {
    partition: String,
    partition_id: String,
    pending: i64,
    processing: i64,
    ready: i64,
}

impl From<PartitionDepth> for PartitionJson {
    fn from(p: PartitionDepth) -> Self {
        PartitionJson {
            partition: p.partition,
            partition_id: p.partition_id.to_string(),
            pending: p.pending,
            processing: p.processing,
            ready: p.ready,
        }
    }
}

/// What the official client documents (`queue`, `group`, `pending`, `partitionsPending`,
/// `conflation`, `effectivePending`, `partitions`), with the leased and servable shares of the
/// backlog beside it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DepthJson {
    queue: String,
    group: String,
    /// The group is registered as conflating: each partition with a backlog is one delivery.
    conflation: bool,
    /// Messages past the group's cursor on every partition.
    pending: i64,
    partitions_pending: i64,
    /// Deliveries the backlog is worth: `partitionsPending` when conflating, else `pending`.
    effective_pending: i64,
    /// Of `pending`, the messages under a live lease of the group.
    processing: i64,
    /// Of `pending`, the messages after the leased ones that could be served now (not held back by
    /// `delayedProcessing`, an open `windowBuffer` or a `retryDelay`).
    ready: i64,
    partitions_ready: i64,
    effective_ready: i64,
    total_partitions: i64,
    limit: i64,
    offset: i64,
    partitions: Vec<PartitionJson>,
}

/// The group's backlog on the queue; 404 for a queue that does not exist. `group` absent (or
/// `__QUEUE_MODE__`) is queue mode; `limit` (1 to 1000, default 1000) and `offset` page the
/// partitions listed, by name.
pub async fn queue_depth(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let queue = path_name(&req, "queue", NameKind::Queue)?;
    let query = strict_query(&req, &["group", "limit", "offset"])?;
    let group = names::group_or_queue_mode(query.get("group").map(String::as_str)).to_owned();
    names::check(NameKind::ConsumerGroup, "group", &group).map_err(ApiError::BadRequest)?;
    let limit = query_int(&query, "limit", 1, MAX_PAGE)?.unwrap_or(MAX_PAGE) as i64;
    let offset = query_int(&query, "offset", 0, i64::MAX as u64)?.unwrap_or(0) as i64;
    let depth = depth::queue_depth(&broker, &queue, &group, limit, offset)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("queue {queue:?} not found")))?;
    let (effective_pending, effective_ready) = if depth.conflation {
        (depth.partitions_pending, depth.partitions_ready)
    } else {
        (depth.pending, depth.ready)
    };
    Ok(HttpResponse::Ok().json(DepthJson {
        queue,
        group,
        conflation: depth.conflation,
        pending: depth.pending,
        partitions_pending: depth.partitions_pending,
        effective_pending,
        processing: depth.processing,
        ready: depth.ready,
        partitions_ready: depth.partitions_ready,
        effective_ready,
        total_partitions: depth.total_partitions,
        limit,
        offset,
        partitions: depth.partitions.into_iter().map(PartitionJson::from).collect(),
    }))
}
