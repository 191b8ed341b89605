//! Pop, ack and lease extension: what a consumer sees.

use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

#[actix_web::test]
async fn a_popped_message_carries_every_field_of_the_contract() {
    let app = TestApp::spawn().await;
    let trace = "1b4e28ba-2fa1-41d2-883f-0016d3cca427";
    let pushed = app
        .push(json!([{"queue": "fields", "partition": "p1", "transactionId": "t-1", "traceId": trace, "payload": {"a": 1}}]))
        .await;
    let answer = app.pop("queue/fields", "batch=1&wait=false").await;
    assert_eq!(answer.status, StatusCode::OK);
    let m = &answer.messages()[0];
    assert_eq!(m["id"], pushed[0]["message_id"]);
    assert_eq!(m["transactionId"], "t-1");
    assert_eq!(m["traceId"], trace);
    assert_eq!(m["queue"], "fields");
    assert_eq!(m["partition"], "p1");
    assert_eq!(m["partitionId"], pushed[0]["partition_id"]);
    assert_eq!(m["data"], json!({"a": 1}));
    assert_eq!(m["consumerGroup"], "__QUEUE_MODE__");
    assert_eq!(m["offset"], 1);
    assert_eq!(m["deliveryAttempt"], 1);
    assert!(m["leaseId"].as_str().is_some_and(|l| !l.is_empty()));
    assert_eq!(m["leaseId"], answer.body["leaseId"]);
    let created: DateTime<Utc> = m["createdAt"].as_str().expect("createdAt").parse().expect("ISO-8601");
    assert!((Utc::now() - created).num_seconds().abs() < 60);
    assert!(m["createdAt"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert_eq!(answer.body["partitionsClaimed"], 1);
}

#[actix_web::test]
async fn payloads_come_back_exactly_as_pushed() {
    let app = TestApp::spawn().await;
    let big = json!({"blob": "x".repeat(1 << 20)});
    let payloads =
        vec![Value::Null, json!({}), json!("text"), json!([1, "two", 3.5]), json!({"n": {"d": [true]}}), big];
    for (i, payload) in payloads.iter().enumerate() {
        app.push_one("payloads", "p", &format!("p{i}"), payload.clone()).await;
    }
    let answer = app.pop("queue/payloads/partition/p", "batch=10").await;
    let data: Vec<Value> = answer.messages().iter().map(|m| m["data"].clone()).collect();
    assert_eq!(data, payloads);
}

#[actix_web::test]
async fn a_partition_pop_takes_only_that_partition() {
    let app = TestApp::spawn().await;
    app.push_one("routes", "p1", "a", json!(1)).await;
    app.push_one("routes", "p2", "b", json!(2)).await;
    let answer = app.pop("queue/routes/partition/p1", "batch=10").await;
    assert_eq!(answer.transaction_ids(), vec!["a"]);
    let missing = app.pop("queue/routes/partition/nope", "batch=10").await;
    assert_eq!(missing.status, StatusCode::NO_CONTENT);
}

#[actix_web::test]
async fn batch_is_a_global_cap_and_one_lease_covers_every_claimed_partition() {
    let app = TestApp::spawn().await;
    for p in ["p0", "p1", "p2"] {
        app.push(
            json!([{"queue": "wide", "partition": p, "payload": 1}, {"queue": "wide", "partition": p, "payload": 2}]),
        )
        .await;
    }
    let answer = app.pop("queue/wide", "batch=100&partitions=3").await;
    let messages = answer.messages();
    assert_eq!(messages.len(), 6);
    let partitions: std::collections::BTreeSet<&str> =
        messages.iter().map(|m| m["partitionId"].as_str().expect("id")).collect();
    assert_eq!(partitions.len(), 3);
    let leases: std::collections::BTreeSet<&str> =
        messages.iter().map(|m| m["leaseId"].as_str().expect("lease")).collect();
    assert_eq!(leases.len(), 1, "one lease for the whole pop");
    assert_eq!(answer.body["partitionsClaimed"], 3);

    let lease = answer.body["leaseId"].as_str().expect("lease");
    let extended = app.post(&format!("/api/v1/lease/{lease}/extend"), &json!({})).await;
    assert_eq!(extended.status, StatusCode::OK);
    assert_eq!(extended.body["success"], true);
    assert_eq!(extended.body["renewed"], 3, "one extension covers every partition of the lease");

    let acks = app.ack_all(&messages, "completed", None).await;
    assert!(acks.iter().all(|a| a["success"] == true), "{acks:?}");
    assert_eq!(app.pop("queue/wide", "batch=100&partitions=3").await.status, StatusCode::NO_CONTENT);
}

#[actix_web::test]
async fn the_batch_cap_holds_across_many_full_partitions() {
    let app = TestApp::spawn().await;
    for p in 0..5 {
        let items: Vec<Value> =
            (0..100).map(|i| json!({"queue": "cap", "partition": format!("p{p}"), "payload": i})).collect();
        app.push(Value::Array(items)).await;
    }
    assert_eq!(app.pop("queue/cap", "batch=10&partitions=5").await.messages().len(), 10);
    let single = app.pop("queue/cap", "batch=100").await.messages();
    assert_eq!(single.len(), 100, "without `partitions`, a pop claims one partition");
    assert!(single.iter().all(|m| m["partitionId"] == single[0]["partitionId"]));
}

#[actix_web::test]
async fn messages_of_a_partition_come_in_push_order() {
    let app = TestApp::spawn().await;
    for i in 0..30 {
        app.push_one("fifo", "p", &format!("m{i}"), json!({"id": i})).await;
    }
    let mut seen = Vec::new();
    loop {
        let answer = app.pop("queue/fifo", "batch=4").await;
        if answer.status == StatusCode::NO_CONTENT {
            break;
        }
        let messages = answer.messages();
        seen.extend(messages.iter().map(|m| m["data"]["id"].as_i64().expect("id")));
        app.ack_all(&messages, "completed", None).await;
    }
    assert_eq!(seen, (0..30).collect::<Vec<_>>());
}

#[actix_web::test]
async fn acknowledging_completes_and_the_queue_is_then_empty() {
    let app = TestApp::spawn().await;
    app.push_one("acks", "p", "only", json!(1)).await;
    let m = app.pop("queue/acks", "batch=1").await.messages().remove(0);
    let answer = app
        .post(
            "/api/v1/ack",
            &json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                    "status": "completed", "error": null, "consumerGroup": null}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    let result = &answer.body.as_array().expect("a one-element array")[0];
    assert_eq!(result["success"], true);
    assert_eq!(result["noop"], false);
    assert_eq!(result["leaseReleased"], true);
    assert_eq!(app.pop("queue/acks", "batch=1").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.count("SELECT committed FROM queen.log_consumers").await, 1);
}

#[actix_web::test]
async fn a_batch_ack_answers_every_item_in_order_even_when_some_are_refused() {
    let app = TestApp::spawn().await;
    app.push(json!([{"queue": "batch", "payload": 1}, {"queue": "batch", "payload": 2}])).await;
    let messages = app.pop("queue/batch", "batch=2").await.messages();
    let ghost =
        json!({"transactionId": "ghost", "partitionId": messages[0]["partitionId"], "leaseId": messages[0]["leaseId"]});
    let real = json!({"transactionId": messages[1]["transactionId"], "partitionId": messages[1]["partitionId"],
                      "leaseId": messages[1]["leaseId"], "status": "completed"});
    let answer = app.post("/api/v1/ack/batch", &json!({"acknowledgments": [ghost, real], "consumerGroup": null})).await;
    assert_eq!(answer.status, StatusCode::OK, "per-item verdicts come in a 200");
    let results = answer.body.as_array().expect("an array");
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["success"], false);
    assert!(results[0]["error"].as_str().is_some_and(|e| e.contains("unresolvable")), "{results:?}");
    assert_eq!(results[1]["success"], true);
    assert_eq!(results[1]["transactionId"], messages[1]["transactionId"]);
}

#[actix_web::test]
async fn extending_a_lease_moves_its_expiry_and_an_expired_one_cannot_be_revived() {
    let app = TestApp::spawn().await;
    app.push_one("renew", "p", "r", json!(1)).await;
    let m = app.pop("queue/renew", "batch=1&leaseSeconds=1").await.messages().remove(0);
    let lease = m["leaseId"].as_str().expect("lease").to_owned();
    let extended = app.post(&format!("/api/v1/lease/{lease}/extend"), &json!({"seconds": 120})).await;
    assert_eq!(extended.body["success"], true, "{extended:?}");
    let expires: DateTime<Utc> = extended.body["newExpiresAt"].as_str().expect("expiry").parse().expect("ISO-8601");
    assert!(expires - Utc::now() > chrono::Duration::seconds(100));

    // Acknowledging the whole span releases the lease.
    let released = app
        .post("/api/v1/ack", &json!({"transactionId": "r", "partitionId": m["partitionId"], "leaseId": lease}))
        .await;
    assert_eq!(released.body[0]["success"], true);
    let again = app.post(&format!("/api/v1/lease/{lease}/extend"), &json!({})).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body["success"], false, "a released lease cannot be extended: {again:?}");
}

