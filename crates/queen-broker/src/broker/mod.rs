//! The broker's operations, between the HTTP edge and the store: push, pop, ack.

pub mod access;
pub mod ack;
pub mod deliveries;
pub mod depth;
mod error;
pub mod fleet;
pub mod groups;
pub mod kv;
pub mod leases;
pub mod locks;
pub mod maintenance_mode;
pub mod messages;
mod names_cache;
pub mod offset_reads;
pub mod pop;
mod pop_spacing;
pub mod probes;
pub mod push;
pub mod push_buffer;
pub mod queue_options;
pub mod queues;
pub mod stats;
pub mod timers;
pub mod traces;
pub mod transaction;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use moka::sync::Cache;
use queen_store::Pool;

use crate::actors::coordinator::{Coordinator, CoordinatorMailbox, CoordinatorSettings};
use crate::actors::group_leases::Groups;
use crate::actors::partition_writer::{WriterDeps, WriterLimits, Writers};
use crate::actors::push_journal::{FoundJournal, Journal, PushJournal, PushRoute};
use crate::auth::Authenticator;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::pressure::{Bound, Limited, PerClient};
use crate::services::announcer::Announcer;
use crate::services::listener::{FleetListeners, keep_listening};
use crate::services::maintenance::{Maintenance, MaintenanceSettings};
use crate::services::timers::SweepAlarm;
use maintenance_mode::MaintenanceMode;
use queen_log::Cipher;
use queen_store::segment_cache::SegmentCache;
use queen_store::system_state::Modes;

pub use error::{BrokerError, DATABASE_UNAVAILABLE, limit_setting};
pub use names_cache::NamesCache;

/// Everything a request handler needs, shared by all HTTP workers.
pub struct Broker {
    pub pool: Pool,
    pub config: Arc<Config>,
    pub names: Arc<NamesCache>,
    /// (queue, group) pairs whose registration this broker has written or seen, with whether the
    /// group conflates on the queue.
    pub registered: Cache<(String, String), bool>,
    pub writers: Writers,
    pub groups: Groups,
    pub coordinator: CoordinatorMailbox,
    /// Announces what this broker's writes made available, to the coordinator and the fleet.
    pub announcer: Announcer,
    pub metrics: Arc<Metrics>,
    /// Bytes of request bodies held across the broker (`limits.body_bytes_in_flight`).
    pub body_bytes: Arc<Bound>,
    /// Long polls parked across the broker (`limits.parked_long_polls`).
    pub long_polls: Arc<Bound>,
    /// Long polls parked per client address (`limits.long_polls_per_client`).
    pub client_long_polls: Arc<PerClient>,
    pub maintenance: Arc<MaintenanceMode>,
    /// Who may call the API (`[auth]`); `None` with auth off.
    pub auth: Option<Arc<Authenticator>>,
    /// The key of encrypted queues (`encryption.key`), when configured.
    pub cipher: Option<Arc<Cipher>>,
    /// This broker has no key and its fleet has recorded one (as read at start-up): it may not
    /// know which queues are encrypted, so it journals pushes only to queues it knows are not.
    pub keyless_in_sealing_fleet: bool,
    /// Decoded segments that pops took part of (`pop.segment_cache_bytes`).
    pub segments: Arc<SegmentCache>,
    /// When each group's long-poll pops may start while its stream is dense (`pop.dense_interval_ms`).
    pop_spacing: pop_spacing::PopSpacing,
    /// What this broker delivered under each lease, to resolve its acks.
    pub deliveries: deliveries::Deliveries,
    /// Where pushes wait during push maintenance.
    pub journal: Journal,
    /// Wakes the timer sweeper for timers scheduled through this broker.
    pub timer_alarm: SweepAlarm,
    /// Identifies this broker in the leases it grants.
    pub broker_id: String,
    /// When `/metrics` last read consumer lag from the database.
    pub lag_refreshed_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// The probes running now, which probes arriving meanwhile share.
    pub probes_running: probes::Running,
    /// Namespace pops so far: queues of equal priority take turns at being served first.
    pub namespace_pops: AtomicU64,
    /// LISTEN is in effect: pushes through other brokers wake this broker's parked pops.
    pub hears_fleet: Arc<AtomicBool>,
    shutting_down: AtomicBool,
    /// API requests under way, which a graceful shutdown waits for.
    requests_under_way: Arc<AtomicUsize>,
}

