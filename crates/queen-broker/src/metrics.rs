//! Prometheus metrics, `queen_` names in base units.

use prometheus::{Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

/// Every metric the broker exports.
pub struct Metrics {
    registry: Registry,
    pub messages_pushed: IntCounterVec,
    pub bytes_pushed: IntCounterVec,
    pub duplicates: IntCounterVec,
    pub segments_written: IntCounter,
    pub messages_per_segment: Histogram,
    pub messages_delivered: IntCounterVec,
    pub acks: IntCounterVec,
    pub leases_granted: IntCounter,
    pub leases_expired: IntCounter,
    pub long_poll_waiters: IntGauge,
    pub maintenance_passes: IntCounterVec,
    pub notices_received: IntCounter,
    pub pop_scans: IntCounterVec,
    pub segments_retained_away: IntCounter,
    pub partitions_cleaned_up: IntCounter,
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry.register(Box::new(metric.clone())).expect("metric registered once");
    metric
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let metric = IntCounter::new(name, help).expect("static metric definition");
    registry.register(Box::new(metric.clone())).expect("metric registered once");
    metric
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let messages_per_segment = Histogram::with_opts(
            HistogramOpts::new("queen_segment_messages", "Messages fused into one written segment.")
                .buckets(vec![1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0, 10000.0]),
        )
        .expect("static metric definition");
        registry.register(Box::new(messages_per_segment.clone())).expect("metric registered once");
        let long_poll_waiters = IntGauge::new("queen_long_poll_waiters", "Pops parked waiting for messages.")
            .expect("static metric definition");
        registry.register(Box::new(long_poll_waiters.clone())).expect("metric registered once");
        Self {
            messages_pushed: counter_vec(&registry, "queen_messages_pushed_total", "Messages written.", &["queue"]),
            bytes_pushed: counter_vec(&registry, "queen_pushed_bytes_total", "Payload bytes written.", &["queue"]),
            duplicates: counter_vec(
                &registry,
                "queen_push_duplicates_total",
                "Pushed messages refused as duplicates of a stored transaction id.",
                &["queue"],
            ),
            segments_written: counter(&registry, "queen_segments_written_total", "Segments written."),
            messages_per_segment,
            messages_delivered: counter_vec(
                &registry,
                "queen_messages_delivered_total",
                "Messages handed to consumers.",
                &["queue"],
            ),
            acks: counter_vec(
                &registry,
                "queen_acks_total",
                "Acknowledgements, by status and verdict.",
                &["status", "verdict"],
            ),
            leases_granted: counter(&registry, "queen_leases_granted_total", "Partition leases granted to consumers."),
            leases_expired: counter(
                &registry,
                "queen_leases_expired_total",
                "Leases that ran out unacknowledged and were taken over.",
            ),
            long_poll_waiters,
            maintenance_passes: counter_vec(
                &registry,
                "queen_maintenance_passes_total",
                "Maintenance passes this broker scheduled: ran, skipped (another broker held the lock) or failed.",
                &["outcome"],
            ),
            notices_received: counter(
                &registry,
                "queen_notices_received_total",
                "Fleet events received on the LISTEN connection.",
            ),
            pop_scans: counter_vec(
                &registry,
                "queen_pop_candidate_plans_total",
                "How queue-wide pops found candidates: full scan, candidate list, or skipped (nothing can be pending).",
                &["kind"],
            ),
            segments_retained_away: counter(
                &registry,
                "queen_retention_segments_deleted_total",
                "Segments deleted by retention on this broker.",
            ),
            partitions_cleaned_up: counter(
                &registry,
                "queen_partitions_cleaned_up_total",
                "Empty idle partitions deleted on this broker.",
            ),
            registry,
        }
    }

    /// The Prometheus text exposition.
    pub fn render_text(&self) -> String {
        let mut out = Vec::new();
        // Encoding our own registry into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
