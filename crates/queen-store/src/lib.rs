//! Queen's PostgreSQL layer: versioned migrations, the pool, one module of typed queries per
//! table family, and the managed local PostgreSQL used as the embedded default.

/// SQL: the offset after which a consumer group's cursor on partition `p` starts, by subscription
/// mode (`$mode`, an SQL expression): `all` just below the oldest retained message, `end` after
/// the newest, any other from the first segment created at or after `$from` (the registration
/// time of a `new` group, or the timestamp it asked for), the partition's end when none is. The
/// one rule for creating cursors and for counting what a group without one still has to read.
macro_rules! group_start_sql {
    ($mode:literal, $from:literal) => {
        concat!(
            "CASE ",
            $mode,
            " WHEN 'all' THEN p.retained_from - 1 WHEN 'end' THEN p.last_offset
              ELSE COALESCE((SELECT s.base_offset - 1 FROM queen.log_segments s
                              WHERE s.partition_id = p.id AND s.created_at >= ",
            $from,
            "                   AND s.base_offset >= p.retained_from
                              ORDER BY s.created_at, s.base_offset LIMIT 1),
                            p.last_offset) END"
        )
    };
}

/// SQL: the last offset of partition `p` (of queue `q`) that `delayedProcessing` lets be served:
/// everything, unless the newest messages are still inside the delay, then up to the last segment
/// outside it (0 when none is). The one rule for the pop claim and for queue depth.
macro_rules! delay_visible_until_sql {
    () => {
        "CASE WHEN q.delayed_processing_seconds > 0
                   AND p.last_segment_at > now() - q.delayed_processing_seconds * interval '1 second' THEN
              COALESCE((SELECT s.end_offset FROM queen.log_segments s
                         WHERE s.partition_id = p.id
                           AND s.created_at <= now() - q.delayed_processing_seconds * interval '1 second'
                         ORDER BY s.created_at DESC, s.base_offset DESC LIMIT 1), 0)
              ELSE p.last_offset END"
    };
}

pub mod ack_rules;
mod completed_spans;
pub mod connect;
pub mod cursors;
pub mod depth;
pub mod dlq;
pub mod embedded;
mod error;
pub mod events;
pub mod fleet;
pub mod groups;
pub mod key_check;
pub mod kv;
pub mod listen;
pub mod log;
pub mod messages;
pub mod migrations;
pub mod offset_reads;
pub mod owners;
pub mod pool;
pub mod probes;
pub mod queues;
pub mod retention;
pub mod segment_cache;
pub mod stats;
pub mod system_state;
pub mod timers;
pub mod tls;
pub mod traces;

pub use deadpool_postgres::{Pool, Transaction};
pub use error::{Creation, FailureCounts, LimitReached, StoreError, WriteRefusal, failure_counts};
