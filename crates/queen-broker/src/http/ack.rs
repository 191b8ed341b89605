//! `POST /api/v1/ack` and `POST /api/v1/ack/batch`: per-item verdicts, HTTP 200.

use std::borrow::Cow;
use std::sync::Arc;

use actix_web::{HttpResponse, web};
use queen_store::ack_rules::{AckStatus, AckVerdict, LeaseFence};
use queen_store::cursors::{AckOutcome, AckRequest};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::authorize::Caller;
use super::body::{JsonObject, NoQuery, ObjectOnly, read_body};
use crate::broker::Broker;
use crate::broker::ack::{acknowledge, refusal_text, status_label};
use crate::error::ApiError;
use crate::names::{self, NameKind};

pub async fn single(
    broker: web::Data<Broker>,
    _: NoQuery,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let body = JsonObject::parse_body(&body, false)?;
    body.takes_only(&[ACK_MEMBERS, &["consumerGroup"]].concat())?;
    let group = group_of(&body)?;
    let request = parse_ack(&body, &group)?;
    caller.check_partitions(&broker, &[request.partition_id]).await?;
    answer(&broker, &group, vec![request]).await
}

pub async fn batch(
    broker: web::Data<Broker>,
    _: NoQuery,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let (group, requests) = match TypedBatch::requests(&body) {
        Some(read) => read,
        None => batch_members(&body)?,
    };
    let partitions: Vec<i64> = requests.iter().map(|request| request.partition_id).collect();
    caller.check_partitions(&broker, &partitions).await?;
    answer(&broker, &group, requests).await
}

/// The most acknowledgements one batch may carry: ten of the largest pops.
const MAX_BATCH_ACKS: usize = 100_000;

/// A batch's group and its acknowledgements.
type GroupRequests = (Arc<str>, Vec<AckRequest>);

/// A batch read member by member, each wrong one named in a 400.
fn batch_members(body: &[u8]) -> Result<GroupRequests, ApiError> {
    let body = JsonObject::parse_body(body, false)?;
    body.takes_only(&["acknowledgments", "consumerGroup"])?;
    let group = group_of(&body)?;
    let items = body.objects("acknowledgments")?.ok_or_else(|| ApiError::bad_request("acknowledgments is required"))?;
    if items.is_empty() {
        return Err(ApiError::bad_request("acknowledgments must not be empty"));
    }
    let requests = items
        .read_at_most(MAX_BATCH_ACKS, "acknowledgements")?
        .iter()
        .map(|item| item.takes_only(ACK_MEMBERS).and_then(|()| parse_ack(item, &group)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((group, requests))
}

/// A batch as the clients send it, read in one pass into typed members borrowed from the body.
/// Reading member by member ([`batch_members`]) passes over each item three times and builds a
/// map of it; with push bodies, that reading took about a tenth of the broker's CPU under a
/// fan-out load (`benches/README.md`, *Where the time goes*). This form decides no
/// answer: a batch it does not take whole (an unknown or repeated member, a value of another
/// type, an escape in a lease id, a value the checks refuse) is read again member by member,
/// which accepts it the same way or names what is wrong.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TypedBatch<'a> {
    #[serde(borrow)]
    acknowledgments: Vec<ObjectOnly<TypedAck<'a>>>,
    #[serde(borrow)]
    consumer_group: Option<&'a str>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TypedAck<'a> {
    #[serde(borrow)]
    transaction_id: Cow<'a, str>,
    #[serde(borrow)]
    partition_id: &'a RawValue,
    #[serde(borrow)]
    status: Option<&'a str>,
    #[serde(borrow)]
    error: Option<Cow<'a, str>>,
    #[serde(borrow)]
    lease_id: Option<&'a str>,
}

impl TypedBatch<'_> {
    /// The batch's group and requests, as [`batch_members`] reads them; `None` when this form
    /// does not take the body.
    fn requests(body: &[u8]) -> Option<GroupRequests> {
        let ObjectOnly(batch) = serde_json::from_slice::<ObjectOnly<TypedBatch<'_>>>(body).ok()?;
        // Refused, with its reason, by the member-by-member form.
        if batch.acknowledgments.is_empty() || batch.acknowledgments.len() > MAX_BATCH_ACKS {
            return None;
        }
        let group = names::group_or_queue_mode(batch.consumer_group);
        names::check(NameKind::ConsumerGroup, "consumerGroup", group).ok()?;
        let group: Arc<str> = group.into();
        let requests =
            batch.acknowledgments.into_iter().map(|ObjectOnly(ack)| ack.request(&group)).collect::<Option<_>>()?;
        Some((group, requests))
    }
}

impl TypedAck<'_> {
    fn request(self, group: &Arc<str>) -> Option<AckRequest> {
        names::check(NameKind::TransactionId, "transactionId", &self.transaction_id).ok()?;
        let raw = self.partition_id.get();
        let partition_text = match raw.starts_with('"') {
            true => serde_json::from_str::<&str>(raw).ok()?,
            false => raw,
        };
        Some(AckRequest {
            partition_id: partition_number(partition_text)?,
            transaction_id: Arc::from(self.transaction_id.as_ref()),
            offset: None,
            status: status_named(self.status)?,
            fence: lease_named(self.lease_id)?.map_or(LeaseFence::Unfenced, LeaseFence::Lease),
            consumer_group: Arc::clone(group),
            error: self.error.map(|error| storable_text(error.into_owned())),
        })
    }
}

