//! `queenctl dlq`: dead letters, the messages consumer groups gave up on.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use queen_client::{DeadLetter, DeadLetterQuery};
use serde_json::json;

use crate::context::{Ctx, confirm};
use crate::error::{Failure, Result};
use crate::output::{self, Fields, Table};
use crate::time;

pub const AFTER_HELP: &str = "\
Examples:
  queenctl dlq list --queue orders
  queenctl dlq show 7 order-1
  queenctl dlq retry 7 order-1
  queenctl dlq delete 7 order-1 --yes";

/// The most dead letters a page holds (the broker's bound).
const PAGE: u32 = 1000;

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Dead letters, newest first, with filters and paging
    List(ListArgs),
    /// A message with its dead letters and every group's progress over it
    #[command(after_help = "Examples:\n  queenctl dlq show 7 order-1\n  queenctl dlq show 7 order-1 -o json\n\n\
        PARTITION_ID and TRANSACTION_ID are what `queenctl dlq list` prints.")]
    Show(MessageArgs),
    /// Push a message's dead letters back into its partition, as one new message
    #[command(after_help = "Examples:\n  queenctl dlq retry 7 order-1\n\n\
        The new message's transaction id is dlq:<dead letter id>; every group reads it again.")]
    Retry(MessageArgs),
    /// Delete a message's dead letters (never the message itself)
    #[command(after_help = "Examples:\n  queenctl dlq delete 7 order-1\n  queenctl dlq delete 7 order-1 --yes\n\n\
        Asks for confirmation on a terminal; elsewhere --yes is required.")]
    Delete {
        #[command(flatten)]
        message: MessageArgs,

        /// Do not ask for confirmation
        #[arg(long, short)]
        yes: bool,
    },
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  queenctl dlq list\n  queenctl dlq list --queue orders --group billing --limit 20\n  \
    queenctl dlq list --queue orders --from 2026-07-29T00:00:00Z --to 2026-07-30T00:00:00Z -o json\n  \
    queenctl dlq list --queue orders --limit 100 --offset 100"
)]
pub struct ListArgs {
    /// Of this queue
    #[arg(long, short)]
    pub queue: Option<String>,

    /// Of this consumer group
    #[arg(long, short)]
    pub group: Option<String>,

    /// Of this partition (by name)
    #[arg(long, short)]
    pub partition: Option<String>,

    /// Dead-lettered at or after this ISO-8601 time
    #[arg(long, value_name = "TIME", value_parser = time::parse)]
    pub from: Option<DateTime<Utc>>,

    /// Dead-lettered at or before this ISO-8601 time
    #[arg(long, value_name = "TIME", value_parser = time::parse)]
    pub to: Option<DateTime<Utc>>,

    /// At most this many
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,

    /// Skipping this many (newest first)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub offset: u64,
}

#[derive(Debug, Args)]
pub struct MessageArgs {
    /// The message's partition id
    pub partition_id: String,

    /// The message's transaction id
    pub transaction_id: String,
}

pub async fn run(ctx: &Ctx, command: DlqCommand) -> Result {
    match command {
        DlqCommand::List(args) => list(ctx, args).await,
        DlqCommand::Show(message) => show(ctx, &message).await,
        DlqCommand::Retry(message) => retry(ctx, &message).await,
        DlqCommand::Delete { message, yes } => delete(ctx, &message, yes).await,
    }
}

async fn list(ctx: &Ctx, args: ListArgs) -> Result {
    let mut query = DeadLetterQuery::new().limit(args.limit).offset(args.offset);
    if let Some(queue) = args.queue {
        query = query.queue(queue);
    }
    if let Some(group) = args.group {
        query = query.consumer_group(group);
    }
    if let Some(partition) = args.partition {
        query = query.partition(partition);
    }
    if let Some(from) = args.from {
        query = query.from(from);
    }
    if let Some(to) = args.to {
        query = query.to(to);
    }
    let page = ctx.client.dead_letters(&query).await?;
    if ctx.json() {
        return output::json(&page);
    }
    let mut table = Table::new(&[
        "FAILED AT",
        "QUEUE",
        "PARTITION",
        "PARTITION ID",
        "TRANSACTION ID",
        "GROUP",
        "RETRIES",
        "ERROR",
        "DATA",
    ]);
    for d in &page.messages {
        table.row(vec![
            output::time(&d.failed_at),
            d.queue.clone(),
            d.partition.clone(),
            d.partition_id.clone(),
            output::maybe(d.transaction_id.as_deref()),
            d.consumer_group.clone(),
            d.retry_count.to_string(),
            output::cut(d.error_message.as_deref().unwrap_or("-"), 40),
            output::cut(&data(d), 60),
        ]);
    }
    table.print_or("no dead letters")?;
    if !page.messages.is_empty() {
        let first = page.offset + 1;
        output::note(&format!(
            "dead letters {first} to {} of {}",
            page.offset + page.messages.len() as i64,
            page.total
        ));
    }
    Ok(())
}

