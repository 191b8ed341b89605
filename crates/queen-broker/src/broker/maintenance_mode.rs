//! Maintenance mode: two switches an operator turns on while PostgreSQL is being worked on.
//!
//! - **Push maintenance**: pushes are accepted into this broker's journal instead of the log
//!   (`super::buffer`), and replayed into the log when it ends.
//! - **Pop maintenance**: pops answer at once, empty and marked paused; a long poll waits for it to
//!   end (then pops as usual) or for its timeout. Nothing else (acks, leases, ...) is affected.
//!
//! The switches are kept in PostgreSQL (`queen.system_state`), so they hold for the whole fleet
//! and survive restarts. A change is published to every broker in the transaction that makes it,
//! and the notice carries the whole new state, which brokers apply as it arrives, without asking
//! the database (it may be about to go away for its maintenance). Brokers read the state at
//! start-up and whenever their LISTEN connection is restored, since notices may have been missed.
//! Every state has a revision, and an older one never replaces a newer one, in whatever order a
//! notice and a read arrive, with one exception: two reads in a row older than what the broker
//! holds, with no state applied from the start of the first to the end of the second, say the
//! database went back (restored from a backup, or failed over to a standby that missed the
//! latest change), and the second is applied. The push and pop paths read the switches from
//! atomics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use queen_store::system_state::{self, Mode, Modes};
use queen_store::{Pool, StoreError};
use tokio::sync::watch;

use super::Broker;
use super::BrokerError;
use crate::actors::push_journal::PushRoute;
use crate::backoff::Backoff;
use crate::metrics::{GaugeHeld, Metrics};

/// The switches in effect, and how many states were put into effect so far.
#[derive(Debug, Clone, Copy)]
struct Held {
    modes: Modes,
    applied: u64,
}

/// The switches as this broker applies them.
pub struct MaintenanceMode {
    held: Mutex<Held>,
    route: Arc<PushRoute>,
    pops_paused: AtomicBool,
    /// Long polls held by pop maintenance wait for this to turn false.
    pops_held: watch::Sender<bool>,
    /// Whether push maintenance is on; the drain waits for it to end.
    push_maintenance: watch::Sender<bool>,
    metrics: Arc<Metrics>,
}

impl MaintenanceMode {
    /// The switches as read at start-up. `route` is shared with the journal.
    pub fn new(modes: Modes, route: Arc<PushRoute>, metrics: Arc<Metrics>) -> Self {
        let mode = MaintenanceMode {
            held: Mutex::new(Held { modes, applied: 0 }),
            route,
            pops_paused: AtomicBool::new(false),
            pops_held: watch::Sender::new(false),
            push_maintenance: watch::Sender::new(false),
            metrics,
        };
        mode.apply(modes);
        mode
    }

    /// Puts a state into effect, unless a newer one already is.
    pub fn apply(&self, modes: Modes) {
        self.put_into_effect(modes, None);
    }

