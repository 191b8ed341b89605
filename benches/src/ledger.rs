//! The delivery ledger of one stream: which messages the broker accepted, and how many times
//! each consumer group received each of them. It is what lets every scenario prove that nothing
//! was lost and nothing was delivered twice.

use std::sync::Mutex;

use serde::Serialize;

use crate::generator::MessageGenerator;

/// How many lost or duplicated transaction ids a verification names, to start an investigation.
const EXAMPLES: usize = 5;

/// What became of one push request, for each of its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    /// Answered `queued`: the broker committed it, so every group must receive it.
    Queued,
    /// Answered `duplicate` although its transaction id was never pushed before: a broker defect.
    Duplicate,
    /// The request failed: the message may or may not have been written, so it may arrive at
    /// most once per group and is not counted as lost if it does not.
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pushed {
    NotYet,
    Queued,
    Duplicate,
    Uncertain,
}

#[derive(Debug, Default)]
struct GroupDeliveries {
    /// Receptions per sequence number (saturating).
    counts: Vec<u8>,
    /// Distinct queued messages received: the group is drained when it equals `queued`.
    distinct_queued: u64,
    /// Messages received whose transaction id is not one of this stream's.
    foreign: u64,
}

#[derive(Debug, Default)]
struct State {
    pushed: Vec<Pushed>,
    queued: u64,
    groups: Vec<GroupDeliveries>,
}

/// The ledger of one stream, shared by its producers and consumers.
#[derive(Debug)]
pub struct Ledger {
    generator: MessageGenerator,
    group_names: Vec<String>,
    state: Mutex<State>,
}

/// The verdict on one group.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct GroupVerdict {
    pub group: String,
    /// Distinct messages received.
    pub received: u64,
    /// Queued messages never received.
    pub lost: u64,
    /// Messages received more than once.
    pub duplicated: u64,
    /// Messages received that were never pushed, or whose transaction id is not of this stream.
    pub unexpected: u64,
    /// Examples of lost messages' transaction ids.
    pub lost_examples: Vec<String>,
    /// Examples of duplicated messages' transaction ids.
    pub duplicated_examples: Vec<String>,
}

/// The verdict on one stream.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Verification {
    pub stream: String,
    /// Messages the broker answered `queued`.
    pub queued: u64,
    /// Fresh transaction ids the broker answered `duplicate`.
    pub duplicate_answers: u64,
    /// Messages of failed push requests (may or may not exist).
    pub uncertain: u64,
    pub groups: Vec<GroupVerdict>,
}

impl Verification {
    pub fn passed(&self) -> bool {
        self.duplicate_answers == 0 && self.groups.iter().all(|g| g.lost == 0 && g.duplicated == 0 && g.unexpected == 0)
    }

    /// One line per problem, for the loud failure message.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.duplicate_answers > 0 {
            problems.push(format!(
                "{}: {} fresh transaction ids were answered `duplicate`",
                self.stream, self.duplicate_answers
            ));
        }
        for group in &self.groups {
            if group.lost > 0 {
                problems.push(format!(
                    "{} / group {}: {} of {} queued messages LOST (never delivered), e.g. {}",
                    self.stream,
                    group.group,
                    group.lost,
                    self.queued,
                    group.lost_examples.join(", ")
                ));
            }
            if group.duplicated > 0 {
                problems.push(format!(
                    "{} / group {}: {} messages DELIVERED MORE THAN ONCE, e.g. {}",
                    self.stream,
                    group.group,
                    group.duplicated,
                    group.duplicated_examples.join(", ")
                ));
            }
            if group.unexpected > 0 {
                problems.push(format!(
                    "{} / group {}: {} messages delivered that were never pushed",
                    self.stream, group.group, group.unexpected
                ));
            }
        }
        problems
    }
}

impl Ledger {
    /// A ledger for `generator`'s stream, consumed by the named groups.
    pub fn new(generator: MessageGenerator, group_names: Vec<String>) -> Self {
        let groups = group_names.iter().map(|_| GroupDeliveries::default()).collect();
        Self { generator, group_names, state: Mutex::new(State { groups, ..State::default() }) }
    }

    pub fn generator(&self) -> &MessageGenerator {
        &self.generator
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panicking holder cannot leave the counters half-updated in a way that matters more
        // than losing the whole run, so a poisoned lock is used as it is.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the answer to a push of the messages `seqs`.
    pub fn record_push(&self, seqs: impl IntoIterator<Item = (u64, PushOutcome)>) {
        let mut state = self.state();
        let state = &mut *state;
        for (seq, outcome) in seqs {
            let index = seq as usize;
            if state.pushed.len() <= index {
                state.pushed.resize(index + 1, Pushed::NotYet);
            }
            state.pushed[index] = match outcome {
                PushOutcome::Queued => {
                    state.queued += 1;
                    // A consumer may have received it before its push was answered.
                    for group in &mut state.groups {
                        if group.counts.get(index).is_some_and(|&c| c > 0) {
                            group.distinct_queued += 1;
                        }
                    }
                    Pushed::Queued
                }
                PushOutcome::Duplicate => Pushed::Duplicate,
                PushOutcome::Failed => Pushed::Uncertain,
            };
        }
    }

    /// Records that `group` received the messages with these transaction ids.
    pub fn record_deliveries<'a>(&self, group: usize, transaction_ids: impl IntoIterator<Item = &'a str>) {
        let seqs: Vec<Option<u64>> = transaction_ids.into_iter().map(|t| self.generator.sequence_of(t)).collect();
        let mut state = self.state();
        let State { pushed, groups, .. } = &mut *state;
        let deliveries = &mut groups[group];
        for seq in seqs {
            let Some(seq) = seq else {
                deliveries.foreign += 1;
                continue;
            };
            let index = seq as usize;
            if deliveries.counts.len() <= index {
                deliveries.counts.resize(index + 1, 0);
            }
            let count = &mut deliveries.counts[index];
            if *count == 0 && pushed.get(index) == Some(&Pushed::Queued) {
                deliveries.distinct_queued += 1;
            }
            *count = count.saturating_add(1);
        }
    }

