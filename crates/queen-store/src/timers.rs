//! Timers (`queen.timers`, migration 14): messages scheduled for later, keyed by (queue, timer
//! key), and the statements of the sweep that delivers them.
//!
//! A timer is taken for delivery in two steps. [`claim`] marks due timers with a claim token that
//! is valid until their `fire_at` (and commits, so a cancel or reschedule meanwhile sees the claim
//! and answers "too late"). The delivery transaction then locks the rows still holding that token
//! ([`lock_claimed`]), appends their messages, and deletes them ([`delete_delivered`]) or counts a
//! failed attempt ([`record_failures`]) before it commits. A broker that dies holding a claim
//! loses it when `fire_at` passes, and the timer is claimed again; a delivery whose claim was lost
//! (to a cancel, a reschedule or another broker) finds no row to lock and delivers nothing, so a
//! timer is delivered once.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::StoreError;

/// A timer to schedule (or schedule again: one upsert on its key).
#[derive(Debug, Clone, Copy)]
pub struct NewTimer<'a> {
    pub queue: &'a str,
    pub timer_key: &'a str,
    pub partition: &'a str,
    pub txn: &'a str,
    /// Kept when the key's pending timer has the same `txn` (a retried request), so the id
    /// promised by the first answer stays true.
    pub message_id: Uuid,
    pub payload: &'a [u8],
    pub producer: Option<&'a str>,
    /// From now, by the database's clock; 0 or less is due at once.
    pub delay_ms: i64,
}

/// What scheduling did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheduled {
    /// No timer was pending under the key.
    Created { message_id: Uuid, deliver_at: DateTime<Utc> },
    /// The pending timer under the key was replaced, its attempts reset.
    Replaced { message_id: Uuid, deliver_at: DateTime<Utc> },
    /// The timer under the key is being delivered; nothing changed. `txn` is its message's.
    BeingDelivered { txn: String },
}

/// Schedules the timer: inserts it, or replaces the pending timer of the same key (its payload,
/// destination, due time and txn; its attempts start over) unless that one is being delivered.
pub async fn schedule(client: &impl GenericClient, timer: &NewTimer<'_>) -> Result<Scheduled, StoreError> {
    let statement = client
        .prepare_cached(
            // The outer SELECT reads the snapshot from before the upsert: it finds the claimed
            // row only when the upsert left it alone. `xmax = 0` tells an inserted row from an
            // updated one.
            "WITH upsert AS (
                 INSERT INTO queen.timers AS t (queue, timer_key, partition, txn, message_id, payload, producer,
                                                deliver_at, fire_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7,
                         now() + GREATEST($8::bigint, 0) * interval '1 millisecond',
                         now() + GREATEST($8::bigint, 0) * interval '1 millisecond')
                 ON CONFLICT (queue, timer_key) DO UPDATE
                    SET partition = EXCLUDED.partition,
                        message_id = CASE WHEN t.txn = EXCLUDED.txn THEN t.message_id ELSE EXCLUDED.message_id END,
                        txn = EXCLUDED.txn, payload = EXCLUDED.payload, producer = EXCLUDED.producer,
                        deliver_at = EXCLUDED.deliver_at, fire_at = EXCLUDED.fire_at, claim_token = NULL,
                        attempts = 0, last_error = NULL, updated_at = now()
                  WHERE t.claim_token IS NULL OR t.fire_at <= now()
                 RETURNING xmax = 0 AS created, message_id, deliver_at
             )
             SELECT u.created, u.message_id, u.deliver_at, NULL::text FROM upsert u
             UNION ALL
             SELECT NULL, NULL, NULL, t.txn FROM queen.timers t
              WHERE t.queue = $1 AND t.timer_key = $2 AND NOT EXISTS (SELECT 1 FROM upsert)",
        )
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
        &timer.queue,
        &timer.timer_key,
        &timer.partition,
        &timer.txn,
        &timer.message_id,
        &timer.payload,
        &timer.producer,
        &timer.delay_ms,
    ];
    // A claimed row the snapshot did not hold yet (claimed and committed while the statement
    // ran) leaves no row to read: look again, as of now.
    for _ in 0..3 {
        let Some(row) = client.query_opt(&statement, &params).await? else { continue };
        return Ok(match row.get::<_, Option<bool>>(0) {
            Some(true) => Scheduled::Created { message_id: row.get(1), deliver_at: row.get(2) },
            Some(false) => Scheduled::Replaced { message_id: row.get(1), deliver_at: row.get(2) },
            None => Scheduled::BeingDelivered { txn: row.get(3) },
        });
    }
    Err(StoreError::Missing("timer"))
}

