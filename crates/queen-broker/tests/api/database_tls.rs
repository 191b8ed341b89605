//! TLS from the broker to PostgreSQL, against the harness's cluster that takes TLS connections
//! only (`queen_testkit::tls_cluster`: its own CA, a server certificate for `localhost` and
//! 127.0.0.1, `hostssl` lines only). What should connect does, over TLS on every connection; what
//! should not stops start-up, and the error says why.

use std::time::{Duration, Instant};

use queen_broker::config::Config;
use queen_broker::startup::Application;
use queen_testkit::tls_cluster::{CERT_USER, TlsCluster, tls_cluster};
use queen_testkit::{TestDatabase, target_dir};
use serde_json::json;

use crate::helpers::TestApp;

/// A name that is not in the server's certificate; `hostaddr` takes the connection to 127.0.0.1,
/// while the certificate is checked against this name (no DNS involved).
const WRONG_NAME: &str = "not-in-the-certificate.queen.test";

fn config_for(url: String) -> Config {
    let mut config = Config::default();
    config.http.host = "127.0.0.1".into();
    config.http.port = 0;
    config.http.workers = 2;
    config.database.url = Some(url);
    config.database.pool_size = 4;
    config.buffer.dir = target_dir().join("api-buffers").join(uuid::Uuid::new_v4().simple().to_string());
    config
}

/// A broker on `db` whose configuration `tweak` sets up; the test's helpers speak to it.
async fn spawn(db: TestDatabase, tweak: impl FnOnce(&mut Config)) -> TestApp {
    let mut config = config_for(String::new());
    tweak(&mut config);
    config.validate().expect("valid settings");
    let app = Application::build(config).await.unwrap_or_else(|e| panic!("the broker did not start: {e}"));
    let base = format!("http://127.0.0.1:{}", app.port());
    actix_web::rt::spawn(app.run_until_stopped());
    let http = queen_testkit::http().timeout(Duration::from_secs(60)).build().expect("an HTTP client");
    TestApp { base, http, db }
}

/// What start-up says when the broker on `url` cannot use its database.
async fn refusal(url: String) -> String {
    let config = config_for(url);
    config.validate().expect("the settings themselves are valid");
    let started = Instant::now();
    let error = match Application::build(config).await {
        Ok(_) => panic!("the broker started"),
        Err(e) => e.to_string(),
    };
    assert!(started.elapsed() < Duration::from_secs(10), "refused at once, not after retries: {error}");
    assert!(!error.contains('\n'), "one line: {error}");
    error
}

fn query(cluster: &TlsCluster, parameters: &str) -> String {
    parameters
        .replace("{ca}", &cluster.ca_file().display().to_string())
        .replace("{other_ca}", &cluster.other_ca_file().display().to_string())
}

async fn push_and_pop(app: &TestApp) {
    let pushed = app.push_one("tls", "p", "over-tls", json!({"n": 7})).await;
    assert_eq!(pushed["status"], "queued", "{pushed}");
    let answer = app.pop("queue/tls", "batch=1").await;
    assert_eq!(answer.data_ints("n"), vec![7], "{answer:?}");
}

