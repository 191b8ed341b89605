//! `/health` (liveness), `/ready` (readiness) and `/metrics`.

use std::time::Duration;

use actix_web::{HttpResponse, web};
use serde::Serialize;

use crate::broker::Broker;

/// How long `/health` and `/ready` wait for PostgreSQL to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

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
    if schema_current(&broker).await {
        HttpResponse::Ok().json(Health { status: "ready", database: "connected", version: env!("CARGO_PKG_VERSION") })
    } else {
        HttpResponse::ServiceUnavailable().json(Health {
            status: "unavailable",
            database: "unreachable",
            version: env!("CARGO_PKG_VERSION"),
        })
    }
}

pub async fn metrics(broker: web::Data<Broker>) -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(broker.metrics.render_text())
}
