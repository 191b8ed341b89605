//! `queenctl push`: one message from the command line, or many from an NDJSON file.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use clap::{ArgGroup, Args};
use indicatif::{ProgressBar, ProgressStyle};
use queen_client::{PushItem, PushOutcome, PushStatus};
use serde_json::json;
use serde_json::value::RawValue;

use crate::context::Ctx;
use crate::error::{Failure, Result};
use crate::output::{self, Table};

const AFTER_HELP: &str = "\
Examples:
  queenctl push orders '{\"id\": 1, \"total\": 9.5}'
  queenctl push orders --partition customer-7 --transaction-id order-1 '{\"id\": 1}'
  queenctl push orders --file orders.ndjson --batch-size 1000
  jq -c '.[]' orders.json | queenctl push orders --file -

A file holds one JSON value per line (NDJSON); blank lines are skipped. Every line is checked
before anything is sent: a line that is not JSON is reported with its number, and nothing of the
file is pushed. Pushing the same file again with the same --transaction-id stores nothing twice.";

#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP, group(ArgGroup::new("messages").required(true).args(["payload", "file"])))]
pub struct PushArgs {
    /// The queue (created by its first push)
    pub queue: String,

    /// The message: one JSON value (quote strings: '"text"')
    #[arg(allow_negative_numbers = true)]
    pub payload: Option<String>,

    /// The partition (created by its first push; default "Default")
    #[arg(long, short)]
    pub partition: Option<String>,

    /// The message's transaction id: pushing it again to the partition answers `duplicate` and
    /// stores nothing. With --file, a prefix: line N gets ID:N [default: a new UUIDv7 each]
    #[arg(long, value_name = "ID")]
    pub transaction_id: Option<String>,

    /// Push one message per line of FILE (NDJSON); `-` reads stdin
    #[arg(long, short, value_name = "FILE")]
    pub file: Option<PathBuf>,

    /// Messages per request when pushing a file
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_size: u32,
}

pub async fn run(ctx: &Ctx, args: PushArgs) -> Result {
    match &args.file {
        Some(file) => push_file(ctx, &args, file).await,
        None => push_one(ctx, &args).await,
    }
}

fn item(args: &PushArgs, payload: Box<RawValue>, transaction_id: Option<String>) -> PushItem {
    let mut item = PushItem::raw(args.queue.clone(), payload);
    if let Some(partition) = &args.partition {
        item = item.with_partition(partition.clone());
    }
    if let Some(id) = transaction_id {
        item = item.with_transaction_id(id);
    }
    item
}

async fn push_one(ctx: &Ctx, args: &PushArgs) -> Result {
    let text = args.payload.as_deref().unwrap_or_default();
    let payload = serde_json::from_str::<Box<RawValue>>(text.trim()).map_err(|e| {
        Failure::usage(format!("the payload is not JSON ({e}); a JSON string needs its quotes: '\"{text}\"'"))
    })?;
    let outcome = ctx.client.push_one(item(args, payload, args.transaction_id.clone())).await?;
    if ctx.json() {
        return output::json(&outcome);
    }
    let mut table = Table::new(&["TRANSACTION ID", "STATUS", "MESSAGE ID", "PARTITION ID", "OFFSET"]);
    table.row(outcome_row(&outcome));
    output::print(&table.render())
}

fn outcome_row(o: &PushOutcome) -> Vec<String> {
    vec![
        o.transaction_id.clone(),
        output::word(&o.status),
        o.message_id.to_string(),
        output::maybe(o.partition_id.as_deref()),
        o.offset.map_or_else(|| "-".to_owned(), |offset| offset.to_string()),
    ]
}

