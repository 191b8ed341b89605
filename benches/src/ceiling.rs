//! The storage ceiling: the segments a push would write, written straight into PostgreSQL, no
//! HTTP and no broker. The `append` cells use the broker's own code
//! (`queen_store::log::append_in_transaction`); the raw cells ([`crate::ceiling_raw`]) write
//! parts of it with the bench's SQL, so the ratios between kinds say what each part costs. What
//! the broker reaches is read as a fraction of this.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use queen_store::log::{AppendPolicy, Destination, NewMessage};
use queen_store::pool::{PoolSettings, build_pool};
use queen_store::{Pool, StoreError};
use serde::Serialize;

use crate::ceiling_raw::{RawPartition, RawSegment, write_rows, write_segment};
use crate::generator::MessageGenerator;
use crate::stats::{Distribution, LatencyRecorder};

/// Messages per segment: the push scenarios' batch sizes.
pub const MESSAGES_PER_SEGMENT: [usize; 3] = [100, 10, 1];
/// Segments per transaction of the `append` cells; the raw cells write one.
pub const SEGMENTS_PER_TRANSACTION: [usize; 2] = [1, 10];
pub const CONNECTIONS: [usize; 3] = [1, 4, 8];

/// What a cell writes for each segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CellKind {
    /// The production append, through the store crate: whatever production does.
    #[serde(rename = "append")]
    Append,
    /// Today's append statement written out in the bench: partition row, segment row, a
    /// message-id row per message, and the `pg_notify`.
    #[serde(rename = "rows+notify")]
    RowsNotify,
    /// The same without the `pg_notify`.
    #[serde(rename = "rows")]
    Rows,
    /// The segment row alone.
    #[serde(rename = "segments")]
    Segments,
}

impl CellKind {
    pub const ALL: [CellKind; 4] = [Self::Append, Self::RowsNotify, Self::Rows, Self::Segments];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Append => "append",
            Self::RowsNotify => "rows+notify",
            Self::Rows => "rows",
            Self::Segments => "segments",
        }
    }

    /// Its part of a queue name.
    fn slug(self) -> &'static str {
        match self {
            Self::Append => "append",
            Self::RowsNotify => "rowsnotify",
            Self::Rows => "rows",
            Self::Segments => "segments",
        }
    }
}

impl std::fmt::Display for CellKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CeilingError {
    #[error("the ceiling's database URL is invalid: {0}")]
    Url(#[from] tokio_postgres::Error),
    #[error("ceiling cell {cell}: {source}")]
    Store { cell: String, source: StoreError },
    #[error("ceiling: {0}")]
    Setup(StoreError),
}

/// One point of the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CellShape {
    pub kind: CellKind,
    pub messages_per_segment: usize,
    pub segments_per_transaction: usize,
    pub connections: usize,
}

impl std::fmt::Display for CellShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} msgs/segment × {} segments/tx × {} connections",
            self.kind, self.messages_per_segment, self.segments_per_transaction, self.connections
        )
    }
}

impl CellShape {
    fn queue(&self) -> String {
        format!(
            "ceiling-{}-b{}-s{}-c{}",
            self.kind.slug(),
            self.messages_per_segment,
            self.segments_per_transaction,
            self.connections
        )
    }
}

/// Every cell, in the order they run: for each segment size and connection count the four kinds
/// one after the other, so the ratios between kinds compare cells a few seconds apart; then the
/// `append` cells of many segments per transaction.
pub fn sweep() -> Vec<CellShape> {
    let mut cells = Vec::new();
    for messages_per_segment in MESSAGES_PER_SEGMENT {
        for connections in CONNECTIONS {
            for kind in CellKind::ALL {
                cells.push(CellShape { kind, messages_per_segment, segments_per_transaction: 1, connections });
            }
        }
        for segments_per_transaction in SEGMENTS_PER_TRANSACTION.into_iter().filter(|&s| s > 1) {
            for connections in CONNECTIONS {
                let kind = CellKind::Append;
                cells.push(CellShape { kind, messages_per_segment, segments_per_transaction, connections });
            }
        }
    }
    cells
}

