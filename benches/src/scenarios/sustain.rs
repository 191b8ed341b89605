//! Sustainable fan-out: the highest paced push rate at which every consumer group keeps up.
//!
//! The fan-out scenarios push as fast as they can, so their consumers always fall behind and the
//! figure mixes the push and the delivery side. Here producers offer a fixed rate, step by step:
//! doubling from `--sustain-start` until a step is not kept up with, then bisecting between the
//! last rate kept up with and the first that was not. Between steps the groups catch up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{Harness, Outcome, ScenarioName};
use crate::stats::Distribution;
use crate::workload::{
    Consumers, Drained, Measured, Partitioning, Stream, Window, produce_scheduled, wait_until_delivered,
};

/// Batch of the producers, as in the fan-out scenarios.
const PUSH_BATCH: usize = 10;
/// How often each group's lag is sampled during a step.
const LAG_SAMPLE: Duration = Duration::from_millis(50);
/// A group keeps up when its lag never exceeds this much of the offered rate (plus a pop batch).
const LAG_SECONDS: f64 = 1.0;
/// A step is kept up with only if the producers pushed at least this share of the offered rate.
const MIN_PUSHED_SHARE: f64 = 0.95;
/// A step is kept up with only if the groups received at least this share of the step's pushes
/// times the groups; the rest is what may be in flight at its end. A group that receives less is
/// falling behind, even while its lag is still under the bound.
const MIN_DELIVERED_SHARE: f64 = 0.95;
/// Factor between steps until one is not kept up with.
const GROWTH: f64 = 2.0;
/// Bisection stops when the bracket is narrower than this share of the failed rate.
const BRACKET_SHARE: f64 = 0.05;
/// How long the groups may take to catch up after a step; a backlog that takes longer ends the
/// search, as the next step would start behind.
const CATCH_UP: Duration = Duration::from_secs(15);

/// One offered rate, held for a step.
#[derive(Debug, Clone, Serialize)]
pub struct SustainStep {
    pub offered_per_s: f64,
    pub pushed_per_s: f64,
    /// Deliveries per second, summed over the groups.
    pub delivered_per_s: f64,
    /// The largest lag of any group (messages pushed and not yet received by it), sampled every
    /// 50 ms through the step.
    pub max_lag: u64,
    pub lag_bound: u64,
    pub kept_up: bool,
    /// Why the step was not kept up with.
    pub missed: Vec<String>,
    pub latency_ms: Option<Distribution>,
    pub measured: Measured,
}

/// What the search found.
#[derive(Debug, Clone, Serialize)]
pub struct Sustain {
    pub groups: usize,
    /// The highest offered rate every group kept up with.
    pub sustainable_per_s: Option<f64>,
    /// The lowest offered rate not kept up with.
    pub failed_per_s: Option<f64>,
    pub steps: Vec<SustainStep>,
    /// Why the search ended.
    pub ended: String,
}

impl Sustain {
    pub fn sustainable_step(&self) -> Option<&SustainStep> {
        let rate = self.sustainable_per_s?;
        self.steps.iter().find(|s| s.kept_up && s.offered_per_s == rate)
    }
}

/// `sustain-<groups>`: `groups` groups of `--consumers` long-poll and ack while producers push at
/// stepped rates.
pub(super) async fn sustain(harness: &Harness, scenario: ScenarioName, groups: usize) -> Outcome {
    let load = &harness.load;
    let names = (1..=groups).map(|g| Some(format!("sustain-g{g}"))).collect();
    let stream = harness.stream(scenario.as_str(), names, true);
    let consumers = Consumers::start(&stream, &harness.client, load.consumers, harness.consumer_pops(), None);
    let search = Search { harness, stream: &stream, groups };
    let sustain = search.run().await;
    let failure = harness.finish(&stream, consumers).await.err();
    let best = sustain.sustainable_step();
    Outcome {
        shape: format!(
            "{} paced connections push batches of {PUSH_BATCH} over {} partitions at stepped rates while {groups} \
             group{} × {} consumers long-poll (batch {}, up to {} partitions) and ack",
            load.connections,
            load.partitions,
            if groups == 1 { "" } else { "s" },
            load.consumers,
            load.pop_batch,
            load.pop_partitions
        ),
        measured: best.map(|s| s.measured),
        latency_ms: best.and_then(|s| s.latency_ms),
        sustain: Some(sustain),
        streams: vec![stream],
        failure,
        ..Outcome::default()
    }
}

struct Search<'a> {
    harness: &'a Harness,
    stream: &'a Arc<Stream>,
    groups: usize,
}

