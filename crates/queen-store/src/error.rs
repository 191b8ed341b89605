use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;

static UNAVAILABLE: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);
static READ_ONLY: AtomicU64 = AtomicU64::new(0);
static DISK_FULL: AtomicU64 = AtomicU64::new(0);
static UNANSWERED: AtomicU64 = AtomicU64::new(0);

/// Database failures seen by this process since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureCounts {
    /// PostgreSQL could not be reached, or no connection was free in time.
    pub unavailable: u64,
    /// PostgreSQL refused a statement (other than the writes counted below).
    pub refused: u64,
    /// PostgreSQL refused a write because it is read-only ([`WriteRefusal::ReadOnly`]).
    pub read_only: u64,
    /// PostgreSQL refused a write because it is out of disk space ([`WriteRefusal::DiskFull`]).
    pub disk_full: u64,
    /// PostgreSQL did not answer a write in time ([`StoreError::Unanswered`]).
    pub unanswered: u64,
}

impl FailureCounts {
    /// Failures of every kind.
    pub fn total(&self) -> u64 {
        self.unavailable + self.refused + self.read_only + self.disk_full + self.unanswered
    }
}

pub fn failure_counts() -> FailureCounts {
    FailureCounts {
        unavailable: UNAVAILABLE.load(Ordering::Relaxed),
        refused: REFUSED.load(Ordering::Relaxed),
        read_only: READ_ONLY.load(Ordering::Relaxed),
        disk_full: DISK_FULL.load(Ordering::Relaxed),
        unanswered: UNANSWERED.load(Ordering::Relaxed),
    }
}

/// What went wrong talking to PostgreSQL.
#[derive(Debug, Error)]
pub enum StoreError {
    /// PostgreSQL cannot be reached, or the pool could not hand out a connection in time. The
    /// broker answers 503 and recovers when the database is back.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// PostgreSQL did not answer a write within `waited`: its commit may be waiting on a
    /// synchronous standby or the WAL disk, which PostgreSQL never times out. Whether it took
    /// effect is unknown; its connection is taken out of the pool ([`crate::pool::discard`]).
    #[error(
        "PostgreSQL did not answer {what} within {} ms, and its connection was closed; whether it took effect is unknown",
        waited.as_millis()
    )]
    Unanswered { what: &'static str, waited: std::time::Duration },
    /// The connection was lost while PostgreSQL ran a statement that commits (an autocommit
    /// write, a `COMMIT`): it may have committed or not.
    #[error("the connection was lost while PostgreSQL ran {what}; whether it took effect is unknown")]
    Interrupted { what: &'static str },
    #[error("database error: {0}")]
    Db(tokio_postgres::Error),
    /// PostgreSQL answers but refuses to write, for now: nothing of the statement's transaction
    /// was written. The broker answers 503 (saying why) and recovers when writes are taken again;
    /// `detail` is PostgreSQL's own message, for the log.
    #[error("{}: {detail}", refusal.message())]
    WritesRefused { refusal: WriteRefusal, detail: String },
    /// TLS with PostgreSQL could not be set up and trying again will not help: its certificate
    /// was refused (wrong CA, wrong host name), it refused ours, or it offers no TLS where the
    /// mode requires it. Unavailable as far as requests go (503); start-up stops on it at once.
    #[error("TLS to PostgreSQL: {0}")]
    Tls(String),
    #[error("schema: {0}")]
    Schema(String),
    /// The row an operation needs is gone, e.g. its queue was deleted concurrently.
    #[error("{0} not found")]
    Missing(&'static str),
    #[error("segment {base_offset} of partition {partition_id} is unreadable: {source}")]
    CorruptSegment {
        partition_id: i64,
        base_offset: i64,
        #[source]
        source: queen_log::DecodeError,
    },
    #[error("dead letter {id} is unreadable: {source}")]
    SealedDeadLetter {
        id: i64,
        #[source]
        source: queen_log::DecodeError,
    },
    #[error("cannot encode message: {0}")]
    Encode(#[from] queen_log::EncodeError),
    /// Something is encrypted (a queue to write, a segment or dead letter to read) and this broker
    /// was started without the key: it neither writes plain text nor can read.
    // Says "connection": the official consume loop retries an error that does, and stops on others.
    #[error(
        "{subject} is encrypted and this broker has no encryption key (QUEEN_ENCRYPTION_KEY); retry on a broker \
         that has it (a new connection may reach one)"
    )]
    NoEncryptionKey { subject: String },
    /// Creating what was asked would pass a limit of the fleet (counted in PostgreSQL); nothing
    /// was created.
    #[error(transparent)]
    LimitReached(#[from] LimitReached),
}

/// Why PostgreSQL refuses writes while it still answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteRefusal {
    /// SQLSTATE 25006 `read_only_sql_transaction`: `default_transaction_read_only` is on (an
    /// operator fencing the database), or the server is a hot standby.
    ReadOnly,
    /// SQLSTATE 53100 `disk_full`: a relation (or a temporary file) could not be extended.
    DiskFull,
}

impl WriteRefusal {
    /// What PostgreSQL refusing `e` refuses, if it is a write refusal.
    pub fn of(e: &tokio_postgres::Error) -> Option<WriteRefusal> {
        use tokio_postgres::error::SqlState;
        match e.code()? {
            code if *code == SqlState::READ_ONLY_SQL_TRANSACTION => Some(WriteRefusal::ReadOnly),
            code if *code == SqlState::DISK_FULL => Some(WriteRefusal::DiskFull),
            _ => None,
        }
    }

    /// What a client is told (and the log says).
    pub fn message(self) -> &'static str {
        match self {
            WriteRefusal::ReadOnly => "PostgreSQL is read-only and not accepting writes",
            WriteRefusal::DiskFull => "PostgreSQL is out of disk space and not accepting writes",
        }
    }
}

