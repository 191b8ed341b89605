//! Versioned schema migrations, embedded in the binary.
//!
//! Migrations run at start-up (and from `queen migrate`) under a session advisory lock, so a fleet
//! of brokers starting together migrates once. Each migration runs in its own transaction and is
//! recorded with a checksum; a recorded migration whose text changed since is an error rather than
//! a silent divergence.

use tokio_postgres::Client;

use crate::StoreError;

/// Advisory lock key serialising migrations across brokers ("queenmig" in ASCII).
const MIGRATION_LOCK_KEY: i64 = 0x7175_6565_6e6d_6967;

#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

macro_rules! migration {
    ($version:literal, $name:literal) => {
        Migration { version: $version, name: $name, sql: include_str!(concat!("../migrations/", $name, ".sql")) }
    };
}

/// Every migration, in order.
pub const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001_log"),
    migration!(2, "0002_dlq"),
    migration!(3, "0003_consumer_groups"),
    migration!(4, "0004_maintenance"),
    migration!(5, "0005_message_ids_without_fk"),
    migration!(6, "0006_queue_options"),
    migration!(7, "0007_system_state"),
    migration!(8, "0008_delivery_guarantees"),
    migration!(9, "0009_dead_letter_producer"),
    migration!(10, "0010_fleet_history"),
    migration!(11, "0011_conflation"),
    migration!(12, "0012_traces"),
    migration!(13, "0013_kv"),
    migration!(14, "0014_timers"),
    migration!(15, "0015_offset_reads"),
    migration!(16, "0016_partition_keys"),
    migration!(17, "0017_citus_distribution"),
    migration!(18, "0018_broker_usage"),
    migration!(19, "0019_earlier_offsets"),
];

/// The newest schema version this build knows.
pub fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

fn checksum(sql: &str) -> String {
    // FNV-1a, 64 bit: enough to notice an edited migration, no dependency needed.
    let hash = sql.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("{hash:016x}")
}

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    pub applied: Vec<i32>,
    pub current: i32,
}

/// Brings the schema to [`latest_version`]. Safe to call from many brokers at once. A database
/// whose encoding is not UTF-8 is refused before anything is written to it.
pub async fn migrate(client: &mut Client) -> Result<MigrationReport, StoreError> {
    require_utf8(client).await?;
    client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY]).await?;
    let result = migrate_locked(client).await;
    // The lock is session-scoped: release it whatever happened, so a pooled connection never
    // carries it away.
    let unlock = client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY]).await;
    let report = result?;
    unlock?;
    Ok(report)
}

/// Names, transaction ids and keys are text in the database's encoding: in any other than UTF-8,
/// PostgreSQL refuses those it cannot represent when they are written (failing every push fused
/// with one), or, in `SQL_ASCII`, stores them unchecked.
async fn require_utf8(client: &Client) -> Result<(), StoreError> {
    let encoding: String = client.query_one("SELECT current_setting('server_encoding')", &[]).await?.get(0);
    if encoding == "UTF8" {
        return Ok(());
    }
    Err(StoreError::Schema(format!(
        "the database's encoding is {encoding}; Queen needs a UTF8 database (CREATE DATABASE ... ENCODING 'UTF8' \
         TEMPLATE template0)"
    )))
}

async fn migrate_locked(client: &mut Client) -> Result<MigrationReport, StoreError> {
    client
        .batch_execute(
            "CREATE SCHEMA IF NOT EXISTS queen;
             CREATE TABLE IF NOT EXISTS queen.schema_migrations (
                 version    integer PRIMARY KEY,
                 name       text NOT NULL,
                 checksum   text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             );",
        )
        .await?;
    let rows =
        client.query("SELECT version, name, checksum FROM queen.schema_migrations ORDER BY version", &[]).await?;
    let mut applied = Vec::new();
    let mut current = 0;
    for row in &rows {
        let version: i32 = row.get(0);
        let known = MIGRATIONS.iter().find(|m| m.version == version).ok_or_else(|| {
            StoreError::Schema(format!(
                "the database has schema version {version}, newer than this broker knows ({}); upgrade the broker",
                latest_version()
            ))
        })?;
        let recorded: String = row.get(2);
        if recorded != checksum(known.sql) {
            return Err(StoreError::Schema(format!(
                "migration {version} ({}) differs from the one applied to this database",
                known.name
            )));
        }
        current = current.max(version);
    }
    let pending: Vec<&Migration> = MIGRATIONS.iter().filter(|m| m.version > current).collect();
    for migration in pending {
        let tx = client.transaction().await?;
        // A migration may take as long as the table it rewrites needs (the pool's statement
        // timeout would make a large one impossible). It still gives up on a lock it waited for
        // past the lock timeout, so as not to hold the running fleet's statements queued behind
        // it: that failure, like the database being away, is one to try again.
        tx.batch_execute("SET LOCAL statement_timeout = 0").await?;
        tx.batch_execute(migration.sql).await.map_err(|e| {
            let failed = StoreError::from(e);
            match failed {
                StoreError::Db(_) if !failed.is_unavailable() => {
                    StoreError::Schema(format!("migration {} ({}) failed: {failed}", migration.version, migration.name))
                }
                unavailable => unavailable,
            }
        })?;
        tx.execute(
            "INSERT INTO queen.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
            &[&migration.version, &migration.name, &checksum(migration.sql)],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(version = migration.version, name = migration.name, "applied migration");
        applied.push(migration.version);
        current = migration.version;
    }
    Ok(MigrationReport { applied, current })
}

/// The schema version of the database, 0 when it was never migrated.
pub async fn current_version(client: &Client) -> Result<i32, StoreError> {
    let exists: bool = client.query_one("SELECT to_regclass('queen.schema_migrations') IS NOT NULL", &[]).await?.get(0);
    if !exists {
        return Ok(0);
    }
    let version: Option<i32> = client.query_one("SELECT max(version) FROM queen.schema_migrations", &[]).await?.get(0);
    Ok(version.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_dense_and_ordered() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1, "migration {} is out of order", m.name);
            assert!(m.name.starts_with(&format!("{:04}_", m.version)));
        }
    }

    #[test]
    fn checksum_notices_an_edit() {
        assert_ne!(checksum("CREATE TABLE a ();"), checksum("CREATE TABLE b ();"));
        assert_eq!(checksum("x"), checksum("x"));
    }
}
