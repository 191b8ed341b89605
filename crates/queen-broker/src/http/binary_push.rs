//! The official client's binary bodies (`Content-Type: application/x-queen-push`; the wire
//! protocol's §3.1, §3.2 and §3.4): QPB1, a push, and QTB1, a transaction whose pushes travel as
//! QPB1's frames groups. Integers are little-endian; `str16` is a `u16` length and UTF-8.
//!
//! ```text
//! QPB1  "QPB1" | u8 flags | [u32 raw_len: flag 0x01, the rest is one zstd frame of raw_len bytes]
//!       | u32 groups | groups
//!   plain group   str16 queue | str16 partition | u32 n
//!                 | n × ([str16 transaction id: flag 0x04] | u32 len | payload)
//!   frames group  str16 queue | str16 partition | u32 n | u32 z_len | z    (flag 0x08)
//!                 z: one zstd frame, declaring its size, of n frames in the log's own layout
//! QTB1  "QTB1" | u8 flags | u32 head_len | head | u32 groups | frames groups
//! ```
//!
//! Flag 0x02 asks for counts instead of a result per message. A QTB1 head is the transaction's
//! JSON body without its pushes.
//!
//! A body is checked whole before anything is written, as a JSON body is: names, `push.max_items`,
//! payloads (each one JSON document, nested no deeper than a JSON push's data; checked, not parsed
//! into values), and every zstd frame: exactly one, its declared size within what is left of
//! `http.max_body_bytes` (everything a body decompresses to counts, so a small body cannot claim
//! more memory than a large one could), and a frames group's `n` frames exactly, with frame flags
//! 0 (the producer is the broker's to stamp, from the token). A frames group's messages keep the
//! ids the client minted and carry the group's compressed bytes ([`ReceivedFrame`]), which the log
//! stores as received when it appends the group whole; a frame without a transaction id gets its
//! message id's text, which changes the frame, so that group is compressed again.

use std::sync::Arc;

use actix_web::{HttpMessage, HttpRequest};
use queen_log::{DecodedSegment, EncodedSegment};
use queen_store::log::{Appended, ReceivedFrame};
use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::body::{MAX_DATA_NESTING, nests_deeper_than};
use crate::broker::push::{PushItem, PushResults, Pushed};
use crate::broker::transaction::Applied;
use crate::config::Config;
use crate::error::ApiError;
use crate::names::{self, NameKind};

/// The content type of both bodies.
pub const CONTENT_TYPE: &str = "application/x-queen-push";
/// The first bytes of a QPB1 and of a QTB1 body.
pub const PUSH_MAGIC: &[u8; 4] = b"QPB1";
pub const TRANSACTION_MAGIC: &[u8; 4] = b"QTB1";

/// Whether a body is read as binary: sent with [`CONTENT_TYPE`] (in any case, as media types
/// are), or starting with `magic`, which no JSON text does (a proxy may have changed the type).
pub fn is_binary(req: &HttpRequest, body: &[u8], magic: &[u8; 4]) -> bool {
    req.content_type().eq_ignore_ascii_case(CONTENT_TYPE) || body.starts_with(magic)
}

/// QPB1: the rest of the body is one zstd frame of `raw_len` bytes.
const FLAG_ZSTD: u8 = 0x01;
/// The answer counts the outcomes instead of listing one per message.
const FLAG_COUNTS: u8 = 0x02;
/// QPB1, plain groups: every item carries a transaction id (empty: the broker mints one).
const FLAG_TRANSACTION_IDS: u8 = 0x04;
/// QPB1: the groups are frames groups.
const FLAG_FRAMES: u8 = 0x08;

/// What a body may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Messages in all (`push.max_items`).
    pub max_items: usize,
    /// Bytes its zstd frames decompress to, in all (`http.max_body_bytes`).
    pub max_raw_bytes: usize,
}

impl Limits {
    pub fn of(config: &Config) -> Self {
        Limits { max_items: config.push.max_items, max_raw_bytes: config.http.max_body_bytes }
    }
}

