//! The command line: global flags and the command tree. Each command's own arguments live in
//! its module under `commands/`.

use clap::{Parser, Subcommand};

use crate::commands::{ack, dlq, groups, maintenance, pop, push, queues, seek, status, tail};
use crate::context::Global;

const AFTER_HELP: &str = "\
Examples:
  queenctl push orders '{\"id\": 1}'
  queenctl push orders --file orders.ndjson
  queenctl pop orders --group billing --batch 10 --wait 5
  queenctl ack 7 order-1 --lease 0192f0c4-... --group billing
  queenctl tail orders
  queenctl groups lagging --min-lag-seconds 600
  QUEEN_URL=http://queen-a:6632,http://queen-b:6632 queenctl status -o json

Exit codes:
  0  success
  1  the broker refused or failed the operation (an HTTP 4xx other than 404, a 5xx, a refused
     acknowledgement, a full queue, a rolled-back transaction)
  2  bad arguments or usage (unknown flag, bad JSON payload or file line, bad time, a destructive
     command without --yes when stdin is not a terminal, or not confirmed)
  3  the broker could not be reached (no answer from any URL, after retries and failover)
  4  not found (unknown queue, consumer group, message or dead letter)

Errors are one line on stderr: `queenctl: error: ...`, with the broker's error code and request
id when it gave them.";

/// Operate a Queen message queue broker: push, pop, acknowledge, follow a queue, move consumer
/// groups, handle dead letters, configure queues, check the fleet.
#[derive(Debug, Parser)]
#[command(name = "queenctl", version, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Push one JSON message, or one per line of a file
    Push(push::PushArgs),
    /// Pop messages (leased until acknowledged, unless --auto-ack)
    Pop(pop::PopArgs),
    /// Acknowledge a popped message
    Ack(ack::AckArgs),
    /// Print messages as they arrive, until Ctrl-C (or --count)
    Tail(tail::TailArgs),
    /// Move a consumer group's cursors on a queue: to the end, or to a time
    Seek(seek::SeekArgs),
    /// Consumer groups: list, show, lagging, delete
    #[command(subcommand, after_help = groups::AFTER_HELP)]
    Groups(groups::GroupsCommand),
    /// Dead letters: list, show, retry, delete
    #[command(subcommand, after_help = dlq::AFTER_HELP)]
    Dlq(dlq::DlqCommand),
    /// Queues: list, show, configure, delete
    #[command(subcommand, after_help = queues::AFTER_HELP)]
    Queues(queues::QueuesCommand),
    /// The broker's status, the data's totals, the maintenance switches and the fleet's brokers
    #[command(after_help = status::AFTER_HELP)]
    Status,
    /// Show or switch maintenance mode: pushes buffered (default), or pops paused (--pop)
    Maintenance(maintenance::MaintenanceArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_command_has_examples() {
        fn check(command: &clap::Command, path: &str) {
            let path = format!("{path} {}", command.get_name());
            if command.get_name() != "help" {
                let help = command.get_after_help().map(|h| h.to_string()).unwrap_or_default();
                assert!(help.contains("Examples:"), "`{path} --help` shows no examples");
            }
            for sub in command.get_subcommands() {
                check(sub, &path);
            }
        }
        check(&Cli::command(), "");
    }
}