#[actix_web::test]
async fn auto_ack_commits_at_delivery_and_grants_no_lease() {
    let app = TestApp::spawn().await;
    app.push(json!([{"queue": "auto", "payload": 1}, {"queue": "auto", "payload": 2}])).await;
    let answer = app.pop("queue/auto", "batch=10&autoAck=true").await;
    assert_eq!(answer.messages().len(), 2);
    assert!(answer.body["leaseId"].is_null());
    assert!(answer.messages().iter().all(|m| m["leaseId"].is_null()));
    assert_eq!(app.pop("queue/auto", "batch=10").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.count("SELECT committed FROM queen.log_consumers").await, 2);
    assert_eq!(app.metric("queen_messages_acked_total{queue=\"auto\"}").await, 2.0, "acknowledged at delivery");
}

#[actix_web::test]
async fn a_deleted_queue_is_gone_and_a_push_starts_it_afresh() {
    let app = TestApp::spawn().await;
    app.push_one("doomed", "p", "old", json!(1)).await;
    assert_eq!(app.get("/api/v1/resources/queues/doomed").await.status, StatusCode::OK);
    let deleted = app.delete("/api/v1/resources/queues/doomed").await;
    assert_eq!(deleted.body["existed"], true);
    assert_eq!(app.get("/api/v1/resources/queues/doomed").await.status, StatusCode::NOT_FOUND);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_segments").await, 0);

    let fresh = app.push_one("doomed", "p", "old", json!(2)).await;
    assert_eq!(fresh["status"], "queued", "a recreated queue remembers nothing of the old one");
    assert_eq!(fresh["offset"], 1);
}

