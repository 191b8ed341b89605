//! What the dashboard stands on: its files served from the binary, the fleet's brokers, the
//! history of traffic and lag, and every group's cursor on a queue's partitions.

use std::future::Future;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header::{CONTENT_SECURITY_POLICY, CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp};

const DEADLINE: Duration = Duration::from_secs(20);

/// Asks `probe` until it gives a value, failing the test after [`DEADLINE`].
async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(Instant::now() < deadline, "gave up waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A broker that beats and samples every second.
async fn spawn() -> TestApp {
    TestApp::spawn_with(|config| config.stats.sample_interval_seconds = 1).await
}

#[actix_web::test]
async fn the_dashboard_is_served_from_the_binary_under_a_strict_content_policy() {
    let file = std::env::temp_dir().join(format!("queen-dashboard-{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, "[[token]]\nname = \"ops\"\ntoken = \"dashboard-token-0123456789\"\nrole = \"read-only\"\n")
        .expect("a tokens file");
    let app = TestApp::spawn_with(|config| config.auth.tokens_file = Some(file)).await;

    for path in ["/dashboard", "/dashboard/"] {
        let page = app.http.get(app.url(path)).send().await.expect("GET");
        assert_eq!(page.status(), StatusCode::OK, "{path} is public with auth on");
        assert_eq!(page.headers()[CONTENT_TYPE], "text/html; charset=utf-8");
        let policy = page.headers()[CONTENT_SECURITY_POLICY].to_str().expect("ASCII").to_owned();
        assert!(policy.contains("script-src 'self'") && !policy.contains("unsafe"), "{policy}");
        let html = page.text().await.expect("text");
        assert!(html.contains("/dashboard/app.js"), "{html}");
    }
    let script = app.http.get(app.url("/dashboard/app.js")).send().await.expect("GET");
    assert_eq!(script.headers()[CONTENT_TYPE], "text/javascript; charset=utf-8");
    let etag = script.headers()[ETAG].clone();
    let again = app.http.get(app.url("/dashboard/app.js")).header(IF_NONE_MATCH, etag).send().await.expect("GET");
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "an unchanged file is not sent again");

    let missing = app.get("/dashboard/nothing.js").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.body["code"], "not_found", "{missing:?}");
    // The data the page shows needs a token.
    assert_eq!(app.get("/api/v1/status/brokers").await.status, StatusCode::UNAUTHORIZED);
    let with_token = app
        .http
        .get(app.url("/api/v1/status/brokers"))
        .bearer_auth("dashboard-token-0123456789")
        .send()
        .await
        .expect("GET");
    assert_eq!(with_token.status(), StatusCode::OK);
}

fn brokers_in(answer: &Answer) -> Vec<Value> {
    answer.body["brokers"].as_array().cloned().unwrap_or_default()
}

#[actix_web::test]
async fn every_broker_of_the_database_is_listed_live_with_its_journal() {
    let app = spawn().await;
    let other = TestApp::spawn_on(&app.db, |config| config.stats.sample_interval_seconds = 1).await;
    let other_port = other.rsplit(':').next().expect("a port").to_owned();

    let answer = eventually("both brokers are listed", || async {
        let answer = app.get("/api/v1/status/brokers").await;
        (brokers_in(&answer).len() == 2).then_some(answer)
    })
    .await;
    assert_eq!(answer.body["heartbeatSeconds"], 1);
    assert_eq!(answer.body["maintenance"], json!({"push": false, "pop": false}));
    let brokers = brokers_in(&answer);
    for broker in &brokers {
        assert_eq!(broker["state"], "live", "{broker}");
        assert_eq!(broker["bufferedMessages"], 0);
        assert_eq!(broker["bufferHealthy"], true);
        assert_eq!(broker["version"], env!("CARGO_PKG_VERSION"));
    }
    let mine: Vec<&Value> = brokers.iter().filter(|b| b["self"] == true).collect();
    assert_eq!(mine.len(), 1, "exactly one broker is the one that answered: {brokers:?}");
    let app_port = app.base.rsplit(':').next().expect("a port");
    assert!(mine[0]["id"].as_str().expect("an id").contains(&format!(":{app_port}:")), "{mine:?}");
    assert!(brokers.iter().any(|b| b["id"].as_str().is_some_and(|id| id.contains(&format!(":{other_port}:")))));

    // The switches are the fleet's: turned on through one broker, the other's list says so.
    let on = app.post("/api/v1/system/maintenance/pop", &json!({"enabled": true})).await;
    assert_eq!(on.status, StatusCode::OK);
    let http = queen_testkit::http().build().expect("a client");
    eventually("the other broker reports pop maintenance", || async {
        let answer: Value = http.get(format!("{other}/api/v1/status/brokers")).send().await.ok()?.json().await.ok()?;
        (answer["maintenance"]["pop"] == true).then_some(())
    })
    .await;
}

