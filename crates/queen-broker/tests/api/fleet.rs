//! Several brokers over one database behave as one broker: any broker takes any call, pushes
//! from two brokers keep offsets dense, group resets reach every broker, and candidates come from
//! the views instead of scans.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp};

/// Another broker on the app's database, and a way to talk to it.
struct Other {
    base: String,
    http: reqwest::Client,
}

impl Other {
    async fn start(app: &TestApp) -> Other {
        Other {
            base: TestApp::spawn_on(&app.db, |_| {}).await,
            http: queen_testkit::http().build().expect("an HTTP client"),
        }
    }

    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let answer = self.http.post(format!("{}{path}", self.base)).json(body).send().await.expect("POST");
        let status = answer.status();
        (status, answer.json().await.unwrap_or(Value::Null))
    }
}

#[actix_web::test]
async fn a_lease_granted_by_one_broker_is_honoured_by_another() {
    let app = TestApp::spawn().await;
    let other = Other::start(&app).await;
    app.push(json!([{"queue": "anywhere", "partition": "p", "transactionId": "a", "payload": 1},
                    {"queue": "anywhere", "partition": "p", "transactionId": "b", "payload": 2},
                    {"queue": "anywhere", "partition": "p", "transactionId": "c", "payload": 3}]))
        .await;
    let messages = app.pop("queue/anywhere", "batch=3&consumerGroup=g").await.messages();
    let lease = messages[0]["leaseId"].as_str().expect("lease");

    let (status, extended) = other.post(&format!("/api/v1/lease/{lease}/extend"), &json!({})).await;
    assert_eq!((status, &extended["success"]), (StatusCode::OK, &json!(true)), "extension on the other broker");
    let ack = json!({"transactionId": "a", "partitionId": messages[0]["partitionId"], "leaseId": lease, "consumerGroup": "g"});
    let (_, acked) = other.post("/api/v1/ack", &ack).await;
    assert_eq!(acked[0]["success"], true, "ack on the other broker: {acked}");
    let bundle = json!({"operations": [{"type": "ack", "transactionId": "b", "partitionId": messages[1]["partitionId"],
                                         "leaseId": lease, "consumerGroup": "g"}]});
    let (status, committed) = other.post("/api/v1/transaction", &bundle).await;
    assert_eq!((status, &committed["success"]), (StatusCode::OK, &json!(true)), "transaction on the other broker");
    let (status, sought) = other.post("/api/v1/consumer-groups/g/queues/anywhere/seek", &json!({"toEnd": true})).await;
    assert_eq!((status, &sought["success"]), (StatusCode::OK, &json!(true)));
    let (_, late) = other
        .post(
            "/api/v1/ack",
            &json!({"transactionId": "c", "partitionId": messages[2]["partitionId"],
                                                        "leaseId": lease, "consumerGroup": "g"}),
        )
        .await;
    assert_eq!(late[0]["success"], false, "the seek, made elsewhere, abandoned c's batch: {late}");
    assert!(late[0]["error"].as_str().is_some_and(|e| e.contains("expired lease")), "{late}");
}

#[actix_web::test]
async fn two_brokers_pushing_to_one_partition_keep_offsets_dense() {
    const PUSHES: usize = 200;
    let app = TestApp::spawn().await;
    let other = Other::start(&app).await;
    let pushes = (0..PUSHES).map(|i| {
        let body =
            json!({"items": [{"queue": "shared", "partition": "p", "transactionId": format!("t{i}"), "payload": i}]});
        let (app, other) = (&app, &other);
        async move {
            if i % 2 == 0 {
                app.post("/api/v1/push", &body).await.body
            } else {
                other.post("/api/v1/push", &body).await.1
            }
        }
    });
    let answers = join_all(pushes).await;
    let offsets: BTreeSet<i64> = answers.iter().map(|a| a[0]["offset"].as_i64().expect("an offset")).collect();
    assert_eq!(offsets, (1..=PUSHES as i64).collect(), "offsets 1..N, none twice, none skipped");
    assert!(answers.iter().all(|a| a[0]["status"] == "queued"));
    let stored: Vec<i64> = app
        .db
        .connect()
        .await
        .query("SELECT message_offset FROM queen.log_message_ids ORDER BY 1", &[])
        .await
        .expect("ids")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(stored, (1..=PUSHES as i64).collect::<Vec<_>>());
}

