//! Property tests of the frame and segment codec: everything encoded decodes to itself, and no
//! input, however damaged, makes a decoder panic.

use proptest::prelude::*;
use queen_log::{FrameIter, FrameOwned, SegmentBuilder, decode_segment};
use uuid::Uuid;

fn frame() -> impl Strategy<Value = FrameOwned> {
    (
        any::<u128>(),
        proptest::option::of(any::<u128>()),
        "\\PC{0,40}",
        proptest::option::of("\\PC{0,20}"),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(id, trace, transaction_id, producer, payload)| FrameOwned {
            message_id: Uuid::from_u128(id),
            trace_id: trace.map(Uuid::from_u128),
            transaction_id,
            producer,
            payload,
        })
}

fn encode(frames: &[FrameOwned]) -> (Vec<u8>, Vec<u8>) {
    let mut builder = SegmentBuilder::new();
    let mut raw = Vec::new();
    for frame in frames {
        builder.push(&frame.as_frame()).unwrap();
        queen_log::encode_frame(&frame.as_frame(), &mut raw).unwrap();
    }
    (builder.finish().unwrap().body, raw)
}

proptest! {
    #[test]
    fn segments_round_trip(frames in proptest::collection::vec(frame(), 0..40)) {
        let (body, _) = encode(&frames);
        let decoded = decode_segment(&body, frames.len(), 1 << 24).unwrap();
        let back: Vec<FrameOwned> = decoded.frames().map(|f| f.unwrap().to_owned()).collect();
        prop_assert_eq!(back, frames);
    }

    #[test]
    fn every_truncation_of_raw_frames_is_an_error(frames in proptest::collection::vec(frame(), 1..8), cut in any::<prop::sample::Index>()) {
        let (_, raw) = encode(&frames);
        let cut = cut.index(raw.len());
        let parsed: Vec<_> = FrameIter::new(&raw[..cut]).collect();
        // A cut at a frame boundary yields fewer whole frames; anywhere else ends in an error.
        let whole = parsed.iter().filter(|r| r.is_ok()).count();
        prop_assert!(whole < frames.len());
        let boundary = {
            let mut at = 0;
            let mut boundaries = vec![0];
            for frame in &frames {
                at += queen_log::encoded_len(&frame.as_frame());
                boundaries.push(at);
            }
            boundaries.contains(&cut)
        };
        prop_assert_eq!(parsed.last().is_some_and(Result::is_err), !boundary);
    }

    #[test]
    fn corrupt_segments_never_panic(frames in proptest::collection::vec(frame(), 0..8), flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6), count in 0usize..10) {
        let (mut body, _) = encode(&frames);
        for (at, byte) in flips {
            let at = at.index(body.len());
            body[at] ^= byte | 1;
        }
        if let Ok(decoded) = decode_segment(&body, count, 1 << 20) {
            prop_assert_eq!(decoded.frames().count(), count);
            prop_assert!(decoded.frames().all(|f| f.is_ok()));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), count in 0usize..4) {
        let _ = decode_segment(&bytes, count, 1 << 20);
        for frame in FrameIter::new(&bytes) {
            let _ = frame;
        }
    }
}
