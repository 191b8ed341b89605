//! GroupLeases: one per consumer group. Acknowledgement calls for the group that arrive while
//! one batch is being committed are applied together in the next batch, one call after the
//! other, so a busy group pays one commit per batch rather than one per call (two when some acks
//! complete their deliveries and others need the full rules, see
//! `queen_store::cursors::acknowledge_batch`). The batches go to the broker's
//! [`AckLane`](super::ack_lane::AckLane), which fuses those of different groups that meet there.
//! One group's actor holds at most `limits.group_ack_calls` calls; past that, a call is refused at
//! once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use queen_log::Cipher;
use queen_store::Pool;
use queen_store::cursors::{AckOutcome, AckRequest};
use tokio::sync::oneshot;

use super::WorkError;
use super::ack_lane::{AckLane, CommitAcks};
use super::fusion::{FusionQueue, Pending};
use super::registry::Registry;
use crate::metrics::Metrics;
use crate::pressure::{Bound, Held, Limited};
use crate::services::announcer::Announcer;

/// This actor's label in the metrics.
const ACTOR: &str = "group_leases";

/// Most acknowledgements applied in one transaction.
const MAX_ACKS_PER_BATCH: usize = 10_000;

/// The shortest time a group actor with nothing to do stays: it looks for idleness on a timer of
/// half that, which needs a period.
const IDLE_MIN: Duration = Duration::from_secs(1);

/// One acknowledgement call (all of it for this group).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Acknowledge {
    pub call: Vec<AckRequest>,
    pub reply: oneshot::Sender<Result<Vec<Vec<AckOutcome>>, WorkError>>,
    pub place: Held,
}

pub struct GroupLeases {
    group: Arc<str>,
    lane: Addr<AckLane>,
    queue: FusionQueue<Vec<AckRequest>, Vec<AckOutcome>, WorkError>,
    last_activity: Instant,
    idle: Duration,
    registry: Registry<Arc<str>, GroupLeases>,
    metrics: Arc<Metrics>,
}

impl GroupLeases {
    fn commit_next(&mut self, ctx: &mut Context<Self>) {
        let Some(batch) = self.queue.next_batch(|so_far, next| {
            so_far.iter().map(Vec::len).sum::<usize>() + next.iter().map(Vec::len).sum::<usize>() <= MAX_ACKS_PER_BATCH
        }) else {
            return;
        };
        let replies = batch.replies;
        self.metrics.actor_queued.with_label_values(&[ACTOR]).sub(replies.len() as i64);
        let (reply, committed) = oneshot::channel();
        self.lane.do_send(CommitAcks::new(batch.items, reply));
        let commit = async move { committed.await.map_err(|_| WorkError::Failed("the ack lane stopped".into())) };
        ctx.spawn(commit.into_actor(self).map(move |result, leases, ctx| {
            match result {
                Ok(each_call) => replies.answer_each(each_call),
                Err(e) => replies.answer(Err(e)),
            }
            leases.queue.done();
            leases.last_activity = Instant::now();
            leases.commit_next(ctx);
        }));
    }
}

impl Actor for GroupLeases {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.metrics.actors.with_label_values(&[ACTOR]).inc();
        self.metrics.actors_started.with_label_values(&[ACTOR]).inc();
        let idle = self.idle;
        ctx.run_interval(idle / 2, move |leases, ctx| {
            // Only when no ack call holds a place with it: none is then on its way here.
            if leases.queue.is_idle()
                && leases.last_activity.elapsed() >= idle
                && leases.registry.release_if_unused(&leases.group, &ctx.address())
            {
                ctx.stop();
            }
        });
    }

    fn stopped(&mut self, ctx: &mut Self::Context) {
        self.metrics.actors.with_label_values(&[ACTOR]).dec();
        self.registry.remove(&self.group, &ctx.address());
    }
}

impl Handler<Acknowledge> for GroupLeases {
    type Result = ();

    fn handle(&mut self, msg: Acknowledge, ctx: &mut Self::Context) {
        self.last_activity = Instant::now();
        self.metrics.actor_queued.with_label_values(&[ACTOR]).inc();
        self.queue.push(Pending { items: vec![msg.call], reply: msg.reply, place: msg.place });
        self.commit_next(ctx);
    }
}

/// The GroupLeases actors of this broker.
#[derive(Clone)]
pub struct Groups {
    registry: Registry<Arc<str>, GroupLeases>,
    lane: Addr<AckLane>,
    idle: Duration,
    metrics: Arc<Metrics>,
}

impl Groups {
    /// The group actors, each holding at most `max_calls` ack calls and staying `idle` (at least
    /// [`IDLE_MIN`]) once they have nothing to do; their commits may go unanswered
    /// `answer_within`.
    pub fn new(
        pool: Pool,
        announcer: Announcer,
        idle: Duration,
        max_calls: usize,
        answer_within: Duration,
        metrics: Arc<Metrics>,
        keys: Option<Arc<Cipher>>,
    ) -> Self {
        let registry = Registry::new(Bound::new(Limited::GroupLeases, max_calls, &metrics));
        let lane = AckLane::new(pool, announcer, Arc::clone(&metrics), keys, answer_within).start();
        Self { registry, lane, idle: idle.max(IDLE_MIN), metrics }
    }

    fn start(&self, group: &Arc<str>) -> Addr<GroupLeases> {
        GroupLeases {
            group: Arc::clone(group),
            lane: self.lane.clone(),
            queue: FusionQueue::default(),
            last_activity: Instant::now(),
            idle: self.idle,
            registry: self.registry.clone(),
            metrics: Arc::clone(&self.metrics),
        }
        .start()
    }

    /// Whether no group actor holds an ack call.
    pub fn is_idle(&self) -> bool {
        self.registry.is_idle()
    }

    /// Applies one acknowledgement call whose items all belong to `group`.
    pub async fn acknowledge(&self, group: &str, call: Vec<AckRequest>) -> Result<Vec<AckOutcome>, WorkError> {
        let group: Arc<str> = group.into();
        let place = self.registry.hold(&group, || self.start(&group))?;
        let (reply, answer) = oneshot::channel();
        if self.registry.send(&group, || self.start(&group), Acknowledge { call, reply, place }).is_err() {
            return Err(WorkError::Failed("the group's ack actor could not be started".into()));
        }
        let mut calls =
            answer.await.unwrap_or_else(|_| Err(WorkError::Failed("the group's ack actor stopped".into())))?;
        Ok(calls.pop().unwrap_or_default())
    }
}
