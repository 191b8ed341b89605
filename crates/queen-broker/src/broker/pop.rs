//! Pop: find partitions with messages for the group, claim them under one lease, read the
//! claimed spans from their segments, and, for a long poll, park until a push or a released
//! lease may have made messages available, or until a pending one becomes visible. At most
//! `limits.parked_long_polls` pops are parked at once, and `limits.long_polls_per_client` of one
//! client address: one that would park past either is refused.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use deadpool_postgres::Object;
use queen_store::StoreError;
use queen_store::cursors::{self, ClaimRequest, Claimed, CursorSeed, Expiry, Scope, Visibility};
use queen_store::log::{Span, StoredSegment};
use queen_store::queues::{self, Queue};
use queen_store::segment_cache::ReadEnd;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::Broker;
use super::BrokerError;
use super::deliveries::ClaimedToEnd;
use crate::actors::coordinator::{Checked, PopPlan, ScanDone, Turn, ViewStamp};
use crate::connection::ClientConnection;
use crate::metrics::GaugeHeld;
use crate::pressure::{ClientHeld, Held, Refused};

/// Where a pop takes messages from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PopSource {
    /// One queue; with `partition` (the partition route), only that partition.
    Queue { queue: String, partition: Option<String> },
    /// Every queue of a namespace and/or task (at least one of them set), the higher `priority`
    /// first, queues of equal priority taking turns.
    Namespace { namespace: Option<String>, task: Option<String> },
}

/// A validated pop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PopRequest {
    pub source: PopSource,
    pub group: String,
    /// Most messages, across every claimed partition.
    pub batch: u32,
    /// Most partitions one pop may claim.
    pub max_partitions: u32,
    pub auto_ack: bool,
    pub wait: bool,
    pub timeout: Duration,
    pub lease_seconds: Option<i32>,
    /// Where the group starts on partitions it has never read.
    pub seed: CursorSeed,
    /// The group asks to be served only the newest message of each partition (stored at its
    /// registration on a queue; the stored choice wins).
    pub conflation: bool,
    /// The client's address, whose parked long polls are bounded by `limits.long_polls_per_client`
    /// (not counted when unknown).
    pub client: Option<IpAddr>,
    /// The connection the pop came on: a long poll whose client closed it ends, claiming nothing,
    /// and what any pop claimed after its client closed it is given back.
    pub connection: Option<ClientConnection>,
}

/// One message handed to a consumer.
#[derive(Debug)]
pub struct DeliveredMessage {
    pub message_id: Uuid,
    /// Shared with this broker's record of the delivery, which resolves its ack.
    pub transaction_id: Arc<str>,
    pub trace_id: Option<Uuid>,
    pub producer: Option<String>,
    pub queue: Arc<str>,
    pub partition_id: i64,
    pub partition: Arc<str>,
    pub data: Box<RawValue>,
    pub created_at: DateTime<Utc>,
    pub offset: i64,
    pub delivery_attempt: i32,
}

/// What a pop hands out: nothing, or messages of one or more partitions (of one or more queues)
/// under one lease.
#[derive(Debug, Default)]
pub struct Delivery {
    pub lease_id: Option<Uuid>,
    pub partitions_claimed: usize,
    pub messages: Vec<DeliveredMessage>,
    /// The segments the messages were read from: a framed answer ships them as stored where
    /// the delivery covers them.
    pub segments: Vec<Arc<StoredSegment>>,
    /// Nothing, because pop maintenance is on.
    pub paused: bool,
    /// The pop asked for conflation, and the group is registered without it on a queue it
    /// popped: it is served as registered.
    pub conflation_conflict: bool,
}

enum Attempt {
    /// `passed_over`: partitions the group could have been served from now were left unclaimed
    /// (the pop's limits, or another pop holding them).
    Taken { taken: Taken, passed_over: bool },
    /// Nothing now; `retry_at` is the soonest a pending partition can be served: when a lease
    /// held by another consumer of the group expires, or a message becomes visible. `raced`:
    /// partitions that looked free were taken, or held, by another claim when this one came.
    Empty { retry_at: Option<DateTime<Utc>>, raced: bool },
}

/// What is left of a pop's `batch`, `partitions` and `pop.max_answer_bytes` as it goes from
/// queue to queue.
#[derive(Debug, Clone, Copy)]
struct Budget {
    messages: u32,
    partitions: u32,
    bytes: usize,
}

/// How long after such a time a parked pop looks again, so that it has passed when it does.
const AFTER_EXPIRY: Duration = Duration::from_millis(20);

/// How often a parked namespace pop looks for queues created in its namespace since it parked
/// (their pushes wake only pops parked on them).
const NAMESPACE_RESCAN: Duration = Duration::from_secs(1);

/// How often a parked pop looks again while the broker's LISTEN connection is lost.
const DEAF_RESCAN: Duration = Duration::from_secs(1);

/// How soon a pop that lost partitions to another claim looks again, doubling at each such look
/// up to [`DEAF_RESCAN`]. The other claim may be a pop of another broker, whose lease or leftover
/// partitions nothing here announces: looking again finds when that lease runs out, or the
/// partitions it left. Doubling bounds the looks where the claim keeps passing over partitions
/// the candidate query calls free (a delay set since the pop read the queue's options).
const FIRST_RACE_RELOOK: Duration = Duration::from_millis(20);

