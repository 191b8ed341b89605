//! Authentication and roles: bearer JWTs (HS256, RS256 from a PEM key or a JWKS that rotates,
//! EdDSA) and static API tokens; every route's role boundary; queue scopes; `producerSub` taken
//! from the token, never from the body.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use queen_broker::auth::Role;
use queen_broker::config::Config;
use queen_broker::http::ROUTES;
use queen_broker::http::authorize::Access;
use queen_testkit::JsonServer;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp, TokensFile};

const SECRET: &str = "the-api-tests-hs256-secret-0123456789";
const ISSUER: &str = "https://idp.test";

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/auth")).join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs()
}

/// Claims of a token valid for an hour, for `sub` with one role.
fn claims(sub: &str, role: &str) -> Value {
    json!({"sub": sub, "role": role, "iss": ISSUER, "exp": now() + 3600, "iat": now()})
}

fn hs256(claims: &Value, secret: &str) -> String {
    let key = EncodingKey::from_secret(secret.as_bytes()).expect("a key");
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &key).expect("a token")
}

fn rs256(claims: &Value, private_key: &str, kid: Option<&str>) -> String {
    let key = EncodingKey::from_rsa_pem(&fixture(private_key)).expect("an RSA key");
    let mut header = Header::new(Algorithm::RS256);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, &key).expect("a token")
}

/// A JWKS holding the public halves of the named private keys, under the given key ids.
fn jwks(keys: &[(&str, &str)]) -> String {
    let keys = keys
        .iter()
        .map(|(file, kid)| {
            let key = EncodingKey::from_rsa_pem(&fixture(file)).expect("an RSA key");
            let mut jwk = Jwk::from_encoding_key(&key, Algorithm::RS256).expect("a JWK");
            jwk.common.key_id = Some((*kid).to_owned());
            jwk
        })
        .collect();
    serde_json::to_string(&JwkSet { keys }).expect("JSON")
}

fn with_hs256(config: &mut Config) {
    config.auth.jwt_enabled = true;
    config.auth.jwt_secret = Some(SECRET.into());
    config.auth.jwt_issuer = Some(ISSUER.into());
}

async fn call(app: &TestApp, method: &str, path: &str, token: Option<&str>, body: Option<Value>) -> Answer {
    let method = reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes()).expect("a method");
    let mut request = app.http.request(method, app.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("a response");
    let status = response.status();
    let text = response.text().await.expect("a body");
    Answer { status, body: serde_json::from_str(&text).unwrap_or(Value::Null) }
}

async fn push_as(app: &TestApp, token: &str, queue: &str, transaction_id: &str) -> Answer {
    let item = json!({"queue": queue, "transactionId": transaction_id, "payload": {"t": transaction_id}});
    call(app, "post", "/api/v1/push", Some(token), Some(json!({"items": [item]}))).await
}

/// A token made for another service by the same issuer (or signed with a shared secret) must
/// not pass for one made for this broker: a configured audience is required in the token.
#[actix_web::test]
async fn a_configured_audience_must_be_the_tokens() {
    const AUDIENCE: &str = "queen-broker";
    let app = TestApp::spawn_with(|config| {
        with_hs256(config);
        config.auth.jwt_audience = Some(AUDIENCE.into());
    })
    .await;
    let token = |audience: Option<&str>| {
        let mut claims = claims("ops", "admin");
        if let Some(audience) = audience {
            claims["aud"] = json!(audience);
        }
        hs256(&claims, SECRET)
    };
    for (audience, expected) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some("another-service"), StatusCode::UNAUTHORIZED),
        (Some(AUDIENCE), StatusCode::OK),
    ] {
        let answer = call(&app, "get", "/api/v1/resources/queues", Some(&token(audience)), None).await;
        assert_eq!(answer.status, expected, "audience {audience:?}: {answer:?}");
    }
}

