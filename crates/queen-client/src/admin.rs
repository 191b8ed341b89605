//! Queues and the broker: configuration, listings, dashboards' reads, maintenance mode, health,
//! readiness and metrics.
//!
//! Answers that are part of the client protocol (configure, queue, maintenance, health,
//! metrics, message listing) are typed exactly. The dashboards' reads (resources, status,
//! analytics) grow as the dashboards do: they are typed with the fields the broker serves today,
//! and every member this version of the client does not know lands in their `extra` map.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::transport::{Replay, Request, seg};
use crate::{Client, Error};

/// A queue's configuration: create a queue, or merge options into an existing one (options
/// not given keep their value). The common options are typed; [`option`](QueueConfig::option)
/// names any other by its wire name (the broker refuses, with a 400, an option it does not act on).
///
/// Durations are sent in whole seconds, rounded up, except `retryDelay` (milliseconds).
///
/// ```
/// use std::time::Duration;
/// use queen_client::QueueConfig;
///
/// let config = QueueConfig::new("orders")
///     .namespace("shop")
///     .lease_time(Duration::from_secs(60))
///     .retry_limit(3)
///     .max_size(100_000)
///     .option("customSetting", "kept as is");
/// # let _ = config;
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct QueueConfig {
    queue: String,
    namespace: Option<String>,
    task: Option<String>,
    options: Map<String, Value>,
}

fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

impl QueueConfig {
    /// A configuration of `queue` that changes nothing yet (creates it when missing).
    pub fn new(queue: impl Into<String>) -> QueueConfig {
        QueueConfig { queue: queue.into(), namespace: None, task: None, options: Map::new() }
    }

    /// The queue's namespace (namespace pops serve every queue of one).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The queue's task.
    pub fn task(mut self, task: impl Into<String>) -> Self {
        self.task = Some(task.into());
        self
    }

    /// Any option, by its wire name.
    pub fn option(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.options.insert(name.into(), value.into());
        self
    }

    fn seconds(self, name: &str, duration: Duration) -> Self {
        self.option(name, whole_seconds(duration))
    }

    /// `leaseTime`: how long a pop's lease lasts unless extended or acknowledged.
    pub fn lease_time(self, lease_time: Duration) -> Self {
        self.seconds("leaseTime", lease_time)
    }

    /// `retryLimit`: failures after the first delivery before a message is dead-lettered.
    pub fn retry_limit(self, retries: u32) -> Self {
        self.option("retryLimit", retries)
    }

    /// `retryDelay`: how long a failed message waits before it is delivered again.
    pub fn retry_delay(self, delay: Duration) -> Self {
        self.option("retryDelay", u64::try_from(delay.as_millis()).unwrap_or(u64::MAX))
    }

    /// `priority`: namespace and task pops serve queues of higher priority first.
    pub fn priority(self, priority: i32) -> Self {
        self.option("priority", priority)
    }

    /// `delayedProcessing`: a message is delivered only this long after it was pushed.
    pub fn delayed_processing(self, delay: Duration) -> Self {
        self.seconds("delayedProcessing", delay)
    }

    /// `windowBuffer`: a partition is served only once its last push is this old, then whole.
    pub fn window_buffer(self, window: Duration) -> Self {
        self.seconds("windowBuffer", window)
    }

    /// `maxSize`: pushes past this many unconsumed messages are refused ([`Error::QueueFull`]);
    /// 0 for no limit.
    pub fn max_size(self, messages: u64) -> Self {
        self.option("maxSize", messages)
    }

