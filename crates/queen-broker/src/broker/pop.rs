//! Pop: find partitions with messages for the group, claim them under one lease, read the
//! claimed spans from their segments, and, for a long poll, park until a push or a released
//! lease may have made messages available.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use queen_store::cursors::{self, ClaimRequest, CursorSeed, Scope};
use queen_store::log::{self, Span};
use serde_json::value::RawValue;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::Broker;
use crate::actors::coordinator::{Checked, Observe, Park, PlanPop, PopPlan, ScanDone};
use crate::error::ApiError;

/// A validated pop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PopRequest {
    pub queue: String,
    /// The partition route: only this partition.
    pub partition: Option<String>,
    pub group: String,
    /// Most messages, across every claimed partition.
    pub batch: u32,
    /// Most partitions one pop may claim.
    pub max_partitions: u32,
    pub auto_ack: bool,
    pub wait: bool,
    pub timeout: Duration,
    pub lease_seconds: Option<i32>,
    /// Where the group starts on partitions it has never read.
    pub seed: CursorSeed,
}

/// One message handed to a consumer.
#[derive(Debug)]
pub struct DeliveredMessage {
    pub message_id: Uuid,
    pub transaction_id: String,
    pub trace_id: Option<Uuid>,
    pub partition_id: i64,
    pub partition: Arc<str>,
    pub data: Box<RawValue>,
    pub created_at: DateTime<Utc>,
    pub offset: i64,
    pub delivery_attempt: i32,
}

/// What a pop hands out: nothing, or messages of one or more partitions under one lease.
#[derive(Debug, Default)]
pub struct Delivery {
    pub lease_id: Option<Uuid>,
    pub partitions_claimed: usize,
    pub messages: Vec<DeliveredMessage>,
    /// Nothing, because pop maintenance is on.
    pub paused: bool,
}

enum Attempt {
    Delivered(Delivery),
    /// Nothing now; `retry_at` is when a lease held by another consumer of the group expires.
    Empty {
        retry_at: Option<DateTime<Utc>>,
    },
}

/// How long after a lease's expiry a parked pop looks again, so the lease is over when it does.
const AFTER_EXPIRY: Duration = Duration::from_millis(20);

/// Pops once, or for a long poll until messages come or the timeout passes. A parked pop holds
/// no database connection.
pub async fn pop(broker: &Broker, request: &PopRequest) -> Result<Delivery, ApiError> {
    let deadline = Instant::now() + request.timeout;
    let paused = || Ok(Delivery { paused: true, ..Delivery::default() });
    if held_by_pop_maintenance(broker, request, deadline).await {
        return paused();
    }
    super::groups::register_on_first_pop(broker, &request.queue, &request.group, request.seed).await?;
    let queue: Arc<str> = Arc::from(request.queue.as_str());
    loop {
        if broker.is_shutting_down() {
            return Ok(Delivery::default());
        }
        if held_by_pop_maintenance(broker, request, deadline).await {
            return paused();
        }
        let seen = if request.wait { Some(observe(broker, &queue).await?) } else { None };
        let retry_at = match pop_once(broker, request).await? {
            Attempt::Delivered(delivery) => return Ok(delivery),
            Attempt::Empty { retry_at } => retry_at,
        };
        let Some(seen) = seen else { return Ok(Delivery::default()) };
        let now = Instant::now();
        if now >= deadline {
            return Ok(Delivery::default());
        }
        let wake_at = retry_at
            .map(|at| now + (at - Utc::now()).to_std().unwrap_or_default() + AFTER_EXPIRY)
            .map_or(deadline, |at| at.min(deadline));
        let (wake, woken) = oneshot::channel();
        broker.coordinator.send(Park { queue: Arc::clone(&queue), seen, wake }).await.map_err(coordinator_gone)?;
        // Woken, or the time came: either way, look again (or give up past the deadline).
        let _ = tokio::time::timeout_at(wake_at.into(), woken).await;
    }
}