/// What a creation limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Creation {
    /// Queues of the fleet.
    Queues,
    /// Partitions of one queue.
    Partitions,
    /// Consumer groups of one queue (queue mode not counted).
    Groups,
}

/// A creation refused by a limit: `held` exist, `adding` more were asked for, `max` may exist.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{what:?} limit reached: {held} exist{}, {adding} more asked for, at most {max}", queue.as_ref().map(|q| format!(" in queue {q:?}")).unwrap_or_default())]
pub struct LimitReached {
    pub what: Creation,
    /// The queue whose partitions or groups are counted; `None` for queues.
    pub queue: Option<String>,
    pub held: i64,
    pub adding: i64,
    pub max: i64,
}

impl StoreError {
    /// A write PostgreSQL did not answer within `waited`, counted.
    pub fn unanswered(what: &'static str, waited: std::time::Duration) -> Self {
        UNANSWERED.fetch_add(1, Ordering::Relaxed);
        StoreError::Unanswered { what, waited }
    }

    /// What the failure of a statement that commits (an autocommit write, a `COMMIT`) is: a
    /// connection lost while it ran leaves its outcome unknown ([`StoreError::Interrupted`]),
    /// where a lost connection before it is a clean failure, nothing written.
    pub fn of_commit(self, what: &'static str) -> Self {
        match self {
            StoreError::Unavailable(_) => StoreError::Interrupted { what },
            StoreError::Db(e) if is_connection_failure(&e) => StoreError::Interrupted { what },
            other => other,
        }
    }

    /// Whether the outcome of the write that failed is unknown: it may have committed.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, StoreError::Unanswered { .. } | StoreError::Interrupted { .. })
    }

    /// Whether the failure is the database being unreachable or going away, or too slow to
    /// answer in time (as opposed to a statement that PostgreSQL refused).
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Unavailable(_)
            | StoreError::Tls(_)
            | StoreError::Unanswered { .. }
            | StoreError::Interrupted { .. } => true,
            StoreError::Db(e) => is_connection_failure(e) || is_transient(e),
            _ => false,
        }
    }
}

