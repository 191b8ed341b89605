//! Limits on what clients can create (`limits.max_queues`, `max_partitions_per_queue`,
//! `max_groups_per_queue`), counted in PostgreSQL for the whole fleet: past one, the request is
//! answered 409 `limit_reached` naming the setting (not 429, which clients retry in place), and
//! nothing of it is created or written. And the bound on the long polls one client address parks
//! (`limits.long_polls_per_client`, 429 `overloaded`).

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp};
use crate::long_poll::until_parked;

fn item(queue: &str, partition: &str, transaction_id: &str) -> Value {
    json!({"queue": queue, "partition": partition, "transactionId": transaction_id, "payload": transaction_id})
}

/// An answer with its `Retry-After`.
async fn answered(response: reqwest::Result<reqwest::Response>) -> (Answer, Option<String>) {
    let response = response.expect("an answer");
    let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let status = response.status();
    let text = response.text().await.expect("a body");
    let body = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).expect("JSON") };
    (Answer { status, body }, retry_after)
}

async fn post(http: &reqwest::Client, base: &str, path: &str, body: Value) -> (Answer, Option<String>) {
    answered(http.post(format!("{base}{path}")).json(&body).send().await).await
}

async fn get(http: &reqwest::Client, base: &str, path: &str) -> (Answer, Option<String>) {
    answered(http.get(format!("{base}{path}")).send().await).await
}

async fn push(app: &TestApp, items: Vec<Value>) -> (Answer, Option<String>) {
    post(&app.http, &app.base, "/api/v1/push", json!({ "items": items })).await
}

async fn transaction_push(app: &TestApp, items: Vec<Value>) -> (Answer, Option<String>) {
    post(&app.http, &app.base, "/api/v1/transaction", json!({"operations": [{"type": "push", "items": items}]})).await
}

/// A 409 `limit_reached` that names `setting` in its `limit` and says `text`, without
/// `Retry-After` (waiting does not make room).
fn assert_limit(answer: &(Answer, Option<String>), setting: &str, text: &str) {
    let (answer, retry_after) = answer;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{answer:?}");
    assert_eq!(answer.body["success"], false, "{answer:?}");
    assert_eq!(answer.body["code"], "limit_reached", "{answer:?}");
    assert_eq!(answer.body["limit"], setting, "{answer:?}");
    assert_eq!(answer.body["error"], text, "{answer:?}");
    assert!(answer.body["requestId"].is_string(), "{answer:?}");
    assert_eq!(retry_after.as_deref(), None, "a limit is not transient: no Retry-After");
}

async fn messages_with(app: &TestApp, transaction_ids: &[&str]) -> i64 {
    let list = transaction_ids.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(", ");
    app.count(&format!("SELECT count(*) FROM queen.log_message_ids WHERE transaction_id IN ({list})")).await
}

#[actix_web::test]
async fn past_the_queue_limit_a_push_a_configure_or_a_transaction_is_refused_whole_and_creates_nothing() {
    let app = TestApp::spawn_with(|config| config.limits.max_queues = 2).await;
    app.push(json!([item("one", "p", "a"), item("two", "p", "b")])).await;

    // A push to a queue that exists and one that does not is refused whole.
    let refused = push(&app, vec![item("one", "p", "c"), item("three", "p", "d")]).await;
    let full = "queue limit reached: the fleet holds 2 queues (limits.max_queues = 2)";
    assert_limit(&refused, "limits.max_queues", full);
    assert_eq!((refused.0.body["held"].as_i64(), refused.0.body["max"].as_i64()), (Some(2), Some(2)));
    let configure = json!({"queue": "three", "options": {"leaseTime": 30}});
    assert_limit(&post(&app.http, &app.base, "/api/v1/configure", configure).await, "limits.max_queues", full);
    assert_limit(&transaction_push(&app, vec![item("three", "p", "e")]).await, "limits.max_queues", full);
    // A first push naming two new queues where one place is left takes neither.
    app.delete("/api/v1/resources/queues/two").await;
    let two_new = push(&app, vec![item("four", "p", "f"), item("five", "p", "g")]).await;
    let text = "queue limit reached: the fleet holds 1 queues and the request would add 2 (limits.max_queues = 2)";
    assert_limit(&two_new, "limits.max_queues", text);

    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 1, "no queue was created");
    assert_eq!(app.count("SELECT count(*) FROM queen.partitions").await, 1, "no partition was created");
    assert_eq!(messages_with(&app, &["c", "d", "e", "f", "g"]).await, 0, "no message of a refused request");

    // What exists is served as before; a deleted queue gave its place back.
    app.push_one("one", "p", "h", json!(1)).await;
    app.configure("one", json!({"leaseTime": 30})).await;
    app.push_one("three", "p", "i", json!(2)).await;
    assert_limit(&push(&app, vec![item("six", "p", "j")]).await, "limits.max_queues", full);
}

