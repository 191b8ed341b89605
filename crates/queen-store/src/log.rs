//! The segment log: appending a batch as one segment, and reading offsets back.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use queen_log::{Cipher, DecodeError, DecodedSegment, EncodedSegment, Frame, SegmentBuilder};
use uuid::Uuid;

use crate::StoreError;

/// Upper bound on the decompressed size of one stored segment, so a corrupt row cannot make a
/// reader allocate without limit.
pub const MAX_SEGMENT_RAW_BYTES: usize = 256 * 1024 * 1024;

/// One message to append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    pub message_id: Uuid,
    pub transaction_id: String,
    pub trace_id: Option<Uuid>,
    /// Who pushed it (`producerSub`): the token's subject when auth is on.
    pub producer: Option<String>,
    /// The message's data as JSON text.
    pub payload: Vec<u8>,
    /// Its frame in a segment its producer compressed (a frames group of a binary push), when it
    /// is exactly that frame: such frames carry no trace id and no producer.
    pub received: Option<ReceivedFrame>,
}

/// A message's place in frames its producer framed and compressed as they are stored: one zstd
/// frame declaring its size, checked to hold exactly `frame_count` valid frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedFrame {
    pub segment: Arc<EncodedSegment>,
    /// The message is the segment's frame at this index.
    pub index: usize,
}

/// The segment its producer compressed that `messages` are, whole and in order, when they are:
/// appended whole, it can be stored as received, without compressing anything again.
pub fn received_whole(messages: &[NewMessage]) -> Option<&Arc<EncodedSegment>> {
    let segment = &messages.first()?.received.as_ref()?.segment;
    let whole = messages.len() == segment.frame_count
        && messages.iter().enumerate().all(|(index, message)| {
            message.trace_id.is_none()
                && message.producer.is_none()
                && message.received.as_ref().is_some_and(|r| r.index == index && Arc::ptr_eq(&r.segment, segment))
        });
    whole.then_some(segment)
}

/// The partition an append writes to, and the queue it belongs to (named in the append's notice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Destination<'a> {
    pub queue_id: i64,
    pub queue: &'a str,
    pub partition_id: i64,
}

/// What became of one message of an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    Queued {
        offset: i64,
        message_id: Uuid,
    },
    /// The partition already holds this transaction id; nothing was written for it.
    Duplicate {
        offset: i64,
        message_id: Uuid,
    },
}

/// How many of an append's messages it stored (`outcomes` in the order of `messages`), and
/// their payload bytes: the duplicates wrote nothing.
pub fn stored(messages: &[NewMessage], outcomes: &[Appended]) -> (u64, u64) {
    let queued = messages.iter().zip(outcomes).filter(|(_, outcome)| matches!(outcome, Appended::Queued { .. }));
    queued.fold((0, 0), |(count, bytes), (message, _)| (count + 1, bytes + message.payload.len() as u64))
}

/// The segment an append wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentWritten {
    pub base_offset: i64,
    pub end_offset: i64,
    pub created_at: DateTime<Utc>,
    pub raw_len: usize,
    pub stored_len: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendResult {
    /// One outcome per message, in input order.
    pub outcomes: Vec<Appended>,
    /// `None` when every message was a duplicate.
    pub segment: Option<SegmentWritten>,
}

/// How a queue's appends treat what they write.
#[derive(Debug, Clone, Default)]
pub struct AppendPolicy {
    /// A stored transaction id older than this many seconds is no longer a duplicate: its index
    /// entry passes to the new message. 0 = an id is a duplicate as long as its message is stored.
    pub dedup_window_seconds: i32,
    /// Seals each segment body (after compression) with this key: the queue is encrypted.
    pub seal: Option<Arc<Cipher>>,
}

/// Stored bytes (a segment body, a dead letter's payload) as they were before sealing: opened
/// when they are sealed, whatever the queue's setting is now.
pub fn opened<'a>(bytes: &'a [u8], keys: Option<&Cipher>) -> Result<Cow<'a, [u8]>, DecodeError> {
    if !queen_log::is_sealed(bytes) {
        return Ok(Cow::Borrowed(bytes));
    }
    let cipher =
        keys.ok_or_else(|| DecodeError::Unseal("it is encrypted, and this broker has no encryption key".into()))?;
    cipher.open(bytes).map(Cow::Owned)
}

