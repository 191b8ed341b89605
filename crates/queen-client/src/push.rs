//! Pushing messages: [`PushItem`], [`Client::push`], [`PushOutcome`].

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::binary_push;
use crate::transport::Request;
use crate::{Client, Error};

/// The partition of a push that names none.
pub const DEFAULT_PARTITION: &str = "Default";

/// One message to push: its queue, partition, transaction id, payload and optional trace id.
///
/// The transaction id is the message's identity for deduplication: pushing the same id to the
/// same partition again answers [`PushStatus::Duplicate`] and stores nothing. When none is
/// given, a UUIDv7 is generated as the item is made, so pushing the same `PushItem` again (after
/// an error, say) is deduplicated too.
///
/// ```
/// use queen_client::PushItem;
/// use serde_json::json;
///
/// let item = PushItem::new("orders", &json!({"orderId": 42}))?
///     .with_partition("customer-7")
///     .with_transaction_id("order-42");
/// assert_eq!(item.payload().get(), r#"{"orderId":42}"#);
///
/// // JSON already encoded is pushed as it is, without being parsed into a value and encoded again.
/// let raw = PushItem::from_json("orders", br#"{"orderId": 43}"#.to_vec())?;
/// assert_eq!(raw.payload().get(), r#"{"orderId": 43}"#);
/// # Ok::<(), queen_client::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct PushItem {
    // Shared, so that many items of one queue or partition cost no copy of its name each.
    queue: Arc<str>,
    partition: Option<Arc<str>>,
    transaction_id: String,
    payload: Box<RawValue>,
    trace_id: Option<Uuid>,
}

impl PushItem {
    /// An item whose payload is `payload` encoded as JSON.
    pub fn new(queue: impl Into<Arc<str>>, payload: &impl Serialize) -> Result<PushItem, Error> {
        let payload = serde_json::value::to_raw_value(payload)
            .map_err(|e| Error::InvalidArgument(format!("the payload cannot be encoded as JSON: {e}")))?;
        Ok(PushItem::raw(queue, payload))
    }

    /// An item whose payload is JSON already encoded: sent as it is.
    pub fn raw(queue: impl Into<Arc<str>>, payload: Box<RawValue>) -> PushItem {
        PushItem::identified(queue, Uuid::now_v7().to_string(), payload)
    }

    /// An item with its transaction id and its payload as JSON already encoded: nothing is
    /// generated and nothing encoded again (what a load generator wants).
    pub fn identified(
        queue: impl Into<Arc<str>>,
        transaction_id: impl Into<String>,
        payload: Box<RawValue>,
    ) -> PushItem {
        PushItem {
            queue: queue.into(),
            partition: None,
            transaction_id: transaction_id.into(),
            payload,
            trace_id: None,
        }
    }

    /// An item whose payload is the JSON text `json` (checked to be one JSON value, not
    /// re-encoded).
    pub fn from_json(queue: impl Into<Arc<str>>, json: impl Into<Vec<u8>>) -> Result<PushItem, Error> {
        let text = String::from_utf8(json.into())
            .map_err(|_| Error::InvalidArgument("the payload is not UTF-8 JSON".into()))?;
        let payload = RawValue::from_string(text)
            .map_err(|e| Error::InvalidArgument(format!("the payload is not one JSON value: {e}")))?;
        Ok(PushItem::raw(queue, payload))
    }

    /// The partition to push to (default [`DEFAULT_PARTITION`]). Partitions are created by their
    /// first push; messages of one partition are delivered in order.
    pub fn with_partition(mut self, partition: impl Into<Arc<str>>) -> PushItem {
        self.partition = Some(partition.into());
        self
    }

    /// The transaction id (default: a new UUIDv7).
    pub fn with_transaction_id(mut self, transaction_id: impl Into<String>) -> PushItem {
        self.transaction_id = transaction_id.into();
        self
    }

    /// A trace id the message carries to its consumers.
    pub fn with_trace_id(mut self, trace_id: Uuid) -> PushItem {
        self.trace_id = Some(trace_id);
        self
    }

    /// The queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The partition.
    pub fn partition(&self) -> &str {
        self.partition.as_deref().unwrap_or(DEFAULT_PARTITION)
    }

    /// The transaction id.
    pub fn transaction_id(&self) -> &str {
        &self.transaction_id
    }

    /// The payload, as JSON text.
    pub fn payload(&self) -> &RawValue {
        &self.payload
    }

