//! Queen's PostgreSQL layer: versioned migrations, the pool, one module of typed queries per
//! table family, and the managed local PostgreSQL used as the embedded default.

pub mod ack_rules;
pub mod cursors;
pub mod depth;
pub mod dlq;
pub mod embedded;
mod error;
pub mod events;
pub mod fleet;
pub mod groups;
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