/// A QPB1 body.
#[derive(Debug)]
pub struct BinaryPush {
    /// Its messages, in wire order.
    pub items: Vec<PushItem>,
    /// Flag 0x02: answer with [`PushCounts`].
    pub counts_only: bool,
    /// Bytes decompressed out of the body, which the request holds besides the body's own.
    pub decompressed_bytes: usize,
}

/// A QTB1 body.
#[derive(Debug)]
pub struct BinaryTransaction<'a> {
    /// The transaction's JSON body without its pushes (may be empty).
    pub head: &'a [u8],
    /// The pushed messages, in wire order.
    pub items: Vec<PushItem>,
    /// Flag 0x02: the answer counts pushes and acks ([`TransactionCounts`]).
    pub counts_only: bool,
    /// Bytes decompressed out of the body, which the request holds besides the body's own.
    pub decompressed_bytes: usize,
}

/// Reads a QPB1 body.
pub fn parse_push(body: &[u8], limits: Limits) -> Result<BinaryPush, ApiError> {
    let inflated;
    let mut wire = Wire::new(body, "QPB1");
    wire.magic()?;
    let flags = wire.flags(FLAG_ZSTD | FLAG_COUNTS | FLAG_TRANSACTION_IDS | FLAG_FRAMES)?;
    if flags & FLAG_FRAMES != 0 && flags & FLAG_TRANSACTION_IDS != 0 {
        return Err(
            bad("QPB1 flags: 0x04 (transaction ids) is for plain groups; frames (0x08) carry their own".into()),
        );
    }
    let mut budget = limits.max_raw_bytes;
    if flags & FLAG_ZSTD != 0 {
        let raw_len = wire.u32(|| "raw_len".into())?;
        inflated = inflate(wire.rest(), raw_len, &mut budget)?;
        wire = Wire::new(&inflated, "QPB1 (decompressed)");
    }
    let items = if flags & FLAG_FRAMES != 0 {
        frames_groups(&mut wire, limits.max_items, &mut budget)?
    } else {
        plain_groups(&mut wire, flags & FLAG_TRANSACTION_IDS != 0, limits.max_items)?
    };
    wire.end()?;
    let decompressed_bytes = limits.max_raw_bytes - budget;
    Ok(BinaryPush { items, counts_only: flags & FLAG_COUNTS != 0, decompressed_bytes })
}

/// Reads a QTB1 body.
pub fn parse_transaction(body: &[u8], limits: Limits) -> Result<BinaryTransaction<'_>, ApiError> {
    let mut wire = Wire::new(body, "QTB1");
    wire.magic()?;
    let flags = wire.flags(FLAG_COUNTS)?;
    let head_len = wire.u32(|| "head_len".into())?;
    let head = wire.take(head_len, || "the head".into())?;
    let mut budget = limits.max_raw_bytes;
    let items = frames_groups(&mut wire, limits.max_items, &mut budget)?;
    wire.end()?;
    let decompressed_bytes = limits.max_raw_bytes - budget;
    Ok(BinaryTransaction { head, items, counts_only: flags & FLAG_COUNTS != 0, decompressed_bytes })
}

fn bad(message: String) -> ApiError {
    ApiError::BadRequest(message)
}

/// Flag 0x01: the body decompressed, exactly `raw_len` bytes, taken from the budget.
fn inflate(compressed: &[u8], raw_len: usize, budget: &mut usize) -> Result<Vec<u8>, ApiError> {
    if raw_len > *budget {
        return Err(bad(format!("QPB1 body: raw_len {raw_len} is over the limit of {budget} decompressed bytes")));
    }
    let raw = one_zstd_frame(compressed)
        .and_then(|()| queen_log::zstd_contexts::decompress(compressed, raw_len).map_err(|e| e.to_string()))
        .map_err(|e| bad(format!("QPB1 body: the compressed body (flag 0x01) does not decompress: {e}")))?;
    if raw.len() != raw_len {
        return Err(bad(format!("QPB1 body: the compressed body holds {} bytes, not raw_len {raw_len}", raw.len())));
    }
    *budget -= raw_len;
    Ok(raw)
}

