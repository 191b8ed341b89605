//! Locks and semaphores (`POST /api/v1/locks`): leases on names, with fencing tokens, made of
//! key/value rows.
//!
//! A permit is the row `<name>#<slot>` of namespace [`NAMESPACE`], whose value names its owner and
//! whose lifetime is the lease. Its **token is the row's version**, and every acquire or renew
//! writes it one above every version of the name's rows (all slots, dead rows included;
//! maintenance's floor covers rows it removes), under the name's lock. So a name's tokens only
//! ever rise, across slots, releases and re-acquires: no two permits of a semaphore share one.
//! That is what lets a transaction be fenced by the lock: the `guard` a holder gets is a
//! key/value `check` of its row at its token, which fails once the permit was renewed by someone
//! else's hand, released, expired or taken again.
//!
//! With auth on, a permit is also bound to the identity that took it (the token's subject,
//! stored in its row): only that identity may repeat its acquire, renew or release it (tokens
//! without a subject, a JWT without `sub`, are one identity). A token is no secret (every holder
//! is listed with it, and tokens rise by one), so without the binding any client could release
//! another's lock.
//!
//! Each operation of a call is applied in a transaction of its own: they are independent.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use deadpool_postgres::GenericClient;
use queen_store::StoreError;
use queen_store::kv::{self as store, Entry};

use super::{Broker, BrokerError};

/// The key/value namespace of permits; key/value writes to it are refused, so only this module
/// writes there.
pub const NAMESPACE: &str = "queen-locks";
/// Longest lock name and owner, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
pub const MAX_OWNER_BYTES: usize = 256;
/// Most permits of one name (slots `0..limit`).
pub const MAX_LIMIT: u32 = 1024;

/// Separates a name from its slot in a permit's key; names may not contain it.
const SLOT_SEPARATOR: char = '#';

/// One operation on one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockOp {
    /// Take a permit of `name` (one of `limit`) for `ttl_seconds`. Without an owner, a fresh one is
    /// made up (and the call is then not safe to repeat).
    Acquire {
        name: String,
        ttl_seconds: i64,
        owner: Option<String>,
        limit: u32,
    },
    /// Extend the permit at `slot` held with `token`, which changes.
    Renew {
        name: String,
        token: i64,
        ttl_seconds: i64,
        slot: u32,
        owner: Option<String>,
    },
    Release {
        name: String,
        token: i64,
        slot: u32,
    },
    Get {
        name: String,
    },
}

/// A permit held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit {
    pub name: String,
    pub slot: u32,
    pub token: i64,
    pub owner: String,
}

impl Permit {
    /// The key of the permit's row in [`NAMESPACE`], which its guard checks.
    pub fn key(&self) -> String {
        permit_key(&self.name, self.slot)
    }
}

fn permit_key(name: &str, slot: u32) -> String {
    format!("{name}{SLOT_SEPARATOR}{slot}")
}

/// A live permit of a name, as `get` and a refused acquire report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub slot: u32,
    pub owner: String,
    /// The subject of the token that took the permit; `None` with auth off.
    pub subject: Option<String>,
    pub token: i64,
    pub since: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub renewed_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockOutcome {
    /// `already`: the owner held a permit of the name; it is answered as it is.
    Acquired {
        permit: Permit,
        already: bool,
    },
    /// Every permit is held by others.
    Held {
        holders: Vec<Holder>,
    },
    Renewed {
        permit: Permit,
    },
    /// The token is not the permit's any more (released, expired, taken again).
    RenewLost {
        holders: Vec<Holder>,
    },
    Released,
    ReleaseLost,
    State {
        holders: Vec<Holder>,
    },
}

/// Applies each operation in its own transaction, in order, for `caller` (the token's subject;
/// `None` with auth off), within [`Broker::write_within`]'s bound: past it the call is answered
/// 503, and the operations committed before stand.
pub async fn run(
    broker: &Broker,
    caller: Option<&str>,
    operations: &[LockOp],
) -> Result<Vec<LockOutcome>, BrokerError> {
    let running = async |client: &mut deadpool_postgres::Object| -> Result<Vec<LockOutcome>, BrokerError> {
        let mut outcomes = Vec::with_capacity(operations.len());
        for operation in operations {
            let tx = client.transaction().await.map_err(StoreError::from)?;
            let outcome = match operation {
                LockOp::Acquire { name, ttl_seconds, owner, limit } => {
                    let owner = owner.clone().unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
                    acquire(&tx, name, *ttl_seconds, owner, caller, *limit).await?
                }
                LockOp::Renew { name, token, ttl_seconds, slot, owner } => {
                    renew(&tx, name, *token, *ttl_seconds, *slot, owner.as_deref(), caller).await?
                }
                LockOp::Release { name, token, slot } => release(&tx, name, *token, *slot, caller).await?,
                LockOp::Get { name } => LockOutcome::State { holders: holders(&tx, name).await? },
            };
            // Refusals wrote nothing worth keeping (a placeholder row at most): roll them back.
            if matches!(outcome, LockOutcome::Acquired { .. } | LockOutcome::Renewed { .. } | LockOutcome::Released) {
                tx.commit().await.map_err(|e| StoreError::from(e).of_commit("a lock commit"))?;
            }
            outcomes.push(outcome);
        }
        Ok(outcomes)
    };
    broker.write_within("a lock operation", running).await?.1
}