#[actix_web::test]
async fn without_a_usable_token_every_guarded_route_answers_401_and_the_probes_stay_public() {
    let app = TestApp::spawn_with(with_hs256).await;
    for path in ["/health", "/ready", "/metrics"] {
        assert_eq!(call(&app, "get", path, None, None).await.status, StatusCode::OK, "{path} is public");
    }
    let admin = hs256(&claims("ops", "admin"), SECRET);
    let cases = [
        ("missing", None),
        ("malformed", Some("Basic dXNlcjpwYXNz".to_owned())),
        ("expired", Some(hs256(&json!({"sub": "a", "role": "admin", "iss": ISSUER, "exp": now() - 3600}), SECRET))),
        ("bad_signature", Some(hs256(&claims("a", "admin"), "a-forged-secret-that-is-not-ours"))),
        (
            "invalid_claims",
            Some(hs256(&json!({"sub": "a", "role": "admin", "iss": "https://other", "exp": now() + 60}), SECRET)),
        ),
        ("invalid_claims", Some(hs256(&json!({"sub": "a", "role": "admin", "iss": ISSUER}), SECRET))),
        // The configured issuer is required, not only compared when the token has one.
        ("invalid_claims", Some(hs256(&json!({"sub": "a", "role": "admin", "exp": now() + 60}), SECRET))),
        (
            "not_yet_valid",
            Some(hs256(
                &json!({"sub": "a", "role": "admin", "iss": ISSUER, "exp": now() + 7200, "nbf": now() + 3600}),
                SECRET,
            )),
        ),
        ("invalid", Some("not-a-jwt".to_owned())),
    ];
    for (reason, token) in &cases {
        let before = app.metric(&format!("queen_auth_failures_total{{reason=\"{reason}\"}}")).await;
        let answer = if let Some(token) = token {
            let raw = app.http.post(app.url("/api/v1/push")).json(&json!({"items": [{"queue": "q"}]}));
            let raw =
                if token.starts_with("Basic") { raw.header("authorization", token) } else { raw.bearer_auth(token) };
            let response = raw.send().await.expect("a response");
            assert_eq!(response.headers().get("www-authenticate").map(|v| v.to_str().unwrap()), Some("Bearer"));
            let status = response.status();
            Answer { status, body: response.json().await.expect("a JSON error") }
        } else {
            call(&app, "post", "/api/v1/push", None, Some(json!({"items": [{"queue": "q"}]}))).await
        };
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{reason}: {answer:?}");
        assert_eq!(answer.body["code"], "unauthorized", "{reason}: {answer:?}");
        assert!(answer.body["error"].as_str().is_some_and(|e| !e.is_empty()), "{answer:?}");
        let after = app.metric(&format!("queen_auth_failures_total{{reason=\"{reason}\"}}")).await;
        assert_eq!(after, before + 1.0, "{reason} is counted");
    }
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 0, "no refused push wrote anything");
    assert_eq!(push_as(&app, &admin, "q", "t1").await.status, StatusCode::CREATED);
}

/// A request that exercises the route without needing anything to exist: its status tells only
/// whether auth let it through.
fn sample_request(path: &str) -> String {
    let wait = if path.starts_with("/api/v1/pop") { "?wait=false" } else { "" };
    let path = path
        .replace("{queue}", "auth-q")
        .replace("{partition}", "Default")
        .replace("{lease_id}", "0192f0c4-7b1e-7c3a-9d2e-5b6f7a8b9c0d")
        .replace("{partition_id}", "1")
        .replace("{transaction_id:.+}", "t")
        .replace("{group}", "g");
    format!("{path}{wait}")
}

#[actix_web::test]
async fn every_route_refuses_the_role_below_the_one_it_needs_and_serves_that_role() {
    let app = TestApp::spawn_with(|config| {
        with_hs256(config);
        // /metrics behind its role too, so that every guarded route is checked.
        config.auth.jwt_skip_paths = String::new();
    })
    .await;
    let token = |role: Role| hs256(&claims("tester", role.name()), SECRET);
    let without_role = hs256(&json!({"sub": "tester", "iss": ISSUER, "exp": now() + 3600}), SECRET);
    let mut checked = 0;
    for (method, path, access) in ROUTES {
        let Access::Role(needed, _) = access else { continue };
        let uri = sample_request(path);
        let body = (*method != "get" && *method != "delete").then(|| json!({}));
        let below = match needed {
            Role::ReadOnly => None,
            Role::ReadWrite => Some(Role::ReadOnly),
            Role::Admin => Some(Role::ReadWrite),
        };
        let refused = match below {
            Some(role) => call(&app, method, &uri, Some(&token(role)), body.clone()).await,
            None => call(&app, method, &uri, Some(&without_role), body.clone()).await,
        };
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{method} {path} below {needed:?}: {refused:?}");
        assert_eq!(refused.body["code"], "forbidden", "{refused:?}");
        let served = call(&app, method, &uri, Some(&token(*needed)), body).await;
        assert!(
            !matches!(served.status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN),
            "{method} {path} with {needed:?}: {served:?}"
        );
        checked += 1;
    }
    assert!(checked > 30, "checked {checked} routes");
    // The walk created nothing but the sample queue its requests name.
    assert_eq!(app.count("SELECT count(*) FROM queen.queues WHERE name <> 'auth-q'").await, 0);
}