#[actix_web::test]
async fn past_the_partition_limit_a_push_naming_several_partitions_is_refused_whole() {
    let app = TestApp::spawn_with(|config| config.limits.max_partitions_per_queue = 3).await;
    app.push(json!([item("orders", "p1", "a"), item("orders", "p2", "b")])).await;

    let refused =
        push(&app, vec![item("orders", "p1", "c"), item("orders", "p3", "d"), item("orders", "p4", "e")]).await;
    let text = "partition limit reached: queue \"orders\" holds 2 partitions and the request would add 2 \
                (limits.max_partitions_per_queue = 3)";
    assert_limit(&refused, "limits.max_partitions_per_queue", text);
    assert_eq!(refused.0.body["queue"], "orders");
    assert_eq!(app.count("SELECT count(*) FROM queen.partitions").await, 2, "no partition of the refused push");
    assert_eq!(messages_with(&app, &["c", "d", "e"]).await, 0, "not even in the partition that exists");

    app.push_one("orders", "p3", "f", json!(1)).await;
    let full = "partition limit reached: queue \"orders\" holds 3 partitions (limits.max_partitions_per_queue = 3)";
    assert_limit(&push(&app, vec![item("orders", "p4", "g")]).await, "limits.max_partitions_per_queue", full);
    assert_limit(
        &transaction_push(&app, vec![item("orders", "p4", "h")]).await,
        "limits.max_partitions_per_queue",
        full,
    );
    // A new queue whose first push names too many partitions is not created either.
    let wide: Vec<Value> = (1..=4).map(|p| item("wide", &format!("p{p}"), &format!("w{p}"))).collect();
    let text = "partition limit reached: queue \"wide\" holds 0 partitions and the request would add 4 \
                (limits.max_partitions_per_queue = 3)";
    assert_limit(&push(&app, wide).await, "limits.max_partitions_per_queue", text);
    assert_eq!(app.count("SELECT count(*) FROM queen.queues WHERE name = 'wide'").await, 0, "the queue neither");

    // Each queue counts its own; partitions that exist take pushes as before.
    app.push(json!([item("other", "p1", "i"), item("other", "p2", "j"), item("other", "p3", "k")])).await;
    app.push_one("orders", "p1", "l", json!(2)).await;
    assert_eq!(app.count("SELECT count(*) FROM queen.partitions").await, 6);
    assert_eq!(messages_with(&app, &["g", "h", "w1", "w2", "w3", "w4"]).await, 0);
}

