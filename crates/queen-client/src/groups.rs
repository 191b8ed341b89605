//! Consumer-group administration: listing with lag, deletion, subscription and seek.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use crate::transport::{Replay, Request, seg};
use crate::{Client, Error};

/// A consumer group and its lag on each queue it reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct GroupSummary {
    /// The group (`__QUEUE_MODE__` for queue mode).
    pub name: String,
    /// Per queue.
    pub queues: Vec<GroupQueueLag>,
    /// Unread messages, over every queue.
    pub total_lag: i64,
    /// Age of the oldest unread message, over every queue, in seconds.
    pub max_lag_seconds: f64,
}

/// A group on one queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct GroupQueueLag {
    /// The queue.
    pub queue: String,
    /// Partitions the group has a cursor on.
    pub partitions: usize,
    /// Unread messages.
    pub lag_messages: i64,
    /// Age of the oldest unread message, in seconds.
    pub lag_seconds: f64,
    /// Partitions leased to the group's consumers now.
    pub active_leases: usize,
    /// Messages the group has committed.
    pub total_consumed: i64,
    /// The group's last commit.
    #[serde(default)]
    pub last_consumed_at: Option<DateTime<Utc>>,
    /// How it subscribed (`all`, `new`, or a timestamp mode), when registered.
    #[serde(default)]
    pub subscription_mode: Option<String>,
    /// Where it subscribed from.
    #[serde(default)]
    pub subscription_from: Option<DateTime<Utc>>,
    /// Registered as conflating: it is served only the newest message of each partition.
    #[serde(default)]
    pub conflation: bool,
}

/// A group, its lag per queue and its cursor on every partition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct GroupDetail {
    /// The summary.
    #[serde(flatten)]
    pub summary: GroupSummary,
    /// Every cursor.
    pub partitions: Vec<PartitionLag>,
}

/// A group's cursor on one partition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct PartitionLag {
    /// The queue.
    pub queue: String,
    /// The partition's name.
    pub partition: String,
    /// The partition's id.
    pub partition_id: String,
    /// The last committed offset.
    pub committed: i64,
    /// The partition's last offset.
    pub last_offset: i64,
    /// Unread messages.
    pub lag_messages: i64,
    /// Age of the oldest unread message, in seconds.
    pub lag_seconds: f64,
    /// Whether a consumer holds the partition now.
    pub lease_active: bool,
    /// When that lease expires.
    #[serde(default)]
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Messages committed.
    pub total_consumed: i64,
    /// The last commit.
    #[serde(default)]
    pub last_consumed_at: Option<DateTime<Utc>>,
    /// Failures counted against the head message.
    pub retry_count: i32,
    /// Redeliveries of the head message.
    pub redelivery_count: i32,
}

/// A cursor lagging behind, with its group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct LaggingCursor {
    /// The group.
    pub consumer_group: String,
    /// The cursor.
    #[serde(flatten)]
    pub partition: PartitionLag,
}

/// The answer to a group deletion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct GroupDeleted {
    /// The group.
    pub consumer_group: String,
    /// The queue, for a deletion on one queue.
    #[serde(default)]
    pub queue: Option<String>,
    /// Cursors deleted.
    pub deleted_partitions: u64,
    /// Whether its registration (where it subscribed from) was deleted too.
    pub metadata_deleted: bool,
}

/// The answer to a subscription update.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct SubscriptionUpdated {
    /// The group.
    pub consumer_group: String,
    /// Where it now starts on partitions it has not read.
    pub new_timestamp: DateTime<Utc>,
    /// Registrations updated.
    pub rows_updated: usize,
    /// The queues it is registered on.
    pub queues: Vec<String>,
}

/// Where a seek moves a group's cursors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SeekTarget {
    /// Past the newest message: what is stored now is skipped.
    End,
    /// Just before the first message stored at or after this time (earlier than everything:
    /// the oldest retained message; later than everything: the end).
    Time(DateTime<Utc>),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SeekBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    to_end: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<String>,
}

/// The answer to a seek.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Seeked {
    /// The group.
    pub consumer_group: String,
    /// The queue.
    pub queue: String,
    /// Whether it went to the end.
    pub seek_to_end: bool,
    /// The time it went to.
    #[serde(default)]
    pub target_timestamp: Option<DateTime<Utc>>,
    /// Partitions moved.
    pub partitions_updated: usize,
    /// Each partition's cursor after the seek.
    pub partitions: Vec<SeekedPartition>,
}

/// One partition's cursor after a seek.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct SeekedPartition {
    /// The partition's id.
    pub partition_id: String,
    /// Its name.
    pub partition: String,
    /// The committed offset now.
    pub committed: i64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SubscriptionBody {
    subscription_timestamp: String,
}

impl Client {
    /// Every consumer group, with its lag per queue (queue mode included).
    pub async fn consumer_groups(&self) -> Result<Vec<GroupSummary>, Error> {
        self.call(Request::get("/api/v1/consumer-groups".into())).await
    }

