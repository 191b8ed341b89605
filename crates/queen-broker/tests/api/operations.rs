//! What operators read: metrics (Prometheus text that promtool accepts, or JSON), and the status
//! and resource routes of dashboards.

use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::helpers::{TestApp, store_pool};

/// The `promtool` to check metrics with: `QUEEN_PROMTOOL`, else the one on the PATH.
fn promtool() -> String {
    std::env::var("QUEEN_PROMTOOL").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "promtool".into())
}

/// Traffic that gives every labelled metric a series: pushes, a duplicate, pops, acks of every
/// kind, a dead letter, a long poll.
async fn traffic(app: &TestApp) {
    app.push(json!([{"queue": "ops", "partition": "a", "transactionId": "1", "payload": {"v": 1}},
                    {"queue": "ops", "partition": "a", "transactionId": "2", "payload": {"v": 2}},
                    {"queue": "ops", "partition": "b", "transactionId": "3", "payload": {"v": 3}}]))
        .await;
    app.push_one("ops", "a", "1", json!("again")).await;
    let first = app.pop("queue/ops/partition/a", "batch=1&consumerGroup=g").await.messages();
    app.ack_all(&first, "failed", Some("g")).await;
    let second = app.pop("queue/ops/partition/a", "batch=2&consumerGroup=g").await.messages();
    app.ack_all(&second[..1], "dlq", Some("g")).await;
    app.ack_all(&second[1..], "completed", Some("g")).await;
    app.pop("queue/ops/partition/b", "batch=1&wait=true&timeout=100").await;
}

