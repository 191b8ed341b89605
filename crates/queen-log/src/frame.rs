//! One message as stored in a segment.
//!
//! ```text
//! u32 body_len | u8 flags | u8[16] message_id | [u8[16] trace_id, flag 0x01]
//!   | u16 len, transaction_id | [u16 len, producer, flag 0x02] | payload
//! ```
//!
//! All integers are little-endian; `body_len` counts every byte after itself. The payload is the
//! rest of the body (for JSON pushes, the JSON text of the message's data).

use uuid::Uuid;

use crate::{DecodeError, EncodeError, FLAG_PRODUCER, FLAG_TRACE};

const LEN_PREFIX: usize = 4;
const FIXED_BODY: usize = 1 + 16 + 2;

/// A frame borrowed from encoded bytes (or about to be encoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    pub message_id: Uuid,
    pub trace_id: Option<Uuid>,
    pub transaction_id: &'a str,
    pub producer: Option<&'a str>,
    pub payload: &'a [u8],
}

/// A frame that owns its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameOwned {
    pub message_id: Uuid,
    pub trace_id: Option<Uuid>,
    pub transaction_id: String,
    pub producer: Option<String>,
    pub payload: Vec<u8>,
}

impl FrameOwned {
    pub fn as_frame(&self) -> Frame<'_> {
        Frame {
            message_id: self.message_id,
            trace_id: self.trace_id,
            transaction_id: &self.transaction_id,
            producer: self.producer.as_deref(),
            payload: &self.payload,
        }
    }
}

impl Frame<'_> {
    pub fn to_owned(&self) -> FrameOwned {
        FrameOwned {
            message_id: self.message_id,
            trace_id: self.trace_id,
            transaction_id: self.transaction_id.to_owned(),
            producer: self.producer.map(str::to_owned),
            payload: self.payload.to_vec(),
        }
    }
}

fn body_len(frame: &Frame<'_>) -> usize {
    FIXED_BODY
        + frame.trace_id.map_or(0, |_| 16)
        + frame.transaction_id.len()
        + frame.producer.map_or(0, |p| 2 + p.len())
        + frame.payload.len()
}

/// The number of bytes [`encode_frame`] writes for this frame.
pub fn encoded_len(frame: &Frame<'_>) -> usize {
    LEN_PREFIX + body_len(frame)
}

fn check_str16(field: &'static str, value: &str) -> Result<(), EncodeError> {
    if value.len() > usize::from(u16::MAX) {
        return Err(EncodeError::FieldTooLong { field, len: value.len(), max: usize::from(u16::MAX) });
    }
    Ok(())
}

/// Appends the encoding of `frame` to `out`.
pub fn encode_frame(frame: &Frame<'_>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    check_str16("transaction id", frame.transaction_id)?;
    if let Some(producer) = frame.producer {
        check_str16("producer", producer)?;
    }
    let len = body_len(frame);
    let len32 = u32::try_from(len).map_err(|_| EncodeError::FrameTooLarge { len })?;
    let mut flags = 0u8;
    if frame.trace_id.is_some() {
        flags |= FLAG_TRACE;
    }
    if frame.producer.is_some() {
        flags |= FLAG_PRODUCER;
    }
    out.reserve(LEN_PREFIX + len);
    out.extend_from_slice(&len32.to_le_bytes());
    out.push(flags);
    out.extend_from_slice(frame.message_id.as_bytes());
    if let Some(trace) = frame.trace_id {
        out.extend_from_slice(trace.as_bytes());
    }
    // Lengths were checked above, so these casts cannot truncate.
    out.extend_from_slice(&(frame.transaction_id.len() as u16).to_le_bytes());
    out.extend_from_slice(frame.transaction_id.as_bytes());
    if let Some(producer) = frame.producer {
        out.extend_from_slice(&(producer.len() as u16).to_le_bytes());
        out.extend_from_slice(producer.as_bytes());
    }
    out.extend_from_slice(frame.payload);
    Ok(())
}

/// Reads consecutive frames from raw (decompressed) bytes.
#[derive(Debug, Clone)]
pub struct FrameIter<'a> {
    data: &'a [u8],
    at: usize,
    failed: bool,
}

