//! PushJournal: one per broker. It owns the journal directory, where pushes accepted while push
//! maintenance is on wait, durable, until they are replayed into the log.
//!
//! **Appends.** A push is answered only once its record is on disk (written and `fdatasync`ed).
//! Group commit: while one write is in flight, later appends queue; when it completes, everything
//! queued goes out as the next write and the next `fdatasync`, and each push gets its answer.
//!
//! **Files.** `<sequence>.journal` in the directory, in the format of `queen_log::journal`.
//! Appends go to the active file, which is closed (sealed) when it passes `file_max_bytes`, when a
//! drain needs it, or after a failed write, so that nothing is ever appended after bytes that may
//! be torn. For the same reason a broker never appends to a file it found at start-up. The
//! directory is created and locked (`flock`) when first needed, so a broker that never buffers
//! writes nothing to disk, and two brokers cannot share one directory.
//!
//! **Routing.** [`PushRoute`] tells the push path, in one atomic load, whether pushes go here: while
//! push maintenance is on, and while the journal holds pushes not yet replayed (so a new push can
//! never overtake a buffered one of the same partition).
//!
//! **Draining.** The broker's drain asks for the next file ([`NextToDrain`]), replays it into the
//! log, reports progress ([`Replayed`]) and the end ([`FileDrained`]), and the file is deleted.
//! When nothing is left, push maintenance is off and no write is under way, the journal stops
//! holding pushes in that same step: an append that arrives after it is declined, and its push goes
//! to the log, behind everything that was replayed.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use actix::prelude::*;
use nix::fcntl::{Flock, FlockArg};
use queen_log::{JOURNAL_MAGIC, JournalEntry, JournalReader};
use tokio::sync::oneshot;

use super::fusion::{FusionQueue, Pending};
use crate::config::BufferConfig;
use crate::metrics::Metrics;
use crate::pressure::{Bound, Held, Limited, Refused};

/// This actor's label in the metrics.
const ACTOR: &str = "push_journal";
/// Most push requests the journal holds (queued or being written) before it refuses more.
const MAX_APPENDS: usize = 16 * 1024;
/// Most bytes of queued appends taken into one write (a larger single record still goes alone).
const MAX_WRITE_BYTES: usize = 8 * 1024 * 1024;
const FILE_SUFFIX: &str = ".journal";
const LOCK_FILE: &str = "journal.lock";
/// What a file set aside gets after its name (and is then no journal file to the broker).
const HELD_SUFFIX: &str = ".held";

/// Whether pushes go to the journal or to the log. One atomic word, so that the push path pays
/// one load for it.
#[derive(Debug, Default)]
pub struct PushRoute(AtomicU8);

impl PushRoute {
    /// Push maintenance is on (set by the maintenance switches).
    const MAINTENANCE: u8 = 1;
    /// The journal holds pushes not yet replayed (set by the journal).
    const HOLDING: u8 = 2;

    pub fn to_journal(&self) -> bool {
        self.0.load(Ordering::SeqCst) != 0
    }

    pub fn set_maintenance(&self, on: bool) {
        self.set(Self::MAINTENANCE, on);
    }

    fn maintenance(&self) -> bool {
        self.0.load(Ordering::SeqCst) & Self::MAINTENANCE != 0
    }

    fn set_holding(&self, holding: bool) {
        self.set(Self::HOLDING, holding);
    }

    fn set(&self, bit: u8, on: bool) {
        if on {
            self.0.fetch_or(bit, Ordering::SeqCst);
        } else {
            self.0.fetch_and(!bit, Ordering::SeqCst);
        }
    }
}

/// Why a push was not journaled.
#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    /// Push maintenance is off and the journal is empty: the push belongs in the log.
    #[error("the journal is not taking pushes")]
    Declined,
    /// The disk refused the write; nothing of the push was kept.
    #[error("cannot journal the push: {0}")]
    Unavailable(String),
    /// The journal holds as many pushes as it may; nothing of the push was kept.
    #[error(transparent)]
    Overloaded(#[from] Refused),
    /// The journal's files hold `buffer.max_bytes`; nothing of the push was kept.
    #[error("the push journal holds {0} bytes, as many as buffer.max_bytes lets it; retry later")]
    Full(u64),
}

