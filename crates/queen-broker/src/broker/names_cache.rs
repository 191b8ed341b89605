//! Queues (by name, with their options) and partition ids (by queue id and name), cached.
//! Partition ids never change and are never reused, so a partition entry can only become stale by
//! its partition being deleted; operations that find it gone forget the entry and resolve again.
//! A queue entry also goes stale when the queue is configured: every broker is told (the
//! `QueueChanged` notice) and forgets it.

use std::sync::Arc;
use std::time::Duration;

use moka::sync::Cache;
use queen_store::queues::{self, Queue};
use queen_store::{Pool, StoreError};

/// A safety net for changes this broker did not hear of.
const TIME_TO_LIVE: Duration = Duration::from_secs(60);
const CAPACITY: u64 = 100_000;

pub struct NamesCache {
    queues: Cache<String, Arc<Queue>>,
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

    /// The queue, created with default options on first use.
    pub async fn ensure_queue(&self, pool: &Pool, name: &str) -> Result<Arc<Queue>, StoreError> {
        if let Some(queue) = self.queues.get(name) {
            return Ok(queue);
        }
        let queue = Arc::new(queues::ensure_queue(&pool.get().await?, name).await?);
        self.queues.insert(name.to_owned(), Arc::clone(&queue));
        Ok(queue)
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

    /// The queue if it exists; does not create it.
    pub async fn queue(&self, pool: &Pool, name: &str) -> Result<Option<Arc<Queue>>, StoreError> {
        if let Some(queue) = self.queues.get(name) {
            return Ok(Some(queue));
        }
        let found = queues::find_queue(&pool.get().await?, name).await?.map(Arc::new);
        if let Some(queue) = &found {
            self.queues.insert(name.to_owned(), Arc::clone(queue));
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

    /// Forgets a queue (configured, deleted, or found gone). Its partitions' entries are keyed by
    /// the queue id, which a deleted queue never gets back.
    pub fn forget_queue(&self, name: &str) {
        self.queues.invalidate(name);
    }

    /// Forgets every queue (notices of changes may have been missed).
    pub fn forget_queues(&self) {
        self.queues.invalidate_all();
    }

    pub fn forget_partition(&self, queue_id: i64, name: &str) {
        self.partitions.invalidate(&(queue_id, name.to_owned()));
    }
}
