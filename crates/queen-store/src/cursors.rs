//! Consumer-group cursors and their leases: finding partitions with work, claiming them,
//! extending leases, and acknowledging.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::StoreError;
use crate::ack_rules::{self, AckItem, AckStatus, AckVerdict, CursorState, DeadLetter, LeaseFence, Refusal};
use crate::completed_spans;
use crate::events::{self, Event};
use crate::log::{Span, read_spans};
use queen_log::Cipher;

/// Where a group's cursor starts on a partition it has never read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorSeed {
    /// Just below the oldest retained offset: the group reads everything still stored.
    Oldest,
    /// At the partition's current end: the group reads only later pushes.
    End,
    /// Just below the first segment created at or after the time.
    From(DateTime<Utc>),
}

/// A partition of the queue that may have work for the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub partition_id: i64,
    pub partition: String,
    pub has_cursor: bool,
    /// Set when the group cannot be served the partition now, and from when it may: another
    /// consumer of the group holds it until then, or its next message is not visible yet
    /// (`delayedProcessing`, `windowBuffer`, a `retryDelay` after a failure).
    pub not_before: Option<DateTime<Utc>>,
    /// Messages past the group's cursor, visible or not; `None` without a cursor.
    pub backlog: Option<i64>,
}

/// Which partitions of a queue a candidate query looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Every partition: a full scan.
    All,
    /// These partitions (a broker's candidate list, or the one partition of a partition pop).
    Only(&'a [i64]),
}

/// Whether a candidate query works out when the queue's visibility rules let messages be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// The queue neither delays (`delayedProcessing`) nor windows (`windowBuffer`) messages: only
    /// leases and retry delays hold a partition back.
    Immediate,
    /// The queue delays or windows messages: when the next message can be served is found too.
    Rules,
}

/// Partitions of the queue in `scope` with messages past the group's cursor, or with no cursor
/// yet: those the group can be served now first, the longest-unserved first among them; then
/// the others, the soonest available first. Every such partition comes back, available or not,
/// so the caller learns which still have work and when to look again.
///
/// Under [`Visibility::Rules`], a partition whose newest segment is older than the queue's delay
/// and window costs nothing more; otherwise its next message's segment is found through the
/// primary key. (The claim applies the rules again, from the queue row, whatever was asked here.)
pub async fn candidates(
    client: &impl GenericClient,
    queue_id: i64,
    scope: Scope<'_>,
    group: &str,
    visibility: Visibility,
) -> Result<Vec<Candidate>, StoreError> {
    // Two statements per scope rather than one with `$3 IS NULL OR p.id = ANY($3)`: under that OR
    // a cached plan compares every partition with every listed id. Each comes in two forms, since
    // the rules' expressions cost a tenth of the query even where they do not apply.
    macro_rules! pending_in {
        ($partitions:literal, immediate) => {
            pending_in!($partitions, "", "NULLIF(GREATEST(c.lease_expires_at, c.retry_at, now()), now())")
        };
        ($partitions:literal, rules) => {
            pending_in!(
                $partitions,
                " JOIN queen.queues q ON q.id = $1",
                // The latest of the times it is held until, or NULL when they are all past.
                "NULLIF(GREATEST(
                     c.lease_expires_at,
                     c.retry_at,
                     CASE WHEN q.window_buffer_seconds > 0
                               AND p.last_segment_at > now() - q.window_buffer_seconds * interval '1 second'
                          THEN p.last_segment_at + q.window_buffer_seconds * interval '1 second' END,
                     CASE WHEN q.delayed_processing_seconds > 0
                               AND p.last_segment_at > now() - q.delayed_processing_seconds * interval '1 second'
                          THEN (SELECT s.created_at + q.delayed_processing_seconds * interval '1 second'
                                  FROM queen.log_segments s
                                 WHERE s.partition_id = p.id
                                   AND s.base_offset <= GREATEST(c.committed, p.retained_from - 1) + 1
                                 ORDER BY s.base_offset DESC LIMIT 1) END,
                     now()), now())"
            )
        };
        ($partitions:literal, $queue:literal, $not_before:literal) => {
            concat!(
                "SELECT p.id, p.name, c.partition_id IS NOT NULL, ",
                $not_before,
                " AS not_before, p.last_offset - GREATEST(c.committed, p.retained_from - 1) AS backlog FROM ",
                $partitions,
                $queue,
                " LEFT JOIN queen.log_consumers c ON c.partition_id = p.id AND c.consumer_group = $2
                  WHERE p.queue_id = $1
                    AND p.last_offset >= p.retained_from
                    AND (c.partition_id IS NULL OR p.last_offset > c.committed)
                  ORDER BY not_before NULLS FIRST, c.last_claimed_at NULLS FIRST, p.id"
            )
        };
    }
    let sql = match (scope, visibility) {
        (Scope::All, Visibility::Immediate) => pending_in!("queen.partitions p", immediate),
        (Scope::All, Visibility::Rules) => pending_in!("queen.partitions p", rules),
        (Scope::Only(_), Visibility::Immediate) => {
            pending_in!("unnest($3::bigint[]) AS listed(id) JOIN queen.partitions p ON p.id = listed.id", immediate)
        }
        (Scope::Only(_), Visibility::Rules) => {
            pending_in!("unnest($3::bigint[]) AS listed(id) JOIN queen.partitions p ON p.id = listed.id", rules)
        }
    };
    let statement = client.prepare_cached(sql).await?;
    let rows = match scope {
        Scope::All => client.query(&statement, &[&queue_id, &group]).await?,
        Scope::Only(ids) => client.query(&statement, &[&queue_id, &group, &ids]).await?,
    };
    Ok(rows
        .iter()
        .map(|row| Candidate {
            partition_id: row.get(0),
            partition: row.get(1),
            has_cursor: row.get(2),
            not_before: row.get(3),
            backlog: row.get(4),
        })
        .collect())
}

/// Creates the group's cursor on each partition that has none. The group's registration on the
/// queue (`queen.consumer_groups_metadata`) decides where it starts; `fallback` only when the
/// group has none. An existing cursor is never re-seeded.
pub async fn ensure_cursors(
    client: &impl GenericClient,
    group: &str,
    partition_ids: &[i64],
    fallback: CursorSeed,
) -> Result<(), StoreError> {
    if partition_ids.is_empty() {
        return Ok(());
    }
    let (mode, from): (&str, Option<DateTime<Utc>>) = match fallback {
        CursorSeed::Oldest => ("all", None),
        CursorSeed::End => ("end", None),
        CursorSeed::From(at) => ("timestamp", Some(at)),
    };
    let statement = client
        .prepare_cached(concat!(
            "INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
             SELECT p.id, $2, ",
            group_start_sql!("COALESCE(m.subscription_mode, $3)", "COALESCE(m.subscription_from, $4)"),
            "
               FROM queen.partitions p
               JOIN queen.queues q ON q.id = p.queue_id
               LEFT JOIN queen.consumer_groups_metadata m ON m.queue_name = q.name AND m.consumer_group = $2
              WHERE p.id = ANY($1)
             ON CONFLICT (partition_id, consumer_group) DO NOTHING",
        ))
        .await?;
    client.execute(&statement, &[&partition_ids, &group, &mode, &from]).await?;
    Ok(())
}