    /// Puts `modes` into effect unless a newer revision is. With `replacing`, instead only if
    /// what is in effect is still that, whatever the revisions.
    fn put_into_effect(&self, modes: Modes, replacing: Option<Held>) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let allowed = match replacing {
            None => modes.revision >= held.modes.revision,
            Some(seen) => seen.applied == held.applied,
        };
        if !allowed {
            return false;
        }
        if held.modes != modes {
            tracing::info!(
                push = modes.push_maintenance,
                pop = modes.pop_maintenance,
                revision = modes.revision,
                "maintenance mode"
            );
        }
        *held = Held { modes, applied: held.applied + 1 };
        self.route.set_maintenance(modes.push_maintenance);
        self.pops_paused.store(modes.pop_maintenance, Ordering::SeqCst);
        self.pops_held.send_replace(modes.pop_maintenance);
        self.push_maintenance.send_replace(modes.push_maintenance);
        let gauge = &self.metrics.maintenance_mode;
        gauge.with_label_values(&["push"]).set(i64::from(modes.push_maintenance));
        gauge.with_label_values(&["pop"]).set(i64::from(modes.pop_maintenance));
        true
    }

    /// Reads the switches from PostgreSQL and applies them, retrying until it can (after the
    /// LISTEN connection came back, notices may have been missed, and the database may be
    /// another one).
    pub async fn refresh(&self, pool: &Pool) {
        let mut backoff = Backoff::default();
        // What was in effect when a read came back older than it.
        let mut older_than: Option<Held> = None;
        loop {
            let before = self.held();
            let modes = match read(pool).await {
                Ok(modes) => modes,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the maintenance switches; retrying");
                    backoff.wait().await;
                    continue;
                }
            };
            if modes.revision >= before.modes.revision {
                return self.apply(modes);
            }
            // Older than what was in effect: a change may have been applied while the read ran,
            // so read again. Older again, with nothing applied since the first such read began,
            // the database went back.
            let went_back = older_than.is_some_and(|seen| seen.applied == before.applied);
            if went_back && self.put_into_effect(modes, Some(before)) {
                tracing::warn!(
                    revision = modes.revision,
                    "the database holds older maintenance switches than this broker did (restored, or failed \
                     over to a standby that missed a change): applying them"
                );
                return;
            }
            older_than = Some(before);
        }
    }

    fn held(&self) -> Held {
        *self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn modes(&self) -> Modes {
        self.held().modes
    }

    /// Whether pushes go to the journal: push maintenance is on, or the journal still holds pushes.
    pub fn pushes_to_journal(&self) -> bool {
        self.route.to_journal()
    }

    pub fn pops_paused(&self) -> bool {
        self.pops_paused.load(Ordering::SeqCst)
    }

    /// Waits for pop maintenance to end: `true` when it did (or the broker is shutting down),
    /// `false` at `deadline`.
    pub async fn pops_resume_by(&self, deadline: Instant) -> bool {
        let mut held = self.pops_held.subscribe();
        let _counted = GaugeHeld::count(&self.metrics.paused_long_polls);
        let resumed = tokio::time::timeout_at(deadline.into(), held.wait_for(|held| !held)).await;
        matches!(resumed, Ok(Ok(_)))
    }

    /// Lets every long poll held by pop maintenance go (the broker is shutting down).
    pub fn release_held_pops(&self) {
        self.pops_held.send_replace(false);
    }

    /// Push maintenance, as it changes.
    pub fn push_maintenance(&self) -> watch::Receiver<bool> {
        self.push_maintenance.subscribe()
    }
}

/// The switches as committed in PostgreSQL.
pub async fn read(pool: &Pool) -> Result<Modes, StoreError> {
    let client = pool.get().await?;
    system_state::read(&client).await
}

/// What `/api/v1/system/maintenance` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaintenanceStatus {
    pub modes: Modes,
    /// Messages in this broker's journal, not yet in the log.
    pub buffered_messages: u64,
    /// The journal's last write succeeded and its last drain attempt reached the log.
    pub buffer_healthy: bool,
    pub buffer_directory: String,
}

pub async fn status(broker: &Broker) -> Result<MaintenanceStatus, BrokerError> {
    let journal = broker.journal.status().await.map_err(|e| BrokerError::Internal(e.to_string()))?;
    Ok(MaintenanceStatus {
        modes: broker.maintenance.modes(),
        buffered_messages: journal.buffered_messages,
        buffer_healthy: journal.healthy,
        buffer_directory: broker.journal.dir.display().to_string(),
    })
}

/// Turns a switch on or off for the whole fleet; this broker applies it before answering.
pub async fn set(broker: &Broker, mode: Mode, enabled: bool) -> Result<MaintenanceStatus, BrokerError> {
    let setting = async |c: &mut deadpool_postgres::Object| system_state::set(c, mode, enabled).await;
    let modes = broker.write_within("a maintenance switch", setting).await?.1?;
    broker.maintenance.apply(modes);
    status(broker).await
}