#[actix_web::test]
async fn the_prometheus_text_passes_promtool() {
    let app = TestApp::spawn().await;
    traffic(&app).await;
    let text = app
        .http
        .get(app.url("/metrics"))
        .header("accept", "text/plain;version=0.0.4;q=0.9,*/*;q=0.1")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for family in [
        "queen_messages_pushed_total{queue=\"ops\"} 3",
        "queen_pushed_bytes_total{queue=\"ops\"}",
        "queen_messages_delivered_total{queue=\"ops\"}",
        "queen_delivered_bytes_total{queue=\"ops\"}",
        "queen_messages_acked_total{queue=\"ops\"} 1",
        "queen_messages_failed_total{queue=\"ops\"} 1",
        "queen_messages_dead_lettered_total{queue=\"ops\"} 1",
        "queen_push_duplicates_total{queue=\"ops\"} 1",
        "queen_segments_written_total",
        "queen_segment_messages_bucket",
        "queen_ack_commit_batches_bucket",
        "queen_pop_duration_seconds_bucket",
        "queen_ack_duration_seconds_bucket",
        "queen_push_duration_seconds_bucket",
        "queen_long_poll_waiters",
        "queen_leases_granted_total",
        "queen_leases_expired_total",
        "queen_consumer_group_lag_messages{group=\"g\",queue=\"ops\"}",
        "queen_consumer_group_lag_seconds{group=\"g\",queue=\"ops\"}",
        "queen_db_pool_connections{state=\"in_use\"}",
        "queen_db_errors_total{kind=\"unavailable\"}",
        "queen_actor_queued_requests{actor=\"partition_writer\"}",
        "queen_actors{actor=\"group_leases\"}",
        "queen_notices_received_total",
        "queen_consumer_group_lag_read_timestamp_seconds",
        "queen_fleet_listening 1",
        "process_resident_memory_bytes",
    ] {
        assert!(text.contains(family), "{family} is missing from:\n{text}");
    }

    let mut check = tokio::process::Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): scripts/test.sh installs it, or set QUEEN_PROMTOOL to its path")
        });
    let mut stdin = check.stdin.take().expect("stdin");
    stdin.write_all(text.as_bytes()).await.expect("feeding promtool");
    drop(stdin);
    let output = check.wait_with_output().await.expect("promtool ran");
    assert!(
        output.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[actix_web::test]
async fn metrics_are_json_for_the_official_client() {
    let app = TestApp::spawn().await;
    traffic(&app).await;
    let answer = app.http.get(app.url("/metrics")).header("accept", "*/*").send().await.expect("metrics");
    assert!(answer.headers()["content-type"].to_str().unwrap_or("").contains("application/json"));
    let body: Value = answer.json().await.expect("JSON");
    let pushed = body["metrics"]
        .as_array()
        .expect("families")
        .iter()
        .find(|f| f["name"] == "queen_messages_pushed_total")
        .expect("queen_messages_pushed_total");
    assert_eq!(pushed["type"], "counter");
    assert_eq!(pushed["samples"][0]["labels"]["queue"], "ops");
    assert_eq!(pushed["samples"][0]["value"], 3.0);
    let prometheus = app.http.get(app.url("/metrics?format=prometheus")).send().await.expect("metrics");
    assert!(prometheus.headers()["content-type"].to_str().unwrap_or("").starts_with("text/plain"));
    assert!(prometheus.text().await.expect("text").contains("# TYPE queen_messages_pushed_total counter"));
}

#[actix_web::test]
async fn consumer_lag_is_a_groups_unread_messages_over_every_partition_of_the_queue() {
    let app = TestApp::spawn().await;
    for (partition, count) in [("a", 2), ("b", 3), ("c", 4)] {
        for n in 0..count {
            app.push_one("lagged", partition, &format!("{partition}{n}"), json!(n)).await;
        }
        // Group g reads and acks the first message of each partition: 1, 2 and 3 stay unread.
        let first = app.pop(&format!("queue/lagged/partition/{partition}"), "batch=1&consumerGroup=g").await.messages();
        app.ack_all(&first, "completed", Some("g")).await;
    }
    // Group h reads all of partition a and nothing else: b and c, which it has no cursor on
    // yet, are all its lag; so does queue mode, which is never registered. Group i reads
    // everything.
    let all_of_a = app.pop("queue/lagged/partition/a", "batch=10&consumerGroup=h").await.messages();
    app.ack_all(&all_of_a, "completed", Some("h")).await;
    let all_of_a = app.pop("queue/lagged/partition/a", "batch=10").await.messages();
    app.ack_all(&all_of_a, "completed", None).await;
    let everything = app.pop("queue/lagged", "batch=10&partitions=3&consumerGroup=i").await.messages();
    assert_eq!(everything.len(), 9);
    app.ack_all(&everything, "completed", Some("i")).await;
    let text = app.http.get(app.url("/metrics?format=prometheus")).send().await.expect("metrics").text().await;
    let text = text.expect("text");
    let sample = |name: &str, group: &str| -> f64 {
        let prefix = format!("{name}{{group=\"{group}\",queue=\"lagged\"}} ");
        let value = text.lines().find_map(|line| line.strip_prefix(&prefix)).unwrap_or_else(|| panic!("{prefix}"));
        value.parse().expect("a number")
    };
    assert_eq!(sample("queen_consumer_group_lag_messages", "g"), 6.0);
    assert!(sample("queen_consumer_group_lag_seconds", "g") > 0.0);
    assert_eq!(sample("queen_consumer_group_lag_messages", "h"), 7.0);
    assert!(sample("queen_consumer_group_lag_seconds", "h") > 0.0);
    assert_eq!(sample("queen_consumer_group_lag_messages", "__QUEUE_MODE__"), 7.0);
    assert_eq!(sample("queen_consumer_group_lag_messages", "i"), 0.0);
    assert_eq!(sample("queen_consumer_group_lag_seconds", "i"), 0.0);
}

#[actix_web::test]
async fn namespaces_and_tasks_list_what_queues_carry_with_their_sizes() {
    let app = TestApp::spawn().await;
    // Dotted names carry a namespace and a task; `ops` carries neither and is listed under none.
    app.post("/api/v1/configure", &json!({"queue": "billing.invoices", "options": {}})).await;
    app.push(json!([{"queue": "billing.refunds", "partition": "a", "payload": 1},
                    {"queue": "billing.refunds", "partition": "b", "payload": 2},
                    {"queue": "shop.invoices", "payload": 3},
                    {"queue": "ops", "payload": 4}]))
        .await;

    let namespaces = app.get("/api/v1/resources/namespaces").await;
    assert_eq!(namespaces.status, StatusCode::OK, "{namespaces:?}");
    let listed = namespaces.body["namespaces"].as_array().expect("namespaces");
    let names: Vec<&str> = listed.iter().map(|n| n["namespace"].as_str().unwrap_or("")).collect();
    assert_eq!(names, vec!["billing", "shop"]);
    assert_eq!((&listed[0]["queues"], &listed[0]["partitions"]), (&json!(2), &json!(2)), "{listed:?}");
    assert_eq!((&listed[0]["messages"]["pushed"], &listed[0]["messages"]["stored"]), (&json!(2), &json!(2)));
    assert!(listed[0]["lastPushAt"].is_string(), "{listed:?}");
    assert_eq!((&listed[1]["queues"], &listed[1]["messages"]["pushed"]), (&json!(1), &json!(1)));

    let tasks = app.get("/api/v1/resources/tasks").await;
    let listed = tasks.body["tasks"].as_array().expect("tasks");
    let names: Vec<(&str, i64)> =
        listed.iter().map(|t| (t["task"].as_str().unwrap_or(""), t["queues"].as_i64().unwrap_or(-1))).collect();
    assert_eq!(names, vec![("invoices", 2), ("refunds", 1)]);
    assert_eq!(listed[0]["messages"]["pushed"], 1, "a configured queue without messages adds none");

    let second = app.get("/api/v1/resources/tasks?limit=1&offset=1").await;
    assert_eq!(
        second.body["tasks"].as_array().map(|t| t.iter().map(|t| t["task"].clone()).collect::<Vec<_>>()),
        Some(vec![json!("refunds")])
    );
    assert_eq!((&second.body["limit"], &second.body["offset"]), (&json!(1), &json!(1)));
    let filtered = app.get("/api/v1/resources/namespaces?task=invoices").await;
    assert_eq!(filtered.status, StatusCode::BAD_REQUEST, "{filtered:?}");
    assert!(filtered.body["error"].as_str().is_some_and(|e| e.contains("task")), "{filtered:?}");
}

#[actix_web::test]
async fn status_and_resource_routes_report_the_data() {
    let app = TestApp::spawn().await;
    app.post("/api/v1/configure", &json!({"queue": "billing.invoices", "options": {"leaseTime": 60}})).await;
    traffic(&app).await;

    let overview = app.get("/api/v1/resources/overview").await;
    assert_eq!(overview.status, StatusCode::OK);
    assert_eq!(overview.body["queues"], 2);
    assert_eq!(overview.body["partitions"], 2);
    assert_eq!(overview.body["messages"]["pushed"], 3);
    assert_eq!(overview.body["consumerGroups"], 2);
    assert_eq!(overview.body["deadLetters"], 1);

    let queues = app.get("/api/v1/resources/queues").await;
    let names: Vec<&str> =
        queues.body["queues"].as_array().expect("queues").iter().map(|q| q["name"].as_str().unwrap_or("")).collect();
    assert_eq!(names, vec!["billing.invoices", "ops"]);
    let billing = app.get("/api/v1/resources/queues?namespace=billing").await;
    assert_eq!(billing.body["queues"][0]["task"], "invoices");
    assert_eq!(billing.body["queues"].as_array().map(Vec::len), Some(1));

    let partitions = app.get("/api/v1/resources/partitions?queue=ops").await;
    let list = partitions.body["partitions"].as_array().expect("partitions");
    assert_eq!(list.len(), 2);
    assert!(list.iter().any(|p| p["name"] == "a" && p["lastOffset"] == 2));

    let status = app.get("/api/v1/status").await;
    assert_eq!(status.body["status"], "ok");
    assert!(status.body["uptimeSeconds"].as_f64().is_some());
    assert_eq!(status.body["messages"]["stored"], 3);

    let per_queue = app.get("/api/v1/status/queues").await;
    let ops = per_queue.body["queues"].as_array().expect("queues").iter().find(|q| q["name"] == "ops").expect("ops");
    let groups = ops["consumerGroups"].as_array().expect("groups");
    // g read all of a; b's message, which it has not reached, is its lag.
    assert!(groups.iter().any(|g| g["name"] == "g" && g["lagMessages"] == 1 && g["partitions"] == 2), "{groups:?}");
    // Queue mode took b's message under a lease and never read a: a's two messages and b's.
    assert!(groups.iter().any(|g| g["name"] == "__QUEUE_MODE__" && g["lagMessages"] == 3), "{groups:?}");

    let one = app.get("/api/v1/status/queues/ops").await;
    assert_eq!(one.body["queue"]["name"], "ops");
    assert_eq!(one.body["partitions"].as_array().map(Vec::len), Some(2));
    assert_eq!(app.get("/api/v1/status/queues/nope").await.status, StatusCode::NOT_FOUND);

    let analytics = app.get("/api/v1/status/analytics").await;
    assert_eq!(analytics.body["broker"]["messagesPushed"], 3);
    assert_eq!(analytics.body["broker"]["messagesDeadLettered"], 1);
    assert_eq!(analytics.body["totals"]["messages"]["pushed"], 3);

    let listed = app.get("/api/v1/messages?queue=ops&limit=2").await;
    let messages = listed.body["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2, "the newest two");
    assert!(messages.iter().all(|m| m["queue"] == "ops" && m["data"].is_object()));
    // `offset` (as the client's list_messages documents it) pages on, newest first.
    let everything = app.get("/api/v1/messages?queue=ops&limit=3").await.body["messages"].clone();
    let next = app.get("/api/v1/messages?queue=ops&limit=2&offset=1").await;
    assert_eq!(next.body["messages"], json!(everything.as_array().expect("messages")[1..]), "{next:?}");
    let past = app.get("/api/v1/messages?queue=ops&limit=1000&offset=1").await;
    assert_eq!(past.status, StatusCode::BAD_REQUEST, "{past:?}");
    let one_partition = app.get("/api/v1/messages?queue=ops&partition=b").await;
    assert_eq!(one_partition.body["messages"][0]["transactionId"], "3");
    assert_eq!(app.get("/api/v1/messages").await.status, StatusCode::BAD_REQUEST, "queue is required");
}

/// Turns `app`'s database read-only, or back, for the sessions the broker opens next, and ends
/// the ones it has so that its pool opens new ones (a database's settings apply at connection).
async fn set_read_only(app: &TestApp, on: bool) {
    let admin = app.db.connect().await;
    // A new session of a read-only database is read-only itself: not this one.
    admin.batch_execute("SET default_transaction_read_only = off").await.expect("SET");
    let name = app.db.name();
    let setting = if on { "SET default_transaction_read_only = on" } else { "RESET default_transaction_read_only" };
    admin.batch_execute(&format!("ALTER DATABASE {name} {setting}")).await.expect("ALTER DATABASE");
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&name],
        )
        .await
        .expect("the broker's sessions end");
}

