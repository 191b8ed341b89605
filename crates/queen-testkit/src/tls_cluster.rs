//! A throwaway PostgreSQL that takes TLS connections only, for the tests of TLS to PostgreSQL.
//!
//! It lives in `<target dir>/queen-test-pg-tls/` (the cluster in `pg/`, its certificates in
//! `certs/`) and listens on 127.0.0.1 on a port of its own. Like the shared cluster, the first test
//! process that needs it starts it and the others adopt it, and it is left running afterwards; stop
//! it with `pg_ctl -D <target dir>/queen-test-pg-tls/pg -m fast stop` (as the `postgres` user when
//! root).
//!
//! The certificates are made with rcgen the first time and kept in `certs/`, so that every test
//! process trusts the CA the running server was started with: a CA, a server certificate it signed
//! for `localhost` and `127.0.0.1`, a client certificate it signed for [`CERT_USER`], and another CA
//! that signed nothing (a wrong CA). `pg_hba.conf` has `hostssl` lines only: a password for
//! everyone, a client certificate for [`CERT_USER`]; a plaintext connection is refused by the
//! server itself ("no pg_hba.conf entry ... no encryption").

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use queen_store::embedded::{DataFile, EmbeddedOptions, EmbeddedPostgres};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use tokio::sync::OnceCell;

use crate::{TEST_SETTINGS, TestDatabase, connect_to, target_dir};

/// The user the client certificate is for (its CN), who logs in with it alone.
pub const CERT_USER: &str = "queen_cert_user";

/// TLS connections only; a client certificate for [`CERT_USER`], a password for the others.
const HBA: &str = "\
# Written by queen-testkit: TLS connections only.
# TYPE   DATABASE  USER             ADDRESS       METHOD
local    all       all                            peer
hostssl  all       queen_cert_user  127.0.0.1/32  cert
hostssl  all       all              127.0.0.1/32  scram-sha-256
";

/// PEM texts of a CA, what it signed, and a CA that signed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestCertificates {
    pub ca_pem: String,
    /// For `localhost` and `127.0.0.1`, signed by the CA.
    pub server_cert_pem: String,
    pub server_key_pem: String,
    /// For [`CERT_USER`], signed by the CA.
    pub client_cert_pem: String,
    pub client_key_pem: String,
    /// A CA that signed neither certificate.
    pub other_ca_pem: String,
}

const FILES: [&str; 6] = ["ca.pem", "server.crt", "server.key", "client.crt", "client.key", "other-ca.pem"];

impl TestCertificates {
    /// A fresh set (ECDSA P-256 keys).
    pub fn generate() -> Self {
        let (ca_pem, ca) = certificate_authority("Queen test CA");
        let (other_ca_pem, _) = certificate_authority("Queen test CA that signed nothing");
        let (server_cert_pem, server_key_pem) =
            signed(&ca, &["localhost", "127.0.0.1"], "localhost", ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert_pem, client_key_pem) = signed(&ca, &[], CERT_USER, ExtendedKeyUsagePurpose::ClientAuth);
        TestCertificates { ca_pem, server_cert_pem, server_key_pem, client_cert_pem, client_key_pem, other_ca_pem }
    }

    fn texts(&self) -> [&str; 6] {
        [
            &self.ca_pem,
            &self.server_cert_pem,
            &self.server_key_pem,
            &self.client_cert_pem,
            &self.client_key_pem,
            &self.other_ca_pem,
        ]
    }

    fn read_from(dir: &Path) -> Option<Self> {
        let [ca_pem, server_cert_pem, server_key_pem, client_cert_pem, client_key_pem, other_ca_pem] =
            FILES.map(|name| std::fs::read_to_string(dir.join(name)).ok());
        Some(TestCertificates {
            ca_pem: ca_pem?,
            server_cert_pem: server_cert_pem?,
            server_key_pem: server_key_pem?,
            client_cert_pem: client_cert_pem?,
            client_key_pem: client_key_pem?,
            other_ca_pem: other_ca_pem?,
        })
    }

    /// Writes the set as `dir` whole: into a sibling first, then renamed into place.
    fn write_to(&self, dir: &Path) -> std::io::Result<()> {
        let staging = dir.with_extension(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&staging)?;
        for (name, text) in FILES.iter().zip(self.texts()) {
            let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(staging.join(name))?;
            std::io::Write::write_all(&mut file, text.as_bytes())?;
        }
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::rename(&staging, dir)
    }
}

fn certificate_authority(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names to check");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate().expect("a CA key");
    let cert = params.self_signed(&key).expect("a self-signed CA certificate");
    (cert.pem(), Issuer::new(params, key))
}

fn signed(
    issuer: &Issuer<'static, KeyPair>,
    names: &[&str],
    common_name: &str,
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let names: Vec<String> = names.iter().map(|&name| name.to_owned()).collect();
    let mut params = CertificateParams::new(names).expect("valid names");
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().expect("a key");
    let cert = params.signed_by(&key, issuer).expect("a certificate signed by the CA");
    (cert.pem(), key.serialize_pem())
}

/// The TLS-only cluster, started (or adopted) once per test process.
#[derive(Debug)]
pub struct TlsCluster {
    /// `postgres://postgres:<password>`, to which `@host:port/...` is added.
    credentials: String,
    port: u16,
    certs_dir: PathBuf,
    data_dir: PathBuf,
}

