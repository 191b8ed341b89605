//! The framed pop answer (QPF1), served for a pop with `frames=true`:
//!
//! ```text
//! "QPF1" | u8 version | [u32 len, JSON object of the answer's own keys, version 1]
//!   | str16 queue | str16 leaseId | str16 consumerGroup | u32 claims
//! claim:  u64 partitionId | str16 partition | u64 start | u64 end | u32 deliveryAttempt | u32 records
//! record: u64 base_offset | i64 created_at_us | u32 count | u8 codec | u32 len | bytes
//! ```
//!
//! All integers little-endian, `str16` = u16 byte length + UTF-8. A record's bytes are `count`
//! stored frames (`queen_log`'s layout); frame `i` has offset `base_offset + i`.
//!
//! Each run of consecutive delivered offsets of a partition with one `created_at` (one segment)
//! is one record. Where the run holds at least half of its segment, and every message the
//! segment has within the claim's `start..=end`, the segment goes as stored (codec 1, zstd):
//! the client keeps only the frames within `start..=end`, so the others cost bytes, not
//! correctness. Otherwise, or when the segment is sealed at rest, the run's frames are rebuilt
//! from the delivered messages (codec 0, raw).

use std::sync::Arc;

use queen_log::{Frame, encode_frame};
use queen_store::log::StoredSegment;

use crate::broker::pop::{DeliveredMessage, Delivery};

pub const CONTENT_TYPE: &str = "application/x-queen-pop";

const MAGIC: &[u8; 4] = b"QPF1";
const CODEC_RAW: u8 = 0;
const CODEC_ZSTD: u8 = 1;

/// The QPF1 body of a delivery with messages: `own_keys` is the JSON object of what the JSON
/// answer says beside its messages (the conflation echo, the autopilot's choice), when it says
/// anything. `None` when QPF1 cannot carry the delivery, which is then answered as JSON (the
/// client reads either): no messages; messages of more than one queue (a namespace pop), since a
/// QPF1 answer names one queue; or a field longer than its length prefix allows.
pub fn encode(delivery: &Delivery, consumer_group: &str, own_keys: Option<&[u8]>) -> Option<Vec<u8>> {
    let first = delivery.messages.first()?;
    if delivery.messages.iter().any(|m| m.queue != first.queue) {
        return None;
    }
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    match own_keys {
        Some(json) => {
            out.push(1);
            put_bytes32(&mut out, json)?;
        }
        None => out.push(0),
    }
    put_str16(&mut out, &first.queue)?;
    // An autoAck pop takes no lease: the client reads "" as none.
    put_str16(&mut out, &delivery.lease_id.map(|id| id.to_string()).unwrap_or_default())?;
    put_str16(&mut out, consumer_group)?;
    let claims = claims(&delivery.messages);
    put_u32(&mut out, claims.len())?;
    for claim in &claims {
        put_claim(&mut out, claim, &delivery.segments)?;
    }
    Some(out)
}

/// The messages of each partition, partitions in the order they were delivered.
fn claims(messages: &[DeliveredMessage]) -> Vec<Vec<&DeliveredMessage>> {
    let mut claims: Vec<Vec<&DeliveredMessage>> = Vec::new();
    for message in messages {
        match claims.iter_mut().find(|claim| claim.first().is_some_and(|m| m.partition_id == message.partition_id)) {
            Some(claim) => claim.push(message),
            None => claims.push(vec![message]),
        }
    }
    claims
}

fn put_claim(out: &mut Vec<u8>, claim: &[&DeliveredMessage], segments: &[Arc<StoredSegment>]) -> Option<()> {
    let (first, last) = (claim.first()?, claim.last()?);
    out.extend_from_slice(&u64::try_from(first.partition_id).ok()?.to_le_bytes());
    put_str16(out, &first.partition)?;
    out.extend_from_slice(&u64::try_from(first.offset).ok()?.to_le_bytes());
    out.extend_from_slice(&u64::try_from(last.offset).ok()?.to_le_bytes());
    out.extend_from_slice(&u32::try_from(first.delivery_attempt).ok()?.to_le_bytes());
    let records: Vec<&[&DeliveredMessage]> =
        claim.chunk_by(|a, b| b.offset == a.offset + 1 && b.created_at == a.created_at).collect();
    put_u32(out, records.len())?;
    for record in records {
        match shippable(record, segments, first.offset, last.offset) {
            Some((segment, body)) => put_stored(out, segment, body)?,
            None => put_rebuilt(out, record)?,
        }
    }
    Some(())
}

/// The stored segment a run of a claim's messages can be shipped as: not sealed, the run is
/// everything it has within `start..=end`, and at least half of it.
fn shippable<'a>(
    record: &[&DeliveredMessage],
    segments: &'a [Arc<StoredSegment>],
    start: i64,
    end: i64,
) -> Option<(&'a StoredSegment, &'a [u8])> {
    let (first, last) = (record.first()?, record.last()?);
    let segment = segments.iter().find(|s| {
        s.partition_id == first.partition_id && s.base_offset <= first.offset && first.offset <= s.end_offset()
    })?;
    let covers = first.offset == segment.base_offset.max(start) && last.offset == segment.end_offset().min(end);
    let most = record.len() * 2 >= segment.frames.frame_count();
    // A segment stored before pushes' windows were checked may ask for more than a client's
    // streaming reader allows: its messages are sent rebuilt.
    let body = segment.zstd_body.as_deref().filter(|body| queen_log::window_within_streaming_limit(body))?;
    (covers && most).then_some((segment, body))
}

fn put_stored(out: &mut Vec<u8>, segment: &StoredSegment, body: &[u8]) -> Option<()> {
    out.extend_from_slice(&u64::try_from(segment.base_offset).ok()?.to_le_bytes());
    out.extend_from_slice(&segment.created_at.timestamp_micros().to_le_bytes());
    put_u32(out, segment.frames.frame_count())?;
    out.push(CODEC_ZSTD);
    put_bytes32(out, body)
}

fn put_rebuilt(out: &mut Vec<u8>, record: &[&DeliveredMessage]) -> Option<()> {
    let first = record.first()?;
    out.extend_from_slice(&u64::try_from(first.offset).ok()?.to_le_bytes());
    out.extend_from_slice(&first.created_at.timestamp_micros().to_le_bytes());
    put_u32(out, record.len())?;
    out.push(CODEC_RAW);
    let mut frames = Vec::new();
    for message in record {
        let frame = Frame {
            message_id: message.message_id,
            trace_id: message.trace_id,
            transaction_id: &message.transaction_id,
            producer: message.producer.as_deref(),
            payload: message.data.get().as_bytes(),
        };
        encode_frame(&frame, &mut frames).ok()?;
    }
    put_bytes32(out, &frames)
}

fn put_u32(out: &mut Vec<u8>, n: usize) -> Option<()> {
    out.extend_from_slice(&u32::try_from(n).ok()?.to_le_bytes());
    Some(())
}

fn put_bytes32(out: &mut Vec<u8>, bytes: &[u8]) -> Option<()> {
    put_u32(out, bytes.len())?;
    out.extend_from_slice(bytes);
    Some(())
}

fn put_str16(out: &mut Vec<u8>, text: &str) -> Option<()> {
    out.extend_from_slice(&u16::try_from(text.len()).ok()?.to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    Some(())
}
