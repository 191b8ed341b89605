//! `/api/v1/consumer-groups/...`: listing, lag, seek, subscription and deletion.

use std::collections::BTreeMap;

use actix_web::{HttpRequest, HttpResponse, web};
use queen_store::groups::{CursorLag, Registration, SeekTarget};
use serde::Serialize;

use super::body::{
    JsonObject, NoQuery, iso_time, no_members, path_name, query_bool, query_int, read_body, strict_query,
};
use super::timestamp;
use crate::broker::{Broker, groups};
use crate::error::ApiError;
use crate::names::NameKind;

/// `{"toEnd": true}` or `{"timestamp": T}`; an empty body means `toEnd` where `empty_is_end`.
fn seek_target(body: &[u8], empty_is_end: bool) -> Result<SeekTarget, ApiError> {
    let body = JsonObject::parse_body(body, true)?;
    body.takes_only(&["toEnd", "timestamp"])?;
    let to_end = body.boolean("toEnd")?;
    let timestamp = body.string("timestamp")?;
    match (to_end, timestamp) {
        (Some(true), Some(_)) => Err(ApiError::bad_request("Specify either toEnd=true or a timestamp, not both")),
        (Some(true), None) => Ok(SeekTarget::End),
        (_, Some(at)) => Ok(SeekTarget::Time(iso_time("timestamp", &at)?)),
        (None, None) if empty_is_end && body.is_empty() => Ok(SeekTarget::End),
        _ => Err(ApiError::bad_request("Must specify toEnd=true or a timestamp")),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SeekedJson {
    partition_id: String,
    partition: String,
    committed: i64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SeekAnswer<'a> {
    success: bool,
    consumer_group: &'a str,
    queue: &'a str,
    /// The queue again, under the name upstream's answer gives it.
    queue_name: &'a str,
    seek_to_end: bool,
    target_timestamp: Option<String>,
    partitions_updated: usize,
    partitions: Vec<SeekedJson>,
}

async fn seek(
    broker: &Broker,
    req: &HttpRequest,
    payload: web::Payload,
    partition_id: Option<i64>,
) -> Result<HttpResponse, ApiError> {
    let group = path_name(req, "group", NameKind::ConsumerGroup)?;
    let queue = path_name(req, "queue", NameKind::Queue)?;
    let body = read_body(payload, broker.config.http.max_body_bytes, broker).await?;
    let target = seek_target(&body, partition_id.is_some())?;
    let Some(moved) = groups::seek(broker, &queue, partition_id, &group, target).await? else {
        return Err(ApiError::NotFound(match partition_id {
            Some(id) => format!("Partition {id} not found in queue {queue:?}"),
            None => "Queue not found or has no partitions".into(),
        }));
    };
    let (seek_to_end, target_timestamp) = match target {
        SeekTarget::End => (true, None),
        SeekTarget::Time(at) => (false, Some(timestamp(at))),
    };
    Ok(HttpResponse::Ok().json(SeekAnswer {
        success: true,
        consumer_group: &group,
        queue: &queue,
        queue_name: &queue,
        seek_to_end,
        target_timestamp,
        partitions_updated: moved.len(),
        partitions: moved
            .into_iter()
            .map(|m| SeekedJson {
                partition_id: m.partition_id.to_string(),
                partition: m.partition,
                committed: m.committed,
            })
            .collect(),
    }))
}

pub async fn seek_queue(
    broker: web::Data<Broker>,
    _: NoQuery,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    seek(&broker, &req, payload, None).await
}

pub async fn seek_partition(
    broker: web::Data<Broker>,
    _: NoQuery,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let raw = req.match_info().get("partition_id").unwrap_or_default();
    let id = raw
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| ApiError::bad_request(format!("{raw:?} is not a partition id")))?;
    seek(&broker, &req, payload, Some(id)).await
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SubscriptionAnswer<'a> {
    success: bool,
    consumer_group: &'a str,
    new_timestamp: String,
    rows_updated: usize,
    queues: Vec<String>,
}

pub async fn update_subscription(
    broker: web::Data<Broker>,
    _: NoQuery,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let group = path_name(&req, "group", NameKind::ConsumerGroup)?;
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let body = JsonObject::parse_body(&body, false)?;
    body.takes_only(&["subscriptionTimestamp"])?;
    let at = iso_time("subscriptionTimestamp", &body.required_string("subscriptionTimestamp")?)?;
    let queues = groups::update_subscription(&broker, &group, at).await?;
    if queues.is_empty() {
        return Err(ApiError::NotFound(format!(
            "consumer group {group:?} has neither a registration nor a cursor on any queue"
        )));
    }
    Ok(HttpResponse::Ok().json(SubscriptionAnswer {
        success: true,
        consumer_group: &group,
        new_timestamp: timestamp(at),
        rows_updated: queues.len(),
        queues,
    }))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeleteAnswer<'a> {
    success: bool,
    consumer_group: &'a str,
    queue: Option<&'a str>,
    deleted_partitions: u64,
    metadata_deleted: bool,
}

async fn delete(broker: &Broker, req: &HttpRequest, queue: Option<String>) -> Result<HttpResponse, ApiError> {
    let group = path_name(req, "group", NameKind::ConsumerGroup)?;
    let delete_metadata = query_bool(&strict_query(req, &["deleteMetadata"])?, "deleteMetadata")?.unwrap_or(true);
    let deleted = groups::delete(broker, &group, queue.as_deref(), delete_metadata).await?;
    Ok(HttpResponse::Ok().json(DeleteAnswer {
        success: true,
        consumer_group: &group,
        queue: queue.as_deref(),
        deleted_partitions: deleted.deleted_partitions,
        metadata_deleted: deleted.metadata_deleted > 0,
    }))
}

pub async fn delete_group(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    delete(&broker, &req, None).await
}

pub async fn delete_group_on_queue(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let queue = path_name(&req, "queue", NameKind::Queue)?;
    delete(&broker, &req, Some(queue)).await
}

/// A group's state on one queue.
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct QueueLag {
    queue: String,
    partitions: usize,
    lag_messages: i64,
    lag_seconds: f64,
    active_leases: usize,
    total_consumed: i64,
    last_consumed_at: Option<String>,
    subscription_mode: Option<String>,
    subscription_from: Option<String>,
    /// Registered as conflating: served only the newest message of each partition.
    conflation: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GroupSummary {
    name: String,
    queues: Vec<QueueLag>,
    total_lag: i64,
    max_lag_seconds: f64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartitionLag {
    queue: String,
    partition: String,
    partition_id: String,
    committed: i64,
    last_offset: i64,
    lag_messages: i64,
    lag_seconds: f64,
    lease_active: bool,
    lease_expires_at: Option<String>,
    total_consumed: i64,
    last_consumed_at: Option<String>,
    retry_count: i32,
    redelivery_count: i32,
}

impl From<&CursorLag> for PartitionLag {
    fn from(c: &CursorLag) -> Self {
        PartitionLag {
            queue: c.queue.clone(),
            partition: c.partition.clone(),
            partition_id: c.partition_id.to_string(),
            committed: c.committed,
            last_offset: c.last_offset,
            lag_messages: c.lag_messages,
            lag_seconds: c.lag_seconds,
            lease_active: c.lease_expires_at.is_some(),
            lease_expires_at: c.lease_expires_at.map(timestamp),
            total_consumed: c.total_consumed,
            last_consumed_at: c.last_consumed_at.map(timestamp),
            retry_count: c.retry_count,
            redelivery_count: c.redelivery_count,
        }
    }
}

/// Groups with their per-queue lag, from cursors and registrations (a registered group that has
/// not read anything yet still shows).
fn summarise(lags: &[CursorLag], registrations: &[Registration]) -> Vec<GroupSummary> {
    let mut groups: BTreeMap<&str, BTreeMap<&str, QueueLag>> = BTreeMap::new();
    for registration in registrations {
        let entry = groups.entry(&registration.group).or_default().entry(&registration.queue).or_default();
        entry.subscription_mode = Some(registration.mode.clone());
        entry.subscription_from = registration.from.map(timestamp);
        entry.conflation = registration.conflation;
    }
    for cursor in lags {
        let entry = groups.entry(&cursor.group).or_default().entry(&cursor.queue).or_default();
        entry.partitions += 1;
        entry.lag_messages += cursor.lag_messages;
        entry.lag_seconds = entry.lag_seconds.max(cursor.lag_seconds);
        entry.active_leases += usize::from(cursor.lease_expires_at.is_some());
        entry.total_consumed += cursor.total_consumed;
        let last = cursor.last_consumed_at.map(timestamp);
        if last > entry.last_consumed_at {
            entry.last_consumed_at = last;
        }
    }
    groups
        .into_iter()
        .map(|(name, queues)| {
            let queues: Vec<QueueLag> =
                queues.into_iter().map(|(queue, lag)| QueueLag { queue: queue.to_owned(), ..lag }).collect();
            GroupSummary {
                name: name.to_owned(),
                total_lag: queues.iter().map(|q| q.lag_messages).sum(),
                max_lag_seconds: queues.iter().map(|q| q.lag_seconds).fold(0.0, f64::max),
                queues,
            }
        })
        .collect()
}

pub async fn list(broker: web::Data<Broker>, _: NoQuery) -> Result<HttpResponse, ApiError> {
    let (lags, registrations) = groups::overview(&broker, None).await?;
    Ok(HttpResponse::Ok().json(summarise(&lags, &registrations)))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GroupDetail {
    #[serde(flatten)]
    summary: GroupSummary,
    partitions: Vec<PartitionLag>,
}

pub async fn detail(broker: web::Data<Broker>, _: NoQuery, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let group = path_name(&req, "group", NameKind::ConsumerGroup)?;
    let (lags, registrations) = groups::overview(&broker, Some(&group)).await?;
    let summary = summarise(&lags, &registrations)
        .pop()
        .ok_or_else(|| ApiError::NotFound(format!("consumer group {group:?} not found")))?;
    Ok(HttpResponse::Ok().json(GroupDetail { summary, partitions: lags.iter().map(PartitionLag::from).collect() }))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Lagging {
    consumer_group: String,
    #[serde(flatten)]
    partition: PartitionLag,
}

/// Cursors whose oldest unconsumed message is at least `minLagSeconds` old (default an hour).
pub async fn lagging(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let query = strict_query(&req, &["minLagSeconds"])?;
    let min_lag = query_int(&query, "minLagSeconds", 0, 10 * 365 * 24 * 3600)?.unwrap_or(3600) as f64;
    let (lags, _) = groups::overview(&broker, None).await?;
    let lagging: Vec<Lagging> = lags
        .iter()
        .filter(|c| c.lag_messages > 0 && c.lag_seconds >= min_lag)
        .map(|c| Lagging { consumer_group: c.group.clone(), partition: PartitionLag::from(c) })
        .collect();
    Ok(HttpResponse::Ok().json(lagging))
}

/// Statistics are computed when read, so there is nothing to refresh.
pub async fn refresh_stats(
    broker: web::Data<Broker>,
    _: NoQuery,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    no_members(payload, &broker).await?;
    Ok(HttpResponse::Ok()
        .json(serde_json::json!({"success": true, "refreshed": false, "reason": "statistics are computed on read"})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seek_bodies() {
        assert_eq!(seek_target(br#"{"toEnd": true}"#, false).unwrap(), SeekTarget::End);
        assert_eq!(seek_target(b"", true).unwrap(), SeekTarget::End);
        let at = seek_target(br#"{"timestamp": "2026-07-29T14:00:00Z"}"#, false).unwrap();
        assert_eq!(at, SeekTarget::Time("2026-07-29T14:00:00Z".parse().unwrap()));
        for (body, empty_is_end) in [(&b""[..], false), (br#"{}"#, false), (br#"{"toEnd": false}"#, true)] {
            match seek_target(body, empty_is_end) {
                Err(ApiError::BadRequest(message)) => assert_eq!(message, "Must specify toEnd=true or a timestamp"),
                other => panic!("{:?}: {other:?}", String::from_utf8_lossy(body)),
            }
        }
        assert!(seek_target(br#"{"timestamp": "yesterday"}"#, false).is_err());
        assert!(seek_target(br#"{"toEnd": true, "timestamp": "2026-07-29T14:00:00Z"}"#, false).is_err());
    }
}
