//! Coordinator: one per broker. It keeps what the broker knows about where work is, and parks
//! long-polling pops until work may have arrived.
//!
//! **Waking.** A waiting pop first [`Observe`]s its queue's sequence number, then tries to pop,
//! and parks with the number it saw only if it found nothing. Every [`DataAvailable`] (a local
//! push, or a notice from any broker) advances the number and wakes the queue's parked pops; a
//! pop that parks with a number that has already moved on is woken at once, so a push landing
//! between the try and the park is never missed.
//!
//! **One turn per group.** Queue-wide pops of one group would all race for the same new
//! messages: one claims them, the others plan, check and claim for nothing (with ten groups of
//! two consumers at 500 msg/s, 4 of every 10 claims came back empty). So a [`DataAvailable`]
//! wakes only the longest-parked queue-wide pop of each group, which takes the group's *turn*.
//! It hands the turn on ([`PassTurn`]) to the group's next parked pop when it passes over
//! partitions it could have served (its limits, or another pop holding them), and when it fails
//! or its request goes away, even before it read its [`WakeUp`]; any queue-wide pop that passes
//! over partitions hands a turn on.
//! Partition and namespace pops, and every other wake-up (changed options, shutdown, starting
//! over), wake every parked pop as before.
//!
//! **Candidates.** Pushes (from any broker) announce their partition through `NOTIFY`, and a
//! local push to its own coordinator at once, so a pop that follows a push always sees it. Per
//! (queue, group) the coordinator keeps a *view*: when it last scanned every partition of the
//! queue for the group, and which partitions have had work since, the scan's finds plus every
//! partition announced after the scan was planned. A queue-wide pop asks for a [`PopPlan`]: with a fresh view, the candidates are the
//! view's partitions, at most the pop's limit of them, taken round robin when there are more, so
//! that one pop's query stays small however many partitions have work; a check that finds a
//! candidate drained removes it, unless it was announced again meanwhile, and so does an ack that
//! commits a partition as far as the partition reached when the pop claimed it (its consumer's
//! next pop then need not look there). Without a view, a full
//! scan, whose result becomes the view. A view is re-verified at most every `view_max_age` (30 s).
//! With planning from views off (`pop.plan_from_views = false`), the full scan runs every time, except that a scan that found nothing
//! (the empty-scan watermark) is trusted until a push to the queue or the view's age says
//! otherwise.
//!
//! Seek, group deletion and subscription changes clear the group's views on every broker
//! ([`Forget`], from a local call or a fleet notice). While the LISTEN connection is down no view
//! is trusted; when it comes back, views are dropped and every parked pop looks again, since
//! notices may have been missed: each group's next pop scans committed state.
//!
//! **Bound.** The broker reaches the coordinator through [`CoordinatorMailbox`]: at most
//! `limits.coordinator_messages` messages wait for it. A pop that finds no room is refused (503);
//! a report of a pop's findings is dropped (the view just learns less); an announcement is
//! dropped too, and then, when the coordinator catches up, it starts over as after a lost LISTEN
//! connection: every view is dropped and every parked pop looks again. The few control messages
//! (wake-ups, forgets, the LISTEN connection's state) always go through.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use actix::prelude::*;
use queen_store::cursors::ReleasedWork;
use tokio::sync::oneshot;

use super::WorkError;
use crate::metrics::Metrics;
use crate::pressure::{Bound, Held, Limited};

/// How often stale views, forgotten scans and closed waiters are swept away.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoordinatorSettings {
    /// Take queue-wide pop candidates from the views (fed by announcements) instead of scans.
    pub plan_from_views: bool,
    /// A view older than this is re-verified by a full scan.
    pub view_max_age: Duration,
}

/// The queue's current sequence number.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Observe {
    pub queue: Arc<str>,
    pub reply: oneshot::Sender<u64>,
}

/// Wakes `wake` once the queue's sequence number differs from `seen`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Park {
    pub queue: Arc<str>,
    pub seen: u64,
    pub waiter: Waiter,
}

/// A parked pop: how to wake it, and the group whose turn it waits for when it is a queue-wide
/// pop of one queue (see the module's *One turn per group*).
pub struct Waiter {
    pub turn_of: Option<Arc<str>>,
    pub wake: oneshot::Sender<()>,
}

/// What a parked pop waits on: resolves when the pop is woken, to its group's [`Turn`] for a
/// queue-wide pop of one queue. Dropped with a wake-up that came and was not read (the request
/// went away as it was woken), it hands that turn on, or the group's other parked pops would wait
/// for a pop that is gone.
pub struct WakeUp {
    woken: oneshot::Receiver<()>,
    turn: Option<Turn>,
}