#[actix_web::test]
async fn role_names_and_claims_are_the_configured_ones() {
    let app = TestApp::spawn_with(|config| {
        with_hs256(config);
        config.auth.role_read_write = "producer".into();
        config.auth.jwt_roles_claim = "queen_role".into();
        config.auth.jwt_roles_array_claim = "groups".into();
    })
    .await;
    let single = hs256(&json!({"sub": "a", "queen_role": "producer", "iss": ISSUER, "exp": now() + 60}), SECRET);
    assert_eq!(push_as(&app, &single, "q", "t1").await.status, StatusCode::CREATED);
    let listed = hs256(&json!({"sub": "a", "groups": ["x", "producer"], "iss": ISSUER, "exp": now() + 60}), SECRET);
    assert_eq!(push_as(&app, &listed, "q", "t2").await.status, StatusCode::CREATED);
    let default_name = hs256(&json!({"sub": "a", "role": "read-write", "iss": ISSUER, "exp": now() + 60}), SECRET);
    assert_eq!(push_as(&app, &default_name, "q", "t3").await.status, StatusCode::FORBIDDEN);
}

#[actix_web::test]
async fn producer_sub_is_the_tokens_subject_and_a_spoofed_one_is_refused() {
    let app = TestApp::spawn_with(with_hs256).await;
    let token = hs256(&claims("svc-orders", "read-write"), SECRET);
    let spoofed = json!({"queue": "spoof", "transactionId": "t0", "payload": 0, "producerSub": "someone-else"});
    let refused = call(&app, "post", "/api/v1/push", Some(&token), Some(json!({"items": [spoofed]}))).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    assert!(refused.body["error"].as_str().is_some_and(|e| e.starts_with("items[0].producerSub is set by the broker")));
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 0, "a refused push writes nothing");

    let item = json!({"queue": "spoof", "transactionId": "t1", "payload": 1});
    let pushed = call(&app, "post", "/api/v1/push", Some(&token), Some(json!({"items": [item]}))).await;
    assert_eq!(pushed.status, StatusCode::CREATED, "{pushed:?}");
    let partition = pushed.body[0]["partition_id"].as_str().expect("a partition id").to_owned();

    let read = call(&app, "get", &format!("/api/v1/messages/{partition}/t1"), Some(&token), None).await;
    assert_eq!(read.body["producerSub"], "svc-orders", "{read:?}");
    let listed = call(&app, "get", "/api/v1/messages?queue=spoof", Some(&token), None).await;
    assert_eq!(listed.body["messages"][0]["producerSub"], "svc-orders", "{listed:?}");
    let popped = call(&app, "get", "/api/v1/pop/queue/spoof?wait=false", Some(&token), None).await;
    let message = &popped.messages()[0];
    assert_eq!(message["producerSub"], "svc-orders", "{popped:?}");

    // Dead-lettered, it keeps its producer, and a re-queue carries it again.
    let ack = json!({"transactionId": "t1", "partitionId": partition, "leaseId": message["leaseId"], "status": "dlq"});
    let acked = call(&app, "post", "/api/v1/ack", Some(&token), Some(ack)).await;
    assert_eq!(acked.status, StatusCode::OK, "{acked:?}");
    let admin = hs256(&claims("ops", "admin"), SECRET);
    let letters = call(&app, "get", "/api/v1/dlq?queue=spoof", Some(&admin), None).await;
    assert_eq!(letters.body["messages"][0]["producerSub"], "svc-orders", "{letters:?}");
    let requeued = call(&app, "post", &format!("/api/v1/messages/{partition}/t1/retry"), Some(&admin), None).await;
    assert_eq!(requeued.status, StatusCode::OK, "{requeued:?}");
    let again = call(&app, "get", "/api/v1/pop/queue/spoof?wait=false", Some(&token), None).await;
    assert_eq!(again.messages()[0]["producerSub"], "svc-orders", "{again:?}");
}

#[actix_web::test]
async fn without_auth_producer_sub_is_null_and_a_body_cannot_set_it() {
    let app = TestApp::spawn().await;
    let spoofed = json!({"queue": "open", "transactionId": "t1", "payload": 1, "producerSub": "spoofed"});
    let refused = app.post("/api/v1/push", &json!({"items": [spoofed]})).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    app.push(json!([{"queue": "open", "transactionId": "t1", "payload": 1}])).await;
    let popped = app.pop("queue/open", "wait=false").await;
    assert_eq!(popped.messages()[0]["producerSub"], Value::Null, "{popped:?}");
}