    /// `ttl`: how long a message may wait to be consumed.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.seconds("ttl", ttl)
    }

    /// `deadLetterQueue`: keep exhausted messages as dead letters.
    pub fn dead_letter_queue(self, enabled: bool) -> Self {
        self.option("deadLetterQueue", enabled)
    }

    /// `dlqAfterMaxRetries`: dead-letter messages past `retryLimit` (rather than drop them).
    pub fn dlq_after_max_retries(self, enabled: bool) -> Self {
        self.option("dlqAfterMaxRetries", enabled)
    }

    /// `retentionEnabled`: let maintenance delete old data.
    pub fn retention_enabled(self, enabled: bool) -> Self {
        self.option("retentionEnabled", enabled)
    }

    /// `retentionSeconds`: with retention, data older than this goes, read or not.
    pub fn retention(self, age: Duration) -> Self {
        self.seconds("retentionSeconds", age)
    }

    /// `completedRetentionSeconds`: with retention, data every group has read goes at this age.
    pub fn completed_retention(self, age: Duration) -> Self {
        self.seconds("completedRetentionSeconds", age)
    }

    /// `encryptionEnabled`: encrypt the queue's data at rest (the brokers need the key).
    pub fn encryption_enabled(self, enabled: bool) -> Self {
        self.option("encryptionEnabled", enabled)
    }

    /// `dedupWindowSeconds`: how long a transaction id deduplicates (default: as long as its
    /// message is kept).
    pub fn dedup_window(self, window: Duration) -> Self {
        self.seconds("dedupWindowSeconds", window)
    }
}

#[derive(Serialize)]
struct ConfigureBody<'a> {
    queue: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    task: Option<&'a str>,
    options: &'a Map<String, Value>,
}

/// A queue's options with their effective values (defaults included), as the broker echoes
/// them. Durations are in seconds except `retry_delay` (milliseconds).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct QueueOptions {
    /// `leaseTime`, seconds.
    pub lease_time: i64,
    /// `retryLimit`.
    pub retry_limit: i64,
    /// `retryDelay`, milliseconds.
    pub retry_delay: i64,
    /// `priority`.
    pub priority: i64,
    /// `delayedProcessing`, seconds.
    pub delayed_processing: i64,
    /// `windowBuffer`, seconds.
    pub window_buffer: i64,
    /// `maxSize`, messages (0: no limit).
    pub max_size: i64,
    /// `ttl`, seconds.
    pub ttl: i64,
    /// `maxWaitTimeSeconds`.
    pub max_wait_time_seconds: i64,
    /// `deadLetterQueue`.
    pub dead_letter_queue: bool,
    /// `dlqAfterMaxRetries`.
    pub dlq_after_max_retries: bool,
    /// `retentionEnabled`.
    pub retention_enabled: bool,
    /// `retentionSeconds`.
    pub retention_seconds: i64,
    /// `completedRetentionSeconds`.
    pub completed_retention_seconds: i64,
    /// `encryptionEnabled`.
    pub encryption_enabled: bool,
    /// `dedupWindowSeconds`.
    pub dedup_window_seconds: i64,
    /// Options this version of the client does not know (a newer broker's).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The answer to a configure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Configured {
    /// Always `true` on success.
    pub configured: bool,
    /// The queue's id.
    pub queue_id: i64,
    /// The queue.
    pub queue: String,
    /// Its namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Its task.
    #[serde(default)]
    pub task: Option<String>,
    /// Every option with its effective value.
    pub options: QueueOptions,
}

/// A queue: its options and size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct QueueInfo {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// Its namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Its task.
    #[serde(default)]
    pub task: Option<String>,
    /// Its options.
    pub options: QueueOptions,
    /// How many partitions it has.
    pub partitions: i64,
    /// How many messages it holds.
    pub messages: i64,
}

/// The answer to a queue deletion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueueDeleted {
    /// Always `true` on success.
    pub deleted: bool,
    /// The queue.
    pub queue: String,
    /// Whether there was such a queue.
    pub existed: bool,
}

/// Filters and a page for the listings: [`Client::list_queues`] and [`Client::queue_statuses`]
/// read `namespace`, `task`, `limit` and `offset`; [`Client::list_partitions`] reads `queue`,
/// `limit` and `offset`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct ListQuery {
    namespace: Option<String>,
    task: Option<String>,
    queue: Option<String>,
    limit: Option<u32>,
    offset: Option<u64>,
}

impl ListQuery {
    /// Everything, the first page (100).
    pub fn new() -> ListQuery {
        ListQuery::default()
    }

    /// Queues of this namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Queues of this task.
    pub fn task(mut self, task: impl Into<String>) -> Self {
        self.task = Some(task.into());
        self
    }

