//! The framed pop answer (QPF1) of a pop with `frames=true`: decoded here, it says what the JSON
//! answer to the same pop says; acks take its partition and lease ids; what it cannot carry, and
//! every empty answer, stays JSON.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::TestApp;

/// An answer's status, `Content-Type` and bytes.
struct Raw {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

impl Raw {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text()))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn get_raw(app: &TestApp, path: &str) -> Raw {
    let response = app.http.get(app.url(path)).send().await.expect("GET");
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().expect("a text header").to_owned())
        .unwrap_or_default();
    let body = response.bytes().await.expect("a body").to_vec();
    Raw { status, content_type, body }
}

/// A pop that must answer QPF1; decoded.
async fn framed(app: &TestApp, path: &str) -> Framed {
    let raw = get_raw(app, path).await;
    assert_eq!(raw.status, StatusCode::OK, "{path}: {}", raw.text());
    assert_eq!(raw.content_type, "application/x-queen-pop", "{path}");
    Framed::decode(&raw.body)
}

/// A pop that must answer JSON with messages (or a 200 JSON body without them).
async fn json_pop(app: &TestApp, path: &str) -> Value {
    let raw = get_raw(app, path).await;
    assert_eq!(raw.status, StatusCode::OK, "{path}: {}", raw.text());
    assert_eq!(raw.content_type, "application/json", "{path}");
    raw.json()
}

/// Reads little-endian fields; a read past the end fails the test.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let piece = self.data.get(self.at..self.at + n).unwrap_or_else(|| panic!("truncated at {}", self.at));
        self.at += n;
        piece
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take(2).try_into().unwrap())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn str16(&mut self) -> String {
        let n = usize::from(self.u16());
        String::from_utf8(self.take(n).to_vec()).expect("UTF-8")
    }
    fn uuid(&mut self) -> Uuid {
        Uuid::from_slice(self.take(16)).expect("16 bytes")
    }
    fn done(&self) -> bool {
        self.at == self.data.len()
    }
}

#[derive(Debug)]
struct Framed {
    version: u8,
    own_keys: Option<Value>,
    queue: String,
    lease_id: String,
    consumer_group: String,
    claims: Vec<Claim>,
}

#[derive(Debug)]
struct Claim {
    partition_id: u64,
    partition: String,
    start: u64,
    end: u64,
    delivery_attempt: u32,
    records: Vec<Record>,
}

#[derive(Debug)]
struct Record {
    base_offset: u64,
    created_at_us: i64,
    /// 0: the frames raw, 1: one zstd frame of them (a segment as stored).
    codec: u8,
    frames: Vec<StoredFrame>,
}

#[derive(Debug)]
struct StoredFrame {
    message_id: Uuid,
    trace_id: Option<Uuid>,
    transaction_id: String,
    producer: Option<String>,
    payload: Vec<u8>,
}

impl Framed {
    fn decode(body: &[u8]) -> Framed {
        let mut r = Reader { data: body, at: 0 };
        assert_eq!(r.take(4), b"QPF1");
        let version = r.u8();
        let own_keys = match version {
            0 => None,
            1 => {
                let n = r.u32() as usize;
                Some(serde_json::from_slice(r.take(n)).expect("the JSON part"))
            }
            other => panic!("version {other}"),
        };
        let (queue, lease_id, consumer_group) = (r.str16(), r.str16(), r.str16());
        let claims = (0..r.u32())
            .map(|_| {
                let (partition_id, partition) = (r.u64(), r.str16());
                let (start, end, delivery_attempt) = (r.u64(), r.u64(), r.u32());
                let records = (0..r.u32()).map(|_| Self::record(&mut r)).collect();
                Claim { partition_id, partition, start, end, delivery_attempt, records }
            })
            .collect();
        assert!(r.done(), "bytes after the last claim");
        Framed { version, own_keys, queue, lease_id, consumer_group, claims }
    }

    fn record(r: &mut Reader<'_>) -> Record {
        let (base_offset, created_at_us, count, codec) = (r.u64(), r.i64(), r.u32(), r.u8());
        let len = r.u32() as usize;
        let raw = match codec {
            0 => r.take(len).to_vec(),
            1 => zstd::decode_all(r.take(len)).expect("a zstd frame"),
            other => panic!("codec {other}"),
        };
        let mut bytes = Reader { data: &raw, at: 0 };
        let frames = (0..count)
            .map(|_| {
                let len = bytes.u32() as usize;
                let mut frame = Reader { data: bytes.take(len), at: 0 };
                let flags = frame.u8();
                assert_eq!(flags & !0x03, 0, "only the trace and producer flags");
                let message_id = frame.uuid();
                let trace_id = (flags & 0x01 != 0).then(|| frame.uuid());
                let transaction_id = frame.str16();
                let producer = (flags & 0x02 != 0).then(|| frame.str16());
                let payload = frame.take(len - frame.at).to_vec();
                StoredFrame { message_id, trace_id, transaction_id, producer, payload }
            })
            .collect();
        assert!(bytes.done(), "a record holds exactly its {count} frames");
        Record { base_offset, created_at_us, codec, frames }
    }

