//! PartitionWriter: push fusion for one partition.
//!
//! While one append is in flight, later pushes to the same partition queue up here; when it
//! commits, everything queued goes out as the next segment, in one transaction. Each waiting
//! request then gets its own per-item results. A request that is a segment its producer
//! compressed (a binary push's frames group) goes out alone, so that it is stored as received,
//! and requests are fused only with requests that found their queue under the same policy.
//! A writer holds at most `push.writer_mailbox` requests: a push first takes a place with the
//! writer of every partition it writes ([`Writers::reserve`]), so one refused place refuses the
//! push before anything is written.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use queen_store::Pool;
use queen_store::log::{AppendPolicy, Appended, Destination, NewMessage, received_whole};
use tokio::sync::oneshot;

use super::WorkError;
use super::coordinator::DataAvailable;
use super::fusion::{FusionQueue, Pending};
use super::registry::Registry;
use crate::metrics::Metrics;
use crate::pressure::{Bound, Held, Limited};
use crate::services::announcer::Announcer;

/// This actor's label in the metrics.
const ACTOR: &str = "partition_writer";

/// The shortest period at which a writer checks whether it has been idle long enough to stop.
const IDLE_CHECK_MIN: Duration = Duration::from_secs(1);

/// The partition a writer appends to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteTarget {
    pub queue_id: i64,
    pub queue: Arc<str>,
    pub partition_id: i64,
}

#[derive(Debug, Clone, Copy)]
pub struct WriterLimits {
    pub max_segment_messages: usize,
    pub max_segment_bytes: usize,
    pub mailbox: usize,
    /// How long a writer with nothing to do stays; zero stops it as soon as its last request
    /// is answered.
    pub idle: Duration,
    /// How long an append may go unanswered before the writer stops waiting: PostgreSQL times
    /// out a statement, not its commit, which waits for as long as a synchronous standby or the
    /// WAL disk does not answer.
    pub answer_within: Duration,
}

/// Appends these messages (one push request's share of this partition), under the queue's
/// policy as the request found it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Append {
    pub messages: Vec<NewMessage>,
    pub policy: AppendPolicy,
    pub reply: oneshot::Sender<Result<Vec<Appended>, WorkError>>,
    pub place: Held,
}

pub struct PartitionWriter {
    target: WriteTarget,
    pool: Pool,
    limits: WriterLimits,
    queue: FusionQueue<NewMessage, Appended, WorkError>,
    /// The policy each queued request found its queue under, in queue order. Only requests of
    /// one policy are fused: one that found the queue plain, held up until after it was made
    /// encrypted, must not take a later push of the partition into plain text with it.
    policies: VecDeque<AppendPolicy>,
    last_activity: Instant,
    registry: Registry<i64, PartitionWriter>,
    announcer: Announcer,
    metrics: Arc<Metrics>,
}

/// What a writer needs besides its partition.
#[derive(Clone)]
pub struct WriterDeps {
    pub pool: Pool,
    pub limits: WriterLimits,
    pub announcer: Announcer,
    pub metrics: Arc<Metrics>,
}

/// Whether appends under these policies store alike (sealed or not, and the same dedup window),
/// so that their requests may share a segment.
fn writes_alike(a: &AppendPolicy, b: &AppendPolicy) -> bool {
    a.seal.is_some() == b.seal.is_some() && a.dedup_window_seconds == b.dedup_window_seconds
}

fn payload_bytes(messages: &[NewMessage]) -> usize {
    messages.iter().map(|m| m.payload.len()).sum()
}

impl PartitionWriter {
    fn write_next(&mut self, ctx: &mut Context<Self>) {
        let limits = self.limits;
        let policies = &self.policies;
        // The index of the next request offered to the batch (the first is always taken).
        let offered = std::cell::Cell::new(1);
        let Some(batch) = self.queue.next_batch(|so_far, next| {
            let same_policy =
                policies.get(offered.replace(offered.get() + 1)).is_some_and(|next| writes_alike(&policies[0], next));
            // A segment its producer compressed goes out alone, to be stored as received: fused
            // with other messages, it would have to be compressed again.
            same_policy
                && received_whole(so_far).is_none()
                && received_whole(next).is_none()
                && so_far.len() + next.len() <= limits.max_segment_messages
                && payload_bytes(so_far) + payload_bytes(next) <= limits.max_segment_bytes
        }) else {
            return;
        };
        let pool = self.pool.clone();
        let target = self.target.clone();
        let policy = self.policies.front().cloned().unwrap_or_default();
        self.policies.drain(..batch.replies.len().min(self.policies.len()));
        let messages = batch.items;
        let replies = batch.replies;
        self.metrics.actor_queued.with_label_values(&[ACTOR]).sub(replies.len() as i64);
        let answer_within = limits.answer_within;
        let write = async move {
            let client = pool.get().await.map_err(queen_store::StoreError::from)?;
            let destination =
                Destination { queue_id: target.queue_id, queue: &target.queue, partition_id: target.partition_id };
            let append = queen_store::log::append(&client, destination, &messages, &policy);
            let answered = tokio::time::timeout(answer_within, append).await;
            let Ok(result) = answered else {
                // The append may still commit: a 503, which the push's retry resolves (its
                // transaction ids make it a duplicate then).
                return Err(queen_store::pool::abandon(client, "an append", answer_within));
            };
            let result = result?;
            let stored = queen_store::log::stored(&messages, &result.outcomes);
            Ok::<_, queen_store::StoreError>((result, stored))
        };
        ctx.spawn(write.into_actor(self).map(move |result, writer, ctx| {
            match result {
                Ok((result, (queued, bytes))) => {
                    let duplicates = result.outcomes.len() as u64 - queued;
                    writer.metrics.record_append(&writer.target.queue, queued, duplicates, bytes);
                    // Announced even when every message was a duplicate: that is how the resend
                    // of a push answered 503 (unanswered) finds its first copy, which committed
                    // after the answer and was never announced.
                    let target = &writer.target;
                    let (queue, queue_id, partition_id) = (target.queue.clone(), target.queue_id, target.partition_id);
                    writer.announcer.announce(DataAvailable { queue, queue_id, partition_id });
                    replies.answer(Ok(result.outcomes));
                }
                Err(e) => replies.answer(Err(WorkError::from(e))),
            }
            writer.queue.done();
            writer.last_activity = Instant::now();
            writer.write_next(ctx);
            if writer.limits.idle.is_zero() {
                writer.stop_if_unused(ctx);
            }
        }));
    }

