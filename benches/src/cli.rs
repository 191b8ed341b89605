//! The `queen-bench` command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::scenarios::ScenarioName;

#[derive(Debug, Parser)]
#[command(
    name = "queen-bench",
    version,
    about = "Load generator and storage-ceiling tool for Queen-compatible brokers",
    after_help = "Every figure worth quoting is a ratio measured side by side in one `suite` run; see benches/README.md."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every scenario and the ceiling side by side: own PostgreSQL, one broker per scenario
    Suite(SuiteArgs),
    /// Run one scenario against a broker you started
    Run(RunArgs),
    /// Insert segments straight into PostgreSQL with the production SQL (no broker)
    Ceiling(CeilingArgs),
    /// Simulate a fleet's LISTEN/NOTIFY announcements on the bench's own PostgreSQL (no broker)
    Announce(AnnounceArgs),
    /// Time the queue-wide candidate scan of a pop as the partitions of a queue grow (no broker)
    ScanCost(ScanCostArgs),
    /// Measure what each way of indexing transaction ids for dedup costs against the segment row
    /// alone, on the bench's own PostgreSQL (no broker)
    DedupLayouts(DedupLayoutsArgs),
}

#[derive(Debug, Args)]
pub struct SuiteArgs {
    /// Directory for report.json, report.md and the broker logs
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// The broker binary; defaults to `queen` next to this binary (target/release/queen)
    #[arg(long, value_name = "PATH")]
    pub broker_bin: Option<PathBuf>,
    /// A second broker binary (B) to compare the first (A) with: every scenario runs with both,
    /// alternating which goes first, and the report gives A/B; the ceiling runs once
    #[arg(long, value_name = "PATH")]
    pub compare_bin: Option<PathBuf>,
    /// Data directory of the suite's own PostgreSQL; defaults to bench-pg in the target directory
    #[arg(long, value_name = "DIR")]
    pub pg_dir: Option<PathBuf>,
    /// Only these scenarios (comma-separated); all by default
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Vec<ScenarioName>,
    /// Skip the storage ceiling (the push-vs-ceiling target is then not computed)
    #[arg(long)]
    pub skip_ceiling: bool,
    /// Measured time of each ceiling cell
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub ceiling_cell: Duration,
    /// Do not run pg_test_fsync before and after the suite
    #[arg(long)]
    pub no_fsync_probe: bool,
    /// Runs of each scenario per build, alternating which build goes first; the report gives
    /// every round and stands the median one for them (an odd count has a true median)
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    pub rounds: usize,
    #[command(flatten)]
    pub load: LoadArgs,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The scenario to run
    pub scenario: ScenarioName,
    /// Base URL of the broker
    #[arg(long, default_value = "http://127.0.0.1:6632", env = "QUEEN_BENCH_URL")]
    pub url: String,
    /// A bearer token for a broker with auth on, sent on every request
    #[arg(long, env = "QUEEN_BENCH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The broker's process id, to report its CPU time and peak RSS (same machine only)
    #[arg(long)]
    pub broker_pid: Option<i32>,
    /// The PostgreSQL postmaster's process id, to report the CPU time of PostgreSQL
    #[arg(long)]
    pub postgres_pid: Option<i32>,
    /// Directory for report.json and report.md
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    #[command(flatten)]
    pub load: LoadArgs,
}

