//! `queenctl queues`: list, show, configure and delete queues.

use std::time::Duration;

use clap::{Args, Subcommand};
use queen_client::{ListQuery, QueueConfig, QueueOptions};
use serde_json::{Value, json};

use crate::context::{Ctx, confirm};
use crate::error::{Failure, Result};
use crate::output::{self, Fields, Table};

pub const AFTER_HELP: &str = "\
Examples:
  queenctl queues list
  queenctl queues show orders
  queenctl queues configure orders --lease-time 60 --retry-limit 5
  queenctl queues delete orders --yes";

#[derive(Debug, Subcommand)]
pub enum QueuesCommand {
    /// Queues with their size, filtered by namespace or task
    #[command(
        after_help = "Examples:\n  queenctl queues list\n  queenctl queues list --namespace shop --task billing\n  \
        queenctl queues list --limit 1000 -o json | jq -r '.queues[].name'"
    )]
    List {
        /// Of this namespace
        #[arg(long)]
        namespace: Option<String>,

        /// Of this task
        #[arg(long)]
        task: Option<String>,

        /// At most this many
        #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,

        /// Skipping this many
        #[arg(long, value_name = "N", default_value_t = 0)]
        offset: u64,
    },
    /// A queue: its options, size, partitions and the consumer groups reading it
    #[command(
        after_help = "Examples:\n  queenctl queues show orders\n  queenctl queues show orders -o json | jq .queue.messages"
    )]
    Show {
        /// The queue
        queue: String,
    },
    /// Create a queue, or change its options (those not given keep their value)
    Configure(Box<ConfigureArgs>),
    /// Delete a queue with all its partitions, messages, cursors and dead letters
    #[command(after_help = "Examples:\n  queenctl queues delete orders\n  queenctl queues delete orders --yes\n\n\
        Asks for confirmation on a terminal; elsewhere --yes is required. A push to the name later\n\
        starts a fresh queue.")]
    Delete {
        /// The queue
        queue: String,

        /// Do not ask for confirmation
        #[arg(long, short)]
        yes: bool,
    },
}

const CONFIGURE_AFTER_HELP: &str = "\
Examples:
  queenctl queues configure orders
  queenctl queues configure orders --lease-time 60 --retry-limit 5 --dead-letter-queue true
  queenctl queues configure orders --namespace shop --task billing --priority 10
  queenctl queues configure orders --set maxSize=100000 --set retentionEnabled=true

Prints every option with its effective value. --set passes any option by its wire name; the
value is read as JSON when it is JSON, as text otherwise. The broker refuses an option it does
not act on, and changes nothing.";

#[derive(Debug, Args)]
#[command(after_help = CONFIGURE_AFTER_HELP)]
pub struct ConfigureArgs {
    /// The queue (created when missing)
    pub queue: String,

    /// The queue's namespace (namespace pops serve every queue of one)
    #[arg(long)]
    pub namespace: Option<String>,

    /// The queue's task
    #[arg(long)]
    pub task: Option<String>,

    /// leaseTime: how long a pop's lease lasts, in seconds
    #[arg(long, value_name = "SECONDS")]
    pub lease_time: Option<u64>,

    /// retryLimit: failures after the first delivery before a message is dead-lettered
    #[arg(long, value_name = "N")]
    pub retry_limit: Option<u32>,

    /// retryDelay: how long a failed message waits before it is delivered again, in milliseconds
    #[arg(long, value_name = "MS")]
    pub retry_delay: Option<u64>,

    /// priority: namespace and task pops serve queues of higher priority first
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub priority: Option<i32>,

    /// delayedProcessing: a message is delivered only this long after its push, in seconds
    #[arg(long, value_name = "SECONDS")]
    pub delayed_processing: Option<u64>,

    /// windowBuffer: a partition is served once its last push is this old, in seconds
    #[arg(long, value_name = "SECONDS")]
    pub window_buffer: Option<u64>,

    /// maxSize: pushes past this many unconsumed messages are refused (0: no limit)
    #[arg(long, value_name = "N")]
    pub max_size: Option<u64>,

    /// ttl: how long a message may wait to be consumed, in seconds
    #[arg(long, value_name = "SECONDS")]
    pub ttl: Option<u64>,

    /// deadLetterQueue: keep exhausted messages as dead letters
    #[arg(long, value_name = "BOOL")]
    pub dead_letter_queue: Option<bool>,

    /// dlqAfterMaxRetries: dead-letter messages past retryLimit (rather than drop them)
    #[arg(long, value_name = "BOOL")]
    pub dlq_after_max_retries: Option<bool>,

