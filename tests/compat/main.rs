//! Compatibility: the unmodified official Python client (`queen-mq`, pinned in
//! `tests/compat/requirements.txt`) against a real broker.
//!
//! One test starts one broker on a fresh database and runs the pytest suite in `tests/compat`
//! against it; pytest reports the individual cases. The Python interpreter is the one of the
//! virtual environment `scripts/test.sh` creates at `<target dir>/compat-venv`, or the one named by
//! `QUEEN_COMPAT_PYTHON`. Without it the test fails: a compatibility suite that skips itself
//! would let the client break unnoticed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use queen_testkit::{BrokerProcess, JsonServer, TestDatabase, target_dir};

/// Names the Python interpreter to use instead of `<target dir>/compat-venv/bin/python`.
const PYTHON_VAR: &str = "QUEEN_COMPAT_PYTHON";

/// The broker's encryption key (AES-256, 64 hex characters), made up for the tests.
const ENCRYPTION_KEY: &str = "2b7e151628aed2a6abf7158809cf4f3c2b7e151628aed2a6abf7158809cf4f3c";

/// Generous: the suite takes well under a minute; every test body also has its own deadline.
const SUITE_TIMEOUT: Duration = Duration::from_secs(600);

/// The workspace root, where `tests/compat` lives.
fn workspace_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The Python of the compatibility venv; panics with what to do when there is none.
fn python() -> PathBuf {
    let (python, origin) = match std::env::var_os(PYTHON_VAR).filter(|value| !value.is_empty()) {
        Some(value) => (PathBuf::from(value), format!("named by {PYTHON_VAR}")),
        None => (target_dir().join("compat-venv").join("bin").join("python"), "the default".to_owned()),
    };
    if !python.is_file() {
        panic!(
            "the Python interpreter for the compatibility tests ({origin}) does not exist: {}\n\
             Run scripts/test.sh, which creates the venv <target dir>/compat-venv from \
             tests/compat/requirements.txt, or create one yourself:\n    \
             python3 -m venv target/compat-venv && target/compat-venv/bin/pip install -r tests/compat/requirements.txt\n\
             or set {PYTHON_VAR} to a Python that has those packages installed.",
            python.display()
        );
    }
    python
}

#[tokio::test]
async fn the_official_python_client_works_against_the_broker() {
    let db = TestDatabase::create("compat").await;
    // The maintenance test buffers pushes: a journal directory of this run's own.
    let buffer = target_dir().join(format!("compat-buffer-{}", std::process::id()));
    let buffer = buffer.to_string_lossy();
    let args = ["--database-url", db.url(), "--buffer-dir", &buffer];
    // The encryption test configures an encrypted queue, which needs the broker's key.
    let envs = [("QUEEN_ENCRYPTION_KEY", ENCRYPTION_KEY)];
    let broker = BrokerProcess::start(Path::new(env!("CARGO_BIN_EXE_queen")), &args, &envs).await;
    // The auth tests need a broker of their own (below).
    run_pytest(&broker, &["tests/compat", "--ignore=tests/compat/test_auth.py"], &[]).await;
}

/// The HS256 secret of the auth run, made up for the tests.
const JWT_SECRET: &str = "compat-hs256-secret-0123456789abcdef";
const RS256_KID: &str = "compat-rs256";

#[tokio::test]
async fn the_official_python_client_works_against_a_broker_with_jwt_auth() {
    let fixtures = workspace_root().join("tests/fixtures/auth");
    let private_key = fixtures.join("rs256-a.key");
    let jwks = JsonServer::start("jwks.json", jwks_of(&private_key, RS256_KID)).await;
    let db = TestDatabase::create("compat_auth").await;
    let envs =
        [("JWT_ENABLED", "true"), ("JWT_ALGORITHM", "auto"), ("JWT_SECRET", JWT_SECRET), ("JWT_JWKS_URL", jwks.url())];
    let broker =
        BrokerProcess::start(Path::new(env!("CARGO_BIN_EXE_queen")), &["--database-url", db.url()], &envs).await;
    let key = private_key.to_string_lossy();
    let settings =
        [("QUEEN_AUTH_HS256_SECRET", JWT_SECRET), ("QUEEN_AUTH_RS256_KEY", &*key), ("QUEEN_AUTH_RS256_KID", RS256_KID)];
    run_pytest(&broker, &["tests/compat/test_auth.py"], &settings).await;
    assert!(jwks.requests() > 0, "the broker fetched the JWKS");
}

/// A JWKS with the public half of the RSA private key at `path`, under `kid`.
fn jwks_of(path: &Path, kid: &str) -> String {
    use jsonwebtoken::jwk::{Jwk, JwkSet};
    let pem = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(&pem).expect("an RSA private key");
    let mut jwk = Jwk::from_encoding_key(&key, jsonwebtoken::Algorithm::RS256).expect("a JWK");
    jwk.common.key_id = Some(kid.to_owned());
    serde_json::to_string(&JwkSet { keys: vec![jwk] }).expect("JSON")
}

/// Runs pytest over `targets` against `broker`, failing with everything that helps when it fails.
async fn run_pytest(broker: &BrokerProcess, targets: &[&str], envs: &[(&str, &str)]) {
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
        // The suite decides the client's behaviour, not whoever runs the tests.
        .env_remove("QUEEN_SDK_POP_AUTOPILOT")
        .env_remove("QUEEN_CLIENT_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(SUITE_TIMEOUT, command.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => panic!("cannot run {} -m pytest: {e}", python.display()),
        Err(_) => {
            panic!("pytest did not finish within {SUITE_TIMEOUT:?}; the broker's log:\n{}", broker.log().join("\n"))
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        panic!(
            "the Python client's compatibility suite failed ({}, after {:.1?}).\n\
             ---- pytest stdout ----\n{stdout}\n---- pytest stderr ----\n{stderr}\n\
             ---- broker log ({}) ----\n{}",
            output.status,
            started.elapsed(),
            broker.url(),
            broker.log().join("\n")
        );
    }
    println!("{stdout}");
}
