//! The fleet as the dashboard shows it: each broker's heartbeat (`brokers`), its traffic and the
//! resources it used per heartbeat (`traffic_samples`), and the fleet's consumer lag sampled by
//! one broker per interval (`lag_samples`). Everything here is kept for a day.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;

use crate::StoreError;
use crate::groups::{CURSORS_WITH_OLDEST_UNREAD, LAG_MESSAGES, LAG_SECONDS};

/// Transaction advisory lock giving one broker the lag sampler's turn ("queenlag").
const LAG_SAMPLER_LOCK_KEY: i64 = 0x7175_6565_6e6c_6167;

/// Heartbeats a broker may miss before it is reported missing.
const MISSED_BEATS: f64 = 3.0;

/// Messages a broker handled since its previous sample.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Traffic {
    pub pushed: i64,
    pub delivered: i64,
    pub acked: i64,
    pub failed: i64,
    pub dead_lettered: i64,
}

impl Traffic {
    /// Both together.
    pub fn plus(self, other: Traffic) -> Traffic {
        Traffic {
            pushed: self.pushed + other.pushed,
            delivered: self.delivered + other.delivered,
            acked: self.acked + other.acked,
            failed: self.failed + other.failed,
            dead_lettered: self.dead_lettered + other.dead_lettered,
        }
    }
}

/// What a broker used over one heartbeat interval, and the state of its resources at its end.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Usage {
    /// Seconds since the broker's previous recorded sample.
    pub interval_seconds: f64,
    /// Processor time the process spent in them.
    pub cpu_seconds: f64,
    pub resident_bytes: i64,
    /// The database pool: connections open, of them idle, and its bound.
    pub db_connections: i32,
    pub db_idle_connections: i32,
    pub db_max_connections: i32,
    /// Requests waiting for a pooled connection.
    pub db_waiting: i32,
    /// Long polls parked for messages.
    pub long_poll_waiters: i32,
    /// Database failures of any kind in the interval.
    pub db_errors: i64,
}

/// What a broker says of itself at a heartbeat.
#[derive(Debug, Clone, PartialEq)]
pub struct Heartbeat<'a> {
    pub broker_id: &'a str,
    pub version: &'a str,
    pub started_at: DateTime<Utc>,
    /// It is draining for a graceful shutdown.
    pub stopping: bool,
    pub buffered_messages: i64,
    pub buffer_healthy: bool,
    pub traffic: Traffic,
    pub usage: Usage,
}

/// Records the heartbeat, its traffic and its usage, in one statement. A beat of a broker that
/// recorded its stop (one that ran as the broker left) leaves it stopped; a broker id seen again
/// with another start time (a restarted container keeps its host name and process id) is a new
/// broker.
pub async fn beat(client: &impl GenericClient, beat: &Heartbeat<'_>) -> Result<(), StoreError> {
    let (t, u) = (beat.traffic, beat.usage);
    client
        .execute(
            "WITH broker AS (
                 INSERT INTO queen.brokers AS b (id, version, started_at, seen_at, stopping, buffered_messages, buffer_healthy)
                 VALUES ($1, $2, $3, now(), $4, $5, $6)
                 ON CONFLICT (id) DO UPDATE
                    SET seen_at = now(), version = EXCLUDED.version, started_at = EXCLUDED.started_at,
                        stopping = EXCLUDED.stopping OR (b.started_at = EXCLUDED.started_at AND b.stopped_at IS NOT NULL),
                        stopped_at = CASE WHEN b.started_at = EXCLUDED.started_at THEN b.stopped_at END,
                        buffered_messages = EXCLUDED.buffered_messages, buffer_healthy = EXCLUDED.buffer_healthy
             )
             INSERT INTO queen.traffic_samples
                    (sampled_at, broker_id, pushed, delivered, acked, failed, dead_lettered, interval_seconds,
                     cpu_seconds, resident_bytes, db_connections, db_idle_connections, db_max_connections,
                     db_waiting, long_poll_waiters, db_errors)
             VALUES (now(), $1, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)",
            &[
                &beat.broker_id,
                &beat.version,
                &beat.started_at,
                &beat.stopping,
                &beat.buffered_messages,
                &beat.buffer_healthy,
                &t.pushed,
                &t.delivered,
                &t.acked,
                &t.failed,
                &t.dead_lettered,
                &u.interval_seconds,
                &u.cpu_seconds,
                &u.resident_bytes,
                &u.db_connections,
                &u.db_idle_connections,
                &u.db_max_connections,
                &u.db_waiting,
                &u.long_poll_waiters,
                &u.db_errors,
            ],
        )
        .await?;
    Ok(())
}

