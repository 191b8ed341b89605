//! A segment: the frames of one committed push batch, concatenated and zstd-compressed.

use crate::{DecodeError, EncodeError, Frame, FrameIter, encode_frame};

/// Compression level for segments the broker writes: level 1 is what the official client uses
/// for the segments it compresses itself, and keeps compression cheap on the push path.
pub const SEGMENT_ZSTD_LEVEL: i32 = 1;

/// Collects frames for one segment.
#[derive(Debug, Default)]
pub struct SegmentBuilder {
    raw: Vec<u8>,
    frame_count: usize,
}

/// A compressed segment ready to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedSegment {
    /// One zstd frame that declares its content size.
    pub body: Vec<u8>,
    /// Length of the decompressed frames.
    pub raw_len: usize,
    pub frame_count: usize,
}

impl SegmentBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, frame: &Frame<'_>) -> Result<(), EncodeError> {
        encode_frame(frame, &mut self.raw)?;
        self.frame_count += 1;
        Ok(())
    }

    pub fn frame_count(&self) -> usize {
        self.frame_count
    }

    pub fn is_empty(&self) -> bool {
        self.frame_count == 0
    }

    /// Compresses the collected frames.
    pub fn finish(self) -> Result<EncodedSegment, EncodeError> {
        let body = crate::zstd_contexts::compress_segment(&self.raw).map_err(|e| EncodeError::Zstd(e.to_string()))?;
        Ok(EncodedSegment { body, raw_len: self.raw.len(), frame_count: self.frame_count })
    }
}

/// The decompressed, validated frames of a segment, with where each frame starts, so that a
/// reader of a few offsets goes straight to them instead of walking every frame before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedSegment {
    raw: Vec<u8>,
    /// The byte position of each frame in `raw` (a segment is at most a few hundred MiB).
    starts: Vec<u32>,
}

impl DecodedSegment {
    pub fn frame_count(&self) -> usize {
        self.starts.len()
    }

    /// The frames in offset order. Every frame was validated by [`decode_segment`], so the
    /// iterator yields no errors; it keeps the `Result` so callers need no `unwrap`.
    pub fn frames(&self) -> FrameIter<'_> {
        self.frames_from(0)
    }

    /// The frames from the `index`th (0-based) on; none when there are not that many.
    pub fn frames_from(&self, index: usize) -> FrameIter<'_> {
        let at = self.starts.get(index).map_or(self.raw.len(), |&start| start as usize);
        FrameIter::new(&self.raw[at..])
    }

    /// Bytes this segment holds in memory (its frames and their positions).
    pub fn memory_len(&self) -> usize {
        self.raw.len() + self.starts.len() * std::mem::size_of::<u32>()
    }
}

/// The largest window a streaming zstd reader allows unless told otherwise
/// (`ZSTD_WINDOWLOG_LIMIT_DEFAULT`, 2^27 bytes). The official Python client decodes the segments
/// of a framed pop that way and refuses a frame that asks for more.
pub const STREAMING_WINDOW_LIMIT: u64 = 1 << 27;

/// Whether a zstd frame's window is one every reader takes (at most [`STREAMING_WINDOW_LIMIT`]).
/// A single-segment frame has no window of its own: it is the content, which its reader holds
/// whole anyway. Other frames say theirs in the byte after the header descriptor.
pub fn window_within_streaming_limit(frame: &[u8]) -> bool {
    let Some(&descriptor) = frame.get(4) else { return false };
    if descriptor & 0x20 != 0 {
        return true;
    }
    let Some(&window) = frame.get(5) else { return false };
    let base = 1u64 << (10 + u32::from(window >> 3));
    base + base / 8 * u64::from(window & 7) <= STREAMING_WINDOW_LIMIT
}

