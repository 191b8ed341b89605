//! Reads for dashboards and operators: totals, queues and partitions with their sizes, groups'
//! lag, and what maintenance removed. All from queue, partition and cursor rows.

use queen_store::StoreError;
use queen_store::groups::{self, CursorLag};
use queen_store::stats::{self, LabelStats, MaintenanceSummary, Overview, PartitionStats, QueueLabel, QueueStats};

use super::Broker;
use super::BrokerError;

/// Which queues a listing shows, and which page of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFilter<'a> {
    pub namespace: Option<&'a str>,
    pub task: Option<&'a str>,
    /// Only queues whose name holds this, in any case.
    pub search: Option<&'a str>,
    pub limit: i64,
    pub offset: i64,
}

/// One queue with its partitions and the lag of every group on it.
pub struct QueueStatus {
    pub queue: QueueStats,
    pub partitions: Vec<PartitionStats>,
    pub lags: Vec<CursorLag>,
}

async fn client(broker: &Broker) -> Result<deadpool_postgres::Object, BrokerError> {
    Ok(broker.pool.get().await.map_err(StoreError::from)?)
}

pub async fn overview(broker: &Broker) -> Result<Overview, BrokerError> {
    Ok(stats::overview(&client(broker).await?).await?)
}

/// A page of queues with their sizes.
pub async fn queues(broker: &Broker, filter: &QueueFilter<'_>) -> Result<Vec<QueueStats>, BrokerError> {
    let client = client(broker).await?;
    Ok(stats::queues(&client, None, filter.namespace, filter.task, filter.search, filter.limit, filter.offset).await?)
}

/// A page of the namespaces (or tasks) queues carry, with their queues' sizes summed.
pub async fn queues_by_label(
    broker: &Broker,
    label: QueueLabel,
    limit: i64,
    offset: i64,
) -> Result<Vec<LabelStats>, BrokerError> {
    Ok(stats::queues_by_label(&client(broker).await?, label, limit, offset).await?)
}

/// A page of queues, and the lag of every group's cursors on them (registered groups' missing
/// cursors included).
pub async fn queues_with_lag(
    broker: &Broker,
    filter: &QueueFilter<'_>,
) -> Result<(Vec<QueueStats>, Vec<CursorLag>), BrokerError> {
    let client = client(broker).await?;
    let queues =
        stats::queues(&client, None, filter.namespace, filter.task, filter.search, filter.limit, filter.offset).await?;
    let names: Vec<&str> = queues.iter().map(|stats| stats.queue.name.as_str()).collect();
    let lags = groups::cursor_lags(&client, None, Some(&names)).await?;
    Ok((queues, lags))
}

/// A page of partitions (of one queue, when named), the most recently pushed first.
pub async fn partitions(
    broker: &Broker,
    queue: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<Vec<PartitionStats>, BrokerError> {
    Ok(stats::partitions(&client(broker).await?, queue, limit, offset).await?)
}

/// The queue, up to `max_partitions` of its partitions, and its groups' lag; `None` when it does
/// not exist.
pub async fn queue_status(
    broker: &Broker,
    name: &str,
    max_partitions: i64,
) -> Result<Option<QueueStatus>, BrokerError> {
    let client = client(broker).await?;
    let Some(queue) = stats::queues(&client, Some(name), None, None, None, 1, 0).await?.pop() else { return Ok(None) };
    let partitions = stats::partitions(&client, Some(name), max_partitions, 0).await?;
    let lags = groups::cursor_lags(&client, None, Some(&[name])).await?;
    Ok(Some(QueueStatus { queue, partitions, lags }))
}

/// The totals, and what maintenance did in the last `hours`.
pub async fn with_maintenance(broker: &Broker, hours: f64) -> Result<(Overview, MaintenanceSummary), BrokerError> {
    let client = client(broker).await?;
    Ok((stats::overview(&client).await?, stats::maintenance(&client, hours).await?))
}
