//! Announcing messages made available by this broker: to its own coordinator at once, and to the
//! rest of the fleet after the write committed.
//!
//! The fleet hears through `NOTIFY`, sent by one task per broker: announcements that arrive while
//! a send is under way wait, identical ones once, and all go out in the next statement. So a busy
//! partition costs one notice per burst, not one per push, and no push transaction holds
//! PostgreSQL's notification lock or waits on the notice's WAL flush.
//!
//! A notice can now be lost where it could not before: the broker dies between the commit and the
//! send, or PostgreSQL refuses the send (it is retried while the broker lives). Nothing is lost
//! with it: other brokers find the messages on their next scan, at the latest when their view of
//! the queue is re-verified (`pop.scan_refresh_seconds`), and their parked pops look again when
//! they time out.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use queen_store::Pool;
use queen_store::events::{self, Event};
use tokio::sync::Notify;

use crate::actors::coordinator::{CoordinatorMailbox, DataAvailable};
use crate::backoff::Backoff;

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
}

impl Announcer {
    /// Starts the task that sends fleet notices on connections of `pool`. Must run inside an
    /// actix system.
    pub fn start(coordinator: CoordinatorMailbox, pool: Pool) -> Self {
        let fleet = Arc::new(Pending::default());
        actix::spawn(keep_sending(pool, Arc::clone(&fleet)));
        Self { coordinator, fleet }
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

async fn keep_sending(pool: Pool, fleet: Arc<Pending>) {
    let mut backoff = Backoff::default();
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
            let client = pool.get().await.map_err(queen_store::StoreError::from)?;
            events::publish_after_commit(&client, &notices).await
        };
        match sent.await {
            Ok(()) => backoff = Backoff::default(),
            Err(e) => {
                tracing::warn!(error = %e, notices = notices.len(), "could not send fleet notices; retrying");
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
