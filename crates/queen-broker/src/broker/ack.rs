//! Acknowledgements: one call's acks go to the GroupLeases actor of their consumer group.

use std::sync::Arc;

use queen_store::ack_rules::{AckStatus, AckVerdict, Refusal};
use queen_store::cursors::{AckOutcome, AckRequest};

use super::Broker;
use super::BrokerError;
use super::deliveries::ClaimedToEnd;
use crate::metrics::Metrics;

/// Applies one call's acknowledgements, all of `group`. Outcomes are aligned with `requests`.
pub async fn acknowledge(
    broker: &Broker,
    group: &str,
    mut requests: Vec<AckRequest>,
) -> Result<Vec<AckOutcome>, BrokerError> {
    let claimed_to_end = broker.deliveries.resolve(&mut requests);
    let statuses: Vec<AckStatus> = requests.iter().map(|r| r.status).collect();
    let partitions: Vec<i64> = requests.iter().map(|r| r.partition_id).collect();
    let outcomes = broker.groups.acknowledge(group, requests).await?;
    record(&broker.metrics, &statuses, &outcomes);
    report_drained(broker, group, &partitions, &outcomes, claimed_to_end);
    Ok(outcomes)
}

/// Tells the coordinator of each partition claimed to its end that the group's cursor now
/// reaches: the group's next pop need not look there until something new is announced. The
/// outcomes hold the cursors of the call's `group`, which says nothing of another group's lease
/// named in it.
fn report_drained(
    broker: &Broker,
    group: &str,
    partitions: &[i64],
    outcomes: &[AckOutcome],
    claimed_to_end: Vec<(i64, Arc<ClaimedToEnd>)>,
) {
    for (partition_id, to_end) in claimed_to_end.into_iter().filter(|(_, to_end)| &*to_end.group == group) {
        let committed = partitions.iter().zip(outcomes).filter(|(p, _)| **p == partition_id);
        if committed.filter_map(|(_, outcome)| outcome.committed).max().is_some_and(|at| at >= to_end.end) {
            let group = Arc::clone(&to_end.group);
            broker.coordinator.drained(to_end.queue_id, group, to_end.stamp, vec![partition_id]);
        }
    }
}

/// Counts acknowledgements by status and verdict, and messages acked, failed, dead-lettered and
/// dropped by queue.
pub fn record(metrics: &Metrics, statuses: &[AckStatus], outcomes: &[AckOutcome]) {
    for (status, outcome) in statuses.iter().zip(outcomes) {
        metrics.acks.with_label_values(&[status_label(*status), verdict_label(&outcome.verdict)]).inc();
        let per_queue = match outcome.verdict {
            AckVerdict::Committed { .. } => &metrics.messages_acked,
            // A `retry`, or a `failed` whose failure was counted already (another of the same
            // call), is no failure of the message's.
            AckVerdict::Requeued { retry_counted: true } => &metrics.messages_failed,
            AckVerdict::Requeued { retry_counted: false } => continue,
            AckVerdict::DeadLettered { .. } => &metrics.messages_dead_lettered,
            AckVerdict::Dropped { .. } => &metrics.messages_dropped,
            AckVerdict::Noop | AckVerdict::Refused(_) => continue,
        };
        if let Some(queue) = &outcome.queue {
            per_queue.inc(queue);
        }
    }
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
        AckVerdict::DeadLettered { .. } => "dead_lettered",
        AckVerdict::Dropped { .. } => "dropped",
        AckVerdict::Refused(_) => "refused",
    }
}

/// Why an acknowledgement was refused, in words a client can act on.
pub fn refusal_text(refusal: Refusal, request: &AckRequest, committed: Option<i64>) -> String {
    let (transaction_id, partition_id) = (&request.transaction_id, request.partition_id);
    match refusal {
        Refusal::Unresolvable => {
            format!("unresolvable: transaction id {transaction_id:?} is not a message of partition {partition_id}")
        }
        Refusal::NoCursor => {
            format!("group {:?} has never received messages of partition {partition_id}", request.consumer_group)
        }
        Refusal::InvalidLease => {
            "invalid or expired lease: it is not the live lease of this partition for this group".into()
        }
        Refusal::LeasedByAnother => {
            "the partition is leased to a consumer of this group; acknowledge with the leaseId of the delivery".into()
        }
        Refusal::OutsideRequiredLeases => "the partition's live lease is not one of the transaction's \
                                           requiredLeases (it expired, was released, or belongs to another consumer)"
            .into(),
        Refusal::NotDelivered => "the message was not delivered under this lease".into(),
        Refusal::NeverReceived => format!(
            "group {:?} has never received this message of partition {partition_id}: it lies past every message \
             delivered to the group, and an ack may commit only what was delivered",
            request.consumer_group
        ),
        Refusal::AlreadyCommitted => match committed {
            Some(cursor) => format!("the message is already committed (the group's cursor is at offset {cursor})"),
            None => "the message is already committed".into(),
        },
        Refusal::SupersededByFailure => "not committed: this message, or an earlier one of this partition, failed \
                                         in the same call and will be delivered again, with this one"
            .into(),
    }
}
