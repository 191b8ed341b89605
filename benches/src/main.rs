//! `queen-bench`: load generator and storage-ceiling tool for Queen-compatible brokers.
//!
//! `suite` runs everything side by side on this machine and reports ratios; `run` runs one
//! scenario against a broker you started; `ceiling` measures PostgreSQL alone. Every scenario
//! verifies that every message pushed reached every group exactly once, and the exit code is
//! non-zero when one did not. `announce` and `scan-cost` measure, on a PostgreSQL of their own,
//! what the fleet's announcements and a pop's candidate scan cost as the fleet and the queues grow;
//! `dedup-layouts` what each way of indexing transaction ids costs the push path.

mod announce;
mod broker_process;
mod ceiling;
mod ceiling_raw;
mod cli;
mod dedup_layouts;
mod environment;
mod generator;
mod ledger;
mod own_postgres;
mod procfs;
mod report;
mod rounds;
mod scan_cost;
mod scenarios;
mod stats;
mod suite;
mod workload;

use std::error::Error;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{CeilingArgs, Cli, Command, RunArgs};
use crate::environment::Environment;
use crate::procfs::Watched;
use crate::report::Report;
use crate::scenarios::Harness;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // PostgreSQL's notices (dropping a database that does not exist) are noise here.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tokio_postgres=warn")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let (report, out) = match cli.command {
        Command::Suite(args) => {
            let out = args.out.clone();
            (suite::run(args).await.map_err(Box::<dyn Error>::from), out)
        }
        Command::Run(args) => {
            let out = args.out.clone();
            (run_one(args).await, out)
        }
        Command::Ceiling(args) => {
            let out = args.out.clone();
            (ceiling_only(args).await, out)
        }
        Command::Announce(args) => return print_tables(announce::run(args).await),
        Command::ScanCost(args) => return print_tables(scan_cost::run(args).await),
        Command::DedupLayouts(args) => return print_tables(dedup_layouts::run(args).await),
    };
    match report {
        Ok(report) => finish(&report, &out),
        Err(e) => {
            eprintln!("queen-bench: {e}");
            ExitCode::from(2)
        }
    }
}

/// Prints and writes the report; fails loudly when a message was lost or duplicated or
/// something could not run.
fn finish(report: &Report, out: &Path) -> ExitCode {
    println!("{}", report.markdown());
    if let Err(e) = report.write(out) {
        eprintln!("queen-bench: cannot write the report into {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    eprintln!("queen-bench: report written to {}/report.json and report.md", out.display());
    let problems = report.problems();
    if problems.is_empty() {
        return ExitCode::SUCCESS;
    }
    eprintln!("\n!!!!!!!! queen-bench: THE RUN FAILED !!!!!!!!");
    for problem in &problems {
        eprintln!("!!! {problem}");
    }
    ExitCode::FAILURE
}

/// The measurements without a broker print their markdown tables and write nothing.
fn print_tables<E: std::fmt::Display>(tables: Result<String, E>) -> ExitCode {
    match tables {
        Ok(tables) => {
            println!("{tables}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("queen-bench: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run_one(args: RunArgs) -> Result<Report, Box<dyn Error>> {
    let client = workload::connect(&args.url, args.token.as_deref())?;
    client.ready().await.map_err(|e| format!("the broker at {} is not ready: {e}", args.url))?;
    let environment = Environment::collect(args.url.clone(), suite::load_flags(&args.load));
    let watched = Watched { broker: args.broker_pid, postgres: args.postgres_pid };
    let scenario = Harness::new(client, args.load, watched).run(args.scenario).await;
    Ok(Report::new(environment, vec![scenario], None, None))
}

async fn ceiling_only(args: CeilingArgs) -> Result<Report, Box<dyn Error>> {
    let mut environment = Environment::collect("none (storage ceiling only)".into(), String::new());
    environment.read_postgres(&args.database_url).await?;
    let ceiling = ceiling::run(&args.database_url, args.cell).await?;
    Ok(Report::new(environment, Vec::new(), Some(ceiling), None))
}
