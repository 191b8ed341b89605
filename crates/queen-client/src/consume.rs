//! The consume loop: long-poll, run a handler per message, acknowledge, renew leases, survive
//! broker restarts, stop gracefully. [`Client::consumer`] makes a [`Consumer`];
//! [`Consumer::start`] runs it and gives a [`ConsumerHandle`].

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::ack::{Ack, AckStatus};
use crate::lease::LeaseGuard;
use crate::pop::{Delivery, Message, Pop, PopTarget};
use crate::{Client, Error};

/// How long a consumer's lease lasts unless set: its pops ask for it (`leaseSeconds`).
const DEFAULT_LEASE_TIME: Duration = Duration::from_secs(30);
/// How long a consumer's pop waits for messages unless the pop says: also the longest a stop
/// waits for the pop in flight.
const DEFAULT_WAIT: Duration = Duration::from_secs(5);
/// Messages a pop takes per partition it claims, unless the pop sets a batch.
const DEFAULT_BATCH_PER_PARTITION: u32 = 10;
/// Completed acknowledgements are sent together, but never held longer than this.
const ACK_FLUSH_INTERVAL: Duration = Duration::from_millis(500);
/// Nor more of them than this.
const ACK_FLUSH_COUNT: usize = 100;

/// How long past its wait a stop waits for the pop in flight.
const POP_SLACK_ON_STOP: Duration = Duration::from_secs(5);

/// Partitions one pop asks for when the consumer's [`Pop`] names none: the broker's default
/// `pop.max_partitions`, whatever the concurrency.
const MOST_PARTITIONS_PER_POP: usize = 100;

/// A consume loop, not started yet: made by [`Client::consumer`], run by [`Consumer::start`].
///
/// What it does, once started:
///
/// - It long-polls with the given [`Pop`] (a queue, one partition, or a namespace/task, as a
///   consumer group or in queue mode), claiming at most as many partitions per pop as it has
///   room for handlers.
/// - It runs the handler once per message. The messages of one partition are handled one after
///   the other, in order (the broker's order per partition holds, and acknowledgements, which
///   are cursor commits, never commit a message whose handler has not finished); different
///   partitions are handled concurrently, up to [`concurrency`](Consumer::concurrency) handlers
///   at once.
/// - A handler's `Ok` is acknowledged `completed`; its `Err` (or a panic) `failed` with the
///   error's text, so the queue's `retryLimit` and dead-letter queue apply. After a failure the
///   partition's following messages of that delivery are left to be delivered again, in order.
///   Completed acknowledgements of a partition are sent together (at the latest every 500 ms).
/// - While handlers run, the delivery's lease is extended every third of the lease time (the
///   pops ask for [`lease_time`](Consumer::lease_time), 30 s unless set), so slow handlers keep
///   their messages. A lease that is lost anyway (expired, unknown) stops the handling of its
///   remaining messages: they are delivered again elsewhere.
/// - Broker errors that may pass (no answer, 408, 429, 502, 503, 504) are retried with backoff
///   for as long as it takes, so the loop rides out a broker restart or a failover;
///   acknowledgements are retried until their lease would have run out. Any other error of a
///   pop ends the loop, gracefully, with that error.
/// - [`ConsumerHandle::stop`] ends it gracefully: no new pop; the pop in flight is waited for
///   (at most its wait, 5 s unless the pop says, and 5 s more; one still unanswered then is
///   given up, and the broker takes back what it claimed) and what it brings is given back at
///   once (a `retry` acknowledgement, which neither counts a failure nor waits); handlers in flight
///   finish and are acknowledged; messages not started are given back likewise; then the loop
///   returns its [`ConsumeStats`].
///
/// ```no_run
/// # async fn example(client: queen_client::Client) -> Result<(), queen_client::Error> {
/// use std::time::Duration;
/// use queen_client::{Message, Pop};
///
/// let consumer = client
///     .consumer(Pop::queue("orders").group("billing"))
///     .concurrency(8)
///     .lease_time(Duration::from_secs(60))
///     .start(|message: Message| async move {
///         let order: serde_json::Value = message.json().map_err(|e| e.to_string())?;
///         println!("billing {order}");
///         Ok::<(), String>(())
///     })?;
/// tokio::signal::ctrl_c().await.ok();
/// let stats = consumer.shutdown().await?;
/// println!("{} messages handled", stats.handled);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a consumer does nothing until started"]
pub struct Consumer {
    client: Client,
    pop: Pop,
    concurrency: usize,
    lease_time: Duration,
    initial_backoff: Duration,
    max_backoff: Duration,
}