/// What the partition already holds of a batch's transaction ids.
#[derive(Default)]
struct StoredIds {
    /// The stored (offset, message id) of the ids that still count as duplicates.
    duplicates: HashMap<String, (i64, Uuid)>,
    /// Every offset an id released from its dedup window was stored at, oldest first: its new
    /// index row keeps them (`earlier_offsets`), for acks that name the id.
    released: HashMap<String, Vec<i64>>,
}

/// The stored ids of `messages` ([`StoredIds`]). Ids stored longer ago than the policy's dedup
/// window are released first: their index entries are deleted (guarded by offset, so an entry
/// that a concurrent append just gave to a new message stays), and the ids count as new; unless
/// the stored message is the very message being written (its message id: a push buffered during
/// maintenance and replayed again after the window), which stays a duplicate.
async fn duplicates_of(
    client: &impl GenericClient,
    partition_id: i64,
    messages: &[NewMessage],
    policy: &AppendPolicy,
) -> Result<StoredIds, StoreError> {
    let transaction_ids: Vec<&str> = messages.iter().map(|m| m.transaction_id.as_str()).collect();
    // One primary-key probe per id, whatever the table's statistics say: a plan cached while the
    // table was small would otherwise scan it whole for every push. The age of an id (its
    // segment's) is looked up only under a dedup window, in a statement of its own: a parameter
    // that switches the lookup off would make PostgreSQL plan the statement anew at every call.
    let rows = if policy.dedup_window_seconds > 0 {
        let statement = client
            .prepare_cached(
                "SELECT t.transaction_id, m.message_offset, m.message_id,
                        (SELECT s.created_at FROM queen.log_segments s
                          WHERE s.partition_id = $1 AND s.base_offset <= m.message_offset
                          ORDER BY s.base_offset DESC LIMIT 1) < now() - $3::int * interval '1 second'
                   FROM unnest($2::text[]) AS t(transaction_id)
                  CROSS JOIN LATERAL (SELECT message_offset, message_id FROM queen.log_message_ids
                                       WHERE partition_id = $1 AND transaction_id = t.transaction_id LIMIT 1) m",
            )
            .await?;
        client.query(&statement, &[&partition_id, &transaction_ids, &policy.dedup_window_seconds]).await?
    } else {
        let statement = client
            .prepare_cached(
                "SELECT t.transaction_id, m.message_offset, m.message_id, false
                   FROM unnest($2::text[]) AS t(transaction_id)
                  CROSS JOIN LATERAL (SELECT message_offset, message_id FROM queen.log_message_ids
                                       WHERE partition_id = $1 AND transaction_id = t.transaction_id LIMIT 1) m",
            )
            .await?;
        client.query(&statement, &[&partition_id, &transaction_ids]).await?
    };
    let mut duplicates = HashMap::with_capacity(rows.len());
    let (mut stale_ids, mut stale_offsets): (Vec<String>, Vec<i64>) = (Vec::new(), Vec::new());
    // The message each id would be written as (its first in the batch).
    let mut sent: HashMap<&str, Uuid> = HashMap::new();
    if policy.dedup_window_seconds > 0 {
        for message in messages {
            sent.entry(&message.transaction_id).or_insert(message.message_id);
        }
    }
    for row in &rows {
        let (transaction_id, offset, message_id): (String, i64, Uuid) = (row.get(0), row.get(1), row.get(2));
        let stale = row.get::<_, Option<bool>>(3) == Some(true);
        if stale && sent.get(transaction_id.as_str()) != Some(&message_id) {
            stale_ids.push(transaction_id);
            stale_offsets.push(offset);
        } else {
            duplicates.insert(transaction_id, (offset, message_id));
        }
    }
    let mut released = HashMap::new();
    if !stale_ids.is_empty() {
        let statement = client
            .prepare_cached(
                // Earlier offsets retention removed are let go.
                "DELETE FROM queen.log_message_ids m
                  USING queen.partitions p
                  WHERE m.partition_id = $1 AND p.id = $1
                    AND (m.transaction_id, m.message_offset) IN (SELECT * FROM unnest($2::text[], $3::bigint[]))
              RETURNING m.transaction_id, m.message_offset,
                        ARRAY(SELECT o FROM unnest(m.earlier_offsets) AS o WHERE o >= p.retained_from)",
            )
            .await?;
        for row in client.query(&statement, &[&partition_id, &stale_ids, &stale_offsets]).await? {
            let mut offsets: Vec<i64> = row.get(2);
            offsets.push(row.get(1));
            released.insert(row.get(0), offsets);
        }
    }
    Ok(StoredIds { duplicates, released })
}