/// The history's totals over every point, and its newest lag sample.
fn history_totals(history: &Value) -> (Value, Option<Value>) {
    let points = history["points"].as_array().cloned().unwrap_or_default();
    let sum = |field: &str| points.iter().map(|p| p[field].as_i64().unwrap_or(0)).sum::<i64>();
    let totals = json!({"pushed": sum("pushed"), "delivered": sum("delivered"), "acked": sum("acked"),
                        "failed": sum("failed"), "deadLettered": sum("deadLettered")});
    let lag = points.iter().rev().find(|p| !p["lagMessages"].is_null()).cloned();
    (totals, lag)
}

/// Five messages pushed to `queue` through `app`, three through the broker at `other`; group g
/// takes four through `app` and acknowledges three of them.
async fn traffic_through_both(app: &TestApp, other: &str, queue: &str) {
    let items = |from: usize, n: usize| -> Value {
        (from..from + n)
            .map(|i| json!({"queue": queue, "partition": "p", "transactionId": format!("t{i}"), "payload": i}))
            .collect()
    };
    app.push(items(0, 5)).await;
    let http = queen_testkit::http().build().expect("a client");
    let pushed = http.post(format!("{other}/api/v1/push")).json(&json!({"items": items(5, 3)})).send().await;
    assert_eq!(pushed.expect("a push").status(), StatusCode::CREATED);
    let popped = app.pop(&format!("queue/{queue}"), "batch=4&consumerGroup=g&wait=false").await.messages();
    assert_eq!(popped.len(), 4);
    app.ack_all(&popped[..3], "completed", Some("g")).await;
}

#[actix_web::test]
async fn the_history_counts_the_fleets_traffic_per_interval_and_samples_lag() {
    let app = spawn().await;
    let other = TestApp::spawn_on(&app.db, |config| config.stats.sample_interval_seconds = 1).await;
    traffic_through_both(&app, &other, "traced").await;

    let expected = json!({"pushed": 8, "delivered": 4, "acked": 3, "failed": 0, "deadLettered": 0});
    let history = eventually("the history counts the traffic of both brokers", || async {
        let history = app.get("/api/v1/status/history?minutes=5").await;
        (history_totals(&history.body).0 == expected).then_some(history)
    })
    .await;
    assert_eq!(history.body["intervalSeconds"], 1);
    let points = history.body["points"].as_array().expect("points");
    // Five minutes at one second: every interval is a point, empty ones included.
    assert!((300..=302).contains(&points.len()), "{} points", points.len());
    let times: Vec<chrono::DateTime<chrono::Utc>> =
        points.iter().map(|p| p["at"].as_str().expect("at").parse().expect("a time")).collect();
    assert!(times.windows(2).all(|w| w[1] - w[0] == chrono::TimeDelta::seconds(1)), "one point a second");
    assert_eq!(history.body["from"], points[0]["at"]);

    // Five are behind the cursor of g (one of them leased, and not acknowledged).
    let lag = eventually("a lag sample counts the five messages g has not committed", || async {
        let history = app.get("/api/v1/status/history?minutes=1").await;
        history_totals(&history.body).1.filter(|lag| lag["lagMessages"] == 5)
    })
    .await;
    assert!(lag["lagSeconds"].as_f64().expect("seconds") >= 0.0, "{lag}");

    for bad in ["minutes=0", "minutes=1441", "minutes=soon"] {
        let answer = app.get(&format!("/api/v1/status/history?{bad}")).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad}: {answer:?}");
    }
}

#[actix_web::test]
async fn a_queue_status_lists_each_groups_cursor_with_its_lag_and_lease_holder() {
    let app = TestApp::spawn().await;
    app.push(json!([
        {"queue": "orders", "partition": "eu", "transactionId": "e1", "payload": 1},
        {"queue": "orders", "partition": "eu", "transactionId": "e2", "payload": 2},
        {"queue": "orders", "partition": "us", "transactionId": "u1", "payload": 3},
    ]))
    .await;
    let popped = app.pop("queue/orders/partition/eu", "batch=1&consumerGroup=billing&wait=false").await;
    let lease = popped.messages()[0]["leaseId"].as_str().expect("a lease").to_owned();
    let drained = app.pop("queue/orders/partition/us", "batch=1&wait=false").await;
    app.ack_all(&drained.messages(), "completed", None).await;

    let status = app.get("/api/v1/status/queues/orders").await;
    assert_eq!(status.status, StatusCode::OK);
    let cursors = status.body["cursors"].as_array().expect("cursors");
    let find = |group: &str, partition: &str| {
        cursors
            .iter()
            .find(|c| c["group"] == group && c["partition"] == partition)
            .unwrap_or_else(|| panic!("no cursor of {group} on {partition}: {cursors:?}"))
    };
    let billing = find("billing", "eu");
    assert_eq!(billing["lagMessages"], 2, "the leased message is not committed: {billing}");
    assert_eq!(billing["committed"], 0);
    assert_eq!(billing["lastOffset"], 2);
    assert_eq!(billing["leaseId"], lease.as_str());
    assert!(billing["leaseExpiresAt"].is_string());
    assert!(billing["lagSeconds"].as_f64().expect("seconds") >= 0.0);
    let queue_mode = find("__QUEUE_MODE__", "us");
    assert_eq!(queue_mode["lagMessages"], 0);
    assert_eq!(queue_mode["leaseId"], Value::Null, "an acknowledged lease is not held");
    // billing registered on the queue: the partition it has not read yet counts from its start.
    let unread = find("billing", "us");
    assert_eq!((&unread["lagMessages"], &unread["leaseId"]), (&json!(1), &Value::Null));
    // Queue mode too, reading the queue, from the oldest message where it has not read yet.
    let unread = find("__QUEUE_MODE__", "eu");
    assert_eq!((&unread["lagMessages"], &unread["committed"]), (&json!(2), &json!(0)));
    assert_eq!(cursors.len(), 4, "every group reading the queue, on every partition: {cursors:?}");
}