async fn answer(broker: &Broker, group: &str, requests: Vec<AckRequest>) -> Result<HttpResponse, ApiError> {
    let started = std::time::Instant::now();
    let echo = requests.clone();
    // Timed whatever comes of it: a stalled database's 503s are the answers to see.
    let outcomes = acknowledge(broker, group, requests).await;
    broker.metrics.ack_duration.observe(started.elapsed().as_secs_f64());
    let outcomes = outcomes?;
    let results: Vec<AckResult<'_>> = echo
        .iter()
        .zip(&outcomes)
        .enumerate()
        .map(|(index, (request, outcome))| AckResult::new(index, request, outcome))
        .collect();
    Ok(HttpResponse::Ok().json(results))
}

fn group_of(body: &JsonObject<'_>) -> Result<Arc<str>, ApiError> {
    let group = body.text("consumerGroup")?;
    let group = names::group_or_queue_mode(group.as_deref());
    names::check(NameKind::ConsumerGroup, body.member("consumerGroup"), group).map_err(ApiError::BadRequest)?;
    Ok(group.into())
}

/// Partition ids are sent as strings (as pops hand them out) or numbers.
pub fn partition_id(item: &JsonObject<'_>) -> Result<i64, ApiError> {
    let field = item.member("partitionId");
    let raw = item.raw("partitionId").ok_or_else(|| ApiError::bad_request(format!("{field} is required")))?;
    let text = match raw.get().starts_with('"') {
        true => item.text("partitionId")?.unwrap_or_default(),
        false => Cow::Borrowed(raw.get()),
    };
    partition_number(&text)
        .ok_or_else(|| ApiError::bad_request(format!("{field} must be a partition id, not {}", raw.get())))
}

fn partition_number(text: &str) -> Option<i64> {
    text.parse::<i64>().ok().filter(|id| *id > 0)
}

/// A lease id, when the item names one: absent, `null` and `""` mean none.
pub fn lease_id(item: &JsonObject<'_>) -> Result<Option<Uuid>, ApiError> {
    let lease = item.text("leaseId")?;
    lease_named(lease.as_deref()).ok_or_else(|| {
        let lease = lease.as_deref().unwrap_or_default();
        ApiError::bad_request(format!("{} is not a lease id: {lease:?}", item.member("leaseId")))
    })
}

/// The lease a `leaseId` names (`None` within: none named); `None` when it names no lease.
fn lease_named(lease: Option<&str>) -> Option<Option<Uuid>> {
    match lease {
        None | Some("") => Some(None),
        Some(lease) => Uuid::parse_str(lease).ok().map(Some),
    }
}