/// A batch split into what must be written and what is a duplicate, with the new messages
/// already encoded and compressed (outside any lock).
struct AppendPlan {
    slots: Vec<Slot>,
    fresh_transaction_ids: Vec<String>,
    fresh_message_ids: Vec<Uuid>,
    /// The offsets fresh ids released from their dedup window were stored at before, as
    /// (transaction id, offset) pairs.
    earlier: (Vec<String>, Vec<i64>),
    segment: Option<EncodedSegment>,
}

/// Where one input message of a batch stands.
enum Slot {
    /// The `n`th message to write.
    Fresh(usize),
    /// Repeats the transaction id of the `n`th message to write; the first occurrence wins.
    RepeatOf(usize),
    /// The partition already holds it.
    Stored(Appended),
}

fn plan_append(messages: &[NewMessage], stored: &StoredIds, seal: Option<&Cipher>) -> Result<AppendPlan, StoreError> {
    let existing = &stored.duplicates;
    let mut slots = Vec::with_capacity(messages.len());
    let mut first_in_batch: HashMap<&str, usize> = HashMap::new();
    let mut fresh: Vec<&NewMessage> = Vec::new();
    for message in messages {
        if let Some(&(offset, message_id)) = existing.get(&message.transaction_id) {
            slots.push(Slot::Stored(Appended::Duplicate { offset, message_id }));
        } else if let Some(&index) = first_in_batch.get(message.transaction_id.as_str()) {
            slots.push(Slot::RepeatOf(index));
        } else {
            first_in_batch.insert(&message.transaction_id, fresh.len());
            slots.push(Slot::Fresh(fresh.len()));
            fresh.push(message);
        }
    }
    // Every message is written, as its producer framed and compressed them: the bytes are stored
    // as received (sealed after, as any segment).
    let as_received = received_whole(messages).filter(|_| fresh.len() == messages.len());
    let segment = match (fresh.is_empty(), as_received) {
        (true, _) => None,
        (false, Some(received)) => Some(EncodedSegment::clone(received)),
        (false, None) => {
            let mut builder = SegmentBuilder::new();
            for message in &fresh {
                builder.push(&Frame {
                    message_id: message.message_id,
                    trace_id: message.trace_id,
                    transaction_id: &message.transaction_id,
                    producer: message.producer.as_deref(),
                    payload: &message.payload,
                })?;
            }
            Some(builder.finish()?)
        }
    };
    let segment = match (segment, seal) {
        (Some(mut segment), Some(cipher)) => {
            segment.body = cipher.seal(&segment.body)?;
            Some(segment)
        }
        (segment, _) => segment,
    };
    let earlier = fresh
        .iter()
        .filter_map(|m| Some((&m.transaction_id, stored.released.get(&m.transaction_id)?)))
        .flat_map(|(id, offsets)| offsets.iter().map(move |&offset| (id.clone(), offset)))
        .unzip();
    Ok(AppendPlan {
        slots,
        fresh_transaction_ids: fresh.iter().map(|m| m.transaction_id.clone()).collect(),
        fresh_message_ids: fresh.iter().map(|m| m.message_id).collect(),
        earlier,
        segment,
    })
}

