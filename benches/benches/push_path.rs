//! The JSON push path of the broker without IO: parse a 100-item push body, turn the items into
//! messages and build the compressed segment the partition writer would append.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use queen_broker::broker::push::PushItem;
use queen_broker::http::parse_push_body;
use queen_log::{Frame, SegmentBuilder};
use queen_store::log::NewMessage;

const ITEMS: usize = 100;
/// The broker's default `push.max_items`.
const MAX_ITEMS: usize = 10_000;

/// A push body as the load generator sends it at batch 100: one partition, ~100-byte payloads.
fn body() -> Vec<u8> {
    let items: Vec<String> = (0..ITEMS)
        .map(|i| {
            format!(
                r#"{{"queue":"bench-queue","partition":"p7","transactionId":"push-b100-{i:010}","payload":{{"seq":{i},"sentUs":{},"body":"{}"}}}}"#,
                1_000_000 + i,
                "qwertyuiopasdfghjklzxcvbnm".repeat(2)
            )
        })
        .collect();
    format!(r#"{{"items":[{}]}}"#, items.join(",")).into_bytes()
}

/// The segment the broker stores for these messages: one frame each, compressed once.
fn segment(messages: &[NewMessage]) -> queen_log::EncodedSegment {
    let mut builder = SegmentBuilder::new();
    for message in messages {
        let frame = Frame {
            message_id: message.message_id,
            trace_id: message.trace_id,
            transaction_id: &message.transaction_id,
            producer: None,
            payload: &message.payload,
        };
        builder.push(&frame).expect("benchmark frames are well-formed");
    }
    builder.finish().expect("benchmark frames compress")
}

fn push_path(c: &mut Criterion) {
    let body = body();
    let mut group = c.benchmark_group("push_100_items");
    group.throughput(Throughput::Elements(ITEMS as u64));
    group.bench_function("parse", |b| {
        b.iter(|| parse_push_body(black_box(&body), MAX_ITEMS).expect("a valid push body"))
    });
    group.bench_function("parse_and_build_segment", |b| {
        b.iter(|| {
            let items = parse_push_body(black_box(&body), MAX_ITEMS).expect("a valid push body");
            let messages: Vec<NewMessage> = items.iter().map(PushItem::to_message).collect();
            segment(&messages)
        })
    });
    group.finish();
}

criterion_group!(benches, push_path);
criterion_main!(benches);
