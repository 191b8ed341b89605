//! What this broker delivered under each lease it granted: the partitions the lease was granted
//! on, and for each the offset of every transaction id delivered. An ack naming the lease is
//! resolved from it instead of looking the ids up in PostgreSQL, which also lets a batch that
//! completes its deliveries commit in one statement (`queen_store::completed_spans`); a lease
//! extension or a transaction's required lease is looked for on the lease's partitions only, so
//! on a distributed cluster it reaches their shards alone (`docs/scale-out.md`).
//!
//! It is a cache, bounded in bytes: a call that reaches another broker of the fleet, or comes
//! after its entry was evicted, looks the lease up in every partition, and an ack its ids, as
//! before. A lease's entry for a partition goes once acks have resolved every delivery in it, so
//! the cache holds deliveries still waiting for their ack (and those of consumers that never
//! acked, until the bound or the time limit evicts them); an ack sent again after that is looked
//! up like one from another broker. An offset from here is the one the consumer was given; a
//! lookup finds the id's earliest message past the group's cursor, the one delivered too (an id
//! has several only when it was pushed again after its dedup window). When one delivery holds an id
//! twice (pushed again after its window, both messages unconsumed), its ack resolves to the
//! earlier: an ack commits everything up to its message, and the later would commit the messages
//! between the two, unprocessed. The later one is then delivered again once the lease runs out.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use moka::policy::EvictionPolicy;
use moka::sync::Cache;
use queen_store::ack_rules::LeaseFence;
use queen_store::cursors::AckRequest;
use uuid::Uuid;

use super::pop::DeliveredMessage;
use crate::actors::coordinator::ViewStamp;

/// Most bytes of transaction ids and offsets kept: a few thousand deliveries of 100 messages.
const MAX_BYTES: u64 = 4 * 1024 * 1024;

/// An entry outlives any sensible lease; past its lease it resolves acks the rules then refuse.
const KEEP_FOR: Duration = Duration::from_secs(600);

/// Bytes an entry holds besides its transaction ids: the offset and the map's share.
const PER_MESSAGE: usize = 48;

/// A partition claimed up to its end: the offset it had reached, and the view the pop planned
/// from. An ack that commits the group's cursor that far leaves the group nothing there as of
/// that view.
#[derive(Debug)]
pub struct ClaimedToEnd {
    pub end: i64,
    pub queue_id: i64,
    pub group: Arc<str>,
    pub stamp: ViewStamp,
}

/// What one partition delivered under one lease.
struct Delivered {
    /// Transaction id (shared with the delivered message) → offset.
    offsets: HashMap<Arc<str>, i64>,
    /// Deliveries no ack has resolved yet.
    unresolved: AtomicUsize,
    /// Set when the pop took all the partition had.
    to_end: Option<Arc<ClaimedToEnd>>,
}

type Offsets = Arc<Delivered>;

pub struct Deliveries {
    by_lease: Cache<(Uuid, i64), Offsets>,
    /// Every partition each lease was granted on.
    partitions: Cache<Uuid, Arc<Vec<i64>>>,
}

impl Default for Deliveries {
    fn default() -> Self {
        let by_lease = Cache::builder()
            .max_capacity(MAX_BYTES)
            .weigher(|_, offsets: &Offsets| {
                let bytes: usize = offsets.offsets.keys().map(|id| id.len() + PER_MESSAGE).sum();
                u32::try_from(bytes).unwrap_or(u32::MAX)
            })
            .time_to_live(KEEP_FOR)
            // Every delivery is a new key, seen once or twice: frequency-based admission would
            // keep the first deliveries that filled the cache and turn the new ones away.
            .eviction_policy(EvictionPolicy::lru())
            .build();
        let partitions = Cache::builder()
            .max_capacity(MAX_BYTES / 4)
            .weigher(|_, partitions: &Arc<Vec<i64>>| {
                u32::try_from(partitions.len() * 8 + PER_MESSAGE).unwrap_or(u32::MAX)
            })
            .time_to_live(KEEP_FOR)
            .eviction_policy(EvictionPolicy::lru())
            .build();
        Self { by_lease, partitions }
    }
}