/// One push request's items, encoded as a journal record.
#[derive(Debug)]
pub struct Record {
    pub bytes: Vec<u8>,
    pub messages: u64,
}

/// Journals one record; answered once it is durable.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Append {
    pub record: Record,
    pub reply: oneshot::Sender<Result<Vec<()>, JournalError>>,
    pub place: Held,
}

/// What the drain does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainStep {
    /// Replay this file, then report [`FileDrained`].
    File(PathBuf),
    /// Push maintenance is on again: stop.
    Paused,
    /// Everything is replayed; pushes go to the log from now on.
    Done,
}

/// Asks for the next [`DrainStep`]; answered at once, or when the write under way completes.
#[derive(Message)]
#[rtype(result = "()")]
pub struct NextToDrain {
    pub reply: oneshot::Sender<DrainStep>,
}

/// This many messages of the file being drained are in the log now.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Replayed {
    pub messages: u64,
}

/// The file being drained is in the log: delete it. Its messages not yet counted by [`Replayed`]
/// leave the buffered count with it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FileDrained {
    pub path: PathBuf,
}

/// The file being drained can never be replayed as things are (its payloads sealed with a key this
/// broker lacks, say): keep it beside the journal, out of the drain (see [`set_aside`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct FileSetAside {
    pub path: PathBuf,
}

/// Whether the last drain attempt reached the log.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DrainHealth {
    pub healthy: bool,
}

/// What the journal holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalStatus {
    /// Messages on disk, not yet replayed.
    pub buffered_messages: u64,
    /// The last write succeeded, the last drain attempt reached the log, and no file is set aside.
    pub healthy: bool,
}

#[derive(Message)]
#[rtype(result = "JournalStatus")]
pub struct Status;

/// The file appends go to.
struct ActiveFile {
    path: PathBuf,
    file: File,
    len: u64,
    messages: u64,
}

impl ActiveFile {
    /// A new, empty journal file, durable in its directory.
    fn create(dir: &Path, sequence: u64) -> io::Result<Self> {
        let path = dir.join(format!("{sequence:020}{FILE_SUFFIX}"));
        // A drain's progress left by an earlier file of this name (a crash between deleting the
        // two) would have the new file's first records taken as replayed, and skipped.
        match std::fs::remove_file(progress_path(&path)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut file = OpenOptions::new().create_new(true).append(true).open(&path)?;
        file.write_all(JOURNAL_MAGIC)?;
        file.sync_data()?;
        File::open(dir)?.sync_all()?;
        Ok(ActiveFile { path, file, len: JOURNAL_MAGIC.len() as u64, messages: 0 })
    }

    /// Appends `bytes` and makes them durable. After a failure the file is cut back to what was
    /// durable before, as far as the disk allows; it must not be appended to again.
    fn append_durably(&mut self, bytes: &[u8], messages: u64) -> io::Result<()> {
        match self.file.write_all(bytes).and_then(|()| self.file.sync_data()) {
            Ok(()) => {
                self.len += bytes.len() as u64;
                self.messages += messages;
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.len);
                Err(e)
            }
        }
    }
}

/// A closed file waiting to be drained, and how many of its messages are not in the log yet.
struct SealedFile {
    path: PathBuf,
    remaining: u64,
    /// Its length on disk.
    bytes: u64,
}

/// The contents of one journal file, read back.
pub struct JournalContents {
    path: PathBuf,
    data: Vec<u8>,
}

impl JournalContents {
    /// Reads a whole file.
    pub fn read(path: &Path) -> io::Result<Self> {
        Ok(Self { path: path.to_owned(), data: std::fs::read(path)? })
    }

    /// Whether the file starts with another format's bytes (another version's journal, say),
    /// rather than with ours or a part of ours (a creation cut short, which holds no record).
    fn is_foreign(&self) -> bool {
        !self.data.starts_with(JOURNAL_MAGIC) && !JOURNAL_MAGIC.starts_with(&self.data)
    }

