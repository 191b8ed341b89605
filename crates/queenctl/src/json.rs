//! The client's answers as JSON, for `--output json`.
//!
//! Several of `queen_client`'s answer types derive `Deserialize` only. Until they derive
//! `Serialize` too, they are written out here, member by member, in camelCase like the broker's
//! own answers; the members they keep in `extra` (what this client does not know yet) are
//! passed through. Types that already serialize (`Message`, `AckResult`, `DeadLetter`,
//! `MessageStatus`) are used as they are.

use queen_client::{
    BrokerStatus, Configured, Delivery, GroupDeleted, GroupDetail, GroupQueueLag, GroupSummary, LaggingCursor,
    MaintenanceStatus, MessageCounts, PartitionLag, PartitionSummary, PushOutcome, PushStatus, QueueDeleted,
    QueueGroupLag, QueueInfo, QueueOptions, QueueSummary, Requeued, Seeked,
};
use serde_json::{Map, Value, json};

/// Any value that serializes.
pub fn value(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("answers always encode as JSON")
}

/// `object` with the members of `extra` it does not have itself.
fn with_extra(mut object: Value, extra: &Map<String, Value>) -> Value {
    if let Value::Object(members) = &mut object {
        for (key, value) in extra {
            members.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    object
}

pub fn push_status(status: PushStatus) -> &'static str {
    match status {
        PushStatus::Queued => "queued",
        PushStatus::Duplicate => "duplicate",
        PushStatus::Buffered => "buffered",
        _ => "unknown",
    }
}

pub fn push_outcome(o: &PushOutcome) -> Value {
    json!({
        "index": o.index,
        "status": push_status(o.status),
        "transactionId": o.transaction_id,
        "messageId": o.message_id,
        "partitionId": o.partition_id,
        "offset": o.offset,
    })
}

pub fn delivery(d: &Delivery) -> Value {
    json!({
        "messages": value(&d.messages),
        "leaseId": d.lease_id,
        "partitionsClaimed": d.partitions_claimed,
        "paused": d.paused,
    })
}

pub fn seeked(s: &Seeked) -> Value {
    let partitions: Vec<Value> = s
        .partitions
        .iter()
        .map(|p| json!({"partitionId": p.partition_id, "partition": p.partition, "committed": p.committed}))
        .collect();
    json!({
        "consumerGroup": s.consumer_group,
        "queue": s.queue,
        "seekToEnd": s.seek_to_end,
        "targetTimestamp": s.target_timestamp,
        "partitionsUpdated": s.partitions_updated,
        "partitions": partitions,
    })
}

fn group_queue_lag(q: &GroupQueueLag) -> Value {
    json!({
        "queue": q.queue,
        "partitions": q.partitions,
        "lagMessages": q.lag_messages,
        "lagSeconds": q.lag_seconds,
        "activeLeases": q.active_leases,
        "totalConsumed": q.total_consumed,
        "lastConsumedAt": q.last_consumed_at,
        "subscriptionMode": q.subscription_mode,
        "subscriptionFrom": q.subscription_from,
    })
}

pub fn group_summary(g: &GroupSummary) -> Value {
    json!({
        "name": g.name,
        "queues": g.queues.iter().map(group_queue_lag).collect::<Vec<_>>(),
        "totalLag": g.total_lag,
        "maxLagSeconds": g.max_lag_seconds,
    })
}

fn partition_lag(p: &PartitionLag) -> Value {
    json!({
        "queue": p.queue,
        "partition": p.partition,
        "partitionId": p.partition_id,
        "committed": p.committed,
        "lastOffset": p.last_offset,
        "lagMessages": p.lag_messages,
        "lagSeconds": p.lag_seconds,
        "leaseActive": p.lease_active,
        "leaseExpiresAt": p.lease_expires_at,
        "totalConsumed": p.total_consumed,
        "lastConsumedAt": p.last_consumed_at,
        "retryCount": p.retry_count,
        "redeliveryCount": p.redelivery_count,
    })
}

pub fn group_detail(g: &GroupDetail) -> Value {
    let mut detail = group_summary(&g.summary);
    detail["partitions"] = g.partitions.iter().map(partition_lag).collect();
    detail
}

pub fn lagging_cursor(c: &LaggingCursor) -> Value {
    let mut cursor = json!({"consumerGroup": c.consumer_group});
    if let (Value::Object(members), Value::Object(lag)) = (&mut cursor, partition_lag(&c.partition)) {
        members.extend(lag);
    }
    cursor
}

pub fn group_deleted(d: &GroupDeleted) -> Value {
    json!({
        "consumerGroup": d.consumer_group,
        "queue": d.queue,
        "deletedPartitions": d.deleted_partitions,
        "metadataDeleted": d.metadata_deleted,
    })
}

pub fn requeued(r: &Requeued) -> Value {
    json!({
        "result": r.result,
        "queue": r.queue,
        "partitionId": r.partition_id,
        "transactionId": r.transaction_id,
        "messageId": r.message_id,
        "offset": r.offset,
        "deadLetters": r.dead_letters,
    })
}

fn counts(m: &MessageCounts) -> Value {
    json!({"pushed": m.pushed, "stored": m.stored})
}

pub fn queue_summary(q: &QueueSummary) -> Value {
    let queue = json!({
        "id": q.id,
        "name": q.name,
        "namespace": q.namespace,
        "task": q.task,
        "partitions": q.partitions,
        "messages": counts(&q.messages),
        "lastPushAt": q.last_push_at,
        "createdAt": q.created_at,
        "options": q.options,
    });
    with_extra(queue, &q.extra)
}

pub fn queue_options(o: &QueueOptions) -> Value {
    let options = json!({
        "leaseTime": o.lease_time,
        "retryLimit": o.retry_limit,
        "retryDelay": o.retry_delay,
        "priority": o.priority,
        "delayedProcessing": o.delayed_processing,
        "windowBuffer": o.window_buffer,
        "maxSize": o.max_size,
        "ttl": o.ttl,
        "maxWaitTimeSeconds": o.max_wait_time_seconds,
        "deadLetterQueue": o.dead_letter_queue,
        "dlqAfterMaxRetries": o.dlq_after_max_retries,
        "retentionEnabled": o.retention_enabled,
        "retentionSeconds": o.retention_seconds,
        "completedRetentionSeconds": o.completed_retention_seconds,
        "encryptionEnabled": o.encryption_enabled,
        "dedupWindowSeconds": o.dedup_window_seconds,
    });
    with_extra(options, &o.extra)
}

pub fn queue_info(q: &QueueInfo) -> Value {
    json!({
        "id": q.id,
        "name": q.name,
        "namespace": q.namespace,
        "task": q.task,
        "options": queue_options(&q.options),
        "partitions": q.partitions,
        "messages": q.messages,
    })
}

pub fn partition_summary(p: &PartitionSummary) -> Value {
    let partition = json!({
        "id": p.id,
        "queue": p.queue,
        "name": p.name,
        "lastOffset": p.last_offset,
        "retainedFrom": p.retained_from,
        "messagesStored": p.messages_stored,
        "createdAt": p.created_at,
        "lastPushAt": p.last_push_at,
    });
    with_extra(partition, &p.extra)
}

pub fn queue_group_lag(g: &QueueGroupLag) -> Value {
    let group = json!({
        "name": g.name,
        "partitions": g.partitions,
        "lagMessages": g.lag_messages,
        "lagSeconds": g.lag_seconds,
        "activeLeases": g.active_leases,
    });
    with_extra(group, &g.extra)
}

pub fn configured(c: &Configured) -> Value {
    json!({
        "configured": c.configured,
        "queueId": c.queue_id,
        "queue": c.queue,
        "namespace": c.namespace,
        "task": c.task,
        "options": queue_options(&c.options),
        "ignoredOptions": c.ignored_options,
    })
}

pub fn queue_deleted(d: &QueueDeleted) -> Value {
    json!({"deleted": d.deleted, "queue": d.queue, "existed": d.existed})
}

pub fn broker_status(s: &BrokerStatus) -> Value {
    let status = json!({
        "status": s.status,
        "broker": s.broker,
        "version": s.version,
        "uptimeSeconds": s.uptime_seconds,
        "queues": s.queues,
        "partitions": s.partitions,
        "messages": counts(&s.messages),
        "consumerGroups": s.consumer_groups,
        "activeLeases": s.active_leases,
        "deadLetters": s.dead_letters,
    });
    with_extra(status, &s.extra)
}

pub fn maintenance(m: &MaintenanceStatus) -> Value {
    json!({
        "maintenanceMode": m.maintenance_mode,
        "popMaintenanceMode": m.pop_maintenance_mode,
        "bufferedMessages": m.buffered_messages,
        "bufferHealthy": m.buffer_healthy,
        "bufferDirectory": m.buffer_directory,
    })
}
