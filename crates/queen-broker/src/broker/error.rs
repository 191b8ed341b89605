//! What a broker operation fails with, in the broker's terms. The HTTP edge
//! ([`crate::error::ApiError`]) turns each kind into a status and a body; below, the store
//! ([`StoreError`]) and the actors ([`WorkError`]) have enums of their own, turned into this one.

use queen_store::StoreError;

use crate::actors::WorkError;
use crate::pressure::Refused;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The request asks for something this broker refuses as given (an invalid option, a body it
    /// cannot buffer, ...); nothing was written. The text names what.
    #[error("{0}")]
    Invalid(String),
    /// A push would take the queue's unconsumed depth past its `maxSize`; nothing was written.
    #[error(
        "queue {queue:?} is full: {depth} messages are unconsumed, its maxSize is {max_size}, and the push adds {adding}"
    )]
    QueueFull { queue: String, depth: i64, max_size: i64, adding: i64 },
    /// Retry later: the database is unreachable, or what the request named changed under it. The
    /// text is the broker's own words, fit for the client.
    #[error("{0}")]
    Unavailable(String),
    /// A bound of what the broker holds at once was reached; nothing was written.
    #[error(transparent)]
    Overloaded(#[from] Refused),
    /// A fault the broker did not expect. The text is the detail for the log, not for the client.
    #[error("internal error: {0}")]
    Internal(String),
}

/// What a 5xx caused by the database says, whatever PostgreSQL said.
pub const DATABASE_UNAVAILABLE: &str = "the database is unavailable; retry later";

impl BrokerError {
    pub fn invalid(message: impl Into<String>) -> Self {
        BrokerError::Invalid(message.into())
    }
}

impl From<StoreError> for BrokerError {
    fn from(e: StoreError) -> Self {
        if let StoreError::NoEncryptionKey { .. } = e {
            // Another broker of the fleet may have the key; this one is misconfigured.
            tracing::error!(error = %e, "refused to write an encrypted queue in plain text");
            return BrokerError::Unavailable(e.to_string());
        }
        if e.is_unavailable() {
            tracing::warn!(error = %e, "database unavailable");
            BrokerError::Unavailable(DATABASE_UNAVAILABLE.into())
        } else {
            BrokerError::Internal(format!("database operation failed: {e}"))
        }
    }
}

impl From<WorkError> for BrokerError {
    fn from(e: WorkError) -> Self {
        match e {
            WorkError::Unavailable => BrokerError::Unavailable(e.to_string()),
            WorkError::Overloaded(refused) => BrokerError::Overloaded(refused),
            WorkError::Gone(_) => BrokerError::Unavailable(format!("{e}; retry the request")),
            WorkError::Failed(_) => BrokerError::Internal(e.to_string()),
        }
    }
}