    /// Every readable record, in order, each as its entries. A torn or corrupt record was never
    /// acknowledged (its push got an error, or none): it is skipped, with a warning.
    pub fn records(&self) -> impl Iterator<Item = Vec<JournalEntry<'_>>> {
        JournalReader::new(&self.data).filter_map(|record| {
            record
                .map_err(
                    |defect| tracing::warn!(file = %self.path.display(), %defect, "skipping part of a push journal"),
                )
                .ok()
        })
    }
}

/// Where a drain records how many readable records of a journal file are in the log, so a drain
/// stopped midway (push maintenance on again, a restart) goes on after them: replayed again, they
/// would be stored twice once retention had taken their first copies (and their ids) away.
fn progress_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".replayed");
    PathBuf::from(name)
}

/// How many of the file's readable records a drain put in the log (0 before any).
pub fn replayed_records(path: &Path) -> io::Result<u64> {
    match std::fs::read_to_string(progress_path(path)) {
        Ok(text) => text.trim().parse().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// Records, durably, that the file's first `records` readable records are in the log: written
/// whole to a new file, synced, and renamed over the last, so a crash leaves one or the other.
pub fn record_replayed(path: &Path, records: u64) -> io::Result<()> {
    let progress = progress_path(path);
    let mut next = progress.clone().into_os_string();
    next.push(".next");
    let next = PathBuf::from(next);
    let mut file = OpenOptions::new().create(true).truncate(true).write(true).open(&next)?;
    file.write_all(records.to_string().as_bytes())?;
    file.sync_data()?;
    std::fs::rename(&next, &progress)?;
    File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}

pub struct PushJournal {
    dir: PathBuf,
    file_max_bytes: u64,
    /// Most bytes its files may hold together: past it a push is refused, not taken into files
    /// the disk (or a Kubernetes volume's size limit) may not hold.
    max_bytes: u64,
    /// Held while this broker uses the directory; taken when first needed.
    lock: Option<Flock<File>>,
    /// `None` before the first append of a file, and while a write has it.
    active: Option<ActiveFile>,
    sealed: VecDeque<SealedFile>,
    next_sequence: u64,
    queue: FusionQueue<Record, (), JournalError>,
    /// Messages on disk, not yet replayed.
    buffered: u64,
    /// Files set aside as unreplayable (found at start-up, or set aside since): acknowledged
    /// pushes not in the log, which keep the journal unhealthy until an operator sees to them.
    set_aside_files: u64,
    write_failed: bool,
    drain_failing: bool,
    drain_waiter: Option<oneshot::Sender<DrainStep>>,
    route: Arc<PushRoute>,
    metrics: Arc<Metrics>,
}

/// The journal as a broker finds it at start-up: the files a previous run left, to be drained.
pub struct FoundJournal {
    dir: PathBuf,
    file_max_bytes: u64,
    max_bytes: u64,
    lock: Option<Flock<File>>,
    sealed: VecDeque<SealedFile>,
    next_sequence: u64,
    /// Files an earlier run set aside (`.held`).
    set_aside_files: u64,
}

impl FoundJournal {
    /// Looks in the configured directory, locking it if it exists (with none, nothing is touched),
    /// and counts the messages of every file found.
    pub fn recover(config: &BufferConfig) -> io::Result<Self> {
        let mut found = FoundJournal {
            dir: config.dir.clone(),
            file_max_bytes: config.file_max_bytes,
            max_bytes: config.max_bytes,
            lock: None,
            sealed: VecDeque::new(),
            next_sequence: 1,
            set_aside_files: 0,
        };
        if !found.dir.exists() {
            return Ok(found);
        }
        found.lock = Some(lock_dir(&found.dir)?);
        let entries: Vec<PathBuf> =
            std::fs::read_dir(&found.dir)?.filter_map(|entry| Some(entry.ok()?.path())).collect();
        let held = |path: &&PathBuf| {
            path.file_name().and_then(|name| name.to_str()).is_some_and(|name| name.ends_with(HELD_SUFFIX))
        };
        for path in entries.iter().filter(held) {
            tracing::error!(file = %path.display(), "a push journal file set aside earlier holds pushes not in the log");
            found.set_aside_files += 1;
        }
        let mut files: Vec<(u64, PathBuf)> = entries
            .into_iter()
            .filter_map(|path| {
                let sequence = path.file_name()?.to_str()?.strip_suffix(FILE_SUFFIX)?.parse().ok()?;
                Some((sequence, path))
            })
            .collect();
        files.sort();
        for (sequence, path) in files {
            found.next_sequence = found.next_sequence.max(sequence + 1);
            let contents = JournalContents::read(&path)?;
            if contents.is_foreign() {
                tracing::error!(
                    file = %path.display(),
                    "not a push journal this broker reads (another version's?): left in place, not replayed"
                );
                continue;
            }
            let messages: u64 = contents.records().map(|entries| entries.len() as u64).sum();
            tracing::info!(file = %path.display(), messages, "found a push journal file to replay");
            keep_sealed(&mut found.sealed, path, messages, contents.data.len() as u64);
        }
        Ok(found)
    }

    /// Where the journal lives.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Creates the directory if needed and locks it for this broker.
fn lock_dir(dir: &Path) -> io::Result<Flock<File>> {
    std::fs::create_dir_all(dir)?;
    let file = OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(LOCK_FILE))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        io::Error::other(format!(
            "the push journal directory {} is in use by another broker ({errno}); give every broker a directory of its own",
            dir.display()
        ))
    })
}

