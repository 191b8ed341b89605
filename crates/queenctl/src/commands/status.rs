//! `queenctl status`: the broker that answers, the data's totals, the maintenance switches, and
//! the fleet's brokers as their heartbeats tell.

use queen_client::{Fleet, FleetBroker};
use serde_json::json;

use crate::context::Ctx;
use crate::error::Result;
use crate::output::{self, Fields, Table};

pub const AFTER_HELP: &str = "\
Examples:
  queenctl status
  queenctl status -o json | jq .maintenance
  queenctl status -o json | jq -r '.fleet.brokers[] | select(.state != \"live\") | .id'
  queenctl --url http://queen-a:6632,http://queen-b:6632 status

The brokers are those heard of in the last hour, from any broker: each one records a heartbeat
in the database. A broker silent for a few heartbeats without having stopped is `missing`.";

pub async fn run(ctx: &Ctx) -> Result {
    let status = ctx.client.status().await?;
    let maintenance = ctx.client.maintenance().await?;
    let fleet = ctx.client.brokers().await?;
    if ctx.json() {
        return output::json(&json!({
            "url": ctx.client.current_url(),
            "status": status,
            "maintenance": maintenance,
            "fleet": fleet,
        }));
    }
    let on_off = |on: bool| if on { "ON" } else { "off" }.to_owned();
    let mut fields = Fields::new();
    fields
        .add("url", ctx.client.current_url())
        .add("broker", format!("{} ({})", status.broker, status.status))
        .add("version", status.version.clone())
        .add("uptime", output::age(status.uptime_seconds))
        .add("queues", status.queues.to_string())
        .add("partitions", status.partitions.to_string())
        .add("messages", format!("{} stored, {} pushed", status.messages.stored, status.messages.pushed))
        .add("consumer groups", status.consumer_groups.to_string())
        .add("active leases", status.active_leases.to_string())
        .add("dead letters", status.dead_letters.to_string())
        .add("push maintenance", on_off(maintenance.maintenance_mode))
        .add("pop maintenance", on_off(maintenance.pop_maintenance_mode))
        .add("buffered pushes", super::maintenance::journal(&maintenance));
    fields.print()?;
    output::line("")?;
    fleet_table(&fleet).print_or("no broker has recorded a heartbeat in the last hour")
}

/// The fleet's brokers, one per row, the earliest started first.
fn fleet_table(fleet: &Fleet) -> Table {
    let mut table = Table::new(&["BROKER", "STATE", "VERSION", "STARTED", "LAST SEEN", "BUFFERED", "THIS ONE"]);
    for b in &fleet.brokers {
        table.row(vec![
            b.id.clone(),
            b.state.to_string(),
            b.version.clone(),
            output::time(&b.started_at),
            output::time(&b.last_seen_at),
            buffered(b),
            if b.is_self { "yes" } else { "-" }.to_owned(),
        ]);
    }
    table
}

/// A broker's journal in a word or two: its pushes, and whether it can be written.
fn buffered(b: &FleetBroker) -> String {
    if b.buffer_healthy { b.buffered_messages.to_string() } else { format!("{} (NOT WRITABLE)", b.buffered_messages) }
}