impl Future for WakeUp {
    type Output = Result<Option<Turn>, oneshot::error::RecvError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        Pin::new(&mut this.woken).poll(cx).map_ok(|()| this.turn.take())
    }
}

impl Drop for WakeUp {
    fn drop(&mut self) {
        let Some(turn) = self.turn.take() else { return };
        // Closed first, so that no wake-up can land after the look.
        self.woken.close();
        if self.woken.try_recv().is_err() {
            turn.settle();
        }
    }
}

/// The group's turn on a queue, held by the queue-wide pop that new messages woke. Dropped
/// before [`Turn::settle`] (the pop failed, or its request went away, before it looked), it hands
/// the turn to the group's next parked pop.
pub struct Turn {
    addr: Option<Addr<Coordinator>>,
    queue: Arc<str>,
    group: Arc<str>,
}

impl Turn {
    /// The pop has looked: nothing to hand on.
    pub fn settle(mut self) {
        self.addr = None;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(addr) = self.addr.take() {
            addr.do_send(PassTurn { queue: Arc::clone(&self.queue), group: Arc::clone(&self.group) });
        }
    }
}

/// Wakes the group's next parked queue-wide pop on the queue: a pop passed over partitions it
/// could have served, or the one holding the group's turn failed or went away before it looked.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PassTurn {
    pub queue: Arc<str>,
    pub group: Arc<str>,
}

/// Messages became available on a partition: by this broker's doing (a push, a released lease),
/// announced before the caller is answered, or by another broker's (its fleet notice).
#[derive(Message)]
#[rtype(result = "()")]
pub struct DataAvailable {
    pub queue: Arc<str>,
    pub queue_id: i64,
    pub partition_id: i64,
}

impl From<ReleasedWork> for DataAvailable {
    fn from(work: ReleasedWork) -> Self {
        DataAvailable { queue: Arc::from(work.queue), queue_id: work.queue_id, partition_id: work.partition_id }
    }
}

/// Wake every parked pop (the broker is shutting down).
#[derive(Message)]
#[rtype(result = "()")]
pub struct WakeAll;

/// Wake the queue's parked pops: its options changed, so when its messages may be served may
/// have too.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WakeQueue(pub Arc<str>);

/// The LISTEN connection is down: notices may be missed from now on.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ListenLost;

/// The LISTEN connection is (back) up.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ListenRestored;

/// Forget the group's views on the queue (every queue when `queue_id` is 0), and wake the
/// queue's parked pops (every parked pop when the queue's name is not known, as for a fleet
/// notice, which names the queue by id only).
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
    Full { ticket: u64, scan: u64 },
    /// Check these partitions only (none: nothing can be pending); report with [`Checked`],
    /// passing `as_of` back. They are one round of a view of `view_size` partitions.
    Candidates { ticket: u64, as_of: u64, partitions: Vec<i64>, view_size: usize },
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct PlanPop {
    pub queue_id: i64,
    pub group: Arc<str>,
    /// Most partitions to check.
    pub limit: usize,
    pub reply: oneshot::Sender<PopPlan>,
}

/// The full scan `scan` found work in `pending` (leased or not).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ScanDone {
    pub ticket: u64,
    pub scan: u64,
    pub group: Arc<str>,
    pub pending: Vec<i64>,
}

/// The group had no work left on partitions as of revision `as_of`: a plan's candidates were
/// `checked`, of which these are still `pending`; or a pop claimed partitions to their end and
/// an ack (or the claim, committing at delivery) then committed them (`pending` empty).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Checked {
    pub ticket: u64,
    pub as_of: u64,
    pub queue_id: i64,
    pub group: Arc<str>,
    pub checked: Vec<i64>,
    pub pending: Vec<i64>,
}

/// The view a queue-wide pop planned from, for reporting what it then found drained: the report
/// applies only if no view went stale since (`ticket`), and leaves the partitions announced after
/// `as_of`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewStamp {
    pub ticket: u64,
    pub as_of: u64,
}

#[derive(Default)]
struct QueueWaiters {
    seq: u64,
    /// Longest parked first.
    parked: Vec<Waiter>,
}

/// A full scan planned and not reported yet, with the partitions announced since it was planned
/// (the scan may have missed them).
struct Scan {
    queue_id: i64,
    planned_at: Instant,
    announced: Vec<i64>,
}

