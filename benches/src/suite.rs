//! The whole suite, side by side in one run: the suite's own PostgreSQL, a fresh database and a
//! fresh broker process per scenario, then the storage ceiling on the same server.

use std::path::{Path, PathBuf};

use queen_store::embedded::{EmbeddedOptions, EmbeddedPostgres};

use crate::broker_process::{BrokerError, BrokerProcess};
use crate::cli::{LoadArgs, SuiteArgs};
use crate::environment::{Environment, fdatasync_probe};
use crate::procfs::Watched;
use crate::report::{ComparedRun, Comparison, Report};
use crate::rounds::{Rounds, representative};
use crate::scenarios::{Harness, ScenarioName, ScenarioReport};

#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    #[error("cannot locate this executable to find the broker next to it: {0}")]
    Location(std::io::Error),
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error("the suite's PostgreSQL: {0}")]
    Postgres(#[from] queen_store::embedded::EmbeddedError),
    #[error("the suite's PostgreSQL: {0}")]
    Sql(#[from] tokio_postgres::Error),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error(
        "another queen-bench suite is running on the PostgreSQL in {0} (it holds {1}); wait for it, or give this one \
         its own --pg-dir"
    )]
    Busy(PathBuf, PathBuf),
}

/// Runs the suite and returns its report; the caller writes and prints it.
pub async fn run(args: SuiteArgs) -> Result<Report, SuiteError> {
    let target_dir = target_dir()?;
    let broker_bin = args.broker_bin.clone().unwrap_or_else(|| target_dir.join("release").join("queen"));
    for bin in std::iter::once(&broker_bin).chain(&args.compare_bin) {
        if !bin.is_file() {
            return Err(BrokerError::Missing(bin.clone()).into());
        }
    }
    let pg_dir = args.pg_dir.clone().unwrap_or_else(|| target_dir.join("bench-pg"));
    let _one_at_a_time = lock(&pg_dir)?;
    let logs = args.out.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| SuiteError::Io(format!("creating {}", logs.display()), e))?;
    tracing::info!(data_dir = %pg_dir.display(), "starting the suite's PostgreSQL");
    let postgres = EmbeddedPostgres::start(EmbeddedOptions {
        data_dir: pg_dir,
        bin_dir: None,
        port: None,
        // Production-like: fsync and synchronous_commit stay on.
        settings: vec![],
    })
    .await?;
    let compare_bin = args.compare_bin.clone();
    let report = Suite { args: &args, postgres: &postgres, broker_bin, compare_bin, logs }.run().await;
    if let Err(e) = postgres.stop().await {
        tracing::error!("stopping the suite's PostgreSQL: {e}");
    }
    report
}

/// Holds the suite's PostgreSQL directory for this run (until the returned file is dropped). A
/// second suite on the same directory would adopt the running server, create and drop its
/// databases under the first one's brokers, start its brokers on the same push journal, and stop
/// the server when it is done: both runs would report errors and lost messages that no build made.
fn lock(pg_dir: &Path) -> Result<std::fs::File, SuiteError> {
    let path = suite_lock(pg_dir);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| SuiteError::Io(format!("opening {}", path.display()), e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(SuiteError::Busy(pg_dir.to_owned(), path)),
        Err(std::fs::TryLockError::Error(e)) => Err(SuiteError::Io(format!("locking {}", path.display()), e)),
    }
}

/// `<pg-dir>.suite.lock`: not `<pg-dir>.lock`, which `queen_store::embedded` takes to start and
/// stop the server, and would wait for forever while the suite holds it.
fn suite_lock(pg_dir: &Path) -> PathBuf {
    let mut name = pg_dir.file_name().unwrap_or_default().to_owned();
    name.push(".suite.lock");
    pg_dir.with_file_name(name)
}

/// The target directory: this binary lives in `<target>/release`.
pub fn target_dir() -> Result<PathBuf, SuiteError> {
    let exe = std::env::current_exe().map_err(SuiteError::Location)?;
    let profile_dir = exe.parent().unwrap_or(Path::new("."));
    Ok(profile_dir.parent().unwrap_or(profile_dir).to_owned())
}

