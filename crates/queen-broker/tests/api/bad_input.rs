//! Bad input: each class gets a 4xx JSON error naming the problem, and nothing is written.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp, row_versions};

fn assert_refused(answer: &Answer, status: StatusCode, mentions: &str) {
    assert_eq!(answer.status, status, "{answer:?}");
    let error = answer.body["error"].as_str().unwrap_or_else(|| panic!("no JSON error in {answer:?}"));
    assert!(error.contains(mentions), "the error {error:?} does not mention {mentions:?}");
}

async fn assert_nothing_written(app: &TestApp) {
    for table in ["queues", "partitions", "log_segments", "log_message_ids", "log_consumers"] {
        assert_eq!(app.count(&format!("SELECT count(*) FROM queen.{table}")).await, 0, "queen.{table} was written");
    }
}

#[actix_web::test]
async fn malformed_json_is_refused() {
    let app = TestApp::spawn().await;
    for path in ["/api/v1/push", "/api/v1/configure", "/api/v1/ack", "/api/v1/ack/batch"] {
        assert_refused(&app.post_raw(path, "{\"items\": [").await, StatusCode::BAD_REQUEST, "not valid JSON");
        assert_refused(&app.post_raw(path, "[1, 2]").await, StatusCode::BAD_REQUEST, "JSON object");
        assert_refused(&app.post_raw(path, "").await, StatusCode::BAD_REQUEST, "empty");
    }
    // Members in order, in an array, as serde's derived structs would take them: no object.
    let positional = [
        ("/api/v1/push", "[[]]", "JSON object"),
        ("/api/v1/push", r#"{"items": [["q", "p", 1]]}"#, "items[0]"),
        ("/api/v1/ack/batch", r#"[[{"transactionId": "t", "partitionId": "1"}], "g"]"#, "JSON object"),
        ("/api/v1/ack/batch", r#"{"acknowledgments": [["t", "1", "completed", null, null]]}"#, "acknowledgments[0]"),
    ];
    for (path, body, mentions) in positional {
        assert_refused(&app.post_raw(path, body).await, StatusCode::BAD_REQUEST, mentions);
    }
    assert_nothing_written(&app).await;
}

#[actix_web::test]
async fn missing_fields_are_refused() {
    let app = TestApp::spawn().await;
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/api/v1/push", json!({}), "items"),
        ("/api/v1/push", json!({"items": [{"queue": "q"}, {"payload": 1}]}), "items[1].queue"),
        ("/api/v1/configure", json!({"options": {}}), "queue"),
        ("/api/v1/ack", json!({"partitionId": "1"}), "transactionId"),
        ("/api/v1/ack", json!({"transactionId": "t"}), "partitionId"),
        ("/api/v1/ack/batch", json!({"consumerGroup": null}), "acknowledgments"),
        ("/api/v1/ack/batch", json!({"acknowledgments": [{"transactionId": "t"}]}), "acknowledgments[0].partitionId"),
    ];
    for (path, body, mentions) in cases {
        assert_refused(&app.post(path, &body).await, StatusCode::BAD_REQUEST, mentions);
    }
    assert_nothing_written(&app).await;
}

#[actix_web::test]
async fn empty_and_mistyped_fields_are_refused() {
    let app = TestApp::spawn().await;
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/api/v1/push", json!({"items": null}), "items is required"),
        ("/api/v1/push", json!({"items": [{"queue": ""}]}), "items[0].queue"),
        ("/api/v1/push", json!({"items": [{"queue": "q", "partition": ""}]}), "items[0].partition"),
        ("/api/v1/push", json!({"items": [{"queue": "q", "transactionId": ""}]}), "items[0].transactionId"),
        ("/api/v1/push", json!({"items": [{"queue": 5}]}), "items[0].queue must be a string"),
        ("/api/v1/push", json!({"items": [{"queue": "q", "traceId": "not-a-uuid"}]}), "items[0].traceId"),
        ("/api/v1/push", json!({"items": "all of them"}), "items must be an array"),
        ("/api/v1/configure", json!({"queue": "q", "options": {"leaseTime": -5}}), "options.leaseTime"),
        ("/api/v1/configure", json!({"queue": "q", "options": {"retryLimit": "3"}}), "options.retryLimit"),
        ("/api/v1/configure", json!({"queue": "q", "options": []}), "options"),
        ("/api/v1/configure", json!({"queue": "q.a.b", "namespace": ""}), "namespace must not be empty"),
        ("/api/v1/configure", json!({"queue": "q.a.b", "task": ""}), "task must not be empty"),
        ("/api/v1/ack/batch", json!({"acknowledgments": []}), "acknowledgments must not be empty"),
        ("/api/v1/ack", json!({"transactionId": "t", "partitionId": "abc"}), "partitionId"),
        ("/api/v1/ack", json!({"transactionId": "t", "partitionId": "1", "status": "maybe"}), "status"),
        ("/api/v1/ack", json!({"transactionId": "t", "partitionId": "1", "leaseId": "nope"}), "leaseId"),
    ];
    for (path, body, mentions) in cases {
        assert_refused(&app.post(path, &body).await, StatusCode::BAD_REQUEST, mentions);
    }
    // One bad item refuses the whole push: the good items before it are not written either.
    let mixed = json!({"items": [{"queue": "good", "payload": 1}, {"queue": "good", "partition": "a/b"}]});
    assert_refused(&app.post("/api/v1/push", &mixed).await, StatusCode::BAD_REQUEST, "items[1].partition");
    assert_nothing_written(&app).await;
}

#[actix_web::test]
async fn an_empty_push_is_answered_with_no_results_and_writes_nothing() {
    let app = TestApp::spawn().await;
    let answer = app.post("/api/v1/push", &json!({"items": []})).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    assert_eq!(answer.body, json!([]));
    assert_nothing_written(&app).await;
}

#[actix_web::test]
async fn names_past_the_limits_are_refused() {
    let app = TestApp::spawn().await;
    let long = "n".repeat(256);
    let push = |item: Value| json!({"items": [item]});
    assert_refused(
        &app.post("/api/v1/push", &push(json!({"queue": long}))).await,
        StatusCode::BAD_REQUEST,
        "at most 255",
    );
    let partition = push(json!({"queue": "q", "partition": long}));
    assert_refused(&app.post("/api/v1/push", &partition).await, StatusCode::BAD_REQUEST, "at most 255");
    let transaction = push(json!({"queue": "q", "transactionId": long}));
    assert_refused(&app.post("/api/v1/push", &transaction).await, StatusCode::BAD_REQUEST, "at most 255");
    let control = push(json!({"queue": "bad\u{7}name"}));
    assert_refused(&app.post("/api/v1/push", &control).await, StatusCode::BAD_REQUEST, "control characters");
    // What the official clients' raw URL paths would cut or change: a pop of `orders#eu` would
    // pop `orders`, and a read of message `x/../y` would read `y`.
    for (item, mentions) in [
        (json!({"queue": "orders#eu"}), "items[0].queue: the queue name must not contain '#'"),
        (json!({"queue": "q", "partition": "p?x"}), "items[0].partition: the partition name must not contain '?'"),
        (json!({"queue": "a%41"}), "must not contain \"%41\""),
        (json!({"queue": "q", "transactionId": "x/../y"}), "must not have '.' or '..' between its '/'s"),
    ] {
        assert_refused(&app.post("/api/v1/push", &push(item)).await, StatusCode::BAD_REQUEST, mentions);
    }
    let configured = app.post("/api/v1/configure", &json!({"queue": "orders#eu", "options": {}})).await;
    assert_refused(&configured, StatusCode::BAD_REQUEST, "must not contain '#'");
    let group = app.pop("queue/q", &format!("consumerGroup={long}")).await;
    assert_refused(&group, StatusCode::BAD_REQUEST, "consumerGroup");
    assert_refused(&app.pop(&format!("queue/{long}"), "batch=1").await, StatusCode::BAD_REQUEST, "queue");
    assert_nothing_written(&app).await;
}

#[actix_web::test]
async fn bad_pop_parameters_are_refused() {
    let app = TestApp::spawn().await;
    for (query, mentions) in [
        ("batch=0", "batch"),
        ("batch=abc", "batch"),
        ("batch=100000", "batch"),
        ("partitions=0", "partitions"),
        ("wait=maybe", "wait"),
        ("timeout=-1", "timeout"),
        ("timeout=99999999999", "timeout"),
        ("subscriptionMode=sometimes", "subscriptionMode"),
        ("consumerGroup=g&subscriptionMode=sometimes&subscriptionFrom=now", "subscriptionMode"),
        ("consumerGroup=g%00h", "NUL character"),
        ("subscriptionFrom=yesterday", "subscriptionFrom"),
        ("conflation=true", "consumerGroup"),
        ("consumerGroup=g&conflation=yes", "conflation"),
        ("consumerGroup=g&conflation=true&autoAck=true", "autoAck"),
        // The path of the lagging groups' list takes that name.
        ("consumerGroup=lagging", "reserved"),
    ] {
        let answer = app.pop("queue/q", query).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{query}");
        assert_refused(&answer, StatusCode::BAD_REQUEST, mentions);
    }
    assert_nothing_written(&app).await;
}

/// Escapes that do not decode to UTF-8 would be read as U+FFFD (`%FF` and `%FE` alike), and a
/// pop would register a group under a name its client never sent: they are refused.
#[actix_web::test]
async fn a_path_or_a_query_that_is_not_utf8_once_decoded_is_refused() {
    let app = TestApp::spawn().await;
    app.push_one("q", "p", "t", json!(1)).await;
    let not_text = [
        app.get("/api/v1/pop/queue/q?consumerGroup=%FF").await,
        app.delete("/api/v1/consumer-groups/%FE").await,
        app.post("/api/v1/consumer-groups/%C3/queues/q/seek", &json!({"toEnd": true})).await,
        app.get("/api/v1/pop/queue/q/partition/p%E9").await,
        // An escaped letter of `/api/` routes the same, and is checked the same.
        app.get("/%61pi/v1/pop/queue/q?consumerGroup=%FF").await,
    ];
    for answer in &not_text {
        assert_refused(answer, StatusCode::BAD_REQUEST, "not UTF-8");
    }
    assert_eq!(app.count("SELECT count(*) FROM queen.log_consumers").await, 0, "no group was registered");
}

/// A time range whose start comes after its end is refused, not answered with an empty page.
#[actix_web::test]
async fn a_from_after_to_and_an_unknown_metrics_format_are_refused() {
    let app = TestApp::spawn().await;
    for path in [
        "/api/v1/dlq?queue=q&from=2026-02-02T00:00:00Z&to=2026-02-01T00:00:00Z",
        "/api/v1/traces/by-name/n?from=2026-02-02T00:00:00Z&to=2026-02-01T00:00:00Z",
    ] {
        assert_refused(&app.get(path).await, StatusCode::BAD_REQUEST, "from must not be after to");
    }
    assert_refused(&app.get("/metrics?format=xml").await, StatusCode::BAD_REQUEST, "format");
    // Each refusal says what is wrong with the value, not something else.
    assert_refused(&app.get("/api/v1/dlq?limit=0").await, StatusCode::BAD_REQUEST, "from 1 (past 1000, read as 1000)");
    let far = app.get("/api/v1/dlq?from=-4800-01-01").await;
    assert_refused(&far, StatusCode::BAD_REQUEST, "outside what PostgreSQL holds");
    let huge = app.get("/api/v1/timers/q?limit=99999999999999999999").await;
    assert_eq!(huge.status, StatusCode::OK, "clamped, as any limit past the page's most: {huge:?}");
}

/// PostgreSQL's text cannot hold a NUL character: a name or filter holding one is refused before
/// it reaches a statement (which would fail with a 500).
#[actix_web::test]
async fn a_nul_character_in_a_path_or_a_query_is_refused() {
    let app = TestApp::spawn().await;
    for path in [
        "/api/v1/dlq?queue=a%00b",
        "/api/v1/resources/queues?namespace=%00",
        "/api/v1/status/queues?namespace=x%00",
        "/api/v1/resources/queues?search=a%00",
        "/api/v1/messages/1/t%00",
        "/api/v1/traces/by-name/n%00",
    ] {
        assert_refused(&app.get(path).await, StatusCode::BAD_REQUEST, "NUL character");
    }
    assert_nothing_written(&app).await;
}

#[actix_web::test]
async fn unknown_and_malformed_lease_ids_are_refused() {
    let app = TestApp::spawn().await;
    let unknown = app.post("/api/v1/lease/0192f0c4-0000-7000-8000-000000000000/extend", &json!({})).await;
    assert_refused(&unknown, StatusCode::NOT_FOUND, "not found");
    let malformed = app.post("/api/v1/lease/not-a-lease/extend", &json!({})).await;
    assert_refused(&malformed, StatusCode::BAD_REQUEST, "not a lease id");
    let seconds = app.post("/api/v1/lease/0192f0c4-0000-7000-8000-000000000000/extend", &json!({"seconds": 0})).await;
    assert_refused(&seconds, StatusCode::BAD_REQUEST, "seconds");
    assert_nothing_written(&app).await;
}

#[actix_web::test]
async fn bodies_over_the_configured_size_are_refused() {
    let app = TestApp::spawn_with(|config| config.http.max_body_bytes = 4096).await;
    let body = json!({"items": [{"queue": "big", "payload": "x".repeat(8192)}]});
    assert_refused(&app.post("/api/v1/push", &body).await, StatusCode::PAYLOAD_TOO_LARGE, "4096 bytes");
    assert_nothing_written(&app).await;
}

#[actix_web::test]
async fn unknown_routes_and_methods_get_json_errors() {
    let app = TestApp::spawn().await;
    assert_refused(&app.get("/api/v1/nothing-here").await, StatusCode::NOT_FOUND, "no route");
    let wrong_method = app.get("/api/v1/push").await;
    assert_refused(&wrong_method, StatusCode::METHOD_NOT_ALLOWED, "not allowed");
    assert_eq!(
        (&wrong_method.body["success"], &wrong_method.body["code"]),
        (&json!(false), &json!("method_not_allowed"))
    );
    assert!(wrong_method.body["requestId"].is_string(), "{wrong_method:?}");
    assert_refused(&app.get("/api/v1/resources/queues/absent").await, StatusCode::NOT_FOUND, "absent");
}

/// Message `t1` pushed to partition `p` of queue `q` and leased to group `g`: its partition id and
/// the lease.
async fn leased_to_group_g(app: &TestApp) -> (String, String) {
    let pushed = app.push_one("q", "p", "t1", json!(1)).await;
    let partition = pushed["partition_id"].as_str().expect("a partition id").to_owned();
    let popped = app.pop("queue/q", "consumerGroup=g&wait=false").await;
    let lease = popped.messages()[0]["leaseId"].as_str().unwrap_or_else(|| panic!("a lease in {popped:?}")).to_owned();
    (partition, lease)
}

#[actix_web::test]
async fn a_member_a_body_does_not_take_is_refused_by_name_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let (partition, lease) = leased_to_group_g(&app).await;
    let ack = json!({"transactionId": "t1", "partitionId": partition, "leaseId": lease});
    let with = |body: &Value, key: &str, value: Value| {
        let mut body = body.clone();
        body[key] = value;
        body
    };
    let push_item = json!({"queue": "q", "partition": "p", "payload": 2});
    let push_op = json!({"type": "push", "items": [push_item]});
    let ack_op = with(&ack, "type", json!("ack"));
    let cases: Vec<(String, Value, String)> = vec![
        ("/api/v1/push".into(), json!({"items": [push_item], "bufferMs": 100}), "bufferMs is not a member the broker reads here; the body takes items".into()),
        ("/api/v1/push".into(), json!({"items": [with(&push_item, "namespace", json!("n"))]}), "items[0].namespace is not a member the broker reads here; items[0] takes queue, partition, payload, transactionId, traceId".into()),
        ("/api/v1/push".into(), json!({"items": [with(&push_item, "producerSub", json!("someone"))]}), "items[0].producerSub is set by the broker, from the caller's token".into()),
        ("/api/v1/ack".into(), with(&ack, "leaseID", json!(lease)), "leaseID is not a member the broker reads here; the body takes transactionId, partitionId, status, error, leaseId, consumerGroup".into()),
        ("/api/v1/ack/batch".into(), json!({"acknowledgments": [ack], "group": "g"}), "group is not a member".into()),
        ("/api/v1/ack/batch".into(), json!({"acknowledgments": [with(&ack, "consumerGroup", json!("g"))], "consumerGroup": "g"}), "acknowledgments[0].consumerGroup is not a member the broker reads here; acknowledgments[0] takes transactionId, partitionId, status, error, leaseId".into()),
        ("/api/v1/transaction".into(), json!({"operations": [ack_op, push_op], "atomic": true}), "atomic is not a member the broker reads here; the body takes operations, requiredLeases, kv, timers".into()),
        ("/api/v1/transaction".into(), json!({"operations": [with(&ack_op, "group", json!("g")), push_op]}), "operations[0].group is not a member".into()),
        ("/api/v1/transaction".into(), json!({"operations": [ack_op, with(&push_op, "queue", json!("q"))]}), "operations[1].queue is not a member the broker reads here; operations[1] takes type, items".into()),
        ("/api/v1/transaction".into(), json!({"operations": [ack_op, {"type": "push", "items": [with(&push_item, "delay", json!(5))]}]}), "operations[1].items[0].delay is not a member".into()),
        (format!("/api/v1/lease/{lease}/extend"), json!({"seconds": 30, "minutes": 1}), "minutes is not a member the broker reads here; the body takes seconds".into()),
        ("/api/v1/configure".into(), json!({"queue": "q", "options": {"leaseTime": 5}, "partitions": 4}), "partitions is not a member".into()),
        ("/api/v1/traces".into(), json!({"transactionId": "t1", "partitionId": partition, "data": {}, "level": "x"}), "level is not a member".into()),
        ("/api/v1/consumer-groups/g/queues/q/seek".into(), json!({"toEnd": true, "partition": "p"}), "partition is not a member the broker reads here; the body takes toEnd, timestamp".into()),
        (format!("/api/v1/consumer-groups/g/queues/q/partitions/{partition}/seek"), json!({"toEnd": true, "offset": 0}), "offset is not a member".into()),
        ("/api/v1/consumer-groups/g/subscription".into(), json!({"subscriptionTimestamp": "2026-01-01T00:00:00Z", "mode": "all"}), "mode is not a member".into()),
        ("/api/v1/system/maintenance".into(), json!({"enabled": true, "reason": "upgrade"}), "reason is not a member".into()),
        ("/api/v1/timers".into(), json!({"operations": [{"op": "cancel", "queue": "q", "timerKey": "k"}], "dryRun": true}), "dryRun is not a member".into()),
        ("/api/v1/fetch".into(), json!({"entries": [{"queue": "q", "partition": "p", "offset": 0}], "timeout": 5}), "timeout is not a member".into()),
        ("/api/v1/fetch".into(), json!({"entries": [{"queue": "q", "partition": "p", "offset": 0, "count": 5}]}), "entries[0].count is not a member the broker reads here; entries[0] takes queue, partition, offset, maxBytes".into()),
        ("/api/v1/partitions/changed".into(), json!({"entries": [{"queue": "q"}], "since": "2026-01-01T00:00:00Z"}), "since is not a member the broker reads here; the body takes entries".into()),
        ("/api/v1/partitions/changed".into(), json!({"entries": [{"queue": "q", "partition": "p"}]}), "entries[0].partition is not a member".into()),
    ];
    let db = app.db.connect().await;
    let before = row_versions(&db).await;
    for (path, body, error) in cases {
        assert_refused(&app.post(&path, &body).await, StatusCode::BAD_REQUEST, &error);
    }
    // The key/value and lock routes answer in their own envelope: the code, the member, the detail.
    for (path, code) in [("/api/v1/kv", "kv_unknown_field"), ("/api/v1/locks", "lock_unknown_field")] {
        let body = json!({"operations": [{"op": "get", "ns": "n", "key": "k", "name": "k"}], "atomic": true});
        let answer = app.post(path, &body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        assert_eq!((&answer.body["code"], &answer.body["reason"]), (&json!(code), &json!("atomic")), "{answer:?}");
    }
    assert_eq!(row_versions(&db).await, before, "a refused body changed something");

    // The lease is still the group's and the message still unacknowledged: acked as the client
    // sends it, it completes.
    let acked = app.post("/api/v1/ack", &with(&ack, "consumerGroup", json!("g"))).await;
    assert_eq!(acked.body[0]["success"], true, "{acked:?}");
}

#[actix_web::test]
async fn a_member_given_twice_is_refused_by_name_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let (partition, lease) = leased_to_group_g(&app).await;
    let ack = format!(r#""transactionId": "t1", "partitionId": "{partition}", "leaseId": "{lease}""#);
    // A JSON object keeps the last of two members of one name; which one the client meant is a
    // guess (an ack whose second `leaseId` differed would be fenced by one of them).
    let cases = [
        (
            "/api/v1/push",
            r#"{"items": [{"queue": "q", "partition": "p", "payload": 1, "payload": 2}]}"#.to_owned(),
            "items[0].payload is given more than once",
        ),
        (
            "/api/v1/push",
            r#"{"items": [{"queue": "q", "payload": 1}], "items": []}"#.to_owned(),
            "items is given more than once",
        ),
        (
            "/api/v1/ack",
            format!(r#"{{{ack}, "consumerGroup": "g", "leaseId": "{lease}"}}"#),
            "leaseId is given more than once",
        ),
        (
            "/api/v1/ack/batch",
            format!(
                r#"{{"acknowledgments": [{{{ack}, "status": "completed", "status": "failed"}}], "consumerGroup": "g"}}"#
            ),
            "acknowledgments[0].status is given more than once",
        ),
        (
            "/api/v1/transaction",
            format!(r#"{{"operations": [{{"type": "ack", {ack}, "consumerGroup": "g", "type": "ack"}}]}}"#),
            "operations[0].type is given more than once",
        ),
        (
            "/api/v1/configure",
            r#"{"queue": "q", "options": {"leaseTime": 5, "leaseTime": 60}}"#.to_owned(),
            "options.leaseTime is given more than once",
        ),
    ];
    let db = app.db.connect().await;
    let before = row_versions(&db).await;
    for (path, body, error) in cases {
        assert_refused(&app.post_raw(path, body).await, StatusCode::BAD_REQUEST, error);
    }
    assert_eq!(row_versions(&db).await, before, "a refused body changed something");
    let acked = app.post_raw("/api/v1/ack", format!(r#"{{{ack}, "consumerGroup": "g"}}"#)).await;
    assert_eq!(acked.body[0]["success"], true, "the message was still leased and unacknowledged: {acked:?}");
}

#[actix_web::test]
async fn a_query_parameter_a_route_does_not_take_or_given_twice_is_refused_by_name_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let (partition, _) = leased_to_group_g(&app).await;
    let db = app.db.connect().await;
    let before = row_versions(&db).await;
    // A lowercase `consumergroup` would otherwise pop in queue mode, leasing the message there.
    for (path, unknown) in [
        ("/api/v1/pop/queue/q?consumergroup=g&wait=false", "consumergroup"),
        ("/api/v1/pop/queue/q/partition/p?batch=1&waitMs=10", "waitMs"),
        ("/api/v1/pop?namespace=n&batchSize=5", "batchSize"),
        ("/api/v1/dlq?queue=q&status=failed", "status"),
        ("/api/v1/messages?queue=q&status=pending", "status"),
        ("/api/v1/resources/queues?queue=q", "queue"),
        ("/api/v1/resources/partitions?namespace=n", "namespace"),
        ("/api/v1/status/queues?name=q", "name"),
        ("/api/v1/status/history?hours=2", "hours"),
        ("/api/v1/consumer-groups/lagging?minLag=5", "minLag"),
        ("/api/v1/timers/q?cursor=k", "cursor"),
    ] {
        let answer = app.get(path).await;
        assert_refused(
            &answer,
            StatusCode::BAD_REQUEST,
            &format!("unknown query parameter \"{unknown}\"; this route takes"),
        );
    }
    for path in
        ["/api/v1/consumer-groups/g?deleteMeta=false", "/api/v1/timers/q/k?tx=t", "/api/v1/resources/queues/q?force=1"]
    {
        assert_refused(&app.delete(path).await, StatusCode::BAD_REQUEST, "unknown query parameter");
    }
    // A parameter given twice: which value would act is a guess, so neither does.
    for (path, twice) in [
        ("/api/v1/pop/queue/q?consumerGroup=g&consumerGroup=h&wait=false", "consumerGroup"),
        ("/api/v1/pop/queue/q/partition/p?wait=false&batch=1&batch=5", "batch"),
        ("/api/v1/pop/queue/q?wait=false&frames=true&frames=false", "frames"),
    ] {
        let answer = app.get(path).await;
        assert_refused(
            &answer,
            StatusCode::BAD_REQUEST,
            &format!("query parameter \"{twice}\" is given more than once"),
        );
    }
    // Routes that read no query refuse one too.
    for path in ["/api/v1/status?from=2026-01-01", "/api/v1/resources/overview?x=1", "/api/v1/consumer-groups?queue=q"]
    {
        assert_refused(&app.get(path).await, StatusCode::BAD_REQUEST, "this route takes no query parameters");
    }
    let push = json!({"items": [{"queue": "q", "partition": "p", "payload": 2}]});
    assert_refused(&app.post("/api/v1/push?sync=true", &push).await, StatusCode::BAD_REQUEST, "\"sync\"");
    // A route that reads no body takes none, or `{}` (what the official JavaScript client sends).
    let retry = format!("/api/v1/messages/{partition}/t1/retry");
    assert_refused(
        &app.post(&retry, &json!({"queue": "q"})).await,
        StatusCode::BAD_REQUEST,
        "the body takes no members",
    );
    assert_refused(&app.post(&retry, &json!({})).await, StatusCode::NOT_FOUND, "no dead letter");
    assert_refused(
        &app.post("/api/v1/stats/refresh", &json!({"all": true})).await,
        StatusCode::BAD_REQUEST,
        "all is not",
    );
    assert_eq!(app.post("/api/v1/stats/refresh", &json!({})).await.status, StatusCode::OK);
    assert_eq!(row_versions(&db).await, before, "a refused query changed something");
    let again = app.pop("queue/q", "wait=false").await;
    assert_eq!(again.messages().len(), 1, "queue mode still has the message: {again:?}");
}

/// Arrays past their bound are refused by their count, before any element is read: a body of
/// tiny elements costs no map per element before its 400.
#[actix_web::test]
async fn arrays_past_their_bound_are_refused_by_count_and_write_nothing() {
    let app = TestApp::spawn().await;
    let tiny = |n: usize| vec![json!({}); n];
    for (path, body, named) in [
        ("/api/v1/push", json!({"items": tiny(10_001)}), "items holds 10001 messages"),
        ("/api/v1/ack/batch", json!({"acknowledgments": tiny(100_001)}), "acknowledgments holds 100001"),
        ("/api/v1/transaction", json!({"operations": tiny(10_001)}), "operations holds 10001 operations"),
    ] {
        let refused = app.post(path, &body).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{path}: {refused:?}");
        let error = refused.body["error"].as_str().unwrap_or_default();
        assert!(error.contains(named), "{path}: {error}");
    }
    assert_nothing_written(&app).await;
}

/// An ack batch past its bound (100,000 acknowledgements) is refused whichever way the broker
/// reads it: well-formed acks take a faster reader than the one that names each wrong member.
#[actix_web::test]
async fn an_ack_batch_past_its_bound_is_refused_however_it_is_read() {
    let app = TestApp::spawn().await;
    let ack = r#"{"transactionId":"t","partitionId":"1"}"#;
    let body = format!(r#"{{"acknowledgments":[{}]}}"#, vec![ack; 100_001].join(","));
    let answer = app.post_raw("/api/v1/ack/batch", body).await;
    assert_refused(&answer, StatusCode::BAD_REQUEST, "at most 100000");
}

/// A body with a `Content-Encoding` reaches no handler still encoded, to be refused as bad JSON
/// without a word about why: it is a 415 naming the encoding, and writes nothing.
#[actix_web::test]
async fn an_encoded_body_is_refused_naming_its_encoding() {
    let app = TestApp::spawn().await;
    let body = serde_json::to_vec(&json!({"items": [{"queue": "q", "payload": 1}]})).expect("JSON");
    let request = |encoding: &str| {
        app.http
            .post(app.url("/api/v1/push"))
            .header("content-type", "application/json")
            .header("content-encoding", encoding)
            .body(body.clone())
            .send()
    };
    let refused = request("gzip").await.expect("an answer");
    assert_eq!(refused.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let refused: Value = refused.json().await.expect("JSON");
    assert_eq!(refused["code"], "unsupported_media_type", "{refused}");
    assert!(refused["error"].as_str().is_some_and(|e| e.contains("\"gzip\"")), "{refused}");
    assert_nothing_written(&app).await;
    assert_eq!(request("identity").await.expect("an answer").status(), StatusCode::CREATED, "identity is as sent");
}
