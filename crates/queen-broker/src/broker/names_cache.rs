//! Queue and partition names resolved to ids, cached. Ids never change and are never reused, so
//! an entry can only become stale by its queue or partition being deleted; operations that find
//! it gone forget the entry and resolve again.

use std::time::Duration;

use moka::sync::Cache;
use queen_store::{Pool, StoreError, queues};

/// A safety net for deletions this broker did not see.
const TIME_TO_LIVE: Duration = Duration::from_secs(60);
const CAPACITY: u64 = 100_000;

pub struct NamesCache {
    queues: Cache<String, i64>,
    partitions: Cache<(i64, String), i64>,
}

impl Default for NamesCache {
    fn default() -> Self {
        Self::new()
    }
}

impl NamesCache {
    pub fn new() -> Self {
        Self {
            queues: Cache::builder().max_capacity(CAPACITY).time_to_live(TIME_TO_LIVE).build(),
            partitions: Cache::builder().max_capacity(CAPACITY).time_to_live(TIME_TO_LIVE).build(),
        }
    }

    /// The queue's id, creating the queue on first use.
    pub async fn ensure_queue(&self, pool: &Pool, name: &str) -> Result<i64, StoreError> {
        if let Some(id) = self.queues.get(name) {
            return Ok(id);
        }
        let id = queues::ensure_queue(&pool.get().await?, name).await?;
        self.queues.insert(name.to_owned(), id);
        Ok(id)
    }

    /// The partition's id, creating it on first use.
    pub async fn ensure_partition(&self, pool: &Pool, queue_id: i64, name: &str) -> Result<i64, StoreError> {
        let key = (queue_id, name.to_owned());
        if let Some(id) = self.partitions.get(&key) {
            return Ok(id);
        }
        let id = queues::ensure_partition(&pool.get().await?, queue_id, name).await?;
        self.partitions.insert(key, id);
        Ok(id)
    }

    /// The queue's id if it exists; does not create it.
    pub async fn queue(&self, pool: &Pool, name: &str) -> Result<Option<i64>, StoreError> {
        if let Some(id) = self.queues.get(name) {
            return Ok(Some(id));
        }
        let found = queues::find_queue(&pool.get().await?, name).await?.map(|q| q.id);
        if let Some(id) = found {
            self.queues.insert(name.to_owned(), id);
        }
        Ok(found)
    }

    /// The partition's id if it exists; does not create it.
    pub async fn partition(&self, pool: &Pool, queue_id: i64, name: &str) -> Result<Option<i64>, StoreError> {
        let key = (queue_id, name.to_owned());
        if let Some(id) = self.partitions.get(&key) {
            return Ok(Some(id));
        }
        let found = queues::find_partition(&pool.get().await?, queue_id, name).await?;
        if let Some(id) = found {
            self.partitions.insert(key, id);
        }
        Ok(found)
    }

    /// Forgets a queue (deleted, or found gone). Its partitions' entries are keyed by the old
    /// queue id, which is never looked up again.
    pub fn forget_queue(&self, name: &str) {
        self.queues.invalidate(name);
    }

    pub fn forget_partition(&self, queue_id: i64, name: &str) {
        self.partitions.invalidate(&(queue_id, name.to_owned()));
    }
}
