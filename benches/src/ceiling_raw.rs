//! The storage ceiling's raw cells: the rows a push writes, with SQL of the bench's own, so that
//! what each part of an append costs stays measurable whatever production does next.
//!
//! The statements mirror production as of commit a5a7ae9: `write_plan` in
//! crates/queen-store/src/log.rs (one statement that advances the partition row, inserts the
//! segment row and one `log_message_ids` row per message, and calls `pg_notify` for the
//! partition's `p` event on `queen_events`). They are a measuring instrument, deliberately not
//! kept in step with the store crate: the `append` cells follow production, these keep today's
//! cost. Production's lock of the partition row and its duplicate check come before that
//! statement; the raw cells leave both out.

use queen_client::uuid::Uuid;
use queen_log::{Frame, SegmentBuilder};
use queen_store::StoreError;
use queen_store::log::NewMessage;

/// The channel production's append notifies on.
pub const CHANNEL: &str = "queen_events";

/// `write_plan`'s common table expressions: the partition row, the segment row, the message ids.
macro_rules! write_plan_ctes {
    () => {
        "WITH p AS (
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
         ), ids AS (
             INSERT INTO queen.log_message_ids (partition_id, transaction_id, message_offset, message_id)
             SELECT $1, t.transaction_id, p.base_offset + t.ordinal - 1, t.message_id
               FROM p, unnest($5::text[], $6::uuid[]) WITH ORDINALITY AS t(transaction_id, message_id, ordinal)
         )
         SELECT s.base_offset, s.end_offset, s.created_at FROM segment s"
    };
}

/// `write_plan`'s statement without its `pg_notify`.
const ROWS_SQL: &str = write_plan_ctes!();

/// `write_plan`'s statement as it is: the notice is sent once per segment row.
const ROWS_NOTIFY_SQL: &str = concat!(write_plan_ctes!(), " CROSS JOIN LATERAL (SELECT pg_notify($7, $8)) notice");

/// The segment row alone, at an offset the writer keeps in memory.
const SEGMENT_SQL: &str = "INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, created_at,
                                                           frame_count, raw_length, body)
     VALUES ($1, $2, $2 + $3::bigint - 1, clock_timestamp(), $3::bigint::integer, $4, $5)";

/// A batch encoded and compressed as the append would (before `BEGIN`: the raw cells measure
/// the SQL, not zstd).
pub struct RawSegment {
    body: Vec<u8>,
    raw_len: i32,
    frame_count: i64,
    transaction_ids: Vec<String>,
    message_ids: Vec<Uuid>,
}

impl RawSegment {
    pub fn encode(messages: &[NewMessage]) -> Result<Self, StoreError> {
        let mut builder = SegmentBuilder::new();
        for message in messages {
            builder.push(&Frame {
                message_id: message.message_id,
                trace_id: message.trace_id,
                transaction_id: &message.transaction_id,
                producer: message.producer.as_deref(),
                payload: &message.payload,
            })?;
        }
        let segment = builder.finish()?;
        let raw_len = i32::try_from(segment.raw_len)
            .map_err(|_| queen_log::EncodeError::FrameTooLarge { len: segment.raw_len })?;
        Ok(Self {
            body: segment.body,
            raw_len,
            frame_count: segment.frame_count as i64,
            transaction_ids: messages.iter().map(|m| m.transaction_id.clone()).collect(),
            message_ids: messages.iter().map(|m| m.message_id).collect(),
        })
    }
}

/// One partition a raw writer owns.
pub struct RawPartition {
    pub partition_id: i64,
    /// The `p` notice production sends for it.
    notice: String,
    /// Where its next segment starts, for the `segments` cells (which do not touch the
    /// partition row); the rows cells take it from the row, as production does.
    next_offset: i64,
}

impl RawPartition {
    pub fn new(queue_id: i64, queue: &str, partition_id: i64) -> Self {
        Self { partition_id, notice: format!("p {queue_id} {partition_id} {queue}"), next_offset: 1 }
    }
}

/// The partition row, the segment row and the message-id rows in one statement, and with
/// `notify` the `pg_notify` too.
pub async fn write_rows(
    tx: &deadpool_postgres::Transaction<'_>,
    partition: &RawPartition,
    segment: &RawSegment,
    notify: bool,
) -> Result<(), StoreError> {
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [
        &partition.partition_id,
        &segment.frame_count,
        &segment.raw_len,
        &segment.body,
        &segment.transaction_ids,
        &segment.message_ids,
    ];
    if notify {
        let statement = tx.prepare_cached(ROWS_NOTIFY_SQL).await?;
        let mut with_notice = params.to_vec();
        with_notice.extend([&CHANNEL as &(dyn tokio_postgres::types::ToSql + Sync), &partition.notice]);
        tx.query_one(&statement, &with_notice).await?;
    } else {
        let statement = tx.prepare_cached(ROWS_SQL).await?;
        tx.query_one(&statement, &params).await?;
    }
    Ok(())
}

/// Only the segment row. The offset advances in memory once the statement succeeded; a failed
/// transaction fails its cell, so an offset is never taken twice.
pub async fn write_segment(
    tx: &deadpool_postgres::Transaction<'_>,
    partition: &mut RawPartition,
    segment: &RawSegment,
) -> Result<(), StoreError> {
    let statement = tx.prepare_cached(SEGMENT_SQL).await?;
    tx.execute(
        &statement,
        &[&partition.partition_id, &partition.next_offset, &segment.frame_count, &segment.raw_len, &segment.body],
    )
    .await?;
    partition.next_offset += segment.frame_count;
    Ok(())
}
