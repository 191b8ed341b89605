//! Reads by offset: `POST /api/v1/fetch` and `POST /api/v1/partitions/changed`. Records come back
//! with the offsets pops give, from committed segments only, within the byte budgets, without a
//! lease or a cursor; retention moves `logStartOffset`; `safeTime` never passes a write that can
//! still commit.

use chrono::{DateTime, Utc};
use queen_store::log::{AppendPolicy, NewMessage, append_in_transaction};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp, TokensFile};
use crate::retention::{age, until_count};

/// Pushes `n` messages to `queue`/`partition` in one request (one segment): `{"label", "i"}`,
/// transaction ids `<label>-<i>`.
async fn segment(app: &TestApp, queue: &str, partition: &str, label: &str, n: usize) {
    let items: Vec<Value> = (0..n)
        .map(|i| {
            json!({"queue": queue, "partition": partition, "transactionId": format!("{label}-{i}"),
                        "payload": {"label": label, "i": i}})
        })
        .collect();
    app.push(Value::Array(items)).await;
}

async fn fetch(app: &TestApp, entries: Value) -> Answer {
    app.post("/api/v1/fetch", &json!({ "entries": entries })).await
}

/// The one entry of a fetch of `queue`/`partition` from `offset`, insisting on a 200.
async fn fetch_one(app: &TestApp, queue: &str, partition: &str, offset: i64, max_bytes: i64) -> Value {
    let entries = json!([{"queue": queue, "partition": partition, "offset": offset, "maxBytes": max_bytes}]);
    let answer = fetch(app, entries).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    answer.body["entries"][0].clone()
}

fn offsets(entry: &Value) -> Vec<i64> {
    entry["records"].as_array().expect("records").iter().map(|r| r["offset"].as_i64().expect("offset")).collect()
}

fn transaction_ids(entry: &Value) -> Vec<String> {
    entry["records"].as_array().expect("records").iter().map(|r| r["transactionId"].as_str().unwrap().into()).collect()
}

async fn changed(app: &TestApp, entry: Value) -> Answer {
    app.post("/api/v1/partitions/changed", &json!({"entries": [entry]})).await
}

fn time(value: &Value) -> DateTime<Utc> {
    value.as_str().unwrap_or_else(|| panic!("not a time: {value}")).parse().expect("ISO-8601")
}

