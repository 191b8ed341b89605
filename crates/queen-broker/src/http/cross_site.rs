//! A web page can make its visitor's browser send requests to any address it names, an internal
//! broker's included, and a request that needs no preflight (a GET, a POST of text) reaches the
//! handler even though the page cannot read the answer: with auth off (the default), any page
//! a user on the network opens could pop with `autoAck`, switch maintenance on or delete
//! dead letters. Browsers say where a request comes from (`Sec-Fetch-Site`); an API request
//! that a page of another origin made is refused (403) unless `http.allow_cross_site` says
//! otherwise. Clients other than browsers send no such header, and the broker's own dashboard
//! is the same origin. Browsers send `Sec-Fetch-Site` only to trustworthy addresses (HTTPS, or
//! loopback), not to a plain-HTTP broker elsewhere on the network; there the `Origin` a browser
//! puts on every cross-origin POST (and CORS request) tells it: one naming another host than the
//! request's is refused too. (A GET an `<img>` makes carries neither over plain HTTP: serve the
//! API over HTTPS, or turn auth on.) The broker sends no CORS headers, so no page of another
//! origin could use the answers anyway.

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
    let another_origin = matches!(site, Some(b"cross-site" | b"same-site")) || foreign_origin(&req);
    if !allowed && another_origin && super::is_api(&req) {
        let refusal = ApiError::Forbidden(
            "a browser request made by a page of another origin is refused (http.allow_cross_site)".into(),
        )
        .error_response();
        return Ok(req.into_response(refusal).map_into_right_body());
    }
    next.call(req).await.map(ServiceResponse::map_into_left_body)
}

/// Whether the request names an `Origin` whose host (and port) is not the one it was sent to.
fn foreign_origin(req: &ServiceRequest) -> bool {
    let Some(origin) = req.headers().get("origin") else { return false };
    let Ok(origin) = origin.to_str() else { return true };
    // `null` (a sandboxed page, a file) and anything without a scheme is no origin of ours.
    let Some((scheme, authority)) = origin.split_once("://") else { return true };
    let host = req.connection_info().host().to_ascii_lowercase();
    without_default_port(scheme, &authority.to_ascii_lowercase()) != without_default_port(scheme, &host)
}

/// `authority` without the port its scheme implies (`h:443` for https is `h`).
fn without_default_port<'a>(scheme: &str, authority: &'a str) -> &'a str {
    let default = match scheme {
        "https" => ":443",
        _ => ":80",
    };
    authority.strip_suffix(default).unwrap_or(authority)
}
