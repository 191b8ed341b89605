//! Queen's test harness: a shared PostgreSQL cluster and a fresh database per test.
//!
//! The cluster is the embedded one from [`queen_store::embedded`], kept in
//! `<target dir>/queen-test-pg` and left running after the tests (a wrapper script stops it). Set
//! `QUEEN_TEST_DATABASE_URL` to the admin URL of an existing server to use that instead. Many test
//! processes start the cluster at once (nextest runs one process per test); the embedded start's
//! lock file makes that safe: one starts it, the others adopt it.
//!
//! Failures panic: this crate runs only inside tests, where a panic is how a test fails.

pub mod in_process;
mod json_server;
mod process;
pub mod pytest;
pub mod statements_cluster;
pub mod tls_cluster;

use std::path::{Path, PathBuf};

use queen_store::embedded::{EmbeddedOptions, EmbeddedPostgres};
use queen_store::tls::PgTarget;
use tokio::sync::OnceCell;
use tokio_postgres::Client;

pub use json_server::JsonServer;
pub use process::BrokerProcess;

/// Admin URL of an existing server to use instead of the embedded cluster.
const EXTERNAL_URL_VAR: &str = "QUEEN_TEST_DATABASE_URL";

/// Durability is worthless for throwaway test data, and speed is not; many tests run at once.
///
/// `authentication_timeout`: a test that ends while its broker is still opening a connection
/// blocks its runtime in `TestDatabase`'s drop, so that connection's handshake stalls; `DROP
/// DATABASE` then waits for the stalled backend (it cannot accept the drop's barrier while
/// authenticating) until the server gives up on it, 60 s by default.
const TEST_SETTINGS: [(&str, &str); 6] = [
    ("fsync", "off"),
    ("synchronous_commit", "off"),
    ("full_page_writes", "off"),
    ("max_connections", "500"),
    ("shared_buffers", "128MB"),
    ("authentication_timeout", "5s"),
];

const NAME_PREFIX: &str = "queen_test_";

/// PostgreSQL truncates identifiers to 63 bytes; staying below keeps names exact.
const MAX_NAME_LEN: usize = 62;

/// Admin URL (to database `postgres`) of the shared test cluster, starting it if needed.
pub async fn shared_cluster_url() -> String {
    // Holds a plain String, not a connection, so it serves every test's runtime alike.
    static URL: OnceCell<String> = OnceCell::const_new();
    URL.get_or_init(start_or_adopt_cluster).await.clone()
}

async fn start_or_adopt_cluster() -> String {
    if let Some(url) = std::env::var(EXTERNAL_URL_VAR).ok().filter(|url| !url.is_empty()) {
        return url;
    }
    let options = EmbeddedOptions {
        data_dir: target_dir().join("queen-test-pg"),
        bin_dir: None,
        port: None,
        settings: TEST_SETTINGS.iter().map(|&(name, value)| (name.to_owned(), value.to_owned())).collect(),
    };
    let data_dir = options.data_dir.clone();
    let cluster = EmbeddedPostgres::start(options)
        .await
        .unwrap_or_else(|e| panic!("cannot start the shared test cluster in {}: {e}", data_dir.display()));
    cluster.url("postgres")
}