impl Client {
    /// A consume loop over what `pop` asks for; see [`Consumer`].
    pub fn consumer(&self, pop: Pop) -> Consumer {
        Consumer {
            client: self.clone(),
            pop,
            concurrency: 1,
            lease_time: DEFAULT_LEASE_TIME,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl Consumer {
    /// At most this many handlers at once (default 1), each on its own partition. One pop asks
    /// for at most 100 partitions (the broker's default `pop.max_partitions`) unless the [`Pop`]
    /// names its own `partitions`.
    pub fn concurrency(mut self, handlers: usize) -> Self {
        self.concurrency = handlers.max(1);
        self
    }

    /// The lease time the pops ask for (default 30 s), unless the pop sets
    /// [`lease_seconds`](Pop::lease_seconds). Leases are extended every third of it while
    /// handlers run.
    pub fn lease_time(mut self, lease_time: Duration) -> Self {
        self.lease_time = lease_time.max(Duration::from_secs(1));
        self
    }

    /// The backoff after a failed pop: from `initial`, doubling, at most `max` (default 100 ms
    /// to 5 s).
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max.max(initial);
        self
    }

    /// Starts the loop on the current Tokio runtime, running `handler` for each message.
    ///
    /// Fails at once for a pop with auto-ack (the loop acknowledges itself).
    pub fn start<F, Fut, E>(self, handler: F) -> Result<ConsumerHandle, Error>
    where
        F: Fn(Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        if self.pop.auto_ack {
            return Err(Error::InvalidArgument("a consumer acknowledges itself: its pop cannot auto-ack".into()));
        }
        let mut pop = self.pop;
        let lease_seconds = *pop.lease_seconds.get_or_insert(self.lease_time.as_secs().max(1) as u32);
        if pop.wait.is_none() {
            pop.wait = Some(DEFAULT_WAIT);
        }
        pop.request(&self.client)?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let stats = Arc::new(Counters::default());
        // The handler is called inside the returned future, so that a panic in its synchronous
        // part is caught with the task it runs in (and acknowledged `failed`), as one in its
        // future is.
        let handler = Arc::new(handler);
        let handler: Arc<Handler> = Arc::new(move |message| {
            let handler = Arc::clone(&handler);
            Box::pin(async move { handler(message).await.map_err(|e| e.to_string()) })
        });
        let context = Arc::new(Context {
            client: self.client,
            handler,
            stats: Arc::clone(&stats),
            lease_time: Duration::from_secs(u64::from(lease_seconds)),
            initial_backoff: self.initial_backoff,
            max_backoff: self.max_backoff,
            stop: stop_rx,
        });
        let task = tokio::spawn(poll_loop(context, pop, self.concurrency));
        Ok(ConsumerHandle { stop: stop_tx, task: Some(task), stats })
    }
}

type HandlerFuture = std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
type Handler = dyn Fn(Message) -> HandlerFuture + Send + Sync;

struct Context {
    client: Client,
    handler: Arc<Handler>,
    stats: Arc<Counters>,
    lease_time: Duration,
    initial_backoff: Duration,
    max_backoff: Duration,
    stop: watch::Receiver<bool>,
}

impl Context {
    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Waits `pause`, or less if a stop is asked for.
    async fn pause(&self, pause: Duration) {
        let mut stop = self.stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|stopping| *stopping) => {}
        }
    }
}

