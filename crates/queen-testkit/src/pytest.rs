//! Python suites run by pytest against a real broker: the official client's compatibility suite
//! and the dashboard's browser tests. Their interpreter is the virtual environment that
//! `scripts/test.sh` makes from `tests/compat/requirements.txt` at `<target dir>/compat-venv`, or
//! the one `QUEEN_COMPAT_PYTHON` names. Without it a suite fails: one that skipped itself would let
//! what it guards break unnoticed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::{BrokerProcess, target_dir};

/// Names the Python interpreter to use instead of `<target dir>/compat-venv/bin/python`.
const PYTHON_VAR: &str = "QUEEN_COMPAT_PYTHON";

/// Generous: every suite takes well under a minute, and every wait in it has its own deadline.
const SUITE_TIMEOUT: Duration = Duration::from_secs(600);

/// The workspace root, where the suites live and pytest runs.
pub fn workspace_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The Python of the venv; panics with what to do when there is none.
pub fn python() -> PathBuf {
    let (python, origin) = match std::env::var_os(PYTHON_VAR).filter(|value| !value.is_empty()) {
        Some(value) => (PathBuf::from(value), format!("named by {PYTHON_VAR}")),
        None => (target_dir().join("compat-venv").join("bin").join("python"), "the default".to_owned()),
    };
    assert!(
        python.is_file(),
        "the Python interpreter of the pytest suites ({origin}) does not exist: {}\n\
         Run scripts/test.sh, which creates the venv <target dir>/compat-venv from \
         tests/compat/requirements.txt, or create one yourself:\n    \
         python3 -m venv target/compat-venv && target/compat-venv/bin/pip install -r tests/compat/requirements.txt\n\
         or set {PYTHON_VAR} to a Python that has those packages installed.",
        python.display()
    );
    python
}

/// Runs pytest over `targets` (paths from the workspace root) against `broker`, whose URL the
/// suite reads from `QUEEN_URL`, with `envs` set; panics with pytest's output and the broker's
/// log when `suite` fails. Pytest's report.
pub async fn run(suite: &str, broker: &BrokerProcess, targets: &[&str], envs: &[(&str, &str)]) -> String {
    let python = python();
    let started = Instant::now();
    let mut command = tokio::process::Command::new(&python);
    command
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .args(targets)
        .current_dir(workspace_root())
        .envs(envs.iter().copied())
        .env("QUEEN_URL", broker.url())
        // No __pycache__ directories in the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        // The suite decides the official client's behaviour, not whoever runs the tests.
        .env_remove("QUEEN_SDK_POP_AUTOPILOT")
        .env_remove("QUEEN_CLIENT_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(SUITE_TIMEOUT, command.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => panic!("cannot run {} -m pytest: {e}", python.display()),
        Err(_) => {
            panic!("{suite} did not finish within {SUITE_TIMEOUT:?}; the broker's log:\n{}", broker.log().join("\n"))
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        panic!(
            "{suite} failed ({}, after {:.1?}).\n\
             ---- pytest stdout ----\n{stdout}\n---- pytest stderr ----\n{stderr}\n\
             ---- broker log ({}) ----\n{}",
            output.status,
            started.elapsed(),
            broker.url(),
            broker.log().join("\n")
        );
    }
    format!("{stdout}\n({suite}: {:.1?})", started.elapsed())
}