/// What cancelling did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancelled {
    /// The pending timer was deleted; `txn` was its message's.
    Cancelled { txn: String },
    /// No timer is pending under the key (or, when a txn was given, none with that txn): it was
    /// never scheduled, was cancelled, or was delivered.
    Absent,
    /// The timer is being delivered; nothing changed.
    BeingDelivered { txn: String },
}

/// Cancels the pending timer of the key; with `txn`, only if it is the timer of that txn.
pub async fn cancel(
    client: &impl GenericClient,
    queue: &str,
    timer_key: &str,
    txn: Option<&str>,
) -> Result<Cancelled, StoreError> {
    let statement = client
        .prepare_cached(
            "WITH target AS (
                 SELECT txn, claim_token IS NOT NULL AND fire_at > now() AS delivering FROM queen.timers
                  WHERE queue = $1 AND timer_key = $2 AND ($3::text IS NULL OR txn = $3::text)
                    FOR UPDATE
             ), gone AS (
                 DELETE FROM queen.timers t USING target
                  WHERE t.queue = $1 AND t.timer_key = $2 AND NOT target.delivering
                 RETURNING t.txn
             )
             SELECT target.txn, target.delivering FROM target",
        )
        .await?;
    let row = client.query_opt(&statement, &[&queue, &timer_key, &txn]).await?;
    Ok(match row {
        None => Cancelled::Absent,
        Some(row) if row.get::<_, bool>(1) => Cancelled::BeingDelivered { txn: row.get(0) },
        Some(row) => Cancelled::Cancelled { txn: row.get(0) },
    })
}

/// Where a stored timer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerState {
    /// Waiting for its due time.
    Pending,
    /// Claimed by a broker that is delivering it.
    Delivering,
    /// A delivery failed; it is tried again after a backoff.
    Retrying,
    /// Its delivery attempts are spent: kept, not tried again until it is rescheduled.
    Held,
}

/// A timer as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTimer {
    pub queue: String,
    pub timer_key: String,
    pub partition: String,
    pub txn: String,
    pub message_id: Uuid,
    /// As stored: sealed when its queue was encrypted when it was scheduled.
    pub payload: Vec<u8>,
    pub producer: Option<String>,
    pub deliver_at: DateTime<Utc>,
    /// When a sweeper may take it next; `None` when held.
    pub fire_at: Option<DateTime<Utc>>,
    pub state: TimerState,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const STORED_COLUMNS: &str = "queue, timer_key, partition, txn, message_id, payload, producer, deliver_at, fire_at,
     claim_token IS NOT NULL AND fire_at > now(), attempts, last_error, created_at, updated_at";

fn stored(row: &tokio_postgres::Row) -> StoredTimer {
    let fire_at: Option<DateTime<Utc>> = row.get(8);
    let attempts: i32 = row.get(10);
    let state = match (fire_at, row.get::<_, Option<bool>>(9)) {
        (None, _) => TimerState::Held,
        (_, Some(true)) => TimerState::Delivering,
        _ if attempts > 0 => TimerState::Retrying,
        _ => TimerState::Pending,
    };
    StoredTimer {
        queue: row.get(0),
        timer_key: row.get(1),
        partition: row.get(2),
        txn: row.get(3),
        message_id: row.get(4),
        payload: row.get(5),
        producer: row.get(6),
        deliver_at: row.get(7),
        fire_at,
        state,
        attempts,
        last_error: row.get(11),
        created_at: row.get(12),
        updated_at: row.get(13),
    }
}

/// The timer of the key, if one is pending.
pub async fn find(
    client: &impl GenericClient,
    queue: &str,
    timer_key: &str,
) -> Result<Option<StoredTimer>, StoreError> {
    let sql = format!("SELECT {STORED_COLUMNS} FROM queen.timers WHERE queue = $1 AND timer_key = $2");
    let statement = client.prepare_cached(&sql).await?;
    Ok(client.query_opt(&statement, &[&queue, &timer_key]).await?.as_ref().map(stored))
}