    /// retentionEnabled: let maintenance delete old data
    #[arg(long, value_name = "BOOL")]
    pub retention_enabled: Option<bool>,

    /// retentionSeconds: with retention, data older than this goes, read or not
    #[arg(long, value_name = "SECONDS")]
    pub retention_seconds: Option<u64>,

    /// completedRetentionSeconds: with retention, data every group has read goes at this age
    #[arg(long, value_name = "SECONDS")]
    pub completed_retention_seconds: Option<u64>,

    /// encryptionEnabled: encrypt the queue's data at rest (the brokers need the key)
    #[arg(long, value_name = "BOOL")]
    pub encryption_enabled: Option<bool>,

    /// dedupWindowSeconds: how long a transaction id deduplicates
    #[arg(long, value_name = "SECONDS")]
    pub dedup_window_seconds: Option<u64>,

    /// Any option by its wire name: KEY=VALUE, the value JSON or text (repeatable)
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_setting)]
    pub settings: Vec<(String, Value)>,
}

/// `key=value`, the value read as JSON when it is JSON (`10`, `true`, `"text"`), else as text.
fn parse_setting(text: &str) -> std::result::Result<(String, Value), String> {
    let (key, value) = text.split_once('=').ok_or_else(|| format!("{text:?} is not KEY=VALUE"))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("{text:?} names no option"));
    }
    let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
    Ok((key.to_owned(), value))
}

pub async fn run(ctx: &Ctx, command: QueuesCommand) -> Result {
    match command {
        QueuesCommand::List { namespace, task, limit, offset } => list(ctx, namespace, task, limit, offset).await,
        QueuesCommand::Show { queue } => show(ctx, &queue).await,
        QueuesCommand::Configure(args) => configure(ctx, *args).await,
        QueuesCommand::Delete { queue, yes } => delete(ctx, &queue, yes).await,
    }
}

async fn list(ctx: &Ctx, namespace: Option<String>, task: Option<String>, limit: u32, offset: u64) -> Result {
    let mut query = ListQuery::new().limit(limit).offset(offset);
    if let Some(namespace) = namespace {
        query = query.namespace(namespace);
    }
    if let Some(task) = task {
        query = query.task(task);
    }
    let page = ctx.client.list_queues(&query).await?;
    if ctx.json() {
        return output::json(&page);
    }
    let mut table =
        Table::new(&["QUEUE", "NAMESPACE", "TASK", "PARTITIONS", "PUSHED", "STORED", "LAST PUSH", "CREATED"]);
    for q in &page.queues {
        table.row(vec![
            q.name.clone(),
            output::maybe(q.namespace.as_deref()),
            output::maybe(q.task.as_deref()),
            q.partitions.to_string(),
            q.messages.pushed.to_string(),
            q.messages.stored.to_string(),
            output::maybe_time(q.last_push_at.as_ref()),
            output::maybe_time(q.created_at.as_ref()),
        ]);
    }
    table.print_or("no queues")?;
    // The broker does not count the queues: a full page may have more after it.
    if page.queues.len() >= limit as usize {
        let next = offset + page.queues.len() as u64;
        output::note(&format!(
            "{} queues shown from offset {offset}; there may be more: --offset {next}",
            page.queues.len()
        ));
    }
    Ok(())
}

async fn show(ctx: &Ctx, queue: &str) -> Result {
    let info = ctx.client.queue(queue).await?;
    let status = ctx.client.queue_status(queue).await?;
    if ctx.json() {
        return output::json(&json!({
            "queue": info,
            "partitions": status.partitions,
            "consumerGroups": status.queue.consumer_groups,
        }));
    }
    let mut fields = Fields::new();
    fields
        .add("queue", info.name.clone())
        .add("namespace", output::maybe(info.namespace.as_deref()))
        .add("task", output::maybe(info.task.as_deref()))
        .add("partitions", info.partitions.to_string())
        .add("messages", info.messages.to_string())
        .add("pushed", status.queue.messages.pushed.to_string())
        .add("last push", output::maybe_time(status.queue.last_push_at.as_ref()));
    output::print(&fields.render())?;
    output::line("")?;
    output::print(&options_fields(&info.options).render())?;

    let mut groups = Table::new(&["GROUP", "PARTITIONS", "LAG", "OLDEST UNREAD", "LEASES"]);
    for g in &status.queue.consumer_groups {
        groups.row(vec![
            g.name.clone(),
            g.partitions.to_string(),
            g.lag_messages.to_string(),
            output::age(g.lag_seconds),
            g.active_leases.to_string(),
        ]);
    }
    if !groups.is_empty() {
        output::line("")?;
        output::print(&groups.render())?;
    }
    let mut partitions = Table::new(&["PARTITION", "PARTITION ID", "LAST OFFSET", "STORED", "LAST PUSH"]);
    for p in &status.partitions {
        partitions.row(vec![
            p.name.clone(),
            p.id.clone(),
            p.last_offset.to_string(),
            p.messages_stored.to_string(),
            output::maybe_time(p.last_push_at.as_ref()),
        ]);
    }
    if !partitions.is_empty() {
        output::line("")?;
        output::print(&partitions.render())?;
    }
    // The broker lists a queue's first partitions only (`/status/queues/{queue}`).
    let listed = status.partitions.len() as u64;
    if listed < info.partitions as u64 {
        output::line(&format!("(the first {listed} of {} partitions)", info.partitions))?;
    }
    Ok(())
}

