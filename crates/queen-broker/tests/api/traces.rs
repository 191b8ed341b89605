//! Trace events: recorded on a message, read back by message, by name and as the names in use;
//! refused whole when bad; retained exactly as long as their message; never in the way of pushes,
//! pops and acks.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp};
use crate::retention::{age, until_count, waiting_in};

/// Records an event and insists on a 201; the answer's body.
async fn trace(app: &TestApp, body: Value) -> Value {
    let answer = app.post("/api/v1/traces", &body).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    answer.body
}

/// A trace body for the pushed message `pushed` (a push result).
fn on(pushed: &Value, names: Value, event_type: Option<&str>, data: Value) -> Value {
    let mut body = json!({
        "transactionId": pushed["transaction_id"], "partitionId": pushed["partition_id"],
        "consumerGroup": "__QUEUE_MODE__", "traceNames": names, "data": data,
    });
    if let Some(event_type) = event_type {
        body["eventType"] = json!(event_type);
    }
    body
}

fn of_message(pushed: &Value) -> String {
    format!(
        "/api/v1/traces/{}/{}",
        pushed["partition_id"].as_str().unwrap(),
        pushed["transaction_id"].as_str().unwrap()
    )
}

/// The `data` of each listed event, in the order listed.
fn data_of(answer: &Answer) -> Vec<Value> {
    answer.body["traces"].as_array().expect("traces").iter().map(|t| t["data"].clone()).collect()
}

fn assert_refused(answer: &Answer, status: StatusCode, mentions: &str) {
    assert_eq!(answer.status, status, "{answer:?}");
    let error = answer.body["error"].as_str().unwrap_or_else(|| panic!("no JSON error in {answer:?}"));
    assert!(error.contains(mentions), "the error {error:?} does not mention {mentions:?}");
}

async fn stored_events(app: &TestApp) -> (i64, i64) {
    (
        app.count("SELECT count(*) FROM queen.message_traces").await,
        app.count("SELECT count(*) FROM queen.message_trace_names").await,
    )
}

#[actix_web::test]
async fn events_are_read_back_by_message_oldest_first_and_by_name_newest_first() {
    let app = TestApp::spawn().await;
    let order = app.push_one("orders", "eu", "order-1", json!({"n": 1})).await;
    let other = app.push_one("billing", "Default", "invoice-9", json!({"n": 2})).await;

    let first = trace(&app, on(&order, json!(["tenant-acme", "order-1"]), None, json!({"step": "received"}))).await;
    assert_eq!(first["success"], true);
    assert_eq!(first["offset"], 1);
    // The same name twice is one name; an event without names is the message's only.
    trace(&app, on(&order, json!(["order-1", "order-1"]), Some("step"), json!({"step": "charged"}))).await;
    trace(&app, on(&order, Value::Null, Some("error"), json!({"step": "unnamed"}))).await;
    let mut grouped = on(&other, json!(["tenant-acme"]), None, json!({"step": "invoiced"}));
    grouped["consumerGroup"] = json!("billing-workers");
    trace(&app, grouped).await;

    let by_message = app.get(&of_message(&order)).await;
    assert_eq!(by_message.status, StatusCode::OK, "{by_message:?}");
    assert_eq!(
        data_of(&by_message),
        vec![json!({"step": "received"}), json!({"step": "charged"}), json!({"step": "unnamed"})]
    );
    assert_eq!(by_message.body["total"], 3);
    let event = &by_message.body["traces"][0];
    assert_eq!(event["queue"], "orders");
    assert_eq!(event["partition"], "eu");
    assert_eq!(event["partitionId"], order["partition_id"]);
    assert_eq!(event["transactionId"], "order-1");
    assert_eq!(event["messageId"], order["message_id"]);
    assert_eq!(event["offset"], 1);
    assert_eq!(event["consumerGroup"], "__QUEUE_MODE__");
    assert_eq!(event["eventType"], "info", "the default event type");
    assert_eq!(event["traceNames"], json!(["tenant-acme", "order-1"]));
    assert!(event["createdAt"].as_str().is_some_and(|t| t.ends_with('Z')), "{event}");
    assert_eq!(by_message.body["traces"][1]["traceNames"], json!(["order-1"]));
    assert_eq!(by_message.body["traces"][1]["eventType"], "step");
    assert_eq!(by_message.body["traces"][2]["traceNames"], json!([]));
    // Paged: the second of three.
    let second = app.get(&format!("{}?limit=1&offset=1", of_message(&order))).await;
    assert_eq!(data_of(&second), vec![json!({"step": "charged"})]);
    assert_eq!((second.body["total"].clone(), second.body["limit"].clone()), (json!(3), json!(1)));

    // A name across queues, newest first.
    let tenant = app.get("/api/v1/traces/by-name/tenant-acme").await;
    assert_eq!(data_of(&tenant), vec![json!({"step": "invoiced"}), json!({"step": "received"})]);
    assert_eq!(tenant.body["total"], 2);
    assert_eq!(tenant.body["traces"][0]["queue"], "billing");
    assert_eq!(tenant.body["traces"][0]["consumerGroup"], "billing-workers");
    let page = app.get("/api/v1/traces/by-name/tenant-acme?limit=1&offset=1").await;
    assert_eq!(data_of(&page), vec![json!({"step": "received"})]);
    assert_eq!(page.body["total"], 2);
    let past_the_end = app.get("/api/v1/traces/by-name/tenant-acme?limit=1&offset=5").await;
    assert_eq!((data_of(&past_the_end).len(), past_the_end.body["total"].clone()), (0, json!(2)));
    let future = app.get("/api/v1/traces/by-name/tenant-acme?from=2999-01-01T00:00:00Z").await;
    assert_eq!((data_of(&future).len(), future.body["total"].clone()), (0, json!(0)));
    let unused = app.get("/api/v1/traces/by-name/nobody").await;
    assert_eq!((unused.status, unused.body["total"].clone()), (StatusCode::OK, json!(0)));

    // The names in use, in name order, with their counts.
    let names = app.get("/api/v1/traces/names").await;
    let listed: Vec<(Value, Value)> = names.body["names"]
        .as_array()
        .expect("names")
        .iter()
        .map(|n| (n["name"].clone(), n["events"].clone()))
        .collect();
    assert_eq!(listed, vec![(json!("order-1"), json!(2)), (json!("tenant-acme"), json!(2))]);
    assert!(names.body["names"][0]["lastEventAt"].as_str().is_some());
    let searched = app.get("/api/v1/traces/names?search=ACME").await;
    assert_eq!(searched.body["names"].as_array().map(Vec::len), Some(1));
    assert_eq!(searched.body["names"][0]["name"], "tenant-acme");
    let second_name = app.get("/api/v1/traces/names?limit=1&offset=1").await;
    assert_eq!(second_name.body["names"][0]["name"], "tenant-acme");
}