/// The JSON values of an NDJSON text with their line numbers (from 1), blank lines skipped; the
/// first bad line's error, with how many others are bad, when any is.
fn parse_lines(text: &[u8]) -> std::result::Result<Vec<(usize, Box<RawValue>)>, String> {
    let mut values = Vec::new();
    let mut first_error = None;
    let mut bad = 0usize;
    for (index, line) in text.split(|byte| *byte == b'\n').enumerate() {
        let number = index + 1;
        let parsed = std::str::from_utf8(line).map_err(|_| "not UTF-8".to_owned()).map(str::trim).and_then(|line| {
            if line.is_empty() {
                Ok(None)
            } else {
                serde_json::from_str::<Box<RawValue>>(line).map(Some).map_err(|e| format!("not one JSON value ({e})"))
            }
        });
        match parsed {
            Ok(Some(value)) => values.push((number, value)),
            Ok(None) => {}
            Err(problem) => {
                bad += 1;
                first_error.get_or_insert(format!("line {number}: {problem}"));
            }
        }
    }
    match first_error {
        None => Ok(values),
        Some(error) if bad == 1 => Err(error),
        Some(error) => {
            let more = bad - 1;
            Err(format!("{error}; {more} more bad line{}", if more == 1 { "" } else { "s" }))
        }
    }
}

async fn push_file(ctx: &Ctx, args: &PushArgs, file: &PathBuf) -> Result {
    let (name, text) = if file.as_os_str() == "-" {
        let mut text = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut text)
            .map_err(|e| Failure::usage(format!("cannot read stdin: {e}")))?;
        ("stdin".to_owned(), text)
    } else {
        let text = std::fs::read(file).map_err(|e| Failure::usage(format!("cannot read {}: {e}", file.display())))?;
        (file.display().to_string(), text)
    };
    let values =
        parse_lines(&text).map_err(|problem| Failure::usage(format!("{name}, {problem}; nothing was pushed")))?;
    let items: Vec<PushItem> = values
        .into_iter()
        .map(|(line, payload)| {
            item(args, payload, args.transaction_id.as_ref().map(|prefix| format!("{prefix}:{line}")))
        })
        .collect();

    let progress = if ctx.json() || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(items.len() as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {human_pos}/{human_len} messages, {percent}%, eta {eta}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar
    };
    let (mut queued, mut duplicates, mut buffered) = (0u64, 0u64, 0u64);
    for batch in items.chunks(args.batch_size as usize) {
        let outcomes = match ctx.client.push(batch).await {
            Ok(outcomes) => outcomes,
            Err(error) => {
                progress.abandon();
                let done = queued + duplicates + buffered;
                let mut failure = Failure::from(error);
                failure.message = format!("{} (after {done} of {} messages were pushed)", failure.message, items.len());
                return Err(failure);
            }
        };
        for outcome in &outcomes {
            match outcome.status {
                PushStatus::Duplicate => duplicates += 1,
                PushStatus::Buffered => buffered += 1,
                _ => queued += 1,
            }
        }
        progress.inc(batch.len() as u64);
    }
    progress.finish_and_clear();

    if ctx.json() {
        return output::json(&json!({
            "queue": args.queue,
            "messages": items.len(),
            "queued": queued,
            "duplicates": duplicates,
            "buffered": buffered,
        }));
    }
    let mut summary =
        format!("pushed {} messages to {}: {queued} queued, {duplicates} duplicates", items.len(), args.queue);
    if buffered > 0 {
        summary.push_str(&format!(", {buffered} buffered (push maintenance is on)"));
    }
    output::line(&summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndjson_lines_are_numbered_and_blank_ones_skipped() {
        let values = parse_lines(b"{\"a\":1}\n\n  \r\n[1, 2]\r\n\"x\"\n").unwrap();
        let lines: Vec<(usize, &str)> = values.iter().map(|(n, v)| (*n, v.get())).collect();
        assert_eq!(lines, vec![(1, "{\"a\":1}"), (4, "[1, 2]"), (5, "\"x\"")]);
        assert!(parse_lines(b"").unwrap().is_empty());
    }

    #[test]
    fn the_first_bad_line_is_named() {
        let error = parse_lines(b"1\n{\"a\":\n2\nnope\n").unwrap_err();
        assert!(error.starts_with("line 2: not one JSON value"), "{error}");
        assert!(error.ends_with("; 1 more bad line"), "{error}");
        assert!(parse_lines(b"1 2\n").unwrap_err().starts_with("line 1:"));
        assert!(parse_lines(b"\xff\n").unwrap_err().contains("not UTF-8"));
    }
}
