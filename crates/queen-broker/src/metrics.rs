//! Prometheus metrics: `queen_` names in base units, labelled by queue and (for lag) group names,
//! never by partitions or messages; queues capped by [`QueueLabels`], groups by
//! `limits.max_groups_per_queue` per named queue, and folded into one under `_other`. Rendered as the Prometheus text format, or as JSON for the
//! official client.

mod queue_labels;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::proto::{MetricFamily, MetricType};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use serde::Serialize;

pub use queue_labels::{OTHER_QUEUES, QueueCounter, QueueLabels};

/// The group label of lag under `queue="_other"`: the groups of every queue past the label limit.
pub const OTHER_GROUPS: &str = "_other";

/// Latency buckets, in seconds: 0.5 ms to 30 s.
const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Every metric the broker exports.
pub struct Metrics {
    registry: Registry,
    queue_labels: Arc<QueueLabels>,
    // Messages, per queue.
    pub messages_pushed: QueueCounter,
    pub bytes_pushed: QueueCounter,
    pub duplicates: QueueCounter,
    pub messages_delivered: QueueCounter,
    pub bytes_delivered: QueueCounter,
    pub messages_acked: QueueCounter,
    pub messages_failed: QueueCounter,
    pub messages_dead_lettered: QueueCounter,
    pub messages_dropped: QueueCounter,
    pub messages_expired: QueueCounter,
    pub acks: IntCounterVec,
    // Push fusion.
    pub segments_written: IntCounter,
    pub messages_per_segment: Histogram,
    // Ack fusion across groups (the AckLane).
    pub ack_batches_per_commit: Histogram,
    // Latency of the hot routes.
    pub push_duration: Histogram,
    pub pop_duration: HistogramVec,
    pub ack_duration: Histogram,
    // Leases and long polls.
    pub leases_granted: IntCounter,
    pub leases_expired: IntCounter,
    pub long_poll_waiters: IntGauge,
    pub pops_spaced: IntCounter,
    // Consumer lag, refreshed from the database when scraped.
    pub lag_messages: IntGaugeVec,
    pub lag_seconds: prometheus::GaugeVec,
    pub lag_read_at: IntGauge,
    // Actors.
    pub actors: IntGaugeVec,
    pub actors_started: IntCounterVec,
    pub actor_queued: IntGaugeVec,
    // Overload.
    pub overload_refusals: IntCounterVec,
    // Authentication.
    pub auth_failures: IntCounterVec,
    // The fleet.
    pub notices_received: IntCounter,
    pub fleet_listening: IntGauge,
    pub pop_scans: IntCounterVec,
    // The segment cache, caught up with the cache's own counts when scraped.
    pub segment_cache_hits: IntCounter,
    pub segment_cache_misses: IntCounter,
    pub segment_cache_bytes: IntGauge,
    pub segment_cache_segments: IntGauge,
    // The database.
    pub db_pool_connections: IntGaugeVec,
    pub db_pool_max: IntGauge,
    pub db_pool_waiting: IntGauge,
    pub db_errors: IntCounterVec,
    // Maintenance.
    pub maintenance_passes: IntCounterVec,
    pub segments_retained_away: IntCounter,
    pub partitions_cleaned_up: IntCounter,
    pub kv_rows_pruned: IntCounter,
    // Timers.
    pub timers_delivered: IntCounter,
    pub timer_delivery_failures: IntCounter,
    // Maintenance mode.
    pub maintenance_mode: IntGaugeVec,
    pub buffered_messages: IntGauge,
    pub journal_files_set_aside: IntGauge,
    pub messages_buffered: IntCounter,
    pub paused_long_polls: IntGauge,
}

