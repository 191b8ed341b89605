//! DNS rebinding: a page of `evil.example` can have its name point at 127.0.0.1 once it is
//! loaded, and its scripts then reach a broker on the visitor's own machine as the page's own
//! origin. Neither `Sec-Fetch-Site` nor `Origin` tells such a request apart (`http::cross_site`
//! cannot refuse it), and the page reads the answers: with auth off, every message. What gives
//! it away is the `Host` it names, the page's. A request that comes over loopback is served only
//! when its `Host` is an IP address (nothing to rebind), `localhost` or a name under it (browsers
//! resolve those themselves), this machine's name, or a name in `http.allowed_hosts` (a proxy on
//! the same machine that passes its clients' `Host` on). Requests from other machines are left
//! alone: their legitimate names (a Service's, a load balancer's) cannot be known here.

use std::net::IpAddr;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::{Error, ResponseError, web};

use crate::broker::Broker;
use crate::error::ApiError;

pub async fn refuse(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, Error> {
    let over_loopback = req.peer_addr().is_some_and(|peer| peer.ip().to_canonical().is_loopback());
    if over_loopback
        && let Some(name) = named_host(&req)
        && !allowed(&name, &req)
    {
        let refusal = ApiError::Forbidden(format!(
            "Host {name:?} is not one this broker answers to over loopback (a DNS-rebinding page names its own); \
             add it to http.allowed_hosts"
        ))
        .error_response();
        return Ok(req.into_response(refusal).map_into_right_body());
    }
    next.call(req).await.map(ServiceResponse::map_into_left_body)
}

/// The host name the request was sent to, lowercased and without its port or a final dot; none
/// when it names no host or an IP address.
fn named_host(req: &ServiceRequest) -> Option<String> {
    // The header itself: `connection_info().host()` would take `X-Forwarded-Host`, which the
    // rebinding page's own scripts may set.
    let authority = match req.headers().get(header::HOST) {
        Some(value) => value.to_str().unwrap_or("\u{fffd}"),
        None => req.uri().authority()?.as_str(),
    };
    host_name(authority)
}

/// `authority`'s host when it is a name: `[::1]:6632` and `127.0.0.1` are none (and cost no
/// allocation: every request over loopback is looked at).
fn host_name(authority: &str) -> Option<String> {
    if authority.starts_with('[') {
        return None;
    }
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    (!host.is_empty() && host.parse::<IpAddr>().is_err()).then(|| host.to_ascii_lowercase())
}

fn allowed(name: &str, req: &ServiceRequest) -> bool {
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    if crate::startup::hostname().eq_ignore_ascii_case(name) {
        return true;
    }
    let broker = req.app_data::<web::Data<Broker>>();
    broker
        .is_some_and(|broker| broker.config.http.allowed_host_names().any(|allowed| allowed == "*" || allowed == name))
}

#[cfg(test)]
mod tests {
    use super::host_name;

    #[test]
    fn addresses_name_no_host_and_names_lose_their_port_and_final_dot() {
        for address in ["127.0.0.1", "127.0.0.1:6632", "[::1]:6632", "[::1]", "10.0.0.7:80", ""] {
            assert_eq!(host_name(address), None, "{address}");
        }
        assert_eq!(host_name("Evil.Example:6632").as_deref(), Some("evil.example"));
        assert_eq!(host_name("evil.example.").as_deref(), Some("evil.example"));
        assert_eq!(host_name("localhost").as_deref(), Some("localhost"));
    }
}
