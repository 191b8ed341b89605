//! Dead letters and message lookup.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::transport::{Replay, Request, seg};
use crate::{Client, Error};

/// Which dead letters to list: filters and a page.
///
/// ```
/// use queen_client::DeadLetterQuery;
///
/// let query = DeadLetterQuery::new().queue("orders").consumer_group("billing").limit(50).offset(100);
/// # let _ = query;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct DeadLetterQuery {
    queue: Option<String>,
    consumer_group: Option<String>,
    partition: Option<String>,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    limit: Option<u32>,
    offset: Option<u64>,
}

impl DeadLetterQuery {
    /// Every dead letter, the first page (100).
    pub fn new() -> DeadLetterQuery {
        DeadLetterQuery::default()
    }

    /// Of this queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Of this consumer group.
    pub fn consumer_group(mut self, group: impl Into<String>) -> Self {
        self.consumer_group = Some(group.into());
        self
    }

    /// Of this partition (by name).
    pub fn partition(mut self, partition: impl Into<String>) -> Self {
        self.partition = Some(partition.into());
        self
    }

    /// Dead-lettered at or after this time.
    pub fn from(mut self, from: DateTime<Utc>) -> Self {
        self.from = Some(from);
        self
    }

    /// Dead-lettered at or before this time.
    pub fn to(mut self, to: DateTime<Utc>) -> Self {
        self.to = Some(to);
        self
    }

    /// At most this many (1 to 1000; default 100).
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Skipping this many (newest first).
    pub fn offset(mut self, offset: u64) -> Self {
        self.offset = Some(offset);
        self
    }

    fn request(&self) -> Request {
        let time = |at: &DateTime<Utc>| at.to_rfc3339_opts(SecondsFormat::Micros, true);
        Request::get("/api/v1/dlq".into())
            .query_opt("queue", self.queue.as_ref())
            .query_opt("consumerGroup", self.consumer_group.as_ref())
            .query_opt("partition", self.partition.as_ref())
            .query_opt("from", self.from.as_ref().map(time))
            .query_opt("to", self.to.as_ref().map(time))
            .query_opt("limit", self.limit)
            .query_opt("offset", self.offset)
    }
}

/// A page of dead letters, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeadLetterPage {
    /// The dead letters.
    pub messages: Vec<DeadLetter>,
    /// How many match the filters, over every page.
    pub total: i64,
    /// The page size.
    pub limit: i64,
    /// The page's start.
    pub offset: i64,
}

/// A message a consumer group gave up on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct DeadLetter {
    /// The message's id; `None` (with `data` and `created_at`) when retention removed the message
    /// before it was copied.
    #[serde(default)]
    pub id: Option<Uuid>,
    /// The dead letter's own id.
    pub dead_letter_id: i64,
    /// The message's transaction id.
    #[serde(default)]
    pub transaction_id: Option<String>,
    /// The message's trace id.
    #[serde(default)]
    pub trace_id: Option<Uuid>,
    /// Who pushed the message.
    #[serde(default)]
    pub producer_sub: Option<String>,
    /// Its queue.
    pub queue: String,
    /// Its partition's name.
    pub partition: String,
    /// Its partition's id.
    pub partition_id: String,
    /// Its offset.
    pub offset: i64,
    /// The group that gave up on it.
    pub consumer_group: String,
    /// The last failure's error text.
    #[serde(default)]
    pub error_message: Option<String>,
    /// Failures counted.
    pub retry_count: i32,
    /// The payload.
    #[serde(default)]
    pub data: Option<Box<RawValue>>,
    /// When the message was stored.
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
    /// When it was dead-lettered.
    pub failed_at: DateTime<Utc>,
}

impl DeadLetter {
    /// The payload decoded as `T`; `None` when it was not kept.
    pub fn json<T: DeserializeOwned>(&self) -> Option<Result<T, serde_json::Error>> {
        self.data.as_ref().map(|data| serde_json::from_str(data.get()))
    }
}

