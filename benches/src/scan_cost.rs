//! `scan-cost`: what the queue-wide candidate query of a pop costs as a queue's partitions grow.
//!
//! For each partition count P, a queue of P partitions, each holding one message, and one
//! group's cursor on each, half of them past that message: P/2 partitions pending. Then the
//! store's own query, `queen_store::cursors::candidates`, timed in the two forms a queue-wide pop
//! uses: `Scope::All`, the full scan a pop falls back to when it knows of no candidates, and
//! `Scope::Only` with three listed partitions, the pop planned from announcements. The query
//! runs as production runs it (a cached prepared statement, so PostgreSQL may move to a generic
//! plan after a few runs), and `auto_explain` shows the plan of one more full scan.

use std::time::{Duration, Instant};

use deadpool_postgres::{ClientWrapper, Transaction};
use futures::StreamExt;
use queen_client::uuid::Uuid;
use queen_log::{Frame, SegmentBuilder};
use queen_store::StoreError;
use queen_store::cursors::{Scope, Visibility, candidates};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::cli::ScanCostArgs;
use crate::own_postgres::{OwnPostgres, OwnPostgresError};
use crate::stats::Distribution;

/// The consumer group whose cursors the queues hold.
const GROUP: &str = "scan-cost";
/// Partitions listed in the planned form: a few announced ones.
const LISTED: usize = 3;
/// Runs of each form before the timed ones (connection and caches warm, statements prepared).
const WARM_RUNS: usize = 3;
/// Partition names per creation statement.
const CREATE_CHUNK: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum ScanCostError {
    #[error(transparent)]
    Postgres(#[from] OwnPostgresError),
    #[error("scan-cost: {0}")]
    Sql(#[from] tokio_postgres::Error),
    #[error("scan-cost: {0}")]
    Store(#[from] StoreError),
    #[error("scan-cost: {0}")]
    Encode(#[from] queen_log::EncodeError),
}

pub async fn run(args: ScanCostArgs) -> Result<String, ScanCostError> {
    let postgres = OwnPostgres::start("scan-cost", args.pg_dir.clone(), Vec::new()).await?;
    let result = measure(&args, &postgres.database_url).await;
    postgres.stop().await;
    result
}

/// One queue of the measurement.
struct Subject {
    partitions: usize,
    queue_id: i64,
    /// Pending partitions spread over the queue, the planned form's list.
    listed: Vec<i64>,
}

/// What was measured on one queue; times in µs.
struct Measured {
    partitions: usize,
    full_rows: usize,
    full_us: Option<Distribution>,
    listed_rows: usize,
    listed_us: Option<Distribution>,
    plan: String,
}

async fn measure(args: &ScanCostArgs, url: &str) -> Result<String, ScanCostError> {
    let (mut client, mut notices) = connect(url).await?;
    queen_store::migrations::migrate(&mut client).await?;
    let mut subjects = Vec::new();
    for &partitions in &args.partitions {
        tracing::info!(partitions, "scan-cost: creating the queue");
        subjects.push(create(&mut client, partitions).await?);
    }
    // Statistics and visibility as a settled database has them, not as bulk loading left them.
    client.batch_execute("VACUUM ANALYZE queen.partitions, queen.log_consumers, queen.log_segments").await?;
    let mut measured = Vec::new();
    for subject in &subjects {
        tracing::info!(partitions = subject.partitions, "scan-cost: timing");
        measured.push(time(&mut client, &mut notices, subject, args.runs.max(1)).await?);
    }
    Ok(report(&measured, args.runs))
}

/// A connection whose notices (`auto_explain`'s plans) come out on the receiver, wrapped as the
/// pool's connections are, so the store's queries run on it unchanged.
async fn connect(url: &str) -> Result<(ClientWrapper, mpsc::UnboundedReceiver<String>), ScanCostError> {
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await?;
    let (sender, notices) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notice(notice) = message {
                let _ = sender.send(notice.message().to_owned());
            }
        }
    });
    Ok((ClientWrapper::new(client, task), notices))
}

/// The queue `scan-cost-<P>`: partitions created by the store's code, then in bulk one message
/// each (the partition row advanced and a real one-message segment; the transaction-id rows are
/// left out, the candidate query does not read them) and the group's cursor on each, committed
/// past the message on the odd ids.
async fn create(client: &mut ClientWrapper, partitions: usize) -> Result<Subject, ScanCostError> {
    let queue = format!("scan-cost-{partitions}");
    let names: Vec<String> = (0..partitions).map(|i| format!("p{i:06}")).collect();
    let tx = client.transaction().await?;
    let queue_id = queen_store::queues::create_queues(&tx, &[&queue], 0).await?[0].id;
    for chunk in names.chunks(CREATE_CHUNK) {
        let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
        queen_store::queues::create_partitions(&tx, queue_id, &queue, &chunk, 0).await?;
    }
    let mut builder = SegmentBuilder::new();
    let message_id: Uuid = queen_log::new_message_id();
    builder.push(&Frame {
        message_id,
        trace_id: None,
        transaction_id: "scan-cost-1",
        producer: None,
        payload: br#"{"n":1}"#,
    })?;
    let segment = builder.finish()?;
    let raw_len = i32::try_from(segment.raw_len).unwrap_or(i32::MAX);
    tx.execute(
        "WITH p AS (
             UPDATE queen.partitions SET last_offset = 1, last_segment_at = now()
              WHERE queue_id = $1 RETURNING id
         ), s AS (
             INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, created_at, frame_count,
                                             raw_length, body)
             SELECT id, 1, 1, now(), 1, $2, $3 FROM p
         )
         INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
         SELECT id, $4, id % 2 FROM p",
        &[&queue_id, &raw_len, &segment.body, &GROUP],
    )
    .await?;
    tx.commit().await?;
    let pending: Vec<i64> = client
        .query("SELECT id FROM queen.partitions WHERE queue_id = $1 AND id % 2 = 0 ORDER BY id", &[&queue_id])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let listed =
        (0..LISTED.min(pending.len())).map(|i| pending[i * (pending.len() - 1) / (LISTED - 1).max(1)]).collect();
    Ok(Subject { partitions, queue_id, listed })
}

