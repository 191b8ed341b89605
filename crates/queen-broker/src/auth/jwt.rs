//! JWT verification with upstream Queen's settings: HS256 with a shared secret, RS256 and EdDSA
//! with a PEM public key or the keys of a JWKS, or `auto` (the token's own `alg`, among those the
//! configured key material can verify; never `none`). `exp` is required; `nbf`, `iss` and `aud`
//! are checked when present or configured, with `auth.jwt_clock_skew_seconds` of leeway.

use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::jwks::KeySet;
use super::{AuthError, AuthFailure, Identity, RoleNames};
use crate::config::{AuthConfig, ConfigError};

/// The claim that confines a token to queue name prefixes.
const QUEUES_CLAIM: &str = "queues";

fn invalid(setting: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError { setting: setting.into(), problem: problem.into() }
}

/// The algorithms `auth.jwt_algorithm` allows.
fn algorithms(name: &str) -> Result<&'static [Algorithm], ConfigError> {
    Ok(match name {
        "HS256" => &[Algorithm::HS256],
        "RS256" => &[Algorithm::RS256],
        "EdDSA" => &[Algorithm::EdDSA],
        "auto" => &[Algorithm::HS256, Algorithm::RS256, Algorithm::EdDSA],
        other => {
            return Err(invalid("auth.jwt_algorithm", format!("{other:?} is not one of HS256, RS256, EdDSA, auto")));
        }
    })
}

fn set(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.is_empty())
}

/// A PEM public key: RSA or Ed25519, whichever it is.
fn public_key(pem: &str) -> Option<(Algorithm, DecodingKey)> {
    if let Ok(key) = DecodingKey::from_rsa_pem(pem.as_bytes()) {
        return Some((Algorithm::RS256, key));
    }
    DecodingKey::from_ed_pem(pem.as_bytes()).ok().map(|key| (Algorithm::EdDSA, key))
}

/// Checks that the JWT settings fit together; each problem names its setting.
pub fn check(config: &AuthConfig) -> Result<(), ConfigError> {
    let allowed = algorithms(&config.jwt_algorithm)?;
    let hs = allowed.contains(&Algorithm::HS256);
    let asymmetric = allowed.iter().any(|a| *a != Algorithm::HS256);
    let (secret, pem, jwks) = (set(&config.jwt_secret), set(&config.jwt_public_key), set(&config.jwt_jwks_url));
    if secret.is_some() && !hs {
        return Err(invalid(
            "auth.jwt_secret",
            format!("is for HS256, but auth.jwt_algorithm is {}", config.jwt_algorithm),
        ));
    }
    for (setting, given) in [("auth.jwt_public_key", pem.is_some()), ("auth.jwt_jwks_url", jwks.is_some())] {
        if given && !asymmetric {
            return Err(invalid(setting, "is for RS256 or EdDSA, but auth.jwt_algorithm is HS256"));
        }
    }
    match config.jwt_algorithm.as_str() {
        "HS256" if secret.is_none() => return Err(invalid("auth.jwt_secret", "is required with HS256 (JWT_SECRET)")),
        "RS256" | "EdDSA" if pem.is_none() && jwks.is_none() => {
            return Err(invalid(
                "auth.jwt_public_key",
                format!("{} needs a public key (JWT_PUBLIC_KEY) or a JWKS (JWT_JWKS_URL)", config.jwt_algorithm),
            ));
        }
        "auto" if secret.is_none() && pem.is_none() && jwks.is_none() => {
            return Err(invalid("auth.jwt_secret", "auto needs a secret, a public key or a JWKS"));
        }
        _ => {}
    }
    if let Some(pem) = pem {
        match public_key(pem) {
            None => return Err(invalid("auth.jwt_public_key", "is not a PEM RSA or Ed25519 public key")),
            Some((algorithm, _)) if !allowed.contains(&algorithm) => {
                return Err(invalid(
                    "auth.jwt_public_key",
                    format!("is a {algorithm:?} key, but auth.jwt_algorithm is {}", config.jwt_algorithm),
                ));
            }
            Some(_) => {}
        }
    }
    if let Some(url) = jwks
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        return Err(invalid("auth.jwt_jwks_url", "must be an http:// or https:// URL"));
    }
    if config.jwt_jwks_timeout_ms == 0 {
        return Err(invalid("auth.jwt_jwks_timeout_ms", "must be at least 1"));
    }
    // Upper bounds keep time arithmetic (a refresh deadline, a token's expiry less the leeway)
    // from overflowing; the refetch floor keeps tokens naming unknown key ids, which anyone can
    // send, from making the broker fetch the set back to back.
    for (name, value, range) in [
        ("auth.jwt_jwks_refresh_seconds", config.jwt_jwks_refresh_seconds, 1..=86_400),
        ("auth.jwt_jwks_min_refetch_seconds", config.jwt_jwks_min_refetch_seconds, 1..=86_400),
        ("auth.jwt_clock_skew_seconds", config.jwt_clock_skew_seconds, 0..=86_400),
    ] {
        if !range.contains(&value) {
            return Err(invalid(name, format!("must be between {} and {}", range.start(), range.end())));
        }
    }
    if config.jwt_roles_claim.is_empty() && config.jwt_roles_array_claim.is_empty() {
        return Err(invalid("auth.jwt_roles_claim", "one of jwt_roles_claim and jwt_roles_array_claim must be set"));
    }
    Ok(())
}