/// Up to `limit` timers of the queue in key order, after the key `after` (exclusive), and whether
/// more follow. The page ends before `max_bytes` of payloads (it holds at least one timer), so a
/// page of large payloads is not read whole.
pub async fn list(
    client: &impl GenericClient,
    queue: &str,
    after: Option<&str>,
    limit: i64,
    max_bytes: i64,
) -> Result<(Vec<StoredTimer>, bool), StoreError> {
    // One more than asked for, to tell whether more follow; `fetched` counts them before the cut.
    let sql = format!(
        "SELECT {STORED_COLUMNS}, fetched FROM (
             SELECT *, sum(octet_length(payload)) OVER w AS through, row_number() OVER w AS place,
                    count(*) OVER () AS fetched
               FROM (SELECT * FROM queen.timers
                      WHERE queue = $1 AND ($2::text IS NULL OR timer_key > $2::text)
                      ORDER BY timer_key LIMIT $3::bigint + 1) page
             WINDOW w AS (ORDER BY timer_key ROWS UNBOUNDED PRECEDING)
         ) counted
         WHERE through <= $4::bigint OR place = 1
         ORDER BY timer_key"
    );
    let statement = client.prepare_cached(&sql).await?;
    let rows = client.query(&statement, &[&queue, &after, &limit, &max_bytes]).await?;
    // `fetched` comes last, after the stored columns.
    let fetched: i64 = rows.first().map_or(0, |row| row.get(row.len() - 1));
    let mut timers: Vec<StoredTimer> = rows.iter().map(stored).collect();
    timers.truncate(usize::try_from(limit).unwrap_or(0));
    let more = fetched > timers.len() as i64;
    Ok((timers, more))
}

/// Milliseconds until the earliest timer a sweeper may take (0 or less: one is due now), by the
/// database's clock; `None` when there is none. One probe of the `fire_at` index.
pub async fn next_due_in_ms(client: &impl GenericClient) -> Result<Option<f64>, StoreError> {
    let statement = client
        .prepare_cached(
            "SELECT (EXTRACT(EPOCH FROM min(fire_at) - clock_timestamp()) * 1000)::double precision
               FROM queen.timers WHERE fire_at IS NOT NULL",
        )
        .await?;
    Ok(client.query_one(&statement, &[]).await?.get(0))
}

/// A timer claimed for delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedTimer {
    pub queue: String,
    pub timer_key: String,
    pub partition: String,
    pub txn: String,
    pub message_id: Uuid,
    pub payload: Vec<u8>,
    pub producer: Option<String>,
}

/// Claims up to `limit` due timers, the longest due first, under `token` for `claim_ms`: until
/// then no other sweeper takes them, and cancels and reschedules of them answer "too late".
/// Timers other sweepers are claiming right now are skipped, never waited for. The claim stops
/// before `max_bytes` of payloads (it takes at least one timer), so a sweep holds no more than
/// that in memory.
pub async fn claim(
    client: &impl GenericClient,
    token: Uuid,
    claim_ms: i64,
    limit: i64,
    max_bytes: i64,
) -> Result<Vec<ClaimedTimer>, StoreError> {
    let statement = client
        .prepare_cached(
            "WITH due AS (
                 SELECT queue, timer_key, fire_at, octet_length(payload) AS bytes FROM queen.timers
                  WHERE fire_at IS NOT NULL AND fire_at <= now()
                  ORDER BY fire_at LIMIT $3::bigint
                    FOR UPDATE SKIP LOCKED
             ), taken AS (
                 SELECT queue, timer_key FROM (
                     SELECT queue, timer_key, sum(bytes) OVER w AS through, row_number() OVER w AS place
                       FROM due
                     WINDOW w AS (ORDER BY fire_at, queue, timer_key ROWS UNBOUNDED PRECEDING)) counted
                  WHERE through <= $4::bigint OR place = 1
             )
             UPDATE queen.timers t
                SET claim_token = $1, fire_at = now() + $2::bigint * interval '1 millisecond'
               FROM taken
              WHERE t.queue = taken.queue AND t.timer_key = taken.timer_key
          RETURNING t.queue, t.timer_key, t.partition, t.txn, t.message_id, t.payload, t.producer",
        )
        .await?;
    let rows = client.query(&statement, &[&token, &claim_ms, &limit, &max_bytes]).await?;
    Ok(rows
        .iter()
        .map(|row| ClaimedTimer {
            queue: row.get(0),
            timer_key: row.get(1),
            partition: row.get(2),
            txn: row.get(3),
            message_id: row.get(4),
            payload: row.get(5),
            producer: row.get(6),
        })
        .collect())
}

