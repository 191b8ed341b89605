//! Which PostgreSQL the broker uses: the configured server, or (with none configured) the
//! embedded one it starts and owns under its data directory.

use std::sync::Arc;
use std::time::Duration;

use queen_store::embedded::{EmbeddedError, EmbeddedOptions, EmbeddedPostgres};
use queen_store::tls::{PgTarget, SslMode, TlsError, TlsSettings};
use tokio_postgres::error::SqlState;

use crate::config::{Config, ConfigError};

/// The database the embedded server holds Queen's schema in.
const EMBEDDED_DATABASE: &str = "queen";

pub struct Database {
    /// Where every connection goes (the pool, the LISTEN connection) and how, TLS included.
    pub target: PgTarget,
    embedded: Option<Arc<EmbeddedPostgres>>,
    /// The task that starts the embedded server again when it stops under the broker, and what
    /// tells it to end.
    supervisor: Option<(tokio::task::JoinHandle<()>, tokio::sync::watch::Sender<bool>)>,
}

/// How often a broker looks whether its embedded server still runs.
const EMBEDDED_CHECK_INTERVAL: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum DatabaseError {
    #[error(transparent)]
    Embedded(#[from] EmbeddedError),
    #[error("cannot prepare the embedded database: {0}")]
    Prepare(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("TLS to PostgreSQL: {0}")]
    Tls(#[from] TlsError),
    /// The server and this broker cannot agree on TLS, or the server refuses the broker's
    /// connection; retrying would not help.
    #[error("cannot connect to PostgreSQL at {server}: {reason}")]
    Refused { server: String, reason: String },
}

impl Database {
    /// Starts the embedded server when no server is configured. A configured one is tried once,
    /// so that TLS it refuses (or a server that refuses the broker) stops start-up at once with
    /// the reason; one that is not reachable yet is waited for by the migration.
    pub async fn open(config: &Config) -> Result<Self, DatabaseError> {
        // For the libraries that use rustls' process-wide provider (the HTTP clients).
        queen_store::tls::install_crypto_provider();
        if config.database.is_external() {
            let tls = config.database.tls()?;
            let target = PgTarget::new(config.database.pg_config(), &tls)?;
            check_tls(&target, tls.mode, config.database.pool_settings().connect_timeout).await?;
            return Ok(Self { target, embedded: None, supervisor: None });
        }
        let data_dir = config.embedded.data_dir.join("pg");
        tracing::info!(
            data_dir = %data_dir.display(),
            "no database configured: running an embedded PostgreSQL in {}",
            data_dir.display()
        );
        let server = EmbeddedPostgres::start(EmbeddedOptions {
            data_dir,
            bin_dir: config.embedded.bin_dir.clone(),
            port: config.embedded.port,
            settings: Vec::new(),
        })
        .await?;
        // Ours, on loopback: plaintext.
        let embedded = |database: &str| -> Result<PgTarget, DatabaseError> {
            Ok(PgTarget::new(server.url(database).parse()?, &TlsSettings::disabled())?)
        };
        create_database_if_missing(&embedded("postgres")?, EMBEDDED_DATABASE).await?;
        let target = embedded(EMBEDDED_DATABASE)?;
        tracing::info!(port = server.port(), "embedded PostgreSQL ready on 127.0.0.1:{}", server.port());
        Ok(Self { target, embedded: Some(Arc::new(server)), supervisor: None })
    }

    /// Keeps the embedded server running, if this broker runs one: a server killed (the kernel's
    /// out-of-memory killer, an operator) or crashed past its own recovery is started again on
    /// the same port, and the pool's connections find it there. A configured server is its
    /// operator's to run. Stopped by [`Database::close`].
    pub fn keep_embedded_running(&mut self) {
        let Some(server) = self.embedded.clone() else { return };
        let (end, mut ended) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                // Ended between looks only: a start under way finishes before the server is stopped.
                tokio::select! {
                    _ = tokio::time::sleep(EMBEDDED_CHECK_INTERVAL) => {}
                    _ = ended.changed() => return,
                }
                match server.start_again_if_stopped().await {
                    Ok(false) => {}
                    Ok(true) => tracing::warn!(
                        data_dir = %server.data_dir().display(),
                        "the embedded PostgreSQL had stopped; started it again"
                    ),
                    Err(e) => {
                        tracing::error!(error = %e, "the embedded PostgreSQL has stopped and could not be started again")
                    }
                }
            }
        });
        self.supervisor = Some((task, end));
    }

    /// Whether this broker runs an embedded server (started here or adopted).
    pub fn is_embedded(&self) -> bool {
        self.embedded.is_some()
    }

    /// At the end of `serve`: stops the embedded server, whoever started it, unless other
    /// brokers still use it (they share the data directory): the last one to leave stops it.
    pub async fn close_unless_in_use(mut self, in_use_by_others: bool) {
        if in_use_by_others && self.is_embedded() {
            tracing::info!("leaving the embedded PostgreSQL running: other brokers use it");
            self.stop_supervising().await;
        } else {
            self.close().await;
        }
    }

    /// Ends the task that starts the embedded server again.
    async fn stop_supervising(&mut self) {
        if let Some((task, end)) = self.supervisor.take() {
            let _ = end.send(true);
            let _ = task.await;
        }
    }

    /// Stops the embedded server, if this broker runs one.
    async fn close(mut self) {
        self.stop_supervising().await;
        if let Some(server) = self.embedded
            && let Err(e) = server.stop().await
        {
            tracing::error!(error = %e, "could not stop the embedded PostgreSQL");
        }
    }

    /// Stops the embedded server only if this process started it: a one-off command (`migrate`)
    /// run beside a broker, or a broker that failed to start, must not stop the server another
    /// broker is using.
    pub async fn close_if_started_here(self) {
        match &self.embedded {
            Some(server) if server.adopted() => {
                tracing::info!("leaving the embedded PostgreSQL running: another process started it");
            }
            _ => self.close().await,
        }
    }
}