/// The TLS-only cluster, starting it if needed.
pub async fn tls_cluster() -> &'static TlsCluster {
    static CLUSTER: OnceCell<TlsCluster> = OnceCell::const_new();
    CLUSTER.get_or_init(start_or_adopt).await
}

async fn start_or_adopt() -> TlsCluster {
    let root = target_dir().join("queen-test-pg-tls");
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("cannot create {}: {e}", root.display()));
    // Held until the server runs with the certificates on disk: processes starting together
    // must not each make a set of their own.
    let lock = lock(&root.join("setup.lock")).await;
    let certs_dir = root.join("certs");
    let certs = match TestCertificates::read_from(&certs_dir) {
        Some(certs) => certs,
        None => {
            let certs = TestCertificates::generate();
            certs.write_to(&certs_dir).unwrap_or_else(|e| panic!("cannot write {}: {e}", certs_dir.display()));
            certs
        }
    };
    let files = [
        ("server.crt", &certs.server_cert_pem),
        ("server.key", &certs.server_key_pem),
        ("root.crt", &certs.ca_pem),
        ("pg_hba.conf", &HBA.to_owned()),
    ]
    .map(|(name, text)| DataFile { name: name.into(), contents: text.as_bytes().to_vec() });
    let mut settings: Vec<(String, String)> =
        TEST_SETTINGS.iter().map(|&(name, value)| (name.to_owned(), value.to_owned())).collect();
    for (name, value) in [
        ("shared_buffers", "32MB"),
        ("max_connections", "200"),
        ("ssl", "on"),
        ("ssl_cert_file", "server.crt"),
        ("ssl_key_file", "server.key"),
        ("ssl_ca_file", "root.crt"),
    ] {
        settings.push((name.into(), value.into()));
    }
    let options = EmbeddedOptions { data_dir: root.join("pg"), bin_dir: None, port: None, settings };
    let mut server = start(&options, &files).await;
    // A server adopted from an earlier run whose certificates were made again since must restart
    // with the new ones.
    let serving = std::fs::read_to_string(server.data_dir().join("server.crt")).ok();
    if serving.as_deref() != Some(certs.server_cert_pem.as_str()) {
        server.stop().await.unwrap_or_else(|e| panic!("cannot restart the TLS test cluster: {e}"));
        server = start(&options, &files).await;
    }
    drop(lock);
    let url = server.url("postgres");
    let credentials = url.split_once("@127.0.0.1:").map(|(credentials, _)| credentials.to_owned());
    let cluster = TlsCluster {
        credentials: credentials.unwrap_or_else(|| panic!("unexpected URL form {url}")),
        port: server.port(),
        certs_dir,
        data_dir: server.data_dir().to_path_buf(),
    };
    let admin =
        connect_to(&cluster.admin_url()).await.unwrap_or_else(|e| panic!("cannot connect to the TLS cluster: {e}"));
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE {CERT_USER} LOGIN; \
             EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
        ))
        .await
        .unwrap_or_else(|e| panic!("cannot create {CERT_USER}: {e}"));
    cluster
}

async fn start(options: &EmbeddedOptions, files: &[DataFile]) -> EmbeddedPostgres {
    EmbeddedPostgres::start_with_files(options.clone(), files)
        .await
        .unwrap_or_else(|e| panic!("cannot start the TLS test cluster in {}: {e}", options.data_dir.display()))
}

/// An exclusive lock on `path`, released when the file is dropped.
async fn lock(path: &Path) -> std::fs::File {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    tokio::task::spawn_blocking(move || file.lock().map(|()| file))
        .await
        .expect("the locking thread")
        .unwrap_or_else(|e| panic!("cannot lock {}: {e}", path.display()))
}

impl TlsCluster {
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// As the `postgres` superuser (with its password) to `database` at `host` (`localhost`,
    /// `127.0.0.1`, or a name with `hostaddr=127.0.0.1` in `query`), with `query` (`sslmode=...`).
    pub fn url(&self, host: &str, database: &str, query: &str) -> String {
        let query = if query.is_empty() { String::new() } else { format!("?{query}") };
        format!("{}@{host}:{}/{database}{query}", self.credentials, self.port)
    }

    /// As [`CERT_USER`], who has no password: only the client certificate lets it in.
    pub fn cert_user_url(&self, database: &str, query: &str) -> String {
        format!("postgres://{CERT_USER}@localhost:{}/{database}?{query}", self.port)
    }

    /// The superuser's URL to database `postgres`, over TLS (`require`).
    pub fn admin_url(&self) -> String {
        self.url("127.0.0.1", "postgres", "sslmode=require")
    }

    /// The CA that signed the server's (and the client's) certificate, as a PEM file.
    pub fn ca_file(&self) -> PathBuf {
        self.certs_dir.join("ca.pem")
    }

    /// A CA that signed nothing.
    pub fn other_ca_file(&self) -> PathBuf {
        self.certs_dir.join("other-ca.pem")
    }

    /// The client certificate for [`CERT_USER`] and its key.
    pub fn client_cert_file(&self) -> PathBuf {
        self.certs_dir.join("client.crt")
    }

    pub fn client_key_file(&self) -> PathBuf {
        self.certs_dir.join("client.key")
    }

    /// A database of its own for one test on this cluster; its `url()` connects with `require`.
    pub async fn create_database(&self, label: &str) -> TestDatabase {
        TestDatabase::create_in(&self.admin_url(), label).await
    }
}