/// What a broker knows about a group's work on a queue since its last full scan.
struct GroupView {
    scanned_at: Instant,
    /// Partitions with work (leased or not) at the scan or announced since, minus those found
    /// drained since; each with the revision that put it here.
    pending: BTreeMap<i64, u64>,
    /// Where the next plan's round starts.
    next: i64,
}

impl GroupView {
    fn scanned(at: Instant, pending: impl IntoIterator<Item = i64>, revision: u64) -> Self {
        GroupView { scanned_at: at, pending: pending.into_iter().map(|p| (p, revision)).collect(), next: 0 }
    }

    fn is_fresh(&self, max_age: Duration) -> bool {
        self.scanned_at.elapsed() < max_age
    }

    /// Up to `limit` pending partitions, going on from where the last call stopped.
    fn next_round(&mut self, limit: usize) -> Vec<i64> {
        let mut round: Vec<i64> = self
            .pending
            .range(self.next..)
            .chain(self.pending.range(..self.next))
            .map(|(p, _)| *p)
            .take(limit)
            .collect();
        if round.len() == self.pending.len() {
            round.sort_unstable();
            self.next = 0;
        } else if let Some(last) = round.last() {
            self.next = last + 1;
        }
        round
    }
}

pub struct Coordinator {
    settings: CoordinatorSettings,
    waiters: HashMap<Arc<str>, QueueWaiters>,
    /// Sequence numbers are unique across queues and never 0, so a queue forgotten by the sweep
    /// and seen again can never repeat a number a waiter holds.
    last_seq: u64,
    /// Every queue's number is at least this: raised when the coordinator starts over, so a pop
    /// that observed a queue before and parks after is woken at once.
    epoch: u64,
    /// Set by the mailbox when an announcement found no room.
    missed: Arc<AtomicBool>,
    /// Per queue id, per group.
    views: HashMap<i64, HashMap<Arc<str>, GroupView>>,
    scans: HashMap<u64, Scan>,
    last_scan: u64,
    /// Advances with every change that adds to views (an announcement, a scan), so a check
    /// planned before cannot remove what was added after it.
    revision: u64,
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
            epoch: 0,
            missed: Arc::new(AtomicBool::new(false)),
            views: HashMap::new(),
            scans: HashMap::new(),
            last_scan: 0,
            revision: 0,
            ticket: 0,
            listening: false,
            metrics,
        }
    }

    fn wake(&mut self, queue: Arc<str>) {
        self.last_seq += 1;
        let waiters = self.waiters.entry(queue).or_default();
        waiters.seq = self.last_seq;
        for waiter in waiters.parked.drain(..) {
            let _ = waiter.wake.send(());
        }
    }

    /// New messages: wakes the queue's parked pops, but of each group's queue-wide pops only the
    /// longest parked, which takes the group's turn.
    fn wake_for_messages(&mut self, queue: Arc<str>) {
        self.last_seq += 1;
        let waiters = self.waiters.entry(queue).or_default();
        waiters.seq = self.last_seq;
        let mut turns_taken: Vec<Arc<str>> = Vec::new();
        for waiter in std::mem::take(&mut waiters.parked) {
            match waiter.turn_of {
                Some(group) if turns_taken.contains(&group) => {
                    waiters.parked.push(Waiter { turn_of: Some(group), wake: waiter.wake });
                }
                // A pop whose request went away cannot take the turn; the next one does.
                Some(group) => {
                    if waiter.wake.send(()).is_ok() {
                        turns_taken.push(group);
                    }
                }
                None => {
                    let _ = waiter.wake.send(());
                }
            }
        }
    }

    /// Wakes the longest-parked queue-wide pop of the group still waiting on the queue.
    fn pass_turn(&mut self, queue: &str, group: &str) {
        let Some(waiters) = self.waiters.get_mut(queue) else { return };
        while let Some(next) = waiters.parked.iter().position(|w| w.turn_of.as_deref() == Some(group)) {
            if waiters.parked.remove(next).wake.send(()).is_ok() {
                return;
            }
        }
    }

    fn wake_all(&mut self) {
        let queues: Vec<Arc<str>> = self.waiters.keys().cloned().collect();
        for queue in queues {
            self.wake(queue);
        }
    }

    /// The queue's sequence number as pops see it.
    fn seq_of(&self, queue: &str) -> u64 {
        self.waiters.get(queue).map_or(0, |q| q.seq).max(self.epoch)
    }

    /// Announcements may have been missed: trust no view, and have every pop look again, parked
    /// now or about to park after looking.
    fn start_over(&mut self) {
        self.ticket += 1;
        self.views.clear();
        self.wake_everyone();
    }

    /// Has every pop look again: the parked ones, and those about to park after looking (their
    /// sequence number is behind the epoch now), on any queue, one with no entry here included.
    fn wake_everyone(&mut self) {
        self.last_seq += 1;
        self.epoch = self.last_seq;
        self.wake_all();
    }

    /// Messages became available in the partition: it is pending for every group viewing the
    /// queue, and for every scan of the queue under way.
    fn announce(&mut self, queue_id: i64, partition_id: i64) {
        self.revision += 1;
        let revision = self.revision;
        for view in self.views.get_mut(&queue_id).into_iter().flat_map(HashMap::values_mut) {
            view.pending.insert(partition_id, revision);
        }
        for scan in self.scans.values_mut().filter(|scan| scan.queue_id == queue_id) {
            scan.announced.push(partition_id);
        }
    }

    fn forget_views(&mut self, queue_id: i64, group: &str) {
        self.ticket += 1;
        for (view_queue, groups) in &mut self.views {
            if queue_id == 0 || *view_queue == queue_id {
                groups.remove(group);
            }
        }
        self.views.retain(|_, groups| !groups.is_empty());
    }

    fn view_mut(&mut self, queue_id: i64, group: &str) -> Option<&mut GroupView> {
        self.views.get_mut(&queue_id)?.get_mut(group)
    }

    fn sweep(&mut self) {
        for waiters in self.waiters.values_mut() {
            waiters.parked.retain(|waiter| !waiter.wake.is_closed());
        }
        // A queue's entry goes with its last parked pop, and its sequence number with it: the
        // epoch keeps it, or a pop that looked before the entry's last bump would park on the
        // number it saw (a push between its look and its park, missed).
        let dropped = self.waiters.values().filter(|waiters| waiters.parked.is_empty()).map(|waiters| waiters.seq);
        self.epoch = dropped.fold(self.epoch, u64::max);
        self.waiters.retain(|_, waiters| !waiters.parked.is_empty());
        let max_age = self.settings.view_max_age;
        for groups in self.views.values_mut() {
            groups.retain(|_, view| view.is_fresh(max_age));
        }
        self.views.retain(|_, groups| !groups.is_empty());
        // A scan whose pop failed never reports.
        self.scans.retain(|_, scan| scan.planned_at.elapsed() < max_age);
    }

    fn plan(&mut self, queue_id: i64, group: &str, limit: usize) -> PopPlan {
        let (ticket, as_of, plan_from_views, listening) =
            (self.ticket, self.revision, self.settings.plan_from_views, self.listening);
        let max_age = self.settings.view_max_age;
        let fresh = self.view_mut(queue_id, group).filter(|view| view.is_fresh(max_age));
        match fresh {
            Some(view) if listening && plan_from_views => {
                let view_size = view.pending.len();
                PopPlan::Candidates { ticket, as_of, partitions: view.next_round(limit), view_size }
            }
            // Without planning from views, only an empty scan with no push to the queue since is trusted.
            Some(view) if listening && view.pending.is_empty() => {
                PopPlan::Candidates { ticket, as_of, partitions: Vec::new(), view_size: 0 }
            }
            _ => {
                self.last_scan += 1;
                let scan = Scan { queue_id, planned_at: Instant::now(), announced: Vec::new() };
                self.scans.insert(self.last_scan, scan);
                PopPlan::Full { ticket, scan: self.last_scan }
            }
        }
    }

    fn store_scan(&mut self, msg: ScanDone) {
        let Some(scan) = self.scans.remove(&msg.scan) else { return };
        if msg.ticket == self.ticket && self.listening {
            self.revision += 1;
            let pending = msg.pending.into_iter().chain(scan.announced);
            let view = GroupView::scanned(scan.planned_at, pending, self.revision);
            self.views.entry(scan.queue_id).or_default().insert(msg.group, view);
        }
    }

    fn apply_check(&mut self, msg: Checked) {
        if msg.ticket != self.ticket {
            return;
        }
        let Some(view) = self.view_mut(msg.queue_id, &msg.group) else { return };
        let still: HashSet<i64> = msg.pending.into_iter().collect();
        for partition in msg.checked.iter().filter(|p| !still.contains(p)) {
            // Announced after the check was planned: the check may have missed that push.
            if view.pending.get(partition).is_some_and(|added| *added <= msg.as_of) {
                view.pending.remove(partition);
            }
        }
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(SWEEP_INTERVAL, |coordinator, _| coordinator.sweep());
    }
}

