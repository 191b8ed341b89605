//! Coordinator: one per broker. It keeps what the broker knows about where work is, and parks
//! long-polling pops until work may have arrived.
//!
//! **Waking.** A waiting pop first [`Observe`]s its queue's sequence number, then tries to pop,
//! and parks with the number it saw only if it found nothing. Every [`DataAvailable`] (a local
//! push, or a notice from any broker) advances the number and wakes the queue's parked pops; a
//! pop that parks with a number that has already moved on is woken at once, so a push landing
//! between the try and the park is never missed.
//!
//! **Candidates.** Pushes (from any broker) announce their partition through `NOTIFY`; the
//! coordinator keeps, per queue, the partitions announced recently: the *hot list*. Per (queue,
//! group) it keeps a *view*: when it last scanned every partition of the queue for the group, and
//! which partitions had work then. A queue-wide pop asks for a [`PopPlan`]: with a fresh view,
//! the candidates are the view's partitions plus the hot list (a bounded set, checked in one
//! query, never a scan of every partition); without one, a full scan, whose result becomes the
//! view. A view is re-verified at most every `view_max_age` (30 s). With the hot list off, the
//! full scan runs every time, except that a scan that found nothing (the empty-scan watermark) is
//! trusted until a push to the queue or the view's age says otherwise.
//!
//! Seek, group deletion and subscription changes clear the group's views on every broker
//! ([`Forget`], from a local call or a fleet notice). While the LISTEN connection is down no view
//! is trusted; when it comes back, views are dropped, the hot list is seeded from what was pushed
//! recently, and every parked pop looks again, since notices may have been missed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use queen_store::events::Event;
use tokio::sync::oneshot;

use crate::metrics::Metrics;

/// How often stale hot entries, views and closed waiters are swept away.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoordinatorSettings {
    /// Take queue-wide pop candidates from the hot list and views.
    pub hot_list: bool,
    /// A view older than this is re-verified by a full scan.
    pub view_max_age: Duration,
    /// Most partitions remembered as hot per queue; the least recently pushed go first.
    pub hot_capacity: usize,
}

impl CoordinatorSettings {
    /// How long a partition stays hot after its last notice. Twice the view age, so a partition
    /// pushed after a scan stays a candidate until the next scan has certainly seen it.
    fn hot_ttl(&self) -> Duration {
        self.view_max_age * 2
    }
}

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

/// Messages became available on the queue, pushed by this broker.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DataAvailable {
    pub queue: Arc<str>,
}

/// Wake every parked pop (the broker is shutting down).
#[derive(Message)]
#[rtype(result = "()")]
pub struct WakeAll;

/// A fleet event, from the LISTEN connection.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Notice(pub Event);

/// The LISTEN connection is down: notices may be missed from now on.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ListenLost;

/// The LISTEN connection is (back) up; `recent` are (queue id, partition id) pairs pushed to
/// lately, read from committed state.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ListenRestored {
    pub recent: Vec<(i64, i64)>,
}

/// Forget the group's views on the queue (every queue when `queue_id` is 0), and wake the
/// queue's parked pops.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Forget {
    pub queue_id: i64,
    pub queue: Option<Arc<str>>,
    pub group: Arc<str>,
}

/// Which partitions a queue-wide pop should look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PopPlan {
    /// Scan every partition of the queue; report it with [`ScanDone`].
    Full { ticket: u64 },
    /// Check these partitions only (none: nothing can be pending); report with [`Checked`].
    Candidates { ticket: u64, partitions: Vec<i64> },
}

#[derive(Message)]
#[rtype(result = "PopPlan")]
pub struct PlanPop {
    pub queue_id: i64,
    pub group: Arc<str>,
}

/// A full scan that started at `started` found work in `pending` (leased or not).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ScanDone {
    pub ticket: u64,
    pub queue_id: i64,
    pub group: Arc<str>,
    pub started: Instant,
    pub pending: Vec<i64>,
}

/// Of a plan's candidates, these still have work.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Checked {
    pub ticket: u64,
    pub queue_id: i64,
    pub group: Arc<str>,
    pub pending: Vec<i64>,
}

#[derive(Default)]
struct QueueWaiters {
    seq: u64,
    parked: Vec<oneshot::Sender<()>>,
}

/// What a broker knows about a group's work on a queue since its last full scan.
struct GroupView {
    scanned_at: Instant,
    /// Partitions with work (leased or not) at the scan, minus those found drained since.
    pending: HashSet<i64>,
}

pub struct Coordinator {
    settings: CoordinatorSettings,
    waiters: HashMap<Arc<str>, QueueWaiters>,
    /// Sequence numbers are unique across queues and never 0, so a queue forgotten by the sweep
    /// and seen again can never repeat a number a waiter holds.
    last_seq: u64,
    /// Per queue id: partitions announced recently, with when.
    hot: HashMap<i64, HashMap<i64, Instant>>,
    views: HashMap<(i64, Arc<str>), GroupView>,
    /// Advances whenever views may have gone stale (a forget, a lost connection), so that a scan
    /// planned before cannot store its outdated result.
    ticket: u64,
    listening: bool,
    metrics: Arc<Metrics>,
}

