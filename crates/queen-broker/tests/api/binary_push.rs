//! Binary bodies (`Content-Type: application/x-queen-push`, the wire protocol's §3.1 and §3.2):
//! QPB1 pushes, of plain items and of frames groups the client compressed, and QTB1 transactions.
//! The bodies are built here byte by byte; the tests check the answers, what pops serve, what
//! PostgreSQL holds (a frames group stored as the bytes sent), and that every corrupt or truncated
//! body is refused with a JSON error and nothing written.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use queen_log::Cipher;
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{Answer, TestApp};

/// QPB1 flags.
const ZSTD: u8 = 0x01;
const COUNTS: u8 = 0x02;
const WITH_IDS: u8 = 0x04;
const FRAMES: u8 = 0x08;

fn str16(out: &mut Vec<u8>, text: &[u8]) {
    out.extend_from_slice(&u16::try_from(text.len()).expect("a short text").to_le_bytes());
    out.extend_from_slice(text);
}

fn u32le(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).expect("a u32").to_le_bytes());
}

/// `"QPB1" | flags | u32 groups | groups`.
fn qpb1(flags: u8, groups: &[impl AsRef<[u8]>]) -> Vec<u8> {
    let mut body = b"QPB1".to_vec();
    body.push(flags);
    u32le(&mut body, groups.len());
    groups.iter().for_each(|group| body.extend_from_slice(group.as_ref()));
    body
}

/// `"QTB1" | flags | u32 head_len | head | u32 groups | groups`.
fn qtb1(flags: u8, head: &[u8], groups: &[impl AsRef<[u8]>]) -> Vec<u8> {
    let mut body = b"QTB1".to_vec();
    body.push(flags);
    u32le(&mut body, head.len());
    body.extend_from_slice(head);
    u32le(&mut body, groups.len());
    groups.iter().for_each(|group| body.extend_from_slice(group.as_ref()));
    body
}

fn group_head(queue: &[u8], partition: &[u8], n: usize) -> Vec<u8> {
    let mut group = Vec::new();
    str16(&mut group, queue);
    str16(&mut group, partition);
    u32le(&mut group, n);
    group
}

/// A plain group of (transaction id, payload) items; the ids go on the wire only `with_ids`.
fn plain_group(queue: &str, partition: &str, items: &[(&str, &str)], with_ids: bool) -> Vec<u8> {
    let mut group = group_head(queue.as_bytes(), partition.as_bytes(), items.len());
    for (transaction_id, payload) in items {
        if with_ids {
            str16(&mut group, transaction_id.as_bytes());
        }
        u32le(&mut group, payload.len());
        group.extend_from_slice(payload.as_bytes());
    }
    group
}

/// A message as the client frames it.
#[derive(Debug, Clone)]
struct Message {
    id: Uuid,
    transaction_id: String,
    payload: String,
}

fn message(transaction_id: &str, payload: &str) -> Message {
    Message { id: Uuid::now_v7(), transaction_id: transaction_id.into(), payload: payload.into() }
}

/// A stored frame with frame flags `flags` and `extra` bytes (a trace id) after the message id.
fn frame_with(flags: u8, extra: &[u8], message: &Message) -> Vec<u8> {
    let mut frame = Vec::new();
    u32le(&mut frame, 1 + 16 + extra.len() + 2 + message.transaction_id.len() + message.payload.len());
    frame.push(flags);
    frame.extend_from_slice(message.id.as_bytes());
    frame.extend_from_slice(extra);
    str16(&mut frame, message.transaction_id.as_bytes());
    frame.extend_from_slice(message.payload.as_bytes());
    frame
}

fn framed(messages: &[Message]) -> Vec<u8> {
    messages.iter().flat_map(|message| frame_with(0, &[], message)).collect()
}

/// One zstd frame declaring its size, with a checksum, which the broker's own (level 1) segments
/// never carry: stored bytes equal to these were not compressed again.
fn compress(raw: &[u8]) -> Vec<u8> {
    let mut compressor = zstd::bulk::Compressor::new(3).expect("a compressor");
    compressor.include_checksum(true).expect("a checksum");
    compressor.compress(raw).expect("compressed")
}

fn frames_group(queue: &str, partition: &str, n: usize, z: &[u8]) -> Vec<u8> {
    let mut group = group_head(queue.as_bytes(), partition.as_bytes(), n);
    u32le(&mut group, z.len());
    group.extend_from_slice(z);
    group
}

