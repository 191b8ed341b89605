//! `announce`: the fleet's announcement traffic on a real PostgreSQL, without brokers.
//!
//! Every broker of a fleet keeps one LISTEN connection, and today every broker receives every
//! announcement (`p <queue id> <partition id> <queue>` on `queen_events`, see
//! `queen_store::events`). This simulates a fleet of N brokers as N LISTEN connections and a few
//! publishers that send announcements at a fixed rate the way the broker's announcer does: once
//! per 5 ms interval, everything due in one `pg_notify` statement committed asynchronously. Each
//! announcement carries its send time after the queue name, so the receivers measure the wake
//! latency.
//!
//! Two designs: `single`, today's one channel; `sharded`, a queue's announcements on one of C
//! channels by hash of the queue, each broker listening only to the channels of the queues it
//! serves (each queue is served by R brokers, chosen by hashing). A broker *needs* an
//! announcement when it serves the queue; only those count for the latency, in both designs.
//!
//! Times are taken on the bench's own clock (one process sends and receives), and a cell counts
//! the announcements *sent* in its measured window, however late they arrive.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client, NoTls};

use crate::cli::AnnounceArgs;
use crate::own_postgres::OwnPostgres;
use crate::procfs::Watched;
use crate::stats::Distribution;

/// The broker's announcer sends at most once per this interval.
const ANNOUNCER_INTERVAL: Duration = Duration::from_millis(5);
/// Today's channel, and the prefix of the sharded ones.
const CHANNEL: &str = "queen_events";
/// Connections opened at once while a fleet comes up.
const CONNECTING: usize = 8;
/// How often the NOTIFY queue's fill is sampled.
const QUEUE_SAMPLE: Duration = Duration::from_millis(100);
/// After the last send, how long deliveries may stop growing before the rest count as missed.
const DRAIN_STALL: Duration = Duration::from_secs(3);
/// Longest wait for the deliveries after the last send.
const DRAIN_MAX: Duration = Duration::from_secs(60);
/// The saturation search goes no lower.
const MIN_SATURATION_RATE: u32 = 50;
/// Share of the offered announcements the publishers must send for a cell to keep up.
const SENT_SHARE: f64 = 0.99;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Design {
    /// One channel, every broker listens to it (today)
    Single,
    /// A queue's announcements on one of C channels; a broker listens to those of its queues
    Sharded,
}