/// Whether pop maintenance keeps the pop from popping: a long poll waits for it to end, at most
/// until its deadline; without a database call either way.
async fn held_by_pop_maintenance(broker: &Broker, request: &PopRequest, deadline: Instant) -> bool {
    let maintenance = &broker.maintenance;
    maintenance.pops_paused() && !(request.wait && maintenance.pops_resume_by(deadline).await)
}

async fn observe(broker: &Broker, queue: &Arc<str>) -> Result<u64, ApiError> {
    broker.coordinator.send(Observe { queue: Arc::clone(queue) }).await.map_err(coordinator_gone)
}

fn coordinator_gone(e: actix::MailboxError) -> ApiError {
    ApiError::Internal(format!("the coordinator did not answer: {e}"))
}

async fn pop_once(broker: &Broker, request: &PopRequest) -> Result<Attempt, ApiError> {
    let names = &broker.names;
    let Some(queue_id) = names.queue(&broker.pool, &request.queue).await?.map(|q| q.id) else {
        return Ok(Attempt::Empty { retry_at: None });
    };
    let group: Arc<str> = Arc::from(request.group.as_str());
    // Free partitions to consider claiming: a few more than the pop may take, in case some are
    // claimed by a competing pop in the meantime.
    let claimable = usize::try_from(request.max_partitions.max(4) * 4).unwrap_or(usize::MAX);
    // Which partitions to look at: the one named, or the coordinator's plan for the queue.
    let (client, candidates) = match &request.partition {
        Some(name) => {
            let Some(partition_id) = names.partition(&broker.pool, queue_id, name).await? else {
                return Ok(Attempt::Empty { retry_at: None });
            };
            let client = broker.pool.get().await.map_err(queen_store::StoreError::from)?;
            let found = cursors::candidates(&client, queue_id, Scope::Only(&[partition_id]), &request.group).await?;
            (client, found)
        }
        None => match planned_candidates(broker, queue_id, &group, claimable).await? {
            Some(found) => found,
            None => return Ok(Attempt::Empty { retry_at: None }),
        },
    };
    let retry_at = candidates.iter().filter_map(|c| c.leased_until).min();
    // Free partitions, longest-unserved first.
    let free: Vec<&cursors::Candidate> =
        candidates.iter().filter(|c| c.leased_until.is_none()).take(claimable).collect();
    if free.is_empty() {
        return Ok(Attempt::Empty { retry_at });
    }
    let uncursored: Vec<i64> = free.iter().filter(|c| !c.has_cursor).map(|c| c.partition_id).collect();
    cursors::ensure_cursors(&client, &request.group, &uncursored, request.seed).await?;

    let lease_id = Uuid::now_v7();
    let partition_ids: Vec<i64> = free.iter().map(|c| c.partition_id).collect();
    let claims = cursors::claim(
        &client,
        &ClaimRequest {
            group: &request.group,
            partition_ids: &partition_ids,
            batch: i64::from(request.batch),
            max_partitions: i64::from(if request.partition.is_some() { 1 } else { request.max_partitions }),
            lease_id,
            lease_seconds: request.lease_seconds,
            auto_ack: request.auto_ack,
            broker_id: &broker.broker_id,
        },
    )
    .await?;
    if claims.is_empty() {
        return Ok(Attempt::Empty { retry_at });
    }
    let spans: Vec<Span> =
        claims.iter().map(|c| Span { partition_id: c.partition_id, first: c.first, last: c.last }).collect();
    let segments = log::read_spans(&client, &spans).await?;
    drop(client);

    let names_by_id: HashMap<i64, Arc<str>> =
        free.iter().map(|c| (c.partition_id, Arc::from(c.partition.as_str()))).collect();
    let attempts: HashMap<i64, (i64, i64, i32)> =
        claims.iter().map(|c| (c.partition_id, (c.first, c.last, c.delivery_attempt))).collect();
    let mut messages = Vec::new();
    for segment in &segments {
        let Some(&(first, last, delivery_attempt)) = attempts.get(&segment.partition_id) else { continue };
        let partition = names_by_id.get(&segment.partition_id).cloned().unwrap_or_else(|| Arc::from(""));
        for (index, frame) in segment.frames.frames().enumerate() {
            let offset = segment.base_offset + index as i64;
            if offset < first || offset > last {
                continue;
            }
            let frame = frame.map_err(|e| corrupt(segment.partition_id, segment.base_offset, e))?;
            let json = String::from_utf8(frame.payload.to_vec())
                .map_err(|_| ApiError::Internal(format!("message at offset {offset} is not UTF-8 JSON")))?;
            let data = RawValue::from_string(json)
                .map_err(|e| ApiError::Internal(format!("message at offset {offset} is not JSON: {e}")))?;
            messages.push(DeliveredMessage {
                message_id: frame.message_id,
                transaction_id: frame.transaction_id.to_owned(),
                trace_id: frame.trace_id,
                partition_id: segment.partition_id,
                partition: Arc::clone(&partition),
                data,
                created_at: segment.created_at,
                offset,
                delivery_attempt,
            });
        }
    }

    let metrics = &broker.metrics;
    metrics.messages_delivered.with_label_values(&[&request.queue]).inc_by(messages.len() as u64);
    let bytes: usize = messages.iter().map(|m| m.data.get().len()).sum();
    metrics.bytes_delivered.with_label_values(&[&request.queue]).inc_by(bytes as u64);
    if !request.auto_ack {
        metrics.leases_granted.inc_by(claims.len() as u64);
    }
    metrics.leases_expired.inc_by(claims.iter().filter(|c| c.took_over_expired_lease).count() as u64);
    Ok(Attempt::Delivered(Delivery {
        lease_id: (!request.auto_ack).then_some(lease_id),
        partitions_claimed: claims.len(),
        messages,
        paused: false,
    }))
}