impl<'a> FrameIter<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, at: 0, failed: false }
    }

    /// Where the next frame starts in the data.
    pub fn position(&self) -> usize {
        self.at
    }

    fn take(&mut self, body: &'a [u8], pos: &mut usize, n: usize, frame_at: usize) -> Result<&'a [u8], DecodeError> {
        let end = pos.checked_add(n).filter(|end| *end <= body.len()).ok_or(DecodeError::Truncated {
            at: frame_at + LEN_PREFIX + *pos,
            needed: (*pos + n).saturating_sub(body.len()),
        })?;
        let piece = &body[*pos..end];
        *pos = end;
        Ok(piece)
    }

    fn read_str16(
        &mut self,
        body: &'a [u8],
        pos: &mut usize,
        frame_at: usize,
        not_utf8: DecodeError,
    ) -> Result<&'a str, DecodeError> {
        let len = self.take(body, pos, 2, frame_at)?;
        let len = usize::from(u16::from_le_bytes([len[0], len[1]]));
        let bytes = self.take(body, pos, len, frame_at)?;
        std::str::from_utf8(bytes).map_err(|_| not_utf8)
    }

    fn next_frame(&mut self) -> Result<Frame<'a>, DecodeError> {
        let frame_at = self.at;
        let rest = &self.data[self.at..];
        if rest.len() < LEN_PREFIX {
            return Err(DecodeError::Truncated { at: frame_at, needed: LEN_PREFIX - rest.len() });
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len < FIXED_BODY {
            return Err(DecodeError::BodyTooShort { at: frame_at, len });
        }
        let available = rest.len() - LEN_PREFIX;
        if len > available {
            return Err(DecodeError::Truncated { at: frame_at + LEN_PREFIX, needed: len - available });
        }
        let body = &rest[LEN_PREFIX..LEN_PREFIX + len];
        let flags = body[0];
        if flags & !(FLAG_TRACE | FLAG_PRODUCER) != 0 {
            return Err(DecodeError::UnsupportedFlags { at: frame_at, flags });
        }
        let mut pos = 1;
        let id = self.take(body, &mut pos, 16, frame_at)?;
        let message_id = Uuid::from_slice(id).map_err(|_| DecodeError::Truncated { at: frame_at, needed: 16 })?;
        let trace_id = if flags & FLAG_TRACE != 0 {
            let trace = self.take(body, &mut pos, 16, frame_at)?;
            Some(Uuid::from_slice(trace).map_err(|_| DecodeError::Truncated { at: frame_at, needed: 16 })?)
        } else {
            None
        };
        let transaction_id =
            self.read_str16(body, &mut pos, frame_at, DecodeError::TransactionIdNotUtf8 { at: frame_at })?;
        let producer = if flags & FLAG_PRODUCER != 0 {
            Some(self.read_str16(body, &mut pos, frame_at, DecodeError::ProducerNotUtf8 { at: frame_at })?)
        } else {
            None
        };
        self.at += LEN_PREFIX + len;
        Ok(Frame { message_id, trace_id, transaction_id, producer, payload: &body[pos..] })
    }
}

impl<'a> Iterator for FrameIter<'a> {
    type Item = Result<Frame<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.at >= self.data.len() {
            return None;
        }
        let result = self.next_frame();
        self.failed = result.is_err();
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FrameOwned {
        FrameOwned {
            message_id: Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001),
            trace_id: None,
            transaction_id: "tx-1".into(),
            producer: None,
            payload: br#"{"a":1}"#.to_vec(),
        }
    }

    #[test]
    fn layout_matches_the_client_stored_frame() {
        let frame = sample();
        let mut out = Vec::new();
        encode_frame(&frame.as_frame(), &mut out).unwrap();
        // body_len = flags(1) + id(16) + u16 + "tx-1"(4) + payload(7)
        assert_eq!(&out[..4], &(1u32 + 16 + 2 + 4 + 7).to_le_bytes());
        assert_eq!(out[4], 0);
        assert_eq!(&out[5..21], frame.message_id.as_bytes());
        assert_eq!(&out[21..23], &4u16.to_le_bytes());
        assert_eq!(&out[23..27], b"tx-1");
        assert_eq!(&out[27..], br#"{"a":1}"#);
        assert_eq!(out.len(), encoded_len(&frame.as_frame()));
    }

    #[test]
    fn optional_fields_set_their_flags() {
        let mut frame = sample();
        frame.trace_id = Some(Uuid::from_u128(7));
        frame.producer = Some("svc".into());
        let mut out = Vec::new();
        encode_frame(&frame.as_frame(), &mut out).unwrap();
        assert_eq!(out[4], FLAG_TRACE | FLAG_PRODUCER);
        let decoded: Vec<_> = FrameIter::new(&out).collect::<Result<_, _>>().unwrap();
        assert_eq!(decoded, vec![frame.as_frame()]);
    }

    #[test]
    fn over_long_transaction_id_is_refused() {
        let mut frame = sample();
        frame.transaction_id = "x".repeat(70_000);
        let err = encode_frame(&frame.as_frame(), &mut Vec::new()).unwrap_err();
        assert!(matches!(err, EncodeError::FieldTooLong { field: "transaction id", .. }));
    }

    #[test]
    fn encrypted_frames_are_refused() {
        let mut out = Vec::new();
        encode_frame(&sample().as_frame(), &mut out).unwrap();
        out[4] = crate::FLAG_ENCRYPTED;
        let err = FrameIter::new(&out).next().unwrap().unwrap_err();
        assert_eq!(err, DecodeError::UnsupportedFlags { at: 0, flags: crate::FLAG_ENCRYPTED });
    }

    #[test]
    fn iteration_stops_after_the_first_error() {
        let mut out = Vec::new();
        encode_frame(&sample().as_frame(), &mut out).unwrap();
        out.extend_from_slice(&[1, 2]);
        let results: Vec<_> = FrameIter::new(&out).collect();
        assert_eq!(results.len(), 2);
        assert!(results[0].is_ok());
        assert!(matches!(results[1], Err(DecodeError::Truncated { .. })));
    }
}
