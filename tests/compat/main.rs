//! Compatibility: the unmodified official Python client (`queen-mq`, pinned in
//! `tests/compat/requirements.txt`) against a real broker.
//!
//! Each test starts one broker on a fresh database and runs pytest files of `tests/compat` against
//! it: the suite, then the files that need a broker of their own (JWT auth, HTTPS, creation
//! limits, a database outage, a full broker). pytest reports the individual cases (`queen_testkit::pytest` says which Python).

use std::path::Path;
use std::time::{Duration, Instant};

use queen_testkit::tls_cluster::TestCertificates;
use queen_testkit::{BrokerProcess, JsonServer, TestDatabase, pytest, target_dir};

/// The broker's encryption key (AES-256, 64 hex characters), made up for the tests.
const ENCRYPTION_KEY: &str = "2b7e151628aed2a6abf7158809cf4f3c2b7e151628aed2a6abf7158809cf4f3c";

const SUITE: &str = "the Python client's compatibility suite";

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
    // The auth, HTTPS and limits tests need brokers of their own (below).
    let targets = [
        "tests/compat",
        "--ignore=tests/compat/test_auth.py",
        "--ignore=tests/compat/test_https.py",
        "--ignore=tests/compat/test_limits.py",
        "--ignore=tests/compat/test_outage.py",
        "--ignore=tests/compat/test_overload.py",
    ];
    let report = pytest::run(SUITE, &broker, &targets, &[]).await;
    println!("{report}");
}

/// The HS256 secret of the auth run, made up for the tests.
const JWT_SECRET: &str = "compat-hs256-secret-0123456789abcdef";
const RS256_KID: &str = "compat-rs256";

#[tokio::test]
async fn the_official_python_client_works_against_a_broker_with_jwt_auth() {
    let fixtures = pytest::workspace_root().join("tests/fixtures/auth");
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
    println!("{}", pytest::run(SUITE, &broker, &["tests/compat/test_auth.py"], &settings).await);
    assert!(jwks.requests() > 0, "the broker fetched the JWKS");
}

#[tokio::test]
async fn the_official_python_client_works_against_a_broker_serving_https() {
    // A certificate for 127.0.0.1 from a CA of the test's own, which the client is told to trust.
    let dir = target_dir().join(format!("compat-https-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the certificate");
    let certificates = TestCertificates::generate();
    let (ca, cert, key) = (dir.join("ca.pem"), dir.join("tls.crt"), dir.join("tls.key"));
    for (path, text) in
        [(&ca, &certificates.ca_pem), (&cert, &certificates.server_cert_pem), (&key, &certificates.server_key_pem)]
    {
        std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let db = TestDatabase::create("compat_https").await;
    let (cert, key) = (cert.to_string_lossy(), key.to_string_lossy());
    let envs = [("QUEEN_HTTP__TLS_CERT_FILE", &*cert), ("QUEEN_HTTP__TLS_KEY_FILE", &*key)];
    let broker =
        BrokerProcess::start(Path::new(env!("CARGO_BIN_EXE_queen")), &["--database-url", db.url()], &envs).await;
    assert!(broker.url().starts_with("https://"), "the broker serves HTTPS: {}", broker.url());
    // httpx, under the official client, trusts the CA named by SSL_CERT_FILE.
    let ca = ca.to_string_lossy();
    println!("{}", pytest::run(SUITE, &broker, &["tests/compat/test_https.py"], &[("SSL_CERT_FILE", &*ca)]).await);
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn the_official_python_client_is_told_at_once_of_a_creation_limit() {
    let db = TestDatabase::create("compat_limits").await;
    let envs = [("QUEEN_LIMITS__MAX_QUEUES", "3"), ("QUEEN_LIMITS__MAX_GROUPS_PER_QUEUE", "1")];
    let broker =
        BrokerProcess::start(Path::new(env!("CARGO_BIN_EXE_queen")), &["--database-url", db.url()], &envs).await;
    println!("{}", pytest::run(SUITE, &broker, &["tests/compat/test_limits.py"], &[]).await);
}

#[tokio::test]
async fn the_official_python_clients_consumer_outlives_a_full_broker() {
    let db = TestDatabase::create("compat_overload").await;
    let envs = [("QUEEN_LIMITS__PARKED_LONG_POLLS", "1")];
    let broker =
        BrokerProcess::start(Path::new(env!("CARGO_BIN_EXE_queen")), &["--database-url", db.url()], &envs).await;
    println!("{}", pytest::run(SUITE, &broker, &["tests/compat/test_overload.py"], &[]).await);
}

/// How long the database stays cut off: longer than the client's own retries of a request
/// (three attempts over 3 s), so that its consume loop sees the pops fail.
const OUTAGE: Duration = Duration::from_secs(8);

#[tokio::test]
async fn the_official_python_clients_consumer_outlives_a_database_outage() {
    let db = TestDatabase::create("compat_outage").await;
    let broker = BrokerProcess::start(Path::new(env!("CARGO_BIN_EXE_queen")), &["--database-url", db.url()], &[]).await;
    let suite = pytest::run(SUITE, &broker, &["tests/compat/test_outage.py"], &[]);
    let url = broker.url();
    let (report, ()) = tokio::join!(suite, cut_off_once_consumed(&db, &url));
    println!("{report}");
}

/// Once test_outage.py's consumer has acknowledged its first message, refuses new connections to
/// the database and ends the broker's own for [`OUTAGE`], then lets them in again.
async fn cut_off_once_consumed(db: &TestDatabase, broker: &str) {
    let admin = db.connect().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let acknowledged = "SELECT count(*) FROM queen.log_consumers
                         WHERE consumer_group = 'outlives-the-outage' AND committed >= 1";
    while admin.query_one(acknowledged, &[]).await.map_or(0, |row| row.get::<_, i64>(0)) == 0 {
        assert!(Instant::now() < deadline, "the consumer never acknowledged its first message");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // From outside the database: PostgreSQL cannot cut off the one it is connected to.
    let name = db.name();
    let mut outside: tokio_postgres::Config = db.url().parse().expect("the database URL");
    let (cluster, connection) = outside.dbname("postgres").connect(tokio_postgres::NoTls).await.expect("a connection");
    tokio::spawn(connection);
    cluster.batch_execute(&format!("ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS false")).await.expect("cut off");
    let ended = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1";
    cluster.execute(ended, &[&name]).await.expect("the broker's connections ended");
    tokio::time::sleep(OUTAGE).await;
    let http = queen_testkit::http().build().expect("a client");
    let failures = queen_testkit::metric_at(&http, broker, "queen_db_errors_total{kind=\"unavailable\"}").await;
    cluster.batch_execute(&format!("ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS true")).await.expect("let back");
    assert!(failures >= 3.0, "the consumer's pops failed meanwhile ({failures} database failures)");
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
