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
    ) -> Result<Resolution, StoreError> {
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
    ) -> Result<Resolution, StoreError> {
        let mut known = self.known(pool, wanted).await?;
        if known.is_complete() {
            return known.resolution();
        }
        // The rest is created, all of it or none; unanswered, the creation may still commit, and
        // the request sent again finds what it created.
        let creating = async |client: &mut Object| -> Result<(), StoreError> {
            let tx = client.transaction().await?;
            known.create_in(&tx, wanted, limits).await?;
            Ok(tx.commit().await?)
        };
        queen_store::pool::answered_within(pool.get().await?, self.answer_within, "a creation", creating).await?.1?;
        self.remember(&known);
        known.resolution()
    }

    /// The wanted queues and partitions that exist, cached or looked up (and cached), with gaps
    /// for those that do not: [`Known::create_in`] creates them in a caller's transaction, and
    /// [`NamesCache::remember`] caches them once it committed.
    pub async fn known(&self, pool: &Pool, wanted: &[(&str, Vec<&str>)]) -> Result<Known, StoreError> {
        let queues: Vec<Option<Arc<Queue>>> = wanted.iter().map(|(queue, _)| self.queues.get(*queue)).collect();
        let ids: Vec<Vec<Option<i64>>> = wanted
            .iter()
            .zip(&queues)
            .map(|((_, partitions), queue)| {
                let cached = |partition: &&str| {
                    queue.as_ref().and_then(|q| self.partitions.get(&(q.id, (*partition).to_owned())))
                };
                partitions.iter().map(cached).collect()
            })
            .collect();
        let mut known = Known { queues, ids, created_partitions: Vec::new() };
        if known.is_complete() {
            return Ok(known);
        }

        // Not cached: what exists already.
        let client = pool.get().await?;
        let unknown: Vec<&str> =
            wanted.iter().zip(&known.queues).filter(|(_, q)| q.is_none()).map(|((n, _), _)| *n).collect();
        if !unknown.is_empty() {
            for found in queues::find_queues(&client, &unknown).await? {
                let found = Arc::new(found);
                self.queues.insert(found.name.clone(), Arc::clone(&found));
                place(&mut known.queues, wanted, &found);
            }
        }
        for (at, (_, partitions)) in wanted.iter().enumerate() {
            let Some(queue) = &known.queues[at] else { continue };
            let unknown: Vec<&str> = missing(partitions, &known.ids[at]);
            if unknown.is_empty() {
                continue;
            }
            for (name, id) in queues::find_partitions(&client, queue.id, &unknown).await? {
                self.partitions.insert((queue.id, name.clone()), id);
                fill(&mut known.ids[at], partitions, &name, id);
            }
        }
        Ok(known)
    }

    /// Caches what `known` holds, once the transaction that created its new queues and partitions
    /// committed (a creation rolled back would leave ids of rows that never were).
    pub fn remember(&self, known: &Known) {
        for queue in known.queues.iter().flatten() {
            self.queues.insert(queue.name.clone(), Arc::clone(queue));
        }
        for (queue_id, name, id) in &known.created_partitions {
            self.partitions.insert((*queue_id, name.clone()), *id);
        }
    }

    /// The queue as cached, without asking PostgreSQL (which may be away).
    pub fn cached_queue(&self, name: &str) -> Option<Arc<Queue>> {
        self.queues.get(name)
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

    /// Forgets every queue and partition: notices of changes may have been missed, and the
    /// database may not be the one the ids were read from (restored from a backup, or a standby
    /// promoted behind the primary's sequences), where a partition id names another partition.
    pub fn forget_all(&self) {
        self.queues.invalidate_all();
        self.partitions.invalidate_all();
    }

    pub fn forget_partition(&self, queue_id: i64, name: &str) {
        self.partitions.invalidate(&(queue_id, name.to_owned()));
    }
}

/// Each wanted queue with the ids of its wanted partitions, in the order asked.
pub type Resolution = Vec<(Arc<Queue>, Vec<i64>)>;

/// The queues and partition ids of a request, in the order asked, as far as they exist.
pub struct Known {
    queues: Vec<Option<Arc<Queue>>>,
    ids: Vec<Vec<Option<i64>>>,
    /// Partitions [`Known::create_in`] created: (queue id, name, id).
    created_partitions: Vec<(i64, String, i64)>,
}

impl Known {
    pub fn is_complete(&self) -> bool {
        self.queues.iter().all(Option::is_some) && self.ids.iter().flatten().all(Option::is_some)
    }

    /// Creates the missing queues (with default options) and partitions in `tx`, within `limits`
    /// (`None`: whatever the limits say), counted against them in PostgreSQL: all of them, or
    /// [`StoreError::LimitReached`] and the transaction must be rolled back. Its creation locks
    /// are held until `tx` ends.
    pub async fn create_in(
        &mut self,
        tx: &deadpool_postgres::Transaction<'_>,
        wanted: &[(&str, Vec<&str>)],
        limits: Option<CreationLimits>,
    ) -> Result<(), StoreError> {
        let limits = limits.unwrap_or_default();
        let new: Vec<&str> =
            wanted.iter().zip(&self.queues).filter(|(_, q)| q.is_none()).map(|((n, _), _)| *n).collect();
        for created in queues::create_queues(tx, &new, limits.queues).await? {
            place(&mut self.queues, wanted, &Arc::new(created));
        }
        // Partition-creation locks in queue id order, whoever takes several.
        let mut order: Vec<usize> = (0..wanted.len()).filter(|&at| self.ids[at].iter().any(Option::is_none)).collect();
        order.sort_by_key(|&at| self.queues[at].as_ref().map_or(0, |q| q.id));
        for at in order {
            let (queue, partitions) = (self.queues[at].as_ref().ok_or(StoreError::Missing("queue"))?, &wanted[at].1);
            let new = missing(partitions, &self.ids[at]);
            let max = limits.partitions_per_queue;
            for (name, id) in queues::create_partitions(tx, queue.id, &queue.name, &new, max).await? {
                fill(&mut self.ids[at], partitions, &name, id);
                self.created_partitions.push((queue.id, name, id));
            }
        }
        Ok(())
    }

    /// Each wanted queue with the ids of its wanted partitions, once every one is known.
    pub fn resolution(&self) -> Result<Resolution, StoreError> {
        if !self.is_complete() {
            return Err(StoreError::Missing("partition"));
        }
        let queues = self.queues.iter().flatten().cloned();
        Ok(queues.zip(&self.ids).map(|(queue, ids)| (queue, ids.iter().flatten().copied().collect())).collect())
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
