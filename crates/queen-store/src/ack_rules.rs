//! The acknowledgement contract, as a pure function over one cursor.
//!
//! An ack is a cursor commit: `completed` at offset N commits everything up to N. `failed` pulls
//! delivery back to just before the failed message (even when later messages of the same call
//! were completed), releases the lease and counts a retry against the message at the head of the
//! cursor; past the queue's retry limit that message is dead-lettered and the cursor moves past
//! it. `retry` pulls back without counting. `dlq` dead-letters a message now and commits up to it.
//!
//! Every item is checked against the cursor as it stood when the call began: a late `completed`
//! (at or below the cursor) is a no-op, unless it names a stale lease (one another consumer's
//! took over, or a seek released), a late `failed` is refused, an ack under a lease that is
//! not the live one is refused, and so is an ack of a message the group was never delivered, with
//! or without a lease: an ack can never commit past a message the group did not receive. Acks
//! are idempotent: a `failed`, `retry` or `dlq` sent again under its own lease, which the first
//! ended, is a no-op too.
//!
//! In a transaction, a late `completed` under a lease is a no-op only while that lease is still
//! the live one: the bundle's pushes rest on its acks, and a message committed after its lease
//! ran out may have been processed by the consumer that took the partition over. The bundle is
//! then refused whole rather than applied on work it no longer owns.

use uuid::Uuid;

/// The lease an acknowledgement claims to act under.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LeaseFence {
    /// None named: allowed only while nobody holds the partition.
    #[default]
    Unfenced,
    /// The lease of the delivery: it must be the partition's live lease.
    Lease(Uuid),
    /// One of a transaction's `requiredLeases`: the partition's live lease must be among them.
    AnyOf(Vec<Uuid>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AckStatus {
    Completed,
    Failed,
    Retry,
    DeadLetter,
}

/// A cursor row, as locked for the ack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorState {
    pub committed: i64,
    pub lease_id: Option<Uuid>,
    pub lease_live: bool,
    pub leased_until: Option<i64>,
    /// The highest offset ever delivered to the group on this partition.
    pub delivered_until: i64,
    pub retry_count: i32,
    pub head_attempts: i32,
    /// The queue's retry limit: a message is delivered at most `retry_limit + 1` times.
    pub retry_limit: i32,
    /// Whether the queue dead-letters a message that exhausted its retries; otherwise it is
    /// dropped.
    pub dead_letter_exhausted: bool,
}

/// One acknowledgement of a message of this cursor's partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckItem<'a> {
    pub offset: i64,
    pub status: AckStatus,
    pub fence: &'a LeaseFence,
    pub error: Option<&'a str>,
    /// Part of a transaction's bundle (see the module's comment on late acks).
    pub bundled: bool,
}

/// Why an ack was refused. Nothing changes for a refused item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The transaction id is not in the partition.
    Unresolvable,
    /// The group has never received this partition's messages.
    NoCursor,
    /// The lease named is not the live lease of this partition for this group.
    InvalidLease,
    /// Another consumer holds a live lease, and the ack named none.
    LeasedByAnother,
    /// The ack named no lease of its own, and the partition's live lease (if any) is not one of
    /// the transaction's `requiredLeases`.
    OutsideRequiredLeases,
    /// The message lies beyond what the live lease delivered.
    NotDelivered,
    /// The message lies beyond every message the group has been delivered on the partition.
    NeverReceived,
    /// A `failed`, `retry` or `dlq` for a message the cursor has already passed.
    AlreadyCommitted,
    /// A `completed` or `dlq` after a message of the same call that failed: delivery restarts at
    /// the failed one, so this one will come again.
    SupersededByFailure,
}

/// What happened to one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckVerdict {
    /// The cursor moved to (at least) this message.
    Committed {
        lease_released: bool,
    },
    /// A `completed` at or below the cursor: nothing to do.
    Noop,
    /// `failed` or `retry`: the message and those after it will be delivered again.
    Requeued {
        retry_counted: bool,
    },
    /// Dead-lettered: by `dlq`, or by `failed` past the retry limit.
    DeadLettered {
        lease_released: bool,
    },
    /// `failed` past the retry limit on a queue that does not dead-letter: given up on, not kept.
    Dropped {
        lease_released: bool,
    },
    Refused(Refusal),
}

impl AckVerdict {
    pub fn is_success(&self) -> bool {
        !matches!(self, AckVerdict::Refused(_))
    }
}