    /// One consumer group with every cursor; [`Error::Status`] 404 when it has none and is
    /// registered nowhere.
    pub async fn consumer_group(&self, group: &str) -> Result<GroupDetail, Error> {
        self.call(Request::get(format!("/api/v1/consumer-groups/{}", seg(group)))).await
    }

    /// Cursors with unread messages at least `min_lag_seconds` old.
    pub async fn lagging_groups(&self, min_lag_seconds: u64) -> Result<Vec<LaggingCursor>, Error> {
        self.call(Request::get("/api/v1/consumer-groups/lagging".into()).query("minLagSeconds", min_lag_seconds)).await
    }

    /// Deletes a group's cursors on every queue (and so its leases); with `delete_metadata`, its
    /// registrations too, so that its next pop subscribes afresh.
    pub async fn delete_consumer_group(&self, group: &str, delete_metadata: bool) -> Result<GroupDeleted, Error> {
        let path = format!("/api/v1/consumer-groups/{}", seg(group));
        self.call(Request::delete(path).query("deleteMetadata", delete_metadata).replay(Replay::IfUnapplied)).await
    }

    /// Deletes a group's cursors (and with `delete_metadata` its registration) on one queue.
    pub async fn delete_consumer_group_on_queue(
        &self,
        group: &str,
        queue: &str,
        delete_metadata: bool,
    ) -> Result<GroupDeleted, Error> {
        let path = format!("/api/v1/consumer-groups/{}/queues/{}", seg(group), seg(queue));
        self.call(Request::delete(path).query("deleteMetadata", delete_metadata).replay(Replay::IfUnapplied)).await
    }

    /// Sets where a registered group starts on partitions it has not read yet; [`Error::Status`]
    /// 404 when it is registered on no queue.
    pub async fn update_subscription(&self, group: &str, at: DateTime<Utc>) -> Result<SubscriptionUpdated, Error> {
        let body = SubscriptionBody { subscription_timestamp: at.to_rfc3339_opts(SecondsFormat::Micros, true) };
        let path = format!("/api/v1/consumer-groups/{}/subscription", seg(group));
        self.call(Request::post(path).json(&body)?).await
    }

    /// Moves a group's cursor on every partition of `queue` (creating missing ones), releasing
    /// its leases there: back to re-read, or to the end to skip a backlog.
    ///
    /// ```no_run
    /// # async fn example(client: queen_client::Client) -> Result<(), queen_client::Error> {
    /// use queen_client::SeekTarget;
    ///
    /// // Skip everything `billing` has not read on `orders` yet.
    /// let seeked = client.seek("billing", "orders", SeekTarget::End).await?;
    /// println!("{} partitions moved", seeked.partitions_updated);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn seek(&self, group: &str, queue: &str, target: SeekTarget) -> Result<Seeked, Error> {
        let path = format!("/api/v1/consumer-groups/{}/queues/{}/seek", seg(group), seg(queue));
        self.call(Request::post(path).json(&seek_body(target))?.replay(Replay::IfUnapplied)).await
    }

    /// Moves a group's cursor on one partition of `queue`, by the partition's id.
    pub async fn seek_partition(
        &self,
        group: &str,
        queue: &str,
        partition_id: &str,
        target: SeekTarget,
    ) -> Result<Seeked, Error> {
        let path = format!(
            "/api/v1/consumer-groups/{}/queues/{}/partitions/{}/seek",
            seg(group),
            seg(queue),
            seg(partition_id)
        );
        let request = match target {
            // On this route an empty body means the end.
            SeekTarget::End => Request::post(path),
            SeekTarget::Time(_) => Request::post(path).json(&seek_body(target))?,
        };
        self.call(request.replay(Replay::IfUnapplied)).await
    }
}

fn seek_body(target: SeekTarget) -> SeekBody {
    match target {
        SeekTarget::End => SeekBody { to_end: Some(true), timestamp: None },
        SeekTarget::Time(at) => {
            SeekBody { to_end: None, timestamp: Some(at.to_rfc3339_opts(SecondsFormat::Micros, true)) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_answers_read_as_the_broker_writes_them() {
        let detail = r#"{"name":"g","queues":[{"queue":"q","partitions":1,"lagMessages":2,"lagSeconds":1.5,"activeLeases":0,
            "totalConsumed":3,"lastConsumedAt":null,"subscriptionMode":"all","subscriptionFrom":null}],"totalLag":2,"maxLagSeconds":1.5,
            "partitions":[{"queue":"q","partition":"p","partitionId":"7","committed":3,"lastOffset":5,"lagMessages":2,"lagSeconds":1.5,
            "leaseActive":false,"leaseExpiresAt":null,"totalConsumed":3,"lastConsumedAt":"2026-07-29T14:00:00.000001Z","retryCount":0,"redeliveryCount":0}]}"#;
        let detail: GroupDetail = serde_json::from_str(detail).unwrap();
        assert_eq!(detail.summary.total_lag, 2);
        assert_eq!(detail.partitions[0].last_offset, 5);
        assert_eq!(serde_json::to_string(&seek_body(SeekTarget::End)).unwrap(), r#"{"toEnd":true}"#);
    }
}