    /// The trace id.
    pub fn trace_id(&self) -> Option<Uuid> {
        self.trace_id
    }

    pub(crate) fn wire(&self) -> WireItem<'_> {
        WireItem {
            queue: &self.queue,
            partition: self.partition(),
            transaction_id: &self.transaction_id,
            payload: &self.payload,
            trace_id: self.trace_id,
        }
    }
}

/// An item as the broker reads it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WireItem<'a> {
    queue: &'a str,
    partition: &'a str,
    transaction_id: &'a str,
    payload: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<Uuid>,
}

#[derive(Serialize)]
struct PushBody<'a> {
    items: Vec<WireItem<'a>>,
}

/// What became of a pushed item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum PushStatus {
    /// Stored now.
    Queued,
    /// Stored before under this transaction id in this partition: nothing was written, and
    /// [`PushOutcome::message_id`] is the stored message's. A push the client retried after an
    /// answer was lost may answer this for its own first attempt.
    Duplicate,
    /// Kept in the broker's journal during push maintenance, to be stored when it ends.
    Buffered,
}

/// The answer for one pushed item.
///
/// Serialized in camelCase like the broker's other answers; read in the push answer's own
/// snake_case (`transaction_id`) or in camelCase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct PushOutcome {
    /// The item's position in the push.
    pub index: usize,
    /// What became of it.
    pub status: PushStatus,
    /// Its transaction id.
    #[serde(alias = "transaction_id")]
    pub transaction_id: String,
    /// The stored message's id (the original one for a duplicate).
    #[serde(alias = "message_id")]
    pub message_id: Uuid,
    /// The partition's id; `None` while buffered.
    #[serde(default, alias = "partition_id")]
    pub partition_id: Option<String>,
    /// The message's offset in its partition; `None` while buffered.
    #[serde(default)]
    pub offset: Option<i64>,
}

impl PushOutcome {
    /// Whether the message is in the queue: queued now or before (a duplicate). A buffered push
    /// is not yet.
    pub fn is_stored(&self) -> bool {
        matches!(self.status, PushStatus::Queued | PushStatus::Duplicate)
    }
}

impl Client {
    /// Pushes `items` in one request; one outcome per item, in item order.
    ///
    /// Items may go to different queues and partitions. A push is all or nothing: an item the
    /// broker refuses (a bad name, a full queue) refuses the whole request, as an error, and
    /// nothing is stored. A full queue is [`Error::QueueFull`]. Pushes are retried on failover:
    /// their transaction ids make a retry answer `duplicate` rather than store twice.
    ///
    /// ```no_run
    /// # async fn example(client: queen_client::Client) -> Result<(), queen_client::Error> {
    /// use queen_client::{PushItem, PushStatus};
    ///
    /// let outcomes = client
    ///     .push(&[
    ///         PushItem::new("orders", &serde_json::json!({"id": 1}))?.with_transaction_id("order-1"),
    ///         PushItem::new("orders", &serde_json::json!({"id": 2}))?.with_transaction_id("order-2"),
    ///     ])
    ///     .await?;
    /// assert!(outcomes.iter().all(|o| o.status == PushStatus::Queued));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn push(&self, items: &[PushItem]) -> Result<Vec<PushOutcome>, Error> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let request = Request::post("/api/v1/push".into())
            .json(&PushBody { items: items.iter().map(PushItem::wire).collect() })?;
        let answer = self.send(&request).await?.success()?;
        let outcomes: Vec<PushOutcome> = answer.json()?;
        check_outcomes(&answer.url, items.iter().map(PushItem::transaction_id), &outcomes)?;
        Ok(outcomes)
    }

    /// Pushes `items` as [`Client::push`] does, in the binary body the official clients send
    /// with `binary_push` and `push_compression` (QPB1 frames groups): the messages are framed
    /// and compressed here, consecutive items of one partition together, and the broker stores
    /// them as received instead of parsing JSON and compressing. The message ids are minted
    /// here. Items that cannot travel so (one carries a trace id) are pushed as JSON.
    pub async fn push_binary(&self, items: &[PushItem]) -> Result<Vec<PushOutcome>, Error> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        // The binary body has no way to refuse it: the broker would store the message under its
        // message id's text, and a retry (with a message id minted afresh) store it again.
        if let Some(index) = items.iter().position(|item| item.transaction_id().is_empty()) {
            return Err(Error::InvalidArgument(format!("item {index} has an empty transaction id")));
        }
        let Ok(body) = binary_push::encode(items) else { return self.push(items).await };
        let request = Request::post("/api/v1/push".into()).bytes(body, binary_push::CONTENT_TYPE);
        let answer = self.send(&request).await?.success()?;
        let outcomes: Vec<PushOutcome> = answer.json()?;
        check_outcomes(&answer.url, items.iter().map(PushItem::transaction_id), &outcomes)?;
        Ok(outcomes)
    }

    /// Pushes one item; its outcome.
    pub async fn push_one(&self, item: PushItem) -> Result<PushOutcome, Error> {
        let mut outcomes = self.push(std::slice::from_ref(&item)).await?;
        Ok(outcomes.remove(0))
    }
}

