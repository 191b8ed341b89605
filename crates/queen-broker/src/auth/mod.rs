//! Who is calling: bearer tokens turned into an [`Identity`] with a [`Role`] and, optionally, the
//! queue name prefixes it is confined to. Two sources, usable together: JWTs ([`jwt`], keys from a
//! secret, a PEM public key or a JWKS) and static API tokens from a file ([`tokens`]). Off unless
//! configured; the HTTP edge (`http::authorize`) asks for an identity on every guarded route.

mod jwks;
mod jwt;
mod tokens;

use std::sync::Arc;

pub use jwks::{KeySet, keep_fresh};

use crate::config::{AuthConfig, ConfigError};

/// What a caller may do. Each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Status, resources, message and dead-letter reads, group listings, metrics.
    ReadOnly,
    /// Push, pop, ack, lease extension, transactions.
    ReadWrite,
    /// Configure, delete, seek, subscriptions, dead-letter re-queue and delete, group deletion,
    /// maintenance.
    Admin,
}

impl Role {
    /// The role's name in the README's route table and in errors.
    pub fn name(self) -> &'static str {
        match self {
            Role::ReadOnly => "read-only",
            Role::ReadWrite => "read-write",
            Role::Admin => "admin",
        }
    }
}

/// The names tokens carry for each role (`auth.role_*`).
#[derive(Debug, Clone)]
pub struct RoleNames {
    admin: String,
    read_write: String,
    read_only: String,
}

impl RoleNames {
    fn of(config: &AuthConfig) -> Self {
        Self {
            admin: config.role_admin.clone(),
            read_write: config.role_read_write.clone(),
            read_only: config.role_read_only.clone(),
        }
    }

    pub fn parse(&self, name: &str) -> Option<Role> {
        if name == self.admin {
            Some(Role::Admin)
        } else if name == self.read_write {
            Some(Role::ReadWrite)
        } else if name == self.read_only {
            Some(Role::ReadOnly)
        } else {
            None
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The JWT's `sub`, or the static token's name: what pushed messages record as `producerSub`.
    pub subject: Option<String>,
    /// The highest role the token carries; `None` for a valid token without a known role.
    pub role: Option<Role>,
    /// Queue name prefixes the token is confined to; `None` for every queue.
    pub queues: Option<Vec<String>>,
}

impl Identity {
    /// Whether the token may act on the queue.
    pub fn allows_queue(&self, queue: &str) -> bool {
        self.queues.as_ref().is_none_or(|prefixes| prefixes.iter().any(|prefix| queue.starts_with(prefix.as_str())))
    }

    pub fn is_scoped(&self) -> bool {
        self.queues.is_some()
    }
}

/// Why a request carries no usable identity: each is a 401, counted by [`AuthFailure::reason`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthFailure {
    #[error("authentication required: send Authorization: Bearer <token>")]
    Missing,
    #[error("the Authorization header is not a bearer token")]
    Malformed,
    #[error("token has expired")]
    Expired,
    #[error("token is not valid yet")]
    NotYetValid,
    #[error("invalid token signature")]
    BadSignature,
    #[error("unknown key id {0:?}")]
    UnknownKey(String),
    /// The token is well formed and signed, but a claim is wrong (issuer, audience, ...).
    #[error("invalid token: {0}")]
    InvalidClaims(String),
    /// Not a JWT this broker accepts, nor a known API token.
    #[error("invalid token")]
    Invalid,
}

impl AuthFailure {
    /// The `reason` label of `queen_auth_failures_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Malformed => "malformed",
            AuthFailure::Expired => "expired",
            AuthFailure::NotYetValid => "not_yet_valid",
            AuthFailure::BadSignature => "bad_signature",
            AuthFailure::UnknownKey(_) => "unknown_key",
            AuthFailure::InvalidClaims(_) => "invalid_claims",
            AuthFailure::Invalid => "invalid",
        }
    }
}

/// What authenticating a token can end in besides an identity.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error(transparent)]
    Failed(#[from] AuthFailure),
    /// The broker cannot check the token now (no JWKS could be fetched yet): a 503, since the
    /// caller is not at fault.
    #[error("{0}")]
    Unavailable(String),
}

/// Turns bearer tokens into identities. Built once at start-up from `[auth]`.
pub struct Authenticator {
    tokens: Option<tokens::StaticTokens>,
    jwt: Option<jwt::JwtVerifier>,
    skip_paths: Vec<String>,
}

impl Authenticator {
    /// The authenticator `[auth]` asks for; `None` when auth is off. Reads the tokens file and
    /// the key material; what is inconsistent is named.
    pub fn from_config(config: &AuthConfig) -> Result<Option<Arc<Self>>, ConfigError> {
        check(config)?;
        let key_material = [&config.jwt_secret, &config.jwt_public_key, &config.jwt_jwks_url];
        if !config.jwt_enabled && key_material.iter().any(|value| value.as_deref().is_some_and(|v| !v.is_empty())) {
            tracing::warn!(
                "JWT key material is configured but auth.jwt_enabled (JWT_ENABLED) is false: JWTs are not checked"
            );
        }
        let tokens = config.tokens_file.as_deref().map(tokens::StaticTokens::load).transpose()?;
        let jwt = config.jwt_enabled.then(|| jwt::JwtVerifier::new(config)).transpose()?;
        if jwt.is_some() {
            for weakness in jwt::weaknesses(config) {
                tracing::warn!("{weakness}");
            }
        }
        if tokens.is_none() && jwt.is_none() {
            return Ok(None);
        }
        let skip_paths = skip_paths(config).map(str::to_owned).collect();
        Ok(Some(Arc::new(Self { tokens, jwt, skip_paths })))
    }