/// The messages as one frames group.
fn frames_of(queue: &str, partition: &str, messages: &[Message]) -> (Vec<u8>, Vec<u8>) {
    let z = compress(&framed(messages));
    (frames_group(queue, partition, messages.len(), &z), z)
}

async fn send(app: &TestApp, path: &str, body: Vec<u8>, token: Option<&str>) -> Answer {
    let mut request = app.http.post(app.url(path)).header("content-type", "application/x-queen-push").body(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("an answer");
    let status = response.status();
    let text = response.text().await.expect("a body");
    let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    Answer { status, body }
}

async fn pushed(app: &TestApp, body: Vec<u8>) -> Vec<Value> {
    let answer = send(app, "/api/v1/push", body, None).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    answer.body.as_array().cloned().expect("a result per message")
}

/// Refused with a 400 whose error says `why`.
async fn refused(app: &TestApp, path: &str, body: Vec<u8>, why: &str) {
    let shown = format!("{:?}", String::from_utf8_lossy(&body));
    let answer = send(app, path, body, None).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{shown}: {answer:?}");
    let error = answer.body["error"].as_str().unwrap_or_else(|| panic!("{shown}: no error in {answer:?}"));
    assert!(error.contains(why), "{shown}: {error:?} does not say {why:?}");
}

fn field<'a>(values: &'a [Value], key: &str) -> Vec<&'a Value> {
    values.iter().map(|value| &value[key]).collect()
}

fn ids(messages: &[Message]) -> Vec<Value> {
    messages.iter().map(|message| json!(message.id.to_string())).collect()
}

/// The segments of a queue's partition, oldest first: (frame count, raw length, body).
async fn segments(app: &TestApp, queue: &str, partition: &str) -> Vec<(i32, i32, Vec<u8>)> {
    let rows = app
        .db
        .connect()
        .await
        .query(
            "SELECT s.frame_count, s.raw_length, s.body FROM queen.log_segments s
               JOIN queen.partitions p ON p.id = s.partition_id JOIN queen.queues q ON q.id = p.queue_id
              WHERE q.name = $1 AND p.name = $2 ORDER BY s.base_offset",
            &[&queue, &partition],
        )
        .await
        .expect("the segments");
    rows.iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect()
}

/// The (message id, transaction id, payload) of each frame of a stored segment body.
fn frames_in(body: &[u8], count: i32) -> Vec<(Uuid, String, String)> {
    let decoded = queen_log::decode_segment(body, count as usize, 1 << 24).expect("a segment");
    decoded
        .frames()
        .map(|frame| frame.expect("a frame"))
        .map(|f| (f.message_id, f.transaction_id.to_owned(), String::from_utf8(f.payload.to_vec()).expect("UTF-8")))
        .collect()
}

async fn popped(app: &TestApp, queue: &str) -> Vec<Value> {
    app.pop(&format!("queue/{queue}"), "batch=100&wait=false").await.messages()
}

/// Rows the broker writes when it takes a push or a transaction.
async fn written(db: &tokio_postgres::Client) -> i64 {
    let sql = "SELECT (SELECT count(*) FROM queen.queues) + (SELECT count(*) FROM queen.partitions)
                    + (SELECT count(*) FROM queen.log_segments) + (SELECT count(*) FROM queen.log_message_ids)
                    + (SELECT count(*) FROM queen.log_consumers) + (SELECT count(*) FROM queen.kv)";
    db.query_one(sql, &[]).await.expect("the counts").get(0)
}

