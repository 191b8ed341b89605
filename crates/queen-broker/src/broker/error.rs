//! What a broker operation fails with, in the broker's terms. The HTTP edge
//! ([`crate::error::ApiError`]) turns each kind into a status and a body; below, the store
//! ([`StoreError`]) and the actors ([`WorkError`]) have enums of their own, turned into this one.

use queen_store::{Creation, LimitReached, StoreError, WriteRefusal};

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
    /// Creating what the request needs (a queue, partitions, a consumer group) would pass a
    /// creation limit of the fleet (`limits.max_*`, counted in PostgreSQL); nothing was created
    /// or written. Not transient: it passes only when something is deleted or the limit raised.
    #[error("{}", limit_text(.0))]
    LimitReached(LimitReached),
    /// Retry later: the database is unreachable or refuses writes for now (read-only, out of
    /// disk space), or what the request named changed under it. The text is the broker's own
    /// words, fit for the client.
    #[error("{0}")]
    Unavailable(String),
    /// The request needs an encryption key this broker does not hold (another broker of the
    /// fleet may); nothing was written or read. Retry later, as [`BrokerError::Unavailable`], but
    /// not going away by itself: the broker is misconfigured.
    #[error("{0}")]
    NoKey(String),
    /// A bound of what the broker holds at once was reached; nothing was written.
    #[error(transparent)]
    Overloaded(#[from] Refused),
    /// A fault the broker did not expect. The text is the detail for the log, not for the client.
    #[error("internal error: {0}")]
    Internal(String),
}

/// What a 5xx caused by the database says, whatever PostgreSQL said. It names the connection:
/// the official clients' consume loop keeps polling (after a second) on an error that says
/// "connection", and stops on any other, so a database outage would end every consumer.
pub const DATABASE_UNAVAILABLE: &str =
    "the database is unavailable; retry later (the broker renews its connections by itself)";

/// What a 503 caused by PostgreSQL refusing writes says: why, and that it passes (named as
/// [`DATABASE_UNAVAILABLE`] is, for the same reason).
fn writes_refused(refusal: WriteRefusal) -> String {
    format!("{}; retry later (the broker renews its connections by itself)", refusal.message())
}

impl BrokerError {
    pub fn invalid(message: impl Into<String>) -> Self {
        BrokerError::Invalid(message.into())
    }
}

/// The setting that limits what `what` counts.
pub fn limit_setting(what: Creation) -> &'static str {
    match what {
        Creation::Queues => "limits.max_queues",
        Creation::Partitions => "limits.max_partitions_per_queue",
        Creation::Groups => "limits.max_groups_per_queue",
    }
}

/// `queue limit reached: the fleet holds 10 queues (limits.max_queues = 10)`, and what the
/// request would have added when that is more than one.
fn limit_text(reached: &LimitReached) -> String {
    let LimitReached { what, queue, held, adding, max } = reached;
    let queue = queue.as_deref().unwrap_or_default();
    let (kind, holds, unit) = match what {
        Creation::Queues => ("queue", "the fleet holds".to_owned(), "queues"),
        Creation::Partitions => ("partition", format!("queue {queue:?} holds"), "partitions"),
        Creation::Groups => ("consumer group", format!("queue {queue:?} has"), "consumer groups"),
    };
    let more = if held < max { format!(" and the request would add {adding}") } else { String::new() };
    format!("{kind} limit reached: {holds} {held} {unit}{more} ({} = {max})", limit_setting(*what))
}

impl From<StoreError> for BrokerError {
    fn from(e: StoreError) -> Self {
        let e = match e {
            StoreError::LimitReached(reached) => return BrokerError::LimitReached(reached),
            other => other,
        };
        if let StoreError::NoEncryptionKey { .. } = e {
            // Another broker of the fleet may have the key; this one is misconfigured.
            tracing::error!(error = %e, "refused to write an encrypted queue in plain text");
            return BrokerError::NoKey(e.to_string());
        }
        if e.outcome_unknown() {
            // The message says what the client needs to know: the outcome is unknown.
            tracing::warn!(error = %e, "a write went unanswered");
            return BrokerError::Unavailable(e.to_string());
        }
        if let StoreError::WritesRefused { refusal, .. } = e {
            tracing::warn!(error = %e, "writes refused");
            return BrokerError::Unavailable(writes_refused(refusal));
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
            WorkError::Unavailable | WorkError::Unanswered(_) => BrokerError::Unavailable(e.to_string()),
            WorkError::WritesRefused(refusal) => BrokerError::Unavailable(writes_refused(refusal)),
            WorkError::Overloaded(refused) => BrokerError::Overloaded(refused),
            WorkError::Gone(_) => BrokerError::Unavailable(format!("{e}; retry the request")),
            WorkError::Failed(_) => BrokerError::Internal(e.to_string()),
        }
    }
}
