//! HTTPS: a broker with a certificate from a CA of its own, trusted through the client's own
//! rustls configuration (no process-wide crypto provider needed).

use std::path::PathBuf;

use queen_client::{Client, Error, Pop, PushItem};
use queen_testkit::target_dir;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};

use crate::helpers::TestBroker;

/// A CA, and a certificate for 127.0.0.1 written where the broker reads it.
struct Pki {
    ca_pem: String,
    dir: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, "queen-client test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a key")).expect("a CA");
        let leaf_params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("params");
        let key = KeyPair::generate().expect("a key");
        let leaf = leaf_params.signed_by(&key, &*issuer).expect("a certificate");
        let dir = target_dir().join("client-tls").join(uuid::Uuid::new_v4().simple().to_string());
        std::fs::create_dir_all(&dir).expect("a directory");
        std::fs::write(dir.join("tls.crt"), leaf.pem()).expect("the certificate");
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).expect("the key");
        Pki { ca_pem: issuer.pem(), dir }
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

#[actix_web::test]
async fn an_https_broker_with_its_own_ca_is_reached_when_the_ca_is_given() {
    let pki = Pki::new();
    let (cert, key) = (pki.dir.join("tls.crt"), pki.dir.join("tls.key"));
    let broker = TestBroker::start_with(move |config| {
        config.http.tls_cert_file = Some(cert);
        config.http.tls_key_file = Some(key);
    })
    .await;
    let url = broker.url.replacen("http://", "https://", 1);

    let client =
        Client::builder().url(&url).ca_certificate_pem(&pki.ca_pem).native_roots(false).build().expect("a client");
    assert_eq!(client.health().await.expect("health over HTTPS").status, "healthy");
    client.push_one(PushItem::new("secret", &"over TLS").unwrap()).await.expect("a push");
    let delivery = client.pop(&Pop::queue("secret")).await.expect("a pop");
    assert_eq!(delivery.messages[0].json::<String>().unwrap(), "over TLS");

    let stranger = Client::builder().url(&url).native_roots(false).build().expect("a client");
    let refused = stranger.health().await.unwrap_err();
    assert!(matches!(refused, Error::Transport { .. }), "an unknown CA is refused: {refused:?}");
}