#[actix_web::test]
async fn names_with_slashes_and_percent_signs_are_read_by_name() {
    let app = TestApp::spawn().await;
    let pushed = app.push_one("paths", "p", "t/1", json!(1)).await;
    trace(&app, on(&pushed, json!(["a/b c", "100%"]), None, json!({}))).await;
    // As the official client sends it: percent-encoded, `/` kept.
    let slashed = app.get("/api/v1/traces/by-name/a/b%20c").await;
    assert_eq!(slashed.body["total"], 1, "{slashed:?}");
    let percent = app.get("/api/v1/traces/by-name/100%25").await;
    assert_eq!(percent.body["total"], 1, "{percent:?}");
    // A transaction id holding `/` reads back through the message route.
    let by_message = app.get(&of_message(&pushed)).await;
    assert_eq!(by_message.body["total"], 1, "{by_message:?}");
}

#[actix_web::test]
async fn bad_bodies_are_refused_naming_the_field_and_write_nothing() {
    let app = TestApp::spawn().await;
    let pushed = app.push_one("bad", "p", "t-1", json!(1)).await;
    let good = on(&pushed, json!(["x"]), None, json!({"k": 1}));
    let with = |key: &str, value: Value| {
        let mut body = good.clone();
        body[key] = value;
        body
    };
    let without = |key: &str| {
        let mut body = good.clone();
        body.as_object_mut().unwrap().remove(key);
        body
    };
    let cases: Vec<(Value, &str)> = vec![
        (without("transactionId"), "transactionId is required"),
        (with("transactionId", json!("")), "transactionId"),
        (with("transactionId", json!(7)), "transactionId must be a string"),
        (without("partitionId"), "partitionId is required"),
        (with("partitionId", json!("abc")), "partitionId"),
        (with("partitionId", json!(-1)), "partitionId"),
        (with("consumerGroup", json!("a/b")), "consumerGroup"),
        (with("consumerGroup", json!(5)), "consumerGroup must be a string"),
        (with("traceNames", json!("x")), "traceNames must be an array"),
        (with("traceNames", json!([""])), "traceNames[0] must not be empty"),
        (with("traceNames", json!(["ok", 3])), "traceNames[1] must be a string"),
        (with("traceNames", json!(["a\u{1}b"])), "traceNames[0] must not contain control characters"),
        (with("traceNames", json!(["n".repeat(256)])), "traceNames[0] is 256 bytes long"),
        (with("traceNames", json!((0..33).map(|i| format!("n{i}")).collect::<Vec<_>>())), "traceNames has 33 names"),
        (with("eventType", json!("")), "eventType must not be empty"),
        (with("eventType", json!(["info"])), "eventType must be a string"),
        (without("data"), "data is required"),
        (with("data", Value::Null), "data is required"),
        (with("data", json!([1])), "data must be a JSON object"),
        (with("data", json!("text")), "data must be a JSON object"),
        (with("data", json!({"blob": "x".repeat(64 * 1024)})), "data is 65547 bytes"),
        // Read back three levels down: past 127 in all, which JSON readers refuse.
        (with("data", json!({"deep": nested(124)})), "data nests arrays and objects more than 124 levels deep"),
    ];
    for (body, mentions) in cases {
        assert_refused(&app.post("/api/v1/traces", &body).await, StatusCode::BAD_REQUEST, mentions);
    }
    assert_refused(&app.post_raw("/api/v1/traces", "{\"data\": ").await, StatusCode::BAD_REQUEST, "not valid JSON");
    assert_refused(&app.post_raw("/api/v1/traces", "").await, StatusCode::BAD_REQUEST, "empty");
    let huge = format!("{{\"data\": {{\"blob\": \"{}\"}}}}", "x".repeat(300 * 1024));
    assert_refused(&app.post_raw("/api/v1/traces", huge).await, StatusCode::PAYLOAD_TOO_LARGE, "exceeds");
    assert_eq!(stored_events(&app).await, (0, 0), "nothing was written");
    // The good body is good, and 32 names are allowed.
    trace(&app, with("traceNames", json!((0..32).map(|i| format!("n{i}")).collect::<Vec<_>>()))).await;
    assert_eq!(stored_events(&app).await, (1, 32));
}