/// The answer to re-queuing a message's dead letters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Requeued {
    /// `moved` (pushed again as a new message) or `duplicate` (already pushed again before).
    pub result: String,
    /// The queue.
    pub queue: String,
    /// The partition's id.
    pub partition_id: String,
    /// The new message's transaction id (`dlq:<dead letter id>`).
    pub transaction_id: String,
    /// The new message's id.
    pub message_id: Uuid,
    /// The new message's offset.
    pub offset: i64,
    /// Dead letters removed.
    pub dead_letters: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeletedDeadLetters {
    deleted_dead_letters: u64,
}

/// A stored message and every consumer group's progress over it.
// The fields of `StoredMessage` are repeated rather than flattened in: serde's `flatten` buffers
// the members, and a buffered `RawValue` payload cannot be read back.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MessageStatus {
    /// The message id.
    pub id: Uuid,
    /// Its transaction id.
    pub transaction_id: String,
    /// Its trace id.
    #[serde(default)]
    pub trace_id: Option<Uuid>,
    /// Who pushed it.
    #[serde(default)]
    pub producer_sub: Option<String>,
    /// Its queue.
    pub queue: String,
    /// Its partition's name.
    pub partition: String,
    /// Its partition's id.
    pub partition_id: String,
    /// Its offset.
    pub offset: i64,
    /// When it was stored.
    pub created_at: DateTime<Utc>,
    /// The payload.
    pub data: Box<RawValue>,
    /// The queue's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The queue's task.
    #[serde(default)]
    pub task: Option<String>,
    /// `completed` when every group with a cursor on the partition has passed it, `processing`
    /// while a lease holds it, `pending` otherwise.
    pub status: String,
    /// Every group with a cursor on its partition.
    pub consumer_groups: Vec<GroupProgress>,
}

impl MessageStatus {
    /// The payload decoded as `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.data.get())
    }
}

/// One group's progress over a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct GroupProgress {
    /// The group.
    pub name: String,
    /// Whether its cursor is at or past the message.
    pub consumed: bool,
    /// When the lease covering the message expires, while one does.
    #[serde(default)]
    pub lease_expires_at: Option<DateTime<Utc>>,
}

impl Client {
    /// Lists dead letters, newest first.
    pub async fn dead_letters(&self, query: &DeadLetterQuery) -> Result<DeadLetterPage, Error> {
        self.call(query.request()).await
    }

    /// Pushes a message's dead letters back into its partition as one new message (transaction
    /// id `dlq:<dead letter id>`), to be consumed again; [`Error::Status`] 404 when it has none.
    ///
    /// Not sent again after an attempt whose outcome is unknown: a repeat of one that applied
    /// would answer 404.
    pub async fn retry_dead_letter(&self, partition_id: &str, transaction_id: &str) -> Result<Requeued, Error> {
        let path = format!("/api/v1/messages/{}/{}/retry", seg(partition_id), seg(transaction_id));
        self.call(Request::post(path).replay(Replay::IfUnapplied)).await
    }

    /// Deletes a message's dead letters (never the message itself); how many.
    /// [`Error::Status`] 404 when it has none. Not sent again after an attempt whose outcome is
    /// unknown.
    pub async fn delete_dead_letters(&self, partition_id: &str, transaction_id: &str) -> Result<u64, Error> {
        let path = format!("/api/v1/messages/{}/{}", seg(partition_id), seg(transaction_id));
        let deleted: DeletedDeadLetters = self.call(Request::delete(path).replay(Replay::IfUnapplied)).await?;
        Ok(deleted.deleted_dead_letters)
    }

    /// A stored message, by its partition id and transaction id, with every group's progress;
    /// [`Error::Status`] 404 when there is none.
    pub async fn message(&self, partition_id: &str, transaction_id: &str) -> Result<MessageStatus, Error> {
        self.call(Request::get(format!("/api/v1/messages/{}/{}", seg(partition_id), seg(transaction_id)))).await
    }
}
