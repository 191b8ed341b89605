//! Popping messages: [`Pop`], [`Client::pop`], [`Delivery`] and [`Message`].

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::framed_pop;
use crate::transport::{Replay, Request, seg};
use crate::{Client, Error};

/// The consumer group of consumers that name none ("queue mode"): one more group, reading every
/// message once, independent of the named groups.
pub const QUEUE_MODE_GROUP: &str = "__QUEUE_MODE__";

/// Where a consumer group that has never read a queue starts on it. Only a group's first pop on
/// a queue registers it; later settings change nothing (delete the group to start again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SubscriptionMode {
    /// At the oldest retained message: the whole backlog (the default).
    All,
    /// After the newest message: only what is pushed from now on.
    New,
}

impl SubscriptionMode {
    fn as_str(self) -> &'static str {
        match self {
            SubscriptionMode::All => "all",
            SubscriptionMode::New => "new",
        }
    }
}

/// Where a new consumer group starts, as a point in time. Wins over [`SubscriptionMode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SubscriptionFrom {
    /// From now: only what is pushed later.
    Now,
    /// From the first message stored at or after this time.
    Time(DateTime<Utc>),
}

/// Which messages a pop asks for: a queue (any partition, or one), or every queue of a
/// namespace and/or task; with how many, how long to wait, as which consumer group.
///
/// ```
/// use std::time::Duration;
/// use queen_client::{Pop, SubscriptionMode};
///
/// // Up to 100 messages from up to 4 partitions of `orders` under one lease, as group `billing`,
/// // waiting up to 10 s for something to arrive.
/// let pop = Pop::queue("orders")
///     .batch(100)
///     .partitions(4)
///     .group("billing")
///     .subscription_mode(SubscriptionMode::All)
///     .wait(Duration::from_secs(10));
/// # let _ = pop;
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Pop {
    pub(crate) target: PopTarget,
    pub(crate) batch: Option<u32>,
    pub(crate) partitions: Option<u32>,
    pub(crate) wait: Option<Duration>,
    pub(crate) group: Option<String>,
    pub(crate) auto_ack: bool,
    pub(crate) subscription_mode: Option<SubscriptionMode>,
    pub(crate) subscription_from: Option<SubscriptionFrom>,
    pub(crate) lease_seconds: Option<u32>,
    pub(crate) autopilot: bool,
    pub(crate) frames: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PopTarget {
    Queue { queue: String, partition: Option<String> },
    Labels { namespace: Option<String>, task: Option<String> },
}

impl Pop {
    fn new(target: PopTarget) -> Pop {
        Pop {
            target,
            batch: None,
            partitions: None,
            wait: None,
            group: None,
            auto_ack: false,
            subscription_mode: None,
            subscription_from: None,
            lease_seconds: None,
            autopilot: false,
            frames: false,
        }
    }

    /// A pop from any partition of `queue`.
    pub fn queue(queue: impl Into<String>) -> Pop {
        Pop::new(PopTarget::Queue { queue: queue.into(), partition: None })
    }

    /// A pop from one partition of `queue`.
    pub fn partition(queue: impl Into<String>, partition: impl Into<String>) -> Pop {
        Pop::new(PopTarget::Queue { queue: queue.into(), partition: Some(partition.into()) })
    }

    /// A pop from every queue of `namespace`, the queues of higher `priority` first.
    pub fn namespace(namespace: impl Into<String>) -> Pop {
        Pop::new(PopTarget::Labels { namespace: Some(namespace.into()), task: None })
    }

    /// A pop from every queue of `task`, the queues of higher `priority` first.
    pub fn task(task: impl Into<String>) -> Pop {
        Pop::new(PopTarget::Labels { namespace: None, task: Some(task.into()) })
    }

    /// A pop from every queue of `namespace` and `task`.
    pub fn namespace_task(namespace: impl Into<String>, task: impl Into<String>) -> Pop {
        Pop::new(PopTarget::Labels { namespace: Some(namespace.into()), task: Some(task.into()) })
    }

    /// At most this many messages in all (the broker's default is 1).
    pub fn batch(mut self, messages: u32) -> Pop {
        self.batch = Some(messages);
        self
    }

    /// At most this many partitions, all under one lease (default 1). Ignored by the
    /// one-partition route.
    pub fn partitions(mut self, partitions: u32) -> Pop {
        self.partitions = Some(partitions);
        self
    }

    /// Long poll: when nothing is available, wait up to `timeout` for messages to arrive (the
    /// broker answers as soon as some do). The request itself is given `timeout` plus the
    /// client's long-poll slack.
    pub fn wait(mut self, timeout: Duration) -> Pop {
        self.wait = Some(timeout);
        self
    }

    /// Answer at once, empty when nothing is available (the default).
    pub fn no_wait(mut self) -> Pop {
        self.wait = None;
        self
    }

    /// Pop as this consumer group (default: queue mode, [`QUEUE_MODE_GROUP`]).
    pub fn group(mut self, group: impl Into<String>) -> Pop {
        self.group = Some(group.into());
        self
    }

    /// Commit at delivery: no lease, no acknowledgement needed, and a message lost by the
    /// consumer is not delivered again (at most once).
    pub fn auto_ack(mut self, auto_ack: bool) -> Pop {
        self.auto_ack = auto_ack;
        self
    }

    /// Where the group starts if this is its first pop on the queue.
    pub fn subscription_mode(mut self, mode: SubscriptionMode) -> Pop {
        self.subscription_mode = Some(mode);
        self
    }

    /// Where the group starts if this is its first pop on the queue, as a time.
    pub fn subscription_from(mut self, from: SubscriptionFrom) -> Pop {
        self.subscription_from = Some(from);
        self
    }

    /// The lease of this pop lasts this many seconds instead of the queue's `leaseTime`.
    pub fn lease_seconds(mut self, seconds: u32) -> Pop {
        self.lease_seconds = Some(seconds);
        self
    }

    /// Let the broker choose `batch` and `partitions` where they are not set.
    pub fn autopilot(mut self, autopilot: bool) -> Pop {
        self.autopilot = autopilot;
        self
    }

    /// Ask for the answer in the framed binary format (QPF1, the official clients'
    /// `framed_pop`): the messages as stored frames instead of JSON objects, which costs both
    /// sides less per message. A broker that cannot frame an answer sends JSON, which is read as
    /// well.
    pub fn frames(mut self, framed: bool) -> Pop {
        self.frames = framed;
        self
    }

    /// The long-poll timeout, when this pop waits.
    pub fn wait_timeout(&self) -> Option<Duration> {
        self.wait
    }

    /// The consumer group, `None` for queue mode.
    pub fn consumer_group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    pub(crate) fn request(&self, client: &Client) -> Result<Request, Error> {
        let invalid = |what: &str| Err(Error::InvalidArgument(format!("a pop's {what} must be at least 1")));
        if self.batch == Some(0) {
            return invalid("batch");
        }
        if self.partitions == Some(0) {
            return invalid("partitions");
        }
        if self.lease_seconds == Some(0) {
            return invalid("lease seconds");
        }
        let mut request = match &self.target {
            PopTarget::Queue { queue, partition: None } => Request::get(format!("/api/v1/pop/queue/{}", seg(queue))),
            PopTarget::Queue { queue, partition: Some(partition) } => {
                Request::get(format!("/api/v1/pop/queue/{}/partition/{}", seg(queue), seg(partition)))
            }
            PopTarget::Labels { namespace, task } => {
                if namespace.is_none() && task.is_none() {
                    return Err(Error::InvalidArgument("a pop without a queue needs a namespace or a task".into()));
                }
                Request::get("/api/v1/pop".into())
                    .query_opt("namespace", namespace.as_ref())
                    .query_opt("task", task.as_ref())
            }
        };
        request = request.query_opt("batch", self.batch).query_opt("partitions", self.partitions);
        request = match self.wait {
            Some(timeout) => request
                .query("wait", "true")
                .query("timeout", timeout.as_millis())
                .timeout(timeout + client.inner.long_poll_slack),
            None => request.query("wait", "false"),
        };
        request = request.query_opt("consumerGroup", self.group.as_ref());
        if self.auto_ack {
            // Committed at delivery: a lost answer's messages are gone for the group, and a pop
            // sent again would take the next ones.
            request = request.query("autoAck", "true").replay(Replay::IfUnapplied);
        }
        request = request.query_opt("subscriptionMode", self.subscription_mode.map(SubscriptionMode::as_str));
        request = request.query_opt(
            "subscriptionFrom",
            self.subscription_from.map(|from| match from {
                SubscriptionFrom::Now => "now".to_owned(),
                SubscriptionFrom::Time(at) => at.to_rfc3339_opts(SecondsFormat::Micros, true),
            }),
        );
        request = request.query_opt("leaseSeconds", self.lease_seconds);
        if self.autopilot {
            request = request.query("autopilot", "true");
        }
        if self.frames {
            request = request.query("frames", "true");
        }
        Ok(request)
    }
}

/// What one pop delivered: messages (none when nothing was available) under one lease.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Delivery {
    /// The messages, partition by partition, each partition's in order.
    #[serde(default)]
    pub messages: Vec<Message>,
    /// The lease over every partition of the delivery; `None` when empty or with auto-ack.
    #[serde(default)]
    pub lease_id: Option<Uuid>,
    /// How many partitions the pop claimed.
    #[serde(default)]
    pub partitions_claimed: usize,
    /// Pops are paused fleet-wide (pop maintenance): nothing is delivered until it ends.
    #[serde(default)]
    pub paused: bool,
    /// What the broker chose for a pop with autopilot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autopilot: Option<Autopilot>,
}