    /// Partitions of this queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// At most this many (1 to 1000; default 100).
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Skipping this many.
    pub fn offset(mut self, offset: u64) -> Self {
        self.offset = Some(offset);
        self
    }

    fn apply(&self, request: Request, by_queue: bool) -> Request {
        let request = if by_queue {
            request.query_opt("queue", self.queue.as_ref())
        } else {
            request.query_opt("namespace", self.namespace.as_ref()).query_opt("task", self.task.as_ref())
        };
        request.query_opt("limit", self.limit).query_opt("offset", self.offset)
    }
}

/// Messages pushed and stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MessageCounts {
    /// Ever pushed.
    #[serde(default)]
    pub pushed: i64,
    /// Stored now.
    #[serde(default)]
    pub stored: i64,
}

/// `/api/v1/resources/overview`: the data at a glance.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct Overview {
    /// Queues.
    pub queues: i64,
    /// Partitions.
    pub partitions: i64,
    /// Messages.
    pub messages: MessageCounts,
    /// Consumer groups.
    pub consumer_groups: i64,
    /// Leases held now.
    pub active_leases: i64,
    /// Dead letters.
    pub dead_letters: i64,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A queue in a listing.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct QueueSummary {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// Its namespace.
    pub namespace: Option<String>,
    /// Its task.
    pub task: Option<String>,
    /// Its partitions.
    pub partitions: i64,
    /// Its messages.
    pub messages: MessageCounts,
    /// Its last push.
    pub last_push_at: Option<DateTime<Utc>>,
    /// When it was created.
    pub created_at: Option<DateTime<Utc>>,
    /// Its options, as echoed.
    pub options: Map<String, Value>,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A page of queues.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct QueuePage {
    /// The queues.
    pub queues: Vec<QueueSummary>,
    /// The page size.
    pub limit: i64,
    /// The page's start.
    pub offset: i64,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A partition in a listing.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct PartitionSummary {
    /// Its id.
    pub id: String,
    /// Its queue.
    pub queue: String,
    /// Its name.
    pub name: String,
    /// Its last offset.
    pub last_offset: i64,
    /// The oldest offset retention kept.
    pub retained_from: i64,
    /// Messages it holds.
    pub messages_stored: i64,
    /// When it was created.
    pub created_at: Option<DateTime<Utc>>,
    /// Its last push.
    pub last_push_at: Option<DateTime<Utc>>,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A page of partitions, the most recently pushed first.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct PartitionPage {
    /// The partitions.
    pub partitions: Vec<PartitionSummary>,
    /// The page size.
    pub limit: i64,
    /// The page's start.
    pub offset: i64,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `/api/v1/status`: the broker that answers and the data at a glance.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct BrokerStatus {
    /// `ok`.
    pub status: String,
    /// The answering broker's id.
    pub broker: String,
    /// Its version.
    pub version: String,
    /// Seconds since it started.
    pub uptime_seconds: f64,
    /// Queues.
    pub queues: i64,
    /// Partitions.
    pub partitions: i64,
    /// Messages.
    pub messages: MessageCounts,
    /// Consumer groups.
    pub consumer_groups: i64,
    /// Leases held now.
    pub active_leases: i64,
    /// Dead letters.
    pub dead_letters: i64,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A group's lag on a queue, in a queue's status.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct QueueGroupLag {
    /// The group.
    pub name: String,
    /// Partitions it has a cursor on.
    pub partitions: usize,
    /// Unread messages.
    pub lag_messages: i64,
    /// Age of the oldest unread message, seconds.
    pub lag_seconds: f64,
    /// Partitions leased now.
    pub active_leases: usize,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A queue with its groups' lag.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct QueueStatus {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// Its namespace.
    pub namespace: Option<String>,
    /// Its task.
    pub task: Option<String>,
    /// Its partitions.
    pub partitions: i64,
    /// Its messages.
    pub messages: MessageCounts,
    /// Its last push.
    pub last_push_at: Option<DateTime<Utc>>,
    /// When it was created.
    pub created_at: Option<DateTime<Utc>>,
    /// Its options, as echoed.
    pub options: Map<String, Value>,
    /// The groups reading it.
    pub consumer_groups: Vec<QueueGroupLag>,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A page of queue statuses.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct QueueStatusPage {
    /// The queues.
    pub queues: Vec<QueueStatus>,
    /// The page size.
    pub limit: i64,
    /// The page's start.
    pub offset: i64,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `/api/v1/status/queues/{queue}`: one queue, its partitions and its groups.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct QueueStatusDetail {
    /// The queue.
    pub queue: QueueStatus,
    /// Its partitions.
    pub partitions: Vec<PartitionSummary>,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `/api/v1/status/analytics`: the answering broker's traffic since it started, the data's
/// totals, and what maintenance removed in the last day.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct Analytics {
    /// The answering broker's counters.
    pub broker: BrokerTraffic,
    /// The data's totals.
    pub totals: Overview,
    /// Maintenance over the last day.
    pub maintenance_last_day: MaintenanceSummary,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One broker's traffic since it started.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct BrokerTraffic {
    /// The broker's id.
    pub id: String,
    /// Seconds since it started.
    pub uptime_seconds: f64,
    /// Messages it stored from pushes.
    pub messages_pushed: f64,
    /// Messages it delivered.
    pub messages_delivered: f64,
    /// Messages acknowledged through it.
    pub messages_acked: f64,
    /// Failed acknowledgements through it.
    pub messages_failed: f64,
    /// Messages it dead-lettered.
    pub messages_dead_lettered: f64,
    /// Segments it wrote.
    pub segments_written: f64,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// What maintenance passes removed.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct MaintenanceSummary {
    /// Passes run.
    pub passes: i64,
    /// Segments deleted.
    pub segments_deleted: i64,
    /// Messages deleted.
    pub messages_deleted: i64,
    /// Partitions deleted.
    pub partitions_deleted: i64,
    /// The last pass.
    pub last_pass_at: Option<DateTime<Utc>>,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Both maintenance switches (shared by the fleet) and the answering broker's push journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MaintenanceStatus {
    /// Push maintenance: pushes answer `buffered` and are journaled, then stored when it ends.
    pub maintenance_mode: bool,
    /// Pop maintenance: pops answer nothing (`paused`).
    pub pop_maintenance_mode: bool,
    /// Pushes in this broker's journal.
    pub buffered_messages: u64,
    /// Whether the journal can be written.
    pub buffer_healthy: bool,
    /// Where the journal is.
    pub buffer_directory: String,
}

#[derive(Serialize)]
struct Switch {
    enabled: bool,
}

/// `/api/v1/status/brokers`: the brokers of the fleet heard of in the last hour (each broker
/// records a heartbeat in the database, so any broker lists them all) and the fleet's
/// maintenance switches.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct Fleet {
    /// How often each broker beats (its `stats.sample_interval_seconds`); a broker not heard of
    /// for a few beats is [`BrokerState::Missing`].
    pub heartbeat_seconds: u64,
    /// The fleet's maintenance switches.
    pub maintenance: MaintenanceSwitches,
    /// The brokers, the earliest started first.
    pub brokers: Vec<FleetBroker>,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The fleet's two maintenance switches, as [`Client::brokers`] shows them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct MaintenanceSwitches {
    /// Push maintenance: pushes are journaled (`buffered`).
    pub push: bool,
    /// Pop maintenance: pops deliver nothing (`paused`).
    pub pop: bool,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One broker of the fleet, as its last heartbeat says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct FleetBroker {
    /// Its id (host, port and process).
    pub id: String,
    /// Its version.
    pub version: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub last_seen_at: DateTime<Utc>,
    /// Whether it is live, draining, stopped or missing.
    pub state: BrokerState,
    /// Pushes in its journal (push maintenance), at its last heartbeat.
    #[serde(default)]
    pub buffered_messages: i64,
    /// Whether its journal could be written, at its last heartbeat.
    #[serde(default)]
    pub buffer_healthy: bool,
    /// Whether it is the broker that answered.
    #[serde(default, rename = "self")]
    pub is_self: bool,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// What a broker of the fleet is doing, as far as its heartbeats tell.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum BrokerState {
    /// Beating.
    Live,
    /// Draining for a graceful shutdown.
    Stopping,
    /// Shut down gracefully.
    Stopped,
    /// Not heard of for a few heartbeats without having stopped: crashed, or cut off from the
    /// database.
    Missing,
    /// A state this client does not know, as the broker named it.
    #[serde(untagged)]
    Other(String),
}

impl BrokerState {
    /// The state as the broker names it: `live`, `stopping`, `stopped`, `missing`...
    pub fn as_str(&self) -> &str {
        match self {
            BrokerState::Live => "live",
            BrokerState::Stopping => "stopping",
            BrokerState::Stopped => "stopped",
            BrokerState::Missing => "missing",
            BrokerState::Other(name) => name,
        }
    }
}

impl std::fmt::Display for BrokerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `/api/v1/status/history`: the fleet's traffic and consumer lag over the last minutes, one
/// point per sample interval.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct History {
    /// The interval between points, seconds (the brokers' `stats.sample_interval_seconds`).
    pub interval_seconds: u64,
    /// The first point's time.
    pub from: Option<DateTime<Utc>>,
    /// The last point's time: the interval under way.
    pub to: Option<DateTime<Utc>>,
    /// Every interval, oldest first, those without traffic included.
    pub points: Vec<HistoryPoint>,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One interval of the fleet's history: its traffic summed over the brokers, and the consumer
/// lag when it was sampled in that interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct HistoryPoint {
    /// The interval's start.
    pub at: DateTime<Utc>,
    /// Messages stored from pushes.
    #[serde(default)]
    pub pushed: i64,
    /// Messages delivered.
    #[serde(default)]
    pub delivered: i64,
    /// Messages acknowledged.
    #[serde(default)]
    pub acked: i64,
    /// Failed acknowledgements.
    #[serde(default)]
    pub failed: i64,
    /// Messages dead-lettered.
    #[serde(default)]
    pub dead_lettered: i64,
    /// Unread messages over every consumer group's cursors; `None` when the lag was not
    /// sampled in this interval.
    #[serde(default)]
    pub lag_messages: Option<i64>,
    /// Age of the oldest unread message, seconds; `None` when not sampled.
    #[serde(default)]
    pub lag_seconds: Option<f64>,
    /// Members this client does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The answer of `/health` or `/ready`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Health {
    /// `healthy` (`/health`) or `ready` (`/ready`).
    pub status: String,
    /// `connected`, `unreachable` or `read-only`.
    pub database: String,
    /// The broker's version.
    pub version: String,
}

/// `/metrics` as JSON: every metric family with its samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Metrics {
    /// The families.
    pub metrics: Vec<MetricFamily>,
}

impl Metrics {
    /// The value of the sample of `name` whose labels include every pair of `labels` (a
    /// histogram's count); `None` when there is none.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let family = self.metrics.iter().find(|family| family.name == name)?;
        family
            .samples
            .iter()
            .find(|sample| {
                labels.iter().all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(*value))
            })
            .and_then(|sample| sample.value.or(sample.count.map(|count| count as f64)))
    }
}

/// A metric family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MetricFamily {
    /// Its name, e.g. `queen_messages_pushed_total`.
    pub name: String,
    /// What it measures.
    pub help: String,
    /// `counter`, `gauge`, `histogram`, `summary` or `untyped`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its samples.
    pub samples: Vec<MetricSample>,
}

/// One sample of a metric family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MetricSample {
    /// Its labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// A counter's or gauge's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// A histogram's or summary's count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// A histogram's or summary's sum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum: Option<f64>,
    /// A histogram's cumulative buckets, by upper bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<BTreeMap<String, u64>>,
}

/// A stored message, as listings show it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct StoredMessage {
    /// The message id.
    pub id: Uuid,
    /// Its transaction id.
    pub transaction_id: String,
    /// Its trace id.
    #[serde(default)]
    pub trace_id: Option<Uuid>,
    /// Who pushed it.
    #[serde(default)]
    pub producer_sub: Option<String>,
    /// Its queue.
    pub queue: String,
    /// Its partition's name.
    pub partition: String,
    /// Its partition's id.
    pub partition_id: String,
    /// Its offset.
    pub offset: i64,
    /// When it was stored.
    pub created_at: DateTime<Utc>,
    /// The payload.
    pub data: Box<RawValue>,
}

