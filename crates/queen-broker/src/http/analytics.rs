//! `/api/v1/analytics/...`: what each broker of the fleet did and used, interval by interval, from
//! the samples every broker records at its heartbeat. The official clients read them with
//! `admin.get_system_metrics` (processor, memory, database pool) and `admin.get_worker_metrics`
//! (messages handled, database failures, parked long polls), both taking `from` and `to`.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, TimeDelta, Utc};
use serde::Serialize;

use super::body::{strict_query, time_range};
use super::{Timestamp, timestamp};
use crate::broker::Broker;
use crate::broker::fleet::{self, BrokerSeries};
use crate::error::ApiError;

/// The span read when the request names no `from`.
const DEFAULT_SPAN: TimeDelta = TimeDelta::hours(1);

/// The span asked for: `from` and `to`, ISO-8601 times; by default the hour before `to`, and up
/// to the present.
fn window(req: &HttpRequest) -> Result<(DateTime<Utc>, Option<DateTime<Utc>>), ApiError> {
    let (from, to) = time_range(&strict_query(req, &["from", "to"])?)?;
    Ok((from.unwrap_or_else(|| to.unwrap_or_else(Utc::now) - DEFAULT_SPAN), to))
}

/// The answer's frame around each broker's points.
async fn series<P: Serialize>(
    broker: &Broker,
    req: &HttpRequest,
    points: impl Fn(&BrokerSeries) -> Vec<P>,
) -> Result<HttpResponse, ApiError> {
    let (from, to) = window(req)?;
    let (step, found) = fleet::usage(broker, from, to).await?;
    let brokers: Vec<serde_json::Value> = found
        .iter()
        .map(|series| serde_json::json!({"brokerId": series.broker_id, "points": points(series)}))
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "from": timestamp(from),
        "to": to.map(timestamp),
        "intervalSeconds": step.as_secs(),
        "brokers": brokers,
    })))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SystemPoint {
    at: Timestamp,
    /// Processor time per second: the cores the broker kept busy on average.
    cpu_cores: f64,
    /// The highest of the interval.
    resident_bytes: i64,
    db_pool: DbPool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DbPool {
    connections: i32,
    idle: i32,
    max: i32,
    waiting: i32,
}

/// `GET /analytics/system-metrics?from=&to=`: each broker's processor and memory use and its
/// database pool, per interval (intervals sampled only by brokers older than this one are left
/// out).
pub async fn system_metrics(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    series(&broker, &req, |series| {
        series
            .intervals
            .iter()
            .filter_map(|i| {
                let usage = i.usage?;
                Some(SystemPoint {
                    at: Timestamp(i.at),
                    cpu_cores: usage.cpu_cores,
                    resident_bytes: usage.resident_bytes,
                    db_pool: DbPool {
                        connections: usage.db_connections,
                        idle: usage.db_idle_connections,
                        max: usage.db_max_connections,
                        waiting: usage.db_waiting,
                    },
                })
            })
            .collect()
    })
    .await
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WorkerPoint {
    at: Timestamp,
    pushed: i64,
    delivered: i64,
    acked: i64,
    failed: i64,
    dead_lettered: i64,
    /// `null` for an interval sampled only by a broker older than this one.
    db_errors: Option<i64>,
    /// The most at one sample of the interval; `null` as above.
    long_poll_waiters: Option<i32>,
}

/// `GET /analytics/worker-metrics?from=&to=`: the messages each broker handled per interval, its
/// database failures and its parked long polls.
pub async fn worker_metrics(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    series(&broker, &req, |series| {
        series
            .intervals
            .iter()
            .map(|i| WorkerPoint {
                at: Timestamp(i.at),
                pushed: i.traffic.pushed,
                delivered: i.traffic.delivered,
                acked: i.traffic.acked,
                failed: i.traffic.failed,
                dead_lettered: i.traffic.dead_lettered,
                db_errors: i.usage.map(|u| u.db_errors),
                long_poll_waiters: i.usage.map(|u| u.long_poll_waiters),
            })
            .collect()
    })
    .await
}