/// Decompresses a segment body and checks that it holds exactly `expected_frames` well-formed
/// frames. `max_raw_len` bounds the memory a corrupt or hostile body can make us allocate.
pub fn decode_segment(body: &[u8], expected_frames: usize, max_raw_len: usize) -> Result<DecodedSegment, DecodeError> {
    let declared = zstd::zstd_safe::get_frame_content_size(body)
        .map_err(|_| DecodeError::Zstd("not a zstd frame".into()))?
        .ok_or_else(|| DecodeError::Zstd("the frame does not declare its content size".into()))?;
    let declared = usize::try_from(declared).unwrap_or(usize::MAX);
    let limit = max_raw_len.min(u32::MAX as usize);
    if declared > limit {
        return Err(DecodeError::TooLarge { len: declared, limit });
    }
    let raw = crate::zstd_contexts::decompress(body, declared).map_err(|e| DecodeError::Zstd(e.to_string()))?;
    if raw.len() != declared {
        return Err(DecodeError::LengthMismatch { expected: declared, actual: raw.len() });
    }
    let mut starts = Vec::with_capacity(expected_frames.min(raw.len()));
    let mut frames = FrameIter::new(&raw);
    loop {
        // Within `limit`, which fits in a u32.
        let start = frames.position() as u32;
        match frames.next() {
            Some(frame) => {
                frame?;
                starts.push(start);
            }
            None => break,
        }
    }
    if starts.len() != expected_frames {
        return Err(DecodeError::CountMismatch { expected: expected_frames, actual: starts.len() });
    }
    Ok(DecodedSegment { raw, starts })
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::FrameOwned;

    #[test]
    fn a_window_past_what_streaming_readers_allow_is_told_apart() {
        let frame = crate::zstd_contexts::compress_segment(&[7; 300_000]).expect("compressed");
        assert!(window_within_streaming_limit(&frame), "the broker's own segments");
        // Not one segment, and a window of 2^27 (exponent 17), 2^27 + 2^24 (mantissa 1), 2^31.
        let asking = |window: u8| [&frame[..4], &[frame[4] & !0x20, window], &frame[5..]].concat();
        assert!(window_within_streaming_limit(&asking(17 << 3)));
        assert!(!window_within_streaming_limit(&asking(17 << 3 | 1)));
        assert!(!window_within_streaming_limit(&asking(21 << 3)));
        assert!(!window_within_streaming_limit(&frame[..4]), "cut short");
    }

    fn frames(n: usize) -> Vec<FrameOwned> {
        (0..n)
            .map(|i| FrameOwned {
                message_id: Uuid::from_u128(i as u128 + 1),
                trace_id: None,
                transaction_id: format!("tx-{i}"),
                producer: None,
                payload: format!(r#"{{"i":{i}}}"#).into_bytes(),
            })
            .collect()
    }

    fn encode(frames: &[FrameOwned]) -> EncodedSegment {
        let mut builder = SegmentBuilder::new();
        for frame in frames {
            builder.push(&frame.as_frame()).unwrap();
        }
        builder.finish().unwrap()
    }

    #[test]
    fn round_trip() {
        let input = frames(100);
        let segment = encode(&input);
        assert_eq!(segment.frame_count, 100);
        let decoded = decode_segment(&segment.body, 100, 1 << 20).unwrap();
        let output: Vec<_> = decoded.frames().map(|f| f.unwrap().to_owned()).collect();
        assert_eq!(output, input);
    }

    #[test]
    fn frames_from_an_index_start_at_that_frame() {
        let input = frames(100);
        let decoded = decode_segment(&encode(&input).body, 100, 1 << 20).unwrap();
        for index in [0, 1, 57, 99] {
            let output: Vec<_> = decoded.frames_from(index).map(|f| f.unwrap().to_owned()).collect();
            assert_eq!(output, input[index..]);
        }
        assert_eq!(decoded.frames_from(100).count(), 0);
        assert_eq!(decoded.frames_from(1000).count(), 0);
    }

    #[test]
    fn a_wrong_frame_count_is_an_error() {
        let segment = encode(&frames(3));
        assert_eq!(
            decode_segment(&segment.body, 4, 1 << 20).unwrap_err(),
            DecodeError::CountMismatch { expected: 4, actual: 3 }
        );
    }

    #[test]
    fn the_size_limit_is_checked_before_decompressing() {
        let segment = encode(&frames(10));
        let err = decode_segment(&segment.body, 10, 8).unwrap_err();
        assert!(matches!(err, DecodeError::TooLarge { limit: 8, .. }));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(decode_segment(b"not zstd at all", 1, 1 << 20).is_err());
        assert!(decode_segment(&[], 0, 1 << 20).is_err());
    }
}