/// What one cell reached.
#[derive(Debug, Clone, Serialize)]
pub struct CeilingCell {
    pub shape: CellShape,
    pub seconds: f64,
    pub segments_per_s: f64,
    pub messages_per_s: f64,
    /// Time from `BEGIN` to the end of `COMMIT`, in milliseconds.
    pub transaction_ms: Option<Distribution>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CeilingReport {
    pub cell_seconds: f64,
    pub cells: Vec<CeilingCell>,
}

impl CeilingReport {
    /// The cell of this kind and segment size, one segment per transaction, on `connections`.
    pub fn cell(&self, kind: CellKind, messages_per_segment: usize, connections: usize) -> Option<&CeilingCell> {
        let shape = CellShape { kind, messages_per_segment, segments_per_transaction: 1, connections };
        self.cells.iter().find(|c| c.shape == shape)
    }

    /// The fastest connection count of that kind and segment size, one segment per transaction.
    pub fn fastest(&self, kind: CellKind, messages_per_segment: usize) -> Option<&CeilingCell> {
        CONNECTIONS
            .iter()
            .filter_map(|&connections| self.cell(kind, messages_per_segment, connections))
            .max_by(|a, b| a.messages_per_s.total_cmp(&b.messages_per_s))
    }
}

/// Runs every cell for `cell_duration` against the database at `database_url` (migrated first).
pub async fn run(database_url: &str, cell_duration: Duration) -> Result<CeilingReport, CeilingError> {
    let config: tokio_postgres::Config = database_url.parse()?;
    let settings = PoolSettings {
        // The writers, and the listener.
        max_size: CONNECTIONS.iter().max().unwrap_or(&1) + 1,
        wait_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        statement_timeout: Duration::from_secs(60),
        lock_timeout: Duration::from_secs(10),
        application_name: "queen-bench-ceiling".into(),
    };
    let pool = build_pool(config, &settings).map_err(CeilingError::Setup)?;
    let mut client = pool.get().await.map_err(|e| CeilingError::Setup(e.into()))?;
    queen_store::migrations::migrate(&mut client).await.map_err(CeilingError::Setup)?;
    // A broker listens on the channel the append notifies; a notice nobody listens to costs
    // less. The pool's connection task reads and drops what arrives.
    client
        .batch_execute(&format!("LISTEN {}", crate::ceiling_raw::CHANNEL))
        .await
        .map_err(|e| CeilingError::Setup(e.into()))?;
    let listener = client;

    let epoch = Instant::now();
    let mut cells = Vec::new();
    for shape in sweep() {
        tracing::info!(%shape, "ceiling cell");
        let cell = run_cell(&pool, shape, cell_duration, epoch)
            .await
            .map_err(|source| CeilingError::Store { cell: shape.to_string(), source })?;
        cells.push(cell);
    }
    drop(listener);
    pool.close();
    Ok(CeilingReport { cell_seconds: cell_duration.as_secs_f64(), cells })
}

/// The partitions one connection of a cell writes: its own, one per segment of a transaction,
/// so connections never wait on each other's partition row locks.
struct Writer {
    queue_id: i64,
    queue: String,
    partitions: Vec<RawPartition>,
}

async fn run_cell(
    pool: &Pool,
    shape: CellShape,
    duration: Duration,
    epoch: Instant,
) -> Result<CeilingCell, StoreError> {
    let queue = shape.queue();
    let mut writers = Vec::new();
    {
        let client = pool.get().await?;
        let queue_id = queen_store::queues::ensure_queue(&client, &queue).await?.id;
        for connection in 0..shape.connections {
            let mut partitions = Vec::new();
            for segment in 0..shape.segments_per_transaction {
                let name = format!("p{connection}-{segment}");
                let partition_id = queen_store::queues::ensure_partition(&client, queue_id, &name).await?;
                partitions.push(RawPartition::new(queue_id, &queue, partition_id));
            }
            writers.push(Writer { queue_id, queue: queue.clone(), partitions });
        }
    }
    let state = Arc::new(CellState {
        shape,
        generator: MessageGenerator::new(queue, epoch),
        next_seq: AtomicU64::new(0),
        segments: AtomicU64::new(0),
        transaction_times: LatencyRecorder::new(),
        deadline: Instant::now() + duration,
    });
    let started = Instant::now();
    let tasks: Vec<_> = writers
        .into_iter()
        .map(|writer| {
            let (pool, state) = (pool.clone(), state.clone());
            tokio::spawn(async move { write_until(&pool, writer, &state).await })
        })
        .collect();
    for task in futures::future::join_all(tasks).await {
        task.map_err(|e| StoreError::Unavailable(format!("a ceiling writer stopped: {e}")))??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let segments = state.segments.load(Ordering::Relaxed) as f64;
    Ok(CeilingCell {
        shape,
        seconds,
        segments_per_s: segments / seconds,
        messages_per_s: segments * shape.messages_per_segment as f64 / seconds,
        transaction_ms: state.transaction_times.summary_ms(),
    })
}

/// What the connections of one cell share.
struct CellState {
    shape: CellShape,
    generator: MessageGenerator,
    next_seq: AtomicU64,
    /// Segments committed.
    segments: AtomicU64,
    transaction_times: LatencyRecorder,
    deadline: Instant,
}

/// One connection's loop: a transaction of `segments_per_transaction` segments, committed, again.
async fn write_until(pool: &Pool, mut writer: Writer, state: &CellState) -> Result<(), StoreError> {
    let mut client = pool.get().await?;
    let per_segment = state.shape.messages_per_segment as u64;
    let kind = state.shape.kind;
    while Instant::now() < state.deadline {
        // Generated before BEGIN, as the broker parses a request before it writes; the raw cells
        // compress there too, the append compresses under its lock as production does.
        let batches: Vec<Vec<NewMessage>> = writer
            .partitions
            .iter()
            .map(|_| {
                let first = state.next_seq.fetch_add(per_segment, Ordering::Relaxed);
                (first..first + per_segment).map(|seq| state.generator.new_message(seq)).collect()
            })
            .collect();
        let segments = match kind {
            CellKind::Append => Vec::new(),
            _ => batches.iter().map(|messages| RawSegment::encode(messages)).collect::<Result<_, _>>()?,
        };
        let began = Instant::now();
        let tx = client.transaction().await?;
        for (index, partition) in writer.partitions.iter_mut().enumerate() {
            match kind {
                CellKind::Append => {
                    let destination = Destination {
                        queue_id: writer.queue_id,
                        queue: &writer.queue,
                        partition_id: partition.partition_id,
                    };
                    let policy = AppendPolicy::default();
                    queen_store::log::append_in_transaction(&tx, destination, &batches[index], &policy).await?;
                }
                CellKind::RowsNotify => write_rows(&tx, partition, &segments[index], true).await?,
                CellKind::Rows => write_rows(&tx, partition, &segments[index], false).await?,
                CellKind::Segments => write_segment(&tx, partition, &segments[index]).await?,
            }
        }
        tx.commit().await?;
        state.transaction_times.record_all([began.elapsed().as_micros() as u64]);
        state.segments.fetch_add(writer.partitions.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_runs_every_kind_side_by_side_and_append_in_full() {
        let cells = sweep();
        // append: 3 sizes × 2 segments/tx × 3 connections; the raw kinds: 3 sizes × 3 connections.
        assert_eq!(cells.len(), 18 + 3 * 9);
        for kind in CellKind::ALL {
            for size in MESSAGES_PER_SEGMENT {
                for connections in CONNECTIONS {
                    let shape =
                        CellShape { kind, messages_per_segment: size, segments_per_transaction: 1, connections };
                    assert_eq!(cells.iter().filter(|&&c| c == shape).count(), 1, "{shape}");
                }
            }
        }
        assert!(cells.iter().all(|c| c.segments_per_transaction == 1 || c.kind == CellKind::Append));
        // The kinds of one size and connection count run back to back.
        assert_eq!(cells[..4].iter().map(|c| c.kind).collect::<Vec<_>>(), CellKind::ALL);
        assert!(cells[..4].iter().all(|c| c.connections == 1 && c.messages_per_segment == 100));
    }
}
