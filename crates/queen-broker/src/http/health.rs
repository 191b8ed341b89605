//! `/health` (liveness), `/ready` (readiness) and `/metrics`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;

use super::body::query_pairs;
use crate::broker::Broker;
use crate::broker::probes::{self, Readiness, Unanswered};
use crate::error::ApiError;

#[derive(Serialize)]
struct Health {
    status: &'static str,
    database: &'static str,
    version: &'static str,
}

/// The process is alive. Never fails because PostgreSQL is down: restarting the broker would
/// not bring the database back.
pub async fn health(broker: web::Data<Broker>) -> HttpResponse {
    let database = match probes::database_reachable(broker.clone()).await {
        Ok(()) => "connected",
        Err(unanswered) => unanswered_state(unanswered),
    };
    HttpResponse::Ok().json(Health { status: "healthy", database, version: env!("CARGO_PKG_VERSION") })
}

/// The broker can serve: PostgreSQL answers, holds the schema this broker needs, and takes
/// writes. While it is read-only the answer is 503 with `database: "read-only"`: a broker that
/// can take no push (and no pop or ack, which write leases and cursors) is not ready, though it
/// stays alive (`/health`) and recovers by itself when writes are taken again. `database` says
/// what was found, and a broker that is stopping answers 503 with `status: "stopping"`. Two
/// states stay ready: a pool whose every connection stayed in use by requests (`busy`: the
/// database answers them; taking every broker of a loaded fleet out of its load balancer at once
/// would turn slow answers into refused connections), and push maintenance, whose point is that
/// the broker takes pushes into its journal while PostgreSQL is away (`status: "buffering"`).
pub async fn ready(broker: web::Data<Broker>) -> HttpResponse {
    let readiness = probes::readiness(broker.clone()).await;
    let database = match readiness {
        Readiness::Ready => "connected",
        Readiness::ReadOnly => "read-only",
        Readiness::SchemaBehind => "schema-behind",
        Readiness::Unanswered(unanswered) => unanswered_state(unanswered),
    };
    let version = env!("CARGO_PKG_VERSION");
    if broker.is_shutting_down() {
        return HttpResponse::ServiceUnavailable().json(Health { status: "stopping", database, version });
    }
    if matches!(readiness, Readiness::Ready | Readiness::Unanswered(Unanswered::PoolBusy)) {
        return HttpResponse::Ok().json(Health { status: "ready", database, version });
    }
    if broker.maintenance.pushes_to_journal() {
        return HttpResponse::Ok().json(Health { status: "buffering", database, version });
    }
    HttpResponse::ServiceUnavailable().json(Health { status: "unavailable", database, version })
}

fn unanswered_state(unanswered: Unanswered) -> &'static str {
    match unanswered {
        Unanswered::PoolBusy => "busy",
        Unanswered::Database => "unreachable",
    }
}

/// `GET /metrics`: the Prometheus text format when the request accepts it (Prometheus asks for
/// `text/plain` or OpenMetrics) or asks with `?format=prometheus`; JSON otherwise, which is what
/// the official client (`Accept: */*`) can read, or with `?format=json`.
pub async fn metrics(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let prometheus_text = wants_prometheus_text(&req)?;
    probes::refresh_metrics(&broker).await;
    let metrics = &broker.metrics;
    Ok(if prometheus_text {
        HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(metrics.render_text())
    } else {
        HttpResponse::Ok().json(metrics.render_json())
    })
}

/// `?format=` decides when given (other parameters are a scraper's own and left alone); the
/// `Accept` header otherwise.
fn wants_prometheus_text(req: &HttpRequest) -> Result<bool, ApiError> {
    match query_pairs(req.query_string())?.get("format").map(String::as_str) {
        Some("prometheus") => return Ok(true),
        Some("json") => return Ok(false),
        Some(other) => {
            let other = crate::names::quoted_member(other);
            return Err(ApiError::bad_request(format!("format must be prometheus or json, not \"{other}\"")));
        }
        None => {}
    }
    let accept = req.headers().get(actix_web::http::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    Ok(accept.contains("text/plain") || accept.contains("openmetrics"))
}