impl Search<'_> {
    async fn run(&self) -> Sustain {
        let load = &self.harness.load;
        let started = Instant::now();
        let mut sustain = Sustain {
            groups: self.groups,
            sustainable_per_s: None,
            failed_per_s: None,
            steps: Vec::new(),
            ended: String::new(),
        };
        let start_rate = round_rate(f64::from(load.sustain_start));
        // Warm-up: connections opened, plans cached, at the first rate.
        self.push_at(start_rate, load.warmup).await;
        if !self.catch_up().await {
            sustain.ended = format!("the groups did not catch up within {}s after the warm-up", CATCH_UP.as_secs());
            return sustain;
        }
        let mut rate = start_rate;
        let mut bisections = 0;
        loop {
            if started.elapsed() + load.sustain_step > load.sustain_budget {
                sustain.ended = format!("the time budget ({}s) ran out", load.sustain_budget.as_secs_f64());
                break;
            }
            let step = self.step(rate).await;
            tracing::info!(
                offered = rate,
                pushed = step.pushed_per_s.round(),
                max_lag = step.max_lag,
                kept_up = step.kept_up,
                missed = %step.missed.join("; "),
                "sustain step"
            );
            if step.kept_up {
                sustain.sustainable_per_s = Some(sustain.sustainable_per_s.map_or(rate, |r| r.max(rate)));
            } else {
                sustain.failed_per_s = Some(sustain.failed_per_s.map_or(rate, |r| r.min(rate)));
            }
            sustain.steps.push(step);
            if !self.catch_up().await {
                sustain.ended = format!("the groups did not catch up within {}s after a step", CATCH_UP.as_secs());
                break;
            }
            let bracket = (sustain.sustainable_per_s, sustain.failed_per_s);
            match next_rate(rate, bracket, load.sustain_bisect.saturating_sub(bisections)) {
                Ok(next) => {
                    bisections += usize::from(bracket.0.is_some() && bracket.1.is_some());
                    rate = next;
                }
                Err(why) => {
                    sustain.ended = why.to_owned();
                    break;
                }
            }
        }
        sustain
    }

    /// Pushes at `rate` messages per second for `duration` over the connections, each on a
    /// schedule of its own, staggered; returns when the last request is answered.
    async fn push_at(&self, rate: f64, duration: Duration) {
        let load = &self.harness.load;
        let connections = load.connections.max(1);
        let requests_per_s = rate / PUSH_BATCH as f64;
        let interval = Duration::from_secs_f64(connections as f64 / requests_per_s);
        let start = Instant::now();
        let deadline = start + duration;
        let producers: Vec<_> = (0..connections)
            .map(|i| {
                let first = start + interval.mul_f64(i as f64 / connections as f64);
                tokio::spawn(produce_scheduled(
                    self.stream.clone(),
                    self.harness.client.clone(),
                    PUSH_BATCH,
                    Partitioning::PerRequest(load.partitions),
                    (first, interval),
                    deadline,
                ))
            })
            .collect();
        futures::future::join_all(producers).await;
    }

    /// One measured step at `rate`, with the lags sampled while the producers push.
    async fn step(&self, rate: f64) -> SustainStep {
        let load = &self.harness.load;
        let errors_before = self.stream.errors.counts();
        let lag_bound = (rate * LAG_SECONDS).ceil() as u64 + load.pop_batch as u64;
        let window = Window::open(self.stream, &self.harness.watched);
        let push = self.push_at(rate, load.sustain_step);
        tokio::pin!(push);
        let mut samples = tokio::time::interval(LAG_SAMPLE);
        let mut max_lag = 0;
        loop {
            tokio::select! {
                () = &mut push => break,
                _ = samples.tick() => max_lag = max_lag.max(self.max_lag()),
            }
        }
        max_lag = max_lag.max(self.max_lag());
        let measured = window.close(self.stream, &self.harness.watched);
        let latency_ms = self.stream.latency.as_ref().and_then(|l| l.summary_ms());
        let errors_after = self.stream.errors.counts();
        let errors = errors_after.total() - errors_before.total();
        let planned = rate * load.sustain_step.as_secs_f64();
        let mut missed =
            verdict(self.groups as u64, planned, measured.pushed, measured.delivered, (max_lag, lag_bound), errors);
        // The error log keeps the run's first few messages: say what failed when one of them is this step's.
        if let Some(first) = errors_after.first.get(errors_before.first.len()) {
            missed.push(format!("first failure: {first}"));
        }
        SustainStep {
            offered_per_s: rate,
            pushed_per_s: measured.pushed_per_s(),
            delivered_per_s: measured.delivered_per_s(),
            max_lag,
            lag_bound,
            kept_up: missed.is_empty(),
            missed,
            latency_ms,
            measured,
        }
    }

    fn max_lag(&self) -> u64 {
        self.stream.ledger.lags().into_iter().max().unwrap_or(0)
    }

    /// Waits until every group has received everything pushed; `false` if that took too long.
    async fn catch_up(&self) -> bool {
        let caught_up = tokio::time::timeout(CATCH_UP, wait_until_delivered(self.stream, CATCH_UP)).await;
        matches!(caught_up, Ok(Drained::Complete))
    }
}

