//! HTTPS on the broker's listener (`http.tls_cert_file`, `http.tls_key_file`).
//!
//! The rustls `ServerConfig` takes its certificate from a [`ReloadingCert`], which holds the
//! current certificate and key and swaps them, without a restart, when the files change (their
//! metadata is looked at every [`POLL_INTERVAL`]) or when the broker gets SIGHUP. A reload that
//! fails (a file still being written, a key that does not fit the certificate) keeps serving the
//! previous certificate and logs why; the files are tried again at every poll until they load.
//! Kubernetes updates a mounted Secret by swapping a symlink, which changes the files' inodes:
//! that is a change too. Connections already open keep the certificate they were opened with.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::config::{ConfigError, HttpConfig};

/// How often the certificate and key files are looked at for a change.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Why the certificate files cannot be used, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot read {}: {source}", path.display())]
    Read { setting: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{} holds no PEM certificate", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{} does not hold a usable certificate chain: {problem}", path.display())]
    Certificate { path: PathBuf, problem: String },
    #[error("{} does not hold a usable private key: {problem}", path.display())]
    Key { path: PathBuf, problem: String },
    #[error("the key in {} is not the key of the certificate in {}", key.display(), cert.display())]
    Mismatch { cert: PathBuf, key: PathBuf },
}

impl CertError {
    /// The setting whose file is at fault.
    pub fn setting(&self) -> &'static str {
        match self {
            CertError::Read { setting, .. } => setting,
            CertError::NoCertificate { .. } | CertError::Certificate { .. } => "http.tls_cert_file",
            CertError::Key { .. } | CertError::Mismatch { .. } => "http.tls_key_file",
        }
    }
}

/// The certificate chain file and the key file.
#[derive(Debug, Clone)]
struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
}

/// What identifies a file's content without reading it: a write changes its size or modification
/// time, a replacement (a rename, Kubernetes' symlink swap) its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// The stamps of both files; `None` for a file that cannot be looked at (being replaced, say).
type Stamps = [Option<Stamp>; 2];

impl CertFiles {
    fn stamps(&self) -> Stamps {
        let stamp = |path: &Path| {
            std::fs::metadata(path).ok().map(|m| Stamp {
                dev: m.dev(),
                ino: m.ino(),
                len: m.len(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
            })
        };
        [stamp(&self.cert), stamp(&self.key)]
    }

    /// Reads and checks both files: a chain of at least one certificate, a private key the
    /// provider can sign with, and, where that can be told, the key of the first certificate.
    fn load(&self, provider: &CryptoProvider) -> Result<CertifiedKey, CertError> {
        let read = |setting, path: &Path| {
            std::fs::read(path).map_err(|source| CertError::Read { setting, path: path.into(), source })
        };
        let cert_pem = read("http.tls_cert_file", &self.cert)?;
        let key_pem = read("http.tls_key_file", &self.key)?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CertError::Certificate { path: self.cert.clone(), problem: e.to_string() })?;
        if chain.is_empty() {
            return Err(CertError::NoCertificate { path: self.cert.clone() });
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| CertError::Key { path: self.key.clone(), problem: e.to_string() })?;
        let signing_key = provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| CertError::Key { path: self.key.clone(), problem: e.to_string() })?;
        let certified = CertifiedKey::new(chain, signing_key);
        match certified.keys_match() {
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(certified),
            Err(rustls::Error::InconsistentKeys(_)) => {
                Err(CertError::Mismatch { cert: self.cert.clone(), key: self.key.clone() })
            }
            Err(e) => Err(CertError::Certificate { path: self.cert.clone(), problem: e.to_string() }),
        }
    }
}

/// The certificate the listener serves, swapped whole when the files are reloaded: every
/// handshake takes the one current when it starts.
#[derive(Debug)]
pub struct ReloadingCert {
    files: CertFiles,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ReloadingCert {
    /// Loads the files once; an error names the file at fault.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Self>, CertError> {
        let files = CertFiles { cert: cert.into(), key: key.into() };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let current = files.load(&provider)?;
        Ok(Arc::new(Self { files, provider, current: RwLock::new(Arc::new(current)) }))
    }

    /// The certificate and key served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Reads the files again; on success the next handshakes get the new certificate, on
    /// failure the current one stays.
    pub fn reload(&self) -> Result<(), CertError> {
        let loaded = Arc::new(self.files.load(&self.provider)?);
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = loaded;
        Ok(())
    }

    /// A server configuration (TLS 1.2 and 1.3, no client certificates, ALPN `http/1.1`) that
    /// takes its certificate from `self`.
    pub fn server_config(self: &Arc<Self>) -> ServerConfig {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports the default protocol versions")
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        // actix-http puts its own protocols (`http/1.1`, as the server speaks no HTTP/2) in front
        // of these; the list stands for itself where the configuration is used elsewhere.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config
    }
}

/// The listener's TLS configuration when `http.tls_cert_file` and `http.tls_key_file` are set,
/// with the task that reloads them started (it ends once the server dropped the configuration).
/// Must run inside an actix system. Files that cannot be used stop start-up, naming the file.
pub fn server_config(http: &HttpConfig) -> Result<Option<ServerConfig>, ConfigError> {
    let Some((cert, key)) = http.tls_files() else {
        return Ok(None);
    };
    let reloading = ReloadingCert::load(cert, key)
        .map_err(|e| ConfigError { setting: e.setting().into(), problem: e.to_string() })?;
    let config = reloading.server_config();
    let stamps = reloading.files.stamps();
    actix_web::rt::spawn(keep_reloading(Arc::downgrade(&reloading), stamps));
    tracing::info!(cert = %cert.display(), key = %key.display(), "the listener serves HTTPS");
    Ok(Some(config))
}

