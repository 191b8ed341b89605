//! The storage ceiling: the segments a push would write, appended straight into PostgreSQL with
//! the broker's own SQL (`queen_store::log::append_in_transaction`), no HTTP and no broker. What
//! the broker reaches is read as a fraction of this.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use queen_store::log::{AppendPolicy, Destination, NewMessage};
use queen_store::pool::{PoolSettings, build_pool};
use queen_store::{Pool, StoreError};
use serde::Serialize;

use crate::generator::MessageGenerator;
use crate::stats::{Distribution, LatencyRecorder};

/// Messages per segment: the push scenarios' batch sizes.
pub const MESSAGES_PER_SEGMENT: [usize; 3] = [100, 10, 1];
pub const SEGMENTS_PER_TRANSACTION: [usize; 2] = [1, 10];
pub const CONNECTIONS: [usize; 3] = [1, 4, 8];

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
    pub messages_per_segment: usize,
    pub segments_per_transaction: usize,
    pub connections: usize,
}

impl std::fmt::Display for CellShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} msgs/segment × {} segments/tx × {} connections",
            self.messages_per_segment, self.segments_per_transaction, self.connections
        )
    }
}

impl CellShape {
    fn queue(&self) -> String {
        format!("ceiling-b{}-s{}-c{}", self.messages_per_segment, self.segments_per_transaction, self.connections)
    }
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
    /// The fastest cell writing segments of `messages_per_segment`, one segment per
    /// transaction: what a broker committing each push batch on its own could at best reach.
    pub fn same_shape_as_push(&self, messages_per_segment: usize) -> Option<&CeilingCell> {
        self.cells
            .iter()
            .filter(|c| c.shape.messages_per_segment == messages_per_segment && c.shape.segments_per_transaction == 1)
            .max_by(|a, b| a.messages_per_s.total_cmp(&b.messages_per_s))
    }

    /// The fastest cell of all, in messages per second.
    pub fn best(&self) -> Option<&CeilingCell> {
        self.cells.iter().max_by(|a, b| a.messages_per_s.total_cmp(&b.messages_per_s))
    }
}

/// Runs every cell for `cell_duration` against the database at `database_url` (migrated first).
pub async fn run(database_url: &str, cell_duration: Duration) -> Result<CeilingReport, CeilingError> {
    let config: tokio_postgres::Config = database_url.parse()?;
    let settings = PoolSettings {
        max_size: *CONNECTIONS.iter().max().unwrap_or(&1),
        wait_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        statement_timeout: Duration::from_secs(60),
        lock_timeout: Duration::from_secs(10),
        application_name: "queen-bench-ceiling".into(),
    };
    let pool = build_pool(config, &settings).map_err(CeilingError::Setup)?;
    let mut client = pool.get().await.map_err(|e| CeilingError::Setup(e.into()))?;
    queen_store::migrations::migrate(&mut client).await.map_err(CeilingError::Setup)?;
    drop(client);

    let epoch = Instant::now();
    let mut cells = Vec::new();
    for messages_per_segment in MESSAGES_PER_SEGMENT {
        for segments_per_transaction in SEGMENTS_PER_TRANSACTION {
            for connections in CONNECTIONS {
                let shape = CellShape { messages_per_segment, segments_per_transaction, connections };
                tracing::info!(%shape, "ceiling cell");
                let cell = run_cell(&pool, shape, cell_duration, epoch)
                    .await
                    .map_err(|source| CeilingError::Store { cell: shape.to_string(), source })?;
                cells.push(cell);
            }
        }
    }
    pool.close();
    Ok(CeilingReport { cell_seconds: cell_duration.as_secs_f64(), cells })
}

/// The partitions one connection of a cell writes: its own, one per segment of a transaction,
/// so connections never wait on each other's partition row locks.
struct Writer {
    queue_id: i64,
    queue: String,
    partitions: Vec<i64>,
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
                partitions.push(queen_store::queues::ensure_partition(&client, queue_id, &name).await?);
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
            tokio::spawn(async move { write_until(&pool, &writer, &state).await })
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

/// One connection's loop: a transaction of `segments_per_transaction` appends, committed, again.
async fn write_until(pool: &Pool, writer: &Writer, state: &CellState) -> Result<(), StoreError> {
    let mut client = pool.get().await?;
    let per_segment = state.shape.messages_per_segment as u64;
    while Instant::now() < state.deadline {
        // Generated before BEGIN, as the broker parses a request before it writes.
        let batches: Vec<Vec<NewMessage>> = writer
            .partitions
            .iter()
            .map(|_| {
                let first = state.next_seq.fetch_add(per_segment, Ordering::Relaxed);
                (first..first + per_segment).map(|seq| state.generator.new_message(seq)).collect()
            })
            .collect();
        let began = Instant::now();
        let tx = client.transaction().await?;
        for (&partition_id, messages) in writer.partitions.iter().zip(&batches) {
            let destination = Destination { queue_id: writer.queue_id, queue: &writer.queue, partition_id };
            queen_store::log::append_in_transaction(&tx, destination, messages, &AppendPolicy::default()).await?;
        }
        tx.commit().await?;
        state.transaction_times.record_all([began.elapsed().as_micros() as u64]);
        state.segments.fetch_add(writer.partitions.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}
