//! The named scenarios, what they share (the harness), and what each one reports.

mod latency;
mod partitions;
mod sustain;
mod throughput;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

pub use self::sustain::Sustain;
#[cfg(test)]
pub use self::sustain::SustainStep;
use crate::cli::LoadArgs;
use crate::generator::MessageGenerator;
use crate::ledger::Verification;
use crate::procfs::Watched;
use crate::stats::Distribution;
use crate::workload::{
    CONSUMER_LONG_POLL, Consumers, Drained, ErrorCounts, Measured, Partitioning, PopPlan, Stream, Until, Window,
    produce, wait_until_delivered,
};

/// How long a drain may go without any group making progress before what is missing is
/// declared lost.
const DRAIN_STALL: Duration = Duration::from_secs(20);
/// Pops of the drain that verifies push-only scenarios and empties backlogs between phases:
/// large and across many partitions (Queen's default `pop.max_partitions`), so it is quick.
const DRAIN_POP: PopPlan = PopPlan { batch: 1000, partitions: 100, wait: Some(CONSUMER_LONG_POLL), frames: false };
/// Consumers of that drain.
const DRAIN_CONSUMERS: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum ScenarioName {
    #[value(name = "push-b1")]
    PushB1,
    #[value(name = "push-b10")]
    PushB10,
    #[value(name = "push-b100")]
    PushB100,
    #[value(name = "consume")]
    Consume,
    #[value(name = "fanout-0")]
    Fanout0,
    #[value(name = "fanout-1")]
    Fanout1,
    #[value(name = "fanout-5")]
    Fanout5,
    #[value(name = "fanout-10")]
    Fanout10,
    #[value(name = "sustain-1")]
    Sustain1,
    #[value(name = "sustain-10")]
    Sustain10,
    #[value(name = "partitions-1")]
    Partitions1,
    #[value(name = "partitions-1000")]
    Partitions1000,
    #[value(name = "partitions-10000")]
    Partitions10000,
    #[value(name = "e2e-latency")]
    E2eLatency,
}

impl ScenarioName {
    pub const ALL: [ScenarioName; 14] = [
        Self::PushB1,
        Self::PushB10,
        Self::PushB100,
        Self::Consume,
        Self::Fanout0,
        Self::Fanout1,
        Self::Fanout5,
        Self::Fanout10,
        Self::Sustain1,
        Self::Sustain10,
        Self::Partitions1,
        Self::Partitions1000,
        Self::Partitions10000,
        Self::E2eLatency,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::PushB1 => "push-b1",
            Self::PushB10 => "push-b10",
            Self::PushB100 => "push-b100",
            Self::Consume => "consume",
            Self::Fanout0 => "fanout-0",
            Self::Fanout1 => "fanout-1",
            Self::Fanout5 => "fanout-5",
            Self::Fanout10 => "fanout-10",
            Self::Sustain1 => "sustain-1",
            Self::Sustain10 => "sustain-10",
            Self::Partitions1 => "partitions-1",
            Self::Partitions1000 => "partitions-1000",
            Self::Partitions10000 => "partitions-10000",
            Self::E2eLatency => "e2e-latency",
        }
    }

    /// The unconstrained fan-out scenario a sustain scenario is read next to.
    pub fn fanout_of_sustain(self) -> Option<ScenarioName> {
        match self {
            Self::Sustain1 => Some(Self::Fanout1),
            Self::Sustain10 => Some(Self::Fanout10),
            _ => None,
        }
    }
}

impl std::fmt::Display for ScenarioName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Fairness of queue-wide pops: for each partition, how many pops came before its first one.
#[derive(Debug, Clone, Serialize)]
pub struct Fairness {
    pub partitions: usize,
    pub partitions_served: usize,
    pub pops: u64,
    pub pops_before_first_served: Option<Distribution>,
}

/// How queue-wide pops found their candidates, from the broker's
/// `queen_pop_candidate_plans_total`, over one phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CandidatePlans {
    pub full: u64,
    pub candidates: u64,
    pub skipped: u64,
}

