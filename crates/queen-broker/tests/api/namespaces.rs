//! `GET /api/v1/pop?namespace=&task=`: a pop over every queue of a namespace and/or task, with a
//! queue-wide pop's lease, group, wait and batch semantics, serving higher-priority queues first.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{Answer, TestApp};
use crate::long_poll::push_once_parked;

async fn configure_in(app: &TestApp, queue: &str, namespace: &str, task: &str, priority: i64) {
    let body = json!({"queue": queue, "namespace": namespace, "task": task, "options": {"priority": priority}});
    let answer = app.post("/api/v1/configure", &body).await;
    assert_eq!(answer.body["configured"], true, "{answer:?}");
}

fn queues_of(answer: &Answer) -> Vec<String> {
    answer.messages().iter().map(|m| m["queue"].as_str().unwrap_or_default().to_owned()).collect()
}

#[actix_web::test]
async fn a_namespace_pop_takes_from_every_matching_queue_under_one_lease() {
    let app = TestApp::spawn().await;
    // Namespace and task of an implicitly created queue come from its dotted name.
    app.push_one("billing.invoices", "p", "inv", json!("inv")).await;
    app.push_one("billing.refunds.eu", "p", "ref", json!("ref")).await;
    app.push_one("shipping.labels", "p", "lab", json!("lab")).await;

    let answer = app.get("/api/v1/pop?namespace=billing&batch=10&partitions=10").await;
    let served: BTreeSet<String> = queues_of(&answer).into_iter().collect();
    assert_eq!(served, BTreeSet::from(["billing.invoices".to_owned(), "billing.refunds.eu".to_owned()]));
    let leases: BTreeSet<String> = answer.messages().iter().map(|m| m["leaseId"].to_string()).collect();
    assert_eq!(leases.len(), 1, "one lease for the whole pop");
    let acks = app.ack_all(&answer.messages(), "completed", None).await;
    assert!(acks.iter().all(|a| a["success"] == true), "{acks:?}");

    let by_task = app.get("/api/v1/pop?task=labels&batch=10").await;
    assert_eq!(queues_of(&by_task), vec!["shipping.labels"]);
    assert_eq!(app.get("/api/v1/pop?namespace=billing&batch=10&partitions=10").await.status, StatusCode::NO_CONTENT);
}

#[actix_web::test]
async fn higher_priority_queues_are_served_first_and_equal_ones_take_turns() {
    let app = TestApp::spawn().await;
    configure_in(&app, "urgent", "work", "jobs", 10).await;
    configure_in(&app, "routine-a", "work", "jobs", 0).await;
    configure_in(&app, "routine-b", "work", "jobs", 0).await;
    for queue in ["routine-a", "routine-b", "urgent"] {
        for i in 0..3 {
            app.push_one(queue, &format!("p{i}"), &format!("{queue}-{i}"), json!(i)).await;
        }
    }
    let mut order = Vec::new();
    for _ in 0..9 {
        let answer = app.get("/api/v1/pop?namespace=work&task=jobs&batch=1&autoAck=true").await;
        order.extend(queues_of(&answer));
    }
    assert_eq!(order[..3], ["urgent", "urgent", "urgent"], "{order:?}");
    let routine: BTreeSet<&str> = order[3..5].iter().map(String::as_str).collect();
    assert_eq!(routine, BTreeSet::from(["routine-a", "routine-b"]), "equal priorities take turns: {order:?}");
    assert_eq!(order.len(), 9);
}

#[actix_web::test]
async fn a_namespace_pop_keeps_group_cursors_per_queue() {
    let app = TestApp::spawn().await;
    app.push_one("fan.one", "p", "a", json!("a")).await;
    app.push_one("fan.two", "p", "b", json!("b")).await;
    for group in ["g1", "g2"] {
        let answer = app
            .get(&format!("/api/v1/pop?namespace=fan&batch=10&partitions=10&consumerGroup={group}&autoAck=true"))
            .await;
        assert_eq!(answer.messages().len(), 2, "{group}: {answer:?}");
    }
    let registrations = app.count("SELECT count(*) FROM queen.consumer_groups_metadata").await;
    assert_eq!(registrations, 4, "each group registered on each queue");
}

#[actix_web::test]
async fn a_waiting_namespace_pop_is_woken_by_a_push_and_finds_a_queue_created_while_it_waited() {
    let app = TestApp::spawn().await;
    app.configure("wait.existing", json!({})).await;
    let waiting = app.get("/api/v1/pop?namespace=wait&batch=1&wait=true&timeout=20000");
    let (answer, pushed_at) = futures::join!(waiting, push_once_parked(&app, "wait.existing", "p", "x"));
    assert_eq!(answer.transaction_ids(), vec!["x"]);
    assert!(pushed_at.elapsed() < Duration::from_secs(2));

    let waiting = app.get("/api/v1/pop?namespace=later&batch=1&wait=true&timeout=20000");
    let push = async {
        // With no queue in the namespace yet, the pop waits on no queue (nothing to observe):
        // give it time to get there. Were it slower, the push would only be found sooner.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pushed_at = Instant::now();
        app.push_one("later.created", "p", "y", json!("y")).await;
        pushed_at
    };
    let (answer, pushed_at) = futures::join!(waiting, push);
    assert_eq!(answer.transaction_ids(), vec!["y"]);
    assert!(
        pushed_at.elapsed() < Duration::from_secs(3),
        "found the new queue {:?} after its push",
        pushed_at.elapsed()
    );
}

/// A group popping a namespace for `new` messages subscribed to the namespace then: a queue
/// first pushed to after that is read from its first message, not from the pop that finds it.
#[actix_web::test]
async fn a_new_group_reads_a_queue_that_joins_its_namespace_later_from_its_first_message() {
    let app = TestApp::spawn().await;
    app.configure("joined.first", json!({})).await;
    let pop = "/api/v1/pop?namespace=joined&batch=10&partitions=10&consumerGroup=g&subscriptionMode=new&wait=false";
    assert_eq!(app.get(pop).await.status, StatusCode::NO_CONTENT);
    let later = json!([
        {"queue": "joined.later", "partition": "p", "transactionId": "early", "payload": 1},
        {"queue": "joined.later", "partition": "p", "transactionId": "next", "payload": 2},
    ]);
    app.push(later).await;
    let answer = app.get(pop).await;
    assert_eq!(answer.transaction_ids(), vec!["early", "next"], "{answer:?}");
}

#[actix_web::test]
async fn a_pop_without_a_queue_needs_a_namespace_or_a_task() {
    let app = TestApp::spawn().await;
    for query in ["batch=1", "namespace=&task=", "namespace=a%01b"] {
        let answer = app.get(&format!("/api/v1/pop?{query}")).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{query}: {answer:?}");
    }
}

/// A namespace or task is a label, not a name that travels in a path: what configure lets a
/// queue carry (`/` included), a pop can ask for.
#[actix_web::test]
async fn a_namespace_pop_serves_every_label_configure_accepts() {
    let app = TestApp::spawn().await;
    configure_in(&app, "slashed", "team/a", "jobs/nightly", 0).await;
    app.push_one("slashed", "p", "m", json!("m")).await;
    for query in ["namespace=team%2Fa", "task=jobs%2Fnightly"] {
        let answer = app.get(&format!("/api/v1/pop?{query}&batch=1")).await;
        assert_eq!(queues_of(&answer), vec!["slashed"], "{query}: {answer:?}");
        app.ack_all(&answer.messages(), "retry", None).await;
    }
}
