//! Reads by offset, as Kafka readers know them: records of a partition from an offset, and the
//! partitions of a queue written since a time. A read takes no lease, moves no cursor and
//! creates nothing; two readers asking the same question get the same answer.
//!
//! Offsets are the ones pops hand out: a partition's first record is offset 1, so an empty
//! partition's high watermark (the next offset it assigns) is 1. Records are served from their
//! segments through the segment cache, as pops are. What a queue holds back from consumers
//! (`delayedProcessing`, `windowBuffer`) is not held back here: those options say when a group
//! may claim a message, and a read claims nothing; it sees every committed record, like the
//! message routes do.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use queen_store::StoreError;
use queen_store::log::{Span, StoredSegment};
use queen_store::offset_reads::{self, ChangedPage, ChangedQuery, PlannedSegment, ReadPlan, ReadTarget};
use queen_store::segment_cache::ReadEnd;

use super::{Broker, BrokerError};

/// Most entries one fetch may ask for.
pub const MAX_FETCH_ENTRIES: usize = 1024;

/// The most payload bytes one fetch answers, for an entry and for the whole call; a larger
/// `maxBytes` is read as this.
pub const MAX_FETCH_BYTES: i64 = 8 * 1024 * 1024;

/// Most segments one entry of a fetch reads: partitions written one message per push have a
/// segment per record, and a read of them should not turn into a walk of a million rows.
const MAX_SEGMENTS_PER_ENTRY: i64 = 1000;

/// What a fetch asks of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchEntry {
    pub queue: String,
    pub partition: String,
    pub offset: i64,
    /// Payload bytes this entry may answer, at most [`MAX_FETCH_BYTES`].
    pub max_bytes: i64,
}

impl FetchEntry {
    /// The payload bytes this entry may answer in a call of `call_bytes`.
    fn budget(&self, call_bytes: i64) -> i64 {
        self.max_bytes.clamp(1, call_bytes)
    }
}

/// Why an entry answers no records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchRefusal {
    /// The offset is below the oldest record retention kept, or past the high watermark.
    OffsetOutOfRange,
    /// The queue or the partition does not exist.
    UnknownTopicOrPartition,
}

/// One record read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedRecord {
    pub offset: i64,
    pub transaction_id: String,
    /// The pushed JSON text, byte for byte.
    pub payload: Vec<u8>,
    /// When its segment was stored.
    pub stored_at: DateTime<Utc>,
}

/// The answer for one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedEntry {
    /// The offset the partition assigns next (0 for an unknown partition).
    pub high_watermark: i64,
    /// The oldest offset retention kept (0 for an unknown partition).
    pub log_start_offset: i64,
    pub refusal: Option<FetchRefusal>,
    pub records: Vec<FetchedRecord>,
}

/// Reads each entry's partition from its offset, in order, within the entry's `max_bytes` of
/// payload and `max_bytes` for the whole call, except that the call's first record is answered
/// whatever its size (Kafka's rule: a record larger than the budget would otherwise stop its
/// reader for good). An entry whose budget the call spent answers no records and no error.
///
/// Two statements, whatever the number of entries: one finds every partition and the segments a
/// read from its offset covers within its budget (the decoded sizes are known from the segment
/// rows), one reads the bodies of those segments the segment cache does not hold. Only
/// committed records are ever read: the partition row and the segments are what committed.
pub async fn fetch(broker: &Broker, entries: &[FetchEntry], max_bytes: i64) -> Result<Vec<FetchedEntry>, BrokerError> {
    let call_bytes = max_bytes.clamp(1, MAX_FETCH_BYTES);
    let targets: Vec<ReadTarget<'_>> = entries
        .iter()
        .map(|e| ReadTarget {
            queue: &e.queue,
            partition: &e.partition,
            offset: e.offset,
            budget: e.budget(call_bytes),
        })
        .collect();
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    let plans = offset_reads::plan_reads(&client, &targets, MAX_SEGMENTS_PER_ENTRY).await?;
    let mut answers: Vec<FetchedEntry> =
        plans.iter().zip(entries).map(|(plan, e)| where_it_stands(plan, e.offset)).collect();
    let spans = spans_within(entries, &plans, &answers, call_bytes);
    let wanted: Vec<Span> = spans.iter().flatten().copied().collect();
    let segments = broker.segments.read(&client, &wanted, broker.cipher.as_deref(), ReadEnd::Anywhere).await?;
    let by_partition = by_partition(&segments);
    let mut budget = Budget { call_left: call_bytes, delivered: false };
    for ((answer, entry), span) in answers.iter_mut().zip(entries).zip(&spans) {
        let Some(span) = span else { continue };
        let held = by_partition.get(&span.partition_id);
        let stored = held.into_iter().flat_map(|segments| segments.range(..=span.last).map(|(_, s)| s.as_ref()));
        match take_records(*span, entry.budget(call_bytes), stored, &mut budget)? {
            Taken::Records(records) => answer.records = records,
            Taken::RetainedFrom(start) => {
                answer.refusal = Some(FetchRefusal::OffsetOutOfRange);
                answer.log_start_offset = answer.log_start_offset.max(start);
            }
        }
    }
    Ok(answers)
}

