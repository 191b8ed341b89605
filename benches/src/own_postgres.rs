//! A PostgreSQL of the bench's own for the measurements that need no broker (`announce`,
//! `scan-cost`): the suite's embedded cluster code, with the settings a measurement asks for,
//! and a fresh database in it.

use std::path::PathBuf;

use queen_store::embedded::{EmbeddedError, EmbeddedOptions, EmbeddedPostgres};

use crate::suite::{SuiteError, postmaster_pid, recreate_database, target_dir};

#[derive(Debug, thiserror::Error)]
pub enum OwnPostgresError {
    #[error(transparent)]
    Suite(#[from] SuiteError),
    #[error("the bench's PostgreSQL: {0}")]
    Embedded(#[from] EmbeddedError),
    #[error("the bench's PostgreSQL: {0}")]
    Sql(#[from] tokio_postgres::Error),
    #[error(
        "the PostgreSQL in {dir} has {name} = {actual}, this measurement needs {wanted}; it was already running, \
         so the setting could not be given: stop it (pg_ctl -D {dir} stop) and run again"
    )]
    Setting { dir: String, name: String, actual: String, wanted: String },
}

/// A running cluster and the fresh database a measurement works in.
pub struct OwnPostgres {
    postgres: EmbeddedPostgres,
    pub database_url: String,
    /// The postmaster, whose process tree is PostgreSQL's CPU time.
    pub postmaster: Option<i32>,
}

impl OwnPostgres {
    /// Starts (or adopts) the cluster in `pg_dir`, by default `bench-pg-<purpose>` in the target
    /// directory, with `settings`, and recreates the database `bench_<purpose>`. An adopted
    /// cluster keeps its settings, so each one asked for is checked.
    pub async fn start(
        purpose: &str,
        pg_dir: Option<PathBuf>,
        settings: Vec<(String, String)>,
    ) -> Result<Self, OwnPostgresError> {
        let data_dir = match pg_dir {
            Some(dir) => dir,
            None => target_dir()?.join(format!("bench-pg-{purpose}")),
        };
        tracing::info!(data_dir = %data_dir.display(), "starting the bench's PostgreSQL");
        let postgres = EmbeddedPostgres::start(EmbeddedOptions {
            data_dir,
            bin_dir: None,
            port: None,
            settings: settings.clone(),
        })
        .await?;
        let database = format!("bench_{}", purpose.replace('-', "_"));
        let (admin, connection) = tokio_postgres::connect(&postgres.url("postgres"), tokio_postgres::NoTls).await?;
        let connection = tokio::spawn(connection);
        for (name, wanted) in &settings {
            let actual: String = admin.query_one(&format!("SHOW {name}"), &[]).await?.get(0);
            if &actual != wanted {
                let dir = postgres.data_dir().display().to_string();
                let (name, wanted) = (name.clone(), wanted.clone());
                return Err(OwnPostgresError::Setting { dir, name, actual, wanted });
            }
        }
        recreate_database(&admin, &database).await?;
        drop(admin);
        let _ = connection.await;
        let postmaster = postmaster_pid(postgres.data_dir());
        Ok(Self { database_url: postgres.url(&database), postmaster, postgres })
    }

    /// Stops the cluster; a failure is logged, the measurement is done anyway.
    pub async fn stop(self) {
        if let Err(e) = self.postgres.stop().await {
            tracing::error!("stopping the bench's PostgreSQL: {e}");
        }
    }
}
