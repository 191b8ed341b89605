//! Key/value state (`POST /api/v1/kv`, the transaction `kv` rider): versions, expiry,
//! compare-and-set, increments with bounds, prefix pages, refusals, maintenance.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp, TokensFile};

/// One batch; insists on a 200 with one result per operation.
async fn batch(app: &TestApp, operations: Value) -> Vec<Value> {
    let count = operations.as_array().map_or(0, Vec::len);
    let answer = app.post("/api/v1/kv", &json!({ "operations": operations })).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let results = answer.body["results"].as_array().cloned().unwrap_or_else(|| panic!("results: {answer:?}"));
    assert_eq!(results.len(), count, "index-aligned: {answer:?}");
    results
}

async fn one(app: &TestApp, operation: Value) -> Value {
    batch(app, json!([operation])).await.remove(0)
}

fn put(key: &str, value: Value) -> Value {
    json!({"op": "put", "ns": "t", "key": key, "value": value, "forever": true})
}

fn get(key: &str) -> Value {
    json!({"op": "get", "ns": "t", "key": key})
}

async fn rows(app: &TestApp) -> i64 {
    app.count("SELECT count(*) FROM queen.kv").await
}

/// Polls `condition` every 50 ms until it holds, failing after `within`.
pub async fn until<F, Fut>(within: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !condition().await {
        assert!(Instant::now() < deadline, "{what} did not happen within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_web::test]
async fn a_batch_answers_every_operation_in_order_and_versions_count_writes() {
    let app = TestApp::spawn().await;
    let results = batch(
        &app,
        json!([
            put("a", json!({"n": 1})),
            {"op": "putIfAbsent", "ns": "t", "key": "b", "value": null, "ttlSeconds": 60},
            {"op": "incr", "ns": "t", "key": "c", "forever": true},
            {"op": "check", "ns": "t", "key": "d", "expect": 0},
            get("e"),
        ]),
    )
    .await;
    assert_eq!(results[0]["applied"], true);
    assert_eq!((results[0]["version"].clone(), results[0]["value"].clone()), (json!(1), json!({"n": 1})));
    assert_eq!(results[0]["expiresAt"], Value::Null, "forever");
    assert_eq!(results[1]["applied"], true);
    assert!(results[1]["expiresAt"].is_string(), "a lifetime: {results:?}");
    assert_eq!((results[2]["value"].clone(), results[2]["version"].clone()), (json!(1), json!(1)));
    assert_eq!((results[3]["applied"].clone(), results[3]["version"].clone()), (json!(true), json!(0)));
    assert_eq!(results[4], json!({"found": false, "key": "e"}));

    let results = batch(
        &app,
        json!([
            get("a"),
            get("b"),
            {"op": "put", "ns": "t", "key": "c", "value": "x", "forever": true, "expect": 1},
            {"op": "delete", "ns": "t", "key": "d"},
            {"op": "getMany", "ns": "t", "keys": ["e", "f"]},
        ]),
    )
    .await;
    assert_eq!((results[0]["found"].clone(), results[0]["value"].clone()), (json!(true), json!({"n": 1})));
    assert!(results[0]["updatedAt"].is_string());
    assert_eq!(
        (results[1]["found"].clone(), results[1]["value"].clone()),
        (json!(true), Value::Null),
        "null is a value"
    );
    assert_eq!((results[2]["applied"].clone(), results[2]["version"].clone()), (json!(true), json!(2)));
    assert_eq!((results[3]["applied"].clone(), results[3]["reason"].clone()), (json!(false), json!("absent")));
    assert_eq!(results[4], json!({"rows": [], "missing": ["e", "f"], "truncated": false}));

    // A loser learns the current value and version in the same answer.
    let lost = one(&app, json!({"op": "put", "ns": "t", "key": "c", "value": "y", "forever": true, "expect": 1})).await;
    assert_eq!(
        lost,
        json!({"applied": false, "key": "c", "value": "x", "version": 2, "expiresAt": null, "reason": "version"})
    );
    let lost = one(&app, json!({"op": "putIfAbsent", "ns": "t", "key": "a", "value": 2, "forever": true})).await;
    assert_eq!((lost["reason"].clone(), lost["version"].clone()), (json!("exists"), json!(1)));
    let lost = one(&app, json!({"op": "put", "ns": "t", "key": "zz", "value": 2, "forever": true, "expect": 3})).await;
    assert_eq!((lost["reason"].clone(), lost["version"].clone()), (json!("absent"), json!(0)), "never created: {lost}");
    assert_eq!(one(&app, get("zz")).await["found"], false);

    // Deleted and written again, a key goes on from its last version.
    let deleted = one(&app, json!({"op": "delete", "ns": "t", "key": "c", "expect": 2})).await;
    assert_eq!((deleted["applied"].clone(), deleted["version"].clone()), (json!(true), json!(2)));
    assert_eq!(one(&app, get("c")).await["found"], false);
    let again = one(&app, json!({"op": "delete", "ns": "t", "key": "c"})).await;
    assert_eq!(again["reason"], "absent", "a delete of nothing is a verdict");
    assert_eq!(one(&app, put("c", json!(0))).await["version"], 3);
    // Namespaces are apart.
    let other = one(&app, json!({"op": "get", "ns": "u", "key": "a"})).await;
    assert_eq!(other["found"], false);
}

#[actix_web::test]
async fn bad_operations_are_refused_naming_the_field_and_write_nothing() {
    let app = TestApp::spawn().await;
    let ok = put("written-if-accepted", json!(1));
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            json!({"op": "put", "ns": "t", "key": "k", "value": 1}),
            "kv_expiry_not_specified",
            "operations[1].ttlSeconds",
        ),
        (
            json!({"op": "put", "ns": "t", "key": "k", "value": 1, "ttlSeconds": 5, "forever": true}),
            "kv_expiry_not_specified",
            "operations[1].ttlSeconds",
        ),
        (json!({"op": "incr", "ns": "t", "key": "k"}), "kv_expiry_not_specified", "operations[1].ttlSeconds"),
        (
            json!({"op": "put", "ns": "t", "key": "k", "value": 1, "ttlSeconds": 0}),
            "kv_invalid_field",
            "operations[1].ttlSeconds",
        ),
        (
            json!({"op": "put", "ns": "t", "key": "k", "value": 1, "forever": false}),
            "kv_invalid_field",
            "operations[1].forever",
        ),
        (json!({"op": "put", "ns": "t", "key": "k", "forever": true}), "kv_invalid_field", "operations[1].value"),
        (
            json!({"op": "put", "ns": "t", "key": "k", "value": 1, "forever": true, "expect": -1}),
            "kv_invalid_field",
            "operations[1].expect",
        ),
        (
            json!({"op": "put", "ns": "t", "key": "k", "value": 1, "forever": true, "expect": "1"}),
            "kv_invalid_field",
            "operations[1].expect",
        ),
        (
            json!({"op": "putIfAbsent", "ns": "t", "key": "k", "value": 1, "forever": true, "expect": 0}),
            "kv_unknown_field",
            "operations[1].expect",
        ),
        (
            json!({"op": "incr", "ns": "t", "key": "k", "forever": true, "expect": 1}),
            "kv_unknown_field",
            "operations[1].expect",
        ),
        (json!({"op": "get", "ns": "t", "key": "k", "tenant": "x"}), "kv_unknown_field", "operations[1].tenant"),
        (json!({"op": "getPrefix", "ns": "t", "prefix": ""}), "kv_prefix_required", "operations[1].prefix"),
        (json!({"op": "getPrefix", "ns": "t"}), "kv_prefix_required", "operations[1].prefix"),
        (json!({"op": "check", "ns": "t", "key": "k"}), "kv_expect_required", "operations[1].expect"),
        // A fence left empty is not an unconditional write (nor a check of nothing).
        (
            json!({"op": "put", "ns": "t", "key": "k", "value": 1, "forever": true, "expect": null}),
            "kv_invalid_field",
            "operations[1].expect",
        ),
        (json!({"op": "delete", "ns": "t", "key": "k", "expect": null}), "kv_invalid_field", "operations[1].expect"),
        (json!({"op": "check", "ns": "t", "key": "k", "expect": null}), "kv_invalid_field", "operations[1].expect"),
        (json!({"op": "delete", "ns": "t", "key": "k", "expect": 0}), "kv_invalid_field", "operations[1].expect"),
        (
            json!({"op": "incr", "ns": "t", "key": "k", "forever": true, "delta": 1.5}),
            "kv_invalid_field",
            "operations[1].delta",
        ),
        (
            json!({"op": "incr", "ns": "t", "key": "k", "forever": true, "min": 5, "max": 1}),
            "kv_invalid_field",
            "operations[1].min",
        ),
        (json!({"op": "nap", "ns": "t", "key": "k"}), "kv_unknown_op", "operations[1].op"),
        (json!({"ns": "t", "key": "k"}), "kv_invalid_field", "operations[1].op"),
        (json!({"op": "get", "key": "k"}), "kv_invalid_field", "operations[1].ns"),
        (json!({"op": "get", "ns": "t", "key": ""}), "kv_invalid_field", "operations[1].key"),
        (json!({"op": "get", "ns": "t", "key": "a\u{0}b"}), "kv_invalid_field", "operations[1].key"),
        (json!({"op": "get", "ns": "t", "key": "k".repeat(1025)}), "kv_invalid_field", "operations[1].key"),
        (json!({"op": "getMany", "ns": "t", "keys": []}), "kv_invalid_field", "operations[1].keys"),
        (json!({"op": "getMany", "ns": "t", "keys": ["a", 1]}), "kv_invalid_field", "operations[1].keys"),
        (json!({"op": "get", "ns": "t", "key": "written-if-accepted"}), "kv_duplicate_key", "operations[1]"),
        (
            json!({"op": "put", "ns": "queen-locks", "key": "k#0", "value": 1, "forever": true}),
            "kv_namespace_reserved",
            "operations[1].ns",
        ),
        (
            json!({"op": "put", "ns": "t", "key": "k", "value": "v".repeat(70_000), "forever": true}),
            "kv_value_too_large",
            "operations[1].value",
        ),
        // A getMany answer carries it five levels down: past 127 in all, which JSON readers refuse.
        (
            json!({"op": "put", "ns": "t", "key": "k", "value": nested(123), "forever": true}),
            "kv_value_too_deep",
            "operations[1].value",
        ),
    ];
    for (bad, code, field) in cases {
        let answer = app.post("/api/v1/kv", &json!({"operations": [ok, bad]})).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad}: {answer:?}");
        assert_eq!(
            (answer.body["error"].as_str(), answer.body["reason"].as_str()),
            (Some(code), Some(field)),
            "{bad}: {answer:?}"
        );
        assert_eq!(answer.body["code"], code);
        assert!(
            answer.body["detail"].as_str().is_some_and(|d| d.contains(field)),
            "the detail names {field}: {answer:?}"
        );
    }
    for body in [json!({}), json!({"operations": []}), json!({"operations": {"op": "get"}}), json!({"operations": [1]})]
    {
        let answer = app.post("/api/v1/kv", &body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}: {answer:?}");
        assert_eq!(answer.body["error"], "kv_invalid_body", "{body}: {answer:?}");
    }
    // Values PostgreSQL's jsonb cannot hold, and one it would write back a thousand times larger
    // (its numbers' exponents written out in digits).
    let written_out = format!("[{}]", ["1e-8000"; 10].join(","));
    let past_numeric = format!("0.{}1", "0".repeat(16_383));
    for value in [
        r#""a\u0000b""#,
        r#"{"k\u0000": 1}"#,
        r#""\ud800""#,
        "1e400",
        "1e-999999",
        &written_out,
        "1e-16384",
        &past_numeric,
    ] {
        let body =
            format!(r#"{{"operations": [{{"op": "put", "ns": "t", "key": "k", "forever": true, "value": {value}}}]}}"#);
        let answer = app.post_raw("/api/v1/kv", body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{value}: {answer:?}");
        assert_eq!(answer.body["reason"], "operations[0].value", "{value}: {answer:?}");
    }
    let too_many: Vec<Value> = (0..257).map(|i| get(&i.to_string())).collect();
    let answer = app.post("/api/v1/kv", &json!({ "operations": too_many })).await;
    assert_eq!(
        (answer.status, answer.body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("kv_too_many_operations"))
    );
    assert_eq!(rows(&app).await, 0, "nothing was written");
    // As many digits after the point as numeric holds is stored.
    let body = r#"{"operations": [{"op": "put", "ns": "t", "key": "k", "forever": true, "value": 1e-16383}]}"#;
    assert_eq!(app.post_raw("/api/v1/kv", body).await.status, StatusCode::OK);
    assert_eq!(rows(&app).await, 1);
}

#[actix_web::test]
async fn an_expired_key_is_invisible_at_once_and_counts_as_absent() {
    let app = TestApp::spawn().await;
    let results = batch(
        &app,
        json!([
            {"op": "put", "ns": "t", "key": "p:brief", "value": "soon gone", "ttlSeconds": 1},
            {"op": "incr", "ns": "t", "key": "p:counter", "delta": 5, "ttlSeconds": 1},
            put("p:stays", json!("here")),
        ]),
    )
    .await;
    let version = results[0]["version"].as_i64().expect("a version");
    let polled = &app;
    until(Duration::from_secs(5), "the key's expiry", move || async move {
        one(polled, get("p:brief")).await["found"] == false
    })
    .await;
    assert_eq!(rows(&app).await, 3, "still stored: maintenance has not run, the reads filter");

    let many = one(&app, json!({"op": "getMany", "ns": "t", "keys": ["p:brief", "p:stays"]})).await;
    assert_eq!(many["missing"], json!(["p:brief"]));
    let page = one(&app, json!({"op": "getPrefix", "ns": "t", "prefix": "p:"})).await;
    let listed: Vec<&str> = page["rows"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(listed, ["p:stays"]);
    let check = one(&app, json!({"op": "check", "ns": "t", "key": "p:brief", "expect": version})).await;
    assert_eq!(check["reason"], "absent");

    // Writes see it as absent: must-not-exist holds, a fenced write does not, a counter restarts.
    let expect_old =
        one(&app, json!({"op": "put", "ns": "t", "key": "p:brief", "value": 1, "forever": true, "expect": version}))
            .await;
    assert_eq!(expect_old["reason"], "absent");
    let revived =
        one(&app, json!({"op": "putIfAbsent", "ns": "t", "key": "p:brief", "value": "again", "forever": true})).await;
    assert_eq!((revived["applied"].clone(), revived["version"].clone()), (json!(true), json!(version + 1)));
    let counter = one(&app, json!({"op": "incr", "ns": "t", "key": "p:counter", "delta": 2, "forever": true})).await;
    assert_eq!(
        (counter["value"].clone(), counter["expiresAt"].clone()),
        (json!(2), Value::Null),
        "from 0, new lifetime"
    );
}

#[actix_web::test]
async fn increments_are_bounded_typed_and_keep_their_window() {
    let app = TestApp::spawn().await;
    let incr = |delta: i64, bounds: Value, ttl: i64| {
        let mut op = json!({"op": "incr", "ns": "t", "key": "quota", "delta": delta, "ttlSeconds": ttl});
        for (k, v) in bounds.as_object().unwrap() {
            op[k] = v.clone();
        }
        op
    };
    let first = one(&app, incr(3, json!({"max": 5}), 3600)).await;
    assert_eq!(
        (first["applied"].clone(), first["value"].clone(), first["version"].clone()),
        (json!(true), json!(3), json!(1))
    );
    let window = first["expiresAt"].clone();
    let second = one(&app, incr(2, json!({"max": 5}), 60)).await;
    assert_eq!(second["value"], 5);
    assert_eq!(second["expiresAt"], window, "a live counter keeps its expiry");
    let refused = one(&app, incr(1, json!({"max": 5}), 60)).await;
    assert_eq!(
        (refused["applied"].clone(), refused["reason"].clone(), refused["value"].clone(), refused["version"].clone()),
        (json!(false), json!("limit"), json!(5), json!(2)),
        "refused, not saturated"
    );
    assert_eq!(one(&app, incr(-6, json!({"min": 0}), 60)).await["reason"], "limit");
    let down = one(&app, incr(-5, json!({"min": 0}), 60)).await;
    assert_eq!(down["value"], 0);
    let default_delta = one(&app, json!({"op": "incr", "ns": "t", "key": "quota", "forever": true})).await;
    assert_eq!(default_delta["value"], 1, "delta defaults to 1");
    // A bound crossed by the very first increment refuses it too, and creates nothing.
    let fresh =
        one(&app, json!({"op": "incr", "ns": "t", "key": "fresh", "delta": 10, "max": 5, "forever": true})).await;
    assert_eq!((fresh["reason"].clone(), fresh["version"].clone()), (json!("limit"), json!(0)));
    assert_eq!(one(&app, json!({"op": "get", "ns": "t", "key": "fresh"})).await["found"], false);

    one(&app, put("name", json!("ada"))).await;
    let typed = one(&app, json!({"op": "incr", "ns": "t", "key": "name", "forever": true})).await;
    assert_eq!((typed["reason"].clone(), typed["value"].clone()), (json!("type"), json!("ada")));
    one(&app, put("big", json!(i64::MAX))).await;
    assert_eq!(one(&app, json!({"op": "incr", "ns": "t", "key": "big", "forever": true})).await["reason"], "limit");
}

#[actix_web::test]
async fn prefix_reads_page_by_key_and_clamp_their_limit() {
    let app = TestApp::spawn().await;
    let mut writes: Vec<Value> = (0..25).map(|i| put(&format!("p:{i:02}"), json!(i))).collect();
    // Neighbours that must not be listed, and keys whose characters LIKE would treat as patterns.
    writes.extend([put("p;", json!(0)), put("o:1", json!(0)), put("q%_1", json!(1)), put("qx1", json!(2))]);
    batch(&app, json!(writes)).await;

    let mut listed = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut op = json!({"op": "getPrefix", "ns": "t", "prefix": "p:", "limit": 10});
        if let Some(after) = &after {
            op["after"] = json!(after);
        }
        let page = one(&app, op).await;
        pages += 1;
        for row in page["rows"].as_array().unwrap() {
            listed.push(row["key"].as_str().unwrap().to_owned());
            assert!(row["value"].is_number() && row["version"] == 1 && row["updatedAt"].is_string(), "{row}");
        }
        if page["truncated"] != true {
            assert_eq!(page["nextAfter"], Value::Null);
            break;
        }
        after = page["nextAfter"].as_str().map(str::to_owned);
        assert_eq!(after.as_deref(), listed.last().map(String::as_str), "the cursor is the last key of the page");
    }
    let expected: Vec<String> = (0..25).map(|i| format!("p:{i:02}")).collect();
    assert_eq!((listed, pages), (expected, 3));

    let literal = one(&app, json!({"op": "getPrefix", "ns": "t", "prefix": "q%_"})).await;
    assert_eq!(literal["rows"].as_array().map(Vec::len), Some(1), "% and _ are characters: {literal}");
    let keys_only =
        one(&app, json!({"op": "getPrefix", "ns": "t", "prefix": "p:", "keysOnly": true, "limit": 0})).await;
    assert_eq!(keys_only["rows"].as_array().map(Vec::len), Some(1), "a limit below 1 is clamped to 1");
    assert!(keys_only["rows"][0].get("value").is_none(), "keys only: {keys_only}");
    let clamped = one(&app, json!({"op": "getPrefix", "ns": "t", "prefix": "p", "limit": 1_000_000})).await;
    assert_eq!((clamped["rows"].as_array().map(Vec::len), clamped["truncated"].clone()), (Some(26), json!(false)));
}

#[actix_web::test]
async fn a_lost_required_precondition_aborts_the_whole_batch() {
    let app = TestApp::spawn().await;
    one(&app, put("marker", json!("first"))).await;
    let answer = app
        .post(
            "/api/v1/kv",
            &json!({"operations": [
                put("side-effect", json!(1)),
                {"op": "putIfAbsent", "ns": "t", "key": "marker", "value": "second", "forever": true, "required": true},
                {"op": "incr", "ns": "t", "key": "counter", "forever": true},
            ]}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "nothing applied, no results to align: {answer:?}");
    assert_eq!(
        answer.body,
        json!({"ok": false, "success": false, "error": "kv_precondition", "code": "kv_precondition",
               "reason": "kv_precondition", "failedIndex": 1, "kvReason": "exists", "key": "marker",
               "value": "first", "version": 1})
    );
    let after = batch(&app, json!([get("side-effect"), get("counter")])).await;
    assert_eq!((after[0]["found"].clone(), after[1]["found"].clone()), (json!(false), json!(false)), "nothing applied");
    // Not required: the same loss is a verdict and the rest applies.
    let results = batch(
        &app,
        json!([put("side-effect", json!(1)), {"op": "putIfAbsent", "ns": "t", "key": "marker", "value": 2, "forever": true}]),
    )
    .await;
    assert_eq!((results[0]["applied"].clone(), results[1]["applied"].clone()), (json!(true), json!(false)));
}

/// Read-then-CAS increments of one counter from many tasks: every applied CAS takes the next
/// version, none is lost, none applies twice.
#[actix_web::test]
async fn concurrent_compare_and_set_on_one_broker_applies_each_version_once() {
    let app = Arc::new(TestApp::spawn().await);
    let created = one(&app, put("counter", json!(0))).await;
    let start = created["version"].as_i64().unwrap();
    const WRITERS: usize = 8;
    const INCREMENTS: usize = 200;
    let applied = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (app, applied) = (Arc::clone(&app), Arc::clone(&applied));
            tokio::spawn(async move {
                loop {
                    if applied.lock().unwrap().len() >= INCREMENTS {
                        return;
                    }
                    let seen = one(&app, get("counter")).await;
                    let (value, version) = (seen["value"].as_i64().unwrap(), seen["version"].as_i64().unwrap());
                    let cas = json!({"op": "put", "ns": "t", "key": "counter", "value": value + 1, "forever": true, "expect": version});
                    let result = one(&app, cas).await;
                    if result["applied"] == true {
                        // Writers that were mid-call when the goal was reached may pass it: the
                        // checks below count every applied CAS.
                        applied.lock().unwrap().push((result["version"].as_i64().unwrap(), value + 1));
                    } else {
                        assert_eq!(result["reason"], "version", "{result}");
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a writer");
    }
    let applied = applied.lock().unwrap().clone();
    let total = applied.len() as i64;
    let versions: BTreeSet<i64> = applied.iter().map(|(version, _)| *version).collect();
    assert_eq!(versions.len(), applied.len(), "no version applied twice");
    assert_eq!(versions, (start + 1..=start + total).collect(), "no gap");
    assert!(applied.iter().all(|(version, value)| *version - start == *value), "each CAS wrote the next count");
    let last = one(&app, get("counter")).await;
    assert_eq!((last["value"].clone(), last["version"].clone()), (json!(total), json!(start + total)));
}

#[actix_web::test]
async fn of_writers_creating_one_absent_key_at_once_exactly_one_wins() {
    let app = Arc::new(TestApp::spawn().await);
    for round in 0..5 {
        let key = format!("race-{round}");
        let attempts: Vec<_> = (0..16)
            .map(|writer| {
                let (app, key) = (Arc::clone(&app), key.clone());
                tokio::spawn(async move {
                    let op = json!({"op": "putIfAbsent", "ns": "t", "key": key, "value": writer, "ttlSeconds": 60});
                    one(&app, op).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for attempt in attempts {
            let result = attempt.await.expect("a writer");
            if result["applied"] == true {
                winners.push(result["value"].clone());
            } else {
                assert_eq!(
                    (result["reason"].clone(), result["version"].clone()),
                    (json!("exists"), json!(1)),
                    "{result}"
                );
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        assert_eq!(one(&app, get(&key)).await["value"], winners[0]);
    }
}

#[actix_web::test]
async fn maintenance_removes_dead_rows_in_batches_and_versions_never_repeat() {
    let app = TestApp::spawn_with(|config| config.maintenance.interval_ms = 100).await;
    one(&app, put("k", json!(1))).await;
    one(&app, put("k", json!(2))).await;
    assert_eq!(one(&app, json!({"op": "delete", "ns": "t", "key": "k"})).await["version"], 2);
    one(&app, json!({"op": "put", "ns": "t", "key": "brief", "value": 1, "ttlSeconds": 1})).await;
    one(&app, put("forever", json!(1))).await;
    // Dead rows beyond one statement's batch.
    let db = app.db.connect().await;
    db.execute(
        "INSERT INTO queen.kv (ns, key, value, version, expires_at, created_at, updated_at)
         SELECT 'old', 'k' || n, '1', 7, now() - interval '1 minute', now(), now() FROM generate_series(1, 2500) n",
        &[],
    )
    .await
    .expect("dead rows");
    let polled = &app;
    until(Duration::from_secs(20), "the removal of every dead row", move || async move {
        polled.count("SELECT count(*) FROM queen.kv").await == 1
    })
    .await;
    // The deleted key, the expired one and the 2,500, counted once the pass that removed the last
    // of them has reported.
    until(Duration::from_secs(5), "the pruned rows counted", move || async move {
        polled.metric("queen_kv_rows_pruned_total").await == 2502.0
    })
    .await;
    assert_eq!(one(&app, get("forever")).await["found"], true, "a live key stays");
    // The namespace's floor is the highest version removed there (other keys' included).
    let again = one(&app, put("k", json!(3))).await["version"].as_i64().unwrap();
    assert!(again > 2, "version {again} is above the ones removed with the row");
    let old = one(&app, json!({"op": "put", "ns": "old", "key": "k1", "value": 1, "forever": true})).await;
    assert_eq!(old["version"], 8);
    let fresh = one(&app, json!({"op": "put", "ns": "fresh", "key": "k1", "value": 1, "forever": true})).await;
    assert_eq!(fresh["version"], 1, "floors are per namespace");
}

fn push_op(queue: &str, transaction_id: &str) -> Value {
    json!({"type": "push", "items": [{"queue": queue, "transactionId": transaction_id, "payload": {"id": transaction_id}}]})
}

async fn transaction(app: &TestApp, body: Value) -> Answer {
    app.post("/api/v1/transaction", &body).await
}

#[actix_web::test]
async fn a_transaction_applies_its_kv_rider_with_its_acks_and_pushes_or_nothing() {
    let app = TestApp::spawn().await;
    app.push_one("in", "p", "m1", json!(1)).await;
    let message = app.pop("queue/in", "batch=1").await.messages().remove(0);
    let ack = json!({"type": "ack", "transactionId": message["transactionId"], "partitionId": message["partitionId"],
                     "status": "completed", "leaseId": message["leaseId"]});

    // A marker the bundle requires to be absent, which is not: nothing of the bundle happens.
    one(&app, put("done:m1", json!("earlier"))).await;
    let answer = transaction(
        &app,
        json!({"operations": [ack.clone(), push_op("out", "o1")], "requiredLeases": [message["leaseId"]],
               "kv": [{"op": "incr", "ns": "t", "key": "seen", "forever": true},
                      {"op": "putIfAbsent", "ns": "t", "key": "done:m1", "value": "now", "forever": true, "required": true}]}),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["success"], false);
    assert_eq!(answer.body["reason"], "kv_precondition");
    assert_eq!(answer.body["failedIndex"], 3, "after the ack and the pushed item");
    assert_eq!((answer.body["kvReason"].clone(), answer.body["value"].clone()), (json!("exists"), json!("earlier")));
    assert_eq!(answer.body["version"], 1);
    assert!(answer.body["transactionId"].is_string());
    assert_eq!(app.pop("queue/out", "batch=1").await.status, StatusCode::NO_CONTENT, "the push did not happen");
    assert_eq!(one(&app, get("seen")).await["found"], false, "the rider's other write did not happen");

    // Without the marker it all commits together, the rider's results after the others'.
    one(&app, json!({"op": "delete", "ns": "t", "key": "done:m1"})).await;
    let answer = transaction(
        &app,
        json!({"operations": [ack, push_op("out", "o1")], "requiredLeases": [message["leaseId"]],
               "kv": [{"op": "incr", "ns": "t", "key": "seen", "forever": true},
                      {"op": "putIfAbsent", "ns": "t", "key": "done:m1", "value": "now", "forever": true, "required": true},
                      {"op": "getMany", "ns": "t", "keys": ["nothing"]}]}),
    )
    .await;
    assert_eq!(answer.body["success"], true, "{answer:?}");
    let results = answer.body["results"].as_array().expect("results");
    assert_eq!(results.len(), 5, "{results:?}");
    assert_eq!(results[1]["status"], "queued");
    assert_eq!((results[2]["applied"].clone(), results[2]["value"].clone()), (json!(true), json!(1)));
    assert_eq!((results[3]["applied"].clone(), results[3]["version"].clone()), (json!(true), json!(2)));
    assert_eq!(results[4]["missing"], json!(["nothing"]));
    assert_eq!(app.pop("queue/out", "batch=1").await.messages().len(), 1);
    assert_eq!(app.pop("queue/in", "batch=1").await.status, StatusCode::NO_CONTENT, "acknowledged");

    // Key/value operations alone make a bundle; a prefix read does not ride in one.
    let alone = transaction(&app, json!({"operations": [], "kv": [put("solo", json!(true))]})).await;
    assert_eq!(
        (alone.body["success"].clone(), alone.body["results"][0]["applied"].clone()),
        (json!(true), json!(true))
    );
    let refused =
        transaction(&app, json!({"operations": [], "kv": [{"op": "getPrefix", "ns": "t", "prefix": "d"}]})).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    assert!(refused.body["error"].as_str().unwrap().starts_with("kv[0].op"), "{refused:?}");
    let refused =
        transaction(&app, json!({"operations": [push_op("out", "o2")], "kv": [{"op": "put", "ns": "t", "key": "x"}]}))
            .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    assert!(refused.body["error"].as_str().unwrap().contains("kv[0].value"), "{refused:?}");
    assert_eq!(app.pop("queue/out", "batch=1").await.status, StatusCode::NO_CONTENT, "a refused bundle pushed nothing");
}

/// Key/value state belongs to no queue: a token confined to queue prefixes may not reach it, by
/// any route.
#[actix_web::test]
async fn a_token_confined_to_queues_cannot_reach_key_value_state() {
    const CONFINED: &str = "confined-token-0123456789abcdef";
    const FLEET: &str = "fleet-token-0123456789abcdef";
    let tokens = TokensFile::new(&format!(
        "[[token]]\nname = \"orders\"\ntoken = \"{CONFINED}\"\nrole = \"read-write\"\nqueues = [\"orders.\"]\n\
         [[token]]\nname = \"fleet\"\ntoken = \"{FLEET}\"\nrole = \"read-write\"\n"
    ));
    let file = tokens.path();
    let app = TestApp::spawn_with(move |config| config.auth.tokens_file = Some(file)).await;
    let send = |token: &'static str, path: &'static str, body: Value| {
        let request = app.http.post(app.url(path)).bearer_auth(token).json(&body);
        async move { request.send().await.expect("a call").status() }
    };
    let kv = json!({"operations": [put("k", json!(1))]});
    let lock = json!({"operations": [{"op": "acquire", "name": "l", "ttlSeconds": 5}]});
    let bundle = json!({"operations": [push_op("orders.eu", "t1")], "kv": [put("k", json!(1))]});
    assert_eq!(send(CONFINED, "/api/v1/kv", kv.clone()).await, StatusCode::FORBIDDEN);
    assert_eq!(send(CONFINED, "/api/v1/locks", lock.clone()).await, StatusCode::FORBIDDEN);
    assert_eq!(
        send(CONFINED, "/api/v1/transaction", bundle.clone()).await,
        StatusCode::FORBIDDEN,
        "not through a rider"
    );
    assert_eq!(rows(&app).await, 0);
    assert_eq!(send(FLEET, "/api/v1/kv", kv).await, StatusCode::OK);
    assert_eq!(send(FLEET, "/api/v1/locks", lock).await, StatusCode::OK);
    assert_eq!(send(FLEET, "/api/v1/transaction", bundle).await, StatusCode::OK);
}

/// Arrays nested `levels` deep around a number.
fn nested(levels: usize) -> Value {
    serde_json::from_str(&format!("{}1{}", "[".repeat(levels), "]".repeat(levels))).expect("nested arrays")
}

/// Two batches, each checking that the key the other creates is absent: run one after the other
/// in either order, one of them fails, so run at once they may not both apply. The first is a
/// bundle held after its kv rider, on a capped queue's capacity lock, while the second runs.
#[actix_web::test]
async fn two_batches_each_checking_that_what_the_other_creates_is_absent_cannot_both_apply() {
    let app = TestApp::spawn().await;
    app.configure("capped-kv", json!({"maxSize": 100})).await;
    let queue_id = app.count("SELECT id FROM queen.queues WHERE name = 'capped-kv'").await;
    let holder = app.db.connect().await;
    let capacity =
        [&queen_store::queues::CAPACITY_LOCK_CLASS as &(dyn tokio_postgres::types::ToSql + Sync), &(queue_id as i32)];
    holder.execute("SELECT pg_advisory_lock($1, $2)", &capacity).await.expect("holding the capacity lock");
    let check_then_create = |checked: &str, created: &str| {
        json!([{"op": "check", "ns": "t", "key": checked, "expect": 0, "required": true},
               {"op": "putIfAbsent", "ns": "t", "key": created, "value": 1, "forever": true, "required": true}])
    };
    let push = json!({"type": "push", "items": [{"queue": "capped-kv", "transactionId": "x", "payload": 1}]});
    let held = transaction(&app, json!({"operations": [push], "kv": check_then_create("a", "b")}));
    let second = async {
        crate::retention::until_count(&app, &crate::retention::waiting_in("pg_advisory_xact_lock"), 1).await;
        let body = json!({"operations": check_then_create("b", "a")});
        let second = app.post("/api/v1/kv", &body);
        tokio::pin!(second);
        let waiting = crate::retention::waiting_in("");
        let second_waits = crate::retention::until_count(&app, &waiting, 2);
        let answer = tokio::select! {
            answer = &mut second => Some(answer),
            () = second_waits => None,
        };
        holder.execute("SELECT pg_advisory_unlock_all()", &[]).await.expect("unlock");
        match answer {
            Some(answer) => answer,
            None => second.await,
        }
    };
    let (held, second) = tokio::join!(held, second);
    assert_eq!(held.body["success"], true, "{held:?}");
    assert_eq!(second.status, StatusCode::CONFLICT, "the second saw the first's key: {second:?}");
    assert_eq!(one(&app, get("b")).await["found"], true);
    assert_eq!(one(&app, get("a")).await["found"], false);
}