impl Delivery {
    /// Whether nothing was delivered.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// How many messages were delivered.
    pub fn len(&self) -> usize {
        self.messages.len()
    }
}

impl IntoIterator for Delivery {
    type Item = Message;
    type IntoIter = std::vec::IntoIter<Message>;

    fn into_iter(self) -> Self::IntoIter {
        self.messages.into_iter()
    }
}

/// The knobs the broker chose for a pop with [`Pop::autopilot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Autopilot {
    /// Partitions the pop could claim.
    pub partitions: u32,
    /// Messages the pop could take.
    pub batch: u32,
    /// Advice to a consumer that does not long-poll: how long to wait after an empty pop.
    pub wait_ms: u32,
}

/// A delivered message.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Message {
    /// The message id the broker gave it.
    pub id: Uuid,
    /// The transaction id it was pushed with.
    pub transaction_id: String,
    /// Its partition's id: what acknowledgements name.
    pub partition_id: String,
    /// Its partition's name.
    pub partition: String,
    /// Its queue.
    pub queue: String,
    /// The lease it was delivered under; `None` with auto-ack.
    #[serde(default)]
    pub lease_id: Option<Uuid>,
    /// The group it was delivered to ([`QUEUE_MODE_GROUP`] in queue mode).
    pub consumer_group: String,
    /// When it was stored.
    pub created_at: DateTime<Utc>,
    /// Which delivery of it to this group this is, from 1: more after failures and expired
    /// leases.
    #[serde(default)]
    pub delivery_attempt: u32,
    /// The trace id it was pushed with.
    #[serde(default)]
    pub trace_id: Option<Uuid>,
    /// Who pushed it: the pushing token's subject when authentication is on.
    #[serde(default)]
    pub producer_sub: Option<String>,
    /// Its offset in its partition.
    #[serde(default)]
    pub offset: i64,
    /// The payload, as the JSON text it was pushed as.
    pub data: Box<RawValue>,
}

