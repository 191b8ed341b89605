//! `GET /api/v1/resources/queues/{queue}/depth`: a group's backlog per partition, what a lease
//! holds of it, what could be served now, and how a conflating group's backlog reads.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

/// The depth of `queue` with `query`, insisting on a 200.
async fn depth(app: &TestApp, queue: &str, query: &str) -> Value {
    let answer = app.get(&format!("/api/v1/resources/queues/{queue}/depth{query}")).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    answer.body
}

/// `(partition, pending, processing, ready)` of every listed partition.
fn per_partition(depth: &Value) -> Vec<(String, i64, i64, i64)> {
    depth["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| {
            let number = |key: &str| p[key].as_i64().unwrap_or_else(|| panic!("{key} in {p}"));
            (
                p["partition"].as_str().expect("partition").to_owned(),
                number("pending"),
                number("processing"),
                number("ready"),
            )
        })
        .collect()
}

/// `(pending, partitionsPending, processing, ready, partitionsReady)`.
fn totals(depth: &Value) -> (i64, i64, i64, i64, i64) {
    let number = |key: &str| depth[key].as_i64().unwrap_or_else(|| panic!("{key} in {depth}"));
    (number("pending"), number("partitionsPending"), number("processing"), number("ready"), number("partitionsReady"))
}

fn items(queue: &str, partition: &str, ids: &[&str]) -> Value {
    ids.iter().map(|id| json!({"queue": queue, "partition": partition, "transactionId": id, "payload": id})).collect()
}

#[actix_web::test]
async fn each_group_has_its_own_backlog_per_partition_and_a_never_seen_group_counts_from_its_start() {
    let app = TestApp::spawn().await;
    app.push(items("orders", "p1", &["a1", "a2", "a3"])).await;
    app.push(items("orders", "p2", &["b1", "b2"])).await;
    // `done` reads p1 to the end.
    let read = app.pop("queue/orders/partition/p1", "batch=10&consumerGroup=done").await.messages();
    app.ack_all(&read, "completed", Some("done")).await;
    // `late` registers for new messages only, before b3 is pushed.
    let nothing = app.pop("queue/orders", "batch=10&consumerGroup=late&subscriptionMode=new").await;
    assert_eq!(nothing.status, StatusCode::NO_CONTENT, "{nothing:?}");
    app.push(items("orders", "p2", &["b3"])).await;
    // `holder` holds b1 and b2 under a lease.
    let held = app.pop("queue/orders/partition/p2", "batch=2&consumerGroup=holder").await.messages();
    assert_eq!(held.len(), 2);

    let queue_mode = depth(&app, "orders", "").await;
    assert_eq!(queue_mode["queue"], "orders");
    assert_eq!(queue_mode["group"], "__QUEUE_MODE__");
    assert_eq!(queue_mode["conflation"], false);
    assert_eq!(per_partition(&queue_mode), vec![("p1".into(), 3, 0, 3), ("p2".into(), 3, 0, 3)]);
    assert_eq!(totals(&queue_mode), (6, 2, 0, 6, 2));
    assert_eq!((queue_mode["effectivePending"].clone(), queue_mode["effectiveReady"].clone()), (json!(6), json!(6)));
    assert_eq!(queue_mode["totalPartitions"], 2);
    assert_eq!(depth(&app, "orders", "?group=__QUEUE_MODE__").await, queue_mode, "the same group by name");

    let done = depth(&app, "orders", "?group=done").await;
    assert_eq!(done["group"], "done");
    assert_eq!(per_partition(&done), vec![("p1".into(), 0, 0, 0), ("p2".into(), 3, 0, 3)], "p2 from the oldest");
    assert_eq!(totals(&done), (3, 1, 0, 3, 1));

    let late = depth(&app, "orders", "?group=late").await;
    assert_eq!(per_partition(&late), vec![("p1".into(), 0, 0, 0), ("p2".into(), 1, 0, 1)], "only what came after");

    let ghost = depth(&app, "orders", "?group=ghost").await;
    assert_eq!(per_partition(&ghost), vec![("p1".into(), 3, 0, 3), ("p2".into(), 3, 0, 3)]);

    // b3 is not ready: the group's next pop cannot take p2 while the lease holds it.
    let holder = depth(&app, "orders", "?group=holder").await;
    assert_eq!(per_partition(&holder), vec![("p1".into(), 3, 0, 3), ("p2".into(), 3, 2, 0)]);
    assert_eq!(totals(&holder), (6, 2, 2, 3, 1));
    let next = app.pop("queue/orders/partition/p2", "batch=10&consumerGroup=holder&wait=false").await;
    assert_eq!(next.status, StatusCode::NO_CONTENT, "nothing servable, as depth says: {next:?}");
    assert!(holder["partitions"][1]["partitionId"].as_str().is_some_and(|id| id.parse::<i64>().is_ok()));

    // Acknowledging the leased messages leaves b3, ready.
    app.ack_all(&held, "completed", Some("holder")).await;
    let holder = depth(&app, "orders", "?group=holder").await;
    assert_eq!(per_partition(&holder)[1], ("p2".into(), 1, 0, 1));
}