#[actix_web::test]
async fn query_parameters_a_read_does_not_take_are_refused() {
    let app = TestApp::spawn().await;
    let pushed = app.push_one("reads", "p", "t-1", json!(1)).await;
    let cases = [
        (format!("{}?limt=5", of_message(&pushed)), "limt"),
        (format!("{}?limit=0", of_message(&pushed)), "limit"),
        ("/api/v1/traces/by-name/x?limit=1001".to_owned(), "limit"),
        ("/api/v1/traces/by-name/x?from=yesterday".to_owned(), "from"),
        ("/api/v1/traces/by-name/x?queue=reads".to_owned(), "queue"),
        (format!("/api/v1/traces/by-name/{}", "n".repeat(256)), "256 bytes"),
        ("/api/v1/traces/names?offset=-1".to_owned(), "offset"),
        ("/api/v1/traces/names?search=%00".to_owned(), "search"),
        ("/api/v1/traces/abc/t-1".to_owned(), "partition id"),
    ];
    for (path, mentions) in cases {
        assert_refused(&app.get(&path).await, StatusCode::BAD_REQUEST, mentions);
    }
}

#[actix_web::test]
async fn an_event_on_a_message_the_partition_does_not_hold_is_a_404() {
    let app = TestApp::spawn().await;
    let pushed = app.push_one("known", "p", "t-1", json!(1)).await;
    let mut unknown = on(&pushed, json!(["x"]), None, json!({}));
    unknown["transactionId"] = json!("never-pushed");
    assert_refused(&app.post("/api/v1/traces", &unknown).await, StatusCode::NOT_FOUND, "never-pushed");
    let mut elsewhere = on(&pushed, json!(["x"]), None, json!({}));
    elsewhere["partitionId"] = json!("999999");
    assert_refused(&app.post("/api/v1/traces", &elsewhere).await, StatusCode::NOT_FOUND, "partition 999999");
    assert_eq!(stored_events(&app).await, (0, 0));
    let partition = pushed["partition_id"].as_str().unwrap();
    assert_refused(
        &app.get(&format!("/api/v1/traces/{partition}/never-pushed")).await,
        StatusCode::NOT_FOUND,
        "never-pushed",
    );
}