/// Pops once, or for a long poll until messages come or the timeout passes. A parked pop holds
/// no database connection.
pub async fn pop(broker: &Broker, request: &PopRequest) -> Result<Delivery, BrokerError> {
    let deadline = Instant::now() + request.timeout;
    // Every answer to a pop that asked for conflation says whether the group conflates, the
    // empty ones included (the client stops on an answer without it): known once the group is
    // registered on the queues the pop looks at (before that, as far as this broker has seen).
    let mut conflation_conflict = match &request.source {
        PopSource::Queue { queue, .. } => {
            request.conflation && super::groups::seen_without_conflation(broker, queue, &request.group)
        }
        PopSource::Namespace { .. } => false,
    };
    let empty = |conflation_conflict| Ok(Delivery { conflation_conflict, ..Delivery::default() });
    let paused = |conflation_conflict| Ok(Delivery { paused: true, conflation_conflict, ..Delivery::default() });
    // This pop's place among the parked ones, taken when it first waits.
    let mut parked = None;
    // Counted in `queen_long_poll_waiters` from when it first waits for messages to its end.
    let mut waiting = None;
    let mut race_relook = FIRST_RACE_RELOOK;
    // A queue-wide pop of one queue waits for new messages in its group's turn on the queue.
    let turn_key: Option<(Arc<str>, Arc<str>)> = match &request.source {
        PopSource::Queue { queue, partition: None } => {
            Some((Arc::from(queue.as_str()), Arc::from(request.group.as_str())))
        }
        PopSource::Queue { partition: Some(_), .. } | PopSource::Namespace { .. } => None,
    };
    // The group's turn, while this pop holds it.
    let mut turn: Option<Turn> = None;
    if held_by_pop_maintenance(broker, request, deadline, &mut parked).await? {
        return paused(conflation_conflict);
    }
    // A dense stream's pops start in the group's slots (`pop_spacing`), waiting as parked pops do.
    if let (true, Some(group)) = (request.wait, &turn_key)
        && let Some(slot) = broker.pop_spacing.start_at(group)
    {
        broker.metrics.pops_spaced.inc();
        if parked.is_none() {
            parked = Some(Parked::take(broker, request)?);
        }
        waiting.get_or_insert_with(|| GaugeHeld::count(&broker.metrics.long_poll_waiters));
        tokio::select! {
            () = tokio::time::sleep_until(slot.min(deadline.into())) => {}
            () = ClientConnection::closed(request.connection) => return empty(conflation_conflict),
        }
    }
    let subscribed_at = Utc::now();
    let mut queue_conflates = false;
    if let PopSource::Queue { queue, .. } = &request.source {
        let (group, seed) = (&request.group, request.seed);
        let conflates = super::groups::register_on_first_pop(broker, &[queue], group, seed, request.conflation).await?;
        queue_conflates = conflates.contains(&true);
        conflation_conflict = request.conflation && !queue_conflates;
    }
    loop {
        // Nobody would receive what a long poll whose client left claimed: it would stay leased.
        let client_left = request.wait && request.connection.is_some_and(ClientConnection::is_closed);
        if broker.is_shutting_down() || client_left {
            return empty(conflation_conflict);
        }
        if held_by_pop_maintenance(broker, request, deadline, &mut parked).await? {
            return paused(conflation_conflict);
        }
        // One lease for whatever this look claims, on every queue; a new one at each look, so
        // that a claim given back in the background (`Unhanded`) never meets a later claim of
        // this same pop under its id.
        let lease_id = Uuid::now_v7();
        // A queue pop's name is observed before its queue is looked up: the push that creates
        // the queue right after a lookup that found none still wakes it.
        let mut seen = Vec::new();
        if let (true, PopSource::Queue { queue, .. }) = (request.wait, &request.source) {
            let name: Arc<str> = Arc::from(queue.as_str());
            seen.push((Arc::clone(&name), broker.coordinator.observe(name).await?));
        }
        let (names, queues) = sources(broker, request, queue_conflates).await?;
        if request.wait && seen.is_empty() {
            for name in &names {
                seen.push((Arc::clone(name), broker.coordinator.observe(Arc::clone(name)).await?));
            }
        }
        conflation_conflict = request.conflation && queues.iter().any(|(_, conflates)| !conflates);
        let mut taken: Vec<Taken> = Vec::new();
        let mut retry_at = None;
        let mut raced = false;
        let mut left_work = false;
        for (queue, conflates) in &queues {
            let budget = Budget {
                messages: request.batch - taken.iter().map(|t| t.messages.len() as u32).sum::<u32>(),
                partitions: request.max_partitions - taken.iter().map(|t| t.claims.len() as u32).sum::<u32>(),
                bytes: broker.config.pop.max_answer_bytes.saturating_sub(taken.iter().map(Taken::bytes).sum()),
            };
            if budget.messages == 0 || budget.partitions == 0 || budget.bytes == 0 {
                break;
            }
            match pop_queue(broker, request, queue, *conflates, budget, lease_id, subscribed_at).await {
                Ok(Attempt::Taken { taken: more, passed_over }) => {
                    left_work |= passed_over;
                    taken.push(more);
                }
                Ok(Attempt::Empty { retry_at: at, raced: lost }) => {
                    retry_at = retry_at.into_iter().chain(at).min();
                    raced |= lost;
                }
                // What earlier queues of a namespace pop claimed is delivered rather than left
                // leased to nobody.
                Err(e) if taken.is_empty() => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, queue = %queue.name, "a namespace pop delivers what it claimed before");
                    break;
                }
            }
        }
        // The client may have left while the pop looked: a long poll's after the check at the top
        // of the loop, any pop's when it gave up waiting for the answer (its own timeout). What
        // was claimed for it, on every queue, goes back at once rather than stay leased to nobody
        // or, auto-acked, committed for nobody.
        let claimed_for_nobody = !taken.is_empty() && request.connection.is_some_and(ClientConnection::is_closed);
        if claimed_for_nobody {
            let claims: Vec<cursors::Claim> = taken.iter().flat_map(|t| t.claims.iter().cloned()).collect();
            let unhanded = Unhanded::of(request, lease_id, &claims);
            match broker.pool.get().await {
                Ok(client) => unhanded.take_back(broker, client).await,
                Err(e) => {
                    tracing::warn!(error = %e, "could not take back the claims of a pop whose client left; trying again");
                    unhanded.take_back_later(broker);
                }
            }
        }
        // The pop has looked: a turn it held is done with, and work it left is for the group's
        // next parked pop.
        if let Some(held) = turn.take() {
            held.settle();
        }
        if let (true, Some((queue, group))) = (left_work, &turn_key) {
            broker.coordinator.pass_turn(Arc::clone(queue), Arc::clone(group));
        }
        if claimed_for_nobody {
            return empty(conflation_conflict);
        }
        if !taken.is_empty() || !request.wait {
            let mut delivery = Delivery { conflation_conflict, ..Delivery::default() };
            for taken in taken {
                hand_out(broker, request, lease_id, taken, &mut delivery);
            }
            if let (true, Some(group)) = (request.wait, &turn_key) {
                let full = delivery.messages.len() >= request.batch as usize || left_work;
                broker.pop_spacing.delivered(group, delivery.messages.len() as u32, request.batch, full);
            }
            return Ok(delivery);
        }
        let now = Instant::now();
        if now >= deadline {
            return empty(conflation_conflict);
        }
        let mut wake_at = retry_at
            .map(|at| now + (at - Utc::now()).to_std().unwrap_or_default() + AFTER_EXPIRY)
            .map_or(deadline, |at| at.min(deadline));
        if matches!(request.source, PopSource::Namespace { .. }) {
            wake_at = wake_at.min(now + NAMESPACE_RESCAN);
        }
        // Without LISTEN, a push through another broker wakes nobody here.
        if !broker.hears_fleet.load(Ordering::Relaxed) {
            wake_at = wake_at.min(now + DEAF_RESCAN);
        }
        if raced {
            wake_at = wake_at.min(now + race_relook);
            race_relook = (race_relook * 2).min(DEAF_RESCAN);
        }
        if parked.is_none() {
            parked = Some(Parked::take(broker, request)?);
        }
        let mut woken = Vec::with_capacity(seen.len());
        for (queue, seen) in seen {
            woken.push(broker.coordinator.park(queue, turn_key.as_ref().map(|(_, group)| Arc::clone(group)), seen)?);
        }
        // Counted once its parks are in the coordinator's mailbox: whatever wakes queues after
        // the gauge shows it (a push's notice) reaches the coordinator behind them.
        waiting.get_or_insert_with(|| GaugeHeld::count(&broker.metrics.long_poll_waiters));
        // A shutdown that began before the pop parked may have woken the parked pops already.
        if broker.is_shutting_down() {
            return empty(conflation_conflict);
        }
        // Woken (by any of the queues), or the time came: either way, look again (or give up past
        // the deadline). A client that leaves meanwhile gives its places back at once, and hands
        // on a turn its wake-up brought (`WakeUp`).
        let woken_or_due = async {
            if woken.is_empty() {
                tokio::time::sleep_until(wake_at.into()).await;
                None
            } else {
                match tokio::time::timeout_at(wake_at.into(), futures::future::select_all(woken)).await {
                    Ok((Ok(turn), _, _)) => turn,
                    _ => None,
                }
            }
        };
        tokio::select! {
            held = woken_or_due => turn = held,
            () = ClientConnection::closed(request.connection) => return empty(conflation_conflict),
        }
    }
}

