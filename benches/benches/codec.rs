//! The segment codec on a 100-message push batch: encoding and compressing it as the broker
//! stores it, and decompressing and walking it as a pop reads it.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use queen_log::{Frame, FrameOwned, SegmentBuilder, decode_segment};

/// Messages per segment, as a push of batch 100 makes.
const MESSAGES: usize = 100;
/// Bound on the decompressed size, far above what the benchmark's segment needs.
const MAX_RAW: usize = 16 << 20;

/// A hundred frames shaped like the load generator's: ~100-byte JSON payloads, transaction ids
/// naming a stream and a sequence number.
fn frames() -> Vec<FrameOwned> {
    (0..MESSAGES)
        .map(|i| FrameOwned {
            message_id: queen_log::new_message_id(),
            trace_id: None,
            transaction_id: format!("push-b100-{i:010}"),
            producer: None,
            payload: format!(
                r#"{{"seq":{i},"sentUs":{},"body":"{}"}}"#,
                1_000_000 + i,
                "qwertyuiopasdfghjklzxcvbnm".repeat(2)
            )
            .into_bytes(),
        })
        .collect()
}

fn encode(frames: &[FrameOwned]) -> queen_log::EncodedSegment {
    let mut builder = SegmentBuilder::new();
    for frame in frames {
        builder.push(&frame.as_frame()).expect("benchmark frames are well-formed");
    }
    builder.finish().expect("benchmark frames compress")
}

fn codec(c: &mut Criterion) {
    let frames = frames();
    let segment = encode(&frames);
    let mut group = c.benchmark_group("segment_100_messages");
    group.throughput(Throughput::Elements(MESSAGES as u64));
    group.bench_function("encode_and_compress", |b| b.iter(|| encode(black_box(&frames))));
    group.bench_function("decompress_and_iterate", |b| {
        b.iter(|| {
            let decoded = decode_segment(black_box(&segment.body), MESSAGES, MAX_RAW).expect("a valid segment");
            decoded.frames().map(|f| f.map_or(0, |f: Frame<'_>| f.payload.len())).sum::<usize>()
        })
    });
    group.bench_function("decompress_and_slice_last_10", |b| {
        // A pop whose cursor is 90 messages into the segment: decode, skip, copy out the rest.
        b.iter(|| {
            let decoded = decode_segment(black_box(&segment.body), MESSAGES, MAX_RAW).expect("a valid segment");
            decoded.frames().skip(MESSAGES - 10).filter_map(Result::ok).map(|f| f.to_owned()).collect::<Vec<_>>()
        })
    });
    group.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
