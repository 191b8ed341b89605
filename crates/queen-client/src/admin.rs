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

use crate::transport::{Request, seg};
use crate::{Client, Error};

/// A queue's configuration: create a queue, or merge options into an existing one (options
/// not given keep their value). The common options are typed; [`option`](QueueConfig::option)
/// passes any other through (the broker keeps, echoes and lists unknown ones as ignored).
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
    /// Options the broker keeps and echoes but does not act on.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The answer to a configure.
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
    /// Options kept but not acted on.
    #[serde(default)]
    pub ignored_options: Vec<String>,
}

/// A queue: its options and size.
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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

/// The answer of `/health` or `/ready`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[non_exhaustive]
pub struct MetricSample {
    /// Its labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// A counter's or gauge's value.
    #[serde(default)]
    pub value: Option<f64>,
    /// A histogram's or summary's count.
    #[serde(default)]
    pub count: Option<u64>,
    /// A histogram's or summary's sum.
    #[serde(default)]
    pub sum: Option<f64>,
    /// A histogram's cumulative buckets, by upper bound.
    #[serde(default)]
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
#[derive(Debug, Clone, Deserialize)]
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
        self.call(Request::delete(format!("/api/v1/resources/queues/{}", seg(queue)))).await
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
