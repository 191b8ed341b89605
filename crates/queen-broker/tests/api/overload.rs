//! Backpressure: past a bound of what the broker holds at once, work is refused at once with
//! `Retry-After` and writes nothing: 429 for one partition's writer or one group's acks, 503 for
//! the broker's bounds (request bodies in flight, parked long polls). Work is held in the broker
//! by locking the rows it writes from a connection of the test's own.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp};
use crate::long_poll::until_parked;

/// A transaction of the test's own holding row locks, so the broker's writes of those rows wait.
struct RowLock(tokio_postgres::Client);

impl RowLock {
    async fn take(app: &TestApp, rows: &str) -> RowLock {
        let client = app.db.connect().await;
        client.batch_execute(&format!("BEGIN; {rows} FOR UPDATE")).await.expect("the rows are locked");
        RowLock(client)
    }

    async fn release(self) {
        self.0.batch_execute("COMMIT").await.expect("the lock is released");
    }
}

/// Waits until `n` of the broker's statements wait for a lock.
async fn until_blocked(app: &TestApp, n: i64) {
    let waiting = "SELECT count(*) FROM pg_stat_activity
                    WHERE datname = current_database() AND application_name = 'queen' AND wait_event_type = 'Lock'";
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.count(waiting).await < n {
        assert!(Instant::now() < deadline, "the broker's write never waited for the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn item(partition: &str, transaction_id: &str, payload: Value) -> Value {
    json!({"queue": "busy", "partition": partition, "transactionId": transaction_id, "payload": payload})
}

/// An answer with its `Retry-After`.
async fn answered(response: reqwest::Result<reqwest::Response>) -> (Answer, Option<String>) {
    let response = response.expect("an answer");
    let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let status = response.status();
    (Answer { status, body: response.json().await.unwrap_or(Value::Null) }, retry_after)
}

async fn push(app: &TestApp, items: Vec<Value>) -> (Answer, Option<String>) {
    answered(app.http.post(app.url("/api/v1/push")).json(&json!({ "items": items })).send().await).await
}

fn assert_refused(answer: &(Answer, Option<String>), status: StatusCode, bound: &str) {
    let (answer, retry_after) = answer;
    assert_eq!(answer.status, status, "{answer:?}");
    assert_eq!(answer.body["code"], "overloaded", "{answer:?}");
    assert!(answer.body["error"].as_str().is_some_and(|e| e.contains(bound)), "{answer:?}");
    assert_eq!(retry_after.as_deref(), Some("1"));
}

async fn stored(app: &TestApp, transaction_id: &str) -> i64 {
    app.count(&format!("SELECT count(*) FROM queen.log_message_ids WHERE transaction_id = '{transaction_id}'")).await
}

#[actix_web::test]
async fn a_partition_writer_holding_its_mailbox_refuses_a_push_whole_with_429() {
    let app = TestApp::spawn_with(|config| config.push.writer_mailbox = 2).await;
    let first = app.push(json!([item("hot", "seed-hot", json!(0)), item("cold", "seed-cold", json!(0))])).await;
    let hot = first[0]["partition_id"].as_str().expect("a partition id").to_owned();
    let lock = RowLock::take(&app, &format!("SELECT 1 FROM queen.partitions WHERE id = {hot}")).await;

    // One append waits for the lock, the next request waits behind it: the writer holds two.
    let held = async {
        let a = push(&app, vec![item("hot", "a", json!(1))]);
        let b = async {
            until_blocked(&app, 1).await;
            push(&app, vec![item("hot", "b", json!(2))]).await
        };
        futures::join!(a, b)
    };
    let refused = async {
        until_blocked(&app, 1).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while app.metric("queen_actor_queued_requests{actor=\"partition_writer\"}").await < 1.0 {
            assert!(Instant::now() < deadline, "the second push never queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Its share of the cold partition, whose writer has room, is refused with it.
        let refused = push(&app, vec![item("cold", "c-cold", json!(3)), item("hot", "c-hot", json!(3))]).await;
        lock.release().await;
        refused
    };
    let ((a, b), refused) = futures::join!(held, refused);
    assert_refused(&refused, StatusCode::TOO_MANY_REQUESTS, "pushes wait for this partition");
    assert_eq!((a.0.status, b.0.status), (StatusCode::CREATED, StatusCode::CREATED));
    assert_eq!((stored(&app, "c-cold").await, stored(&app, "c-hot").await), (0, 0), "the refused push wrote nothing");
    assert_eq!(app.metric("queen_overload_refusals_total{bound=\"partition_writer\"}").await, 1.0);

    let retried = push(&app, vec![item("cold", "c-cold", json!(3)), item("hot", "c-hot", json!(3))]).await;
    assert_eq!(retried.0.status, StatusCode::CREATED, "room again once the writer caught up");
}

/// A broker holding 100 KiB of bodies at most, partition `p` of `busy` locked (so a push to it
/// holds its body), and a 50 KiB payload.
async fn bodies_bound_with_partition_p_locked() -> (TestApp, RowLock, Value) {
    let app = TestApp::spawn_with(|config| {
        config.http.max_body_bytes = 64 * 1024;
        config.limits.body_bytes_in_flight = 100 * 1024;
    })
    .await;
    let seeded = app.push_one("busy", "p", "seed", json!(0)).await;
    let partition = seeded["partition_id"].as_str().expect("a partition id").to_owned();
    let lock = RowLock::take(&app, &format!("SELECT 1 FROM queen.partitions WHERE id = {partition}")).await;
    (app, lock, json!("x".repeat(50 * 1024)))
}

#[actix_web::test]
async fn a_push_body_past_the_bytes_in_flight_is_refused_with_503() {
    let (app, lock, payload) = bodies_bound_with_partition_p_locked().await;

    // The first body stays held while its append waits for the lock.
    let held = push(&app, vec![item("p", "big-1", payload.clone())]);
    let refused = async {
        until_blocked(&app, 1).await;
        let refused = push(&app, vec![item("q", "big-2", payload.clone())]).await;
        let small = push(&app, vec![item("q", "small", json!(1))]).await;
        lock.release().await;
        (refused, small)
    };
    let (held, (refused, small)) = futures::join!(held, refused);
    assert_refused(&refused, StatusCode::SERVICE_UNAVAILABLE, "bytes of request bodies");
    assert_eq!(small.0.status, StatusCode::CREATED, "a body that fits beside the held one is taken");
    assert_eq!(held.0.status, StatusCode::CREATED);
    assert_eq!(stored(&app, "big-2").await, 0);
    assert_eq!(app.metric("queen_overload_refusals_total{bound=\"body_bytes\"}").await, 1.0);
    let retried = push(&app, vec![item("q", "big-2", payload)]).await;
    assert_eq!(retried.0.status, StatusCode::CREATED, "the bytes were given back");
}

/// A QPB1 body compressed whole (flag 0x01) of one plain item, as the official client sends it
/// with `push_compression=True`: a few hundred bytes on the wire for a `payload` of any length.
fn compressed_push(partition: &str, transaction_id: &str, payload: &Value) -> Vec<u8> {
    let text = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend_from_slice(&u16::try_from(bytes.len()).expect("short").to_le_bytes());
        out.extend_from_slice(bytes);
    };
    let payload = payload.to_string();
    let mut raw = 1u32.to_le_bytes().to_vec();
    text(&mut raw, b"busy");
    text(&mut raw, partition.as_bytes());
    raw.extend_from_slice(&1u32.to_le_bytes());
    text(&mut raw, transaction_id.as_bytes());
    raw.extend_from_slice(&u32::try_from(payload.len()).expect("a u32").to_le_bytes());
    raw.extend_from_slice(payload.as_bytes());
    let mut body = b"QPB1".to_vec();
    body.push(0x01 | 0x04);
    body.extend_from_slice(&u32::try_from(raw.len()).expect("a u32").to_le_bytes());
    body.extend_from_slice(&zstd::bulk::compress(&raw, 3).expect("compressed"));
    body
}

#[actix_web::test]
async fn a_compressed_push_holds_the_bytes_it_decompresses_to() {
    let (app, lock, payload) = bodies_bound_with_partition_p_locked().await;
    let send = |body: Vec<u8>| {
        let request = app.http.post(app.url("/api/v1/push")).header("content-type", "application/x-queen-push");
        async move { answered(request.body(body).send().await).await }
    };
    let compressed = compressed_push("q", "zipped", &payload);
    assert!(compressed.len() < 1024, "{} bytes on the wire", compressed.len());

    let held = push(&app, vec![item("p", "big-1", payload.clone())]);
    let refused = async {
        until_blocked(&app, 1).await;
        let refused = send(compressed.clone()).await;
        lock.release().await;
        refused
    };
    let (held, refused) = futures::join!(held, refused);
    assert_refused(&refused, StatusCode::SERVICE_UNAVAILABLE, "bytes of request bodies");
    assert_eq!(held.0.status, StatusCode::CREATED);
    assert_eq!(stored(&app, "zipped").await, 0);
    let retried = send(compressed).await;
    assert_eq!(retried.0.status, StatusCode::CREATED, "the bytes were given back: {:?}", retried.0);
}

/// A compressed push that, with what it inflates to, holds more than the bound lets one request
/// hold would be refused as overload on every retry, on an idle broker: it is a 413 naming the
/// bound. (Its digits are random, so it compresses to about half.)
#[actix_web::test]
async fn a_compressed_push_larger_inflated_than_the_bound_is_refused_as_too_large() {
    let app = TestApp::spawn_with(|config| {
        config.http.max_body_bytes = 64 * 1024;
        config.limits.body_bytes_in_flight = 64 * 1024;
    })
    .await;
    let digits: String = (0..1536).map(|_| uuid::Uuid::new_v4().simple().to_string()).collect();
    let compressed = compressed_push("q", "inflated", &json!(digits));
    assert!(compressed.len() > 20 * 1024, "{} bytes on the wire", compressed.len());
    let request = app.http.post(app.url("/api/v1/push")).header("content-type", "application/x-queen-push");
    let (refused, retry_after) = answered(request.body(compressed).send().await).await;
    assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE, "{refused:?}");
    assert!(refused.body["error"].as_str().is_some_and(|e| e.contains("limits.body_bytes_in_flight")), "{refused:?}");
    assert_eq!(retry_after, None, "retrying would not help");
    assert_eq!(stored(&app, "inflated").await, 0);
}

#[actix_web::test]
async fn an_ack_call_past_its_groups_bound_is_refused_with_429() {
    let app = TestApp::spawn_with(|config| config.limits.group_ack_calls = 1).await;
    app.push(json!([item("p", "m1", json!(1)), item("q", "m2", json!(2))])).await;
    let first = app.pop("queue/busy/partition/p", "batch=1&consumerGroup=g").await.messages();
    let second = app.pop("queue/busy/partition/q", "batch=1&consumerGroup=g").await.messages();
    let partition = first[0]["partitionId"].as_str().expect("a partition id").to_owned();
    let lock =
        RowLock::take(&app, &format!("SELECT 1 FROM queen.log_consumers WHERE partition_id = {partition}")).await;

    let ack = |messages: &[Value]| {
        let acks: Vec<Value> = messages
            .iter()
            .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}))
            .collect();
        let body = json!({"acknowledgments": acks, "consumerGroup": "g"});
        let request = app.http.post(app.url("/api/v1/ack/batch")).json(&body).send();
        async move { answered(request.await).await }
    };
    let held = ack(&first);
    let refused = async {
        until_blocked(&app, 1).await;
        let refused = ack(&second).await;
        lock.release().await;
        refused
    };
    let (held, refused) = futures::join!(held, refused);
    assert_refused(&refused, StatusCode::TOO_MANY_REQUESTS, "ack calls wait for this consumer group");
    assert_eq!(held.0.body[0]["success"], true, "{:?}", held.0);
    assert_eq!(app.metric("queen_overload_refusals_total{bound=\"group_leases\"}").await, 1.0);
    let retried = ack(&second).await;
    assert_eq!(retried.0.body[0]["success"], true, "the refused call changed nothing: its lease still holds");
}