/// An entry's answer before anything is read: its partition's bounds, and whether the offset is
/// one to read from.
fn where_it_stands(plan: &ReadPlan, offset: i64) -> FetchedEntry {
    let Some(log) = plan.partition else {
        return FetchedEntry {
            high_watermark: 0,
            log_start_offset: 0,
            refusal: Some(FetchRefusal::UnknownTopicOrPartition),
            records: Vec::new(),
        };
    };
    let high_watermark = log.last_offset + 1;
    // At the high watermark there is nothing yet, which is no error: the reader is up to date.
    let out_of_range = offset < log.retained_from || offset > high_watermark;
    FetchedEntry {
        high_watermark,
        log_start_offset: log.retained_from,
        refusal: out_of_range.then_some(FetchRefusal::OffsetOutOfRange),
        records: Vec::new(),
    }
}

/// The span each entry reads, in the order of the entries, so that the segments read for the
/// whole call stay within its budget: each entry takes its planned segments while the decoded
/// bytes before them fit both its own budget and what the entries before it left of the call's
/// (decoded bytes hold the payloads and their frames' headers, so the payloads read fit too). The
/// first entry with something to read always gets its first segment.
fn spans_within(
    entries: &[FetchEntry],
    plans: &[ReadPlan],
    answers: &[FetchedEntry],
    call_bytes: i64,
) -> Vec<Option<Span>> {
    let mut call_left = call_bytes;
    let mut planned_any = false;
    entries
        .iter()
        .zip(plans)
        .zip(answers)
        .map(|((entry, plan), answer)| {
            let partition_id = plan.partition.filter(|_| answer.refusal.is_none())?.id;
            let allowance = entry.budget(call_bytes).min(call_left);
            if allowance <= 0 && planned_any {
                return None;
            }
            let taken = segments_within(&plan.segments, allowance.max(1));
            let last = taken.last()?;
            call_left -= last.bytes_through;
            planned_any = true;
            Some(Span { partition_id, first: entry.offset, last: last.end_offset })
        })
        .collect()
}

/// The planned segments whose predecessors' decoded bytes stay under `allowance` (at least the
/// first one).
fn segments_within(planned: &[PlannedSegment], allowance: i64) -> &[PlannedSegment] {
    let mut before = 0;
    let count = planned
        .iter()
        .take_while(|segment| {
            let fits = before < allowance;
            before = segment.bytes_through;
            fits
        })
        .count();
    &planned[..count]
}

/// The segments read, by partition and base offset (two entries may read one partition).
fn by_partition(segments: &[Arc<StoredSegment>]) -> HashMap<i64, BTreeMap<i64, Arc<StoredSegment>>> {
    let mut held: HashMap<i64, BTreeMap<i64, Arc<StoredSegment>>> = HashMap::new();
    for segment in segments {
        held.entry(segment.partition_id).or_default().insert(segment.base_offset, Arc::clone(segment));
    }
    held
}

/// Payload bytes a call may still answer, and whether it answered a record yet.
#[derive(Debug)]
struct Budget {
    call_left: i64,
    delivered: bool,
}

/// What an entry's read gave.
#[derive(Debug, PartialEq, Eq)]
enum Taken {
    Records(Vec<FetchedRecord>),
    /// The segment holding the first offset is gone: retention removed it after the partition
    /// was looked at. The oldest offset left is at least this.
    RetainedFrom(i64),
}

