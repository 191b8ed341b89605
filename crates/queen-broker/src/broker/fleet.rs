//! The fleet as operators see it: every broker beats (says it is alive, draining or stopped, and
//! what its push journal holds) and records its traffic and the resources it used every
//! `stats.sample_interval_seconds`; one broker per interval samples the consumer lag. The
//! dashboard and the analytics routes read the brokers and the last hours from there, so any
//! broker shows the whole fleet.

use std::time::{Duration, Instant};

use actix_web::web;
use chrono::{DateTime, TimeDelta, Utc};
use queen_store::StoreError;
use queen_store::fleet::{self, BrokerInterval, BrokerSeen, Heartbeat, Traffic, Usage};
use queen_store::system_state::Modes;

use super::{Broker, BrokerError};
use crate::metrics::{self, Metrics};

/// Brokers not heard of for this long are no longer listed.
const LISTED_FOR_SECONDS: f64 = 3600.0;

/// Longest history one read returns: what is kept.
pub const MAX_HISTORY_MINUTES: u64 = 24 * 60;

/// The most intervals a broker's usage series is split into: a longer span gets longer intervals.
const MAX_USAGE_POINTS: u32 = 360;

fn interval(broker: &Broker) -> Duration {
    Duration::from_secs(broker.config.stats.sample_interval_seconds)
}

/// Beats until the process ends: records the heartbeat, with the traffic and the processor time
/// since the last one that was recorded (those of a failed beat go with the next), then takes the
/// lag sampler's turn if it is free.
pub async fn keep_beating(broker: web::Data<Broker>) {
    let started_at = Utc::now();
    let mut recorded = Totals::at_start();
    let mut failing = false;
    let mut ticks = tokio::time::interval(interval(&broker));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let totals = Totals::of(&broker.metrics);
        let beaten = match beat(&broker, started_at, &totals, &recorded).await {
            Ok(()) => {
                // Recorded: not reported again, whatever comes of the lag sample.
                recorded = totals;
                sample_lag(&broker).await
            }
            Err(e) => Err(e),
        };
        match beaten {
            Ok(()) => {
                if failing {
                    tracing::info!("heartbeats are recorded again");
                }
                failing = false;
            }
            // Said once per outage: the database's own failures are logged where they happen.
            Err(e) if !failing => {
                tracing::warn!(error = %e, "cannot record this broker's heartbeat");
                failing = true;
            }
            Err(_) => {}
        }
    }
}

async fn beat(broker: &Broker, started_at: DateTime<Utc>, now: &Totals, recorded: &Totals) -> Result<(), BrokerError> {
    let journal = super::maintenance_mode::status(broker).await?;
    // The pool as the requests see it, before this beat takes a connection of it.
    let pool = broker.pool.status();
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    let as_i32 = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let usage = Usage {
        interval_seconds: now.at.duration_since(recorded.at).as_secs_f64(),
        cpu_seconds: (now.cpu_seconds - recorded.cpu_seconds).max(0.0),
        resident_bytes: now.resident_bytes,
        db_connections: as_i32(pool.size),
        db_idle_connections: as_i32(pool.available),
        db_max_connections: as_i32(pool.max_size),
        db_waiting: as_i32(pool.waiting),
        long_poll_waiters: i32::try_from(broker.metrics.long_poll_waiters.get()).unwrap_or(i32::MAX),
        db_errors: grown(now.db_errors, recorded.db_errors),
    };
    let heartbeat = Heartbeat {
        broker_id: &broker.broker_id,
        version: env!("CARGO_PKG_VERSION"),
        started_at,
        stopping: broker.is_shutting_down(),
        buffered_messages: i64::try_from(journal.buffered_messages).unwrap_or(i64::MAX),
        buffer_healthy: journal.buffer_healthy,
        traffic: now.traffic_since(recorded),
        usage,
    };
    fleet::beat(&client, &heartbeat).await?;
    Ok(())
}

/// Takes the lag sampler's turn if it is free.
async fn sample_lag(broker: &Broker) -> Result<(), BrokerError> {
    let mut client = broker.pool.get().await.map_err(StoreError::from)?;
    fleet::sample_lag(&mut client, interval(broker).as_secs_f64()).await?;
    Ok(())
}

/// Records that this broker stopped gracefully; bounded, since the database may be why it stops.
pub async fn leave(broker: &Broker) {
    let left = tokio::time::timeout(Duration::from_secs(1), async {
        let client = broker.pool.get().await.map_err(StoreError::from)?;
        fleet::leave(&client, &broker.broker_id).await
    })
    .await;
    if !matches!(left, Ok(Ok(()))) {
        tracing::debug!("could not record this broker's stop; it will show as missing");
    }
}

/// Whether other brokers of this database run now (as their heartbeats say); bounded, and
/// `false` when the database does not answer.
pub async fn others_running(broker: &Broker) -> bool {
    let seen = tokio::time::timeout(Duration::from_secs(1), async {
        let client = broker.pool.get().await.map_err(StoreError::from)?;
        fleet::others_running(&client, &broker.broker_id, interval(broker).as_secs_f64()).await
    })
    .await;
    matches!(seen, Ok(Ok(true)))
}