    /// The messages as the JSON answer writes them, in delivery order: as the clients read it,
    /// the frames of each claim's `start..=end`.
    fn messages(&self) -> Vec<Value> {
        let mut messages = Vec::new();
        for claim in &self.claims {
            for record in &claim.records {
                for (frame, offset) in record.frames.iter().zip(record.base_offset..) {
                    if !(claim.start..=claim.end).contains(&offset) {
                        continue;
                    }
                    let created_at = DateTime::from_timestamp_micros(record.created_at_us).expect("a time");
                    messages.push(json!({
                        "id": frame.message_id,
                        "transactionId": frame.transaction_id,
                        "traceId": frame.trace_id,
                        "producerSub": frame.producer,
                        "queue": self.queue,
                        "partition": claim.partition,
                        "partitionId": claim.partition_id.to_string(),
                        "offset": offset,
                        "createdAt": created_at.to_rfc3339_opts(SecondsFormat::Micros, true),
                        "data": serde_json::from_slice::<Value>(&frame.payload).expect("JSON data"),
                        "leaseId": self.lease_id,
                        "consumerGroup": self.consumer_group,
                        "deliveryAttempt": claim.delivery_attempt,
                    }));
                }
            }
        }
        messages
    }

    /// Frames per record of each partition, by partition name.
    fn record_sizes(&self) -> BTreeMap<String, Vec<usize>> {
        self.claims.iter().map(|c| (c.partition.clone(), c.records.iter().map(|r| r.frames.len()).collect())).collect()
    }

    /// (codec, frames, base offset) of each record, in order.
    fn records(&self) -> Vec<(u8, usize, u64)> {
        self.claims.iter().flat_map(|c| &c.records).map(|r| (r.codec, r.frames.len(), r.base_offset)).collect()
    }
}

/// Messages by id, without what differs between two groups' pops (lease and group).
fn by_id(messages: &[Value]) -> BTreeMap<String, Value> {
    messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            let object = m.as_object_mut().expect("an object");
            object.remove("leaseId");
            object.remove("consumerGroup");
            (m["id"].as_str().expect("an id").to_owned(), m)
        })
        .collect()
}

