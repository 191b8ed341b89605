//! Reads by offset: `POST /api/v1/fetch` (records of partitions from offsets) and
//! `POST /api/v1/partitions/changed` (the partitions of queues written since a time). Both answer
//! one entry per entry asked, in order; what is wrong with one entry's partition is that entry's
//! `error`, what is wrong with the request is a 400 naming the field.

use std::io::Write;

use actix_web::{HttpResponse, web};
use queen_store::offset_reads::{ChangedPage, ChangedPartition};
use serde::Serialize;

use super::authorize::Caller;
use super::body::{JsonObject, NoQuery, iso_time, read_body};
use super::timestamp;
use crate::broker::Broker;
use crate::broker::offset_reads::{
    self, ChangedEntry, FetchEntry, FetchRefusal, FetchedEntry, MAX_CHANGED_ENTRIES, MAX_CHANGED_PAGE, MAX_FETCH_BYTES,
    MAX_FETCH_ENTRIES,
};
use crate::error::ApiError;
use crate::names::{self, NameKind};

/// The entry's error when its queue or partition does not exist.
const UNKNOWN_TOPIC_OR_PARTITION: &str = "UNKNOWN_TOPIC_OR_PARTITION";
const OFFSET_OUT_OF_RANGE: &str = "OFFSET_OUT_OF_RANGE";

pub async fn fetch(
    broker: web::Data<Broker>,
    _: NoQuery,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let body = JsonObject::parse_body(&body, false)?;
    body.takes_only(&["entries", "maxBytes"])?;
    let max_bytes = byte_budget(&body)?.unwrap_or(MAX_FETCH_BYTES);
    let items = entries_of(&body, MAX_FETCH_ENTRIES)?;
    let entries = items.iter().map(|item| fetch_entry(item, max_bytes)).collect::<Result<Vec<_>, _>>()?;
    caller.check_queues(entries.iter().map(|e| e.queue.as_str()))?;
    let answers = offset_reads::fetch(&broker, &entries, max_bytes).await?;
    Ok(HttpResponse::Ok().content_type("application/json").body(fetch_answer(&answers)))
}

pub async fn changed(
    broker: web::Data<Broker>,
    _: NoQuery,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, broker.config.http.max_body_bytes, &broker).await?;
    let body = JsonObject::parse_body(&body, false)?;
    body.takes_only(&["entries"])?;
    let items = entries_of(&body, MAX_CHANGED_ENTRIES)?;
    let entries = items.iter().map(changed_entry).collect::<Result<Vec<_>, _>>()?;
    caller.check_queues(entries.iter().map(|e| e.queue.as_str()))?;
    let (safe_time, pages) = offset_reads::changed_since(&broker, &entries).await?;
    Ok(HttpResponse::Ok().json(ChangedAnswer {
        safe_time: timestamp(safe_time),
        entries: pages.into_iter().map(ChangedEntryJson::from).collect(),
    }))
}

/// The body's `entries`: required, not empty, at most `max`.
fn entries_of<'a>(body: &JsonObject<'a>, max: usize) -> Result<Vec<JsonObject<'a>>, ApiError> {
    let items = body.objects("entries")?.ok_or_else(|| ApiError::bad_request("entries is required"))?;
    if items.is_empty() {
        return Err(ApiError::bad_request("entries must not be empty"));
    }
    items.read_at_most(max, "entries")
}

/// A `maxBytes`: a positive integer, read as at most [`MAX_FETCH_BYTES`].
fn byte_budget(object: &JsonObject<'_>) -> Result<Option<i64>, ApiError> {
    match object.integer("maxBytes")? {
        Some(bytes) if bytes < 1 => Err(ApiError::bad_request(format!(
            "{} must be a positive integer, not {bytes}",
            object.name_of("maxBytes")
        ))),
        bytes => Ok(bytes.map(|b| b.min(MAX_FETCH_BYTES))),
    }
}

/// A queue or partition name an entry must carry.
fn required_name(item: &JsonObject<'_>, key: &str, kind: NameKind) -> Result<String, ApiError> {
    let name = item.required_string(key)?;
    names::check(kind, item.member(key), &name).map_err(ApiError::BadRequest)?;
    Ok(name)
}

fn fetch_entry(item: &JsonObject<'_>, call_bytes: i64) -> Result<FetchEntry, ApiError> {
    item.takes_only(&["queue", "partition", "offset", "maxBytes"])?;
    let offset = item
        .integer("offset")?
        .ok_or_else(|| ApiError::bad_request(format!("{} is required", item.name_of("offset"))))?;
    if offset < 0 {
        return Err(ApiError::bad_request(format!("{} must not be negative, not {offset}", item.name_of("offset"))));
    }
    Ok(FetchEntry {
        queue: required_name(item, "queue", NameKind::Queue)?,
        partition: required_name(item, "partition", NameKind::Partition)?,
        offset,
        max_bytes: byte_budget(item)?.unwrap_or(call_bytes),
    })
}

fn changed_entry(item: &JsonObject<'_>) -> Result<ChangedEntry, ApiError> {
    item.takes_only(&["queue", "since", "after", "limit"])?;
    let limit = match item.integer("limit")? {
        None => MAX_CHANGED_PAGE,
        Some(limit) if (1..=MAX_CHANGED_PAGE).contains(&limit) => limit,
        Some(limit) => {
            return Err(ApiError::bad_request(format!(
                "{} must be an integer from 1 to {MAX_CHANGED_PAGE}, not {limit}",
                item.name_of("limit")
            )));
        }
    };
    let since = item.string("since")?.map(|text| iso_time(&item.name_of("since"), &text)).transpose()?;
    let after = match item.string("after")?.as_deref() {
        None | Some("") => 0,
        Some(cursor) => cursor.parse::<i64>().ok().filter(|id| *id > 0).ok_or_else(|| {
            ApiError::bad_request(format!(
                "{} must be the `next` of an earlier page, not {cursor:?}",
                item.name_of("after")
            ))
        })?,
    };
    Ok(ChangedEntry { queue: required_name(item, "queue", NameKind::Queue)?, since, after, limit })
}

