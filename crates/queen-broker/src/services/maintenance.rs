//! Maintenance: retention, partition clean-up and dead key/value rows, one pass every
//! `maintenance.interval_ms`.
//!
//! Every broker of a fleet schedules passes; a pass runs only on the broker that takes the
//! maintenance advisory lock, so in a fleet one broker runs each pass and the others skip it.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use chrono::Utc;
use queen_log::Cipher;
use queen_store::retention::{self, Trimmed};
use queen_store::{Pool, StoreError};

use crate::broker::NamesCache;
use crate::metrics::Metrics;
use crate::names::QUEUE_MODE_GROUP;

/// Most partitions one pass deletes.
const CLEANUP_LIMIT: i64 = 1000;
/// Dead key/value rows deleted per statement, and most statements per pass.
const KV_PRUNE_BATCH: i64 = 1000;
const KV_PRUNE_BATCHES: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MaintenanceSettings {
    pub interval: Duration,
    pub partition_cleanup_days: f64,
    /// Segments deleted per transaction.
    pub batch_segments: i64,
}

pub struct Maintenance {
    pool: Pool,
    settings: MaintenanceSettings,
    broker_id: String,
    names: Arc<NamesCache>,
    metrics: Arc<Metrics>,
    /// Opens sealed segments, whose transaction ids retention deletes with them.
    keys: Option<Arc<Cipher>>,
    running: bool,
}

/// What one pass did on the broker that ran it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    pub trimmed: Trimmed,
    pub partitions_deleted: u64,
    /// Expired and deleted key/value rows removed.
    pub kv_rows_deleted: u64,
}

impl Maintenance {
    pub fn new(
        pool: Pool,
        settings: MaintenanceSettings,
        broker_id: String,
        names: Arc<NamesCache>,
        metrics: Arc<Metrics>,
        keys: Option<Arc<Cipher>>,
    ) -> Self {
        Self { pool, settings, broker_id, names, metrics, keys, running: false }
    }

    fn schedule_pass(&mut self, ctx: &mut Context<Self>) {
        if self.running {
            return;
        }
        self.running = true;
        let (pool, settings, broker_id, keys, metrics) =
            (self.pool.clone(), self.settings, self.broker_id.clone(), self.keys.clone(), Arc::clone(&self.metrics));
        let pass = async move { run_pass(&pool, settings, &broker_id, keys.as_deref(), &metrics).await };
        ctx.spawn(pass.into_actor(self).map(|outcome, service, _| {
            service.running = false;
            let label = match &outcome {
                Ok(Some(_)) => "ran",
                Ok(None) => "skipped",
                Err(_) => "failed",
            };
            service.metrics.maintenance_passes.with_label_values(&[label]).inc();
            match outcome {
                Ok(Some((report, removed))) => {
                    service.metrics.partitions_cleaned_up.inc_by(report.partitions_deleted);
                    service.metrics.kv_rows_pruned.inc_by(report.kv_rows_deleted);
                    for partition in removed {
                        service.names.forget_partition(partition.queue_id, &partition.partition);
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "maintenance pass failed"),
            }
        }));
    }
}

/// One pass, if this broker gets the lock: `None` when another broker holds it.
async fn run_pass(
    pool: &Pool,
    settings: MaintenanceSettings,
    broker_id: &str,
    keys: Option<&Cipher>,
    metrics: &Metrics,
) -> Result<Option<(PassReport, Vec<retention::RemovedPartition>)>, StoreError> {
    let mut client = pool.get().await?;
    if !retention::try_lock(&client).await? {
        return Ok(None);
    }
    let started_at = Utc::now();
    let outcome = async {
        let mut report = PassReport::default();
        for trim in retention::trims(&client, QUEUE_MODE_GROUP).await? {
            let trimmed =
                retention::apply_trim(&mut client, trim, settings.batch_segments, keys, QUEUE_MODE_GROUP).await;
            match trimmed {
                Ok(trimmed) => {
                    // Counted as each trim commits: a pass that fails later deleted them all the same.
                    metrics.segments_retained_away.inc_by(trimmed.segments);
                    report.trimmed.segments += trimmed.segments;
                    report.trimmed.messages += trimmed.messages;
                }
                // One partition's trim failing (its row held by pushes through every try, a
                // statement timeout) is retried at the next pass; the others, the clean-up and
                // the pass's record go on. A lost session ends the pass.
                Err(e) if !client.is_closed() => {
                    tracing::warn!(partition_id = trim.partition_id, error = %e, "a retention trim is left for the next pass");
                }
                Err(e) => return Err(e),
            }
        }
        let removed = retention::clean_up_partitions(&client, settings.partition_cleanup_days, CLEANUP_LIMIT).await?;
        report.partitions_deleted = removed.len() as u64;
        report.kv_rows_deleted = queen_store::kv::prune_dead(&client, KV_PRUNE_BATCH, KV_PRUNE_BATCHES).await?;
        retention::record_run(&client, broker_id, started_at, report.trimmed, report.partitions_deleted).await?;
        Ok::<_, StoreError>((report, removed))
    }
    .await;
    if retention::unlock(&client).await.is_err() {
        // A pooled connection must never keep the lock: close it, and the session's lock with it.
        drop(deadpool_postgres::Object::take(client));
    }
    outcome.map(Some)
}

impl Actor for Maintenance {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.settings.interval, |service, ctx| service.schedule_pass(ctx));
    }
}