/// What is allowed but weak in the JWT settings, one sentence each, for the start-up log: an
/// HS256 secret shorter than the 32 bytes HS256 asks for (guessed offline from any token), and a
/// JWKS fetched over plain HTTP from another machine (anyone on the way can swap its keys).
pub fn weaknesses(config: &AuthConfig) -> Vec<String> {
    let mut weak = Vec::new();
    if let Some(secret) = set(&config.jwt_secret)
        && secret.len() < 32
    {
        weak.push(format!(
            "auth.jwt_secret (JWT_SECRET) is {} bytes; HS256 wants at least 32, and a shorter one can be guessed \
             offline from any token",
            secret.len()
        ));
    }
    if let Some(url) = set(&config.jwt_jwks_url)
        && let Some(rest) = url.strip_prefix("http://")
    {
        let host = rest.split(['/', ':']).next().unwrap_or_default();
        let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            weak.push(
                "auth.jwt_jwks_url (JWT_JWKS_URL) is plain HTTP: anyone between the broker and it can hand the \
                 broker keys of their own; use https"
                    .to_owned(),
            );
        }
    }
    weak
}

pub struct JwtVerifier {
    allowed: &'static [Algorithm],
    secret: Option<DecodingKey>,
    /// The PEM public key and the algorithm it verifies.
    public_key: Option<(Algorithm, DecodingKey)>,
    jwks: Option<Arc<KeySet>>,
    issuer: Option<String>,
    audience: Option<String>,
    leeway: u64,
    roles_claim: String,
    roles_array_claim: String,
    roles: RoleNames,
}

impl JwtVerifier {
    /// Assumes [`check`] passed.
    pub fn new(config: &AuthConfig) -> Result<Self, ConfigError> {
        let allowed = algorithms(&config.jwt_algorithm)?;
        let secret = set(&config.jwt_secret)
            .map(|secret| DecodingKey::from_secret(secret.as_bytes()))
            .transpose()
            .map_err(|e| invalid("auth.jwt_secret", e.to_string()))?;
        let jwks = set(&config.jwt_jwks_url).map(|url| {
            KeySet::new(
                url.to_owned(),
                Duration::from_millis(config.jwt_jwks_timeout_ms),
                Duration::from_secs(config.jwt_jwks_refresh_seconds),
                Duration::from_secs(config.jwt_jwks_min_refetch_seconds),
            )
        });
        Ok(Self {
            allowed,
            secret,
            public_key: set(&config.jwt_public_key).and_then(public_key),
            jwks,
            issuer: set(&config.jwt_issuer).map(str::to_owned),
            audience: set(&config.jwt_audience).map(str::to_owned),
            leeway: config.jwt_clock_skew_seconds,
            roles_claim: config.jwt_roles_claim.clone(),
            roles_array_claim: config.jwt_roles_array_claim.clone(),
            roles: RoleNames::of(config),
        })
    }

    pub fn key_set(&self) -> Option<Arc<KeySet>> {
        self.jwks.clone()
    }

    pub async fn verify(&self, token: &str) -> Result<Identity, AuthError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| AuthFailure::Invalid)?;
        if !self.allowed.contains(&header.alg) {
            return Err(AuthFailure::InvalidClaims(format!("algorithm {:?} is not accepted", header.alg)).into());
        }
        let held;
        let key = match header.alg {
            Algorithm::HS256 => self.secret.as_ref(),
            algorithm => match (&self.public_key, &self.jwks) {
                // A kid names a JWKS key; the PEM key serves tokens without one, or without a JWKS.
                (Some((pem_algorithm, key)), jwks)
                    if *pem_algorithm == algorithm && (header.kid.is_none() || jwks.is_none()) =>
                {
                    Some(key)
                }
                (_, Some(jwks)) => {
                    held = match jwks.find(header.kid.as_deref(), algorithm).await {
                        Some(key) => key,
                        None if !jwks.is_loaded() => {
                            return Err(AuthError::Unavailable(
                                "cannot verify tokens now: the JWKS could not be fetched".into(),
                            ));
                        }
                        None => {
                            return Err(AuthFailure::UnknownKey(header.kid.unwrap_or_else(|| "(none)".into())).into());
                        }
                    };
                    Some(&held.key)
                }
                _ => None,
            },
        };
        let key = key.ok_or_else(|| AuthFailure::InvalidClaims(format!("no key verifies {:?} tokens", header.alg)))?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.leeway;
        validation.validate_nbf = true;
        validation.validate_aud = self.audience.is_some();
        // A configured issuer or audience is required in the token, not only compared when it
        // is there: a token another service's issuer made for itself carries neither of ours.
        let mut required = vec!["exp"];
        if let Some(audience) = &self.audience {
            validation.set_audience(&[audience]);
            required.push("aud");
        }
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        validation.set_required_spec_claims(&required);
        let claims = jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation)
            .map_err(|e| failure_of(e.kind()))?
            .claims;
        Ok(self.identity(&claims)?)
    }

    fn identity(&self, claims: &Map<String, Value>) -> Result<Identity, AuthFailure> {
        let single = claims.get(&self.roles_claim).and_then(Value::as_str).into_iter();
        let listed = claims
            .get(&self.roles_array_claim)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str);
        let role = single.chain(listed).filter_map(|name| self.roles.parse(name)).max();
        let queues = claims.get(QUEUES_CLAIM).map(queue_prefixes).transpose()?;
        let subject = claims.get("sub").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
        Ok(Identity { subject, role, queues })
    }
}