/// Keeps a closed file for the drain; one without messages is deleted.
fn keep_sealed(sealed: &mut VecDeque<SealedFile>, path: PathBuf, messages: u64, bytes: u64) {
    if messages > 0 {
        sealed.push_back(SealedFile { path, remaining: messages, bytes });
    } else {
        remove(&path);
    }
}

impl PushJournal {
    /// The journal actor over what was found; pushes go to it until what was found is drained.
    pub fn new(found: FoundJournal, route: Arc<PushRoute>, metrics: Arc<Metrics>) -> Self {
        let FoundJournal { dir, file_max_bytes, max_bytes, lock, sealed, next_sequence, set_aside_files } = found;
        let buffered = sealed.iter().map(|file| file.remaining).sum();
        route.set_holding(!sealed.is_empty());
        let journal = PushJournal {
            dir,
            file_max_bytes,
            max_bytes,
            lock,
            active: None,
            sealed,
            next_sequence,
            queue: FusionQueue::default(),
            buffered,
            set_aside_files,
            write_failed: false,
            drain_failing: false,
            drain_waiter: None,
            route,
            metrics,
        };
        journal.record_count();
        journal
    }

    fn seal_active(&mut self) {
        if let Some(ActiveFile { path, messages, len, .. }) = self.active.take() {
            keep_sealed(&mut self.sealed, path, messages, len);
        }
    }

    /// Nothing on disk and nothing on its way there.
    fn is_empty(&self) -> bool {
        self.sealed.is_empty() && self.active.as_ref().is_none_or(|a| a.messages == 0) && self.queue.is_idle()
    }

    fn record_count(&self) {
        self.metrics.buffered_messages.set(i64::try_from(self.buffered).unwrap_or(i64::MAX));
        self.metrics.journal_files_set_aside.set(i64::try_from(self.set_aside_files).unwrap_or(i64::MAX));
    }

