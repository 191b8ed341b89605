//! Trace events that consumers attach to messages: recording one, and reading them back by
//! message, by name, and the names in use.

use queen_store::StoreError;
use queen_store::traces::{self, NameFilter, NewTrace, Page, Recorded, TraceEvent, TraceName};

use super::{Broker, BrokerError};

/// Records the event; `None` when the partition holds no such message (or retention removed it).
pub async fn record(broker: &Broker, trace: &NewTrace<'_>) -> Result<Option<Recorded>, BrokerError> {
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    Ok(traces::record(&client, trace).await?)
}

/// A page of the message's events, oldest first, and how many it has; `None` when the partition
/// holds no such message.
pub async fn of_message(
    broker: &Broker,
    partition_id: i64,
    transaction_id: &str,
    page: Page,
) -> Result<Option<(Vec<TraceEvent>, i64)>, BrokerError> {
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    Ok(traces::of_message(&client, partition_id, transaction_id, page).await?)
}

/// A page of the events carrying `name`, newest first, and how many match.
pub async fn by_name(broker: &Broker, name: &str, filter: &NameFilter) -> Result<(Vec<TraceEvent>, i64), BrokerError> {
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    Ok(traces::by_name(&client, name, filter).await?)
}

/// A page of the names in use, in name order.
pub async fn names(broker: &Broker, search: Option<&str>, page: Page) -> Result<Vec<TraceName>, BrokerError> {
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    Ok(traces::names(&client, search, page).await?)
}