/// How often a graceful shutdown looks whether the work under way is done.
const DRAIN_POLL: Duration = Duration::from_millis(10);

/// One API request under way, counted until dropped.
pub struct UnderWay(Arc<AtomicUsize>);

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Broker {
    /// Takes a pooled connection and runs `work` on it, bounded by `database.answer_within`: a
    /// write whose commit PostgreSQL does not answer in time (a silent synchronous standby) is
    /// given up on, its connection discarded, and its outcome unknown (a 503).
    pub async fn write_within<T>(
        &self,
        what: &'static str,
        work: impl AsyncFnOnce(&mut deadpool_postgres::Object) -> T,
    ) -> Result<(deadpool_postgres::Object, T), queen_store::StoreError> {
        self.continue_within(self.pool.get().await?, what, work).await
    }

    /// [`Broker::write_within`] on a connection already taken.
    pub async fn continue_within<T>(
        &self,
        client: deadpool_postgres::Object,
        what: &'static str,
        work: impl AsyncFnOnce(&mut deadpool_postgres::Object) -> T,
    ) -> Result<(deadpool_postgres::Object, T), queen_store::StoreError> {
        queen_store::pool::answered_within(client, self.config.database.answer_within(), what, work).await
    }

    /// Whether the broker is shutting down: it is not ready, and long polls answer at once.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Starts the graceful shutdown: the broker is no longer ready, new API requests are refused
    /// (`http::gate`), and parked long polls are woken and answer empty.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.coordinator.wake_all();
        self.maintenance.release_held_pops();
    }

    /// Counts an API request as under way until the returned guard is dropped. Counted before
    /// the request looks at [`Broker::is_shutting_down`], so a shutdown either waits for it or
    /// is seen by it.
    pub fn request_under_way(&self) -> UnderWay {
        self.requests_under_way.fetch_add(1, Ordering::SeqCst);
        UnderWay(Arc::clone(&self.requests_under_way))
    }

    /// Waits, at most `limit`, until no API request is under way and no partition writer, group
    /// actor or the journal holds work (a request whose client went away leaves its work queued
    /// there). Whether everything finished.
    pub async fn drain(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let idle = self.requests_under_way.load(Ordering::SeqCst) == 0
                && self.writers.is_idle()
                && self.groups.is_idle()
                && self.journal.is_idle()
                && self.journal_replayed_or_held().await;
            if idle {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    /// Whether the push journal holds nothing, or nothing that can reach the log now (push
    /// maintenance is on, or the replay is failing). A shutdown waits for a replay that goes
    /// through: the journal may be lost with the broker (a pod's `emptyDir`), and what is left in
    /// it is replayed only by a broker started on the same directory.
    async fn journal_replayed_or_held(&self) -> bool {
        if self.maintenance.modes().push_maintenance {
            return true;
        }
        match self.journal.status().await {
            Ok(status) => status.buffered_messages == 0 || !status.healthy,
            Err(_) => true,
        }
    }

    /// The broker as a keyless one in a fleet that has recorded a key (`check_encryption_key`).
    pub fn keyless_in_sealing_fleet(mut self, keyless: bool) -> Self {
        self.keyless_in_sealing_fleet = keyless;
        self
    }

    /// The broker with `[auth]`'s authenticator (built and checked by the caller).
    pub fn with_auth(mut self, auth: Option<Arc<Authenticator>>) -> Self {
        self.auth = auth;
        self
    }

    /// Wires the actors and starts the LISTEN connection (on `pg`), with the maintenance switches
    /// as read at start-up, the push journal as found, and the encryption key. Must run inside an
    /// actix system.
    pub fn new(
        pool: Pool,
        pg: queen_store::tls::PgTarget,
        config: Arc<Config>,
        broker_id: String,
        modes: Modes,
        journal: FoundJournal,
        cipher: Option<Arc<Cipher>>,
    ) -> Self {
        let metrics = Arc::new(Metrics::new(config.metrics.max_queue_labels));
        let route = Arc::new(PushRoute::default());
        let journal = Journal::start(PushJournal::new(journal, Arc::clone(&route), Arc::clone(&metrics)));
        let maintenance_mode = Arc::new(MaintenanceMode::new(modes, route, Arc::clone(&metrics)));
        let view_max_age = Duration::from_secs(config.pop.scan_refresh_seconds.max(1));
        let settings = CoordinatorSettings { plan_from_views: config.pop.plan_from_views, view_max_age };
        let limits = &config.limits;
        let coordinator = CoordinatorMailbox::start(
            Coordinator::new(settings, Arc::clone(&metrics)),
            limits.coordinator_messages,
            &metrics,
        );
        let names = Arc::new(NamesCache::new(config.database.answer_within()));
        let segments = Arc::new(SegmentCache::new(config.pop.segment_cache_bytes));
        let pop_spacing = pop_spacing::PopSpacing::new(Duration::from_millis(config.pop.dense_interval_ms));
        let announcer = Announcer::start(coordinator.clone(), pool.clone());
        let registered = Cache::builder()
            .max_capacity(100_000)
            .time_to_live(Duration::from_secs(60))
            .support_invalidation_closures()
            .build();
        let hears_fleet = Arc::new(AtomicBool::new(false));
        let listeners = FleetListeners {
            hears_fleet: Arc::clone(&hears_fleet),
            coordinator: coordinator.clone(),
            names: Arc::clone(&names),
            registered: registered.clone(),
            segments: Arc::clone(&segments),
            metrics: Arc::clone(&metrics),
            maintenance: Arc::clone(&maintenance_mode),
            pool: pool.clone(),
            announcer: announcer.clone(),
        };
        actix::spawn(keep_listening(pg.clone(), listeners));
        let idle = Duration::from_secs(config.push.writer_idle_seconds);
        let writers = Writers::new(WriterDeps {
            pool: pool.clone(),
            limits: WriterLimits {
                max_segment_messages: config.push.max_segment_messages,
                max_segment_bytes: config.push.max_segment_bytes,
                mailbox: config.push.writer_mailbox,
                idle,
                answer_within: config.database.answer_within(),
            },
            announcer: announcer.clone(),
            metrics: Arc::clone(&metrics),
        });
        let groups = Groups::new(
            pool.clone(),
            announcer.clone(),
            idle,
            limits.group_ack_calls,
            config.database.answer_within(),
            Arc::clone(&metrics),
            cipher.clone(),
        );
        let body_bytes = Bound::new(Limited::BodyBytes, limits.body_bytes_in_flight, &metrics);
        let long_polls = Bound::new(Limited::LongPolls, limits.parked_long_polls, &metrics);
        let client_long_polls = PerClient::new(Limited::ClientLongPolls, limits.long_polls_per_client, &metrics);
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
            announcer,
            metrics,
            body_bytes,
            long_polls,
            client_long_polls,
            maintenance: maintenance_mode,
            auth: None,
            cipher,
            keyless_in_sealing_fleet: false,
            segments,
            pop_spacing,
            deliveries: deliveries::Deliveries::default(),
            journal,
            timer_alarm: SweepAlarm::default(),
            broker_id,
            lag_refreshed_at: std::sync::Mutex::new(None),
            probes_running: probes::Running::default(),
            namespace_pops: AtomicU64::new(0),
            hears_fleet,
            shutting_down: AtomicBool::new(false),
            requests_under_way: Arc::new(AtomicUsize::new(0)),
        }
    }
}
