//! Real `queen` processes for end-to-end tests.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// How long a broker may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// A broker process, killed when dropped.
pub struct BrokerProcess {
    child: Child,
    port: u16,
    /// It serves HTTPS (it was given a certificate).
    https: bool,
    log: Arc<Mutex<Vec<String>>>,
}

impl BrokerProcess {
    /// Starts `binary` with `args` (and `--host 127.0.0.1 --port 0` unless `args` name a port)
    /// and waits until it logs the port it listens on.
    pub async fn start(binary: &Path, args: &[&str], envs: &[(&str, &str)]) -> BrokerProcess {
        let mut command = Command::new(binary);
        // The test decides the broker's configuration, not whoever runs the tests.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if configures_queen(&key) {
                command.env_remove(key.as_ref());
            }
        }
        command.args(args);
        if !args.contains(&"--port") {
            command.args(["--host", "127.0.0.1", "--port", "0"]);
        }
        command.envs(envs.iter().copied()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = command.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (listening_tx, listening_rx) = oneshot::channel();
        let lines = Arc::clone(&log);
        tokio::spawn(async move {
            let mut listening_tx = Some(listening_tx);
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if let Some(listening) = listening_on(&line)
                    && let Some(tx) = listening_tx.take()
                {
                    let _ = tx.send(listening);
                }
                lines.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        let (port, https) = match tokio::time::timeout(START_TIMEOUT, listening_rx).await {
            Ok(Ok(listening)) => listening,
            outcome => {
                let status = child.try_wait().ok().flatten();
                let log = log.lock().unwrap_or_else(|p| p.into_inner()).join("\n");
                panic!("the broker did not start ({outcome:?}, exit {status:?}); its log:\n{log}");
            }
        };
        BrokerProcess { child, port, https, log }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The process id, while the process runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Every line the broker has logged so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = self.child.id() {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }

    /// Waits for the process to exit, at most `limit`.
    pub async fn wait(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(limit, self.child.wait()).await.ok().and_then(Result::ok)
    }
}

/// Whether an environment variable is one the broker reads its settings from.
fn configures_queen(key: &str) -> bool {
    const NAMES: [&str; 8] = [
        "DATABASE_URL",
        "HOST",
        "PORT",
        "LOG_LEVEL",
        "DEFAULT_BATCH_SIZE",
        "DEFAULT_TIMEOUT",
        "FILE_BUFFER_DIR",
        "FILE_BUFFER_MAX_BATCH",
    ];
    ["QUEEN_", "PG_", "DB_", "JWT_"].iter().any(|prefix| key.starts_with(prefix)) || NAMES.contains(&key)
}

/// The port in the broker's "listening on port N (http)" line, and whether it says "(https)".
fn listening_on(line: &str) -> Option<(u16, bool)> {
    let rest = &line[line.find("listening on port ")? + "listening on port ".len()..];
    let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let port = rest[..digits].parse().ok()?;
    Some((port, rest[digits..].starts_with(" (https)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_and_the_scheme_are_read_from_the_log_line() {
        assert_eq!(
            listening_on(
                "2026-11-29T19:35:21Z  INFO queen_broker::startup: queen listening on port 6632 (http) port=6632"
            ),
            Some((6632, false))
        );
        assert_eq!(
            listening_on(
                "2026-12-06T03:35:21Z  INFO queen_broker::startup: queen listening on port 6633 (https) port=6633"
            ),
            Some((6633, true))
        );
        assert_eq!(listening_on("starting 2 workers"), None);
    }
}