/// The queues a pop looks at, in serving order, each with whether the group conflates there, and
/// the names it parks on: the queue of a queue pop (by name even before it exists: its first push
/// wakes the pop; `queue_conflates` as registered), or the queues of a namespace pop, registering
/// the group on each the first time.
async fn sources(
    broker: &Broker,
    request: &PopRequest,
    queue_conflates: bool,
) -> Result<(Vec<Arc<str>>, Vec<(Arc<Queue>, bool)>), BrokerError> {
    match &request.source {
        PopSource::Queue { queue, .. } => {
            let found = broker.names.queue(&broker.pool, queue).await?;
            Ok((vec![Arc::from(queue.as_str())], found.into_iter().map(|q| (q, queue_conflates)).collect()))
        }
        PopSource::Namespace { namespace, task } => {
            let client = broker.pool.get().await.map_err(StoreError::from)?;
            let queues = queues::queues_of(&client, namespace.as_deref(), task.as_deref()).await?;
            drop(client);
            let names: Vec<&str> = queues.iter().map(|queue| queue.name.as_str()).collect();
            let (group, seed) = (&request.group, request.seed);
            let conflates =
                super::groups::register_on_first_pop(broker, &names, group, seed, request.conflation).await?;
            let mut queues: Vec<(Queue, bool)> = queues.into_iter().zip(conflates).collect();
            // Queues of one priority take turns at being first.
            let turn = broker.namespace_pops.fetch_add(1, Ordering::Relaxed) as usize;
            for tier in queues.chunk_by_mut(|(a, _), (b, _)| a.options.priority == b.options.priority) {
                let len = tier.len();
                tier.rotate_left(turn % len);
            }
            let names = queues.iter().map(|(q, _)| Arc::from(q.name.as_str())).collect();
            Ok((names, queues.into_iter().map(|(queue, conflates)| (Arc::new(queue), conflates)).collect()))
        }
    }
}

/// Whether pop maintenance keeps the pop from popping: a long poll waits for it to end (parked,
/// taking its place among the parked pops if it has none yet), at most until its deadline;
/// without a database call either way.
async fn held_by_pop_maintenance(
    broker: &Broker,
    request: &PopRequest,
    deadline: Instant,
    parked: &mut Option<Parked>,
) -> Result<bool, BrokerError> {
    let maintenance = &broker.maintenance;
    if !maintenance.pops_paused() {
        return Ok(false);
    }
    if !request.wait {
        return Ok(true);
    }
    if parked.is_none() {
        *parked = Some(Parked::take(broker, request)?);
    }
    Ok(!maintenance.pops_resume_by(deadline).await)
}

/// A waiting pop's places among the parked ones: its client's and the broker's, given back when
/// the pop ends, however it ends (answered, timed out, failed, or dropped with its connection).
struct Parked {
    _client: ClientHeld,
    _broker: Held,
}

impl Parked {
    /// The client's place first: a client past its own bound is refused with a 429 and takes
    /// none of the broker's.
    fn take(broker: &Broker, request: &PopRequest) -> Result<Parked, Refused> {
        let client = broker.client_long_polls.hold(request.client)?;
        Ok(Parked { _client: client, _broker: broker.long_polls.hold(1)? })
    }
}

