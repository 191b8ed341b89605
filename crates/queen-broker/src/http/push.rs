//! `POST /api/v1/push`: a JSON body, or the binary QPB1 body (`super::binary_push`).

use std::borrow::Cow;

use actix_web::{HttpRequest, HttpResponse, web};
use queen_store::log::Appended;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::authorize::Caller;
use super::binary_push::{self, BinaryPush, Limits, PushCounts};
use super::body::{JsonObject, MAX_DATA_NESTING, NoQuery, ObjectOnly, hold_decompressed, nests_deeper_than, read_body};
use crate::broker::Broker;
use crate::broker::push::{PushItem, PushResults, Pushed, push};
use crate::error::ApiError;
use crate::names::{self, DEFAULT_PARTITION, NameKind};

pub async fn handle(
    broker: web::Data<Broker>,
    _: NoQuery,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let started = std::time::Instant::now();
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let (mut items, counts_only, _decompressed) = if binary_push::is_binary(&req, &body, binary_push::PUSH_MAGIC) {
        let BinaryPush { items, counts_only, decompressed_bytes } =
            binary_push::parse_push(&body, Limits::of(&broker.config))?;
        (items, counts_only, Some(hold_decompressed(&broker, body.len(), decompressed_bytes)?))
    } else {
        (parse_items(&body, broker.config.push.max_items)?, false, None)
    };
    stamp(&caller, &mut items)?;
    // Timed whatever comes of it: a stalled database's 503s are the answers to see.
    let results = push(&broker, items).await;
    broker.metrics.push_duration.observe(started.elapsed().as_secs_f64());
    let results = results?;
    let mut answer = HttpResponse::Created();
    if counts_only {
        return Ok(answer.json(PushCounts::of(&results)));
    }
    Ok(match &results {
        PushResults::Stored(pushed) => {
            answer.json(pushed.iter().enumerate().map(|(index, p)| ItemResult::new(index, p)).collect::<Vec<_>>())
        }
        PushResults::Buffered(items) => answer
            .json(items.iter().enumerate().map(|(index, item)| BufferedResult::new(index, item)).collect::<Vec<_>>()),
    })
}

/// Checks that the caller may push to every item's queue, and records it as their producer.
pub fn stamp(caller: &Caller, items: &mut [PushItem]) -> Result<(), ApiError> {
    caller.check_queues(items.iter().map(|item| item.queue.as_str()))?;
    if let Some(producer) = caller.subject() {
        // Refused here, alone: in a segment it would fail the append of every push fused with it.
        if producer.len() > usize::from(u16::MAX) {
            return Err(ApiError::bad_request(format!(
                "the token's subject is {} bytes long; a message records at most {} as its producer",
                producer.len(),
                u16::MAX
            )));
        }
        for item in items {
            item.producer = Some(producer.to_owned());
        }
    }
    Ok(())
}

/// Every item of a push body, checked; one bad item refuses the whole request, so nothing is
/// written. An empty `items` is no items (the official JavaScript client's buffered producer
/// flushes an empty batch when it closes). (Public for the push-path benchmark.)
pub fn parse_items(body: &[u8], max_items: usize) -> Result<Vec<PushItem>, ApiError> {
    match TypedPush::items(body, max_items) {
        Some(items) => Ok(items),
        None => items_by_member(body, max_items),
    }
}

/// The items read member by member, each wrong one named in a 400.
fn items_by_member(body: &[u8], max_items: usize) -> Result<Vec<PushItem>, ApiError> {
    let body = JsonObject::parse_body(body, false)?;
    body.takes_only(&["items"])?;
    let items = body.objects("items")?.ok_or_else(|| ApiError::bad_request("items is required"))?;
    items.read_at_most(max_items, "messages")?.iter().map(parse_item).collect()
}

/// The members of a push item, here and in a transaction's push operation.
const ITEM_MEMBERS: &[&str] = &["queue", "partition", "payload", "transactionId", "traceId"];