impl Message {
    /// The payload decoded as `T`.
    ///
    /// ```
    /// # fn example(message: queen_client::Message) -> Result<(), serde_json::Error> {
    /// #[derive(serde::Deserialize)]
    /// struct Order {
    ///     id: u64,
    /// }
    /// let order: Order = message.json()?;
    /// # let _ = order.id;
    /// # Ok(())
    /// # }
    /// ```
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.data.get())
    }

    /// The consumer group, `None` in queue mode.
    pub fn group(&self) -> Option<&str> {
        (self.consumer_group != QUEUE_MODE_GROUP).then_some(self.consumer_group.as_str())
    }
}

impl Client {
    /// Pops messages. An empty [`Delivery`] when nothing is available (at once, or by the end of
    /// a long poll's wait).
    ///
    /// The messages are leased to the caller (unless popped with auto-ack) until the lease runs
    /// out: acknowledge each with [`Client::ack`] or [`Client::ack_batch`], or extend the lease
    /// while working on them ([`Client::extend_lease`], [`Client::keep_lease`]). A pop is retried
    /// on failover like any call; if a pop's answer is lost, its lease expires and the messages
    /// are delivered again (the expiry counts as a failed delivery toward the retry limit).
    ///
    /// ```no_run
    /// # async fn example(client: queen_client::Client) -> Result<(), queen_client::Error> {
    /// use std::time::Duration;
    /// use queen_client::{Ack, Pop};
    ///
    /// let delivery = client.pop(&Pop::queue("orders").batch(10).wait(Duration::from_secs(5))).await?;
    /// for message in &delivery.messages {
    ///     println!("{}: {}", message.transaction_id, message.data);
    /// }
    /// let acks: Vec<Ack> = delivery.messages.iter().map(Ack::completed).collect();
    /// client.ack_batch(&acks).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn pop(&self, pop: &Pop) -> Result<Delivery, Error> {
        let request = pop.request(self)?;
        let answer = self.send(&request).await?.success()?;
        if answer.status == StatusCode::NO_CONTENT || answer.body.is_empty() {
            return Ok(Delivery::default());
        }
        if answer.body.starts_with(framed_pop::MAGIC) {
            return framed_pop::decode(&answer.body).map_err(|reason| Error::Decode { url: answer.url, reason });
        }
        answer.json()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pop: &Pop) -> String {
        let client = Client::new("http://h").unwrap();
        let request = pop.request(&client).unwrap();
        format!("{request:?}")
    }

    #[test]
    fn pops_ask_for_what_is_set() {
        let asked =
            query(&Pop::partition("q", "a/b").batch(5).wait(Duration::from_millis(1500)).group("g").lease_seconds(9));
        for part in [
            "/api/v1/pop/queue/q/partition/a%2Fb",
            "(\"batch\", \"5\")",
            "(\"wait\", \"true\")",
            "(\"timeout\", \"1500\")",
            "(\"consumerGroup\", \"g\")",
            "(\"leaseSeconds\", \"9\")",
        ] {
            assert!(asked.contains(part), "{part} in {asked}");
        }
        let at: DateTime<Utc> = "2026-01-02T03:04:05Z".parse().unwrap();
        let asked = query(&Pop::namespace_task("ns", "t").subscription_from(SubscriptionFrom::Time(at)).auto_ack(true));
        for part in
            ["/api/v1/pop\"", "(\"namespace\", \"ns\")", "(\"task\", \"t\")", "2026-01-02T03:04:05.000000Z", "autoAck"]
        {
            assert!(asked.contains(part), "{part} in {asked}");
        }
        let client = Client::new("http://h").unwrap();
        assert!(Pop::queue("q").batch(0).request(&client).is_err());
    }

    #[test]
    fn messages_read_as_the_broker_writes_them() {
        let answer = r#"{"success":true,"queue":"q","partition":"p","partitionId":"7","leaseId":"0192f0c4-0000-7000-8000-000000000001",
            "consumerGroup":"__QUEUE_MODE__","partitionsClaimed":1,"messages":[{"id":"0192f0c4-0000-7000-8000-000000000002",
            "transactionId":"t","traceId":null,"producerSub":null,"queue":"q","partition":"p","partitionId":"7","offset":1,
            "createdAt":"2026-07-29T14:00:00.123456Z","data":{"a":[1,2]},"leaseId":"0192f0c4-0000-7000-8000-000000000001",
            "consumerGroup":"__QUEUE_MODE__","deliveryAttempt":1}]}"#;
        let delivery: Delivery = serde_json::from_str(answer).unwrap();
        assert_eq!(delivery.len(), 1);
        let message = &delivery.messages[0];
        assert_eq!(message.json::<serde_json::Value>().unwrap(), serde_json::json!({"a": [1, 2]}));
        assert_eq!(message.group(), None);
        assert_eq!(message.delivery_attempt, 1);
        let paused: Delivery = serde_json::from_str(r#"{"success": true, "messages": [], "paused": true}"#).unwrap();
        assert!(paused.paused && paused.is_empty());
    }
}