#[actix_web::test]
async fn rs256_keys_come_from_a_jwks_and_a_rotation_is_picked_up_without_a_restart() {
    let server = JsonServer::start("jwks.json", jwks(&[("rs256-a.key", "key-a")])).await;
    let url = server.url().to_owned();
    let app = TestApp::spawn_with(move |config| {
        config.auth.jwt_enabled = true;
        config.auth.jwt_algorithm = "RS256".into();
        config.auth.jwt_jwks_url = Some(url);
        config.auth.jwt_jwks_min_refetch_seconds = 1;
    })
    .await;
    let signed_a = rs256(&claims("svc", "read-write"), "rs256-a.key", Some("key-a"));
    assert_eq!(push_as(&app, &signed_a, "rs", "t1").await.status, StatusCode::CREATED);

    // A key the set does not hold: 401 naming the key id.
    let signed_b = rs256(&claims("svc", "read-write"), "rs256-b.key", Some("key-b"));
    let unknown = push_as(&app, &signed_b, "rs", "t2").await;
    assert_eq!(unknown.status, StatusCode::UNAUTHORIZED, "{unknown:?}");
    assert!(unknown.body["error"].as_str().unwrap_or_default().contains("key-b"), "{unknown:?}");
    // A token signed by key b but naming key a is a forgery.
    let forged = rs256(&claims("svc", "admin"), "rs256-b.key", Some("key-a"));
    assert_eq!(push_as(&app, &forged, "rs", "t3").await.status, StatusCode::UNAUTHORIZED);
    // An HS256 token signed with the public key (algorithm confusion) is refused.
    let confused = hs256(&claims("svc", "admin"), &String::from_utf8(fixture("rs256-a.pub")).expect("PEM"));
    assert_eq!(push_as(&app, &confused, "rs", "t4").await.status, StatusCode::UNAUTHORIZED);

    // The provider rotates to key b: the next token signed by it is accepted, no restart.
    let fetches = server.requests();
    server.set(jwks(&[("rs256-b.key", "key-b")]));
    // Fetched again once a second has passed since the fetch key b's first token made.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while push_as(&app, &signed_b, "rs", "t5").await.status != StatusCode::CREATED {
        assert!(std::time::Instant::now() < deadline, "the rotated key was never fetched");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(server.requests() > fetches, "the unknown key id made the broker fetch the set again");
    assert_eq!(push_as(&app, &signed_a, "rs", "t6").await.status, StatusCode::UNAUTHORIZED, "key a was retired");
}

#[actix_web::test]
async fn a_jwks_that_cannot_be_fetched_answers_503_not_401() {
    // A port nothing listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("an address").port();
    let app = TestApp::spawn_with(move |config| {
        config.auth.jwt_enabled = true;
        config.auth.jwt_algorithm = "RS256".into();
        config.auth.jwt_jwks_url = Some(format!("http://127.0.0.1:{port}/jwks.json"));
        config.auth.jwt_jwks_timeout_ms = 500;
    })
    .await;
    let token = rs256(&claims("svc", "read-write"), "rs256-a.key", Some("key-a"));
    let answer = push_as(&app, &token, "q", "t1").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
}

#[actix_web::test]
async fn a_pem_public_key_verifies_rs256_and_eddsa_tokens() {
    let rsa = String::from_utf8(fixture("rs256-a.pub")).expect("PEM");
    let app = TestApp::spawn_with(move |config| {
        config.auth.jwt_enabled = true;
        config.auth.jwt_algorithm = "RS256".into();
        config.auth.jwt_public_key = Some(rsa);
    })
    .await;
    let token = rs256(&claims("svc", "read-write"), "rs256-a.key", None);
    assert_eq!(push_as(&app, &token, "q", "t1").await.status, StatusCode::CREATED);
    let other = rs256(&claims("svc", "read-write"), "rs256-b.key", None);
    assert_eq!(push_as(&app, &other, "q", "t2").await.status, StatusCode::UNAUTHORIZED);

    let ed = String::from_utf8(fixture("ed25519.pub")).expect("PEM");
    let app = TestApp::spawn_with(move |config| {
        config.auth.jwt_enabled = true;
        config.auth.jwt_algorithm = "EdDSA".into();
        config.auth.jwt_public_key = Some(ed);
    })
    .await;
    let key = EncodingKey::from_ed_pem(&fixture("ed25519.key")).expect("an Ed25519 key");
    let token =
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims("svc", "read-write"), &key).expect("a token");
    assert_eq!(push_as(&app, &token, "q", "t1").await.status, StatusCode::CREATED);
    let hs = hs256(&claims("svc", "read-write"), SECRET);
    assert_eq!(push_as(&app, &hs, "q", "t2").await.status, StatusCode::UNAUTHORIZED, "only EdDSA is accepted");
}

const ORDERS_TOKEN: &str = "orders-token-0123456789abcdef";
const OPS_TOKEN: &str = "ops-token-0123456789abcdef";

