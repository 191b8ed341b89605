//! The moving parts every scenario is made of: a stream (one queue, its message generator and its
//! ledger), producers that push to it, consumers that pop and ack from it, the drain that waits
//! for every group to catch up, and the measured window.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use queen_client::{AckStatus, Client, Message, Pop, PushItem, PushStatus, RetryPolicy, SubscriptionMode};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::task::JoinSet;

use crate::generator::{MessageGenerator, PayloadStamp};
use crate::ledger::{Ledger, PushOutcome};
use crate::procfs::{CpuReading, CpuUsage, Watched};
use crate::stats::LatencyRecorder;

/// Name the ledger gives queue mode (no `consumerGroup`), as the broker does.
pub const QUEUE_MODE: &str = "__QUEUE_MODE__";
/// Pause after a failed call, so a broker in trouble is not hammered.
const ERROR_BACKOFF: Duration = Duration::from_millis(200);
/// Pause after an empty non-waiting pop.
const EMPTY_POP_BACKOFF: Duration = Duration::from_millis(5);
/// How often a failed ack is tried before its messages are left to lease expiry.
const ACK_ATTEMPTS: usize = 3;
/// How many error messages a stream keeps for the report.
const KEPT_ERRORS: usize = 5;
/// Long-poll time of consumer pops: short, so consumers notice the end of a phase quickly.
pub const CONSUMER_LONG_POLL: Duration = Duration::from_secs(1);

/// Calls that failed, by kind, with the first few messages.
#[derive(Debug, Default)]
pub struct ErrorLog {
    push: AtomicU64,
    pop: AtomicU64,
    ack: AtomicU64,
    ack_refused: AtomicU64,
    first: Mutex<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ErrorCounts {
    pub push: u64,
    pub pop: u64,
    pub ack: u64,
    /// Acknowledgements the broker answered with `success: false`.
    pub ack_refused: u64,
    pub first: Vec<String>,
}

impl ErrorCounts {
    pub fn total(&self) -> u64 {
        self.push + self.pop + self.ack + self.ack_refused
    }

    pub fn merge(&mut self, other: ErrorCounts) {
        self.push += other.push;
        self.pop += other.pop;
        self.ack += other.ack;
        self.ack_refused += other.ack_refused;
        self.first.extend(other.first);
        self.first.truncate(KEPT_ERRORS);
    }
}

impl ErrorLog {
    /// Counts `count` failures of one kind, keeping the message if it is among the first.
    fn note(&self, counter: &AtomicU64, count: u64, message: String) {
        counter.fetch_add(count, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if first.len() < KEPT_ERRORS {
            first.push(message);
        }
    }

    pub fn counts(&self) -> ErrorCounts {
        ErrorCounts {
            push: self.push.load(Ordering::Relaxed),
            pop: self.pop.load(Ordering::Relaxed),
            ack: self.ack.load(Ordering::Relaxed),
            ack_refused: self.ack_refused.load(Ordering::Relaxed),
            first: self.first.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone(),
        }
    }
}

/// A client of the broker at `url` as the load generator uses it: with the wire contract's
/// timeouts and without retries of its own, so that every failed call is seen and counted, and a
/// push that is sent again cannot answer `duplicate` for a fresh transaction id.
pub fn connect(url: &str, token: Option<&str>) -> Result<Client, queen_client::Error> {
    let builder = Client::builder().url(url).retry_policy(RetryPolicy::no_retries());
    match token {
        Some(token) => builder.token(token).build(),
        None => builder.build(),
    }
}

/// One queue under load: what was pushed to it and delivered from it.
#[derive(Debug)]
pub struct Stream {
    pub queue: String,
    /// The queue's name as every pushed item shares it.
    queue_name: Arc<str>,
    /// `None` is queue mode.
    groups: Vec<Option<String>>,
    pub ledger: Ledger,
    next_seq: AtomicU64,
    next_request: AtomicU64,
    /// Messages answered `queued`.
    pub pushed: AtomicU64,
    /// Messages received, summed over the groups.
    pub delivered: AtomicU64,
    pub errors: ErrorLog,
    /// End-to-end latencies, when this stream measures them.
    pub latency: Option<LatencyRecorder>,
    /// Producers push binary bodies (QPB1 frames groups) instead of JSON.
    binary_pushes: bool,
}

impl Stream {
    pub fn new(queue: String, generator: MessageGenerator, groups: Vec<Option<String>>, measure_latency: bool) -> Self {
        let names = groups.iter().map(|g| g.clone().unwrap_or_else(|| QUEUE_MODE.to_owned())).collect();
        Self {
            queue_name: queue.as_str().into(),
            queue,
            groups,
            ledger: Ledger::new(generator, names),
            next_seq: AtomicU64::new(0),
            next_request: AtomicU64::new(0),
            pushed: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            errors: ErrorLog::default(),
            latency: measure_latency.then(LatencyRecorder::new),
            binary_pushes: false,
        }
    }

