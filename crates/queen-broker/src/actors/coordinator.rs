//! Coordinator: one per broker. Parks long-polling pops and wakes them when data may have
//! arrived for their queue.
//!
//! A waiting pop first [`Observe`]s its queue's sequence number, then tries to pop, and parks
//! with the number it saw only if it found nothing. Every [`DataAvailable`] advances the number
//! and wakes the queue's parked pops; a pop that parks with a number that has already moved on
//! is woken at once, so a push landing between the try and the park is never missed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::metrics::Metrics;

/// How often closed waiters (their pop timed out or the client left) are swept away.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// The queue's current sequence number.
#[derive(Message)]
#[rtype(result = "u64")]
pub struct Observe {
    pub queue: Arc<str>,
}

/// Wakes `wake` once the queue's sequence number differs from `seen`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Park {
    pub queue: Arc<str>,
    pub seen: u64,
    pub wake: oneshot::Sender<()>,
}

/// Messages became available on the queue: pushed, or released by an acknowledgement.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DataAvailable {
    pub queue: Arc<str>,
}

#[derive(Default)]
struct QueueWaiters {
    seq: u64,
    parked: Vec<oneshot::Sender<()>>,
}

pub struct Coordinator {
    queues: HashMap<Arc<str>, QueueWaiters>,
    /// Sequence numbers are unique across queues and never 0, so a queue forgotten by the sweep
    /// and seen again can never repeat a number a waiter holds.
    last_seq: u64,
    metrics: Arc<Metrics>,
}

impl Coordinator {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { queues: HashMap::new(), last_seq: 0, metrics }
    }

    fn update_gauge(&self) {
        let parked: usize = self.queues.values().map(|q| q.parked.len()).sum();
        self.metrics.long_poll_waiters.set(parked as i64);
    }

    fn sweep(&mut self) {
        for waiters in self.queues.values_mut() {
            waiters.parked.retain(|wake| !wake.is_closed());
        }
        self.queues.retain(|_, waiters| !waiters.parked.is_empty());
        self.update_gauge();
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(16 * 1024);
        ctx.run_interval(SWEEP_INTERVAL, |coordinator, _| coordinator.sweep());
    }
}

impl Handler<Observe> for Coordinator {
    type Result = u64;

    fn handle(&mut self, msg: Observe, _: &mut Self::Context) -> u64 {
        self.queues.get(&msg.queue).map_or(0, |q| q.seq)
    }
}

impl Handler<Park> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Park, _: &mut Self::Context) {
        let waiters = self.queues.entry(msg.queue).or_default();
        if waiters.seq != msg.seen {
            let _ = msg.wake.send(());
            return;
        }
        waiters.parked.push(msg.wake);
        self.update_gauge();
    }
}

impl Handler<DataAvailable> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: DataAvailable, _: &mut Self::Context) {
        self.last_seq += 1;
        let waiters = self.queues.entry(msg.queue).or_default();
        waiters.seq = self.last_seq;
        for wake in waiters.parked.drain(..) {
            let _ = wake.send(());
        }
        self.update_gauge();
    }
}
