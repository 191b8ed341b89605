//! `queenctl pop`: take messages once, with what `queenctl ack` needs.

use std::time::Duration;

use clap::Args;
use queen_client::{Message, Pop};

use crate::context::Ctx;
use crate::error::Result;
use crate::output::{self, Table};

const AFTER_HELP: &str = "\
Examples:
  queenctl pop orders
  queenctl pop orders --group billing --batch 10 --wait 5
  queenctl pop orders --partition customer-7 --auto-ack
  queenctl pop orders --batch 100 --partitions 4

Popped messages are leased to you for the queue's leaseTime: acknowledge each with
`queenctl ack PARTITION_ID TRANSACTION_ID --lease LEASE_ID [--group G]`, or they are delivered
again when the lease runs out (which counts as a failed delivery). With --auto-ack they are
committed as they are delivered, and nothing needs acknowledging.";

#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct PopArgs {
    /// The queue
    pub queue: String,

    /// Pop from this partition only [default: any]
    #[arg(long, short)]
    pub partition: Option<String>,

    /// Pop as this consumer group [default: queue mode, the group of consumers that name none]
    #[arg(long, short)]
    pub group: Option<String>,

    /// At most this many messages, over every partition taken
    #[arg(long, short, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,

    /// Take messages from up to this many partitions, under one lease
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub partitions: u32,

    /// Wait up to this long for a message when none is there [default: answer at once]
    #[arg(long, short, value_name = "SECONDS")]
    pub wait: Option<u64>,

    /// Commit the messages as they are delivered: no lease, nothing to acknowledge
    #[arg(long)]
    pub auto_ack: bool,

    /// Lease the messages for this long instead of the queue's leaseTime
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(1..))]
    pub lease_seconds: Option<u32>,
}

pub async fn run(ctx: &Ctx, args: PopArgs) -> Result {
    let mut pop = match &args.partition {
        Some(partition) => Pop::partition(args.queue.clone(), partition.clone()),
        None => Pop::queue(args.queue.clone()),
    }
    .batch(args.batch)
    .partitions(args.partitions)
    .auto_ack(args.auto_ack);
    if let Some(group) = &args.group {
        pop = pop.group(group.clone());
    }
    if let Some(seconds) = args.wait {
        pop = pop.wait(Duration::from_secs(seconds));
    }
    if let Some(seconds) = args.lease_seconds {
        pop = pop.lease_seconds(seconds);
    }
    let delivery = ctx.client.pop(&pop).await?;
    if ctx.json() {
        return output::json(&delivery);
    }
    if delivery.paused {
        output::note("pops are paused fleet-wide (pop maintenance is on): nothing was delivered");
        return Ok(());
    }
    if delivery.is_empty() {
        output::note("no messages");
        return Ok(());
    }
    output::print(&message_table(&delivery.messages).render())?;
    if !args.auto_ack {
        let group = args.group.as_ref().map(|g| format!(" --group {g}")).unwrap_or_default();
        output::note(&format!(
            "leased until acknowledged: queenctl ack PARTITION_ID TRANSACTION_ID --lease LEASE_ID{group}"
        ));
    }
    Ok(())
}

/// Delivered messages, one per row, with what an acknowledgement names first.
pub fn message_table(messages: &[Message]) -> Table {
    let mut table = Table::new(&[
        "PARTITION ID",
        "TRANSACTION ID",
        "LEASE ID",
        "PARTITION",
        "OFFSET",
        "ATTEMPT",
        "CREATED",
        "DATA",
    ]);
    for m in messages {
        table.row(vec![
            m.partition_id.clone(),
            m.transaction_id.clone(),
            m.lease_id.map_or_else(|| "-".to_owned(), |lease| lease.to_string()),
            m.partition.clone(),
            m.offset.to_string(),
            m.delivery_attempt.to_string(),
            output::time(&m.created_at),
            m.data.get().to_owned(),
        ]);
    }
    table
}
