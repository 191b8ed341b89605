//! Property tests of the frame and segment codec: everything encoded decodes to itself, and no
//! input, however damaged, makes a decoder panic: neither bytes at random nor damage aimed at one
//! field (lengths, flags, a zstd header); the same for push journals and sealed blobs.

use proptest::prelude::*;
use queen_log::{
    Cipher, DecodeError, FrameIter, FrameOwned, JOURNAL_MAGIC, JournalDefect, JournalEntry, JournalReader,
    SegmentBuilder, decode_segment, encode_record,
};
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

// Structure-aware damage: what a disk, a bug or a hostile writer does to one field, after which
// the bytes are compressed again, so that it is the frame parser (not zstd) that meets it.

/// Where each frame of raw frames starts.
fn starts_of(frames: &[FrameOwned]) -> Vec<usize> {
    frames
        .iter()
        .scan(0, |at, frame| {
            let start = *at;
            *at += queen_log::encoded_len(&frame.as_frame());
            Some(start)
        })
        .collect()
}

/// A change to one field of one frame.
#[derive(Debug, Clone)]
enum FieldDamage {
    /// `body_len` becomes this.
    BodyLen(u32),
    /// `body_len` moves by this much.
    BodyLenBy(i8),
    Flags(u8),
    /// The transaction id's `u16` length becomes this.
    TransactionIdLen(u16),
    /// The transaction id's length moves by this much.
    TransactionIdLenBy(i8),
    /// A byte of the transaction id becomes one no UTF-8 text holds.
    NotUtf8(prop::sample::Index, u8),
    /// The raw bytes end there.
    Truncate(prop::sample::Index),
    /// Bytes follow the last frame.
    Append(Vec<u8>),
}

fn field_damage() -> impl Strategy<Value = FieldDamage> {
    prop_oneof![
        prop_oneof![Just(0u32), Just(18), Just(19), Just(u32::MAX), any::<u32>()].prop_map(FieldDamage::BodyLen),
        any::<i8>().prop_map(FieldDamage::BodyLenBy),
        any::<u8>().prop_map(FieldDamage::Flags),
        prop_oneof![Just(0u16), Just(u16::MAX), any::<u16>()].prop_map(FieldDamage::TransactionIdLen),
        any::<i8>().prop_map(FieldDamage::TransactionIdLenBy),
        (any::<prop::sample::Index>(), prop::sample::select(vec![0x80u8, 0xc0, 0xc3, 0xed, 0xf5, 0xff]))
            .prop_map(|(at, byte)| FieldDamage::NotUtf8(at, byte)),
        any::<prop::sample::Index>().prop_map(FieldDamage::Truncate),
        proptest::collection::vec(any::<u8>(), 1..40).prop_map(FieldDamage::Append),
    ]
}

fn damage(raw: &mut Vec<u8>, frames: &[FrameOwned], which: prop::sample::Index, damage: &FieldDamage) {
    let k = which.index(frames.len());
    let start = starts_of(frames)[k];
    let body_len = u32::from_le_bytes(raw[start..start + 4].try_into().unwrap());
    let id_len_at = start + 4 + 1 + 16 + if frames[k].trace_id.is_some() { 16 } else { 0 };
    let id_len = u16::from_le_bytes([raw[id_len_at], raw[id_len_at + 1]]);
    match damage {
        FieldDamage::BodyLen(len) => raw[start..start + 4].copy_from_slice(&len.to_le_bytes()),
        FieldDamage::BodyLenBy(by) => {
            raw[start..start + 4].copy_from_slice(&body_len.wrapping_add_signed(i32::from(*by)).to_le_bytes())
        }
        FieldDamage::Flags(flags) => raw[start + 4] = *flags,
        FieldDamage::TransactionIdLen(len) => raw[id_len_at..id_len_at + 2].copy_from_slice(&len.to_le_bytes()),
        FieldDamage::TransactionIdLenBy(by) => {
            raw[id_len_at..id_len_at + 2].copy_from_slice(&id_len.wrapping_add_signed(i16::from(*by)).to_le_bytes())
        }
        FieldDamage::NotUtf8(at, byte) => {
            if id_len > 0 {
                raw[id_len_at + 2 + at.index(usize::from(id_len))] = *byte;
            }
        }
        FieldDamage::Truncate(at) => raw.truncate(at.index(raw.len())),
        FieldDamage::Append(tail) => raw.extend_from_slice(tail),
    }
}

