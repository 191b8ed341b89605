//! `POST /api/v1/push`: a JSON body, or the binary QPB1 body (`super::binary_push`).

use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use queen_store::log::Appended;
use serde::Serialize;
use uuid::Uuid;

use super::authorize::Caller;
use super::binary_push::{self, BinaryPush, Limits, PushCounts};
use super::body::{JsonObject, NoQuery, read_body};
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
    let (mut items, counts_only) = if req.content_type() == binary_push::CONTENT_TYPE {
        let BinaryPush { items, counts_only } = binary_push::parse_push(&body, Limits::of(&broker.config))?;
        (items, counts_only)
    } else {
        (parse_items(&body, broker.config.push.max_items)?, false)
    };
    stamp(&caller, &mut items)?;
    let results = push(&broker, items).await?;
    broker.metrics.push_duration.observe(started.elapsed().as_secs_f64());
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
    if let Some(producer) = caller.producer() {
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
    let body = JsonObject::parse_body(body, false)?;
    body.takes_only(&["items"])?;
    let items = body.objects("items")?.ok_or_else(|| ApiError::bad_request("items is required"))?;
    if items.len() > max_items {
        return Err(ApiError::bad_request(format!(
            "items holds {} messages; at most {max_items} are allowed",
            items.len()
        )));
    }
    items.iter().map(parse_item).collect()
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
        names::check(kind, item.member(key), &value).map(|()| value).map_err(ApiError::BadRequest)
    };
    let queue = checked(NameKind::Queue, "queue", item.required_string("queue")?)?;
    let partition = checked(
        NameKind::Partition,
        "partition",
        item.string("partition")?.unwrap_or_else(|| DEFAULT_PARTITION.into()),
    )?;
    let transaction_id = match item.string("transactionId")? {
        Some(id) => checked(NameKind::TransactionId, "transactionId", id)?,
        None => queen_log::new_message_id().to_string(),
    };
    let trace_id = item
        .string("traceId")?
        .map(|trace| {
            Uuid::parse_str(&trace).map_err(|_| {
                ApiError::bad_request(format!("{} must be a UUID, not {trace:?}", item.name_of("traceId")))
            })
        })
        .transpose()?;
    // The payload is kept as the JSON text it was sent as; absent means null.
    let payload = item.raw_or_null("payload").map_or("null", |raw| raw.get()).as_bytes().to_vec();
    let message_id = queen_log::new_message_id();
    Ok(PushItem { queue, partition, transaction_id, trace_id, producer: None, message_id, payload, received: None })
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
    use super::*;

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

    #[test]
    fn too_many_items_are_refused() {
        let body = format!(r#"{{"items":[{}]}}"#, [r#"{"queue":"q"}"#; 3].join(","));
        assert!(parse_items(body.as_bytes(), 2).is_err());
    }
}
