//! A throwaway PostgreSQL that records every statement it runs (`pg_stat_statements`), for tests
//! that check what SQL the broker sends, such as the routing rule of `docs/scale-out.md`.
//!
//! It lives in `<target dir>/queen-test-pg-statements/` and is started and adopted like the shared
//! cluster. It is a cluster of its own because the extension must be loaded at server start, and
//! because its statement table is bounded: the shared cluster's hundreds of test databases would
//! push one test's entries out of it.

use queen_store::embedded::{EmbeddedOptions, EmbeddedPostgres};
use tokio::sync::OnceCell;

use crate::{TEST_SETTINGS, TestDatabase, target_dir};

/// A database of its own on the recording cluster, with `pg_stat_statements` installed.
pub async fn create_database(label: &str) -> TestDatabase {
    let db = TestDatabase::create_in(&cluster_url().await, label).await;
    db.connect()
        .await
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .unwrap_or_else(|e| panic!("cannot install pg_stat_statements in {}: {e}", db.name()));
    db
}

/// The SQL of every statement run in `db` since it was created, as PostgreSQL normalised it
/// (constants replaced by `$n`), with how many times each ran. Statements inside functions are
/// included.
pub async fn statements_of(db: &TestDatabase) -> Vec<(String, i64)> {
    // The extension's view exists in the databases it was installed in.
    db.connect()
        .await
        .query(
            "SELECT s.query, s.calls FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
              WHERE d.datname = $1 ORDER BY s.query",
            &[&db.name()],
        )
        .await
        .expect("pg_stat_statements")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

async fn cluster_url() -> String {
    static URL: OnceCell<String> = OnceCell::const_new();
    URL.get_or_init(start_or_adopt).await.clone()
}

async fn start_or_adopt() -> String {
    let mut settings: Vec<(String, String)> =
        TEST_SETTINGS.iter().map(|&(name, value)| (name.to_owned(), value.to_owned())).collect();
    for (name, value) in [
        ("shared_buffers", "32MB"),
        ("max_connections", "100"),
        ("shared_preload_libraries", "pg_stat_statements"),
        ("pg_stat_statements.track", "all"),
        ("pg_stat_statements.max", "20000"),
    ] {
        settings.push((name.into(), value.into()));
    }
    let options = EmbeddedOptions {
        data_dir: target_dir().join("queen-test-pg-statements"),
        bin_dir: None,
        port: None,
        settings,
    };
    let data_dir = options.data_dir.clone();
    let cluster = EmbeddedPostgres::start(options)
        .await
        .unwrap_or_else(|e| panic!("cannot start the recording test cluster in {}: {e}", data_dir.display()));
    cluster.url("postgres")
}
