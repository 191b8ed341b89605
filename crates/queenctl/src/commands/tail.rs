//! `queenctl tail`: print a queue's messages as they arrive.

use std::time::Duration;

use clap::Args;
use queen_client::{AckStatus, AckVerdict, Delivery, Message, Pop, SubscriptionFrom, SubscriptionMode, uuid::Uuid};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::context::Ctx;
use crate::error::{Failure, Result};
use crate::output;
use crate::time::{self, Start};

const AFTER_HELP: &str = "\
Examples:
  queenctl tail orders
  queenctl tail orders --from all --count 10
  queenctl tail orders --from 2026-07-29T14:00:00Z -o json | jq .data
  queenctl tail orders --group audit

Without --group, tail disturbs no one: it reads as a consumer group of its own
(queenctl-tail-<random>), starting with the messages pushed from now on (--from all: the whole
backlog; --from TIME: from that time), committing what it prints as it goes. Other groups,
queue mode included, still get every message. That group's cursors and registration are deleted
when tail ends, by --count, by Ctrl-C or by SIGTERM, which takes a token with the admin role on
the queue (tail refuses to start without one).

With --group G, tail consumes as G: what it prints is acknowledged for G, and G's other
consumers do not get it. --from then matters only if this is G's first read of the queue.

Ctrl-C stops it (exit 0); a long poll in flight is let finish first (up to 2 seconds), and what
it brings is given back to a named group undelivered. A second Ctrl-C quits at once.";

/// How long each poll waits for messages. Short, because stopping waits for the poll in flight: a
/// broker notices a plain-HTTP client that went away, but over HTTPS (or behind a proxy that keeps
/// its connection) a parked poll stays until its timeout and could still be handed messages.
const POLL: Duration = Duration::from_secs(2);

/// The most messages one poll takes.
const MAX_BATCH: u64 = 100;

#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct TailArgs {
    /// The queue
    pub queue: String,

    /// Consume as this consumer group, acknowledging what is printed [default: a throwaway group]
    #[arg(long, short)]
    pub group: Option<String>,

    /// Follow this partition only [default: every partition]
    #[arg(long, short)]
    pub partition: Option<String>,

    /// Where a new group starts: `all`, `new`, or an ISO-8601 time [default: new for the
    /// throwaway group]
    #[arg(long, value_name = "all|new|TIME", value_parser = time::parse_start)]
    pub from: Option<Start>,

    /// Stop after this many messages
    #[arg(long, short = 'n', value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
}

pub async fn run(ctx: &Ctx, args: TailArgs) -> Result {
    let signals = watch_signals().map_err(|e| Failure::failed(format!("cannot watch for Ctrl-C: {e}")))?;
    let (group, throwaway) = match &args.group {
        Some(group) => (group.clone(), false),
        None => (format!("queenctl-tail-{}", &Uuid::new_v4().simple().to_string()[..12]), true),
    };
    if throwaway {
        may_remove(ctx, &args.queue, &group).await?;
    }
    let result = follow(ctx, &args, &group, throwaway, signals).await;
    if throwaway && let Err(error) = ctx.client.delete_consumer_group_on_queue(&group, &args.queue, true).await {
        output::note(&format!(
            "queenctl: warning: could not delete the throwaway consumer group {group}: {}; \
                 delete it with `queenctl groups delete {group} --yes`",
            Failure::from(error).message
        ));
    }
    result
}

/// Removing the throwaway group when tail ends takes the admin role on the queue, which a token
/// that may pop need not have: tried first (there is nothing to remove yet), so that tail never
/// leaves behind a group it cannot remove, which would hold the queue's retention back and count
/// against its groups for ever.
async fn may_remove(ctx: &Ctx, queue: &str, group: &str) -> Result {
    match ctx.client.delete_consumer_group_on_queue(group, queue, true).await {
        Err(error) if matches!(error.status().map(|s| s.as_u16()), Some(401 | 403)) => Err(Failure::usage(format!(
            "tail without --group reads as a throwaway consumer group, which only a token with the admin \
             role on {queue} can remove afterwards; pass --group G to read as a group of your own ({})",
            Failure::from(error).message
        ))),
        Err(error) => Err(error.into()),
        Ok(_) => Ok(()),
    }
}

/// Counts SIGINTs, SIGTERMs and SIGHUPs, from now on. A hang-up (the terminal or the ssh session
/// closing) would otherwise end the process before it removed its throwaway group.
fn watch_signals() -> std::io::Result<watch::Receiver<u32>> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let (count, signals) = watch::channel(0u32);
    tokio::spawn(async move {
        loop {
            let received = tokio::select! {
                received = interrupt.recv() => received,
                received = terminate.recv() => received,
                received = hangup.recv() => received,
            };
            if received.is_none() {
                break;
            }
            count.send_modify(|n| *n += 1);
        }
    });
    Ok(signals)
}

