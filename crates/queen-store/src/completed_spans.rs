//! The common acknowledgement in one statement: a consumer completing messages it was delivered,
//! under the lease it was delivered them with.
//!
//! The full rules ([`crate::cursors::acknowledge`]) resolve transaction ids, lock the cursors,
//! apply [`crate::ack_rules`] in Rust and write the cursors back: three statements. When every ack of a
//! cursor in a batch is `completed`, names its lease, and comes with the offset the broker
//! delivered it at, the rules reduce to a condition and an assignment: if the lease is live, every
//! offset lies past the cursor and within what the lease delivered, the cursor moves to the
//! highest (releasing the lease when that is the end of the delivery), and every ack is
//! committed. One `UPDATE` checks the condition and makes the change; the cursors it did not
//! change (a lease that ran out, an ack at or below the cursor, ...) go through the full rules,
//! which find them exactly as they were.

use std::collections::HashMap;

use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::StoreError;
use crate::ack_rules::{AckStatus, AckVerdict, LeaseFence};
use crate::cursors::{AckOutcome, AckRequest, ReleasedWork};

/// The acks of one cursor that may take the one-statement path.
struct Span {
    partition_id: i64,
    group: String,
    lease_id: Uuid,
    low: i64,
    high: i64,
    /// (call, request) of each ack of the cursor.
    acks: Vec<(usize, usize)>,
}

/// What the one-statement path did to a batch of calls.
pub(crate) struct Completed {
    /// Per call, per request: the outcome when the path decided it.
    pub outcomes: Vec<Vec<Option<AckOutcome>>>,
    pub released: Vec<ReleasedWork>,
}

/// The cursors each of whose acks in the whole batch are in one call, `completed`, under one named
/// lease, with their offsets known. A cursor acked by two calls of a batch is left to the full
/// rules, which apply the calls one after the other.
fn eligible(calls: &[Vec<AckRequest>]) -> Vec<Span> {
    let mut spans: HashMap<(i64, &str), Option<Span>> = HashMap::new();
    for (call_index, call) in calls.iter().enumerate() {
        for (request_index, request) in call.iter().enumerate() {
            let key = (request.partition_id, &*request.consumer_group);
            let simple = match (&request.fence, request.offset, request.status) {
                (LeaseFence::Lease(lease), Some(offset), AckStatus::Completed) => Some((*lease, offset)),
                _ => None,
            };
            let entry = spans.entry(key).or_insert_with(|| {
                simple.map(|(lease_id, offset)| Span {
                    partition_id: request.partition_id,
                    group: request.consumer_group.to_string(),
                    lease_id,
                    low: offset,
                    high: offset,
                    acks: Vec::new(),
                })
            });
            let fits = |span: &Span| {
                simple.is_some_and(|(lease, _)| lease == span.lease_id)
                    && span.acks.first().is_none_or(|&(call, _)| call == call_index)
            };
            match (entry.as_mut(), simple) {
                (Some(span), Some((_, offset))) if fits(span) => {
                    span.low = span.low.min(offset);
                    span.high = span.high.max(offset);
                    span.acks.push((call_index, request_index));
                }
                _ => *entry = None,
            }
        }
    }
    let mut spans: Vec<Span> = spans.into_values().flatten().collect();
    // Cursors are locked in the order the full rules lock them, so that the two cannot deadlock.
    spans.sort_by(|a, b| (a.partition_id, &a.group).cmp(&(b.partition_id, &b.group)));
    spans
}

/// Applies the acks that qualify (see the module comment) in one statement, atomic by itself.
pub(crate) async fn commit(client: &impl GenericClient, calls: &[Vec<AckRequest>]) -> Result<Completed, StoreError> {
    let mut done =
        Completed { outcomes: calls.iter().map(|call| vec![None; call.len()]).collect(), released: Vec::new() };
    let spans = eligible(calls);
    if spans.is_empty() {
        return Ok(done);
    }
    let statement = client
        .prepare_cached(
            "UPDATE queen.log_consumers c
                SET committed = u.high,
                    lease_expires_at = CASE WHEN u.high >= c.leased_until THEN NULL ELSE c.lease_expires_at END,
                    retry_count = 0,
                    head_attempts = (c.leased_until > u.high)::int,
                    head_expiries = 0,
                    total_consumed = c.total_consumed + (u.high - c.committed),
                    last_consumed_at = now()
               FROM unnest($1::bigint[], $2::text[], $3::uuid[], $4::bigint[], $5::bigint[])
                    WITH ORDINALITY AS u(partition_id, consumer_group, lease_id, low, high, ord)
               JOIN queen.partitions p ON p.id = u.partition_id
               JOIN queen.queues q ON q.id = p.queue_id
              WHERE c.partition_id = u.partition_id AND c.consumer_group = u.consumer_group
                AND c.lease_id = u.lease_id AND c.lease_expires_at > now()
                AND u.low > c.committed
                AND u.high <= c.leased_until AND u.high <= GREATEST(c.delivered_until, c.committed)
             RETURNING u.ord, c.lease_expires_at IS NULL, p.last_offset, q.id, q.name",
        )
        .await?;
    let partition_ids: Vec<i64> = spans.iter().map(|s| s.partition_id).collect();
    let groups: Vec<&str> = spans.iter().map(|s| s.group.as_str()).collect();
    let leases: Vec<Uuid> = spans.iter().map(|s| s.lease_id).collect();
    let lows: Vec<i64> = spans.iter().map(|s| s.low).collect();
    let highs: Vec<i64> = spans.iter().map(|s| s.high).collect();
    let rows = client.query(&statement, &[&partition_ids, &groups, &leases, &lows, &highs]).await?;
    for row in rows {
        let Some(span) = usize::try_from(row.get::<_, i64>(0) - 1).ok().and_then(|i| spans.get(i)) else { continue };
        let lease_released: bool = row.get(1);
        let last_offset: i64 = row.get(2);
        let queue: String = row.get(4);
        for &(call, request) in &span.acks {
            done.outcomes[call][request] = Some(AckOutcome {
                verdict: AckVerdict::Committed { lease_released },
                committed: Some(span.high),
                queue: Some(queue.clone()),
            });
        }
        if lease_released && span.high < last_offset {
            done.released.push(ReleasedWork { queue_id: row.get(3), partition_id: span.partition_id, queue });
        }
    }
    Ok(done)
}