/// Pops once from one queue, within the budget, claiming under `lease_id`; only each partition's
/// newest message when the group `conflates` on the queue.
async fn pop_queue(
    broker: &Broker,
    request: &PopRequest,
    queue: &Queue,
    conflates: bool,
    budget: Budget,
    lease_id: Uuid,
    subscribed_at: DateTime<Utc>,
) -> Result<Attempt, BrokerError> {
    let names = &broker.names;
    let queue_id = queue.id;
    let group: Arc<str> = Arc::from(request.group.as_str());
    let options = &queue.options;
    let visibility = match options.delayed_processing_seconds > 0 || options.window_buffer_seconds > 0 {
        true => Visibility::Rules,
        false => Visibility::Immediate,
    };
    // Free partitions to consider claiming: a few more than the pop may take, in case some are
    // claimed by a competing pop in the meantime.
    let claimable = usize::try_from(budget.partitions.max(4) * 4).unwrap_or(usize::MAX);
    let only_partition = match &request.source {
        PopSource::Queue { partition, .. } => partition.as_deref(),
        PopSource::Namespace { .. } => None,
    };
    // Which partitions to look at: the one named, or the coordinator's plan for the queue.
    let Planned { mut client, candidates, stamp } = match only_partition {
        Some(name) => {
            let Some(partition_id) = names.partition(&broker.pool, queue_id, name).await? else {
                return Ok(Attempt::Empty { retry_at: None, raced: false });
            };
            let client = broker.pool.get().await.map_err(StoreError::from)?;
            let scope = Scope::Only(&[partition_id]);
            let candidates = cursors::candidates(&client, queue_id, scope, &request.group, visibility).await?;
            Planned { client, candidates, stamp: None }
        }
        None => match planned_candidates(broker, queue_id, &group, visibility, claimable).await? {
            Some(planned) => planned,
            None => return Ok(Attempt::Empty { retry_at: None, raced: false }),
        },
    };
    let retry_at = candidates.iter().filter_map(|c| c.not_before).min();
    // Partitions the group can be served now, longest-unserved first.
    let free: Vec<&cursors::Candidate> = candidates.iter().filter(|c| c.not_before.is_none()).take(claimable).collect();
    if free.is_empty() {
        return Ok(Attempt::Empty { retry_at, raced: false });
    }
    let uncursored: Vec<i64> = free.iter().filter(|c| !c.has_cursor).map(|c| c.partition_id).collect();
    if !uncursored.is_empty() {
        // Without its registration (deleted with its queue, or by the group's deletion, while this
        // pop went on), a `new` group starts where this pop began: its queue may have been
        // created again by a push the group is waiting for.
        let fallback = match request.seed {
            CursorSeed::End => CursorSeed::From(subscribed_at),
            seed => seed,
        };
        let ensure = async |c: &mut Object| cursors::ensure_cursors(&*c, &request.group, &uncursored, fallback).await;
        let (answered, ensured) = broker.continue_within(client, "a cursor's creation", ensure).await?;
        client = answered;
        ensured?;
    }

    let partition_ids: Vec<i64> = free.iter().map(|c| c.partition_id).collect();
    if queue.options.expiry_seconds().is_some() {
        let expire = async |c: &mut Object| expire_old_messages(broker, c, queue, &request.group, &partition_ids).await;
        let (answered, expired) = broker.continue_within(client, "an expiry", expire).await?;
        client = answered;
        expired?;
    }
    let max_partitions = i64::from(if only_partition.is_some() { 1 } else { budget.partitions });
    let claim_request = ClaimRequest {
        group: &request.group,
        partition_ids: &partition_ids,
        batch: i64::from(budget.messages),
        max_partitions,
        // A cursor locked past the claim's partitions would not be taken.
        lock_at_most: enough_to_fill(&free, budget.messages, conflates, visibility).min(max_partitions),
        lease_id,
        lease_seconds: request.lease_seconds,
        auto_ack: request.auto_ack,
        conflation: conflates,
        visibility,
    };
    // A claim that takes a lease commits asynchronously and never waits for its commit; an
    // auto-acked one waits, and is bounded.
    let Claimed { mut claims, exhausted } = if request.auto_ack {
        // If it still commits, it commits its messages undelivered, as a lost answer would.
        let claim = async |c: &mut Object| cursors::claim(&*c, &claim_request).await;
        let (answered, claimed) = broker.continue_within(client, "an auto-acked claim", claim).await?;
        client = answered;
        claimed?
    } else {
        match cursors::claim(&client, &claim_request).await {
            Ok(claimed) => claimed,
            // The connection went while the claim ran: it may have committed, leasing partitions
            // to nobody until the lease ran out (a failed delivery of their heads). Given back,
            // guarded by this look's lease, which nothing else holds.
            Err(e @ (StoreError::Unavailable(_) | StoreError::Interrupted { .. })) => {
                Unhanded::Leases { lease_id, given_back: partition_ids.clone(), cut: Vec::new() }
                    .take_back_later(broker);
                return Err(e.into());
            }
            Err(e) => return Err(e.into()),
        }
    };
    if !exhausted.is_empty() {
        // On a connection of its own: what is claimed already is read on this one whatever
        // comes of giving the heads up.
        let serve = async |c: &mut Object| {
            serve_past_exhausted_heads(broker, c, queue, &claim_request, &claims, &exhausted).await
        };
        let past = match broker.write_within("giving up exhausted heads", serve).await {
            Ok((_, past)) => past,
            Err(e) => Err(e.into()),
        };
        match past {
            Ok(more) => claims.extend(more),
            Err(e) if claims.is_empty() => return Err(e),
            // What is claimed already is delivered rather than left leased to nobody (its lease
            // running out would count against its messages); a later pop gives the heads up.
            Err(e) => tracing::warn!(error = %e, queue = %queue.name, "exhausted heads left for a later pop"),
        }
    }
    if claims.is_empty() {
        // The candidates called these partitions free, and the claim took none: another claim
        // had them (`raced`), or the cursors just made start later than the query assumed.
        // Such a cursor (a `new` or timestamp subscription) is asked when its partition can be
        // served, so a long poll waiting on a delay wakes in time. Partitions without a cursor
        // come first, so a new group on a queue of many partitions may have spent this pop on
        // partitions where it starts at the end: a long poll looks again at once, at the ones
        // after them.
        let retry_at = if uncursored.is_empty() {
            retry_at
        } else {
            let scope = Scope::Only(&uncursored);
            let seeded = cursors::candidates(&client, queue_id, scope, &request.group, visibility).await?;
            Some(seeded.iter().filter_map(|c| c.not_before).chain(retry_at).min().unwrap_or_else(Utc::now))
        };
        return Ok(Attempt::Empty { retry_at, raced: true });
    }
    let names_by_id: HashMap<i64, Arc<str>> =
        free.iter().map(|c| (c.partition_id, Arc::from(c.partition.as_str()))).collect();
    let read = read_claimed(broker, &client, queue, &names_by_id, &claims, budget.bytes).await;
    let Read { mut messages, mut segments, handed_lasts } = match read {
        Ok(read) => read,
        Err(e) => {
            // Handed to nobody: taken back now rather than left to a lease running out (a failed
            // delivery of the messages) or committed (their loss).
            Unhanded::of(request, lease_id, &claims).take_back(broker, client).await;
            return Err(e);
        }
    };
    // What the pop does not hand out of its claims is taken back before it answers: the tails
    // its answer's byte bound left, and whole claims whose spans a retention pass removed
    // between the claim and the read (the claim reads the watermark without locking the
    // partition). A lease left whole would keep the group off the rest of its partition until it
    // ran out, and count as a failed delivery of messages nobody was given; an auto-acked cursor
    // left where the claim put it would lose them for the group.
    let mut passed_over = free.len() > claims.len();
    let mut tails = Vec::new();
    let mut handed = Vec::with_capacity(claims.len());
    for (mut claim, handed_last) in claims.into_iter().zip(handed_lasts) {
        if handed_last == Some(claim.last) {
            handed.push(claim);
            continue;
        }
        tails.push((claim, handed_last));
        if let Some(last) = handed_last {
            claim.last = last;
            handed.push(claim);
            passed_over = true;
        }
    }
    if tails.is_empty() {
        drop(client);
    } else if request.auto_ack {
        // An auto-acked cursor moved on by another pop of the group since the claim cannot go
        // back: what the claim committed there is handed out after all, as it was before the
        // bound (the messages would otherwise be lost for the group).
        let spans = Unhanded::auto_acked_tails(&tails);
        let undo = async |c: &mut Object| cursors::undo_auto_acked_claims(&*c, &request.group, &spans).await;
        let undone = broker
            .continue_within(client, "moving back an auto-acked pop's cursors", undo)
            .await
            .and_then(|(answered, undone)| undone.map(|moved_back| (answered, moved_back)));
        // The claims whose cursors stay where the claim put them, with a connection to read on.
        let (kept, client) = match undone {
            Ok((client, moved_back)) => {
                (tails.into_iter().filter(|(c, _)| !moved_back.contains(&c.partition_id)).collect(), Some(client))
            }
            // Refused by PostgreSQL (a lock timeout behind an ack, read-only), nothing moved
            // back: as for cursors that moved on.
            Err(e @ (StoreError::Db(_) | StoreError::WritesRefused { .. })) => {
                tracing::warn!(error = %e, queue = %queue.name, "could not move back an auto-acked pop's cursors; handing out the rest");
                (tails, None)
            }
            // Whether they moved back is unknown: the guarded move is tried again until answered.
            Err(e) => {
                tracing::warn!(error = %e, queue = %queue.name, "could not move back an auto-acked pop's cursors; trying again");
                Unhanded::tails(request, lease_id, &tails).take_back_later(broker);
                (Vec::new(), None)
            }
        };
        if !kept.is_empty() {
            let client = match client {
                Some(client) => Ok(client),
                None => broker.pool.get().await,
            };
            match client {
                Ok(client) => {
                    let rest = hand_out_the_rest(broker, client, queue, &names_by_id, request, &kept).await;
                    messages.extend(rest.messages);
                    segments.extend(rest.segments);
                    handed = whole_again(handed, &kept, &rest.handed_lasts);
                    // Each partition's messages together, in the claims' order.
                    let place: HashMap<i64, usize> =
                        handed.iter().enumerate().map(|(i, c)| (c.partition_id, i)).collect();
                    messages.sort_by_key(|m| (place.get(&m.partition_id).copied(), m.offset));
                }
                Err(e) => {
                    tracing::warn!(error = %e, queue = %queue.name, "moving back an auto-acked pop's cursors later");
                    Unhanded::tails(request, lease_id, &kept).take_back_later(broker);
                }
            }
        }
    } else {
        Unhanded::tails(request, lease_id, &tails).take_back(broker, client).await;
    }
    if handed.is_empty() {
        return Ok(Attempt::Empty { retry_at: Some(Utc::now()), raced: false });
    }
    let taken =
        Taken { queue: Arc::from(queue.name.as_str()), queue_id, group, claims: handed, stamp, messages, segments };
    Ok(Attempt::Taken { taken, passed_over })
}