#[actix_web::test]
async fn retention_removes_the_events_of_the_messages_it_removes() {
    let app = TestApp::spawn_with(|config| config.maintenance.interval_ms = 100).await;
    app.configure("kept", json!({"retentionEnabled": true, "retentionSeconds": 600})).await;
    let old = app.push_one("kept", "p", "old", json!(1)).await;
    let new = app.push_one("kept", "p", "new", json!(2)).await;
    trace(&app, on(&old, json!(["shared", "old-only"]), None, json!({"of": "old"}))).await;
    trace(&app, on(&new, json!(["shared"]), None, json!({"of": "new"}))).await;

    age(&app, "kept", 2).await;
    until_count(&app, "SELECT count(*) FROM queen.message_traces", 1).await;
    assert_eq!(app.count("SELECT count(*) FROM queen.message_trace_names").await, 1, "the names went too");
    let shared = app.get("/api/v1/traces/by-name/shared").await;
    assert_eq!(data_of(&shared), vec![json!({"of": "new"})]);
    assert_eq!(app.get("/api/v1/traces/by-name/old-only").await.body["total"], 0);
    let names = app.get("/api/v1/traces/names").await;
    assert_eq!(names.body["names"].as_array().map(Vec::len), Some(1), "{names:?}");
    assert_eq!(app.get(&of_message(&old)).await.status, StatusCode::NOT_FOUND, "the message is gone");
    // And an event on a message retention removed is refused like any unknown message.
    let late = app.post("/api/v1/traces", &on(&old, Value::Null, None, json!({}))).await;
    assert_eq!(late.status, StatusCode::NOT_FOUND, "{late:?}");
    assert_eq!(data_of(&app.get(&of_message(&new)).await), vec![json!({"of": "new"})]);
}

#[actix_web::test]
async fn deleting_a_queue_removes_its_events() {
    let app = TestApp::spawn().await;
    let gone = app.push_one("doomed", "p", "t-1", json!(1)).await;
    let kept = app.push_one("spared", "p", "t-1", json!(1)).await;
    trace(&app, on(&gone, json!(["both"]), None, json!({"q": "doomed"}))).await;
    trace(&app, on(&kept, json!(["both"]), None, json!({"q": "spared"}))).await;

    assert_eq!(app.delete("/api/v1/resources/queues/doomed").await.status, StatusCode::OK);
    assert_eq!(stored_events(&app).await, (1, 1));
    assert_eq!(data_of(&app.get("/api/v1/traces/by-name/both").await), vec![json!({"q": "spared"})]);
}

#[actix_web::test]
async fn pushes_pops_and_acks_never_wait_for_the_trace_tables() {
    let app = TestApp::spawn().await;
    // Created (and the broker's statements prepared) before the tables are locked.
    let first = app.push_one("busy", "p", "t-0", json!(0)).await;
    trace(&app, on(&first, json!(["x"]), None, json!({}))).await;
    let mut locker = app.db.connect().await;
    let lock = locker.transaction().await.expect("a transaction");
    lock.batch_execute("LOCK TABLE queen.message_traces, queen.message_trace_names IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("the lock");

    let consume = async {
        app.push_one("busy", "p", "t-1", json!(1)).await;
        app.push_one("busy", "fresh", "t-2", json!(2)).await;
        let popped = app.pop("queue/busy", "batch=10&consumerGroup=g").await.messages();
        let acks = app.ack_all(&popped, "completed", Some("g")).await;
        assert!(acks.iter().all(|a| a["success"] == true), "{acks:?}");
        popped.len()
    };
    let popped = tokio::time::timeout(Duration::from_secs(10), consume).await.expect("nothing waited for the lock");
    assert!(popped >= 1);
    lock.rollback().await.expect("rollback");
}

#[actix_web::test]
async fn an_event_racing_the_deletion_of_its_queue_waits_for_it_and_finds_no_message() {
    let app = TestApp::spawn().await;
    let pushed = app.push_one("racing", "p", "t-1", json!(1)).await;
    let mut deleter = app.db.connect().await;
    let deletion = deleter.transaction().await.expect("a transaction");
    deletion.execute("DELETE FROM queen.queues WHERE name = 'racing'", &[]).await.expect("the deletion");

    let body = on(&pushed, json!(["late"]), None, json!({}));
    let event = app.post("/api/v1/traces", &body);
    let waiting = async {
        until_count(&app, &waiting_in(""), 1).await;
        deletion.commit().await.expect("commit");
    };
    let (answer, ()) = tokio::join!(event, waiting);
    assert_eq!(answer.status, StatusCode::NOT_FOUND, "{answer:?}");
    assert_eq!(stored_events(&app).await, (0, 0));
}

/// Arrays nested `levels` deep around a number.
fn nested(levels: usize) -> Value {
    serde_json::from_str(&format!("{}1{}", "[".repeat(levels), "]".repeat(levels))).expect("nested arrays")
}