/// Each broker's points of one analytics series, by broker id.
fn by_broker(answer: &Value) -> Vec<(String, Vec<Value>)> {
    answer["brokers"]
        .as_array()
        .expect("brokers")
        .iter()
        .map(|b| (b["brokerId"].as_str().expect("an id").to_owned(), b["points"].as_array().expect("points").clone()))
        .collect()
}

fn summed(points: &[Value], field: &str) -> i64 {
    points.iter().map(|p| p[field].as_i64().unwrap_or(0)).sum()
}

#[actix_web::test]
async fn the_analytics_series_show_what_each_broker_handled_and_used() {
    let beating_with_a_pool_of = |size| {
        move |config: &mut queen_broker::config::Config| {
            config.stats.sample_interval_seconds = 1;
            config.database.pool_size = size;
        }
    };
    let app = TestApp::spawn_with(beating_with_a_pool_of(9)).await;
    let other = TestApp::spawn_on(&app.db, beating_with_a_pool_of(7)).await;
    let http = queen_testkit::http().build().expect("a client");
    traffic_through_both(&app, &other, "watched").await;
    // A long poll parked on the other broker for as long as the test looks for it.
    assert_eq!(app.post("/api/v1/configure", &json!({"queue": "idle"})).await.status, StatusCode::OK);
    let parked = tokio::spawn({
        let (http, other) = (http.clone(), other.clone());
        async move { http.get(format!("{other}/api/v1/pop/queue/idle?wait=true&timeout=15000")).send().await }
    });

    // What each broker handled, in the JavaScript client's form of `from` (`toISOString()`).
    let from = (chrono::Utc::now() - chrono::TimeDelta::minutes(5)).format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string();
    let workers = eventually("each broker's traffic and the parked long poll are sampled", || async {
        let answer = app.get(&format!("/api/v1/analytics/worker-metrics?from={from}")).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        let brokers = by_broker(&answer.body);
        let handled: Vec<[i64; 3]> = brokers
            .iter()
            .map(|(_, points)| [summed(points, "pushed"), summed(points, "delivered"), summed(points, "acked")])
            .collect();
        let parked = brokers.iter().any(|(_, points)| points.iter().any(|p| p["longPollWaiters"].as_i64() >= Some(1)));
        (handled.contains(&[5, 4, 3]) && handled.contains(&[3, 0, 0]) && parked && brokers.len() == 2).then_some(answer)
    })
    .await;
    assert_eq!(workers.body["intervalSeconds"], 1);
    parked.abort();

    // What each broker used, through the other broker: any broker answers for the fleet.
    let system = http.get(format!("{other}/api/v1/analytics/system-metrics")).send().await.expect("a read");
    assert_eq!(system.status(), StatusCode::OK);
    let system: Value = system.json().await.expect("JSON");
    let brokers = by_broker(&system);
    assert_eq!(brokers.len(), 2, "{system}");
    let mut pool_maxima: Vec<i64> = Vec::new();
    for (id, points) in &brokers {
        assert!(!points.is_empty(), "{id} has no sample");
        for point in points {
            assert!(point["residentBytes"].as_i64() > Some(1 << 20), "{point}");
            assert!(point["cpuCores"].as_f64().is_some_and(|cores| cores >= 0.0), "{point}");
            let pool = &point["dbPool"];
            assert!(pool["connections"].as_i64() <= pool["max"].as_i64(), "{point}");
            assert!(pool["idle"].as_i64() <= pool["connections"].as_i64(), "{point}");
        }
        pool_maxima.push(points[0]["dbPool"]["max"].as_i64().expect("a pool bound"));
    }
    pool_maxima.sort_unstable();
    assert_eq!(pool_maxima, vec![7, 9], "each broker reports its own pool");

    // A window that ends before these brokers started holds nothing of them.
    let before = app.get("/api/v1/analytics/worker-metrics?from=2026-01-01&to=2026-01-02T00:00:00Z").await;
    assert_eq!(before.status, StatusCode::OK);
    assert_eq!(before.body["brokers"], json!([]), "{before:?}");
    for bad in ["from=yesterday", "to=2026-13-01", "from=2026-02-02&to=2026-02-01", "since=2026-01-01"] {
        for route in ["system-metrics", "worker-metrics"] {
            let answer = app.get(&format!("/api/v1/analytics/{route}?{bad}")).await;
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{route}?{bad}: {answer:?}");
            assert!(answer.body["error"].is_string(), "{answer:?}");
        }
    }
}