/// Whether `caller` may act on a permit taken under `subject`: the same identity, or a permit
/// bound to none (taken with auth off; with auth on a token without a subject holds none).
fn may_act(subject: Option<&str>, caller: Option<&str>) -> bool {
    subject.is_none_or(|subject| caller == Some(subject))
}

/// Acquires of one name take turns (a transaction advisory lock), so each sees every permit the
/// ones before it took, and an owner repeating its acquire under the same identity (`subject`)
/// finds its permit.
async fn acquire(
    client: &impl GenericClient,
    name: &str,
    ttl_seconds: i64,
    owner: String,
    subject: Option<&str>,
    limit: u32,
) -> Result<LockOutcome, BrokerError> {
    store::lock_key_group(client, NAMESPACE, name).await?;
    let holders = holders(client, name).await?;
    // The owner's name alone is not enough: another identity may hold a permit under it.
    let mine = holders.iter().find(|holder| holder.owner == owner && may_act(holder.subject.as_deref(), subject));
    let slot = match mine {
        Some(mine) => mine.slot,
        None => match (0..limit).find(|slot| holders.iter().all(|holder| holder.slot != *slot)) {
            Some(slot) => slot,
            None => return Ok(LockOutcome::Held { holders }),
        },
    };
    let key = (NAMESPACE.to_owned(), permit_key(name, slot));
    let locked = store::lock(client, &BTreeMap::from([(key.clone(), true)])).await?;
    let now = locked.now;
    let row = locked.rows.get(&key).ok_or_else(|| BrokerError::Internal("a permit's row was not locked".into()))?;
    if row.is_live(now) {
        let Some(mine) = mine else {
            // Not reachable while acquires take turns; a refusal rather than a second holder.
            return Ok(LockOutcome::Held { holders });
        };
        // The acquire sent again (its answer lost): the holder counts the permit's time from
        // this send, so the permit is kept at least that long, its token unchanged.
        let asked = now + Duration::seconds(ttl_seconds);
        let write = store::Write {
            ns: key.0,
            key: key.1,
            value: row.value.clone(),
            version: row.version,
            expires_at: Some(row.expires_at.map_or(asked, |at| at.max(asked))),
            created_at: row.created_at,
        };
        store::store(client, now, &[write]).await?;
        let permit = Permit { name: name.to_owned(), slot, token: mine.token, owner };
        return Ok(LockOutcome::Acquired { permit, already: true });
    }
    // A free slot, or the owner's permit that ended (ran out, was released or pruned) between the
    // listing and its lock: nobody holds it, and it is taken anew, with a new token.
    let token = next_token(client, name, row.next_version(now)).await?;
    let write = store::Write {
        ns: key.0,
        key: key.1,
        value: Some(serde_json::json!({ "owner": owner, "subject": subject, "since": token }).to_string()),
        version: token,
        expires_at: Some(now + Duration::seconds(ttl_seconds)),
        created_at: now,
    };
    store::store(client, now, &[write]).await?;
    Ok(LockOutcome::Acquired { permit: Permit { name: name.to_owned(), slot, token, owner }, already: false })
}