async fn time(
    client: &mut ClientWrapper,
    notices: &mut mpsc::UnboundedReceiver<String>,
    subject: &Subject,
    runs: usize,
) -> Result<Measured, ScanCostError> {
    // The store's queries take a pooled client or a transaction; a read-only transaction around
    // the runs serves, each statement still taking its own snapshot (read committed).
    let tx = client.transaction().await?;
    let all = Scope::All;
    let listed = Scope::Only(&subject.listed);
    let (full_rows, full_us) = time_scope(&tx, subject.queue_id, all, runs).await?;
    let (listed_rows, listed_us) = time_scope(&tx, subject.queue_id, listed, runs).await?;
    tx.batch_execute(
        "LOAD 'auto_explain';
         SET LOCAL auto_explain.log_min_duration = 0;
         SET LOCAL auto_explain.log_analyze = on;
         SET LOCAL auto_explain.log_buffers = on;
         SET LOCAL auto_explain.log_level = notice;",
    )
    .await?;
    while notices.try_recv().is_ok() {}
    candidates(&tx, subject.queue_id, all, GROUP, Visibility::Immediate).await?;
    tx.commit().await?;
    // The notice precedes the query's answer on the connection; the wait is a safety margin.
    let plan = tokio::time::timeout(Duration::from_secs(2), notices.recv()).await.ok().flatten();
    let plan = plan.as_deref().map_or_else(|| "no plan received".to_owned(), summarise_plan);
    Ok(Measured { partitions: subject.partitions, full_rows, full_us, listed_rows, listed_us, plan })
}

/// Rows returned and the distribution of run times (µs) of the candidate query in `scope`.
async fn time_scope(
    tx: &Transaction<'_>,
    queue_id: i64,
    scope: Scope<'_>,
    runs: usize,
) -> Result<(usize, Option<Distribution>), ScanCostError> {
    let mut rows = 0;
    for _ in 0..WARM_RUNS {
        rows = candidates(tx, queue_id, scope, GROUP, Visibility::Immediate).await?.len();
    }
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        candidates(tx, queue_id, scope, GROUP, Visibility::Immediate).await?;
        times.push(started.elapsed().as_micros() as u64);
    }
    Ok((rows, Distribution::of_values(&mut times)))
}

/// `auto_explain`'s duration, the top node's buffers and the scan nodes, on one line.
fn summarise_plan(plan: &str) -> String {
    let duration = plan.lines().next().and_then(|l| l.split("plan:").next()).unwrap_or("").trim();
    let buffers = plan.lines().find(|l| l.trim_start().starts_with("Buffers:")).map(str::trim).unwrap_or("");
    let scans: Vec<&str> = plan
        .lines()
        .map(|l| l.trim_start().trim_start_matches("->").trim())
        .filter(|l| l.contains(" Scan ") || l.starts_with("Seq Scan"))
        .map(|l| l.split("  (").next().unwrap_or(l))
        .collect();
    format!("{duration}; top node {buffers}; {}", scans.join(", "))
}

fn report(measured: &[Measured], runs: usize) -> String {
    let ms =
        |d: Option<Distribution>| d.map_or("–".to_owned(), |d| format!("{:.2} / {:.2}", d.p50 / 1e3, d.p99 / 1e3));
    let mut out = format!(
        "Candidate query of a queue-wide pop (`queen_store::cursors::candidates`, `Visibility::Immediate`), \
         {runs} timed runs of each form per queue, one group, half of the partitions pending.\n\n\
         | partitions | full scan rows | full scan ms p50 / p99 | listed ({LISTED}) rows | listed ms p50 / p99 | \
         full ÷ listed (p50) |\n|---:|---:|---:|---:|---:|---:|\n"
    );
    for m in measured {
        let ratio = match (m.full_us, m.listed_us) {
            (Some(full), Some(listed)) if listed.p50 > 0.0 => format!("{:.0}", full.p50 / listed.p50),
            _ => "–".to_owned(),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {ratio} |\n",
            m.partitions,
            m.full_rows,
            ms(m.full_us),
            m.listed_rows,
            ms(m.listed_us)
        ));
    }
    out.push_str("\nThe full scan once more under `auto_explain` (ANALYZE, BUFFERS):\n\n");
    for m in measured {
        out.push_str(&format!("- {} partitions: {}\n", m.partitions, m.plan));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_is_summarised_on_one_line() {
        let plan = "duration: 12.345 ms  plan:\nQuery Text: SELECT ...\nSort  (cost=1..2 rows=3 width=4) (actual \
                    time=1..2 rows=3 loops=1)\n  Buffers: shared hit=1234\n  ->  Hash Right Join  (cost=1..2)\n        \
                    ->  Seq Scan on log_consumers c  (cost=0..1)\n        ->  Index Scan using partitions_queue_id_id \
                    on partitions p  (cost=0..1)\n              Buffers: shared hit=99\n";
        assert_eq!(
            summarise_plan(plan),
            "duration: 12.345 ms; top node Buffers: shared hit=1234; Seq Scan on log_consumers c, Index Scan using \
             partitions_queue_id_id on partitions p"
        );
    }
}