/// The messages that count against the coordinator's bound.
enum Counted {
    Observe(Observe),
    Park(Park),
    PlanPop(PlanPop),
    ScanDone(ScanDone),
    Checked(Checked),
    DataAvailable(DataAvailable),
}

/// A message holding its place in the coordinator's bound until it is handled.
#[derive(Message)]
#[rtype(result = "()")]
struct Queued(Counted, Held);

impl Handler<Queued> for Coordinator {
    type Result = ();

    fn handle(&mut self, Queued(msg, _place): Queued, ctx: &mut Self::Context) {
        if self.missed.swap(false, Ordering::SeqCst) {
            self.start_over();
        }
        match msg {
            Counted::Observe(msg) => self.handle(msg, ctx),
            Counted::Park(msg) => self.handle(msg, ctx),
            Counted::PlanPop(msg) => self.handle(msg, ctx),
            Counted::ScanDone(msg) => self.handle(msg, ctx),
            Counted::Checked(msg) => self.handle(msg, ctx),
            Counted::DataAvailable(msg) => self.handle(msg, ctx),
        }
    }
}

impl Handler<Observe> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Observe, _: &mut Self::Context) {
        let _ = msg.reply.send(self.seq_of(&msg.queue));
    }
}

impl Handler<Park> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Park, _: &mut Self::Context) {
        if self.seq_of(&msg.queue) != msg.seen {
            let _ = msg.waiter.wake.send(());
            return;
        }
        self.waiters.entry(msg.queue).or_default().parked.push(msg.waiter);
    }
}