/// Everything one scenario measured and verified.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub scenario: ScenarioName,
    /// The load, in words.
    pub shape: String,
    /// The measured window; `None` when the scenario failed before it.
    pub measured: Option<Measured>,
    pub pushed_per_s: Option<f64>,
    pub delivered_per_s: Option<f64>,
    /// End-to-end latency in milliseconds, where consumers ran while producers pushed.
    pub latency_ms: Option<Distribution>,
    /// Broker CPU seconds per million messages (a push and a delivery each count as one).
    pub broker_cpu_s_per_million: Option<f64>,
    pub peak_broker_rss_bytes: Option<u64>,
    pub fairness: Option<Fairness>,
    pub candidate_plans: Option<CandidatePlans>,
    /// The rate search of the sustain scenarios.
    pub sustain: Option<Sustain>,
    pub verification: Vec<Verification>,
    pub errors: ErrorCounts,
    /// Why the scenario could not complete, if it could not.
    pub failure: Option<String>,
}

impl ScenarioReport {
    /// Every message accounted for and nothing went wrong that invalidates the figures.
    pub fn passed(&self) -> bool {
        self.failure.is_none() && !self.verification.is_empty() && self.verification.iter().all(Verification::passed)
    }

    /// A scenario that could not run at all.
    pub fn failed(scenario: ScenarioName, failure: String) -> Self {
        Self {
            scenario,
            shape: String::new(),
            measured: None,
            pushed_per_s: None,
            delivered_per_s: None,
            latency_ms: None,
            broker_cpu_s_per_million: None,
            peak_broker_rss_bytes: None,
            fairness: None,
            candidate_plans: None,
            sustain: None,
            verification: Vec::new(),
            errors: ErrorCounts::default(),
            failure: Some(failure),
        }
    }
}

/// What a scenario hands back to the harness, which adds the resource figures.
#[derive(Debug, Default)]
struct Outcome {
    shape: String,
    measured: Option<Measured>,
    latency_ms: Option<Distribution>,
    fairness: Option<Fairness>,
    candidate_plans: Option<CandidatePlans>,
    sustain: Option<Sustain>,
    streams: Vec<Arc<Stream>>,
    failure: Option<String>,
}

/// What every scenario runs with.
pub struct Harness {
    pub client: queen_client::Client,
    pub load: LoadArgs,
    pub watched: Watched,
    /// Makes queue names unique, so runs against a long-lived broker do not meet old data.
    pub run_id: String,
    /// Zero of every payload's send time.
    pub epoch: Instant,
}

impl Harness {
    pub fn new(client: queen_client::Client, load: LoadArgs, watched: Watched) -> Self {
        let run_id = format!("{:x}", chrono::Utc::now().timestamp_millis());
        Self { client, load, watched, run_id, epoch: Instant::now() }
    }

    /// Runs the scenario, verifies every stream and reads the broker's resources.
    pub async fn run(&self, scenario: ScenarioName) -> ScenarioReport {
        let outcome = match scenario {
            ScenarioName::PushB1 => throughput::push(self, scenario, 1).await,
            ScenarioName::PushB10 => throughput::push(self, scenario, 10).await,
            ScenarioName::PushB100 => throughput::push(self, scenario, 100).await,
            ScenarioName::Consume => throughput::consume(self, scenario).await,
            ScenarioName::Fanout0 => throughput::fanout(self, scenario, 0).await,
            ScenarioName::Fanout1 => throughput::fanout(self, scenario, 1).await,
            ScenarioName::Fanout5 => throughput::fanout(self, scenario, 5).await,
            ScenarioName::Fanout10 => throughput::fanout(self, scenario, 10).await,
            ScenarioName::Sustain1 => sustain::sustain(self, scenario, 1).await,
            ScenarioName::Sustain10 => sustain::sustain(self, scenario, 10).await,
            ScenarioName::Partitions1 => partitions::throughput(self, scenario, 1).await,
            ScenarioName::Partitions1000 => partitions::with_fairness(self, scenario, 1000).await,
            ScenarioName::Partitions10000 => partitions::with_candidate_plans(self, scenario, 10_000).await,
            ScenarioName::E2eLatency => latency::e2e(self, scenario).await,
        };
        self.report(scenario, outcome)
    }