async fn poll_loop(context: Arc<Context>, base: Pop, concurrency: usize) -> Result<ConsumeStats, Error> {
    let room = Arc::new(Semaphore::new(concurrency));
    let one_partition = matches!(base.target, PopTarget::Queue { partition: Some(_), .. });
    // The broker takes at most `pop.max_partitions` (100 by default) per pop.
    let most_partitions =
        base.partitions.map_or(concurrency.min(MOST_PARTITIONS_PER_POP), |p| p as usize).clamp(1, concurrency);
    let mut runs = JoinSet::new();
    let mut backoff = context.initial_backoff;
    let mut failure = None;
    let mut stop = context.stop.clone();
    loop {
        // Reap finished runs so the set does not grow.
        while runs.try_join_next().is_some() {}
        let first = tokio::select! {
            permit = Arc::clone(&room).acquire_owned() => permit.expect("the semaphore is never closed"),
            _ = stop.wait_for(|stopping| *stopping) => break,
        };
        if context.stopping() {
            break;
        }
        let mut permits = vec![first];
        let wanted = if one_partition { 1 } else { most_partitions };
        while permits.len() < wanted {
            match Arc::clone(&room).try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        let claimed = permits.len() as u32;
        let mut pop = base.clone().partitions(claimed);
        if base.batch.is_none() {
            pop = pop.batch(claimed * DEFAULT_BATCH_PER_PARTITION);
        }
        context.stats.pops.fetch_add(1, Ordering::Relaxed);
        // A stop waits for the pop in flight for at most its long poll (its wait, and the slack
        // the transport gives it), not through the retries a stalled broker would take it through:
        // one given up on is seen by the broker as a client that left, and what it claimed goes back.
        let popping = context.client.pop(&pop);
        tokio::pin!(popping);
        let popped = tokio::select! {
            popped = &mut popping => popped,
            () = async { drop(stop.wait_for(|stopping| *stopping).await) } => {
                let bound = pop.wait.unwrap_or(DEFAULT_WAIT) + POP_SLACK_ON_STOP;
                match tokio::time::timeout(bound, &mut popping).await {
                    Ok(popped) => popped,
                    Err(_) => break,
                }
            }
        };
        match popped {
            Ok(delivery) => {
                backoff = context.initial_backoff;
                if delivery.paused {
                    // Pop maintenance: the broker answers at once; come back later.
                    drop(permits);
                    context.pause(context.max_backoff).await;
                    continue;
                }
                if delivery.is_empty() {
                    context.stats.empty_pops.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                dispatch(&context, delivery, permits, &room, &mut runs).await;
            }
            Err(error) if transient(&error) => {
                context.stats.pop_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, ?backoff, "queen-client consumer: a pop failed; trying again");
                drop(permits);
                context.pause(crate::transport::spread(backoff)).await;
                backoff = (backoff * 2).min(context.max_backoff);
            }
            Err(error) => {
                tracing::error!(%error, "queen-client consumer: a pop failed for good; stopping");
                failure = Some(error);
                break;
            }
        }
    }
    // Handlers in flight finish and are acknowledged; what was not started is given back.
    while runs.join_next().await.is_some() {}
    let stats = context.stats.snapshot();
    match failure {
        Some(error) => Err(error),
        None => Ok(stats),
    }
}

/// Whether a failed call may succeed if made again later.
fn transient(error: &Error) -> bool {
    error.is_retryable() && !matches!(error, Error::QueueFull { .. })
}

/// Splits a delivery into its partitions' runs and starts one task per run.
async fn dispatch(
    context: &Arc<Context>,
    delivery: Delivery,
    mut permits: Vec<OwnedSemaphorePermit>,
    room: &Arc<Semaphore>,
    tasks: &mut JoinSet<()>,
) {
    let lease = delivery.lease_id.map(|lease_id| Arc::new(context.client.keep_lease(lease_id, context.lease_time)));
    let mut runs: Vec<Vec<Message>> = Vec::new();
    for message in delivery.messages {
        match runs.iter_mut().find(|run| run[0].partition_id == message.partition_id) {
            Some(run) => run.push(message),
            None => runs.push(vec![message]),
        }
    }
    for run in runs {
        // A pop claims at most one partition per permit; should it bring more, they wait for room.
        let permit = match permits.pop() {
            Some(permit) => permit,
            None => Arc::clone(room).acquire_owned().await.expect("the semaphore is never closed"),
        };
        tasks.spawn(handle_run(Arc::clone(context), run, lease.clone(), permit));
    }
}

/// Handles one partition's messages of a delivery, in order, and acknowledges them.
async fn handle_run(
    context: Arc<Context>,
    run: Vec<Message>,
    lease: Option<Arc<LeaseGuard>>,
    _permit: OwnedSemaphorePermit,
) {
    let stats = &context.stats;
    let mut acks: Vec<Ack> = Vec::new();
    let mut oldest_pending: Option<Instant> = None;
    let mut messages = run.into_iter();
    while let Some(message) = messages.next() {
        let lost = lease.as_ref().is_some_and(|guard| guard.is_lost());
        if context.stopping() || lost {
            // Not started: given back at once, the rest of the run with it.
            let given_back = 1 + messages.len() as u64;
            if lost {
                stats.lease_losses.fetch_add(1, Ordering::Relaxed);
            } else {
                acks.push(Ack::retry(&message));
            }
            stats.released.fetch_add(given_back, Ordering::Relaxed);
            break;
        }
        if oldest_pending.is_some_and(|at| at.elapsed() >= ACK_FLUSH_INTERVAL) || acks.len() >= ACK_FLUSH_COUNT {
            flush(&context, &mut acks).await;
            oldest_pending = None;
        }
        let in_flight = stats.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        stats.max_in_flight.fetch_max(in_flight, Ordering::Relaxed);
        let handling = tokio::spawn((context.handler)(message.clone()));
        tokio::pin!(handling);
        // Completed acknowledgements waiting are sent when they are due, while the handler runs:
        // a slow handler does not hold the ones before it (work done, to be redone if the lease
        // were lost meanwhile).
        let outcome = loop {
            let Some(due) = oldest_pending.map(|at| at + ACK_FLUSH_INTERVAL) else { break (&mut handling).await };
            tokio::select! {
                outcome = &mut handling => break outcome,
                () = tokio::time::sleep_until(due) => {
                    flush(&context, &mut acks).await;
                    oldest_pending = None;
                }
            }
        };
        stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        stats.handled.fetch_add(1, Ordering::Relaxed);
        let outcome = outcome.unwrap_or_else(|e| {
            Err(match e.try_into_panic() {
                Ok(panic) => format!("the handler panicked: {}", panic_text(&*panic)),
                Err(_) => "the handler was cancelled".to_owned(),
            })
        });
        match outcome {
            Ok(()) => {
                stats.completed.fetch_add(1, Ordering::Relaxed);
                acks.push(Ack::completed(&message));
                oldest_pending.get_or_insert_with(Instant::now);
            }
            Err(error) => {
                // The failure restarts the partition at this message: the rest of the run is
                // delivered again, in order, so it is left alone here.
                stats.failed.fetch_add(1, Ordering::Relaxed);
                acks.push(Ack::failed(&message, error));
                break;
            }
        }
    }
    flush(&context, &mut acks).await;
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic".to_owned())
}

/// Sends the acknowledgements, retrying while it may pass and the lease could still be live.
async fn flush(context: &Context, acks: &mut Vec<Ack>) {
    if acks.is_empty() {
        return;
    }
    let stats = &context.stats;
    let deadline = Instant::now() + context.lease_time;
    let mut backoff = context.initial_backoff;
    loop {
        match context.client.ack_batch(acks).await {
            Ok(results) => {
                for result in results {
                    if result.success {
                        stats.acked.fetch_add(1, Ordering::Relaxed);
                    } else {
                        stats.ack_refused.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            transaction_id = %result.transaction_id,
                            error = result.error.as_deref().unwrap_or("refused"),
                            "queen-client consumer: an acknowledgement was refused; the message will be delivered again"
                        );
                    }
                }
                break;
            }
            Err(error) if transient(&error) && Instant::now() + backoff < deadline => {
                stats.ack_retries.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, ?backoff, "queen-client consumer: acknowledging failed; trying again");
                tokio::time::sleep(crate::transport::spread(backoff)).await;
                backoff = (backoff * 2).min(context.max_backoff);
            }
            Err(error) => {
                stats.ack_errors.fetch_add(acks.len() as u64, Ordering::Relaxed);
                tracing::error!(%error, "queen-client consumer: acknowledging failed; the messages will be delivered again");
                break;
            }
        }
    }
    let given_back = acks.iter().filter(|ack| ack.status == AckStatus::Retry).count() as u64;
    stats.acks_sent.fetch_add(acks.len() as u64 - given_back, Ordering::Relaxed);
    acks.clear();
}