pub fn parse_item(item: &JsonObject<'_>) -> Result<PushItem, ApiError> {
    if item.raw_or_null("producerSub").is_some() {
        return Err(ApiError::bad_request(format!(
            "{} is set by the broker, from the caller's token; leave it out",
            item.name_of("producerSub")
        )));
    }
    item.takes_only(ITEM_MEMBERS)?;
    let checked = |kind, key: &str, value: String| {
        names::check_new(kind, item.member(key), &value).map(|()| value).map_err(ApiError::BadRequest)
    };
    let queue = checked(NameKind::Queue, "queue", item.required_string("queue")?)?;
    let partition = checked(
        NameKind::Partition,
        "partition",
        item.string("partition")?.unwrap_or_else(|| DEFAULT_PARTITION.into()),
    )?;
    let transaction_id = match item.string("transactionId")? {
        Some(id) => Some(checked(NameKind::TransactionId, "transactionId", id)?),
        None => None,
    };
    let trace_id = item
        .string("traceId")?
        .map(|trace| {
            Uuid::parse_str(&trace).map_err(|_| {
                ApiError::bad_request(format!("{} must be a UUID, not {trace:?}", item.name_of("traceId")))
            })
        })
        .transpose()?;
    Ok(item_of(queue, partition, transaction_id, trace_id, item.raw_or_null("payload")))
}

/// A checked item, its transaction id minted when the producer gave none.
fn item_of(
    queue: String,
    partition: String,
    transaction_id: Option<String>,
    trace_id: Option<Uuid>,
    payload: Option<&RawValue>,
) -> PushItem {
    let transaction_id = transaction_id.unwrap_or_else(|| queen_log::new_message_id().to_string());
    // The payload is kept as the JSON text it was sent as; absent means null.
    let payload = payload.map_or("null", RawValue::get).as_bytes().to_vec();
    let message_id = queen_log::new_message_id();
    PushItem { queue, partition, transaction_id, trace_id, producer: None, message_id, payload, received: None }
}

/// A push body as the clients send it, read in one pass into typed members borrowed from the
/// body, as an ack batch is (`super::ack`): member by member passes over each item three times
/// and builds a map of it. This form decides no answer: a body it does not take whole (an
/// unknown or repeated member, `producerSub`, a value of another type or one the checks refuse,
/// too many items, a payload too deep) is read again member by member, which accepts it the
/// same way or names what is wrong.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TypedPush<'a> {
    #[serde(borrow)]
    items: Vec<ObjectOnly<TypedItem<'a>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TypedItem<'a> {
    #[serde(borrow)]
    queue: Cow<'a, str>,
    #[serde(borrow)]
    partition: Option<Cow<'a, str>>,
    /// `null` reads as absent, which stores the same `null`.
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
    #[serde(borrow)]
    transaction_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    trace_id: Option<&'a str>,
}

impl TypedPush<'_> {
    /// The body's items, as [`items_by_member`] reads them; `None` when this form does not take it.
    fn items(body: &[u8], max_items: usize) -> Option<Vec<PushItem>> {
        let ObjectOnly(push) = serde_json::from_slice::<ObjectOnly<TypedPush<'_>>>(body).ok()?;
        if push.items.len() > max_items {
            return None;
        }
        push.items.into_iter().map(|ObjectOnly(item)| item.item()).collect()
    }
}

impl TypedItem<'_> {
    fn item(self) -> Option<PushItem> {
        let checked = |kind, value: Cow<'_, str>| names::check_new(kind, "", &value).ok().map(|()| value.into_owned());
        let queue = checked(NameKind::Queue, self.queue)?;
        let partition = checked(NameKind::Partition, self.partition.unwrap_or(Cow::Borrowed(DEFAULT_PARTITION)))?;
        let transaction_id = match self.transaction_id {
            Some(id) => Some(checked(NameKind::TransactionId, id)?),
            None => None,
        };
        let trace_id = match self.trace_id {
            Some(trace) => Some(Uuid::parse_str(trace).ok()?),
            None => None,
        };
        // The body's bound on nesting, where a payload sits three levels in; only a payload can
        // nest in a body this form takes, so only its bytes are scanned.
        if self.payload.is_some_and(|payload| nests_deeper_than(payload.get().as_bytes(), MAX_DATA_NESTING)) {
            return None;
        }
        Some(item_of(queue, partition, transaction_id, trace_id, self.payload))
    }
}

