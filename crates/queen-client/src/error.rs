//! One error type for every call: [`Error`].

use std::time::Duration;

use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What a call of this crate can fail with.
///
/// Refusals the broker states in a 2xx answer (an acknowledgement refused, a lease that cannot be
/// extended any more) are not errors: they come back as per-item verdicts in the call's answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No answer came: the connection could not be made or was reset, the request timed out, or
    /// the answer's body could not be read. `url` is the broker's URL tried last; a call that
    /// failed over names the others it tried in `tried`.
    #[error("{url}: {source}{}", also_tried(.tried))]
    Transport {
        /// The request's URL.
        url: String,
        /// What went wrong.
        #[source]
        source: reqwest::Error,
        /// The request's URLs at the other brokers this call tried before `url`, in the order
        /// first tried; empty when it tried no other.
        tried: Vec<String>,
    },
    /// The broker answered with an error status (not one of the statuses below, which have
    /// variants of their own).
    #[error("{url} answered {status}: {}", .body.error)]
    Status {
        /// The request's URL.
        url: String,
        /// The HTTP status.
        status: StatusCode,
        /// The broker's JSON error body.
        body: Box<ErrorBody>,
        /// The answer's `Retry-After`, when it had one.
        retry_after: Option<Duration>,
    },
    /// A push was refused with 429 `queue_full`: the queue holds `max_size` messages (its
    /// `maxSize` option) and nothing of the push was written.
    #[error("queue {queue:?} is full ({depth} messages, at most {max_size})")]
    QueueFull {
        /// The request's URL.
        url: String,
        /// The full queue.
        queue: String,
        /// Messages in the queue when the push was refused.
        depth: i64,
        /// The queue's `maxSize`.
        max_size: i64,
        /// When to try again, as the broker suggests.
        retry_after: Option<Duration>,
        /// The broker's request id, to find its log lines.
        request_id: Option<String>,
    },
    /// A request would take the fleet past one of its creation limits (409 `limit_reached`):
    /// queues, partitions per queue or consumer groups per queue. Nothing was created; retrying
    /// does not help until something is deleted or the limit raised.
    #[error("{url}: {} ({limit} is {max})", .body.error)]
    LimitReached {
        /// The request's URL.
        url: String,
        /// The broker setting that limits, e.g. `limits.max_queues`.
        limit: String,
        /// How many of what it counts exist.
        held: i64,
        /// The limit.
        max: i64,
        /// The whole error body.
        body: Box<ErrorBody>,
    },
    /// A transaction was refused whole (409 `rolled_back`): nothing of it applied.
    #[error("transaction rolled back: {reason}")]
    RolledBack {
        /// The request's URL.
        url: String,
        /// The id the broker gave the attempt.
        transaction_id: Option<String>,
        /// Why, as the broker says it (an acknowledgement refused, a required lease not live...).
        reason: String,
        /// The broker's request id, to find its log lines.
        request_id: Option<String>,
    },
    /// The broker's answer is not what this client expected.
    #[error("{url}: cannot read the answer: {reason}")]
    Decode {
        /// The request's URL.
        url: String,
        /// What did not fit.
        reason: String,
    },
    /// The call was refused before anything was sent (an empty batch, a name the broker would
    /// refuse, a payload that is not JSON...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The client could not be built (a bad URL, an unreadable CA certificate...).
    #[error("client configuration: {0}")]
    Config(String),
}

/// ` (also tried a, b)`, or nothing.
fn also_tried(tried: &[String]) -> String {
    if tried.is_empty() { String::new() } else { format!(" (also tried {})", tried.join(", ")) }
}