/// A timer's key.
pub type TimerKey = (String, String);

fn key_arrays(keys: &[TimerKey]) -> (Vec<&str>, Vec<&str>) {
    keys.iter().map(|(queue, key)| (queue.as_str(), key.as_str())).unzip()
}

/// Locks, until the end of the caller's transaction, those of `keys` that still hold `token`
/// (in key order, the order every transaction that locks several timers takes them in); their
/// keys. The others were cancelled, rescheduled or claimed again since: not this delivery's.
pub async fn lock_claimed(
    tx: &deadpool_postgres::Transaction<'_>,
    token: Uuid,
    keys: &[TimerKey],
) -> Result<Vec<TimerKey>, StoreError> {
    let (queues, timer_keys) = key_arrays(keys);
    let statement = tx
        .prepare_cached(
            "SELECT t.queue, t.timer_key FROM queen.timers t
               JOIN unnest($2::text[], $3::text[]) AS k(queue, timer_key)
                 ON t.queue = k.queue AND t.timer_key = k.timer_key
              WHERE t.claim_token = $1
              ORDER BY t.queue COLLATE \"C\", t.timer_key COLLATE \"C\"
                FOR UPDATE OF t",
        )
        .await?;
    let rows = tx.query(&statement, &[&token, &queues, &timer_keys]).await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// Deletes the delivered timers (still under `token`).
pub async fn delete_delivered(client: &impl GenericClient, token: Uuid, keys: &[TimerKey]) -> Result<u64, StoreError> {
    if keys.is_empty() {
        return Ok(0);
    }
    let (queues, timer_keys) = key_arrays(keys);
    let statement = client
        .prepare_cached(
            "DELETE FROM queen.timers t USING unnest($2::text[], $3::text[]) AS k(queue, timer_key)
              WHERE t.queue = k.queue AND t.timer_key = k.timer_key AND t.claim_token = $1",
        )
        .await?;
    Ok(client.execute(&statement, &[&token, &queues, &timer_keys]).await?)
}

/// How failed deliveries are tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Failed attempts after which a timer is held.
    pub max_attempts: i32,
    /// The wait after the first failure; it doubles with each one after.
    pub first_backoff_ms: i64,
    pub max_backoff_ms: i64,
}

/// A timer whose delivery failed, after [`record_failures`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedTimer {
    pub key: TimerKey,
    pub attempts: i32,
    /// Its attempts are spent: it is held.
    pub held: bool,
}

/// Counts a failed attempt for each timer (still under `token`) with its error, and releases its
/// claim: it is tried again after the policy's backoff, or held once its attempts are spent.
pub async fn record_failures(
    client: &impl GenericClient,
    token: Uuid,
    failures: &[(TimerKey, String)],
    policy: RetryPolicy,
) -> Result<Vec<FailedTimer>, StoreError> {
    if failures.is_empty() {
        return Ok(Vec::new());
    }
    let (queues, timer_keys): (Vec<&str>, Vec<&str>) =
        failures.iter().map(|((queue, key), _)| (queue.as_str(), key.as_str())).unzip();
    let errors: Vec<&str> = failures.iter().map(|(_, error)| error.as_str()).collect();
    let statement = client
        .prepare_cached(
            "UPDATE queen.timers t
                SET claim_token = NULL, attempts = t.attempts + 1, last_error = k.error, updated_at = now(),
                    fire_at = CASE WHEN t.attempts + 1 >= $5::int THEN NULL
                                   ELSE now() + LEAST($7::bigint, $6::bigint * power(2, LEAST(t.attempts, 30))::bigint)
                                                * interval '1 millisecond' END
               FROM unnest($2::text[], $3::text[], $4::text[]) AS k(queue, timer_key, error)
              WHERE t.queue = k.queue AND t.timer_key = k.timer_key AND t.claim_token = $1
          RETURNING t.queue, t.timer_key, t.attempts, t.fire_at IS NULL",
        )
        .await?;
    let rows = client
        .query(
            &statement,
            &[
                &token,
                &queues,
                &timer_keys,
                &errors,
                &policy.max_attempts,
                &policy.first_backoff_ms,
                &policy.max_backoff_ms,
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| FailedTimer { key: (row.get(0), row.get(1)), attempts: row.get(2), held: row.get(3) })
        .collect())
}
