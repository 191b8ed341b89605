//! Errors as the HTTP API reports them: a JSON body `{"error": "...", "code": "...", "requestId": "..."}`
//! with a stable `code` a client can branch on. A 5xx answer says only what the client can act
//! on; what went wrong inside is logged under the request id, never sent.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::broker::BrokerError;
use crate::pressure::Refused;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or names something invalid; nothing was written.
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// The route exists, not for this method: 405.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// No usable bearer token (auth on): 401.
    #[error(transparent)]
    Unauthorized(#[from] crate::auth::AuthFailure),
    /// A valid token without the role or the queue scope the request needs: 403.
    #[error("{0}")]
    Forbidden(String),
    /// The request is valid but the state of what it names does not allow it.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// A body in a form the broker does not read (a `Content-Encoding`): 415.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The request body did not arrive within `http.request_body_timeout_ms`: 408.
    #[error("{0}")]
    RequestTimeout(String),
    /// The broker is stopping: retry on another broker. The text is shown to the client.
    #[error("{0}")]
    Unavailable(String),
    /// Something the edge read back cannot be rendered (stored bytes that are not JSON). The text
    /// is the detail for the log.
    #[error("internal error: {0}")]
    Internal(String),
    /// What a broker operation failed with.
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

impl From<Refused> for ApiError {
    fn from(refused: Refused) -> Self {
        ApiError::Broker(BrokerError::Overloaded(refused))
    }
}

/// What an internal error says to the client.
const INTERNAL: &str = "internal error; the broker's log has the details under this request id";

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::BadRequest(message.into())
    }

    fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) | ApiError::Broker(BrokerError::Invalid(_)) => "bad_request",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::Conflict(_) => "conflict",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::RequestTimeout(_) => "request_timeout",
            ApiError::Broker(BrokerError::QueueFull { .. }) => "queue_full",
            ApiError::Broker(BrokerError::LimitReached(_)) => "limit_reached",
            ApiError::Unavailable(_) | ApiError::Broker(BrokerError::Unavailable(_) | BrokerError::NoKey(_)) => {
                "unavailable"
            }
            ApiError::Broker(BrokerError::Overloaded(_)) => "overloaded",
            ApiError::Internal(_) | ApiError::Broker(BrokerError::Internal(_)) => "internal",
        }
    }

    /// Whether the client should come back later (with `Retry-After`). A creation limit is not:
    /// it passes only when something is deleted or the limit is raised (a 409, without
    /// `Retry-After`).
    fn is_transient(&self) -> bool {
        matches!(
            self,
            ApiError::Unavailable(_)
                | ApiError::Broker(
                    BrokerError::Unavailable(_)
                        | BrokerError::NoKey(_)
                        | BrokerError::QueueFull { .. }
                        | BrokerError::Overloaded(_)
                )
        )
    }
}

/// `success: false` rides along so that clients which read `success` (the official client does on
/// several routes) see the failure too.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ErrorBody<'a> {
    success: bool,
    error: String,
    code: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    details: Option<Details<'a>>,
}

/// What a refusal says beyond its message, for a client to act on.
#[derive(Serialize)]
#[serde(untagged)]
enum Details<'a> {
    #[serde(rename_all = "camelCase")]
    QueueFull { queue: &'a str, depth: i64, max_size: i64 },
    /// `limit` is the setting's name; `held` what exists of what it counts (in `queue`, for the
    /// limits per queue), `max` the limit.
    Limit {
        limit: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        queue: Option<&'a str>,
        held: i64,
        max: i64,
    },
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::Broker(BrokerError::Invalid(_)) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Broker(BrokerError::QueueFull { .. }) => StatusCode::TOO_MANY_REQUESTS,
            // Final, not a rate: the official clients retry a 429 in place, a long poll for ever.
            ApiError::Broker(BrokerError::LimitReached(_)) => StatusCode::CONFLICT,
            ApiError::Unavailable(_) | ApiError::Broker(BrokerError::Unavailable(_) | BrokerError::NoKey(_)) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Broker(BrokerError::Overloaded(refused)) if refused.limited.is_broker_wide() => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Broker(BrokerError::Overloaded(_)) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) | ApiError::Broker(BrokerError::Internal(_)) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let request_id = crate::http::request_id::current();
        let error = match self {
            ApiError::Internal(details) | ApiError::Broker(BrokerError::Internal(details)) => {
                tracing::error!(request_id = request_id.as_deref().unwrap_or("-"), details, "internal error");
                INTERNAL.to_owned()
            }
            other => other.to_string(),
        };
        let mut response = HttpResponse::build(self.status_code());
        if self.is_transient() {
            response.insert_header(("Retry-After", "1"));
        }
        if let ApiError::Unauthorized(_) = self {
            response.insert_header(("WWW-Authenticate", "Bearer"));
        }
        if let ApiError::RequestTimeout(_) = self {
            // A body that did not arrive in time is not read further: the connection is done.
            response.force_close();
        }
        let details = match self {
            ApiError::Broker(BrokerError::QueueFull { queue, depth, max_size, .. }) => {
                Some(Details::QueueFull { queue, depth: *depth, max_size: *max_size })
            }
            ApiError::Broker(BrokerError::LimitReached(reached)) => Some(Details::Limit {
                limit: crate::broker::limit_setting(reached.what),
                queue: reached.queue.as_deref(),
                held: reached.held,
                max: reached.max,
            }),
            _ => None,
        };
        response.json(ErrorBody { success: false, error, code: self.code(), request_id, details })
    }
}