pub fn status(item: &JsonObject<'_>) -> Result<AckStatus, ApiError> {
    let status = item.text("status")?;
    status_named(status.as_deref()).ok_or_else(|| {
        ApiError::bad_request(format!(
            "{} must be one of completed, failed, retry, dlq; not {:?}",
            item.member("status"),
            status.unwrap_or_default()
        ))
    })
}

/// The status a `status` member names (absent: completed); `None` for one the broker does not know.
fn status_named(status: Option<&str>) -> Option<AckStatus> {
    match status {
        None | Some("completed" | "success") => Some(AckStatus::Completed),
        Some("failed") => Some(AckStatus::Failed),
        Some("retry") => Some(AckStatus::Retry),
        Some("dlq") => Some(AckStatus::DeadLetter),
        Some(_) => None,
    }
}

/// The members [`parse_ack`] reads; the group is the caller's to read (a batch names it once).
pub const ACK_MEMBERS: &[&str] = &["transactionId", "partitionId", "status", "error", "leaseId"];

/// One acknowledgement of a request body, for `group`, fenced by the lease it names.
pub fn parse_ack(item: &JsonObject<'_>, group: &Arc<str>) -> Result<AckRequest, ApiError> {
    let transaction_id = item.required_text("transactionId")?;
    names::check(NameKind::TransactionId, item.member("transactionId"), &transaction_id)
        .map_err(ApiError::BadRequest)?;
    Ok(AckRequest {
        partition_id: partition_id(item)?,
        transaction_id: Arc::from(transaction_id.as_ref()),
        offset: None,
        status: status(item)?,
        fence: lease_id(item)?.map_or(LeaseFence::Unfenced, LeaseFence::Lease),
        consumer_group: Arc::clone(group),
        error: item.string("error")?.map(storable_text),
    })
}

/// An ack's `error` as PostgreSQL can store it: `text` cannot hold U+0000, so each one becomes
/// U+FFFD. The error is a diagnostic (often a stack trace) that ends up in the dead letter; an ack
/// is not refused over it, or a consumer whose failures carry a NUL could never give up on its
/// message.
fn storable_text(text: String) -> String {
    if text.contains('\0') { text.replace('\0', "\u{FFFD}") } else { text }
}

/// One item's verdict as the client reads it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AckResult<'a> {
    index: usize,
    transaction_id: &'a str,
    #[serde(serialize_with = "super::id_text")]
    partition_id: i64,
    consumer_group: &'a str,
    status: &'static str,
    success: bool,
    noop: bool,
    lease_released: bool,
    dlq: bool,
    /// Given up on without a dead letter (the queue does not dead-letter exhausted messages);
    /// present only then.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    dropped: bool,
    error: Option<String>,
}

