//! `GET`/`POST /api/v1/system/maintenance` (push maintenance) and
//! `GET`/`POST /api/v1/system/maintenance/pop` (pop maintenance).

use actix_web::{HttpResponse, web};
use queen_store::system_state::Mode;
use serde::Serialize;

use super::body::{JsonObject, NoQuery, read_body};
use crate::broker::Broker;
use crate::broker::maintenance_mode::{self, MaintenanceStatus};
use crate::error::ApiError;

/// Largest body these routes read: `{"enabled": true}` and some room.
const MAX_BODY: usize = 1024;

/// Both switches and this broker's journal, on either route.
pub async fn status(broker: web::Data<Broker>, _: NoQuery) -> Result<HttpResponse, ApiError> {
    answer(maintenance_mode::status(&broker).await?)
}

pub async fn set_push(broker: web::Data<Broker>, _: NoQuery, payload: web::Payload) -> Result<HttpResponse, ApiError> {
    set(&broker, Mode::PushMaintenance, payload).await
}

pub async fn set_pop(broker: web::Data<Broker>, _: NoQuery, payload: web::Payload) -> Result<HttpResponse, ApiError> {
    set(&broker, Mode::PopMaintenance, payload).await
}

async fn set(broker: &Broker, mode: Mode, payload: web::Payload) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, MAX_BODY, broker).await?;
    let body = JsonObject::parse_body(&body, false)?;
    body.takes_only(&["enabled"])?;
    let enabled = body
        .boolean("enabled")?
        .ok_or_else(|| ApiError::bad_request("enabled is required: {\"enabled\": true} or {\"enabled\": false}"))?;
    answer(maintenance_mode::set(broker, mode, enabled).await?)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusJson<'a> {
    maintenance_mode: bool,
    pop_maintenance_mode: bool,
    buffered_messages: u64,
    buffer_healthy: bool,
    buffer_directory: &'a str,
}

fn answer(status: MaintenanceStatus) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(StatusJson {
        maintenance_mode: status.modes.push_maintenance,
        pop_maintenance_mode: status.modes.pop_maintenance,
        buffered_messages: status.buffered_messages,
        buffer_healthy: status.buffer_healthy,
        buffer_directory: &status.buffer_directory,
    }))
}