#[actix_web::test]
async fn a_message_reports_each_groups_progress_and_is_completed_when_all_passed_it() {
    let app = TestApp::spawn().await;
    let pushed = app.push_one("status", "p", "known", json!({"k": 1})).await;
    let path = format!("/api/v1/messages/{}/known", pushed["partition_id"].as_str().expect("id"));
    let untouched = app.get(&path).await;
    assert_eq!(untouched.status, StatusCode::OK);
    assert_eq!(untouched.body["data"], json!({"k": 1}));
    assert_eq!(untouched.body["consumerGroups"], json!([]));
    assert_eq!(untouched.body["status"], "pending");

    app.pop("queue/status", "batch=1&autoAck=true").await;
    let leased = app.pop("queue/status", "batch=1&consumerGroup=slow").await.messages();
    let mid = app.get(&path).await;
    let groups = mid.body["consumerGroups"].as_array().expect("groups");
    assert_eq!(groups.len(), 2);
    let queue_mode = groups.iter().find(|g| g["name"] == "__QUEUE_MODE__").expect("queue mode");
    assert_eq!((&queue_mode["consumed"], &queue_mode["leaseExpiresAt"]), (&json!(true), &Value::Null));
    let slow = groups.iter().find(|g| g["name"] == "slow").expect("slow");
    assert_eq!(slow["consumed"], false);
    assert!(slow["leaseExpiresAt"].is_string(), "a live lease holds it: {slow}");
    assert_eq!(mid.body["status"], "processing");

    app.ack_all(&leased, "completed", Some("slow")).await;
    assert_eq!(app.get(&path).await.body["status"], "completed");

    // On a partition slow has not reached yet (no cursor of its own), the message waits for it.
    let other = app.push_one("status", "q", "unread", json!(2)).await;
    app.pop("queue/status/partition/q", "batch=1&autoAck=true").await;
    let unread = app.get(&format!("/api/v1/messages/{}/unread", other["partition_id"].as_str().expect("id"))).await;
    let groups = unread.body["consumerGroups"].as_array().expect("groups");
    let slow = groups.iter().find(|g| g["name"] == "slow").unwrap_or_else(|| panic!("slow: {}", unread.body));
    assert_eq!((&slow["consumed"], &unread.body["status"]), (&json!(false), &json!("pending")));
    assert_eq!(
        app.get(&format!("/api/v1/messages/{}/unknown", pushed["partition_id"].as_str().unwrap())).await.status,
        StatusCode::NOT_FOUND
    );
}

