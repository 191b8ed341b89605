//! The broker's operations, between the HTTP edge and the store: push, pop, ack.

pub mod ack;
pub mod groups;
pub mod maintenance_mode;
pub mod messages;
mod names_cache;
pub mod pop;
pub mod push;
pub mod push_buffer;
pub mod queue_options;
pub mod queues;
pub mod transaction;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use moka::sync::Cache;
use queen_store::Pool;

use crate::actors::coordinator::{Coordinator, CoordinatorMailbox, CoordinatorSettings};
use crate::actors::group_leases::Groups;
use crate::actors::partition_writer::{WriterDeps, WriterLimits, Writers};
use crate::actors::push_journal::{FoundJournal, Journal, PushJournal, PushRoute};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::pressure::{Bound, Limited};
use crate::services::listener::{FleetListeners, keep_listening};
use crate::services::maintenance::{Maintenance, MaintenanceSettings};
use maintenance_mode::MaintenanceMode;
use queen_log::Cipher;
use queen_store::system_state::Modes;

pub use names_cache::NamesCache;

/// Everything a request handler needs, shared by all HTTP workers.
pub struct Broker {
    pub pool: Pool,
    pub config: Arc<Config>,
    pub names: Arc<NamesCache>,
    /// (queue, group) pairs whose registration this broker has written or seen.
    pub registered: Cache<(String, String), ()>,
    pub writers: Writers,
    pub groups: Groups,
    pub coordinator: CoordinatorMailbox,
    pub metrics: Arc<Metrics>,
    /// Bytes of request bodies held across the broker (`limits.body_bytes_in_flight`).
    pub body_bytes: Arc<Bound>,
    /// Long polls parked across the broker (`limits.parked_long_polls`).
    pub long_polls: Arc<Bound>,
    pub maintenance: Arc<MaintenanceMode>,
    /// The key of encrypted queues (`encryption.key`), when configured.
    pub cipher: Option<Arc<Cipher>>,
    /// Where pushes wait during push maintenance.
    pub journal: Journal,
    /// Identifies this broker in the leases it grants.
    pub broker_id: String,
    /// Where the database is, for connections that must not come from the pool.
    pg_config: tokio_postgres::Config,
    /// When `/metrics` last read consumer lag from the database.
    pub lag_refreshed_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// Namespace pops so far: queues of equal priority take turns at being served first.
    pub namespace_pops: AtomicU64,
    shutting_down: AtomicBool,
}

impl Broker {
    /// Whether the broker is shutting down: it is not ready, and long polls answer at once.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Starts the graceful shutdown: parked long polls are woken and answer empty.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.coordinator.wake_all();
        self.maintenance.release_held_pops();
    }

    /// Releases the live leases this broker granted, announcing the partitions, so that other
    /// brokers' consumers take the work at once instead of after the lease time. How many.
    ///
    /// Runs at shutdown over a connection of its own, opened on the calling runtime: the shared
    /// pool's connections opened by HTTP workers are driven by the workers' runtimes, which are
    /// stopping by then, and may close under the statement.
    pub async fn release_leases(&self) -> Result<u64, queen_store::StoreError> {
        let settings = queen_store::pool::PoolSettings { max_size: 1, ..self.config.database.pool_settings() };
        let pool = queen_store::pool::build_pool(self.pg_config.clone(), &settings)?;
        let mut client = pool.get().await?;
        let tx = client.transaction().await?;
        let released = queen_store::cursors::release_leases_of(&tx, &self.broker_id).await?;
        tx.commit().await?;
        Ok(released)
    }

    /// Wires the actors and starts the LISTEN connection (on `pg`), with the maintenance switches
    /// as read at start-up, the push journal as found, and the encryption key. Must run inside an
    /// actix system.
    pub fn new(
        pool: Pool,
        pg: tokio_postgres::Config,
        config: Arc<Config>,
        broker_id: String,
        modes: Modes,
        journal: FoundJournal,
        cipher: Option<Arc<Cipher>>,
    ) -> Self {
        let metrics = Arc::new(Metrics::new());
        let route = Arc::new(PushRoute::default());
        let journal = Journal::start(PushJournal::new(journal, Arc::clone(&route), Arc::clone(&metrics)));
        let maintenance_mode = Arc::new(MaintenanceMode::new(modes, route, Arc::clone(&metrics)));
        let view_max_age = Duration::from_secs(config.pop.scan_refresh_seconds.max(1));
        let settings = CoordinatorSettings { hot_list: config.pop.hot_list, view_max_age };
        let limits = &config.limits;
        let coordinator = CoordinatorMailbox::start(
            Coordinator::new(settings, Arc::clone(&metrics)),
            limits.coordinator_messages,
            &metrics,
        );
        let names = Arc::new(NamesCache::new());
        let listeners = FleetListeners {
            coordinator: coordinator.clone(),
            names: Arc::clone(&names),
            metrics: Arc::clone(&metrics),
            maintenance: Arc::clone(&maintenance_mode),
            pool: pool.clone(),
        };
        actix::spawn(keep_listening(pg.clone(), listeners));
        let idle = Duration::from_secs(config.push.writer_idle_seconds.max(1));
        let writers = Writers::new(WriterDeps {
            pool: pool.clone(),
            limits: WriterLimits {
                max_segment_messages: config.push.max_segment_messages,
                max_segment_bytes: config.push.max_segment_bytes,
                mailbox: config.push.writer_mailbox,
                idle,
            },
            coordinator: coordinator.clone(),
            metrics: Arc::clone(&metrics),
        });
        let groups = Groups::new(
            pool.clone(),
            coordinator.clone(),
            idle,
            limits.group_ack_calls,
            Arc::clone(&metrics),
            cipher.clone(),
        );
        let body_bytes = Bound::new(Limited::BodyBytes, limits.body_bytes_in_flight, &metrics);
        let long_polls = Bound::new(Limited::LongPolls, limits.parked_long_polls, &metrics);
        let registered = Cache::builder()
            .max_capacity(100_000)
            .time_to_live(Duration::from_secs(60))
            .support_invalidation_closures()
            .build();
        let maintenance = &config.maintenance;
        actix::Actor::start(Maintenance::new(
            pool.clone(),
            MaintenanceSettings {
                interval: Duration::from_millis(maintenance.interval_ms),
                partition_cleanup_days: f64::from(maintenance.partition_cleanup_days),
                batch_segments: i64::from(maintenance.batch_segments),
            },
            broker_id.clone(),
            Arc::clone(&names),
            Arc::clone(&metrics),
            cipher.clone(),
        ));
        Self {
            pool,
            config,
            names,
            registered,
            writers,
            groups,
            coordinator,
            metrics,
            body_bytes,
            long_polls,
            maintenance: maintenance_mode,
            cipher,
            journal,
            broker_id,
            pg_config: pg,
            lag_refreshed_at: std::sync::Mutex::new(None),
            namespace_pops: AtomicU64::new(0),
            shutting_down: AtomicBool::new(false),
        }
    }
}
