//! The connection pool every request borrows from.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Metrics, Pool, RecyclingMethod, Runtime};

use crate::StoreError;
use crate::tls::PgTarget;

/// How the pool connects and how long it waits.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub max_size: usize,
    /// How long a request waits for a free connection before the broker answers 503.
    pub wait_timeout: Duration,
    pub connect_timeout: Duration,
    /// Server-side bound on any one statement, so a stuck query cannot hold a connection forever.
    pub statement_timeout: Duration,
    /// Server-side bound on waiting for a row lock.
    pub lock_timeout: Duration,
    pub application_name: String,
}

/// Builds the pool, whose connections go through `target`'s TLS connector. Connections are
/// opened lazily, so this succeeds while PostgreSQL is down. A bare `tokio_postgres::Config` is a
/// target too (its `sslmode` only: nothing verified).
pub fn build_pool(target: impl Into<PgTarget>, settings: &PoolSettings) -> Result<Pool, StoreError> {
    let PgTarget { config: mut pg, tls } = target.into();
    // A name the URL gives wins (an operator's way to tell brokers apart in pg_stat_activity).
    if pg.get_application_name().is_none() {
        pg.application_name(&settings.application_name);
    }
    pg.connect_timeout(settings.connect_timeout);
    // Generic plans: the broker runs a few statements thousands of times a second, and with the
    // default choice PostgreSQL re-plans each of them on every execution (their generic plans
    // look dearer to it than a custom plan for one small `unnest` list), which cost the hot
    // path more than executing them. After the URL's own `options` (a search_path, a hosted
    // server's endpoint), which setting them would replace; a setting given twice takes the last.
    let options = session_options(pg.get_options(), settings);
    pg.options(options);
    let create_timeout = crate::connect::whole_attempt(settings.connect_timeout, &pg);
    let manager = Manager::from_connect(
        pg,
        crate::connect::HostByHost { tls },
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    let verify_timeout = settings.connect_timeout;
    Pool::builder(manager)
        .pre_recycle(Hook::async_fn(move |client, metrics| {
            Box::pin(async move {
                if maybe_on_a_standby(metrics) {
                    let check = client.query_one("SELECT pg_is_in_recovery()", &[]);
                    return match tokio::time::timeout(verify_timeout, check).await {
                        Ok(Ok(row)) if row.get::<_, bool>(0) => Err(HookError::message("connected to a standby")),
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err(e)) => Err(HookError::message(format!("connection lost: {e}"))),
                        Err(_) => Err(HookError::message("connection lost: no answer to a check")),
                    };
                }
                if !maybe_lost(metrics) {
                    return Ok(());
                }
                match tokio::time::timeout(verify_timeout, client.simple_query("")).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(HookError::message(format!("connection lost: {e}"))),
                    Err(_) => Err(HookError::message("connection lost: no answer to a check")),
                }
            })
        }))
        .max_size(settings.max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(settings.wait_timeout))
        .create_timeout(Some(create_timeout))
        .recycle_timeout(Some(settings.connect_timeout))
        .build()
        .map_err(|e| StoreError::Unavailable(format!("cannot build the connection pool: {e}")))
}

/// The `options` every pooled session starts with: the URL's own, then the broker's settings.
fn session_options(given: Option<&str>, settings: &PoolSettings) -> String {
    let ours = format!(
        "-c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={} \
         -c plan_cache_mode=force_generic_plan",
        settings.statement_timeout.as_millis(),
        settings.lock_timeout.as_millis(),
        settings.statement_timeout.as_millis().max(1000) * 2,
    );
    match given.map(str::trim) {
        Some(given) if !given.is_empty() => format!("{given} {ours}"),
        _ => ours,
    }
}

/// Gives up on a write `client` ran for longer than `waited` without an answer ([`discard`]),
/// with the error that says its outcome is unknown.
pub fn abandon(client: deadpool_postgres::Object, what: &'static str, waited: Duration) -> StoreError {
    discard(client);
    StoreError::unanswered(what, waited)
}

/// Takes a connection whose write went unanswered out of the pool rather than let it serve anyone
/// else. Its commit, already written locally if PostgreSQL reached it, is not cancelled (a commit
/// cancelled while it waits for a synchronous standby stays on the primary alone, while a retry
/// of the request would be answered as already done): closing the connection does not stop a
/// backend waiting for its standby.
pub fn discard(client: deadpool_postgres::Object) {
    drop(deadpool_postgres::Object::take(client));
}

