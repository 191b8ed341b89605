//! HTTPS on the listener: a broker given a certificate and key serves its API over TLS only, and
//! takes a new certificate written over the files without a restart, keeping the one it has when
//! the files cannot be used. A long poll whose client left is seen to have gone over TLS too.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_broker::config::Config;
use queen_broker::startup::Application;
use queen_testkit::{TestDatabase, target_dir};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;

use crate::helpers::TestApp;
use crate::long_poll::{
    a_push_to_a_left_poll_goes_to_a_consumer_that_is_there, until_no_poll_is_parked, until_parked,
    until_the_broker_received_the_close,
};

/// How long a changed certificate may take to be served: the broker looks every 2 s.
const RELOAD_BOUND: Duration = Duration::from_secs(30);

struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A server certificate and its key, PEM.
struct Leaf {
    der: CertificateDer<'static>,
    cert_pem: String,
    key_pem: String,
}

impl Ca {
    fn new() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, "queen test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a CA key")).expect("a CA");
        Ca { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for 127.0.0.1 with its own key, serial and common name.
    fn leaf(&self, serial: u64, name: &str) -> Leaf {
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.serial_number = Some(serial.into());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &*self.issuer).expect("a certificate");
        Leaf { der: cert.der().clone(), cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }
}

/// The files the broker is given, in a directory of their own.
struct Files {
    dir: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Files {
    fn new() -> Files {
        let dir = target_dir().join("api-tls").join(uuid::Uuid::new_v4().simple().to_string());
        std::fs::create_dir_all(&dir).expect("a directory for the certificate");
        Files { cert: dir.join("tls.crt"), key: dir.join("tls.key"), dir }
    }

    /// Overwrites both files in place, the key first.
    fn write(&self, leaf: &Leaf) {
        std::fs::write(&self.key, &leaf.key_pem).expect("write the key");
        std::fs::write(&self.cert, &leaf.cert_pem).expect("write the certificate");
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// The broker's log lines, captured on the test's thread, which runs the broker's own tasks (the
/// certificate reloads among them).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("the log")).into_owned()
    }

    fn clear(&self) {
        self.0.lock().expect("the log").clear();
    }
}

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("the log").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// A broker serving HTTPS with a certificate `ca` issued, and the files it reads.
async fn spawn_https(ca: &Ca) -> (TestApp, Files) {
    let files = Files::new();
    files.write(&ca.leaf(1, "queen"));
    let (cert, key) = (files.cert.clone(), files.key.clone());
    let app = TestApp::spawn_https(https_client(ca), |config| {
        config.http.tls_cert_file = Some(cert);
        config.http.tls_key_file = Some(key);
    })
    .await;
    (app, files)
}

fn https_client(ca: &Ca) -> reqwest::Client {
    let root = reqwest::Certificate::from_pem(ca.pem().as_bytes()).expect("the CA, PEM");
    queen_testkit::http().tls_certs_only([root]).timeout(Duration::from_secs(60)).build().expect("an HTTPS client")
}

/// A TLS client's configuration that trusts only `ca`.
fn trusting(ca: &Ca) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.issuer.der().clone()).expect("the CA");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// What one new TLS connection was served.
struct Served {
    leaf: CertificateDer<'static>,
    alpn: Option<Vec<u8>>,
    response: String,
}

/// Opens a new connection (no session to resume), offering h2 and http/1.1, and asks for
/// `/health` over it.
async fn connect(port: u16, ca: &Ca) -> Served {
    let mut config = trusting(ca);
    tokio::task::spawn_blocking(move || {
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        config.resumption = rustls::client::Resumption::disabled();
        let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
        let connection = rustls::ClientConnection::new(Arc::new(config), name).expect("a TLS client");
        let socket = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");
        socket.set_read_timeout(Some(Duration::from_secs(10))).expect("a read timeout");
        let mut tls = rustls::StreamOwned::new(connection, socket);
        tls.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").expect("a request");
        let mut response = Vec::new();
        // The server may close without close_notify once it answered; what was read is the answer.
        let _ = tls.read_to_end(&mut response);
        let leaf = tls.conn.peer_certificates().expect("a certificate")[0].clone().into_owned();
        let alpn = tls.conn.alpn_protocol().map(<[u8]>::to_vec);
        Served { leaf, alpn, response: String::from_utf8_lossy(&response).into_owned() }
    })
    .await
    .expect("the connection task")
}

