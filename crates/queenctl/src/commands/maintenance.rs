//! `queenctl maintenance`: show or switch the fleet's maintenance modes.

use clap::{Args, ValueEnum};
use queen_client::MaintenanceStatus;

use crate::context::Ctx;
use crate::error::Result;
use crate::output::{self, Fields};

const AFTER_HELP: &str = "\
Examples:
  queenctl maintenance
  queenctl maintenance on
  queenctl maintenance off
  queenctl maintenance on --pop

Push maintenance (the default): pushes are answered `buffered`, kept in each broker's journal, and
stored in order when it is switched off. Pop maintenance (--pop): pops deliver nothing until it
is switched off. Both switches are shared by the whole fleet.";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Action {
    /// Show both switches
    Status,
    /// Switch maintenance on
    On,
    /// Switch maintenance off
    Off,
}

#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct MaintenanceArgs {
    /// What to do
    #[arg(value_enum, default_value_t = Action::Status)]
    pub action: Action,

    /// Pop maintenance rather than push maintenance
    #[arg(long)]
    pub pop: bool,
}

pub async fn run(ctx: &Ctx, args: MaintenanceArgs) -> Result {
    let status = match (args.action, args.pop) {
        (Action::Status, _) => ctx.client.maintenance().await?,
        (Action::On | Action::Off, false) => ctx.client.set_push_maintenance(args.action == Action::On).await?,
        (Action::On | Action::Off, true) => ctx.client.set_pop_maintenance(args.action == Action::On).await?,
    };
    if ctx.json() {
        return output::json(&status);
    }
    let on_off = |on: bool| if on { "ON" } else { "off" }.to_owned();
    let mut fields = Fields::new();
    fields
        .add("push maintenance", on_off(status.maintenance_mode))
        .add("pop maintenance", on_off(status.pop_maintenance_mode))
        .add("buffered pushes", journal(&status));
    fields.print()
}

/// This broker's push journal in a few words.
pub fn journal(status: &MaintenanceStatus) -> String {
    let health = if status.buffer_healthy { "healthy" } else { "NOT WRITABLE" };
    format!("{} (journal {health}, {})", status.buffered_messages, status.buffer_directory)
}