#[derive(Debug, Default)]
struct Counters {
    pops: AtomicU64,
    empty_pops: AtomicU64,
    pop_errors: AtomicU64,
    handled: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    acks_sent: AtomicU64,
    acked: AtomicU64,
    ack_refused: AtomicU64,
    ack_retries: AtomicU64,
    ack_errors: AtomicU64,
    released: AtomicU64,
    lease_losses: AtomicU64,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

impl Counters {
    fn snapshot(&self) -> ConsumeStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ConsumeStats {
            pops: get(&self.pops),
            empty_pops: get(&self.empty_pops),
            pop_errors: get(&self.pop_errors),
            handled: get(&self.handled),
            completed: get(&self.completed),
            failed: get(&self.failed),
            acks_sent: get(&self.acks_sent),
            acked: get(&self.acked),
            ack_refused: get(&self.ack_refused),
            ack_retries: get(&self.ack_retries),
            ack_errors: get(&self.ack_errors),
            released: get(&self.released),
            lease_losses: get(&self.lease_losses),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            max_in_flight: self.max_in_flight.load(Ordering::Relaxed),
        }
    }
}

/// What a consume loop has done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ConsumeStats {
    /// Pops sent.
    pub pops: u64,
    /// Pops that brought nothing.
    pub empty_pops: u64,
    /// Pops that failed and were tried again.
    pub pop_errors: u64,
    /// Handler runs finished.
    pub handled: u64,
    /// Handler runs that returned `Ok`.
    pub completed: u64,
    /// Handler runs that returned `Err` or panicked.
    pub failed: u64,
    /// Acknowledgements sent (`completed` and `failed`; the `retry`s of [`released`] messages
    /// apart).
    ///
    /// [`released`]: ConsumeStats::released
    pub acks_sent: u64,
    /// Acknowledgements the broker applied (`retry`s included).
    pub acked: u64,
    /// Acknowledgements the broker refused (an expired lease, say): those messages are
    /// delivered again.
    pub ack_refused: u64,
    /// Acknowledgement calls that failed and were tried again.
    pub ack_retries: u64,
    /// Acknowledgements that could not be sent before their lease would have run out: those
    /// messages are delivered again.
    pub ack_errors: u64,
    /// Messages given back unhandled: delivered after a stop was asked for, or behind a lost
    /// lease.
    pub released: u64,
    /// Runs of messages abandoned because their lease was lost.
    pub lease_losses: u64,
    /// Handlers running now.
    pub in_flight: usize,
    /// The most handlers that ran at once.
    pub max_in_flight: usize,
}

