//! The LISTEN connection's keeper: connects, hands every fleet event to whoever it concerns (the
//! coordinator, the queue cache, the registrations seen), and when the connection is lost tells
//! the coordinator (which stops trusting what it knew), drops the cached segments and reconnects
//! with a backoff.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use moka::sync::Cache;
use queen_store::events::Event;
use queen_store::listen::listen;
use queen_store::segment_cache::SegmentCache;

use crate::actors::coordinator::{CoordinatorMailbox, DataAvailable, Forget};
use crate::backoff::Backoff;
use crate::broker::NamesCache;
use crate::broker::maintenance_mode::MaintenanceMode;
use crate::metrics::Metrics;
use crate::services::announcer::Announcer;

/// Who acts on fleet events.
pub struct FleetListeners {
    /// Whether LISTEN is in effect, for parked pops (`Broker::hears_fleet`).
    pub hears_fleet: Arc<AtomicBool>,
    pub coordinator: CoordinatorMailbox,
    pub names: Arc<NamesCache>,
    /// The broker's (queue, group) registrations seen, dropped when another broker deletes or
    /// resets the group, or changes or deletes the queue: a group of the same name starts over.
    pub registered: Cache<(String, String), bool>,
    pub segments: Arc<SegmentCache>,
    pub metrics: Arc<Metrics>,
    pub maintenance: Arc<MaintenanceMode>,
    /// For re-reading what notices may have been missed.
    pub pool: queen_store::Pool,
    /// Whose notices are this broker's own, already delivered.
    pub announcer: Announcer,
}

impl FleetListeners {
    /// Acts on a notice, then counts it: once counted, what it changed here is in effect.
    fn deliver(&self, event: Event) {
        match event {
            Event::Available { queue_id, partition_id, queue } => {
                self.coordinator.announce(DataAvailable { queue: Arc::from(queue), queue_id, partition_id });
            }
            Event::Reset { queue_id, group } => {
                let group: Arc<str> = Arc::from(group);
                let reset = Arc::clone(&group);
                let _ = self.registered.invalidate_entries_if(move |(_, registered), _| **registered == *reset);
                self.coordinator.forget(Forget { queue_id, queue: None, group });
            }
            Event::QueueChanged { queue, .. } => {
                let changed = queue.clone();
                let _ = self.registered.invalidate_entries_if(move |(registered, _), _| *registered == changed);
                self.names.forget_queue(&queue);
                self.coordinator.wake_queue(Arc::from(queue.as_str()));
                self.forget_if_deleted(queue);
            }
            Event::ModesChanged(modes) => self.maintenance.apply(modes),
        }
        self.metrics.notices_received.inc();
    }

    /// Removes the metric series of a queue that was configured or deleted, if it is gone.
    fn forget_if_deleted(&self, queue: String) {
        let (names, pool, metrics) = (Arc::clone(&self.names), self.pool.clone(), Arc::clone(&self.metrics));
        actix::spawn(async move {
            if let Ok(None) = names.queue(&pool, &queue).await {
                metrics.forget_queue(&queue);
            }
        });
    }

    /// LISTEN was lost, often with the database (a failover): the pool's next connection may reach
    /// another one, whose partitions hold other messages at offsets the cache knows, before LISTEN
    /// is back to clear it.
    fn lost(&self) {
        self.hears_fleet.store(false, Ordering::Relaxed);
        self.metrics.fleet_listening.set(0);
        self.announcer.renew();
        self.segments.clear();
        self.coordinator.listen_lost();
    }

    /// LISTEN is in effect again: whatever was announced while it was down may have been missed,
    /// and the database may not be the one it was (restored from a backup, its identities
    /// restarted), so no segment read before is trusted.
    fn restored(&self) {
        self.hears_fleet.store(true, Ordering::Relaxed);
        self.metrics.fleet_listening.set(1);
        self.names.forget_all();
        self.registered.invalidate_all();
        self.segments.clear();
        self.coordinator.listen_restored();
        let (maintenance, pool) = (Arc::clone(&self.maintenance), self.pool.clone());
        actix::spawn(async move { maintenance.refresh(&pool).await });
    }
}

/// Runs until the broker stops. Connects to `pg` as the pool does, TLS included.
pub async fn keep_listening(pg: queen_store::tls::PgTarget, listeners: FleetListeners) {
    let mut backoff = Backoff::default();
    loop {
        match listen(&pg).await {
            Ok(mut listening) => {
                backoff.reset();
                // Once LISTEN took effect: a push after it arrives as a notice, one before it is
                // found by the scans that follow (the coordinator drops every view).
                listeners.restored();
                while let Some(notice) = listening.events.recv().await {
                    if !listeners.announcer.own_sender(notice.sender_pid) {
                        listeners.deliver(notice.event);
                    }
                }
                tracing::warn!("lost the LISTEN connection; reconnecting");
                listeners.lost();
            }
            Err(e) => tracing::warn!(error = %e, "cannot open the LISTEN connection; retrying"),
        }
        backoff.wait().await;
    }
}