struct Suite<'a> {
    args: &'a SuiteArgs,
    postgres: &'a EmbeddedPostgres,
    /// Build A: the one under test.
    broker_bin: PathBuf,
    /// Build B, the one A is compared with, if any.
    compare_bin: Option<PathBuf>,
    logs: PathBuf,
}

/// Which of the two builds of an A/B run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Build {
    A,
    B,
}

impl Suite<'_> {
    async fn run(&self) -> Result<Report, SuiteError> {
        let broker = match &self.compare_bin {
            None => format!("{} (a fresh process per scenario)", self.broker_bin.display()),
            Some(b) => format!(
                "A {} against B {} (a fresh process and database per scenario and build, alternating which goes \
                 first)",
                self.broker_bin.display(),
                b.display()
            ),
        };
        let broker = match self.args.rounds {
            1 => broker,
            rounds => format!("{broker}, {rounds} rounds of each scenario"),
        };
        let mut environment = Environment::collect(broker, load_flags(&self.args.load));
        environment.read_postgres(&self.postgres.url("postgres")).await?;
        let probe_dir = self.postgres.data_dir().parent().unwrap_or(Path::new(".")).to_owned();
        if !self.args.no_fsync_probe {
            environment.fdatasync_before = fdatasync_probe(self.postgres.bin_dir(), &probe_dir).await;
        }
        let postmaster = postmaster_pid(self.postgres.data_dir());
        let (admin, connection) =
            tokio_postgres::connect(&self.postgres.url("postgres"), tokio_postgres::NoTls).await?;
        let connection = tokio::spawn(connection);

        let scenarios =
            if self.args.scenarios.is_empty() { ScenarioName::ALL.to_vec() } else { self.args.scenarios.clone() };
        let mut reports = Vec::new();
        let mut compared = Vec::new();
        let mut rounds = Vec::new();
        for (index, scenario) in scenarios.into_iter().enumerate() {
            let (mut runs_a, mut runs_b, mut b_went_first) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..self.args.rounds {
                // A then B, then B then A: neither always meets the server (its caches, its
                // WAL) in the state the other left.
                let b_first = self.compare_bin.is_some() && (index + round) % 2 == 1;
                let order: &[Build] = match (&self.compare_bin, b_first) {
                    (None, _) => &[Build::A],
                    (Some(_), false) => &[Build::A, Build::B],
                    (Some(_), true) => &[Build::B, Build::A],
                };
                for &build in order {
                    tracing::info!(%scenario, ?build, round = round + 1, "scenario");
                    let database = format!("bench_{}", scenario.as_str().replace('-', "_"));
                    recreate_database(&admin, &database).await?;
                    let report = self.run_scenario(scenario, build, &database, postmaster).await;
                    if !report.passed() {
                        let why = report.failure.as_deref().unwrap_or("verification failed");
                        tracing::error!(%scenario, ?build, "scenario failed: {why}");
                    }
                    drop_database(&admin, &database).await?;
                    match build {
                        Build::A => runs_a.push(report),
                        Build::B => {
                            runs_b.push(report);
                            b_went_first.push(b_first);
                        }
                    }
                }
            }
            rounds.push(Rounds::new(scenario, &runs_a, &runs_b));
            if let Some(median) = representative(&runs_a) {
                reports.push(runs_a.swap_remove(median));
            }
            if let Some(median) = representative(&runs_b) {
                compared.push(ComparedRun { ran_first: b_went_first[median], report: runs_b.swap_remove(median) });
            }
        }
        let comparison =
            self.compare_bin.as_ref().map(|b| Comparison { broker: b.display().to_string(), runs: compared });

        let mut failures = Vec::new();
        let ceiling = if self.args.skip_ceiling {
            None
        } else {
            recreate_database(&admin, "bench_ceiling").await?;
            let ceiling = crate::ceiling::run(&self.postgres.url("bench_ceiling"), self.args.ceiling_cell).await;
            drop_database(&admin, "bench_ceiling").await?;
            ceiling.map_err(|e| failures.push(e.to_string())).ok()
        };
        if !self.args.no_fsync_probe {
            environment.fdatasync_after = fdatasync_probe(self.postgres.bin_dir(), &probe_dir).await;
        }
        drop(admin);
        let _ = connection.await;
        let mut report = Report::new(environment, reports, ceiling, comparison).with_rounds(rounds);
        report.failures = failures;
        Ok(report)
    }

    /// One scenario on a broker of its own; whatever goes wrong ends up in the report.
    async fn run_scenario(
        &self,
        scenario: ScenarioName,
        build: Build,
        database: &str,
        postmaster: Option<i32>,
    ) -> ScenarioReport {
        let (bin, log) = match (build, &self.compare_bin) {
            (Build::B, Some(b)) => (b, self.logs.join(format!("{scenario}.B.broker.log"))),
            _ => (&self.broker_bin, self.logs.join(format!("{scenario}.broker.log"))),
        };
        let mut broker = match BrokerProcess::start(bin, &self.postgres.url(database), &log).await {
            Ok(broker) => broker,
            Err(e) => return ScenarioReport::failed(scenario, e.to_string()),
        };
        let client = match crate::workload::connect(broker.url(), None) {
            Ok(client) => client,
            Err(e) => return ScenarioReport::failed(scenario, e.to_string()),
        };
        let watched = Watched { broker: Some(broker.pid()), postgres: postmaster };
        let mut report = Harness::new(client, self.args.load.clone(), watched).run(scenario).await;
        if let Some(status) = broker.exited() {
            let crash = format!("the broker exited during the scenario ({status}); see {}", broker.log().display());
            report.failure = Some(report.failure.map_or(crash.clone(), |f| format!("{crash}; {f}")));
        }
        if let Err(e) = broker.stop().await {
            tracing::warn!(%scenario, "{e}");
        }
        report
    }
}