fn register<T: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: T) -> T {
    registry.register(Box::new(metric.clone())).expect("each metric is registered once");
    metric
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(registry, IntCounter::new(name, help).expect("a valid metric definition"))
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(registry, IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric definition"))
}

fn per_queue(registry: &Registry, labels: &Arc<QueueLabels>, name: &str, help: &str) -> QueueCounter {
    QueueCounter::new(counter_vec(registry, name, help, &["queue"]), Arc::clone(labels))
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(registry, IntGauge::new(name, help).expect("a valid metric definition"))
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(registry, IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid metric definition"))
}

fn latency(registry: &Registry, name: &str, help: &str) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    register(registry, Histogram::with_opts(opts).expect("a valid metric definition"))
}

impl Metrics {
    /// Metrics where at most `max_queue_labels` queues have series of their own.
    pub fn new(max_queue_labels: usize) -> Self {
        let r = Registry::new();
        let queues = Arc::new(QueueLabels::new(max_queue_labels));
        let build_info = gauge_vec(&r, "queen_build_info", "The broker's version; always 1.", &["version"]);
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        #[cfg(target_os = "linux")]
        r.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))
            .expect("the process collector is registered once");
        Self {
            messages_pushed: per_queue(&r, &queues, "queen_messages_pushed_total", "Messages written."),
            bytes_pushed: per_queue(&r, &queues, "queen_pushed_bytes_total", "Payload bytes written."),
            duplicates: per_queue(
                &r,
                &queues,
                "queen_push_duplicates_total",
                "Pushed messages refused as duplicates of a stored transaction id.",
            ),
            messages_delivered: per_queue(
                &r,
                &queues,
                "queen_messages_delivered_total",
                "Messages handed to consumers.",
            ),
            bytes_delivered: per_queue(
                &r,
                &queues,
                "queen_delivered_bytes_total",
                "Payload bytes handed to consumers.",
            ),
            messages_acked: per_queue(
                &r,
                &queues,
                "queen_messages_acked_total",
                "Messages named by an acknowledgement that committed them (auto-acked ones at delivery); a completed ack also commits the unnamed messages before it, which are not counted.",
            ),
            messages_failed: per_queue(
                &r,
                &queues,
                "queen_messages_failed_total",
                "Messages acknowledged as failed or to retry (to be delivered again).",
            ),
            messages_dead_lettered: per_queue(
                &r,
                &queues,
                "queen_messages_dead_lettered_total",
                "Messages moved to the dead-letter queue.",
            ),
            messages_dropped: per_queue(
                &r,
                &queues,
                "queen_messages_dropped_total",
                "Messages given up on after their last retry without a dead letter (the queue does not dead-letter).",
            ),
            messages_expired: per_queue(
                &r,
                &queues,
                "queen_messages_expired_total",
                "Messages a group skipped as older than the queue's ttl or maxWaitTimeSeconds (dead-lettered or not).",
            ),
            acks: counter_vec(
                &r,
                "queen_acks_total",
                "Acknowledgements, by status and verdict.",
                &["status", "verdict"],
            ),
            segments_written: counter(
                &r,
                "queen_segments_written_total",
                "Segments written (one per fused push batch).",
            ),
            messages_per_segment: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new("queen_segment_messages", "Messages fused into one written segment.")
                        .buckets(vec![1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0, 10000.0]),
                )
                .expect("a valid metric definition"),
            ),
            ack_batches_per_commit: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "queen_ack_commit_batches",
                        "Consumer groups' ack batches sent together in one commit attempt (a batch tried again alone counts again).",
                    )
                    .buckets(vec![1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0]),
                )
                .expect("a valid metric definition"),
            ),
            push_duration: latency(
                &r,
                "queen_push_duration_seconds",
                "Time to answer a push request, refused by the database or not.",
            ),
            pop_duration: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "queen_pop_duration_seconds",
                        "Time to answer a pop request, long polls included, refused by the database or not.",
                    )
                    .buckets(LATENCY_BUCKETS.to_vec()),
                    &["wait"],
                )
                .expect("a valid metric definition"),
            ),
            ack_duration: latency(
                &r,
                "queen_ack_duration_seconds",
                "Time to answer an ack request, refused by the database or not.",
            ),
            leases_granted: counter(&r, "queen_leases_granted_total", "Partition leases granted to consumers."),
            leases_expired: counter(
                &r,
                "queen_leases_expired_total",
                "Leases that ran out unacknowledged and were taken over.",
            ),
            long_poll_waiters: gauge(&r, "queen_long_poll_waiters", "Long polls waiting for messages."),
            pops_spaced: counter(
                &r,
                "queen_pops_spaced_total",
                "Long-poll pops that waited for their group's slot while its stream was dense.",
            ),
            lag_messages: gauge_vec(
                &r,
                "queen_consumer_group_lag_messages",
                "Messages stored past a group's cursors on a queue.",
                &["queue", "group"],
            ),
            lag_seconds: register(
                &r,
                prometheus::GaugeVec::new(
                    Opts::new(
                        "queen_consumer_group_lag_seconds",
                        "Age of the oldest message past a group's cursors on a queue.",
                    ),
                    &["queue", "group"],
                )
                .expect("a valid metric definition"),
            ),
            lag_read_at: gauge(
                &r,
                "queen_consumer_group_lag_read_timestamp_seconds",
                "When the lag gauges were last read from the database (Unix time); they keep their values while a read fails.",
            ),
            actors: gauge_vec(&r, "queen_actors", "Live actors of this broker.", &["actor"]),
            actors_started: counter_vec(
                &r,
                "queen_actors_started_total",
                "Actors this broker started: against queen_actors, how often idle actors stop and start again.",
                &["actor"],
            ),
            actor_queued: gauge_vec(
                &r,
                "queen_actor_queued_requests",
                "Requests waiting in actors for the next write.",
                &["actor"],
            ),
            overload_refusals: counter_vec(
                &r,
                "queen_overload_refusals_total",
                "Requests refused because a bound of what the broker holds at once was reached, by bound.",
                &["bound"],
            ),
            auth_failures: counter_vec(
                &r,
                "queen_auth_failures_total",
                "Requests refused by authentication (401) or authorization (403), by reason.",
                &["reason"],
            ),
            notices_received: counter(
                &r,
                "queen_notices_received_total",
                "Fleet events received on the LISTEN connection from other brokers (a broker's own announcements are not counted).",
            ),
            fleet_listening: gauge(
                &r,
                "queen_fleet_listening",
                "1 while the LISTEN connection is in effect; 0 while it is lost, when parked pops look again every second for pushes through other brokers.",
            ),
            pop_scans: counter_vec(
                &r,
                "queen_pop_candidate_plans_total",
                "How queue-wide pops found candidates: full scan, candidate list, or skipped (nothing can be pending).",
                &["kind"],
            ),
            segment_cache_hits: counter(
                &r,
                "queen_segment_cache_hits_total",
                "Segments pops and message reads found decoded in the segment cache.",
            ),
            segment_cache_misses: counter(
                &r,
                "queen_segment_cache_misses_total",
                "Segments pops and message reads fetched and decoded from the database.",
            ),
            segment_cache_bytes: gauge(&r, "queen_segment_cache_bytes", "Bytes the segment cache holds."),
            segment_cache_segments: gauge(&r, "queen_segment_cache_segments", "Segments the segment cache holds."),
            db_pool_connections: gauge_vec(
                &r,
                "queen_db_pool_connections",
                "Connections of the database pool, by state.",
                &["state"],
            ),
            db_pool_max: gauge(&r, "queen_db_pool_max_connections", "Most connections the database pool opens."),
            db_pool_waiting: gauge(&r, "queen_db_pool_waiting_requests", "Requests waiting for a database connection."),
            db_errors: counter_vec(
                &r,
                "queen_db_errors_total",
                "Database operations that failed: unavailable (could not reach it), read_only or disk_full (PostgreSQL refused a write for that reason), unanswered (a write not answered in time, its outcome unknown) or refused (another statement failed).",
                &["kind"],
            ),
            maintenance_passes: counter_vec(
                &r,
                "queen_maintenance_passes_total",
                "Maintenance passes this broker scheduled: ran, skipped (another broker held the lock) or failed.",
                &["outcome"],
            ),
            segments_retained_away: counter(
                &r,
                "queen_retention_segments_deleted_total",
                "Segments deleted by retention.",
            ),
            partitions_cleaned_up: counter(&r, "queen_partitions_cleaned_up_total", "Empty idle partitions deleted."),
            kv_rows_pruned: counter(
                &r,
                "queen_kv_rows_pruned_total",
                "Dead key/value rows (expired, deleted, or left by a refused write) deleted by maintenance.",
            ),
            timers_delivered: counter(
                &r,
                "queen_timers_delivered_total",
                "Due timers this broker appended to their queues (duplicates of a message already stored included).",
            ),
            timer_delivery_failures: counter(
                &r,
                "queen_timer_delivery_failures_total",
                "Deliveries of due timers that failed (queue full, a creation limit, ...) and will be retried or held.",
            ),
            maintenance_mode: gauge_vec(
                &r,
                "queen_maintenance_mode",
                "Whether push or pop maintenance is on (1) or off (0), as this broker applies it.",
                &["kind"],
            ),
            buffered_messages: gauge(
                &r,
                "queen_buffered_messages",
                "Messages in this broker's push journal, waiting to be replayed into the log.",
            ),
            journal_files_set_aside: gauge(
                &r,
                "queen_push_journal_files_set_aside",
                "Push journal files this broker set aside as unreplayable (.held): acknowledged pushes not in the log.",
            ),
            messages_buffered: counter(
                &r,
                "queen_messages_buffered_total",
                "Pushed messages accepted into this broker's push journal during push maintenance.",
            ),
            paused_long_polls: gauge(
                &r,
                "queen_paused_long_polls",
                "Long-polling pops held by pop maintenance, waiting for it to end.",
            ),
            registry: r,
            queue_labels: queues,
        }
    }

    /// What one append to a partition stored, whichever path wrote it (a partition's writer, a
    /// capped push, a transaction, a timer, a dead letter's retry): `queued` new messages, in one
    /// segment of `payload_bytes` when there are any, and `duplicates` found stored already.
    pub fn record_append(&self, queue: &str, queued: u64, duplicates: u64, payload_bytes: u64) {
        self.messages_pushed.inc_by(queue, queued);
        self.duplicates.inc_by(queue, duplicates);
        if queued > 0 {
            self.bytes_pushed.inc_by(queue, payload_bytes);
            self.segments_written.inc();
            self.messages_per_segment.observe(queued as f64);
        }
    }

    /// The `queue` label value to record the queue's lag under (see [`QueueLabels`]).
    pub fn queue_label<'a>(&self, queue: &'a str) -> &'a str {
        self.queue_labels.label(queue)
    }

    /// Removes the series of a deleted queue, giving its place up to another queue. What was
    /// counted under `_other` for it stays there.
    pub fn forget_queue(&self, queue: &str) {
        if !self.queue_labels.release(queue) {
            return;
        }
        let counters = [
            &self.messages_pushed,
            &self.bytes_pushed,
            &self.duplicates,
            &self.messages_delivered,
            &self.bytes_delivered,
            &self.messages_acked,
            &self.messages_failed,
            &self.messages_dead_lettered,
            &self.messages_dropped,
            &self.messages_expired,
        ];
        for counter in counters {
            counter.remove(queue);
        }
        remove_queue_series(&self.lag_messages, queue);
        remove_queue_series(&self.lag_seconds, queue);
    }

    /// Records the pool's state (called when scraped).
    pub fn observe_pool(&self, status: deadpool_postgres::Status) {
        let in_use = status.size.saturating_sub(status.available);
        self.db_pool_connections.with_label_values(&["in_use"]).set(in_use as i64);
        self.db_pool_connections.with_label_values(&["idle"]).set(status.available as i64);
        self.db_pool_max.set(status.max_size as i64);
        self.db_pool_waiting.set(status.waiting as i64);
    }

    /// Catches the database failure counters up with the process's totals (called when scraped).
    pub fn observe_db_failures(&self, counts: queen_store::FailureCounts) {
        let kinds = [
            ("unavailable", counts.unavailable),
            ("refused", counts.refused),
            ("read_only", counts.read_only),
            ("disk_full", counts.disk_full),
            ("unanswered", counts.unanswered),
        ];
        for (kind, total) in kinds {
            let counter = self.db_errors.with_label_values(&[kind]);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    /// Catches the segment cache's metrics up with its counts (called when scraped).
    pub fn observe_segment_cache(&self, stats: queen_store::segment_cache::SegmentCacheStats) {
        self.segment_cache_hits.inc_by(stats.hits.saturating_sub(self.segment_cache_hits.get()));
        self.segment_cache_misses.inc_by(stats.misses.saturating_sub(self.segment_cache_misses.get()));
        self.segment_cache_bytes.set(i64::try_from(stats.bytes).unwrap_or(i64::MAX));
        self.segment_cache_segments.set(i64::try_from(stats.segments).unwrap_or(i64::MAX));
    }

    /// The Prometheus text exposition.
    pub fn render_text(&self) -> String {
        let mut out = Vec::new();
        // Encoding our own registry into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// The same families as JSON: `{"metrics": [{name, help, type, samples: [{labels, value}]}]}`,
    /// histograms with `count`, `sum` and cumulative `buckets`.
    pub fn render_json(&self) -> serde_json::Value {
        let families: Vec<FamilyJson> = self.registry.gather().iter().map(FamilyJson::from).collect();
        serde_json::json!({ "metrics": families })
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(crate::config::MetricsConfig::default().max_queue_labels)
    }
}

/// Removes every series of the vector whose `queue` label is the queue.
fn remove_queue_series<T: MetricVecBuilder>(vec: &MetricVec<T>, queue: &str) {
    for family in vec.collect() {
        for metric in family.get_metric() {
            let labels: HashMap<&str, &str> = metric.get_label().iter().map(|l| (l.name(), l.value())).collect();
            if labels.get("queue") == Some(&queue) {
                let _ = vec.remove(&labels);
            }
        }
    }
}

#[derive(Serialize)]
struct FamilyJson {
    name: String,
    help: String,
    #[serde(rename = "type")]
    kind: &'static str,
    samples: Vec<SampleJson>,
}

#[derive(Serialize)]
struct SampleJson {
    labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sum: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    buckets: Option<BTreeMap<String, u64>>,
}

impl From<&MetricFamily> for FamilyJson {
    fn from(family: &MetricFamily) -> Self {
        let kind = match family.get_field_type() {
            MetricType::COUNTER => "counter",
            MetricType::GAUGE => "gauge",
            MetricType::HISTOGRAM => "histogram",
            MetricType::SUMMARY => "summary",
            MetricType::UNTYPED => "untyped",
        };
        let samples = family
            .get_metric()
            .iter()
            .map(|metric| {
                let labels = metric.get_label().iter().map(|l| (l.name().to_owned(), l.value().to_owned())).collect();
                let mut sample = SampleJson { labels, value: None, count: None, sum: None, buckets: None };
                match family.get_field_type() {
                    MetricType::COUNTER => sample.value = Some(metric.get_counter().get_value()),
                    MetricType::GAUGE => sample.value = Some(metric.get_gauge().get_value()),
                    MetricType::HISTOGRAM => {
                        let histogram = metric.get_histogram();
                        sample.count = Some(histogram.get_sample_count());
                        sample.sum = Some(histogram.get_sample_sum());
                        sample.buckets = Some(
                            histogram
                                .get_bucket()
                                .iter()
                                .map(|b| (b.upper_bound().to_string(), b.cumulative_count()))
                                .collect(),
                        );
                    }
                    // This registry makes no summaries or untyped metrics.
                    _ => {}
                }
                sample
            })
            .collect();
        FamilyJson { name: family.name().to_owned(), help: family.help().to_owned(), kind, samples }
    }
}
/// What the process has used since it started: its processor time (getrusage), and its resident
/// memory and start as the Prometheus process collector reads them from `/proc`; zeros where there
/// is none.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessUsage {
    pub cpu_seconds: f64,
    pub resident_bytes: i64,
    pub uptime: std::time::Duration,
}

pub fn process_usage() -> ProcessUsage {
    #[cfg(target_os = "linux")]
    {
        let families = prometheus::process_collector::ProcessCollector::for_self().collect();
        let value = |name: &str| {
            let family = families.iter().find(|f| f.name() == name)?;
            let metric = family.get_metric().first()?;
            Some(match family.get_field_type() {
                MetricType::COUNTER => metric.get_counter().get_value(),
                _ => metric.get_gauge().get_value(),
            })
        };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let started = value("process_start_time_seconds").unwrap_or(now.as_secs_f64());
        // The collector's processor time is in whole seconds; getrusage's, in microseconds.
        let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
        let cpu_seconds = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
            .map_or(0.0, |usage| seconds(usage.user_time()) + seconds(usage.system_time()));
        ProcessUsage {
            cpu_seconds,
            resident_bytes: value("process_resident_memory_bytes").unwrap_or(0.0) as i64,
            uptime: std::time::Duration::try_from_secs_f64(now.as_secs_f64() - started).unwrap_or_default(),
        }
    }
    #[cfg(not(target_os = "linux"))]
    ProcessUsage::default()
}

/// Counts one in `gauge` for as long as it lives: a request may be dropped at any point (its
/// client went away), and the count must drop with it.
pub struct GaugeHeld(IntGauge);

impl GaugeHeld {
    pub fn count(gauge: &IntGauge) -> Self {
        gauge.inc();
        GaugeHeld(gauge.clone())
    }
}

impl Drop for GaugeHeld {
    fn drop(&mut self) {
        self.0.dec();
    }
}
