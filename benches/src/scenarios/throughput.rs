//! Push at a batch size, consume a backlog, and push while consumer groups fan out.

use std::time::Instant;

use super::{Harness, Outcome, ScenarioName};
use crate::workload::{Consumers, Partitioning, PopPlan, Window};

/// Batch of the fan-out producers.
const FANOUT_BATCH: usize = 10;

/// `push-b<batch>`: producers only; a drain afterwards verifies every message.
pub(super) async fn push(harness: &Harness, scenario: ScenarioName, batch: usize) -> Outcome {
    let load = &harness.load;
    let stream = harness.stream(scenario.as_str(), vec![None], false);
    let measured =
        harness.timed_push(&stream, load.connections, batch, Partitioning::PerRequest(load.partitions)).await;
    let failure = harness.drain(&stream).await.err();
    Outcome {
        shape: format!(
            "{} connections push batches of {batch} to one of {} partitions each",
            load.connections, load.partitions
        ),
        measured: Some(measured),
        streams: vec![stream],
        failure,
        ..Outcome::default()
    }
}

/// `consume`: a prefilled backlog, popped and acked as fast as the consumers can; the window
/// runs from the first pop until the backlog is gone or the duration is up.
pub(super) async fn consume(harness: &Harness, scenario: ScenarioName) -> Outcome {
    let load = &harness.load;
    let stream = harness.stream(scenario.as_str(), vec![None], false);
    harness.prefill(&stream, load.prefill, load.prefill_batch, Partitioning::PerRequest(load.partitions)).await;
    let pops = PopPlan { batch: load.pop_batch, partitions: load.pop_partitions, wait: None, frames: load.framed_pops };
    let window = Window::open(&stream, &harness.watched);
    let consumers = Consumers::start(&stream, &harness.client, load.consumers, pops, None);
    let deadline = Instant::now() + load.duration;
    while !stream.ledger.all_delivered() && Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let measured = window.close(&stream, &harness.watched);
    let failure = harness.finish(&stream, consumers).await.err();
    Outcome {
        shape: format!(
            "{} queued messages over {} partitions, pushed {} per request; {} consumers pop (batch {}, up to {} \
             partitions, no wait) and ack",
            load.prefill, load.partitions, load.prefill_batch, load.consumers, load.pop_batch, load.pop_partitions
        ),
        measured: Some(measured),
        streams: vec![stream],
        failure,
        ..Outcome::default()
    }
}

/// `fanout-<groups>`: producers push batches of 10 while each group's consumers long-poll and
/// ack; with no groups it is the baseline push rate of the same load.
pub(super) async fn fanout(harness: &Harness, scenario: ScenarioName, groups: usize) -> Outcome {
    let load = &harness.load;
    let names: Vec<Option<String>> = if groups == 0 {
        // No consumers while pushing; queue mode drains afterwards to verify.
        vec![None]
    } else {
        (1..=groups).map(|g| Some(format!("fanout-g{g}"))).collect()
    };
    let stream = harness.stream(scenario.as_str(), names, groups > 0);
    let consumers =
        (groups > 0).then(|| Consumers::start(&stream, &harness.client, load.consumers, harness.consumer_pops(), None));
    let measured =
        harness.timed_push(&stream, load.connections, FANOUT_BATCH, Partitioning::PerRequest(load.partitions)).await;
    let latency_ms = stream.latency.as_ref().and_then(|l| l.summary_ms());
    let failure = match consumers {
        Some(consumers) => harness.finish(&stream, consumers).await.err(),
        None => harness.drain(&stream).await.err(),
    };
    Outcome {
        shape: if groups == 0 {
            format!(
                "{} connections push batches of {FANOUT_BATCH} over {} partitions, no consumers (the baseline; queue \
                 mode drains afterwards to verify)",
                load.connections, load.partitions
            )
        } else {
            format!(
                "{} connections push batches of {FANOUT_BATCH} over {} partitions while {groups} groups × {} consumers \
                 long-poll (batch {}, up to {} partitions) and ack",
                load.connections, load.partitions, load.consumers, load.pop_batch, load.pop_partitions
            )
        },
        measured: Some(measured),
        latency_ms,
        streams: vec![stream],
        failure,
        ..Outcome::default()
    }
}