/// A running consume loop: stop it, watch it, wait for it.
///
/// Dropping the handle asks the loop to stop, as [`stop`](ConsumerHandle::stop) does; it then
/// winds down in the background.
#[derive(Debug)]
pub struct ConsumerHandle {
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<Result<ConsumeStats, Error>>>,
    stats: Arc<Counters>,
}

impl ConsumerHandle {
    /// Asks the loop to stop gracefully (see [`Consumer`]); returns at once.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// What the loop has done so far.
    pub fn stats(&self) -> ConsumeStats {
        self.stats.snapshot()
    }

    /// Whether the loop has ended (stopped, or failed for good).
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for the loop to end (it ends only when stopped, or on an error that does not pass);
    /// what it did, or the error that ended it.
    pub async fn join(mut self) -> Result<ConsumeStats, Error> {
        let Some(task) = self.task.take() else { return Ok(self.stats()) };
        match task.await {
            Ok(result) => result,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(_) => Ok(self.stats()),
        }
    }

    /// Stops the loop gracefully and waits for it: [`stop`](ConsumerHandle::stop), then
    /// [`join`](ConsumerHandle::join).
    pub async fn shutdown(self) -> Result<ConsumeStats, Error> {
        self.stop();
        self.join().await
    }
}

impl Drop for ConsumerHandle {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}
