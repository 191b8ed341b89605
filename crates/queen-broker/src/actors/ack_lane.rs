//! AckLane: one per broker, where the consumer groups' ack batches are committed. Batches that
//! arrive while a commit is in flight wait, and go out together as the next commit, whatever
//! their groups: most of what an ack statement costs PostgreSQL is fixed (its round trip, its
//! executor's start-up, its commit), so with ten groups acking, one statement for the ten costs
//! far less than ten.
//!
//! A commit can be held up, on a cursor lock of its groups (a transaction of theirs under way,
//! say). The batches waiting behind it are not held with it: once a commit has been in flight for
//! [`HELD_UP_AFTER`], the next one starts beside it. A group has at most one batch here at a time
//! (its [`GroupLeases`](super::group_leases::GroupLeases) actor waits for the answer before it
//! sends the next), so however many commits are held up, the others' acks go on. A commit of
//! several groups' batches that fails (past `database.lock_timeout_ms` on one group's cursor, say)
//! is not their failure: each batch is committed again on its own, and only a batch that fails
//! alone is answered with the error.
//!
//! A commit can fail after its first statement committed part of it
//! (`queen_store::cursors::acknowledge_batch`). What that part committed stands: its acks are
//! answered as committed (not sent again, when they would be no-ops), and the leases it released
//! are announced. Only a call with an ack left undone is answered with the error.
//!
//! A statement of a commit PostgreSQL does not answer within `answer_within` (its commit waiting
//! on a silent synchronous standby, say) is given up on, and its connection discarded: its
//! batches are answered as above, none sent again, since what the unanswered statement did is
//! unknown (an ack sent again by its client is a no-op if it went through).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use queen_log::Cipher;
use queen_store::Pool;
use queen_store::cursors::{AckBatch, AckBatchFailure, AckOutcome, AckRequest};
use tokio::sync::oneshot;

use super::WorkError;
use super::coordinator::DataAvailable;
use crate::metrics::Metrics;
use crate::services::announcer::Announcer;

/// How long a commit is in flight before the batches waiting behind it get a commit of their own.
/// An ack statement takes well under a millisecond in PostgreSQL (0.35–0.53 ms on average under
/// `sustain-10` held at 6,000 msg/s, with PostgreSQL at a full core), its commit one WAL flush.
const HELD_UP_AFTER: Duration = Duration::from_millis(20);

/// Most acknowledgements applied in one commit (a group's batch is never split).
const MAX_ACKS_PER_COMMIT: usize = 10_000;

/// What each call of a batch came to, call by call.
pub type CallOutcomes = Vec<Result<Vec<AckOutcome>, WorkError>>;

/// One group's batch of ack calls: one answer per call comes back.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CommitAcks {
    calls: Vec<Vec<AckRequest>>,
    reply: oneshot::Sender<CallOutcomes>,
}

impl CommitAcks {
    pub fn new(calls: Vec<Vec<AckRequest>>, reply: oneshot::Sender<CallOutcomes>) -> Self {
        Self { calls, reply }
    }
}

/// A batch in the lane: its acks not committed yet, and the outcomes of those committed.
struct Batch {
    /// Per call: the acks not committed yet.
    undone: Vec<Vec<AckRequest>>,
    /// Per call, per request: the outcome once committed.
    outcomes: Vec<Vec<Option<AckOutcome>>>,
    reply: oneshot::Sender<CallOutcomes>,
    /// Committed on its own: a commit it was fused into failed.
    alone: bool,
}

impl Batch {
    fn new(CommitAcks { calls, reply }: CommitAcks) -> Self {
        let outcomes = calls.iter().map(|call| vec![None; call.len()]).collect();
        Self { undone: calls, outcomes, reply, alone: false }
    }

    /// The acks to commit, call by call (a call may be left empty), until [`Batch::fill`] gives
    /// back those the commit left undone.
    fn take_undone(&mut self) -> Vec<Vec<AckRequest>> {
        std::mem::take(&mut self.undone)
    }

    fn acks(&self) -> usize {
        self.undone.iter().map(Vec::len).sum()
    }

    /// Takes in what a commit of the acks [`Batch::take_undone`] took came to: `sent` are those
    /// acks, and `committed` their outcomes, call by call.
    fn fill(
        &mut self,
        sent: impl Iterator<Item = Vec<AckRequest>>,
        committed: impl Iterator<Item = Vec<Option<AckOutcome>>>,
    ) {
        for ((outcomes, sent), committed) in self.outcomes.iter_mut().zip(sent).zip(committed) {
            let mut undone = Vec::new();
            let open_slots = outcomes.iter_mut().filter(|o| o.is_none());
            for ((slot, request), outcome) in open_slots.zip(sent).zip(committed) {
                match outcome {
                    Some(outcome) => *slot = Some(outcome),
                    None => undone.push(request),
                }
            }
            self.undone.push(undone);
        }
    }

    fn all_committed(&self) -> bool {
        self.undone.iter().all(Vec::is_empty)
    }

    /// Answers each call: its outcomes when every ack of it was committed, else `error`.
    fn answer(self, error: &WorkError) {
        let each = self
            .outcomes
            .into_iter()
            .map(|call| call.into_iter().collect::<Option<Vec<_>>>().ok_or_else(|| error.clone()))
            .collect();
        // A group actor that went away needs no answer.
        let _ = self.reply.send(each);
    }
}

