//! Broker-wide switches (`queen.system_state`): push maintenance and pop maintenance.
//!
//! A change locks both rows, takes the next revision and publishes the new state to the fleet
//! in the same transaction, so notices arrive in the order the changes committed and each
//! carries the whole state as it stood at its commit.

use deadpool_postgres::GenericClient;
use serde_json::json;

use crate::StoreError;
use crate::events::{self, Event};

/// One switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Pushes are accepted into each broker's local journal instead of the log.
    PushMaintenance,
    /// Pops answer at once, empty and marked paused.
    PopMaintenance,
}

impl Mode {
    fn key(self) -> &'static str {
        match self {
            Mode::PushMaintenance => "push_maintenance",
            Mode::PopMaintenance => "pop_maintenance",
        }
    }
}

/// Both switches, and the revision of the latest change (0 before any).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Modes {
    pub revision: i64,
    pub push_maintenance: bool,
    pub pop_maintenance: bool,
}

impl Modes {
    fn set(&mut self, mode: Mode, enabled: bool) {
        match mode {
            Mode::PushMaintenance => self.push_maintenance = enabled,
            Mode::PopMaintenance => self.pop_maintenance = enabled,
        }
    }

    fn from_rows(rows: &[tokio_postgres::Row]) -> Self {
        let mut modes = Modes::default();
        for row in rows {
            let key: &str = row.get(0);
            let value: serde_json::Value = row.get(1);
            let mode = match key {
                "push_maintenance" => Mode::PushMaintenance,
                "pop_maintenance" => Mode::PopMaintenance,
                _ => continue,
            };
            modes.set(mode, value["enabled"].as_bool().unwrap_or(false));
            modes.revision = modes.revision.max(value["revision"].as_i64().unwrap_or(0));
        }
        modes
    }
}

const KEYS: [&str; 2] = ["pop_maintenance", "push_maintenance"];

/// Both switches as committed.
pub async fn read(client: &impl GenericClient) -> Result<Modes, StoreError> {
    let rows = client.query("SELECT key, value FROM queen.system_state WHERE key = ANY($1)", &[&&KEYS[..]]).await?;
    Ok(Modes::from_rows(&rows))
}

/// Turns one switch on or off and tells the fleet; the state as committed.
pub async fn set(client: &mut deadpool_postgres::Client, mode: Mode, enabled: bool) -> Result<Modes, StoreError> {
    let tx = client.transaction().await?;
    // Both rows, in key order: concurrent changes take turns, so revisions follow commit order.
    let rows = tx
        .query("SELECT key, value FROM queen.system_state WHERE key = ANY($1) ORDER BY key FOR UPDATE", &[&&KEYS[..]])
        .await?;
    let mut modes = Modes::from_rows(&rows);
    modes.revision += 1;
    modes.set(mode, enabled);
    let value = json!({"enabled": enabled, "revision": modes.revision});
    tx.execute(
        "INSERT INTO queen.system_state (key, value, updated_at) VALUES ($1, $2, now())
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at",
        &[&mode.key(), &value],
    )
    .await?;
    events::publish(&tx, &Event::ModesChanged(modes)).await?;
    tx.commit().await?;
    Ok(modes)
}