/// Whether the bytes are exactly one zstd frame.
fn one_zstd_frame(bytes: &[u8]) -> Result<(), String> {
    match zstd::zstd_safe::find_frame_compressed_size(bytes) {
        Ok(len) if len == bytes.len() => Ok(()),
        Ok(len) => Err(format!("{} bytes follow its zstd frame", bytes.len() - len)),
        Err(_) => Err("it is not a whole zstd frame (not zstd, or cut short)".into()),
    }
}

/// Plain groups: each item's transaction id (with flag 0x04) and payload.
fn plain_groups(wire: &mut Wire<'_>, with_transaction_ids: bool, max_items: usize) -> Result<Vec<PushItem>, ApiError> {
    let groups = wire.u32(|| "the group count".into())?;
    let mut items = Vec::new();
    for g in 0..groups {
        let (queue, partition, n) = wire.group_head(g, items.len(), max_items)?;
        for i in 0..n {
            let field = |name: &str| format!("groups[{g}].items[{i}].{name}");
            let transaction_id = match with_transaction_ids {
                true => Some(wire.text(|| field("transactionId"))?).filter(|id| !id.is_empty()),
                false => None,
            };
            let transaction_id = match transaction_id {
                Some(id) => {
                    names::check(NameKind::TransactionId, format_args!("groups[{g}].items[{i}].transactionId"), id)
                        .map_err(bad)?;
                    id.to_owned()
                }
                // Minted, as for a JSON item without one.
                None => queen_log::new_message_id().to_string(),
            };
            let len = wire.u32(|| field("payload length"))?;
            let payload = wire.take(len, || field("payload"))?;
            check_payload(payload, || field("payload"))?;
            items.push(item(&queue, &partition, transaction_id, queen_log::new_message_id(), payload));
        }
    }
    Ok(items)
}

/// Frames groups: each group's zstd frame checked and its frames read.
fn frames_groups(wire: &mut Wire<'_>, max_items: usize, budget: &mut usize) -> Result<Vec<PushItem>, ApiError> {
    let groups = wire.u32(|| "the group count".into())?;
    let mut items = Vec::new();
    for g in 0..groups {
        let (queue, partition, n) = wire.group_head(g, items.len(), max_items)?;
        let z_len = wire.u32(|| format!("groups[{g}].z_len"))?;
        let z = wire.take(z_len, || format!("groups[{g}].z"))?;
        let (frames, raw_len) =
            decode_group(z, n, *budget).map_err(|e| bad(format!("groups[{g}]: its {n} frames: {e}")))?;
        *budget -= raw_len;
        let first = items.len();
        // Stored as received only when every frame is kept as it came.
        let mut as_received = true;
        for (i, frame) in frames.frames().enumerate() {
            let field = |name: &str| format!("groups[{g}].frames[{i}]{name}");
            let frame = frame.map_err(|e| bad(format!("{}: {e}", field(""))))?;
            if frame.trace_id.is_some() || frame.producer.is_some() {
                return Err(bad(format!(
                    "{}: a pushed frame's flags are 0; it carries no trace id (0x01) and no producer (0x02), \
                     which the broker takes from the token",
                    field("")
                )));
            }
            let transaction_id = if frame.transaction_id.is_empty() {
                as_received = false;
                frame.message_id.to_string()
            } else {
                names::check(
                    NameKind::TransactionId,
                    format_args!("groups[{g}].frames[{i}].transactionId"),
                    frame.transaction_id,
                )
                .map_err(bad)?;
                frame.transaction_id.to_owned()
            };
            check_payload(frame.payload, || field(".payload"))?;
            items.push(item(&queue, &partition, transaction_id, frame.message_id, frame.payload));
        }
        // A frame asking readers for a window larger than streaming readers allow is compressed
        // again: stored as received, the official client's framed pops would refuse it.
        if as_received && n > 0 && queen_log::window_within_streaming_limit(z) {
            let segment = Arc::new(EncodedSegment { body: z.to_vec(), raw_len, frame_count: n });
            for (index, item) in items[first..].iter_mut().enumerate() {
                item.received = Some(ReceivedFrame { segment: Arc::clone(&segment), index });
            }
        }
    }
    Ok(items)
}