/// Pops on `app` until a message comes, within 5 s.
async fn pop_until_delivered(app: &TestApp, route: &str, query: &str) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let answer = app.pop(route, &format!("{query}&wait=true&timeout=200")).await;
        if answer.status == StatusCode::OK || Instant::now() > deadline {
            return answer;
        }
    }
}

#[actix_web::test]
async fn a_seek_on_one_broker_clears_the_emptiness_every_broker_knew() {
    let app = TestApp::spawn().await;
    let other = Other::start(&app).await;
    app.push(json!([{"queue": "rewind", "transactionId": "x", "payload": 1}])).await;
    let messages = app.pop("queue/rewind", "batch=10&consumerGroup=g").await.messages();
    app.ack_all(&messages, "completed", Some("g")).await;
    // `app` now knows the group has nothing left on the queue.
    assert_eq!(app.pop("queue/rewind", "consumerGroup=g").await.status, StatusCode::NO_CONTENT);
    let (status, _) =
        other.post("/api/v1/consumer-groups/g/queues/rewind/seek", &json!({"timestamp": "2001-01-01T00:00:00Z"})).await;
    assert_eq!(status, StatusCode::OK);
    let again = pop_until_delivered(&app, "queue/rewind", "batch=10&consumerGroup=g").await;
    assert_eq!(again.transaction_ids(), vec!["x"], "the seek made elsewhere is seen here");
}