pub struct AckLane {
    pool: Pool,
    announcer: Announcer,
    metrics: Arc<Metrics>,
    /// Opens sealed segments for the dead letters an ack writes.
    keys: Option<Arc<Cipher>>,
    /// How long a commit may go unanswered.
    answer_within: Duration,
    waiting: VecDeque<Batch>,
    /// The commits in flight: a number for each, and when it started.
    in_flight: Vec<(u64, Instant)>,
    started: u64,
    /// A look at the commits in flight is due (see [`AckLane::commit_next`]).
    look_due: bool,
}

impl AckLane {
    pub fn new(
        pool: Pool,
        announcer: Announcer,
        metrics: Arc<Metrics>,
        keys: Option<Arc<Cipher>>,
        answer_within: Duration,
    ) -> Self {
        Self {
            pool,
            announcer,
            metrics,
            keys,
            answer_within,
            waiting: VecDeque::new(),
            in_flight: Vec::new(),
            started: 0,
            look_due: false,
        }
    }

    /// One commit at a time, and one more beside each commit held up.
    fn slots(&self) -> usize {
        1 + self.in_flight.iter().filter(|(_, since)| since.elapsed() >= HELD_UP_AFTER).count()
    }

    fn commit_next(&mut self, ctx: &mut Context<Self>) {
        while self.in_flight.len() < self.slots() && !self.waiting.is_empty() {
            let mut batches = Vec::new();
            let mut acks = 0;
            while let Some(next) = self.waiting.front() {
                let size = next.acks();
                if !batches.is_empty() && (next.alone || acks + size > MAX_ACKS_PER_COMMIT) {
                    break;
                }
                let Some(batch) = self.waiting.pop_front() else { break };
                acks += size;
                let alone = batch.alone;
                batches.push(batch);
                if alone {
                    break;
                }
            }
            self.metrics.ack_batches_per_commit.observe(batches.len() as f64);
            let calls: Vec<Vec<AckRequest>> = batches.iter_mut().flat_map(Batch::take_undone).collect();
            self.started += 1;
            let number = self.started;
            self.in_flight.push((number, Instant::now()));
            let pool = self.pool.clone();
            let keys = self.keys.clone();
            let answer_within = self.answer_within;
            let commit = async move {
                let result = match pool.get().await {
                    Ok(mut client) => {
                        let acked = queen_store::cursors::acknowledge_batch(
                            &mut client,
                            &calls,
                            keys.as_deref(),
                            answer_within,
                        )
                        .await;
                        if acked.as_ref().is_err_and(|failed| failed.error.outcome_unknown()) {
                            queen_store::pool::discard(client);
                        }
                        acked
                    }
                    Err(e) => Err(AckBatchFailure::nothing_committed(&calls, e.into())),
                };
                (calls, result)
            };
            ctx.spawn(commit.into_actor(self).map(move |(calls, result), lane, ctx| {
                lane.settle(batches, calls, result);
                lane.in_flight.retain(|(commit, _)| *commit != number);
                lane.commit_next(ctx);
            }));
        }
        // Batches left waiting: look again when the youngest commit in flight would be held up.
        if !self.waiting.is_empty() && !self.look_due {
            self.look_due = true;
            let youngest = self.in_flight.iter().map(|(_, since)| since.elapsed()).min().unwrap_or_default();
            ctx.run_later(HELD_UP_AFTER.saturating_sub(youngest), |lane, ctx| {
                lane.look_due = false;
                lane.commit_next(ctx);
            });
        }
    }

    /// Takes in what a commit of `batches` (their acks `calls`) came to: answers the batches it
    /// settled, and puts those a fused commit's failure left undone back to go again one by one.
    fn settle(
        &mut self,
        mut batches: Vec<Batch>,
        calls: Vec<Vec<AckRequest>>,
        result: Result<AckBatch, AckBatchFailure>,
    ) {
        let (committed, released, failure): (Vec<Vec<Option<AckOutcome>>>, _, _) = match result {
            Ok(done) => {
                let outcomes = done.outcomes.into_iter().map(|call| call.into_iter().map(Some).collect()).collect();
                (outcomes, done.released, None)
            }
            Err(failed) => (failed.committed, failed.released, Some(failed.error)),
        };
        for work in released {
            self.announcer.announce(DataAvailable::from(work));
        }
        let (mut calls, mut committed) = (calls.into_iter(), committed.into_iter());
        for batch in &mut batches {
            let count = batch.outcomes.len();
            batch.fill(calls.by_ref().take(count), committed.by_ref().take(count));
        }
        let Some(error) = failure else {
            // A commit that went through decided every ack it was sent.
            for batch in batches {
                batch.answer(&WorkError::Failed("the ack commit left an ack undecided".into()));
            }
            return;
        };
        // Sent again alone, the batches of an unanswered commit would wait as long again, each,
        // and those of a commit whose outcome is unknown would apply twice (a `failed` without a
        // lease counting again).
        let fused = batches.len() > 1 && !error.outcome_unknown();
        if fused {
            tracing::debug!(error = %error, batches = batches.len(), "a fused ack commit failed: its batches go again one by one");
        }
        let error = WorkError::from(error);
        for mut batch in batches.into_iter().rev() {
            if fused && !batch.all_committed() {
                batch.alone = true;
                self.waiting.push_front(batch);
            } else {
                batch.answer(&error);
            }
        }
    }
}

impl Actor for AckLane {
    type Context = Context<Self>;
}

impl Handler<CommitAcks> for AckLane {
    type Result = ();

    fn handle(&mut self, msg: CommitAcks, ctx: &mut Self::Context) {
        self.waiting.push_back(Batch::new(msg));
        self.commit_next(ctx);
    }
}
