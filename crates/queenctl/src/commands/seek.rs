//! `queenctl seek`: move a consumer group's cursors on a queue.

use chrono::{DateTime, Utc};
use clap::{ArgGroup, Args};
use queen_client::SeekTarget;

use crate::context::Ctx;
use crate::error::{Failure, Result};
use crate::output::{self, Table};
use crate::time;

const AFTER_HELP: &str = "\
Examples:
  queenctl seek billing orders --to-end
  queenctl seek billing orders --to 2026-07-29T14:00:00Z
  queenctl seek billing orders --to 2026-07-29 --partition-id 7

--to-end skips everything stored now: the group reads only what is pushed next. --to TIME goes
back (or forward) to the first message stored at or after TIME, to read again from there. The
group's leases on the queue are released. A time without an offset is UTC. A group that does
not read the queue yet is refused (a misspelt name would start a new group there, whose cursors
hold the queue's consumed-only retention back); --create starts it at the target instead.";

#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP, group(ArgGroup::new("target").required(true).args(["to_end", "to"])))]
pub struct SeekArgs {
    /// The consumer group
    pub group: String,

    /// The queue
    pub queue: String,

    /// Past the newest message
    #[arg(long)]
    pub to_end: bool,

    /// To the first message stored at or after this ISO-8601 time
    #[arg(long, value_name = "TIME", value_parser = time::parse)]
    pub to: Option<DateTime<Utc>>,

    /// Move the cursor of this partition only (its id, as `queenctl pop` prints it)
    #[arg(long, value_name = "ID")]
    pub partition_id: Option<String>,

    /// Start the group on the queue at the target when it does not read the queue yet
    #[arg(long)]
    pub create: bool,
}

pub async fn run(ctx: &Ctx, args: SeekArgs) -> Result {
    if !args.create {
        reads_the_queue(ctx, &args.group, &args.queue).await?;
    }
    let target = match args.to {
        Some(at) => SeekTarget::Time(at),
        None => SeekTarget::End,
    };
    let seeked = match &args.partition_id {
        Some(id) => ctx.client.seek_partition(&args.group, &args.queue, id, target).await?,
        None => ctx.client.seek(&args.group, &args.queue, target).await?,
    };
    if ctx.json() {
        return output::json(&seeked);
    }
    let to = match args.to {
        Some(at) => output::time(&at),
        None => "the end".to_owned(),
    };
    output::line(&format!(
        "moved {} cursor{} of group {} on {} to {to}",
        seeked.partitions_updated,
        if seeked.partitions_updated == 1 { "" } else { "s" },
        seeked.consumer_group,
        seeked.queue
    ))?;
    let mut table = Table::new(&["PARTITION ID", "PARTITION", "COMMITTED"]);
    for p in &seeked.partitions {
        table.row(vec![p.partition_id.clone(), p.partition.clone(), p.committed.to_string()]);
    }
    if table.is_empty() { Ok(()) } else { output::print(&table.render()) }
}

/// Refuses (not found) a group that has neither a cursor nor a registration on `queue`.
async fn reads_the_queue(ctx: &Ctx, group: &str, queue: &str) -> Result {
    let unknown = || {
        Failure::not_found(format!(
            "consumer group {group} does not read queue {queue}; pass --create to start it there with this seek"
        ))
    };
    match ctx.client.consumer_group(group).await {
        Ok(detail) if detail.summary.queues.iter().any(|q| q.queue == queue) => Ok(()),
        Ok(_) => Err(unknown()),
        Err(error) if error.status() == Some(queen_client::StatusCode::NOT_FOUND) => Err(unknown()),
        Err(error) => Err(error.into()),
    }
}
