//! Key/value state: a batch of operations (`POST /api/v1/kv`, or a transaction's `kv` rider)
//! applied in one PostgreSQL transaction.
//!
//! A batch is judged in two steps. Its writes and checks first: the rows of their keys are locked
//! together ([`queen_store::kv::lock`], which says why that makes compare-and-set linearizable),
//! each operation is decided against its row, and, unless a `required` one failed, the changes
//! are written back in one statement. Its reads after, in operation order, so they see the
//! batch's writes. A key appears in at most one operation of a batch ([`Batch::new`]), so the
//! writes do not depend on each other and their order does not matter.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Duration, Utc};
use deadpool_postgres::GenericClient;
use queen_store::StoreError;
use queen_store::kv::{self as store, Entry, KeyRef, Row};

use super::{Broker, BrokerError};

/// Most operations one batch holds.
pub const MAX_OPERATIONS: usize = 256;
/// Most keys one batch names, `getMany` keys counted one by one.
pub const MAX_KEYS: usize = 1024;
/// Longest namespace, in bytes.
pub const MAX_NAMESPACE_BYTES: usize = 128;
/// Longest key (and `getPrefix` prefix or cursor), in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Largest value, in bytes of JSON text: state, not a blob store beside the log.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Longest lifetime a write may give a key: ten years (a longer one is `forever`).
pub const MAX_TTL_SECONDS: i64 = 10 * 365 * 24 * 3600;
/// Rows a `getPrefix` page holds when it asks for no number, and the most it may ask for (a
/// larger `limit` is lowered, never refused).
pub const DEFAULT_PREFIX_LIMIT: usize = 100;
pub const MAX_PREFIX_LIMIT: usize = 1000;
/// Most bytes (keys and values) the reads of one batch return; past it `getMany` and `getPrefix`
/// answer `truncated`.
const MAX_READ_BYTES: usize = 4 * 1024 * 1024;

/// One operation of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    Get { ns: String, key: String },
    GetMany { ns: String, keys: Vec<String> },
    GetPrefix(PrefixRead),
    Write(Write),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixRead {
    pub ns: String,
    pub prefix: String,
    /// Exclusive keyset cursor: the `nextAfter` of the page before.
    pub after: Option<String>,
    pub limit: usize,
    pub keys_only: bool,
}

/// An operation that judges one key, and may change it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub ns: String,
    pub key: String,
    pub change: Change,
    /// A failed precondition aborts the whole batch (or transaction) instead of being a verdict.
    pub required: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Set the value and the lifetime. `expect`: 0 = the key must not exist (`putIfAbsent`),
    /// n = the key must be at version n (it is never created then).
    Put { value: String, expiry: Expiry, expect: Option<i64> },
    /// Delete the key (`expect`: at that version only).
    Delete { expect: Option<i64> },
    /// Write nothing; the key must be at version `expect` (0: must not exist).
    Check { expect: i64 },
    /// Add `delta` to an integer value (an absent or expired key counts as 0 and is created with
    /// `expiry`; a live one keeps its expiry), refused when the result would leave `min..=max`.
    Incr { delta: i64, min: Option<i64>, max: Option<i64>, expiry: Expiry },
}

/// A written key's lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    Forever,
    Seconds(i64),
}

impl Expiry {
    fn at(self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Expiry::Forever => None,
            Expiry::Seconds(seconds) => Some(now + Duration::seconds(seconds)),
        }
    }
}

/// Operations checked together: at most [`MAX_OPERATIONS`] and [`MAX_KEYS`], and no key named
/// twice (a `getPrefix` names none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    operations: Vec<Operation>,
}

/// Why operations cannot form a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchRefusal {
    #[error("a batch holds at most {MAX_OPERATIONS} operations, not {0}")]
    TooManyOperations(usize),
    #[error("a batch names at most {MAX_KEYS} keys, not {0}")]
    TooManyKeys(usize),
    /// The operation at `index` names a key an earlier one names.
    #[error("key {key:?} of namespace {ns:?} is named by more than one operation of the batch")]
    DuplicateKey { index: usize, ns: String, key: String },
}