/// Reads what follows `handed_last` in each auto-acked claim whose cursor could not go back,
/// whatever its size: the claim committed it, so it is handed out or lost. A read that fails
/// loses it, and says so.
async fn hand_out_the_rest(
    broker: &Broker,
    client: Object,
    queue: &Queue,
    names_by_id: &HashMap<i64, Arc<str>>,
    request: &PopRequest,
    kept: &[(cursors::Claim, Option<i64>)],
) -> Read {
    let rest: Vec<cursors::Claim> = kept
        .iter()
        .map(|(c, handed_last)| cursors::Claim { first: handed_last.map_or(c.first, |l| l + 1), ..*c })
        .collect();
    match read_claimed(broker, &client, queue, names_by_id, &rest, usize::MAX).await {
        Ok(read) => read,
        Err(e) => {
            let spans = Unhanded::auto_acked_tails(kept);
            tracing::error!(error = %e, queue = %queue.name, group = %request.group, ?spans,
                            "auto-acked messages committed and not handed out: lost for the group");
            Read { messages: Vec::new(), segments: Vec::new(), handed_lasts: vec![None; rest.len()] }
        }
    }
}

/// `handed` with each of the `kept` claims as far as the rest of it was read: a claim cut short
/// is lengthened, one of which nothing was handed out is added.
fn whole_again(
    mut handed: Vec<cursors::Claim>,
    kept: &[(cursors::Claim, Option<i64>)],
    rest_lasts: &[Option<i64>],
) -> Vec<cursors::Claim> {
    for ((claim, handed_last), rest_last) in kept.iter().zip(rest_lasts) {
        let Some(last) = rest_last.or(*handed_last) else { continue };
        match handed.iter_mut().find(|c| c.partition_id == claim.partition_id) {
            Some(cut) => cut.last = last,
            None => handed.push(cursors::Claim { last, ..*claim }),
        }
    }
    handed
}

/// What a pop claimed on one queue and read, to hand out once it has looked at every queue.
struct Taken {
    queue: Arc<str>,
    queue_id: i64,
    group: Arc<str>,
    claims: Vec<cursors::Claim>,
    /// The view the pop planned from, for a queue-wide pop.
    stamp: Option<ViewStamp>,
    messages: Vec<DeliveredMessage>,
    segments: Vec<Arc<StoredSegment>>,
}

impl Taken {
    /// The payload bytes of its messages, counted against `pop.max_answer_bytes`.
    fn bytes(&self) -> usize {
        self.messages.iter().map(|m| m.data.get().len()).sum()
    }
}

