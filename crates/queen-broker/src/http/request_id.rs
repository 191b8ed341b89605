//! Request ids: every request gets one (the caller's `X-Request-Id` when it sends a usable one),
//! every response carries it back in `X-Request-Id`, error bodies name it, and what the broker
//! logs while serving the request is under it. A client reporting a 5xx quotes the id; the
//! details are in the log, never in the answer.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use tracing::Instrument;

pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Longest caller-chosen id kept; a longer or odd one is replaced by the broker's own.
const MAX_LEN: usize = 128;

tokio::task_local! {
    static CURRENT: String;
}

/// The id of the request being served, when called while serving one.
pub fn current() -> Option<String> {
    CURRENT.try_with(Clone::clone).ok()
}

fn usable(id: &str) -> bool {
    (1..=MAX_LEN).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// The middleware: names the request, serves it under that name, and stamps the answer.
pub async fn assign(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let id = req
        .headers()
        .get(&HEADER)
        .and_then(|value| value.to_str().ok())
        .filter(|id| usable(id))
        .map_or_else(|| uuid::Uuid::now_v7().simple().to_string(), str::to_owned);
    let span = tracing::info_span!("request", request_id = %id, method = %req.method(), path = %req.path());
    let mut response = CURRENT.scope(id.clone(), next.call(req)).instrument(span).await?;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HEADER, value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::usable;

    #[test]
    fn only_short_plain_ids_are_taken_from_the_caller() {
        assert!(usable("0192f0c4-7b1e-7c3a-9d2e-5b6f7a8b9c0d"));
        assert!(usable("lb:abc_1.2"));
        assert!(!usable(""));
        assert!(!usable("has space"));
        assert!(!usable("new\nline"));
        assert!(!usable(&"x".repeat(129)));
    }
}