#[actix_web::test]
async fn a_plain_binary_push_is_answered_and_served_as_a_json_push_would_be() {
    let app = TestApp::spawn().await;
    let items = [("a", r#"{"n": 1}"#), ("", "[1, 2.50]"), ("c", r#""téxt""#)];
    let body =
        qpb1(WITH_IDS, &[plain_group("plain", "p1", &items, true), plain_group("plain", "p2", &[("d", "null")], true)]);
    let results = pushed(&app, body.clone()).await;
    assert_eq!(field(&results, "status"), ["queued"; 4]);
    assert_eq!(field(&results, "index"), [0, 1, 2, 3]);
    let minted = results[1]["transaction_id"].as_str().expect("a transaction id").to_owned();
    assert!(!minted.is_empty(), "an empty transaction id is minted");
    assert_eq!(field(&results, "transaction_id"), [&json!("a"), &json!(minted), &json!("c"), &json!("d")]);

    let mut served = app.pop("queue/plain/partition/p1", "batch=10&wait=false").await.messages();
    served.extend(app.pop("queue/plain/partition/p2", "batch=10&wait=false").await.messages());
    assert_eq!(field(&served, "data"), [&json!({"n": 1}), &json!([1, 2.5]), &json!("téxt"), &Value::Null]);
    assert_eq!(field(&served, "transactionId"), field(&results, "transaction_id"));
    assert_eq!(field(&served, "id"), field(&results, "message_id"));
    // The payloads are kept byte for byte.
    let (count, _, body_p1) = segments(&app, "plain", "p1").await.remove(0);
    let payloads: Vec<String> = frames_in(&body_p1, count).into_iter().map(|(_, _, payload)| payload).collect();
    assert_eq!(payloads, items.map(|(_, payload)| payload));

    // Sent again, the messages with a transaction id are duplicates of themselves; the one without
    // gets a new id and is new.
    let again = pushed(&app, body).await;
    assert_eq!(field(&again, "status"), ["duplicate", "queued", "duplicate", "duplicate"]);
    assert_eq!(again[0]["message_id"], results[0]["message_id"]);
    assert_eq!((&again[3]["offset"], &again[3]["partition_id"]), (&results[3]["offset"], &results[3]["partition_id"]));

    // Without flag 0x04 no item carries a transaction id: each is minted.
    let results = pushed(&app, qpb1(0, &[plain_group("plain", "p3", &[("", "1"), ("", "2")], false)])).await;
    assert_eq!(field(&results, "status"), ["queued"; 2]);
    assert_ne!(results[0]["transaction_id"], results[1]["transaction_id"]);
}

#[actix_web::test]
async fn a_frames_push_keeps_the_client_ids_and_is_stored_as_the_bytes_sent() {
    let app = TestApp::spawn().await;
    let messages = [message("f1", r#"{"a":1}"#), message("f2", "[true]"), message("f3", r#""x""#)];
    let (group, z) = frames_of("frames", "p", &messages);
    let body = qpb1(FRAMES, &[group]);
    let results = pushed(&app, body.clone()).await;
    assert_eq!(field(&results, "status"), ["queued"; 3]);
    assert_eq!(field(&results, "message_id"), ids(&messages).iter().collect::<Vec<_>>());
    assert_eq!(field(&results, "transaction_id"), [&json!("f1"), &json!("f2"), &json!("f3")]);
    assert_eq!(field(&results, "offset"), [1, 2, 3]);
    let raw_len = framed(&messages).len() as i32;
    assert_eq!(segments(&app, "frames", "p").await, [(3, raw_len, z.clone())], "one segment, the bytes as sent");

    let served = popped(&app, "frames").await;
    assert_eq!(field(&served, "id"), ids(&messages).iter().collect::<Vec<_>>());
    assert_eq!(field(&served, "transactionId"), [&json!("f1"), &json!("f2"), &json!("f3")]);
    assert_eq!(field(&served, "data"), [&json!({"a": 1}), &json!([true]), &json!("x")]);

    // A retry sends the same bytes: duplicates of themselves, nothing stored again.
    let again = pushed(&app, body).await;
    assert_eq!(field(&again, "status"), ["duplicate"; 3]);
    assert_eq!(field(&again, "message_id"), field(&results, "message_id"));
    assert_eq!(field(&again, "offset"), [1, 2, 3]);
    assert_eq!(segments(&app, "frames", "p").await.len(), 1);
}

#[actix_web::test]
async fn frames_that_are_not_written_as_they_came_are_compressed_again() {
    let app = TestApp::spawn().await;
    let json_pushed = app.push_one("again", "p", "f2", json!("from JSON")).await;
    let messages = [message("f1", "1"), message("f2", "2"), message("f3", "3")];
    let (group, z) = frames_of("again", "p", &messages);
    let results = pushed(&app, qpb1(FRAMES, &[group])).await;
    assert_eq!(field(&results, "status"), ["queued", "duplicate", "queued"]);
    assert_eq!(results[1]["message_id"], json_pushed["message_id"], "the stored message's id");
    let stored = segments(&app, "again", "p").await;
    let (count, _, body) = stored.last().expect("a segment").clone();
    assert_ne!(body, z, "compressed again without the stored one");
    let kept = |m: &Message| (m.id, m.transaction_id.clone(), m.payload.clone());
    assert_eq!(frames_in(&body, count), [kept(&messages[0]), kept(&messages[2])]);

    // A frame without a transaction id gets its message id's text, which changes the frame.
    let untitled = [message("", "4"), message("f5", "5")];
    let (group, z) = frames_of("again", "p", &untitled);
    let results = pushed(&app, qpb1(FRAMES, &[group])).await;
    let text = untitled[0].id.to_string();
    assert_eq!(field(&results, "transaction_id"), [&json!(text), &json!("f5")]);
    let (count, _, body) = segments(&app, "again", "p").await.pop().expect("a segment");
    assert_ne!(body, z);
    assert_eq!(frames_in(&body, count)[0], (untitled[0].id, text, "4".into()));

    // A transaction id twice in the group: the second is a duplicate of the first.
    let repeated = [message("r", "6"), message("r", "7")];
    let (group, z) = frames_of("again", "p", &repeated);
    let results = pushed(&app, qpb1(FRAMES, &[group])).await;
    assert_eq!(field(&results, "status"), ["queued", "duplicate"]);
    assert_eq!(results[1]["message_id"], json!(repeated[0].id.to_string()));
    assert_ne!(segments(&app, "again", "p").await.pop().expect("a segment").2, z);
    let served = popped(&app, "again").await;
    assert_eq!(field(&served, "data"), [&json!("from JSON"), &json!(1), &json!(3), &json!(4), &json!(5), &json!(6)]);
}

#[actix_web::test]
async fn a_frames_push_among_concurrent_pushes_of_its_partition_is_a_segment_of_its_own() {
    let app = TestApp::spawn().await;
    let messages: Vec<Message> = (0..5).map(|i| message(&format!("f{i}"), &i.to_string())).collect();
    let (group, z) = frames_of("busy", "p", &messages);
    let app = &app;
    let json_push = |i: usize| async move { app.push_one("busy", "p", &format!("j{i}"), json!(i)).await };
    let before = futures::future::join_all((0..20).map(json_push));
    let frames = pushed(app, qpb1(FRAMES, &[group]));
    let after = futures::future::join_all((20..40).map(json_push));
    let (before, frames, after) = futures::join!(before, frames, after);
    assert!(before.iter().chain(&after).all(|result| result["status"] == "queued"));
    assert_eq!(field(&frames, "status"), ["queued"; 5]);

    let stored = segments(app, "busy", "p").await;
    let own: Vec<_> = stored.iter().filter(|(_, _, body)| *body == z).collect();
    assert_eq!(own.len(), 1, "stored as sent, once");
    assert_eq!(own[0].0, 5, "alone in its segment");
    assert_eq!(stored.iter().map(|(count, _, _)| *count).sum::<i32>(), 45);
    assert_eq!(popped(app, "busy").await.len(), 45);
}

#[actix_web::test]
async fn an_encrypted_queue_seals_the_bytes_as_sent() {
    const KEY: &str = "3c1e5b2d4f6081a3c5e7092b4d6f8a1c3e5f7092b4d6e8f0a2c4e6081b3d7f9a";
    let app = TestApp::spawn_with(|config| config.encryption.key = Some(KEY.into())).await;
    app.configure("vault", json!({"encryptionEnabled": true})).await;
    let messages = [message("v1", r#"{"secret":1}"#), message("v2", r#"{"secret":2}"#)];
    let (group, z) = frames_of("vault", "p", &messages);
    pushed(&app, qpb1(FRAMES, &[group])).await;
    let (_, _, body) = segments(&app, "vault", "p").await.remove(0);
    assert!(queen_log::is_sealed(&body), "sealed at rest");
    let opened = Cipher::from_hex(KEY).expect("the key").open(&body).expect("opened");
    assert_eq!(opened, z, "the bytes as sent, sealed");
    let served = popped(&app, "vault").await;
    assert_eq!(field(&served, "data"), [&json!({"secret": 1}), &json!({"secret": 2})]);
    assert_eq!(field(&served, "id"), ids(&messages).iter().collect::<Vec<_>>());
}

#[actix_web::test]
async fn with_auth_the_producer_is_the_tokens_and_the_frames_are_compressed_again() {
    const SECRET: &str = "the-binary-push-tests-hs256-secret-0123";
    let app = TestApp::spawn_with(|config| {
        config.auth.jwt_enabled = true;
        config.auth.jwt_secret = Some(SECRET.into());
    })
    .await;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs();
    let claims = json!({"sub": "svc-binary", "role": "read-write", "exp": now + 3600});
    let key = EncodingKey::from_secret(SECRET.as_bytes()).expect("a key");
    let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).expect("a token");

    let messages = [message("a1", "1"), message("a2", "2")];
    let (group, z) = frames_of("stamped", "p", &messages);
    let answer = send(&app, "/api/v1/push", qpb1(FRAMES, &[group]), Some(&token)).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    let (_, _, body) = segments(&app, "stamped", "p").await.remove(0);
    assert_ne!(body, z, "framed again with the producer");
    let served = app.http.get(app.url("/api/v1/pop/queue/stamped?batch=10&wait=false")).bearer_auth(&token);
    let served: Value = served.send().await.expect("a pop").json().await.expect("JSON");
    let served = served["messages"].as_array().expect("messages");
    assert_eq!(field(served, "producerSub"), [&json!("svc-binary"); 2]);
    assert_eq!(field(served, "id"), ids(&messages).iter().collect::<Vec<_>>());
}

#[actix_web::test]
async fn counts_only_and_a_compressed_body_are_understood() {
    let app = TestApp::spawn().await;
    let group = plain_group("counted", "p", &[("c1", "1"), ("c2", "2")], true);
    let counted = qpb1(COUNTS | WITH_IDS, &[&group]);
    let answer = send(&app, "/api/v1/push", counted.clone(), None).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    assert_eq!(answer.body, json!({"count": 2, "queued": 2, "duplicate": 0, "error": 0}));
    let again = send(&app, "/api/v1/push", counted, None).await;
    assert_eq!(again.body, json!({"count": 2, "queued": 0, "duplicate": 2, "error": 0}));

    // Flag 0x01: everything after the flags is one zstd frame of raw_len bytes.
    let plain = qpb1(WITH_IDS, &[plain_group("counted", "p", &[("c3", "3")], true)]);
    let mut body = b"QPB1".to_vec();
    body.push(ZSTD | WITH_IDS);
    u32le(&mut body, plain.len() - 5);
    body.extend_from_slice(&compress(&plain[5..]));
    let results = pushed(&app, body).await;
    assert_eq!(field(&results, "status"), ["queued"]);
    assert_eq!(field(&popped(&app, "counted").await, "data"), [1, 2, 3]);
}

/// A proxy may re-case or replace the content type; the body's first bytes still say what it is.
#[actix_web::test]
async fn a_binary_body_is_known_by_its_first_bytes_whatever_its_content_type() {
    let app = TestApp::spawn().await;
    for (n, content_type) in ["Application/X-Queen-Push", "application/octet-stream"].into_iter().enumerate() {
        let id = format!("typed-{n}");
        let body = qpb1(WITH_IDS, &[plain_group("typed", "p", &[(&id, "7")], true)]);
        let response = app.http.post(app.url("/api/v1/push")).header("content-type", content_type).body(body);
        let response = response.send().await.expect("an answer");
        assert_eq!(response.status(), StatusCode::CREATED, "{content_type}");
        let (message, _) = frames_of("typed", "p", &[message(&format!("txn-{n}"), "8")]);
        let transaction = qtb1(0, b"", &[message]);
        let response = app.http.post(app.url("/api/v1/transaction")).header("content-type", content_type);
        let response = response.body(transaction).send().await.expect("an answer");
        assert_eq!(response.status(), StatusCode::OK, "{content_type}: {:?}", response.text().await);
    }
    assert_eq!(field(&popped(&app, "typed").await, "data"), [7, 8, 7, 8]);
}

#[actix_web::test]
async fn a_binary_transaction_acks_pushes_and_answers_the_head_first() {
    let app = TestApp::spawn().await;
    app.push_one("stage-a", "p", "s1", json!({"v": 1})).await;
    let taken = popped(&app, "stage-a").await.remove(0);
    let head = json!({
        "operations": [{"type": "ack", "transactionId": "s1", "partitionId": taken["partitionId"],
                        "leaseId": taken["leaseId"], "status": "completed"}],
        "requiredLeases": [taken["leaseId"]],
        "kv": [{"op": "get", "ns": "binary", "key": "k"}],
    });
    let messages = [message("n1", r#"{"v":2}"#), message("n2", r#"{"v":3}"#)];
    let (group, z) = frames_of("stage-b", "p", &messages);
    let body = qtb1(0, head.to_string().as_bytes(), &[group]);
    let answer = send(&app, "/api/v1/transaction", body, None).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["success"], true);
    let results = answer.body["results"].as_array().expect("results");
    assert_eq!(results.len(), 4, "{results:?}");
    assert_eq!((&results[0]["transactionId"], &results[0]["success"]), (&json!("s1"), &json!(true)));
    assert_eq!(field(&results[1..3], "message_id"), ids(&messages).iter().collect::<Vec<_>>());
    assert_eq!(field(&results[1..3], "status"), ["queued"; 2]);
    assert_eq!(field(&results[1..3], "index"), [1, 2]);
    assert_eq!(results[3], json!({"found": false, "key": "k"}));

    assert!(popped(&app, "stage-a").await.is_empty(), "acknowledged");
    let served = popped(&app, "stage-b").await;
    assert_eq!(field(&served, "data"), [&json!({"v": 2}), &json!({"v": 3})]);
    assert_eq!(segments(&app, "stage-b", "p").await[0].2, z, "stored as sent in the transaction too");

    // No head at all; and counts instead of results (flag 0x02).
    let (group, _) = frames_of("stage-b", "p", &[message("n3", "4")]);
    let answer = send(&app, "/api/v1/transaction", qtb1(0, b"", &[&group]), None).await;
    assert_eq!((answer.status, &answer.body["results"][0]["status"]), (StatusCode::OK, &json!("queued")));
    let answer = send(&app, "/api/v1/transaction", qtb1(COUNTS, b"{\"operations\":[]}", &[group]), None).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(
        (&answer.body["pushed"], &answer.body["duplicate"], &answer.body["acked"]),
        (&json!(0), &json!(1), &json!(0))
    );
    assert_eq!(answer.body["results"], json!([]));
}

#[actix_web::test]
async fn a_binary_transaction_that_rolls_back_writes_none_of_its_groups() {
    let app = TestApp::spawn().await;
    app.push_one("held", "p", "h1", json!(1)).await;
    let taken = popped(&app, "held").await.remove(0);
    let stale = Uuid::now_v7().to_string();
    let head = json!({"operations": [{"type": "ack", "transactionId": "h1", "partitionId": taken["partitionId"],
                                      "leaseId": stale, "status": "completed"}], "requiredLeases": [stale]});
    let (group, _) = frames_of("never", "p", &[message("x1", "1")]);
    let answer = send(&app, "/api/v1/transaction", qtb1(0, head.to_string().as_bytes(), &[group]), None).await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{answer:?}");
    assert!(answer.body["error"].as_str().is_some_and(|e| e.contains("rolled back")), "{answer:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.log_message_ids").await, 1, "only the first push");
}

/// A body with one frame whose bytes are `frame`, in a group that says it holds `n`.
fn one_frame_body(frame: &[u8], n: usize) -> Vec<u8> {
    qpb1(FRAMES, &[frames_group("bad", "p", n, &compress(frame))])
}

#[actix_web::test]
async fn corrupt_and_truncated_bodies_are_refused_and_write_nothing() {
    let app = TestApp::spawn_with(|config| {
        config.push.max_items = 8;
        config.http.max_body_bytes = 64 * 1024;
    })
    .await;
    let messages = [message("b1", r#"{"a":1}"#), message("b2", "[2]")];
    let (frames, z) = frames_of("bad", "p", &messages);
    let valid_frames = qpb1(FRAMES, &[&frames]);
    let valid_plain = qpb1(WITH_IDS, &[plain_group("bad", "p", &[("b3", "3"), ("b4", "{}")], true)]);
    let valid_transaction = qtb1(0, br#"{"operations":[]}"#, &[&frames]);
    for (path, valid) in
        [("/api/v1/push", &valid_frames), ("/api/v1/push", &valid_plain), ("/api/v1/transaction", &valid_transaction)]
    {
        for len in 0..valid.len() {
            let answer = send(&app, path, valid[..len].to_vec(), None).await;
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "cut at {len} of {path}: {answer:?}");
            assert!(answer.body["error"].is_string(), "{answer:?}");
        }
    }

    let (push, tx) = ("/api/v1/push", "/api/v1/transaction");
    let with = |bytes: &[u8], tail: &[u8]| [bytes, tail].concat();
    let plain = |items: &[(&str, &str)]| qpb1(WITH_IDS, &[plain_group("bad", "p", items, true)]);
    let raw_group = |queue: &[u8], partition: &[u8]| {
        let mut group = group_head(queue, partition, 1);
        str16(&mut group, b"t");
        u32le(&mut group, 1);
        group.push(b'1');
        qpb1(WITH_IDS, &[group])
    };
    let mut cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (push, with(b"QPB2", &valid_frames[4..]), "must start with \"QPB1\""),
        (push, valid_transaction.clone(), "not a QPB1 body"),
        ("/api/v1/transaction", valid_frames.clone(), "not a QTB1 body"),
        (push, qpb1(0x10 | FRAMES, &[&frames]), "0x10"),
        ("/api/v1/transaction", qtb1(0x01, b"{}", &[&frames]), "0x01"),
        (push, with(&valid_frames, &[0]), "1 bytes follow its last group"),
        (push, qpb1(FRAMES, &[frames_group("bad", "p", 2, b"not zstd at all")]), "not a whole zstd frame"),
        (push, qpb1(FRAMES, &[frames_group("bad", "p", 2, &[z.clone(), z.clone()].concat())]), "follow its zstd frame"),
        (push, qpb1(FRAMES, &[frames_group("bad", "p", 3, &z)]), "holds 2 frames, expected 3"),
        (push, one_frame_body(&frame_with(0, &[], &message("t", "nul")), 1), "not one JSON document"),
        (push, one_frame_body(&frame_with(0, &[], &message("t", "1 2")), 1), "not one JSON document"),
        (push, one_frame_body(&frame_with(0, &[], &message("t", "")), 1), "not one JSON document"),
        (push, one_frame_body(&frame_with(0x01, &[7; 16], &message("t", "1")), 1), "flags are 0"),
        (push, one_frame_body(&frame_with(0x04, &[], &message("t", "1")), 1), "unsupported flags 0x04"),
        (push, one_frame_body(&frame_with(0, &[], &message(&"t".repeat(256), "1")), 1), "at most 255"),
        (push, plain(&[("t", "{")]), "not one JSON document"),
        (push, plain(&[("t", "NaN")]), "not one JSON document"),
        (push, plain(&[("t", "\"\u{1}\"")]), "not one JSON document"),
        (push, plain(&[("t", "1"), ("u", "[1,]")]), "groups[0].items[1].payload"),
        (push, qpb1(WITH_IDS, &[plain_group("bad", "p", &[("t", "1"); 9], true)]), "at most 8"),
        (push, raw_group(b"", b"p"), "must not be empty"),
        (push, raw_group(&[0xff, 0xfe], b"p"), "groups[0].queue is not UTF-8"),
        (push, raw_group(b"q", b"a/b"), "must not contain '/'"),
        (push, raw_group(b"q", b"\n"), "control characters"),
        (push, qpb1(FRAMES | WITH_IDS, &[&frames]), "is for plain groups"),
        (push, qpb1(FRAMES, &[frames_group("bad", "p", 0, &compress(b""))]), "holds no message"),
        (push, qpb1(WITH_IDS, &[group_head(b"bad", b"p", 0)]), "holds no message"),
        (tx, qtb1(0, b"", &[frames_group("bad", "p", 0, &compress(b""))]), "holds no message"),
    ];
    // Nested past what a JSON push's data may be (124 levels); and not UTF-8.
    let deep = format!("{}{}", "[".repeat(125), "]".repeat(125));
    cases.push((push, plain(&[("t", &deep)]), "124 levels"));
    let mut not_utf8 = qpb1(WITH_IDS, &[plain_group("bad", "p", &[("t", "\"ab\"")], true)]);
    let at = not_utf8.len() - 2;
    not_utf8[at] = 0xff;
    cases.push((push, not_utf8, "not UTF-8"));
    // Declared sizes: over what is left of the 64 KiB, or not declared at all.
    let large = framed(&[message("t", &format!("\"{}\"", "a".repeat(70_000)))]);
    cases.push((push, one_frame_body(&large, 1), "over the limit"));
    let mut undeclared = zstd::bulk::Compressor::new(1).expect("a compressor");
    undeclared.include_contentsize(false).expect("no content size");
    let undeclared = undeclared.compress(&framed(&messages)).expect("compressed");
    cases.push((push, qpb1(FRAMES, &[frames_group("bad", "p", 2, &undeclared)]), "does not declare"));
    // Flag 0x01: a body that does not decompress, or not to raw_len, or to more than the limit.
    let zstd_body = |raw_len: usize, compressed: &[u8]| {
        let mut body = b"QPB1".to_vec();
        body.push(ZSTD | WITH_IDS);
        u32le(&mut body, raw_len);
        body.extend_from_slice(compressed);
        body
    };
    let inner = &valid_plain[5..];
    cases.push((push, zstd_body(inner.len(), b"garbage"), "does not decompress"));
    cases.push((push, zstd_body(inner.len() + 1, &compress(inner)), "not raw_len"));
    cases.push((push, zstd_body(65 * 1024, &compress(inner)), "over the limit"));
    // A head that is no JSON, or that pushes.
    cases.push((tx, qtb1(0, b"{", &[&frames]), "not valid JSON"));
    let pushing = br#"{"operations":[{"type":"push","items":[{"queue":"bad","payload":1}]}]}"#;
    cases.push((tx, qtb1(0, pushing, &[&frames]), "its pushes are its groups"));
    cases.push((tx, qtb1(0, br#"{"operations":[]}"#, &[] as &[Vec<u8>]), "must not be empty"));
    for (path, body, why) in cases {
        refused(&app, path, body, why).await;
    }
    assert_eq!(written(&app.db.connect().await).await, 0, "nothing was written");
}

/// A small deterministic generator (xorshift), seeded per run and named in every failure.
struct Noise(u64);

impl Noise {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }

    /// The body with one to three of: a byte changed, bytes cut out, bytes put in, a stretch
    /// repeated.
    fn mutate(&mut self, mut body: Vec<u8>) -> Vec<u8> {
        for _ in 0..=self.below(3) {
            let at = self.below(body.len());
            match self.below(4) {
                0 => body[at] = self.below(256) as u8,
                1 => {
                    let end = (at + 1 + self.below(8)).min(body.len());
                    body.drain(at..end);
                }
                2 => {
                    let inserted: Vec<u8> = (0..=self.below(8)).map(|_| self.below(256) as u8).collect();
                    body.splice(at..at, inserted);
                }
                _ => {
                    let end = (at + 1 + self.below(16)).min(body.len());
                    let stretch = body[at..end].to_vec();
                    body.splice(at..at, stretch);
                }
            }
            if body.is_empty() {
                break;
            }
        }
        body
    }
}

#[actix_web::test]
async fn mutated_binary_bodies_are_never_a_server_error_and_a_refusal_writes_nothing() {
    let app = TestApp::spawn_with(|config| config.push.max_items = 64).await;
    let seed = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_nanos() as u64 | 1;
    let mut noise = Noise(seed);
    let messages = [message("m1", r#"{"a":[1,2]}"#), message("m2", r#""two""#), message("m3", "3")];
    let (frames, _) = frames_of("fuzz", "p", &messages);
    let bodies = [
        ("/api/v1/push", qpb1(FRAMES, &[&frames])),
        ("/api/v1/push", qpb1(WITH_IDS, &[plain_group("fuzz", "p", &[("m4", "[4]"), ("m5", "{\"b\":5}")], true)])),
        ("/api/v1/transaction", qtb1(0, br#"{"operations":[],"requiredLeases":[]}"#, &[frames])),
    ];
    let db = app.db.connect().await;
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(300);
    for case in 0..cases {
        let (path, valid) = &bodies[noise.below(bodies.len())];
        let body = noise.mutate(valid.clone());
        let shown = format!("seed {seed}, case {case}, {path}: {body:?}");
        let before = written(&db).await;
        let request = app.http.post(app.url(path)).header("content-type", "application/x-queen-push").body(body);
        let response = request.send().await.unwrap_or_else(|e| panic!("no answer ({e}): {shown}"));
        let status = response.status();
        let text = response.text().await.expect("a body");
        assert!(status.is_success() || status.is_client_error(), "{status} {text}: {shown}");
        if status.is_client_error() {
            let error: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}) {text}: {shown}"));
            assert!(error["error"].is_string(), "{text}: {shown}");
            assert_eq!(written(&db).await, before, "a refusal wrote: {text}: {shown}");
        }
    }
}