/// The frames re-encoded: a decoder that accepted bytes must have read exactly them.
fn reencoded<'a>(frames: impl Iterator<Item = Result<queen_log::Frame<'a>, queen_log::DecodeError>>) -> Vec<u8> {
    let mut out = Vec::new();
    for frame in frames {
        queen_log::encode_frame(&frame.expect("a validated frame"), &mut out).unwrap();
    }
    out
}

/// The length of a zstd frame header (magic, descriptor, window, dictionary id, content size).
fn zstd_header_len(body: &[u8]) -> usize {
    let descriptor = body[4];
    let single_segment = descriptor & 0x20 != 0;
    let window = usize::from(!single_segment);
    let dictionary = [0, 1, 2, 4][usize::from(descriptor & 3)];
    let content_size = match descriptor >> 6 {
        0 => usize::from(single_segment),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    4 + 1 + window + dictionary + content_size
}

type Record = Vec<(String, String, FrameOwned)>;

fn record() -> impl Strategy<Value = Record> {
    proptest::collection::vec(("\\PC{0,12}", "\\PC{0,12}", frame()), 1..4)
}

/// A journal of the records, and where each record starts (and the last ends).
fn journal_of(records: &[Record]) -> (Vec<u8>, Vec<usize>) {
    let mut out = JOURNAL_MAGIC.to_vec();
    let mut bounds = vec![out.len()];
    for record in records {
        let entries: Vec<JournalEntry<'_>> = record
            .iter()
            .map(|(queue, partition, frame)| JournalEntry { queue, partition, frame: frame.as_frame() })
            .collect();
        encode_record(&entries, &mut out).unwrap();
        bounds.push(out.len());
    }
    (out, bounds)
}

fn owned(entries: &[JournalEntry<'_>]) -> Record {
    entries.iter().map(|e| (e.queue.to_owned(), e.partition.to_owned(), e.frame.to_owned())).collect()
}

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// One field of one frame damaged (its lengths, flags, transaction id, or the end of the
    /// data): the segment is refused, or what it yields re-encodes to exactly its bytes, as many
    /// frames as asked for.
    #[test]
    fn damaged_frame_fields_are_refused_or_read_exactly(
        frames in proptest::collection::vec(frame(), 1..8),
        which in any::<prop::sample::Index>(),
        how in field_damage(),
        count in prop_oneof![Just(None), (0usize..10).prop_map(Some)],
    ) {
        let (_, mut raw) = encode(&frames);
        damage(&mut raw, &frames, which, &how);
        let body = zstd::bulk::compress(&raw, 1).unwrap();
        let expected = count.unwrap_or(frames.len());
        if let Ok(decoded) = decode_segment(&body, expected, 1 << 24) {
            prop_assert_eq!(decoded.frame_count(), expected);
            prop_assert!(decoded.frames().all(|f| f.is_ok()));
            prop_assert_eq!(reencoded(decoded.frames()), raw.clone());
        }
        // The same damage met by the frame iterator alone: whole frames, then at most one error.
        let results: Vec<_> = FrameIter::new(&raw).collect();
        let whole = results.iter().take_while(|r| r.is_ok()).count();
        prop_assert!(results.len() - whole <= 1, "nothing after an error");
    }

    /// A damaged zstd frame header (magic, descriptor, declared size): refused, as too large
    /// before anything is allocated when it declares more than the limit, or harmless.
    #[test]
    fn a_damaged_segment_header_is_refused_or_harmless(
        frames in proptest::collection::vec(frame(), 0..8),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        limit in prop_oneof![Just(1usize << 20), 1usize..4096],
    ) {
        let (mut body, raw) = encode(&frames);
        let at = at.index(zstd_header_len(&body));
        body[at] ^= flip;
        let declared = zstd::zstd_safe::get_frame_content_size(&body).ok().flatten();
        match decode_segment(&body, frames.len(), limit) {
            Ok(decoded) => prop_assert_eq!(reencoded(decoded.frames()), raw, "a changed header changed the frames"),
            Err(e) => {
                if let Some(declared) = declared.filter(|d| *d > limit as u64) {
                    prop_assert!(matches!(e, DecodeError::TooLarge { .. }), "declares {declared}: {e:?}");
                }
            }
        }
    }

    /// One byte of one record's body altered: that record is reported corrupt, every other record
    /// reads back as written.
    #[test]
    fn a_damaged_journal_record_is_skipped_and_the_others_read(
        records in proptest::collection::vec(record(), 1..6),
        which in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let (mut data, bounds) = journal_of(&records);
        let k = which.index(records.len());
        let body = bounds[k] + 8..bounds[k + 1];
        data[body.start + at.index(body.len())] ^= flip;
        let read: Vec<_> = JournalReader::new(&data).collect();
        prop_assert_eq!(read.len(), records.len());
        for (i, (got, record)) in read.iter().zip(&records).enumerate() {
            if i == k {
                prop_assert!(matches!(got, Err(JournalDefect::Corrupt { at, .. }) if *at == bounds[k]), "{:?}", got);
            } else {
                let got = got.as_ref().map(|e| owned(e));
                prop_assert_eq!(got.as_ref(), Ok(record));
            }
        }
    }

    /// A journal cut anywhere (a crash mid-write): the records written whole read back, then the
    /// torn one is reported and nothing more is read.
    #[test]
    fn a_cut_journal_reads_its_whole_records_then_stops(
        records in proptest::collection::vec(record(), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let (data, bounds) = journal_of(&records);
        let cut = JOURNAL_MAGIC.len() + cut.index(data.len() - JOURNAL_MAGIC.len());
        let read: Vec<_> = JournalReader::new(&data[..cut]).collect();
        let whole = bounds.iter().skip(1).filter(|end| **end <= cut).count();
        for (got, record) in read.iter().zip(&records).take(whole) {
            let got = got.as_ref().map(|e| owned(e));
                prop_assert_eq!(got.as_ref(), Ok(record));
        }
        if bounds.contains(&cut) {
            prop_assert_eq!(read.len(), whole);
        } else {
            prop_assert_eq!(read.len(), whole + 1);
            let torn = matches!(read[whole], Err(JournalDefect::Torn { at, .. }) if at == bounds[whole]);
            prop_assert!(torn, "{:?}", read[whole]);
        }
    }

    /// Bytes flipped anywhere in a journal, headers included: the reader never panics, and every
    /// record it yields is one that was written.
    #[test]
    fn a_journal_damaged_anywhere_yields_only_records_written(
        records in proptest::collection::vec(record(), 1..6),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..5),
    ) {
        let (mut data, _) = journal_of(&records);
        for (at, flip) in flips {
            let at = JOURNAL_MAGIC.len() + at.index(data.len() - JOURNAL_MAGIC.len());
            data[at] ^= flip;
        }
        for got in JournalReader::new(&data).flatten() {
            prop_assert!(records.contains(&owned(&got)), "a record never written: {:?}", got);
        }
    }

    /// Sealed bytes open back; altered or cut anywhere, they never do.
    #[test]
    fn altered_sealed_bytes_never_open(
        plain in proptest::collection::vec(any::<u8>(), 0..300),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        cut in prop_oneof![Just(None), any::<prop::sample::Index>().prop_map(Some)],
    ) {
        let cipher = Cipher::from_hex(KEY).unwrap();
        let sealed = cipher.seal(&plain).unwrap();
        prop_assert_eq!(cipher.open(&sealed).unwrap(), plain);
        let mut damaged = sealed.clone();
        match cut {
            Some(cut) => damaged.truncate(cut.index(sealed.len())),
            None => damaged[at.index(sealed.len())] ^= flip,
        }
        prop_assert!(cipher.open(&damaged).is_err());
    }
}