    fn write_next(&mut self, ctx: &mut Context<Self>) {
        let size = |records: &[Record]| records.iter().map(|r| r.bytes.len()).sum::<usize>();
        // The bytes taken so far, counted as they grow: a batch may hold thousands of records.
        let counted = std::cell::Cell::new((0, 0));
        let fits = |so_far: &[Record], next: &[Record]| {
            let (records, bytes) = counted.get();
            let bytes = bytes + size(&so_far[records..]);
            counted.set((so_far.len(), bytes));
            bytes + size(next) <= MAX_WRITE_BYTES
        };
        let Some(batch) = self.queue.next_batch(fits) else { return };
        let records = batch.items.len();
        let messages: u64 = batch.items.iter().map(|r| r.messages).sum();
        let mut bytes = Vec::with_capacity(size(&batch.items));
        for record in &batch.items {
            bytes.extend_from_slice(&record.bytes);
        }
        let replies = batch.replies;
        self.metrics.actor_queued.with_label_values(&[ACTOR]).sub(replies.len() as i64);
        let on_disk =
            self.sealed.iter().map(|file| file.bytes).sum::<u64>() + self.active.as_ref().map_or(0, |a| a.len);
        if on_disk + bytes.len() as u64 > self.max_bytes {
            replies.answer(Err(JournalError::Full(on_disk)));
            self.queue.done();
            return self.write_next(ctx);
        }
        if self.lock.is_none() {
            match lock_dir(&self.dir) {
                Ok(lock) => self.lock = Some(lock),
                Err(e) => {
                    self.write_failed = true;
                    tracing::error!(error = %e, "cannot use the push journal directory");
                    replies.answer(Err(JournalError::Unavailable(e.to_string())));
                    self.queue.done();
                    return self.write_next(ctx);
                }
            }
        }
        let active = self.active.take();
        let (dir, sequence) = (self.dir.clone(), self.next_sequence);
        if active.is_none() {
            self.next_sequence += 1;
        }
        let write = tokio::task::spawn_blocking(move || {
            let mut active = match active {
                Some(active) => active,
                None => match ActiveFile::create(&dir, sequence) {
                    Ok(active) => active,
                    Err(e) => return (None, Err(e)),
                },
            };
            let written = active.append_durably(&bytes, messages);
            (Some(active), written)
        });
        ctx.spawn(write.into_actor(self).map(move |joined, journal, ctx| {
            let (active, written) = joined.unwrap_or_else(|e| (None, Err(io::Error::other(e.to_string()))));
            journal.active = active;
            match written {
                Ok(()) => {
                    journal.write_failed = false;
                    journal.buffered += messages;
                    journal.metrics.messages_buffered.inc_by(messages);
                    journal.record_count();
                    replies.answer(Ok(vec![(); records]));
                    if journal.active.as_ref().is_some_and(|a| a.len >= journal.file_max_bytes) {
                        journal.seal_active();
                    }
                }
                Err(e) => {
                    journal.write_failed = true;
                    tracing::error!(error = %e, "cannot write the push journal");
                    replies.answer(Err(JournalError::Unavailable(e.to_string())));
                    journal.seal_active();
                }
            }
            journal.queue.done();
            journal.write_next(ctx);
            journal.answer_drain_waiter();
        }));
    }

    /// The drain's next step; `None` while a write is under way (it may add to the journal).
    fn next_step(&mut self) -> Option<DrainStep> {
        if self.route.maintenance() {
            return Some(DrainStep::Paused);
        }
        if self.sealed.is_empty() {
            if !self.queue.is_idle() {
                return None;
            }
            self.seal_active();
        }
        match self.sealed.front() {
            Some(file) => Some(DrainStep::File(file.path.clone())),
            None => {
                // Nothing held, nothing being written, push maintenance off: from here on an
                // append is declined and its push goes to the log.
                self.route.set_holding(false);
                Some(DrainStep::Done)
            }
        }
    }

    /// The file being drained leaves the journal, deleted or set aside.
    fn let_go(&mut self, path: &Path, aside: bool) {
        if self.sealed.front().is_some_and(|file| file.path == path)
            && let Some(file) = self.sealed.pop_front()
        {
            if aside {
                set_aside(&file.path);
                self.set_aside_files += 1;
            } else {
                remove(&file.path);
            }
            // Its messages leave the count: in the log, unreadable, or kept with the file set aside.
            self.buffered = self.buffered.saturating_sub(file.remaining);
            self.record_count();
        }
    }

    fn answer_drain_waiter(&mut self) {
        if self.drain_waiter.is_some()
            && let Some(step) = self.next_step()
            && let Some(waiter) = self.drain_waiter.take()
        {
            let _ = waiter.send(step);
        }
    }
}