/// The `queues` claim: an array of non-empty queue name prefixes. Anything else is refused rather
/// than read as no confinement (a single prefix sent as a string would otherwise open every
/// queue), and so is an empty prefix, which would confine nothing.
fn queue_prefixes(claim: &Value) -> Result<Vec<String>, AuthFailure> {
    let malformed =
        || AuthFailure::InvalidClaims("the queues claim must be an array of non-empty queue name prefixes".into());
    let prefixes = claim.as_array().ok_or_else(malformed)?;
    prefixes
        .iter()
        .map(|prefix| prefix.as_str().filter(|p| !p.is_empty()).map(str::to_owned).ok_or_else(malformed))
        .collect()
}

fn failure_of(kind: &ErrorKind) -> AuthFailure {
    match kind {
        ErrorKind::ExpiredSignature => AuthFailure::Expired,
        ErrorKind::ImmatureSignature => AuthFailure::NotYetValid,
        ErrorKind::InvalidSignature => AuthFailure::BadSignature,
        ErrorKind::InvalidIssuer => AuthFailure::InvalidClaims("wrong issuer".into()),
        ErrorKind::InvalidAudience => AuthFailure::InvalidClaims("wrong audience".into()),
        ErrorKind::MissingRequiredClaim(claim) => AuthFailure::InvalidClaims(format!("the {claim} claim is required")),
        ErrorKind::InvalidClaimFormat(claim) => AuthFailure::InvalidClaims(format!("the {claim} claim is malformed")),
        ErrorKind::InvalidAlgorithm => AuthFailure::InvalidClaims("the algorithm does not fit the key".into()),
        _ => AuthFailure::Invalid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hs256() -> AuthConfig {
        AuthConfig { jwt_enabled: true, jwt_secret: Some("a-secret-of-the-tests".into()), ..AuthConfig::default() }
    }

    #[test]
    fn inconsistent_settings_are_named() {
        let setting = |config: AuthConfig| check(&config).unwrap_err().setting;
        assert_eq!(setting(AuthConfig { jwt_secret: None, ..hs256() }), "auth.jwt_secret");
        assert_eq!(setting(AuthConfig { jwt_algorithm: "none".into(), ..hs256() }), "auth.jwt_algorithm");
        assert_eq!(setting(AuthConfig { jwt_algorithm: "RS256".into(), ..hs256() }), "auth.jwt_secret");
        let rs = AuthConfig { jwt_algorithm: "RS256".into(), jwt_secret: None, ..hs256() };
        assert_eq!(setting(rs.clone()), "auth.jwt_public_key");
        assert_eq!(
            setting(AuthConfig { jwt_public_key: Some("not a key".into()), ..rs.clone() }),
            "auth.jwt_public_key"
        );
        assert_eq!(
            setting(AuthConfig { jwt_jwks_url: Some("file:///keys".into()), ..rs.clone() }),
            "auth.jwt_jwks_url"
        );
        assert_eq!(
            setting(AuthConfig { jwt_jwks_url: Some("http://127.0.0.1/jwks".into()), ..hs256() }),
            "auth.jwt_jwks_url"
        );
        check(&AuthConfig { jwt_jwks_url: Some("https://idp.example/jwks".into()), ..rs }).expect("a JWKS is enough");
        check(&hs256()).expect("a secret is enough");
    }

    #[test]
    fn a_short_secret_and_a_remote_plain_http_jwks_are_called_weak() {
        assert_eq!(weaknesses(&hs256()).len(), 1, "21 bytes");
        assert!(weaknesses(&AuthConfig { jwt_secret: Some("s".repeat(32)), ..hs256() }).is_empty());
        let rs = |url: &str| AuthConfig {
            jwt_algorithm: "RS256".into(),
            jwt_secret: None,
            jwt_jwks_url: Some(url.into()),
            ..hs256()
        };
        assert_eq!(weaknesses(&rs("http://idp.example/jwks")).len(), 1);
        assert!(weaknesses(&rs("http://127.0.0.1:8080/jwks")).is_empty(), "loopback");
        assert!(weaknesses(&rs("https://idp.example/jwks")).is_empty());
    }
}
