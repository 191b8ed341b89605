//! Acknowledgements: [`Ack`], [`Client::ack`], [`Client::ack_batch`], [`AckResult`].

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::pop::{Message, QUEUE_MODE_GROUP};
use crate::transport::{Replay, Request};
use crate::{Client, Error};

/// What an acknowledgement says about a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum AckStatus {
    /// Done: the group's cursor moves past the message (and everything before it in its
    /// partition that this lease delivered).
    Completed,
    /// Not done: delivered again (after the queue's `retryDelay`), counting toward its
    /// `retryLimit`; past it, dead-lettered. Later messages of the partition are delivered again
    /// too.
    Failed,
    /// Deliver again, without counting a failure.
    Retry,
    /// Dead-letter it now and move past it.
    Dlq,
}

/// One acknowledgement: which message (partition id and transaction id), for which group, under
/// which lease, with what status.
///
/// An acknowledgement is a cursor commit: `completed` on a message commits everything before it
/// in its partition too, so acknowledge a partition's messages in order.
///
/// ```no_run
/// # async fn example(client: queen_client::Client, message: queen_client::Message) -> Result<(), queen_client::Error> {
/// use queen_client::Ack;
///
/// let verdict = client.ack(&Ack::failed(&message, "payment service down")).await?;
/// if !verdict.success {
///     eprintln!("refused: {}", verdict.error.unwrap_or_default());
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Ack {
    /// The message's partition id.
    pub partition_id: String,
    /// The message's transaction id.
    pub transaction_id: String,
    /// The lease it was delivered under; an acknowledgement under a lease that is not live is
    /// refused. `None` acknowledges without a lease (refused while another consumer holds the
    /// partition).
    pub lease_id: Option<Uuid>,
    /// The consumer group; `None` for queue mode.
    pub consumer_group: Option<String>,
    /// What it says.
    pub status: AckStatus,
    /// Why it failed, for `failed` (kept with a dead letter).
    pub error: Option<String>,
}

impl Ack {
    /// An acknowledgement of `message` with `status`, for the group and under the lease it was
    /// delivered with.
    pub fn new(message: &Message, status: AckStatus) -> Ack {
        Ack {
            partition_id: message.partition_id.clone(),
            transaction_id: message.transaction_id.clone(),
            lease_id: message.lease_id,
            consumer_group: message.group().map(str::to_owned),
            status,
            error: None,
        }
    }

    /// `completed`.
    pub fn completed(message: &Message) -> Ack {
        Ack::new(message, AckStatus::Completed)
    }

    /// `failed`, with the reason.
    pub fn failed(message: &Message, error: impl Into<String>) -> Ack {
        Ack::new(message, AckStatus::Failed).with_error(error)
    }

    /// `retry`.
    pub fn retry(message: &Message) -> Ack {
        Ack::new(message, AckStatus::Retry)
    }

    /// `dlq`.
    pub fn dlq(message: &Message) -> Ack {
        Ack::new(message, AckStatus::Dlq)
    }

    /// An acknowledgement of a message known by its ids only.
    pub fn by_id(partition_id: impl Into<String>, transaction_id: impl Into<String>, status: AckStatus) -> Ack {
        Ack {
            partition_id: partition_id.into(),
            transaction_id: transaction_id.into(),
            lease_id: None,
            consumer_group: None,
            status,
            error: None,
        }
    }

    /// The same acknowledgement under `lease_id`.
    pub fn with_lease(mut self, lease_id: Uuid) -> Ack {
        self.lease_id = Some(lease_id);
        self
    }

    /// The same acknowledgement for `group`.
    pub fn with_group(mut self, group: impl Into<String>) -> Ack {
        self.consumer_group = Some(group.into());
        self
    }

    /// The same acknowledgement with an error text.
    pub fn with_error(mut self, error: impl Into<String>) -> Ack {
        self.error = Some(error.into());
        self
    }

    pub(crate) fn group_name(&self) -> &str {
        self.consumer_group.as_deref().unwrap_or(QUEUE_MODE_GROUP)
    }

