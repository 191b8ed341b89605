//! Reading a framed pop answer (QPF1), what a pop with [`Pop::frames`](crate::Pop::frames) may
//! get instead of JSON:
//!
//! ```text
//! "QPF1" | u8 version | [u32 len, JSON object of the answer's own keys, version 1]
//!   | str16 queue | str16 leaseId | str16 consumerGroup | u32 claims
//! claim:  u64 partitionId | str16 partition | u64 start | u64 end | u32 deliveryAttempt | u32 records
//! record: u64 base_offset | i64 created_at_us | u32 count | u8 codec | u32 len | bytes
//! ```
//!
//! Integers are little-endian, `str16` is a u16 byte length and UTF-8. A record is `count` stored
//! frames (`queen_log`'s layout), raw (codec 0) or as one zstd frame (codec 1); frame `i` has
//! offset `base_offset + i` and belongs to the delivery only within `start..=end` of its claim,
//! since a record may be a whole stored segment shared with other deliveries.

use std::borrow::Cow;

use chrono::DateTime;
use serde::Deserialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::pop::{Autopilot, Delivery, Message};

/// How a QPF1 answer starts; the client reads any other body as JSON.
pub(crate) const MAGIC: &[u8; 4] = b"QPF1";
const CODEC_RAW: u8 = 0;
const CODEC_ZSTD: u8 = 1;

/// What the records of one answer may hold at most, decompressed: a bound on the memory a
/// corrupt answer can make the client allocate (a few kilobytes of zstd can declare a quarter of
/// a gigabyte, and an answer can hold any number of records).
const MAX_ANSWER_RAW_BYTES: usize = 256 * 1024 * 1024;

/// The keys of the JSON part the client reads.
#[derive(Deserialize)]
struct OwnKeys {
    #[serde(default)]
    autopilot: Option<Autopilot>,
}

/// The delivery a QPF1 body carries, or what in it does not fit.
pub(crate) fn decode(body: &[u8]) -> Result<Delivery, String> {
    decode_within(body, MAX_ANSWER_RAW_BYTES)
}

/// [`decode`], the records holding at most `most` bytes decompressed.
fn decode_within(body: &[u8], most: usize) -> Result<Delivery, String> {
    let mut wire = Wire { body, at: 0 };
    if wire.take(4)? != MAGIC {
        return Err("not a QPF1 answer".into());
    }
    let autopilot = match wire.u8()? {
        0 => None,
        1 => {
            let len = wire.u32()?;
            let json = wire.take(len)?;
            serde_json::from_slice::<OwnKeys>(json).map_err(|e| format!("the JSON part: {e}"))?.autopilot
        }
        version => return Err(format!("QPF1 version {version} is not known to this client")),
    };
    let queue = wire.str16()?.to_owned();
    let lease_text = wire.str16()?;
    let lease_id = if lease_text.is_empty() {
        None
    } else {
        Some(lease_text.parse::<Uuid>().map_err(|e| format!("leaseId: {e}"))?)
    };
    let consumer_group = wire.str16()?.to_owned();
    let claims = wire.u32()?;
    let mut messages = Vec::new();
    // What the records decoded so far hold, against `most`.
    let mut decoded = 0usize;
    for _ in 0..claims {
        let partition_id = wire.u64()?.to_string();
        let partition = wire.str16()?.to_owned();
        let (start, end) = (wire.u64()?, wire.u64()?);
        let delivery_attempt = u32::try_from(wire.u32()?).unwrap_or(u32::MAX);
        for _ in 0..wire.u32()? {
            let base_offset = wire.u64()?;
            let created_at = DateTime::from_timestamp_micros(wire.i64()?).ok_or("a record's time is out of range")?;
            let count = wire.u32()?;
            let codec = wire.u8()?;
            let len = wire.u32()?;
            let bytes = wire.take(len)?;
            let room = most - decoded;
            let raw = match codec {
                CODEC_RAW if bytes.len() <= room => Cow::Borrowed(bytes),
                CODEC_RAW => return Err(format!("the records hold more than the {most} bytes an answer may hold")),
                CODEC_ZSTD => Cow::Owned(decompress(bytes, room)?),
                other => return Err(format!("record codec {other} is not known to this client")),
            };
            decoded += raw.len();
            let mut frames = 0;
            for (index, frame) in queen_log::FrameIter::new(&raw).enumerate() {
                let frame = frame.map_err(|e| format!("a record's frame: {e}"))?;
                frames += 1;
                let offset = base_offset.checked_add(index as u64).ok_or("a record's offsets overflow")?;
                if offset < start || offset > end {
                    continue;
                }
                messages.push(Message {
                    id: frame.message_id,
                    transaction_id: frame.transaction_id.to_owned(),
                    partition_id: partition_id.clone(),
                    partition: partition.clone(),
                    queue: queue.clone(),
                    lease_id,
                    consumer_group: consumer_group.clone(),
                    created_at,
                    delivery_attempt,
                    trace_id: frame.trace_id,
                    producer_sub: frame.producer.map(str::to_owned),
                    offset: i64::try_from(offset).map_err(|_| "an offset out of range")?,
                    data: payload(frame.payload)?,
                });
            }
            if frames != count {
                return Err(format!("a record declares {count} frames and holds {frames}"));
            }
        }
    }
    if wire.at != body.len() {
        return Err(format!("{} bytes after the last claim", body.len() - wire.at));
    }
    Ok(Delivery { messages, lease_id, partitions_claimed: claims, paused: false, autopilot })
}