impl StoredMessage {
    /// The payload decoded as `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.data.get())
    }
}

/// The newest messages of a queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MessageListing {
    /// Newest first.
    pub messages: Vec<StoredMessage>,
    /// The most asked for.
    pub limit: i64,
}

impl Client {
    /// Creates a queue, or merges options into it; every option's effective value.
    pub async fn configure(&self, config: &QueueConfig) -> Result<Configured, Error> {
        let body = ConfigureBody {
            queue: &config.queue,
            namespace: config.namespace.as_deref(),
            task: config.task.as_deref(),
            options: &config.options,
        };
        self.call(Request::post("/api/v1/configure".into()).json(&body)?).await
    }

    /// A queue; [`Error::Status`] 404 when there is none.
    pub async fn queue(&self, queue: &str) -> Result<QueueInfo, Error> {
        self.call(Request::get(format!("/api/v1/resources/queues/{}", seg(queue)))).await
    }

    /// Deletes a queue with everything of it: partitions, messages, cursors, registrations,
    /// dead letters. A push to the name later starts a fresh queue.
    pub async fn delete_queue(&self, queue: &str) -> Result<QueueDeleted, Error> {
        self.call(Request::delete(format!("/api/v1/resources/queues/{}", seg(queue))).replay(Replay::IfUnapplied)).await
    }