impl Handler<DataAvailable> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: DataAvailable, _: &mut Self::Context) {
        self.announce(msg.queue_id, msg.partition_id);
        self.wake_for_messages(msg.queue);
    }
}

impl Handler<PassTurn> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: PassTurn, _: &mut Self::Context) {
        self.pass_turn(&msg.queue, &msg.group);
    }
}

impl Handler<WakeAll> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: WakeAll, _: &mut Self::Context) {
        self.wake_all();
    }
}

impl Handler<WakeQueue> for Coordinator {
    type Result = ();

    fn handle(&mut self, WakeQueue(queue): WakeQueue, _: &mut Self::Context) {
        self.wake(queue);
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

    fn handle(&mut self, _: ListenRestored, _: &mut Self::Context) {
        self.listening = true;
        self.start_over();
    }
}

impl Handler<Forget> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Forget, _: &mut Self::Context) {
        self.forget_views(msg.queue_id, &msg.group);
        match msg.queue {
            Some(queue) => self.wake(queue),
            // Any queue's pops, those about to park on a queue with no entry here too.
            None => self.wake_everyone(),
        }
    }
}

impl Handler<PlanPop> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: PlanPop, _: &mut Self::Context) {
        let plan = self.plan(msg.queue_id, &msg.group, msg.limit);
        let kind = match &plan {
            PopPlan::Full { .. } => "full",
            PopPlan::Candidates { partitions, .. } if partitions.is_empty() => "skipped",
            PopPlan::Candidates { .. } => "candidates",
        };
        self.metrics.pop_scans.with_label_values(&[kind]).inc();
        let _ = msg.reply.send(plan);
    }
}

impl Handler<ScanDone> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: ScanDone, _: &mut Self::Context) {
        self.store_scan(msg);
    }
}

impl Handler<Checked> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Checked, _: &mut Self::Context) {
        self.apply_check(msg);
    }
}

/// The coordinator as the rest of the broker reaches it, within its bound.
#[derive(Clone)]
pub struct CoordinatorMailbox {
    addr: Addr<Coordinator>,
    /// Messages sent and not handled yet.
    waiting: Arc<Bound>,
    /// Set when an announcement found no room; the coordinator starts over when it catches up.
    missed: Arc<AtomicBool>,
}

fn coordinator_gone() -> WorkError {
    WorkError::Failed("the coordinator did not answer".into())
}

impl CoordinatorMailbox {
    /// Starts the coordinator, with at most `limit` messages waiting for it.
    pub fn start(coordinator: Coordinator, limit: usize, metrics: &Metrics) -> Self {
        let missed = Arc::clone(&coordinator.missed);
        let waiting = Bound::new(Limited::Coordinator, limit, metrics);
        Self { addr: coordinator.start(), waiting, missed }
    }

    fn send(&self, msg: Counted, place: Held) {
        self.addr.do_send(Queued(msg, place));
    }

    /// The queue's current sequence number (for [`CoordinatorMailbox::park`]); refused when the
    /// coordinator is full.
    pub async fn observe(&self, queue: Arc<str>) -> Result<u64, WorkError> {
        let place = self.waiting.hold(1)?;
        let (reply, seq) = oneshot::channel();
        self.send(Counted::Observe(Observe { queue, reply }), place);
        seq.await.map_err(|_| coordinator_gone())
    }

