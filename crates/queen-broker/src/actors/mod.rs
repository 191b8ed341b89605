//! The broker's actors. Each owns its state and holds a bounded amount of work
//! ([`crate::pressure`]):
//! - [`partition_writer::PartitionWriter`], one per active partition: push fusion;
//! - [`group_leases::GroupLeases`], one per consumer group: coalesces acknowledgements;
//! - [`ack_lane::AckLane`], one per broker: commits the groups' ack batches, fusing those that
//!   meet;
//! - [`coordinator::Coordinator`], one per broker: parks long polls and wakes them;
//! - [`push_journal::PushJournal`], one per broker: the journal of pushes accepted during push
//!   maintenance.

mod ack_lane;
pub mod coordinator;
mod fusion;
pub mod group_leases;
pub mod partition_writer;
pub mod push_journal;
mod registry;

use queen_store::{StoreError, WriteRefusal};

use crate::pressure::Refused;

/// Why an actor could not do a request's work. Cloneable, so one failed write can answer every
/// request fused into it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WorkError {
    /// The database could not be reached (the cause is logged where it happened).
    #[error("{}", crate::broker::DATABASE_UNAVAILABLE)]
    Unavailable,
    /// PostgreSQL did not answer the write in time: whether it took effect is unknown, which the
    /// message (the store's) says.
    #[error("{0}")]
    Unanswered(String),
    /// PostgreSQL answers but takes no writes now (read-only, out of disk space); nothing was
    /// written (the cause is logged where it happened).
    #[error("{}", .0.message())]
    WritesRefused(WriteRefusal),
    /// The queue or partition was deleted while the request was under way.
    #[error("the {0} no longer exists")]
    Gone(&'static str),
    /// A bound of what the actor holds was reached; nothing was done.
    #[error(transparent)]
    Overloaded(#[from] Refused),
    #[error("{0}")]
    Failed(String),
}

impl From<StoreError> for WorkError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Missing(what) => WorkError::Gone(what),
            StoreError::Unanswered { .. } | StoreError::Interrupted { .. } => {
                tracing::warn!(error = %e, "a write went unanswered");
                WorkError::Unanswered(e.to_string())
            }
            StoreError::WritesRefused { refusal, .. } => {
                tracing::warn!(error = %e, "writes refused");
                WorkError::WritesRefused(refusal)
            }
            e if e.is_unavailable() => {
                tracing::warn!(error = %e, "database unavailable");
                WorkError::Unavailable
            }
            e => WorkError::Failed(format!("database operation failed: {e}")),
        }
    }
}
