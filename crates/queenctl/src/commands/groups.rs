//! `queenctl groups`: consumer groups, their lag, and their deletion.

use clap::{Args, Subcommand};
use queen_client::PartitionLag;

use crate::context::{Ctx, confirm};
use crate::error::{Failure, Result};
use crate::output::{self, Fields, Table};

pub const AFTER_HELP: &str = "\
Examples:
  queenctl groups list
  queenctl groups show billing
  queenctl groups lagging --min-lag-seconds 600
  queenctl groups delete billing --queue orders --yes";

#[derive(Debug, Subcommand)]
pub enum GroupsCommand {
    /// Every consumer group with its lag on each queue it reads
    #[command(
        after_help = "Examples:\n  queenctl groups list\n  queenctl groups list -o json | jq '.[] | select(.totalLag > 0)'\n\n\
        `__QUEUE_MODE__` is queue mode: the consumers that name no group."
    )]
    List,
    /// One consumer group: its lag per queue and its cursor on every partition
    #[command(after_help = "Examples:\n  queenctl groups show billing\n  queenctl groups show __QUEUE_MODE__ -o json")]
    Show {
        /// The consumer group
        group: String,
    },
    /// Cursors whose oldest unread message is at least this old
    #[command(after_help = "Examples:\n  queenctl groups lagging\n  queenctl groups lagging --min-lag-seconds 60")]
    Lagging {
        /// The least age of the oldest unread message, in seconds
        #[arg(long, value_name = "N", default_value_t = 3600)]
        min_lag_seconds: u64,
    },
    /// Delete a consumer group's cursors (and its registration): it starts afresh on its next pop
    Delete(DeleteArgs),
}

const DELETE_AFTER_HELP: &str = "\
Examples:
  queenctl groups delete billing
  queenctl groups delete billing --queue orders --yes
  queenctl groups delete billing --keep-metadata --yes

Deletes the group's cursors, on every queue or on --queue only, and so its leases. Its
registration (where it subscribed from) goes too, unless --keep-metadata: then its next pop
starts where it subscribed first, rather than as a new group. Messages are never deleted.
Asks for confirmation on a terminal; elsewhere --yes is required.";

#[derive(Debug, Args)]
#[command(after_help = DELETE_AFTER_HELP)]
pub struct DeleteArgs {
    /// The consumer group
    pub group: String,

    /// On this queue only
    #[arg(long, short)]
    pub queue: Option<String>,

    /// Keep the group's registration (where it subscribed from)
    #[arg(long)]
    pub keep_metadata: bool,

    /// Do not ask for confirmation
    #[arg(long, short)]
    pub yes: bool,
}

pub async fn run(ctx: &Ctx, command: GroupsCommand) -> Result {
    match command {
        GroupsCommand::List => list(ctx).await,
        GroupsCommand::Show { group } => show(ctx, &group).await,
        GroupsCommand::Lagging { min_lag_seconds } => lagging(ctx, min_lag_seconds).await,
        GroupsCommand::Delete(args) => delete(ctx, args).await,
    }
}

async fn list(ctx: &Ctx) -> Result {
    let groups = ctx.client.consumer_groups().await?;
    if ctx.json() {
        return output::json(&groups);
    }
    let mut table =
        Table::new(&["GROUP", "QUEUE", "PARTITIONS", "LAG", "OLDEST UNREAD", "LEASES", "CONSUMED", "LAST CONSUMED"]);
    for group in &groups {
        for q in &group.queues {
            table.row(vec![
                group.name.clone(),
                q.queue.clone(),
                q.partitions.to_string(),
                q.lag_messages.to_string(),
                output::age(q.lag_seconds),
                q.active_leases.to_string(),
                q.total_consumed.to_string(),
                output::maybe_time(q.last_consumed_at.as_ref()),
            ]);
        }
    }
    table.print_or("no consumer groups")
}

