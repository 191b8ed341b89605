//! Buffered pushes: what push maintenance does to a push, and how buffered pushes reach the log.
//!
//! While pushes go to the journal ([`super::maintenance_mode::MaintenanceMode::pushes_to_journal`]),
//! a push request becomes one journal record holding everything needed to replay its items
//! exactly (queue, partition, transaction id, trace id, the payload as sent, and the message id the
//! push was answered with), and is answered once that record is durable; PostgreSQL is not
//! touched. The drain replays the journal, oldest record first, a batch at a time, through the
//! append every push uses ([`super::push::write`]), which drops a transaction id the partition
//! already holds, so replaying a record again (after a crash mid-drain) changes nothing.

use std::path::Path;

use actix_web::web;
use std::borrow::Cow;

use queen_log::{Cipher, Frame, JournalEntry};
use queen_store::StoreError;
use queen_store::log::opened;

use super::Broker;
use super::BrokerError;
use super::push::{Admission, PushItem, write};
use crate::actors::push_journal::{self, DrainStep, JournalContents, JournalError, Record};
use crate::backoff::Backoff;

/// Journals one push request: `true` once it is durable, `false` when the journal declined it
/// (push maintenance ended and the journal is empty), so the push belongs in the log.
pub async fn journal(broker: &Broker, items: &[PushItem]) -> Result<bool, BrokerError> {
    // Without a key, a push to a queue this broker knows is encrypted is refused as a direct push
    // is: journaled, it would sit in plain text and never replay. One to a queue it has not cached
    // is taken (PostgreSQL may be away during maintenance), unless its fleet seals (it has
    // recorded a key): the queue may be encrypted, and its payload would reach the disk in plain.
    if broker.cipher.is_none() {
        for item in items {
            match broker.names.cached_queue(&item.queue) {
                Some(queue) if queue.options.encryption_enabled => {
                    return Err(StoreError::NoEncryptionKey { subject: format!("queue {:?}", item.queue) }.into());
                }
                None if broker.keyless_in_sealing_fleet => {
                    return Err(BrokerError::NoKey(format!(
                        "queue {:?} may be encrypted: this broker has no encryption key (QUEEN_ENCRYPTION_KEY), its \
                         fleet has one, and it cannot tell during push maintenance; retry on a broker that has it (a \
                         new connection may reach one)",
                        item.queue
                    )));
                }
                _ => {}
            }
        }
    }
    let record = record_of(items, broker.cipher.as_deref())?;
    // Such a push would be refused as the journal being full however empty it is: retrying it
    // cannot help, so it is a 400, not a 503.
    let most = broker.config.buffer.max_bytes;
    if record.bytes.len() as u64 > most {
        return Err(BrokerError::invalid(format!(
            "the push takes {} bytes in the push journal, more than it holds in all (buffer.max_bytes = {most}); \
             while push maintenance is on, send it in smaller requests",
            record.bytes.len()
        )));
    }
    match broker.journal.append(record).await {
        Ok(()) => Ok(true),
        Err(JournalError::Declined) => Ok(false),
        Err(e @ (JournalError::Unavailable(_) | JournalError::Full(_))) => Err(BrokerError::Unavailable(e.to_string())),
        Err(JournalError::Overloaded(refused)) => Err(refused.into()),
    }
}

/// One push request as a journal record. With an encryption key configured, every payload is
/// sealed on its own (the queues' settings may not be readable during maintenance), so no payload
/// of an encrypted queue reaches the disk in plain text.
fn record_of(items: &[PushItem], keys: Option<&Cipher>) -> Result<Record, BrokerError> {
    let cannot = |e: queen_log::EncodeError| BrokerError::invalid(format!("the push cannot be buffered: {e}"));
    let payloads: Vec<Cow<'_, [u8]>> = items
        .iter()
        .map(|item| match keys {
            Some(cipher) => cipher.seal(&item.payload).map(Cow::Owned),
            None => Ok(Cow::Borrowed(item.payload.as_slice())),
        })
        .collect::<Result<_, _>>()
        .map_err(cannot)?;
    let entries: Vec<JournalEntry<'_>> = items
        .iter()
        .zip(&payloads)
        .map(|(item, payload)| JournalEntry {
            queue: &item.queue,
            partition: &item.partition,
            frame: Frame {
                message_id: item.message_id,
                trace_id: item.trace_id,
                transaction_id: &item.transaction_id,
                producer: item.producer.as_deref(),
                payload,
            },
        })
        .collect();
    let mut bytes = Vec::new();
    queen_log::encode_record(&entries, &mut bytes).map_err(cannot)?;
    Ok(Record { bytes, messages: items.len() as u64 })
}