#[actix_web::test]
async fn a_framed_pop_says_what_the_json_pop_says_and_its_ids_ack() {
    let app = TestApp::spawn().await;
    let trace = Uuid::now_v7();
    // One push is one segment, one record: partition a gets two, b one, c four.
    app.push(json!([
        {"queue": "orders", "partition": "a", "transactionId": "a0", "payload": {"n": 0, "text": "grüße"}, "traceId": trace},
        {"queue": "orders", "partition": "a", "transactionId": "a1", "payload": [1, 2.5, null]},
        {"queue": "orders", "partition": "a", "payload": "minted id"},
    ]))
    .await;
    app.push(json!([
        {"queue": "orders", "partition": "a", "transactionId": "a3", "payload": {"nested": {"deep": [true]}}},
        {"queue": "orders", "partition": "a", "transactionId": "a4", "payload": 4, "traceId": Uuid::now_v7()},
    ]))
    .await;
    app.push(json!([
        {"queue": "orders", "partition": "b", "transactionId": "b0", "payload": ""},
        {"queue": "orders", "partition": "b", "transactionId": "b1", "payload": {}},
    ]))
    .await;
    for i in 0..4 {
        app.push_one("orders", "c", &format!("c{i}"), json!({"i": i})).await;
    }

    let query = "batch=100&partitions=3&subscriptionMode=all&wait=false";
    let answer = framed(&app, &format!("/api/v1/pop/queue/orders?{query}&consumerGroup=framed&frames=true")).await;
    let plain = json_pop(&app, &format!("/api/v1/pop/queue/orders?{query}&consumerGroup=plain")).await;

    assert_eq!(answer.version, 0, "nothing beside the messages: no JSON part");
    assert_eq!(answer.own_keys, None);
    assert_eq!(answer.queue, "orders");
    assert_eq!(answer.consumer_group, "framed");
    Uuid::parse_str(&answer.lease_id).expect("a lease id");
    assert_eq!(answer.claims.len(), 3, "one claim per partition: {answer:?}");
    let sizes = BTreeMap::from([("a".into(), vec![3, 2]), ("b".into(), vec![2]), ("c".into(), vec![1, 1, 1, 1])]);
    assert_eq!(answer.record_sizes(), sizes, "a record per segment");
    assert!(answer.records().iter().all(|r| r.0 == 1), "whole segments go as stored: {answer:?}");
    for claim in &answer.claims {
        assert_eq!(claim.delivery_attempt, 1);
        assert_eq!(claim.start, 1, "{claim:?}");
        assert_eq!(claim.end, claim.records.iter().map(|r| r.frames.len() as u64).sum::<u64>(), "{claim:?}");
        let bases: Vec<u64> = claim.records.iter().map(|r| r.base_offset).collect();
        let times: Vec<i64> = claim.records.iter().map(|r| r.created_at_us).collect();
        assert!(times.is_sorted() && bases.is_sorted(), "{claim:?}");
    }

    let messages = answer.messages();
    assert_eq!(messages.len(), 11);
    let json_messages = plain["messages"].as_array().expect("messages").clone();
    assert_eq!(by_id(&messages), by_id(&json_messages), "the same messages, field for field");
    assert!(messages.iter().any(|m| m["traceId"] == json!(trace)), "trace ids ride in the frames");
    let minted = messages.iter().find(|m| m["data"] == "minted id").expect("the message pushed without an id");
    assert!(!minted["transactionId"].as_str().expect("a transaction id").is_empty(), "the broker's id rides too");
    // Within each partition, the framed answer keeps the JSON answer's order.
    let order = |list: &[Value], partition: &str| -> Vec<Value> {
        list.iter().filter(|m| m["partition"] == partition).map(|m| m["offset"].clone()).collect()
    };
    for partition in ["a", "b", "c"] {
        assert_eq!(order(&messages, partition), order(&json_messages, partition));
    }

    // Acked with the framed partition ids (decimal strings of the u64s) and lease: committed, so
    // the next pop of the group gets only what came after.
    let acks = app.ack_all(&messages, "completed", Some("framed")).await;
    assert!(acks.iter().all(|a| a["success"] == true), "{acks:?}");
    app.push_one("orders", "a", "a5", json!(5)).await;
    let next = framed(&app, &format!("/api/v1/pop/queue/orders?{query}&consumerGroup=framed&frames=true")).await;
    let next_messages = next.messages();
    assert_eq!(next_messages.len(), 1, "{next:?}");
    assert_eq!(
        (next_messages[0]["transactionId"].as_str(), next_messages[0]["offset"].as_u64()),
        (Some("a5"), Some(6))
    );
    assert_eq!(next.claims[0].delivery_attempt, 1);
    assert_ne!(next.lease_id, answer.lease_id);
}

#[actix_web::test]
async fn the_conflation_echo_and_the_autopilot_choice_ride_in_the_json_part() {
    let app = TestApp::spawn().await;
    for i in 0..3 {
        app.push_one("prices", "eur", &format!("m{i}"), json!({"i": i})).await;
    }
    let conflating =
        framed(&app, "/api/v1/pop/queue/prices?batch=10&consumerGroup=ticker&conflation=true&frames=true").await;
    assert_eq!(conflating.version, 1);
    assert_eq!(conflating.own_keys, Some(json!({"conflation": true})));
    let messages = conflating.messages();
    assert_eq!(messages.len(), 1, "the newest only");
    assert_eq!(messages[0]["transactionId"], "m2");
    assert_eq!((conflating.claims[0].start, conflating.claims[0].end), (3, 3), "the delivered span is the newest");

    // A group registered without conflation that asks for it: the conflict, and every message.
    let plain = json_pop(&app, "/api/v1/pop/queue/prices?batch=1&consumerGroup=audit").await;
    app.ack_all(plain["messages"].as_array().expect("messages"), "completed", Some("audit")).await;
    let conflict =
        framed(&app, "/api/v1/pop/queue/prices?batch=10&consumerGroup=audit&conflation=true&frames=true").await;
    assert_eq!(conflict.own_keys, Some(json!({"conflationConflict": true})));
    assert_eq!(conflict.messages().len(), 2);

    // The autopilot's choice, as the JSON answer of another group states it.
    let chosen = framed(&app, "/api/v1/pop/queue/prices?autopilot=true&consumerGroup=pilot-a&frames=true").await;
    let told = json_pop(&app, "/api/v1/pop/queue/prices?autopilot=true&consumerGroup=pilot-b").await;
    assert!(told["autopilot"].is_object(), "{told}");
    assert_eq!(chosen.version, 1);
    assert_eq!(chosen.own_keys, Some(json!({"autopilot": told["autopilot"]})));
    // A pop of one partition says the width it applied: that one partition.
    let one =
        json_pop(&app, "/api/v1/pop/queue/prices/partition/eur?autopilot=true&partitions=8&consumerGroup=pilot-c")
            .await;
    assert_eq!(one["autopilot"]["partitions"], 1, "{one}");
}