    /// Producers push binary bodies instead of JSON.
    pub fn with_binary_pushes(mut self, binary: bool) -> Self {
        self.binary_pushes = binary;
        self
    }

    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Claims the next `count` sequence numbers, no further than `limit`; `None` past it.
    fn claim(&self, count: usize, limit: Option<u64>) -> Option<Range<u64>> {
        let start = self.next_seq.fetch_add(count as u64, Ordering::Relaxed);
        let end = start + count as u64;
        match limit {
            Some(limit) if start >= limit => None,
            Some(limit) => Some(start..end.min(limit)),
            None => Some(start..end),
        }
    }
}

/// Which partitions a producer's requests go to. Partitions are named `p0`, `p1`, ...
#[derive(Debug, Clone, Copy)]
pub enum Partitioning {
    /// Each request to one partition, the stream's requests taking `p0..pN` in turn: a batch
    /// is one segment, as in the storage ceiling.
    PerRequest(usize),
    /// Message `seq` of a request to partition `seq % N`: one request touches many partitions.
    PerMessage(usize),
}

/// When a producer stops.
#[derive(Debug, Clone, Copy)]
pub enum Until {
    Deadline(Instant),
    /// After this many messages of the stream (all producers together).
    Messages(u64),
}

/// Pushes batches of `batch` messages back to back until `until`.
pub async fn produce(stream: Arc<Stream>, client: Client, batch: usize, partitioning: Partitioning, until: Until) {
    loop {
        let limit = match until {
            Until::Deadline(deadline) if Instant::now() >= deadline => return,
            Until::Deadline(_) => None,
            Until::Messages(count) => Some(count),
        };
        let Some(seqs) = stream.claim(batch, limit) else { return };
        if !push_once(&stream, &client, seqs, partitioning).await {
            tokio::time::sleep(ERROR_BACKOFF).await;
        }
    }
}

/// Pushes batches of `batch` on a schedule: request `k` is due at `start + k × interval`, and
/// none is sent at or after `deadline`. A producer behind its schedule (a slow answer) sends the
/// next request at once, so it catches up when it can; what is still due at the deadline is not
/// sent, and the rate achieved shows a broker that did not keep up.
pub async fn produce_scheduled(
    stream: Arc<Stream>,
    client: Client,
    batch: usize,
    partitioning: Partitioning,
    schedule: (Instant, Duration),
    deadline: Instant,
) {
    let (mut due, interval) = schedule;
    while due < deadline {
        tokio::time::sleep_until(due.into()).await;
        if Instant::now() >= deadline {
            return;
        }
        let Some(seqs) = stream.claim(batch, None) else { return };
        if !push_once(&stream, &client, seqs, partitioning).await {
            tokio::time::sleep(ERROR_BACKOFF).await;
        }
        due += interval;
    }
}

/// Pushes single messages at `per_second` until the deadline, each on its own task so a slow
/// request does not delay the next one.
pub async fn produce_paced(stream: Arc<Stream>, client: Client, per_second: u32, deadline: Instant) {
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(per_second.max(1))));
    let mut requests = JoinSet::new();
    while Instant::now() < deadline {
        ticks.tick().await;
        let Some(seqs) = stream.claim(1, None) else { return };
        let (stream, client) = (stream.clone(), client.clone());
        requests.spawn(async move { push_once(&stream, &client, seqs, Partitioning::PerRequest(1)).await });
        // Reap finished requests as we go, so the set stays small.
        while requests.try_join_next().is_some() {}
    }
    requests.join_all().await;
}