/// Two admin tokens: `orders-svc` confined to `orders.`, `ops` unconfined.
fn orders_and_ops_tokens() -> TokensFile {
    TokensFile::new(&format!(
        "[[token]]\nname = \"orders-svc\"\ntoken = \"{ORDERS_TOKEN}\"\nrole = \"admin\"\nqueues = [\"orders.\"]\n\
         [[token]]\nname = \"ops\"\ntoken = \"{OPS_TOKEN}\"\nrole = \"admin\"\n"
    ))
}

#[actix_web::test]
async fn static_tokens_confine_their_holder_to_their_queue_prefixes() {
    let tokens = orders_and_ops_tokens();
    let file = tokens.path();
    let app = TestApp::spawn_with(move |config| config.auth.tokens_file = Some(file)).await;

    let mine = push_as(&app, ORDERS_TOKEN, "orders.eu", "t1").await;
    assert_eq!(mine.status, StatusCode::CREATED, "{mine:?}");
    let partition = mine.body[0]["partition_id"].as_str().expect("a partition id").to_owned();
    let theirs = push_as(&app, OPS_TOKEN, "billing", "t1").await;
    assert_eq!(theirs.status, StatusCode::CREATED);
    let billing_partition = theirs.body[0]["partition_id"].as_str().expect("a partition id").to_owned();

    let forbidden = |answer: &Answer| answer.status == StatusCode::FORBIDDEN && answer.body["code"] == "forbidden";
    let outside = push_as(&app, ORDERS_TOKEN, "billing", "t2").await;
    assert!(forbidden(&outside), "{outside:?}");
    let mixed = call(&app, "post", "/api/v1/push", Some(ORDERS_TOKEN),
        Some(json!({"items": [{"queue": "orders.eu", "transactionId": "t3"}, {"queue": "billing", "transactionId": "t3"}]}))).await;
    assert!(forbidden(&mixed), "a push with one item outside the scope is refused whole: {mixed:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.log_message_ids WHERE transaction_id IN ('t2', 't3')").await, 0);

    let refused = [
        ("get", "/api/v1/pop/queue/billing?wait=false".to_owned(), None),
        ("post", "/api/v1/configure".to_owned(), Some(json!({"queue": "billing"}))),
        ("get", format!("/api/v1/messages/{billing_partition}/t1"), None),
        ("post", "/api/v1/ack".to_owned(), Some(json!({"transactionId": "t1", "partitionId": billing_partition}))),
        ("delete", "/api/v1/resources/queues/billing".to_owned(), None),
        ("get", "/api/v1/status".to_owned(), None),
        ("get", "/api/v1/dlq".to_owned(), None),
        ("get", "/api/v1/dlq?queue=billing".to_owned(), None),
        (
            "post",
            "/api/v1/transaction".to_owned(),
            Some(json!({"operations": [{"type": "push", "items": [{"queue": "billing"}]}]})),
        ),
        // A partition of its own queue does not open another queue named beside it...
        (
            "post",
            format!("/api/v1/consumer-groups/g/queues/billing/partitions/{partition}/seek"),
            Some(json!({"toEnd": true})),
        ),
        // ...and one of no queue (cleaned up, its dead letters left) is not known to be its own.
        ("post", "/api/v1/messages/999999/t1/retry".to_owned(), Some(json!({}))),
        ("delete", "/api/v1/messages/999999/t1".to_owned(), None),
    ];
    for (method, path, body) in refused {
        let answer = call(&app, method, &path, Some(ORDERS_TOKEN), body).await;
        assert!(forbidden(&answer), "{method} {path}: {answer:?}");
    }
    // A partition of another queue and one of no queue are refused alike, naming no queue: a token
    // walking the (sequential) partition ids learns nothing of other queues.
    let theirs = call(&app, "get", &format!("/api/v1/messages/{billing_partition}/t1"), Some(ORDERS_TOKEN), None).await;
    let nobodys = call(&app, "get", "/api/v1/messages/999999/t1", Some(ORDERS_TOKEN), None).await;
    assert_eq!(theirs.body["error"], nobodys.body["error"], "{theirs:?}");
    assert!(!theirs.body.to_string().contains("billing"), "{theirs:?}");
    let allowed = [
        ("get", "/api/v1/pop/queue/orders.eu?wait=false".to_owned()),
        ("get", format!("/api/v1/messages/{partition}/t1")),
        ("get", "/api/v1/dlq?queue=orders.eu".to_owned()),
        ("get", "/api/v1/resources/queues/orders.eu".to_owned()),
    ];
    for (method, path) in allowed {
        let answer = call(&app, method, &path, Some(ORDERS_TOKEN), None).await;
        assert!(answer.status.is_success(), "{method} {path}: {answer:?}");
    }
    assert_eq!(app.count("SELECT count(*) FROM queen.queues WHERE name = 'billing'").await, 1, "billing still there");

    // The token's name is its producer; an unknown token is a 401.
    let popped = call(&app, "get", "/api/v1/pop/queue/billing?wait=false", Some(OPS_TOKEN), None).await;
    assert_eq!(popped.messages()[0]["producerSub"], "ops", "{popped:?}");
    let unknown = push_as(&app, "ops-token-0123456789abcdeX", "billing", "t9").await;
    assert_eq!(unknown.status, StatusCode::UNAUTHORIZED);
}

