//! The fleet as operators see it: every broker beats (says it is alive, draining or stopped, and
//! what its push journal holds) and records its traffic every `stats.sample_interval_seconds`; one
//! broker per interval samples the consumer lag. The dashboard reads the brokers and the last
//! hours from there, so any broker shows the whole fleet.

use std::time::Duration;

use actix_web::web;
use chrono::{DateTime, TimeDelta, Utc};
use queen_store::StoreError;
use queen_store::fleet::{self, BrokerSeen, Heartbeat, Traffic};
use queen_store::system_state::Modes;

use super::{Broker, BrokerError};
use crate::metrics::Metrics;

/// Brokers not heard of for this long are no longer listed.
const LISTED_FOR_SECONDS: f64 = 3600.0;

/// Longest history one read returns: what is kept.
pub const MAX_HISTORY_MINUTES: u64 = 24 * 60;

fn interval(broker: &Broker) -> Duration {
    Duration::from_secs(broker.config.stats.sample_interval_seconds)
}

/// Beats until the process ends: records the heartbeat and the traffic since the last one that
/// was recorded (traffic of a failed beat goes with the next), then takes the lag sampler's turn
/// if it is free.
pub async fn keep_beating(broker: web::Data<Broker>) {
    let started_at = Utc::now();
    let mut recorded = Totals::default();
    let mut failing = false;
    let mut ticks = tokio::time::interval(interval(&broker));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let totals = Totals::of(&broker.metrics);
        match beat(&broker, started_at, totals.since(&recorded)).await {
            Ok(()) => {
                recorded = totals;
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

async fn beat(broker: &Broker, started_at: DateTime<Utc>, traffic: Traffic) -> Result<(), BrokerError> {
    let journal = super::maintenance_mode::status(broker).await?;
    let mut client = broker.pool.get().await.map_err(StoreError::from)?;
    let heartbeat = Heartbeat {
        broker_id: &broker.broker_id,
        version: env!("CARGO_PKG_VERSION"),
        started_at,
        stopping: broker.is_shutting_down(),
        buffered_messages: i64::try_from(journal.buffered_messages).unwrap_or(i64::MAX),
        buffer_healthy: journal.buffer_healthy,
        traffic,
    };
    fleet::beat(&client, &heartbeat).await?;
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

/// The counters a heartbeat reports the growth of.
#[derive(Debug, Default, Clone, Copy)]
struct Totals([u64; 5]);

impl Totals {
    fn of(metrics: &Metrics) -> Self {
        Totals([
            metrics.messages_pushed.total(),
            metrics.messages_delivered.total(),
            metrics.messages_acked.total(),
            metrics.messages_failed.total(),
            metrics.messages_dead_lettered.total(),
        ])
    }

    fn since(&self, earlier: &Totals) -> Traffic {
        let grown = |i: usize| i64::try_from(self.0[i].saturating_sub(earlier.0[i])).unwrap_or(i64::MAX);
        Traffic { pushed: grown(0), delivered: grown(1), acked: grown(2), failed: grown(3), dead_lettered: grown(4) }
    }
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