/// The partitions with work for the group that a queue-wide pop considers, as the coordinator
/// plans them, with the connection that looked; `None` when the plan says nothing can be pending
/// (the database is not touched). A round of candidates that are all leased to other consumers
/// is followed by the next round, until one has a free partition or the whole view was looked at,
/// so a pop never waits on leases while another candidate is free.
async fn planned_candidates(
    broker: &Broker,
    queue_id: i64,
    group: &Arc<str>,
    limit: usize,
) -> Result<Option<(deadpool_postgres::Object, Vec<cursors::Candidate>)>, ApiError> {
    let plan_pop = || broker.coordinator.send(PlanPop { queue_id, group: Arc::clone(group), limit });
    let mut plan = plan_pop().await.map_err(coordinator_gone)?;
    let budget = match &plan {
        PopPlan::Candidates { partitions, .. } if partitions.is_empty() => return Ok(None),
        PopPlan::Candidates { view_size, .. } => *view_size,
        PopPlan::Full { .. } => 0,
    };
    let client = broker.pool.get().await.map_err(queen_store::StoreError::from)?;
    let (mut found, mut looked) = (Vec::new(), 0);
    loop {
        match plan {
            PopPlan::Full { ticket, scan } => {
                let scanned = cursors::candidates(&client, queue_id, Scope::All, group).await?;
                let pending = scanned.iter().map(|c| c.partition_id).collect();
                broker.coordinator.do_send(ScanDone { ticket, scan, group: Arc::clone(group), pending });
                return Ok(Some((client, scanned)));
            }
            PopPlan::Candidates { ticket, as_of, partitions, .. } => {
                let checked = cursors::candidates(&client, queue_id, Scope::Only(&partitions), group).await?;
                let pending = checked.iter().map(|c| c.partition_id).collect();
                let any_free = checked.iter().any(|c| c.leased_until.is_none());
                looked += partitions.len();
                let group = Arc::clone(group);
                broker.coordinator.do_send(Checked { ticket, as_of, queue_id, group, checked: partitions, pending });
                found.extend(checked);
                if any_free || looked >= budget {
                    return Ok(Some((client, found)));
                }
            }
        }
        plan = plan_pop().await.map_err(coordinator_gone)?;
        if matches!(&plan, PopPlan::Candidates { partitions, .. } if partitions.is_empty()) {
            return Ok(Some((client, found)));
        }
    }
}

fn corrupt(partition_id: i64, base_offset: i64, source: queen_log::DecodeError) -> ApiError {
    ApiError::from(queen_store::StoreError::CorruptSegment { partition_id, base_offset, source })
}
