//! The edge's part in authentication: every route is registered with the [`Access`] it needs
//! (`super::ROUTES`), and with auth on, a route's middleware turns the bearer token into an
//! [`Identity`] and checks its role and queue scope before the handler runs. 401 for a missing,
//! malformed, expired or badly signed token; 403 for a valid one without the role or scope. Every
//! refusal is counted in `queen_auth_failures_total{reason}` and logged without the token. With
//! auth off a route pays one branch.

use std::future::{Ready, ready};

use actix_web::body::BoxBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header::AUTHORIZATION;
use actix_web::middleware::Next;
use actix_web::{Error, FromRequest, HttpMessage, HttpRequest, web};

use crate::auth::{AuthError, AuthFailure, Identity, Role};
use crate::broker::{Broker, access};
use crate::error::ApiError;

/// Which queues a request acts on, so that a token confined to queue name prefixes can be
/// checked against them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The `{queue}` of the path.
    PathQueue,
    /// The queue of the `{partition_id}` of the path.
    PathPartition,
    /// The queues of the partitions the `{lease_id}` of the path holds.
    PathLease,
    /// Named in the body; the handler checks them ([`Caller`]).
    Body,
    /// The `queue` of the query string, which a confined token must give.
    QueryQueue,
    /// Every queue: refused to a confined token.
    Fleet,
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Always served without a token (`/health`, `/ready`).
    Public,
    /// A token with at least this role, and, for a confined token, queues within its scope.
    Role(Role, Scope),
}

impl Access {
    /// The role column of the README's route table.
    pub fn label(self) -> &'static str {
        match self {
            Access::Public => "public",
            Access::Role(role, _) => role.name(),
        }
    }

    /// The scope column of the README's route table: what a token confined to queue name
    /// prefixes is checked against.
    pub fn scope_label(self) -> &'static str {
        match self {
            Access::Public => "-",
            Access::Role(_, Scope::PathQueue) => "the path's queue",
            Access::Role(_, Scope::PathPartition) => "the partition's queue",
            Access::Role(_, Scope::PathLease) => "the lease's queues",
            Access::Role(_, Scope::Body) => "the queues the body names",
            Access::Role(_, Scope::QueryQueue) => "`?queue=`, required",
            Access::Role(_, Scope::Fleet) => "refused",
        }
    }
}

/// The identity the request was served under; `None` with auth off or on a public path.
#[derive(Debug, Clone, Default)]
pub struct Caller(pub Option<Identity>);

impl Caller {
    /// The token's subject with auth on, else none: what pushed messages record as
    /// `producerSub`, and whom a lock's permit is bound to.
    pub fn subject(&self) -> Option<&str> {
        self.0.as_ref().and_then(|identity| identity.subject.as_deref())
    }

    /// Whom a lock's permits are bound to: the token's subject, or none with auth off. A token
    /// without a subject is refused (403): a permit bound to none is any caller's to renew,
    /// release or find again.
    pub fn permit_holder(&self) -> Result<Option<&str>, ApiError> {
        let Some(identity) = &self.0 else { return Ok(None) };
        let refused =
            || ApiError::Forbidden("lock permits are bound to the token's subject, and it has no `sub`".into());
        identity.subject.as_deref().map(Some).ok_or_else(refused)
    }

    /// Refuses (403) a queue outside the token's scope.
    pub fn check_queues<'a>(&self, queues: impl IntoIterator<Item = &'a str>) -> Result<(), ApiError> {
        let Some(identity) = self.0.as_ref().filter(|identity| identity.is_scoped()) else { return Ok(()) };
        for queue in queues {
            if !identity.allows_queue(queue) {
                return Err(out_of_scope(queue));
            }
        }
        Ok(())
    }

    /// Refuses (403) a namespace a token confined to queue prefixes does not hold whole: a
    /// namespace pop (`?namespace=`) serves every queue labelled with it, so a queue of the token
    /// labelled with another's namespace would reach that namespace's consumers (and, with a
    /// higher priority, be served before its own queues). The namespace `queue`'s own name gives
    /// it is allowed, since the queue gets it without asking.
    pub fn check_namespace(&self, queue: &str, namespace: &str) -> Result<(), ApiError> {
        let Some(identity) = self.0.as_ref().filter(|identity| identity.is_scoped()) else { return Ok(()) };
        let derived = queen_store::queues::derived_namespace_task(queue).0;
        if derived == Some(namespace) || identity.allows_queue(&format!("{namespace}.")) {
            return Ok(());
        }
        Err(ApiError::Forbidden(format!(
            "the token may not place queue {queue:?} in namespace {namespace:?}: a namespace pop there serves queues \
             outside the token's prefixes"
        )))
    }

    /// Refuses (403) a partition of a queue outside the token's scope, and one of no queue: what
    /// is left of a partition cleaned up (its dead letters) is no longer known to be the token's.
    /// The refusal names no queue and is the same for both: partition ids are sequential, and a
    /// token walking them would otherwise learn every queue's name and which partitions exist.
    pub async fn check_partitions(&self, broker: &Broker, partitions: &[i64]) -> Result<(), ApiError> {
        let Some(identity) = self.0.as_ref().filter(|identity| identity.is_scoped()) else { return Ok(()) };
        let owners = access::queues_of_partitions(broker, partitions).await?;
        if owners.unknown.is_empty() && owners.queues.iter().all(|queue| identity.allows_queue(queue)) {
            return Ok(());
        }
        Err(ApiError::Forbidden(
            "a token confined to queues acts only on partitions of its queues, and a partition named is not one".into(),
        ))
    }

    /// Refuses (403) a lease holding messages of a queue outside the token's scope, naming none.
    pub fn check_lease_queues(&self, queues: &[String]) -> Result<(), ApiError> {
        let Some(identity) = self.0.as_ref().filter(|identity| identity.is_scoped()) else { return Ok(()) };
        if queues.iter().all(|queue| identity.allows_queue(queue)) {
            return Ok(());
        }
        Err(ApiError::Forbidden("a token confined to queues acts only on leases of its queues".into()))
    }
}