/// Adds what the pop took on one queue to its `delivery`: remembered for the acks, and counted.
fn hand_out(broker: &Broker, request: &PopRequest, lease_id: Uuid, taken: Taken, delivery: &mut Delivery) {
    let taken_bytes = taken.bytes();
    let Taken { queue, queue_id, group, claims, stamp, messages, segments } = taken;
    // Where the pop took everything a partition had, the group's view can drop it once the
    // cursor is there: at once when the claim committed, else when the ack does.
    let took_all = |claim: &&cursors::Claim| claim.last >= claim.partition_end;
    if !request.auto_ack {
        let claimed: Vec<(i64, Option<Arc<ClaimedToEnd>>)> = claims
            .iter()
            .map(|claim| {
                let end = stamp.filter(|_| took_all(&claim)).map(|stamp| {
                    let group = Arc::clone(&group);
                    Arc::new(ClaimedToEnd { end: claim.partition_end, queue_id, group, stamp })
                });
                (claim.partition_id, end)
            })
            .collect();
        broker.deliveries.record(lease_id, &claimed, &messages);
    } else if let Some(stamp) = stamp {
        let drained: Vec<i64> = claims.iter().filter(took_all).map(|claim| claim.partition_id).collect();
        if !drained.is_empty() {
            broker.coordinator.drained(queue_id, group, stamp, drained);
        }
    }

    let metrics = &broker.metrics;
    metrics.messages_delivered.inc_by(&queue, messages.len() as u64);
    metrics.bytes_delivered.inc_by(&queue, taken_bytes as u64);
    if request.auto_ack {
        // Committed at delivery: acknowledged then, as an ack would have.
        metrics.messages_acked.inc_by(&queue, messages.len() as u64);
    } else {
        metrics.leases_granted.inc_by(claims.len() as u64);
        delivery.lease_id = Some(lease_id);
    }
    metrics.leases_expired.inc_by(claims.iter().filter(|c| c.took_over_expired_lease).count() as u64);
    delivery.partitions_claimed += claims.len();
    delivery.messages.extend(messages);
    delivery.segments.extend(segments);
}

/// How many of `free`, taken in order, the claim locks: as many as have backlogs that fill
/// `messages`. A partition without a cursor counts as full, and a conflating group is served one
/// message per partition. Under a delay or a window a backlog may not be visible yet, so every
/// one may be locked.
fn enough_to_fill(free: &[&cursors::Candidate], messages: u32, conflates: bool, visibility: Visibility) -> i64 {
    let every = free.len() as i64;
    if visibility == Visibility::Rules {
        return every;
    }
    let wanted = i64::from(messages);
    let mut offered = 0;
    let filled_by = free.iter().position(|candidate| {
        let backlog = candidate.backlog.unwrap_or(wanted);
        offered += if conflates { backlog.min(1) } else { backlog };
        offered >= wanted
    });
    filled_by.map_or(every, |last| last as i64 + 1)
}

/// What a pop claimed and did not hand out: all of it when its segments could not be read or
/// its client left; the rest of a claim its answer's byte bound cut, or whose span retention
/// removed.
enum Unhanded {
    /// Leases given back where the pop handed out nothing of their partitions
    /// ([`cursors::give_back_claims`]), and cut to what it handed out elsewhere,
    /// `(partition, handed_last)` ([`cursors::cut_claims`]): they would otherwise stand until they
    /// ran out, and count against messages nobody was given.
    Leases { lease_id: Uuid, given_back: Vec<i64>, cut: Vec<(i64, i64)> },
    /// An `autoAck` claim's cursors, committed at delivery, moved back to before what was not
    /// handed out, `(partition, first, last)` ([`cursors::undo_auto_acked_claims`]): the messages
    /// would otherwise be lost for the group.
    AutoAcked { group: String, spans: Vec<(i64, i64, i64)> },
}

/// How long a take-back that PostgreSQL did not answer, or refused for now, is tried again in the
/// background. Both forms are guarded (a lease still held, a cursor still where the claim left
/// it), so a late one changes nothing that moved on.
const TAKE_BACK_RETRIES_FOR: Duration = Duration::from_secs(300);

impl Unhanded {
    /// The whole of the claims.
    fn of(request: &PopRequest, lease_id: Uuid, claims: &[cursors::Claim]) -> Self {
        let whole: Vec<(cursors::Claim, Option<i64>)> = claims.iter().map(|claim| (*claim, None)).collect();
        Self::tails(request, lease_id, &whole)
    }

    /// What follows `handed_last` in each claim (the whole claim when none).
    fn tails(request: &PopRequest, lease_id: Uuid, tails: &[(cursors::Claim, Option<i64>)]) -> Self {
        if request.auto_ack {
            return Unhanded::AutoAcked { group: request.group.clone(), spans: Self::auto_acked_tails(tails) };
        }
        let (mut given_back, mut cut) = (Vec::new(), Vec::new());
        for (claim, handed_last) in tails {
            match handed_last {
                Some(last) => cut.push((claim.partition_id, *last)),
                None => given_back.push(claim.partition_id),
            }
        }
        Unhanded::Leases { lease_id, given_back, cut }
    }

    /// `(partition, first, last)` of what follows `handed_last` in each claim.
    fn auto_acked_tails(tails: &[(cursors::Claim, Option<i64>)]) -> Vec<(i64, i64, i64)> {
        tails
            .iter()
            .map(|(c, handed_last)| (c.partition_id, handed_last.map_or(c.first, |last| last + 1), c.last))
            .collect()
    }

    async fn take_back_on(&self, client: &deadpool_postgres::Object) -> Result<u64, StoreError> {
        match self {
            Unhanded::Leases { lease_id, given_back, cut } => {
                let mut taken_back = 0;
                if !given_back.is_empty() {
                    taken_back += cursors::give_back_claims(client, *lease_id, given_back).await?;
                }
                if !cut.is_empty() {
                    taken_back += cursors::cut_claims(client, *lease_id, cut).await?;
                }
                Ok(taken_back)
            }
            Unhanded::AutoAcked { group, spans } => {
                Ok(cursors::undo_auto_acked_claims(client, group, spans).await?.len() as u64)
            }
        }
    }

    /// On `client`, or on another when that one was lost (its backend terminated while the pop
    /// read the segments): the claim committed already. Bounded by `database.answer_within`, as
    /// every write of the delivery path. While PostgreSQL does not answer, or refuses for now
    /// (a lock or statement timeout, a deadlock, read-only), it is tried again in the background
    /// (a restart under load would otherwise leave the leases to run out, or an auto-acked group
    /// without messages it never got).
    async fn take_back(self, broker: &Broker, client: deadpool_postgres::Object) {
        let bound = broker.config.database.answer_within();
        let mut result = self.take_back_within(client, bound).await;
        if let Err(StoreError::Unavailable(_)) = result {
            result = match broker.pool.get().await {
                Ok(other) => self.take_back_within(other, bound).await,
                Err(e) => Err(e.into()),
            };
        }
        match result {
            Ok(_) => {}
            Err(e) if for_now(&e) => {
                tracing::warn!(error = %e, "could not take back what a pop claimed and did not hand out; trying again");
                self.take_back_later(broker);
            }
            Err(e) => tracing::warn!(error = %e, "could not take back what a pop claimed and did not hand out"),
        }
    }

