//! Decoded segments kept in memory, so that pops of a few messages at a time from a large segment
//! do not fetch, open and decompress the whole segment again for every pop: a read takes the
//! segments it finds here and fetches from PostgreSQL only the spans between them.
//!
//! An entry is kept while a reader is inside it, since that reader comes back for the rest:
//! - a read that ends inside a segment leaves a reader there (and keeps a segment it fetched);
//! - a read that starts inside a segment and reaches its end takes one away, and the entry goes
//!   when none is left;
//! - a read that covers a segment whole changes nothing: a consumer draining a backlog in large
//!   batches does not turn the cache into a copy of the backlog.
//!
//! That holds for readers that take their spans whole, as pops do ([`ReadEnd::AtSpanEnd`]). An
//! offset fetch stops where its byte budget runs out, which it learns only from the decoded
//! segments, and a message lookup does not come back ([`ReadEnd::Anywhere`]): their reads keep a
//! fetched segment the span does not cover whole, and count nothing, so they never hold an entry
//! past the pops reading it.
//!
//! A reader that never comes back (a consumer gone, a lease that expired and was re-read from
//! its start) leaves its entry counted; entries are weighed by their bytes and the least
//! recently used go first, so such entries age out. Without the count, every segment a pop ended
//! inside stayed until the bound pushed it out, and a busy broker held its whole bound
//! (64 MiB by default) of segments no reader wanted.
//!
//! **Why a hit is never stale.** An entry is keyed by (partition id, base offset), and what it
//! holds never changes: a segment is written once, by a committed append, and never updated.
//! - A partition id is an identity value, never reused, so a partition deleted with its queue or
//!   by clean-up, and one recreated under the same name, never share entries.
//! - Offsets of a partition are never reused: `last_offset` only grows, and the cache is filled
//!   only by reads outside any transaction, so it never holds a segment whose append could still
//!   roll back (reads inside a transaction use [`crate::log::read_spans`]).
//! - Retention deletes segments from the low end of a partition, and a deleted queue takes its
//!   partitions: their entries stay until evicted, but no read asks for them. Readers ask for
//!   offsets that a statement just found stored: a claim starts at the retention watermark of
//!   the partition row it locks, a message lookup goes through the transaction-id index, which
//!   retention empties in the transaction that deletes the segments. A read that races a
//!   retention pass serves what the claim saw when the segments are cached, and otherwise finds
//!   fewer of them, or none (the pop then gives back the lease of a claim it could serve nothing
//!   of).
//! - A database replaced under a running broker (a restore) would restart the identities; the
//!   broker's LISTEN connection breaks with it, and the broker clears the cache when it
//!   reconnects ([`SegmentCache::clear`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use deadpool_postgres::GenericClient;
use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy;
use moka::sync::Cache;
use queen_log::Cipher;

use crate::StoreError;
use crate::log::{IndexedRead, Span, StoredSegment, read_spans_indexed};

/// Bytes counted for an entry besides its frames: the cache's and the index's bookkeeping.
const ENTRY_OVERHEAD: usize = 160;

/// (partition id, base offset).
type SegmentKey = (i64, i64);

/// The segments held, by partition: base offset → end offset. It tells which entry holds an
/// offset; the cache itself says whether the entry is still there.
type Held = Arc<Mutex<HashMap<i64, BTreeMap<i64, i64>>>>;

/// A held segment and how many readers are inside it (see the module).
struct Entry {
    segment: Arc<StoredSegment>,
    readers: AtomicI64,
}

type Segments = Cache<SegmentKey, Arc<Entry>>;

/// Decoded segments shared by every reader of the broker, bounded by bytes.
pub struct SegmentCache {
    /// `None` when the cache is off (a size of 0): every read goes to the database.
    segments: Option<Segments>,
    held: Held,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// What the cache did since the broker started, and what it holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentCacheStats {
    /// Segments a read found in the cache.
    pub hits: u64,
    /// Segments a read fetched from the database.
    pub misses: u64,
    /// Bytes held (decoded frames and bookkeeping).
    pub bytes: u64,
    pub segments: u64,
}