/// Renames the file `<name>.journal.held`, and its drain's progress with it, where no drain looks:
/// its pushes were acknowledged and stay on disk, and the operator, having fixed the cause (the
/// broker's key, say), renames it back to be replayed at the next start.
fn set_aside(path: &Path) {
    let mut held = path.as_os_str().to_owned();
    held.push(HELD_SUFFIX);
    let held = PathBuf::from(held);
    if let Err(e) = std::fs::rename(path, &held) {
        tracing::error!(file = %path.display(), error = %e, "cannot set aside a push journal file");
        return;
    }
    match std::fs::rename(progress_path(path), progress_path(&held)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            tracing::error!(file = %held.display(), error = %e, "cannot set aside a push journal file's progress");
        }
        _ => {}
    }
    tracing::error!(
        file = %held.display(),
        "set aside a push journal file that cannot be replayed; rename it back (without .held) once the cause \
         is fixed, and restart the broker to replay it"
    );
}

fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        tracing::warn!(file = %path.display(), error = %e, "cannot delete a drained push journal file");
    }
    let progress = progress_path(path);
    if let Err(e) = std::fs::remove_file(&progress)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(file = %progress.display(), error = %e, "cannot delete a drained push journal file's progress");
    }
}

impl Actor for PushJournal {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.metrics.actors.with_label_values(&[ACTOR]).inc();
        self.metrics.actors_started.with_label_values(&[ACTOR]).inc();
        // Appends are bounded before they are sent (`Journal::append`); actix's own capacity is
        // off, so that the drain's and the status's requests never wait behind it.
        ctx.set_mailbox_capacity(0);
    }
}

impl Handler<Append> for PushJournal {
    type Result = ();

    fn handle(&mut self, msg: Append, ctx: &mut Self::Context) {
        if !self.route.maintenance() && self.is_empty() {
            let _ = msg.reply.send(Err(JournalError::Declined));
            return;
        }
        self.route.set_holding(true);
        self.metrics.actor_queued.with_label_values(&[ACTOR]).inc();
        self.queue.push(Pending { items: vec![msg.record], reply: msg.reply, place: msg.place });
        self.write_next(ctx);
    }
}

impl Handler<NextToDrain> for PushJournal {
    type Result = ();

    fn handle(&mut self, msg: NextToDrain, _: &mut Self::Context) {
        match self.next_step() {
            Some(step) => {
                let _ = msg.reply.send(step);
            }
            None => self.drain_waiter = Some(msg.reply),
        }
    }
}

impl Handler<Replayed> for PushJournal {
    type Result = ();

    fn handle(&mut self, msg: Replayed, _: &mut Self::Context) {
        if let Some(file) = self.sealed.front_mut() {
            let messages = msg.messages.min(file.remaining);
            file.remaining -= messages;
            self.buffered = self.buffered.saturating_sub(messages);
            self.record_count();
        }
    }
}

impl Handler<FileDrained> for PushJournal {
    type Result = ();

    fn handle(&mut self, msg: FileDrained, _: &mut Self::Context) {
        self.let_go(&msg.path, false);
    }
}

impl Handler<FileSetAside> for PushJournal {
    type Result = ();

    fn handle(&mut self, msg: FileSetAside, _: &mut Self::Context) {
        self.let_go(&msg.path, true);
    }
}

impl Handler<DrainHealth> for PushJournal {
    type Result = ();

    fn handle(&mut self, msg: DrainHealth, _: &mut Self::Context) {
        self.drain_failing = !msg.healthy;
    }
}

impl Handler<Status> for PushJournal {
    type Result = MessageResult<Status>;

    fn handle(&mut self, _: Status, _: &mut Self::Context) -> Self::Result {
        MessageResult(JournalStatus {
            buffered_messages: self.buffered,
            healthy: !self.write_failed && !self.drain_failing && self.set_aside_files == 0,
        })
    }
}

/// The journal as the broker's operations use it.
#[derive(Clone)]
pub struct Journal {
    addr: Addr<PushJournal>,
    pub dir: PathBuf,
    /// The push requests the journal holds.
    appends: Arc<Bound>,
}

fn gone(e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(format!("the push journal did not answer: {e}"))
}