#[actix_web::test]
async fn past_the_group_limit_a_new_group_is_refused_at_its_first_pop_or_seek_and_registers_nothing() {
    let app = TestApp::spawn_with(|config| config.limits.max_groups_per_queue = 2).await;
    app.push(json!([item("team.jobs.a", "p", "a"), item("team.jobs.b", "p", "b")])).await;
    let app = &app;
    let pop = |group: &str, wait: bool| {
        let path = format!("/api/v1/pop/queue/team.jobs.a?consumerGroup={group}&wait={wait}&timeout=5000");
        async move { get(&app.http, &app.base, &path).await }
    };
    assert_eq!(pop("g1", false).await.0.status, StatusCode::OK);
    assert_eq!(pop("g2", false).await.0.status, StatusCode::OK);

    let full = "consumer group limit reached: queue \"team.jobs.a\" has 2 consumer groups \
                (limits.max_groups_per_queue = 2)";
    assert_limit(&pop("g3", false).await, "limits.max_groups_per_queue", full);
    let started = Instant::now();
    assert_limit(&pop("g3", true).await, "limits.max_groups_per_queue", full);
    assert!(started.elapsed() < Duration::from_secs(2), "a long poll is refused at once, not parked");
    let seek = json!({"toEnd": true});
    let seek_g3 = post(&app.http, &app.base, "/api/v1/consumer-groups/g3/queues/team.jobs.a/seek", seek.clone()).await;
    assert_limit(&seek_g3, "limits.max_groups_per_queue", full);
    // A namespace pop over a queue without room registers the group on none of its queues.
    let namespace = get(&app.http, &app.base, "/api/v1/pop?namespace=team&consumerGroup=g3").await;
    assert_limit(&namespace, "limits.max_groups_per_queue", full);
    let g3 = "SELECT count(*) FROM queen.consumer_groups_metadata WHERE consumer_group = 'g3'";
    assert_eq!(app.count(g3).await, 0, "no registration of the refused group");
    let cursors = "SELECT count(*) FROM queen.log_consumers WHERE consumer_group = 'g3'";
    assert_eq!(app.count(cursors).await, 0, "no cursor of the refused group");

    // Groups that exist pop and seek as before; queue mode is not counted.
    assert_eq!(pop("g1", false).await.0.status, StatusCode::NO_CONTENT, "g1 holds the lease");
    let seek_g1 = post(&app.http, &app.base, "/api/v1/consumer-groups/g1/queues/team.jobs.a/seek", seek).await;
    assert_eq!(seek_g1.0.status, StatusCode::OK, "{seek_g1:?}");
    assert_eq!(app.pop("queue/team.jobs.a", "").await.status, StatusCode::OK, "queue mode pops");
    // A deleted group gives its place back.
    app.delete("/api/v1/consumer-groups/g2/queues/team.jobs.a").await;
    assert_eq!(pop("g3", false).await.0.status, StatusCode::OK);
    assert_eq!(app.count(g3).await, 1);
}

