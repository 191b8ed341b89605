//! Timers: scheduled messages kept in PostgreSQL and delivered, once, by a broker's sweeper when
//! they are due; their edges (bad operations, server-owned fields, delays of zero or less,
//! cancels of fired timers, reschedules, claims, failed deliveries, restarts, the transaction
//! rider).

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use queen_testkit::TestDatabase;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp};

/// Longest a test waits for a timer to be delivered.
const DEADLINE: Duration = Duration::from_secs(20);

fn schedule(queue: &str, key: &str, data: Value, delay_ms: i64, txn: &str) -> Value {
    let payload = BASE64.encode(serde_json::to_vec(&data).expect("JSON"));
    json!({"op": "schedule", "queue": queue, "timerKey": key, "payload": payload, "delayMs": delay_ms, "txn": txn})
}

async fn timers(app: &TestApp, ops: Value) -> Answer {
    app.post("/api/v1/timers", &json!({ "operations": ops })).await
}

/// The results of a batch that must be answered 200.
async fn results(app: &TestApp, ops: Value) -> Vec<Value> {
    let answer = timers(app, ops).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    answer.body["results"].as_array().cloned().expect("results")
}

async fn stored_timers(app: &TestApp) -> i64 {
    app.count("SELECT count(*) FROM queen.timers").await
}

/// Pops the queue (long polls) until it hands out messages; fails after [`DEADLINE`].
async fn delivered(app: &TestApp, queue: &str) -> Vec<Value> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let messages = app.pop(&format!("queue/{queue}"), "batch=100&wait=true&timeout=1000").await.messages();
        if !messages.is_empty() {
            return messages;
        }
        assert!(Instant::now() < deadline, "no timer was delivered to {queue}");
    }
}