impl Journal {
    pub fn start(journal: PushJournal) -> Self {
        let dir = journal.dir.clone();
        let appends = Bound::new(Limited::Journal, MAX_APPENDS, &journal.metrics);
        Self { addr: journal.start(), dir, appends }
    }

    /// Whether no push request waits for the journal.
    pub fn is_idle(&self) -> bool {
        self.appends.held() == 0
    }

    /// Journals one push request's record; `Ok` once it is durable.
    pub async fn append(&self, record: Record) -> Result<(), JournalError> {
        let place = self.appends.hold(1)?;
        let (reply, answer) = oneshot::channel();
        self.addr.do_send(Append { record, reply, place });
        answer.await.map_err(gone)?.map(drop)
    }

    pub async fn next_to_drain(&self) -> Result<DrainStep, JournalError> {
        let (reply, answer) = oneshot::channel();
        self.addr.send(NextToDrain { reply }).await.map_err(gone)?;
        answer.await.map_err(gone)
    }

    pub fn replayed(&self, messages: u64) {
        self.addr.do_send(Replayed { messages });
    }

    pub fn file_drained(&self, path: PathBuf) {
        self.addr.do_send(FileDrained { path });
    }

    pub fn file_set_aside(&self, path: PathBuf) {
        self.addr.do_send(FileSetAside { path });
    }

    pub fn drain_health(&self, healthy: bool) {
        self.addr.do_send(DrainHealth { healthy });
    }

    pub async fn status(&self) -> Result<JournalStatus, JournalError> {
        self.addr.send(Status).await.map_err(gone)
    }
}

#[cfg(test)]
mod tests {
    use queen_log::{Frame, encode_record};
    use uuid::Uuid;

    use super::*;

    fn scratch_dir() -> PathBuf {
        std::env::temp_dir().join(format!("queen-journal-{}", Uuid::new_v4().simple()))
    }

    fn config(dir: &Path) -> BufferConfig {
        BufferConfig { dir: dir.to_owned(), ..BufferConfig::default() }
    }

    fn record(transaction_ids: &[&str]) -> Vec<u8> {
        let entries: Vec<JournalEntry<'_>> = transaction_ids
            .iter()
            .map(|transaction_id| JournalEntry {
                queue: "q",
                partition: "p",
                frame: Frame {
                    message_id: Uuid::now_v7(),
                    trace_id: None,
                    transaction_id,
                    producer: None,
                    payload: b"1",
                },
            })
            .collect();
        let mut bytes = Vec::new();
        encode_record(&entries, &mut bytes).expect("encodes");
        bytes
    }

    fn transaction_ids(path: &Path) -> Vec<String> {
        let contents = JournalContents::read(path).expect("readable");
        contents.records().flatten().map(|entry| entry.frame.transaction_id.to_owned()).collect()
    }