/// A namespace pop serves every queue labelled with the namespace: a token confined to queue
/// prefixes may not label its queues with a namespace it does not hold whole, which would send
/// its messages to that namespace's consumers.
#[actix_web::test]
async fn a_confined_token_cannot_place_its_queues_in_another_namespace() {
    let tokens = orders_and_ops_tokens();
    let file = tokens.path();
    let app = TestApp::spawn_with(move |config| config.auth.tokens_file = Some(file)).await;
    let configure = |body: Value| call(&app, "post", "/api/v1/configure", Some(ORDERS_TOKEN), Some(body));

    let placed =
        configure(json!({"queue": "orders.trojan", "namespace": "billing", "options": {"priority": 100}})).await;
    assert_eq!((placed.status, &placed.body["code"]), (StatusCode::FORBIDDEN, &json!("forbidden")), "{placed:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 0, "nothing created");
    assert_eq!(push_as(&app, ORDERS_TOKEN, "orders.eu", "t1").await.status, StatusCode::CREATED);
    let moved = configure(json!({"queue": "orders.eu", "namespace": "billing"})).await;
    assert_eq!(moved.status, StatusCode::FORBIDDEN, "{moved:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.queues WHERE namespace = 'billing'").await, 0);
    let billing = call(&app, "get", "/api/v1/pop?namespace=billing&wait=false", Some(OPS_TOKEN), None).await;
    assert_eq!(billing.status, StatusCode::NO_CONTENT, "billing's consumers get nothing of the token's: {billing:?}");

    // Its own namespace, and the one its queue's name gives, it may name.
    let own = configure(json!({"queue": "orders.x", "namespace": "orders", "task": "invoices"})).await;
    assert_eq!(own.status, StatusCode::OK, "{own:?}");
    let unconfined = call(
        &app,
        "post",
        "/api/v1/configure",
        Some(OPS_TOKEN),
        Some(json!({"queue": "audit", "namespace": "billing"})),
    )
    .await;
    assert_eq!(unconfined.status, StatusCode::OK, "{unconfined:?}");
}

/// A JWT's `queues` claim confines it as a static token's list does; one that is not an array of
/// non-empty prefixes (a lone string, say) is refused rather than read as no confinement.
#[actix_web::test]
async fn a_jwts_queues_claim_confines_it_and_a_malformed_one_is_refused() {
    let app = TestApp::spawn_with(with_hs256).await;
    let with_queues = |queues: Value| {
        let mut claims = claims("svc", "admin");
        claims["queues"] = queues;
        hs256(&claims, SECRET)
    };
    let confined = with_queues(json!(["orders."]));
    assert_eq!(push_as(&app, &confined, "orders.eu", "t1").await.status, StatusCode::CREATED);
    assert_eq!(push_as(&app, &confined, "billing", "t2").await.status, StatusCode::FORBIDDEN);
    for malformed in [json!("orders."), json!(null), json!(["orders.", ""]), json!(["orders.", 5])] {
        let token = with_queues(malformed.clone());
        let answer = call(&app, "get", "/api/v1/resources/queues", Some(&token), None).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{malformed}: {answer:?}");
        assert!(answer.body["error"].as_str().is_some_and(|e| e.contains("queues claim")), "{answer:?}");
    }
    assert_eq!(app.count("SELECT count(*) FROM queen.queues WHERE name = 'billing'").await, 0);
}

#[actix_web::test]
async fn jwts_and_static_tokens_work_side_by_side() {
    let tokens =
        TokensFile::new(&format!("[[token]]\nname = \"ops\"\ntoken = \"{OPS_TOKEN}\"\nrole = \"read-only\"\n"));
    let file = tokens.path();
    let app = TestApp::spawn_with(move |config| {
        with_hs256(config);
        config.auth.tokens_file = Some(file);
    })
    .await;
    let jwt = hs256(&claims("svc", "read-write"), SECRET);
    assert_eq!(push_as(&app, &jwt, "q", "t1").await.status, StatusCode::CREATED);
    assert_eq!(push_as(&app, OPS_TOKEN, "q", "t2").await.status, StatusCode::FORBIDDEN, "read-only cannot push");
    assert_eq!(call(&app, "get", "/api/v1/resources/queues/q", Some(OPS_TOKEN), None).await.status, StatusCode::OK);
}