/// The load settings as the flags that reproduce them.
pub fn load_flags(load: &LoadArgs) -> String {
    format!(
        "--duration {}s --warmup {}s --connections {} --partitions {} --consumers {} --pop-batch {} \
         --pop-partitions {} --prefill {} --prefill-batch {} --latency-rate {} --sustain-start {} --sustain-step {}s \
         --sustain-bisect {} --sustain-budget {}s{}{}",
        load.duration.as_secs_f64(),
        load.warmup.as_secs_f64(),
        load.connections,
        load.partitions,
        load.consumers,
        load.pop_batch,
        load.pop_partitions,
        load.prefill,
        load.prefill_batch,
        load.latency_rate,
        load.sustain_start,
        load.sustain_step.as_secs_f64(),
        load.sustain_bisect,
        load.sustain_budget.as_secs_f64(),
        if load.framed_pops { " --framed-pops" } else { "" },
        if load.binary_pushes { " --binary-pushes" } else { "" }
    )
}

/// The postmaster's pid: the first line of `postmaster.pid`.
pub fn postmaster_pid(data_dir: &Path) -> Option<i32> {
    std::fs::read_to_string(data_dir.join("postmaster.pid")).ok()?.lines().next()?.trim().parse().ok()
}

pub async fn recreate_database(admin: &tokio_postgres::Client, name: &str) -> Result<(), tokio_postgres::Error> {
    drop_database(admin, name).await?;
    admin.batch_execute(&format!("CREATE DATABASE \"{name}\"")).await
}

async fn drop_database(admin: &tokio_postgres::Client, name: &str) -> Result<(), tokio_postgres::Error> {
    admin.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_suite_at_a_time_on_a_postgres_directory() {
        let dir = std::env::temp_dir().join(format!("queen-bench-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pg_dir = dir.join("bench-pg");
        let first = lock(&pg_dir).expect("the first suite takes the directory");
        match lock(&pg_dir) {
            Err(SuiteError::Busy(busy, _)) => assert_eq!(busy, pg_dir),
            other => panic!("a second suite on the same directory must be refused, got {other:?}"),
        }
        assert!(lock(&dir.join("other-pg")).is_ok(), "another directory is free");
        // The embedded server's own start lock stays free, or starting it would wait forever.
        let start_lock = std::fs::File::create(dir.join("bench-pg.lock")).unwrap();
        assert!(start_lock.try_lock().is_ok(), "the suite holds {}, not the start lock", suite_lock(&pg_dir).display());
        drop(first);
        assert!(lock(&pg_dir).is_ok(), "free again once the first suite is done");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