    pub(crate) fn wire(&self) -> WireAck<'_> {
        WireAck {
            transaction_id: &self.transaction_id,
            partition_id: &self.partition_id,
            status: self.status,
            lease_id: self.lease_id,
            error: self.error.as_deref(),
        }
    }
}

/// An acknowledgement as the broker reads it (the group is the request's).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WireAck<'a> {
    pub(crate) transaction_id: &'a str,
    pub(crate) partition_id: &'a str,
    pub(crate) status: AckStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lease_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SingleBody<'a> {
    #[serde(flatten)]
    ack: WireAck<'a>,
    consumer_group: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BatchBody<'a> {
    acknowledgments: Vec<WireAck<'a>>,
    consumer_group: &'a str,
}

/// The broker's verdict on one acknowledgement. A refusal is not an error of the call: it is
/// this verdict with `success: false` and the reason in `error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct AckResult {
    /// The acknowledgement's position in the call.
    pub index: usize,
    /// Its transaction id.
    pub transaction_id: String,
    /// Its partition id.
    pub partition_id: String,
    /// Its consumer group.
    pub consumer_group: String,
    /// Its status, as the broker read it.
    pub status: AckStatus,
    /// Whether it applied (a no-op applies).
    pub success: bool,
    /// A `completed` for a message already committed: nothing changed.
    #[serde(default)]
    pub noop: bool,
    /// It released the lease (the whole leased span is done, or a failure gave it up).
    #[serde(default)]
    pub lease_released: bool,
    /// The message went to the dead-letter queue.
    #[serde(default)]
    pub dlq: bool,
    /// The message was given up without a dead letter (the queue does not keep them).
    #[serde(default)]
    pub dropped: bool,
    /// Why it was refused.
    #[serde(default)]
    pub error: Option<String>,
}

impl AckResult {
    /// What the verdict comes to.
    pub fn verdict(&self) -> AckVerdict<'_> {
        match (&self.error, self.success, self.noop) {
            (_, true, true) => AckVerdict::Noop,
            (_, true, false) => AckVerdict::Applied,
            (error, false, _) => AckVerdict::Refused(error.as_deref().unwrap_or("refused")),
        }
    }
}

/// An [`AckResult`] in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckVerdict<'a> {
    /// It applied.
    Applied,
    /// It applied, changing nothing: the message was already committed.
    Noop,
    /// It was refused, for this reason (an expired lease, a message already committed, an
    /// unknown transaction id...).
    Refused(&'a str),
}

impl Client {
    /// Acknowledges one message; the broker's verdict.
    pub async fn ack(&self, ack: &Ack) -> Result<AckResult, Error> {
        let body = SingleBody { ack: ack.wire(), consumer_group: ack.group_name() };
        let request =
            Request::post("/api/v1/ack".into()).json(&body)?.replay(replay_of(std::slice::from_ref(&body.ack)));
        let answer = self.send(&request).await?.success()?;
        let mut results: Vec<AckResult> = answer.json()?;
        if results.len() != 1 {
            return Err(Error::Decode { url: answer.url, reason: format!("{} verdicts for one ack", results.len()) });
        }
        Ok(results.remove(0))
    }

    /// Acknowledges several messages of one consumer group in one call, applied in order; one
    /// verdict per acknowledgement, in order. Nothing is sent for no acknowledgements.
    ///
    /// Acknowledgements are retried on failover: they are cursor commits, so a `completed` sent
    /// twice is a no-op the second time. A `failed` whose first attempt applied is refused the
    /// second time (its lease was released): the verdict then says refused though the failure
    /// was recorded. A `failed` that names no lease would count twice, so a batch holding one is
    /// sent again only when the first attempt certainly did nothing.
    pub async fn ack_batch(&self, acks: &[Ack]) -> Result<Vec<AckResult>, Error> {
        let Some(first) = acks.first() else { return Ok(Vec::new()) };
        let group = first.group_name();
        if let Some(other) = acks.iter().find(|ack| ack.group_name() != group) {
            return Err(Error::InvalidArgument(format!(
                "one batch acknowledges for one consumer group, not {group:?} and {:?}",
                other.group_name()
            )));
        }
        self.ack_wire(acks.iter().map(Ack::wire).collect(), group).await
    }