    /// A page of queues (`/api/v1/resources/queues`).
    pub async fn list_queues(&self, query: &ListQuery) -> Result<QueuePage, Error> {
        self.call(query.apply(Request::get("/api/v1/resources/queues".into()), false)).await
    }

    /// A page of partitions (`/api/v1/resources/partitions`).
    pub async fn list_partitions(&self, query: &ListQuery) -> Result<PartitionPage, Error> {
        self.call(query.apply(Request::get("/api/v1/resources/partitions".into()), true)).await
    }

    /// The data at a glance (`/api/v1/resources/overview`).
    pub async fn overview(&self) -> Result<Overview, Error> {
        self.call(Request::get("/api/v1/resources/overview".into())).await
    }

    /// The answering broker and the data at a glance (`/api/v1/status`).
    pub async fn status(&self) -> Result<BrokerStatus, Error> {
        self.call(Request::get("/api/v1/status".into())).await
    }

    /// A page of queues with their groups' lag (`/api/v1/status/queues`).
    pub async fn queue_statuses(&self, query: &ListQuery) -> Result<QueueStatusPage, Error> {
        self.call(query.apply(Request::get("/api/v1/status/queues".into()), false)).await
    }

    /// One queue with its partitions and groups (`/api/v1/status/queues/{queue}`).
    pub async fn queue_status(&self, queue: &str) -> Result<QueueStatusDetail, Error> {
        self.call(Request::get(format!("/api/v1/status/queues/{}", seg(queue)))).await
    }