async fn renew(
    client: &impl GenericClient,
    name: &str,
    token: i64,
    ttl_seconds: i64,
    slot: u32,
    owner: Option<&str>,
    caller: Option<&str>,
) -> Result<LockOutcome, BrokerError> {
    // Taken before the row, in the order acquires take them.
    store::lock_key_group(client, NAMESPACE, name).await?;
    let key = (NAMESPACE.to_owned(), permit_key(name, slot));
    let locked = store::lock(client, &BTreeMap::from([(key.clone(), true)])).await?;
    let now = locked.now;
    // Sent again naming its owner (the client retries a renew whose answer it lost, having moved
    // the token on), a token this holding gave before is the holder's: refused, the holder would
    // think the permit lost while it stays held, and no one could release it before its time ran
    // out. The owner is checked below; without one, only the current token is the holder's.
    let token_is_held = |row: &store::Row| row.version == token || (owner.is_some() && given_by_holding(row, token));
    let held = locked.rows.get(&key).filter(|row| row.is_live(now) && token_is_held(row));
    let held_owner = held.and_then(|row| owner_of(row.value.as_deref()));
    let (Some(row), Some(held_owner)) = (held, held_owner) else {
        return Ok(LockOutcome::RenewLost { holders: holders(client, name).await? });
    };
    let other_owner = owner.is_some_and(|owner| owner != held_owner);
    if other_owner || !may_act(subject_of(row.value.as_deref()).as_deref(), caller) {
        return Ok(LockOutcome::RenewLost { holders: holders(client, name).await? });
    }
    let write = store::Write {
        ns: key.0,
        key: key.1,
        value: row.value.clone(),
        version: next_token(client, name, row.version + 1).await?,
        expires_at: Some(now + Duration::seconds(ttl_seconds)),
        created_at: row.created_at,
    };
    let permit = Permit { name: name.to_owned(), slot, token: write.version, owner: held_owner };
    store::store(client, now, &[write]).await?;
    Ok(LockOutcome::Renewed { permit })
}

async fn release(
    client: &impl GenericClient,
    name: &str,
    token: i64,
    slot: u32,
    caller: Option<&str>,
) -> Result<LockOutcome, BrokerError> {
    let key = (NAMESPACE.to_owned(), permit_key(name, slot));
    let locked = store::lock(client, &BTreeMap::from([(key.clone(), true)])).await?;
    let now = locked.now;
    let held = |row: &&store::Row| {
        row.is_live(now) && row.version == token && may_act(subject_of(row.value.as_deref()).as_deref(), caller)
    };
    let Some(row) = locked.rows.get(&key).filter(held) else {
        return Ok(LockOutcome::ReleaseLost);
    };
    // Dead, keeping its version: the next acquire's token is above this one.
    let write = store::Write {
        ns: key.0,
        key: key.1,
        value: None,
        version: row.version,
        expires_at: Some(now),
        created_at: row.created_at,
    };
    store::store(client, now, &[write]).await?;
    Ok(LockOutcome::Released)
}

/// The token a permit of `name` takes next: at least `own_next` (its row's next version), and
/// above every token the name's other slots had. The caller holds the name's lock.
async fn next_token(client: &impl GenericClient, name: &str, own_next: i64) -> Result<i64, BrokerError> {
    let highest = store::highest_version(client, NAMESPACE, &format!("{name}{SLOT_SEPARATOR}")).await?;
    Ok(own_next.max(highest + 1))
}

/// The live permits of a name, by slot.
async fn holders(client: &impl GenericClient, name: &str) -> Result<Vec<Holder>, BrokerError> {
    let prefix = format!("{name}{SLOT_SEPARATOR}");
    let rows = store::get_prefix(client, NAMESPACE, &prefix, None, i64::from(MAX_LIMIT), false).await?;
    let mut holders: Vec<Holder> = rows.iter().filter_map(|entry| holder(&prefix, entry)).collect();
    holders.sort_by_key(|holder| holder.slot);
    Ok(holders)
}

fn holder(prefix: &str, entry: &Entry) -> Option<Holder> {
    let slot = entry.key.strip_prefix(prefix)?.parse().ok()?;
    Some(Holder {
        slot,
        owner: owner_of(entry.value.as_deref())?,
        subject: subject_of(entry.value.as_deref()),
        token: entry.version,
        since: entry.created_at,
        expires_at: entry.expires_at,
        renewed_at: entry.updated_at,
    })
}

/// Whether `token` is one the permit's holding gave before its current one: from its acquire's
/// token (recorded as `since`; a permit taken before that was recorded has none) up to it.
fn given_by_holding(row: &store::Row, token: i64) -> bool {
    let value = row.value.as_deref().and_then(|value| serde_json::from_str::<serde_json::Value>(value).ok());
    let since = value.and_then(|value| value.get("since")?.as_i64());
    since.is_some_and(|since| since <= token && token < row.version)
}

fn owner_of(value: Option<&str>) -> Option<String> {
    field_of(value, "owner")
}

fn subject_of(value: Option<&str>) -> Option<String> {
    field_of(value, "subject")
}

fn field_of(value: Option<&str>, field: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(value?).ok()?;
    value.get(field)?.as_str().map(str::to_owned)
}

/// Refuses a lock name holding the separator of a permit's key (the edge checks what every name
/// must be: 1 to [`MAX_NAME_BYTES`] bytes, no control characters).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.contains(SLOT_SEPARATOR) {
        return Err(format!("must not contain {SLOT_SEPARATOR:?}"));
    }
    Ok(())
}