/// What a pop asks to claim.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    pub group: &'a str,
    /// Partitions to try, in order of preference. Each must already have the group's cursor.
    pub partition_ids: &'a [i64],
    /// Most messages, across every claimed partition.
    pub batch: i64,
    /// Most partitions one claim may take.
    pub max_partitions: i64,
    /// Most cursors the claim locks, taking them in order of preference and passing over those
    /// another claim holds. Locking a cursor is a write whether or not it is then taken, and a
    /// cursor locked and not taken is one a concurrent claim of the group passes over.
    pub lock_at_most: i64,
    /// The lease shared by every partition this claim takes.
    pub lease_id: Uuid,
    /// Overrides the queue's lease time.
    pub lease_seconds: Option<i32>,
    /// Commit at delivery: advance the cursor and take no lease.
    pub auto_ack: bool,
    /// The group conflates: serve only each partition's newest visible message, retiring the
    /// ones behind it as it is claimed (the group would never be served them).
    pub conflation: bool,
    /// Whether the queue delays or windows messages, as the pop found its options. Under
    /// [`Visibility::Immediate`] the claim leaves out the delay's segment lookup, and passes over a
    /// partition whose newest messages a delay set since still covers.
    pub visibility: Visibility,
}

/// One partition a pop claimed, and the span it delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub partition_id: i64,
    pub first: i64,
    pub last: i64,
    /// How many times the span's first message has now been delivered.
    pub delivery_attempt: i32,
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// The partition's previous lease on this group ran out without being acknowledged.
    pub took_over_expired_lease: bool,
    /// The partition's last offset when it was claimed, visible or not: once the group's cursor
    /// reaches it, nothing that was on the partition then is left for the group.
    pub partition_end: i64,
}

/// What a claim took, and what it left for [`give_up_exhausted_heads`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claimed {
    /// In the order of the request's partitions.
    pub claims: Vec<Claim>,
    /// Partitions whose head message was not delivered again: the lease that ran out over it
    /// was its last allowed failure.
    pub exhausted: Vec<i64>,
}

/// The claim statement, with `{delay_visible_until}` (the last offset of partition `p` of queue
/// `q` the delay lets be served), `{auto_ack}` and `{conflation}` to fill in: one statement per kind
/// of queue and pop rather than one taking them as parameters, since PostgreSQL sets up every
/// part of a plan and compiles every expression at each execution, used or not
/// (`benches/README.md`, *What `pg_stat_statements` does not see*).
const CLAIM_TEMPLATE: &str = "WITH candidate AS (
         SELECT c.partition_id, x.ord, s.start_after, s.start_after > c.committed AS skipped,
                v.last_offset, p.last_offset AS partition_end,
                c.lease_expires_at IS NOT NULL AS expired, q.lease_time_seconds,
                -- The lease that ran out delivered the head message: a failed delivery.
                c.lease_expires_at IS NOT NULL AND COALESCE(c.leased_until, 0) > s.start_after AS head_failed,
                c.lease_expires_at IS NOT NULL AND COALESCE(c.leased_until, 0) > s.start_after
                    AND CASE WHEN s.start_after > c.committed THEN 0 ELSE c.retry_count END + 1 > q.retry_limit
                    AS exhausted
           FROM unnest($2::bigint[]) WITH ORDINALITY AS x(partition_id, ord)
           JOIN queen.log_consumers c ON c.partition_id = x.partition_id AND c.consumer_group = $1
           JOIN queen.partitions p ON p.id = x.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          -- The last offset the group may be served: nothing while the partition's window is
          -- still open, else what the delay lets be served.
          CROSS JOIN LATERAL (SELECT CASE
              WHEN q.window_buffer_seconds > 0
                   AND p.last_segment_at > now() - q.window_buffer_seconds * interval '1 second' THEN 0
              ELSE {delay_visible_until} END AS last_offset) v
          -- Where the delivery starts: after the cursor, or, for a conflating group, just before
          -- the newest visible message.
          CROSS JOIN LATERAL (SELECT GREATEST(c.committed, p.retained_from - 1,
                                              CASE WHEN {conflation} THEN v.last_offset - 1 ELSE 0 END) AS start_after) s
          WHERE (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
            AND (c.retry_at IS NULL OR c.retry_at <= now())
            AND v.last_offset > s.start_after
          ORDER BY x.ord
          LIMIT $7::bigint
            FOR UPDATE OF c SKIP LOCKED
     ), allotted AS (
         SELECT *, LEAST(last_offset - start_after,
                         $3::bigint - COALESCE(SUM(last_offset - start_after)
                             OVER (ORDER BY ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)::bigint) AS take
           FROM candidate WHERE NOT exhausted
     ), chosen AS (
         SELECT * FROM allotted WHERE take > 0 ORDER BY ord LIMIT $4::bigint
     ), claimed AS (
     UPDATE queen.log_consumers c
        SET lease_id = CASE WHEN {auto_ack} THEN c.lease_id ELSE $5 END,
            lease_expires_at = CASE WHEN {auto_ack} THEN NULL
                ELSE now() + COALESCE($6, ch.lease_time_seconds) * interval '1 second' END,
            -- An auto-acked claim keeps where it started: until its pop has handed out what it
            -- committed (or moved the cursor back), retention must not take what it claimed.
            leased_until = CASE WHEN {auto_ack} THEN ch.start_after ELSE ch.start_after + ch.take END,
            -- What the claim skips (conflation's older messages, or what retention removed under
            -- the cursor) is passed: a new head, whose counters start over (with the failure of a
            -- lease that ran out over it, when retention skipped to it).
            committed = CASE WHEN {auto_ack} THEN ch.start_after + ch.take
                             WHEN ch.skipped THEN ch.start_after ELSE c.committed END,
            delivered_until = GREATEST(c.delivered_until, ch.start_after + ch.take),
            head_attempts = CASE WHEN {auto_ack} THEN 0 WHEN ch.skipped AND {conflation} THEN 1
                                 WHEN ch.skipped THEN 1 + ch.head_failed::int
                                 ELSE c.head_attempts + 1 END,
            retry_count = CASE WHEN {auto_ack} OR (ch.skipped AND {conflation}) THEN 0
                               WHEN ch.skipped THEN ch.head_failed::int
                               ELSE c.retry_count + ch.head_failed::int END,
            head_expiries = CASE WHEN {auto_ack} OR (ch.skipped AND {conflation}) THEN 0
                                 WHEN ch.skipped THEN ch.head_failed::int
                                 ELSE c.head_expiries + ch.head_failed::int END,
            redelivery_count = c.redelivery_count + CASE WHEN ch.expired THEN 1 ELSE 0 END,
            total_consumed = c.total_consumed + CASE WHEN {auto_ack} THEN ch.take ELSE 0 END
                             + CASE WHEN ch.skipped AND {conflation} THEN ch.start_after - c.committed ELSE 0 END,
            last_claimed_at = now(),
            last_consumed_at = CASE WHEN {auto_ack} OR (ch.skipped AND {conflation}) THEN now()
                                    ELSE c.last_consumed_at END
       FROM chosen ch
      WHERE c.partition_id = ch.partition_id AND c.consumer_group = $1
     RETURNING c.partition_id, ch.start_after + 1 AS first, ch.start_after + ch.take AS last,
               CASE WHEN {auto_ack} THEN 1 ELSE c.head_attempts END AS attempt, c.lease_expires_at, ch.expired,
               ch.ord, ch.partition_end
     )
     -- A leasing claim commits without waiting for the WAL flush (docs/architecture.md, *A lease
     -- does not wait for the disk*); one that commits at delivery waits, so that its cursor never
     -- moves back.
     SELECT partition_id, first, last, attempt, lease_expires_at, expired, ord, false, partition_end
       FROM claimed LEFT JOIN (SELECT set_config('synchronous_commit', 'off', true) WHERE NOT {auto_ack}) AS commit_mode
         ON true
     UNION ALL
     SELECT partition_id, NULL, NULL, NULL, NULL, true, ord, true, NULL FROM candidate WHERE exhausted";

/// The claim statement for a kind of queue and pop.
fn claim_form(visibility: Visibility, auto_ack: bool, conflation: bool) -> &'static str {
    static FORMS: LazyLock<Vec<String>> = LazyLock::new(|| {
        let delay_visible_until = |visibility| match visibility {
            Visibility::Rules => delay_visible_until_sql!(),
            // The pop found the queue without a delay. Should one have been set since, a partition
            // whose newest messages it still covers is passed over until the pop knows (never a
            // message early): the delay's segment lookup is left out of this form.
            Visibility::Immediate => {
                "CASE WHEN q.delayed_processing_seconds > 0
                           AND p.last_segment_at > now() - q.delayed_processing_seconds * interval '1 second' THEN 0
                      ELSE p.last_offset END"
            }
        };
        let mut forms = Vec::with_capacity(8);
        for visibility in [Visibility::Immediate, Visibility::Rules] {
            for auto_ack in [false, true] {
                for conflation in [false, true] {
                    forms.push(
                        CLAIM_TEMPLATE
                            .replace("{delay_visible_until}", delay_visible_until(visibility))
                            .replace("{auto_ack}", if auto_ack { "true" } else { "false" })
                            .replace("{conflation}", if conflation { "true" } else { "false" }),
                    );
                }
            }
        }
        forms
    });
    let index = usize::from(visibility == Visibility::Rules) * 4 + usize::from(auto_ack) * 2 + usize::from(conflation);
    &FORMS[index]
}