/// A message of a group, as a JSON item would be: no trace id, and no producer but the token's.
fn item(queue: &str, partition: &str, transaction_id: String, message_id: Uuid, payload: &[u8]) -> PushItem {
    PushItem {
        queue: queue.to_owned(),
        partition: partition.to_owned(),
        transaction_id,
        trace_id: None,
        producer: None,
        message_id,
        payload: payload.to_vec(),
        received: None,
    }
}

/// A frames group's `z`: exactly one zstd frame declaring a size within `budget`, of exactly `n`
/// valid frames; with that size.
fn decode_group(z: &[u8], n: usize, budget: usize) -> Result<(DecodedSegment, usize), String> {
    one_zstd_frame(z)?;
    let frames = queen_log::decode_segment(z, n, budget).map_err(|e| e.to_string())?;
    // Declared, or the frames would not have decoded.
    let raw_len = zstd::zstd_safe::get_frame_content_size(z).ok().flatten().unwrap_or(u64::MAX);
    Ok((frames, usize::try_from(raw_len).unwrap_or(usize::MAX)))
}

/// A payload is one JSON document, nested no deeper than a JSON push's data may be (it is served
/// inside pop answers as it is).
fn check_payload(payload: &[u8], field: impl Fn() -> String) -> Result<(), ApiError> {
    let text = std::str::from_utf8(payload).map_err(|_| bad(format!("{}: the payload is not UTF-8", field())))?;
    if nests_deeper_than(payload, MAX_DATA_NESTING) {
        return Err(bad(format!(
            "{}: the payload nests arrays and objects more than {MAX_DATA_NESTING} levels deep",
            field()
        )));
    }
    serde_json::from_str::<&RawValue>(text)
        .map_err(|e| bad(format!("{}: the payload is not one JSON document: {e}", field())))?;
    Ok(())
}

/// Reads a body front to back; every read names what it reads, for the error.
struct Wire<'a> {
    data: &'a [u8],
    at: usize,
    /// The body's kind, as errors name it.
    kind: &'static str,
}

impl<'a> Wire<'a> {
    fn new(data: &'a [u8], kind: &'static str) -> Self {
        Wire { data, at: 0, kind }
    }