/// A message to copy into the dead-letter table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub offset: i64,
    pub error: Option<String>,
    /// How many times the message was retried before it was given up on.
    pub retry_count: i32,
}

/// Why a message was given up on when its last allowed failure was a lease running out:
/// `failures` in all, `expiries` of them expired leases, the rest failed acks.
pub fn exhaustion_reason(failures: i32, expiries: i32) -> String {
    let acks = failures - expiries;
    match acks {
        0 => format!("lease expired {}", times(expiries)),
        1 => format!("failed {}: 1 failed ack, lease expired {}", times(failures), times(expiries)),
        _ => format!("failed {}: {acks} failed acks, lease expired {}", times(failures), times(expiries)),
    }
}

/// Why a message was given up on when its last allowed failure was a failed ack that gave no
/// error of its own.
fn silent_failure_reason(failures: i32) -> String {
    format!("failed {}; the last failed ack gave no error", times(failures))
}

fn times(n: i32) -> String {
    if n == 1 { "once".to_owned() } else { format!("{n} times") }
}

/// What the acks of one call do to one cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorChange {
    pub after: CursorState,
    /// Messages newly committed (for the consumed counter).
    pub consumed: i64,
    pub lease_released: bool,
    pub dead_letters: Vec<DeadLetter>,
    /// A message acknowledged as `failed` will be delivered again (the queue's retry delay
    /// applies before it is).
    pub failure_redelivered: bool,
}

impl CursorChange {
    pub fn is_change(&self, before: &CursorState) -> bool {
        &self.after != before
    }
}

fn validate(state: &CursorState, item: &AckItem<'_>) -> Result<(), AckVerdict> {
    if item.offset <= state.committed {
        return Err(match item.status {
            AckStatus::Completed if item.bundled && *item.fence != LeaseFence::Unfenced => {
                fence_refusal(state, item.fence).map_or(AckVerdict::Noop, AckVerdict::Refused)
            }
            AckStatus::Completed if stale(state, item.fence) => AckVerdict::Refused(Refusal::InvalidLease),
            AckStatus::Completed => AckVerdict::Noop,
            // A `dlq` sent again: the first dead-lettered the message and committed past it.
            AckStatus::DeadLetter if !item.bundled && own_ended(state, item.fence) => AckVerdict::Noop,
            _ => AckVerdict::Refused(Refusal::AlreadyCommitted),
        });
    }
    if let Some(refusal) = fence_refusal(state, item.fence) {
        // A `failed` or `retry` sent again (the first released the lease), or late under a lease
        // that ran out: the message comes again either way, which is what it asks.
        if !item.bundled
            && matches!(item.status, AckStatus::Failed | AckStatus::Retry)
            && own_ended(state, item.fence)
            && state.leased_until.is_some_and(|until| item.offset <= until)
        {
            return Err(AckVerdict::Noop);
        }
        return Err(AckVerdict::Refused(refusal));
    }
    if state.lease_live && state.leased_until.is_some_and(|until| item.offset > until) {
        return Err(AckVerdict::Refused(Refusal::NotDelivered));
    }
    if item.offset > state.delivered_until {
        return Err(AckVerdict::Refused(Refusal::NeverReceived));
    }
    Ok(())
}

/// Whether a late ack names a lease that is not the cursor's own: a lease another consumer's took
/// over (this one ran out), or one a seek released or that ran out over a message a pop gave up
/// on. Those keep the lease's id and forget what it delivered, so the batch is told its lease is
/// gone, not that its acks are done; a lease its own acks ended still knows what it delivered,
/// and their resending is a no-op.
fn stale(state: &CursorState, fence: &LeaseFence) -> bool {
    match fence {
        LeaseFence::Lease(lease) => {
            state.lease_id != Some(*lease) || (!state.lease_live && state.leased_until.is_none())
        }
        _ => false,
    }
}

/// Whether the ack names the cursor's own lease, ended (by its acks, or run out) rather than
/// released by a seek or taken over.
fn own_ended(state: &CursorState, fence: &LeaseFence) -> bool {
    matches!(fence, LeaseFence::Lease(lease) if state.lease_id == Some(*lease))
        && !state.lease_live
        && state.leased_until.is_some()
}