/// A statement PostgreSQL cancelled because it ran past `statement_timeout` (57014, which a
/// cancel request also gives) or waited past `lock_timeout` (55P03), or whose transaction it
/// chose to end a deadlock (40P01) or a serialization conflict (40001), or that ran out of a
/// resource of the server (class 53 but a full disk: memory, shared memory, a configured limit):
/// the database is stalled, short of something, or other sessions hold or change what the
/// statement needs. Its transaction is rolled back, so nothing of it is left, the connection
/// stays usable, and the same request may succeed later: a 503, not a 500.
fn is_transient(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code().is_some_and(|code| {
        [
            SqlState::QUERY_CANCELED,
            SqlState::LOCK_NOT_AVAILABLE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::INSUFFICIENT_RESOURCES,
            SqlState::OUT_OF_MEMORY,
            SqlState::CONFIGURATION_LIMIT_EXCEEDED,
        ]
        .contains(code)
    })
}

fn is_connection_failure(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        let code = code.code();
        // Class 08: connection exception; 57P0x: admin/crash shutdown, cannot connect now; 53300:
        // no connection slot left (max_connections, or a role's or database's limit).
        return code.starts_with("08") || code.starts_with("57P") || code == "53300";
    }
    // No SQLSTATE: an IO failure on the wire, or a failure to connect at all, is the database
    // being away; anything else (a parameter that did not serialize, say) is a bug of ours.
    let io = std::error::Error::source(e).is_some_and(|source| source.is::<std::io::Error>());
    io || e.to_string().starts_with("error connecting") || e.to_string().contains("timed out")
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        if let Some(reason) = crate::tls::refusal(&e) {
            UNAVAILABLE.fetch_add(1, Ordering::Relaxed);
            StoreError::Tls(reason)
        } else if is_connection_failure(&e) {
            UNAVAILABLE.fetch_add(1, Ordering::Relaxed);
            crate::pool::connection_lost();
            StoreError::Unavailable(e.to_string())
        } else if let Some(refusal) = WriteRefusal::of(&e) {
            let counter = match refusal {
                WriteRefusal::ReadOnly => {
                    crate::pool::writes_refused_read_only();
                    &READ_ONLY
                }
                WriteRefusal::DiskFull => &DISK_FULL,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            let detail = e.as_db_error().map_or_else(|| e.to_string(), |db| db.message().to_owned());
            StoreError::WritesRefused { refusal, detail }
        } else {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            StoreError::Db(e)
        }
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            // Opening a connection failed on something PostgreSQL said that is no connection
            // failure on a live session: it refuses new connections for now (a database with
            // ALLOW_CONNECTIONS off while it is restored, 55000). Away for now, as an unreachable
            // server is; a refused login (class 28) stays the configuration's fault.
            deadpool_postgres::PoolError::Backend(e)
                if e.code().is_some_and(|code| !code.code().starts_with("28")) && !is_connection_failure(&e) =>
            {
                UNAVAILABLE.fetch_add(1, Ordering::Relaxed);
                StoreError::Unavailable(e.to_string())
            }
            deadpool_postgres::PoolError::Backend(e) => e.into(),
            other => {
                UNAVAILABLE.fetch_add(1, Ordering::Relaxed);
                StoreError::Unavailable(other.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_lost_under_a_commit_leaves_its_outcome_unknown() {
        let lost = StoreError::Unavailable("connection closed".into()).of_commit("an ack commit");
        assert!(matches!(lost, StoreError::Interrupted { what: "an ack commit" }), "{lost:?}");
        assert!(lost.outcome_unknown() && lost.is_unavailable());
        assert!(lost.to_string().contains("whether it took effect is unknown"), "{lost}");
        let refused = StoreError::Missing("queue").of_commit("an ack commit");
        assert!(matches!(refused, StoreError::Missing("queue")) && !refused.outcome_unknown());
    }
}