/// Where the readers of a read stop, which says what the cache keeps for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadEnd {
    /// Each reader takes its span whole (a pop: the span is what its claim delivered), so the
    /// cache counts it into the segment its span ends inside and out of the one it leaves.
    AtSpanEnd,
    /// A reader may stop anywhere inside its span, or not come back at all (an offset fetch cut
    /// by its byte budget, a message lookup): the cache counts nothing for it.
    Anywhere,
}

/// Where a read finds a piece of a span.
enum Piece {
    Held { base_offset: i64, end_offset: i64 },
    Missing(Span),
}

impl SegmentCache {
    /// A cache of at most `max_bytes`; 0 turns it off.
    pub fn new(max_bytes: u64) -> Self {
        let held = Held::default();
        let segments = (max_bytes > 0).then(|| {
            let index = Arc::clone(&held);
            Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|_, entry: &Arc<Entry>| {
                    let stored = entry.segment.zstd_body.as_ref().map_or(0, Vec::len);
                    u32::try_from(entry.segment.frames.memory_len() + stored + ENTRY_OVERHEAD).unwrap_or(u32::MAX)
                })
                .eviction_policy(EvictionPolicy::lru())
                .eviction_listener(move |key: Arc<SegmentKey>, _, cause| {
                    // A replaced entry is still held, under the same key.
                    if cause != RemovalCause::Replaced {
                        forget(&mut lock(&index), *key);
                    }
                })
                .build()
        });
        Self { segments, held, hits: AtomicU64::new(0), misses: AtomicU64::new(0) }
    }

    /// Reads the segments that cover the spans, in span order then offset order, like
    /// [`crate::log::read_spans`]: from the cache where it holds them, from the database (opening
    /// sealed ones with `keys`) where it does not. Never inside a transaction (see the module).
    pub async fn read(
        &self,
        client: &impl GenericClient,
        spans: &[Span],
        keys: Option<&Cipher>,
        end: ReadEnd,
    ) -> Result<Vec<Arc<StoredSegment>>, StoreError> {
        self.read_decoding_at_most(client, spans, keys, end, usize::MAX).await
    }

    /// [`Self::read`], decoding segments from the database only until they hold `decode_at_most`
    /// bytes (at least one segment). What comes back still covers each span from its start
    /// without a hole the bound made: a span the bound cut is covered up to the cut (a piece the
    /// cache holds past it is left out), and a span after it not at all past its first piece the
    /// cache does not hold. Segments the cache holds cost no decoding.
    pub async fn read_decoding_at_most(
        &self,
        client: &impl GenericClient,
        spans: &[Span],
        keys: Option<&Cipher>,
        end: ReadEnd,
        decode_at_most: usize,
    ) -> Result<Vec<Arc<StoredSegment>>, StoreError> {
        let Some(segments) = &self.segments else {
            let fetched = read_spans_indexed(client, spans, keys, decode_at_most).await?.segments;
            self.misses.fetch_add(fetched.len() as u64, Ordering::Relaxed);
            return Ok(fetched.into_iter().map(|(_, segment)| Arc::new(segment)).collect());
        };
        let mut found: Vec<Vec<Arc<StoredSegment>>> = vec![Vec::new(); spans.len()];
        // What to fetch, and for which span.
        let (mut missing, mut missing_for) = (Vec::new(), Vec::new());
        for (index, span) in spans.iter().enumerate() {
            for piece in self.pieces(span) {
                let hole = match piece {
                    Piece::Held { base_offset, end_offset } => match segments.get(&(span.partition_id, base_offset)) {
                        Some(entry) => {
                            self.hits.fetch_add(1, Ordering::Relaxed);
                            if end == ReadEnd::AtSpanEnd {
                                self.count_readers(segments, &entry, span);
                            }
                            found[index].push(Arc::clone(&entry.segment));
                            continue;
                        }
                        // Evicted since the index was read.
                        None => Span {
                            partition_id: span.partition_id,
                            first: base_offset.max(span.first),
                            last: end_offset.min(span.last),
                        },
                    },
                    Piece::Missing(hole) => hole,
                };
                missing.push(hole);
                missing_for.push(index);
            }
        }
        let IndexedRead { segments: fetched, cut } = read_spans_indexed(client, &missing, keys, decode_at_most).await?;
        self.misses.fetch_add(fetched.len() as u64, Ordering::Relaxed);
        // Per span, the first offset the bound left unread.
        let mut unread_from: Vec<Option<i64>> = vec![None; spans.len()];
        let read_of_cut =
            cut.and_then(|cut| fetched.iter().filter(|(hole, _)| *hole == cut).map(|(_, s)| s.end_offset() + 1).max());
        if let Some(cut) = cut {
            for (hole, span) in missing.iter().enumerate().skip(cut) {
                let from = if hole == cut { read_of_cut.unwrap_or(span.first) } else { span.first };
                let index = missing_for[hole];
                unread_from[index] = Some(unread_from[index].map_or(from, |earlier| earlier.min(from)));
            }
        }
        for (hole, segment) in fetched {
            let index = missing_for[hole];
            let span = &spans[index];
            let segment = Arc::new(segment);
            // The reader stops inside the segment where the bound cut its span, most likely,
            // and comes back there.
            let cut_inside = cut == Some(hole) && read_of_cut == Some(segment.end_offset() + 1);
            let reader_inside = cut_inside
                || match end {
                    ReadEnd::AtSpanEnd => segment.end_offset() > span.last,
                    ReadEnd::Anywhere => segment.base_offset < span.first || segment.end_offset() > span.last,
                };
            if reader_inside {
                self.keep(segments, &segment);
            }
            found[index].push(segment);
        }
        Ok(found
            .into_iter()
            .zip(unread_from)
            .flat_map(|(mut pieces, unread_from)| {
                // A hole's fetch starts at the segment holding its first offset, which another
                // read may have cached meanwhile.
                pieces.sort_by_key(|segment| segment.base_offset);
                pieces.dedup_by_key(|segment| segment.base_offset);
                if let Some(unread_from) = unread_from {
                    pieces.retain(|segment| segment.base_offset < unread_from);
                }
                pieces
            })
            .collect())
    }

    /// The span cut into the segments the cache holds and the stretches between them.
    fn pieces(&self, span: &Span) -> Vec<Piece> {
        let held = lock(&self.held);
        let Some(bases) = held.get(&span.partition_id) else { return vec![Piece::Missing(*span)] };
        let mut pieces = Vec::new();
        let mut at = span.first;
        while at <= span.last {
            match bases.range(..=at).next_back() {
                Some((&base_offset, &end_offset)) if end_offset >= at => {
                    pieces.push(Piece::Held { base_offset, end_offset });
                    at = end_offset + 1;
                }
                _ => {
                    // (`range` refuses an empty range.)
                    let after = (at < span.last).then(|| bases.range(at + 1..=span.last).next()).flatten();
                    let last = after.map_or(span.last, |(&base, _)| base - 1);
                    pieces.push(Piece::Missing(Span { partition_id: span.partition_id, first: at, last }));
                    at = last + 1;
                }
            }
        }
        pieces
    }

    /// Keeps a segment fetched by a read that ended inside it: one reader is inside.
    fn keep(&self, segments: &Segments, segment: &Arc<StoredSegment>) {
        // Indexed first: the eviction of the entry (or its refusal) un-indexes it after.
        let key = (segment.partition_id, segment.base_offset);
        lock(&self.held).entry(key.0).or_default().insert(key.1, segment.end_offset());
        segments.insert(key, Arc::new(Entry { segment: Arc::clone(segment), readers: AtomicI64::new(1) }));
    }

    /// Counts a read of `span` that found `entry` held: a reader entering it or leaving it.
    fn count_readers(&self, segments: &Segments, entry: &Entry, span: &Span) {
        let segment = &entry.segment;
        let (came_from_inside, stays_inside) = (span.first > segment.base_offset, span.last < segment.end_offset());
        match (came_from_inside, stays_inside) {
            (false, true) => {
                entry.readers.fetch_add(1, Ordering::Relaxed);
            }
            // The reader that takes the last one away drops the entry. One entering at that
            // moment finds it gone when it comes back, and fetches it again.
            (true, false) if entry.readers.fetch_sub(1, Ordering::Relaxed) <= 1 => {
                segments.invalidate(&(segment.partition_id, segment.base_offset));
            }
            _ => {}
        }
    }

    /// Drops every entry (the database may have been replaced).
    pub fn clear(&self) {
        if let Some(segments) = &self.segments {
            segments.invalidate_all();
        }
        lock(&self.held).clear();
    }

    pub fn stats(&self) -> SegmentCacheStats {
        let (bytes, segments) = self.segments.as_ref().map_or((0, 0), |s| {
            s.run_pending_tasks();
            (s.weighted_size(), s.entry_count())
        });
        SegmentCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes,
            segments,
        }
    }
}