impl Coordinator {
    pub fn new(settings: CoordinatorSettings, metrics: Arc<Metrics>) -> Self {
        Self {
            settings,
            waiters: HashMap::new(),
            last_seq: 0,
            hot: HashMap::new(),
            views: HashMap::new(),
            ticket: 0,
            listening: false,
            metrics,
        }
    }

    fn update_gauge(&self) {
        let parked: usize = self.waiters.values().map(|q| q.parked.len()).sum();
        self.metrics.long_poll_waiters.set(parked as i64);
    }

    fn wake(&mut self, queue: Arc<str>) {
        self.last_seq += 1;
        let waiters = self.waiters.entry(queue).or_default();
        waiters.seq = self.last_seq;
        for wake in waiters.parked.drain(..) {
            let _ = wake.send(());
        }
        self.update_gauge();
    }

    fn wake_all(&mut self) {
        let queues: Vec<Arc<str>> = self.waiters.keys().cloned().collect();
        for queue in queues {
            self.wake(queue);
        }
    }

    fn mark_hot(&mut self, queue_id: i64, partition_id: i64, at: Instant) {
        let hot = self.hot.entry(queue_id).or_default();
        hot.insert(partition_id, at);
        if hot.len() > self.settings.hot_capacity {
            let oldest = hot.iter().min_by_key(|(_, at)| **at).map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                hot.remove(&oldest);
            }
        }
    }

    fn forget_views(&mut self, queue_id: i64, group: &str) {
        self.ticket += 1;
        self.views.retain(|(view_queue, view_group), _| {
            !(&**view_group == group && (queue_id == 0 || *view_queue == queue_id))
        });
    }

    fn sweep(&mut self) {
        for waiters in self.waiters.values_mut() {
            waiters.parked.retain(|wake| !wake.is_closed());
        }
        self.waiters.retain(|_, waiters| !waiters.parked.is_empty());
        let ttl = self.settings.hot_ttl();
        for hot in self.hot.values_mut() {
            hot.retain(|_, at| at.elapsed() < ttl);
        }
        self.hot.retain(|_, hot| !hot.is_empty());
        let max_age = self.settings.view_max_age;
        self.views.retain(|_, view| view.scanned_at.elapsed() < max_age);
        self.update_gauge();
    }

    fn plan(&self, queue_id: i64, group: Arc<str>) -> PopPlan {
        let ticket = self.ticket;
        let fresh =
            self.views.get(&(queue_id, group)).filter(|view| view.scanned_at.elapsed() < self.settings.view_max_age);
        let (Some(view), true) = (fresh, self.listening) else { return PopPlan::Full { ticket } };
        let hot = self.hot.get(&queue_id);
        if self.settings.hot_list {
            let mut partitions: HashSet<i64> = view.pending.clone();
            partitions.extend(hot.into_iter().flat_map(|hot| hot.keys().copied()));
            return PopPlan::Candidates { ticket, partitions: partitions.into_iter().collect() };
        }
        // Without the hot list, only an empty scan with no push to the queue since is trusted.
        let pushed_since = hot.is_some_and(|hot| hot.values().any(|at| *at >= view.scanned_at));
        if view.pending.is_empty() && !pushed_since {
            PopPlan::Candidates { ticket, partitions: Vec::new() }
        } else {
            PopPlan::Full { ticket }
        }
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
        self.waiters.get(&msg.queue).map_or(0, |q| q.seq)
    }
}

impl Handler<Park> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Park, _: &mut Self::Context) {
        let waiters = self.waiters.entry(msg.queue).or_default();
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
        self.wake(msg.queue);
    }
}

impl Handler<WakeAll> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: WakeAll, _: &mut Self::Context) {
        self.wake_all();
    }
}

impl Handler<Notice> for Coordinator {
    type Result = ();

    fn handle(&mut self, Notice(event): Notice, _: &mut Self::Context) {
        self.metrics.notices_received.inc();
        match event {
            Event::Available { queue_id, partition_id, queue } => {
                self.mark_hot(queue_id, partition_id, Instant::now());
                self.wake(Arc::from(queue));
            }
            Event::Reset { queue_id, group } => {
                self.forget_views(queue_id, &group);
                // Which queue was reset is known by id only: wake every parked pop to be sure.
                self.wake_all();
            }
        }
    }
}

impl Handler<ListenLost> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: ListenLost, _: &mut Self::Context) {
        self.listening = false;
        self.ticket += 1;
        self.views.clear();
    }
}