impl Deliveries {
    /// Remembers what a pop delivered under `lease_id` on the partitions it `claimed`, each with
    /// where it was claimed to its end if it was (a pop over several queues records once per
    /// queue, under one lease).
    pub fn record(&self, lease_id: Uuid, claimed: &[(i64, Option<Arc<ClaimedToEnd>>)], messages: &[DeliveredMessage]) {
        let mut partitions = self.partitions.get(&lease_id).map(|known| known.to_vec()).unwrap_or_default();
        partitions.extend(claimed.iter().map(|(partition_id, _)| *partition_id));
        self.partitions.insert(lease_id, Arc::new(partitions));
        let mut by_partition: HashMap<i64, HashMap<Arc<str>, i64>> = HashMap::new();
        for message in messages {
            let offsets = by_partition.entry(message.partition_id).or_default();
            offsets
                .entry(Arc::clone(&message.transaction_id))
                .and_modify(|offset| *offset = (*offset).min(message.offset))
                .or_insert(message.offset);
        }
        for (partition_id, offsets) in by_partition {
            let unresolved = AtomicUsize::new(offsets.len());
            let to_end = claimed.iter().find(|(claimed, _)| *claimed == partition_id).and_then(|(_, end)| end.clone());
            self.by_lease.insert((lease_id, partition_id), Arc::new(Delivered { offsets, unresolved, to_end }));
        }
    }

    /// Every partition `lease_id` was granted on, when this broker granted it and still knows.
    pub fn partitions_of(&self, lease_id: Uuid) -> Option<Arc<Vec<i64>>> {
        self.partitions.get(&lease_id)
    }

