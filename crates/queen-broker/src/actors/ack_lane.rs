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

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use queen_log::Cipher;
use queen_store::Pool;
use queen_store::cursors::{AckOutcome, AckRequest};
use tokio::sync::oneshot;

use super::WorkError;
use super::coordinator::DataAvailable;
use crate::services::announcer::Announcer;

/// How long a commit is in flight before the batches waiting behind it get a commit of their own.
/// An ack statement takes well under a millisecond in PostgreSQL (0.35–0.53 ms on average under
/// `sustain-10` held at 6,000 msg/s, with PostgreSQL at a full core), its commit one WAL flush.
const HELD_UP_AFTER: Duration = Duration::from_millis(20);

/// Most acknowledgements applied in one commit (a group's batch is never split).
const MAX_ACKS_PER_COMMIT: usize = 10_000;

type Reply = oneshot::Sender<Result<Vec<Vec<AckOutcome>>, WorkError>>;

/// One group's batch of ack calls: one list of outcomes per call comes back.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CommitAcks {
    calls: Vec<Vec<AckRequest>>,
    reply: Reply,
    /// Committed on its own: a commit it was fused into failed.
    alone: bool,
}

impl CommitAcks {
    pub fn new(calls: Vec<Vec<AckRequest>>, reply: Reply) -> Self {
        Self { calls, reply, alone: false }
    }

    fn acks(&self) -> usize {
        self.calls.iter().map(Vec::len).sum()
    }
}

pub struct AckLane {
    pool: Pool,
    announcer: Announcer,
    /// Opens sealed segments for the dead letters an ack writes.
    keys: Option<Arc<Cipher>>,
    waiting: VecDeque<CommitAcks>,
    /// The commits in flight: a number for each, and when it started.
    in_flight: Vec<(u64, Instant)>,
    started: u64,
    /// A look at the commits in flight is due (see [`AckLane::commit_next`]).
    look_due: bool,
}

impl AckLane {
    pub fn new(pool: Pool, announcer: Announcer, keys: Option<Arc<Cipher>>) -> Self {
        Self { pool, announcer, keys, waiting: VecDeque::new(), in_flight: Vec::new(), started: 0, look_due: false }
    }

    /// One commit at a time, and one more beside each commit held up.
    fn slots(&self) -> usize {
        1 + self.in_flight.iter().filter(|(_, since)| since.elapsed() >= HELD_UP_AFTER).count()
    }

    fn commit_next(&mut self, ctx: &mut Context<Self>) {
        while self.in_flight.len() < self.slots() && !self.waiting.is_empty() {
            let mut calls = Vec::new();
            let mut replies = Vec::new();
            let mut acks = 0;
            while let Some(next) = self.waiting.front() {
                let size = next.acks();
                if !replies.is_empty() && (next.alone || acks + size > MAX_ACKS_PER_COMMIT) {
                    break;
                }
                let Some(CommitAcks { calls: mut own, reply, alone }) = self.waiting.pop_front() else { break };
                acks += size;
                replies.push((own.len(), reply));
                calls.append(&mut own);
                if alone {
                    break;
                }
            }
            self.started += 1;
            let number = self.started;
            self.in_flight.push((number, Instant::now()));
            let pool = self.pool.clone();
            let keys = self.keys.clone();
            let commit = async move {
                let result = match pool.get().await {
                    Ok(mut client) => {
                        queen_store::cursors::acknowledge_batch(&mut client, &calls, keys.as_deref()).await
                    }
                    Err(e) => Err(e.into()),
                };
                (calls, result)
            };
            ctx.spawn(commit.into_actor(self).map(move |(mut calls, result), lane, ctx| {
                match result {
                    Ok(batch) => {
                        for work in batch.released {
                            lane.announcer.announce(DataAvailable::from(work));
                        }
                        let mut outcomes = batch.outcomes.into_iter();
                        for (count, reply) in replies {
                            // A group actor that went away needs no answer.
                            let _ = reply.send(Ok(outcomes.by_ref().take(count).collect()));
                        }
                    }
                    Err(e) if replies.len() > 1 => {
                        tracing::debug!(error = %e, batches = replies.len(), "a fused ack commit failed: its batches go again one by one");
                        for (count, reply) in replies.into_iter().rev() {
                            let own = calls.split_off(calls.len() - count);
                            lane.waiting.push_front(CommitAcks { calls: own, reply, alone: true });
                        }
                    }
                    Err(e) => {
                        let error = WorkError::from(e);
                        for (_, reply) in replies {
                            let _ = reply.send(Err(error.clone()));
                        }
                    }
                }
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
}

impl Actor for AckLane {
    type Context = Context<Self>;
}

impl Handler<CommitAcks> for AckLane {
    type Result = ();

    fn handle(&mut self, msg: CommitAcks, ctx: &mut Self::Context) {
        self.waiting.push_back(msg);
        self.commit_next(ctx);
    }
}