#[actix_web::test]
async fn bad_bodies_are_refused_naming_the_field() {
    let app = TestApp::spawn().await;
    let entry = json!({"queue": "q", "partition": "p", "offset": 0, "maxBytes": 100});
    let with = |key: &str, value: Value| {
        let mut bad = entry.clone();
        bad[key] = value;
        json!({"entries": [bad]})
    };
    let without = |key: &str| {
        let mut bad = entry.clone();
        bad.as_object_mut().unwrap().remove(key);
        json!({"entries": [bad]})
    };
    let cases = [
        (json!({}), "entries is required"),
        (json!({"entries": {}}), "entries must be an array"),
        (json!({"entries": []}), "entries must not be empty"),
        (json!({"entries": [1]}), "entries[0] must be a JSON object"),
        (without("queue"), "entries[0].queue is required"),
        (with("queue", json!(7)), "entries[0].queue must be a string"),
        (with("partition", json!("a/b")), "entries[0].partition"),
        (without("partition"), "entries[0].partition is required"),
        (without("offset"), "entries[0].offset is required"),
        (with("offset", json!(-1)), "entries[0].offset must not be negative"),
        (with("offset", json!("3")), "entries[0].offset must be an integer"),
        (with("offset", json!(1.5)), "entries[0].offset must be an integer"),
        (with("maxBytes", json!(0)), "entries[0].maxBytes must be a positive integer"),
        (json!({"entries": [entry], "maxBytes": -5}), "maxBytes must be a positive integer"),
    ];
    for (body, expected) in cases {
        let answer = app.post("/api/v1/fetch", &body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}: {answer:?}");
        let error = answer.body["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(expected), "{body}: {error:?} should start with {expected:?}");
    }

    let many = |n: usize| Value::Array(vec![entry.clone(); n]);
    let refused = fetch(&app, many(1025)).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    assert_eq!(refused.body["error"], "entries holds 1025 entries; at most 1024 are allowed");
    let served = fetch(&app, many(1024)).await;
    assert_eq!(served.status, StatusCode::OK);
    assert_eq!(served.body["entries"].as_array().map(Vec::len), Some(1024));

    let discovery = [
        (json!({"queue": "q", "limit": 0}), "entries[0].limit must be an integer from 1 to 1000"),
        (json!({"queue": "q", "limit": 1001}), "entries[0].limit must be an integer from 1 to 1000"),
        (json!({"queue": "q", "since": "yesterday"}), "entries[0].since must be an ISO-8601 timestamp"),
        (json!({"queue": "q", "since": 12}), "entries[0].since must be a string"),
        (json!({"queue": "q", "after": "x"}), "entries[0].after must be the `next` of an earlier page"),
        (json!({"limit": 10}), "entries[0].queue is required"),
    ];
    for (entry, expected) in discovery {
        let answer = changed(&app, entry.clone()).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{entry}: {answer:?}");
        let error = answer.body["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(expected), "{entry}: {error:?} should start with {expected:?}");
    }
    let too_many = json!({"entries": vec![json!({"queue": "q"}); 101]});
    let answer = app.post("/api/v1/partitions/changed", &too_many).await;
    assert_eq!(answer.body["error"], "entries holds 101 entries; at most 100 are allowed", "{answer:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 0, "reads create nothing");
}

#[actix_web::test]
async fn records_across_segments_come_back_with_the_offsets_pops_give_and_move_nothing() {
    let app = TestApp::spawn().await;
    segment(&app, "orders", "p", "a", 3).await;
    segment(&app, "orders", "p", "b", 2).await;
    segment(&app, "orders", "p", "c", 4).await;
    segment(&app, "orders", "other", "o", 1).await;

    let entries = json!([
        {"queue": "orders", "partition": "p", "offset": 1, "maxBytes": 1_000_000},
        {"queue": "orders", "partition": "p", "offset": 5, "maxBytes": 1_000_000},
        {"queue": "orders", "partition": "other", "offset": 1, "maxBytes": 1_000_000},
        {"queue": "orders", "partition": "nobody", "offset": 0, "maxBytes": 1_000_000},
        {"queue": "nowhere", "partition": "p", "offset": 0, "maxBytes": 1_000_000},
        {"queue": "orders", "partition": "p", "offset": 0, "maxBytes": 1_000_000},
        {"queue": "orders", "partition": "p", "offset": 10, "maxBytes": 1_000_000},
        {"queue": "orders", "partition": "p", "offset": 11, "maxBytes": 1_000_000},
    ]);
    let answer = fetch(&app, entries).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let got = answer.body["entries"].as_array().expect("entries");
    assert_eq!(got.len(), 8, "one answer per entry asked");

    let whole = &got[0];
    assert_eq!((&whole["highWatermark"], &whole["logStartOffset"]), (&json!(10), &json!(1)));
    assert!(whole.get("error").is_none(), "{whole}");
    assert_eq!(offsets(whole), (1..=9).collect::<Vec<i64>>());
    assert_eq!(transaction_ids(whole), ["a-0", "a-1", "a-2", "b-0", "b-1", "c-0", "c-1", "c-2", "c-3"]);
    assert_eq!(whole["records"][3]["payload"], json!({"label": "b", "i": 0}));
    let stored_at: Vec<DateTime<Utc>> = whole["records"].as_array().unwrap().iter().map(|r| time(&r["ts"])).collect();
    assert!(stored_at.windows(2).all(|w| w[0] <= w[1]), "segments are stored in offset order: {stored_at:?}");
    assert_eq!(stored_at[0], stored_at[2], "one segment, one time");

    assert_eq!(offsets(&got[1]), vec![5, 6, 7, 8, 9], "from the middle of a segment");
    assert_eq!(transaction_ids(&got[2]), ["o-0"]);
    for unknown in [&got[3], &got[4]] {
        assert_eq!(unknown["error"], "UNKNOWN_TOPIC_OR_PARTITION", "{unknown}");
        assert_eq!(offsets(unknown), Vec::<i64>::new());
    }
    // Offsets start at 1: 0 is below the log's start, the client's cue to restart there.
    assert_eq!((&got[5]["error"], &got[5]["logStartOffset"]), (&json!("OFFSET_OUT_OF_RANGE"), &json!(1)));
    assert!(got[6].get("error").is_none(), "at the high watermark: nothing new, no error: {}", got[6]);
    assert_eq!(offsets(&got[6]), Vec::<i64>::new());
    assert_eq!(got[7]["error"], "OFFSET_OUT_OF_RANGE", "past the end");

    // Nothing was leased, no cursor exists: a group and queue mode pop everything, at the
    // offsets the fetch gave.
    assert_eq!(app.count("SELECT count(*) FROM queen.log_consumers").await, 0, "no cursor");
    let popped = app.pop("queue/orders/partition/p", "batch=100&consumerGroup=g&wait=false").await.messages();
    let popped_offsets: Vec<i64> = popped.iter().map(|m| m["offset"].as_i64().expect("offset")).collect();
    assert_eq!(popped_offsets, offsets(whole));
    let queue_mode = app.pop("queue/orders/partition/p", "batch=100&wait=false").await;
    assert_eq!(queue_mode.messages().len(), 9);
}

#[actix_web::test]
async fn max_bytes_bound_each_entry_and_the_call_and_the_first_record_always_comes() {
    let app = TestApp::spawn().await;
    // Payloads of exactly 100 bytes of JSON text (a string of 98 characters), in one segment.
    let items: Vec<Value> = (0..10)
        .map(|i| {
            json!({"queue": "sized", "partition": "p", "transactionId": format!("s-{i}"),
                        "payload": format!("{i}{}", "x".repeat(97))})
        })
        .collect();
    app.push(Value::Array(items.clone())).await;
    segment(&app, "sized", "q", "q", 3).await;
    // The same records one segment each.
    for item in &items {
        let mut item = item.clone();
        item["partition"] = json!("r");
        app.push(json!([item])).await;
    }

    for partition in ["p", "r"] {
        assert_eq!(offsets(&fetch_one(&app, "sized", partition, 1, 250).await), vec![1, 2], "a third would pass 250");
        assert_eq!(offsets(&fetch_one(&app, "sized", partition, 1, 300).await), vec![1, 2, 3], "exactly 300 fits");
        assert_eq!(offsets(&fetch_one(&app, "sized", partition, 4, 10).await), vec![4], "a record over the budget");
    }

    // The call's budget is shared in order: the first entry spends it, the second gets nothing
    // (and no error), which tells the client to ask again.
    let body = json!({"maxBytes": 250, "entries": [
        {"queue": "sized", "partition": "p", "offset": 1, "maxBytes": 10_000},
        {"queue": "sized", "partition": "q", "offset": 1, "maxBytes": 10_000}]});
    let answer = app.post("/api/v1/fetch", &body).await;
    assert_eq!(offsets(&answer.body["entries"][0]), vec![1, 2]);
    assert_eq!(offsets(&answer.body["entries"][1]), Vec::<i64>::new());
    assert!(answer.body["entries"][1].get("error").is_none(), "{answer:?}");

    // A reader with a small budget reads every record once, in order; the rounds after the first
    // start inside the segment and find it in the segment cache.
    let hits = app.metric("queen_segment_cache_hits_total").await;
    for partition in ["p", "r"] {
        let mut read = Vec::new();
        let mut next = 1;
        loop {
            let entry = fetch_one(&app, "sized", partition, next, 250).await;
            let got = offsets(&entry);
            if got.is_empty() {
                assert_eq!(next, entry["highWatermark"].as_i64().unwrap());
                break;
            }
            next = got.last().unwrap() + 1;
            read.extend(got);
        }
        assert_eq!(read, (1..=10).collect::<Vec<i64>>(), "{partition}");
    }
    assert!(app.metric("queen_segment_cache_hits_total").await > hits, "served from the segment cache");
}

#[actix_web::test]
async fn an_encrypted_queue_reads_back_in_plain_text() {
    let key = "7f3c9a1e5b2d4f6081a3c5e7092b4d6f8a1c3e5f7092b4d6e8f0a2c4e6081b3d";
    let app = TestApp::spawn_with(|config| config.encryption.key = Some(key.into())).await;
    app.configure("vault", json!({"encryptionEnabled": true})).await;
    segment(&app, "vault", "p", "secret", 2).await;
    let sealed: Vec<u8> =
        app.db.connect().await.query_one("SELECT body FROM queen.log_segments", &[]).await.unwrap().get(0);
    assert!(sealed.starts_with(b"QSE1"), "stored sealed");
    let entry = fetch_one(&app, "vault", "p", 1, 1_000_000).await;
    assert_eq!(entry["records"][1]["payload"], json!({"label": "secret", "i": 1}), "{entry}");
}

#[actix_web::test]
async fn retention_moves_the_log_start_and_reads_below_it_are_out_of_range() {
    let app = TestApp::spawn_with(|config| config.maintenance.interval_ms = 100).await;
    app.configure("aged", json!({"retentionEnabled": true, "retentionSeconds": 600})).await;
    segment(&app, "aged", "p", "old", 3).await;
    segment(&app, "aged", "p", "new", 2).await;
    age(&app, "aged", 4).await;
    until_count(&app, "SELECT retained_from FROM queen.partitions", 4).await;

    let below = fetch_one(&app, "aged", "p", 1, 1_000_000).await;
    assert_eq!(below["error"], "OFFSET_OUT_OF_RANGE");
    assert_eq!((&below["logStartOffset"], &below["highWatermark"]), (&json!(4), &json!(6)));
    assert_eq!(transaction_ids(&fetch_one(&app, "aged", "p", 4, 1_000_000).await), ["new-0", "new-1"]);
    let listed = changed(&app, json!({"queue": "aged"})).await;
    let partition = &listed.body["entries"][0]["partitions"][0];
    assert_eq!((&partition["logStart"], &partition["lastOffset"]), (&json!(4), &json!(5)), "{listed:?}");

    // Everything retained away: the log starts at the high watermark and the last offset stays.
    age(&app, "aged", i64::MAX).await;
    until_count(&app, "SELECT retained_from FROM queen.partitions", 6).await;
    let empty = fetch_one(&app, "aged", "p", 6, 1_000_000).await;
    assert_eq!((&empty["logStartOffset"], &empty["highWatermark"]), (&json!(6), &json!(6)));
    assert!(empty.get("error").is_none());
    assert_eq!(fetch_one(&app, "aged", "p", 5, 1_000_000).await["error"], "OFFSET_OUT_OF_RANGE");
}

#[actix_web::test]
async fn partitions_are_listed_in_creation_order_page_by_page_with_what_they_hold() {
    let app = TestApp::spawn().await;
    for name in ["c", "a", "b", "d", "e"] {
        segment(&app, "listed", name, name, 2).await;
    }
    app.push(json!([{"queue": "other", "partition": "x", "payload": 1}])).await;

    let mut names = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut entry = json!({"queue": "listed", "limit": 2});
        if let Some(cursor) = &after {
            entry["after"] = json!(cursor);
        }
        let answer = changed(&app, entry).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        let page = &answer.body["entries"][0];
        for partition in page["partitions"].as_array().expect("partitions") {
            assert_eq!((&partition["lastOffset"], &partition["logStart"]), (&json!(2), &json!(1)), "{partition}");
            assert!(partition["id"].as_str().is_some_and(|id| id.parse::<i64>().is_ok()), "{partition}");
            time(&partition["lastWriteAt"]);
            names.push(partition["name"].as_str().unwrap().to_owned());
        }
        match page["next"].as_str() {
            Some("") => break,
            Some(next) => after = Some(next.to_owned()),
            None => panic!("no next: {page}"),
        }
    }
    assert_eq!(names, ["c", "a", "b", "d", "e"], "creation order, each once");

    let unknown = changed(&app, json!({"queue": "nowhere"})).await;
    assert_eq!(unknown.body["entries"][0]["error"], "UNKNOWN_TOPIC_OR_PARTITION", "{unknown:?}");
    time(&unknown.body["safeTime"]);
}

/// An append stamps its segment inside its transaction and commits later. While a push
/// transaction that has stamped its segment is open (held here, through the store's own append),
/// the safe time must not pass the stamp, although the database's clock already has; asking again
/// from it once the push committed finds the partition.
#[actix_web::test]
async fn the_safe_time_stays_behind_a_push_that_can_still_commit() {
    let app = TestApp::spawn().await;
    app.push(json!([{"queue": "held", "partition": "first", "payload": 0}])).await;
    app.push(json!([{"queue": "held", "partition": "second", "payload": 0}])).await;
    let ids = app.db.connect().await;
    let destination = app.destination("held", "first").await;
    let mut pusher = app.store_connection("held-push").await;
    let held = pusher.transaction().await.expect("a transaction");
    let message = NewMessage {
        message_id: uuid::Uuid::now_v7(),
        transaction_id: "held-1".into(),
        trace_id: None,
        producer: None,
        payload: b"1".to_vec(),
        received: None,
    };
    let appended =
        append_in_transaction(&held, destination, &[message], &AppendPolicy::default()).await.expect("the append");
    let stamped = appended.segment.expect("a segment").created_at;
    // The second partition is written after the stamp, and commits at once.
    app.push(json!([{"queue": "held", "partition": "second", "payload": 1}])).await;
    let clock: DateTime<Utc> = ids.query_one("SELECT clock_timestamp()", &[]).await.unwrap().get(0);
    assert!(stamped < clock);

    let during = changed(&app, json!({"queue": "held"})).await;
    let safe_time = time(&during.body["safeTime"]);
    assert!(safe_time <= stamped, "the safe time {safe_time} passed a write stamped {stamped} that can still commit");
    let first = &during.body["entries"][0]["partitions"][0];
    assert_eq!((&first["name"], &first["lastOffset"]), (&json!("first"), &json!(1)), "the held write is invisible");
    let fetched = fetch_one(&app, "held", "first", 1, 1_000_000).await;
    assert_eq!((offsets(&fetched), &fetched["highWatermark"]), (vec![1], &json!(2)), "committed records only");

    held.commit().await.expect("the push commits");
    let after = changed(&app, json!({"queue": "held", "since": during.body["safeTime"]})).await;
    let names: Vec<&str> = after.body["entries"][0]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["first", "second"], "nothing missed: {after:?}");
    assert!(time(&after.body["safeTime"]) > stamped, "with nothing open, the safe time moves on");
    assert_eq!(transaction_ids(&fetch_one(&app, "held", "first", 2, 1_000_000).await), ["held-1"]);
}

/// Both routes name their queues in the body: a read-only token confined to a queue prefix reads
/// its queues and is refused (403, whole) a call that names another.
#[actix_web::test]
async fn a_token_confined_to_queues_reads_only_those() {
    const READER: &str = "orders-reader-0123456789abcdef";
    let tokens = TokensFile::new(&format!(
        "[[token]]\nname = \"reader\"\ntoken = \"{READER}\"\nrole = \"read-only\"\nqueues = [\"orders.\"]\n"
    ));
    let file = tokens.path();
    let app = TestApp::spawn_with(move |config| config.auth.tokens_file = Some(file)).await;
    let call = |path: &'static str, body: Value| {
        let request = app.http.post(app.url(path)).bearer_auth(READER).json(&body);
        async move { request.send().await.expect("a response").status() }
    };
    let entry = |queue: &str| json!({"queue": queue, "partition": "p", "offset": 0, "maxBytes": 100});

    assert_eq!(call("/api/v1/fetch", json!({"entries": [entry("orders.eu")]})).await, StatusCode::OK);
    let mixed = json!({"entries": [entry("orders.eu"), entry("billing")]});
    assert_eq!(call("/api/v1/fetch", mixed).await, StatusCode::FORBIDDEN);
    let discovery = |queue: &str| json!({"entries": [{"queue": queue}]});
    assert_eq!(call("/api/v1/partitions/changed", discovery("orders.eu")).await, StatusCode::OK);
    assert_eq!(call("/api/v1/partitions/changed", discovery("billing")).await, StatusCode::FORBIDDEN);
    let anonymous = app.post("/api/v1/fetch", &json!({"entries": [entry("orders.eu")]})).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
}