/// A journal entry as the push it was, its payload opened when sealed.
fn item_of(entry: &JournalEntry<'_>, keys: Option<&Cipher>) -> Result<PushItem, String> {
    let payload = opened(entry.frame.payload, keys)
        .map_err(|e| format!("cannot read a buffered message of queue {:?}: {e}", entry.queue))?;
    Ok(PushItem {
        queue: entry.queue.to_owned(),
        partition: entry.partition.to_owned(),
        transaction_id: entry.frame.transaction_id.to_owned(),
        trace_id: entry.frame.trace_id,
        producer: entry.frame.producer.map(str::to_owned),
        message_id: entry.frame.message_id,
        payload: payload.into_owned(),
        received: None,
    })
}

/// Runs for the broker's life: whenever push maintenance is off, replays what the journal holds
/// (at start-up, what a previous run left) until it is empty and pushes go to the log again.
pub async fn keep_draining(broker: web::Data<Broker>) {
    let mut push_maintenance = broker.maintenance.push_maintenance();
    loop {
        if push_maintenance.wait_for(|on| !on).await.is_err() {
            return;
        }
        drain(&broker).await;
        if push_maintenance.changed().await.is_err() {
            return;
        }
    }
}

/// Says, at shutdown, what the journal still holds: only a broker started on the same directory
/// replays it, and a directory lost with its broker (a pod's `emptyDir`) loses it.
pub async fn report_left(broker: &Broker) {
    if let Ok(status) = broker.journal.status().await
        && status.buffered_messages > 0
    {
        tracing::error!(
            buffered_messages = status.buffered_messages,
            dir = %broker.journal.dir.display(),
            "stopping with pushes the log does not hold yet: a broker started on this journal directory replays them"
        );
    }
}

/// Why a drain stopped replaying a file before its end.
enum Halt {
    /// Push maintenance is on again.
    Stopped,
    /// The file can never be replayed as things are; why.
    Unreplayable(String),
}

/// Why an attempt at replaying failed.
enum Failure {
    /// It may go through later (PostgreSQL away, the disk busy).
    Transient(String),
    /// It never will while the broker is as it is: a payload sealed with a key it does not hold,
    /// or a queue that is encrypted without a key here.
    Permanent(String),
}

impl From<BrokerError> for Failure {
    fn from(e: BrokerError) -> Self {
        match e {
            BrokerError::NoKey(_) => Failure::Permanent(e.to_string()),
            e => Failure::Transient(e.to_string()),
        }
    }
}

/// Replays file after file until the journal is empty or push maintenance is on again. It goes on
/// while the broker is stopping, whose drain waits for it while it goes through (within
/// `http.shutdown_timeout_seconds`); what is left is replayed at the next start on the same
/// journal directory.
async fn drain(broker: &Broker) {
    loop {
        if must_stop(broker) {
            return;
        }
        match broker.journal.next_to_drain().await {
            Ok(DrainStep::File(path)) => match replay_file(broker, &path).await {
                Ok(()) => {}
                Err(Halt::Stopped) => return,
                // Set aside, not retried for ever: the pushes after it would wait behind it, and
                // every new push of this broker with them, answered but never in the log.
                Err(Halt::Unreplayable(why)) => {
                    tracing::error!(file = %path.display(), error = %why, "a push journal file cannot be replayed");
                    broker.journal.file_set_aside(path);
                }
            },
            Ok(DrainStep::Paused | DrainStep::Done) => return,
            Err(e) => {
                tracing::error!(error = %e, "the push journal stopped answering; the drain stops");
                return;
            }
        }
    }
}