/// Appends the messages to the partition as one segment, in one statement: the partition row is
/// locked, the next offsets are taken from `last_offset`, the segment and its transaction ids
/// are inserted, and `last_offset` advances, all in one commit. Messages whose transaction id
/// the partition already holds (or that repeat one earlier in the batch) are not written and come
/// back as [`Appended::Duplicate`] with the original offset and message id.
///
/// The first attempt assumes that no transaction id is stored yet, which is what almost every
/// push finds, and writes without looking: the unique index on `(partition_id, transaction_id)`
/// refuses the statement whole (it runs outside a transaction, so nothing of it stays, not even
/// the offsets it took) when one is. Then the append looks the ids up and is planned again, in a
/// transaction with its write, so that ids released from their dedup window are released only
/// with the write that carries their earlier offsets; and again when a concurrent append of the
/// same id from another broker races that lookup. The caller announces the partition once the
/// append committed ([`crate::events::publish_after_commit`]).
pub async fn append(
    client: &impl GenericClient,
    destination: Destination<'_>,
    messages: &[NewMessage],
    policy: &AppendPolicy,
) -> Result<AppendResult, StoreError> {
    let seal = policy.seal.as_deref();
    let plan = plan_append(messages, &StoredIds::default(), seal)?;
    match write_plan(client, destination, &plan).await {
        Err(StoreError::Db(e)) if is_unique_violation(&e) => {}
        result => return result.map(|segment| finish(plan, segment)).map_err(|e| e.of_commit("an append")),
    }
    let mut attempts = 1;
    loop {
        attempts += 1;
        client.batch_execute("BEGIN").await?;
        let written = async {
            let stored = duplicates_of(client, destination.partition_id, messages, policy).await?;
            let plan = plan_append(messages, &stored, seal)?;
            let segment = write_plan(client, destination, &plan).await?;
            Ok::<_, StoreError>(finish(plan, segment))
        }
        .await;
        match written {
            Ok(result) => {
                client
                    .batch_execute("COMMIT")
                    .await
                    .map_err(|e| StoreError::from(e).of_commit("an append's commit"))?;
                return Ok(result);
            }
            Err(e) => {
                client.batch_execute("ROLLBACK").await?;
                match e {
                    StoreError::Db(e) if attempts < 4 && is_unique_violation(&e) => continue,
                    e => return Err(e),
                }
            }
        }
    }
}

fn is_unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
}

/// [`append`] inside a transaction the caller owns: the partition row is locked first, so the
/// duplicate check cannot race, at the price of compressing under the lock. The lock is the one
/// the append's own update takes (`FOR NO KEY UPDATE`), which leaves the row's key-share locks
/// alone: a cursor created on the partition meanwhile (its foreign key takes one) neither waits
/// for the transaction nor, when it creates cursors on several partitions the transaction appends
/// to, deadlocks with it.
pub async fn append_in_transaction(
    tx: &deadpool_postgres::Transaction<'_>,
    destination: Destination<'_>,
    messages: &[NewMessage],
    policy: &AppendPolicy,
) -> Result<AppendResult, StoreError> {
    let partition_id = destination.partition_id;
    let locked =
        tx.query_opt("SELECT 1 FROM queen.partitions WHERE id = $1 FOR NO KEY UPDATE", &[&partition_id]).await?;
    if locked.is_none() {
        return Err(StoreError::Missing("partition"));
    }
    let stored = duplicates_of(tx, partition_id, messages, policy).await?;
    let plan = plan_append(messages, &stored, policy.seal.as_deref())?;
    let segment = write_plan(tx, destination, &plan).await?;
    Ok(finish(plan, segment))
}

/// The append: the partition row advanced, the segment row and its ids' index rows inserted.
/// `{ids}` is where the ids come from (`t`: transaction id, message id, ordinal) and what else
/// their rows get.
const APPEND_TEMPLATE: &str = "WITH p AS (
         UPDATE queen.partitions
            SET last_offset = last_offset + $2::bigint,
                last_segment_at = GREATEST(clock_timestamp(), last_segment_at)
          WHERE id = $1
      RETURNING last_offset - $2::bigint + 1 AS base_offset, last_offset AS end_offset,
                last_segment_at AS created_at
     ), segment AS (
         INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, created_at, frame_count,
                                         raw_length, body)
         SELECT $1, base_offset, end_offset, created_at, $2::bigint::integer, $3, $4 FROM p
         RETURNING base_offset, end_offset, created_at
     ), ids AS ({ids})
     SELECT base_offset, end_offset, created_at FROM segment";

static APPEND_SQL: LazyLock<String> = LazyLock::new(|| {
    APPEND_TEMPLATE.replace(
        "{ids}",
        "INSERT INTO queen.log_message_ids (partition_id, transaction_id, message_offset, message_id)
         SELECT $1, t.transaction_id, p.base_offset + t.ordinal - 1, t.message_id
           FROM p, unnest($5::text[], $6::uuid[]) WITH ORDINALITY AS t(transaction_id, message_id, ordinal)",
    )
});