#[actix_web::test]
async fn a_limit_of_zero_is_no_limit() {
    let app = TestApp::spawn_with(|config| {
        let limits = &mut config.limits;
        (limits.max_queues, limits.max_partitions_per_queue, limits.max_groups_per_queue) = (0, 0, 0);
        limits.long_polls_per_client = 0;
    })
    .await;
    let items: Vec<Value> = (0..60).map(|i| item(&format!("q{}", i % 6), &format!("p{i}"), &format!("t{i}"))).collect();
    app.push(Value::Array(items)).await;
    app.configure("configured", json!({})).await;
    for group in ["g1", "g2", "g3", "g4", "g5"] {
        assert_eq!(app.pop("queue/q0", &format!("consumerGroup={group}")).await.status, StatusCode::OK);
    }
    let seek = post(&app.http, &app.base, "/api/v1/consumer-groups/g6/queues/q0/seek", json!({"toEnd": true})).await;
    assert_eq!(seek.0.status, StatusCode::OK, "{seek:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 7);
    assert_eq!(app.count("SELECT count(*) FROM queen.partitions").await, 60);
    let waits = (0..5).map(|_| app.pop("queue/idle", "wait=true&timeout=1500"));
    let parked = async {
        until_parked(&app, 5).await;
    };
    let (answers, ()) = futures::join!(futures::future::join_all(waits), parked);
    assert!(answers.iter().all(|a| a.status == StatusCode::NO_CONTENT), "{answers:?}");
}

/// Races `a` and `b` (one request each, sent at once); the statuses, in that order.
async fn race(
    a: impl Future<Output = (Answer, Option<String>)>,
    b: impl Future<Output = (Answer, Option<String>)>,
) -> [StatusCode; 2] {
    let ((a, _), (b, _)) = futures::join!(a, b);
    for answer in [&a, &b] {
        assert!(matches!(answer.status.as_u16(), 200 | 201 | 409), "{answer:?}");
    }
    [a.status, b.status]
}

fn one_won(statuses: [StatusCode; 2]) -> bool {
    statuses.iter().filter(|s| **s == StatusCode::CONFLICT).count() == 1
}

#[actix_web::test]
async fn two_brokers_racing_for_the_last_queue_place_let_exactly_one_create_it() {
    let limits = |config: &mut queen_broker::config::Config| config.limits.max_queues = 3;
    let app = TestApp::spawn_with(limits).await;
    let other = TestApp::spawn_on(&app.db, limits).await;
    app.push(json!([item("base-1", "p", "a"), item("base-2", "p", "b")])).await;
    for round in 0..10 {
        let (a, b) = (format!("race-{round}-a"), format!("race-{round}-b"));
        let statuses = race(
            post(&app.http, &app.base, "/api/v1/push", json!({"items": [item(&a, "p", &a)]})),
            post(&app.http, &other, "/api/v1/push", json!({"items": [item(&b, "p", &b)]})),
        )
        .await;
        assert!(one_won(statuses), "round {round}: {statuses:?}");
        assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 3, "round {round}");
        let winner = if statuses[0] == StatusCode::CREATED { &a } else { &b };
        assert_eq!(app.delete(&format!("/api/v1/resources/queues/{winner}")).await.status, StatusCode::OK);
    }
    // A configure and a push race the same way.
    let statuses = race(
        post(&app.http, &app.base, "/api/v1/configure", json!({"queue": "by-configure", "options": {}})),
        post(&app.http, &other, "/api/v1/push", json!({"items": [item("by-push", "p", "x")]})),
    )
    .await;
    assert!(one_won(statuses), "{statuses:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 3);
}

#[actix_web::test]
async fn two_brokers_racing_for_the_last_partition_or_group_place_let_exactly_one_take_it() {
    let limits = |config: &mut queen_broker::config::Config| {
        config.limits.max_partitions_per_queue = 2;
        config.limits.max_groups_per_queue = 2;
    };
    let app = TestApp::spawn_with(limits).await;
    let other = TestApp::spawn_on(&app.db, limits).await;
    for round in 0..8 {
        let queue = format!("r{round}");
        app.push_one(&queue, "p0", &format!("{queue}-0"), json!(0)).await;
        let statuses = race(
            post(&app.http, &app.base, "/api/v1/push", json!({"items": [item(&queue, "a", &format!("{queue}-a"))]})),
            post(&app.http, &other, "/api/v1/push", json!({"items": [item(&queue, "b", &format!("{queue}-b"))]})),
        )
        .await;
        assert!(one_won(statuses), "round {round}, partitions: {statuses:?}");
        let partitions = format!(
            "SELECT count(*) FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = '{queue}'"
        );
        assert_eq!(app.count(&partitions).await, 2);

        assert_eq!(app.pop(&format!("queue/{queue}"), "consumerGroup=g0").await.status, StatusCode::OK);
        let statuses = race(
            get(&app.http, &app.base, &format!("/api/v1/pop/queue/{queue}?consumerGroup=ga")),
            get(&app.http, &other, &format!("/api/v1/pop/queue/{queue}?consumerGroup=gb")),
        )
        .await;
        assert!(one_won(statuses), "round {round}, groups: {statuses:?}");
        let groups = format!("SELECT count(*) FROM queen.consumer_groups_metadata WHERE queue_name = '{queue}'");
        assert_eq!(app.count(&groups).await, 2);
    }
}

/// A long poll on a queue nobody pushes to, from the test's client, with `X-Forwarded-For` when
/// given; its status and `Retry-After`.
async fn long_poll(app: &TestApp, timeout_ms: u64, forwarded_for: Option<&str>) -> (Answer, Option<String>) {
    let mut request = app.http.get(app.url(&format!("/api/v1/pop/queue/idle?wait=true&timeout={timeout_ms}")));
    if let Some(address) = forwarded_for {
        request = request.header("X-Forwarded-For", address);
    }
    answered(request.send().await).await
}

fn assert_client_refused(answer: &(Answer, Option<String>)) {
    let (answer, retry_after) = answer;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS, "{answer:?}");
    assert_eq!(answer.body["code"], "overloaded", "{answer:?}");
    assert!(answer.body["error"].as_str().is_some_and(|e| e.contains("this client address")), "{answer:?}");
    assert_eq!(retry_after.as_deref(), Some("1"), "a place comes free when a poll ends");
}

