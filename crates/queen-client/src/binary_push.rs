//! The binary push body in its compressed form (QPB1 with frames groups, what the official
//! clients send with `binary_push` and `push_compression`):
//!
//! ```text
//! "QPB1" | u8 flags (0x08) | u32 groups
//! group: str16 queue | str16 partition | u32 n | u32 z_len | z
//! z:     one zstd frame, declaring its size, of n frames in the log's stored layout
//! ```
//!
//! Integers are little-endian, `str16` is a u16 byte length and UTF-8. Consecutive items of one
//! queue and partition make a group. The client mints each message's id, and the broker stores a
//! group's compressed bytes as received, without decoding and compressing again.

use queen_log::{Frame, encode_frame};

use crate::PushItem;

/// The content type of a binary push body.
pub(crate) const CONTENT_TYPE: &str = "application/x-queen-push";

const MAGIC: &[u8; 4] = b"QPB1";
const FLAG_FRAMES: u8 = 0x08;

/// The QPB1 body of `items`, or why they cannot travel in one: a trace id (a frames group's
/// frames carry none), or a name or transaction id longer than its length prefix allows.
pub(crate) fn encode(items: &[PushItem]) -> Result<Vec<u8>, String> {
    let groups: Vec<&[PushItem]> =
        items.chunk_by(|a, b| a.queue() == b.queue() && a.partition() == b.partition()).collect();
    let mut out = MAGIC.to_vec();
    out.push(FLAG_FRAMES);
    put_u32(&mut out, groups.len())?;
    let mut frames = Vec::new();
    for group in groups {
        let first = &group[0];
        put_str16(&mut out, first.queue())?;
        put_str16(&mut out, first.partition())?;
        put_u32(&mut out, group.len())?;
        frames.clear();
        for item in group {
            if item.trace_id().is_some() {
                return Err("an item carries a trace id".into());
            }
            let frame = Frame {
                message_id: uuid::Uuid::now_v7(),
                trace_id: None,
                transaction_id: item.transaction_id(),
                producer: None,
                payload: item.payload().get().as_bytes(),
            };
            encode_frame(&frame, &mut frames).map_err(|e| e.to_string())?;
        }
        let compressed = queen_log::zstd_contexts::compress_segment(&frames).map_err(|e| format!("zstd: {e}"))?;
        put_u32(&mut out, compressed.len())?;
        out.extend_from_slice(&compressed);
    }
    Ok(out)
}

fn put_u32(out: &mut Vec<u8>, n: usize) -> Result<(), String> {
    let n = u32::try_from(n).map_err(|_| format!("{n} is past a u32"))?;
    out.extend_from_slice(&n.to_le_bytes());
    Ok(())
}

fn put_str16(out: &mut Vec<u8>, text: &str) -> Result<(), String> {
    let len = u16::try_from(text.len()).map_err(|_| format!("a name of {} bytes is past a u16", text.len()))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use queen_log::decode_segment;
    use serde_json::json;

    use super::*;

    #[test]
    fn consecutive_items_of_a_partition_make_one_compressed_group_of_stored_frames() {
        let items = [
            PushItem::new("q", &json!({"a": 1})).unwrap().with_partition("p").with_transaction_id("t1"),
            PushItem::new("q", &json!({"a": 2})).unwrap().with_partition("p").with_transaction_id("t2"),
            PushItem::new("q", &3).unwrap().with_transaction_id("t3"),
        ];
        let body = encode(&items).unwrap();
        assert_eq!(&body[..5], b"QPB1\x08");
        assert_eq!(u32::from_le_bytes(body[5..9].try_into().unwrap()), 2, "two groups");
        let mut at = 9;
        let mut groups = Vec::new();
        while at < body.len() {
            let mut str16 = || {
                let len = usize::from(u16::from_le_bytes([body[at], body[at + 1]]));
                let text = std::str::from_utf8(&body[at + 2..at + 2 + len]).unwrap().to_owned();
                at += 2 + len;
                text
            };
            let (queue, partition) = (str16(), str16());
            let n = u32::from_le_bytes(body[at..at + 4].try_into().unwrap()) as usize;
            let z_len = u32::from_le_bytes(body[at + 4..at + 8].try_into().unwrap()) as usize;
            let segment = decode_segment(&body[at + 8..at + 8 + z_len], n, 1 << 20).unwrap();
            let frames: Vec<(String, Vec<u8>)> = segment
                .frames()
                .map(|f| f.map(|f| (f.transaction_id.to_owned(), f.payload.to_vec())).unwrap())
                .collect();
            groups.push((queue, partition, frames));
            at += 8 + z_len;
        }
        assert_eq!(
            groups,
            [
                (
                    "q".into(),
                    "p".into(),
                    vec![("t1".into(), br#"{"a":1}"#.to_vec()), ("t2".into(), br#"{"a":2}"#.to_vec())]
                ),
                ("q".into(), "Default".into(), vec![("t3".into(), b"3".to_vec())]),
            ]
        );
    }

    #[test]
    fn an_item_with_a_trace_id_cannot_travel_in_frames() {
        let traced = PushItem::new("q", &1).unwrap().with_trace_id(uuid::Uuid::now_v7());
        assert!(encode(&[traced]).is_err());
        let long = PushItem::new("q".repeat(70_000), &1).unwrap();
        assert!(encode(&[long]).is_err());
    }
}