/// The rate of the next step after one at `rate`, given the highest rate kept up with and the
/// lowest not kept up with so far: double until a step fails, halve until one passes, then
/// bisect; `Err` says why the search is over.
fn next_rate(rate: f64, bracket: (Option<f64>, Option<f64>), bisections_left: usize) -> Result<f64, &'static str> {
    let next = match bracket {
        (_, None) => rate * GROWTH,
        (None, Some(failed)) => failed / GROWTH,
        (Some(_), Some(_)) if bisections_left == 0 => return Err("the bisection steps (--sustain-bisect) were done"),
        (Some(kept), Some(failed)) if failed - kept <= BRACKET_SHARE * failed => {
            return Err("the rates kept up with and not are within 5 % of each other");
        }
        (Some(kept), Some(failed)) => (kept + failed) / 2.0,
    };
    let next = round_rate(next);
    if bracket.0 == Some(next) || bracket.1 == Some(next) {
        return Err("the next rate to try was one tried already");
    }
    Ok(next)
}

/// Offered rates are whole batches per second.
fn round_rate(rate: f64) -> f64 {
    (rate / PUSH_BATCH as f64).round().max(1.0) * PUSH_BATCH as f64
}

/// Why a step was not kept up with (nothing when it was): the producers pushed what was offered,
/// no call failed, no group's lag passed the bound, and the deliveries of the step are nearly the
/// groups times the pushes (all but what may be in flight at its end).
fn verdict(groups: u64, planned: f64, pushed: u64, delivered: u64, lag: (u64, u64), errors: u64) -> Vec<String> {
    let (max_lag, lag_bound) = lag;
    let mut missed = Vec::new();
    if (pushed as f64) < MIN_PUSHED_SHARE * planned {
        missed.push(format!("pushed {pushed} of {planned:.0} offered"));
    }
    if errors > 0 {
        missed.push(format!("{errors} calls failed"));
    }
    if max_lag > lag_bound {
        missed.push(format!("lag {max_lag} > {lag_bound}"));
    }
    let expected = groups * pushed;
    if (delivered as f64) < MIN_DELIVERED_SHARE * expected as f64 {
        missed.push(format!("delivered {delivered} of {expected}"));
    }
    missed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_whole_batches() {
        assert_eq!(round_rate(500.0), 500.0);
        assert_eq!(round_rate(754.0), 750.0);
        assert_eq!(round_rate(756.0), 760.0);
        assert_eq!(round_rate(3.0), 10.0);
    }

    #[test]
    fn the_rate_doubles_halves_then_bisects() {
        assert_eq!(next_rate(500.0, (Some(500.0), None), 3), Ok(1000.0));
        assert_eq!(next_rate(500.0, (None, Some(500.0)), 3), Ok(250.0));
        assert_eq!(next_rate(4000.0, (Some(2000.0), Some(4000.0)), 3), Ok(3000.0));
        assert_eq!(next_rate(3000.0, (Some(3000.0), Some(4000.0)), 2), Ok(3500.0));
        assert!(next_rate(3500.0, (Some(3000.0), Some(3500.0)), 0).is_err());
        assert!(next_rate(3900.0, (Some(3900.0), Some(4000.0)), 3).is_err());
        // Nothing below one batch per second.
        assert!(next_rate(10.0, (None, Some(10.0)), 3).is_err());
    }

    #[test]
    fn a_step_is_kept_up_with_only_if_everything_holds() {
        // 2 groups, 3,000 offered, all pushed and delivered twice, lag within bound.
        assert!(verdict(2, 3000.0, 3000, 6000, (400, 1100), 0).is_empty());
        // Deliveries short by what may be in flight at the end still pass; a group a quarter
        // behind does not, though its lag is still under the bound.
        assert!(verdict(2, 3000.0, 3000, 5800, (1000, 1100), 0).is_empty());
        assert_eq!(verdict(2, 3000.0, 3000, 4500, (1000, 1100), 0), ["delivered 4500 of 6000"]);
        assert_eq!(verdict(2, 3000.0, 2800, 5600, (10, 1100), 0), ["pushed 2800 of 3000 offered"]);
        assert_eq!(verdict(2, 3000.0, 3000, 6000, (1200, 1100), 0), ["lag 1200 > 1100"]);
        assert_eq!(verdict(2, 3000.0, 3000, 3000, (1000, 1100), 0), ["delivered 3000 of 6000"]);
        assert_eq!(verdict(1, 3000.0, 3000, 3000, (0, 1100), 2), ["2 calls failed"]);
    }
}
