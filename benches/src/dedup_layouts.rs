//! `dedup-layouts`: what each way of indexing a push's transaction ids costs PostgreSQL, against
//! writing the segment row alone.
//!
//! Exact dedup per (partition, transaction id), answering a duplicate with the original message,
//! needs every stored id findable. The layouts below are the ways PostgreSQL offers: a row per
//! id with a unique B-tree (production's `log_message_ids`), a narrower row keyed by a 64-bit
//! hash of the id, or the ids as an array in the segment row with a GIN index; `array` stores
//! the ids without any index (no lookup possible) to separate the bytes from the index entries.
//! Each cell writes segments of the same compressed bytes, one statement per segment (the
//! partition row advanced, the segment row, the layout's ids), on its own fresh tables after a
//! checkpoint; the layouts take turns, in reverse order every other round, and each is reported
//! against the `segments` cell of its round.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use queen_client::uuid::Uuid;
use queen_log::{Frame, SegmentBuilder};

use crate::cli::DedupLayoutsArgs;
use crate::generator::MessageGenerator;
use crate::own_postgres::{OwnPostgres, OwnPostgresError};

#[derive(Debug, thiserror::Error)]
pub enum DedupLayoutsError {
    #[error(transparent)]
    Postgres(#[from] OwnPostgresError),
    #[error("dedup-layouts: {0}")]
    Sql(#[from] tokio_postgres::Error),
    #[error("dedup-layouts: {0}")]
    Encode(#[from] queen_log::EncodeError),
    #[error("dedup-layouts: a writer stopped: {0}")]
    Writer(#[from] tokio::task::JoinError),
}

/// How the transaction ids of a segment are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    Segments,
    Array,
    Rows,
    Hashed,
    Gin,
}

impl Layout {
    const ALL: [Layout; 5] = [Layout::Segments, Layout::Array, Layout::Rows, Layout::Hashed, Layout::Gin];

    fn name(self) -> &'static str {
        match self {
            Layout::Segments => "segments",
            Layout::Array => "array",
            Layout::Rows => "rows",
            Layout::Hashed => "hashed",
            Layout::Gin => "gin",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Layout::Segments => "the segment row alone: no id stored",
            Layout::Array => "the ids as a text[] column of the segment row, no index: no lookup possible",
            Layout::Rows => "a row per id (text id, offset, message id), unique B-tree on (partition, id): production",
            Layout::Hashed => "a row per id (64-bit hash of the id, offset), unique B-tree on (partition, hash)",
            Layout::Gin => "the ids as a text[] column of the segment row, GIN index (fastupdate off)",
        }
    }

    /// The statement writing one segment. Parameters: partition, message count, body, the ids,
    /// the message ids, the ids' hashes; every layout binds all of them, so all pay the same
    /// transfer and parsing.
    fn insert(self) -> String {
        let advance = "WITH p AS (UPDATE dedup.partitions SET last_offset = last_offset + $2::bigint WHERE id = $1
                        RETURNING last_offset - $2::bigint + 1 AS base_offset)";
        let bound = "cardinality($4::text[]) = cardinality($5::uuid[]) AND cardinality($6::bigint[]) = $2::bigint";
        match self {
            Layout::Segments => format!(
                "{advance} INSERT INTO dedup.segments (partition_id, base_offset, body)
                 SELECT $1, base_offset, $3 FROM p WHERE {bound}"
            ),
            Layout::Array | Layout::Gin => format!(
                "{advance} INSERT INTO dedup.segments (partition_id, base_offset, body, transaction_ids)
                 SELECT $1, base_offset, $3, $4 FROM p WHERE {bound}"
            ),
            Layout::Rows => format!(
                "{advance}, s AS (INSERT INTO dedup.segments (partition_id, base_offset, body)
                                  SELECT $1, base_offset, $3 FROM p WHERE {bound})
                 INSERT INTO dedup.ids (partition_id, transaction_id, message_offset, message_id)
                 SELECT $1, t.id, p.base_offset + t.n - 1, t.message_id
                   FROM p, unnest($4::text[], $5::uuid[]) WITH ORDINALITY AS t(id, message_id, n)"
            ),
            Layout::Hashed => format!(
                "{advance}, s AS (INSERT INTO dedup.segments (partition_id, base_offset, body)
                                  SELECT $1, base_offset, $3 FROM p WHERE {bound})
                 INSERT INTO dedup.hashed_ids (partition_id, id_hash, message_offset)
                 SELECT $1, t.id_hash, p.base_offset + t.n - 1
                   FROM p, unnest($6::bigint[]) WITH ORDINALITY AS t(id_hash, n)"
            ),
        }
    }
}