/// The records of `span` from `segments` (in offset order, the one holding `span.first` first),
/// while their payloads fit `entry_bytes` and the call's budget; the call's first record always
/// does. Stops at a gap, which only retention can make, and only at the low end.
fn take_records<'a>(
    span: Span,
    entry_bytes: i64,
    segments: impl Iterator<Item = &'a StoredSegment>,
    budget: &mut Budget,
) -> Result<Taken, BrokerError> {
    let mut records = Vec::new();
    let mut entry_left = entry_bytes;
    let mut next = span.first;
    let mut found_first = false;
    'segments: for segment in segments {
        if segment.end_offset() < next {
            continue;
        }
        if segment.base_offset > next {
            if !found_first {
                return Ok(Taken::RetainedFrom(segment.base_offset));
            }
            break;
        }
        found_first = true;
        for (offset, frame) in segment.frames_in(next, span.last) {
            let frame = frame.map_err(|source| StoreError::CorruptSegment {
                partition_id: segment.partition_id,
                base_offset: segment.base_offset,
                source,
            })?;
            let size = frame.payload.len() as i64;
            if budget.delivered && (size > entry_left || size > budget.call_left) {
                break 'segments;
            }
            entry_left -= size;
            budget.call_left -= size;
            budget.delivered = true;
            records.push(FetchedRecord {
                offset,
                transaction_id: frame.transaction_id.to_owned(),
                payload: frame.payload.to_vec(),
                stored_at: segment.created_at,
            });
            next = offset + 1;
        }
    }
    if !found_first {
        // No segment at all: retention removed every segment of the span.
        return Ok(Taken::RetainedFrom(span.last + 1));
    }
    Ok(Taken::Records(records))
}

/// The partitions of one [`changed_since`] query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangedEntry {
    pub queue: String,
    pub since: Option<DateTime<Utc>>,
    /// The cursor of the previous page (a partition id); 0 for the first page.
    pub after: i64,
    pub limit: i64,
}

/// Most partitions one page lists, and how many it lists when the reader does not say.
pub const MAX_CHANGED_PAGE: i64 = 1000;

/// Most queries one discovery call may carry.
pub const MAX_CHANGED_ENTRIES: usize = 100;

/// The pages of the queries, and the answer's safe time: every write stamped before it is in
/// these pages (when it matches them), and no write committed later can be stamped before it, so
/// a reader that asks again with `since` = the safe time misses nothing.
pub async fn changed_since(
    broker: &Broker,
    entries: &[ChangedEntry],
) -> Result<(DateTime<Utc>, Vec<ChangedPage>), BrokerError> {
    let queries: Vec<ChangedQuery<'_>> = entries
        .iter()
        .map(|e| ChangedQuery { queue: &e.queue, since: e.since, after: e.after, limit: e.limit })
        .collect();
    let client = broker.pool.get().await.map_err(StoreError::from)?;
    Ok(offset_reads::changed_since(&client, &queries).await?)
}

#[cfg(test)]
mod tests {
    use queen_log::{Frame, SegmentBuilder};
    use uuid::Uuid;

    use super::*;

    /// A segment of one partition whose records' payloads are `sizes` bytes long.
    fn segment(base_offset: i64, sizes: &[usize]) -> StoredSegment {
        let mut builder = SegmentBuilder::new();
        let payloads: Vec<String> = sizes.iter().map(|n| "7".repeat(*n)).collect();
        for (i, payload) in payloads.iter().enumerate() {
            let transaction_id = format!("t{}", base_offset + i as i64);
            let frame = Frame {
                message_id: Uuid::now_v7(),
                trace_id: None,
                transaction_id: &transaction_id,
                producer: None,
                payload: payload.as_bytes(),
            };
            builder.push(&frame).expect("a frame");
        }
        let body = builder.finish().expect("a segment").body;
        let frames = queen_log::decode_segment(&body, sizes.len(), 1 << 20).expect("decoded");
        StoredSegment { partition_id: 1, base_offset, created_at: Utc::now(), frames, sealed: false, zstd_body: None }
    }

    fn span(first: i64, last: i64) -> Span {
        Span { partition_id: 1, first, last }
    }

    fn offsets(taken: Taken) -> Vec<i64> {
        match taken {
            Taken::Records(records) => records.iter().map(|r| r.offset).collect(),
            other => panic!("no records: {other:?}"),
        }
    }

    #[test]
    fn records_are_taken_from_the_offset_across_segments_within_the_entry_budget() {
        let segments = [segment(1, &[10, 10, 10]), segment(4, &[10, 10])];
        let mut budget = Budget { call_left: 1000, delivered: false };
        let taken = take_records(span(2, 5), 1000, segments.iter(), &mut budget).unwrap();
        assert_eq!(offsets(taken), vec![2, 3, 4, 5]);
        assert_eq!(budget.call_left, 960);

        let mut budget = Budget { call_left: 1000, delivered: false };
        let taken = take_records(span(1, 5), 25, segments.iter(), &mut budget).unwrap();
        assert_eq!(offsets(taken), vec![1, 2], "a third record would pass the entry's 25 bytes");
    }

