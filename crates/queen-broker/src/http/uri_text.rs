//! A request's path and query name queues, partitions, groups and transaction ids, percent-
//! encoded. actix (paths) and `serde_urlencoded` (queries) decode escapes that are not UTF-8 by
//! putting U+FFFD in their place, so `%FF` and `%FE` would both name the group `"\u{FFFD}"`,
//! which a pop would create and a deletion act on. An API request whose path or query is not
//! UTF-8 once decoded is refused (400) before it is routed.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{Error, ResponseError};

use crate::error::ApiError;

pub async fn refuse_non_utf8(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, Error> {
    let not_text = |raw: &str| percent_encoding::percent_decode_str(raw).decode_utf8().is_err();
    let which = if not_text(req.uri().path()) {
        Some("path")
    } else if not_text(req.query_string()) {
        Some("query string")
    } else {
        None
    };
    if let Some(which) = which.filter(|_| super::is_api(&req)) {
        let refusal = ApiError::bad_request(format!("the {which} is not UTF-8 once percent-decoded")).error_response();
        return Ok(req.into_response(refusal).map_into_right_body());
    }
    next.call(req).await.map(ServiceResponse::map_into_left_body)
}