    /// Gives each ack that names a lease this broker delivered under the offset its transaction
    /// id was delivered at; returns, once per partition, where the acked partitions that were
    /// claimed to their end had reached.
    pub fn resolve(&self, requests: &mut [AckRequest]) -> Vec<(i64, Arc<ClaimedToEnd>)> {
        let mut to_end: Vec<(i64, Arc<ClaimedToEnd>)> = Vec::new();
        for request in requests {
            let LeaseFence::Lease(lease_id) = request.fence else { continue };
            let key = (lease_id, request.partition_id);
            let Some(delivered) = self.by_lease.get(&key) else { continue };
            request.offset = delivered.offsets.get(&*request.transaction_id).copied();
            if let Some(end) = &delivered.to_end
                && request.offset.is_some()
                && !to_end.iter().any(|(partition_id, _)| *partition_id == request.partition_id)
            {
                to_end.push((request.partition_id, Arc::clone(end)));
            }
            if request.offset.is_some()
                && delivered.unresolved.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    == Ok(1)
            {
                self.by_lease.invalidate(&key);
            }
        }
        to_end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use queen_store::ack_rules::AckStatus;

    fn delivered(partition_id: i64, offset: i64) -> DeliveredMessage {
        DeliveredMessage {
            message_id: Uuid::now_v7(),
            transaction_id: format!("{partition_id}-{offset}-{}", Uuid::now_v7()).into(),
            trace_id: None,
            producer: None,
            queue: Arc::from("q"),
            partition_id,
            partition: Arc::from("p"),
            data: serde_json::value::RawValue::from_string("1".into()).expect("JSON"),
            created_at: chrono::Utc::now(),
            offset,
            delivery_attempt: 1,
        }
    }

    fn ack_of(lease_id: Uuid, message: &DeliveredMessage) -> AckRequest {
        AckRequest {
            partition_id: message.partition_id,
            transaction_id: Arc::clone(&message.transaction_id),
            offset: None,
            status: AckStatus::Completed,
            fence: LeaseFence::Lease(lease_id),
            consumer_group: "g".into(),
            error: None,
        }
    }

    #[test]
    fn the_newest_deliveries_resolve_once_the_map_is_full() {
        let deliveries = Deliveries::default();
        // Several times what the map holds, one lease per pop of 100 messages, never acked (the
        // consumers went away).
        for pop in 0..2_000 {
            let lease_id = Uuid::now_v7();
            let messages: Vec<DeliveredMessage> = (0..100).map(|i| delivered(pop % 32, pop * 100 + i)).collect();
            deliveries.record(lease_id, &[(pop % 32, None)], &messages);
            deliveries.by_lease.run_pending_tasks();
        }
        let lease_id = Uuid::now_v7();
        let messages: Vec<DeliveredMessage> = (0..100).map(|i| delivered(7, 1_000_000 + i)).collect();
        deliveries.record(lease_id, &[(7, None)], &messages);
        deliveries.by_lease.run_pending_tasks();
        deliveries.partitions.run_pending_tasks();
        let mut acks: Vec<AckRequest> = messages.iter().map(|m| ack_of(lease_id, m)).collect();
        deliveries.resolve(&mut acks);
        let resolved = acks.iter().filter(|a| a.offset.is_some()).count();
        assert_eq!(resolved, 100, "the latest pop's acks are resolved from the map");
        assert_eq!(deliveries.partitions_of(lease_id).as_deref(), Some(&vec![7]));
    }

    #[test]
    fn acks_of_a_partition_claimed_to_its_end_say_so_once_per_call() {
        let deliveries = Deliveries::default();
        let lease_id = Uuid::now_v7();
        let stamp = ViewStamp { ticket: 1, as_of: 9 };
        let to_end = Arc::new(ClaimedToEnd { end: 3, queue_id: 1, group: Arc::from("g"), stamp });
        // Partition 5 was taken to its end, 6 was not.
        let messages: Vec<DeliveredMessage> =
            (1..=3).map(|offset| delivered(5, offset)).chain((1..=2).map(|offset| delivered(6, offset))).collect();
        deliveries.record(lease_id, &[(5, Some(to_end)), (6, None)], &messages);
        let mut acks: Vec<AckRequest> = messages.iter().map(|m| ack_of(lease_id, m)).collect();
        let reached = deliveries.resolve(&mut acks);
        assert_eq!(reached.iter().map(|(partition, end)| (*partition, end.end)).collect::<Vec<_>>(), [(5, 3)]);
        assert_eq!(reached[0].1.stamp, stamp);
        // Acks of another lease say nothing of this one.
        let mut stranger = vec![ack_of(Uuid::now_v7(), &messages[0])];
        assert!(deliveries.resolve(&mut stranger).is_empty());
    }

    #[test]
    fn an_id_delivered_twice_resolves_to_its_earlier_message() {
        let deliveries = Deliveries::default();
        let lease_id = Uuid::now_v7();
        let mut messages: Vec<DeliveredMessage> = (1..=10).map(|offset| delivered(5, offset)).collect();
        messages[9].transaction_id = Arc::clone(&messages[2].transaction_id);
        deliveries.record(lease_id, &[(5, None)], &messages);
        let mut acks = vec![ack_of(lease_id, &messages[9])];
        deliveries.resolve(&mut acks);
        assert_eq!(acks[0].offset, Some(3), "not 10, which would commit 4 to 9 unprocessed");
    }

    #[test]
    fn an_entry_goes_once_acks_have_resolved_every_delivery_in_it() {
        let deliveries = Deliveries::default();
        let lease_id = Uuid::now_v7();
        let messages: Vec<DeliveredMessage> = (1..=3).map(|offset| delivered(5, offset)).collect();
        deliveries.record(lease_id, &[(5, None)], &messages);
        let mut first_two: Vec<AckRequest> = messages[..2].iter().map(|m| ack_of(lease_id, m)).collect();
        deliveries.resolve(&mut first_two);
        assert_eq!(first_two.iter().map(|a| a.offset).collect::<Vec<_>>(), [Some(1), Some(2)]);
        // An id the lease did not deliver resolves nothing and counts nothing.
        let mut stranger = vec![ack_of(lease_id, &delivered(5, 99))];
        deliveries.resolve(&mut stranger);
        assert_eq!(stranger[0].offset, None);
        deliveries.by_lease.run_pending_tasks();
        assert!(deliveries.by_lease.get(&(lease_id, 5)).is_some(), "one delivery still waits for its ack");
        let mut last = vec![ack_of(lease_id, &messages[2])];
        deliveries.resolve(&mut last);
        assert_eq!(last[0].offset, Some(3));
        deliveries.by_lease.run_pending_tasks();
        assert!(deliveries.by_lease.get(&(lease_id, 5)).is_none(), "every delivery was acked");
        // Sent again, the ack is left to the database lookup.
        let mut again = vec![ack_of(lease_id, &messages[2])];
        deliveries.resolve(&mut again);
        assert_eq!(again[0].offset, None);
        assert_eq!(deliveries.partitions_of(lease_id).as_deref(), Some(&vec![5]), "the lease's partitions stay");
    }
}