#[actix_web::test]
async fn frames_false_or_absent_answer_json_and_any_other_value_is_refused_claiming_nothing() {
    let app = TestApp::spawn().await;
    app.push_one("q", "p", "m0", json!(0)).await;
    app.push_one("ns.one", "p", "n0", json!(0)).await;
    for path in [
        "/api/v1/pop/queue/q?frames=maybe",
        "/api/v1/pop/queue/q/partition/p?frames=TRUE",
        "/api/v1/pop?namespace=ns&frames=",
    ] {
        let refused = get_raw(&app, path).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{path}");
        let error = refused.json()["error"].as_str().expect("an error").to_owned();
        assert!(error.starts_with("frames must be true or false"), "{path}: {error}");
    }
    // Nothing was claimed: queue mode, which the refused pops asked as, gets the messages at their
    // first delivery; so does a group asking with frames=false.
    for query in ["batch=1", "batch=1&consumerGroup=off&frames=false"] {
        let answer = json_pop(&app, &format!("/api/v1/pop/queue/q?{query}")).await;
        assert_eq!(answer["messages"][0]["transactionId"], "m0", "{answer}");
        assert_eq!(answer["messages"][0]["deliveryAttempt"], 1, "{answer}");
    }
    let namespace = json_pop(&app, "/api/v1/pop?namespace=ns&frames=false").await;
    assert_eq!(namespace["messages"][0]["deliveryAttempt"], 1, "{namespace}");
}

#[actix_web::test]
async fn every_route_frames_and_auto_ack_has_no_lease() {
    let app = TestApp::spawn().await;
    for partition in ["x", "y"] {
        app.push_one("routes", partition, &format!("{partition}0"), json!(partition)).await;
    }
    let one = framed(&app, "/api/v1/pop/queue/routes/partition/y?batch=10&frames=true").await;
    assert_eq!((one.claims.len(), one.claims[0].partition.as_str()), (1, "y"));
    assert_eq!(one.consumer_group, "__QUEUE_MODE__", "queue mode, named as the JSON answer names it");

    let auto = framed(&app, "/api/v1/pop/queue/routes?batch=10&autoAck=true&frames=true").await;
    assert_eq!(auto.lease_id, "", "no lease for a commit at delivery");
    assert_eq!(auto.messages()[0]["transactionId"], "x0");
    assert_eq!(get_raw(&app, "/api/v1/pop/queue/routes?batch=10&frames=true").await.status, StatusCode::NO_CONTENT);

    app.push_one("solo.jobs", "p", "s0", json!("s")).await;
    let solo = framed(&app, "/api/v1/pop?namespace=solo&frames=true").await;
    assert_eq!((solo.queue.as_str(), solo.messages().len()), ("solo.jobs", 1));
}

#[actix_web::test]
async fn a_namespace_pop_over_several_queues_and_empty_answers_stay_json() {
    let app = TestApp::spawn().await;
    app.push_one("duo.left", "p", "l0", json!("l")).await;
    app.push_one("duo.right", "p", "r0", json!("r")).await;
    let both = json_pop(&app, "/api/v1/pop?namespace=duo&batch=10&partitions=10&frames=true").await;
    let mut queues: Vec<&str> =
        both["messages"].as_array().expect("messages").iter().filter_map(|m| m["queue"].as_str()).collect();
    queues.sort_unstable();
    assert_eq!(queues, ["duo.left", "duo.right"], "a QPF1 answer names one queue: this one is JSON");

    let empty = get_raw(&app, "/api/v1/pop/queue/nothing?frames=true").await;
    assert_eq!((empty.status, empty.body.len()), (StatusCode::NO_CONTENT, 0));
    let echoed = json_pop(&app, "/api/v1/pop/queue/nothing?consumerGroup=g&conflation=true&frames=true").await;
    assert_eq!(echoed, json!({"success": true, "messages": [], "conflation": true}));

    app.push_one("held", "p", "h0", json!(0)).await;
    let switched = app.post("/api/v1/system/maintenance/pop", &json!({"enabled": true})).await;
    assert_eq!(switched.status, StatusCode::OK, "{switched:?}");
    let paused = json_pop(&app, "/api/v1/pop/queue/held?frames=true").await;
    assert_eq!(paused, json!({"success": true, "messages": [], "paused": true}));
}

