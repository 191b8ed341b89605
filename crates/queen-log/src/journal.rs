//! The push journal's record format: what a broker writes to its local disk for a push it accepts
//! while push maintenance is on, and reads back to replay it into the log.
//!
//! ```text
//! file   = magic "QJOURNL1" | record*
//! record = u32 body_len | u32 crc32(body) | body
//! body   = entry+
//! entry  = u16 len, queue | u16 len, partition | frame (see `frame`)
//! ```
//!
//! All integers are little-endian. One record is one accepted push request; its entries keep the
//! request's order. A record is written whole and made durable before the push is answered, so a
//! record that cannot be read back (a crash cut the write short, or the disk corrupted it) was
//! never acknowledged: readers report it and go on, they never fail the file.

use crate::frame::{Frame, FrameIter, encode_frame, encoded_len};
use crate::{DecodeError, EncodeError};

/// The first bytes of every journal file.
pub const JOURNAL_MAGIC: &[u8; 8] = b"QJOURNL1";

const RECORD_HEADER: usize = 8;

/// One message of a journal record: where it goes, and the message as it will be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalEntry<'a> {
    pub queue: &'a str,
    pub partition: &'a str,
    pub frame: Frame<'a>,
}

fn put_str16(field: &'static str, value: &str, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let len = u16::try_from(value.len()).map_err(|_| EncodeError::FieldTooLong {
        field,
        len: value.len(),
        max: usize::from(u16::MAX),
    })?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(value.as_bytes());
    Ok(())
}

/// Appends one record holding `entries` to `out`.
pub fn encode_record(entries: &[JournalEntry<'_>], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let start = out.len();
    out.extend_from_slice(&[0; RECORD_HEADER]);
    for entry in entries {
        put_str16("queue", entry.queue, out)?;
        put_str16("partition", entry.partition, out)?;
        encode_frame(&entry.frame, out)?;
    }
    let body = &out[start + RECORD_HEADER..];
    let len = u32::try_from(body.len()).map_err(|_| EncodeError::FrameTooLarge { len: body.len() })?;
    let crc = crc32fast::hash(body);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + RECORD_HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Why part of a journal could not be read. Either way the bytes were never acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalDefect {
    /// The file does not start with [`JOURNAL_MAGIC`]; nothing of it is read.
    #[error("not a push journal (bad magic)")]
    NotAJournal,
    /// The record at `at` ends past the end of the data: a write cut short. Reading stops.
    #[error("torn record at byte {at}: {missing} bytes missing")]
    Torn { at: usize, missing: usize },
    /// The record at `at` is complete but its checksum or contents are wrong; it is skipped.
    #[error("corrupt record at byte {at}: {reason}")]
    Corrupt { at: usize, reason: String },
}

/// Reads the records of a whole journal file: each item is one record's entries, or a defect.
/// After [`JournalDefect::NotAJournal`] or [`JournalDefect::Torn`] nothing more is read.
pub struct JournalReader<'a> {
    data: &'a [u8],
    at: usize,
    done: bool,
}

impl<'a> JournalReader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, at: 0, done: false }
    }

    fn next_record(&mut self) -> Result<Vec<JournalEntry<'a>>, JournalDefect> {
        let at = self.at;
        let rest = &self.data[at..];
        let torn = |missing| JournalDefect::Torn { at, missing };
        if rest.len() < RECORD_HEADER {
            return Err(torn(RECORD_HEADER - rest.len()));
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let available = rest.len() - RECORD_HEADER;
        if len > available {
            return Err(torn(len - available));
        }
        let body = &rest[RECORD_HEADER..RECORD_HEADER + len];
        self.at += RECORD_HEADER + len;
        let corrupt = |reason: String| JournalDefect::Corrupt { at, reason };
        if crc32fast::hash(body) != crc {
            return Err(corrupt("checksum mismatch".into()));
        }
        decode_body(body).map_err(|e| corrupt(e.to_string()))
    }
}

impl<'a> Iterator for JournalReader<'a> {
    type Item = Result<Vec<JournalEntry<'a>>, JournalDefect>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.at == 0 {
            if !self.data.starts_with(JOURNAL_MAGIC) {
                self.done = true;
                return Some(Err(JournalDefect::NotAJournal));
            }
            self.at = JOURNAL_MAGIC.len();
        }
        if self.at >= self.data.len() {
            self.done = true;
            return None;
        }
        let record = self.next_record();
        self.done = matches!(record, Err(JournalDefect::Torn { .. }));
        Some(record)
    }
}