    /// Parks until the queue's number differs from `seen` (at once if it already does): the
    /// returned wake-up fires then. A queue-wide pop of one queue names its group (`turn_of`),
    /// and new messages then wake it only in its group's turn, which its wake-up carries.
    /// Refused when the coordinator is full.
    pub fn park(&self, queue: Arc<str>, turn_of: Option<Arc<str>>, seen: u64) -> Result<WakeUp, WorkError> {
        let place = self.waiting.hold(1)?;
        let (wake, woken) = oneshot::channel();
        let turn =
            turn_of.clone().map(|group| Turn { addr: Some(self.addr.clone()), queue: Arc::clone(&queue), group });
        self.send(Counted::Park(Park { queue, seen, waiter: Waiter { turn_of, wake } }), place);
        Ok(WakeUp { woken, turn })
    }

    /// Hands the group's turn on the queue to its next parked pop (see [`PassTurn`]); never
    /// refused, since a turn lost would leave the group's other pops waiting.
    pub fn pass_turn(&self, queue: Arc<str>, group: Arc<str>) {
        self.addr.do_send(PassTurn { queue, group });
    }

    /// Where a queue-wide pop of the group should look; refused when the coordinator is full.
    pub async fn plan(&self, queue_id: i64, group: Arc<str>, limit: usize) -> Result<PopPlan, WorkError> {
        let place = self.waiting.hold(1)?;
        let (reply, plan) = oneshot::channel();
        self.send(Counted::PlanPop(PlanPop { queue_id, group, limit, reply }), place);
        plan.await.map_err(|_| coordinator_gone())
    }

    /// Reports a full scan's findings; dropped when the coordinator is full.
    pub fn scanned(&self, report: ScanDone) {
        if let Some(place) = self.waiting.try_hold(1) {
            self.send(Counted::ScanDone(report), place);
        }
    }

    /// Reports what a check of candidates found; dropped when the coordinator is full.
    pub fn checked(&self, report: Checked) {
        if let Some(place) = self.waiting.try_hold(1) {
            self.send(Counted::Checked(report), place);
        }
    }

    /// Reports partitions the group has nothing left on, as of the view the pop that claimed
    /// them planned from; dropped when the coordinator is full.
    pub fn drained(&self, queue_id: i64, group: Arc<str>, stamp: ViewStamp, partitions: Vec<i64>) {
        let ViewStamp { ticket, as_of } = stamp;
        self.checked(Checked { ticket, as_of, queue_id, group, checked: partitions, pending: Vec::new() });
    }

    /// Announces messages available on a partition. When the coordinator is full the
    /// announcement is dropped, and the coordinator starts over once it catches up.
    pub fn announce(&self, available: DataAvailable) {
        match self.waiting.try_hold(1) {
            Some(place) => self.send(Counted::DataAvailable(available), place),
            None => self.missed.store(true, Ordering::SeqCst),
        }
    }

    /// Wakes every parked pop (the broker is shutting down).
    pub fn wake_all(&self) {
        self.addr.do_send(WakeAll);
    }

    /// Wakes the queue's parked pops (its options changed).
    pub fn wake_queue(&self, queue: Arc<str>) {
        self.addr.do_send(WakeQueue(queue));
    }

    /// Forgets a group's views (see [`Forget`]).
    pub fn forget(&self, forget: Forget) {
        self.addr.do_send(forget);
    }

    pub fn listen_lost(&self) {
        self.addr.do_send(ListenLost);
    }

