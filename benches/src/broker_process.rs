//! A broker process the suite starts for one scenario and stops after it.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// How long a broker may take to answer `/ready`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a broker may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How much of the log a failure report quotes.
const LOG_TAIL_BYTES: usize = 2000;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error(
        "the broker binary {0} does not exist; build it with `cargo build --release --bin queen` (or pass --broker-bin)"
    )]
    Missing(PathBuf),
    #[error("cannot start the broker {bin}: {source}")]
    Spawn { bin: PathBuf, source: std::io::Error },
    #[error("cannot find a free port: {0}")]
    Port(std::io::Error),
    #[error("the broker exited during start-up ({status}); its log {log} ends with:\n{tail}")]
    Exited { status: std::process::ExitStatus, log: PathBuf, tail: String },
    #[error("the broker did not answer /ready within {}s ({last_error}); its log {log} ends with:\n{tail}", START_TIMEOUT.as_secs())]
    NotReady { last_error: String, log: PathBuf, tail: String },
    #[error("stopping the broker: {0}")]
    Stop(std::io::Error),
}

/// A running broker, its stdout and stderr going to a log file.
pub struct BrokerProcess {
    child: Child,
    pid: i32,
    url: String,
    log: PathBuf,
}

impl BrokerProcess {
    /// Starts `bin` on a free loopback port against `database_url` and waits until it is ready.
    pub async fn start(bin: &Path, database_url: &str, log: &Path) -> Result<Self, BrokerError> {
        if !bin.is_file() {
            return Err(BrokerError::Missing(bin.to_owned()));
        }
        let port = free_port().map_err(BrokerError::Port)?;
        let spawn_error = |source| BrokerError::Spawn { bin: bin.to_owned(), source };
        let log_file = std::fs::File::create(log).map_err(spawn_error)?;
        let child = Command::new(bin)
            .args(["--database-url", database_url, "--host", "127.0.0.1", "--port", &port.to_string()])
            .env("QUEEN_LOG__LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().map_err(spawn_error)?)
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .map_err(spawn_error)?;
        let pid = child.id().and_then(|id| i32::try_from(id).ok()).unwrap_or_default();
        let mut broker = Self { child, pid, url: format!("http://127.0.0.1:{port}"), log: log.to_owned() };
        broker.wait_ready().await?;
        Ok(broker)
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The broker's log, for reports that point at it.
    pub fn log(&self) -> &Path {
        &self.log
    }

    async fn wait_ready(&mut self) -> Result<(), BrokerError> {
        let client = crate::workload::connect(&self.url, None).map_err(|e| BrokerError::NotReady {
            last_error: e.to_string(),
            log: self.log.clone(),
            tail: String::new(),
        })?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(BrokerError::Exited { status, log: self.log.clone(), tail: log_tail(&self.log) });
            }
            let last_error = match client.ready().await {
                Ok(_) => return Ok(()),
                Err(e) => e.to_string(),
            };
            if started.elapsed() > START_TIMEOUT {
                return Err(BrokerError::NotReady { last_error, log: self.log.clone(), tail: log_tail(&self.log) });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether the broker has exited on its own (crashed) while it should be serving.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM, then SIGKILL if it has not exited in time.
    pub async fn stop(mut self) -> Result<std::process::ExitStatus, BrokerError> {
        if let Some(status) = self.exited() {
            return Ok(status);
        }
        // The process may exit between the check and the signal; waiting below still works.
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGTERM);
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(status) => status.map_err(BrokerError::Stop),
            Err(_) => {
                tracing::warn!(pid = self.pid, "the broker ignored SIGTERM; killing it");
                self.child.kill().await.map_err(BrokerError::Stop)?;
                self.child.wait().await.map_err(BrokerError::Stop)
            }
        }
    }
}

/// The end of a log file, for error messages.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let start = text.len().saturating_sub(LOG_TAIL_BYTES);
    let start = (start..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
    text[start..].to_owned()
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}