/// [`APPEND_SQL`] with the earlier offsets of ids pushed again after their dedup window, as
/// (transaction id, offset) pairs in `$7` and `$8`.
static APPEND_AGAIN_SQL: LazyLock<String> = LazyLock::new(|| {
    APPEND_TEMPLATE.replace(
        "{ids}",
        "INSERT INTO queen.log_message_ids (partition_id, transaction_id, message_offset, message_id, earlier_offsets)
         SELECT $1, t.transaction_id, p.base_offset + t.ordinal - 1, t.message_id, e.offsets
           FROM p, unnest($5::text[], $6::uuid[]) WITH ORDINALITY AS t(transaction_id, message_id, ordinal)
           LEFT JOIN (SELECT id, array_agg(o ORDER BY o) AS offsets
                        FROM unnest($7::text[], $8::bigint[]) AS e(id, o) GROUP BY id) e ON e.id = t.transaction_id",
    )
});

async fn write_plan(
    client: &impl GenericClient,
    destination: Destination<'_>,
    plan: &AppendPlan,
) -> Result<Option<SegmentWritten>, StoreError> {
    let partition_id = destination.partition_id;
    let Some(segment) = &plan.segment else { return Ok(None) };
    // Ids released from their dedup window carry the offsets they were stored at before, in a
    // statement of its own: the everyday one stays as it was.
    let statement = match plan.earlier.0.is_empty() {
        true => client.prepare_cached(&APPEND_SQL).await?,
        false => client.prepare_cached(&APPEND_AGAIN_SQL).await?,
    };
    let frame_count = segment.frame_count as i64;
    let raw_len =
        i32::try_from(segment.raw_len).map_err(|_| queen_log::EncodeError::FrameTooLarge { len: segment.raw_len })?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
        &partition_id,
        &frame_count,
        &raw_len,
        &segment.body,
        &plan.fresh_transaction_ids,
        &plan.fresh_message_ids,
        &plan.earlier.0,
        &plan.earlier.1,
    ];
    let params = if plan.earlier.0.is_empty() { &params[..6] } else { &params[..] };
    let row = client.query_opt(&statement, params).await?.ok_or(StoreError::Missing("partition"))?;
    Ok(Some(SegmentWritten {
        base_offset: row.get(0),
        end_offset: row.get(1),
        created_at: row.get(2),
        raw_len: segment.raw_len,
        stored_len: segment.body.len(),
    }))
}

fn finish(plan: AppendPlan, segment: Option<SegmentWritten>) -> AppendResult {
    let fresh = |index: usize| {
        // A fresh or repeated slot exists only when a segment was planned, and a planned segment
        // is either written or the append failed before getting here.
        let base_offset = segment.as_ref().map_or(0, |s| s.base_offset);
        (base_offset + index as i64, plan.fresh_message_ids[index])
    };
    let outcomes = plan
        .slots
        .iter()
        .map(|slot| match *slot {
            Slot::Fresh(index) => {
                let (offset, message_id) = fresh(index);
                Appended::Queued { offset, message_id }
            }
            Slot::RepeatOf(index) => {
                let (offset, message_id) = fresh(index);
                Appended::Duplicate { offset, message_id }
            }
            Slot::Stored(outcome) => outcome,
        })
        .collect();
    AppendResult { outcomes, segment }
}

/// A stored segment, decompressed.
#[derive(Debug, Clone)]
pub struct StoredSegment {
    pub partition_id: i64,
    pub base_offset: i64,
    pub created_at: DateTime<Utc>,
    pub frames: DecodedSegment,
    /// It was stored sealed (its queue was encrypted when it was written).
    pub sealed: bool,
    /// Its body as stored (one zstd frame of its frames) when not sealed: what a framed pop
    /// ships as is.
    pub zstd_body: Option<Vec<u8>>,
}

impl StoredSegment {
    /// The offset of its last message.
    pub fn end_offset(&self) -> i64 {
        self.base_offset + self.frames.frame_count() as i64 - 1
    }