    /// Acknowledges every message of `messages` (one group's, as a pop delivers them) with
    /// `status`, in one call: what a consumer that handled a whole delivery sends.
    pub async fn ack_messages(&self, messages: &[Message], status: AckStatus) -> Result<Vec<AckResult>, Error> {
        let Some(first) = messages.first() else { return Ok(Vec::new()) };
        let group = first.consumer_group.as_str();
        if messages.iter().any(|message| message.consumer_group != group) {
            return Err(Error::InvalidArgument("one batch acknowledges for one consumer group".into()));
        }
        let acks = messages
            .iter()
            .map(|m| WireAck {
                transaction_id: &m.transaction_id,
                partition_id: &m.partition_id,
                status,
                lease_id: m.lease_id,
                error: None,
            })
            .collect();
        self.ack_wire(acks, group).await
    }

    async fn ack_wire(&self, acks: Vec<WireAck<'_>>, group: &str) -> Result<Vec<AckResult>, Error> {
        let count = acks.len();
        let replay = replay_of(&acks);
        let body = BatchBody { acknowledgments: acks, consumer_group: group };
        let request = Request::post("/api/v1/ack/batch".into()).json(&body)?.replay(replay);
        let answer = self.send(&request).await?.success()?;
        let results: Vec<AckResult> = answer.json()?;
        if results.len() != count {
            return Err(Error::Decode {
                url: answer.url,
                reason: format!("{} verdicts for {count} acknowledgements", results.len()),
            });
        }
        Ok(results)
    }
}

/// Whether acknowledgements may be sent again after an attempt whose outcome is unknown: a
/// `failed` without a lease passes the broker's checks a second time and counts again toward the
/// message's `retryLimit`; with its lease it is refused, which the lease's release by the first
/// makes harmless.
fn replay_of(acks: &[WireAck<'_>]) -> Replay {
    if acks.iter().any(|ack| ack.status == AckStatus::Failed && ack.lease_id.is_none()) {
        Replay::IfUnapplied
    } else {
        Replay::Always
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_failed_without_its_lease_is_not_sent_again_after_a_lost_answer() {
        let lease = Some(Uuid::nil());
        let ack = |status, lease_id| WireAck { transaction_id: "t", partition_id: "1", status, lease_id, error: None };
        assert_eq!(replay_of(&[ack(AckStatus::Completed, None), ack(AckStatus::Failed, lease)]), Replay::Always);
        assert_eq!(replay_of(&[ack(AckStatus::Dlq, None), ack(AckStatus::Retry, None)]), Replay::Always);
        assert_eq!(replay_of(&[ack(AckStatus::Completed, None), ack(AckStatus::Failed, None)]), Replay::IfUnapplied);
    }

    #[test]
    fn acks_encode_as_the_broker_reads_them() {
        let ack = Ack::by_id("7", "t", AckStatus::Failed).with_error("boom").with_group("g");
        let body = SingleBody { ack: ack.wire(), consumer_group: ack.group_name() };
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"transactionId":"t","partitionId":"7","status":"failed","error":"boom","consumerGroup":"g"}"#
        );
        assert_eq!(Ack::by_id("7", "t", AckStatus::Dlq).group_name(), QUEUE_MODE_GROUP);
    }

    #[test]
    fn verdicts_read_as_the_broker_writes_them() {
        let answer = r#"[{"index":0,"transactionId":"t","partitionId":"7","consumerGroup":"g","status":"completed","success":true,"noop":true,"leaseReleased":false,"dlq":false,"error":null},
                         {"index":1,"transactionId":"u","partitionId":"7","consumerGroup":"g","status":"failed","success":false,"noop":false,"leaseReleased":false,"dlq":false,"error":"invalid or expired lease"}]"#;
        let results: Vec<AckResult> = serde_json::from_str(answer).unwrap();
        assert_eq!(results[0].verdict(), AckVerdict::Noop);
        assert_eq!(results[1].verdict(), AckVerdict::Refused("invalid or expired lease"));
    }
}