/// Every option with its wire name and effective value.
fn options_fields(options: &QueueOptions) -> Fields {
    let mut fields = Fields::new();
    if let Ok(Value::Object(members)) = serde_json::to_value(options) {
        for (name, value) in members {
            let text = match value {
                Value::String(text) => text,
                other => other.to_string(),
            };
            fields.add(&name, text);
        }
    }
    fields
}

/// `config` with one more option, when it was given.
fn apply<T>(config: QueueConfig, value: Option<T>, set: fn(QueueConfig, T) -> QueueConfig) -> QueueConfig {
    match value {
        Some(value) => set(config, value),
        None => config,
    }
}

async fn configure(ctx: &Ctx, args: ConfigureArgs) -> Result {
    let mut config = QueueConfig::new(args.queue.clone());
    if let Some(namespace) = args.namespace {
        config = config.namespace(namespace);
    }
    if let Some(task) = args.task {
        config = config.task(task);
    }
    let seconds = |value: Option<u64>| value.map(Duration::from_secs);
    config = apply(config, seconds(args.lease_time), QueueConfig::lease_time);
    config = apply(config, args.retry_limit, QueueConfig::retry_limit);
    config = apply(config, args.retry_delay.map(Duration::from_millis), QueueConfig::retry_delay);
    config = apply(config, args.priority, QueueConfig::priority);
    config = apply(config, seconds(args.delayed_processing), QueueConfig::delayed_processing);
    config = apply(config, seconds(args.window_buffer), QueueConfig::window_buffer);
    config = apply(config, args.max_size, QueueConfig::max_size);
    config = apply(config, seconds(args.ttl), QueueConfig::ttl);
    config = apply(config, args.dead_letter_queue, QueueConfig::dead_letter_queue);
    config = apply(config, args.dlq_after_max_retries, QueueConfig::dlq_after_max_retries);
    config = apply(config, args.retention_enabled, QueueConfig::retention_enabled);
    config = apply(config, seconds(args.retention_seconds), QueueConfig::retention);
    config = apply(config, seconds(args.completed_retention_seconds), QueueConfig::completed_retention);
    config = apply(config, args.encryption_enabled, QueueConfig::encryption_enabled);
    config = apply(config, seconds(args.dedup_window_seconds), QueueConfig::dedup_window);
    for (key, value) in args.settings {
        config = config.option(key, value);
    }
    let configured = ctx.client.configure(&config).await?;
    if ctx.json() {
        return output::json(&configured);
    }
    let mut fields = Fields::new();
    fields
        .add("queue", configured.queue.clone())
        .add("namespace", output::maybe(configured.namespace.as_deref()))
        .add("task", output::maybe(configured.task.as_deref()));
    output::print(&fields.render())?;
    output::line("")?;
    output::print(&options_fields(&configured.options).render())
}

async fn delete(ctx: &Ctx, queue: &str, yes: bool) -> Result {
    confirm(yes, &format!("delete queue {queue} with all its messages, cursors and dead letters"))?;
    let deleted = ctx.client.delete_queue(queue).await?;
    if !deleted.existed {
        return Err(Failure::not_found(format!("queue {queue:?} not found")));
    }
    if ctx.json() {
        return output::json(&deleted);
    }
    output::line(&format!("deleted queue {}", deleted.queue))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_json_when_they_can_be() {
        assert_eq!(parse_setting("maxSize=10").unwrap(), ("maxSize".into(), json!(10)));
        assert_eq!(parse_setting("flag=true").unwrap(), ("flag".into(), json!(true)));
        assert_eq!(parse_setting("name=kept as is").unwrap(), ("name".into(), json!("kept as is")));
        assert_eq!(parse_setting("quoted=\"1\"").unwrap(), ("quoted".into(), json!("1")));
        assert!(parse_setting("novalue").is_err());
        assert!(parse_setting("=1").is_err());
    }
}