/// Whether a broker other than `broker_id` beat within the last few intervals of
/// `interval_seconds` and has not stopped.
pub async fn others_running(
    client: &impl GenericClient,
    broker_id: &str,
    interval_seconds: f64,
) -> Result<bool, StoreError> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM queen.brokers
                             WHERE id <> $1 AND stopped_at IS NULL
                               AND seen_at > now() - make_interval(secs => $2::float8 * $3::float8))",
            &[&broker_id, &interval_seconds, &MISSED_BEATS],
        )
        .await?;
    Ok(row.get(0))
}

/// Marks the broker stopped: it shut down gracefully.
pub async fn leave(client: &impl GenericClient, broker_id: &str) -> Result<(), StoreError> {
    client
        .execute(
            "UPDATE queen.brokers SET stopping = true, stopped_at = now(), seen_at = now() WHERE id = $1",
            &[&broker_id],
        )
        .await?;
    Ok(())
}

/// Samples the fleet's consumer lag, unless another broker did within the last `interval_seconds`
/// or is doing it now, and prunes what is older than a day. Whether this call sampled.
pub async fn sample_lag(client: &mut deadpool_postgres::Client, interval_seconds: f64) -> Result<bool, StoreError> {
    let tx = client.transaction().await?;
    // A little under the interval, so that brokers whose timers drift do not skip a turn.
    let due: bool = tx
        .query_one(
            "SELECT pg_try_advisory_xact_lock($1)
                AND NOT EXISTS (SELECT 1 FROM queen.lag_samples
                                 WHERE sampled_at > now() - make_interval(secs => $2::float8 * 0.9))",
            &[&LAG_SAMPLER_LOCK_KEY, &interval_seconds],
        )
        .await?
        .get(0);
    if !due {
        return Ok(false);
    }
    let sample = format!(
        "INSERT INTO queen.lag_samples (sampled_at, lag_messages, lag_seconds)
         SELECT now(), COALESCE(sum({LAG_MESSAGES}), 0)::bigint, COALESCE(max({LAG_SECONDS}), 0)
           FROM {CURSORS_WITH_OLDEST_UNREAD}"
    );
    tx.execute(&sample, &[]).await?;
    tx.batch_execute(
        "DELETE FROM queen.lag_samples WHERE sampled_at < now() - interval '1 day';
         DELETE FROM queen.traffic_samples WHERE sampled_at < now() - interval '1 day';
         DELETE FROM queen.brokers WHERE seen_at < now() - interval '1 day';",
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// A broker as the fleet last heard of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerSeen {
    pub id: String,
    pub version: String,
    pub started_at: DateTime<Utc>,
    pub seen_at: DateTime<Utc>,
    pub state: BrokerState,
    pub buffered_messages: i64,
    pub buffer_healthy: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerState {
    /// Beating.
    Live,
    /// Draining for a graceful shutdown.
    Stopping,
    /// Shut down gracefully.
    Stopped,
    /// Not heard of for a few heartbeats, without having stopped: crashed, or cut off.
    Missing,
}

impl BrokerState {
    pub fn name(self) -> &'static str {
        match self {
            BrokerState::Live => "live",
            BrokerState::Stopping => "stopping",
            BrokerState::Stopped => "stopped",
            BrokerState::Missing => "missing",
        }
    }
}

/// The brokers heard of within the last `within_seconds`, oldest first; a broker that missed a few
/// heartbeats of `interval_seconds` is missing.
pub async fn brokers(
    client: &impl GenericClient,
    interval_seconds: f64,
    within_seconds: f64,
) -> Result<Vec<BrokerSeen>, StoreError> {
    let rows = client
        .query(
            "SELECT id, version, started_at, seen_at,
                    CASE WHEN stopped_at IS NOT NULL THEN 'stopped'
                         WHEN seen_at < now() - make_interval(secs => $1::float8 * $2::float8) THEN 'missing'
                         WHEN stopping THEN 'stopping'
                         ELSE 'live' END,
                    buffered_messages, buffer_healthy
               FROM queen.brokers
              WHERE seen_at > now() - make_interval(secs => $3)
              ORDER BY started_at, id",
            &[&interval_seconds, &MISSED_BEATS, &within_seconds],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| BrokerSeen {
            id: row.get(0),
            version: row.get(1),
            started_at: row.get(2),
            seen_at: row.get(3),
            state: match row.get::<_, &str>(4) {
                "stopped" => BrokerState::Stopped,
                "missing" => BrokerState::Missing,
                "stopping" => BrokerState::Stopping,
                _ => BrokerState::Live,
            },
            buffered_messages: row.get(5),
            buffer_healthy: row.get(6),
        })
        .collect())
}

/// The fleet's recent past in intervals of `interval_seconds` aligned to the Unix epoch: the
/// traffic summed over brokers, and the lag samples (the latest of each interval).
#[derive(Debug, Clone, PartialEq)]
pub struct History {
    /// The database's clock when read: the history ends in the interval holding it.
    pub now: DateTime<Utc>,
    pub traffic: Vec<(DateTime<Utc>, Traffic)>,
    /// Interval start, messages behind, age of the oldest unread message in seconds.
    pub lag: Vec<(DateTime<Utc>, i64, f64)>,
}