/// A frame's payload as the message's data: its JSON text, `null` when empty.
fn payload(bytes: &[u8]) -> Result<Box<RawValue>, String> {
    if bytes.is_empty() {
        return Ok(RawValue::NULL.to_owned());
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "a payload is not UTF-8")?;
    RawValue::from_string(text.to_owned()).map_err(|e| format!("a payload is not JSON: {e}"))
}

/// A codec-1 record's frames: one zstd frame that declares its size, within `room` bytes.
fn decompress(bytes: &[u8], room: usize) -> Result<Vec<u8>, String> {
    let declared = zstd::zstd_safe::get_frame_content_size(bytes)
        .map_err(|_| "a compressed record is not a zstd frame")?
        .ok_or("a compressed record does not declare its size")?;
    let declared = usize::try_from(declared).unwrap_or(usize::MAX);
    if declared > room {
        return Err(format!("a compressed record declares {declared} bytes, past what the answer may still hold"));
    }
    // On the thread's kept context: making one per record costs a `cpuid`, which virtual
    // machines trap.
    let raw = queen_log::zstd_contexts::decompress(bytes, declared).map_err(|e| format!("a compressed record: {e}"))?;
    if raw.len() != declared {
        return Err("a compressed record is shorter than it declares".into());
    }
    Ok(raw)
}

struct Wire<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Wire<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|end| *end <= self.body.len()).ok_or_else(|| {
            format!("truncated at byte {} ({n} more bytes expected, {} left)", self.at, self.body.len() - self.at)
        })?;
        let piece = &self.body[self.at..end];
        self.at = end;
        Ok(piece)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<usize, String> {
        let bytes: [u8; 4] = self.take(4)?.try_into().map_err(|_| "u32")?;
        usize::try_from(u32::from_le_bytes(bytes)).map_err(|_| "a length out of range".into())
    }

    fn u64(&mut self) -> Result<u64, String> {
        let bytes: [u8; 8] = self.take(8)?.try_into().map_err(|_| "u64")?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn i64(&mut self) -> Result<i64, String> {
        let bytes: [u8; 8] = self.take(8)?.try_into().map_err(|_| "i64")?;
        Ok(i64::from_le_bytes(bytes))
    }

    fn str16(&mut self) -> Result<&'a str, String> {
        let bytes: [u8; 2] = self.take(2)?.try_into().map_err(|_| "u16")?;
        let text = self.take(usize::from(u16::from_le_bytes(bytes)))?;
        std::str::from_utf8(text).map_err(|_| "a string is not UTF-8".into())
    }
}

#[cfg(test)]
mod tests {
    use queen_log::{Frame, encode_frame};

    use super::*;