/// One outcome per item, in item order.
pub(crate) fn check_outcomes<'a>(
    url: &str,
    sent: impl ExactSizeIterator<Item = &'a str>,
    outcomes: &[PushOutcome],
) -> Result<(), Error> {
    let decode = |reason: String| Error::Decode { url: url.to_owned(), reason };
    if sent.len() != outcomes.len() {
        return Err(decode(format!("{} results for {} items", outcomes.len(), sent.len())));
    }
    for (index, (transaction_id, outcome)) in sent.zip(outcomes).enumerate() {
        if outcome.transaction_id != transaction_id || outcome.index != index {
            return Err(decode(format!(
                "result {index} is for item {} ({}), not {transaction_id}",
                outcome.index, outcome.transaction_id
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_encode_as_the_broker_reads_them() {
        let item = PushItem::from_json("q", b"[1, 2]".to_vec()).unwrap().with_transaction_id("t");
        let json = serde_json::to_string(&item.wire()).unwrap();
        assert_eq!(json, r#"{"queue":"q","partition":"Default","transactionId":"t","payload":[1, 2]}"#);
        let traced = item.with_partition("p").with_trace_id(Uuid::nil());
        let json = serde_json::to_string(&traced.wire()).unwrap();
        assert!(
            json.contains(r#""partition":"p""#) && json.contains(r#""traceId":"00000000-0000-0000-0000-000000000000""#)
        );
        assert!(PushItem::from_json("q", b"{".to_vec()).is_err());
        assert!(PushItem::from_json("q", b"1 2".to_vec()).is_err());
    }

    #[test]
    fn generated_transaction_ids_are_uuid_v7_and_distinct() {
        let (a, b) = (PushItem::new("q", &1).unwrap(), PushItem::new("q", &1).unwrap());
        assert_ne!(a.transaction_id(), b.transaction_id());
        assert_eq!(Uuid::parse_str(a.transaction_id()).unwrap().get_version_num(), 7);
    }

    #[test]
    fn outcomes_are_read_in_item_order() {
        let answer = r#"[{"index":0,"status":"queued","transaction_id":"a","message_id":"0192f0c4-0000-7000-8000-000000000001","partition_id":"7","offset":3},
                         {"index":1,"status":"buffered","transaction_id":"b","message_id":"0192f0c4-0000-7000-8000-000000000002","queue":"q","partition":"p"}]"#;
        let outcomes: Vec<PushOutcome> = serde_json::from_str(answer).unwrap();
        assert!(outcomes[0].is_stored() && !outcomes[1].is_stored());
        assert_eq!(outcomes[1].partition_id, None);
        assert!(check_outcomes("u", ["a", "b"].into_iter(), &outcomes).is_ok());
        assert!(check_outcomes("u", ["b", "a"].into_iter(), &outcomes).is_err());
        assert!(check_outcomes("u", ["a"].into_iter(), &outcomes).is_err());
    }

    #[test]
    fn outcomes_are_written_in_camel_case_and_read_back() {
        let wire = r#"{"index":0,"status":"duplicate","transaction_id":"a","message_id":"0192f0c4-0000-7000-8000-000000000001","partition_id":"7","offset":3}"#;
        let outcome: PushOutcome = serde_json::from_str(wire).unwrap();
        let written = serde_json::to_value(&outcome).unwrap();
        assert_eq!(
            written,
            serde_json::json!({"index": 0, "status": "duplicate", "transactionId": "a",
                "messageId": "0192f0c4-0000-7000-8000-000000000001", "partitionId": "7", "offset": 3})
        );
        assert_eq!(serde_json::from_value::<PushOutcome>(written).unwrap(), outcome);
    }
}