/// New connections until one is served `leaf`; how long that took.
async fn wait_until_served(port: u16, ca: &Ca, leaf: &Leaf, what: &str) -> Duration {
    let start = Instant::now();
    loop {
        if connect(port, ca).await.leaf == leaf.der {
            return start.elapsed();
        }
        assert!(start.elapsed() < RELOAD_BOUND, "{what} was not served within {RELOAD_BOUND:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Until the log holds a line with every one of `needles`.
async fn wait_for_log(log: &Captured, needles: &[&str], what: &str) {
    let start = Instant::now();
    while !log.text().lines().any(|line| needles.iter().all(|needle| line.contains(needle))) {
        assert!(start.elapsed() < RELOAD_BOUND, "{what}: no log line with {needles:?} in:\n{}", log.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn port_of(app: &TestApp) -> u16 {
    app.base.rsplit(':').next().and_then(|port| port.parse().ok()).expect("a port in the base URL")
}

#[actix_web::test]
async fn a_broker_given_a_certificate_serves_https_only_and_reloads_the_certificate_without_a_restart() {
    let log = Captured::default();
    let subscriber = tracing_subscriber::fmt().with_writer(log.clone()).with_ansi(false).finish();
    let _log = tracing::subscriber::set_default(subscriber);
    let ca = Ca::new();
    let first = ca.leaf(1, "queen-first");
    let files = Files::new();
    files.write(&first);
    let (cert, key) = (files.cert.clone(), files.key.clone());
    let app = TestApp::spawn_https(https_client(&ca), |config| {
        config.http.tls_cert_file = Some(cert);
        config.http.tls_key_file = Some(key);
    })
    .await;
    let port = port_of(&app);
    assert!(app.base.starts_with("https://"));
    assert!(log.text().contains(&format!("queen listening on port {port} (https)")), "{}", log.text());

    // The API over HTTPS, with a client that trusts only the test's CA.
    let pushed = app.push_one("https", "p", "tx-1", json!({"over": "tls"})).await;
    assert_eq!(pushed["status"], "queued", "{pushed}");
    let popped = app.pop("queue/https", "batch=1&wait=false").await;
    assert_eq!(popped.messages().len(), 1, "{popped:?}");
    assert_eq!(popped.messages()[0]["data"], json!({"over": "tls"}));

    // Plain HTTP to the TLS port gets no answer.
    let plain = queen_testkit::http().timeout(Duration::from_secs(10)).build().expect("a client");
    let refused = plain.get(format!("http://127.0.0.1:{port}/health")).send().await;
    assert!(refused.is_err(), "plain HTTP was answered: {refused:?}");

    let served = connect(port, &ca).await;
    assert_eq!(served.leaf, first.der, "the configured certificate");
    assert_eq!(served.alpn.as_deref(), Some(&b"http/1.1"[..]), "HTTP/1.1 is agreed, even to a client offering h2");
    assert!(served.response.starts_with("HTTP/1.1 200"), "{}", served.response);

    // A second certificate written over the files is served to new connections, same broker.
    let second = ca.leaf(2, "queen-second");
    files.write(&second);
    let took = wait_until_served(port, &ca, &second, "the second certificate").await;
    eprintln!("the second certificate was served {took:?} after it was written");
    wait_for_log(&log, &["reloaded the listener's certificate"], "the reload is logged").await;
    let pushed = app.push_one("https", "p", "tx-2", json!({"after": "reload"})).await;
    assert_eq!(pushed["status"], "queued", "the API still answers over HTTPS: {pushed}");

    // A half-written certificate file: the reload fails, is logged naming the file, and the
    // current certificate stays.
    log.clear();
    let third = ca.leaf(3, "queen-third");
    std::fs::write(&files.cert, &third.cert_pem[..third.cert_pem.len() / 2]).expect("half a certificate");
    let cert_name = files.cert.display().to_string();
    wait_for_log(&log, &["cannot reload the listener's certificate", &cert_name], "the failed reload").await;
    let served = connect(port, &ca).await;
    assert_eq!(served.leaf, second.der, "a file that cannot be used keeps the certificate served");
    assert!(served.response.starts_with("HTTP/1.1 200"), "{}", served.response);

    // Once the files are whole again they are taken; SIGHUP reloads them whatever their state.
    files.write(&third);
    wait_until_served(port, &ca, &third, "the third certificate").await;
    log.clear();
    nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
    wait_for_log(&log, &["reloaded the listener's certificate", "forced=true"], "the reload on SIGHUP").await;
    assert_eq!(connect(port, &ca).await.leaf, third.der);
}

#[actix_web::test]
async fn a_certificate_or_key_that_cannot_be_used_stops_start_up_naming_the_file() {
    let db = TestDatabase::create("https_bad_files").await;
    let ca = Ca::new();
    let files = Files::new();
    let leaf = ca.leaf(1, "queen");
    files.write(&leaf);
    let garbage = files.dir.join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n").expect("write");
    let other_key = files.dir.join("other.key");
    std::fs::write(&other_key, ca.leaf(2, "other").key_pem).expect("write");
    let missing = files.dir.join("missing.crt");

    let start = |cert: &Path, key: &Path| {
        Application::build(queen_testkit::in_process::config(&db, |config: &mut Config| {
            config.http.workers = 1;
            config.database.pool_size = 2;
            config.http.tls_cert_file = Some(cert.into());
            config.http.tls_key_file = Some(key.into());
        }))
    };
    for (cert, key, setting, named) in [
        (&missing, &files.key, "http.tls_cert_file", &missing),
        (&files.cert, &garbage, "http.tls_key_file", &garbage),
        (&garbage, &files.key, "http.tls_cert_file", &garbage),
        (&files.cert, &other_key, "http.tls_key_file", &other_key),
    ] {
        let Err(error) = start(cert, key).await else {
            panic!("the broker started with {} and {}", cert.display(), key.display());
        };
        let text = error.to_string();
        assert!(text.contains(setting) && text.contains(&*named.to_string_lossy()), "{text}");
        assert_eq!(text.lines().count(), 1, "one line: {text}");
    }
}

/// Sends a long poll of `queue` over a TLS connection of its own, waits until it is parked, and
/// leaves as a TLS client does: a close_notify alert, then the connection closed. Returns once
/// the broker's end has received the close.
async fn abandon_a_long_poll_over_tls(app: &TestApp, ca: &Ca, queue: &str) {
    let port = port_of(app);
    let config = trusting(ca);
    let request =
        format!("GET /api/v1/pop/queue/{queue}?batch=1&wait=true&timeout=30000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    // Blocking I/O, off the test's thread, which runs the broker.
    let tls = tokio::task::spawn_blocking(move || {
        let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
        let connection = rustls::ClientConnection::new(Arc::new(config), name).expect("a TLS client");
        let socket = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");
        let mut tls = rustls::StreamOwned::new(connection, socket);
        tls.write_all(request.as_bytes()).expect("the request");
        tls.flush().expect("the request sent");
        tls
    })
    .await
    .expect("the connection task");
    until_parked(app, 1).await;
    let client_port = tls.sock.local_addr().expect("the client's address").port();
    tokio::task::spawn_blocking(move || {
        let mut tls = tls;
        tls.conn.send_close_notify();
        tls.flush().expect("the close_notify sent");
    })
    .await
    .expect("the closing task");
    until_the_broker_received_the_close(port, client_port).await;
}

#[actix_web::test]
async fn a_long_poll_over_https_whose_client_left_claims_nothing_and_gives_its_place_back() {
    let ca = Ca::new();
    let (app, _files) = spawn_https(&ca).await;
    abandon_a_long_poll_over_tls(&app, &ca, "left").await;
    a_push_to_a_left_poll_goes_to_a_consumer_that_is_there(&app, "left").await;
    abandon_a_long_poll_over_tls(&app, &ca, "idle").await;
    until_no_poll_is_parked(&app).await;
}
