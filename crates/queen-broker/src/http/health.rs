//! `/health` (liveness), `/ready` (readiness) and `/metrics`.

use std::time::Duration;

use std::collections::BTreeMap;
use std::time::Instant;

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;

use crate::broker::Broker;

/// How long `/health` and `/ready` wait for PostgreSQL to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How often scrapes re-read consumer lag from the database.
const LAG_REFRESH: Duration = Duration::from_secs(10);

async fn database_reachable(broker: &Broker) -> bool {
    let probe = async {
        let client = broker.pool.get().await.ok()?;
        client.simple_query("SELECT 1").await.ok()
    };
    matches!(tokio::time::timeout(PROBE_TIMEOUT, probe).await, Ok(Some(_)))
}

#[derive(Serialize)]
struct Health {
    status: &'static str,
    database: &'static str,
    version: &'static str,
}

/// The process is alive. Never fails because PostgreSQL is down: restarting the broker would
/// not bring the database back.
pub async fn health(broker: web::Data<Broker>) -> HttpResponse {
    let database = if database_reachable(&broker).await { "connected" } else { "unreachable" };
    HttpResponse::Ok().json(Health { status: "healthy", database, version: env!("CARGO_PKG_VERSION") })
}

/// The schema is at the version this broker needs (another broker may have rolled the
/// database back or replaced it).
async fn schema_current(broker: &Broker) -> bool {
    let check = async {
        let client = broker.pool.get().await.ok()?;
        queen_store::migrations::current_version(&client).await.ok()
    };
    let latest = queen_store::migrations::latest_version();
    matches!(tokio::time::timeout(PROBE_TIMEOUT, check).await, Ok(Some(version)) if version >= latest)
}

/// The broker can serve: PostgreSQL answers and holds the schema this broker needs.
pub async fn ready(broker: web::Data<Broker>) -> HttpResponse {
    if !broker.is_shutting_down() && schema_current(&broker).await {
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
    let metrics = &broker.metrics;
    metrics.observe_pool(broker.pool.status());
    metrics.observe_db_failures(queen_store::failure_counts());
    refresh_lag(&broker).await;
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

/// Consumer lag comes from the cursors; it is read at most every [`LAG_REFRESH`], however often
/// the broker is scraped.
async fn refresh_lag(broker: &Broker) {
    let due = {
        let mut last = broker.lag_refreshed_at.lock().unwrap_or_else(|p| p.into_inner());
        let due = last.is_none_or(|at| at.elapsed() >= LAG_REFRESH);
        if due {
            *last = Some(Instant::now());
        }
        due
    };
    if !due {
        return;
    }
    let lags = async {
        let client = broker.pool.get().await.ok()?;
        queen_store::groups::cursor_lags(&client, None).await.ok()
    };
    let Ok(Some(lags)) = tokio::time::timeout(PROBE_TIMEOUT, lags).await else { return };
    let mut totals: BTreeMap<(&str, &str), (i64, f64)> = BTreeMap::new();
    for cursor in &lags {
        let total = totals.entry((&cursor.queue, &cursor.group)).or_default();
        total.0 += cursor.lag_messages;
        total.1 = total.1.max(cursor.lag_seconds);
    }
    let metrics = &broker.metrics;
    metrics.lag_messages.reset();
    metrics.lag_seconds.reset();
    for ((queue, group), (messages, seconds)) in totals {
        metrics.lag_messages.with_label_values(&[queue, group]).set(messages);
        metrics.lag_seconds.with_label_values(&[queue, group]).set(seconds);
    }
}