/// Why the cursor's live lease does not let an ack with this fence act, if it does not.
fn fence_refusal(state: &CursorState, fence: &LeaseFence) -> Option<Refusal> {
    let live = state.lease_id.filter(|_| state.lease_live);
    match fence {
        LeaseFence::Lease(lease) if live != Some(*lease) => Some(Refusal::InvalidLease),
        LeaseFence::AnyOf(leases) if !live.is_some_and(|live| leases.contains(&live)) => {
            Some(Refusal::OutsideRequiredLeases)
        }
        LeaseFence::Unfenced if live.is_some() => Some(Refusal::LeasedByAnother),
        _ => None,
    }
}

/// How many times the message after `committed` has been delivered when the cursor moves there:
/// once if the latest lease covered it, else not yet.
fn deliveries_of_next(state: &CursorState, committed: i64) -> i32 {
    i32::from(state.leased_until.is_some_and(|until| until > committed))
}

/// Applies one call's acks for one cursor. Verdicts come back aligned with `items`.
pub fn apply(state: &CursorState, items: &[AckItem<'_>]) -> (CursorChange, Vec<AckVerdict>) {
    let checked: Vec<Result<(), AckVerdict>> = items.iter().map(|item| validate(state, item)).collect();
    let valid = |i: usize| checked[i].is_ok();

    // The earliest message this call failed: delivery restarts there. A `failed` at that offset
    // wins over a `retry` at the same offset.
    let pull_back = items
        .iter()
        .enumerate()
        .filter(|&(i, item)| valid(i) && matches!(item.status, AckStatus::Failed | AckStatus::Retry))
        .min_by_key(|(_, item)| (item.offset, item.status != AckStatus::Failed))
        .map(|(i, item)| (i, item.offset));
    let limit = pull_back.map_or(i64::MAX, |(_, offset)| offset);

    let mut after = state.clone();
    let mut dead_letters = Vec::new();
    let advance_to = items
        .iter()
        .enumerate()
        .filter(|&(i, item)| {
            valid(i) && matches!(item.status, AckStatus::Completed | AckStatus::DeadLetter) && item.offset < limit
        })
        .map(|(_, item)| item.offset)
        .max();
    if let Some(target) = advance_to {
        after.committed = target;
        after.retry_count = 0;
        after.head_attempts = deliveries_of_next(state, target);
    }
    for item in items.iter().enumerate().filter(|&(i, item)| valid(i) && item.offset < limit).map(|(_, item)| item) {
        // A message named twice in one call is dead-lettered once.
        if item.status == AckStatus::DeadLetter && !dead_letters.iter().any(|d: &DeadLetter| d.offset == item.offset) {
            let retry_count = if item.offset == state.committed + 1 { state.retry_count } else { 0 };
            dead_letters.push(DeadLetter { offset: item.offset, error: item.error.map(str::to_owned), retry_count });
        }
    }

    // The message at the head of the cursor, when this call exhausted its retries.
    let mut given_up_head = None;
    let mut retry_counted_by = None;
    let lease_released = if let Some((index, offset)) = pull_back {
        // A retry is counted against a message only when it is the next one the group needs.
        if items[index].status == AckStatus::Failed && offset == after.committed + 1 {
            retry_counted_by = Some(index);
            after.retry_count += 1;
            if after.retry_count > state.retry_limit {
                if state.dead_letter_exhausted {
                    dead_letters.push(DeadLetter {
                        offset,
                        // A failed ack need not say why (`ack(message, False)` sends no error).
                        error: Some(
                            items[index].error.map_or_else(|| silent_failure_reason(after.retry_count), str::to_owned),
                        ),
                        // Retries that happened: every failure but the first delivery's.
                        retry_count: after.retry_count - 1,
                    });
                }
                after.committed = offset;
                after.retry_count = 0;
                after.head_attempts = deliveries_of_next(state, offset);
                given_up_head = Some(offset);
            }
        }
        true
    } else {
        state.lease_live && state.leased_until.is_some_and(|until| after.committed >= until)
    };
    if lease_released {
        after.lease_live = false;
    }

    let verdicts = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            if let Err(verdict) = checked[i] {
                return verdict;
            }
            // At the failure's own offset too: the same message acked both ways in one call is
            // delivered again (unless the failure gave it up), and nothing else happened to it.
            let superseded = item.offset > limit || (item.offset == limit && given_up_head != Some(limit));
            match item.status {
                AckStatus::Completed | AckStatus::DeadLetter if superseded => {
                    AckVerdict::Refused(Refusal::SupersededByFailure)
                }
                AckStatus::Completed => AckVerdict::Committed { lease_released },
                AckStatus::DeadLetter => AckVerdict::DeadLettered { lease_released },
                AckStatus::Failed | AckStatus::Retry if given_up_head == Some(item.offset) => {
                    if state.dead_letter_exhausted {
                        AckVerdict::DeadLettered { lease_released }
                    } else {
                        AckVerdict::Dropped { lease_released }
                    }
                }
                AckStatus::Failed | AckStatus::Retry => {
                    AckVerdict::Requeued { retry_counted: retry_counted_by == Some(i) }
                }
            }
        })
        .collect();
    let failure_redelivered = items
        .iter()
        .enumerate()
        .any(|(i, item)| valid(i) && item.status == AckStatus::Failed && given_up_head != Some(item.offset));
    let consumed = after.committed - state.committed;
    (CursorChange { after, consumed, lease_released, dead_letters, failure_redelivered }, verdicts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Uuid = Uuid::from_u128(42);
    const FENCED: LeaseFence = LeaseFence::Lease(LEASE);
    const UNFENCED: LeaseFence = LeaseFence::Unfenced;

    fn leased(committed: i64, until: i64) -> CursorState {
        CursorState {
            committed,
            lease_id: Some(LEASE),
            lease_live: true,
            leased_until: Some(until),
            delivered_until: until,
            retry_count: 0,
            head_attempts: 1,
            retry_limit: 3,
            dead_letter_exhausted: true,
        }
    }

    fn ack(offset: i64, status: AckStatus) -> AckItem<'static> {
        AckItem { offset, status, fence: &FENCED, error: None, bundled: false }
    }

    #[test]
    fn completing_the_whole_span_commits_and_releases() {
        let state = leased(0, 3);
        let (change, verdicts) = apply(&state, &[ack(3, AckStatus::Completed)]);
        assert_eq!(change.after.committed, 3);
        assert_eq!(change.consumed, 3);
        assert!(change.lease_released && !change.after.lease_live);
        assert_eq!(verdicts, vec![AckVerdict::Committed { lease_released: true }]);
    }

    #[test]
    fn completing_part_of_the_span_keeps_the_lease() {
        let (change, verdicts) = apply(&leased(0, 3), &[ack(2, AckStatus::Completed)]);
        assert_eq!(change.after.committed, 2);
        assert!(change.after.lease_live);
        assert_eq!(verdicts, vec![AckVerdict::Committed { lease_released: false }]);
    }

    #[test]
    fn late_acks_are_a_noop_or_refused() {
        let state = leased(2, 3);
        let (change, verdicts) = apply(&state, &[ack(1, AckStatus::Completed), ack(1, AckStatus::Failed)]);
        assert!(!change.is_change(&state));
        assert_eq!(verdicts, vec![AckVerdict::Noop, AckVerdict::Refused(Refusal::AlreadyCommitted)]);
    }

    #[test]
    fn a_late_ack_under_a_stale_lease_is_refused_and_under_its_own_ended_lease_is_a_noop() {
        // The lease's own acks ended it: their resending is a no-op.
        let mut ended = leased(3, 3);
        ended.lease_live = false;
        assert_eq!(apply(&ended, &[ack(2, AckStatus::Completed)]).1, vec![AckVerdict::Noop]);
        // A seek released it (and forgot what it delivered): the abandoned batch is told so.
        let mut sought = ended.clone();
        sought.leased_until = None;
        let (change, verdicts) = apply(&sought, &[ack(2, AckStatus::Completed)]);
        assert!(!change.is_change(&sought));
        assert_eq!(verdicts, vec![AckVerdict::Refused(Refusal::InvalidLease)]);
        // Another consumer's lease took the partition over.
        let mut taken_over = leased(3, 5);
        taken_over.lease_id = Some(Uuid::from_u128(7));
        assert_eq!(
            apply(&taken_over, &[ack(2, AckStatus::Completed)]).1,
            vec![AckVerdict::Refused(Refusal::InvalidLease)]
        );
        // An ack naming no lease stays a no-op.
        let unfenced = AckItem { fence: &UNFENCED, ..ack(2, AckStatus::Completed) };
        assert_eq!(apply(&sought, &[unfenced]).1, vec![AckVerdict::Noop]);
    }

    #[test]
    fn a_nack_sent_again_under_its_own_ended_lease_is_a_noop() {
        // The first `failed` released the lease; the cursor stays before the message.
        let mut released = leased(1, 3);
        released.lease_live = false;
        for status in [AckStatus::Failed, AckStatus::Retry] {
            let (change, verdicts) = apply(&released, &[ack(2, status)]);
            assert!(!change.is_change(&released));
            assert_eq!(verdicts, vec![AckVerdict::Noop], "{status:?}");
        }
        // The first `dlq` dead-lettered the message and committed past it.
        let mut dead_lettered = released.clone();
        dead_lettered.committed = 2;
        assert_eq!(apply(&dead_lettered, &[ack(2, AckStatus::DeadLetter)]).1, vec![AckVerdict::Noop]);
        // Not so for a completion past the cursor (it would commit after the lease ended), a
        // message the lease did not deliver, under a lease a seek released, nor in a bundle.
        assert_eq!(apply(&released, &[ack(4, AckStatus::Failed)]).1, vec![AckVerdict::Refused(Refusal::InvalidLease)]);
        assert_eq!(
            apply(&released, &[ack(2, AckStatus::Completed)]).1,
            vec![AckVerdict::Refused(Refusal::InvalidLease)]
        );
        let mut sought = released.clone();
        sought.leased_until = None;
        assert_eq!(apply(&sought, &[ack(2, AckStatus::Failed)]).1, vec![AckVerdict::Refused(Refusal::InvalidLease)]);
        let bundled = AckItem { bundled: true, ..ack(2, AckStatus::Failed) };
        assert_eq!(apply(&released, &[bundled]).1, vec![AckVerdict::Refused(Refusal::InvalidLease)]);
    }

    #[test]
    fn a_failure_clamps_the_cursor_below_it_despite_later_completions() {
        let items = [
            ack(1, AckStatus::Completed),
            ack(2, AckStatus::Failed),
            ack(3, AckStatus::Completed),
            ack(4, AckStatus::Completed),
        ];
        let (change, verdicts) = apply(&leased(0, 4), &items);
        assert_eq!(change.after.committed, 1);
        assert_eq!(change.after.retry_count, 1);
        assert!(change.lease_released && change.failure_redelivered);
        assert_eq!(
            verdicts,
            vec![
                AckVerdict::Committed { lease_released: true },
                AckVerdict::Requeued { retry_counted: true },
                AckVerdict::Refused(Refusal::SupersededByFailure),
                AckVerdict::Refused(Refusal::SupersededByFailure),
            ]
        );
    }

    #[test]
    fn a_message_acked_both_completed_and_failed_in_one_call_is_not_said_to_be_committed() {
        let items = [ack(1, AckStatus::Completed), ack(1, AckStatus::Failed), ack(2, AckStatus::DeadLetter)];
        let (change, verdicts) = apply(&leased(0, 2), &items);
        assert_eq!(change.after.committed, 0);
        assert!(change.dead_letters.is_empty());
        assert_eq!(
            verdicts,
            vec![
                AckVerdict::Refused(Refusal::SupersededByFailure),
                AckVerdict::Requeued { retry_counted: true },
                AckVerdict::Refused(Refusal::SupersededByFailure),
            ]
        );
        // Unless the failure gave the message up: then it is past, as the completion said.
        let mut last_try = leased(0, 2);
        last_try.retry_count = 3;
        let (change, verdicts) = apply(&last_try, &items[..2]);
        assert_eq!(change.after.committed, 1);
        assert_eq!(verdicts[0], AckVerdict::Committed { lease_released: true });
    }

    #[test]
    fn retry_pulls_back_without_counting() {
        let (change, verdicts) = apply(&leased(0, 3), &[ack(1, AckStatus::Completed), ack(2, AckStatus::Retry)]);
        assert_eq!(change.after.committed, 1);
        assert_eq!(change.after.retry_count, 0);
        assert!(change.lease_released);
        assert!(!change.failure_redelivered, "a retry is not a failure: no retry delay");
        assert_eq!(verdicts[1], AckVerdict::Requeued { retry_counted: false });
    }

    #[test]
    fn past_the_retry_limit_the_head_is_dead_lettered_and_passed() {
        let mut state = leased(4, 6);
        state.retry_limit = 1;
        state.retry_count = 1;
        let item = AckItem { error: Some("boom"), ..ack(5, AckStatus::Failed) };
        let (change, verdicts) = apply(&state, &[item]);
        assert_eq!(change.after.committed, 5);
        assert_eq!(change.after.retry_count, 0);
        assert_eq!(change.dead_letters, vec![DeadLetter { offset: 5, error: Some("boom".into()), retry_count: 1 }]);
        assert!(change.lease_released);
        assert!(!change.failure_redelivered, "the failed message is gone, not delivered again");
        assert_eq!(verdicts, vec![AckVerdict::DeadLettered { lease_released: true }]);
    }

    #[test]
    fn past_the_retry_limit_a_queue_without_dead_lettering_drops_the_head() {
        let mut state = leased(4, 6);
        state.retry_limit = 0;
        state.dead_letter_exhausted = false;
        let (change, verdicts) = apply(&state, &[ack(5, AckStatus::Failed)]);
        assert_eq!(change.after.committed, 5, "given up on, and passed");
        assert!(change.dead_letters.is_empty(), "not kept");
        assert!(change.lease_released && !change.failure_redelivered);
        assert_eq!(verdicts, vec![AckVerdict::Dropped { lease_released: true }]);
    }

    #[test]
    fn retry_limit_zero_dead_letters_on_the_first_failure() {
        let mut state = leased(0, 1);
        state.retry_limit = 0;
        let (change, _) = apply(&state, &[ack(1, AckStatus::Failed)]);
        assert_eq!(change.after.committed, 1);
        let reason = "failed once; the last failed ack gave no error";
        assert_eq!(change.dead_letters, vec![DeadLetter { offset: 1, error: Some(reason.into()), retry_count: 0 }]);
    }

    #[test]
    fn dlq_status_dead_letters_now_and_commits() {
        let mut state = leased(0, 2);
        state.retry_count = 2;
        let (change, verdicts) = apply(&state, &[ack(1, AckStatus::DeadLetter)]);
        assert_eq!(change.after.committed, 1);
        assert_eq!(change.dead_letters, vec![DeadLetter { offset: 1, error: None, retry_count: 2 }]);
        assert!(change.after.lease_live);
        assert_eq!(verdicts, vec![AckVerdict::DeadLettered { lease_released: false }]);
    }

    #[test]
    fn a_message_dead_lettered_twice_in_one_call_has_one_dead_letter() {
        let (change, verdicts) = apply(&leased(0, 2), &[ack(1, AckStatus::DeadLetter), ack(1, AckStatus::DeadLetter)]);
        assert_eq!(change.dead_letters, vec![DeadLetter { offset: 1, error: None, retry_count: 0 }]);
        let kept = AckVerdict::DeadLettered { lease_released: false };
        assert_eq!(verdicts, vec![kept, kept]);
    }

    #[test]
    fn a_stale_or_foreign_lease_is_refused() {
        let mut expired = leased(0, 2);
        expired.lease_live = false;
        let (change, verdicts) = apply(&expired, &[ack(1, AckStatus::Completed)]);
        assert!(!change.is_change(&expired));
        assert_eq!(verdicts, vec![AckVerdict::Refused(Refusal::InvalidLease)]);

        let foreign = LeaseFence::Lease(Uuid::from_u128(7));
        let other = AckItem { fence: &foreign, ..ack(1, AckStatus::Completed) };
        let (_, verdicts) = apply(&leased(0, 2), &[other]);
        assert_eq!(verdicts, vec![AckVerdict::Refused(Refusal::InvalidLease)]);
    }

    #[test]
    fn in_a_bundle_a_late_ack_needs_its_lease_still_live() {
        // Committed up to 2 by the consumer that took the partition over under another lease.
        let mut taken_over = leased(2, 4);
        taken_over.lease_id = Some(Uuid::from_u128(7));
        let bundled = AckItem { bundled: true, ..ack(1, AckStatus::Completed) };
        let (change, verdicts) = apply(&taken_over, &[bundled]);
        assert!(!change.is_change(&taken_over));
        assert_eq!(verdicts, vec![AckVerdict::Refused(Refusal::InvalidLease)]);
        let required = LeaseFence::AnyOf(vec![LEASE]);
        let (_, verdicts) = apply(&taken_over, &[AckItem { fence: &required, ..bundled }]);
        assert_eq!(verdicts, vec![AckVerdict::Refused(Refusal::OutsideRequiredLeases)]);
        // Outside a bundle the same ack is refused too (its lease is stale); a bundled one under
        // the live lease (a retried bundle whose lease still holds) is a no-op, as is one under none.
        assert_eq!(
            apply(&taken_over, &[ack(1, AckStatus::Completed)]).1,
            vec![AckVerdict::Refused(Refusal::InvalidLease)]
        );
        assert_eq!(apply(&leased(2, 4), &[bundled]).1, vec![AckVerdict::Noop]);
        let unfenced = AckItem { fence: &UNFENCED, ..bundled };
        assert_eq!(apply(&taken_over, &[unfenced]).1, vec![AckVerdict::Noop]);
    }

    #[test]
    fn an_unfenced_ack_is_refused_while_someone_holds_the_lease() {
        let item = AckItem { fence: &UNFENCED, ..ack(1, AckStatus::Completed) };
        let (_, verdicts) = apply(&leased(0, 2), &[item]);
        assert_eq!(verdicts, vec![AckVerdict::Refused(Refusal::LeasedByAnother)]);

        let mut free = leased(0, 2);
        free.lease_live = false;
        let (change, verdicts) = apply(&free, &[item]);
        assert_eq!(change.after.committed, 1);
        assert_eq!(verdicts, vec![AckVerdict::Committed { lease_released: false }]);
    }

    #[test]
    fn an_ack_under_required_leases_needs_the_live_lease_among_them() {
        let required = LeaseFence::AnyOf(vec![Uuid::from_u128(7), LEASE]);
        let item = AckItem { fence: &required, ..ack(1, AckStatus::Completed) };
        let (change, verdicts) = apply(&leased(0, 2), &[item]);
        assert_eq!(change.after.committed, 1);
        assert_eq!(verdicts, vec![AckVerdict::Committed { lease_released: false }]);

        let others = LeaseFence::AnyOf(vec![Uuid::from_u128(7)]);
        let item = AckItem { fence: &others, ..ack(1, AckStatus::Completed) };
        let (_, verdicts) = apply(&leased(0, 2), &[item]);
        assert_eq!(verdicts, vec![AckVerdict::Refused(Refusal::OutsideRequiredLeases)]);

        let mut free = leased(0, 2);
        free.lease_live = false;
        let item = AckItem { fence: &required, ..ack(1, AckStatus::Completed) };
        let (_, verdicts) = apply(&free, &[item]);
        assert_eq!(verdicts, vec![AckVerdict::Refused(Refusal::OutsideRequiredLeases)], "no live lease at all");
    }

    #[test]
    fn an_exhaustion_reason_says_how_the_message_failed() {
        assert_eq!(exhaustion_reason(3, 3), "lease expired 3 times");
        assert_eq!(exhaustion_reason(1, 1), "lease expired once");
        assert_eq!(exhaustion_reason(3, 2), "failed 3 times: 1 failed ack, lease expired 2 times");
        assert_eq!(exhaustion_reason(4, 1), "failed 4 times: 3 failed acks, lease expired once");
    }

    #[test]
    fn no_ack_commits_past_what_the_group_was_delivered() {
        let mut released = leased(1, 1);
        released.lease_live = false;
        for fence in [UNFENCED, FENCED] {
            for status in [AckStatus::Completed, AckStatus::Failed, AckStatus::DeadLetter] {
                let item = AckItem { fence: &fence, ..ack(3, status) };
                let (change, verdicts) = apply(&released, &[item]);
                assert!(!change.is_change(&released));
                let expected = if fence == FENCED { Refusal::InvalidLease } else { Refusal::NeverReceived };
                assert_eq!(verdicts, vec![AckVerdict::Refused(expected)], "{status:?} {fence:?}");
            }
        }
        // Delivered once (then given back): an unfenced ack may commit it.
        released.delivered_until = 3;
        let item = AckItem { fence: &UNFENCED, ..ack(3, AckStatus::Completed) };
        assert_eq!(apply(&released, &[item]).0.after.committed, 3);
    }

    #[test]
    fn an_ack_beyond_the_leased_span_is_refused() {
        let (_, verdicts) = apply(&leased(0, 2), &[ack(3, AckStatus::Completed)]);
        assert_eq!(verdicts, vec![AckVerdict::Refused(Refusal::NotDelivered)]);
    }

    #[test]
    fn a_failure_behind_an_unacked_head_pulls_back_without_counting() {
        let (change, verdicts) = apply(&leased(0, 3), &[ack(3, AckStatus::Failed)]);
        assert_eq!(change.after.committed, 0);
        assert_eq!(change.after.retry_count, 0);
        assert!(change.lease_released);
        assert_eq!(verdicts, vec![AckVerdict::Requeued { retry_counted: false }]);
    }
}
