//! `--ca-cert`: an HTTPS broker whose certificate comes from a CA of its own.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};

use crate::helpers::{TestBroker, temp_file};

/// A CA's PEM, and a certificate for 127.0.0.1 with its key, as files.
fn pki() -> (String, String, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.distinguished_name.push(DnType::CommonName, "queenctl test CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a key")).expect("a CA");
    let key = KeyPair::generate().expect("a key");
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("params")
        .signed_by(&key, &*issuer)
        .expect("a certificate");
    (temp_file("ca.pem", &issuer.pem()), temp_file("tls.crt", &leaf.pem()), temp_file("tls.key", &key.serialize_pem()))
}

#[actix_web::test]
async fn an_https_broker_is_reached_with_its_ca_and_refused_without() {
    let (ca, cert, key) = pki();
    let broker = TestBroker::start_with(move |config| {
        config.http.tls_cert_file = Some(cert.into());
        config.http.tls_key_file = Some(key.into());
    })
    .await;
    let url = broker.url.replacen("http://", "https://", 1);

    let pushed = crate::helpers::run(
        &["--url", &url, "--ca-cert", &ca, "push", "secret", "\"over TLS\"", "-o", "json"],
        &[],
        None,
    )
    .await
    .success();
    assert_eq!(pushed.json()["status"], "queued");
    let popped = crate::helpers::run(&["--url", &url, "--ca-cert", &ca, "pop", "secret", "-o", "json"], &[], None)
        .await
        .success();
    assert_eq!(popped.json()["messages"][0]["data"], "over TLS");

    let stranger = crate::helpers::run(&["--url", &url, "status"], &[], None).await;
    stranger.fails(3, &format!("queenctl: error: cannot reach the broker ({url}/api/v1/status): "));
    assert!(stranger.stderr.to_lowercase().contains("certificate"), "the cause is named: {stranger:#?}");
    let not_a_ca = temp_file("junk.pem", "not a certificate");
    crate::helpers::run(&["--url", &url, "--ca-cert", &not_a_ca, "status"], &[], None)
        .await
        .usage_error("client configuration");
}