    /// Its messages at offsets `first..=last`, with their offsets, found without walking the
    /// frames before them. Every frame was validated when the segment was decoded, so the
    /// iterator yields no errors; it keeps the `Result` so callers need no `unwrap`.
    pub fn frames_in(&self, first: i64, last: i64) -> impl Iterator<Item = (i64, Result<Frame<'_>, DecodeError>)> + '_ {
        let first = first.max(self.base_offset);
        let count = usize::try_from(last.min(self.end_offset()) - first + 1).unwrap_or(0);
        let skip = usize::try_from(first - self.base_offset).unwrap_or(0);
        (first..).zip(self.frames.frames_from(skip).take(count))
    }
}

/// One span of offsets to read: `first..=last` of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub partition_id: i64,
    pub first: i64,
    pub last: i64,
}

/// Reads the segments that cover the spans, in span order then offset order, opening sealed ones
/// with `keys`. The walk for each span starts at the segment holding `first`, found through the
/// primary key, so the cost does not grow with the partition's history. Reads outside a
/// transaction go through [`crate::segment_cache::SegmentCache::read`] instead.
pub async fn read_spans(
    client: &impl GenericClient,
    spans: &[Span],
    keys: Option<&Cipher>,
) -> Result<Vec<StoredSegment>, StoreError> {
    let read = read_spans_indexed(client, spans, keys, usize::MAX).await?;
    Ok(read.segments.into_iter().map(|(_, segment)| segment).collect())
}

/// What [`read_spans_indexed`] read.
#[derive(Default)]
pub(crate) struct IndexedRead {
    /// Each segment with the index of the span it was read for.
    pub segments: Vec<(usize, StoredSegment)>,
    /// The first span the decode bound left unread: in part, after the segments read for it,
    /// and every span after it whole.
    pub cut: Option<usize>,
}