    #[test]
    fn the_first_record_of_a_call_is_taken_whatever_its_size_and_no_other_past_the_budget() {
        let segments = [segment(1, &[500, 10])];
        let mut budget = Budget { call_left: 100, delivered: false };
        let taken = take_records(span(1, 2), 100, segments.iter(), &mut budget).unwrap();
        assert_eq!(offsets(taken), vec![1], "the oversized record alone");
        // The next entry of the same call gets nothing: the call's budget is spent.
        let mut other = segment(1, &[1]);
        other.partition_id = 2;
        let taken = take_records(Span { partition_id: 2, first: 1, last: 1 }, 100, [&other].into_iter(), &mut budget);
        assert_eq!(offsets(taken.unwrap()), Vec::<i64>::new());
    }

    #[test]
    fn a_span_whose_first_segment_is_gone_was_retained_away() {
        let survivors = [segment(6, &[1, 1])];
        let mut budget = Budget { call_left: 100, delivered: false };
        let taken = take_records(span(2, 7), 100, survivors.iter(), &mut budget).unwrap();
        assert_eq!(taken, Taken::RetainedFrom(6));
        let taken = take_records(span(2, 7), 100, std::iter::empty(), &mut budget).unwrap();
        assert_eq!(taken, Taken::RetainedFrom(8));
        assert!(!budget.delivered);
    }

    fn planned(ends_and_sizes: &[(i64, i64)]) -> Vec<PlannedSegment> {
        let mut through = 0;
        ends_and_sizes
            .iter()
            .map(|&(end_offset, size)| {
                through += size;
                PlannedSegment { end_offset, bytes_through: through }
            })
            .collect()
    }

    #[test]
    fn an_entry_reads_the_segments_that_start_within_its_budget() {
        let plan = planned(&[(10, 100), (20, 100), (30, 100)]);
        assert_eq!(segments_within(&plan, 1).len(), 1, "the first segment always");
        assert_eq!(segments_within(&plan, 100).len(), 1);
        assert_eq!(segments_within(&plan, 101).len(), 2);
        assert_eq!(segments_within(&plan, 10_000).len(), 3);
    }

    #[test]
    fn the_call_budget_is_shared_by_the_entries_in_order() {
        let entry = |partition: &str, max_bytes| FetchEntry {
            queue: "q".into(),
            partition: partition.into(),
            offset: 1,
            max_bytes,
        };
        let plan = |id, segments: &[(i64, i64)]| ReadPlan {
            partition: Some(offset_reads::PartitionLog { id, last_offset: 100, retained_from: 1 }),
            segments: planned(segments),
        };
        let entries = [entry("a", 1000), entry("b", 1000), entry("c", 1000)];
        let plans = [plan(1, &[(10, 150), (20, 150)]), plan(2, &[(5, 100)]), plan(3, &[(5, 100)])];
        let answers: Vec<FetchedEntry> = plans.iter().map(|p| where_it_stands(p, 1)).collect();
        let spans = spans_within(&entries, &plans, &answers, 250);
        assert_eq!(spans[0], Some(Span { partition_id: 1, first: 1, last: 20 }), "150 bytes before the second");
        assert_eq!(spans[1], None, "the first entry planned 300 bytes of the call's 250");
        assert_eq!(spans[2], None);
    }

    #[test]
    fn an_offset_is_read_from_the_oldest_kept_up_to_the_high_watermark() {
        let plan = ReadPlan {
            partition: Some(offset_reads::PartitionLog { id: 1, last_offset: 9, retained_from: 4 }),
            segments: Vec::new(),
        };
        let refusal = |offset| where_it_stands(&plan, offset).refusal;
        assert_eq!(refusal(3), Some(FetchRefusal::OffsetOutOfRange), "retained away");
        assert_eq!(refusal(4), None);
        assert_eq!(refusal(10), None, "at the high watermark: nothing new, no error");
        assert_eq!(refusal(11), Some(FetchRefusal::OffsetOutOfRange), "past the end");
        let stands = where_it_stands(&plan, 0);
        assert_eq!((stands.high_watermark, stands.log_start_offset), (10, 4));
        let unknown = where_it_stands(&ReadPlan { partition: None, segments: Vec::new() }, 0);
        assert_eq!(unknown.refusal, Some(FetchRefusal::UnknownTopicOrPartition));
    }
}
