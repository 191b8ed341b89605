//! Consumer-group administration: registration on first pop, seek, subscription changes,
//! deletion, and the lag views.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{GenericClient, Object};
use queen_store::cursors::CursorSeed;
use queen_store::groups::{self, CursorLag, GroupDeleted, Registration, SeekTarget, SeekedPartition};

use super::Broker;
use queen_store::StoreError;
use queen_store::events::{self, Event};

use super::BrokerError;
use crate::actors::coordinator::Forget;
use crate::names::QUEUE_MODE_GROUP;

/// Records where a named group starts on each of the queues, and whether it conflates, the first
/// time this broker sees it pop there; answers, for each queue, whether the group conflates there
/// (as first registered: a later pop asking otherwise changes nothing). Queue mode needs no
/// registration: it always starts at the oldest retained message and never conflates. A group new
/// to a queue is registered only within `limits.max_groups_per_queue`, on all of the queues or,
/// when one has no room for another group, on none ([`BrokerError::LimitReached`]). A registration
/// this broker wrote or saw costs nothing; one it has not seen, a lookup.
pub async fn register_on_first_pop(
    broker: &Broker,
    queues: &[&str],
    group: &str,
    seed: CursorSeed,
    conflation: bool,
) -> Result<Vec<bool>, BrokerError> {
    if group == QUEUE_MODE_GROUP {
        return Ok(vec![false; queues.len()]);
    }
    let key = |queue: &str| (queue.to_owned(), group.to_owned());
    let mut conflates: Vec<Option<bool>> = queues.iter().map(|queue| broker.registered.get(&key(queue))).collect();
    let unseen: Vec<&str> = queues.iter().zip(&conflates).filter(|(_, seen)| seen.is_none()).map(|(q, _)| *q).collect();
    if !unseen.is_empty() {
        let registering = async |c: &mut Object| register(broker, c, queues, &unseen, group, seed, conflation).await;
        let conflating = broker.write_within("a group's registration", registering).await?.1?;
        for (queue, flag) in queues.iter().zip(&mut conflates).filter(|(_, flag)| flag.is_none()) {
            let stored = conflating.iter().any(|c| c == queue);
            broker.registered.insert(key(queue), stored);
            *flag = Some(stored);
        }
    }
    Ok(conflates.into_iter().map(|flag| flag.unwrap_or(false)).collect())
}

/// Whether the group is registered on the queue without conflation, as far as this broker has
/// seen, without a database call: what an answer given before the pop registers can say.
pub fn seen_without_conflation(broker: &Broker, queue: &str, group: &str) -> bool {
    broker.registered.get(&(queue.to_owned(), group.to_owned())) == Some(false)
}

/// Registers the group on the `unseen` queues it has no registration on, within the limit; the
/// queues of `unseen` it conflates on.
async fn register(
    broker: &Broker,
    client: &mut Object,
    queues: &[&str],
    unseen: &[&str],
    group: &str,
    seed: CursorSeed,
    conflation: bool,
) -> Result<Vec<String>, BrokerError> {
    // A group that asked a namespace (or task) pop for `new` messages subscribed to it when it was
    // first registered on one of its queues: a queue joining later is read from then on, not only
    // from the pop that first sees it.
    let seed = match seed {
        CursorSeed::End if queues.len() > 1 => {
            groups::earliest_new_registration(&*client, queues, group).await?.map_or(seed, CursorSeed::From)
        }
        _ => seed,
    };
    let max = broker.config.limits.creation().groups_per_queue;
    if max == 0 {
        for queue in unseen {
            groups::register(&*client, queue, group, seed, conflation).await?;
        }
    } else {
        let unregistered = groups::unregistered(&*client, unseen, group).await?;
        if !unregistered.is_empty() {
            let unregistered: Vec<&str> = unregistered.iter().map(String::as_str).collect();
            groups::register_within(client, &unregistered, group, seed, conflation, QUEUE_MODE_GROUP, max).await?;
        }
    }
    Ok(groups::conflating(&*client, unseen, group).await?)
}

/// How long telling the fleet of a committed change is tried again; other brokers' views go stale
/// on their own within a minute.
const RESET_RETRIES_FOR: Duration = Duration::from_secs(60);