fn data(d: &DeadLetter) -> String {
    d.data.as_ref().map_or_else(|| "(payload not retained)".to_owned(), |data| data.get().to_owned())
}

async fn show(ctx: &Ctx, args: &MessageArgs) -> Result {
    // Retention may have removed the message from the log; its dead letters keep their own copy.
    let message = match ctx.client.message(&args.partition_id, &args.transaction_id).await {
        Ok(message) => Some(message),
        Err(error) if error.status() == Some(queen_client::StatusCode::NOT_FOUND) => None,
        Err(error) => return Err(error.into()),
    };
    // Dead letters are listed by queue and partition name; this message's are picked out (from
    // every dead letter when the message, and with it those names, is gone).
    let mut letters = Vec::new();
    let mut offset = 0u64;
    loop {
        let mut query = DeadLetterQuery::new().limit(PAGE).offset(offset);
        if let Some(message) = &message {
            query = query.queue(message.queue.clone()).partition(message.partition.clone());
        }
        let page = ctx.client.dead_letters(&query).await?;
        let count = page.messages.len() as u64;
        letters.extend(page.messages.into_iter().filter(|d| {
            d.partition_id == args.partition_id && d.transaction_id.as_deref() == Some(&args.transaction_id)
        }));
        offset += count;
        if count == 0 || offset >= page.total.max(0) as u64 {
            break;
        }
    }
    let Some(first) = letters.first() else {
        let what = if message.is_some() { "has no dead letters" } else { "is not stored and has no dead letters" };
        return Err(Failure::not_found(format!(
            "message {:?} of partition {} {what}",
            args.transaction_id, args.partition_id
        )));
    };
    if ctx.json() {
        return output::json(&json!({"message": message, "deadLetters": letters}));
    }
    let mut fields = Fields::new();
    match &message {
        Some(message) => {
            fields
                .add("queue", message.queue.clone())
                .add("partition", format!("{} (id {})", message.partition, message.partition_id))
                .add("transaction id", message.transaction_id.clone())
                .add("message id", message.id.to_string())
                .add("offset", message.offset.to_string())
                .add("created", output::time(&message.created_at))
                .add("producer", output::maybe(message.producer_sub.as_deref()))
                .add("status", message.status.clone())
                .add("data", message.data.get().to_owned());
            for g in &message.consumer_groups {
                let state = if g.consumed { "consumed" } else { "not consumed" };
                let lease = g
                    .lease_expires_at
                    .as_ref()
                    .map(|at| format!(", leased until {}", output::time(at)))
                    .unwrap_or_default();
                fields.add(&format!("group {}", g.name), format!("{state}{lease}"));
            }
        }
        None => {
            fields
                .add("queue", first.queue.clone())
                .add("partition", format!("{} (id {})", first.partition, first.partition_id))
                .add("transaction id", args.transaction_id.clone())
                .add("message id", first.id.map_or_else(|| "-".to_owned(), |id| id.to_string()))
                .add("offset", first.offset.to_string())
                .add("status", "removed from the log by retention; the dead letter keeps its copy".to_owned())
                .add("data", data(first));
        }
    }
    output::print(&fields.render())?;
    output::line("")?;
    let mut table = Table::new(&["DEAD LETTER", "GROUP", "FAILED AT", "RETRIES", "ERROR"]);
    for d in &letters {
        table.row(vec![
            d.dead_letter_id.to_string(),
            d.consumer_group.clone(),
            output::time(&d.failed_at),
            d.retry_count.to_string(),
            output::maybe(d.error_message.as_deref()),
        ]);
    }
    output::print(&table.render())
}

async fn retry(ctx: &Ctx, args: &MessageArgs) -> Result {
    let requeued = ctx.client.retry_dead_letter(&args.partition_id, &args.transaction_id).await?;
    if ctx.json() {
        return output::json(&requeued);
    }
    let what = if requeued.result == "duplicate" { "was already pushed again" } else { "pushed again" };
    output::line(&format!(
        "{what} to {} (partition id {}) as {} at offset {}, message id {}; {} dead letter{} removed",
        requeued.queue,
        requeued.partition_id,
        requeued.transaction_id,
        requeued.offset,
        requeued.message_id,
        requeued.dead_letters,
        if requeued.dead_letters == 1 { "" } else { "s" }
    ))
}

async fn delete(ctx: &Ctx, args: &MessageArgs, yes: bool) -> Result {
    confirm(
        yes,
        &format!("delete the dead letters of message {} of partition {}", args.transaction_id, args.partition_id),
    )?;
    let deleted = ctx.client.delete_dead_letters(&args.partition_id, &args.transaction_id).await?;
    if ctx.json() {
        return output::json(&json!({
            "partitionId": args.partition_id,
            "transactionId": args.transaction_id,
            "deletedDeadLetters": deleted,
        }));
    }
    output::line(&format!("deleted {deleted} dead letter{}", if deleted == 1 { "" } else { "s" }))
}