impl Batch {
    pub fn new(operations: Vec<Operation>) -> Result<Batch, BatchRefusal> {
        if operations.len() > MAX_OPERATIONS {
            return Err(BatchRefusal::TooManyOperations(operations.len()));
        }
        let mut seen = HashSet::new();
        for (index, operation) in operations.iter().enumerate() {
            let (ns, keys): (&str, Vec<&str>) = match operation {
                Operation::Get { ns, key } => (ns, vec![key]),
                Operation::GetMany { ns, keys } => (ns, keys.iter().map(String::as_str).collect()),
                Operation::GetPrefix(_) => continue,
                Operation::Write(write) => (&write.ns, vec![&write.key]),
            };
            for key in keys {
                if !seen.insert((ns, key)) {
                    return Err(BatchRefusal::DuplicateKey { index, ns: ns.to_owned(), key: key.to_owned() });
                }
            }
        }
        if seen.len() > MAX_KEYS {
            return Err(BatchRefusal::TooManyKeys(seen.len()));
        }
        Ok(Batch { operations })
    }

    pub fn operations(&self) -> &[Operation] {
        &self.operations
    }

    pub fn len(&self) -> usize {
        self.operations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.operations.is_empty()
    }
}

/// Why a write or check was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The key exists and must not.
    Exists,
    /// The key does not exist (or expired) and must.
    Absent,
    /// The key is at another version than expected.
    Version,
    /// An increment would leave its bounds (or the integers).
    Limit,
    /// An increment of a value that is not an integer.
    Type,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Exists => "exists",
            Reason::Absent => "absent",
            Reason::Version => "version",
            Reason::Limit => "limit",
            Reason::Type => "type",
        }
    }
}

/// What a write or check did to its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub key: String,
    pub applied: bool,
    pub reason: Option<Reason>,
    /// Applied: the value written (`None` for a delete). Not applied: the key's current value
    /// (`None` when it does not exist).
    pub value: Option<String>,
    /// Applied: the key's new version (a delete: the version it had). Not applied: its current
    /// version, 0 when it does not exist.
    pub version: i64,
    pub expires_at: Option<DateTime<Utc>>,
}

/// The result of one operation, in the batch's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    Get {
        key: String,
        entry: Option<Entry>,
    },
    /// `rows` in the order the keys were asked; a key cut by the byte budget is in neither list.
    GetMany {
        rows: Vec<Entry>,
        missing: Vec<String>,
        truncated: bool,
    },
    GetPrefix {
        rows: Vec<Entry>,
        truncated: bool,
        next_after: Option<String>,
    },
    Write(Verdict),
}

/// What a batch came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Applied(Vec<OpResult>),
    /// The `required` operation at `index` (the first to fail) failed: nothing of the batch (or
    /// of the transaction it rides in) was applied.
    Aborted {
        index: usize,
        verdict: Verdict,
    },
}

/// Applies a batch in a transaction of its own, committed unless the batch aborted, within
/// [`Broker::write_within`]'s bound.
pub async fn apply(broker: &Broker, batch: &Batch) -> Result<Outcome, BrokerError> {
    let applying = async |client: &mut deadpool_postgres::Object| -> Result<Outcome, BrokerError> {
        let tx = client.transaction().await.map_err(StoreError::from)?;
        let outcome = apply_in(&tx, batch).await?;
        if let Outcome::Applied(_) = outcome {
            tx.commit().await.map_err(|e| StoreError::from(e).of_commit("a key/value commit"))?;
        }
        Ok(outcome)
    };
    broker.write_within("a key/value batch", applying).await?.1
}

