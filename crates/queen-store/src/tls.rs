//! TLS from the broker to PostgreSQL, with libpq's settings: `sslmode`, `sslrootcert`, `sslcert`,
//! `sslkey`, and the rustls connector (ring provider) that every connection of the broker (the
//! pool, the LISTEN connection, the start-up check) is opened with.
//!
//! The modes behave as libpq's:
//!
//! | mode | TLS | what is verified |
//! |---|---|---|
//! | `disable` | never | nothing |
//! | `prefer` (default) | when the server offers it | nothing; the chain when `sslrootcert` is given |
//! | `require` | always | nothing; the chain when `sslrootcert` is given |
//! | `verify-ca` | always | the chain, against `sslrootcert` (required) |
//! | `verify-full` | always | the chain and the host name, against `sslrootcert`, else the platform's roots |
//!
//! As with libpq, a given `sslrootcert` is the only CA trusted; without it `verify-full` trusts the
//! platform's certificate store (`sslrootcert=system` says so explicitly, as in libpq 16), and
//! `verify-ca` refuses to run: against public CAs, a chain check without the name check accepts
//! any certificate anyone obtained for any name.
//!
//! tokio-postgres parses `sslmode` itself but knows only `disable`, `prefer` and `require`, and
//! none of the file parameters; [`split_tls_params`] takes ours out of a connection string first,
//! and [`PgTarget::new`] maps the mode onto tokio-postgres's (the TLS connector does the rest).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Once};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
pub use tokio_postgres_rustls::MakeRustlsConnect;

/// Installs ring as rustls' process-wide default provider, for the libraries that take the
/// default (reqwest). Idempotent; a provider installed before is left in place. The connectors
/// built here name ring themselves and do not need it.
pub fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// libpq's `sslmode`, with libpq's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    Disable,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub const NAMES: [&'static str; 5] = ["disable", "prefer", "require", "verify-ca", "verify-full"];

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told: whether to ask for TLS and whether to insist. Verification is
    /// the connector's business.
    pub fn for_tokio_postgres(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SslMode {
    type Err = TlsError;

    fn from_str(value: &str) -> Result<Self, TlsError> {
        match value {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            other => Err(TlsError::UnknownMode(other.to_owned())),
        }
    }
}

/// Which CAs are trusted (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file of CA certificates: those, and only those.
    File(PathBuf),
    /// `sslrootcert=system`: the platform's certificate store.
    System,
}

impl RootCert {
    pub fn parse(value: &str) -> RootCert {
        if value == "system" { RootCert::System } else { RootCert::File(PathBuf::from(value)) }
    }
}

/// How a connection to PostgreSQL uses TLS.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsSettings {
    pub mode: SslMode,
    /// `sslrootcert`.
    pub root_cert: Option<RootCert>,
    /// `sslcert`: the client certificate (PEM, optionally followed by its intermediates).
    pub client_cert: Option<PathBuf>,
    /// `sslkey`: the client certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub client_key: Option<PathBuf>,
}

/// What the server's certificate is checked for.
enum Verification {
    Nothing,
    Chain(Arc<RootCertStore>),
    ChainAndName(Arc<RootCertStore>),
}

impl TlsSettings {
    /// No TLS: the embedded PostgreSQL, on loopback.
    pub fn disabled() -> Self {
        TlsSettings { mode: SslMode::Disable, ..TlsSettings::default() }
    }