/// Reloads the files whenever their stamps differ from those of the last load, every
/// [`POLL_INTERVAL`], and on SIGHUP whatever they say. A failed reload is logged once per state
/// of the files (and at every SIGHUP) and tried again at each poll.
async fn keep_reloading(cert: Weak<ReloadingCert>, mut loaded: Stamps) {
    let mut hangup = signal(SignalKind::hangup())
        .inspect_err(|e| tracing::warn!(error = %e, "cannot listen for SIGHUP; certificates reload on change only"))
        .ok();
    let mut polls = tokio::time::interval(POLL_INTERVAL);
    polls.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failed_at: Option<Stamps> = None;
    loop {
        let forced = tokio::select! {
            _ = polls.tick() => false,
            () = next_hangup(&mut hangup) => true,
        };
        let Some(cert) = cert.upgrade() else {
            return;
        };
        let now = cert.files.stamps();
        if !forced && now == loaded && failed_at.is_none() {
            continue;
        }
        let files = &cert.files;
        match cert.reload() {
            Ok(()) => {
                tracing::info!(cert = %files.cert.display(), key = %files.key.display(), forced, "reloaded the listener's certificate");
                loaded = now;
                failed_at = None;
            }
            Err(e) => {
                if forced || failed_at != Some(now) {
                    tracing::error!(error = %e, "cannot reload the listener's certificate; still serving the previous one");
                }
                failed_at = Some(now);
            }
        }
    }
}

async fn next_hangup(hangup: &mut Option<Signal>) {
    if let Some(signal) = hangup
        && signal.recv().await.is_some()
    {
        return;
    }
    *hangup = None;
    std::future::pending::<()>().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().expect("a key");
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("a certificate");
        let (cert_path, key_path) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
        std::fs::write(&cert_path, cert.pem()).expect("write the certificate");
        std::fs::write(&key_path, key.serialize_pem()).expect("write the key");
        (cert_path, key_path)
    }

    fn scratch() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("queen-listener-tls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        dir
    }

    #[test]
    fn files_that_cannot_be_used_are_named_and_a_failed_reload_keeps_the_certificate() {
        let dir = scratch();
        let (cert_a, key_a) = write_pair(&dir, "a");
        let (cert_b, key_b) = write_pair(&dir, "b");
        let missing = dir.join("missing.crt");

        let error = ReloadingCert::load(&missing, &key_a).unwrap_err();
        assert_eq!(error.setting(), "http.tls_cert_file");
        assert!(error.to_string().contains(&*missing.to_string_lossy()), "{error}");
        let error = ReloadingCert::load(&cert_a, &key_b).unwrap_err();
        assert!(matches!(error, CertError::Mismatch { .. }), "{error}");
        assert_eq!(error.setting(), "http.tls_key_file");
        let garbage = dir.join("garbage.pem");
        std::fs::write(&garbage, "-----BEGIN PRIVATE KEY-----\nnot base64\n").expect("write");
        let error = ReloadingCert::load(&cert_a, &garbage).unwrap_err();
        assert!(matches!(error, CertError::Key { .. }), "{error}");
        assert!(error.to_string().contains(&*garbage.to_string_lossy()), "{error}");
        std::fs::write(&garbage, "no PEM here\n").expect("write");
        let error = ReloadingCert::load(&garbage, &key_a).unwrap_err();
        assert!(matches!(error, CertError::NoCertificate { .. }), "{error}");

        let reloading = ReloadingCert::load(&cert_a, &key_a).expect("a good pair loads");
        let first = reloading.current().cert[0].clone();
        // Half of the next certificate written: the reload fails, the old one stays.
        let pem_b = std::fs::read_to_string(&cert_b).expect("read");
        std::fs::write(&cert_a, &pem_b[..pem_b.len() / 2]).expect("write");
        assert!(reloading.reload().is_err());
        assert_eq!(reloading.current().cert[0], first);
        // The certificate complete but the key still the old one: refused as well.
        std::fs::write(&cert_a, &pem_b).expect("write");
        assert!(matches!(reloading.reload(), Err(CertError::Mismatch { .. })));
        assert_eq!(reloading.current().cert[0], first);
        std::fs::copy(&key_b, &key_a).expect("copy");
        reloading.reload().expect("the new pair loads");
        assert_ne!(reloading.current().cert[0], first);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_replaced_file_changes_its_stamp() {
        let dir = scratch();
        let (cert, key) = write_pair(&dir, "a");
        let files = CertFiles { cert: cert.clone(), key };
        let before = files.stamps();
        assert!(before.iter().all(Option::is_some));
        assert_eq!(files.stamps(), before, "nothing changed");
        // A same-size replacement by rename, as Kubernetes' symlink swap does: a new inode.
        let next = dir.join("next.crt");
        std::fs::copy(&cert, &next).expect("copy");
        std::fs::rename(&next, &cert).expect("rename");
        assert_ne!(files.stamps(), before);
        std::fs::remove_dir_all(&dir).ok();
    }
}
