//! A web page can make its visitor's browser send requests to any address it names, an internal
//! broker's included, and a request that needs no preflight (a GET, a POST of text) reaches the
//! handler even though the page cannot read the answer: with auth off (the default), any page
//! a user on the network opens could pop with `autoAck`, switch maintenance on or delete
//! dead letters. Browsers say where a request comes from (`Sec-Fetch-Site`); an API request
//! that a page of another origin made is refused (403) unless `http.allow_cross_site` says
//! otherwise. Clients other than browsers send no such header, and the broker's own dashboard
//! is the same origin. The broker sends no CORS headers, so no page of another origin could use
//! the answers anyway.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{Error, ResponseError, web};

use crate::broker::Broker;
use crate::error::ApiError;

pub async fn refuse(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, Error> {
    let allowed = req.app_data::<web::Data<Broker>>().is_none_or(|broker| broker.config.http.allow_cross_site);
    let site = req.headers().get("sec-fetch-site").map(|value| value.as_bytes());
    // `same-site` is another origin too (another port or subdomain of the same site).
    let another_origin = matches!(site, Some(b"cross-site" | b"same-site"));
    if !allowed && another_origin && req.path().starts_with("/api/") {
        let refusal = ApiError::Forbidden(
            "a browser request made by a page of another origin is refused (http.allow_cross_site)".into(),
        )
        .error_response();
        return Ok(req.into_response(refusal).map_into_right_body());
    }
    next.call(req).await.map(ServiceResponse::map_into_left_body)
}
