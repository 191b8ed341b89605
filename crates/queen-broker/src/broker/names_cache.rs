//! Queues (by name, with their options) and partition ids (by queue id and name), cached.
//! Partition ids never change and are never reused, so a partition entry can only become stale by
//! its partition being deleted; operations that find it gone forget the entry and resolve again.
//! A queue entry also goes stale when the queue is configured: every broker is told (the
//! `QueueChanged` notice) and forgets it.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Object;
use moka::sync::Cache;
use queen_store::queues::{self, CreationLimits, Queue};
use queen_store::{Pool, StoreError};

/// A safety net for changes this broker did not hear of.
const TIME_TO_LIVE: Duration = Duration::from_secs(60);
const CAPACITY: u64 = 100_000;

pub struct NamesCache {
    queues: Cache<String, Arc<Queue>>,
    partitions: Cache<(i64, String), i64>,
    /// How long a creation's commit may go unanswered.
    answer_within: Duration,
}

impl NamesCache {
    pub fn new(answer_within: Duration) -> Self {
        Self {
            queues: Cache::builder().max_capacity(CAPACITY).time_to_live(TIME_TO_LIVE).build(),
            partitions: Cache::builder().max_capacity(CAPACITY).time_to_live(TIME_TO_LIVE).build(),
            answer_within,
        }
    }

    /// Each wanted queue (each named once) with the ids of its wanted partitions, in the order
    /// asked, creating those that do not exist yet (queues with default options) within `limits`
    /// (`None`: whatever the limits say), all of them or none: one transaction creates everything
    /// missing, counted against the limits in PostgreSQL, so a request that would pass one
    /// creates nothing ([`StoreError::LimitReached`]). What the cache holds costs nothing more; a
    /// queue deleted since it was cached is looked up (and created) again, once. A creation whose
    /// commit goes unanswered for `answer_within` is [`StoreError::Unanswered`].
    pub async fn resolve(
        &self,
        pool: &Pool,
        wanted: &[(&str, Vec<&str>)],
        limits: Option<CreationLimits>,
    ) -> Result<Vec<(Arc<Queue>, Vec<i64>)>, StoreError> {
        match self.resolve_once(pool, wanted, limits).await {
            Err(StoreError::Missing(_)) => {
                for (queue, _) in wanted {
                    self.forget_queue(queue);
                }
                self.resolve_once(pool, wanted, limits).await
            }
            resolved => resolved,
        }
    }

    async fn resolve_once(
        &self,
        pool: &Pool,
        wanted: &[(&str, Vec<&str>)],
        limits: Option<CreationLimits>,
    ) -> Result<Vec<(Arc<Queue>, Vec<i64>)>, StoreError> {
        let mut queues: Vec<Option<Arc<Queue>>> = wanted.iter().map(|(queue, _)| self.queues.get(*queue)).collect();
        let mut ids: Vec<Vec<Option<i64>>> = wanted
            .iter()
            .zip(&queues)
            .map(|((_, partitions), queue)| {
                let cached = |partition: &&str| {
                    queue.as_ref().and_then(|q| self.partitions.get(&(q.id, (*partition).to_owned())))
                };
                partitions.iter().map(cached).collect()
            })
            .collect();
        let complete = |queues: &[Option<Arc<Queue>>], ids: &[Vec<Option<i64>>]| {
            queues.iter().all(Option::is_some) && ids.iter().flatten().all(Option::is_some)
        };
        if complete(&queues, &ids) {
            return Ok(finish(queues, ids));
        }

        // Not cached: what exists already.
        let client = pool.get().await?;
        let unknown: Vec<&str> =
            wanted.iter().zip(&queues).filter(|(_, q)| q.is_none()).map(|((n, _), _)| *n).collect();
        if !unknown.is_empty() {
            for found in queues::find_queues(&client, &unknown).await? {
                let found = Arc::new(found);
                self.queues.insert(found.name.clone(), Arc::clone(&found));
                place(&mut queues, wanted, &found);
            }
        }
        for (at, (_, partitions)) in wanted.iter().enumerate() {
            let Some(queue) = &queues[at] else { continue };
            let unknown: Vec<&str> = missing(partitions, &ids[at]);
            if unknown.is_empty() {
                continue;
            }
            for (name, id) in queues::find_partitions(&client, queue.id, &unknown).await? {
                self.partitions.insert((queue.id, name.clone()), id);
                fill(&mut ids[at], partitions, &name, id);
            }
        }
        if complete(&queues, &ids) {
            return Ok(finish(queues, ids));
        }

        // The rest is created, all of it or none; unanswered, the creation may still commit, and
        // the request sent again finds what it created.
        let limits = limits.unwrap_or_default();
        let mut created_partitions = Vec::new();
        let creating = async |client: &mut Object| -> Result<(), StoreError> {
            let tx = client.transaction().await?;
            let new: Vec<&str> =
                wanted.iter().zip(&queues).filter(|(_, q)| q.is_none()).map(|((n, _), _)| *n).collect();
            for created in queues::create_queues(&tx, &new, limits.queues).await? {
                place(&mut queues, wanted, &Arc::new(created));
            }
            // Partition-creation locks in queue id order, whoever takes several.
            let mut order: Vec<usize> = (0..wanted.len()).filter(|&at| ids[at].iter().any(Option::is_none)).collect();
            order.sort_by_key(|&at| queues[at].as_ref().map_or(0, |q| q.id));
            for at in order {
                let (queue, partitions) = (queues[at].as_ref().ok_or(StoreError::Missing("queue"))?, &wanted[at].1);
                let new = missing(partitions, &ids[at]);
                let max = limits.partitions_per_queue;
                for (name, id) in queues::create_partitions(&tx, queue.id, &queue.name, &new, max).await? {
                    fill(&mut ids[at], partitions, &name, id);
                    created_partitions.push((queue.id, name, id));
                }
            }
            Ok(tx.commit().await?)
        };
        queen_store::pool::answered_within(client, self.answer_within, "a creation", creating).await?.1?;
        for queue in queues.iter().flatten() {
            self.queues.insert(queue.name.clone(), Arc::clone(queue));
        }
        for (queue_id, name, id) in created_partitions {
            self.partitions.insert((queue_id, name), id);
        }
        if complete(&queues, &ids) { Ok(finish(queues, ids)) } else { Err(StoreError::Missing("partition")) }
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

/// Puts the queue wherever it is wanted.
fn place(queues: &mut [Option<Arc<Queue>>], wanted: &[(&str, Vec<&str>)], queue: &Arc<Queue>) {
    for (slot, _) in queues.iter_mut().zip(wanted).filter(|(_, (name, _))| *name == queue.name) {
        *slot = Some(Arc::clone(queue));
    }
}

/// The partitions of `names` whose id is not known yet.
fn missing<'a>(names: &[&'a str], ids: &[Option<i64>]) -> Vec<&'a str> {
    names.iter().zip(ids).filter(|(_, id)| id.is_none()).map(|(name, _)| *name).collect()
}

/// Sets the id of every position where the partition `name` is wanted.
fn fill(ids: &mut [Option<i64>], names: &[&str], name: &str, id: i64) {
    for (slot, _) in ids.iter_mut().zip(names).filter(|(_, wanted)| **wanted == name) {
        *slot = Some(id);
    }
}

/// The resolution, once every queue and partition is known.
fn finish(queues: Vec<Option<Arc<Queue>>>, ids: Vec<Vec<Option<i64>>>) -> Vec<(Arc<Queue>, Vec<i64>)> {
    queues.into_iter().flatten().zip(ids).map(|(queue, ids)| (queue, ids.into_iter().flatten().collect())).collect()
}