/// Applies a batch inside the caller's transaction. On [`Outcome::Aborted`] the caller must roll
/// the transaction back: nothing of the batch was decided, but placeholder rows may have been
/// inserted.
pub async fn apply_in(client: &impl GenericClient, batch: &Batch) -> Result<Outcome, BrokerError> {
    let writes: Vec<(usize, &Write)> = batch
        .operations
        .iter()
        .enumerate()
        .filter_map(|(index, operation)| match operation {
            Operation::Write(write) => Some((index, write)),
            _ => None,
        })
        .collect();
    let mut verdicts = HashMap::new();
    if !writes.is_empty() {
        // In a batch that writes, a checked key gets a row to lock too, absent or not: two
        // batches each checking that the key the other writes is absent would otherwise both
        // pass (neither check sees the other's uncommitted key). A batch that only checks
        // writes nothing.
        let writes_a_key = writes.iter().any(|(_, write)| !matches!(write.change, Change::Check { .. }));
        let keys: BTreeMap<KeyRef, bool> = writes
            .iter()
            .map(|(_, write)| {
                let checked = matches!(write.change, Change::Check { .. });
                ((write.ns.clone(), write.key.clone()), writes_a_key || !checked)
            })
            .collect();
        let locked = store::lock(client, &keys).await?;
        let mut changes = Vec::new();
        for &(index, write) in &writes {
            let row = locked.rows.get(&(write.ns.clone(), write.key.clone()));
            let (verdict, change) = decide(write, row, locked.now)?;
            if write.required && !verdict.applied {
                // Writes are judged in operation order, so this is the first that failed.
                return Ok(Outcome::Aborted { index, verdict });
            }
            changes.extend(change);
            verdicts.insert(index, verdict);
        }
        store::store(client, locked.now, &changes).await?;
    }
    let mut budget = MAX_READ_BYTES;
    let mut results = Vec::with_capacity(batch.len());
    for (index, operation) in batch.operations.iter().enumerate() {
        let result = match operation {
            Operation::Write(_) => OpResult::Write(
                verdicts.remove(&index).ok_or_else(|| BrokerError::Internal("a write has no verdict".into()))?,
            ),
            Operation::Get { ns, key } => {
                let entry = store::get_many(client, ns, &[key]).await?.pop();
                budget = budget.saturating_sub(entry.as_ref().map_or(0, size));
                OpResult::Get { key: key.clone(), entry }
            }
            Operation::GetMany { ns, keys } => {
                let asked: Vec<&str> = keys.iter().map(String::as_str).collect();
                let mut found: HashMap<String, Entry> =
                    store::get_many(client, ns, &asked).await?.into_iter().map(|e| (e.key.clone(), e)).collect();
                let (mut rows, mut missing, mut truncated) = (Vec::new(), Vec::new(), false);
                for key in keys {
                    match found.remove(key) {
                        None => missing.push(key.clone()),
                        Some(entry) => {
                            if !take(&mut budget, &entry, rows.is_empty()) {
                                truncated = true;
                                break;
                            }
                            rows.push(entry);
                        }
                    }
                }
                OpResult::GetMany { rows, missing, truncated }
            }
            Operation::GetPrefix(read) => {
                let limit = read.limit.clamp(1, MAX_PREFIX_LIMIT);
                let page = store::get_prefix(
                    client,
                    &read.ns,
                    &read.prefix,
                    read.after.as_deref(),
                    limit as i64 + 1,
                    read.keys_only,
                )
                .await?;
                let mut truncated = page.len() > limit;
                let mut rows = Vec::new();
                for entry in page.into_iter().take(limit) {
                    if !take(&mut budget, &entry, rows.is_empty()) {
                        truncated = true;
                        break;
                    }
                    rows.push(entry);
                }
                let next_after = if truncated { rows.last().map(|e: &Entry| e.key.clone()) } else { None };
                OpResult::GetPrefix { rows, truncated, next_after }
            }
        };
        results.push(result);
    }
    Ok(Outcome::Applied(results))
}

/// The bytes a row costs the read budget.
fn size(entry: &Entry) -> usize {
    entry.key.len() + entry.value.as_ref().map_or(0, String::len)
}

/// Takes a row's bytes from the budget if it fits; the first row of a read always fits, so that
/// every page makes progress.
fn take(budget: &mut usize, entry: &Entry, first: bool) -> bool {
    let cost = size(entry);
    if cost > *budget && !first {
        return false;
    }
    *budget = budget.saturating_sub(cost);
    true
}