/// The fetch answer as JSON text. Written by hand so that each payload goes out as the JSON text
/// it was pushed as, byte for byte, without being parsed again: the push checked it, and a segment
/// never changes.
fn fetch_answer(entries: &[FetchedEntry]) -> Vec<u8> {
    let payload_bytes: usize = entries.iter().flat_map(|e| &e.records).map(|r| r.payload.len() + 128).sum();
    let mut out = Vec::with_capacity(payload_bytes + entries.len() * 64 + 16);
    out.extend_from_slice(b"{\"entries\":[");
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Writes into a Vec cannot fail.
        let _ =
            write!(out, "{{\"highWatermark\":{},\"logStartOffset\":{},", entry.high_watermark, entry.log_start_offset);
        if let Some(refusal) = entry.refusal {
            let code = match refusal {
                FetchRefusal::OffsetOutOfRange => OFFSET_OUT_OF_RANGE,
                FetchRefusal::UnknownTopicOrPartition => UNKNOWN_TOPIC_OR_PARTITION,
            };
            let _ = write!(out, "\"error\":\"{code}\",");
        }
        out.extend_from_slice(b"\"records\":[");
        for (j, record) in entry.records.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            let _ = write!(out, "{{\"offset\":{},\"transactionId\":", record.offset);
            let _ = serde_json::to_writer(&mut out, &record.transaction_id);
            out.extend_from_slice(b",\"payload\":");
            out.extend_from_slice(&record.payload);
            let _ = write!(out, ",\"ts\":\"{}\"}}", timestamp(record.stored_at));
        }
        out.extend_from_slice(b"]}");
    }
    out.extend_from_slice(b"]}");
    out
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ChangedAnswer {
    safe_time: String,
    entries: Vec<ChangedEntryJson>,
}

#[derive(Serialize)]
struct ChangedEntryJson {
    partitions: Vec<ChangedPartitionJson>,
    /// The cursor of the next page (the last partition's id); empty on the last page.
    next: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
}

impl From<ChangedPage> for ChangedEntryJson {
    fn from(page: ChangedPage) -> Self {
        match page {
            ChangedPage::UnknownQueue => ChangedEntryJson {
                partitions: Vec::new(),
                next: String::new(),
                error: Some(UNKNOWN_TOPIC_OR_PARTITION),
            },
            ChangedPage::Partitions { partitions, more } => {
                let next = partitions.last().filter(|_| more).map(|p| p.id.to_string()).unwrap_or_default();
                ChangedEntryJson { partitions: partitions.into_iter().map(Into::into).collect(), next, error: None }
            }
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ChangedPartitionJson {
    name: String,
    id: String,
    /// The offset of the last record written; -1 when none ever was.
    last_offset: i64,
    log_start: i64,
    /// Null for a partition nothing was ever written to.
    last_write_at: Option<String>,
}

impl From<ChangedPartition> for ChangedPartitionJson {
    fn from(p: ChangedPartition) -> Self {
        ChangedPartitionJson {
            name: p.name,
            id: p.id.to_string(),
            // Offsets start at 1, so 0 is "nothing written".
            last_offset: if p.last_offset > 0 { p.last_offset } else { -1 },
            log_start: p.retained_from,
            last_write_at: p.last_write_at.map(timestamp),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::offset_reads::FetchedRecord;
    use chrono::{DateTime, Utc};

    #[test]
    fn a_fetch_answer_carries_payloads_as_they_were_pushed() {
        let at: DateTime<Utc> = "2026-01-02T03:04:05.123456Z".parse().unwrap();
        let record = |offset, payload: &str| FetchedRecord {
            offset,
            transaction_id: format!("t\"{offset}"),
            payload: payload.as_bytes().to_vec(),
            stored_at: at,
        };
        let entries = [
            FetchedEntry {
                high_watermark: 3,
                log_start_offset: 1,
                refusal: None,
                records: vec![record(1, r#"{"a": [1, 2.50]}"#), record(2, "\"x\"")],
            },
            FetchedEntry {
                high_watermark: 0,
                log_start_offset: 0,
                refusal: Some(FetchRefusal::UnknownTopicOrPartition),
                records: Vec::new(),
            },
        ];
        let text = String::from_utf8(fetch_answer(&entries)).unwrap();
        assert!(text.contains(r#""payload":{"a": [1, 2.50]}"#), "byte for byte: {text}");
        let json: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(
            json,
            serde_json::json!({"entries": [
                {"highWatermark": 3, "logStartOffset": 1, "records": [
                    {"offset": 1, "transactionId": "t\"1", "payload": {"a": [1, 2.5]}, "ts": "2026-01-02T03:04:05.123456Z"},
                    {"offset": 2, "transactionId": "t\"2", "payload": "x", "ts": "2026-01-02T03:04:05.123456Z"}]},
                {"highWatermark": 0, "logStartOffset": 0, "error": "UNKNOWN_TOPIC_OR_PARTITION", "records": []}
            ]})
        );
    }
}