/// Claims partitions with pending messages, atomically: each claimed cursor's lease was free or
/// expired, is now this claim's, and covers the next visible messages of the partition, with
/// `batch` capping the total. Rows another transaction is claiming right now are skipped, not
/// waited on; partitions with nothing visible yet (the queue's delay or window, a retry delay)
/// are passed over.
///
/// A lease that ran out over the head message (delivered, never acknowledged) is a failed
/// delivery of it, counted like a failed ack; a head with no failure left under the queue's retry
/// limit is not claimed but reported in [`Claimed::exhausted`].
///
/// A claim that takes a lease commits asynchronously: lost in a crash before it reached the disk,
/// it is a lease that never was, and its messages are delivered again.
pub async fn claim(client: &impl GenericClient, request: &ClaimRequest<'_>) -> Result<Claimed, StoreError> {
    if request.partition_ids.is_empty() || request.batch < 1 || request.max_partitions < 1 || request.lock_at_most < 1 {
        return Ok(Claimed::default());
    }
    let statement = client.prepare_cached(claim_form(request.visibility, request.auto_ack, request.conflation)).await?;
    let rows = client
        .query(
            &statement,
            &[
                &request.group,
                &request.partition_ids,
                &request.batch,
                &request.max_partitions,
                &request.lease_id,
                &request.lease_seconds,
                &request.lock_at_most,
            ],
        )
        .await?;
    let (exhausted, claimed): (Vec<_>, Vec<_>) = rows.iter().partition(|row| row.get::<_, bool>(7));
    let mut claims: Vec<(i64, Claim)> = claimed
        .into_iter()
        .map(|row| {
            let claim = Claim {
                partition_id: row.get(0),
                first: row.get(1),
                last: row.get(2),
                delivery_attempt: row.get(3),
                lease_expires_at: row.get(4),
                took_over_expired_lease: row.get(5),
                partition_end: row.get(8),
            };
            (row.get(6), claim)
        })
        .collect();
    claims.sort_by_key(|(ord, _)| *ord);
    Ok(Claimed {
        claims: claims.into_iter().map(|(_, claim)| claim).collect(),
        exhausted: exhausted.iter().map(|row| row.get(0)).collect(),
    })
}

/// A head message given up on because its last allowed delivery failed with a lease running out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenUp {
    pub partition_id: i64,
    pub offset: i64,
    /// Copied into the dead-letter table; otherwise the queue does not dead-letter, and the
    /// message was only passed.
    pub dead_lettered: bool,
}

/// Gives up on the head messages that [`claim`] reported exhausted on these partitions: in one
/// transaction, under the cursor lock and only where it still holds (another pop may have done it
/// first), each is dead-lettered with the reason (or only passed when the queue does not
/// dead-letter exhausted messages), the cursor moves past it, and a partition with messages left
/// is announced.
pub async fn give_up_exhausted_heads(
    client: &mut deadpool_postgres::Client,
    group: &str,
    partition_ids: &[i64],
    keys: Option<&Cipher>,
) -> Result<Vec<GivenUp>, StoreError> {
    let tx = client.transaction().await?;
    let statement = tx
        .prepare_cached(
            "WITH target AS (
                 SELECT c.partition_id, GREATEST(c.committed, p.retained_from - 1) + 1 AS head, h.retry_count,
                        h.head_expiries, q.dead_letter_queue AND q.dlq_after_max_retries AS keep, q.id AS queue_id,
                        q.name, p.last_offset
                   FROM unnest($2::bigint[]) AS x(partition_id)
                   JOIN queen.log_consumers c ON c.partition_id = x.partition_id AND c.consumer_group = $1
                   JOIN queen.partitions p ON p.id = x.partition_id
                   JOIN queen.queues q ON q.id = p.queue_id
                  -- The head's failures, none when retention removed the one they were counted for.
                  CROSS JOIN LATERAL (SELECT CASE WHEN p.retained_from - 1 > c.committed THEN 0 ELSE c.retry_count END,
                                             CASE WHEN p.retained_from - 1 > c.committed THEN 0 ELSE c.head_expiries END)
                                     AS h(retry_count, head_expiries)
                  WHERE c.lease_expires_at <= now()
                    AND c.leased_until > GREATEST(c.committed, p.retained_from - 1)
                    AND h.retry_count + 1 > q.retry_limit
                    FOR UPDATE OF c SKIP LOCKED
             )
             UPDATE queen.log_consumers c
                SET committed = t.head, lease_expires_at = NULL, retry_count = 0, head_expiries = 0,
                    head_attempts = (c.leased_until > t.head)::int, redelivery_count = c.redelivery_count + 1,
                    -- The lease that ran out is over: a late ack under it is refused as one
                    -- (`ack_rules`), not told its message is done.
                    leased_until = NULL,
                    total_consumed = c.total_consumed + (t.head - c.committed), last_consumed_at = now()
               FROM target t
              WHERE c.partition_id = t.partition_id AND c.consumer_group = $1
          RETURNING t.partition_id, t.head, t.retry_count, t.head_expiries, t.keep, t.queue_id, t.name,
                    t.last_offset > t.head",
        )
        .await?;
    let rows = tx.query(&statement, &[&group, &partition_ids]).await?;
    let mut given_up = Vec::with_capacity(rows.len());
    let mut letters: Vec<(CursorKey, DeadLetter)> = Vec::new();
    for row in &rows {
        let (partition_id, offset, retry_count, expiries): (i64, i64, i32, i32) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let dead_lettered: bool = row.get(4);
        if dead_lettered {
            // This expiry is one more failure, and one more expiry, than the cursor counted.
            let error = ack_rules::exhaustion_reason(retry_count + 1, expiries + 1);
            letters.push(((partition_id, group.to_owned()), DeadLetter { offset, error: Some(error), retry_count }));
        }
        if row.get::<_, bool>(7) {
            events::publish(&tx, &Event::Available { queue_id: row.get(5), partition_id, queue: row.get(6) }).await?;
        }
        given_up.push(GivenUp { partition_id, offset, dead_lettered });
    }
    let dead: Vec<(&CursorKey, &DeadLetter)> = letters.iter().map(|(key, letter)| (key, letter)).collect();
    insert_dead_letters(&tx, &dead, &HashMap::new(), keys).await?;
    tx.commit().await?;
    Ok(given_up)
}

/// Messages a group skipped on one partition, `first..=last`, because they were too old.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    pub partition_id: i64,
    pub first: i64,
    pub last: i64,
}

