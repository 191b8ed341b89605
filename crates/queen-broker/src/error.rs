//! Errors as the HTTP API reports them: a JSON body `{"error": "...", "code": "...", "requestId": "..."}`
//! with a stable `code` a client can branch on. A 5xx answer says only what the client can act
//! on; what went wrong inside is logged under the request id, never sent.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use queen_store::StoreError;
use serde::Serialize;

use crate::pressure::Refused;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or names something invalid; nothing was written.
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// The request is valid but the state of what it names does not allow it.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// A push would take the queue's unconsumed depth past its `maxSize`; nothing was written.
    #[error(
        "queue {queue:?} is full: {depth} messages are unconsumed, its maxSize is {max_size}, and the push adds {adding}"
    )]
    QueueFull { queue: String, depth: i64, max_size: i64, adding: i64 },
    /// PostgreSQL is unreachable: retry later. The text is the broker's own words, shown to the
    /// client.
    #[error("{0}")]
    Unavailable(String),
    /// A bound of what the broker holds at once was reached; nothing was written. Retry later
    /// (503: on another broker too; 429: the bound is one partition's or group's).
    #[error(transparent)]
    Overloaded(#[from] Refused),
    /// A fault of the broker or the database it did not expect. The text is the detail for the
    /// log; the client is told only that it happened, and the request id.
    #[error("internal error: {0}")]
    Internal(String),
}

/// What a 5xx caused by the database says, whatever PostgreSQL said.
pub const DATABASE_UNAVAILABLE: &str = "the database is unavailable; retry later";

/// What an internal error says to the client.
const INTERNAL: &str = "internal error; the broker's log has the details under this request id";

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::BadRequest(message.into())
    }

    fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict(_) => "conflict",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::QueueFull { .. } => "queue_full",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Overloaded(_) => "overloaded",
            ApiError::Internal(_) => "internal",
        }
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
#[serde(rename_all = "camelCase")]
struct Details<'a> {
    queue: &'a str,
    depth: i64,
    max_size: i64,
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Overloaded(refused) if refused.limited.is_broker_wide() => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let request_id = crate::http::request_id::current();
        let error = match self {
            ApiError::Internal(details) => {
                tracing::error!(request_id = request_id.as_deref().unwrap_or("-"), details, "internal error");
                INTERNAL.to_owned()
            }
            other => other.to_string(),
        };
        let mut response = HttpResponse::build(self.status_code());
        if matches!(self, ApiError::Unavailable(_) | ApiError::QueueFull { .. } | ApiError::Overloaded(_)) {
            response.insert_header(("Retry-After", "1"));
        }
        let details = match self {
            ApiError::QueueFull { queue, depth, max_size, .. } => {
                Some(Details { queue, depth: *depth, max_size: *max_size })
            }
            _ => None,
        };
        response.json(ErrorBody { success: false, error, code: self.code(), request_id, details })
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if let StoreError::NoEncryptionKey { .. } = e {
            // Another broker of the fleet may have the key; this one is misconfigured.
            tracing::error!(error = %e, "refused to write an encrypted queue in plain text");
            return ApiError::Unavailable(e.to_string());
        }
        if e.is_unavailable() {
            tracing::warn!(error = %e, "database unavailable");
            ApiError::Unavailable(DATABASE_UNAVAILABLE.into())
        } else {
            ApiError::Internal(format!("database operation failed: {e}"))
        }
    }
}