/// Pushes until an answer is `wanted` (the pool may first hand out a session that was ended).
async fn push_until(
    app: &TestApp,
    id: &str,
    wanted: impl Fn(&crate::helpers::Answer) -> bool,
) -> crate::helpers::Answer {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    for attempt in 0.. {
        let item = json!({"queue": "fenced", "partition": "p", "transactionId": format!("{id}-{attempt}"), "payload": attempt});
        let answer = app.post("/api/v1/push", &json!({"items": [item]})).await;
        if wanted(&answer) {
            return answer;
        }
        assert!(std::time::Instant::now() < deadline, "no push answered as wanted; the last: {answer:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    unreachable!("the attempts do not end")
}

#[actix_web::test]
async fn a_read_only_database_is_a_503_that_says_so_and_not_ready_until_it_takes_writes() {
    let app = TestApp::spawn().await;
    app.push_one("fenced", "p", "before", json!(0)).await;
    set_read_only(&app, true).await;

    let refused = push_until(&app, "refused", |answer| {
        answer.status == StatusCode::SERVICE_UNAVAILABLE
            && answer.body["error"] != queen_broker::broker::DATABASE_UNAVAILABLE
    })
    .await;
    assert_eq!(
        refused.body["error"],
        "PostgreSQL is read-only and not accepting writes; retry later (the broker renews its connections by itself)",
        "{refused:?}"
    );
    assert_eq!(refused.body["code"], "unavailable");
    // A refused push is timed as any other: a stalled database shows in the latency.
    let timed = app.metric("queen_push_duration_seconds_count").await;
    let item = json!({"queue": "fenced", "partition": "p", "transactionId": "refused again", "payload": 2});
    let again = app.post("/api/v1/push", &json!({"items": [item]})).await;
    assert_eq!(again.status, StatusCode::SERVICE_UNAVAILABLE, "{again:?}");
    assert_eq!(app.metric("queen_push_duration_seconds_count").await, timed + 1.0);
    let popped = app.pop("queue/fenced", "batch=1").await;
    assert_eq!(popped.status, StatusCode::SERVICE_UNAVAILABLE, "a pop leases (a write): {popped:?}");
    let ready = app.get("/ready").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE, "{ready:?}");
    assert_eq!(ready.body["database"], "read-only", "{ready:?}");
    assert_eq!(app.get("/health").await.status, StatusCode::OK);
    assert!(app.metric("queen_db_errors_total{kind=\"read_only\"}").await >= 1.0);

    set_read_only(&app, false).await;
    push_until(&app, "back", |answer| answer.status == StatusCode::CREATED).await;
    assert_eq!(app.get("/ready").await.status, StatusCode::OK);
    assert_eq!(app.pop("queue/fenced", "batch=10").await.messages().len(), 2, "before, and the push after");
}

/// During push maintenance the broker takes pushes into its journal whatever PostgreSQL does:
/// it stays ready while the database refuses writes, saying it buffers.
#[actix_web::test]
async fn a_broker_in_push_maintenance_stays_ready_while_the_database_refuses_writes() {
    let app = TestApp::spawn().await;
    let on = app.post("/api/v1/system/maintenance", &json!({"enabled": true})).await;
    assert_eq!(on.status, StatusCode::OK, "{on:?}");
    set_read_only(&app, true).await;
    let ready = app.get("/ready").await;
    assert_eq!((ready.status, &ready.body["status"]), (StatusCode::OK, &json!("buffering")), "{ready:?}");
    // Read-only, or its connections just ended by the switch.
    assert!(["read-only", "unreachable"].contains(&ready.body["database"].as_str().unwrap_or_default()), "{ready:?}");
    assert_eq!(app.push_one("held", "p", "t", json!(1)).await["status"], "buffered");
    set_read_only(&app, false).await;
}

/// `/ready` tells a pool whose every connection stays in use by requests (`busy`) from a database
/// that does not answer (`unreachable`): the two send an operator after different faults. A busy
/// broker stays ready: the database answers its requests, and a loaded fleet taken out of its
/// load balancer all at once would refuse connections instead of answering slowly.
#[actix_web::test]
async fn ready_says_the_pool_is_busy_when_every_connection_is_in_use() {
    let app = TestApp::spawn_with(|config| config.database.pool_size = 1).await;
    app.push_one("busy", "p", "m1", json!(1)).await;
    let popped = app.pop("queue/busy", "batch=1&consumerGroup=g").await.messages();
    let holder = app.hold_cursor("g").await;
    // The ack holds the pool's only connection while it waits for the cursor.
    let ack = app.ack_all(&popped, "completed", Some("g"));
    let meanwhile = async {
        app.until_waiting_for_a_lock("queen.log_consumers", "the ack never waited for the cursor").await;
        let ready = app.get("/ready").await;
        holder.batch_execute("ROLLBACK").await.expect("the lock released");
        ready
    };
    let (acked, ready) = tokio::join!(ack, meanwhile);
    assert_eq!(ready.status, StatusCode::OK, "{ready:?}");
    assert_eq!(ready.body["database"], "busy", "{ready:?}");
    assert_eq!(acked[0]["success"], true, "{acked:?}");
    assert_eq!(app.get("/ready").await.status, StatusCode::OK, "free again");
}

/// A host of a multi-host URL that accepts connections and never answers (a frozen server, a
/// proxy whose backend hung) is passed over after `connect_timeout`, as libpq does: a broker
/// whose URL names one first starts (its TLS check and migrations), serves through its pool and
/// listens, all on the next host, where each connection used to spend its whole bound on the
/// silent one and never reach the next.
#[actix_web::test]
async fn a_host_that_accepts_connections_and_never_answers_is_passed_over_for_the_next() {
    let db = queen_testkit::TestDatabase::create("silent_host").await;
    // The kernel completes the handshake on a listening socket; nothing ever answers on it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let (scheme, rest) = db.url().split_once("://").expect("a URL");
    let (user, hosts_and_rest) = rest.split_once('@').expect("a URL with a user");
    let port = silent.local_addr().expect("its address").port();
    let url = format!("{scheme}://{user}@127.0.0.1:{port},{hosts_and_rest}");
    let base = TestApp::spawn_on(&db, move |config| {
        config.database.url = Some(url);
        config.database.connect_timeout_ms = 1000;
    })
    .await;
    let http = queen_testkit::http().build().expect("a client");
    let push = json!({"items": [{"queue": "silent-first", "partition": "p", "transactionId": "t1", "payload": 1}]});
    let pushed = http.post(format!("{base}/api/v1/push")).json(&push).send().await.expect("a push");
    assert_eq!(pushed.status(), StatusCode::CREATED);
    let popped = http.get(format!("{base}/api/v1/pop/queue/silent-first?wait=false")).send().await.expect("a pop");
    assert_eq!(popped.status(), StatusCode::OK);
    let listening = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'queen-listen'";
    let sql = db.connect().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sql.query_one(listening, &[]).await.expect("a count").get::<_, i64>(0) < 1 {
        assert!(std::time::Instant::now() < deadline, "the broker never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server with no connection slot left for the broker (SQLSTATE 53300: `max_connections`, or a
/// role's or a database's limit) is PostgreSQL unavailable for now: a 503 to retry later, and a
/// broker starting then waits for it, not an internal error that stops it.
#[actix_web::test]
async fn a_server_out_of_connection_slots_is_unavailable_for_now() {
    let app = TestApp::spawn().await;
    let role = format!("queen_no_slot_{}", uuid::Uuid::new_v4().simple());
    let admin = app.db.connect().await;
    admin
        .batch_execute(&format!("CREATE ROLE {role} LOGIN PASSWORD 'no-slot' CONNECTION LIMIT 0"))
        .await
        .expect("a role");
    let mut config: tokio_postgres::Config = app.db.url().parse().expect("the database URL");
    config.user(&role).password("no-slot");
    let pool = store_pool(config, "no-slot");
    let refused = queen_store::StoreError::from(pool.get().await.expect_err("no slot for the role"));
    admin.batch_execute(&format!("DROP ROLE {role}")).await.expect("the role dropped");
    assert!(refused.is_unavailable(), "{refused}");
    let answered = queen_broker::broker::BrokerError::from(refused);
    assert!(matches!(answered, queen_broker::broker::BrokerError::Unavailable(_)), "{answered:?}");
}

/// A bounded write whose caller went away mid-statement (its request dropped: the client
/// disconnected) does not hand its connection back with the statement still running on it: the
/// next user of the pool gets a connection that answers at once.
#[actix_web::test]
async fn a_write_dropped_mid_statement_does_not_leave_its_connection_to_the_next_user() {
    let app = TestApp::spawn().await;
    let target: tokio_postgres::Config = app.db.url().parse().expect("the database URL");
    let pool = store_pool(target, "dropped-write");
    let client = pool.get().await.expect("a connection");
    let sleeping = queen_store::pool::answered_within(client, Duration::from_secs(60), "a sleep", async |c| {
        c.batch_execute("SELECT pg_sleep(30)").await
    });
    // The caller goes away while the statement runs.
    assert!(tokio::time::timeout(Duration::from_millis(300), sleeping).await.is_err(), "the sleep still ran");
    let next = tokio::time::timeout(Duration::from_secs(10), async {
        pool.get().await.expect("a connection").query_one("SELECT 1", &[]).await.expect("an answer").get::<_, i32>(0)
    })
    .await;
    assert_eq!(next.ok(), Some(1), "the next user waited behind the abandoned sleep");
}

/// The database URL's own `application_name` and `options` reach the broker's sessions (its
/// timeouts are added after the options, not in their place).
#[actix_web::test]
async fn the_database_urls_application_name_and_options_are_kept() {
    let app = TestApp::spawn_with(|config| {
        let url = config.database.url.take().expect("the test database's URL");
        let joiner = if url.contains('?') { '&' } else { '?' };
        config.database.url = Some(format!("{url}{joiner}application_name=queen-eu&options=-c%20work_mem%3D7MB"));
    })
    .await;
    assert_eq!(app.push_one("named", "p", "m", json!(1)).await["status"], "queued");
    let named =
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'queen-eu'";
    assert!(app.count(named).await >= 1, "the broker's sessions carry the URL's name");
}

/// Every path that appends counts what it stored: a capped queue's push, a transaction's push and
/// a dead letter's retry each write a segment, counted with its messages and bytes.
#[actix_web::test]
async fn every_path_that_appends_counts_its_segments_messages_and_bytes() {
    let app = TestApp::spawn().await;
    app.configure("capped", json!({"maxSize": 100})).await;
    let counts = async || {
        (
            app.metric("queen_segments_written_total").await,
            app.metric("queen_messages_pushed_total{queue=\"capped\"}").await,
            app.metric("queen_pushed_bytes_total{queue=\"capped\"}").await,
        )
    };
    let before = counts().await;
    let pushed = app.push_one("capped", "p", "direct", json!(12345)).await;
    let after_push = counts().await;
    assert_eq!((after_push.0 - before.0, after_push.1 - before.1, after_push.2 - before.2), (1.0, 1.0, 5.0));

    let bundle = json!({"operations": [{"type": "push", "items": [{"queue": "capped", "partition": "p",
                                                                    "transactionId": "bundled", "payload": 678}]}]});
    assert_eq!(app.post("/api/v1/transaction", &bundle).await.status, StatusCode::OK);
    let after_bundle = counts().await;
    assert_eq!(
        (after_bundle.0 - after_push.0, after_bundle.1 - after_push.1, after_bundle.2 - after_push.2),
        (1.0, 1.0, 3.0)
    );

    let popped = app.pop("queue/capped", "batch=1").await.messages();
    app.ack_all(&popped, "dlq", None).await;
    let partition = pushed["partition_id"].as_str().expect("partition_id");
    assert_eq!(
        app.post(&format!("/api/v1/messages/{partition}/direct/retry"), &json!({})).await.status,
        StatusCode::OK
    );
    let after_retry = counts().await;
    assert_eq!(
        (after_retry.0 - after_bundle.0, after_retry.1 - after_bundle.1, after_retry.2 - after_bundle.2),
        (1.0, 1.0, 5.0)
    );
}

/// `/ready` and `/health` take no token. Probes of one kind that arrive while one runs wait for
/// its answer instead of each taking a pooled connection for a query of its own: here twenty
/// readiness probes arrive while one waits (for the schema table, locked by the test) until its
/// timeout, and only that one asked PostgreSQL.
#[actix_web::test]
async fn probes_that_arrive_while_one_runs_share_its_answer() {
    let app = TestApp::spawn().await;
    let sql = app.db.connect().await;
    sql.batch_execute("BEGIN; LOCK TABLE queen.schema_migrations IN ACCESS EXCLUSIVE MODE").await.expect("the lock");
    let first = app.get("/ready");
    let more = async {
        app.until_waiting_for_a_lock("schema_migrations", "the first probe waits for the schema table").await;
        futures::future::join_all((0..20).map(|_| app.get("/ready"))).await
    };
    let (first, more) = futures::join!(first, more);
    for answer in std::iter::once(&first).chain(&more) {
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
        assert_eq!(answer.body["database"], "unreachable", "the shared probe ran out of time: {answer:?}");
    }
    // Every probe that ran a query is still there, waiting for the lock: a probe that runs out of
    // time drops its connection, which PostgreSQL notices only once the lock is let go.
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                   AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND query LIKE '%queen.schema_migrations%'";
    assert_eq!(app.count(waiting).await, 1, "one readiness query for twenty-one probes");
    sql.batch_execute("ROLLBACK").await.expect("the lock released");
    assert_eq!(app.get("/ready").await.status, StatusCode::OK, "a probe after it asks again");
}

/// A write whose connection is lost while it commits may have committed or not: its 503 says the
/// outcome is unknown (not merely that the database is away), and the same write sent again takes
/// effect once. The commits are held by a deferred trigger that sleeps, and their sessions ended.
#[actix_web::test]
async fn a_write_whose_connection_is_lost_while_it_commits_is_answered_outcome_unknown() {
    let app = TestApp::spawn().await;
    app.push_one("lost", "p", "before", json!(0)).await;
    let admin = app.db.connect().await;
    let stall = "CREATE FUNCTION public.stall() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN PERFORM pg_sleep(60); RETURN NULL; END $$;
                 CREATE CONSTRAINT TRIGGER stall AFTER INSERT ON queen.log_segments
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.stall()";
    admin.batch_execute(stall).await.expect("the stalling trigger");
    // Ends the broker's session once it sleeps in its commit.
    let end_the_stalled_commit = async || {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let ended = "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE datname = $1 AND wait_event = 'PgSleep') AS ended";
        while admin.query_one(ended, &[&app.db.name()]).await.expect("pg_stat_activity").get::<_, i64>(0) == 0 {
            assert!(std::time::Instant::now() < deadline, "no commit sleeps in the trigger");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let push = json!({"items": [{"queue": "lost", "partition": "p", "transactionId": "pushed", "payload": 1}]});
    let transaction = json!({"operations": [{"type": "push", "items": [
        {"queue": "lost", "partition": "p", "transactionId": "in-transaction", "payload": 2}]}]});
    for (what, route, body) in [("push", "/api/v1/push", &push), ("transaction", "/api/v1/transaction", &transaction)] {
        let (answer, ()) = tokio::join!(app.post(route, body), end_the_stalled_commit());
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "the {what}: {answer:?}");
        let error = answer.body["error"].as_str().unwrap_or_default();
        assert!(error.contains("whether it took effect is unknown"), "the {what}: {error}");
    }

    admin.batch_execute("DROP TRIGGER stall ON queen.log_segments").await.expect("the trigger dropped");
    for (what, route, body) in [("push", "/api/v1/push", &push), ("transaction", "/api/v1/transaction", &transaction)] {
        let mut answer = app.post(route, body).await;
        for _ in 0..20 {
            // The pool may hand out a session that was ended first.
            if answer.status != StatusCode::SERVICE_UNAVAILABLE {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            answer = app.post(route, body).await;
        }
        assert!(answer.status.is_success(), "the {what} sent again: {answer:?}");
    }
    let popped = app.pop("queue/lost", "batch=10&wait=false").await;
    assert_eq!(popped.transaction_ids(), vec!["before", "pushed", "in-transaction"]);
}
