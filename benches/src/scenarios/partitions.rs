//! Many partitions: throughput while one group consumes, fairness of queue-wide pops across a
//! thousand partitions, and whether pops find work among ten thousand without scanning them all.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{CandidatePlans, DRAIN_STALL, Fairness, Harness, Outcome, ScenarioName};
use crate::stats::Distribution;
use crate::workload::{
    Consumers, Drained, Partitioning, PopPlan, PopTrace, Stream, Until, produce, wait_until_delivered,
};

/// Batch of the producers while one group consumes.
const PUSH_BATCH: usize = 10;
/// Messages each partition holds before the fairness drain: several pops' worth, so partitions
/// already served compete with those not served yet.
const FAIRNESS_MESSAGES_PER_PARTITION: usize = 30;
/// The fairness drain pops like a consumer that takes one partition at a time.
const FAIRNESS_POPS: PopPlan = PopPlan { batch: 10, partitions: 1, wait: None, frames: false };
/// Partitions the candidate-list phase pushes to, out of the many that exist.
const HOT_PARTITIONS: usize = 3;
/// Longest candidate-list phase.
const CANDIDATE_PHASE: Duration = Duration::from_secs(10);
/// Messages per request when every partition gets its first message.
const CREATE_BATCH: usize = 100;

/// The metric the broker counts queue-wide pop plans in.
const PLANS_METRIC: &str = "queen_pop_candidate_plans_total";

/// `partitions-<n>`: push across `n` partitions while one group's consumers long-poll.
pub(super) async fn throughput(harness: &Harness, scenario: ScenarioName, partitions: usize) -> Outcome {
    let stream = harness.stream(scenario.as_str(), vec![None], true);
    let consumers = start_consumers(harness, &stream);
    let mut outcome = measure(harness, &stream, partitions).await;
    outcome.failure = harness.finish(&stream, consumers).await.err();
    outcome.streams = vec![stream];
    outcome
}

/// `partitions-1000`: the throughput phase, then a backlog in every partition drained by pops of
/// one partition each, recording how many pops each partition waited for its first service.
pub(super) async fn with_fairness(harness: &Harness, scenario: ScenarioName, partitions: usize) -> Outcome {
    let mut outcome = throughput(harness, scenario, partitions).await;
    if outcome.failure.is_some() {
        return outcome;
    }
    let stream = harness.stream(&format!("{scenario}-fairness"), vec![None], false);
    let messages = (partitions * FAIRNESS_MESSAGES_PER_PARTITION) as u64;
    // One request per partition, each holding all of that partition's messages.
    harness.prefill(&stream, messages, FAIRNESS_MESSAGES_PER_PARTITION, Partitioning::PerRequest(partitions)).await;
    let trace = Arc::new(PopTrace::default());
    let consumers =
        Consumers::start(&stream, &harness.client, harness.load.consumers, FAIRNESS_POPS, Some(trace.clone()));
    outcome.failure = harness.finish(&stream, consumers).await.err();
    let mut waits = trace.first_served();
    outcome.fairness = Some(Fairness {
        partitions,
        partitions_served: waits.len(),
        pops: trace.pops(),
        pops_before_first_served: Distribution::of_values(&mut waits),
    });
    outcome.streams.push(stream);
    outcome
}

/// `partitions-10000`: every partition gets a message, then the throughput phase, then steady
/// pushes to three partitions while the broker's metrics count how each queue-wide pop planned.
/// The backlogs between the phases are drained by the drain consumers, whose pops claim many
/// partitions each: one group's pops of a few partitions at a time would take minutes.
pub(super) async fn with_candidate_plans(harness: &Harness, scenario: ScenarioName, partitions: usize) -> Outcome {
    let stream = harness.stream(scenario.as_str(), vec![None], true);
    harness.prefill(&stream, partitions as u64, CREATE_BATCH, Partitioning::PerMessage(partitions)).await;
    if let Err(failure) = harness.drain(&stream).await {
        return Outcome { failure: Some(failure), streams: vec![stream], ..Outcome::default() };
    }
    let consumers = start_consumers(harness, &stream);
    let mut outcome = measure(harness, &stream, partitions).await;
    consumers.stop().await;
    outcome.failure = harness.drain(&stream).await.err();
    if outcome.failure.is_none() {
        match candidate_phase(harness, &stream).await {
            Ok(plans) => outcome.candidate_plans = plans,
            Err(failure) => outcome.failure = Some(failure),
        }
    }
    outcome.streams = vec![stream];
    outcome
}

