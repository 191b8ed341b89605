//! Announcing messages made available by this broker: to its own coordinator at once, and to the
//! rest of the fleet after the write committed.
//!
//! The fleet hears through `NOTIFY`, sent by one task per broker: announcements that arrive while
//! a send is under way, or within a few milliseconds after it, wait, identical ones once, and all
//! go out in the next statement. So a busy partition costs one notice per burst, not one per
//! push, and no push transaction holds PostgreSQL's notification lock or waits on the notice's WAL
//! flush.
//!
//! With a pool of [`KEEP_FROM_POOL_SIZE`] connections or more, the task keeps one of them for
//! this, and the LISTEN connection ignores the notices sent on it ([`Announcer::own_sender`]): they
//! tell this broker what it already knows, and each would wake the queue's parked pops once more
//! for nothing. A smaller pool is left whole to the requests (a pool of one would otherwise be
//! taken for good), at the price of those extra wakes.
//!
//! A notice can now be lost where it could not before: the broker dies between the commit and the
//! send, or PostgreSQL refuses the send (it is retried while the broker lives). Nothing is lost
//! with it: other brokers find the messages on their next scan, at the latest when their view of
//! the queue is re-verified (`pop.scan_refresh_seconds`), and their parked pops look again when
//! they time out.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use queen_store::Pool;
use queen_store::events::{self, Event};
use tokio::sync::Notify;

use crate::actors::coordinator::{CoordinatorMailbox, DataAvailable};
use crate::backoff::Backoff;

/// The least time between two sends: what gathers meanwhile goes in one statement, so a busy
/// broker sends at most a few hundred a second, and another broker hears of a push at most this
/// much later than it would have.
const MIN_GAP: Duration = Duration::from_millis(5);

/// The smallest pool the task keeps a connection of.
pub const KEEP_FROM_POOL_SIZE: usize = 4;

/// Most distinct notices kept while PostgreSQL is away; past it new ones are dropped (see the
/// module's comment for what that costs).
const MAX_PENDING: usize = 100_000;

/// Hands announcements to the coordinator and to the fleet.
#[derive(Clone)]
pub struct Announcer {
    coordinator: CoordinatorMailbox,
    fleet: Arc<Pending>,
}

#[derive(Default)]
struct Pending {
    notices: Mutex<HashSet<String>>,
    ready: Notify,
    /// The backend process of the connection the notices are sent on (0 while there is none).
    sender_pid: AtomicI32,
    /// The kept connection is to be replaced before the next send (see [`Announcer::renew`]).
    renew: AtomicBool,
}

impl Announcer {
    /// Starts the task that sends fleet notices on connections of `pool`. Must run inside an
    /// actix system.
    pub fn start(coordinator: CoordinatorMailbox, pool: Pool) -> Self {
        let fleet = Arc::new(Pending::default());
        let keep = pool.status().max_size >= KEEP_FROM_POOL_SIZE;
        actix::spawn(keep_sending(pool, Arc::clone(&fleet), keep));
        Self { coordinator, fleet }
    }

    /// Whether a notice from this backend process is one of this announcer's own.
    pub fn own_sender(&self, pid: i32) -> bool {
        pid != 0 && self.fleet.sender_pid.load(Ordering::Relaxed) == pid
    }

    /// LISTEN was lost, and the kept connection most likely with it, unnoticed until it next
    /// sends: its process id is let go at once, since a new session of the database (another
    /// broker's, after a restart numbers processes again) may be given it, and its notices would
    /// be taken for this broker's own and dropped.
    pub fn renew(&self) {
        self.fleet.sender_pid.store(0, Ordering::Relaxed);
        self.fleet.renew.store(true, Ordering::Relaxed);
    }

    /// Messages became available on the partition through a write of this broker that has
    /// committed.
    pub fn announce(&self, available: DataAvailable) {
        let event = Event::Available {
            queue_id: available.queue_id,
            partition_id: available.partition_id,
            queue: available.queue.to_string(),
        };
        self.coordinator.announce(available);
        {
            let mut notices = self.fleet.notices.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if notices.len() < MAX_PENDING {
                notices.insert(event.encode());
            } else {
                tracing::warn!("fleet notices are not being sent; another broker learns of this push on its next scan");
            }
        }
        self.fleet.ready.notify_one();
    }
}

/// Sends what gathers, on a connection kept between sends when `keep`; a kept one goes back to the
/// pool (which discards a broken one) after a failure.
async fn keep_sending(pool: Pool, fleet: Arc<Pending>, keep: bool) {
    let mut backoff = Backoff::default();
    let mut connection: Option<deadpool_postgres::Object> = None;
    loop {
        fleet.ready.notified().await;
        let notices: Vec<String> = {
            let mut pending = fleet.notices.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            pending.drain().collect()
        };
        if notices.is_empty() {
            continue;
        }
        let sent = async {
            if !keep {
                let client = pool.get().await.map_err(queen_store::StoreError::from)?;
                return events::publish_after_commit(&client, &notices).await;
            }
            if fleet.renew.swap(false, Ordering::Relaxed) {
                connection = None;
            }
            if connection.is_none() {
                let client = pool.get().await.map_err(queen_store::StoreError::from)?;
                fleet.sender_pid.store(events::session_pid(&client).await?, Ordering::Relaxed);
                connection = Some(client);
            }
            match &connection {
                Some(client) => events::publish_after_commit(client, &notices).await,
                None => Ok(()),
            }
        };
        let sent = sent.await;
        match sent {
            Ok(()) => {
                backoff = Backoff::default();
                tokio::time::sleep(MIN_GAP).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, notices = notices.len(), "could not send fleet notices; retrying");
                connection = None;
                fleet.sender_pid.store(0, Ordering::Relaxed);
                {
                    let mut pending = fleet.notices.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    let room = MAX_PENDING.saturating_sub(pending.len());
                    pending.extend(notices.into_iter().take(room));
                }
                backoff.wait().await;
                fleet.ready.notify_one();
            }
        }
    }
}