/// One push request; whether it succeeded.
async fn push_once(stream: &Stream, client: &Client, seqs: Range<u64>, partitioning: Partitioning) -> bool {
    let generator = stream.ledger.generator();
    // A request to one partition names it once, and its items share the name.
    let request_partition: Option<Arc<str>> = match partitioning {
        Partitioning::PerRequest(count) => {
            Some(format!("p{}", stream.next_request.fetch_add(1, Ordering::Relaxed) % count as u64).into())
        }
        Partitioning::PerMessage(_) => None,
    };
    let sent_us = generator.now_us();
    let items: Vec<PushItem> = seqs
        .clone()
        .map(|seq| {
            let partition: Arc<str> = match (&request_partition, partitioning) {
                (Some(name), _) => Arc::clone(name),
                (None, Partitioning::PerMessage(count)) => format!("p{}", seq % count as u64).into(),
                (None, Partitioning::PerRequest(_)) => "p0".into(),
            };
            // The payload is JSON text already: pushed as it is, not encoded again.
            let payload =
                RawValue::from_string(generator.payload(seq, sent_us)).expect("the generator writes valid JSON");
            PushItem::identified(Arc::clone(&stream.queue_name), generator.transaction_id(seq), payload)
                .with_partition(partition)
        })
        .collect();
    let pushed = if stream.binary_pushes { client.push_binary(&items).await } else { client.push(&items).await };
    match pushed {
        Ok(results) => {
            let outcomes: Vec<(u64, PushOutcome)> = seqs
                .zip(&results)
                .map(|(seq, result)| {
                    let outcome = match result.status {
                        PushStatus::Queued => PushOutcome::Queued,
                        PushStatus::Duplicate => PushOutcome::Duplicate,
                        _ => PushOutcome::Failed,
                    };
                    (seq, outcome)
                })
                .collect();
            let queued = outcomes.iter().filter(|(_, o)| *o == PushOutcome::Queued).count() as u64;
            let refused: Vec<PushStatus> = results
                .iter()
                .map(|r| r.status)
                .filter(|status| !matches!(status, PushStatus::Queued | PushStatus::Duplicate))
                .collect();
            if let Some(status) = refused.first() {
                let message = format!("push: {} items answered {status:?}", refused.len());
                stream.errors.note(&stream.errors.push, refused.len() as u64, message);
            }
            stream.ledger.record_push(outcomes);
            stream.pushed.fetch_add(queued, Ordering::Relaxed);
            true
        }
        Err(error) => {
            stream.ledger.record_push(seqs.map(|seq| (seq, PushOutcome::Failed)));
            stream.errors.note(&stream.errors.push, 1, format!("push: {error}"));
            false
        }
    }
}

/// How consumers pop.
#[derive(Debug, Clone, Copy)]
pub struct PopPlan {
    pub batch: usize,
    pub partitions: usize,
    /// Long-poll time; `None` pops without waiting.
    pub wait: Option<Duration>,
    /// Ask for framed (QPF1) answers.
    pub frames: bool,
}

/// Which pop served each partition first, counted over all consumers of a set (fairness).
#[derive(Debug, Default)]
pub struct PopTrace {
    pops: AtomicU64,
    first_served: Mutex<HashMap<String, u64>>,
}

impl PopTrace {
    fn record(&self, messages: &[Message]) {
        let index = self.pops.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_served.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for message in messages {
            first.entry(message.partition.clone()).or_insert(index);
        }
    }

    pub fn pops(&self) -> u64 {
        self.pops.load(Ordering::Relaxed)
    }

    /// For each partition served, how many pops were answered before its first one.
    pub fn first_served(&self) -> Vec<u64> {
        self.first_served.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values().copied().collect()
    }
}

/// Consumers of a stream, `per_group` for each of its groups, running until stopped.
pub struct Consumers {
    stop: Arc<AtomicBool>,
    tasks: JoinSet<()>,
}

impl Consumers {
    pub fn start(
        stream: &Arc<Stream>,
        client: &Client,
        per_group: usize,
        plan: PopPlan,
        trace: Option<Arc<PopTrace>>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        for group in 0..stream.group_count() {
            for _ in 0..per_group {
                let consumer = Consumer {
                    stream: stream.clone(),
                    client: client.clone(),
                    group,
                    plan,
                    trace: trace.clone(),
                    stop: stop.clone(),
                };
                tasks.spawn(consumer.run());
            }
        }
        Self { stop, tasks }
    }

    /// Asks every consumer to stop after its current pop, and waits for them.
    pub async fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        while self.tasks.join_next().await.is_some() {}
    }
}

struct Consumer {
    stream: Arc<Stream>,
    client: Client,
    group: usize,
    plan: PopPlan,
    trace: Option<Arc<PopTrace>>,
    stop: Arc<AtomicBool>,
}