    /// The rustls connector for these settings, reading the files they name. Every inconsistency
    /// is found here, before any connection is tried.
    pub fn connector(&self) -> Result<MakeRustlsConnect, TlsError> {
        let client_auth = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => Some((read_certificates("sslcert", cert)?, read_private_key(key)?)),
            (None, Some(_)) => return Err(TlsError::KeyWithoutCert),
            (Some(_), None) => return Err(TlsError::CertWithoutKey),
            (None, None) => None,
        };
        let provider = provider();
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Rustls)?;
        let builder = match self.verification()? {
            Verification::Nothing => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NameBlindVerifier { roots: None, provider })),
            Verification::Chain(roots) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NameBlindVerifier { roots: Some(roots), provider })),
            Verification::ChainAndName(roots) => builder.with_root_certificates(roots),
        };
        let config = match client_auth {
            Some((certs, key)) => builder.with_client_auth_cert(certs, key).map_err(TlsError::ClientAuth)?,
            None => builder.with_no_client_auth(),
        };
        Ok(MakeRustlsConnect::new(config))
    }

    fn verification(&self) -> Result<Verification, TlsError> {
        use SslMode::*;
        let verification = match (self.mode, &self.root_cert) {
            // Nothing is sent over TLS, so nothing is read (as libpq).
            (Disable, _) => Verification::Nothing,
            (Prefer | Require, None) => Verification::Nothing,
            // libpq: with a root certificate given, `require` (and `prefer`) check the chain.
            (Prefer | Require | VerifyCa, Some(RootCert::File(path))) => {
                Verification::Chain(Arc::new(file_roots(path)?))
            }
            (Prefer | Require | VerifyCa, Some(RootCert::System)) => {
                return Err(TlsError::SystemRootsNeedVerifyFull { mode: self.mode });
            }
            (VerifyCa, None) => return Err(TlsError::VerifyCaWithoutRootCert),
            (VerifyFull, Some(RootCert::File(path))) => Verification::ChainAndName(Arc::new(file_roots(path)?)),
            (VerifyFull, None | Some(RootCert::System)) => Verification::ChainAndName(Arc::new(platform_roots()?)),
        };
        Ok(verification)
    }
}

/// Where and how to connect: tokio-postgres's settings, with its `sslmode` set from ours, and the
/// connector that verifies what ours asks for.
#[derive(Clone)]
pub struct PgTarget {
    pub config: tokio_postgres::Config,
    pub tls: MakeRustlsConnect,
}

/// TCP keepalive probes of an idle connection: the first after this long without traffic...
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// ...then one this often, the peer given up after this many unanswered.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_PROBES: u32 = 3;
/// How long data sent may go unacknowledged before the connection is given up.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

/// A server that vanished (its host died, the network was cut) is noticed within about half a
/// minute, on an idle connection (keepalive probes: the LISTEN connection) and on one waiting for
/// what it sent to be acknowledged (`TCP_USER_TIMEOUT`), instead of the kernel's two hours or
/// quarter of an hour; the connection then fails, and the broker answers 503 and reconnects.
/// Settings the connection string gave are kept.
fn notice_vanished_servers(config: &mut tokio_postgres::Config) {
    if !config.get_keepalives() {
        return;
    }
    if config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(KEEPALIVE_INTERVAL);
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(KEEPALIVE_PROBES);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
}

impl PgTarget {
    pub fn new(mut config: tokio_postgres::Config, tls: &TlsSettings) -> Result<Self, TlsError> {
        config.ssl_mode(tls.mode.for_tokio_postgres());
        notice_vanished_servers(&mut config);
        Ok(PgTarget { config, tls: tls.connector()? })
    }

    /// A connection string (URL or `key=value`) that may carry our TLS parameters.
    pub fn from_connection_string(connection: &str) -> Result<Self, TlsError> {
        let (rest, params) = split_tls_params(connection);
        let config = rest.parse().map_err(|e: tokio_postgres::Error| TlsError::ConnectionString(e.to_string()))?;
        PgTarget::new(config, &params.settings()?)
    }

    /// Opens one connection ([`crate::connect::connect`]); its `Connection` must be polled
    /// (spawned) for the client to work.
    pub async fn connect(&self) -> Result<(tokio_postgres::Client, crate::connect::Connection), tokio_postgres::Error> {
        crate::connect::connect(&self.config, &self.tls).await
    }
}

/// A plain tokio-postgres configuration can only say `disable`, `prefer` or `require`, which
/// verify nothing (as libpq without a root certificate).
impl From<tokio_postgres::Config> for PgTarget {
    fn from(config: tokio_postgres::Config) -> Self {
        let mode = match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => SslMode::Disable,
            tokio_postgres::config::SslMode::Require => SslMode::Require,
            _ => SslMode::Prefer,
        };
        let settings = TlsSettings { mode, ..TlsSettings::default() };
        // Without files to read or roots to load, building the connector cannot fail.
        let tls = settings.connector().expect("a connector that verifies nothing needs nothing");
        let mut config = config;
        notice_vanished_servers(&mut config);
        PgTarget { config, tls }
    }
}

impl fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTarget").field("config", &self.config).finish_non_exhaustive()
    }
}