    async fn take_back_within(&self, client: deadpool_postgres::Object, bound: Duration) -> Result<u64, StoreError> {
        let work = async |c: &mut deadpool_postgres::Object| self.take_back_on(c).await;
        queen_store::pool::answered_within(client, bound, "taking back a pop's claims", work).await?.1
    }

    /// Tried again in the background, for [`TAKE_BACK_RETRIES_FOR`].
    fn take_back_later(self, broker: &Broker) {
        tokio::spawn(self.keep_taking_back(broker.pool.clone(), broker.config.database.answer_within()));
    }

    async fn keep_taking_back(self, pool: deadpool_postgres::Pool, bound: Duration) {
        let until = Instant::now() + TAKE_BACK_RETRIES_FOR;
        let mut backoff = crate::backoff::Backoff::default();
        while Instant::now() < until {
            backoff.wait().await;
            let result = match pool.get().await {
                Ok(client) => self.take_back_within(client, bound).await,
                Err(e) => Err(e.into()),
            };
            match result {
                Ok(_) => return,
                Err(e) if for_now(&e) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "could not take back what a pop claimed and did not hand out");
                    return;
                }
            }
        }
        tracing::warn!("gave up taking back what a pop claimed and did not hand out");
    }
}

/// Whether a take-back that failed so may succeed later: PostgreSQL away, unanswered, or
/// refusing for now. Both forms are guarded, so trying again after one that took effect unseen
/// changes nothing.
fn for_now(e: &StoreError) -> bool {
    e.is_unavailable() || matches!(e, StoreError::WritesRefused { .. })
}

/// What a pop read of its claims on one queue.
struct Read {
    messages: Vec<DeliveredMessage>,
    /// The segments the messages were read from.
    segments: Vec<Arc<StoredSegment>>,
    /// For each claim, in order, the offset of the last message read of it; `None`: none.
    handed_lasts: Vec<Option<i64>>,
}

/// The claimed messages, read from their segments (through the segment cache), and those
/// segments. Messages are taken in claim order until their payloads hold `bytes` (at least one
/// message); the read decodes segments only as far as that bound, so that what it returns
/// covers each claim from its start up to where it stopped, but for what retention removed.
async fn read_claimed(
    broker: &Broker,
    client: &deadpool_postgres::Object,
    queue: &Queue,
    names_by_id: &HashMap<i64, Arc<str>>,
    claims: &[cursors::Claim],
    bytes: usize,
) -> Result<Read, BrokerError> {
    let spans: Vec<Span> =
        claims.iter().map(|c| Span { partition_id: c.partition_id, first: c.first, last: c.last }).collect();
    let (keys, end) = (broker.cipher.as_deref(), ReadEnd::AtSpanEnd);
    let segments = broker.segments.read_decoding_at_most(client, &spans, keys, end, bytes).await?;
    let queue_name: Arc<str> = Arc::from(queue.name.as_str());
    let claim_of: HashMap<i64, usize> = claims.iter().enumerate().map(|(i, c)| (c.partition_id, i)).collect();
    // Per claim, the offset after the last message read of it.
    let mut next: Vec<i64> = claims.iter().map(|c| c.first).collect();
    let (mut messages, mut taken) = (Vec::new(), 0);
    'segments: for segment in &segments {
        let Some(&index) = claim_of.get(&segment.partition_id) else { continue };
        let claim = &claims[index];
        let partition = names_by_id.get(&segment.partition_id).cloned().unwrap_or_else(|| Arc::from(""));
        for (offset, frame) in segment.frames_in(next[index], claim.last) {
            if taken >= bytes && !messages.is_empty() {
                break 'segments;
            }
            let frame = frame.map_err(|e| corrupt(segment.partition_id, segment.base_offset, e))?;
            let json = String::from_utf8(frame.payload.to_vec())
                .map_err(|_| BrokerError::Internal(format!("message at offset {offset} is not UTF-8 JSON")))?;
            let data = RawValue::from_string(json)
                .map_err(|e| BrokerError::Internal(format!("message at offset {offset} is not JSON: {e}")))?;
            taken += frame.payload.len();
            messages.push(DeliveredMessage {
                message_id: frame.message_id,
                transaction_id: Arc::from(frame.transaction_id),
                trace_id: frame.trace_id,
                producer: frame.producer.map(str::to_owned),
                queue: Arc::clone(&queue_name),
                partition_id: segment.partition_id,
                partition: Arc::clone(&partition),
                data,
                created_at: segment.created_at,
                offset,
                delivery_attempt: claim.delivery_attempt,
            });
            next[index] = offset + 1;
        }
    }
    let handed_lasts = claims.iter().zip(next).map(|(claim, next)| (next > claim.first).then_some(next - 1)).collect();
    Ok(Read { messages, segments, handed_lasts })
}

/// Moves the group past the messages of these partitions that are older than the queue's `ttl`
/// or `maxWaitTimeSeconds`, so that it is never served them: dead-lettered with the reason when
/// the queue dead-letters, only skipped otherwise; counted either way.
async fn expire_old_messages(
    broker: &Broker,
    client: &mut deadpool_postgres::Object,
    queue: &Queue,
    group: &str,
    partition_ids: &[i64],
) -> Result<(), BrokerError> {
    let options = &queue.options;
    let Some(max_age_seconds) = options.expiry_seconds() else { return Ok(()) };
    let option = if options.ttl_seconds == max_age_seconds { "ttl" } else { "maxWaitTimeSeconds" };
    let error = format!("expired: older than the queue's {option} of {max_age_seconds} s");
    let expiry = Expiry { max_age_seconds, dead_letter_error: options.dead_letter_queue.then_some(error.as_str()) };
    let expired = cursors::expire(client, group, partition_ids, &expiry, broker.cipher.as_deref()).await?;
    let count: u64 = expired.iter().map(|e| (e.last - e.first + 1) as u64).sum();
    broker.metrics.messages_expired.inc_by(&queue.name, count);
    if expiry.dead_letter_error.is_some() {
        broker.metrics.messages_dead_lettered.inc_by(&queue.name, count);
    }
    Ok(())
}