    #[test]
    fn recovery_counts_what_is_readable_and_skips_torn_and_corrupt_records() {
        let dir = scratch_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let mut first = JOURNAL_MAGIC.to_vec();
        first.extend(record(&["a", "b"]));
        let mut corrupt = record(&["c"]);
        let last = corrupt.len() - 1;
        corrupt[last] ^= 1;
        first.extend(corrupt);
        first.extend(record(&["d"]));
        let torn = record(&["e"]);
        first.extend(&torn[..torn.len() - 3]);
        std::fs::write(dir.join("00000000000000000001.journal"), &first).unwrap();
        std::fs::write(dir.join("00000000000000000007.journal"), JOURNAL_MAGIC).unwrap();
        std::fs::write(dir.join("notes.txt"), "not a journal").unwrap();

        let found = FoundJournal::recover(&config(&dir)).expect("recovers");
        let counts: Vec<u64> = found.sealed.iter().map(|file| file.remaining).collect();
        assert_eq!(counts, [3], "a, b and d; c is corrupt, e torn; the empty file is dropped");
        assert_eq!(transaction_ids(&found.sealed[0].path), ["a", "b", "d"]);
        assert_eq!(found.next_sequence, 8, "new files never reuse a sequence");
        assert!(!dir.join("00000000000000000007.journal").exists());

        let error = FoundJournal::recover(&config(&dir)).err().expect("the directory is locked");
        assert!(error.to_string().contains("in use by another broker"), "{error}");
        drop(found);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_directory_is_left_alone() {
        let dir = scratch_dir();
        let found = FoundJournal::recover(&config(&dir)).expect("recovers");
        assert!(found.sealed.is_empty() && found.lock.is_none());
        assert!(!dir.exists(), "a broker that never buffers writes nothing");
    }

    #[actix_rt::test]
    async fn appends_are_held_until_drained_and_declined_afterwards() {
        let dir = scratch_dir();
        let route = Arc::new(PushRoute::default());
        let found = FoundJournal::recover(&config(&dir)).expect("recovers");
        let journal = Journal::start(PushJournal::new(found, Arc::clone(&route), Arc::new(Metrics::default())));
        let append =
            |ids: &'static [&'static str]| journal.append(Record { bytes: record(ids), messages: ids.len() as u64 });

        assert!(matches!(append(&["early"]).await, Err(JournalError::Declined)), "off and empty: to the log");
        route.set_maintenance(true);
        assert!(route.to_journal());
        let (one, two) = futures::join!(append(&["a", "b"]), append(&["c"]));
        assert!(one.is_ok() && two.is_ok());
        assert_eq!(journal.status().await.unwrap(), JournalStatus { buffered_messages: 3, healthy: true });
        assert_eq!(journal.next_to_drain().await.unwrap(), DrainStep::Paused);

        route.set_maintenance(false);
        assert!(route.to_journal(), "still holding pushes");
        let DrainStep::File(path) = journal.next_to_drain().await.unwrap() else { panic!("a file to drain") };
        append(&["d"]).await.expect("appended behind the file being drained");
        assert_eq!(transaction_ids(&path), ["a", "b", "c"]);
        journal.replayed(3);
        journal.file_drained(path.clone());
        let DrainStep::File(next) = journal.next_to_drain().await.unwrap() else { panic!("the file appended to") };
        assert!(!path.exists(), "a drained file is deleted");
        assert_eq!(transaction_ids(&next), ["d"]);
        journal.file_drained(next);
        assert_eq!(journal.next_to_drain().await.unwrap(), DrainStep::Done);
        assert!(!route.to_journal(), "pushes go to the log again");
        assert!(matches!(append(&["late"]).await, Err(JournalError::Declined)));
        assert_eq!(journal.status().await.unwrap().buffered_messages, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Past `buffer.max_bytes` a push is refused, not taken into files the volume may not hold;
    /// once a drained file is deleted, pushes are taken again.
    #[actix_rt::test]
    async fn the_journal_refuses_pushes_past_its_bound() {
        let dir = scratch_dir();
        let route = Arc::new(PushRoute::default());
        let one = record(&["a"]).len() as u64;
        // The header and two records, in files of one record each.
        let bounded =
            BufferConfig { file_max_bytes: 4096, max_bytes: JOURNAL_MAGIC.len() as u64 + 2 * one, ..config(&dir) };
        let found = FoundJournal::recover(&bounded).expect("recovers");
        let journal = Journal::start(PushJournal::new(found, Arc::clone(&route), Arc::new(Metrics::default())));
        let append =
            |ids: &'static [&'static str]| journal.append(Record { bytes: record(ids), messages: ids.len() as u64 });
        route.set_maintenance(true);
        append(&["a"]).await.expect("the first fits");
        append(&["b"]).await.expect("the second fits");
        let refused = append(&["c"]).await;
        assert!(matches!(refused, Err(JournalError::Full(_))), "{refused:?}");
        assert_eq!(journal.status().await.unwrap().buffered_messages, 2, "nothing of the refused push was kept");

        route.set_maintenance(false);
        let DrainStep::File(path) = journal.next_to_drain().await.unwrap() else { panic!("a file to drain") };
        journal.replayed(2);
        journal.file_drained(path);
        route.set_maintenance(true);
        append(&["c"]).await.expect("taken again once the journal was drained");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
