//! The operators' dashboard (`/dashboard`) in a real browser: headless Chromium driven by
//! Selenium (tests/dashboard/*.py, run with pytest) against a real broker.
//!
//! One test runs the pages and their actions against a broker without auth; the other runs the
//! sign-in against a broker with static API tokens. The Python is the compatibility suite's
//! (`queen_testkit::pytest`; tests/compat/requirements.txt pins Selenium). Chromium and
//! chromedriver are Debian's
//! (`/usr/bin/chromium`, `/usr/bin/chromedriver`, or `QUEEN_CHROMIUM` / `QUEEN_CHROMEDRIVER`).
//! Without any of them the tests fail saying what to install: a browser suite that skips itself
//! would let the dashboard break unnoticed. Screenshots of every page go to
//! `<target dir>/dashboard-screenshots`.

use std::path::{Path, PathBuf};

use queen_testkit::{BrokerProcess, TestDatabase, pytest, target_dir};

const SUITE: &str = "the dashboard's browser tests";

/// The broker records its history every second here (10 by default), so charts fill at once.
const SAMPLE_INTERVAL: (&str, &str) = ("QUEEN_STATS__SAMPLE_INTERVAL_SECONDS", "1");

/// Static API tokens of the auth run, made up for the tests (at least 16 characters each).
const ADMIN_TOKEN: &str = "dashboard-admin-token-5f0c9e2a7b41";
const READER_TOKEN: &str = "dashboard-reader-token-93d1a6e8c274";

/// The browser and its driver, or a failure that says what to install.
fn require_browser() {
    let wanted = [("QUEEN_CHROMIUM", "/usr/bin/chromium"), ("QUEEN_CHROMEDRIVER", "/usr/bin/chromedriver")];
    let missing: Vec<String> = wanted
        .iter()
        .map(|(var, default)| {
            std::env::var(var).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| (*default).to_owned())
        })
        .filter(|path| !Path::new(path).is_file())
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard tests drive a real browser and {} missing. Install Debian's Chromium and its WebDriver:\n    \
         apt-get install chromium chromium-driver\n\
         (scripts/test.sh does it when run as root), or set QUEEN_CHROMIUM and QUEEN_CHROMEDRIVER to them.",
        if missing.len() == 1 { format!("{} is", missing[0]) } else { format!("{} are", missing.join(" and ")) }
    );
}

/// Where the screenshots go; both tests write there, under names of their own.
fn screenshots() -> PathBuf {
    let dir = target_dir().join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir.canonicalize().unwrap_or(dir)
}

#[tokio::test]
async fn the_dashboard_shows_the_broker_and_acts_on_it_in_a_real_browser() {
    require_browser();
    let db = TestDatabase::create("dashboard").await;
    let dir = target_dir().join(format!("dashboard-buffer-{}", std::process::id()));
    let buffer = dir.to_string_lossy();
    let args = ["--database-url", db.url(), "--buffer-dir", &buffer];
    let broker = BrokerProcess::start(Path::new(env!("CARGO_BIN_EXE_queen")), &args, &[SAMPLE_INTERVAL]).await;
    run(&broker, &["tests/dashboard", "--ignore=tests/dashboard/test_auth.py"], &[]).await;
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_dashboard_asks_for_a_token_when_auth_is_on() {
    require_browser();
    let dir = target_dir().join(format!("dashboard-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let tokens = dir.join("tokens.toml");
    let file = format!(
        "[[token]]\nname = \"dashboard-admin\"\ntoken = \"{ADMIN_TOKEN}\"\nrole = \"admin\"\n\n\
         [[token]]\nname = \"dashboard-reader\"\ntoken = \"{READER_TOKEN}\"\nrole = \"read-only\"\n"
    );
    std::fs::write(&tokens, file).unwrap_or_else(|e| panic!("cannot write {}: {e}", tokens.display()));
    let db = TestDatabase::create("dashboard_auth").await;
    let buffer = dir.join("buffer");
    let (tokens, buffer) = (tokens.to_string_lossy(), buffer.to_string_lossy());
    let args = ["--database-url", db.url(), "--buffer-dir", &buffer];
    let envs = [SAMPLE_INTERVAL, ("QUEEN_AUTH__TOKENS_FILE", &*tokens)];
    let broker = BrokerProcess::start(Path::new(env!("CARGO_BIN_EXE_queen")), &args, &envs).await;
    let tokens = [("QUEEN_DASHBOARD_ADMIN_TOKEN", ADMIN_TOKEN), ("QUEEN_DASHBOARD_READER_TOKEN", READER_TOKEN)];
    run(&broker, &["tests/dashboard/test_auth.py"], &tokens).await;
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the pytest `targets` against `broker`, with the screenshots' directory.
async fn run(broker: &BrokerProcess, targets: &[&str], envs: &[(&str, &str)]) {
    let screenshots = screenshots();
    let screenshots = screenshots.to_string_lossy();
    let mut envs = envs.to_vec();
    envs.push(("QUEEN_DASHBOARD_SCREENSHOTS", &screenshots));
    let report = pytest::run(SUITE, broker, targets, &envs).await;
    println!("{report}\n(screenshots in {screenshots})");
}
