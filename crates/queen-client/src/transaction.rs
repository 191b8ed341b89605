//! Transactions: acknowledgements and pushes applied together or not at all.

use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::ack::{Ack, AckResult, AckStatus};
use crate::error::ErrorBody;
use crate::push::{PushItem, PushOutcome, WireItem};
use crate::transport::{Replay, Request};
use crate::{Client, Error};

/// Acknowledgements and pushes to apply in one PostgreSQL transaction, in the order given: all
/// of them, or none. The classic use is "consume from A, produce to B, exactly once": acknowledge
/// the input and push the output together.
///
/// Each acknowledgement is fenced by its own lease; [`require_lease`](Transaction::require_lease)
/// names leases that must all still be live for the transaction to commit (and fences
/// acknowledgements that name no lease of their own).
///
/// ```no_run
/// # async fn example(client: queen_client::Client, message: queen_client::Message) -> Result<(), queen_client::Error> {
/// use queen_client::{Ack, PushItem, Transaction};
///
/// let transaction = Transaction::new()
///     .ack(Ack::completed(&message))
///     .push([PushItem::new("shipments", &serde_json::json!({"order": message.transaction_id}))?]);
/// match client.commit(&transaction).await {
///     Ok(committed) => println!("{} results", committed.results.len()),
///     Err(queen_client::Error::RolledBack { reason, .. }) => eprintln!("nothing applied: {reason}"),
///     Err(other) => return Err(other),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct Transaction {
    operations: Vec<Operation>,
    required_leases: Vec<Uuid>,
}

#[derive(Debug, Clone)]
enum Operation {
    Ack(Ack),
    Push(Vec<PushItem>),
}

impl Transaction {
    /// An empty transaction.
    pub fn new() -> Transaction {
        Transaction::default()
    }

    /// Adds an acknowledgement.
    pub fn ack(mut self, ack: Ack) -> Transaction {
        self.operations.push(Operation::Ack(ack));
        self
    }

    /// Adds a push of `items`.
    pub fn push(mut self, items: impl IntoIterator<Item = PushItem>) -> Transaction {
        let items: Vec<PushItem> = items.into_iter().collect();
        if !items.is_empty() {
            self.operations.push(Operation::Push(items));
        }
        self
    }

    /// Requires `lease_id` to be live when the transaction commits.
    pub fn require_lease(mut self, lease_id: Uuid) -> Transaction {
        if !self.required_leases.contains(&lease_id) {
            self.required_leases.push(lease_id);
        }
        self
    }

    /// Whether it holds no operation.
    pub fn is_empty(&self) -> bool {
        self.operations.is_empty()
    }

    /// How many results a commit answers: one per acknowledgement and one per pushed item.
    fn result_count(&self) -> usize {
        self.operations
            .iter()
            .map(|operation| match operation {
                Operation::Ack(_) => 1,
                Operation::Push(items) => items.len(),
            })
            .sum()
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum WireOperation<'a> {
    #[serde(rename_all = "camelCase")]
    Ack {
        r#type: &'static str,
        transaction_id: &'a str,
        partition_id: &'a str,
        status: AckStatus,
        consumer_group: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        lease_id: Option<Uuid>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<&'a str>,
    },
    Push {
        r#type: &'static str,
        items: Vec<WireItem<'a>>,
    },
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireTransaction<'a> {
    operations: Vec<WireOperation<'a>>,
    required_leases: &'a [Uuid],
}

impl<'a> From<&'a Transaction> for WireTransaction<'a> {
    fn from(transaction: &'a Transaction) -> Self {
        let operations = transaction
            .operations
            .iter()
            .map(|operation| match operation {
                Operation::Ack(ack) => WireOperation::Ack {
                    r#type: "ack",
                    transaction_id: &ack.transaction_id,
                    partition_id: &ack.partition_id,
                    status: ack.status,
                    consumer_group: ack.consumer_group.as_deref(),
                    lease_id: ack.lease_id,
                    error: ack.error.as_deref(),
                },
                Operation::Push(items) => {
                    WireOperation::Push { r#type: "push", items: items.iter().map(PushItem::wire).collect() }
                }
            })
            .collect();
        WireTransaction { operations, required_leases: &transaction.required_leases }
    }
}

/// A committed transaction.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Committed {
    /// The id the broker gave the transaction.
    pub transaction_id: Option<Uuid>,
    /// One result per acknowledgement and per pushed item, in the transaction's order.
    pub results: Vec<TransactionResult>,
}