    fn frame(i: u128) -> (Uuid, String, String) {
        (Uuid::from_u128(i), format!("tx-{i}"), format!(r#"{{"i":{i}}}"#))
    }

    fn frames(range: std::ops::Range<u128>) -> Vec<u8> {
        let mut out = Vec::new();
        for i in range {
            let (id, tx, payload) = frame(i);
            let frame = Frame {
                message_id: id,
                trace_id: None,
                transaction_id: &tx,
                producer: None,
                payload: payload.as_bytes(),
            };
            encode_frame(&frame, &mut out).unwrap();
        }
        out
    }

    /// The frames as one zstd frame, as a segment is stored.
    fn compressed(range: std::ops::Range<u128>) -> Vec<u8> {
        queen_log::zstd_contexts::compress_segment(&frames(range)).unwrap()
    }

    fn str16(out: &mut Vec<u8>, text: &str) {
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }

    /// An answer with one claim of partition 7, span `start..=end`, and the given records
    /// (base offset, count, codec, bytes).
    fn answer(start: u64, end: u64, records: &[(u64, u32, u8, Vec<u8>)]) -> Vec<u8> {
        let mut out = b"QPF1".to_vec();
        out.push(1);
        let own = br#"{"autopilot":{"partitions":2,"batch":50,"waitMs":0}}"#;
        out.extend_from_slice(&(own.len() as u32).to_le_bytes());
        out.extend_from_slice(own);
        str16(&mut out, "orders");
        str16(&mut out, "0192f0c4-0000-7000-8000-000000000001");
        str16(&mut out, "billing");
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&7u64.to_le_bytes());
        str16(&mut out, "p-1");
        out.extend_from_slice(&start.to_le_bytes());
        out.extend_from_slice(&end.to_le_bytes());
        out.extend_from_slice(&2u32.to_le_bytes());
        out.extend_from_slice(&(records.len() as u32).to_le_bytes());
        for (base, count, codec, bytes) in records {
            out.extend_from_slice(&base.to_le_bytes());
            out.extend_from_slice(&1_785_333_600_123_456i64.to_le_bytes());
            out.extend_from_slice(&count.to_le_bytes());
            out.push(*codec);
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(bytes);
        }
        out
    }

    #[test]
    fn raw_and_compressed_records_give_the_messages_of_the_claimed_span_only() {
        // Offsets 1..=3 raw, then a whole stored segment of offsets 4..=8 of which 4..=6 are ours.
        let body = answer(2, 6, &[(1, 3, CODEC_RAW, frames(1..4)), (4, 5, CODEC_ZSTD, compressed(4..9))]);
        let delivery = decode(&body).unwrap();
        let offsets: Vec<i64> = delivery.messages.iter().map(|m| m.offset).collect();
        assert_eq!(offsets, [2, 3, 4, 5, 6]);
        let m = &delivery.messages[2];
        assert_eq!((m.transaction_id.as_str(), m.data.get()), ("tx-4", r#"{"i":4}"#));
        assert_eq!((m.partition_id.as_str(), m.partition.as_str(), m.queue.as_str()), ("7", "p-1", "orders"));
        assert_eq!((m.consumer_group.as_str(), m.delivery_attempt), ("billing", 2));
        assert_eq!(m.created_at.timestamp_micros(), 1_785_333_600_123_456);
        assert_eq!(m.lease_id, delivery.lease_id);
        assert!(delivery.lease_id.is_some());
        assert_eq!(delivery.autopilot.map(|a| a.batch), Some(50));
        assert_eq!(delivery.partitions_claimed, 1);
    }

    #[test]
    fn truncated_or_corrupt_answers_are_errors() {
        let body = answer(1, 5, &[(1, 5, CODEC_ZSTD, compressed(1..6))]);
        assert_eq!(decode(&body).unwrap().len(), 5);
        for cut in 0..body.len() {
            assert!(decode(&body[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = body.clone();
        extra.push(0);
        assert!(decode(&extra).is_err());
        assert!(decode(&answer(1, 5, &[(1, 4, CODEC_ZSTD, compressed(1..6))])).is_err(), "count mismatch");
        assert!(decode(&answer(1, 5, &[(1, 5, 9, frames(1..6))])).is_err(), "unknown codec");
        let mut garbled = compressed(1..6);
        let last = garbled.len() - 3;
        garbled[last] ^= 0xff;
        assert!(decode(&answer(1, 5, &[(1, 5, CODEC_ZSTD, garbled)])).is_err(), "corrupt zstd");
    }

    #[test]
    fn the_records_of_an_answer_are_bounded_together() {
        let held = frames(1..6).len() + frames(6..11).len();
        let body = answer(1, 10, &[(1, 5, CODEC_ZSTD, compressed(1..6)), (6, 5, CODEC_ZSTD, compressed(6..11))]);
        assert_eq!(decode_within(&body, held).unwrap().len(), 10);
        let refused = decode_within(&body, held - 1).unwrap_err();
        assert!(refused.contains("past what the answer may still hold"), "{refused}");
        let raw = answer(1, 10, &[(1, 5, CODEC_RAW, frames(1..6)), (6, 5, CODEC_RAW, frames(6..11))]);
        assert!(decode_within(&raw, held - 1).unwrap_err().contains("bytes an answer may hold"));
    }
}