/// How old a message may be when a group is served it, and what becomes of older ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry<'a> {
    pub max_age_seconds: i32,
    /// Older messages are copied into the dead-letter table with this error; without one they
    /// are only skipped.
    pub dead_letter_error: Option<&'a str>,
}

/// Most messages one transaction dead-letters on a partition; expiry goes on in the next.
const EXPIRY_CHUNK: i64 = 1000;

/// Moves the group's cursors past the messages older than the expiry on those of the partitions
/// that nobody holds, dead-lettering them first when asked. The bound comes from the
/// `(partition_id, created_at)` index (segment-granular, like every time rule of the log).
pub async fn expire(
    client: &mut deadpool_postgres::Client,
    group: &str,
    partition_ids: &[i64],
    expiry: &Expiry<'_>,
    keys: Option<&Cipher>,
) -> Result<Vec<Expired>, StoreError> {
    // Dead letters are copied a chunk at a time; skipping alone has no cost per message.
    let chunk = expiry.dead_letter_error.map(|_| EXPIRY_CHUNK);
    let mut expired = Vec::new();
    let mut remaining = partition_ids.to_vec();
    while !remaining.is_empty() {
        let tx = client.transaction().await?;
        let statement = tx
            .prepare_cached(
                "WITH target AS (
                     SELECT c.partition_id, GREATEST(c.committed, p.retained_from - 1) AS start_after,
                            (SELECT s.end_offset FROM queen.log_segments s
                              WHERE s.partition_id = p.id AND s.created_at < now() - $3::int * interval '1 second'
                              ORDER BY s.created_at DESC, s.base_offset DESC LIMIT 1) AS expired_end
                       FROM unnest($2::bigint[]) AS x(partition_id)
                       JOIN queen.log_consumers c ON c.partition_id = x.partition_id AND c.consumer_group = $1
                       JOIN queen.partitions p ON p.id = x.partition_id
                      WHERE c.lease_expires_at IS NULL OR c.lease_expires_at <= now()
                        FOR UPDATE OF c SKIP LOCKED
                 )
                 UPDATE queen.log_consumers c
                    SET committed = LEAST(t.expired_end, t.start_after + $4), retry_count = 0, head_attempts = 0,
                        head_expiries = 0
                   FROM target t
                  WHERE c.partition_id = t.partition_id AND c.consumer_group = $1 AND t.expired_end > t.start_after
              RETURNING c.partition_id, t.start_after + 1, c.committed",
            )
            .await?;
        let rows = tx.query(&statement, &[&group, &remaining, &expiry.max_age_seconds, &chunk]).await?;
        let moved: Vec<Expired> =
            rows.iter().map(|row| Expired { partition_id: row.get(0), first: row.get(1), last: row.get(2) }).collect();
        if let Some(error) = expiry.dead_letter_error {
            let letters: Vec<(CursorKey, DeadLetter)> = moved
                .iter()
                .flat_map(|e| {
                    (e.first..=e.last).map(move |offset| {
                        let letter = DeadLetter { offset, error: Some(error.to_owned()), retry_count: 0 };
                        ((e.partition_id, group.to_owned()), letter)
                    })
                })
                .collect();
            let dead: Vec<(&CursorKey, &DeadLetter)> = letters.iter().map(|(key, letter)| (key, letter)).collect();
            insert_dead_letters(&tx, &dead, &HashMap::new(), keys).await?;
        }
        tx.commit().await?;
        remaining = match chunk {
            Some(chunk) => moved.iter().filter(|e| e.last - e.first + 1 == chunk).map(|e| e.partition_id).collect(),
            None => Vec::new(),
        };
        expired.extend(moved);
    }
    Ok(expired)
}

/// Gives back what a claim under `lease_id` took on these partitions when its messages could not
/// be handed out (their segments could not be read, its client left, or its answer's byte bound
/// was reached before them): the leases are released and the delivery is not counted, so nothing
/// waits for the lease to run out, which would count as a failure of the head message; what the
/// claim counted as delivered to the group goes back, so that an ack without a lease cannot commit
/// those messages. Partitions with messages left are announced. How many were given back.
pub async fn give_back_claims(
    client: &impl GenericClient,
    lease_id: Uuid,
    partition_ids: &[i64],
) -> Result<u64, StoreError> {
    let rows = client
        .query(
            "UPDATE queen.log_consumers c
                SET lease_expires_at = NULL, head_attempts = GREATEST(c.head_attempts - 1, 0),
                    delivered_until = CASE WHEN c.delivered_until = c.leased_until THEN c.committed
                                           ELSE c.delivered_until END
               FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
              WHERE c.lease_id = $1 AND c.partition_id = ANY($2) AND c.lease_expires_at > now()
                AND p.id = c.partition_id
          RETURNING q.id, p.id, q.name",
            &[&lease_id, &partition_ids],
        )
        .await?;
    announce_available(client, &rows).await?;
    Ok(rows.len() as u64)
}

/// Cuts what a claim under `lease_id` leased on these partitions, `(partition, handed_last)`, to
/// the messages its pop handed out, the last of them at `handed_last`: the pop handed out fewer
/// than it claimed (its answer's byte bound). An ack of those messages then ends the lease, and
/// the rest is served to the group's next pop; a lease that ran out counts as a failed delivery
/// of its head, which was handed out, as for any lease. What the claim counted as delivered goes
/// back to `handed_last`, so that an ack without a lease cannot commit the rest. A cut that comes
/// after the ack of everything handed out (tried again after PostgreSQL did not answer) ends the
/// lease, and the partition is announced. How many were cut.
pub async fn cut_claims(client: &impl GenericClient, lease_id: Uuid, cuts: &[(i64, i64)]) -> Result<u64, StoreError> {
    let partition_ids: Vec<i64> = cuts.iter().map(|c| c.0).collect();
    let handed_lasts: Vec<i64> = cuts.iter().map(|c| c.1).collect();
    let rows = client
        .query(
            "UPDATE queen.log_consumers c
                SET leased_until = x.handed_last,
                    delivered_until = CASE WHEN c.delivered_until = c.leased_until THEN x.handed_last
                                           ELSE c.delivered_until END,
                    lease_expires_at = CASE WHEN c.committed >= x.handed_last THEN NULL ELSE c.lease_expires_at END
               FROM unnest($2::bigint[], $3::bigint[]) AS x(partition_id, handed_last),
                    queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
              WHERE c.lease_id = $1 AND c.partition_id = x.partition_id AND c.lease_expires_at > now()
                AND c.leased_until > x.handed_last AND p.id = c.partition_id
          RETURNING q.id, p.id, q.name, c.lease_expires_at IS NULL",
            &[&lease_id, &partition_ids, &handed_lasts],
        )
        .await?;
    let released: Vec<tokio_postgres::Row> = rows.iter().filter(|row| row.get::<_, bool>(3)).cloned().collect();
    announce_available(client, &released).await?;
    Ok(rows.len() as u64)
}

/// Moves back the cursors an `autoAck` claim committed at delivery over messages that were not
/// handed out after all (their segments could not be read, its client left, or its answer's byte
/// bound was reached before them): without it they would be lost for the group without having
/// been delivered, which at-most-once does not allow. `claims` are `(partition, first, last)`:
/// the messages not handed out, the last of them the claim's last; a cursor that moved on since
/// (another pop of the group) is left where it is. What the claim counted as delivered goes back
/// with it. Partitions moved back are announced; which they were.
///
/// The head's failure counts the claim reset stay reset.
pub async fn undo_auto_acked_claims(
    client: &impl GenericClient,
    group: &str,
    claims: &[(i64, i64, i64)],
) -> Result<Vec<i64>, StoreError> {
    let partition_ids: Vec<i64> = claims.iter().map(|c| c.0).collect();
    let firsts: Vec<i64> = claims.iter().map(|c| c.1).collect();
    let lasts: Vec<i64> = claims.iter().map(|c| c.2).collect();
    let rows = client
        .query(
            "UPDATE queen.log_consumers c
                SET committed = x.first - 1, total_consumed = c.total_consumed - (x.last - x.first + 1),
                    delivered_until = CASE WHEN c.delivered_until = x.last THEN x.first - 1
                                           ELSE c.delivered_until END
               FROM unnest($2::bigint[], $3::bigint[], $4::bigint[]) AS x(partition_id, first, last),
                    queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
              WHERE c.partition_id = x.partition_id AND c.consumer_group = $1 AND c.committed = x.last
                AND p.id = c.partition_id
          RETURNING q.id, p.id, q.name",
            &[&group, &partition_ids, &firsts, &lasts],
        )
        .await?;
    announce_available(client, &rows).await?;
    Ok(rows.iter().map(|row| row.get(1)).collect())
}

