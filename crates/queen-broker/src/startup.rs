//! Building and running the broker: [`Application::build`] does everything up to an open
//! listener (tests bind port 0 and read the port back), [`Application::run_until_stopped`]
//! serves until the process is told to stop.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::middleware::from_fn;
use actix_web::{App, HttpServer, web};
use queen_store::StoreError;

use crate::actors::push_journal::FoundJournal;
use crate::broker::Broker;
use crate::config::Config;
use crate::database::{Database, DatabaseError};
use crate::http;

/// How long start-up keeps retrying PostgreSQL before giving up.
const DATABASE_STARTUP_ATTEMPTS: u32 = 30;

/// How long connections left open after a graceful shutdown's drain (idle ones, or ones just
/// answered with a refusal) get to close before they are dropped.
const CLOSE_CONNECTIONS_SECONDS: u64 = 1;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Database(#[from] DatabaseError),
    #[error("cannot migrate the schema: {0}")]
    Migrate(StoreError),
    #[error("cannot listen on {address}: {source}")]
    Bind { address: String, source: std::io::Error },
    #[error("cannot read the maintenance switches: {0}")]
    Modes(StoreError),
    #[error("cannot open the push journal in {dir}: {source}")]
    Journal { dir: String, source: std::io::Error },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot compare the encryption key with the fleet's: {0}")]
    KeyCheck(StoreError),
    #[error(
        "encryption.key is not the key this database's encrypted data is sealed with (another broker recorded a \
         different one): start every broker of the fleet with the same key"
    )]
    KeyDiffers,
}

pub struct Application {
    port: u16,
    server: Server,
    broker: web::Data<Broker>,
    database: Database,
}

impl Application {
    /// Opens the database (starting the embedded one if none is configured), migrates the
    /// schema, starts the actors and binds the listener. Must run inside an actix system.
    pub async fn build(config: Config) -> Result<Self, StartError> {
        let cipher = config.encryption.cipher()?.map(Arc::new);
        let auth = crate::auth::Authenticator::from_config(&config.auth)?;
        // The first log line says where the database is (the embedded one's data directory).
        let mut database = Database::open(&config).await?;
        database.keep_embedded_running();
        match Self::start_serving(config, &database, cipher, auth).await {
            Ok((port, server, broker)) => Ok(Self { port, server, broker, database }),
            // An embedded server started for this broker is not left running without it.
            Err(e) => {
                database.close_if_started_here().await;
                Err(e)
            }
        }
    }

    /// The rest of [`Application::build`], once the database is there: the schema, the broker
    /// and its background tasks, and the listener.
    async fn start_serving(
        config: Config,
        database: &Database,
        cipher: Option<Arc<queen_log::Cipher>>,
        auth: Option<Arc<crate::auth::Authenticator>>,
    ) -> Result<(u16, Server, web::Data<Broker>), StartError> {
        // Every connection is a descriptor: a 1024 soft limit would cap clients far below
        // `http.max_connections`.
        raise_open_file_limit(config.http.max_connections);
        let pool = queen_store::pool::build_pool(database.target.clone(), &config.database.pool_settings())
            .map_err(StartError::Migrate)?;
        migrate_with_retries(&pool).await?;
        let keyless_in_sealing_fleet = check_encryption_key(&pool, cipher.as_deref()).await?;
        let modes = crate::broker::maintenance_mode::read(&pool).await.map_err(StartError::Modes)?;
        let journal = FoundJournal::recover(&config.buffer)
            .map_err(|source| StartError::Journal { dir: config.buffer.dir.display().to_string(), source })?;

        let address = format!("{}:{}", config.http.host, config.http.port);
        let listener =
            TcpListener::bind(&address).map_err(|source| StartError::Bind { address: address.clone(), source })?;
        let port = listener.local_addr().map_err(|source| StartError::Bind { address, source })?.port();
        let tls = crate::listener_tls::server_config(&config.http)?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let broker_id = format!("{}:{port}:{}", hostname(), std::process::id());
        let workers = match config.http.workers {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        let max_connections = config.http.max_connections;
        let request_head_timeout_ms = config.http.request_head_timeout_ms;
        let keep_alive = Duration::from_secs(config.http.keep_alive_seconds);
        let pg = database.target.clone();
        let broker = web::Data::new(
            Broker::new(pool, pg, Arc::new(config), broker_id, modes, journal, cipher)
                .with_auth(auth.clone())
                .keyless_in_sealing_fleet(keyless_in_sealing_fleet),
        );
        // The JWKS is fetched (and kept fresh) on this runtime, which outlives the HTTP workers.
        if let Some(keys) = auth.as_ref().and_then(|auth| auth.key_set()) {
            actix_web::rt::spawn(crate::auth::keep_fresh(keys));
        }
        // Replays what the journal holds whenever push maintenance is off (now, if a previous run
        // left pushes in it).
        actix_web::rt::spawn(crate::broker::push_buffer::keep_draining(broker.clone()));
        // The fleet list and the history the dashboard shows.
        actix_web::rt::spawn(crate::broker::fleet::keep_beating(broker.clone()));
        // Delivers due timers, those that fell due while no broker ran first.
        actix_web::rt::spawn(crate::services::timers::keep_sweeping(broker.clone()));
        let app_broker = broker.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(app_broker.clone())
                .wrap(from_fn(http::content_encoding::refuse))
                .wrap(from_fn(http::uri_text::refuse_non_utf8))
                .wrap(from_fn(http::cross_site::refuse))
                .wrap(from_fn(http::dns_rebinding::refuse))
                .wrap(from_fn(http::gate::admit))
                .wrap(from_fn(http::leading_slashes::collapse))
                .wrap(from_fn(http::request_id::assign))
                .configure(http::routes)
        })
        // A parked long poll looks at its connection to tell whether its client is still there.
        .on_connect(crate::connection::remember)
        .workers(workers)
        // The HTTP server counts connections per worker.
        .max_connections(max_connections.div_ceil(workers))
        // Signals are ours to handle: the broker drains its work before the server stops.
        .disable_signals()
        .shutdown_timeout(CLOSE_CONNECTIONS_SECONDS)
        .client_request_timeout(Duration::from_millis(request_head_timeout_ms))
        .keep_alive(keep_alive);
        let server = match tls {
            Some(tls) => server.listen_rustls_0_23(listener, tls),
            None => server.listen(listener),
        }
        .map_err(|source| StartError::Bind { address: format!("port {port}"), source })?
        .run();
        http::mark_start();
        tracing::info!(port, scheme, "queen listening on port {port} ({scheme})");
        Ok((port, server, broker))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the broker's LISTEN connection is in effect, as it changes: it opens once the
    /// broker runs, and a test that counts wake-ups waits for it (a broker without it has its
    /// parked pops look again every second).
    pub fn hears_fleet(&self) -> Arc<std::sync::atomic::AtomicBool> {
        Arc::clone(&self.broker.hears_fleet)
    }

