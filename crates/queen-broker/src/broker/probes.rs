//! What the probes and the metrics scrape ask of the broker: whether PostgreSQL answers, whether
//! it holds the schema this build needs and takes writes, and the gauges read from the database.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use actix_web::web;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use super::Broker;

/// How long a probe waits for PostgreSQL to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How often scrapes re-read consumer lag from the database.
const LAG_REFRESH: Duration = Duration::from_secs(10);

/// Why a probe got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unanswered {
    /// Every connection of the full pool stayed in use by requests for the probe's whole time:
    /// the broker is busy, and PostgreSQL may well be answering them.
    PoolBusy,
    /// PostgreSQL did not answer in time (a new connection, or the check itself) or failed.
    Database,
}

/// Runs `check` on a pooled connection, the wait for the connection and the check together within
/// `timeout` (the probes' timeouts in the Helm chart are set just above it). A connection whose
/// check ran out of time is not given back to the pool, where the next request would wait behind
/// the statement still running on it (or on a server that no longer answers).
async fn on_a_connection<T>(
    broker: &Broker,
    timeout: Duration,
    check: impl AsyncFnOnce(&mut deadpool_postgres::Client) -> Option<T>,
) -> Result<T, Unanswered> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut client = match tokio::time::timeout_at(deadline, broker.pool.get()).await {
        Ok(Ok(client)) => client,
        Ok(Err(_)) => return Err(Unanswered::Database),
        Err(_) => {
            let pool = broker.pool.status();
            let full = pool.size >= pool.max_size && pool.available == 0;
            return Err(if full { Unanswered::PoolBusy } else { Unanswered::Database });
        }
    };
    let answer = tokio::time::timeout_at(deadline, check(&mut client)).await;
    match answer {
        Ok(answer) => answer.ok_or(Unanswered::Database),
        Err(_) => {
            drop(deadpool_postgres::Object::take(client));
            Err(Unanswered::Database)
        }
    }
}

/// The probes running now. `/health` and `/ready` take no token: a flood of them must not take
/// the pool's connections from requests, so the probes of one kind that arrive while one runs
/// wait for its answer instead of asking PostgreSQL again. No answer outlives its probe.
#[derive(Default)]
pub struct Running {
    reachable: Flight<Result<(), Unanswered>>,
    readiness: Flight<Readiness>,
}

struct Flight<T>(Mutex<Option<Shared<BoxFuture<'static, T>>>>);

impl<T> Default for Flight<T> {
    fn default() -> Self {
        Flight(Mutex::new(None))
    }
}

impl<T: Clone + Send + Sync + 'static> Flight<T> {
    /// The answer of the probe running now, or of one `start` starts.
    async fn join(&self, start: impl FnOnce() -> BoxFuture<'static, T>) -> T {
        let running = {
            let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            match slot.as_ref().filter(|running| running.peek().is_none()) {
                Some(running) => running.clone(),
                None => slot.insert(start().shared()).clone(),
            }
        };
        running.await
    }
}

/// PostgreSQL answers a query within the probe timeout.
pub async fn database_reachable(broker: web::Data<Broker>) -> Result<(), Unanswered> {
    let probe = broker.clone();
    let ping = async |client: &mut deadpool_postgres::Client| queen_store::probes::ping(client).await.ok();
    let start = move || async move { on_a_connection(&probe, PROBE_TIMEOUT, ping).await }.boxed();
    broker.probes_running.reachable.join(start).await
}

/// What readiness finds of PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// It answers, holds the schema this broker needs, and takes writes.
    Ready,
    /// It answers with the schema, but its transactions are read-only (`default_transaction_read_only`
    /// on, or a hot standby): no push, pop or ack can be served.
    ReadOnly,
    /// Its schema is older than this broker needs (another broker may have rolled the database
    /// back or replaced it).
    SchemaBehind,
    /// It could not be asked: see [`Unanswered`].
    Unanswered(Unanswered),
}

/// Whether PostgreSQL lets this broker serve, on one pooled connection: the schema version, then
/// `transaction_read_only` (the setting a new transaction of the pool's sessions gets; a write
/// refused for lack of disk space cannot be foreseen without writing, and is not looked for).
pub async fn readiness(broker: web::Data<Broker>) -> Readiness {
    let probe = broker.clone();
    let check = async |client: &mut deadpool_postgres::Client| {
        let version = queen_store::migrations::current_version(client).await.ok()?;
        if version < queen_store::migrations::latest_version() {
            return Some(Readiness::SchemaBehind);
        }
        let read_only = queen_store::probes::transactions_read_only(client).await.ok()?;
        Some(if read_only { Readiness::ReadOnly } else { Readiness::Ready })
    };
    let start = move || {
        async move { on_a_connection(&probe, PROBE_TIMEOUT, check).await.unwrap_or_else(Readiness::Unanswered) }.boxed()
    };
    broker.probes_running.readiness.join(start).await
}

/// Brings the gauges a scrape reports up to date: the pool, the database failures, the segment
/// cache, and consumer lag, which comes from the cursors and is read at most every
/// [`LAG_REFRESH`], however often the broker is scraped.
pub async fn refresh_metrics(broker: &Broker) {
    let metrics = &broker.metrics;
    metrics.observe_pool(broker.pool.status());
    metrics.observe_db_failures(queen_store::failure_counts());
    metrics.observe_segment_cache(broker.segments.stats());
    let due = {
        let mut last = broker.lag_refreshed_at.lock().unwrap_or_else(|p| p.into_inner());
        let due = last.is_none_or(|at| at.elapsed() >= LAG_REFRESH);
        if due {
            *last = Some(Instant::now());
        }
        due
    };
    if !due {
        return;
    }
    // The query is bounded by PostgreSQL (see `queue_lags`); the wait here only in case the
    // server does not answer at all.
    let read = async |client: &mut deadpool_postgres::Client| {
        queen_store::groups::queue_lags(client, PROBE_TIMEOUT).await.ok()
    };
    let Ok(lags) = on_a_connection(broker, 2 * PROBE_TIMEOUT, read).await else {
        // The gauges keep what they last read, which `queen_consumer_group_lag_read_timestamp_seconds`
        // dates.
        tracing::warn!("could not read consumer lag for the metrics; the lag gauges keep their last values");
        return;
    };
    // Queues past the label limit share one label, and their groups one too: the groups of
    // thousands of queues would otherwise make millions of series under it.
    let mut totals: BTreeMap<(&str, &str), (i64, f64)> = BTreeMap::new();
    for lag in &lags {
        let queue = metrics.queue_label(&lag.queue);
        let group = if queue == crate::metrics::OTHER_QUEUES { crate::metrics::OTHER_GROUPS } else { &lag.group };
        let total = totals.entry((queue, group)).or_default();
        total.0 += lag.lag_messages;
        total.1 = total.1.max(lag.lag_seconds);
    }
    metrics.lag_messages.reset();
    metrics.lag_seconds.reset();
    metrics.lag_read_at.set(chrono::Utc::now().timestamp());
    for ((queue, group), (messages, seconds)) in totals {
        metrics.lag_messages.with_label_values(&[queue, group]).set(messages);
        metrics.lag_seconds.with_label_values(&[queue, group]).set(seconds);
    }
}
