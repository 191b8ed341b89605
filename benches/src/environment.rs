//! What a report says about the machine and the database it was measured on.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// How long the fdatasync probe may take before it is given up.
const FSYNC_PROBE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Default, Serialize)]
pub struct Environment {
    pub date: String,
    pub nproc: usize,
    pub cpu_model: Option<String>,
    pub postgres_version: Option<String>,
    pub synchronous_commit: Option<String>,
    pub fsync: Option<String>,
    pub broker_commit: Option<String>,
    /// The fdatasync line of `pg_test_fsync`, before and after the run.
    pub fdatasync_before: Option<String>,
    pub fdatasync_after: Option<String>,
    /// The broker: a URL, or the binary the suite started.
    pub broker: String,
    /// The load settings, as flags.
    pub load: String,
}

impl Environment {
    pub fn collect(broker: String, load: String) -> Self {
        Self {
            date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            nproc: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model: cpu_model(),
            broker_commit: git_commit(),
            broker,
            load,
            ..Self::default()
        }
    }

    /// Reads the server's version and durability settings.
    pub async fn read_postgres(&mut self, database_url: &str) -> Result<(), tokio_postgres::Error> {
        let (client, connection) = tokio_postgres::connect(database_url, tokio_postgres::NoTls).await?;
        let connection = tokio::spawn(connection);
        let show = |name: &'static str| {
            let client = &client;
            async move { client.query_one(&format!("SHOW {name}"), &[]).await.map(|row| row.get::<_, String>(0)) }
        };
        self.postgres_version = Some(show("server_version").await?);
        self.synchronous_commit = Some(show("synchronous_commit").await?);
        self.fsync = Some(show("fsync").await?);
        drop(client);
        let _ = connection.await;
        Ok(())
    }
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_owned())
}

/// The checked-out commit of the working directory's repository, if git is there.
fn git_commit() -> Option<String> {
    let output = std::process::Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Runs `pg_test_fsync` on a file in `dir` until it prints its fdatasync line, and returns that
/// line (`fdatasync  1234.5 ops/sec  810 usecs/op`). The rest of its tests are not waited for.
pub async fn fdatasync_probe(bin_dir: &Path, dir: &Path) -> Option<String> {
    let probe = async {
        let mut child = Command::new(bin_dir.join("pg_test_fsync"))
            .arg("-s")
            .arg("1")
            .arg("-f")
            .arg(dir.join("pg_test_fsync.probe"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .ok()?;
        let mut lines = BufReader::new(child.stdout.take()?).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.trim_start().starts_with("fdatasync") && line.contains("ops/sec") {
                return Some(line.split_whitespace().collect::<Vec<_>>().join(" "));
            }
        }
        None
    };
    let line = tokio::time::timeout(FSYNC_PROBE_TIMEOUT, probe).await.ok().flatten();
    let _ = std::fs::remove_file(dir.join("pg_test_fsync.probe"));
    line
}

/// Operations per second of a probe line, to compare before and after.
pub fn fdatasync_ops(line: &str) -> Option<f64> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "ops/sec")?;
    words.get(at.checked_sub(1)?)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_lines_give_their_rate() {
        assert_eq!(fdatasync_ops("fdatasync 10778.123 ops/sec 93 usecs/op"), Some(10778.123));
        assert_eq!(fdatasync_ops("fdatasync n/a"), None);
    }
}