/// Runs `work` on `client` (writes whose commit PostgreSQL may never answer: a silent synchronous
/// standby), waiting at most `bound`, and hands the connection back with the outcome. Past the
/// bound the connection is [`abandon`]ed and the outcome unknown ([`StoreError::Unanswered`]).
/// The same when the caller goes away first (a request whose client disconnected is dropped
/// mid-write): the connection is discarded, not handed back with its write still waiting on it.
pub async fn answered_within<T>(
    client: deadpool_postgres::Object,
    bound: Duration,
    what: &'static str,
    work: impl AsyncFnOnce(&mut deadpool_postgres::Object) -> T,
) -> Result<(deadpool_postgres::Object, T), StoreError> {
    // The slot is emptied only below, so both lookups find the connection.
    let lost = || StoreError::Unavailable("the connection went missing".into());
    let mut under_way = WriteUnderWay(Some(client));
    let working = under_way.0.as_mut().ok_or_else(lost)?;
    let answered = tokio::time::timeout(bound, work(working)).await;
    let client = under_way.0.take().ok_or_else(lost)?;
    match answered {
        Ok(outcome) => Ok((client, outcome)),
        Err(_) => Err(abandon(client, what, bound)),
    }
}

/// A connection with a write under way: discarded if dropped before the write was answered.
struct WriteUnderWay(Option<deadpool_postgres::Object>);

impl Drop for WriteUnderWay {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            discard(client);
        }
    }
}

/// When something last happened that puts the pool's older connections in doubt (`None`:
/// never); a connection last handed out (or opened) before it is checked when next taken.
struct Mark(Mutex<Option<Instant>>);

impl Mark {
    const fn new() -> Self {
        Mark(Mutex::new(None))
    }

    fn set(&self) {
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Instant::now());
    }

    /// Whether the connection `metrics` describes was last handed out before the mark.
    fn predates(&self, metrics: &Metrics) -> bool {
        let at = *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        at.is_some_and(|at| metrics.recycled.unwrap_or(metrics.created) <= at)
    }
}

/// When a connection of this process was last found lost.
static LOST: Mark = Mark::new();

/// When a write of this process was last refused as read-only.
static READ_ONLY: Mark = Mark::new();

/// A write was refused as read-only: the server may be a standby that a single address (a DNS
/// name, a virtual IP, a Kubernetes Service) pointed at for a moment, and a pooled connection
/// opened then could stay on it, refusing every write it carries, for as long as it lived. So
/// each connection handed out before the refusal is asked, when next taken, whether its server
/// is in recovery, and dropped if it is ([`maybe_on_a_standby`]); one fenced read-only by
/// `default_transaction_read_only` is kept.
pub(crate) fn writes_refused_read_only() {
    READ_ONLY.set();
}

/// Whether a pooled connection was last handed out (or opened) before the latest read-only
/// refusal.
fn maybe_on_a_standby(metrics: &Metrics) -> bool {
    READ_ONLY.predates(metrics)
}

/// A statement failed because its connection was lost (its backend terminated, the server gone).
///
/// Fast recycling hands out any connection whose client is not closed yet, and a client learns
/// that its backend is gone only when the server closes the socket, which comes after the error
/// that ended the failed statement: the connection could go back into the pool and fail the next
/// request too. So, after a loss, each pooled connection that was in use before it is checked
/// with one empty round trip when next taken ([`maybe_lost`]); one that fails the check is
/// dropped and the pool takes or opens another. Until a loss, taking a connection costs nothing
/// more.
pub(crate) fn connection_lost() {
    LOST.set();
}

/// Whether a pooled connection was last handed out (or opened) before the latest loss, and so may
/// be the one lost, or another lost with it.
fn maybe_lost(metrics: &Metrics) -> bool {
    LOST.predates(metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_urls_own_session_options_are_kept_before_the_brokers() {
        let settings = PoolSettings {
            max_size: 1,
            wait_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            statement_timeout: Duration::from_millis(30_000),
            lock_timeout: Duration::from_millis(5_000),
            application_name: "queen".into(),
        };
        let ours = session_options(None, &settings);
        assert!(ours.starts_with("-c statement_timeout=30000 -c lock_timeout=5000"), "{ours}");
        let both = session_options(Some("-c search_path=app,queen endpoint=ep-1"), &settings);
        assert_eq!(both, format!("-c search_path=app,queen endpoint=ep-1 {ours}"));
        assert_eq!(session_options(Some("  "), &settings), ours);
    }
}