#[actix_web::test]
async fn the_producer_rides_in_its_frame() {
    const SECRET: &str = "the-framed-pop-tests-hs256-secret";
    let app = TestApp::spawn_with(|config| {
        config.auth.jwt_enabled = true;
        config.auth.jwt_secret = Some(SECRET.into());
    })
    .await;
    let exp = chrono::Utc::now().timestamp() + 3600;
    let claims = json!({"sub": "svc-orders", "role": "read-write", "exp": exp});
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).expect("a key");
    let token = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).expect("a token");
    let item = json!({"queue": "signed", "transactionId": "t1", "payload": 1});
    let pushed = app.http.post(app.url("/api/v1/push")).bearer_auth(&token).json(&json!({"items": [item]})).send();
    assert_eq!(pushed.await.expect("a push").status(), StatusCode::CREATED);

    let popped = app.http.get(app.url("/api/v1/pop/queue/signed?frames=true")).bearer_auth(&token).send().await;
    let body = popped.expect("a pop").bytes().await.expect("a body");
    let answer = Framed::decode(&body);
    assert_eq!(answer.claims[0].records[0].frames[0].producer.as_deref(), Some("svc-orders"));
    assert_eq!(answer.messages()[0]["producerSub"], "svc-orders");
}

#[actix_web::test]
async fn a_segment_goes_as_stored_where_the_pop_takes_most_of_it_and_rebuilt_where_it_takes_little() {
    let app = TestApp::spawn().await;
    let items: Vec<Value> = (0..10)
        .map(|i| json!({"queue": "logs", "partition": "p", "transactionId": format!("t{i}"), "payload": {"i": i}}))
        .collect();
    app.push(json!(items)).await;
    let pop =
        |group: &str, batch: u32| format!("/api/v1/pop/queue/logs?batch={batch}&consumerGroup={group}&frames=true");
    let ids = |framed: &Framed| -> Vec<String> {
        framed.messages().iter().map(|m| m["transactionId"].as_str().expect("an id").to_owned()).collect()
    };

    // Six of the segment's ten: the whole segment goes, and the span keeps the other four out.
    let most = framed(&app, &pop("most", 6)).await;
    assert_eq!(most.records(), vec![(1, 10, 1)], "{most:?}");
    assert_eq!((most.claims[0].start, most.claims[0].end), (1, 6));
    assert_eq!(ids(&most), ["t0", "t1", "t2", "t3", "t4", "t5"]);
    let acks = app.ack_all(&most.messages(), "completed", Some("most")).await;
    assert!(acks.iter().all(|a| a["success"] == true), "{acks:?}");
    // The last four, less than half of it: rebuilt, and only they.
    let rest = framed(&app, &pop("most", 10)).await;
    assert_eq!(rest.records(), vec![(0, 4, 7)], "{rest:?}");
    assert_eq!(ids(&rest), ["t6", "t7", "t8", "t9"]);

    // Two of ten: rebuilt.
    let few = framed(&app, &pop("few", 2)).await;
    assert_eq!(few.records(), vec![(0, 2, 1)], "{few:?}");
    assert_eq!(ids(&few), ["t0", "t1"]);
}

#[actix_web::test]
async fn a_sealed_segment_is_never_shipped_as_stored() {
    let app = TestApp::spawn_with(|config| {
        config.encryption.key = Some("7f3c9a1e5b2d4f6081a3c5e7092b4d6f8a1c3e5f7092b4d6e8f0a2c4e6081b3d".into())
    })
    .await;
    app.configure("vault", json!({"encryptionEnabled": true})).await;
    app.push(json!([
        {"queue": "vault", "partition": "p", "transactionId": "s0", "payload": {"card": 1}},
        {"queue": "vault", "partition": "p", "transactionId": "s1", "payload": {"card": 2}},
    ]))
    .await;
    let answer = framed(&app, "/api/v1/pop/queue/vault?batch=10&frames=true").await;
    assert_eq!(answer.records(), vec![(0, 2, 1)], "the frames rebuilt in plain: {answer:?}");
    let data: Vec<Value> = answer.messages().iter().map(|m| m["data"].clone()).collect();
    assert_eq!(data, [json!({"card": 1}), json!({"card": 2})]);
}
