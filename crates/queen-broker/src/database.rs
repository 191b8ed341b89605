//! Which PostgreSQL the broker uses: the configured server, or (with none configured) the
//! embedded one it starts and owns under its data directory.

use queen_store::embedded::{EmbeddedError, EmbeddedOptions, EmbeddedPostgres};
use tokio_postgres::NoTls;

use crate::config::Config;

/// The database the embedded server holds Queen's schema in.
const EMBEDDED_DATABASE: &str = "queen";

pub struct Database {
    pub pg_config: tokio_postgres::Config,
    embedded: Option<EmbeddedPostgres>,
}

#[derive(Debug, thiserror::Error)]
pub enum DatabaseError {
    #[error(transparent)]
    Embedded(#[from] EmbeddedError),
    #[error("cannot prepare the embedded database: {0}")]
    Prepare(#[from] tokio_postgres::Error),
}

impl Database {
    /// Starts the embedded server when no server is configured.
    pub async fn open(config: &Config) -> Result<Self, DatabaseError> {
        if config.database.is_external() {
            return Ok(Self { pg_config: config.database.pg_config(), embedded: None });
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
        create_database_if_missing(&server.url("postgres"), EMBEDDED_DATABASE).await?;
        let pg_config = server.url(EMBEDDED_DATABASE).parse()?;
        tracing::info!(port = server.port(), "embedded PostgreSQL ready on 127.0.0.1:{}", server.port());
        Ok(Self { pg_config, embedded: Some(server) })
    }

    /// Stops the embedded server, if this broker runs one.
    pub async fn close(self) {
        if let Some(server) = self.embedded
            && let Err(e) = server.stop().await
        {
            tracing::error!(error = %e, "could not stop the embedded PostgreSQL");
        }
    }
}

async fn create_database_if_missing(admin_url: &str, name: &str) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(admin_url, NoTls).await?;
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