async fn replay_file(broker: &Broker, path: &Path) -> Result<(), Halt> {
    let records = retrying(broker, || {
        let (path, keys) = (path.to_owned(), broker.cipher.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                let contents = JournalContents::read(&path)
                    .map_err(|e| Failure::Transient(format!("cannot read {}: {e}", path.display())))?;
                contents
                    .records()
                    .map(|entries| entries.iter().map(|entry| item_of(entry, keys.as_deref())).collect())
                    .collect::<Result<Vec<Vec<PushItem>>, String>>()
                    .map_err(Failure::Permanent)
            })
            .await
            .map_err(|e| Failure::Transient(e.to_string()))?
        }
    })
    .await?;
    // Records an earlier drain of this file put in the log are not replayed again.
    let done = retrying(broker, || {
        let path = path.to_owned();
        async move {
            push_journal::replayed_records(&path)
                .map_err(|e| Failure::Transient(format!("cannot read the drain's progress: {e}")))
        }
    })
    .await?;
    // A batch of a partition becomes one segment: bounded by bytes as pushes fused into one are
    // (`push.max_segment_bytes`), so a journal of large payloads does not write a segment past
    // what readers decode.
    let (limit, max_bytes) = (broker.config.buffer.drain_batch_messages, broker.config.push.max_segment_bytes);
    let mut batch: Vec<PushItem> = Vec::new();
    let (mut batched, mut batch_bytes) = (done, 0);
    for items in records.into_iter().skip(usize::try_from(done).unwrap_or(usize::MAX)) {
        let bytes = items.iter().map(|item| item.payload.len()).sum::<usize>();
        // A record is one push, written alone as the push would have been; one that would take
        // a batch past the bound starts the next batch.
        if !batch.is_empty() && batch_bytes + bytes > max_bytes {
            let replayed = replay(broker, &mut batch, path, batched).await?;
            broker.journal.replayed(replayed);
            batch_bytes = 0;
        }
        batch_bytes += bytes;
        batch.extend(items);
        batched += 1;
        if batch.len() >= limit {
            let replayed = replay(broker, &mut batch, path, batched).await?;
            broker.journal.replayed(replayed);
            batch_bytes = 0;
        }
    }
    // The last batch leaves the buffered count with the file, in one step of the journal: a
    // count of 0 then means the journal declines pushes again, and they are answered `queued`.
    replay(broker, &mut batch, path, batched).await?;
    tracing::info!(file = %path.display(), "replayed a push journal file into the log");
    broker.journal.file_drained(path.to_owned());
    Ok(())
}

/// Appends the batch to the log (whole, in order), records that the file's first `records`
/// records are in it, and empties the batch; how many messages it appended.
async fn replay(broker: &Broker, batch: &mut Vec<PushItem>, path: &Path, records: u64) -> Result<u64, Halt> {
    if batch.is_empty() {
        return Ok(0);
    }
    if must_stop(broker) {
        return Err(Halt::Stopped);
    }
    retrying(broker, || async { write(broker, batch, Admission::Accepted).await.map_err(Failure::from) }).await?;
    let replayed = batch.len() as u64;
    batch.clear();
    // Not recorded (the disk refused), the batch is replayed again by the next drain of the
    // file: harmless by its ids, unless retention took them meanwhile.
    let path = path.to_owned();
    let recorded = tokio::task::spawn_blocking(move || push_journal::record_replayed(&path, records)).await;
    if let Err(e) = recorded.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())) {
        tracing::warn!(error = %e, "cannot record the drain's progress");
    }
    Ok(replayed)
}

/// Runs `attempt` until it succeeds, with a backoff, reporting the journal unhealthy meanwhile;
/// gives up when push maintenance is on again or the broker is stopping, and at once on a
/// permanent failure.
async fn retrying<T, F, Fut>(broker: &Broker, attempt: F) -> Result<T, Halt>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let mut backoff = Backoff::default();
    let mut failed = false;
    loop {
        match attempt().await {
            Ok(value) => {
                if failed {
                    broker.journal.drain_health(true);
                }
                return Ok(value);
            }
            Err(Failure::Permanent(why)) => return Err(Halt::Unreplayable(why)),
            Err(Failure::Transient(e)) => {
                tracing::warn!(error = %e, "cannot replay the push journal; retrying");
                broker.journal.drain_health(false);
                failed = true;
            }
        }
        backoff.wait().await;
        if must_stop(broker) {
            return Err(Halt::Stopped);
        }
    }
}

/// Push maintenance is on again (the database may be going away).
fn must_stop(broker: &Broker) -> bool {
    broker.maintenance.modes().push_maintenance
}