/// `(application_name, ssl)` of the broker's sessions on its database, once the pool's and the
/// LISTEN connection are all there.
async fn broker_sessions(app: &TestApp) -> Vec<(String, bool)> {
    let client = app.db.connect().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = client
            .query(
                "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
                  WHERE a.datname = current_database() AND a.application_name IN ('queen', 'queen-listen')
                  ORDER BY 1",
                &[],
            )
            .await
            .expect("reading pg_stat_ssl");
        let sessions: Vec<(String, bool)> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
        let has = |name: &str| sessions.iter().any(|(application, _)| application == name);
        if has("queen") && has("queen-listen") {
            return sessions;
        }
        assert!(Instant::now() < deadline, "the broker's connections did not all show up: {sessions:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_web::test]
async fn require_connects_and_every_connection_of_the_broker_is_encrypted() {
    let cluster = tls_cluster().await;
    let db = cluster.create_database("tls_require").await;
    let url = cluster.url("127.0.0.1", db.name(), "sslmode=require");
    let app = spawn(db, |config| config.database.url = Some(url)).await;
    push_and_pop(&app).await;
    let sessions = broker_sessions(&app).await;
    assert!(sessions.iter().all(|(_, ssl)| *ssl), "a broker connection without TLS: {sessions:?}");
    assert_eq!(app.get("/ready").await.status, reqwest::StatusCode::OK);
}

#[actix_web::test]
async fn verify_full_with_the_right_ca_connects() {
    let cluster = tls_cluster().await;
    let db = cluster.create_database("tls_verify_full").await;
    let url = cluster.url("localhost", db.name(), &query(cluster, "sslmode=verify-full&sslrootcert={ca}"));
    let app = spawn(db, |config| config.database.url = Some(url)).await;
    push_and_pop(&app).await;
    assert!(broker_sessions(&app).await.iter().all(|(_, ssl)| *ssl));
}

#[actix_web::test]
async fn the_settings_and_upstream_names_turn_verification_on_as_the_url_does() {
    // PG_USE_SSL=true with PG_SSL_REJECT_UNAUTHORIZED=true is verify-full; the CA from the
    // `[database]` settings, the URL without any TLS parameter.
    let cluster = tls_cluster().await;
    let db = cluster.create_database("tls_settings").await;
    let url = cluster.url("127.0.0.1", db.name(), "");
    let ca = cluster.ca_file();
    let app = spawn(db, |config| {
        config.database.url = Some(url);
        config.database.use_ssl = Some(true);
        config.database.ssl_reject_unauthorized = Some(true);
        config.database.sslrootcert = Some(ca);
    })
    .await;
    push_and_pop(&app).await;
}

#[actix_web::test]
async fn verify_full_with_a_wrong_ca_is_refused_saying_so() {
    let cluster = tls_cluster().await;
    let db = cluster.create_database("tls_wrong_ca").await;
    let error =
        refusal(cluster.url("localhost", db.name(), &query(cluster, "sslmode=verify-full&sslrootcert={other_ca}")))
            .await;
    assert!(error.contains("not signed by a trusted CA"), "{error}");
    assert!(error.contains(&format!("localhost:{}", cluster.port())), "names the server: {error}");
    // libpq's rule: `require` with a root certificate checks the chain too.
    let error =
        refusal(cluster.url("localhost", db.name(), &query(cluster, "sslmode=require&sslrootcert={other_ca}"))).await;
    assert!(error.contains("not signed by a trusted CA"), "{error}");
}

#[actix_web::test]
async fn verify_full_with_a_wrong_host_name_is_refused_saying_so_and_verify_ca_does_not_check_names() {
    let cluster = tls_cluster().await;
    let db = cluster.create_database("tls_wrong_name").await;
    let parameters = "sslmode=verify-full&sslrootcert={ca}&hostaddr=127.0.0.1";
    let error = refusal(cluster.url(WRONG_NAME, db.name(), &query(cluster, parameters))).await;
    assert!(error.contains(&format!("does not match the host name \"{WRONG_NAME}\"")), "{error}");
    assert!(error.contains("it is for localhost, 127.0.0.1"), "{error}");

    let url =
        cluster.url(WRONG_NAME, db.name(), &query(cluster, "sslmode=verify-ca&sslrootcert={ca}&hostaddr=127.0.0.1"));
    let app = spawn(db, |config| config.database.url = Some(url)).await;
    push_and_pop(&app).await;
}

#[actix_web::test]
async fn plaintext_is_refused_by_the_server() {
    let cluster = tls_cluster().await;
    let db = cluster.create_database("tls_plaintext").await;
    let error = refusal(cluster.url("127.0.0.1", db.name(), "sslmode=disable")).await;
    // The server's own words (pg_hba.conf has no line for a connection without encryption), and
    // what to do about it.
    assert!(error.contains("no pg_hba.conf entry") && error.contains("no encryption"), "{error}");
    assert!(error.contains("accepts only TLS connections"), "{error}");
}

#[actix_web::test]
async fn a_client_certificate_logs_its_user_in() {
    let cluster = tls_cluster().await;
    let db = cluster.create_database("tls_client_cert").await;
    db.connect()
        .await
        .batch_execute(&format!("ALTER DATABASE {} OWNER TO {CERT_USER}", db.name()))
        .await
        .expect("giving the database to the certificate's user");
    let parameters = format!(
        "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        cluster.ca_file().display(),
        cluster.client_cert_file().display(),
        cluster.client_key_file().display()
    );
    // Without the certificate, the user (who has no password) is not let in.
    let without = cluster.cert_user_url(db.name(), &query(cluster, "sslmode=verify-full&sslrootcert={ca}"));
    let error = match Application::build(config_for(without)).await {
        Ok(_) => panic!("the broker started without a client certificate"),
        Err(e) => e.to_string(),
    };
    assert!(
        error.contains("the server refused the connection: connection requires a valid client certificate"),
        "{error}"
    );
    let url = cluster.cert_user_url(db.name(), &parameters);
    let app = spawn(db, |config| config.database.url = Some(url)).await;
    push_and_pop(&app).await;
}

#[actix_web::test]
async fn prefer_still_connects_to_a_server_without_tls() {
    // The shared test cluster has no TLS; libpq's default mode falls back to plaintext.
    let app = TestApp::spawn_with(|config| config.database.sslmode = Some("prefer".into())).await;
    push_and_pop(&app).await;
    let sessions = broker_sessions(&app).await;
    assert!(sessions.iter().all(|(_, ssl)| !*ssl), "{sessions:?}");
}

#[actix_web::test]
async fn require_is_refused_by_a_server_without_tls_saying_so() {
    let db = TestDatabase::create("tls_require_plain").await;
    let url = format!("{}?sslmode=require", db.url());
    let error = refusal(url).await;
    assert!(error.contains("the server does not offer TLS, and sslmode requires it"), "{error}");
}