/// Gives up on the head messages whose leases ran out once too often (see
/// [`cursors::give_up_exhausted_heads`]), counting them, then claims what follows them on those
/// partitions within what is left of the pop's budget after `claimed`.
async fn serve_past_exhausted_heads(
    broker: &Broker,
    client: &mut deadpool_postgres::Object,
    queue: &Queue,
    request: &ClaimRequest<'_>,
    claimed: &[cursors::Claim],
    exhausted: &[i64],
) -> Result<Vec<cursors::Claim>, BrokerError> {
    let given_up = cursors::give_up_exhausted_heads(client, request.group, exhausted, broker.cipher.as_deref()).await?;
    let metrics = &broker.metrics;
    let dead_lettered = given_up.iter().filter(|g| g.dead_lettered).count() as u64;
    metrics.messages_dead_lettered.inc_by(&queue.name, dead_lettered);
    metrics.messages_dropped.inc_by(&queue.name, given_up.len() as u64 - dead_lettered);
    metrics.leases_expired.inc_by(given_up.len() as u64);
    let taken: i64 = claimed.iter().map(|c| c.last - c.first + 1).sum();
    let rest = ClaimRequest {
        partition_ids: exhausted,
        batch: request.batch - taken,
        max_partitions: request.max_partitions - claimed.len() as i64,
        lock_at_most: exhausted.len() as i64,
        ..*request
    };
    Ok(cursors::claim(&*client, &rest).await?.claims)
}

/// Candidates to claim from, found on `client`; with the view they were planned from, when they
/// were.
struct Planned {
    client: deadpool_postgres::Object,
    candidates: Vec<cursors::Candidate>,
    stamp: Option<ViewStamp>,
}

/// The partitions with work for the group that a queue-wide pop considers, as the coordinator
/// plans them, with the connection that looked; `None` when the plan says nothing can be pending
/// (the database is not touched). A round of candidates none of which can be served now (leased
/// to other consumers, or with nothing visible yet) is followed by the next round, until one has
/// a partition to serve or the whole view was looked at, so a pop never waits while another
/// candidate is available.
async fn planned_candidates(
    broker: &Broker,
    queue_id: i64,
    group: &Arc<str>,
    visibility: Visibility,
    limit: usize,
) -> Result<Option<Planned>, BrokerError> {
    let plan_pop = || broker.coordinator.plan(queue_id, Arc::clone(group), limit);
    let mut plan = plan_pop().await?;
    let budget = match &plan {
        PopPlan::Candidates { partitions, .. } if partitions.is_empty() => return Ok(None),
        PopPlan::Candidates { view_size, .. } => *view_size,
        PopPlan::Full { .. } => 0,
    };
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    let (mut found, mut looked) = (Vec::new(), 0);
    // The latest round's plan: every push announced before it committed before the claim that
    // follows looks, so what that claim finds holds as of this plan.
    let mut stamp;
    loop {
        match plan {
            PopPlan::Full { ticket, scan } => {
                let scanned = cursors::candidates(&client, queue_id, Scope::All, group, visibility).await?;
                let pending = scanned.iter().map(|c| c.partition_id).collect();
                broker.coordinator.scanned(ScanDone { ticket, scan, group: Arc::clone(group), pending });
                // The view the scan makes is newer than anything this pop could report against.
                return Ok(Some(Planned { client, candidates: scanned, stamp: None }));
            }
            PopPlan::Candidates { ticket, as_of, partitions, .. } => {
                let scope = Scope::Only(&partitions);
                let checked = cursors::candidates(&client, queue_id, scope, group, visibility).await?;
                let pending = checked.iter().map(|c| c.partition_id).collect();
                let any_free = checked.iter().any(|c| c.not_before.is_none());
                looked += partitions.len();
                let group = Arc::clone(group);
                broker.coordinator.checked(Checked { ticket, as_of, queue_id, group, checked: partitions, pending });
                found.extend(checked);
                stamp = Some(ViewStamp { ticket, as_of });
                if any_free || looked >= budget {
                    return Ok(Some(Planned { client, candidates: found, stamp }));
                }
            }
        }
        plan = plan_pop().await?;
        if matches!(&plan, PopPlan::Candidates { partitions, .. } if partitions.is_empty()) {
            return Ok(Some(Planned { client, candidates: found, stamp }));
        }
    }
}

fn corrupt(partition_id: i64, base_offset: i64, source: queen_log::DecodeError) -> BrokerError {
    BrokerError::from(StoreError::CorruptSegment { partition_id, base_offset, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(backlogs: &[Option<i64>]) -> Vec<cursors::Candidate> {
        let candidate = |(id, backlog): (usize, &Option<i64>)| cursors::Candidate {
            partition_id: id as i64,
            partition: format!("p{id}"),
            has_cursor: backlog.is_some(),
            not_before: None,
            backlog: *backlog,
        };
        backlogs.iter().enumerate().map(candidate).collect()
    }

    fn locked(backlogs: &[Option<i64>], messages: u32, conflates: bool, visibility: Visibility) -> i64 {
        let candidates = free(backlogs);
        enough_to_fill(&candidates.iter().collect::<Vec<_>>(), messages, conflates, visibility)
    }

    #[test]
    fn a_claim_locks_the_partitions_that_fill_the_batch() {
        let backlogs = [Some(30), Some(30), Some(30), Some(30), Some(30), Some(30), Some(30), Some(30)];
        assert_eq!(locked(&backlogs, 100, false, Visibility::Immediate), 4);
        assert_eq!(locked(&backlogs, 60, false, Visibility::Immediate), 2);
        assert_eq!(locked(&[Some(5000), Some(5000), Some(5000)], 100, false, Visibility::Immediate), 1);
    }

    #[test]
    fn a_claim_may_lock_every_partition_when_together_they_do_not_fill_the_batch() {
        assert_eq!(locked(&[Some(10), Some(20), Some(30)], 100, false, Visibility::Immediate), 3);
    }

    #[test]
    fn a_partition_without_a_cursor_counts_as_full() {
        assert_eq!(locked(&[None, Some(1), Some(1)], 100, false, Visibility::Immediate), 1);
        assert_eq!(locked(&[Some(1), Some(1), None, Some(1)], 100, false, Visibility::Immediate), 3);
    }

    #[test]
    fn a_conflating_group_counts_one_message_per_partition() {
        let backlogs = [Some(500), Some(500), Some(500), Some(500), Some(500), Some(500)];
        assert_eq!(locked(&backlogs, 3, true, Visibility::Immediate), 3);
    }

    #[test]
    fn under_a_delay_or_a_window_every_free_partition_may_be_locked() {
        let backlogs = [Some(5000), Some(5000), Some(5000), Some(5000), Some(5000)];
        assert_eq!(locked(&backlogs, 100, false, Visibility::Rules), 5);
    }
}
