//! `/health` (liveness), `/ready` (readiness) and `/metrics`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;

use crate::broker::{Broker, probes};

#[derive(Serialize)]
struct Health {
    status: &'static str,
    database: &'static str,
    version: &'static str,
}

/// The process is alive. Never fails because PostgreSQL is down: restarting the broker would
/// not bring the database back.
pub async fn health(broker: web::Data<Broker>) -> HttpResponse {
    let database = if probes::database_reachable(&broker).await { "connected" } else { "unreachable" };
    HttpResponse::Ok().json(Health { status: "healthy", database, version: env!("CARGO_PKG_VERSION") })
}

/// The broker can serve: PostgreSQL answers and holds the schema this broker needs.
pub async fn ready(broker: web::Data<Broker>) -> HttpResponse {
    if !broker.is_shutting_down() && probes::schema_current(&broker).await {
        HttpResponse::Ok().json(Health { status: "ready", database: "connected", version: env!("CARGO_PKG_VERSION") })
    } else {
        HttpResponse::ServiceUnavailable().json(Health {
            status: "unavailable",
            database: "unreachable",
            version: env!("CARGO_PKG_VERSION"),
        })
    }
}

/// `GET /metrics`: the Prometheus text format when the request accepts it (Prometheus asks for
/// `text/plain` or OpenMetrics) or asks with `?format=prometheus`; JSON otherwise, which is what
/// the official client (`Accept: */*`) can read, or with `?format=json`.
pub async fn metrics(broker: web::Data<Broker>, req: HttpRequest) -> HttpResponse {
    probes::refresh_metrics(&broker).await;
    let metrics = &broker.metrics;
    if wants_prometheus_text(&req) {
        HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(metrics.render_text())
    } else {
        HttpResponse::Ok().json(metrics.render_json())
    }
}

fn wants_prometheus_text(req: &HttpRequest) -> bool {
    let query = req.query_string();
    if query.contains("format=json") {
        return false;
    }
    if query.contains("format=prometheus") {
        return true;
    }
    let accept = req.headers().get(actix_web::http::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    accept.contains("text/plain") || accept.contains("openmetrics")
}