async fn follow(ctx: &Ctx, args: &TailArgs, group: &str, throwaway: bool, mut signals: watch::Receiver<u32>) -> Result {
    let mut base = match &args.partition {
        Some(partition) => Pop::partition(args.queue.clone(), partition.clone()),
        None => Pop::queue(args.queue.clone()),
    }
    .group(group)
    // The throwaway group is nobody's: committing at delivery is all the acknowledging it needs.
    .auto_ack(throwaway);
    base = match args.from.or(throwaway.then_some(Start::New)) {
        Some(Start::All) => base.subscription_mode(SubscriptionMode::All),
        Some(Start::New) => base.subscription_mode(SubscriptionMode::New),
        Some(Start::At(at)) => base.subscription_from(SubscriptionFrom::Time(at)),
        None => base,
    };

    let mut printed = 0u64;
    let mut first = true;
    let mut paused = false;
    loop {
        if *signals.borrow_and_update() > 0 {
            return Ok(());
        }
        let batch = args.count.map_or(MAX_BATCH, |count| (count - printed).min(MAX_BATCH));
        let pop = base.clone().batch(batch as u32);
        // The first poll answers at once, registering the group: from then on nothing pushed is
        // missed, and the note below says so.
        let pop = if first { pop.no_wait() } else { pop.wait(POLL) };
        let polled = ctx.client.pop(&pop);
        tokio::pin!(polled);
        let delivery = tokio::select! {
            delivery = &mut polled => delivery?,
            _ = signals.changed() => {
                output::note("stopping (Ctrl-C again to quit at once)");
                tokio::select! {
                    delivery = &mut polled => {
                        if let Ok(delivery) = delivery {
                            give_back(ctx, &delivery, throwaway).await;
                        }
                    }
                    _ = signals.wait_for(|count| *count > 1) => {}
                }
                return Ok(());
            }
        };
        if first {
            first = false;
            let whose = if throwaway { "a throwaway consumer group" } else { "consumer group" };
            output::note(&format!("following {} as {whose} {group}; Ctrl-C to stop", args.queue));
        }
        if delivery.paused {
            if !paused {
                output::note("pops are paused fleet-wide (pop maintenance is on); waiting");
            }
            paused = true;
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                _ = signals.changed() => return Ok(()),
            }
            continue;
        }
        paused = false;
        for (index, message) in delivery.messages.iter().enumerate() {
            if let Err(failure) = print(ctx, message) {
                // The reader went away (`tail ... | head`): what it was shown is acknowledged, and
                // the rest given back now rather than left leased until the lease runs out, which
                // would count a failed delivery against each.
                if !throwaway {
                    let (shown, rest) = delivery.messages.split_at(index);
                    let _ = ctx.client.ack_messages(shown, AckStatus::Completed).await;
                    let _ = ctx.client.ack_messages(rest, AckStatus::Retry).await;
                }
                return Err(failure);
            }
        }
        if !throwaway && !delivery.is_empty() {
            let verdicts = ctx.client.ack_messages(&delivery.messages, AckStatus::Completed).await?;
            if let Some(AckVerdict::Refused(reason)) =
                verdicts.iter().map(|v| v.verdict()).find(|v| matches!(v, AckVerdict::Refused(_)))
            {
                return Err(Failure::failed(format!("the acknowledgement of a printed message was refused: {reason}")));
            }
        }
        printed += delivery.len() as u64;
        if args.count.is_some_and(|count| printed >= count) {
            return Ok(());
        }
    }
}

/// Messages that arrived after Ctrl-C are not printed; a named group gets them back, without
/// counting a failed delivery against them.
async fn give_back(ctx: &Ctx, delivery: &Delivery, throwaway: bool) {
    if throwaway || delivery.is_empty() {
        return;
    }
    if let Err(error) = ctx.client.ack_messages(&delivery.messages, AckStatus::Retry).await {
        output::note(&format!(
            "queenctl: warning: {} messages popped while stopping could not be given back: {}; they are \
             delivered again when their lease expires",
            delivery.len(),
            Failure::from(error).message
        ));
    }
}

fn print(ctx: &Ctx, message: &Message) -> Result {
    if ctx.json() {
        return output::json_line(message);
    }
    output::line(&format!(
        "{}  {}/{}  {}  {}",
        output::time(&message.created_at),
        message.partition,
        message.offset,
        message.transaction_id,
        message.data.get()
    ))
}
