//! `POST /api/v1/lease/{leaseId}/extend`.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use queen_store::cursors::LeaseExtension;
use serde::Serialize;
use uuid::Uuid;

use super::body::{JsonObject, NoQuery, read_body};
use super::timestamp;
use crate::broker::{Broker, leases};
use crate::error::ApiError;

/// Longest extension one call may ask for.
const MAX_EXTENSION_SECONDS: i64 = 7 * 24 * 3600;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Extended {
    lease_id: Uuid,
    success: bool,
    renewed: u64,
    new_expires_at: Option<String>,
    expires_at: Option<String>,
    error: Option<String>,
}

pub async fn extend(
    broker: web::Data<Broker>,
    _: NoQuery,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let raw = req.match_info().get("lease_id").unwrap_or_default();
    let lease_id = Uuid::parse_str(raw).map_err(|_| ApiError::bad_request(format!("{raw:?} is not a lease id")))?;
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let body = JsonObject::parse_body(&body, true)?;
    body.takes_only(&["seconds"])?;
    let seconds = body
        .integer("seconds")?
        .map(|s| {
            (1..=MAX_EXTENSION_SECONDS)
                .contains(&s)
                .then_some(s as i32)
                .ok_or_else(|| ApiError::bad_request(format!("seconds must be from 1 to {MAX_EXTENSION_SECONDS}")))
        })
        .transpose()?;
    let answer = |success, renewed, at: Option<DateTime<Utc>>, error: Option<&str>| Extended {
        lease_id,
        success,
        renewed,
        new_expires_at: at.map(timestamp),
        expires_at: at.map(timestamp),
        error: error.map(str::to_owned),
    };
    match leases::extend(&broker, lease_id, seconds).await? {
        LeaseExtension::Extended { expires_at, partitions } => {
            Ok(HttpResponse::Ok().json(answer(true, partitions, Some(expires_at), None)))
        }
        LeaseExtension::Expired => Ok(HttpResponse::Ok().json(answer(
            false,
            0,
            None,
            Some("lease expired or was released; it cannot be extended"),
        ))),
        LeaseExtension::Unknown => Err(ApiError::NotFound(format!(
            "lease {lease_id} not found: no cursor holds it (it never existed, or it expired and its partition was leased again)"
        ))),
    }
}