async fn show(ctx: &Ctx, group: &str) -> Result {
    let detail = ctx.client.consumer_group(group).await?;
    if ctx.json() {
        return output::json(&detail);
    }
    let summary = &detail.summary;
    let mut fields = Fields::new();
    fields
        .add("group", summary.name.clone())
        .add("unread", format!("{} messages", summary.total_lag))
        .add("oldest unread", output::age(summary.max_lag_seconds));
    for q in &summary.queues {
        let subscribed = match (&q.subscription_mode, &q.subscription_from) {
            (Some(mode), Some(from)) => format!("{mode} from {}", output::time(from)),
            (Some(mode), None) => mode.clone(),
            (None, _) => "-".to_owned(),
        };
        let conflating = if q.conflation { ", conflating (only the newest message of each partition)" } else { "" };
        fields.add(
            &format!("queue {}", q.queue),
            format!(
                "{} unread, oldest {}, {} consumed, subscribed {subscribed}{conflating}",
                q.lag_messages,
                output::age(q.lag_seconds),
                q.total_consumed
            ),
        );
    }
    output::print(&fields.render())?;
    output::line("")?;
    cursor_table(detail.partitions.iter().map(|p| (None, p))).print_or("no cursors")
}

/// Cursors, one per row; with the group's name first when `group` is given.
fn cursor_table<'a>(cursors: impl Iterator<Item = (Option<&'a str>, &'a PartitionLag)>) -> Table {
    let mut cursors = cursors.peekable();
    let with_group = cursors.peek().is_some_and(|(group, _)| group.is_some());
    let mut headers = vec![
        "QUEUE",
        "PARTITION",
        "PARTITION ID",
        "COMMITTED",
        "LAST OFFSET",
        "LAG",
        "OLDEST UNREAD",
        "LEASED UNTIL",
        "RETRIES",
    ];
    if with_group {
        headers.insert(0, "GROUP");
    }
    let mut table = Table::new(&headers);
    for (group, p) in cursors {
        let mut row = vec![
            p.queue.clone(),
            p.partition.clone(),
            p.partition_id.clone(),
            p.committed.to_string(),
            p.last_offset.to_string(),
            p.lag_messages.to_string(),
            output::age(p.lag_seconds),
            if p.lease_active { output::maybe_time(p.lease_expires_at.as_ref()) } else { "-".to_owned() },
            p.retry_count.to_string(),
        ];
        if let Some(group) = group.filter(|_| with_group) {
            row.insert(0, group.to_owned());
        }
        table.row(row);
    }
    table
}

async fn lagging(ctx: &Ctx, min_lag_seconds: u64) -> Result {
    let cursors = ctx.client.lagging_groups(min_lag_seconds).await?;
    if ctx.json() {
        return output::json(&cursors);
    }
    cursor_table(cursors.iter().map(|c| (Some(c.consumer_group.as_str()), &c.partition)))
        .print_or(&format!("no cursor lags {} or more", output::age(min_lag_seconds as f64)))
}

async fn delete(ctx: &Ctx, args: DeleteArgs) -> Result {
    let scope = args.queue.as_ref().map(|q| format!(" on queue {q}")).unwrap_or_default();
    confirm(args.yes, &format!("delete consumer group {}{scope}", args.group))?;
    let deleted = match &args.queue {
        Some(queue) => ctx.client.delete_consumer_group_on_queue(&args.group, queue, !args.keep_metadata).await?,
        None => ctx.client.delete_consumer_group(&args.group, !args.keep_metadata).await?,
    };
    if deleted.deleted_partitions == 0 && !deleted.metadata_deleted {
        let what = if args.keep_metadata { "cursor" } else { "cursor or registration" };
        return Err(Failure::not_found(format!("consumer group {:?} has no {what}{scope}", args.group)));
    }
    if ctx.json() {
        return output::json(&deleted);
    }
    output::line(&format!(
        "deleted consumer group {}{scope}: {} cursor{}{}",
        deleted.consumer_group,
        deleted.deleted_partitions,
        if deleted.deleted_partitions == 1 { "" } else { "s" },
        if deleted.metadata_deleted { " and its registration" } else { "" }
    ))
}