#[actix_web::test]
async fn a_conflating_group_owes_one_delivery_per_partition_with_a_backlog() {
    let app = TestApp::spawn().await;
    app.push(items("prices", "eur", &["e1", "e2", "e3"])).await;
    app.push(items("prices", "usd", &["u1", "u2"])).await;
    // The group registers as conflating, starting after what is there.
    let nothing = app.pop("queue/prices", "batch=1&consumerGroup=latest&subscriptionMode=new&conflation=true").await;
    assert_eq!((nothing.messages().len(), &nothing.body["conflation"]), (0, &json!(true)), "{nothing:?}");
    app.push(items("prices", "eur", &["e4", "e5"])).await;
    app.push(items("prices", "usd", &["u3"])).await;

    let latest = depth(&app, "prices", "?group=latest").await;
    assert_eq!(latest["conflation"], true);
    assert_eq!(totals(&latest), (3, 2, 0, 3, 2));
    assert_eq!((latest["effectivePending"].clone(), latest["effectiveReady"].clone()), (json!(2), json!(2)));
    // Queue mode never conflates.
    let queue_mode = depth(&app, "prices", "").await;
    assert_eq!(queue_mode["conflation"], false);
    assert_eq!(queue_mode["effectivePending"], 8);
}

#[actix_web::test]
async fn what_the_queues_rules_hold_back_is_pending_but_not_ready() {
    let app = TestApp::spawn().await;
    app.configure("delayed", json!({"delayedProcessing": 3600})).await;
    app.push(items("delayed", "p", &["d1", "d2"])).await;
    assert_eq!(totals(&depth(&app, "delayed", "").await), (2, 1, 0, 0, 0));
    app.configure("delayed", json!({"delayedProcessing": 0})).await;
    assert_eq!(totals(&depth(&app, "delayed", "").await), (2, 1, 0, 2, 1), "the rule is read at once");

    app.configure("windowed", json!({"windowBuffer": 3600})).await;
    app.push(items("windowed", "p", &["w1"])).await;
    assert_eq!(totals(&depth(&app, "windowed", "").await), (1, 1, 0, 0, 0));

    app.configure("patient", json!({"retryDelay": 600000, "retryLimit": 5})).await;
    app.push(items("patient", "failing", &["f1", "f2"])).await;
    app.push(items("patient", "fine", &["ok"])).await;
    let first = app.pop("queue/patient/partition/failing", "batch=1").await.messages();
    assert_eq!(app.ack_all(&first, "failed", None).await[0]["success"], true);
    let patient = depth(&app, "patient", "").await;
    assert_eq!(per_partition(&patient), vec![("failing".into(), 2, 0, 0), ("fine".into(), 1, 0, 1)]);
}

#[actix_web::test]
async fn partitions_are_paged_by_name_and_the_totals_cover_them_all() {
    let app = TestApp::spawn().await;
    for (partition, id) in [("c", "3"), ("a", "1"), ("b", "2")] {
        app.push(items("paged", partition, &[id])).await;
    }
    let page = depth(&app, "paged", "?limit=1&offset=1").await;
    assert_eq!(per_partition(&page), vec![("b".into(), 1, 0, 1)]);
    assert_eq!(totals(&page), (3, 3, 0, 3, 3));
    assert_eq!(
        (page["totalPartitions"].clone(), page["limit"].clone(), page["offset"].clone()),
        (json!(3), json!(1), json!(1))
    );
    let past = depth(&app, "paged", "?offset=10").await;
    assert_eq!((per_partition(&past).len(), past["pending"].clone()), (0, json!(3)));

    app.configure("empty", json!({})).await;
    let empty = depth(&app, "empty", "").await;
    assert_eq!((totals(&empty), empty["totalPartitions"].clone()), ((0, 0, 0, 0, 0), json!(0)));
    assert_eq!(empty["partitions"], json!([]));
}

#[actix_web::test]
async fn an_unknown_queue_is_a_404_and_bad_parameters_are_400s() {
    let app = TestApp::spawn().await;
    app.push(items("known", "p", &["1"])).await;
    let missing = app.get("/api/v1/resources/queues/unknown/depth").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{missing:?}");
    for (query, mentions) in
        [("?group=a%2Fb", "group"), ("?limit=0", "limit"), ("?offset=x", "offset"), ("?grop=g", "grop")]
    {
        let answer = app.get(&format!("/api/v1/resources/queues/known/depth{query}")).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        let error = answer.body["error"].as_str().expect("an error");
        assert!(error.contains(mentions), "{error:?} does not mention {mentions:?}");
    }
}