/// A group deleted on one broker starts over on every broker: one that had seen its registration
/// (conflating, here) forgets it, so a group of the same name is registered afresh on its first
/// pop rather than served as the old one was.
#[actix_web::test]
async fn a_group_deleted_on_one_broker_starts_over_on_another() {
    let app = TestApp::spawn().await;
    let other = Other::start(&app).await;
    app.push_one("reborn", "p", "old", json!(0)).await;
    let old = app.pop("queue/reborn", "batch=10&consumerGroup=g&conflation=true").await.messages();
    app.ack_all(&old, "completed", Some("g")).await;

    let notices = app.metric("queen_notices_received_total").await;
    let deleted = other.http.delete(format!("{}/api/v1/consumer-groups/g?deleteMetadata=true", other.base));
    assert_eq!(deleted.send().await.expect("DELETE").status(), StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(5);
    while app.metric("queen_notices_received_total").await <= notices {
        assert!(Instant::now() < deadline, "the deletion never reached this broker");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for id in ["a", "b", "c"] {
        app.push_one("reborn", "p", id, json!(1)).await;
    }
    let fresh = app.pop("queue/reborn", "batch=10&consumerGroup=g").await;
    assert_eq!(fresh.transaction_ids(), vec!["old", "a", "b", "c"], "a new group, not conflating: {fresh:?}");
}

#[actix_web::test]
async fn planned_from_views_pops_find_pushed_partitions_without_scanning_the_queue() {
    const PARTITIONS: i64 = 10_000;
    let app = TestApp::spawn().await;
    // A queue with ten thousand partitions, all drained.
    app.db
        .connect()
        .await
        .batch_execute(&format!(
            "INSERT INTO queen.queues (name) VALUES ('wide');
             INSERT INTO queen.partitions (queue_id, name)
                  SELECT q.id, 'p' || g FROM queen.queues q, generate_series(1, {PARTITIONS}) g;
             INSERT INTO queen.partition_names (queue_id, name, partition_id)
                  SELECT queue_id, name, id FROM queen.partitions;"
        ))
        .await
        .expect("partitions");
    let full = "queen_pop_candidate_plans_total{kind=\"full\"}";
    // The group's first pop scans once; after that, pushes to a few partitions are found through
    // the view.
    assert_eq!(app.pop("queue/wide", "consumerGroup=g").await.status, StatusCode::NO_CONTENT);
    let scans = app.metric(full).await;
    let mut delivered = 0;
    for round in 0..20 {
        app.push(json!([{"queue": "wide", "partition": format!("p{}", round % 3 + 1), "payload": round}])).await;
        let answer = pop_until_delivered(&app, "queue/wide", "batch=10&consumerGroup=g").await;
        delivered += answer.messages().len();
        app.ack_all(&answer.messages(), "completed", Some("g")).await;
    }
    assert_eq!(delivered, 20);
    assert_eq!(app.metric(full).await, scans, "no pop scanned the queue's partitions again");
    assert!(app.metric("queen_pop_candidate_plans_total{kind=\"candidates\"}").await >= 20.0);
}

/// Pushes `ids` to partition `p` of `queue` in one call.
async fn push_ids(app: &TestApp, queue: &str, ids: &[&str]) {
    let items: Vec<Value> =
        ids.iter().map(|id| json!({"queue": queue, "partition": "p", "transactionId": id, "payload": id})).collect();
    app.push(Value::Array(items)).await;
}

/// Gives group `g` a view of `queue` with nothing in it: its first pop scans and makes the view,
/// and the next finds the acked partition empty.
async fn make_an_empty_view(app: &TestApp, queue: &str) {
    push_ids(app, queue, &["a"]).await;
    let route = format!("queue/{queue}");
    let first = app.pop(&route, "batch=10&consumerGroup=g").await;
    assert_eq!(first.transaction_ids(), vec!["a"]);
    app.ack_all(&first.messages(), "completed", Some("g")).await;
    assert_eq!(app.pop(&route, "consumerGroup=g").await.status, StatusCode::NO_CONTENT);
}

/// How the group's pops have planned so far: (candidate checks, skipped looks).
async fn plans(app: &TestApp) -> (f64, f64) {
    let candidates = app.metric("queen_pop_candidate_plans_total{kind=\"candidates\"}").await;
    (candidates, app.metric("queen_pop_candidate_plans_total{kind=\"skipped\"}").await)
}

#[actix_web::test]
async fn a_pop_after_an_ack_of_everything_a_partition_had_does_not_look_there_again() {
    let app = TestApp::spawn().await;
    make_an_empty_view(&app, "drained").await;

    // A pop that takes all of it, acked: the next pop knows without a query.
    push_ids(&app, "drained", &["b", "c"]).await;
    let all = app.pop("queue/drained", "batch=10&consumerGroup=g").await;
    assert_eq!(all.transaction_ids(), vec!["b", "c"]);
    app.ack_all(&all.messages(), "completed", Some("g")).await;
    let (checks, skipped) = plans(&app).await;
    assert_eq!(app.pop("queue/drained", "consumerGroup=g").await.status, StatusCode::NO_CONTENT);
    assert_eq!(plans(&app).await, (checks, skipped + 1.0), "the next pop looked nowhere");

    // Committed at delivery, the same.
    push_ids(&app, "drained", &["d"]).await;
    let auto = app.pop("queue/drained", "batch=10&consumerGroup=g&autoAck=true").await;
    assert_eq!(auto.transaction_ids(), vec!["d"]);
    let (checks, skipped) = plans(&app).await;
    assert_eq!(app.pop("queue/drained", "consumerGroup=g").await.status, StatusCode::NO_CONTENT);
    assert_eq!(plans(&app).await, (checks, skipped + 1.0), "the next pop looked nowhere");

    // What a pop leaves behind (its batch was full, or its ack failed) is still found at once.
    push_ids(&app, "drained", &["e", "f"]).await;
    let part = app.pop("queue/drained", "batch=1&consumerGroup=g").await;
    assert_eq!(part.transaction_ids(), vec!["e"]);
    app.ack_all(&part.messages(), "completed", Some("g")).await;
    let rest = app.pop("queue/drained", "batch=10&consumerGroup=g").await;
    assert_eq!(rest.transaction_ids(), vec!["f"]);
    app.ack_all(&rest.messages(), "failed", Some("g")).await;
    let again = app.pop("queue/drained", "batch=10&consumerGroup=g").await;
    assert_eq!(again.transaction_ids(), vec!["f"], "the failed message is delivered again");
}

#[actix_web::test]
async fn a_push_between_a_pop_and_its_ack_is_found_by_the_next_pop() {
    let app = TestApp::spawn().await;
    make_an_empty_view(&app, "raced").await;

    push_ids(&app, "raced", &["b"]).await;
    let popped = app.pop("queue/raced", "batch=10&consumerGroup=g").await;
    assert_eq!(popped.transaction_ids(), vec!["b"]);
    // Pushed after the pop took the partition's end, before the ack reached it.
    push_ids(&app, "raced", &["c"]).await;
    app.ack_all(&popped.messages(), "completed", Some("g")).await;
    let next = app.pop("queue/raced", "batch=10&consumerGroup=g").await;
    assert_eq!(next.transaction_ids(), vec!["c"], "the ack did not hide the later push");
}

#[actix_web::test]
async fn an_ack_naming_another_groups_lease_leaves_that_group_its_redelivery() {
    let app = TestApp::spawn().await;
    app.post("/api/v1/configure", &json!({"queue": "mixed", "options": {"leaseTime": 1}})).await;
    make_an_empty_view(&app, "mixed").await;
    push_ids(&app, "mixed", &["b"]).await;
    let leased = app.pop("queue/mixed", "batch=10&consumerGroup=g").await;
    assert_eq!(leased.transaction_ids(), vec!["b"]);
    // Group h has read everything, and acks g's delivery under its own name.
    let read = app.pop("queue/mixed", "batch=10&consumerGroup=h").await;
    assert_eq!(read.transaction_ids(), vec!["a", "b"]);
    app.ack_all(&read.messages(), "completed", Some("h")).await;
    app.ack_all(&leased.messages(), "completed", Some("h")).await;
    // g never acked: its lease runs out and a waiting consumer of g gets the message again.
    let again = app.pop("queue/mixed", "batch=10&consumerGroup=g&wait=true&timeout=5000").await;
    assert_eq!(again.transaction_ids(), vec!["b"], "redelivered to g once its lease ran out");
}

#[actix_web::test]
async fn a_pop_looks_past_candidates_that_are_all_leased() {
    let app = TestApp::spawn().await;
    let items: Vec<Value> =
        (1..=20).map(|i| json!({"queue": "busy", "partition": format!("p{i:02}"), "payload": i})).collect();
    app.push(Value::Array(items)).await;
    // One consumer leases sixteen partitions, as many as a one-partition pop checks at a time.
    let first = app.pop("queue/busy", "batch=16&partitions=16&consumerGroup=g").await.messages();
    assert_eq!(first.len(), 16);
    // Every other consumer of the group still gets the four free ones, one each, without waiting.
    let mut rest = BTreeSet::new();
    for _ in 0..4 {
        let answer = app.pop("queue/busy", "batch=1&partitions=1&consumerGroup=g").await;
        assert_eq!(answer.status, StatusCode::OK, "a free partition was left: {:?}", answer.body);
        rest.insert(answer.messages()[0]["partition"].as_str().expect("partition").to_owned());
    }
    assert_eq!(rest.len(), 4, "four different partitions");
    assert_eq!(app.pop("queue/busy", "batch=1&partitions=1&consumerGroup=g").await.status, StatusCode::NO_CONTENT);
}

#[actix_web::test]
async fn without_views_every_pop_scans_unless_the_queue_was_found_empty() {
    let app = TestApp::spawn_with(|config| config.pop.plan_from_views = false).await;
    app.push(json!([{"queue": "cold", "payload": 1}, {"queue": "cold", "payload": 2}])).await;
    let full = "queen_pop_candidate_plans_total{kind=\"full\"}";
    for _ in 0..2 {
        let messages = app.pop("queue/cold", "batch=1&consumerGroup=g").await.messages();
        app.ack_all(&messages, "completed", Some("g")).await;
    }
    assert_eq!(app.metric(full).await, 2.0, "both pops scanned");
    assert_eq!(app.pop("queue/cold", "consumerGroup=g").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.pop("queue/cold", "consumerGroup=g").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.metric(full).await, 3.0, "the empty scan fences the next pop");
    assert_eq!(app.metric("queen_pop_candidate_plans_total{kind=\"skipped\"}").await, 1.0);
    app.push(json!([{"queue": "cold", "payload": 3}])).await;
    let after_push = pop_until_delivered(&app, "queue/cold", "batch=1&consumerGroup=g").await;
    assert_eq!(after_push.messages().len(), 1, "a push lifts the fence");
}

#[actix_web::test]
async fn a_broker_that_lost_its_listen_connection_misses_no_message() {
    let app = TestApp::spawn().await;
    let other = Other::start(&app).await;
    // The group's view of the queue on `app`: empty.
    assert_eq!(app.pop("queue/missed", "consumerGroup=g").await.status, StatusCode::NO_CONTENT);
    let listeners = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'queen-listen'";
    let waiting = app.pop("queue/missed", "consumerGroup=g&wait=true&timeout=10000");
    let cut_and_push = async {
        crate::long_poll::until_parked(&app, 1).await;
        let killed = app
            .count(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name = 'queen-listen') killed",
            )
            .await;
        assert!(killed >= 1, "the brokers' LISTEN connections were cut");
        // Pushed through the other broker: its notice is sent while `app` is not listening.
        let (status, _) = other
            .post(
                "/api/v1/push",
                &json!({"items": [{"queue": "missed", "partition": "p", "transactionId": "late", "payload": 1}]}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED);
    };
    let started = Instant::now();
    let (answer, ()) = futures::join!(waiting, cut_and_push);
    assert_eq!(answer.transaction_ids(), vec!["late"], "found after reconnecting, not lost");
    assert!(started.elapsed() < Duration::from_secs(10), "found before the long poll's timeout");
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.count(listeners).await < 2 {
        assert!(Instant::now() < deadline, "the brokers did not listen again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A heartbeat that runs as a broker leaves (its timer fired, or its statement was under way)
/// does not turn the stopped broker back into a live one, which would then read as missing; a
/// broker id seen again with another start time is a new broker.
#[actix_web::test]
async fn a_heartbeat_after_a_broker_left_keeps_it_stopped() {
    use queen_store::fleet::{self, BrokerState, Heartbeat};
    let app = TestApp::spawn().await;
    let client = app.store_connection("fleet-test").await;
    let started_at = chrono::Utc::now() - chrono::Duration::seconds(60);
    let beat = |started_at| Heartbeat {
        broker_id: "host:6632:1",
        version: "test",
        started_at,
        stopping: false,
        buffered_messages: 0,
        buffer_healthy: true,
        traffic: Default::default(),
        usage: Default::default(),
    };
    let state = async || {
        let seen = fleet::brokers(&client, 10.0, 3600.0).await.expect("the brokers");
        seen.into_iter().find(|b| b.id == "host:6632:1").map(|b| b.state)
    };
    fleet::beat(&client, &beat(started_at)).await.expect("a beat");
    assert_eq!(state().await, Some(BrokerState::Live));
    fleet::leave(&client, "host:6632:1").await.expect("leave");
    fleet::beat(&client, &beat(started_at)).await.expect("a late beat");
    assert_eq!(state().await, Some(BrokerState::Stopped), "a late beat of the same broker");
    fleet::beat(&client, &beat(chrono::Utc::now())).await.expect("a restarted broker's beat");
    assert_eq!(state().await, Some(BrokerState::Live), "the same id started again");
}
