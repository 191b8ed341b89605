//! Acknowledgements: one call's acks go to the GroupLeases actor of their consumer group.

use queen_store::ack_rules::{AckStatus, AckVerdict};
use queen_store::cursors::{AckOutcome, AckRequest};

use super::Broker;
use crate::error::ApiError;

/// Applies one call's acknowledgements, all of `group`. Outcomes are aligned with `requests`.
pub async fn acknowledge(broker: &Broker, group: &str, requests: Vec<AckRequest>) -> Result<Vec<AckOutcome>, ApiError> {
    let statuses: Vec<AckStatus> = requests.iter().map(|r| r.status).collect();
    let outcomes = broker.groups.acknowledge(group, requests).await?;
    for (status, outcome) in statuses.iter().zip(&outcomes) {
        broker.metrics.acks.with_label_values(&[status_label(*status), verdict_label(&outcome.verdict)]).inc();
    }
    Ok(outcomes)
}

pub fn status_label(status: AckStatus) -> &'static str {
    match status {
        AckStatus::Completed => "completed",
        AckStatus::Failed => "failed",
        AckStatus::Retry => "retry",
        AckStatus::DeadLetter => "dlq",
    }
}

fn verdict_label(verdict: &AckVerdict) -> &'static str {
    match verdict {
        AckVerdict::Committed { .. } => "committed",
        AckVerdict::Noop => "noop",
        AckVerdict::Requeued { .. } => "requeued",
        AckVerdict::DeadLettered => "dead_lettered",
        AckVerdict::Refused(_) => "refused",
    }
}
