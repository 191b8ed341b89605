//! The TLS configuration handed to reqwest.
//!
//! The workspace builds reqwest with `rustls-no-provider`: reqwest then needs a process-wide
//! rustls crypto provider, which a library must not assume is installed (nor install behind its
//! caller's back, which could clash with the application's own choice). So the client builds a
//! complete rustls `ClientConfig` itself, with the ring provider passed explicitly, and gives it
//! to reqwest as a preconfigured backend: HTTPS works whatever the process has installed.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::Error;

/// CA certificates from PEM text: every `CERTIFICATE` block it holds (at least one).
pub(crate) fn certificates_from_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Config(format!("the CA certificate is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Config("the CA certificate PEM holds no CERTIFICATE block".into()));
    }
    Ok(certs)
}

/// A rustls client configuration trusting `extra_roots`, and the platform's roots when
/// `native_roots` is set, speaking HTTP/1.1 (what the broker serves; reqwest is built without
/// HTTP/2 here).
pub(crate) fn client_config(
    extra_roots: &[CertificateDer<'static>],
    native_roots: bool,
) -> Result<rustls::ClientConfig, Error> {
    let mut roots = RootCertStore::empty();
    if native_roots {
        // A platform store with some unreadable entries still gives the readable ones; a client
        // that only reaches brokers with their own CA does not need any of them.
        let found = rustls_native_certs::load_native_certs();
        for cert in found.certs {
            let _ = roots.add(cert);
        }
    }
    for cert in extra_roots {
        roots.add(cert.clone()).map_err(|e| Error::Config(format!("the CA certificate cannot be used: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_without_certificates_is_refused() {
        assert!(certificates_from_pem(b"not a certificate").is_err());
        assert!(certificates_from_pem(b"").is_err());
    }

    #[test]
    fn a_configuration_builds_without_a_process_wide_provider() {
        let config = client_config(&[], false).expect("a TLS configuration");
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }
}