/// Connects once: a certificate refused either way, or the server refusing this broker's
/// connection (one without TLS where it takes only TLS, a missing client certificate, a wrong
/// password), is an error with the reason in words; anything else is left to the migration,
/// which retries while the server is unreachable.
async fn check_tls(target: &PgTarget, mode: SslMode, timeout: std::time::Duration) -> Result<(), DatabaseError> {
    let mut config = target.config.clone();
    config.connect_timeout(timeout).application_name("queen");
    let connecting = queen_store::connect::connect(&config, &target.tls);
    let Ok(connected) = tokio::time::timeout(queen_store::connect::whole_attempt(timeout, &config), connecting).await
    else {
        // No host answered at all (a frozen server): left to the migration, as an unreachable one is.
        return Ok(());
    };
    let error = match connected {
        Ok((client, connection)) => {
            drop(client);
            let _ = connection.await;
            return Ok(());
        }
        Err(e) => e,
    };
    let server = server_name(&target.config);
    if let Some(reason) = queen_store::tls::refusal(&error) {
        return Err(DatabaseError::Refused { server, reason });
    }
    // Class 28: the server will not let this broker in as configured (pg_hba.conf, a password, a
    // client certificate it wants).
    if let Some(db) = error.as_db_error()
        && db.code().code().starts_with("28")
    {
        let reason = if mode == SslMode::Disable
            && *db.code() == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            && db.message().contains("no encryption")
        {
            format!(
                "the server accepts only TLS connections ({}); set database.sslmode (or the URL's sslmode) to \
                 require, verify-ca or verify-full",
                db.message()
            )
        } else {
            format!("the server refused the connection: {}", db.message())
        };
        return Err(DatabaseError::Refused { server, reason });
    }
    Ok(())
}

/// `host:port` of the first server configured, for messages.
fn server_name(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => config.get_hostaddrs().first().map_or_else(|| "localhost".into(), ToString::to_string),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}

async fn create_database_if_missing(admin: &PgTarget, name: &str) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = admin.connect().await?;
    let connection = tokio::spawn(connection);
    let exists = client.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name]).await?.is_some();
    if !exists {
        // CREATE DATABASE takes no parameters; the name is a constant of ours.
        client.batch_execute(&format!("CREATE DATABASE \"{name}\"")).await?;
    }
    drop(client);
    let _ = connection.await;
    Ok(())
}