/// One item's answer. Field names are the ones the official client reads.
#[derive(Serialize)]
pub struct ItemResult<'a> {
    index: usize,
    status: &'static str,
    transaction_id: &'a str,
    message_id: Uuid,
    partition_id: String,
    offset: i64,
}

impl<'a> ItemResult<'a> {
    pub fn new(index: usize, pushed: &'a Pushed) -> Self {
        let (status, offset, message_id) = match pushed.outcome {
            Appended::Queued { offset, message_id } => ("queued", offset, message_id),
            Appended::Duplicate { offset, message_id } => ("duplicate", offset, message_id),
        };
        ItemResult {
            index,
            status,
            transaction_id: &pushed.transaction_id,
            message_id,
            partition_id: pushed.partition_id.to_string(),
            offset,
        }
    }
}

/// One item's answer while push maintenance is on: journaled, not in the log yet, so it has no
/// partition id or offset.
#[derive(Serialize)]
pub struct BufferedResult<'a> {
    index: usize,
    status: &'static str,
    transaction_id: &'a str,
    message_id: Uuid,
    queue: &'a str,
    partition: &'a str,
}

impl<'a> BufferedResult<'a> {
    fn new(index: usize, item: &'a PushItem) -> Self {
        BufferedResult {
            index,
            status: "buffered",
            transaction_id: &item.transaction_id,
            message_id: item.message_id,
            queue: &item.queue,
            partition: &item.partition,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::http::arbitrary_bodies::{Member, object};

    fn error_of(body: &str) -> String {
        match parse_items(body.as_bytes(), 100) {
            Err(ApiError::BadRequest(message)) => message,
            other => panic!("expected a 400 for {body}, got {other:?}"),
        }
    }

    #[test]
    fn payloads_are_kept_as_sent() {
        let items = parse_items(br#"{"items":[{"queue":"q","payload":{"a": [1, 2.50]}},{"queue":"q"}]}"#, 10).unwrap();
        assert_eq!(items[0].payload, br#"{"a": [1, 2.50]}"#);
        assert_eq!(items[0].partition, "Default");
        assert_eq!(items[1].payload, b"null");
        assert!(!items[1].transaction_id.is_empty());
    }

    #[test]
    fn bad_items_are_named() {
        assert_eq!(error_of("{"), "the request body is not valid JSON: EOF while parsing an object at line 1 column 1");
        assert_eq!(error_of("[]"), "the request body must be a JSON object");
        assert_eq!(error_of("{}"), "items is required");
        assert_eq!(error_of(r#"{"items":null}"#), "items is required");
        assert_eq!(error_of(r#"{"items":{"queue":"q"}}"#), "items must be an array of objects");
        assert_eq!(error_of(r#"{"items":[{"queue":"q"},{"payload":1}]}"#), "items[1].queue is required");
        assert_eq!(error_of(r#"{"items":[{"queue":7}]}"#), "items[0].queue must be a string");
        assert!(error_of(r#"{"items":[{"queue":"q","partition":""}]}"#).starts_with("items[0].partition"));
        assert!(
            error_of(r#"{"items":[{"queue":"q","traceId":"nope"}]}"#).starts_with("items[0].traceId must be a UUID")
        );
        assert!(error_of(r#"{"items":[1]}"#).starts_with("items[0] must be a JSON object"));
        assert_eq!(
            error_of(r#"{"items":[{"queue":"q","data":1}]}"#),
            "items[0].data is not a member the broker reads here; items[0] takes queue, partition, payload, \
             transactionId, traceId"
        );
        assert_eq!(
            error_of(r#"{"items":[],"bufferMs":5}"#),
            "bufferMs is not a member the broker reads here; the body takes items"
        );
        assert!(
            error_of(r#"{"items":[{"queue":"q","producerSub":null}]}"#).starts_with("items[0].producerSub is set by")
        );
        let long = format!(r#"{{"items":[{{"queue":"q","{}\n":1}}]}}"#, "k".repeat(100));
        assert!(error_of(&long).starts_with(&format!("items[0].{}… is not", "k".repeat(64))));
    }

    #[test]
    fn an_empty_push_is_no_items() {
        assert_eq!(parse_items(br#"{"items":[]}"#, 10).unwrap(), Vec::new());
    }

    /// Both readings of a body, with what each item was given at random (its message id, and a
    /// transaction id minted for it) taken out.
    fn both_readings(body: &str, max_items: usize) -> (Option<Vec<PushItem>>, Result<Vec<PushItem>, String>) {
        let fixed = |mut items: Vec<PushItem>| {
            for item in &mut items {
                item.message_id = Uuid::nil();
                if Uuid::parse_str(&item.transaction_id).is_ok() {
                    item.transaction_id = "minted".to_owned();
                }
            }
            items
        };
        let typed = TypedPush::items(body.as_bytes(), max_items).map(fixed);
        let members = items_by_member(body.as_bytes(), max_items).map(fixed).map_err(|e| e.to_string());
        (typed, members)
    }

    #[test]
    fn the_body_the_clients_send_is_read_in_one_pass_as_member_by_member() {
        let body = r#"{"items":[{"queue":"q","partition":"p1","payload":{"a": [1, 2.50]},"transactionId":"t-1",
            "traceId":"0193a8e0-7c4e-7000-8000-00000000000a"},{"queue":"q","payload":null},{"queue":"q"}]}"#;
        let (typed, members) = both_readings(body, 10);
        let typed = typed.expect("the one-pass form takes what the clients send");
        assert_eq!(Ok(typed.clone()), members);
        assert_eq!(typed[0].payload, br#"{"a": [1, 2.50]}"#);
        assert_eq!((typed[1].payload.as_slice(), typed[1].partition.as_str()), (&b"null"[..], "Default"));
        assert_eq!(typed[2].transaction_id, "minted");
        let nested =
            |depth| format!(r#"{{"items":[{{"queue":"q","payload":{}1{}}}]}}"#, "[".repeat(depth), "]".repeat(depth));
        assert!(both_readings(&nested(MAX_DATA_NESTING), 10).0.is_some());
        assert!(both_readings(&nested(MAX_DATA_NESTING + 1), 10).0.is_none());
        assert!(error_of(&nested(MAX_DATA_NESTING + 1)).contains("levels deep"));
    }

    /// A value of the right type, mostly, or of another.
    const WRONG: &[&str] = &["3", "null", "true", "{}", r#""""#, r#""a/b""#, r#""t\u002d2""#, "[1]"];

    fn item() -> impl Strategy<Value = String> {
        let members = vec![
            Member::new("queue", 0.95, &[r#""q""#, r#""q\u0031""#]),
            Member::new("partition", 0.5, &[r#""p1""#, r#""Default""#]),
            Member::new("payload", 0.5, &["null", "7", r#"{"a": [1, 2.50]}"#, r#""x\ny""#, "[[[]]]"]),
            Member::new("transactionId", 0.5, &[r#""t-1""#, r#""t-2""#]),
            Member::new("traceId", 0.5, &[r#""0193a8e0-7c4e-7000-8000-00000000000a""#, "null"]),
        ];
        object(members, WRONG, &["producerSub", "data", "queue", r"transaction\u0049d", "payload"])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// The one-pass form never answers differently: what it takes, member by member reads the
        /// same; and it takes every body without escapes that member by member accepts.
        #[test]
        fn both_readings_agree(items in prop::collection::vec(item(), 0..4), max_items in 2usize..4) {
            let body = format!(r#"{{"items":[{}]}}"#, items.join(","));
            let (typed, members) = both_readings(&body, max_items);
            match typed {
                Some(typed) => prop_assert_eq!(Ok(typed), members),
                None => prop_assert!(members.is_err() || body.contains('\\'), "not taken in one pass: {}", body),
            }
        }
    }

    #[test]
    fn too_many_items_are_refused() {
        let body = format!(r#"{{"items":[{}]}}"#, [r#"{"queue":"q"}"#; 3].join(","));
        assert!(parse_items(body.as_bytes(), 2).is_err());
    }
}