/// Why TLS settings cannot be used. [`TlsError::setting`] names the parameter at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("unknown sslmode {0:?}: use disable, prefer, require, verify-ca or verify-full")]
    UnknownMode(String),
    #[error("cannot read {} ({setting}): {source}", path.display())]
    Read {
        setting: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} ({setting}) is not usable PEM: {problem}", path.display())]
    BadPem { setting: &'static str, path: PathBuf, problem: String },
    #[error("sslkey is set without sslcert: give the client certificate too")]
    KeyWithoutCert,
    #[error("sslcert is set without sslkey: give the client certificate's private key too")]
    CertWithoutKey,
    #[error(
        "sslmode=verify-ca needs sslrootcert (the CA file to check the server's certificate against); \
         use verify-full to rely on the platform's roots"
    )]
    VerifyCaWithoutRootCert,
    #[error("sslrootcert=system is only allowed with sslmode=verify-full, not {mode} (as libpq)")]
    SystemRootsNeedVerifyFull { mode: SslMode },
    #[error(
        "sslmode=verify-full has no CA to trust: the platform's certificate store is empty{errors}; \
         give sslrootcert"
    )]
    NoPlatformRoots { errors: String },
    #[error("the client certificate (sslcert) and key (sslkey) cannot be used together: {0}")]
    ClientAuth(#[source] rustls::Error),
    #[error("cannot set up TLS: {0}")]
    Rustls(#[source] rustls::Error),
    #[error("invalid connection string: {0}")]
    ConnectionString(String),
}

impl TlsError {
    /// The parameter at fault: `sslmode`, `sslrootcert`, `sslcert`, `sslkey`, or `url`.
    pub fn setting(&self) -> &'static str {
        match self {
            TlsError::UnknownMode(_) | TlsError::Rustls(_) => "sslmode",
            TlsError::Read { setting, .. } | TlsError::BadPem { setting, .. } => setting,
            TlsError::KeyWithoutCert => "sslcert",
            TlsError::CertWithoutKey => "sslkey",
            TlsError::VerifyCaWithoutRootCert
            | TlsError::SystemRootsNeedVerifyFull { .. }
            | TlsError::NoPlatformRoots { .. } => "sslrootcert",
            TlsError::ClientAuth(_) => "sslkey",
            TlsError::ConnectionString(_) => "url",
        }
    }
}

fn read_file(setting: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { setting, path: path.to_path_buf(), source })
}

fn read_certificates(setting: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |problem: String| TlsError::BadPem { setting, path: path.to_path_buf(), problem };
    let bytes = read_file(setting, path)?;
    let certs =
        CertificateDer::pem_slice_iter(&bytes).collect::<Result<Vec<_>, _>>().map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("it holds no certificate (-----BEGIN CERTIFICATE-----)".into()));
    }
    Ok(certs)
}

fn read_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read_file("sslkey", path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsError::BadPem {
        setting: "sslkey",
        path: path.to_path_buf(),
        problem: match e {
            rustls_pki_types::pem::Error::NoItemsFound => {
                "it holds no private key (-----BEGIN PRIVATE KEY-----)".into()
            }
            other => other.to_string(),
        },
    })
}

fn file_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certificates("sslrootcert", path)? {
        roots.add(cert).map_err(|e| TlsError::BadPem {
            setting: "sslrootcert",
            path: path.to_path_buf(),
            problem: format!("a certificate in it cannot be a CA: {e}"),
        })?;
    }
    Ok(roots)
}

fn platform_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        let errors = if errors.is_empty() { String::new() } else { format!(" ({})", errors.join("; ")) };
        return Err(TlsError::NoPlatformRoots { errors });
    }
    Ok(roots)
}

