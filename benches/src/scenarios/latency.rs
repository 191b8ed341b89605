//! End-to-end latency at light load.

use std::time::Instant;

use super::{Harness, Outcome, ScenarioName};
use crate::workload::{Consumers, Window, produce_paced};

/// `e2e-latency`: single-message pushes at a steady light rate, long-polling consumers; the
/// latency of a message runs from just before its push request to the arrival of the pop
/// answer that carries it.
pub(super) async fn e2e(harness: &Harness, scenario: ScenarioName) -> Outcome {
    let load = &harness.load;
    let stream = harness.stream(scenario.as_str(), vec![None], true);
    let consumers = Consumers::start(&stream, &harness.client, load.consumers, harness.consumer_pops(), None);
    let deadline = Instant::now() + load.warmup + load.duration;
    let producer = tokio::spawn(produce_paced(stream.clone(), harness.client.clone(), load.latency_rate, deadline));
    tokio::time::sleep(load.warmup).await;
    let window = Window::open(&stream, &harness.watched);
    // A failed join means the producer task panicked; the ledger then shows what is missing.
    let _ = producer.await;
    let measured = window.close(&stream, &harness.watched);
    let latency_ms = stream.latency.as_ref().and_then(|l| l.summary_ms());
    let failure = harness.finish(&stream, consumers).await.err();
    Outcome {
        shape: format!(
            "{} single-message pushes/s to one partition; {} consumers long-poll (batch {}) and ack",
            load.latency_rate, load.consumers, load.pop_batch
        ),
        measured: Some(measured),
        latency_ms,
        streams: vec![stream],
        failure,
        ..Outcome::default()
    }
}