impl Handler<ListenRestored> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: ListenRestored, _: &mut Self::Context) {
        self.listening = true;
        self.ticket += 1;
        self.views.clear();
        let now = Instant::now();
        for (queue_id, partition_id) in msg.recent {
            self.mark_hot(queue_id, partition_id, now);
        }
        self.wake_all();
    }
}

impl Handler<Forget> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Forget, _: &mut Self::Context) {
        self.forget_views(msg.queue_id, &msg.group);
        match msg.queue {
            Some(queue) => self.wake(queue),
            None => self.wake_all(),
        }
    }
}

impl Handler<PlanPop> for Coordinator {
    type Result = MessageResult<PlanPop>;

    fn handle(&mut self, msg: PlanPop, _: &mut Self::Context) -> Self::Result {
        let plan = self.plan(msg.queue_id, msg.group);
        let kind = match &plan {
            PopPlan::Full { .. } => "full",
            PopPlan::Candidates { partitions, .. } if partitions.is_empty() => "skipped",
            PopPlan::Candidates { .. } => "candidates",
        };
        self.metrics.pop_scans.with_label_values(&[kind]).inc();
        MessageResult(plan)
    }
}

impl Handler<ScanDone> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: ScanDone, _: &mut Self::Context) {
        if msg.ticket == self.ticket && self.listening {
            let view = GroupView { scanned_at: msg.started, pending: msg.pending.into_iter().collect() };
            self.views.insert((msg.queue_id, msg.group), view);
        }
    }
}

impl Handler<Checked> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Checked, _: &mut Self::Context) {
        if msg.ticket != self.ticket {
            return;
        }
        if let Some(view) = self.views.get_mut(&(msg.queue_id, msg.group)) {
            view.pending = msg.pending.into_iter().collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coordinator(hot_list: bool) -> Coordinator {
        let settings = CoordinatorSettings { hot_list, view_max_age: Duration::from_secs(30), hot_capacity: 3 };
        let mut coordinator = Coordinator::new(settings, Arc::new(Metrics::new()));
        coordinator.listening = true;
        coordinator
    }

    fn group() -> Arc<str> {
        Arc::from("g")
    }

    fn sorted(plan: PopPlan) -> Option<Vec<i64>> {
        match plan {
            PopPlan::Full { .. } => None,
            PopPlan::Candidates { mut partitions, .. } => {
                partitions.sort();
                Some(partitions)
            }
        }
    }

    #[test]
    fn a_fresh_view_plus_the_hot_list_replaces_the_full_scan() {
        let mut c = coordinator(true);
        assert_eq!(c.plan(1, group()), PopPlan::Full { ticket: 0 });
        c.views.insert((1, group()), GroupView { scanned_at: Instant::now(), pending: HashSet::from([5]) });
        c.mark_hot(1, 9, Instant::now());
        c.mark_hot(2, 7, Instant::now());
        assert_eq!(sorted(c.plan(1, group())), Some(vec![5, 9]));
    }

    #[test]
    fn a_forget_drops_the_view_and_outdates_scans_in_flight() {
        let mut c = coordinator(true);
        let PopPlan::Full { ticket } = c.plan(1, group()) else { panic!("a full scan") };
        c.forget_views(1, "g");
        let stale = GroupView { scanned_at: Instant::now(), pending: HashSet::new() };
        assert_ne!(ticket, c.ticket, "a scan planned before the forget must not be stored");
        c.views.insert((1, group()), stale);
        c.forget_views(0, "g");
        assert_eq!(sorted(c.plan(1, group())), None, "forgetting every queue of the group");
    }

    #[test]
    fn without_a_listen_connection_every_pop_scans() {
        let mut c = coordinator(true);
        c.views.insert((1, group()), GroupView { scanned_at: Instant::now(), pending: HashSet::new() });
        c.listening = false;
        assert_eq!(sorted(c.plan(1, group())), None);
    }

    #[test]
    fn without_the_hot_list_only_an_empty_scan_with_no_push_since_is_trusted() {
        let mut c = coordinator(false);
        let scanned_at = Instant::now();
        c.views.insert((1, group()), GroupView { scanned_at, pending: HashSet::new() });
        assert_eq!(sorted(c.plan(1, group())), Some(vec![]));
        c.mark_hot(1, 4, scanned_at + Duration::from_millis(1));
        assert_eq!(sorted(c.plan(1, group())), None, "a push since the scan");
    }

    #[test]
    fn the_hot_list_is_bounded() {
        let mut c = coordinator(true);
        let start = Instant::now();
        for (i, partition) in [1, 2, 3, 4].into_iter().enumerate() {
            c.mark_hot(1, partition, start + Duration::from_millis(i as u64));
        }
        let mut hot: Vec<i64> = c.hot[&1].keys().copied().collect();
        hot.sort();
        assert_eq!(hot, vec![2, 3, 4], "the least recently pushed goes first");
    }
}