/// The modes that do not check the host name. Without `roots` (`prefer` and `require` without a
/// root certificate, as libpq) the connection is encrypted but the server not authenticated; with
/// them (`verify-ca`, and `require` given a root certificate) the chain must lead to one of them
/// (webpki: signatures, validity dates, CA constraints, the server-auth usage). The handshake's
/// signatures are checked either way.
#[derive(Debug)]
struct NameBlindVerifier {
    roots: Option<Arc<RootCertStore>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for NameBlindVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.provider.signature_verification_algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// Why TLS with the server could not be set up, in words, when that is why `e` failed and
/// trying again will not help: the server's certificate was refused (wrong CA, wrong name,
/// expired), the server refused ours or the handshake, or it does not offer TLS where it is
/// required. `None` for anything else (a network failure mid-handshake included).
pub fn refusal(e: &tokio_postgres::Error) -> Option<String> {
    // Only failures to set TLS up; a connection that fails later is unavailable like any other.
    if !e.to_string().starts_with("error performing TLS handshake") {
        return None;
    }
    let source = std::error::Error::source(e)?;
    // tokio-rustls reports rustls' verdict as an io::Error wrapping it.
    let rustls_error = source
        .downcast_ref::<rustls::Error>()
        .or_else(|| source.downcast_ref::<io::Error>()?.get_ref()?.downcast_ref::<rustls::Error>());
    if let Some(error) = rustls_error {
        return Some(describe(error));
    }
    // tokio-postgres's own refusals are plain messages (its `Display` leaves the cause out).
    let text = source.to_string();
    if text.contains("server does not support TLS") {
        return Some(
            "the server does not offer TLS, and sslmode requires it (prefer would connect without TLS)".into(),
        );
    }
    if text.contains("no hostname provided for TLS handshake") {
        return Some("TLS needs a host name to connect to (host), not only an address (hostaddr)".into());
    }
    None
}

/// rustls' verdict, for people.
fn describe(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "the server's certificate was refused: it is not signed by a trusted CA (sslrootcert; without it, \
             the platform's roots)"
                .into()
        }
        rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext { expected, presented }) => {
            let names: Vec<String> = presented.iter().map(|name| plain_name(name)).collect();
            let names = if names.is_empty() { "no names".to_owned() } else { names.join(", ") };
            format!(
                "the server's certificate was refused: it does not match the host name {:?} (it is for {names}); \
                 connect by a name it holds, or use sslmode=verify-ca to check the CA only",
                expected.to_str()
            )
        }
        rustls::Error::InvalidCertificate(CertificateError::NotValidForName) => {
            "the server's certificate was refused: it does not match the host name connected to".into()
        }
        rustls::Error::InvalidCertificate(reason) => format!("the server's certificate was refused: {reason}"),
        rustls::Error::AlertReceived(alert) => format!(
            "the server ended the TLS handshake ({alert:?}); does it need a client certificate (sslcert, sslkey) \
             it trusts?"
        ),
        other => format!("the TLS handshake failed: {other}"),
    }
}

/// `DnsName("localhost")` or `IpAddress(127.0.0.1)`, as rustls presents names, as `localhost`.
fn plain_name(presented: &str) -> String {
    let inner = presented
        .split_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .map_or(presented, |inner| inner.trim_matches('"'));
    inner.to_owned()
}

/// Our TLS parameters as a connection string carried them (the last of each wins, as
/// tokio-postgres's own parser has it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionTls {
    pub sslmode: Option<String>,
    pub sslrootcert: Option<String>,
    pub sslcert: Option<String>,
    pub sslkey: Option<String>,
}

impl ConnectionTls {
    /// These parameters alone (libpq's default mode where none is given).
    pub fn settings(&self) -> Result<TlsSettings, TlsError> {
        Ok(TlsSettings {
            mode: self.sslmode.as_deref().map(str::parse).transpose()?.unwrap_or_default(),
            root_cert: self.sslrootcert.as_deref().map(RootCert::parse),
            client_cert: self.sslcert.as_ref().map(PathBuf::from),
            client_key: self.sslkey.as_ref().map(PathBuf::from),
        })
    }

    /// Whether the string gave `name` (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`).
    pub fn has(&self, name: &str) -> bool {
        match name {
            "sslmode" => self.sslmode.is_some(),
            "sslrootcert" => self.sslrootcert.is_some(),
            "sslcert" => self.sslcert.is_some(),
            "sslkey" => self.sslkey.is_some(),
            _ => false,
        }
    }

    fn take(&mut self, key: &str, value: String) -> bool {
        let slot = match key {
            "sslmode" => &mut self.sslmode,
            "sslrootcert" => &mut self.sslrootcert,
            "sslcert" => &mut self.sslcert,
            "sslkey" => &mut self.sslkey,
            _ => return false,
        };
        *slot = Some(value);
        true
    }
}