#[actix_web::test]
async fn a_long_poll_past_the_parked_bound_is_refused_with_503() {
    let app = TestApp::spawn_with(|config| config.limits.parked_long_polls = 2).await;
    let parked = futures::future::join_all((0..2).map(|_| app.pop("queue/idle", "wait=true&timeout=20000")));
    let refused = async {
        until_parked(&app, 2).await;
        let refused =
            answered(app.http.get(app.url("/api/v1/pop/queue/idle?wait=true&timeout=20000")).send().await).await;
        let short = app.pop("queue/idle", "wait=false").await;
        // One message for each parked pop, in partitions of their own.
        let wake = |partition: &str| json!({"queue": "idle", "partition": partition, "transactionId": partition, "payload": 1});
        app.push(json!([wake("p1"), wake("p2")])).await;
        (refused, short)
    };
    let (parked, (refused, short)) = futures::join!(parked, refused);
    assert_refused(&refused, StatusCode::SERVICE_UNAVAILABLE, "long polls are parked");
    assert_eq!(short.status, StatusCode::NO_CONTENT, "a pop that does not wait is served");
    let statuses: Vec<StatusCode> = parked.iter().map(|a| a.status).collect();
    assert_eq!(statuses, vec![StatusCode::OK; 2], "the parked pops were served");
    assert_eq!(app.metric("queen_overload_refusals_total{bound=\"long_polls\"}").await, 1.0);
}