impl Error {
    /// The HTTP status of an answer the broker refused; `None` when there was no answer.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Error::Status { status, .. } => Some(*status),
            Error::QueueFull { .. } => Some(StatusCode::TOO_MANY_REQUESTS),
            Error::LimitReached { .. } | Error::RolledBack { .. } => Some(StatusCode::CONFLICT),
            _ => None,
        }
    }

    /// The broker's machine-readable error `code` (`bad_request`, `not_found`, `unauthorized`,
    /// `forbidden`, `conflict`, `queue_full`, `limit_reached`, `overloaded`, `unavailable`,
    /// `internal`, `rolled_back`...), when the answer carried one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Status { body, .. } => body.code.as_deref(),
            Error::QueueFull { .. } => Some("queue_full"),
            Error::LimitReached { .. } => Some("limit_reached"),
            Error::RolledBack { .. } => Some("rolled_back"),
            _ => None,
        }
    }

    /// The broker's id of the request (its `X-Request-Id`), under which its log has the details.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Error::Status { body, .. } | Error::LimitReached { body, .. } => body.request_id.as_deref(),
            Error::QueueFull { request_id, .. } | Error::RolledBack { request_id, .. } => request_id.as_deref(),
            _ => None,
        }
    }

    /// The URL of the request that failed, when one was sent.
    pub fn url(&self) -> Option<&str> {
        match self {
            Error::Transport { url, .. }
            | Error::Status { url, .. }
            | Error::QueueFull { url, .. }
            | Error::LimitReached { url, .. }
            | Error::RolledBack { url, .. }
            | Error::Decode { url, .. } => Some(url),
            Error::InvalidArgument(_) | Error::Config(_) => None,
        }
    }

    /// How long the broker asked the client to wait before trying again (`Retry-After`).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Status { retry_after, .. } | Error::QueueFull { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether the same call may succeed later, unchanged: no answer came (connection refused
    /// or reset, a timeout), or the broker answered 408, 429 (except a creation limit), 502, 503
    /// or 504. The client has already retried such failures as far as its
    /// [`RetryPolicy`](crate::RetryPolicy) allows; this says whether trying again later makes
    /// sense.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Transport { .. } | Error::QueueFull { .. } => true,
            Error::Status { status, .. } => matches!(
                *status,
                StatusCode::REQUEST_TIMEOUT
                    | StatusCode::TOO_MANY_REQUESTS
                    | StatusCode::BAD_GATEWAY
                    | StatusCode::SERVICE_UNAVAILABLE
                    | StatusCode::GATEWAY_TIMEOUT
            ),
            _ => false,
        }
    }

    /// Whether no answer came because the request timed out.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Transport { source, .. } if source.is_timeout())
    }

    /// Whether the broker answered 404 (no such queue, lease, message, dead letter or group).
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(StatusCode::NOT_FOUND)
    }

    /// Whether the broker refused the credentials (401: no usable token) or their rights (403:
    /// the token lacks the role or the queue scope).
    pub fn is_auth(&self) -> bool {
        matches!(self.status(), Some(StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN))
    }
}

/// The broker's JSON error body: `{"error": "...", "code": "...", "requestId": "..."}` and what
/// a refusal says beyond that (`details`, e.g. `queue`, `depth` and `maxSize` of a full queue).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ErrorBody {
    /// What went wrong, in words. For an answer that was not a JSON error body, its text.
    #[serde(default)]
    pub error: String,
    /// The machine-readable code.
    #[serde(default)]
    pub code: Option<String>,
    /// The broker's id of the request.
    #[serde(default)]
    pub request_id: Option<String>,
    /// Every other member of the body.
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

impl ErrorBody {
    /// Reads an error answer: a JSON error body, or any text. `request_id` (from the
    /// `X-Request-Id` header) fills in when the body names none.
    pub(crate) fn parse(status: StatusCode, body: &[u8], request_id: Option<String>) -> ErrorBody {
        let mut parsed = match serde_json::from_slice::<ErrorBody>(body) {
            Ok(parsed) if !parsed.error.is_empty() || parsed.code.is_some() => parsed,
            _ => {
                // Not an error body (a proxy's page, `/ready`'s JSON): its text, bounded, and the
                // members of a JSON object as details.
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                let mut error: String = text.chars().take(1000).collect();
                if error.is_empty() {
                    error = status.canonical_reason().unwrap_or("no reason given").to_owned();
                }
                let details = serde_json::from_slice::<Map<String, Value>>(body).unwrap_or_default();
                ErrorBody { error, details, ..ErrorBody::default() }
            }
        };
        parsed.details.remove("success");
        if parsed.request_id.is_none() {
            parsed.request_id = request_id;
        }
        parsed
    }

    pub(crate) fn detail_i64(&self, key: &str) -> Option<i64> {
        self.details.get(key).and_then(Value::as_i64)
    }

    pub(crate) fn detail_str(&self, key: &str) -> Option<&str> {
        self.details.get(key).and_then(Value::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_are_read_whether_json_or_not() {
        let body = br#"{"success":false,"error":"queue \"q\" is full","code":"queue_full","requestId":"r1","queue":"q","depth":3,"maxSize":3}"#;
        let parsed = ErrorBody::parse(StatusCode::TOO_MANY_REQUESTS, body, None);
        assert_eq!(parsed.code.as_deref(), Some("queue_full"));
        assert_eq!(parsed.request_id.as_deref(), Some("r1"));
        assert_eq!(parsed.detail_i64("maxSize"), Some(3));
        assert!(!parsed.details.contains_key("success"));

        let page = ErrorBody::parse(StatusCode::BAD_GATEWAY, b"<html>bad gateway</html>", Some("r2".into()));
        assert_eq!(page.error, "<html>bad gateway</html>");
        assert_eq!(page.request_id.as_deref(), Some("r2"));
        let empty = ErrorBody::parse(StatusCode::SERVICE_UNAVAILABLE, b"", None);
        assert_eq!(empty.error, "Service Unavailable");
        let ready = ErrorBody::parse(StatusCode::SERVICE_UNAVAILABLE, br#"{"status":"unavailable"}"#, None);
        assert_eq!(ready.error, r#"{"status":"unavailable"}"#);
        assert_eq!(ready.detail_str("status"), Some("unavailable"));
    }
}
