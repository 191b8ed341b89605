//! `queenctl status`: the broker that answers, the data's totals, and the maintenance switches.
//!
//! The fleet's brokers (`/api/v1/status/brokers`) are not shown yet: queen-client has no call
//! for that route, and this command speaks through the client only.

use serde_json::json;

use crate::context::Ctx;
use crate::error::Result;
use crate::json;
use crate::output::{self, Fields};

pub const AFTER_HELP: &str = "\
Examples:
  queenctl status
  queenctl status -o json | jq .maintenance
  queenctl --url http://queen-a:6632,http://queen-b:6632 status";

pub async fn run(ctx: &Ctx) -> Result {
    let status = ctx.client.status().await?;
    let maintenance = ctx.client.maintenance().await?;
    if ctx.json() {
        return output::json(&json!({
            "url": ctx.client.current_url(),
            "status": json::broker_status(&status),
            "maintenance": json::maintenance(&maintenance),
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
    fields.print()
}