    /// Serves until SIGINT or SIGTERM, then shuts down gracefully: refuses new API requests,
    /// answers parked long polls (empty), lets the requests under way finish and the partition
    /// writers and group actors empty (at most `http.shutdown_timeout_seconds`), stops the
    /// server, and stops the embedded database if this broker runs one. The leases this broker
    /// granted are left alone: they live in PostgreSQL, and their consumers acknowledge through
    /// any other broker.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let Application { server, broker, database, .. } = self;
        let handle = server.handle();
        let stopper = broker.clone();
        let limit = Duration::from_secs(broker.config.http.shutdown_timeout_seconds);
        actix_web::rt::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutting down: answering long polls and finishing the requests under way");
            stopper.begin_shutdown();
            if !stopper.drain(limit).await {
                tracing::warn!("work still under way after http.shutdown_timeout_seconds is cut short");
            }
            crate::broker::push_buffer::report_left(&stopper).await;
            crate::broker::fleet::leave(&stopper).await;
            handle.stop(true).await;
        });
        let served = server.await;
        let in_use_by_others = database.is_embedded() && crate::broker::fleet::others_running(&broker).await;
        database.close_unless_in_use(in_use_by_others).await;
        served
    }
}

/// Refuses a key other than the one the fleet seals with, before the broker serves anything it
/// could not open or seals what its fleet cannot; warns of a broker without a key in a fleet that
/// has one (it serves plain queues, and answers 503 for encrypted ones), and says whether it is one.
async fn check_encryption_key(
    pool: &queen_store::Pool,
    cipher: Option<&queen_log::Cipher>,
) -> Result<bool, StartError> {
    use queen_store::key_check::{self, KeyCheck};
    let client = pool.get().await.map_err(|e| StartError::KeyCheck(e.into()))?;
    match cipher {
        Some(cipher) => match key_check::check(&client, cipher).await.map_err(StartError::KeyCheck)? {
            KeyCheck::Different => Err(StartError::KeyDiffers),
            KeyCheck::Recorded | KeyCheck::Same => Ok(false),
        },
        None => {
            let sealing = key_check::recorded(&client).await.map_err(StartError::KeyCheck)?;
            if sealing {
                tracing::warn!(
                    "this broker has no encryption key, and its fleet has one: encrypted queues are answered 503 here"
                );
            }
            Ok(sealing)
        }
    }
}

/// Runs the migrations, waiting for PostgreSQL to come up if it is not there yet.
pub async fn migrate_with_retries(pool: &queen_store::Pool) -> Result<(), StartError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = async {
            let mut client = pool.get().await?;
            queen_store::migrations::migrate(&mut client).await
        }
        .await;
        match result {
            Ok(report) => {
                tracing::info!(version = report.current, applied = ?report.applied, "schema is current");
                return Ok(());
            }
            Err(e) if e.is_unavailable() && attempt < DATABASE_STARTUP_ATTEMPTS => {
                tracing::warn!(
                    error = %e,
                    attempt,
                    "cannot migrate yet (PostgreSQL not reachable, or another broker migrating); retrying"
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(StartError::Migrate(e)),
        }
    }
}

/// The first SIGTERM or SIGINT.
async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut terminate), Ok(mut interrupt)) => {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        }
        _ => {
            tracing::error!("cannot listen for SIGTERM and SIGINT; stop the broker with SIGKILL");
            std::future::pending::<()>().await;
        }
    }
}

/// Raises this process's soft limit on open files to its hard limit, and logs the outcome;
/// warns when it stays below `max_connections` (connections past it are not accepted).
fn raise_open_file_limit(max_connections: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        tracing::warn!("cannot read the open-file limit");
        return;
    };
    let limit = if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => {
                tracing::info!(
                    from = soft,
                    to = hard,
                    "raised the open-file limit from {soft} to its hard limit {hard}"
                );
                hard
            }
            Err(e) => {
                tracing::warn!(soft, hard, error = %e, "cannot raise the open-file limit");
                soft
            }
        }
    } else {
        tracing::info!(limit = soft, "the open-file limit is {soft}");
        soft
    };
    if limit < max_connections as u64 {
        tracing::warn!(
            limit,
            max_connections,
            "the open-file limit is below http.max_connections: connections past it will not be accepted"
        );
    }
}

/// This machine's name, or `localhost` when it has none that is UTF-8.
pub(crate) fn hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into())
}
