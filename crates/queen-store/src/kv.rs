//! Key/value rows (`queen.kv`, migration 13): locking the rows a batch writes, writing them back,
//! the reads, and maintenance's removal of dead rows.
//!
//! A row is live while its `value` is not NULL and its expiry (NULL: none) is after the instant
//! the caller judges by; every read here filters on that, so an expired key is never returned even
//! before maintenance removes it. Writers follow one protocol (see [`lock`]): the rows of every
//! key a batch writes or checks are locked in one statement, in key order, before anything is
//! decided, and the decisions are written back with [`store`] in the same transaction.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;

use crate::StoreError;

/// A namespace and a key.
pub type KeyRef = (String, String);

/// Transaction advisory lock class serialising the changes to a group of keys that one
/// operation judges together (a lock's permits), with `hashtext` of the group as object ("qkvg").
const KEY_GROUP_LOCK_CLASS: i32 = 0x716b_7667;

/// A row as a writer locked it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub ns: String,
    pub key: String,
    /// The value as JSON text; `None` for a dead row (a deleted key, or a placeholder).
    pub value: Option<String>,
    pub version: i64,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The highest version maintenance has deleted in the namespace.
    pub floor: i64,
}

impl Row {
    /// Whether the key exists at `now`.
    pub fn is_live(&self, now: DateTime<Utc>) -> bool {
        self.value.is_some() && self.expires_at.is_none_or(|at| at > now)
    }

    /// The version the key's next write takes: the next one of a live row; for a key written
    /// anew, one above everything the key ever had, pruned rows of the namespace included.
    pub fn next_version(&self, now: DateTime<Utc>) -> i64 {
        if self.is_live(now) { self.version + 1 } else { self.version.max(self.floor) + 1 }
    }
}

/// The rows a batch locked, in key order, and the instant (taken once every lock was granted) the
/// batch judges expiry by.
#[derive(Debug, Clone)]
pub struct Locked {
    pub now: DateTime<Utc>,
    pub rows: BTreeMap<KeyRef, Row>,
}

/// How many times [`lock`] looks again for rows maintenance deleted between its insert and its
/// lock, before it gives up (which takes maintenance removing the same keys again and again).
const LOCK_ATTEMPTS: usize = 5;

/// Locks the rows of `keys` (`true`: the caller writes the key, so it must have a row to lock) for
/// the rest of the transaction, and returns them with the instant to judge by.
///
/// Why this is linearizable across brokers: every writer of a key holds its row lock
/// (`FOR UPDATE`) from before it reads the row until its transaction ends, and reads the row as
/// the last committed writer left it (READ COMMITTED re-reads a row once its lock is granted). So
/// the writes of one key happen one after the other, each judged against its predecessor. A key
/// without a row has nothing to lock: a writer first inserts a dead placeholder row (`ON CONFLICT
/// DO NOTHING`). Two writers creating the same absent key meet on the primary key: the second's
/// insert waits for the first's transaction and then does nothing, and its `FOR UPDATE` sees the
/// first's row, so exactly one of them creates the key. Rows are inserted and locked in key order
/// (the primary key's byte order), so two batches never wait on each other in a cycle. A key the
/// caller marks `false` (checked by a batch that writes no key) gets no placeholder: it is locked
/// when it has a row (so the check holds until commit) and reads as absent otherwise.
pub async fn lock(client: &impl GenericClient, keys: &BTreeMap<KeyRef, bool>) -> Result<Locked, StoreError> {
    let insert = client
        .prepare_cached(
            "INSERT INTO queen.kv AS k (ns, key, value, version, expires_at, created_at, updated_at)
             SELECT c.ns, c.key, NULL, COALESCE(f.version, 0), clock_timestamp(), clock_timestamp(), clock_timestamp()
               FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS c(ns, key, n)
               LEFT JOIN queen.kv_version_floors f ON f.ns = c.ns
              ORDER BY c.n
             ON CONFLICT (ns, key) DO NOTHING",
        )
        .await?;
    // The floor is read in the statement that locks, after the insert: an insert that waited for
    // maintenance to delete the key's row sees the floor that deletion raised.
    let select = client
        .prepare_cached(
            "SELECT k.ns, k.key, k.value::text, k.version, k.expires_at, k.created_at, k.updated_at,
                    COALESCE(f.version, 0)
               FROM queen.kv k
               LEFT JOIN queen.kv_version_floors f ON f.ns = k.ns
              WHERE (k.ns, k.key) IN (SELECT * FROM unnest($1::text[], $2::text[]))
              ORDER BY k.ns, k.key
                FOR UPDATE OF k",
        )
        .await?;
    let mut rows = BTreeMap::new();
    let mut wanted: Vec<&KeyRef> = keys.keys().collect();
    for _ in 0..LOCK_ATTEMPTS {
        let (ns, key): (Vec<&str>, Vec<&str>) =
            wanted.iter().filter(|k| keys[**k]).map(|(ns, key)| (ns.as_str(), key.as_str())).unzip();
        if !ns.is_empty() {
            client.execute(&insert, &[&ns, &key]).await?;
        }
        let (ns, key): (Vec<&str>, Vec<&str>) = wanted.iter().map(|(ns, key)| (ns.as_str(), key.as_str())).unzip();
        for row in client.query(&select, &[&ns, &key]).await? {
            let row = Row {
                ns: row.get(0),
                key: row.get(1),
                value: row.get(2),
                version: row.get(3),
                expires_at: row.get(4),
                created_at: row.get(5),
                updated_at: row.get(6),
                floor: row.get(7),
            };
            rows.insert((row.ns.clone(), row.key.clone()), row);
        }
        // A written key's row can be missing only if maintenance deleted it (a dead row) between
        // the insert and the lock: insert it again.
        wanted.retain(|k| keys[*k] && !rows.contains_key(*k));
        if wanted.is_empty() {
            let now = client.query_one("SELECT clock_timestamp()", &[]).await?.get(0);
            return Ok(Locked { now, rows });
        }
    }
    Err(StoreError::Unavailable("the rows of a key/value batch kept being removed while it locked them".into()))
}