#[actix_web::test]
async fn an_inconsistent_auth_configuration_stops_start_up_naming_the_setting() {
    let db = queen_testkit::TestDatabase::create("auth_config").await;
    type Tweak = fn(&mut Config);
    let cases: [(&str, Tweak); 3] = [
        ("auth.jwt_secret", |config| config.auth.jwt_enabled = true),
        ("auth.jwt_algorithm", |config| {
            with_hs256(config);
            config.auth.jwt_algorithm = "none".into();
        }),
        ("auth.tokens_file", |config| config.auth.tokens_file = Some("/nonexistent/tokens.toml".into())),
    ];
    for (setting, tweak) in cases {
        let config = queen_testkit::in_process::config(&db, tweak);
        let error = match queen_broker::startup::Application::build(config).await {
            Ok(_) => panic!("{setting}: the broker started"),
            Err(e) => e.to_string(),
        };
        assert!(error.contains(setting), "{setting}: {error}");
        assert!(!error.contains('\n'), "one line: {error}");
    }
}

/// A lock's permit is bound to the token's subject: a JWT without `sub` would bind it to no one,
/// and any caller could renew, release or take it back, so it is refused.
#[actix_web::test]
async fn a_token_without_a_subject_holds_no_lock() {
    let app = TestApp::spawn_with(with_hs256).await;
    let acquire = json!({"operations": [{"op": "acquire", "name": "n", "ttlSeconds": 60, "owner": "me"}]});
    let nobody = hs256(&json!({"role": "read-write", "iss": ISSUER, "exp": now() + 3600}), SECRET);
    let refused = call(&app, "post", "/api/v1/locks", Some(&nobody), Some(acquire.clone())).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{refused:?}");
    assert!(refused.body["error"].as_str().is_some_and(|e| e.contains("sub")), "{refused:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.kv").await, 0, "the refusal wrote nothing");

    let someone = hs256(&claims("worker-1", "read-write"), SECRET);
    let taken = call(&app, "post", "/api/v1/locks", Some(&someone), Some(acquire)).await;
    assert_eq!(taken.status, StatusCode::OK, "{taken:?}");
    assert_eq!(taken.body["results"][0]["acquired"], true, "{taken:?}");
}