fn start_consumers(harness: &Harness, stream: &Arc<Stream>) -> Consumers {
    Consumers::start(stream, &harness.client, harness.load.consumers, harness.consumer_pops(), None)
}

async fn measure(harness: &Harness, stream: &Arc<Stream>, partitions: usize) -> Outcome {
    let load = &harness.load;
    let measured = harness.timed_push(stream, load.connections, PUSH_BATCH, Partitioning::PerRequest(partitions)).await;
    Outcome {
        shape: format!(
            "{} connections push batches of {PUSH_BATCH} to one of {partitions} partitions each while one group of {} \
             consumers long-polls (batch {}, up to {} partitions) and acks",
            load.connections, load.consumers, load.pop_batch, load.pop_partitions
        ),
        measured: Some(measured),
        latency_ms: stream.latency.as_ref().and_then(|l| l.summary_ms()),
        ..Outcome::default()
    }
}

/// Steady pushes to a few partitions of many, one group long-polling; the plans counted
/// meanwhile (`None` when the broker does not export the metric).
async fn candidate_phase(harness: &Harness, stream: &Arc<Stream>) -> Result<Option<CandidatePlans>, String> {
    let read_plans = || async {
        let text =
            harness.client.metrics_prometheus().await.map_err(|e| format!("reading the broker's metrics: {e}"))?;
        Ok::<_, String>(parse_candidate_plans(&text))
    };
    let consumers = start_consumers(harness, stream);
    let before = read_plans().await?;
    let deadline = Instant::now() + harness.load.duration.min(CANDIDATE_PHASE);
    let hot = Partitioning::PerRequest(HOT_PARTITIONS);
    produce(stream.clone(), harness.client.clone(), PUSH_BATCH, hot, Until::Deadline(deadline)).await;
    let drained = wait_until_delivered(stream, DRAIN_STALL).await;
    let after = read_plans().await;
    consumers.stop().await;
    if drained == Drained::Stalled {
        return Err(format!("{}: the pushes to {HOT_PARTITIONS} partitions were not all delivered", stream.queue));
    }
    Ok(before.zip(after?).map(|(before, after)| CandidatePlans {
        full: after.full.saturating_sub(before.full),
        candidates: after.candidates.saturating_sub(before.candidates),
        skipped: after.skipped.saturating_sub(before.skipped),
    }))
}

/// The `queen_pop_candidate_plans_total{kind=...}` counters of a Prometheus text exposition.
fn parse_candidate_plans(text: &str) -> Option<CandidatePlans> {
    let mut plans = CandidatePlans::default();
    let mut found = false;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(PLANS_METRIC).and_then(|r| r.strip_prefix("{kind=\"")) else { continue };
        let Some((kind, value)) = rest.split_once("\"}") else { continue };
        let Ok(value) = value.trim().parse::<f64>() else { continue };
        let slot = match kind {
            "full" => &mut plans.full,
            "candidates" => &mut plans.candidates,
            "skipped" => &mut plans.skipped,
            _ => continue,
        };
        *slot = value as u64;
        found = true;
    }
    found.then_some(plans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_plans_are_read_from_the_exposition() {
        let text = "# HELP queen_pop_candidate_plans_total How queue-wide pops found candidates.\n\
                    # TYPE queen_pop_candidate_plans_total counter\n\
                    queen_pop_candidate_plans_total{kind=\"candidates\"} 1234\n\
                    queen_pop_candidate_plans_total{kind=\"full\"} 3\n\
                    queen_pop_candidate_plans_total_other{kind=\"full\"} 99\n\
                    queen_messages_pushed_total{queue=\"q\"} 5\n";
        assert_eq!(parse_candidate_plans(text), Some(CandidatePlans { full: 3, candidates: 1234, skipped: 0 }));
        assert_eq!(parse_candidate_plans("queen_messages_pushed_total 5\n"), None);
    }
}