/// The traffic in five columns of `row` from `first` on: pushed, delivered, acked, failed and
/// dead-lettered.
fn traffic_of(row: &tokio_postgres::Row, first: usize) -> Traffic {
    Traffic {
        pushed: row.get(first),
        delivered: row.get(first + 1),
        acked: row.get(first + 2),
        failed: row.get(first + 3),
        dead_lettered: row.get(first + 4),
    }
}

/// The last `span_seconds` of history, oldest interval first; intervals without a sample are
/// absent.
pub async fn history(
    client: &impl GenericClient,
    interval_seconds: f64,
    span_seconds: f64,
) -> Result<History, StoreError> {
    let now: DateTime<Utc> = client.query_one("SELECT now()", &[]).await?.get(0);
    let traffic = client
        .query(
            "SELECT date_bin(make_interval(secs => $1), sampled_at, 'epoch'::timestamptz) AS at,
                    sum(pushed)::bigint, sum(delivered)::bigint, sum(acked)::bigint, sum(failed)::bigint,
                    sum(dead_lettered)::bigint
               FROM queen.traffic_samples
              WHERE sampled_at >= $3::timestamptz - make_interval(secs => $2)
              GROUP BY 1 ORDER BY 1",
            &[&interval_seconds, &span_seconds, &now],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), traffic_of(row, 1)))
        .collect();
    let lag = client
        .query(
            "SELECT DISTINCT ON (1) date_bin(make_interval(secs => $1), sampled_at, 'epoch'::timestamptz),
                    lag_messages, lag_seconds
               FROM queen.lag_samples
              WHERE sampled_at >= $3::timestamptz - make_interval(secs => $2)
              ORDER BY 1, sampled_at DESC",
            &[&interval_seconds, &span_seconds, &now],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    Ok(History { now, traffic, lag })
}

/// One broker's samples of one interval: its traffic summed, and its usage. The usage is absent
/// when every sample of the interval predates migration 18 (or came from an older broker).
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerInterval {
    pub broker_id: String,
    /// The interval's start.
    pub at: DateTime<Utc>,
    pub traffic: Traffic,
    pub usage: Option<UsageSummary>,
}

/// A broker's usage over one interval of one or more samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UsageSummary {
    /// Processor time per second of the interval: the cores the process kept busy on average.
    pub cpu_cores: f64,
    /// The highest of the samples.
    pub resident_bytes: i64,
    pub db_connections: i32,
    pub db_max_connections: i32,
    pub db_waiting: i32,
    pub long_poll_waiters: i32,
    /// The lowest of the samples.
    pub db_idle_connections: i32,
    /// Summed.
    pub db_errors: i64,
}

/// Every broker's samples taken from `from` to `to` (the present when `None`), in intervals of
/// `interval_seconds` aligned to the Unix epoch; by broker, oldest interval first. Intervals
/// without a sample are absent.
pub async fn broker_intervals(
    client: &impl GenericClient,
    interval_seconds: f64,
    from: DateTime<Utc>,
    to: Option<DateTime<Utc>>,
) -> Result<Vec<BrokerInterval>, StoreError> {
    let rows = client
        .query(
            "SELECT broker_id, date_bin(make_interval(secs => $1), sampled_at, 'epoch'::timestamptz),
                    sum(pushed)::bigint, sum(delivered)::bigint, sum(acked)::bigint, sum(failed)::bigint,
                    sum(dead_lettered)::bigint,
                    count(cpu_seconds), sum(cpu_seconds) / NULLIF(sum(interval_seconds), 0),
                    max(resident_bytes), max(db_connections), max(db_max_connections), max(db_waiting),
                    max(long_poll_waiters), min(db_idle_connections), sum(db_errors)::bigint
               FROM queen.traffic_samples
              WHERE sampled_at >= $2 AND ($3::timestamptz IS NULL OR sampled_at <= $3)
              GROUP BY 1, 2 ORDER BY 1, 2",
            &[&interval_seconds, &from, &to],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| BrokerInterval {
            broker_id: row.get(0),
            at: row.get(1),
            traffic: traffic_of(row, 2),
            usage: (row.get::<_, i64>(7) > 0).then(|| UsageSummary {
                cpu_cores: row.get::<_, Option<f64>>(8).unwrap_or(0.0),
                resident_bytes: row.get(9),
                db_connections: row.get(10),
                db_max_connections: row.get(11),
                db_waiting: row.get(12),
                long_poll_waiters: row.get(13),
                db_idle_connections: row.get(14),
                db_errors: row.get(15),
            }),
        })
        .collect())
}