/// Peeks until the timer's state is `state`; its row.
async fn peek_until(app: &TestApp, queue: &str, key: &str, state: &str) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let peeked = app.get(&format!("/api/v1/timers/{queue}/{key}")).await.body;
        if peeked["state"] == state {
            return peeked;
        }
        assert!(Instant::now() < deadline, "the timer never became {state}: {peeked}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_web::test]
async fn a_scheduled_timer_is_delivered_once_with_its_txn_not_before_its_delay() {
    let app = TestApp::spawn().await;
    let asked = Instant::now();
    let answer = results(&app, json!([schedule("later", "order-1", json!({"order": 1}), 700, "txn-1")])).await;
    assert_eq!(answer.len(), 1);
    let result = &answer[0];
    assert_eq!((&result["ok"], &result["status"]), (&json!(true), &json!("scheduled")), "{result}");
    assert_eq!(
        (&result["queue"], &result["timerKey"], &result["txn"]),
        (&json!("later"), &json!("order-1"), &json!("txn-1"))
    );
    let message_id = result["messageId"].as_str().expect("a message id, promised at scheduling");
    let deliver_at: chrono::DateTime<chrono::Utc> =
        result["deliverAt"].as_str().expect("deliverAt").parse().expect("ISO-8601");

    let peeked = app.get("/api/v1/timers/later/order-1").await.body;
    assert_eq!(
        (&peeked["found"], &peeked["state"], &peeked["encrypted"]),
        (&json!(true), &json!("pending"), &json!(false))
    );
    assert_eq!(BASE64.decode(peeked["payload"].as_str().expect("payload")).expect("base64"), br#"{"order":1}"#);

    let messages = delivered(&app, "later").await;
    assert!(asked.elapsed() >= Duration::from_millis(700), "delivered {:?} after scheduling", asked.elapsed());
    assert_eq!(messages.len(), 1, "{messages:?}");
    let message = &messages[0];
    assert_eq!(
        (&message["transactionId"], &message["data"], &message["id"]),
        (&json!("txn-1"), &json!({"order": 1}), &json!(message_id))
    );
    assert_eq!(message["partition"], "Default");
    let created: chrono::DateTime<chrono::Utc> =
        message["createdAt"].as_str().expect("createdAt").parse().expect("ISO-8601");
    assert!(created >= deliver_at, "written at {created}, due at {deliver_at}");
    assert_eq!(
        app.get("/api/v1/timers/later/order-1").await.body,
        json!({"found": false}),
        "delivered timers are gone"
    );
    assert_eq!(stored_timers(&app).await, 0);
    assert_eq!(app.pop("queue/later", "batch=10").await.messages().len(), 0, "delivered once");
}

#[actix_web::test]
async fn bad_operations_are_refused_naming_the_field_and_write_nothing() {
    let app = TestApp::spawn().await;
    let good = schedule("q", "k", json!(1), 1000, "t");
    let with = |field: &str, value: Value| {
        let mut op = good.clone();
        op[field] = value;
        op
    };
    let without = |field: &str| {
        let mut op = good.clone();
        op.as_object_mut().expect("an object").remove(field);
        op
    };
    let cases = [
        (json!([]), "operations must not be empty"),
        (json!([with("op", json!("snooze"))]), "operations[0].op"),
        (json!([good.clone(), without("delayMs")]), "operations[1].delayMs is required"),
        (json!([with("delayMs", json!("soon"))]), "operations[0].delayMs must be an integer"),
        (json!([with("delayMs", json!(1e15))]), "operations[0].delayMs"),
        (json!([without("payload")]), "operations[0].payload is required"),
        (json!([with("payload", json!("not base64!"))]), "operations[0].payload must be base64"),
        (
            json!([with("payload", json!(BASE64.encode("not json")))]),
            "operations[0].payload must encode a JSON document",
        ),
        (json!([with("payloadZstd", json!(true))]), "operations[0].payload is not a zstd frame"),
        // Deeper than a push may nest: a pop answer carrying it would be JSON readers give up on.
        (
            json!([with("payload", json!(BASE64.encode(format!("{}1{}", "[".repeat(125), "]".repeat(125)))))]),
            "operations[0].payload nests arrays and objects more than 124 levels deep",
        ),
        (json!([with("queue", json!(""))]), "operations[0].queue"),
        (json!([with("partition", json!("a/b"))]), "operations[0].partition"),
        (json!([with("timerKey", json!("/k"))]), "operations[0].timerKey"),
        // A path would lose them: a cancel of `a/../b` would reach `b`.
        (json!([with("timerKey", json!("a/../b"))]), "operations[0].timerKey"),
        (json!([with("timerKey", json!("a/."))]), "operations[0].timerKey"),
        (json!([with("txn", json!(7))]), "operations[0].txn must be a string"),
        (json!([with("priority", json!(1))]), "operations[0].priority is not a field"),
        (
            json!([{"op": "cancel", "queue": "q", "timerKey": "k", "delayMs": 5}]),
            "operations[0].delayMs is not a field of a cancel",
        ),
    ];
    for (ops, mentions) in cases {
        let answer = timers(&app, ops.clone()).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{ops}: {answer:?}");
        let error = answer.body["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(mentions), "{ops}: {error:?} should start with {mentions:?}");
    }
    let answer = app.post("/api/v1/timers", &json!({})).await;
    assert_eq!((answer.status, &answer.body["error"]), (StatusCode::BAD_REQUEST, &json!("operations is required")));
    assert_eq!(stored_timers(&app).await, 0, "a refused batch writes nothing, its good operations included");
}

/// Compressed payloads (`payloadZstd`) may decompress to as much as a body may weigh, in all:
/// a few kilobytes of zstd frames must not make the broker hold gigabytes. Each of these
/// decompresses to 6 MiB, within the 16 MiB body bound alone; three of them are not, in a batch
/// or in a transaction's rider, and the request is refused whole.
#[actix_web::test]
async fn compressed_payloads_may_decompress_to_a_bodys_worth_in_all() {
    let app = TestApp::spawn().await;
    let document = serde_json::to_vec(&"x".repeat(6 * 1024 * 1024)).expect("JSON");
    let frame = zstd::bulk::compress(&document, 3).expect("a zstd frame that declares its size");
    assert!(frame.len() < 64 * 1024, "a small frame: {} bytes", frame.len());
    let compressed = |key: &str| {
        let mut op = schedule("inflated", key, json!(null), 60_000, key);
        op["payload"] = json!(BASE64.encode(&frame));
        op["payloadZstd"] = json!(true);
        op
    };
    let within = results(&app, json!([compressed("a"), compressed("b")])).await;
    assert!(within.iter().all(|result| result["status"] == "scheduled"), "{within:?}");

    let past = timers(&app, json!([compressed("c"), compressed("d"), compressed("e")])).await;
    assert_eq!(past.status, StatusCode::BAD_REQUEST, "{past:?}");
    let error = past.body["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("operations[2].payload decompresses to 6291458 bytes"), "{error}");
    assert!(error.contains("16777216 bytes in all (http.max_body_bytes)"), "{error}");
    let bundle = json!({"operations": [], "timers": [compressed("c"), compressed("d"), compressed("e")]});
    let rider = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!(rider.status, StatusCode::BAD_REQUEST, "{rider:?}");
    assert!(rider.body["error"].as_str().is_some_and(|e| e.starts_with("timers[2].payload decompresses")), "{rider:?}");
    assert_eq!(stored_timers(&app).await, 2, "only the batch within the bound was stored");
}

#[actix_web::test]
async fn server_owned_fields_are_refused_by_name() {
    let app = TestApp::spawn().await;
    for field in
        ["producerSub", "messageId", "deliverAt", "delaySeconds", "attempts", "claimToken", "tenantId", "_internal"]
    {
        let mut op = schedule("q", "k", json!(1), 1000, "t");
        op[field] = json!("forged");
        let answer = timers(&app, json!([op])).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{field}: {answer:?}");
        let error = answer.body["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(&format!("operations[0].{field} is set by the broker")), "{error}");
    }
    assert_eq!(stored_timers(&app).await, 0);
}

#[actix_web::test]
async fn a_delay_of_zero_or_less_is_due_at_once() {
    let app = TestApp::spawn().await;
    let before = app.count("SELECT (extract(epoch FROM now()) * 1000)::bigint").await;
    let answer = results(
        &app,
        json!([schedule("now", "zero", json!(0), 0, "t0"), schedule("now", "past", json!(-1), -60_000, "t1")]),
    )
    .await;
    for result in &answer {
        let due: chrono::DateTime<chrono::Utc> =
            result["deliverAt"].as_str().expect("deliverAt").parse().expect("ISO-8601");
        assert!(due.timestamp_millis() >= before, "due now, not in the past: {result}");
    }
    let mut txns: Vec<Value> = Vec::new();
    while txns.len() < 2 {
        txns.extend(delivered(&app, "now").await.iter().map(|m| m["transactionId"].clone()));
    }
    txns.sort_by_key(ToString::to_string);
    assert_eq!(txns, [json!("t0"), json!("t1")]);
}

#[actix_web::test]
async fn cancelling_answers_cancelled_then_absent_and_a_fired_timer_is_absent_with_its_txn() {
    let app = TestApp::spawn().await;
    results(&app, json!([schedule("c", "pending", json!(1), 60_000, "p1"), schedule("c", "fires", json!(2), 0, "f1")]))
        .await;

    // Another txn's timer is not the one asked for: left alone.
    let other = app.delete("/api/v1/timers/c/pending?txn=someone-else").await.body;
    assert_eq!(
        other,
        json!({"ok": false, "status": "absent", "queue": "c", "timerKey": "pending", "txn": "someone-else"})
    );
    let cancelled = app.delete("/api/v1/timers/c/pending?txn=p1").await.body;
    assert_eq!(cancelled, json!({"ok": true, "status": "cancelled", "queue": "c", "timerKey": "pending", "txn": "p1"}));
    let again = app.delete("/api/v1/timers/c/pending").await.body;
    assert_eq!(again, json!({"ok": false, "status": "absent", "queue": "c", "timerKey": "pending", "txn": null}));

    let messages = delivered(&app, "c").await;
    assert_eq!(messages.iter().map(|m| &m["transactionId"]).collect::<Vec<_>>(), [&json!("f1")]);
    let fired = app.delete("/api/v1/timers/c/fires?txn=f1").await.body;
    assert_eq!(fired["status"], "absent", "no longer pending: delivered, which the txn lets the caller check");
    assert_eq!(fired["txn"], "f1");
    // A cancel in a batch answers the same way.
    let batch = results(&app, json!([{"op": "cancel", "queue": "c", "timerKey": "fires"}])).await;
    assert_eq!((&batch[0]["ok"], &batch[0]["status"]), (&json!(false), &json!("absent")));
    assert_eq!(stored_timers(&app).await, 0);
}

#[actix_web::test]
async fn rescheduling_moves_the_due_time_and_keeps_the_promised_message_id_for_the_same_txn() {
    let app = TestApp::spawn().await;
    let first = results(&app, json!([schedule("r", "k", json!("first"), 3_600_000, "same")])).await.remove(0);
    let mut op = schedule("r", "k", json!("second"), 300, "same");
    op["op"] = json!("reschedule");
    let second = results(&app, json!([op])).await.remove(0);
    assert_eq!(second["status"], "rescheduled");
    assert_eq!(second["messageId"], first["messageId"], "a retried schedule answers what the first promised");
    let (first_due, second_due) =
        (first["deliverAt"].as_str().expect("due"), second["deliverAt"].as_str().expect("due"));
    assert!(second_due < first_due, "moved from {first_due} to {second_due}");

    let messages = delivered(&app, "r").await;
    assert_eq!(messages.len(), 1);
    assert_eq!((&messages[0]["data"], &messages[0]["id"]), (&json!("second"), &first["messageId"]));

    // Under a new txn, a reschedule is a new message.
    let third = results(&app, json!([schedule("r", "k", json!("third"), 3_600_000, "other")])).await.remove(0);
    assert_eq!(third["status"], "scheduled", "the key's timer was delivered: this is a new one");
    let fourth = results(&app, json!([schedule("r", "k", json!("fourth"), 3_600_000, "another")])).await.remove(0);
    assert_eq!(fourth["status"], "rescheduled");
    assert_ne!(fourth["messageId"], third["messageId"]);
}

#[actix_web::test]
async fn a_timer_being_delivered_answers_too_late_and_a_lapsed_claim_is_delivered_once() {
    let app = TestApp::spawn().await;
    results(&app, json!([schedule("claimed", "k", json!("x"), 3_600_000, "c1")])).await;
    // What a sweeper's claim leaves while it delivers (a sweeper that then died, here).
    let db = app.db.connect().await;
    db.execute("UPDATE queen.timers SET claim_token = gen_random_uuid(), fire_at = now() + interval '1 hour'", &[])
        .await
        .expect("claim");
    assert_eq!(app.get("/api/v1/timers/claimed/k").await.body["state"], "delivering");
    let cancel = app.delete("/api/v1/timers/claimed/k").await.body;
    assert_eq!(cancel, json!({"ok": false, "status": "too_late", "queue": "claimed", "timerKey": "k", "txn": "c1"}));
    let mut op = schedule("claimed", "k", json!("y"), 0, "c2");
    op["op"] = json!("reschedule");
    let rescheduled = results(&app, json!([op])).await.remove(0);
    assert_eq!(
        (&rescheduled["ok"], &rescheduled["status"], &rescheduled["txn"]),
        (&json!(false), &json!("too_late"), &json!("c1"))
    );
    assert_eq!(app.get("/api/v1/timers/claimed/k").await.body["txn"], "c1", "nothing changed");

    // The claim lapses: any sweeper takes the timer again and delivers it, once.
    db.execute("UPDATE queen.timers SET fire_at = now() - interval '1 second'", &[]).await.expect("lapse");
    let messages = delivered(&app, "claimed").await;
    assert_eq!(messages.iter().map(|m| &m["transactionId"]).collect::<Vec<_>>(), [&json!("c1")]);
    assert_eq!(stored_timers(&app).await, 0);
}

#[actix_web::test]
async fn a_timer_whose_queue_is_full_is_retried_until_it_fits_and_is_not_lost() {
    let app = TestApp::spawn().await;
    app.configure("bounded", json!({"maxSize": 1})).await;
    app.push_one("bounded", "p", "first", json!("first")).await;
    results(&app, json!([schedule("bounded", "k", json!("timer"), 0, "from-timer")])).await;
    let retrying = peek_until(&app, "bounded", "k", "retrying").await;
    assert!(retrying["attempts"].as_i64() >= Some(1), "{retrying}");
    assert!(retrying["lastError"].as_str().is_some_and(|e| e.contains("is full")), "{retrying}");
    assert!(retrying["nextAttemptAt"].is_string(), "{retrying}");

    // Room is made: the next attempt delivers it.
    let first = app.pop("queue/bounded", "batch=1").await.messages();
    assert_eq!(first[0]["transactionId"], "first");
    app.ack_all(&first, "completed", None).await;
    let messages = delivered(&app, "bounded").await;
    assert_eq!(messages.iter().map(|m| &m["transactionId"]).collect::<Vec<_>>(), [&json!("from-timer")]);
    assert_eq!(stored_timers(&app).await, 0);
    // What an operator sees of it.
    assert!(app.metric("queen_timer_delivery_failures_total").await >= 1.0);
    assert_eq!(app.metric("queen_timers_delivered_total").await, 1.0);
}

#[actix_web::test]
async fn a_timer_whose_attempts_are_spent_is_held_and_a_reschedule_rearms_it() {
    let app = TestApp::spawn_with(|config| config.timers.max_attempts = 1).await;
    app.configure("tiny", json!({"maxSize": 1})).await;
    app.push_one("tiny", "p", "first", json!("first")).await;
    results(&app, json!([schedule("tiny", "k", json!("timer"), 0, "held-txn")])).await;
    let held = peek_until(&app, "tiny", "k", "held").await;
    assert_eq!((&held["attempts"], &held["nextAttemptAt"]), (&json!(1), &Value::Null), "{held}");

    let first = app.pop("queue/tiny", "batch=1").await.messages();
    app.ack_all(&first, "completed", None).await;
    // Proving a negative: several sweeps and more than the first backoff go by, and a held timer
    // is not tried again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(app.get("/api/v1/timers/tiny/k").await.body["state"], "held");
    assert!(app.pop("queue/tiny", "batch=10").await.messages().is_empty());

    let mut op = schedule("tiny", "k", json!("timer"), 0, "held-txn");
    op["op"] = json!("reschedule");
    assert_eq!(results(&app, json!([op])).await[0]["status"], "rescheduled");
    let messages = delivered(&app, "tiny").await;
    assert_eq!(messages.iter().map(|m| &m["transactionId"]).collect::<Vec<_>>(), [&json!("held-txn")]);
}

#[actix_web::test]
async fn an_encrypted_queues_timer_is_sealed_at_rest_delivered_in_plain_and_never_stored_plain() {
    const KEY: &str = "7f3c9a1e5b2d4f6081a3c5e7092b4d6f8a1c3e5f7092b4d6e8f0a2c4e6081b3d";
    let app = TestApp::spawn_with(|config| config.encryption.key = Some(KEY.into())).await;
    app.configure("secret", json!({"encryptionEnabled": true})).await;
    results(&app, json!([schedule("secret", "k", json!({"card": "4111"}), 3_600_000, "s1")])).await;
    let peeked = app.get("/api/v1/timers/secret/k").await.body;
    assert_eq!(peeked["encrypted"], true);
    let stored = BASE64.decode(peeked["payload"].as_str().expect("payload")).expect("base64");
    assert!(!String::from_utf8_lossy(&stored).contains("4111"), "sealed at rest");

    let mut op = schedule("secret", "k", json!({"card": "4111"}), 0, "s1");
    op["op"] = json!("reschedule");
    results(&app, json!([op])).await;
    let messages = delivered(&app, "secret").await;
    assert_eq!(messages[0]["data"], json!({"card": "4111"}));

    // Its queue deleted, a delivery would create it again with default options, unencrypted: the
    // timer is held back rather than stored in plain text.
    results(&app, json!([schedule("secret", "k2", json!({"card": "5500"}), 3_600_000, "s2")])).await;
    assert_eq!(app.delete("/api/v1/resources/queues/secret").await.status, StatusCode::OK);
    // Due now, as it was scheduled (a reschedule would bring a payload of its own).
    let due = "UPDATE queen.timers SET deliver_at = now(), fire_at = now() WHERE timer_key = 'k2'";
    app.db.connect().await.execute(due, &[]).await.expect("the timer made due");
    let failed = peek_until(&app, "secret", "k2", "retrying").await;
    assert!(failed["lastError"].as_str().is_some_and(|e| e.contains("not encrypted now")), "{failed}");
    let stored = app.count("SELECT count(*) FROM queen.log_message_ids WHERE transaction_id = 's2'").await;
    assert_eq!(stored, 0, "nothing of it was stored");
}

#[actix_web::test]
async fn a_page_of_timers_is_in_key_order_after_an_exclusive_cursor_with_a_clamped_limit() {
    let app = TestApp::spawn().await;
    let ops: Vec<Value> =
        ["d", "a/2", "c", "a/1", "b"].iter().map(|key| schedule("paged", key, json!(key), 3_600_000, key)).collect();
    results(&app, json!(ops)).await;
    let page = app.get("/api/v1/timers/paged?limit=2").await.body;
    let keys = |page: &Value| -> Vec<Value> {
        page["rows"].as_array().expect("rows").iter().map(|r| r["timerKey"].clone()).collect()
    };
    assert_eq!(
        (keys(&page), &page["truncated"], &page["nextAfter"]),
        (vec![json!("a/1"), json!("a/2")], &json!(true), &json!("a/2"))
    );
    let rest = app.get("/api/v1/timers/paged?after=a%2F2&limit=100000").await.body;
    assert_eq!(
        (keys(&rest), &rest["truncated"], &rest["nextAfter"]),
        (vec![json!("b"), json!("c"), json!("d")], &json!(false), &Value::Null)
    );
    assert_eq!(keys(&app.get("/api/v1/timers/paged?limit=0").await.body).len(), 1, "a limit below 1 is 1");
    assert_eq!(app.get("/api/v1/timers/paged?limit=many").await.status, StatusCode::BAD_REQUEST);
    // Keys with `/` are addressed by the rest of the path.
    assert_eq!(app.get("/api/v1/timers/paged/a/1").await.body["txn"], "a/1");
    assert_eq!(app.get("/api/v1/timers/elsewhere").await.body["rows"], json!([]));
}

/// Pages and sweeps are bounded by their payloads' bytes as well as by count: a page stops once
/// it holds `pop.max_answer_bytes` (at least one timer, and `nextAfter` goes on from there), and a
/// sweep claims no more than `push.max_segment_bytes` (its timers of a partition become one
/// segment, no larger than fused pushes make one).
#[actix_web::test]
async fn pages_and_sweeps_of_large_timers_are_bounded_by_bytes() {
    let app = TestApp::spawn_with(|config| {
        config.pop.max_answer_bytes = 1024;
        config.push.max_segment_bytes = 1024;
    })
    .await;
    let data = |key: &str| json!({"key": key, "pad": "x".repeat(600)});
    let keys = ["a", "b", "c", "d"];
    let later: Vec<Value> = keys.iter().map(|key| schedule("big-later", key, data(key), 3_600_000, key)).collect();
    results(&app, json!(later)).await;
    let mut paged = Vec::new();
    let mut next = String::new();
    loop {
        let page = app.get(&format!("/api/v1/timers/big-later?limit=100&after={next}")).await.body;
        let rows = page["rows"].as_array().cloned().expect("rows");
        assert_eq!(rows.len(), 1, "one 600-byte payload per 1024-byte page: {page}");
        paged.extend(rows.iter().map(|row| row["timerKey"].clone()));
        if page["truncated"] == false {
            break;
        }
        next = page["nextAfter"].as_str().expect("nextAfter").to_owned();
    }
    assert_eq!(paged, keys.map(|key| json!(key)), "every timer, once, in key order");

    let due: Vec<Value> = keys.iter().map(|key| schedule("big-due", key, data(key), 0, key)).collect();
    results(&app, json!(due)).await;
    let mut received = Vec::new();
    while received.len() < keys.len() {
        let messages = delivered(&app, "big-due").await;
        app.ack_all(&messages, "completed", None).await;
        received.extend(messages.iter().map(|m| m["data"]["key"].clone()));
    }
    received.sort_by_key(|key| key.as_str().map(str::to_owned));
    assert_eq!(received, keys.map(|key| json!(key)), "every timer delivered once");
    let segments = app.count("SELECT count(*) FROM queen.log_segments s JOIN queen.partitions p ON p.id = s.partition_id JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'big-due'").await;
    assert_eq!(segments, 4, "one timer per sweep, each its own segment");
}

#[actix_web::test]
async fn the_transaction_rider_schedules_in_the_bundles_transaction_and_its_results_come_last() {
    let app = TestApp::spawn().await;
    let bundle = json!({
        "operations": [{"type": "push", "items": [{"queue": "rider-push", "transactionId": "a", "payload": 1},
                                                   {"queue": "rider-push", "transactionId": "b", "payload": 2}]}],
        "requiredLeases": [],
        "timers": [schedule("rider", "k", json!("later"), 0, "rider-txn"), {"op": "cancel", "queue": "rider", "timerKey": "none"}],
    });
    let answer = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!((answer.status, &answer.body["success"]), (StatusCode::OK, &json!(true)), "{answer:?}");
    let results = answer.body["results"].as_array().expect("results");
    let statuses: Vec<&Value> = results.iter().map(|r| &r["status"]).collect();
    assert_eq!(statuses, [&json!("queued"), &json!("queued"), &json!("scheduled"), &json!("absent")]);
    assert_eq!((&results[2]["index"], &results[3]["index"]), (&json!(2), &json!(3)), "the flat index space");
    assert_eq!(delivered(&app, "rider").await[0]["transactionId"], "rider-txn");

    // A bundle of timer operations alone is a bundle.
    let alone = app.post("/api/v1/transaction", &json!({"operations": [], "requiredLeases": [], "timers": [schedule("rider", "k2", json!(2), 3_600_000, "t2")]})).await;
    assert_eq!((alone.status, &alone.body["results"][0]["status"]), (StatusCode::OK, &json!("scheduled")), "{alone:?}");

    // A bundle that rolls back after its timers were applied (its push does not fit) schedules
    // nothing.
    app.configure("rider-full", json!({"maxSize": 1})).await;
    app.push_one("rider-full", "p", "in", json!(0)).await;
    let refused = json!({"operations": [{"type": "push", "items": [{"queue": "rider-full", "transactionId": "over", "payload": 1}]}],
                         "timers": [schedule("rider", "k3", json!(3), 0, "t3")]});
    let answer = app.post("/api/v1/transaction", &refused).await;
    assert_eq!(
        (answer.status, &answer.body["code"]),
        (StatusCode::TOO_MANY_REQUESTS, &json!("queue_full")),
        "{answer:?}"
    );
    assert_eq!(app.get("/api/v1/timers/rider/k3").await.body, json!({"found": false}));
    for (timers, mentions) in
        [(json!([]), "timers must not be empty"), (json!([{"op": "cancel"}]), "timers[0].queue is required")]
    {
        let answer = app.post("/api/v1/transaction", &json!({"operations": [], "timers": timers})).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        assert!(answer.body["error"].as_str().is_some_and(|e| e.starts_with(mentions)), "{answer:?}");
    }
    assert_eq!(stored_timers(&app).await, 1, "only the bundle of timers alone");
}

/// A broker in a thread and actix system of its own, which the test stops as a process would
/// stop: its sweeper with it.
struct StoppableBroker {
    base: String,
    system: actix_rt::System,
    thread: std::thread::JoinHandle<()>,
}

impl StoppableBroker {
    fn start(db: &Arc<TestDatabase>) -> StoppableBroker {
        let (started, base) = std::sync::mpsc::channel();
        let db = Arc::clone(db);
        let thread = std::thread::spawn(move || {
            let system = actix_rt::System::new();
            system.block_on(async {
                let base = queen_testkit::in_process::serve(&db, |_| {}).await;
                started.send((base, actix_rt::System::current())).expect("the test waits");
            });
            system.run().expect("the broker's system runs until stopped");
        });
        let (base, system) = base.recv().expect("the broker starts");
        StoppableBroker { base, system, thread }
    }

    fn stop(self) {
        self.system.stop();
        self.thread.join().expect("the broker's thread ends");
    }
}

#[test]
fn a_timer_outlives_the_broker_it_was_scheduled_through() {
    let system = actix_rt::System::new();
    let db = Arc::new(system.block_on(TestDatabase::create("timers_restart")));
    let first = StoppableBroker::start(&db);
    let http = queen_testkit::http().build().expect("an HTTP client");
    let scheduled = system.block_on(async {
        let ops = json!({"operations": [schedule("durable", "k", json!("survives"), 1500, "durable-txn")]});
        http.post(format!("{}/api/v1/timers", first.base))
            .json(&ops)
            .send()
            .await
            .expect("schedule")
            .json::<Value>()
            .await
    });
    assert_eq!(scheduled.expect("JSON")["results"][0]["status"], "scheduled");
    first.stop();
    let pending = system.block_on(async {
        db.connect().await.query_one("SELECT count(*) FROM queen.timers", &[]).await.expect("count").get::<_, i64>(0)
    });
    assert_eq!(pending, 1, "the stopped broker did not deliver it");

    system.block_on(async {
        let base = TestApp::spawn_on(&db, |_| {}).await;
        let deadline = Instant::now() + DEADLINE;
        loop {
            let answer =
                http.get(format!("{base}/api/v1/pop/queue/durable?wait=true&timeout=1000")).send().await.expect("pop");
            if answer.status() == StatusCode::OK {
                let body: Value = answer.json().await.expect("JSON");
                assert_eq!(body["messages"][0]["transactionId"], "durable-txn");
                break;
            }
            assert!(Instant::now() < deadline, "the next broker never delivered the timer");
        }
    });
}