    /// Stops when nothing is queued or in flight and no request holds a place with this writer
    /// ([`Registry::release_if_unused`]); the partition's next push starts a new one.
    fn stop_if_unused(&self, ctx: &mut Context<Self>) {
        if self.queue.is_idle() && self.registry.release_if_unused(&self.target.partition_id, &ctx.address()) {
            ctx.stop();
        }
    }
}

impl Actor for PartitionWriter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.metrics.actors.with_label_values(&[ACTOR]).inc();
        self.metrics.actors_started.with_label_values(&[ACTOR]).inc();
        // Also stops a writer that was started for a push whose request never came (the push
        // was refused, or its client went away, before it sent).
        let idle = self.limits.idle;
        ctx.run_interval((idle / 2).max(IDLE_CHECK_MIN), move |writer, ctx| {
            if writer.last_activity.elapsed() >= idle {
                writer.stop_if_unused(ctx);
            }
        });
    }

    fn stopped(&mut self, ctx: &mut Self::Context) {
        self.metrics.actors.with_label_values(&[ACTOR]).dec();
        self.registry.remove(&self.target.partition_id, &ctx.address());
    }
}

impl Handler<Append> for PartitionWriter {
    type Result = ();

    fn handle(&mut self, msg: Append, ctx: &mut Self::Context) {
        self.last_activity = Instant::now();
        self.metrics.actor_queued.with_label_values(&[ACTOR]).inc();
        self.policies.push_back(msg.policy);
        self.queue.push(Pending { items: msg.messages, reply: msg.reply, place: msg.place });
        self.write_next(ctx);
    }
}

/// The writers of this broker, one per partition that is being pushed to.
#[derive(Clone)]
pub struct Writers {
    registry: Registry<i64, PartitionWriter>,
    deps: WriterDeps,
}

impl Writers {
    pub fn new(deps: WriterDeps) -> Self {
        let bound = Bound::new(Limited::PartitionWriter, deps.limits.mailbox, &deps.metrics);
        Self { registry: Registry::new(bound), deps }
    }

    fn start(&self, target: &WriteTarget) -> Addr<PartitionWriter> {
        let deps = self.deps.clone();
        PartitionWriter {
            target: target.clone(),
            pool: deps.pool,
            limits: deps.limits,
            queue: FusionQueue::default(),
            policies: VecDeque::new(),
            last_activity: Instant::now(),
            registry: self.registry.clone(),
            announcer: deps.announcer,
            metrics: deps.metrics,
        }
        .start()
    }

    /// Whether no writer holds a request.
    pub fn is_idle(&self) -> bool {
        self.registry.is_idle()
    }

    /// Takes a place for one request with the partition's writer; refused when the writer holds
    /// `push.writer_mailbox` requests.
    pub fn reserve(&self, target: &WriteTarget) -> Result<Reserved<'_>, WorkError> {
        let place = self.registry.hold(&target.partition_id, || self.start(target))?;
        Ok(Reserved { writers: self, target: target.clone(), place })
    }
}

/// A place taken with a partition's writer, for one request.
pub struct Reserved<'a> {
    writers: &'a Writers,
    target: WriteTarget,
    place: Held,
}

impl Reserved<'_> {
    pub fn partition_id(&self) -> i64 {
        self.target.partition_id
    }

    /// Appends the request's messages to the partition and waits for their outcomes, within
    /// about `database.answer_within_ms` in all: a request queued behind a write PostgreSQL does
    /// not answer would otherwise wait for that write's bound and then its own, each one queued
    /// behind it longer still. Its append may still be written after: its outcome is unknown.
    /// (A second more than the write's own bound, so that a write given up on is answered as
    /// such, and counted once.)
    pub async fn append(self, messages: Vec<NewMessage>, policy: AppendPolicy) -> Result<Vec<Appended>, WorkError> {
        let Reserved { writers, target, place } = self;
        let (reply, answer) = oneshot::channel();
        let append = Append { messages, policy, reply, place };
        if writers.registry.send(&target.partition_id, || writers.start(&target), append).is_err() {
            return Err(WorkError::Failed("the partition writer could not be started".into()));
        }
        let within = writers.deps.limits.answer_within + Duration::from_secs(1);
        match tokio::time::timeout(within, answer).await {
            Ok(answer) => answer.unwrap_or_else(|_| Err(WorkError::Failed("the partition writer stopped".into()))),
            Err(_) => Err(WorkError::Unanswered(format!(
                "the push waited {} ms behind a write PostgreSQL has not answered; whether it took effect is unknown",
                within.as_millis()
            ))),
        }
    }
}