    fn report(&self, scenario: ScenarioName, outcome: Outcome) -> ScenarioReport {
        let mut errors = ErrorCounts::default();
        for stream in &outcome.streams {
            errors.merge(stream.errors.counts());
        }
        let verification = outcome.streams.iter().map(|s| s.ledger.verify()).collect();
        let measured = outcome.measured;
        let broker_cpu_s_per_million = measured.and_then(|m| {
            let messages = (m.pushed + m.delivered) as f64;
            (messages > 0.0).then_some(m.cpu.broker_s? / (messages / 1e6))
        });
        ScenarioReport {
            scenario,
            shape: outcome.shape,
            measured,
            pushed_per_s: measured.map(|m| m.pushed_per_s()),
            delivered_per_s: measured.map(|m| m.delivered_per_s()),
            latency_ms: outcome.latency_ms,
            broker_cpu_s_per_million,
            peak_broker_rss_bytes: self.watched.peak_broker_rss(),
            fairness: outcome.fairness,
            candidate_plans: outcome.candidate_plans,
            sustain: outcome.sustain,
            verification,
            errors,
            failure: outcome.failure,
        }
    }

    /// A stream on a queue of its own, whose transaction ids are `<name>-<seq>`.
    fn stream(&self, name: &str, groups: Vec<Option<String>>, measure_latency: bool) -> Arc<Stream> {
        let queue = format!("bench-{}-{name}", self.run_id);
        let stream = Stream::new(queue, MessageGenerator::new(name, self.epoch), groups, measure_latency);
        Arc::new(stream.with_binary_pushes(self.load.binary_pushes))
    }

    /// How consumers pop while producers push: long polls of the configured size.
    fn consumer_pops(&self) -> PopPlan {
        PopPlan {
            batch: self.load.pop_batch,
            partitions: self.load.pop_partitions,
            wait: Some(CONSUMER_LONG_POLL),
            frames: self.load.framed_pops,
        }
    }

    /// Pushes with `connections` producers for the warm-up and then the measured duration;
    /// whatever consumers the caller started keep running. The window closes when the last
    /// producer's last request is answered.
    async fn timed_push(
        &self,
        stream: &Arc<Stream>,
        connections: usize,
        batch: usize,
        partitioning: Partitioning,
    ) -> Measured {
        let deadline = Instant::now() + self.load.warmup + self.load.duration;
        let producers = self.spawn_producers(stream, connections, batch, partitioning, Until::Deadline(deadline));
        tokio::time::sleep(self.load.warmup).await;
        let window = Window::open(stream, &self.watched);
        futures::future::join_all(producers).await;
        window.close(stream, &self.watched)
    }

    /// Pushes exactly `messages` messages as fast as `connections` producers can.
    async fn prefill(&self, stream: &Arc<Stream>, messages: u64, batch: usize, partitioning: Partitioning) {
        let producers =
            self.spawn_producers(stream, self.load.connections, batch, partitioning, Until::Messages(messages));
        futures::future::join_all(producers).await;
    }

    fn spawn_producers(
        &self,
        stream: &Arc<Stream>,
        connections: usize,
        batch: usize,
        partitioning: Partitioning,
        until: Until,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        (0..connections)
            .map(|_| tokio::spawn(produce(stream.clone(), self.client.clone(), batch, partitioning, until)))
            .collect()
    }

    /// Waits for the running consumers to receive everything, then stops them. `Err` names
    /// what could not be drained.
    async fn finish(&self, stream: &Stream, consumers: Consumers) -> Result<(), String> {
        let drained = wait_until_delivered(stream, DRAIN_STALL).await;
        consumers.stop().await;
        match drained {
            Drained::Complete => Ok(()),
            Drained::Stalled => Err(format!(
                "{}: the consumers made no progress for {}s with messages missing",
                stream.queue,
                DRAIN_STALL.as_secs()
            )),
        }
    }

    /// Consumes everything a push-only phase left, with drain consumers.
    async fn drain(&self, stream: &Arc<Stream>) -> Result<(), String> {
        let consumers = Consumers::start(stream, &self.client, DRAIN_CONSUMERS, DRAIN_POP, None);
        self.finish(stream, consumers).await
    }
}