#[derive(Debug, Args)]
pub struct CeilingArgs {
    /// PostgreSQL to write to (the schema is migrated; queues named ceiling-* are created)
    #[arg(long, value_name = "URL", env = "QUEEN_BENCH_DATABASE_URL")]
    pub database_url: String,
    /// Measured time of each cell
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub cell: Duration,
    /// Directory for report.json and report.md
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct AnnounceArgs {
    /// Fleet sizes to simulate, one LISTEN connection per broker
    #[arg(long, value_delimiter = ',', default_value = "3,30,300")]
    pub brokers: Vec<usize>,
    /// How announcements reach the brokers; both by default
    #[arg(long, value_delimiter = ',', default_value = "single,sharded")]
    pub designs: Vec<crate::announce::Design>,
    /// Announcements per second offered, over all publishers
    #[arg(long, default_value_t = 2000)]
    pub rate: u32,
    /// Queues the announcements are spread over, uniformly
    #[arg(long, default_value_t = 1000)]
    pub queues: usize,
    /// Partitions of each queue, for the partition ids the announcements name
    #[arg(long, default_value_t = 10)]
    pub partitions_per_queue: usize,
    /// Publisher connections; each sends its share once per announcer interval (5 ms)
    #[arg(long, default_value_t = 2)]
    pub publishers: usize,
    /// Channels of the sharded design; a queue's announcements go to the channel of its hash
    #[arg(long, default_value_t = 64)]
    pub channels: usize,
    /// Brokers that serve each queue (hold its consumers), chosen by hashing
    #[arg(long, default_value_t = 3)]
    pub brokers_per_queue: usize,
    /// Measured time of each cell (by send time)
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Time each cell sends before it measures
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// After the cells, raise the offered rate for these designs at the largest fleet until the
    /// brokers no longer keep up
    #[arg(long, value_delimiter = ',')]
    pub saturate: Vec<crate::announce::Design>,
    /// First offered rate of the saturation search; it doubles, then one bisection step
    #[arg(long, default_value_t = 1000)]
    pub saturate_from: u32,
    /// Highest offered rate the saturation search tries
    #[arg(long, default_value_t = 64_000)]
    pub saturate_max: u32,
    /// Measured time of each step of the saturation search
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub saturate_step: Duration,
    /// A step is kept up with only if the wake latency p99 stays within this
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub latency_bound: Duration,
    /// Data directory of the bench's own PostgreSQL; defaults to bench-pg-announce in the target
    /// directory
    #[arg(long, value_name = "DIR")]
    pub pg_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ScanCostArgs {
    /// Partition counts of the queues measured, one queue each
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub partitions: Vec<usize>,
    /// Runs of each query per queue
    #[arg(long, default_value_t = 50)]
    pub runs: usize,
    /// Data directory of the bench's own PostgreSQL; defaults to bench-pg-scan-cost in the
    /// target directory
    #[arg(long, value_name = "DIR")]
    pub pg_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DedupLayoutsArgs {
    /// Messages per segment (one push's batch)
    #[arg(long, default_value_t = 100, value_parser = at_least_one())]
    pub messages_per_segment: usize,
    /// Concurrent writing connections
    #[arg(long, default_value_t = 4, value_parser = at_least_one())]
    pub connections: usize,
    /// Partitions each connection writes in turn
    #[arg(long, default_value_t = 8, value_parser = at_least_one())]
    pub partitions_per_connection: usize,
    /// Measured time of each cell
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub cell: Duration,
    /// Rounds of every layout, in reverse order every other round
    #[arg(long, default_value_t = 2, value_parser = at_least_one())]
    pub rounds: usize,
    /// Data directory of the bench's own PostgreSQL; defaults to bench-pg-dedup-layouts in the
    /// target directory
    #[arg(long, value_name = "DIR")]
    pub pg_dir: Option<PathBuf>,
}

/// The shape of the load, shared by every scenario.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Measured time of each timed scenario
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Time at the start of each timed phase that is run but not measured
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Concurrent producer connections
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Partitions the push, consume and fan-out scenarios spread their messages over
    #[arg(long, default_value_t = 32)]
    pub partitions: usize,
    /// Concurrent consumers of each consumer group
    #[arg(long, default_value_t = 2)]
    pub consumers: usize,
    /// `batch` of every consumer pop
    #[arg(long, default_value_t = 100)]
    pub pop_batch: usize,
    /// `partitions` of every queue-wide consumer pop (partitions one pop may claim)
    #[arg(long, default_value_t = 10)]
    pub pop_partitions: usize,
    /// Consumers ask for framed pop answers (QPF1, the official clients' `framed_pop=True`)
    /// instead of JSON; a broker that cannot frame answers JSON
    #[arg(long)]
    pub framed_pops: bool,
    /// Producers push binary bodies (QPB1 frames groups, the official clients' `binary_push=True`
    /// with `push_compression=True`) instead of JSON
    #[arg(long)]
    pub binary_pushes: bool,
    /// Messages pushed before the consume scenario pops them
    #[arg(long, default_value_t = 100_000)]
    pub prefill: u64,
    /// Messages per push request of that backlog, so per segment (concurrent requests to one
    /// partition may be fused into one larger segment)
    #[arg(long, default_value_t = 100)]
    pub prefill_batch: usize,
    /// Single-message pushes per second in e2e-latency
    #[arg(long, default_value_t = 50)]
    pub latency_rate: u32,
    /// Offered push rate (msgs/s) of the first step of the sustain scenarios; it doubles until a
    /// step is not kept up with
    #[arg(long, default_value_t = 500)]
    pub sustain_start: u32,
    /// Measured time of each rate step of the sustain scenarios
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub sustain_step: Duration,
    /// Bisection steps of the sustain scenarios between the last rate kept up with and the first
    /// that was not
    #[arg(long, default_value_t = 3)]
    pub sustain_bisect: usize,
    /// Longest search of a sustain scenario, its warm-up and catching up included
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub sustain_budget: Duration,
}

/// A count that must be 1 or more: a 0 is refused rather than run as something else.
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..)
}

/// `15s`, `500ms`, `2m` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration like 15s, 500ms or 2m"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" | "min" => value * 60.0,
        _ => return Err(format!("unknown unit {unit:?} in {text:?}; use ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3h").is_err());
    }

    #[test]
    fn dedup_layouts_refuses_zero_counts() {
        use clap::Parser;
        for flag in ["--messages-per-segment", "--connections", "--partitions-per-connection", "--rounds"] {
            let parsed = Cli::try_parse_from(["queen-bench", "dedup-layouts", flag, "0"]);
            assert!(parsed.is_err(), "{flag} 0 was accepted");
            assert!(Cli::try_parse_from(["queen-bench", "dedup-layouts", flag, "1"]).is_ok(), "{flag} 1 was refused");
        }
    }
}