/// The process's running totals a heartbeat reports the growth of, when read.
#[derive(Debug, Clone, Copy)]
struct Totals {
    at: Instant,
    messages: [u64; 5],
    db_errors: u64,
    cpu_seconds: f64,
    resident_bytes: i64,
}

impl Totals {
    /// Nothing counted yet: the first beat reports everything since the process started.
    fn at_start() -> Self {
        let uptime = metrics::process_usage().uptime;
        let at = Instant::now().checked_sub(uptime).unwrap_or_else(Instant::now);
        Totals { at, messages: [0; 5], db_errors: 0, cpu_seconds: 0.0, resident_bytes: 0 }
    }

    fn of(metrics: &Metrics) -> Self {
        let process = metrics::process_usage();
        Totals {
            at: Instant::now(),
            messages: [
                metrics.messages_pushed.total(),
                metrics.messages_delivered.total(),
                metrics.messages_acked.total(),
                metrics.messages_failed.total(),
                metrics.messages_dead_lettered.total(),
            ],
            db_errors: queen_store::failure_counts().total(),
            cpu_seconds: process.cpu_seconds,
            resident_bytes: process.resident_bytes,
        }
    }

    fn traffic_since(&self, earlier: &Totals) -> Traffic {
        let grown = |i: usize| grown(self.messages[i], earlier.messages[i]);
        Traffic { pushed: grown(0), delivered: grown(1), acked: grown(2), failed: grown(3), dead_lettered: grown(4) }
    }
}

fn grown(now: u64, earlier: u64) -> i64 {
    i64::try_from(now.saturating_sub(earlier)).unwrap_or(i64::MAX)
}

/// The brokers heard of in the last hour and the fleet's maintenance switches.
pub async fn brokers(broker: &Broker) -> Result<(Vec<BrokerSeen>, Modes), BrokerError> {
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    let seen = fleet::brokers(&client, interval(broker).as_secs_f64(), LISTED_FOR_SECONDS).await?;
    Ok((seen, broker.maintenance.modes()))
}

/// One interval of the history.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryPoint {
    pub at: DateTime<Utc>,
    pub traffic: Traffic,
    /// Messages behind and the oldest unread message's age, when the lag was sampled in it.
    pub lag: Option<(i64, f64)>,
}

/// The last `minutes` (at most [`MAX_HISTORY_MINUTES`]) as one point per interval, oldest first,
/// every interval present (no traffic is zero traffic), ending with the one under way.
pub async fn history(broker: &Broker, minutes: u64) -> Result<(Duration, Vec<HistoryPoint>), BrokerError> {
    let step = interval(broker);
    let span = Duration::from_secs(minutes.min(MAX_HISTORY_MINUTES) * 60);
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    let found = fleet::history(&client, step.as_secs_f64(), span.as_secs_f64()).await?;
    let step_us = i64::try_from(step.as_micros()).unwrap_or(i64::MAX);
    let first = (found.now - TimeDelta::from_std(span).unwrap_or_default()).timestamp_micros();
    let (mut traffic, mut lag) = (found.traffic.into_iter().peekable(), found.lag.into_iter().peekable());
    let mut points = Vec::new();
    // The store bins samples by the same step from the same origin, so bins fall on these points.
    let mut at_us = first - first.rem_euclid(step_us);
    while at_us <= found.now.timestamp_micros() {
        let at = DateTime::from_timestamp_micros(at_us).unwrap_or(found.now);
        let mut point = HistoryPoint { at, traffic: Traffic::default(), lag: None };
        while let Some((_, t)) = traffic.next_if(|(t, _)| *t <= at) {
            point.traffic = point.traffic.plus(t);
        }
        while let Some((_, messages, seconds)) = lag.next_if(|(t, _, _)| *t <= at) {
            point.lag = Some((messages, seconds));
        }
        points.push(point);
        at_us += step_us;
    }
    Ok((step, points))
}

/// One broker's traffic and usage, interval by interval, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerSeries {
    pub broker_id: String,
    pub intervals: Vec<BrokerInterval>,
}

/// Every broker's traffic and usage from `from` to `to` (the present when `None`), by broker
/// (ordered by id), and the intervals' length: the sample interval, or as many of them as keep
/// each series within [`MAX_USAGE_POINTS`]. Intervals without a sample are absent.
pub async fn usage(
    broker: &Broker,
    from: DateTime<Utc>,
    to: Option<DateTime<Utc>>,
) -> Result<(Duration, Vec<BrokerSeries>), BrokerError> {
    let sample = interval(broker);
    let span = (to.unwrap_or_else(Utc::now) - from).to_std().unwrap_or_default();
    // One interval fewer than the most: the span's ends fall inside intervals aligned to the epoch.
    let samples_per_step = span.div_duration_f64(sample * (MAX_USAGE_POINTS - 1)).ceil().max(1.0);
    let step = sample.mul_f64(samples_per_step);
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    let found = fleet::broker_intervals(&client, step.as_secs_f64(), from, to).await?;
    let mut series: Vec<BrokerSeries> = Vec::new();
    for interval in found {
        match series.last_mut() {
            Some(last) if last.broker_id == interval.broker_id => last.intervals.push(interval),
            _ => series.push(BrokerSeries { broker_id: interval.broker_id.clone(), intervals: vec![interval] }),
        }
    }
    Ok((step, series))
}