    fn take(&mut self, len: usize, what: impl FnOnce() -> String) -> Result<&'a [u8], ApiError> {
        let left = self.data.len() - self.at;
        if len > left {
            return Err(bad(format!(
                "{} body ends early: {} needs {len} bytes at byte {}, {left} are left",
                self.kind,
                what(),
                self.at
            )));
        }
        let bytes = &self.data[self.at..self.at + len];
        self.at += len;
        Ok(bytes)
    }

    fn rest(&mut self) -> &'a [u8] {
        let rest = &self.data[self.at..];
        self.at = self.data.len();
        rest
    }

    fn u8(&mut self, what: impl FnOnce() -> String) -> Result<u8, ApiError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: impl FnOnce() -> String) -> Result<usize, ApiError> {
        let bytes = self.take(2, what)?;
        Ok(usize::from(u16::from_le_bytes([bytes[0], bytes[1]])))
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<usize, ApiError> {
        let bytes = self.take(4, what)?;
        let value = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        Ok(usize::try_from(value).unwrap_or(usize::MAX))
    }

    /// A `str16`.
    fn text(&mut self, what: impl Fn() -> String) -> Result<&'a str, ApiError> {
        let len = self.u16(|| format!("{}'s length", what()))?;
        let bytes = self.take(len, &what)?;
        std::str::from_utf8(bytes).map_err(|_| bad(format!("{} is not UTF-8", what())))
    }

    fn magic(&mut self) -> Result<(), ApiError> {
        if self.data.get(..4) != Some(self.kind.as_bytes()) {
            return Err(bad(format!(
                "the body is not a {kind} body (it must start with \"{kind}\"), though its content type is \
                 {CONTENT_TYPE}",
                kind = self.kind
            )));
        }
        self.at = 4;
        Ok(())
    }

    /// The flags byte; bits outside `known` are refused, by name.
    fn flags(&mut self, known: u8) -> Result<u8, ApiError> {
        let flags = self.u8(|| "the flags".into())?;
        let unknown = flags & !known;
        if unknown != 0 {
            return Err(bad(format!(
                "{} body: flags {flags:#04x} hold bits this broker does not know: {unknown:#04x} (it knows {known:#04x})",
                self.kind
            )));
        }
        Ok(flags)
    }

    /// A group's queue, partition and message count, within `max_items` with the `so_far` before.
    fn group_head(&mut self, g: usize, so_far: usize, max_items: usize) -> Result<(String, String, usize), ApiError> {
        let mut name = |kind, key: &str| -> Result<String, ApiError> {
            let field = format!("groups[{g}].{key}");
            let name = self.text(|| field.clone())?;
            names::check_new(kind, &field, name).map_err(bad)?;
            Ok(name.to_owned())
        };
        let queue = name(NameKind::Queue, "queue")?;
        let partition = name(NameKind::Partition, "partition")?;
        let n = self.u32(|| format!("groups[{g}].n"))?;
        if n == 0 {
            return Err(bad(format!("groups[{g}] holds no message: a group has one at least")));
        }
        if n > max_items.saturating_sub(so_far) {
            return Err(bad(format!(
                "groups[{g}] holds {n} messages after {so_far}; at most {max_items} are allowed in all"
            )));
        }
        Ok((queue, partition, n))
    }

    /// Nothing may follow the last group.
    fn end(&self) -> Result<(), ApiError> {
        match self.data.len() - self.at {
            0 => Ok(()),
            left => Err(bad(format!("{} body: {left} bytes follow its last group", self.kind))),
        }
    }
}

/// The answer to a QPB1 push with flag 0x02.
#[derive(Debug, Serialize)]
pub struct PushCounts {
    count: usize,
    queued: usize,
    duplicate: usize,
    /// Always 0: a message that cannot be written fails the whole push.
    error: usize,
    /// Journaled while push maintenance is on, written later.
    #[serde(skip_serializing_if = "Option::is_none")]
    buffered: Option<usize>,
}

impl PushCounts {
    pub fn of(results: &PushResults) -> Self {
        match results {
            PushResults::Stored(pushed) => {
                let queued = pushed.iter().filter(|p| matches!(p.outcome, Appended::Queued { .. })).count();
                PushCounts { count: pushed.len(), queued, duplicate: pushed.len() - queued, error: 0, buffered: None }
            }
            PushResults::Buffered(items) => {
                PushCounts { count: items.len(), queued: 0, duplicate: 0, error: 0, buffered: Some(items.len()) }
            }
        }
    }
}

/// What a committed QTB1 transaction with flag 0x02 answers instead of the results of its pushes
/// and acks.
#[derive(Debug, Serialize)]
pub struct TransactionCounts {
    pushed: usize,
    duplicate: usize,
    acked: usize,
}

impl TransactionCounts {
    pub fn of(applied: &[Applied]) -> Self {
        let mut counts = TransactionCounts { pushed: 0, duplicate: 0, acked: 0 };
        for entry in applied {
            match entry {
                Applied::Push(Pushed { outcome: Appended::Queued { .. }, .. }) => counts.pushed += 1,
                Applied::Push(Pushed { outcome: Appended::Duplicate { .. }, .. }) => counts.duplicate += 1,
                Applied::Ack { .. } => counts.acked += 1,
                Applied::Kv(_) | Applied::Timer(_) => {}
            }
        }
        counts
    }
}