impl<'a> AckResult<'a> {
    pub fn new(index: usize, request: &'a AckRequest, outcome: &AckOutcome) -> Self {
        let (lease_released, dlq) = match outcome.verdict {
            AckVerdict::Committed { lease_released } => (lease_released, false),
            AckVerdict::Requeued { .. } => (true, false),
            AckVerdict::DeadLettered { lease_released } => (lease_released, true),
            AckVerdict::Dropped { lease_released } => (lease_released, false),
            AckVerdict::Noop | AckVerdict::Refused(_) => (false, false),
        };
        let error = match outcome.verdict {
            AckVerdict::Refused(refusal) => Some(refusal_text(refusal, request, outcome.committed)),
            _ => None,
        };
        AckResult {
            index,
            transaction_id: &request.transaction_id,
            partition_id: request.partition_id,
            consumer_group: &request.consumer_group,
            status: status_label(request.status),
            success: outcome.verdict.is_success(),
            noop: outcome.verdict == AckVerdict::Noop,
            lease_released,
            dlq,
            dropped: matches!(outcome.verdict, AckVerdict::Dropped { .. }),
            error,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::http::arbitrary_bodies::{Member, object};

    const LEASE: &str = "0193a8e0-7c4e-7000-8000-00000000000a";

    fn both_readings(body: &str) -> (Option<GroupRequests>, Result<GroupRequests, String>) {
        let typed = TypedBatch::requests(body.as_bytes());
        let members = batch_members(body.as_bytes()).map_err(|e| e.to_string());
        (typed, members)
    }

    #[test]
    fn the_batch_the_clients_send_is_read_in_one_pass_as_member_by_member() {
        let body = format!(
            r#"{{"acknowledgments":[{{"transactionId":"t-1","partitionId":"7","leaseId":"{LEASE}","status":"completed"}},
                {{"transactionId":"t-2","partitionId":8,"status":"failed","error":"boom\n\u0000"}}],
                "consumerGroup":"g"}}"#
        );
        let (typed, members) = both_readings(&body);
        let typed = typed.expect("the one-pass form takes what the clients send");
        assert_eq!(Ok(typed.clone()), members);
        let (group, requests) = typed;
        assert_eq!(&*group, "g");
        assert_eq!(requests[0].fence, LeaseFence::Lease(LEASE.parse().unwrap()));
        assert_eq!((requests[1].partition_id, requests[1].status), (8, AckStatus::Failed));
        assert_eq!(requests[1].error.as_deref(), Some("boom\n\u{FFFD}"));
    }

    #[test]
    fn what_the_one_pass_form_does_not_take_is_read_member_by_member() {
        for body in [
            r#"{"acknowledgments":[{"transactionId":"t","partitionId":"1","leaseID":"x"}]}"#,
            r#"{"acknowledgments":[{"transactionId":"t","transactionId":"u","partitionId":"1"}]}"#,
            r#"{"acknowledgments":[{"transactionId":"t","partitionId":"0"}]}"#,
            r#"{"acknowledgments":[{"transactionId":"t","partitionId":"1","status":"done"}]}"#,
            r#"{"acknowledgments":[{"transactionId":"t","partitionId":"1","leaseId":"nope"}]}"#,
            r#"{"acknowledgments":[{"transactionId":"","partitionId":"1"}]}"#,
            r#"{"acknowledgments":[],"consumerGroup":"g"}"#,
            r#"{"acknowledgments":[{"transactionId":"t","partitionId":"1"}],"consumerGroup":"a/b"}"#,
        ] {
            let (typed, members) = both_readings(body);
            assert!(typed.is_none(), "{body}");
            let error = members.expect_err(body);
            assert!(error.contains("acknowledgments") || error.contains("consumerGroup"), "{body}: {error}");
        }
    }

    /// A value of the right type, mostly, or of another.
    const WRONG: &[&str] = &[r#""3""#, "3", "-3", "1.5", "null", "true", "{}", r#""""#, r#""t\u002d2""#];

    fn item() -> impl Strategy<Value = String> {
        let lease = format!(r#""{LEASE}""#);
        let members = vec![
            Member::new("transactionId", 0.95, &[r#""t-1""#, r#""t-2""#]),
            Member::new("partitionId", 0.95, &[r#""3""#, "12"]),
            Member::new("status", 0.5, &[r#""completed""#, r#""retry""#, r#""dlq""#, "null"]),
            Member::new("error", 0.5, &[r#""boom""#, r#""a\nb""#]),
            Member::new("leaseId", 0.5, &[&lease, r#""""#, "null"]),
        ];
        object(members, WRONG, &["leaseID", "transactionId", "status", r"transaction\u0049d", "queue"])
    }

    fn body() -> impl Strategy<Value = String> {
        let items = prop::collection::vec(item(), 0..4).prop_map(|items| format!("[{}]", items.join(",")));
        let group = prop::sample::select(vec![
            "",
            r#","consumerGroup":"g""#,
            r#","consumerGroup":null"#,
            r#","consumerGroup":1"#,
        ]);
        (items, group).prop_map(|(items, group)| format!(r#"{{"acknowledgments":{items}{group}}}"#))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// The one-pass form never answers differently: what it takes, member by member reads the
        /// same; and it takes every batch without escapes that member by member accepts.
        #[test]
        fn both_readings_agree(body in body()) {
            let (typed, members) = both_readings(&body);
            match typed {
                Some(typed) => prop_assert_eq!(Ok(typed), members),
                None => prop_assert!(members.is_err() || body.contains('\\'), "not taken in one pass: {}", body),
            }
        }
    }
}