/// Judges one write or check against its locked row (`None`: the key has no row, which only a
/// check can meet); what it answers, and what the row becomes.
fn decide(
    write: &Write,
    row: Option<&Row>,
    now: DateTime<Utc>,
) -> Result<(Verdict, Option<store::Write>), BrokerError> {
    let live = row.filter(|row| row.is_live(now));
    // What the key looks like to a caller that did not get its way.
    let current = |applied, reason| Verdict {
        key: write.key.clone(),
        applied,
        reason,
        value: live.and_then(|row| row.value.clone()),
        version: live.map_or(0, |row| row.version),
        expires_at: live.and_then(|row| row.expires_at),
    };
    let refused = |reason| Ok((current(false, Some(reason)), None));
    // What the row becomes when the write applies: its value, its lifetime, its version.
    let (value, expires_at, version) = match (&write.change, row) {
        (Change::Check { expect }, _) => {
            return match (*expect, live) {
                (0, Some(_)) => refused(Reason::Exists),
                (1.., None) => refused(Reason::Absent),
                (expect @ 1.., Some(row)) if row.version != expect => refused(Reason::Version),
                _ => Ok((current(true, None), None)),
            };
        }
        (_, None) => return Err(BrokerError::Internal(format!("the row of key {:?} was not locked", write.key))),
        (Change::Put { value, expiry, expect }, Some(row)) => {
            match (*expect, live) {
                (Some(0), Some(_)) => return refused(Reason::Exists),
                (Some(1..), None) => return refused(Reason::Absent),
                (Some(expect @ 1..), Some(row)) if row.version != expect => return refused(Reason::Version),
                _ => {}
            }
            (Some(value.clone()), expiry.at(now), row.next_version(now))
        }
        (Change::Delete { expect }, Some(_)) => {
            let Some(live) = live else { return refused(Reason::Absent) };
            if expect.is_some_and(|expect| expect != live.version) {
                return refused(Reason::Version);
            }
            // The row stays, dead, with its version: a later write of the key continues from it.
            (None, Some(now), live.version)
        }
        (Change::Incr { delta, min, max, expiry }, Some(row)) => {
            let current = match live {
                None => 0,
                Some(row) => {
                    let number =
                        row.value.as_deref().and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok());
                    match number.as_ref().and_then(serde_json::Value::as_i64) {
                        Some(current) => current,
                        None => return refused(Reason::Type),
                    }
                }
            };
            let Some(next) = current.checked_add(*delta) else { return refused(Reason::Limit) };
            if min.is_some_and(|min| next < min) || max.is_some_and(|max| next > max) {
                return refused(Reason::Limit);
            }
            // The lifetime is given at creation only: a live counter keeps its window.
            let expires_at = match live {
                Some(row) => row.expires_at,
                None => expiry.at(now),
            };
            (Some(next.to_string()), expires_at, row.next_version(now))
        }
    };
    let created_at = match live {
        Some(row) => row.created_at,
        None => now,
    };
    let deleted = value.is_none();
    let change = store::Write {
        ns: write.ns.clone(),
        key: write.key.clone(),
        value: value.clone(),
        version,
        expires_at,
        created_at,
    };
    let verdict = Verdict {
        key: write.key.clone(),
        applied: true,
        reason: None,
        value,
        version,
        expires_at: if deleted { None } else { expires_at },
    };
    Ok((verdict, Some(change)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(change: Change) -> Write {
        Write { ns: "n".into(), key: "k".into(), change, required: false }
    }

    fn row(value: Option<&str>, version: i64, expires_at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Row {
        Row {
            ns: "n".into(),
            key: "k".into(),
            value: value.map(str::to_owned),
            version,
            expires_at,
            created_at: now - Duration::hours(1),
            updated_at: now - Duration::hours(1),
            floor: 0,
        }
    }

    fn put(expect: Option<i64>) -> Change {
        Change::Put { value: "\"v\"".into(), expiry: Expiry::Forever, expect }
    }

    fn incr(delta: i64, min: Option<i64>, max: Option<i64>) -> Change {
        Change::Incr { delta, min, max, expiry: Expiry::Seconds(60) }
    }

    fn judged(change: Change, row: &Row, now: DateTime<Utc>) -> Verdict {
        decide(&write(change), Some(row), now).expect("a verdict").0
    }

    #[test]
    fn preconditions_of_a_put() {
        let now = Utc::now();
        let live = row(Some("1"), 3, None, now);
        let expired = row(Some("1"), 3, Some(now - Duration::seconds(1)), now);
        let reason = |change, row: &Row| judged(change, row, now).reason;
        assert_eq!(reason(put(None), &live), None);
        assert_eq!(reason(put(Some(0)), &live), Some(Reason::Exists));
        assert_eq!(reason(put(Some(0)), &expired), None, "an expired key is absent");
        assert_eq!(reason(put(Some(3)), &live), None);
        assert_eq!(reason(put(Some(2)), &live), Some(Reason::Version));
        assert_eq!(reason(put(Some(3)), &expired), Some(Reason::Absent), "an expect above 0 never creates");
        let applied = judged(put(Some(3)), &live, now);
        assert_eq!((applied.applied, applied.version), (true, 4));
        let lost = judged(put(Some(2)), &live, now);
        assert_eq!((lost.value.as_deref(), lost.version), (Some("1"), 3), "a loser sees the current row");
    }

    #[test]
    fn increments_are_refused_not_saturated() {
        let now = Utc::now();
        let at_nine = row(Some("9"), 9, Some(now + Duration::seconds(30)), now);
        let verdict = judged(incr(1, None, Some(10)), &at_nine, now);
        assert_eq!((verdict.applied, verdict.value.as_deref()), (true, Some("10")));
        assert_eq!(verdict.expires_at, at_nine.expires_at, "a live counter keeps its expiry");
        let verdict = judged(incr(2, None, Some(10)), &at_nine, now);
        assert_eq!((verdict.reason, verdict.value.as_deref()), (Some(Reason::Limit), Some("9")));
        assert_eq!(judged(incr(-10, Some(0), None), &at_nine, now).reason, Some(Reason::Limit));
        let expired = row(Some("9"), 9, Some(now - Duration::seconds(1)), now);
        let verdict = judged(incr(2, None, Some(10)), &expired, now);
        assert_eq!((verdict.value.as_deref(), verdict.version), (Some("2"), 10), "an expired counter starts at 0");
        assert_eq!(verdict.expires_at, Some(now + Duration::seconds(60)), "and takes the new lifetime");
        assert_eq!(judged(incr(20, None, Some(10)), &expired, now).reason, Some(Reason::Limit), "even when created");
        let text = row(Some("\"nine\""), 1, None, now);
        assert_eq!(judged(incr(1, None, None), &text, now).reason, Some(Reason::Type));
        let fraction = row(Some("1.5"), 1, None, now);
        assert_eq!(judged(incr(1, None, None), &fraction, now).reason, Some(Reason::Type));
        let huge = row(Some(&i64::MAX.to_string()), 1, None, now);
        assert_eq!(judged(incr(1, None, None), &huge, now).reason, Some(Reason::Limit));
    }

    #[test]
    fn deletes_and_checks() {
        let now = Utc::now();
        let live = row(Some("1"), 5, None, now);
        let deleted = row(None, 5, Some(now), now);
        let (verdict, change) = decide(&write(Change::Delete { expect: None }), Some(&live), now).unwrap();
        assert_eq!((verdict.applied, verdict.version), (true, 5));
        let change = change.expect("a tombstone");
        assert_eq!((change.value, change.version), (None, 5), "the row keeps its version");
        assert_eq!(judged(Change::Delete { expect: None }, &deleted, now).reason, Some(Reason::Absent));
        assert_eq!(judged(Change::Delete { expect: Some(4) }, &live, now).reason, Some(Reason::Version));
        assert_eq!(judged(put(Some(0)), &deleted, now).version, 6, "written again above its past");
        let check = |expect, row| decide(&write(Change::Check { expect }), row, now).unwrap();
        assert!(check(5, Some(&live)).0.applied);
        assert!(check(5, Some(&live)).1.is_none(), "a check writes nothing");
        assert_eq!(check(4, Some(&live)).0.reason, Some(Reason::Version));
        assert_eq!(check(0, Some(&live)).0.reason, Some(Reason::Exists));
        assert!(check(0, None).0.applied);
        assert!(check(0, Some(&deleted)).0.applied);
        assert_eq!(check(5, None).0.reason, Some(Reason::Absent));
    }

    #[test]
    fn a_key_is_named_once_per_batch() {
        let get = |key: &str| Operation::Get { ns: "n".into(), key: key.into() };
        let many = Operation::GetMany { ns: "n".into(), keys: vec!["a".into(), "b".into()] };
        assert!(Batch::new(vec![get("a"), get("b")]).is_ok());
        assert!(Batch::new(vec![get("a"), Operation::Get { ns: "m".into(), key: "a".into() }]).is_ok());
        assert_eq!(
            Batch::new(vec![get("c"), many, get("b")]),
            Err(BatchRefusal::DuplicateKey { index: 2, ns: "n".into(), key: "b".into() })
        );
        let too_many = (0..=MAX_OPERATIONS).map(|i| get(&i.to_string())).collect();
        assert_eq!(Batch::new(too_many), Err(BatchRefusal::TooManyOperations(MAX_OPERATIONS + 1)));
    }
}