    /// The brokers of the fleet heard of in the last hour, with their state and journal, and
    /// the fleet's maintenance switches (`/api/v1/status/brokers`). Any broker answers for the
    /// whole fleet; [`FleetBroker::is_self`] marks the one that answered.
    ///
    /// ```no_run
    /// # async fn example(client: queen_client::Client) -> Result<(), queen_client::Error> {
    /// use queen_client::BrokerState;
    ///
    /// let fleet = client.brokers().await?;
    /// for broker in fleet.brokers.iter().filter(|b| b.state == BrokerState::Missing) {
    ///     eprintln!("{} last beat at {}", broker.id, broker.last_seen_at);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn brokers(&self) -> Result<Fleet, Error> {
        self.call(Request::get("/api/v1/status/brokers".into())).await
    }

    /// The fleet's traffic and consumer lag over the last `minutes`, one point per sample
    /// interval, oldest first (`/api/v1/status/history`). The broker keeps a day: `minutes` is
    /// 1 to 1440 (the dashboard asks for 60), anything else is refused ([`Error::Status`] 400).
    pub async fn history(&self, minutes: u32) -> Result<History, Error> {
        self.call(Request::get("/api/v1/status/history".into()).query("minutes", minutes)).await
    }

    /// Traffic and maintenance figures (`/api/v1/status/analytics`).
    pub async fn analytics(&self) -> Result<Analytics, Error> {
        self.call(Request::get("/api/v1/status/analytics".into())).await
    }

    /// The newest messages of a queue (of one partition, by name, when given), newest first:
    /// 20 unless `limit` says otherwise (at most 1000).
    pub async fn newest_messages(
        &self,
        queue: &str,
        partition: Option<&str>,
        limit: Option<u32>,
    ) -> Result<MessageListing, Error> {
        let request = Request::get("/api/v1/messages".into())
            .query("queue", queue)
            .query_opt("partition", partition)
            .query_opt("limit", limit);
        self.call(request).await
    }

    /// Both maintenance switches and the answering broker's journal.
    pub async fn maintenance(&self) -> Result<MaintenanceStatus, Error> {
        self.call(Request::get("/api/v1/system/maintenance".into())).await
    }

    /// Turns push maintenance on or off for the fleet.
    pub async fn set_push_maintenance(&self, enabled: bool) -> Result<MaintenanceStatus, Error> {
        self.call(Request::post("/api/v1/system/maintenance".into()).json(&Switch { enabled })?).await
    }

    /// Turns pop maintenance on or off for the fleet.
    pub async fn set_pop_maintenance(&self, enabled: bool) -> Result<MaintenanceStatus, Error> {
        self.call(Request::post("/api/v1/system/maintenance/pop".into()).json(&Switch { enabled })?).await
    }

    /// Liveness (`/health`) of the first broker that answers: one attempt per URL, no waiting.
    pub async fn health(&self) -> Result<Health, Error> {
        self.call(Request::get("/health".into()).one_round()).await
    }

    /// Readiness (`/ready`) of the first ready broker: one attempt per URL, no waiting. A broker
    /// that is not ready answers [`Error::Status`] 503, whose body says why (`database`:
    /// `unreachable` or `read-only`).
    pub async fn ready(&self) -> Result<Health, Error> {
        self.call(Request::get("/ready".into()).one_round()).await
    }

    /// Metrics as JSON (`/metrics?format=json`).
    pub async fn metrics(&self) -> Result<Metrics, Error> {
        self.call(Request::get("/metrics".into()).query("format", "json").one_round()).await
    }

    /// Metrics in the Prometheus text format (`/metrics?format=prometheus`).
    pub async fn metrics_prometheus(&self) -> Result<String, Error> {
        let request = Request::get("/metrics".into()).query("format", "prometheus").one_round();
        self.send(&request).await?.success()?.text()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up_to_whole_seconds() {
        let config = QueueConfig::new("q")
            .lease_time(Duration::from_millis(1500))
            .retry_delay(Duration::from_millis(250))
            .ttl(Duration::from_secs(3));
        assert_eq!(config.options["leaseTime"], 2);
        assert_eq!(config.options["retryDelay"], 250);
        assert_eq!(config.options["ttl"], 3);
    }

    #[test]
    fn dashboards_keep_what_this_client_does_not_know() {
        let detail = r#"{"queue":{"id":1,"name":"q","namespace":null,"task":null,"partitions":1,"messages":{"pushed":3,"stored":3},
            "lastPushAt":null,"createdAt":"2026-07-29T14:00:00Z","options":{},"consumerGroups":[]},"partitions":[],"cursors":[{"group":"g"}]}"#;
        let detail: QueueStatusDetail = serde_json::from_str(detail).unwrap();
        assert_eq!(detail.queue.messages.stored, 3);
        assert!(detail.extra.contains_key("cursors"));
    }

    /// Whether `a` and `b` have the same members at every depth (values may be written
    /// differently: `...00.000000Z` and `...00Z` are one time).
    fn same_members(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                a.len() == b.len()
                    && a.iter().all(|(key, value)| b.get(key).is_some_and(|other| same_members(value, other)))
            }
            (Value::Array(a), Value::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_members(a, b))
            }
            _ => true,
        }
    }

    /// Decodes the broker's JSON, encodes it, decodes that again: the same answer, written with
    /// the broker's member names.
    fn round_trip<T>(broker: &str) -> T
    where
        T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug,
    {
        let answer: T = serde_json::from_str(broker).unwrap();
        let written = serde_json::to_value(&answer).unwrap();
        let original: Value = serde_json::from_str(broker).unwrap();
        assert!(same_members(&written, &original), "{written:#} has the members of {original:#}");
        let again: T = serde_json::from_value(written).unwrap();
        assert_eq!(again, answer);
        answer
    }

    #[test]
    fn answers_are_written_as_the_broker_writes_them_and_read_back() {
        let fleet: Fleet = round_trip(
            r#"{"heartbeatSeconds":10,"maintenance":{"push":false,"pop":true},"brokers":[
                {"id":"a:6632:1","version":"0.1.0","startedAt":"2026-07-29T14:00:00.000001Z","lastSeenAt":"2026-07-29T14:05:00.000000Z",
                 "state":"live","bufferedMessages":0,"bufferHealthy":true,"self":true},
                {"id":"b:6632:2","version":"0.2.0","startedAt":"2026-07-29T14:00:01.000000Z","lastSeenAt":"2026-07-29T14:01:00.000000Z",
                 "state":"rebalancing","bufferedMessages":3,"bufferHealthy":false,"self":false,"zone":"eu-1"}]}"#,
        );
        assert!(fleet.maintenance.pop && fleet.brokers[0].is_self);
        assert_eq!(fleet.brokers[0].state, BrokerState::Live);
        assert_eq!(fleet.brokers[1].state.as_str(), "rebalancing", "a state this client does not know is kept");
        assert_eq!(fleet.brokers[1].extra["zone"], "eu-1");

        let history: History = round_trip(
            r#"{"intervalSeconds":1,"from":"2026-07-29T14:00:00.000000Z","to":"2026-07-29T14:00:01.000000Z","points":[
                {"at":"2026-07-29T14:00:00.000000Z","pushed":5,"delivered":4,"acked":3,"failed":1,"deadLettered":0,"lagMessages":null,"lagSeconds":null},
                {"at":"2026-07-29T14:00:01.000000Z","pushed":0,"delivered":0,"acked":0,"failed":0,"deadLettered":0,"lagMessages":2,"lagSeconds":0.5}]}"#,
        );
        assert_eq!((history.points[0].lag_messages, history.points[1].lag_seconds), (None, Some(0.5)));

        let detail: QueueStatusDetail = round_trip(
            r#"{"queue":{"id":1,"name":"q","namespace":null,"task":null,"partitions":1,"messages":{"pushed":3,"stored":3},
                "lastPushAt":null,"createdAt":"2026-07-29T14:00:00.000000Z","options":{"leaseTime":60},"consumerGroups":[
                {"name":"g","partitions":1,"lagMessages":2,"lagSeconds":1.5,"activeLeases":0}]},
                "partitions":[{"id":"7","queue":"q","name":"p","lastOffset":3,"retainedFrom":1,"messagesStored":3,
                "createdAt":"2026-07-29T14:00:00.000000Z","lastPushAt":null}],"cursors":[{"group":"g"}]}"#,
        );
        assert!(detail.extra.contains_key("cursors"));
    }

    #[test]
    fn metric_samples_are_found_by_labels() {
        let metrics: Metrics = serde_json::from_str(
            r#"{"metrics":[{"name":"m","help":"h","type":"counter","samples":[{"labels":{"queue":"a"},"value":1},{"labels":{"queue":"b"},"value":2}]}]}"#,
        )
        .unwrap();
        assert_eq!(metrics.value("m", &[("queue", "b")]), Some(2.0));
        assert_eq!(metrics.value("m", &[("queue", "c")]), None);
        assert_eq!(metrics.value("n", &[]), None);
    }
}