/// Makes every broker forget what it knew about the group on the queue (every queue when
/// `queue_id` is 0): its empty-scan watermark and candidates, so that a backward seek or a fresh
/// start is seen on the very next pop. Parked pops look again. The change it follows committed,
/// so the caller is answered whatever comes of telling the other brokers: a notice PostgreSQL
/// does not take is sent again in the background.
async fn forget(broker: &Broker, client: &impl GenericClient, queue_id: i64, queue: Option<&str>, group: &str) {
    broker.coordinator.forget(Forget { queue_id, queue: queue.map(Arc::from), group: Arc::from(group) });
    let reset = Event::Reset { queue_id, group: group.to_owned() };
    if let Err(e) = events::publish(client, &reset).await {
        tracing::warn!(error = %e, group, queue_id, "could not tell the fleet of a group's change; trying again");
        let pool = broker.pool.clone();
        tokio::spawn(async move {
            let until = Instant::now() + RESET_RETRIES_FOR;
            let mut backoff = crate::backoff::Backoff::default();
            while Instant::now() < until {
                backoff.wait().await;
                let sent = match pool.get().await {
                    Ok(client) => events::publish(&client, &reset).await,
                    Err(e) => Err(e.into()),
                };
                if sent.is_ok() {
                    return;
                }
            }
            tracing::warn!("gave up telling the fleet of a group's change; other brokers see it within a minute");
        });
    }
}

/// Seeks the group on one partition of the queue, or on all of them. `Ok(None)` when the queue
/// does not exist or has no such partition. A named group new to the queue (neither registered
/// nor with cursors there) is admitted within `limits.max_groups_per_queue` first
/// ([`BrokerError::LimitReached`]: no cursor is created or moved).
pub async fn seek(
    broker: &Broker,
    queue: &str,
    partition_id: Option<i64>,
    group: &str,
    target: SeekTarget,
) -> Result<Option<Vec<SeekedPartition>>, BrokerError> {
    let Some(queue_id) = broker.names.queue(&broker.pool, queue).await?.map(|q| q.id) else { return Ok(None) };
    let max = broker.config.limits.creation().groups_per_queue;
    let known = group == QUEUE_MODE_GROUP || broker.registered.contains_key(&(queue.to_owned(), group.to_owned()));
    let seeking = async |client: &mut Object| {
        if known || max == 0 {
            return groups::seek(&*client, queue_id, partition_id, group, target).await;
        }
        // A seek creates the cursors of a group that has none: a group new to the queue comes to
        // exist, within the limit.
        let tx = client.transaction().await?;
        groups::admit(&tx, queue, group, QUEUE_MODE_GROUP, max).await?;
        let moved = groups::seek(&tx, queue_id, partition_id, group, target).await?;
        tx.commit().await?;
        Ok(moved)
    };
    let (client, moved) = broker.write_within("a seek", seeking).await?;
    let moved = match moved {
        Err(StoreError::Missing(_)) => return Ok(None),
        moved => moved?,
    };
    if moved.is_empty() {
        return Ok(None);
    }
    forget(broker, &client, queue_id, Some(queue), group).await;
    Ok(Some(moved))
}

/// Changes where the group starts on partitions it has not read yet; no cursor moves. Queue mode
/// has none to change: it always starts at the oldest retained message.
pub async fn update_subscription(
    broker: &Broker,
    group: &str,
    from: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<String>, BrokerError> {
    if group == QUEUE_MODE_GROUP {
        return Err(BrokerError::invalid(format!(
            "{QUEUE_MODE_GROUP} (queue mode) has no subscription: it always starts at the oldest retained message"
        )));
    }
    let updating = async |c: &mut Object| groups::update_subscription(&*c, group, from).await;
    let (client, queues) = broker.write_within("a subscription update", updating).await?;
    let queues = queues?;
    if !queues.is_empty() {
        forget(broker, &client, 0, None, group).await;
    }
    Ok(queues)
}

/// Drops the group's cursors (everywhere, or on one queue) and, with `delete_metadata`, its
/// registrations, so that a group of the same name starts over.
pub async fn delete(
    broker: &Broker,
    group: &str,
    queue: Option<&str>,
    delete_metadata: bool,
) -> Result<GroupDeleted, BrokerError> {
    let deleting = async |c: &mut Object| groups::delete_group(&*c, group, queue, delete_metadata).await;
    let (client, deleted) = broker.write_within("a group's deletion", deleting).await?;
    let deleted = deleted?;
    for queue in &deleted.queues {
        broker.registered.invalidate(&(queue.clone(), group.to_owned()));
    }
    // The deletion committed: a queue that cannot be looked up now has every queue forgotten.
    let queue_id = match queue {
        Some(queue) => broker.names.queue(&broker.pool, queue).await.ok().flatten().map_or(0, |q| q.id),
        None => 0,
    };
    forget(broker, &client, queue_id, queue, group).await;
    Ok(deleted)
}

/// Every cursor (of one group) with its lag, and the registrations.
pub async fn overview(
    broker: &Broker,
    group: Option<&str>,
) -> Result<(Vec<CursorLag>, Vec<Registration>), BrokerError> {
    let client = broker.pool.get().await.map_err(queen_store::StoreError::from)?;
    let lags = groups::cursor_lags(&client, group, None).await?;
    let registrations = groups::registrations(&client, group).await?;
    Ok((lags, registrations))
}