    /// Whether every group has received every queued message.
    pub fn all_delivered(&self) -> bool {
        let state = self.state();
        state.groups.iter().all(|g| g.distinct_queued >= state.queued)
    }

    /// For each group, the queued messages it has not received yet: how far it lags behind the
    /// producers.
    pub fn lags(&self) -> Vec<u64> {
        let state = self.state();
        state.groups.iter().map(|g| state.queued.saturating_sub(g.distinct_queued)).collect()
    }

    /// Distinct queued messages received, summed over the groups (drain progress).
    pub fn delivered_progress(&self) -> u64 {
        self.state().groups.iter().map(|g| g.distinct_queued).sum()
    }

    pub fn verify(&self) -> Verification {
        let state = self.state();
        let count_of = |pushed: Pushed| state.pushed.iter().filter(|&&p| p == pushed).count() as u64;
        let groups = state
            .groups
            .iter()
            .zip(&self.group_names)
            .map(|(deliveries, name)| {
                let received = |index: usize| deliveries.counts.get(index).copied().unwrap_or(0);
                let lost: Vec<usize> = (0..state.pushed.len())
                    .filter(|&i| state.pushed[i] == Pushed::Queued && received(i) == 0)
                    .collect();
                let duplicated: Vec<usize> = (0..deliveries.counts.len()).filter(|&i| received(i) > 1).collect();
                let never_pushed = (0..deliveries.counts.len())
                    .filter(|&i| received(i) > 0 && state.pushed.get(i).is_none_or(|&p| p == Pushed::NotYet))
                    .count() as u64;
                let examples = |seqs: &[usize]| {
                    seqs.iter().take(EXAMPLES).map(|&i| self.generator.transaction_id(i as u64)).collect()
                };
                GroupVerdict {
                    group: name.clone(),
                    received: deliveries.counts.iter().filter(|&&c| c > 0).count() as u64,
                    lost: lost.len() as u64,
                    duplicated: duplicated.len() as u64,
                    unexpected: never_pushed + deliveries.foreign,
                    lost_examples: examples(&lost),
                    duplicated_examples: examples(&duplicated),
                }
            })
            .collect();
        Verification {
            stream: self.generator.stream().to_owned(),
            queued: state.queued,
            duplicate_answers: count_of(Pushed::Duplicate),
            uncertain: count_of(Pushed::Uncertain),
            groups,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn ledger(groups: usize) -> Ledger {
        Ledger::new(MessageGenerator::new("s", Instant::now()), (0..groups).map(|g| format!("g{g}")).collect())
    }

    fn ids(ledger: &Ledger, seqs: &[u64]) -> Vec<String> {
        seqs.iter().map(|&s| ledger.generator().transaction_id(s)).collect()
    }

    #[test]
    fn every_group_must_receive_every_queued_message_once() {
        let ledger = ledger(2);
        ledger.record_push((0..4).map(|s| (s, PushOutcome::Queued)));
        ledger.record_deliveries(0, ids(&ledger, &[0, 1, 2, 3]).iter().map(String::as_str));
        ledger.record_deliveries(1, ids(&ledger, &[0, 1, 1]).iter().map(String::as_str));
        assert!(!ledger.all_delivered());
        assert_eq!(ledger.lags(), [0, 2]);
        let verdict = ledger.verify();
        assert!(!verdict.passed());
        assert_eq!((verdict.groups[0].lost, verdict.groups[0].duplicated), (0, 0));
        assert_eq!((verdict.groups[1].lost, verdict.groups[1].duplicated), (2, 1));
        assert_eq!(verdict.groups[1].lost_examples, ids(&ledger, &[2, 3]));
        assert_eq!(verdict.problems().len(), 2);
    }

    #[test]
    fn a_delivery_may_arrive_before_its_push_is_answered() {
        let ledger = ledger(1);
        ledger.record_deliveries(0, ids(&ledger, &[0]).iter().map(String::as_str));
        assert!(ledger.all_delivered());
        ledger.record_push([(0, PushOutcome::Queued)]);
        assert!(ledger.all_delivered());
        assert_eq!(ledger.lags(), [0]);
        assert!(ledger.verify().passed());
    }

    #[test]
    fn failed_pushes_may_arrive_once_or_not_at_all() {
        let ledger = ledger(1);
        ledger.record_push([(0, PushOutcome::Failed), (1, PushOutcome::Failed), (2, PushOutcome::Queued)]);
        ledger.record_deliveries(0, ids(&ledger, &[0, 2]).iter().map(String::as_str));
        let verdict = ledger.verify();
        assert!(verdict.passed(), "{verdict:?}");
        assert_eq!(verdict.uncertain, 2);
    }

    #[test]
    fn strangers_and_duplicate_answers_fail_the_stream() {
        let ledger = ledger(1);
        ledger.record_push([(0, PushOutcome::Duplicate)]);
        ledger.record_deliveries(0, ["not-ours", "s-0000000009"]);
        let verdict = ledger.verify();
        assert_eq!(verdict.duplicate_answers, 1);
        assert_eq!(verdict.groups[0].unexpected, 2);
        assert!(!verdict.passed());
    }
}