/// Takes `sslmode`, `sslrootcert`, `sslcert` and `sslkey` out of a connection string, a URL's
/// query (`postgres://h/db?sslmode=verify-full&sslrootcert=/ca.pem`, values percent-decoded) or
/// `key=value` pairs (`host=h sslmode=verify-full`, values quoted as libpq's), and returns the rest,
/// for tokio-postgres to parse, with what was taken. A string that does not tokenise is returned
/// whole, for tokio-postgres to report.
pub fn split_tls_params(connection: &str) -> (String, ConnectionTls) {
    if connection.starts_with("postgres://") || connection.starts_with("postgresql://") {
        split_url(connection)
    } else {
        split_key_values(connection).unwrap_or_else(|| (connection.to_owned(), ConnectionTls::default()))
    }
}

fn split_url(url: &str) -> (String, ConnectionTls) {
    let mut taken = ConnectionTls::default();
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), taken);
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !taken.take(&percent_decode(key), percent_decode(value)) {
            kept.push(pair);
        }
    }
    let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    (rest, taken)
}

/// `%XX` escapes decoded (as tokio-postgres does: `+` stays `+`); malformed ones are kept as they are.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(high), Some(low)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            decoded.push((high * 16 + low) as u8);
            i += 3;
        } else {
            decoded.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// `key = value` pairs separated by whitespace; a value is bare (up to whitespace) or in single
/// quotes, and a backslash escapes the next character in either.
fn split_key_values(text: &str) -> Option<(String, ConnectionTls)> {
    let mut taken = ConnectionTls::default();
    let mut kept: Vec<&str> = Vec::new();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let end_of = |i: usize| chars.get(i).map_or(text.len(), |&(at, _)| at);
    let mut i = 0;
    loop {
        while i < chars.len() && chars[i].1.is_whitespace() {
            i += 1;
        }
        if i == chars.len() {
            break;
        }
        let start = i;
        while i < chars.len() && !chars[i].1.is_whitespace() && chars[i].1 != '=' {
            i += 1;
        }
        let key = &text[end_of(start)..end_of(i)];
        while i < chars.len() && chars[i].1.is_whitespace() {
            i += 1;
        }
        if key.is_empty() || i == chars.len() || chars[i].1 != '=' {
            return None;
        }
        i += 1;
        while i < chars.len() && chars[i].1.is_whitespace() {
            i += 1;
        }
        let mut value = String::new();
        if i < chars.len() && chars[i].1 == '\'' {
            i += 1;
            loop {
                match chars.get(i)?.1 {
                    '\'' => break,
                    '\\' => {
                        i += 1;
                        value.push(chars.get(i)?.1);
                    }
                    c => value.push(c),
                }
                i += 1;
            }
            i += 1;
        } else {
            while i < chars.len() && !chars[i].1.is_whitespace() {
                if chars[i].1 == '\\' {
                    i += 1;
                }
                value.push(chars.get(i)?.1);
                i += 1;
            }
        }
        if !taken.take(key, value) {
            kept.push(&text[end_of(start)..end_of(i)]);
        }
    }
    Some((kept.join(" "), taken))
}

#[cfg(test)]
mod tests {
    use super::*;
    use queen_testkit::tls_cluster::TestCertificates;

    #[test]
    fn a_vanished_server_is_noticed_within_seconds_unless_the_url_says_otherwise() {
        let target = PgTarget::from_connection_string("postgres://q@db/queen").expect("a target");
        let config = &target.config;
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(config.get_keepalives_interval(), Some(KEEPALIVE_INTERVAL));
        assert_eq!(config.get_keepalives_retries(), Some(KEEPALIVE_PROBES));
        assert_eq!(config.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        let own = "postgres://q@db/queen?keepalives_idle=60&tcp_user_timeout=90";
        let target = PgTarget::from_connection_string(own).expect("a target");
        assert_eq!(target.config.get_keepalives_idle(), Duration::from_secs(60));
        assert_eq!(target.config.get_tcp_user_timeout(), Some(&Duration::from_secs(90)));
        let plain: PgTarget = "host=db user=q".parse::<tokio_postgres::Config>().expect("a config").into();
        assert_eq!(plain.config.get_keepalives_idle(), KEEPALIVE_IDLE, "a bare configuration too");
    }

    /// A directory under the system temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Self {
            let path = std::env::temp_dir().join(format!("queen-tls-unit-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&path).expect("creating the scratch dir");
            Self(path)
        }

        fn file(&self, name: &str, contents: &str) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, contents).expect("writing a scratch file");
            path
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tls(mode: SslMode, root_cert: Option<RootCert>) -> TlsSettings {
        TlsSettings { mode, root_cert, ..TlsSettings::default() }
    }

    #[test]
    fn modes_parse_as_libpq_names_them_and_map_onto_tokio_postgres() {
        use tokio_postgres::config::SslMode as Tokio;
        for name in SslMode::NAMES {
            assert_eq!(name.parse::<SslMode>().expect("a mode").as_str(), name);
        }
        assert_eq!(SslMode::default(), SslMode::Prefer);
        let expected = [Tokio::Disable, Tokio::Prefer, Tokio::Require, Tokio::Require, Tokio::Require];
        for (name, tokio) in SslMode::NAMES.iter().zip(expected) {
            assert_eq!(name.parse::<SslMode>().expect("a mode").for_tokio_postgres(), tokio, "{name}");
        }
        let error = "verify_full".parse::<SslMode>().expect_err("not a mode");
        assert_eq!(error.setting(), "sslmode");
        assert!(error.to_string().contains("verify-full"), "{error}");
        assert!("Require".parse::<SslMode>().is_err(), "names are lower case, as libpq's");
    }

    #[test]
    fn our_parameters_leave_a_url_and_the_rest_stays_as_written() {
        let (rest, taken) = split_tls_params(
            "postgres://u:p%40ss@db.example:6432/queen?sslmode=verify-full&application_name=a%20b\
             &sslrootcert=%2Fetc%2Fqueen%2Fca%20file.pem&sslcert=/c.pem&sslkey=/k.pem&connect_timeout=3",
        );
        assert_eq!(rest, "postgres://u:p%40ss@db.example:6432/queen?application_name=a%20b&connect_timeout=3");
        assert_eq!(
            taken,
            ConnectionTls {
                sslmode: Some("verify-full".into()),
                sslrootcert: Some("/etc/queen/ca file.pem".into()),
                sslcert: Some("/c.pem".into()),
                sslkey: Some("/k.pem".into()),
            }
        );
        rest.parse::<tokio_postgres::Config>().expect("tokio-postgres takes the rest");

        let (rest, taken) = split_tls_params("postgresql://db/queen?sslmode=require");
        assert_eq!((rest.as_str(), taken.sslmode.as_deref()), ("postgresql://db/queen", Some("require")));
        let (rest, taken) = split_tls_params("postgres://db/queen");
        assert_eq!((rest.as_str(), taken), ("postgres://db/queen", ConnectionTls::default()));
        let (_, taken) = split_tls_params("postgres://db/queen?sslmode=disable&sslmode=verify-ca");
        assert_eq!(taken.sslmode.as_deref(), Some("verify-ca"), "the last one wins");
    }

    #[test]
    fn our_parameters_leave_key_value_strings_too() {
        let (rest, taken) = split_tls_params(
            "host=db.example sslmode = verify-full port=5433 sslrootcert='/etc/my ca\\'s.pem' user=queen sslkey=/k\\ x",
        );
        assert_eq!(rest, "host=db.example port=5433 user=queen");
        assert_eq!(taken.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(taken.sslrootcert.as_deref(), Some("/etc/my ca's.pem"));
        assert_eq!(taken.sslkey.as_deref(), Some("/k x"));
        rest.parse::<tokio_postgres::Config>().expect("tokio-postgres takes the rest");
        let broken = "host=db sslmode";
        assert_eq!(split_tls_params(broken), (broken.to_owned(), ConnectionTls::default()));
    }

    #[test]
    fn a_connection_string_with_our_modes_connects_where_tokio_postgres_alone_refuses() {
        let scratch = Scratch::new();
        let ca = scratch.file("ca.pem", &TestCertificates::generate().ca_pem);
        assert!("postgres://db/queen?sslmode=verify-full".parse::<tokio_postgres::Config>().is_err());
        let url = format!("postgres://db/queen?sslmode=verify-full&sslrootcert={}", ca.display());
        let target = PgTarget::from_connection_string(&url).expect("a CA file");
        assert_eq!(target.config.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
        let target = PgTarget::from_connection_string("postgres://db/queen").expect("prefer");
        assert_eq!(target.config.get_ssl_mode(), tokio_postgres::config::SslMode::Prefer);
        let error = PgTarget::from_connection_string("postgres://db/queen?sslmode=allow").expect_err("not ours");
        assert_eq!(error.setting(), "sslmode");
    }

    #[test]
    fn inconsistent_settings_are_refused_naming_the_parameter() {
        let scratch = Scratch::new();
        let certs = TestCertificates::generate();
        let setting = |settings: TlsSettings| settings.connector().err().map(|e| (e.setting(), e.to_string()));

        let (name, text) = setting(tls(SslMode::VerifyCa, None)).expect("verify-ca needs a CA file");
        assert_eq!(name, "sslrootcert", "{text}");
        let (name, text) = setting(tls(SslMode::Require, Some(RootCert::System))).expect("system is for verify-full");
        assert_eq!(name, "sslrootcert", "{text}");

        let key_only = TlsSettings {
            client_key: Some(scratch.file("k.pem", &certs.client_key_pem)),
            ..tls(SslMode::Require, None)
        };
        assert_eq!(setting(key_only).expect("a key needs its certificate").0, "sslcert");
        let cert_only = TlsSettings {
            client_cert: Some(scratch.file("c.pem", &certs.client_cert_pem)),
            ..tls(SslMode::Require, None)
        };
        assert_eq!(setting(cert_only).expect("a certificate needs its key").0, "sslkey");

        let missing = scratch.0.join("missing.pem");
        let (name, text) = setting(tls(SslMode::VerifyFull, Some(RootCert::File(missing.clone())))).expect("missing");
        assert_eq!(name, "sslrootcert");
        assert!(text.contains("cannot read") && text.contains(&*missing.to_string_lossy()), "{text}");

        let garbage =
            scratch.file("garbage.pem", "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n");
        let (name, text) = setting(tls(SslMode::VerifyCa, Some(RootCert::File(garbage)))).expect("bad PEM");
        assert_eq!(name, "sslrootcert");
        assert!(text.contains("not usable PEM"), "{text}");
        let empty = scratch.file("empty.pem", "just some text\n");
        let (_, text) = setting(tls(SslMode::VerifyCa, Some(RootCert::File(empty)))).expect("no certificate");
        assert!(text.contains("holds no certificate"), "{text}");
        let not_a_key = scratch.file("not-a-key.pem", &certs.ca_pem);
        let with_bad_key = TlsSettings {
            client_cert: Some(scratch.file("c2.pem", &certs.client_cert_pem)),
            client_key: Some(not_a_key),
            ..tls(SslMode::Require, None)
        };
        let (name, text) = setting(with_bad_key).expect("a certificate is not a key");
        assert_eq!(name, "sslkey");
        assert!(text.contains("holds no private key"), "{text}");
    }

    #[test]
    fn consistent_settings_build_a_connector() {
        let scratch = Scratch::new();
        let certs = TestCertificates::generate();
        let ca = RootCert::File(scratch.file("ca.pem", &certs.ca_pem));
        for mode in SslMode::NAMES.map(|name| name.parse::<SslMode>().expect("a mode")) {
            tls(mode, Some(ca.clone())).connector().unwrap_or_else(|e| panic!("{mode} with a CA file: {e}"));
        }
        for mode in [SslMode::Disable, SslMode::Prefer, SslMode::Require] {
            tls(mode, None).connector().unwrap_or_else(|e| panic!("{mode} alone: {e}"));
        }
        let with_client = TlsSettings {
            client_cert: Some(scratch.file("c.pem", &certs.client_cert_pem)),
            client_key: Some(scratch.file("k.pem", &certs.client_key_pem)),
            ..tls(SslMode::VerifyFull, Some(ca))
        };
        with_client.connector().expect("a client certificate with its key");
        // Disable reads nothing, as libpq.
        tls(SslMode::Disable, Some(RootCert::File(scratch.0.join("missing.pem")))).connector().expect("disable");
    }

    #[test]
    fn refused_certificates_are_told_in_words() {
        let unknown = describe(&rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer));
        assert!(unknown.contains("not signed by a trusted CA"), "{unknown}");
        let wrong_name = describe(&rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            expected: ServerName::try_from("db.example").expect("a name").to_owned(),
            presented: vec!["DnsName(\"localhost\")".into(), "IpAddress(127.0.0.1)".into()],
        }));
        assert!(wrong_name.contains("does not match the host name \"db.example\""), "{wrong_name}");
        assert!(wrong_name.contains("(it is for localhost, 127.0.0.1)"), "{wrong_name}");
    }
}
