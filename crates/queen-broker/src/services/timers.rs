//! The timer sweeper: every broker runs one. It sleeps until the earliest timer it knows of is
//! due, probes PostgreSQL for the next due timer (one index probe, no lock, no write), and only
//! when one is due claims and delivers due timers (`broker::timers::fire_due`), batch after batch
//! while whole batches come back. Between sweeps it waits at least `timers.sweep_interval_ms`
//! and at most `timers.idle_probe_ms`; a timer scheduled through this broker wakes it at the
//! timer's due time ([`SweepAlarm`]). Sweepers of a fleet compete for due timers with
//! `FOR UPDATE SKIP LOCKED`: each timer is delivered by one of them, once.

use std::sync::Mutex;
use std::time::Duration;

use actix_web::web;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::broker::{Broker, BrokerError, timers};

/// Wakes this broker's sweeper for a timer scheduled through this broker, due before the
/// sweeper's next look.
#[derive(Debug, Default)]
pub struct SweepAlarm {
    earliest: Mutex<Option<Instant>>,
    rung: Notify,
}

impl SweepAlarm {
    /// A timer is due at `due`.
    pub fn set(&self, due: impl Into<Instant>) {
        let due = due.into();
        let mut earliest = self.earliest.lock().unwrap_or_else(|p| p.into_inner());
        if earliest.is_none_or(|at| due < at) {
            *earliest = Some(due);
            self.rung.notify_one();
        }
    }

    fn take(&self) -> Option<Instant> {
        self.earliest.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// Sweeps until the broker shuts down. The first sweep runs at once, so timers that fell due
/// while no broker was running are delivered as soon as one starts.
pub async fn keep_sweeping(broker: web::Data<Broker>) {
    let settings = &broker.config.timers;
    let interval = Duration::from_millis(settings.sweep_interval_ms);
    let idle = Duration::from_millis(settings.idle_probe_ms);
    let mut failing = false;
    while !broker.is_shutting_down() {
        let started = Instant::now();
        let next_due = match sweep(&broker).await {
            Ok(next_due) => {
                if failing {
                    tracing::info!("timers are swept again");
                }
                failing = false;
                next_due
            }
            // Said once per outage: the database's own failures are logged where they happen.
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot sweep timers");
                }
                failing = true;
                None
            }
        };
        let earliest = started + interval;
        let mut wake_at = started + next_due.unwrap_or(idle).clamp(interval, idle);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(wake_at) => break,
                () = broker.timer_alarm.rung.notified() => {
                    if let Some(due) = broker.timer_alarm.take() {
                        wake_at = wake_at.min(due.max(earliest));
                    }
                }
            }
        }
    }
}

/// Delivers what is due; how long until the next timer is due afterwards (`None`: no timer
/// waits, or push maintenance is on).
async fn sweep(broker: &Broker) -> Result<Option<Duration>, BrokerError> {
    // Delivering is pushing: while pushes go to the journal, timers wait, as transactions that
    // push are refused, so that they do not overtake buffered pushes.
    if broker.maintenance.pushes_to_journal() {
        return Ok(None);
    }
    loop {
        match timers::next_due(broker).await? {
            Some(due_in) if due_in.is_zero() => {
                let swept = timers::fire_due(broker).await?;
                if swept.claimed == 0 {
                    // Due, but every one of them is locked by someone else right now.
                    return Ok(Some(Duration::ZERO));
                }
                tracing::debug!(?swept, "timers swept");
            }
            next_due => return Ok(next_due),
        }
    }
}