impl FromRequest for Caller {
    type Error = Error;
    type Future = Ready<Result<Self, Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(Ok(req.extensions().get::<Caller>().cloned().unwrap_or_default()))
    }
}

fn out_of_scope(queue: &str) -> ApiError {
    ApiError::Forbidden(format!("the token may not act on queue {queue:?}"))
}

/// The middleware of every guarded route.
pub async fn authorize(
    access: Access,
    req: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let Access::Role(role, scope) = access else { return next.call(req).await };
    let Some(broker) = req.app_data::<web::Data<Broker>>().cloned() else { return next.call(req).await };
    let Some(auth) = broker.auth.as_deref() else { return next.call(req).await };
    if auth.is_public(super::routed_path(&req)) {
        return next.call(req).await;
    }
    match admit(&broker, auth, role, scope, &req).await {
        Ok(identity) => {
            req.extensions_mut().insert(Caller(Some(identity)));
            next.call(req).await
        }
        Err((reason, refusal)) => {
            broker.metrics.auth_failures.with_label_values(&[reason]).inc();
            tracing::info!(reason, path = req.path(), error = %refusal, "request refused by auth");
            Ok(req.error_response(refusal))
        }
    }
}

async fn admit(
    broker: &Broker,
    auth: &crate::auth::Authenticator,
    role: Role,
    scope: Scope,
    req: &ServiceRequest,
) -> Result<Identity, (&'static str, ApiError)> {
    let token = bearer(req).map_err(|failure| (failure.reason(), ApiError::Unauthorized(failure)))?;
    let identity = auth.authenticate(token).await.map_err(|e| match e {
        AuthError::Failed(failure) => (failure.reason(), ApiError::Unauthorized(failure)),
        AuthError::Unavailable(text) => ("unavailable", ApiError::Unavailable(text)),
    })?;
    match identity.role {
        Some(held) if held >= role => {}
        held => {
            let has = held.map_or_else(|| "no role".to_owned(), |r| format!("role {}", r.name()));
            let refusal = ApiError::Forbidden(format!(
                "insufficient permissions: this needs {}, the token has {has}",
                role.name()
            ));
            return Err(("forbidden_role", refusal));
        }
    }
    if identity.is_scoped() {
        check_scope(broker, &identity, scope, req).await.map_err(|e| match e {
            ApiError::Forbidden(_) => ("forbidden_scope", e),
            // The lookup of a partition's or a lease's queue failed (the database is away).
            other => ("unavailable", other),
        })?;
    }
    Ok(identity)
}

/// The token of `Authorization: Bearer <token>` (a bare token is accepted too, as upstream does).
fn bearer(req: &ServiceRequest) -> Result<&str, AuthFailure> {
    let value = req.headers().get(AUTHORIZATION).ok_or(AuthFailure::Missing)?;
    let value = value.to_str().map_err(|_| AuthFailure::Malformed)?.trim();
    let token = match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
        Some(_) => return Err(AuthFailure::Malformed),
        None => value,
    };
    if token.is_empty() { Err(AuthFailure::Missing) } else { Ok(token) }
}

async fn check_scope(broker: &Broker, identity: &Identity, scope: Scope, req: &ServiceRequest) -> Result<(), ApiError> {
    let caller = Caller(Some(identity.clone()));
    // Decoded as the handler decodes it, so that both see the same name.
    let param = |name| super::body::path_param(req.match_info(), name).ok();
    match scope {
        Scope::Body => Ok(()),
        Scope::PathQueue => caller.check_queues(param("queue").as_deref()),
        Scope::PathPartition => {
            // A route naming its queue too acts on that queue (a partition's seek).
            if req.match_info().get("queue").is_some() {
                caller.check_queues(param("queue").as_deref())?;
            }
            match param("partition_id").and_then(|id| id.parse::<i64>().ok()) {
                Some(id) => caller.check_partitions(broker, &[id]).await,
                // Not a partition id: the handler answers 400 without touching anything.
                None => Ok(()),
            }
        }
        Scope::PathLease => match param("lease_id").and_then(|id| uuid::Uuid::parse_str(&id).ok()) {
            Some(lease) => {
                let queues = access::queues_of_lease(broker, lease).await?;
                caller.check_lease_queues(&queues)
            }
            None => Ok(()),
        },
        Scope::QueryQueue => {
            let query = web::Query::<std::collections::HashMap<String, String>>::from_query(req.query_string()).ok();
            match query.as_ref().and_then(|q| q.get("queue")) {
                Some(queue) => caller.check_queues([queue.as_str()]),
                None => Err(ApiError::Forbidden("a token confined to queues must name one in ?queue=".into())),
            }
        }
        Scope::Fleet => Err(ApiError::Forbidden("a token confined to queues cannot use a fleet-wide route".into())),
    }
}