/// What one entry of a committed transaction became. Serialized as the verdict or the outcome
/// itself, as the broker lists them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum TransactionResult {
    /// An acknowledgement's verdict (every acknowledgement of a committed transaction applied).
    Ack(AckResult),
    /// A pushed item's outcome (`queued`, or `duplicate` for a transaction id already stored).
    Push(PushOutcome),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CommitAnswer {
    #[serde(default)]
    transaction_id: Option<Uuid>,
    results: Vec<Value>,
}

impl Client {
    /// Commits a transaction: every operation applied, with their results in order, or
    /// [`Error::RolledBack`] with the broker's reason and nothing applied.
    ///
    /// A commit is sent again (on failover) only when its first attempt certainly did nothing:
    /// the connection could not be made, or the broker refused it as overloaded. Had a first
    /// attempt committed and its answer been lost, a second one would be rolled back (its
    /// acknowledgements' lease is released by then), misreporting a commit, so any other failure
    /// is returned as it is: check with [`Client::message`] or pop again before deciding.
    pub async fn commit(&self, transaction: &Transaction) -> Result<Committed, Error> {
        if transaction.is_empty() {
            return Err(Error::InvalidArgument("a transaction needs at least one operation".into()));
        }
        let request = Request::post("/api/v1/transaction".into())
            .json(&WireTransaction::from(transaction))?
            .replay(Replay::IfUnapplied);
        let answer = self.send(&request).await?;
        if answer.status == StatusCode::CONFLICT {
            let body = ErrorBody::parse(answer.status, &answer.body, None);
            if body.code.as_deref() == Some("rolled_back") {
                let reason = body.error.strip_prefix("transaction rolled back: ").unwrap_or(&body.error).to_owned();
                return Err(Error::RolledBack {
                    url: answer.url,
                    transaction_id: body.detail_str("transactionId").map(str::to_owned),
                    reason,
                    request_id: body.request_id,
                });
            }
        }
        let answer = answer.success()?;
        let committed: CommitAnswer = answer.json()?;
        let decode = |reason: String| Error::Decode { url: answer.url.clone(), reason };
        if committed.results.len() != transaction.result_count() {
            return Err(decode(format!(
                "{} results for {} entries",
                committed.results.len(),
                transaction.result_count()
            )));
        }
        let mut values = committed.results.into_iter();
        let mut results = Vec::with_capacity(values.len());
        for operation in &transaction.operations {
            match operation {
                Operation::Ack(_) => {
                    let value = values.next().unwrap_or_default();
                    let verdict: AckResult = serde_json::from_value(value).map_err(|e| decode(e.to_string()))?;
                    results.push(TransactionResult::Ack(verdict));
                }
                Operation::Push(items) => {
                    for _ in items {
                        let value = values.next().unwrap_or_default();
                        let outcome: PushOutcome = serde_json::from_value(value).map_err(|e| decode(e.to_string()))?;
                        results.push(TransactionResult::Push(outcome));
                    }
                }
            }
        }
        Ok(Committed { transaction_id: committed.transaction_id, results })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_encode_in_the_callers_order() {
        let lease = Uuid::nil();
        let transaction = Transaction::new()
            .ack(Ack::by_id("7", "t", AckStatus::Completed).with_lease(lease).with_group("g"))
            .push([PushItem::from_json("b", b"1".to_vec()).unwrap().with_transaction_id("u")])
            .push([])
            .require_lease(lease)
            .require_lease(lease);
        let json = serde_json::to_value(WireTransaction::from(&transaction)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "operations": [
                    {"type": "ack", "transactionId": "t", "partitionId": "7", "status": "completed",
                     "consumerGroup": "g", "leaseId": lease},
                    {"type": "push", "items": [{"queue": "b", "partition": "Default", "transactionId": "u", "payload": 1}]}
                ],
                "requiredLeases": [lease]
            })
        );
        assert_eq!(transaction.result_count(), 2);
    }
}