fn take_str16<'a>(body: &'a [u8], pos: &mut usize) -> Result<&'a str, DecodeError> {
    let truncated = |needed| DecodeError::Truncated { at: *pos, needed };
    let len = body.get(*pos..*pos + 2).ok_or_else(|| truncated(2))?;
    let len = usize::from(u16::from_le_bytes([len[0], len[1]]));
    let bytes = body.get(*pos + 2..*pos + 2 + len).ok_or_else(|| truncated(len))?;
    let value = std::str::from_utf8(bytes).map_err(|_| DecodeError::NameNotUtf8 { at: *pos })?;
    *pos += 2 + len;
    Ok(value)
}

fn decode_body(body: &[u8]) -> Result<Vec<JournalEntry<'_>>, DecodeError> {
    let mut entries = Vec::new();
    let mut pos = 0;
    while pos < body.len() {
        let queue = take_str16(body, &mut pos)?;
        let partition = take_str16(body, &mut pos)?;
        let frame = FrameIter::new(&body[pos..]).next().ok_or(DecodeError::Truncated { at: pos, needed: 4 })??;
        pos += encoded_len(&frame);
        entries.push(JournalEntry { queue, partition, frame });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    fn entry<'a>(queue: &'a str, partition: &'a str, transaction_id: &'a str, payload: &'a [u8]) -> JournalEntry<'a> {
        JournalEntry {
            queue,
            partition,
            frame: Frame {
                message_id: Uuid::from_u128(payload.len() as u128 + 1),
                trace_id: (partition == "traced").then(|| Uuid::from_u128(9)),
                transaction_id,
                producer: None,
                payload,
            },
        }
    }

    fn journal(records: &[Vec<JournalEntry<'_>>]) -> (Vec<u8>, Vec<usize>) {
        let mut out = JOURNAL_MAGIC.to_vec();
        let mut starts = Vec::new();
        for record in records {
            starts.push(out.len());
            encode_record(record, &mut out).unwrap();
        }
        (out, starts)
    }

    fn sample() -> Vec<Vec<JournalEntry<'static>>> {
        vec![
            vec![entry("orders", "eu", "t1", br#"{"n":1}"#), entry("orders eu", "traced", "t2", b"null")],
            vec![entry("q", "Default", "t3", br#"[1, 2.50]"#)],
            vec![entry("q", "p", "t4", b"\"x\"")],
        ]
    }

    #[test]
    fn records_round_trip_in_order() {
        let records = sample();
        let (data, _) = journal(&records);
        let read: Vec<_> = JournalReader::new(&data).collect::<Result<_, _>>().unwrap();
        assert_eq!(read, records);
        assert_eq!(JournalReader::new(JOURNAL_MAGIC).count(), 0, "an empty journal has no records");
    }

    #[test]
    fn a_torn_tail_is_reported_and_ends_the_read() {
        let records = sample();
        let (data, starts) = journal(&records);
        for cut in starts[2] + 1..data.len() {
            let read: Vec<_> = JournalReader::new(&data[..cut]).collect();
            assert_eq!(read.len(), 3, "cut at {cut}");
            assert_eq!(read[..2], [Ok(records[0].clone()), Ok(records[1].clone())]);
            assert!(matches!(read[2], Err(JournalDefect::Torn { at, .. }) if at == starts[2]), "cut at {cut}");
        }
    }

    #[test]
    fn a_corrupt_record_is_skipped_and_the_rest_is_read() {
        let records = sample();
        let (mut data, starts) = journal(&records);
        let last = starts[2] - 1;
        data[last] ^= 0x40;
        let read: Vec<_> = JournalReader::new(&data).collect();
        assert_eq!(read.len(), 3);
        assert_eq!(read[0], Ok(records[0].clone()));
        assert!(matches!(&read[1], Err(JournalDefect::Corrupt { at, .. }) if *at == starts[1]), "{:?}", read[1]);
        assert_eq!(read[2], Ok(records[2].clone()));
    }

    #[test]
    fn a_file_without_the_magic_is_not_read() {
        let (mut data, _) = journal(&sample());
        data[0] = b'X';
        assert_eq!(JournalReader::new(&data).collect::<Vec<_>>(), vec![Err(JournalDefect::NotAJournal)]);
    }
}