/// Announces the partitions of `rows` (queue id, partition id, queue name) as having messages.
async fn announce_available(client: &impl GenericClient, rows: &[tokio_postgres::Row]) -> Result<(), StoreError> {
    for row in rows {
        events::publish(
            client,
            &Event::Available { queue_id: row.get(0), partition_id: row.get(1), queue: row.get(2) },
        )
        .await?;
    }
    Ok(())
}

/// Result of extending a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseExtension {
    /// The lease now expires at this time, on this many partitions.
    Extended {
        expires_at: DateTime<Utc>,
        partitions: u64,
    },
    /// The lease exists but has expired or was released; it cannot be revived.
    Expired,
    Unknown,
}

/// Extends a live lease on every partition it covers, to `seconds` from now (when `None`, the
/// queue's lease time, at least 60 s: upstream's default, which the official clients' periodic
/// renewals, sent without seconds, are paced for); never shortens it. `partitions`, when the caller knows every partition the
/// lease was granted on, confines the statement to them (on a distributed cluster, to their
/// shards); otherwise every partition is searched by lease id. Like the claim that took the lease,
/// it commits without waiting for the WAL flush (or a synchronous standby): a crash that forgets
/// it only lets the lease end sooner, and its messages be delivered again.
pub async fn extend_lease(
    client: &impl GenericClient,
    lease_id: Uuid,
    partitions: Option<&[i64]>,
    seconds: Option<i32>,
) -> Result<LeaseExtension, StoreError> {
    macro_rules! extension {
        ($lease_holds:literal) => {
            concat!(
                "WITH extended AS (
                     UPDATE queen.log_consumers c
                        SET lease_expires_at = GREATEST(c.lease_expires_at,
                                                        now() + COALESCE($2, GREATEST(q.lease_time_seconds, 60)) * interval '1 second')
                       FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                      WHERE ",
                $lease_holds,
                " AND c.lease_expires_at > now() AND p.id = c.partition_id
                  RETURNING c.lease_expires_at)
                 SELECT (SELECT count(*) FROM extended), (SELECT min(lease_expires_at) FROM extended),
                        EXISTS (SELECT 1 FROM queen.log_consumers c WHERE ",
                $lease_holds,
                "),
                        set_config('synchronous_commit', 'off', true)"
            )
        };
    }
    let row = match partitions {
        Some(partitions) => {
            let statement = client.prepare_cached(extension!("c.partition_id = ANY($3) AND c.lease_id = $1")).await?;
            client.query_one(&statement, &[&lease_id, &seconds, &partitions]).await?
        }
        None => {
            let statement = client.prepare_cached(extension!("c.lease_id = $1")).await?;
            client.query_one(&statement, &[&lease_id, &seconds]).await?
        }
    };
    let extended: i64 = row.get(0);
    let expires_at: Option<DateTime<Utc>> = row.get(1);
    let known: bool = row.get(2);
    Ok(match expires_at {
        Some(expires_at) if extended > 0 => LeaseExtension::Extended { expires_at, partitions: extended as u64 },
        _ if known => LeaseExtension::Expired,
        _ => LeaseExtension::Unknown,
    })
}

/// Those of `leases` that are not live: unknown, expired or released. A transaction's
/// `requiredLeases` must all be live for it to commit. `partitions`, when the caller knows every
/// partition each lease was granted on (one list per lease, in order), confines the check to them.
pub async fn not_live_leases(
    client: &impl GenericClient,
    leases: &[Uuid],
    partitions: Option<&[Vec<i64>]>,
) -> Result<Vec<Uuid>, StoreError> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let rows = match partitions {
        Some(partitions) => {
            // One (lease, partition) pair per row; a lease is live when one of its pairs is.
            let (pair_leases, pair_partitions): (Vec<Uuid>, Vec<i64>) = leases
                .iter()
                .zip(partitions)
                .flat_map(|(lease, partitions)| partitions.iter().map(move |partition| (*lease, *partition)))
                .unzip();
            let statement = client
                .prepare_cached(
                    "SELECT l.lease_id FROM unnest($1::uuid[]) AS l(lease_id)
                      WHERE NOT EXISTS (
                          SELECT 1 FROM unnest($2::uuid[], $3::bigint[]) AS h(lease_id, partition_id)
                            JOIN queen.log_consumers c ON c.partition_id = h.partition_id AND c.lease_id = h.lease_id
                           WHERE h.lease_id = l.lease_id AND c.lease_expires_at > now())",
                )
                .await?;
            client.query(&statement, &[&leases, &pair_leases, &pair_partitions]).await?
        }
        None => {
            let statement = client
                .prepare_cached(
                    "SELECT l.lease_id FROM unnest($1::uuid[]) AS l(lease_id)
                      WHERE NOT EXISTS (SELECT 1 FROM queen.log_consumers c
                                         WHERE c.lease_id = l.lease_id AND c.lease_expires_at > now())",
                )
                .await?;
            client.query(&statement, &[&leases]).await?
        }
    };
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// One acknowledgement as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckRequest {
    pub partition_id: i64,
    /// Shared, like the group, with the answer that echoes it.
    pub transaction_id: Arc<str>,
    /// The offset the transaction id was delivered at under the ack's lease, when the broker knows
    /// it; otherwise the id is looked up.
    pub offset: Option<i64>,
    pub status: AckStatus,
    pub fence: LeaseFence,
    pub consumer_group: Arc<str>,
    pub error: Option<String>,
}

/// The verdict on one acknowledgement, with what the broker needs to report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckOutcome {
    pub verdict: AckVerdict,
    /// The group's cursor on the partition after the call.
    pub committed: Option<i64>,
    /// The queue of the partition, when the group has a cursor on it.
    pub queue: Option<String>,
}

/// What a batch of acknowledgement calls did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AckBatch {
    /// One list per call, aligned with that call's requests.
    pub outcomes: Vec<Vec<AckOutcome>>,
    /// Partitions on which a released lease left messages for other consumers to take.
    pub released: Vec<ReleasedWork>,
}

/// A partition where a released lease left messages for the group's other consumers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReleasedWork {
    pub queue_id: i64,
    pub partition_id: i64,
    pub queue: String,
}

type CursorKey = (i64, String);

/// A cursor's state through the calls of a batch.
struct CursorTrack {
    before: CursorState,
    now: CursorState,
    consumed: i64,
    lease_released: bool,
    dead_letters: Vec<DeadLetter>,
    /// The queue's retry delay, and whether a failed message is to be delivered again after it.
    retry_delay_ms: i32,
    failure_redelivered: bool,
}

/// Applies acknowledgement calls (each one request's acks) inside the caller's transaction (a
/// bundle's), one call after the other, with the rules of [`ack_rules`] ([`apply_rules`]): for
/// bundled acks when `bundled`, else as single acks are judged (a bundle sent again after its
/// first copy committed and ended its required leases, whose acks that copy applied under their
/// own lease are then no-ops, where bundled ones would be refused).
pub async fn acknowledge(
    tx: &deadpool_postgres::Transaction<'_>,
    calls: &[Vec<AckRequest>],
    keys: Option<&Cipher>,
    bundled: bool,
) -> Result<AckBatch, StoreError> {
    apply_rules(tx, calls, keys, bundled).await
}