/// [`read_spans`], decoding segments only until they hold `decode_at_most` bytes (at least
/// one): the rest are passed over, so the read covers a prefix of what was asked. Their bodies
/// are neither read nor sent by PostgreSQL, and rows are taken one at a time.
pub(crate) async fn read_spans_indexed(
    client: &impl GenericClient,
    spans: &[Span],
    keys: Option<&Cipher>,
    decode_at_most: usize,
) -> Result<IndexedRead, StoreError> {
    use futures::TryStreamExt;

    if spans.is_empty() {
        return Ok(IndexedRead::default());
    }
    let statement = client
        .prepare_cached(
            // Past the bound, a row comes without its body, which PostgreSQL then never reads:
            // the rows before it hold `$4` bytes decoded (`raw_length`).
            "SELECT partition_id, base_offset, created_at, frame_count,
                    CASE WHEN decoded_before < $4 THEN body END, ord
               FROM (SELECT s.partition_id, s.base_offset, s.created_at, s.frame_count, s.body, r.ord,
                            sum(s.raw_length) OVER (ORDER BY r.ord, s.base_offset ROWS UNBOUNDED PRECEDING)
                                - s.raw_length AS decoded_before
                       FROM unnest($1::bigint[], $2::bigint[], $3::bigint[])
                            WITH ORDINALITY AS r(partition_id, first, last, ord)
                      CROSS JOIN LATERAL (
                          SELECT s.* FROM queen.log_segments s
                           WHERE s.partition_id = r.partition_id
                             AND s.base_offset >= COALESCE(
                                     (SELECT max(f.base_offset) FROM queen.log_segments f
                                       WHERE f.partition_id = r.partition_id AND f.base_offset <= r.first), r.first)
                             AND s.base_offset <= r.last
                      ) s) read
              ORDER BY ord, base_offset",
        )
        .await?;
    let partition_ids: Vec<i64> = spans.iter().map(|s| s.partition_id).collect();
    let firsts: Vec<i64> = spans.iter().map(|s| s.first).collect();
    let lasts: Vec<i64> = spans.iter().map(|s| s.last).collect();
    let bound = i64::try_from(decode_at_most).unwrap_or(i64::MAX);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&partition_ids, &firsts, &lasts, &bound];
    let rows = client.query_raw(&statement, params).await?;
    let mut rows = std::pin::pin!(rows);
    let (mut read, mut decoded) = (IndexedRead::default(), 0);
    while let Some(row) = rows.try_next().await? {
        // The ordinality counts from 1.
        let span = usize::try_from(row.get::<_, i64>(5) - 1).unwrap_or(0);
        // Past the bound as the rows' lengths say, or as decoding found it (a length that
        // understates): taken off the connection and dropped.
        let body: Option<&[u8]> = row.get(4);
        let Some(body) = body.filter(|_| decoded < decode_at_most) else {
            read.cut.get_or_insert(span);
            continue;
        };
        let partition_id: i64 = row.get(0);
        let base_offset: i64 = row.get(1);
        let frame_count: i32 = row.get(3);
        let sealed = queen_log::is_sealed(body);
        if sealed && keys.is_none() {
            let subject = format!("segment {base_offset} of partition {partition_id}");
            return Err(StoreError::NoEncryptionKey { subject });
        }
        let frames = opened(body, keys)
            .and_then(|body| queen_log::decode_segment(&body, frame_count.max(0) as usize, MAX_SEGMENT_RAW_BYTES))
            .map_err(|source| StoreError::CorruptSegment { partition_id, base_offset, source })?;
        decoded += frames.memory_len();
        let zstd_body = (!sealed).then(|| body.to_vec());
        let segment = StoredSegment { partition_id, base_offset, created_at: row.get(2), frames, sealed, zstd_body };
        read.segments.push((span, segment));
    }
    Ok(read)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn message(txn: &str) -> NewMessage {
        NewMessage {
            message_id: Uuid::now_v7(),
            transaction_id: txn.into(),
            trace_id: None,
            producer: None,
            payload: b"1".to_vec(),
            received: None,
        }
    }

    fn stored_as(duplicates: HashMap<String, (i64, Uuid)>) -> StoredIds {
        StoredIds { duplicates, ..StoredIds::default() }
    }

    #[test]
    fn an_id_released_from_its_window_carries_the_offsets_it_was_stored_at() {
        let released = HashMap::from([("again".to_string(), vec![3, 7])]);
        let stored = StoredIds { released, ..StoredIds::default() };
        let plan = plan_append(&[message("new"), message("again"), message("again")], &stored, None).unwrap();
        assert_eq!(plan.fresh_transaction_ids, vec!["new", "again"]);
        assert_eq!(plan.earlier, (vec!["again".to_string(), "again".to_string()], vec![3, 7]));
    }

    #[test]
    fn a_plan_skips_stored_and_repeated_transaction_ids() {
        let stored = Uuid::now_v7();
        let existing = HashMap::from([("old".to_string(), (7, stored))]);
        let messages = [message("a"), message("old"), message("b"), message("a")];
        let plan = plan_append(&messages, &stored_as(existing), None).unwrap();
        assert_eq!(plan.fresh_transaction_ids, vec!["a", "b"]);
        assert_eq!(plan.segment.as_ref().map(|s| s.frame_count), Some(2));
        let written =
            SegmentWritten { base_offset: 10, end_offset: 11, created_at: Utc::now(), raw_len: 0, stored_len: 0 };
        let result = finish(plan, Some(written));
        assert_eq!(
            result.outcomes,
            vec![
                Appended::Queued { offset: 10, message_id: messages[0].message_id },
                Appended::Duplicate { offset: 7, message_id: stored },
                Appended::Queued { offset: 11, message_id: messages[2].message_id },
                Appended::Duplicate { offset: 10, message_id: messages[0].message_id },
            ]
        );
    }

    /// A stored segment of `count` messages from `base_offset`, each holding its offset as payload.
    pub(crate) fn segment(partition_id: i64, base_offset: i64, count: i64) -> StoredSegment {
        let mut builder = SegmentBuilder::new();
        for offset in base_offset..base_offset + count {
            let payload = offset.to_string();
            let frame = Frame {
                message_id: Uuid::now_v7(),
                trace_id: None,
                transaction_id: &payload,
                producer: None,
                payload: payload.as_bytes(),
            };
            builder.push(&frame).unwrap();
        }
        let body = builder.finish().unwrap().body;
        let frames = queen_log::decode_segment(&body, count as usize, 1 << 20).unwrap();
        StoredSegment { partition_id, base_offset, created_at: Utc::now(), frames, sealed: false, zstd_body: None }
    }

    #[test]
    fn frames_in_are_the_offsets_asked_for_that_the_segment_holds() {
        let stored = segment(1, 101, 10);
        assert_eq!(stored.end_offset(), 110);
        let offsets = |first, last| -> Vec<(i64, String)> {
            stored
                .frames_in(first, last)
                .map(|(offset, frame)| (offset, String::from_utf8(frame.unwrap().payload.to_vec()).unwrap()))
                .collect()
        };
        let expected = |range: std::ops::RangeInclusive<i64>| -> Vec<(i64, String)> {
            range.map(|offset| (offset, offset.to_string())).collect()
        };
        assert_eq!(offsets(105, 105), expected(105..=105));
        assert_eq!(offsets(90, 103), expected(101..=103));
        assert_eq!(offsets(108, 200), expected(108..=110));
        assert_eq!(offsets(1, 1000), expected(101..=110));
        assert!(offsets(111, 120).is_empty());
        assert!(offsets(50, 100).is_empty());
    }

    /// Messages as their producer framed and compressed them: each its frame of one segment,
    /// whose body is a marker no compressor makes, to tell it from a segment built here.
    fn received(transaction_ids: &[&str]) -> Vec<NewMessage> {
        let mut messages: Vec<NewMessage> = transaction_ids.iter().map(|txn| message(txn)).collect();
        let segment =
            Arc::new(EncodedSegment { body: b"as received".to_vec(), raw_len: 1, frame_count: messages.len() });
        for (index, message) in messages.iter_mut().enumerate() {
            message.received = Some(ReceivedFrame { segment: Arc::clone(&segment), index });
        }
        messages
    }

    fn planned_body(messages: &[NewMessage], existing: &HashMap<String, (i64, Uuid)>) -> Vec<u8> {
        plan_append(messages, &stored_as(existing.clone()), None).unwrap().segment.expect("a segment").body
    }

    #[test]
    fn a_received_segment_written_whole_is_stored_as_received() {
        let messages = received(&["a", "b", "c"]);
        let plan = plan_append(&messages, &StoredIds::default(), None).unwrap();
        let segment = plan.segment.expect("a segment");
        assert_eq!((segment.body.as_slice(), segment.frame_count), (&b"as received"[..], 3));
        assert_eq!(plan.fresh_transaction_ids, vec!["a", "b", "c"]);

        let cipher = Cipher::from_hex(&"ab".repeat(32)).unwrap();
        let sealed = plan_append(&messages, &StoredIds::default(), Some(&cipher)).unwrap().segment.unwrap().body;
        assert_eq!(cipher.open(&sealed).unwrap(), b"as received", "sealed after, as any segment");
    }

    #[test]
    fn a_received_segment_not_written_whole_as_it_came_is_built_again() {
        let fresh = |messages: &[NewMessage], existing: &HashMap<String, (i64, Uuid)>| {
            let body = planned_body(messages, existing);
            let count = messages.len() - existing.len();
            let decoded = queen_log::decode_segment(&body, count, 1 << 20).expect("a segment built here");
            decoded.frames().map(|frame| frame.unwrap().transaction_id.to_owned()).collect::<Vec<_>>()
        };
        let messages = received(&["a", "b", "c"]);
        let stored = HashMap::from([("b".to_string(), (7, Uuid::now_v7()))]);
        assert_eq!(fresh(&messages, &stored), ["a", "c"], "one of them is stored already");
        assert_eq!(fresh(&messages[1..], &HashMap::new()), ["b", "c"], "a part of them");
        let mut stamped = messages.clone();
        stamped[1].producer = Some("svc".into());
        assert_eq!(fresh(&stamped, &HashMap::new()), ["a", "b", "c"], "a producer to stamp");
        let mut fused = messages.clone();
        fused.push(message("d"));
        assert_eq!(fresh(&fused, &HashMap::new()), ["a", "b", "c", "d"], "with other messages");
        let repeated = received(&["a", "a"]);
        assert_ne!(planned_body(&repeated, &HashMap::new()), b"as received", "a repeat in them");
    }

    #[test]
    fn an_all_duplicate_batch_plans_no_segment() {
        let existing = HashMap::from([("x".to_string(), (1, Uuid::now_v7()))]);
        let plan = plan_append(&[message("x")], &stored_as(existing), None).unwrap();
        assert!(plan.segment.is_none());
    }
}