    /// Whether the path is served without a token: `/health` and `/ready` always, and what
    /// `auth.jwt_skip_paths` lists (exactly, or as a prefix when the entry ends in `/`).
    pub fn is_public(&self, path: &str) -> bool {
        matches!(path, "/health" | "/ready")
            || self
                .skip_paths
                .iter()
                .any(|skip| if skip.ends_with('/') { path.starts_with(skip) } else { path == skip })
    }

    /// The JWKS this authenticator reads keys from, to be kept fresh in the background.
    pub fn key_set(&self) -> Option<Arc<KeySet>> {
        self.jwt.as_ref().and_then(jwt::JwtVerifier::key_set)
    }

    /// The identity of a bearer token: a static token first (one hash), then a JWT.
    pub async fn authenticate(&self, token: &str) -> Result<Identity, AuthError> {
        if let Some(identity) = self.tokens.as_ref().and_then(|tokens| tokens.find(token)) {
            return Ok(identity);
        }
        match &self.jwt {
            Some(jwt) => jwt.verify(token).await,
            None => Err(AuthFailure::Invalid.into()),
        }
    }
}

/// The consistency checks that need no file: run by `Config::validate`, so a bad combination
/// stops start-up with one line naming the setting.
pub fn check(config: &AuthConfig) -> Result<(), ConfigError> {
    if config.jwt_enabled {
        jwt::check(config)?;
    }
    for (setting, name) in [
        ("auth.role_admin", &config.role_admin),
        ("auth.role_read_write", &config.role_read_write),
        ("auth.role_read_only", &config.role_read_only),
    ] {
        if name.is_empty() {
            return Err(ConfigError { setting: setting.into(), problem: "must not be empty".into() });
        }
    }
    if config.role_admin == config.role_read_write
        || config.role_admin == config.role_read_only
        || config.role_read_write == config.role_read_only
    {
        return Err(ConfigError {
            setting: "auth.role_admin".into(),
            problem: "the three role names must differ".into(),
        });
    }
    // A prefix covering the API, or a part of it, would serve without a token whatever routes
    // it holds, for every method (its deletions too): upstream's documented default ends in `/`,
    // which as a prefix is every path. Inside the API only exact paths may be listed.
    let covers_api = |skip: &str| skip.ends_with('/') && ("/api/".starts_with(skip) || skip.starts_with("/api/"));
    if let Some(open) = skip_paths(config).find(|skip| covers_api(skip)) {
        return Err(ConfigError {
            setting: "auth.jwt_skip_paths".into(),
            problem: format!(
                "the prefix {open:?} would serve API routes without a token, for every method; list exact paths, \
                 or prefixes outside /api/"
            ),
        });
    }
    Ok(())
}

/// The entries of `auth.jwt_skip_paths`.
fn skip_paths(config: &AuthConfig) -> impl Iterator<Item = &str> {
    config.jwt_skip_paths.split(',').map(str::trim).filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(queues: Option<&[&str]>) -> Identity {
        Identity {
            subject: None,
            role: Some(Role::ReadWrite),
            queues: queues.map(|q| q.iter().map(|s| (*s).to_owned()).collect()),
        }
    }

    #[test]
    fn roles_include_the_ones_below() {
        assert!(Role::Admin > Role::ReadWrite && Role::ReadWrite > Role::ReadOnly);
    }

    #[test]
    fn a_scope_is_a_list_of_name_prefixes() {
        assert!(identity(None).allows_queue("anything"));
        let scoped = identity(Some(&["orders.", "billing."]));
        assert!(scoped.allows_queue("orders.eu"));
        assert!(scoped.allows_queue("billing.invoices"));
        assert!(!scoped.allows_queue("ordersX"));
        assert!(!scoped.allows_queue("audit"));
    }

    #[test]
    fn health_and_ready_are_public_whatever_the_skip_list_says() {
        let mut config = AuthConfig { jwt_skip_paths: "/metrics,/docs/".into(), ..AuthConfig::default() };
        config.jwt_enabled = true;
        config.jwt_secret = Some("s".repeat(32));
        let auth = Authenticator::from_config(&config).unwrap().unwrap();
        assert!(auth.is_public("/health") && auth.is_public("/ready"));
        assert!(auth.is_public("/metrics") && auth.is_public("/docs/a/b"));
        assert!(!auth.is_public("/metrics/x") && !auth.is_public("/api/v1/push"));
    }

    #[test]
    fn auth_is_off_by_default() {
        assert!(Authenticator::from_config(&AuthConfig::default()).unwrap().is_none());
    }

    #[test]
    fn a_skip_prefix_covering_the_api_or_a_part_of_it_is_refused() {
        for open in ["/health,/metrics,/", "/api/", " /api/v1/ ", "/api/v1/resources/"] {
            let config = AuthConfig { jwt_skip_paths: open.into(), ..AuthConfig::default() };
            assert_eq!(check(&config).unwrap_err().setting, "auth.jwt_skip_paths", "{open}");
        }
        for fine in ["/health,/metrics", "/metrics/", "/docs/,/", "/api/v1/system/maintenance"] {
            let config = AuthConfig { jwt_skip_paths: fine.into(), ..AuthConfig::default() };
            if fine.split(',').any(|p| p == "/") {
                assert!(check(&config).is_err(), "{fine}");
            } else {
                assert!(check(&config).is_ok(), "{fine}");
            }
        }
    }

    #[test]
    fn role_names_must_differ() {
        let config = AuthConfig { role_read_only: "admin".into(), ..AuthConfig::default() };
        assert_eq!(check(&config).unwrap_err().setting, "auth.role_admin");
    }
}