impl Design {
    fn as_str(self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::Sharded => "sharded",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AnnounceError {
    #[error(transparent)]
    Postgres(#[from] crate::own_postgres::OwnPostgresError),
    #[error("announce: {0}")]
    Sql(#[from] tokio_postgres::Error),
    #[error("announce: a task stopped: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What one cell is asked to do.
#[derive(Debug, Clone, Copy)]
struct Load {
    design: Design,
    brokers: usize,
    rate: u32,
    warmup: Duration,
    duration: Duration,
}

/// Runs every (design, fleet size) cell, then the saturation searches; returns the report.
pub async fn run(args: AnnounceArgs) -> Result<String, AnnounceError> {
    let largest = args.brokers.iter().copied().max().unwrap_or(0);
    // The fleet, the publishers, a monitor, and room for psql.
    let max_connections = (largest + args.publishers + 20).max(100);
    let settings = vec![("max_connections".to_owned(), max_connections.to_string())];
    let postgres = OwnPostgres::start("announce", args.pg_dir.clone(), settings).await?;
    let result = measure(&args, &postgres).await;
    postgres.stop().await;
    result
}

async fn measure(args: &AnnounceArgs, postgres: &OwnPostgres) -> Result<String, AnnounceError> {
    let mut cells = Vec::new();
    for &design in &args.designs {
        for &brokers in &args.brokers {
            let load = Load { design, brokers, rate: args.rate, warmup: args.warmup, duration: args.duration };
            tracing::info!(design = design.as_str(), brokers, rate = args.rate, "announce cell");
            cells.push(run_cell(args, postgres, load).await?);
        }
    }
    let mut out = header(args);
    out.push_str(&table(&cells, args.latency_bound));
    let largest = args.brokers.iter().copied().max().unwrap_or(0);
    for &design in &args.saturate {
        let steps = saturate(args, postgres, design, largest).await?;
        let verdict = match (
            steps.iter().filter(|s| s.kept_up(args.latency_bound).is_ok()).map(|s| s.load.rate).max(),
            steps.iter().filter(|s| s.kept_up(args.latency_bound).is_err()).map(|s| s.load.rate).min(),
        ) {
            (Some(good), Some(bad)) => format!("kept up with {good}/s, not with {bad}/s"),
            (Some(good), None) => format!("kept up with every rate tried, up to {good}/s"),
            (None, Some(bad)) => format!("kept up with no rate tried, from {bad}/s"),
            (None, None) => "no step ran".to_owned(),
        };
        out.push_str(&format!("\nSaturation search, `{}` at {largest} brokers: {verdict}.\n\n", design.as_str()));
        out.push_str(&table(&steps, args.latency_bound));
    }
    Ok(out)
}

/// Doubles the offered rate until a step is not kept up with (or halves it until one is, if the
/// first is not), then tries the middle of the last two once.
async fn saturate(
    args: &AnnounceArgs,
    postgres: &OwnPostgres,
    design: Design,
    brokers: usize,
) -> Result<Vec<Cell>, AnnounceError> {
    let warmup = args.warmup.min(Duration::from_secs(1));
    let step = |rate| Load { design, brokers, rate, warmup, duration: args.saturate_step };
    let mut steps: Vec<Cell> = Vec::new();
    let (mut good, mut bad): (Option<u32>, Option<u32>) = (None, None);
    let mut rate = args.saturate_from.max(MIN_SATURATION_RATE);
    loop {
        tracing::info!(design = design.as_str(), brokers, rate, "saturation step");
        let cell = run_cell(args, postgres, step(rate)).await?;
        let kept_up = cell.kept_up(args.latency_bound).is_ok();
        steps.push(cell);
        if kept_up {
            good = Some(rate);
            if bad.is_some() || rate >= args.saturate_max {
                break;
            }
            rate = rate.saturating_mul(2).min(args.saturate_max);
        } else {
            bad = Some(rate);
            if good.is_some() || rate / 2 < MIN_SATURATION_RATE {
                break;
            }
            rate /= 2;
        }
    }
    if let (Some(good), Some(bad)) = (good, bad) {
        let middle = good.min(bad) + good.abs_diff(bad) / 2;
        tracing::info!(design = design.as_str(), brokers, rate = middle, "saturation step");
        steps.push(run_cell(args, postgres, step(middle)).await?);
    }
    Ok(steps)
}

/// Who listens to what, and who needs what.
struct Layout {
    channels: Vec<String>,
    /// The channel of each queue's announcements.
    queue_channel: Vec<usize>,
    /// For each broker, whether it serves each queue.
    serves: Vec<Vec<bool>>,
    /// For each broker, the channels it listens on.
    listens: Vec<Vec<usize>>,
    /// Brokers listening on each channel.
    listeners: Vec<u64>,
    /// Brokers serving each queue.
    servers_per_queue: u64,
}

impl Layout {
    fn new(design: Design, brokers: usize, args: &AnnounceArgs) -> Self {
        let servers = args.brokers_per_queue.clamp(1, brokers.max(1));
        // Rendezvous hashing: the brokers ranking highest for a queue serve it.
        let servers_of: Vec<Vec<usize>> = (0..args.queues)
            .map(|queue| {
                let mut ranked: Vec<usize> = (0..brokers).collect();
                ranked.sort_by_key(|&b| std::cmp::Reverse(mix(((queue as u64) << 20) | b as u64)));
                ranked.truncate(servers);
                ranked
            })
            .collect();
        let serves: Vec<Vec<bool>> =
            (0..brokers).map(|b| servers_of.iter().map(|of| of.contains(&b)).collect()).collect();
        let (channels, queue_channel): (Vec<String>, Vec<usize>) = match design {
            Design::Single => (vec![CHANNEL.to_owned()], vec![0; args.queues]),
            Design::Sharded => {
                let count = args.channels.max(1);
                let names = (0..count).map(|k| format!("{CHANNEL}_{k}")).collect();
                (names, (0..args.queues).map(|q| (mix(q as u64) % count as u64) as usize).collect())
            }
        };
        let listens: Vec<Vec<usize>> = serves
            .iter()
            .map(|queues| {
                let mut mine: Vec<usize> = match design {
                    Design::Single => vec![0],
                    Design::Sharded => (0..args.queues).filter(|&q| queues[q]).map(|q| queue_channel[q]).collect(),
                };
                mine.sort_unstable();
                mine.dedup();
                mine
            })
            .collect();
        let mut listeners = vec![0; channels.len()];
        for &channel in listens.iter().flatten() {
            listeners[channel] += 1;
        }
        Self { channels, queue_channel, serves, listens, listeners, servers_per_queue: servers as u64 }
    }
}

/// splitmix64: the bench's stand-in for a hash and for randomness, the same in every run.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What every task of a cell shares: the clock, the measured window (by send time, in µs since
/// `epoch`; nothing is in it until it is set) and the deliveries of the window so far.
struct Shared {
    epoch: Instant,
    window_start_us: AtomicU64,
    window_end_us: AtomicU64,
    delivered: AtomicU64,
}

impl Shared {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn in_window(&self, sent_us: u64) -> bool {
        sent_us >= self.window_start_us.load(Ordering::Relaxed) && sent_us < self.window_end_us.load(Ordering::Relaxed)
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static histogram bounds are valid")
}

/// What one broker received of the window's announcements.
struct Received {
    delivered: u64,
    bytes: u64,
    needed: u64,
    latency_us: Histogram<u64>,
    error: Option<String>,
}

/// The queue index and send time of an announcement: `p <queue id> <partition id> <queue> <µs>`.
fn parse(payload: &str) -> Option<(usize, u64)> {
    let (rest, sent) = payload.rsplit_once(' ')?;
    let queue_id: usize = rest.strip_prefix("p ")?.split(' ').next()?.parse().ok()?;
    Some((queue_id.checked_sub(1)?, sent.parse().ok()?))
}

/// Opens a broker's LISTEN connection; its task reads notifications until `stop`.
async fn listen(
    url: &str,
    layout: &Arc<Layout>,
    broker: usize,
    shared: &Arc<Shared>,
    stop: &watch::Receiver<bool>,
) -> Result<(Client, JoinHandle<Received>), AnnounceError> {
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await?;
    let statements: String =
        layout.listens[broker].iter().map(|&c| format!("LISTEN {};", layout.channels[c])).collect();
    let (layout, shared, mut stop) = (layout.clone(), shared.clone(), stop.clone());
    let task = tokio::spawn(async move {
        let mut received = Received { delivered: 0, bytes: 0, needed: 0, latency_us: histogram(), error: None };
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        loop {
            let message = tokio::select! {
                biased;
                _ = stop.changed() => break,
                message = messages.next() => message,
            };
            let notice = match message {
                Some(Ok(AsyncMessage::Notification(notice))) => notice,
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    received.error = Some(e.to_string());
                    break;
                }
                None => break,
            };
            let Some((queue, sent_us)) = parse(notice.payload()) else { continue };
            if !shared.in_window(sent_us) {
                continue;
            }
            received.delivered += 1;
            // NotificationResponse: type, length, pid, channel and payload NUL-terminated.
            received.bytes += (1 + 4 + 4 + notice.channel().len() + 1 + notice.payload().len() + 1) as u64;
            shared.delivered.fetch_add(1, Ordering::Relaxed);
            if layout.serves[broker].get(queue).copied().unwrap_or(false) {
                received.needed += 1;
                received.latency_us.saturating_record(shared.now_us().saturating_sub(sent_us).max(1));
            }
        }
        received
    });
    client.batch_execute(&statements).await?;
    Ok((client, task))
}

/// What one publisher sent in the window.
struct Sent {
    announcements: u64,
    /// Deliveries the window's announcements should make, over every listening broker.
    deliveries: u64,
    /// Of them, to brokers that need them.
    needed: u64,
    statement_us: Histogram<u64>,
    errors: u64,
    last_error: Option<String>,
}

/// One publisher: once per announcer interval, everything due of its share of the rate, in one
/// statement, as the announcer sends what it collected.
async fn publish(
    client: Client,
    layout: Arc<Layout>,
    shared: Arc<Shared>,
    args: PublisherShape,
) -> Result<Sent, AnnounceError> {
    let statement = client
        .prepare(
            "SELECT set_config('synchronous_commit', 'off', true), pg_notify(c, e)
               FROM unnest($1::text[], $2::text[]) AS t(c, e)",
        )
        .await?;
    let per_second = args.rate / args.publishers as f64;
    let mut sent =
        Sent { announcements: 0, deliveries: 0, needed: 0, statement_us: histogram(), errors: 0, last_error: None };
    let mut ticks = tokio::time::interval(ANNOUNCER_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end_us = shared.window_end_us.load(Ordering::Relaxed);
    let mut next = 0u64;
    loop {
        ticks.tick().await;
        let now_us = shared.now_us();
        if now_us >= end_us {
            break;
        }
        let due = (per_second * now_us as f64 / 1e6) as u64;
        if due <= next {
            continue;
        }
        let mut picks: Vec<(usize, u64)> = (next..due)
            .map(|k| {
                let seq = k * args.publishers as u64 + args.index as u64;
                let queue = (mix(seq) % args.queues as u64) as usize;
                let partition = mix(seq ^ 0x5EED) % args.partitions_per_queue as u64;
                (queue, queue as u64 * args.partitions_per_queue as u64 + partition + 1)
            })
            .collect();
        // PostgreSQL folds equal notices of one transaction into one, and the announcer
        // collects a set: a partition is announced once per statement.
        picks.sort_unstable();
        picks.dedup();
        next = due;
        let sent_us = shared.now_us();
        let channels: Vec<&str> =
            picks.iter().map(|&(q, _)| layout.channels[layout.queue_channel[q]].as_str()).collect();
        let payloads: Vec<String> =
            picks.iter().map(|&(q, partition)| format!("p {} {partition} bench-q{q:04} {sent_us}", q + 1)).collect();
        match client.execute(&statement, &[&channels, &payloads]).await {
            Ok(_) => {
                sent.statement_us.saturating_record((shared.now_us() - sent_us).max(1));
                if shared.in_window(sent_us) {
                    sent.announcements += picks.len() as u64;
                    sent.deliveries +=
                        picks.iter().map(|&(q, _)| layout.listeners[layout.queue_channel[q]]).sum::<u64>();
                    sent.needed += picks.len() as u64 * layout.servers_per_queue;
                }
            }
            Err(e) => {
                sent.errors += 1;
                sent.last_error = Some(e.to_string());
            }
        }
    }
    Ok(sent)
}

#[derive(Debug, Clone, Copy)]
struct PublisherShape {
    index: usize,
    publishers: usize,
    rate: f64,
    queues: usize,
    partitions_per_queue: usize,
}

/// The largest fill of the NOTIFY queue until `end_us`, sampled.
async fn watch_queue(client: Client, shared: Arc<Shared>) -> Result<f64, AnnounceError> {
    let mut largest = 0f64;
    while shared.now_us() < shared.window_end_us.load(Ordering::Relaxed) {
        let usage: f64 = client.query_one("SELECT pg_notification_queue_usage()", &[]).await?.get(0);
        largest = largest.max(usage);
        tokio::time::sleep(QUEUE_SAMPLE).await;
    }
    Ok(largest)
}

/// What one cell measured.
struct Cell {
    load: Load,
    channels_per_broker: f64,
    offered: u64,
    sent: u64,
    statement_ms: Option<Distribution>,
    errors: Vec<String>,
    delivered: u64,
    per_broker_max: u64,
    bytes: u64,
    needed_expected: u64,
    needed: u64,
    latency_ms: Option<Distribution>,
    queue_usage_max: f64,
    postgres_cores: Option<f64>,
    bench_cores: Option<f64>,
    /// Everything else the machine ran meanwhile, the kernel's networking included.
    other_cores: Option<f64>,
}

impl Cell {
    fn per_second(&self, count: u64) -> f64 {
        count as f64 / self.load.duration.as_secs_f64()
    }

    /// `Ok` when the publishers sent the offered rate and every broker got what it needed in
    /// time; otherwise why not.
    fn kept_up(&self, latency_bound: Duration) -> Result<(), String> {
        let mut why = Vec::new();
        if (self.sent as f64) < self.offered as f64 * SENT_SHARE {
            why.push(format!("sent {} of {} offered", self.sent, self.offered));
        }
        if self.needed < self.needed_expected {
            why.push(format!("{} needed deliveries missed", self.needed_expected - self.needed));
        }
        if let Some(p99) = self.latency_ms.map(|l| l.p99)
            && p99 > latency_bound.as_secs_f64() * 1000.0
        {
            why.push(format!("p99 {p99:.0} ms > {} ms", latency_bound.as_millis()));
        }
        if !self.errors.is_empty() {
            why.push(format!("{} errors, e.g. {}", self.errors.len(), self.errors[0]));
        }
        if why.is_empty() { Ok(()) } else { Err(why.join("; ")) }
    }
}

async fn run_cell(args: &AnnounceArgs, postgres: &OwnPostgres, load: Load) -> Result<Cell, AnnounceError> {
    let layout = Arc::new(Layout::new(load.design, load.brokers, args));
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        window_start_us: AtomicU64::new(u64::MAX),
        window_end_us: AtomicU64::new(u64::MAX),
        delivered: AtomicU64::new(0),
    });
    let url = postgres.database_url.as_str();
    let (stop, stopped) = watch::channel(false);
    let fleet: Vec<(Client, JoinHandle<Received>)> = futures::stream::iter(0..load.brokers)
        .map(|broker| listen(url, &layout, broker, &shared, &stopped))
        .buffer_unordered(CONNECTING)
        .try_collect()
        .await?;
    let mut publishers = Vec::new();
    for _ in 0..args.publishers.max(1) {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
        tokio::spawn(connection);
        publishers.push(client);
    }
    let (monitor, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);

    // The window is set before anything is sent: publishers stop at its end.
    let start_us = shared.now_us() + load.warmup.as_micros() as u64;
    shared.window_start_us.store(start_us, Ordering::Relaxed);
    shared.window_end_us.store(start_us + load.duration.as_micros() as u64, Ordering::Relaxed);
    let count = publishers.len();
    let sending: Vec<_> = publishers
        .into_iter()
        .enumerate()
        .map(|(index, client)| {
            let shape = PublisherShape {
                index,
                publishers: count,
                rate: load.rate as f64,
                queues: args.queues.max(1),
                partitions_per_queue: args.partitions_per_queue.max(1),
            };
            tokio::spawn(publish(client, layout.clone(), shared.clone(), shape))
        })
        .collect();
    tokio::time::sleep(load.warmup).await;
    let watched = Watched { broker: None, postgres: postgres.postmaster };
    let cpu_start = watched.read_cpu();
    let queue_usage_max = watch_queue(monitor, shared.clone()).await?;
    let cpu = watched.read_cpu().usage_since(&cpu_start);

    let mut sent = Vec::new();
    for task in sending {
        sent.push(task.await??);
    }
    let expected: u64 = sent.iter().map(|s| s.deliveries).sum();
    wait_for_deliveries(&shared, expected).await;
    let _ = stop.send(true);
    let mut received = Vec::new();
    for (client, task) in fleet {
        received.push(task.await?);
        drop(client);
    }

    let mut latency = histogram();
    let mut statement = histogram();
    for r in &received {
        let _ = latency.add(&r.latency_us);
    }
    for s in &sent {
        let _ = statement.add(&s.statement_us);
    }
    let errors = sent
        .iter()
        .filter_map(|s| s.last_error.as_ref().map(|e| format!("{} failed NOTIFY statements: {e}", s.errors)))
        .chain(received.iter().filter_map(|r| r.error.clone()))
        .collect();
    Ok(Cell {
        load,
        channels_per_broker: layout.listens.iter().map(Vec::len).sum::<usize>() as f64 / load.brokers.max(1) as f64,
        offered: (load.rate as f64 * load.duration.as_secs_f64()) as u64,
        sent: sent.iter().map(|s| s.announcements).sum(),
        statement_ms: Distribution::of_histogram(&statement, 1000.0),
        errors,
        delivered: received.iter().map(|r| r.delivered).sum(),
        per_broker_max: received.iter().map(|r| r.delivered).max().unwrap_or(0),
        bytes: received.iter().map(|r| r.bytes).sum(),
        needed_expected: sent.iter().map(|s| s.needed).sum(),
        needed: received.iter().map(|r| r.needed).sum(),
        latency_ms: Distribution::of_histogram(&latency, 1000.0),
        queue_usage_max,
        postgres_cores: cpu.postgres_s.map(|s| s / cpu.wall_s),
        bench_cores: cpu.bench_s.map(|s| s / cpu.wall_s),
        other_cores: cpu.other_s.map(|s| s / cpu.wall_s),
    })
}

/// Waits until the brokers received every delivery the window's announcements should make, or
/// deliveries stop coming.
async fn wait_for_deliveries(shared: &Shared, expected: u64) {
    let started = Instant::now();
    let (mut last, mut last_change) = (shared.delivered.load(Ordering::Relaxed), Instant::now());
    while last < expected && last_change.elapsed() < DRAIN_STALL && started.elapsed() < DRAIN_MAX {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = shared.delivered.load(Ordering::Relaxed);
        if now != last {
            (last, last_change) = (now, Instant::now());
        }
    }
}

fn header(args: &AnnounceArgs) -> String {
    format!(
        "Announcements over {} queues ({} partitions each), sent by {} publishers once per {} ms; each queue served \
         by {} brokers; sharded over {} channels. Rates are per second of the measured window ({} s, after {} s \
         of warm-up); *useful* is the share of deliveries the receiving broker needed; wake latency is send to \
         receipt at a broker that needs it.\n\n",
        args.queues,
        args.partitions_per_queue,
        args.publishers,
        ANNOUNCER_INTERVAL.as_millis(),
        args.brokers_per_queue,
        args.channels,
        args.duration.as_secs_f64(),
        args.warmup.as_secs_f64(),
    )
}

fn table(cells: &[Cell], latency_bound: Duration) -> String {
    let mut out = String::from(
        "| design | brokers | channels / broker | offered /s | sent /s | NOTIFY stmt ms p50 / p99 | delivered /s \
         (all brokers) | per broker /s mean / max | useful | delivered KB/s | wake ms p50 / p99 / max | needed \
         missed | NOTIFY queue max | cores PG / bench / other | kept up |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for cell in cells {
        let ms = |d: Option<Distribution>, f: fn(&Distribution) -> String| d.as_ref().map_or("–".to_owned(), f);
        let cores = |c: Option<f64>| c.map_or("–".to_owned(), |c| format!("{c:.2}"));
        let per_broker = cell.per_second(cell.delivered) / cell.load.brokers.max(1) as f64;
        let useful = if cell.delivered == 0 { 0.0 } else { cell.needed as f64 / cell.delivered as f64 * 100.0 };
        out.push_str(&format!(
            "| {} | {} | {:.1} | {} | {:.0} | {} | {:.0} | {:.0} / {:.0} | {useful:.0} % | {:.0} | {} | {} | {:.4} % | {} / {} / {} | {} |\n",
            cell.load.design.as_str(),
            cell.load.brokers,
            cell.channels_per_broker,
            cell.load.rate,
            cell.per_second(cell.sent),
            ms(cell.statement_ms, |d| format!("{:.1} / {:.1}", d.p50, d.p99)),
            cell.per_second(cell.delivered),
            per_broker,
            cell.per_second(cell.per_broker_max),
            cell.per_second(cell.bytes) / 1000.0,
            ms(cell.latency_ms, |d| format!("{:.1} / {:.1} / {:.1}", d.p50, d.p99, d.max)),
            cell.needed_expected.saturating_sub(cell.needed),
            cell.queue_usage_max * 100.0,
            cores(cell.postgres_cores),
            cores(cell.bench_cores),
            cores(cell.other_cores),
            match cell.kept_up(latency_bound) {
                Ok(()) => "yes".to_owned(),
                Err(why) => format!("no: {why}"),
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> AnnounceArgs {
        let mut argv = vec!["queen-bench", "announce"];
        argv.extend(extra);
        match crate::cli::Cli::parse_from(argv).command {
            crate::cli::Command::Announce(args) => args,
            _ => unreachable!(),
        }
    }

    #[test]
    fn announcements_carry_their_queue_and_send_time() {
        assert_eq!(parse("p 42 4107 bench-q0041 123456"), Some((41, 123456)));
        assert_eq!(parse("p 0 1 q 5"), None, "queue ids start at 1");
        assert_eq!(parse("r 3 group"), None);
    }

    #[test]
    fn every_queue_has_its_servers_and_the_sharded_brokers_hear_only_their_channels() {
        let args = args(&["--queues", "100", "--channels", "8", "--brokers-per-queue", "3"]);
        let single = Layout::new(Design::Single, 30, &args);
        assert_eq!(single.listeners, vec![30]);
        let sharded = Layout::new(Design::Sharded, 30, &args);
        for queue in 0..100 {
            let servers: Vec<usize> = (0..30).filter(|&b| sharded.serves[b][queue]).collect();
            assert_eq!(servers.len(), 3);
            for b in servers {
                assert!(sharded.listens[b].contains(&sharded.queue_channel[queue]));
            }
        }
        assert_eq!(sharded.listeners.iter().sum::<u64>(), sharded.listens.iter().map(|l| l.len() as u64).sum::<u64>());
        // Fewer brokers than servers per queue: every broker serves every queue.
        let small = Layout::new(Design::Sharded, 2, &args);
        assert_eq!(small.servers_per_queue, 2);
        assert!(small.serves.iter().all(|queues| queues.iter().all(|&s| s)));
    }
}