/// With auth off (the default), any page a user opens could make the user's browser send requests
/// to a broker it can reach: an API request the browser says a page of another origin made
/// (`Sec-Fetch-Site`) is refused, and does nothing. The broker's own pages (the same origin), a
/// navigation to them from elsewhere, and clients that are no browser are served.
#[actix_web::test]
async fn api_requests_a_page_of_another_origin_made_are_refused() {
    let app = TestApp::spawn().await;
    app.push_one("forged", "p", "m1", json!(1)).await;
    // What a form can send: a POST of text, here with the header a browser adds.
    let plant = |header: &str, value: &str| {
        app.http
            .post(app.url("/api/v1/configure"))
            .header(header, value)
            .header("content-type", "text/plain")
            .body(r#"{"queue": "planted", "options": {"leaseTime": 5}}"#)
    };
    for site in ["cross-site", "same-site"] {
        // What an <img> and a form can send: a GET, and a POST of text.
        let popped = app.http.get(app.url("/api/v1/pop/queue/forged?autoAck=true")).header("sec-fetch-site", site);
        let configured = plant("sec-fetch-site", site);
        // The router decodes `%61` as `a`: the same route, the same refusal.
        let escaped = app.http.get(app.url("/%61pi/v1/pop/queue/forged?autoAck=true")).header("sec-fetch-site", site);
        for request in [popped, configured, escaped] {
            let response = request.send().await.expect("a response");
            assert_eq!(response.status(), StatusCode::FORBIDDEN, "{site}");
            let body: Value = response.json().await.expect("a JSON error");
            assert!(body["error"].as_str().is_some_and(|e| e.contains("another origin")), "{body}");
        }
    }
    // Over plain HTTP to an address that is not loopback, browsers send no Sec-Fetch-Site; the
    // Origin of a cross-origin POST says it.
    for origin in ["http://evil.example", "null"] {
        let forged = plant("origin", origin).send().await.expect("a response");
        assert_eq!(forged.status(), StatusCode::FORBIDDEN, "{origin}");
    }
    assert_eq!(app.get("/api/v1/resources/queues/planted").await.status, StatusCode::NOT_FOUND);
    let own = app.base.clone();
    let configured = app.http.post(app.url("/api/v1/configure")).header("origin", own.as_str());
    let configured = configured.json(&json!({"queue": "own", "options": {}})).send().await.expect("a response");
    assert_eq!(configured.status(), StatusCode::OK, "a page of the broker's own origin");
    let navigation = app.http.get(app.url("/dashboard")).header("sec-fetch-site", "cross-site").send().await;
    assert_eq!(navigation.expect("a response").status(), StatusCode::OK, "a link to the dashboard is followed");
    let own_page = app.http.get(app.url("/api/v1/pop/queue/forged?batch=1")).header("sec-fetch-site", "same-origin");
    let own_page: Value = own_page.send().await.expect("a response").json().await.expect("JSON");
    assert_eq!(own_page["messages"][0]["transactionId"], "m1", "nothing was popped by the refused requests");
}

/// `http.allow_cross_site` serves them, for a deployment that puts its own origin policy in front.
#[actix_web::test]
async fn allow_cross_site_serves_requests_of_other_origins() {
    let app = TestApp::spawn_with(|config| config.http.allow_cross_site = true).await;
    let answer = app.http.get(app.url("/api/v1/resources/queues")).header("sec-fetch-site", "cross-site");
    assert_eq!(answer.send().await.expect("a response").status(), StatusCode::OK);
}

/// DNS rebinding: a page whose name now points at 127.0.0.1 reaches a broker on its visitor's
/// machine as its own origin (its `Origin` matches the `Host` it names, its own) and could read
/// every answer. Over loopback, a `Host` naming another host than localhost, this machine or one
/// `http.allowed_hosts` lists is refused and nothing is done; addresses and localhost are served.
#[actix_web::test]
async fn a_page_whose_name_rebinds_to_loopback_is_refused() {
    let app = TestApp::spawn().await;
    app.push_one("rebound", "p", "m1", json!(1)).await;
    let port = app.base.rsplit(':').next().expect("a port").to_owned();
    let evil = format!("evil.example:{port}");
    let popped = app.http.get(app.url("/api/v1/pop/queue/rebound?autoAck=true")).header("host", &evil);
    // What the page's scripts could add to pass for another host.
    let forwarded = app
        .http
        .get(app.url("/api/v1/pop/queue/rebound?autoAck=true"))
        .header("host", &evil)
        .header("x-forwarded-host", format!("localhost:{port}"));
    let configured = app
        .http
        .post(app.url("/api/v1/configure"))
        .header("host", &evil)
        .header("origin", format!("http://{evil}"))
        .json(&json!({"queue": "planted", "options": {}}));
    for request in [popped, forwarded, configured] {
        let response = request.send().await.expect("a response");
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let body: Value = response.json().await.expect("a JSON error");
        assert!(body["error"].as_str().is_some_and(|e| e.contains("http.allowed_hosts")), "{body}");
    }
    assert_eq!(app.get("/api/v1/resources/queues/planted").await.status, StatusCode::NOT_FOUND);
    for host in [format!("localhost:{port}"), format!("queen.localhost:{port}"), format!("127.0.0.1:{port}")] {
        let listed = app.http.get(app.url("/api/v1/resources/queues")).header("host", &host).send().await;
        assert_eq!(listed.expect("a response").status(), StatusCode::OK, "{host}");
    }
    let popped = app.get("/api/v1/pop/queue/rebound?batch=1").await;
    assert_eq!(popped.messages()[0]["transactionId"], "m1", "the refused pops took nothing");

    let proxied = TestApp::spawn_with(|config| config.http.allowed_hosts = "queen.internal, Evil.Example".into()).await;
    let listed = proxied.http.get(proxied.url("/api/v1/resources/queues")).header("host", &evil).send().await;
    assert_eq!(listed.expect("a response").status(), StatusCode::OK, "a name http.allowed_hosts lists");
}

/// A token whose subject is longer than a message can record as its producer is refused alone
/// (400), before its push is fused with another's: the other is stored.
#[actix_web::test]
async fn a_subject_too_long_to_record_is_refused_alone() {
    let app = TestApp::spawn_with(with_hs256).await;
    let long = hs256(&claims(&"s".repeat(70_000), "read-write"), SECRET);
    let short = hs256(&claims("producer", "read-write"), SECRET);
    let (refused, stored) =
        tokio::join!(push_as(&app, &long, "subjects", "long"), push_as(&app, &short, "subjects", "short"));
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    assert!(refused.body["error"].as_str().is_some_and(|e| e.contains("subject")), "{refused:?}");
    assert_eq!(stored.status, StatusCode::CREATED, "{stored:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.log_message_ids").await, 1);
}
