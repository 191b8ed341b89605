//! The connection pool every request borrows from.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

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
    pg.application_name(&settings.application_name);
    pg.connect_timeout(settings.connect_timeout);
    pg.options(format!(
        "-c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={}",
        settings.statement_timeout.as_millis(),
        settings.lock_timeout.as_millis(),
        settings.statement_timeout.as_millis().max(1000) * 2,
    ));
    let manager = Manager::from_config(pg, tls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager)
        .max_size(settings.max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(settings.wait_timeout))
        .create_timeout(Some(settings.connect_timeout))
        .recycle_timeout(Some(settings.connect_timeout))
        .build()
        .map_err(|e| StoreError::Unavailable(format!("cannot build the connection pool: {e}")))
}