/// A batch of acknowledgement calls that failed, with what it committed before it failed: the
/// first of [`acknowledge_batch`]'s two commits may have gone through.
#[derive(Debug)]
pub struct AckBatchFailure {
    pub error: StoreError,
    /// Per call, per request: the outcome of an ack that was committed, `None` for one left
    /// undone.
    pub committed: Vec<Vec<Option<AckOutcome>>>,
    /// Partitions on which a committed ack released a lease and left messages.
    pub released: Vec<ReleasedWork>,
}

impl AckBatchFailure {
    /// `calls` failed before anything of theirs was committed.
    pub fn nothing_committed(calls: &[Vec<AckRequest>], error: StoreError) -> Self {
        Self { error, committed: calls.iter().map(|call| vec![None; call.len()]).collect(), released: Vec::new() }
    }
}

/// Applies acknowledgement calls on a connection of their own: first the acks that complete what
/// their lease delivered, in one statement without a transaction around it
/// ([`crate::completed_spans`]); then the rest by [`apply_rules`] in a transaction of its own,
/// so neither holds cursor locks while the other takes its own. When the second fails, the
/// failure carries what the first committed, so that those acks can still be answered as
/// committed and the leases they released announced.
///
/// Each of the two waits at most `answer_within` for PostgreSQL's answer (a commit waits for as
/// long as a synchronous standby is silent); past it, the failure is
/// [`StoreError::Unanswered`], and the connection must be discarded
/// ([`crate::pool::discard`]).
pub async fn acknowledge_batch(
    client: &mut deadpool_postgres::Object,
    calls: &[Vec<AckRequest>],
    keys: Option<&Cipher>,
    answer_within: Duration,
) -> Result<AckBatch, AckBatchFailure> {
    let unanswered = || StoreError::unanswered("an ack commit", answer_within);
    let completed = match tokio::time::timeout(answer_within, completed_spans::commit(&*client, calls)).await {
        Ok(completed) => {
            completed.map_err(|error| AckBatchFailure::nothing_committed(calls, error.of_commit("an ack commit")))?
        }
        Err(_) => return Err(AckBatchFailure::nothing_committed(calls, unanswered())),
    };
    let (rest, places) = undecided(calls, &completed);
    let by_rules = if rest.iter().all(Vec::is_empty) {
        AckBatch { outcomes: rest.iter().map(|_| Vec::new()).collect(), ..AckBatch::default() }
    } else {
        let ruled = tokio::time::timeout(answer_within, rules_transaction(client, &rest, keys)).await;
        match ruled.unwrap_or_else(|_| Err(unanswered())) {
            Ok(by_rules) => by_rules,
            Err(error) => {
                return Err(AckBatchFailure { error, committed: completed.outcomes, released: completed.released });
            }
        }
    };
    Ok(merge(completed, by_rules, &places))
}

async fn rules_transaction(
    client: &mut deadpool_postgres::Object,
    calls: &[Vec<AckRequest>],
    keys: Option<&Cipher>,
) -> Result<AckBatch, StoreError> {
    let tx = client.transaction().await?;
    let by_rules = apply_rules(&tx, calls, keys, false).await?;
    tx.commit().await.map_err(|e| StoreError::from(e).of_commit("an ack commit"))?;
    Ok(by_rules)
}

/// The requests the one-statement path left, call by call, with where each stands in its call.
fn undecided(
    calls: &[Vec<AckRequest>],
    completed: &completed_spans::Completed,
) -> (Vec<Vec<AckRequest>>, Vec<Vec<usize>>) {
    calls
        .iter()
        .zip(&completed.outcomes)
        .map(|(call, decided)| {
            call.iter()
                .zip(decided)
                .enumerate()
                .filter(|(_, (_, outcome))| outcome.is_none())
                .map(|(i, (r, _))| (r.clone(), i))
                .unzip()
        })
        .unzip()
}

fn merge(completed: completed_spans::Completed, by_rules: AckBatch, places: &[Vec<usize>]) -> AckBatch {
    let mut outcomes = completed.outcomes;
    for ((call, ruled), places) in outcomes.iter_mut().zip(by_rules.outcomes).zip(places) {
        for (outcome, &place) in ruled.into_iter().zip(places) {
            call[place] = Some(outcome);
        }
    }
    let mut released = completed.released;
    released.extend(by_rules.released);
    released.sort();
    released.dedup();
    let outcomes = outcomes
        .into_iter()
        .map(|call| {
            call.into_iter()
                .map(|o| o.unwrap_or(AckOutcome { verdict: AckVerdict::Noop, committed: None, queue: None }))
                .collect()
        })
        .collect();
    AckBatch { outcomes, released }
}