    pub fn listen_restored(&self) {
        self.addr.do_send(ListenRestored);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coordinator(plan_from_views: bool) -> Coordinator {
        let settings = CoordinatorSettings { plan_from_views, view_max_age: Duration::from_secs(30) };
        let mut coordinator = Coordinator::new(settings, Arc::new(Metrics::default()));
        coordinator.listening = true;
        coordinator
    }

    fn view(pending: impl IntoIterator<Item = i64>) -> GroupView {
        GroupView::scanned(Instant::now(), pending, 0)
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

    /// Parks a pop on queue `q` directly, as the mailbox's park does once the number is current.
    fn park(c: &mut Coordinator, turn_of: Option<&str>) -> oneshot::Receiver<()> {
        let (wake, woken) = oneshot::channel();
        c.waiters.entry(Arc::from("q")).or_default().parked.push(Waiter { turn_of: turn_of.map(Arc::from), wake });
        woken
    }

    fn was_woken(woken: &mut oneshot::Receiver<()>) -> bool {
        woken.try_recv().is_ok()
    }

    #[test]
    fn new_messages_wake_one_pop_per_group_and_a_passed_turn_the_next_still_waiting() {
        let mut c = coordinator(true);
        let mut g_first = park(&mut c, Some("g"));
        let g_gone = park(&mut c, Some("g"));
        let mut g_third = park(&mut c, Some("g"));
        let mut h_first = park(&mut c, Some("h"));
        let mut h_second = park(&mut c, Some("h"));
        let mut by_partition = park(&mut c, None);
        drop(g_gone);
        c.wake_for_messages(Arc::from("q"));
        assert!(was_woken(&mut g_first) && was_woken(&mut h_first), "the longest parked of each group");
        assert!(was_woken(&mut by_partition), "a pop outside the turns is always woken");
        assert!(!was_woken(&mut g_third) && !was_woken(&mut h_second), "the others keep waiting");
        c.pass_turn("q", "g");
        assert!(was_woken(&mut g_third), "the turn skips a pop whose request went away");
        assert!(!was_woken(&mut h_second), "a turn passes within its group");
        c.pass_turn("q", "g");
        c.wake(Arc::from("q"));
        assert!(was_woken(&mut h_second), "any other wake-up wakes every parked pop");
        assert!(c.waiters.values().all(|w| w.parked.is_empty()));
    }

    /// A pop looks (seeing a queue's number), then parks unless the number moved: every way of
    /// dropping or missing a queue's entry must still move the number it will be compared with.
    #[test]
    fn a_pop_between_its_look_and_its_park_misses_no_wake_up() {
        let mut c = coordinator(true);
        // The sweep drops an entry with no parked pop; its last bump stays in the epoch.
        let seen = c.seq_of("q");
        c.wake_for_messages(Arc::from("q"));
        c.sweep();
        assert!(c.waiters.is_empty(), "swept");
        assert_ne!(c.seq_of("q"), seen, "a push after the look still wakes the pop that parks");
        // A reset naming no queue (a seek or a group deleted on another broker) reaches queues
        // this broker holds no entry for.
        let seen = c.seq_of("idle");
        c.wake_everyone();
        assert_ne!(c.seq_of("idle"), seen);
    }

    #[test]
    fn a_fresh_view_plus_later_announcements_replace_the_full_scan() {
        let mut c = coordinator(true);
        assert_eq!(c.plan(1, "g", 3), PopPlan::Full { ticket: 0, scan: 1 });
        c.views.entry(1).or_default().insert(group(), view([5]));
        c.announce(1, 9);
        c.announce(2, 7);
        assert_eq!(sorted(c.plan(1, "g", 3)), Some(vec![5, 9]));
    }

    #[test]
    fn a_scan_keeps_what_was_announced_while_it_ran() {
        let mut c = coordinator(true);
        let PopPlan::Full { ticket, scan } = c.plan(1, "g", 3) else { panic!("a full scan") };
        c.announce(1, 8);
        c.announce(2, 9);
        c.store_scan(ScanDone { ticket, scan, group: group(), pending: vec![3] });
        assert_eq!(sorted(c.plan(1, "g", 3)), Some(vec![3, 8]));
        assert!(c.scans.is_empty(), "a reported scan is done with");
    }

    #[test]
    fn a_large_view_is_planned_round_robin() {
        let mut c = coordinator(true);
        c.views.entry(1).or_default().insert(group(), view(1..=7));
        let rounds: Vec<Option<Vec<i64>>> = (0..3).map(|_| sorted(c.plan(1, "g", 3))).collect();
        assert_eq!(rounds, vec![Some(vec![1, 2, 3]), Some(vec![4, 5, 6]), Some(vec![1, 2, 7])]);
    }

    #[test]
    fn a_check_drops_drained_candidates_unless_announced_after_it_was_planned() {
        let mut c = coordinator(true);
        c.views.entry(1).or_default().insert(group(), view([1, 2, 3]));
        let PopPlan::Candidates { ticket, as_of, partitions, .. } = c.plan(1, "g", 3) else { panic!("candidates") };
        c.announce(1, 2);
        c.apply_check(Checked { ticket, as_of, queue_id: 1, group: group(), checked: partitions, pending: vec![3] });
        assert_eq!(sorted(c.plan(1, "g", 3)), Some(vec![2, 3]), "1 drained; 2 pushed again after the check");
    }

    #[test]
    fn a_forget_drops_the_view_and_outdates_scans_in_flight() {
        let mut c = coordinator(true);
        let PopPlan::Full { ticket, scan } = c.plan(1, "g", 3) else { panic!("a full scan") };
        c.forget_views(1, "g");
        c.store_scan(ScanDone { ticket, scan, group: group(), pending: vec![] });
        assert_eq!(sorted(c.plan(1, "g", 3)), None, "a scan planned before the forget is not stored");
        c.views.entry(1).or_default().insert(group(), view([]));
        c.forget_views(0, "g");
        assert_eq!(sorted(c.plan(1, "g", 3)), None, "forgetting every queue of the group");
    }

    #[test]
    fn without_a_listen_connection_every_pop_scans() {
        let mut c = coordinator(true);
        c.views.entry(1).or_default().insert(group(), view([]));
        c.listening = false;
        assert_eq!(sorted(c.plan(1, "g", 3)), None);
    }

    #[test]
    fn without_views_only_an_empty_scan_with_no_push_since_is_trusted() {
        let mut c = coordinator(false);
        c.views.entry(1).or_default().insert(group(), view([]));
        assert_eq!(sorted(c.plan(1, "g", 3)), Some(vec![]));
        c.announce(1, 4);
        assert_eq!(sorted(c.plan(1, "g", 3)), None, "a push since the scan");
    }

    #[test]
    fn a_scan_that_never_reports_is_swept() {
        let mut c = coordinator(true);
        let PopPlan::Full { scan, .. } = c.plan(1, "g", 3) else { panic!("a full scan") };
        c.sweep();
        assert!(c.scans.contains_key(&scan), "still under way");
        let long_ago = Instant::now().checked_sub(Duration::from_secs(60)).expect("a minute of uptime");
        c.scans.get_mut(&scan).expect("the scan").planned_at = long_ago;
        c.sweep();
        assert!(c.scans.is_empty());
    }

    #[actix_rt::test]
    async fn past_its_bound_the_mailbox_refuses_pops_and_drops_announcements_then_starts_over() {
        let metrics = Metrics::new(10);
        let mailbox = CoordinatorMailbox::start(coordinator(true), 2, &metrics);
        let queue: Arc<str> = Arc::from("q");
        let seen = mailbox.observe(Arc::clone(&queue)).await.expect("room");
        // The coordinator handles nothing until the test awaits: two messages fill its mailbox.
        let mut parked = mailbox.park(Arc::clone(&queue), None, seen).expect("room");
        let _other = mailbox.park(Arc::from("other"), None, 0).expect("room");
        assert!(matches!(mailbox.park(Arc::clone(&queue), None, seen), Err(WorkError::Overloaded(_))));
        // A push to the queue announced now finds no room: the pop parked with the number it saw
        // before it must still be woken.
        mailbox.announce(DataAvailable { queue: Arc::clone(&queue), queue_id: 1, partition_id: 7 });
        let woken = tokio::time::timeout(Duration::from_secs(5), &mut parked).await;
        assert!(matches!(woken, Ok(Ok(None))), "the parked pop was woken by the coordinator starting over");
        assert_eq!(metrics.overload_refusals.with_label_values(&["coordinator"]).get(), 1, "only the park was refused");
        mailbox.park(queue, None, seen).expect("room again once the coordinator caught up");
    }

    #[actix_rt::test]
    async fn a_pop_gone_as_its_wake_up_came_hands_the_turn_on_and_one_gone_before_hands_nothing() {
        let mailbox = CoordinatorMailbox::start(coordinator(true), 16, &Metrics::new(10));
        let queue: Arc<str> = Arc::from("q");
        let seen = mailbox.observe(Arc::clone(&queue)).await.expect("room");
        let park = || mailbox.park(Arc::clone(&queue), Some(group()), seen).expect("room");
        let (gone_before, mut gone_as_woken, mut third) = (park(), park(), park());
        // The coordinator handles its messages in order: once it answers, it has handled the rest.
        let handled = || mailbox.observe(Arc::clone(&queue));
        drop(gone_before);
        handled().await.expect("room");
        assert!(gone_as_woken.woken.try_recv().is_err() && third.woken.try_recv().is_err(), "no turn to hand on");
        mailbox.announce(DataAvailable { queue: Arc::clone(&queue), queue_id: 1, partition_id: 7 });
        handled().await.expect("room");
        assert!(third.woken.try_recv().is_err(), "one pop of the group takes the turn");
        drop(gone_as_woken);
        let woken = tokio::time::timeout(Duration::from_secs(5), &mut third).await;
        let Ok(Ok(Some(turn))) = woken else { panic!("the turn the gone pop never read came to the next pop") };
        turn.settle();
    }
}