/// What a writer decided a locked row becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub ns: String,
    pub key: String,
    /// JSON text; `None` deletes the key (the row stays, dead, with its version).
    pub value: Option<String>,
    pub version: i64,
    /// For a deletion: when the key died, which is when maintenance may remove the row.
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// Writes rows locked with [`lock`] in this transaction, `now` being their update time.
pub async fn store(client: &impl GenericClient, now: DateTime<Utc>, writes: &[Write]) -> Result<(), StoreError> {
    if writes.is_empty() {
        return Ok(());
    }
    let statement = client
        .prepare_cached(
            "UPDATE queen.kv AS k
                SET value = c.value::jsonb, version = c.version, expires_at = c.expires_at,
                    created_at = c.created_at, updated_at = $7
               FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::timestamptz[], $6::timestamptz[])
                    AS c(ns, key, value, version, expires_at, created_at)
              WHERE k.ns = c.ns AND k.key = c.key",
        )
        .await?;
    let ns: Vec<&str> = writes.iter().map(|w| w.ns.as_str()).collect();
    let key: Vec<&str> = writes.iter().map(|w| w.key.as_str()).collect();
    let value: Vec<Option<&str>> = writes.iter().map(|w| w.value.as_deref()).collect();
    let version: Vec<i64> = writes.iter().map(|w| w.version).collect();
    let expires_at: Vec<Option<DateTime<Utc>>> = writes.iter().map(|w| w.expires_at).collect();
    let created_at: Vec<DateTime<Utc>> = writes.iter().map(|w| w.created_at).collect();
    client.execute(&statement, &[&ns, &key, &value, &version, &expires_at, &created_at, &now]).await?;
    Ok(())
}

/// A live key as a read returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    /// JSON text; `None` when the read asked for keys only.
    pub value: Option<String>,
    pub version: i64,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

fn entry(row: &tokio_postgres::Row) -> Entry {
    Entry {
        key: row.get(0),
        value: row.get(1),
        version: row.get(2),
        expires_at: row.get(3),
        created_at: row.get(4),
        updated_at: row.get(5),
    }
}

/// The live keys among `keys` of namespace `ns`, in key order, judged at the statement's start.
pub async fn get_many(client: &impl GenericClient, ns: &str, keys: &[&str]) -> Result<Vec<Entry>, StoreError> {
    let statement = client
        .prepare_cached(
            "SELECT key, value::text, version, expires_at, created_at, updated_at
               FROM queen.kv
              WHERE ns = $1 AND key = ANY($2::text[])
                AND value IS NOT NULL AND (expires_at IS NULL OR expires_at > statement_timestamp())
              ORDER BY key",
        )
        .await?;
    Ok(client.query(&statement, &[&ns, &keys]).await?.iter().map(entry).collect())
}

/// Up to `limit` live keys of namespace `ns` starting with `prefix` and after `after`, in key
/// order, judged at the statement's start; values left out when `keys_only`. The prefix is a
/// range of the primary key (no pattern matching: `%` and `_` are plain characters).
pub async fn get_prefix(
    client: &impl GenericClient,
    ns: &str,
    prefix: &str,
    after: Option<&str>,
    limit: i64,
    keys_only: bool,
) -> Result<Vec<Entry>, StoreError> {
    let statement = client
        .prepare_cached(
            "SELECT key, CASE WHEN $6 THEN NULL ELSE value::text END, version, expires_at, created_at, updated_at
               FROM queen.kv
              WHERE ns = $1 AND key >= $2 AND ($3::text IS NULL OR key < $3) AND ($4::text IS NULL OR key > $4)
                AND value IS NOT NULL AND (expires_at IS NULL OR expires_at > statement_timestamp())
              ORDER BY key
              LIMIT $5",
        )
        .await?;
    let end = prefix_end(prefix);
    Ok(client.query(&statement, &[&ns, &prefix, &end, &after, &limit, &keys_only]).await?.iter().map(entry).collect())
}