/// A sample of the Prometheus metrics of the broker at `base`, named as exposed (with its
/// labels); 0 when absent, as for a counter never incremented.
pub async fn metric_at(http: &reqwest::Client, base: &str, sample: &str) -> f64 {
    let text = http
        .get(format!("{base}/metrics?format=prometheus"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .find_map(|line| line.strip_prefix(sample).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// An HTTP client builder for tests. reqwest is built with rustls and no provider of its own, so
/// the process-wide one is installed first.
pub fn http() -> reqwest::ClientBuilder {
    queen_store::tls::install_crypto_provider();
    reqwest::Client::builder()
}

/// Cargo's target directory: `CARGO_TARGET_DIR`, else `<workspace root>/target`.
pub fn target_dir() -> PathBuf {
    let workspace_root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    // A relative CARGO_TARGET_DIR is relative to where cargo ran, normally the workspace root, but
    // tests run in their package's directory. Joining an absolute path replaces the root.
    workspace_root.join(std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into()))
}

/// A database of its own for one test, dropped when the value is.
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
    admin_url: String,
    /// Set by [`TestDatabase::drop_database`] so that `Drop` has nothing left to do.
    dropped: bool,
}

impl TestDatabase {
    /// Creates a fresh database named `queen_test_<label>_<8 hex chars>`, the label reduced to
    /// `[a-z0-9_]` and shortened to keep the name under 63 bytes.
    pub async fn create(label: &str) -> TestDatabase {
        Self::create_in(&shared_cluster_url().await, label).await
    }

    /// As [`TestDatabase::create`], on the server of `admin_url` (a superuser's URL, which may
    /// carry `sslmode` and the other TLS parameters of `queen_store::tls`).
    pub async fn create_in(admin_url: &str, label: &str) -> TestDatabase {
        Self::create_at(admin_url, label, "").await
    }

    /// As [`TestDatabase::create`], with `options` after `CREATE DATABASE <name>` (an encoding,
    /// say).
    pub async fn create_with(label: &str, options: &str) -> TestDatabase {
        Self::create_at(&shared_cluster_url().await, label, options).await
    }

    async fn create_at(admin_url: &str, label: &str, options: &str) -> TestDatabase {
        let admin_url = admin_url.to_owned();
        let random = uuid::Uuid::new_v4().simple().to_string();
        // A simple UUID is 32 ASCII hex digits, so slicing 8 bytes is in bounds and on a char boundary.
        let name = database_name(label, &random[..8]);
        let admin = connect_to(&admin_url).await.unwrap_or_else(|e| panic!("cannot connect to {admin_url}: {e}"));
        // The name is [a-z0-9_] and starts with a letter: a valid identifier without quoting.
        admin
            .batch_execute(&format!("CREATE DATABASE {name} {options}"))
            .await
            .unwrap_or_else(|e| panic!("cannot create test database {name}: {e}"));
        TestDatabase { url: with_database(&admin_url, &name), name, admin_url, dropped: false }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// A new connection to this database, for assertions in tests; its connection task runs on the
    /// current runtime.
    pub async fn connect(&self) -> Client {
        connect_to(&self.url).await.unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.url))
    }

    /// Drops the database now, ending any sessions still connected to it.
    pub async fn drop_database(mut self) {
        drop_database_at(&self.admin_url, &self.name)
            .await
            .unwrap_or_else(|e| panic!("cannot drop test database {}: {e}", self.name));
        self.dropped = true;
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // Drop cannot await, and blocking the test's runtime on its own work would hang a
        // current-thread runtime, so the drop runs on a thread with a runtime of its own.
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        let spawned = std::thread::Builder::new().name(format!("drop {name}")).spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(drop_database_at(&admin_url, &name))?;
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        });
        let error = match spawned.map(std::thread::JoinHandle::join) {
            Ok(Ok(Ok(()))) => return,
            Ok(Ok(Err(e))) => e.to_string(),
            Ok(Err(_panic)) => "the dropping thread panicked".to_owned(),
            Err(e) => format!("cannot spawn the dropping thread: {e}"),
        };
        tracing::warn!(database = %self.name, "cannot drop test database: {error}");
    }
}

/// `queen_test_<label>_<suffix>` with the label reduced to `[a-z0-9_]` and cut to fit.
fn database_name(label: &str, suffix: &str) -> String {
    let room = MAX_NAME_LEN - NAME_PREFIX.len() - 1 - suffix.len();
    let label: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
        .take(room)
        .collect();
    format!("{NAME_PREFIX}{label}_{suffix}")
}

/// `url` with its database replaced by `database`; scheme, credentials, host and query are kept.
fn with_database(url: &str, database: &str) -> String {
    let authority_start = url.find("://").map_or(0, |i| i + 3);
    let authority_end = url[authority_start..].find(['/', '?']).map_or(url.len(), |i| authority_start + i);
    let query = url[authority_end..].find('?').map_or("", |i| &url[authority_end + i..]);
    format!("{}/{database}{query}", &url[..authority_end])
}

/// Connects as the broker would: `url` may carry `sslmode` (default `prefer`) and the TLS files.
async fn connect_to(url: &str) -> Result<Client, Box<dyn std::error::Error + Send + Sync>> {
    let (client, connection) = PgTarget::from_connection_string(url)?.connect().await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("test database connection ended: {e}");
        }
    });
    Ok(client)
}

async fn drop_database_at(admin_url: &str, name: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let admin = connect_to(admin_url).await?;
    // FORCE ends sessions a test left open, which would otherwise make the drop fail.
    Ok(admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sanitised_and_fit_in_an_identifier() {
        assert_eq!(database_name("Topic Fan-out", "0123abcd"), "queen_test_topic_fan_out_0123abcd");
        assert_eq!(database_name("ünïcode", "0123abcd"), "queen_test__n_code_0123abcd");
        let long = database_name(&"x".repeat(100), "0123abcd");
        assert_eq!(long.len(), MAX_NAME_LEN);
        assert!(long.ends_with("x_0123abcd"), "{long}");
    }

    #[test]
    fn urls_get_the_database_swapped_and_keep_the_rest() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "t"),
            "postgres://postgres@127.0.0.1:5432/t"
        );
        assert_eq!(
            with_database("postgresql://u:p@db.example:6432/admin?sslmode=disable", "t"),
            "postgresql://u:p@db.example:6432/t?sslmode=disable"
        );
        assert_eq!(with_database("postgres://db.example", "t"), "postgres://db.example/t");
        assert_eq!(
            with_database("postgres://db.example?application_name=x", "t"),
            "postgres://db.example/t?application_name=x"
        );
    }
}