/// How the producers mint transaction ids: the official client sends a UUID, v7 (time-ordered)
/// when `uuid_extensions` is installed and v4 (random) otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    V4,
    V7,
}

impl Keys {
    fn mint(self) -> String {
        match self {
            Keys::V4 => Uuid::new_v4().to_string(),
            Keys::V7 => Uuid::now_v7().to_string(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Keys::V4 => "UUID v4",
            Keys::V7 => "UUID v7",
        }
    }
}

/// The tables of one cell, made fresh.
const SCHEMA: &str = "
    DROP SCHEMA IF EXISTS dedup CASCADE;
    CREATE SCHEMA dedup;
    CREATE TABLE dedup.partitions (id bigint PRIMARY KEY, last_offset bigint NOT NULL DEFAULT 0)
        WITH (fillfactor = 80);
    CREATE TABLE dedup.segments (
        partition_id bigint NOT NULL, base_offset bigint NOT NULL, body bytea NOT NULL, transaction_ids text[],
        PRIMARY KEY (partition_id, base_offset));
    ALTER TABLE dedup.segments ALTER COLUMN body SET STORAGE EXTERNAL;
    CREATE TABLE dedup.ids (
        partition_id bigint NOT NULL, transaction_id text NOT NULL, message_offset bigint NOT NULL,
        message_id uuid NOT NULL, PRIMARY KEY (partition_id, transaction_id));
    CREATE TABLE dedup.hashed_ids (
        partition_id bigint NOT NULL, id_hash bigint NOT NULL, message_offset bigint NOT NULL,
        PRIMARY KEY (partition_id, id_hash));";

/// One segment's worth of parameters, made before the statement as a broker makes them.
struct Batch {
    body: Vec<u8>,
    transaction_ids: Vec<String>,
    message_ids: Vec<Uuid>,
    hashes: Vec<i64>,
}

fn batch(
    generator: &MessageGenerator,
    first_seq: u64,
    messages: usize,
    keys: Keys,
) -> Result<Batch, DedupLayoutsError> {
    let mut builder = SegmentBuilder::new();
    let (mut transaction_ids, mut message_ids, mut hashes) = (Vec::new(), Vec::new(), Vec::new());
    for seq in first_seq..first_seq + messages as u64 {
        let transaction_id = keys.mint();
        let message_id = queen_log::new_message_id();
        let payload = generator.payload(seq, generator.now_us());
        builder.push(&Frame {
            message_id,
            trace_id: None,
            transaction_id: &transaction_id,
            producer: None,
            payload: payload.as_bytes(),
        })?;
        let mut hasher = DefaultHasher::new();
        transaction_id.hash(&mut hasher);
        hashes.push(hasher.finish() as i64);
        transaction_ids.push(transaction_id);
        message_ids.push(message_id);
    }
    Ok(Batch { body: builder.finish()?.body, transaction_ids, message_ids, hashes })
}

/// One cell's result.
struct Cell {
    round: usize,
    layout: Layout,
    keys: Keys,
    messages_per_s: f64,
}

pub async fn run(args: DedupLayoutsArgs) -> Result<String, DedupLayoutsError> {
    let postgres = OwnPostgres::start("dedup-layouts", args.pg_dir.clone(), Vec::new()).await?;
    let result = measure(&args, &postgres.database_url).await;
    postgres.stop().await;
    result
}

async fn measure(args: &DedupLayoutsArgs, url: &str) -> Result<String, DedupLayoutsError> {
    let mut cells = Vec::new();
    for round in 0..args.rounds {
        let mut order: Vec<(Layout, Keys)> =
            [Keys::V4, Keys::V7].into_iter().flat_map(|keys| Layout::ALL.map(|layout| (layout, keys))).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for (layout, keys) in order {
            tracing::info!(round = round + 1, layout = layout.name(), keys = keys.name(), "dedup-layouts cell");
            let messages_per_s = run_cell(args, url, layout, keys).await?;
            cells.push(Cell { round, layout, keys, messages_per_s });
        }
    }
    Ok(report(args, &cells))
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, DedupLayoutsError> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// Fresh tables, a checkpoint, then `connections` writers for `cell`, each on partitions of its
/// own (so none waits on another's partition row).
async fn run_cell(args: &DedupLayoutsArgs, url: &str, layout: Layout, keys: Keys) -> Result<f64, DedupLayoutsError> {
    let admin = connect(url).await?;
    admin.batch_execute(SCHEMA).await?;
    if layout == Layout::Gin {
        admin
            .batch_execute("CREATE INDEX ON dedup.segments USING gin (transaction_ids) WITH (fastupdate = off)")
            .await?;
    }
    let partitions = (args.connections * args.partitions_per_connection) as i64;
    admin.execute("INSERT INTO dedup.partitions (id) SELECT generate_series(1, $1::bigint)", &[&partitions]).await?;
    admin.batch_execute("CHECKPOINT").await?;
    let generator = Arc::new(MessageGenerator::new("dedup-layouts", Instant::now()));
    let next_seq = Arc::new(AtomicU64::new(0));
    let segments = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + args.cell;
    let started = Instant::now();
    let mut writers = Vec::new();
    for connection in 0..args.connections {
        let client = connect(url).await?;
        let (generator, next_seq, segments) = (generator.clone(), next_seq.clone(), segments.clone());
        let (messages, per_connection) = (args.messages_per_segment, args.partitions_per_connection);
        writers.push(tokio::spawn(async move {
            let statement = client.prepare(&layout.insert()).await?;
            let own: Vec<i64> = (0..per_connection).map(|i| (connection * per_connection + i + 1) as i64).collect();
            let mut turn = 0;
            while Instant::now() < deadline {
                let first_seq = next_seq.fetch_add(messages as u64, Ordering::Relaxed);
                let batch = batch(&generator, first_seq, messages, keys)?;
                let count = messages as i64;
                let partition = own[turn % own.len()];
                turn += 1;
                client
                    .execute(
                        &statement,
                        &[&partition, &count, &batch.body, &batch.transaction_ids, &batch.message_ids, &batch.hashes],
                    )
                    .await?;
                segments.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), DedupLayoutsError>(())
        }));
    }
    for writer in futures::future::join_all(writers).await {
        writer??;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(segments.load(Ordering::Relaxed) as f64 * args.messages_per_segment as f64 / seconds)
}

fn report(args: &DedupLayoutsArgs, cells: &[Cell]) -> String {
    let rounds = args.rounds;
    let mut out = format!(
        "Dedup layouts: {} messages per segment, one statement per segment (autocommit), {} connections, {} s per \
         cell, {rounds} round(s); msgs/s, and in parentheses ÷ the `segments` cell of the same round and keys.\n\n",
        args.messages_per_segment,
        args.connections,
        args.cell.as_secs_f64(),
    );
    out.push_str("| layout | keys |");
    for round in 1..=rounds {
        out.push_str(&format!(" round {round} |"));
    }
    out.push_str(" what it stores |\n|---|---|");
    out.push_str(&"---:|".repeat(rounds));
    out.push_str("---|\n");
    let rate = |round: usize, layout: Layout, keys: Keys| {
        cells.iter().find(|c| c.round == round && c.layout == layout && c.keys == keys).map(|c| c.messages_per_s)
    };
    for keys in [Keys::V4, Keys::V7] {
        for layout in Layout::ALL {
            out.push_str(&format!("| {} | {} |", layout.name(), keys.name()));
            for round in 0..rounds {
                match (rate(round, layout, keys), rate(round, Layout::Segments, keys)) {
                    (Some(own), Some(base)) if base > 0.0 => {
                        out.push_str(&format!(" {own:.0} ({:.2}) |", own / base));
                    }
                    _ => out.push_str(" – |"),
                }
            }
            out.push_str(&format!(" {} |\n", layout.what()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_binds_all_six_parameters() {
        for layout in Layout::ALL {
            let sql = layout.insert();
            for n in 1..=6 {
                assert!(sql.contains(&format!("${n}")), "{} does not use ${n}", layout.name());
            }
        }
    }

    #[test]
    fn a_batch_carries_one_id_and_one_hash_per_message() {
        let generator = MessageGenerator::new("t", Instant::now());
        let batch = batch(&generator, 0, 10, Keys::V4).expect("a batch");
        assert_eq!((batch.transaction_ids.len(), batch.message_ids.len(), batch.hashes.len()), (10, 10, 10));
        let distinct: std::collections::HashSet<_> = batch.transaction_ids.iter().collect();
        assert_eq!(distinct.len(), 10);
    }
}