/// Applies the calls with the rules of [`ack_rules`]: transaction ids whose offsets are not known
/// are resolved, the cursors involved are locked in a fixed order (so concurrent batches cannot
/// deadlock), each call's acks of one cursor are applied together, the cursors are written once,
/// and dead letters are copied into `queen.log_dlq` (read from their segments with `keys`).
/// `bundled`: the calls are a transaction's ([`ack_rules::AckItem::bundled`]).
async fn apply_rules(
    tx: &deadpool_postgres::Transaction<'_>,
    calls: &[Vec<AckRequest>],
    keys: Option<&Cipher>,
    bundled: bool,
) -> Result<AckBatch, StoreError> {
    let requests: Vec<&AckRequest> = calls.iter().flatten().collect();
    if requests.is_empty() {
        return Ok(AckBatch { outcomes: calls.iter().map(|_| Vec::new()).collect(), ..AckBatch::default() });
    }
    let partition_ids: Vec<i64> = requests.iter().map(|r| r.partition_id).collect();
    let groups: Vec<&str> = requests.iter().map(|r| &*r.consumer_group).collect();
    // Only the transaction ids whose offsets the broker does not know are looked up.
    let unknown: Vec<&AckRequest> = requests.iter().copied().filter(|r| r.offset.is_none()).collect();
    let unknown_partitions: Vec<i64> = unknown.iter().map(|r| r.partition_id).collect();
    let transaction_ids: Vec<&str> = unknown.iter().map(|r| &*r.transaction_id).collect();

    let resolve = tx
        .prepare_cached(
            // A primary-key probe per acknowledged message (LATERAL ... LIMIT 1 cannot become a
            // hash join over the whole table, which the planner picks for larger batches).
            "SELECT m.message_offset, m.earlier_offsets
               FROM unnest($1::bigint[], $2::text[]) WITH ORDINALITY AS x(partition_id, transaction_id, ord)
               LEFT JOIN LATERAL (SELECT message_offset, earlier_offsets FROM queen.log_message_ids
                                   WHERE partition_id = x.partition_id AND transaction_id = x.transaction_id LIMIT 1) m ON true
              ORDER BY x.ord",
        )
        .await?;
    let lock = tx
        .prepare_cached(
            "SELECT c.partition_id, c.consumer_group, c.committed, c.lease_id, c.lease_expires_at > now(),
                    c.leased_until, c.retry_count, c.head_attempts, q.retry_limit, q.name, p.last_offset, q.id,
                    q.retry_delay_ms, q.dead_letter_queue AND q.dlq_after_max_retries,
                    GREATEST(c.delivered_until, c.committed)
               FROM queen.log_consumers c
               JOIN queen.partitions p ON p.id = c.partition_id
               JOIN queen.queues q ON q.id = p.queue_id
              WHERE (c.partition_id, c.consumer_group) IN (SELECT * FROM unnest($1::bigint[], $2::text[]))
              ORDER BY c.partition_id, c.consumer_group
                FOR UPDATE OF c",
        )
        .await?;
    // Pipelined: both go out before either answer is awaited.
    let resolve_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&unknown_partitions, &transaction_ids];
    let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&partition_ids, &groups];
    let resolving = async {
        match unknown.is_empty() {
            true => Ok(Vec::new()),
            false => tx.query(&resolve, &resolve_params).await,
        }
    };
    let (looked_up, cursors) = futures::try_join!(resolving, tx.query(&lock, &lock_params))?;
    let cursor_at: HashMap<(i64, &str), i64> =
        cursors.iter().map(|row| ((row.get::<_, i64>(0), row.get::<_, &str>(1)), row.get::<_, i64>(2))).collect();
    let mut looked_up = looked_up.iter();
    let offsets: Vec<Option<i64>> = requests
        .iter()
        .map(|r| {
            r.offset.or_else(|| {
                let row = looked_up.next()?;
                let cursor = cursor_at.get(&(r.partition_id, &*r.consumer_group)).copied();
                unconsumed_occurrence(row.get(0), row.get(1), cursor)
            })
        })
        .collect();
    // What a dead letter whose segment is gone can still say about its message.
    let resolved: HashMap<(i64, i64), &str> = requests
        .iter()
        .zip(&offsets)
        .filter_map(|(request, offset)| Some(((request.partition_id, (*offset)?), &*request.transaction_id)))
        .collect();
    // Per partition: its queue's id and name, and its last offset.
    let partition_heads: HashMap<i64, (i64, String, i64)> =
        cursors.iter().map(|row| (row.get(0), (row.get(11), row.get(9), row.get(10)))).collect();
    let mut tracks: HashMap<CursorKey, CursorTrack> = cursors
        .iter()
        .map(|row| {
            let key = (row.get::<_, i64>(0), row.get::<_, String>(1));
            let state = CursorState {
                committed: row.get(2),
                lease_id: row.get(3),
                lease_live: row.get::<_, Option<bool>>(4).unwrap_or(false),
                leased_until: row.get(5),
                delivered_until: row.get(14),
                retry_count: row.get(6),
                head_attempts: row.get(7),
                retry_limit: row.get(8),
                dead_letter_exhausted: row.get(13),
            };
            let track = CursorTrack {
                before: state.clone(),
                now: state,
                consumed: 0,
                lease_released: false,
                dead_letters: Vec::new(),
                retry_delay_ms: row.get(12),
                failure_redelivered: false,
            };
            (key, track)
        })
        .collect();

    let mut outcomes = Vec::with_capacity(calls.len());
    let mut first = 0;
    for call in calls {
        let call_offsets = &offsets[first..first + call.len()];
        first += call.len();
        outcomes.push(apply_call(call, call_offsets, &mut tracks, &partition_heads, bundled));
    }

    let changed: Vec<(&CursorKey, &CursorTrack)> = tracks.iter().filter(|(_, t)| t.now != t.before).collect();
    write_cursor_changes(tx, &changed).await?;
    let dead: Vec<(&CursorKey, &DeadLetter)> =
        changed.iter().flat_map(|(key, track)| track.dead_letters.iter().map(move |d| (*key, d))).collect();
    insert_dead_letters(tx, &dead, &resolved, keys).await?;
    // A released lease over pending messages makes them available to the group's other
    // consumers, on any broker: the caller announces them once the batch committed, as a push is.
    let mut released: Vec<ReleasedWork> = changed
        .iter()
        .filter(|(_, track)| track.lease_released)
        .filter_map(|((partition_id, _), track)| {
            let (queue_id, queue, last_offset) = partition_heads.get(partition_id)?;
            (track.now.committed < *last_offset).then(|| ReleasedWork {
                queue_id: *queue_id,
                partition_id: *partition_id,
                queue: queue.clone(),
            })
        })
        .collect();
    released.sort();
    released.dedup();
    Ok(AckBatch { outcomes, released })
}

/// Which of the messages stored under one transaction id an ack naming it means: the earliest
/// past the group's cursor (`committed`), as the broker that delivered it would say. An id
/// holds several only when it was pushed again after its queue's dedup window (`earlier`, the
/// offsets it was stored at before `latest`); an ack of the later copy would commit the messages
/// between the two, unprocessed. With none past the cursor, or no cursor, the latest.
fn unconsumed_occurrence(latest: Option<i64>, earlier: Option<Vec<i64>>, committed: Option<i64>) -> Option<i64> {
    let latest = latest?;
    let (Some(earlier), Some(committed)) = (earlier, committed) else { return Some(latest) };
    Some(earlier.into_iter().filter(|&offset| offset > committed).min().map_or(latest, |offset| offset.min(latest)))
}

/// One call's acks against the cursors as the earlier calls of the batch left them.
fn apply_call(
    call: &[AckRequest],
    offsets: &[Option<i64>],
    tracks: &mut HashMap<CursorKey, CursorTrack>,
    partition_heads: &HashMap<i64, (i64, String, i64)>,
    bundled: bool,
) -> Vec<AckOutcome> {
    let queue_of = |partition_id: i64| partition_heads.get(&partition_id).map(|(_, queue, _)| queue.clone());
    let mut outcomes: Vec<Option<AckOutcome>> = vec![None; call.len()];
    let mut per_cursor: HashMap<CursorKey, Vec<usize>> = HashMap::new();
    for (i, request) in call.iter().enumerate() {
        let key = (request.partition_id, request.consumer_group.to_string());
        let committed = tracks.get(&key).map(|t| t.now.committed);
        let refusal = match (offsets[i], committed) {
            (None, _) => Refusal::Unresolvable,
            (Some(_), None) => Refusal::NoCursor,
            (Some(_), Some(_)) => {
                per_cursor.entry(key).or_default().push(i);
                continue;
            }
        };
        let queue = queue_of(request.partition_id);
        outcomes[i] = Some(AckOutcome { verdict: AckVerdict::Refused(refusal), committed, queue });
    }
    for (key, indices) in per_cursor {
        // Grouped above only when the cursor exists and the offset resolved.
        let Some(track) = tracks.get_mut(&key) else { continue };
        let items: Vec<AckItem<'_>> = indices
            .iter()
            .map(|&i| AckItem {
                offset: offsets[i].unwrap_or_default(),
                status: call[i].status,
                fence: &call[i].fence,
                error: call[i].error.as_deref(),
                bundled,
            })
            .collect();
        let (change, verdicts) = ack_rules::apply(&track.now, &items);
        for (&i, verdict) in indices.iter().zip(verdicts) {
            let queue = queue_of(call[i].partition_id);
            outcomes[i] = Some(AckOutcome { verdict, committed: Some(change.after.committed), queue });
        }
        track.now = change.after;
        track.consumed += change.consumed;
        track.lease_released |= change.lease_released;
        track.failure_redelivered |= change.failure_redelivered;
        track.dead_letters.extend(change.dead_letters);
    }
    // Every request got an outcome: refused up front, or from its cursor's rules.
    outcomes
        .into_iter()
        .map(|o| o.unwrap_or(AckOutcome { verdict: AckVerdict::Noop, committed: None, queue: None }))
        .collect()
}