#[actix_web::test]
async fn one_client_parks_at_most_its_long_polls_and_a_poll_that_ends_frees_its_place() {
    let app = TestApp::spawn_with(|config| config.limits.long_polls_per_client = 3).await;
    let refusals = r#"queen_overload_refusals_total{bound="client_long_polls"}"#;
    let short = long_poll(&app, 1000, None);
    let long = futures::future::join(long_poll(&app, 6000, None), long_poll(&app, 6000, None));
    let checks = async {
        until_parked(&app, 3).await;
        // Past its place: refused at once, whatever the client says it forwards for.
        assert_client_refused(&long_poll(&app, 6000, None).await);
        assert_client_refused(&long_poll(&app, 6000, Some("203.0.113.9")).await);
        assert_eq!(app.metric(refusals).await, 2.0);
        // A pop that does not park is not refused: one that waits for nothing, one that finds a
        // message at once.
        assert_eq!(app.pop("queue/idle", "wait=false").await.status, StatusCode::NO_CONTENT);
        app.push_one("busy", "p", "m", json!(1)).await;
        assert_eq!(app.pop("queue/busy", "wait=true&timeout=6000").await.status, StatusCode::OK);
        // The short poll ends at its timeout and gives its place back.
        let deadline = Instant::now() + Duration::from_secs(4);
        loop {
            let answer = long_poll(&app, 1500, None).await;
            if answer.0.status == StatusCode::NO_CONTENT {
                break;
            }
            assert_client_refused(&answer);
            assert!(Instant::now() < deadline, "the place of the poll that ended was never given back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (short, _, ()) = futures::join!(short, long, checks);
    assert_eq!(short.0.status, StatusCode::NO_CONTENT);

    // A poll whose client went away keeps its place until the broker answers it, at its timeout
    // (actix-http drops a handler only when it reads or writes the connection: actix-web #1313),
    // and then gives it back.
    let gone =
        app.http.get(app.url("/api/v1/pop/queue/idle?wait=true&timeout=1500")).timeout(Duration::from_millis(300));
    let polls = futures::future::join(long_poll(&app, 8000, None), long_poll(&app, 8000, None));
    let after = async {
        until_parked(&app, 2).await;
        assert!(gone.send().await.is_err(), "the client gave up");
        assert_client_refused(&long_poll(&app, 500, None).await);
        // Well before the other two polls end and give their places back.
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut parked_again = long_poll(&app, 500, None).await;
        while parked_again.0.status != StatusCode::NO_CONTENT {
            assert_client_refused(&parked_again);
            assert!(Instant::now() < deadline, "the place of the poll whose client went away was never given back");
            tokio::time::sleep(Duration::from_millis(50)).await;
            parked_again = long_poll(&app, 500, None).await;
        }
    };
    let (polls, ()) = futures::join!(polls, after);
    assert_eq!((polls.0.0.status, polls.1.0.status), (StatusCode::NO_CONTENT, StatusCode::NO_CONTENT));
}

#[actix_web::test]
async fn behind_a_trusted_proxy_each_forwarded_address_is_a_client_of_its_own() {
    let app = TestApp::spawn_with(|config| {
        config.limits.long_polls_per_client = 1;
        config.limits.trust_forwarded_for = true;
    })
    .await;
    // The proxy appends the address it saw; what comes before is the client's own claim.
    let polls = futures::future::join(
        long_poll(&app, 3000, Some("203.0.113.1")),
        long_poll(&app, 3000, Some("198.51.100.7, 203.0.113.2")),
    );
    let checks = async {
        until_parked(&app, 2).await;
        assert_client_refused(&long_poll(&app, 3000, Some("198.51.100.8, 203.0.113.1")).await);
        assert_client_refused(&long_poll(&app, 3000, Some("203.0.113.2")).await);
    };
    let (polls, ()) = futures::join!(polls, checks);
    assert_eq!((polls.0.0.status, polls.1.0.status), (StatusCode::NO_CONTENT, StatusCode::NO_CONTENT));
}

#[actix_web::test]
async fn pushes_buffered_during_push_maintenance_are_replayed_even_past_a_limit() {
    let app = TestApp::spawn_with(|config| config.limits.max_queues = 1).await;
    app.push_one("kept", "p", "a", json!(1)).await;
    let app = &app;
    let switch =
        |enabled: bool| async move { app.post("/api/v1/system/maintenance", &json!({ "enabled": enabled })).await };
    assert_eq!(switch(true).await.status, StatusCode::OK);
    // Accepted into the journal without the database: answered, so it must reach the log.
    let buffered = app.push_one("late", "p", "b", json!(2)).await;
    assert_eq!(buffered["status"], "buffered", "{buffered:?}");
    assert_eq!(switch(false).await.status, StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(20);
    while messages_with(app, &["b"]).await == 0 {
        assert!(Instant::now() < deadline, "the buffered push was never replayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 2, "created past the limit, with a warning");
    // Producers' pushes are refused as before.
    let full = "queue limit reached: the fleet holds 2 queues (limits.max_queues = 1)";
    assert_limit(&push(app, vec![item("third", "p", "c")]).await, "limits.max_queues", full);
}