#[actix_web::test]
async fn names_holding_percent_plus_or_slash_are_the_same_in_a_path_as_in_a_body() {
    let app = TestApp::spawn().await;
    let pushed =
        app.push(json!([{"queue": "100%+q", "partition": "p%", "transactionId": "a/b%c+d", "payload": 1}])).await;
    assert_eq!(pushed[0]["status"], "queued");
    // Encoded as a client encodes path segments: `%`, `+` and `/` escaped.
    let popped = app.pop("queue/100%25%2Bq/partition/p%25", "batch=1").await;
    assert_eq!(popped.transaction_ids(), vec!["a/b%c+d"], "{:?}", popped.body);
    let partition_id = pushed[0]["partition_id"].as_str().expect("a partition id");
    let message = app.get(&format!("/api/v1/messages/{partition_id}/a%2Fb%25c%2Bd")).await;
    assert_eq!(message.status, StatusCode::OK, "{:?}", message.body);
    assert_eq!(message.body["transactionId"], "a/b%c+d");
    let queue = app.get("/api/v1/resources/queues/100%25%2Bq").await;
    assert_eq!(queue.status, StatusCode::OK, "{:?}", queue.body);
}

#[actix_web::test]
async fn a_transaction_id_holding_slashes_in_a_row_addresses_its_own_message_and_no_other() {
    let app = TestApp::spawn().await;
    let pushed = app
        .push(json!([
            {"queue": "slashes", "partition": "p", "transactionId": "a/b", "payload": "one slash"},
            {"queue": "slashes", "partition": "p", "transactionId": "a//b", "payload": "two slashes"},
            {"queue": "slashes", "partition": "p", "transactionId": "/c", "payload": "leading slash"},
        ]))
        .await;
    let partition_id = pushed[0]["partition_id"].as_str().expect("a partition id");
    // Raw, as the official client puts a transaction id in a path.
    for (id, payload) in [("a//b", "two slashes"), ("a/b", "one slash"), ("/c", "leading slash")] {
        let message = app.get(&format!("/api/v1/messages/{partition_id}/{id}")).await;
        assert_eq!(message.status, StatusCode::OK, "{id}: {message:?}");
        assert_eq!((message.body["transactionId"].as_str(), message.body["data"].as_str()), (Some(id), Some(payload)));
    }

    // A base URL that ends in a slash still reaches every route.
    let popped = app.http.get(format!("{}//api/v1/pop/queue/slashes?batch=10&wait=false", app.base)).send().await;
    assert_eq!(popped.expect("a pop").status(), StatusCode::OK);
}

/// A transaction id may end in `/retry`, the suffix of the dead-letter retry route: read raw, as
/// the official client puts it in a path, it is still a read of that message (the retry route
/// takes only POST), and a retry of it is still a retry.
#[actix_web::test]
async fn a_transaction_id_ending_in_retry_is_read_as_a_message() {
    let app = TestApp::spawn().await;
    let pushed = app.push_one("suffixed", "p", "job/retry", json!("the job")).await;
    let partition_id = pushed["partition_id"].as_str().expect("a partition id");
    let message = app.get(&format!("/api/v1/messages/{partition_id}/job/retry")).await;
    assert_eq!(message.status, StatusCode::OK, "{message:?}");
    assert_eq!(message.body["transactionId"], "job/retry");
    let retried = app.post(&format!("/api/v1/messages/{partition_id}/job/retry"), &json!({})).await;
    assert_eq!(retried.status, StatusCode::NOT_FOUND, "a retry of job, which has no dead letter: {retried:?}");
    let put = app.http.put(app.url(&format!("/api/v1/messages/{partition_id}/job/retry"))).send().await;
    assert_eq!(put.expect("an answer").status(), StatusCode::METHOD_NOT_ALLOWED);
}