async fn write_cursor_changes(
    tx: &deadpool_postgres::Transaction<'_>,
    changed: &[(&CursorKey, &CursorTrack)],
) -> Result<(), StoreError> {
    if changed.is_empty() {
        return Ok(());
    }
    let statement = tx
        .prepare_cached(
            "UPDATE queen.log_consumers c
                SET committed = u.committed,
                    lease_expires_at = CASE WHEN u.release THEN NULL ELSE c.lease_expires_at END,
                    retry_count = u.retry_count,
                    head_attempts = u.head_attempts,
                    head_expiries = CASE WHEN u.committed = c.committed THEN c.head_expiries ELSE 0 END,
                    total_consumed = c.total_consumed + u.consumed,
                    last_consumed_at = CASE WHEN u.consumed > 0 THEN now() ELSE c.last_consumed_at END,
                    retry_at = CASE WHEN u.retry_delay_ms > 0 THEN now() + u.retry_delay_ms * interval '1 millisecond'
                                    ELSE c.retry_at END
               FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bool[], $5::int[], $6::int[], $7::bigint[],
                           $8::int[])
                    AS u(partition_id, consumer_group, committed, release, retry_count, head_attempts, consumed,
                         retry_delay_ms)
              WHERE c.partition_id = u.partition_id AND c.consumer_group = u.consumer_group",
        )
        .await?;
    let partition_ids: Vec<i64> = changed.iter().map(|((p, _), _)| *p).collect();
    let groups: Vec<&str> = changed.iter().map(|((_, g), _)| g.as_str()).collect();
    let committed: Vec<i64> = changed.iter().map(|(_, t)| t.now.committed).collect();
    let release: Vec<bool> = changed.iter().map(|(_, t)| t.lease_released).collect();
    let retry_counts: Vec<i32> = changed.iter().map(|(_, t)| t.now.retry_count).collect();
    let head_attempts: Vec<i32> = changed.iter().map(|(_, t)| t.now.head_attempts).collect();
    let consumed: Vec<i64> = changed.iter().map(|(_, t)| t.consumed).collect();
    // The partition is not served to the group again before the queue's retry delay is over.
    let retry_delays: Vec<i32> =
        changed.iter().map(|(_, t)| if t.failure_redelivered { t.retry_delay_ms } else { 0 }).collect();
    tx.execute(
        &statement,
        &[&partition_ids, &groups, &committed, &release, &retry_counts, &head_attempts, &consumed, &retry_delays],
    )
    .await?;
    Ok(())
}

/// What a dead letter says in place of a payload that retention removed before it was copied.
pub const PAYLOAD_RETAINED: &str = "payload unavailable (retained)";

/// Copies messages into `queen.log_dlq`, each with its group, error and retry count, in one
/// statement. Runs of consecutive offsets are read from their segments once; the payload of a
/// sealed segment is sealed again on its own. A message whose segment retention already removed
/// (the trim committed while the message was being given up on) is recorded all the same, with
/// what is still known of it (its transaction id from `resolved`, when the caller had it), no
/// payload, and [`PAYLOAD_RETAINED`] in its error.
async fn insert_dead_letters(
    tx: &deadpool_postgres::Transaction<'_>,
    dead: &[(&CursorKey, &DeadLetter)],
    resolved: &HashMap<(i64, i64), &str>,
    keys: Option<&Cipher>,
) -> Result<(), StoreError> {
    if dead.is_empty() {
        return Ok(());
    }
    let mut wanted: HashMap<(i64, i64), Vec<usize>> = HashMap::new();
    for (i, ((partition_id, _), letter)) in dead.iter().enumerate() {
        wanted.entry((*partition_id, letter.offset)).or_default().push(i);
    }
    let mut offsets: Vec<(i64, i64)> = wanted.keys().copied().collect();
    offsets.sort_unstable();
    let mut spans: Vec<Span> = Vec::new();
    for (partition_id, offset) in offsets {
        match spans.last_mut() {
            Some(span) if span.partition_id == partition_id && span.last + 1 == offset => span.last = offset,
            _ => spans.push(Span { partition_id, first: offset, last: offset }),
        }
    }
    let segments = read_spans(tx, &spans, keys).await?;
    let mut rows = DeadLetterRows::default();
    for segment in &segments {
        for (index, frame) in segment.frames.frames().enumerate() {
            let key = (segment.partition_id, segment.base_offset + index as i64);
            let Some(letters) = wanted.remove(&key) else { continue };
            let frame = frame.map_err(|source| StoreError::CorruptSegment {
                partition_id: segment.partition_id,
                base_offset: segment.base_offset,
                source,
            })?;
            let payload = match (segment.sealed, keys) {
                (true, Some(cipher)) => Cow::Owned(cipher.seal(frame.payload)?),
                _ => Cow::Borrowed(frame.payload),
            };
            for i in letters {
                let ((partition_id, group), letter) = dead[i];
                rows.partition_ids.push(*partition_id);
                rows.groups.push(group);
                rows.offsets.push(letter.offset);
                rows.message_ids.push(Some(frame.message_id));
                rows.transaction_ids.push(Some(frame.transaction_id));
                rows.trace_ids.push(frame.trace_id);
                rows.producers.push(frame.producer);
                rows.payloads.push(Some(payload.clone()));
                rows.errors.push(letter.error.as_deref().map(Cow::Borrowed));
                rows.retry_counts.push(letter.retry_count);
                rows.created_at.push(Some(segment.created_at));
            }
        }
    }
    for i in wanted.into_values().flatten() {
        let ((partition_id, group), letter) = dead[i];
        tracing::warn!(partition_id, offset = letter.offset, group, "dead-lettered a message retention removed");
        let error = match &letter.error {
            Some(error) => format!("{error}; {PAYLOAD_RETAINED}"),
            None => PAYLOAD_RETAINED.to_owned(),
        };
        rows.partition_ids.push(*partition_id);
        rows.groups.push(group);
        rows.offsets.push(letter.offset);
        rows.message_ids.push(None);
        rows.transaction_ids.push(resolved.get(&(*partition_id, letter.offset)).copied());
        rows.trace_ids.push(None);
        rows.producers.push(None);
        rows.payloads.push(None);
        rows.errors.push(Some(Cow::Owned(error)));
        rows.retry_counts.push(letter.retry_count);
        rows.created_at.push(None);
    }
    let statement = tx
        .prepare_cached(
            "INSERT INTO queen.log_dlq (queue_name, partition_id, partition_name, consumer_group, message_offset,
                                        message_id, transaction_id, trace_id, payload, error_message, retry_count,
                                        message_created_at, producer_sub)
             SELECT q.name, p.id, p.name, d.consumer_group, d.message_offset, d.message_id, d.transaction_id,
                    d.trace_id, d.payload, d.error_message, d.retry_count, d.message_created_at, d.producer_sub
               FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::uuid[], $5::text[], $6::uuid[], $7::bytea[],
                           $8::text[], $9::int[], $10::timestamptz[], $11::text[])
                    AS d(partition_id, consumer_group, message_offset, message_id, transaction_id, trace_id, payload,
                         error_message, retry_count, message_created_at, producer_sub)
               JOIN queen.partitions p ON p.id = d.partition_id
               JOIN queen.queues q ON q.id = p.queue_id",
        )
        .await?;
    tx.execute(
        &statement,
        &[
            &rows.partition_ids,
            &rows.groups,
            &rows.offsets,
            &rows.message_ids,
            &rows.transaction_ids,
            &rows.trace_ids,
            &rows.payloads,
            &rows.errors,
            &rows.retry_counts,
            &rows.created_at,
            &rows.producers,
        ],
    )
    .await?;
    Ok(())
}

/// The columns of dead letters to insert, one vector each.
#[derive(Default)]
struct DeadLetterRows<'a> {
    partition_ids: Vec<i64>,
    groups: Vec<&'a str>,
    offsets: Vec<i64>,
    message_ids: Vec<Option<Uuid>>,
    transaction_ids: Vec<Option<&'a str>>,
    trace_ids: Vec<Option<Uuid>>,
    producers: Vec<Option<&'a str>>,
    payloads: Vec<Option<Cow<'a, [u8]>>>,
    errors: Vec<Option<Cow<'a, str>>>,
    retry_counts: Vec<i32>,
    created_at: Vec<Option<DateTime<Utc>>>,
}