impl Consumer {
    async fn run(self) {
        let stream = &self.stream;
        let mut pop = Pop::queue(stream.queue.as_str())
            .batch(u32::try_from(self.plan.batch).unwrap_or(u32::MAX))
            .partitions(u32::try_from(self.plan.partitions).unwrap_or(u32::MAX))
            .frames(self.plan.frames);
        if let Some(wait) = self.plan.wait {
            pop = pop.wait(wait);
        }
        if let Some(group) = &stream.groups[self.group] {
            pop = pop.group(group.as_str()).subscription_mode(SubscriptionMode::All);
        }
        while !self.stop.load(Ordering::Relaxed) {
            let messages = match self.client.pop(&pop).await {
                Ok(delivery) => delivery.messages,
                Err(error) => {
                    stream.errors.note(&stream.errors.pop, 1, format!("pop: {error}"));
                    tokio::time::sleep(ERROR_BACKOFF).await;
                    continue;
                }
            };
            if let Some(trace) = &self.trace {
                trace.record(&messages);
            }
            if messages.is_empty() {
                if self.plan.wait.is_none() {
                    tokio::time::sleep(EMPTY_POP_BACKOFF).await;
                }
                continue;
            }
            if let Some(latency) = &stream.latency {
                let generator = stream.ledger.generator();
                let stamps = messages.iter().filter_map(|m| m.json::<PayloadStamp>().ok());
                latency.record_all(stamps.map(|s| generator.latency_us(s)));
            }
            stream.ledger.record_deliveries(self.group, messages.iter().map(|m| m.transaction_id.as_str()));
            stream.delivered.fetch_add(messages.len() as u64, Ordering::Relaxed);
            self.ack(&messages).await;
        }
    }

    /// Acks the delivery in one batch, trying again on a failed call: acks are idempotent, and
    /// an ack that never lands leaves the messages leased until their lease expires.
    async fn ack(&self, messages: &[Message]) {
        let errors = &self.stream.errors;
        for attempt in 1..=ACK_ATTEMPTS {
            match self.client.ack_messages(messages, AckStatus::Completed).await {
                Ok(results) => {
                    let refused: Vec<&str> = results
                        .iter()
                        .filter(|r| !r.success)
                        .map(|r| r.error.as_deref().unwrap_or("refused"))
                        .collect();
                    if let Some(error) = refused.first() {
                        errors.note(&errors.ack_refused, refused.len() as u64, format!("ack refused: {error}"));
                    }
                    return;
                }
                Err(error) => {
                    errors.note(&errors.ack, 1, format!("ack (attempt {attempt}): {error}"));
                    tokio::time::sleep(ERROR_BACKOFF).await;
                }
            }
        }
    }
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    Complete,
    /// No group made progress for the stall time: what is missing is reported as lost.
    Stalled,
}

/// Waits until every group has received every queued message, or until none makes progress
/// for `stall`.
pub async fn wait_until_delivered(stream: &Stream, stall: Duration) -> Drained {
    let mut progress = stream.ledger.delivered_progress();
    let mut last_change = Instant::now();
    loop {
        if stream.ledger.all_delivered() {
            return Drained::Complete;
        }
        let now = stream.ledger.delivered_progress();
        if now != progress {
            progress = now;
            last_change = Instant::now();
        } else if last_change.elapsed() >= stall {
            return Drained::Stalled;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The measured part of a phase: counters and CPU at its start.
pub struct Window {
    cpu: CpuReading,
    pushed: u64,
    delivered: u64,
}

/// What happened in a window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Measured {
    pub pushed: u64,
    pub delivered: u64,
    pub cpu: CpuUsage,
}

impl Measured {
    pub fn seconds(&self) -> f64 {
        self.cpu.wall_s
    }

    pub fn pushed_per_s(&self) -> f64 {
        self.pushed as f64 / self.seconds().max(1e-9)
    }

    pub fn delivered_per_s(&self) -> f64 {
        self.delivered as f64 / self.seconds().max(1e-9)
    }
}

impl Window {
    pub fn open(stream: &Stream, watched: &Watched) -> Self {
        if let Some(latency) = &stream.latency {
            latency.reset();
        }
        Self {
            cpu: watched.read_cpu(),
            pushed: stream.pushed.load(Ordering::Relaxed),
            delivered: stream.delivered.load(Ordering::Relaxed),
        }
    }

    pub fn close(self, stream: &Stream, watched: &Watched) -> Measured {
        let cpu = watched.read_cpu().usage_since(&self.cpu);
        Measured {
            pushed: stream.pushed.load(Ordering::Relaxed) - self.pushed,
            delivered: stream.delivered.load(Ordering::Relaxed) - self.delivered,
            cpu,
        }
    }
}