fn lock(held: &Held) -> MutexGuard<'_, HashMap<i64, BTreeMap<i64, i64>>> {
    held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn forget(held: &mut HashMap<i64, BTreeMap<i64, i64>>, (partition_id, base_offset): SegmentKey) {
    if let Some(bases) = held.get_mut(&partition_id) {
        bases.remove(&base_offset);
        if bases.is_empty() {
            held.remove(&partition_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::tests::segment;

    fn described(pieces: Vec<Piece>) -> Vec<String> {
        pieces
            .into_iter()
            .map(|piece| match piece {
                Piece::Held { base_offset, end_offset } => format!("held {base_offset}-{end_offset}"),
                Piece::Missing(span) => format!("missing {}-{}", span.first, span.last),
            })
            .collect()
    }

    #[test]
    fn a_span_is_cut_into_held_segments_and_the_stretches_between_them() {
        let cache = SegmentCache::new(1 << 20);
        let segments = cache.segments.as_ref().unwrap();
        cache.keep(segments, &Arc::new(segment(7, 1, 10)));
        cache.keep(segments, &Arc::new(segment(7, 21, 10)));
        let span = |first, last| Span { partition_id: 7, first, last };
        assert_eq!(described(cache.pieces(&span(5, 5))), ["held 1-10"]);
        assert_eq!(
            described(cache.pieces(&span(5, 35))),
            ["held 1-10", "missing 11-20", "held 21-30", "missing 31-35"]
        );
        assert_eq!(described(cache.pieces(&span(12, 25))), ["missing 12-20", "held 21-30"]);
        assert_eq!(described(cache.pieces(&span(11, 11))), ["missing 11-11"]);
        assert_eq!(described(cache.pieces(&span(20, 21))), ["missing 20-20", "held 21-30"]);
        assert_eq!(described(cache.pieces(&span(31, 31))), ["missing 31-31"]);
        assert_eq!(described(cache.pieces(&Span { partition_id: 8, first: 1, last: 5 })), ["missing 1-5"]);
    }

    #[test]
    fn an_evicted_segment_is_no_longer_indexed() {
        let cache = SegmentCache::new(1 << 20);
        let segments = cache.segments.as_ref().unwrap();
        cache.keep(segments, &Arc::new(segment(7, 1, 10)));
        segments.invalidate(&(7, 1));
        segments.run_pending_tasks();
        assert_eq!(described(cache.pieces(&Span { partition_id: 7, first: 1, last: 10 })), ["missing 1-10"]);
        assert!(lock(&cache.held).is_empty());
    }

    #[test]
    fn a_segment_is_held_while_a_reader_is_inside_it() {
        let cache = SegmentCache::new(1 << 20);
        let segments = cache.segments.as_ref().unwrap();
        // A read of 1-4 fetched it: one reader inside.
        cache.keep(segments, &Arc::new(segment(7, 1, 10)));
        let read = |first, last| {
            let entry = segments.get(&(7, 1)).expect("held");
            cache.count_readers(segments, &entry, &Span { partition_id: 7, first, last });
            segments.run_pending_tasks();
        };
        read(1, 3); // A second reader enters.
        read(1, 10); // A third reads it whole and is past it.
        read(5, 6); // The first goes on inside it.
        read(7, 12); // It leaves; the second is still inside.
        assert_eq!(described(cache.pieces(&Span { partition_id: 7, first: 4, last: 4 })), ["held 1-10"]);
        read(4, 10); // The second leaves: nobody is.
        assert!(segments.get(&(7, 1)).is_none());
        assert!(lock(&cache.held).is_empty(), "nor indexed");
    }

    #[test]
    fn a_cache_of_zero_bytes_is_off() {
        let cache = SegmentCache::new(0);
        assert!(cache.segments.is_none());
        assert_eq!(cache.stats(), SegmentCacheStats::default());
    }
}