/// The highest version any key of `ns` starting with `prefix` ever had: its rows' (dead rows
/// included) and the namespace's floor, which covers the rows maintenance removed. What a version
/// that must rise across a group of keys starts above.
pub async fn highest_version(client: &impl GenericClient, ns: &str, prefix: &str) -> Result<i64, StoreError> {
    let statement = client
        .prepare_cached(
            "SELECT GREATEST(
                        (SELECT max(version) FROM queen.kv
                          WHERE ns = $1 AND key >= $2 AND ($3::text IS NULL OR key < $3)),
                        (SELECT version FROM queen.kv_version_floors WHERE ns = $1),
                        0)",
        )
        .await?;
    let end = prefix_end(prefix);
    Ok(client.query_one(&statement, &[&ns, &prefix, &end]).await?.get(0))
}

/// The least string above every string starting with `prefix`, in byte order (`None`: there is
/// none). UTF-8 orders like code points, so it is `prefix` with its last character that can be
/// raised raised by one, and what follows it dropped.
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        // The next code point, skipping the surrogates, which are not characters.
        let next = match u32::from(last) + 1 {
            0xD800 => Some('\u{E000}'),
            code => char::from_u32(code),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Serialises, until the transaction ends, every transaction that changes the keys of `group` in
/// namespace `ns` through this lock (a lock's permits, whose acquire looks at all of them before
/// taking one).
pub async fn lock_key_group(client: &impl GenericClient, ns: &str, group: &str) -> Result<(), StoreError> {
    client
        .execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2::text || '/' || $3::text))",
            &[&KEY_GROUP_LOCK_CLASS, &ns, &group],
        )
        .await?;
    Ok(())
}

/// Maintenance: deletes dead rows (expired, deleted, or placeholders left by refused writes), at
/// most `batch` per statement and `max_batches` statements; how many it deleted. Each statement
/// raises the namespaces' version floors to the highest version it deleted, so a key written
/// again never repeats a version. Rows a writer holds are skipped (`SKIP LOCKED`), and a row a
/// writer revived meanwhile no longer qualifies when its lock is taken.
pub async fn prune_dead(client: &impl GenericClient, batch: i64, max_batches: usize) -> Result<u64, StoreError> {
    let statement = client
        .prepare_cached(
            "WITH doomed AS (
                 SELECT ns, key FROM queen.kv
                  WHERE expires_at <= clock_timestamp()
                  ORDER BY expires_at
                  LIMIT $1
                    FOR UPDATE SKIP LOCKED
             ), gone AS (
                 DELETE FROM queen.kv k USING doomed d
                  WHERE k.ns = d.ns AND k.key = d.key
              RETURNING k.ns, k.version
             ), floors AS (
                 INSERT INTO queen.kv_version_floors AS f (ns, version)
                 SELECT ns, max(version) FROM gone GROUP BY ns
                 ON CONFLICT (ns) DO UPDATE SET version = GREATEST(f.version, EXCLUDED.version)
             )
             SELECT count(*) FROM gone",
        )
        .await?;
    let mut deleted = 0;
    for _ in 0..max_batches {
        let count: i64 = client.query_one(&statement, &[&batch]).await?.get(0);
        deleted += count as u64;
        if count < batch {
            break;
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_at_its_last_character_raised() {
        assert_eq!(prefix_end("user:").as_deref(), Some("user;"));
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end("\u{10FFFF}"), None);
        assert_eq!(prefix_end("x\u{D7FF}").as_deref(), Some("x\u{E000}"));
        assert_eq!(prefix_end("é").as_deref(), Some("ê"));
    }

    #[test]
    fn a_key_written_anew_takes_a_version_above_its_past_and_the_floor() {
        let now = Utc::now();
        let row = |value: Option<&str>, version, expires_at, floor| Row {
            ns: "n".into(),
            key: "k".into(),
            value: value.map(str::to_owned),
            version,
            expires_at,
            created_at: now,
            updated_at: now,
            floor,
        };
        let past = Some(now - chrono::Duration::seconds(1));
        let future = Some(now + chrono::Duration::seconds(1));
        assert!(row(Some("1"), 4, None, 9).is_live(now));
        assert_eq!(row(Some("1"), 4, None, 9).next_version(now), 5, "a live row continues, whatever the floor");
        assert_eq!(row(Some("1"), 4, future, 0).next_version(now), 5);
        assert!(!row(Some("1"), 4, past, 0).is_live(now), "expired");
        assert_eq!(row(Some("1"), 4, past, 0).next_version(now), 5);
        assert!(!row(None, 4, past, 0).is_live(now), "deleted");
        assert_eq!(row(None, 4, past, 9).next_version(now), 10, "above the floor");
    }
}
