//! `dlq`: dead letters listed, shown, pushed again and deleted, in both output forms.

use crate::helpers::TestBroker;

/// Pops the next message of `queue` (queue mode) and acknowledges it with `status` (and the
/// error text); its transaction id.
async fn pop_and_ack(broker: &TestBroker, queue: &str, status: &str, error: Option<&str>) -> String {
    let delivery = broker.json(&["pop", queue]).await;
    let message = &delivery["messages"][0];
    let (partition_id, transaction_id) =
        (message["partitionId"].as_str().unwrap(), message["transactionId"].as_str().unwrap());
    let lease = message["leaseId"].as_str().unwrap();
    let mut args = vec!["ack", partition_id, transaction_id, "--lease", lease, "--status", status];
    if let Some(error) = error {
        args.extend(["--error", error]);
    }
    let acked = broker.run(&args).await.success();
    assert!(acked.stdout.contains("dead-lettered"), "{acked:#?}");
    transaction_id.to_owned()
}

#[actix_web::test]
async fn dead_letters_are_listed_shown_retried_and_deleted_in_both_forms() {
    let broker = TestBroker::start().await;
    broker.run(&["queues", "configure", "pay", "--retry-limit", "0"]).await.success();
    let mut partition_id = String::new();
    for n in 1..=4 {
        let pushed =
            broker.json(&["push", "pay", "--transaction-id", &format!("t{n}"), &format!("{{\"amount\": {n}}}")]).await;
        partition_id = pushed["partitionId"].as_str().unwrap().to_owned();
    }
    assert_eq!(pop_and_ack(&broker, "pay", "failed", Some("card declined")).await, "t1");
    for _ in 2..=4 {
        pop_and_ack(&broker, "pay", "dlq", None).await;
    }

    let list = broker.run(&["dlq", "list"]).await.success();
    assert!(list.lines()[0].starts_with("FAILED AT"), "{list:#?}");
    let t1 = list.lines().into_iter().find(|line| line.contains(" t1 ")).expect("t1 is listed");
    assert!(t1.contains("card declined") && t1.ends_with(r#"{"amount": 1}"#), "{list:#?}");
    assert_eq!(list.stderr.trim(), "dead letters 1 to 4 of 4");
    let page = broker
        .json(&["dlq", "list", "--queue", "pay", "--group", "__QUEUE_MODE__", "--limit", "2", "--offset", "1"])
        .await;
    assert_eq!((page["total"].as_i64(), page["messages"].as_array().unwrap().len()), (Some(4), 2));
    assert!(page["messages"][0]["deadLetterId"].is_i64(), "{page:#}");
    let future = broker.json(&["dlq", "list", "--from", "2999-01-01"]).await;
    assert_eq!(future["total"], 0);
    let none = broker.run(&["dlq", "list", "--queue", "other"]).await.success();
    assert_eq!((none.stdout.as_str(), none.stderr.trim()), ("", "no dead letters"));

    let show = broker.run(&["dlq", "show", &partition_id, "t1"]).await.success();
    assert_eq!((show.field("queue"), show.field("transaction id")), ("pay", "t1"));
    assert_eq!(show.field("data"), r#"{"amount": 1}"#);
    assert_eq!(show.field("group __QUEUE_MODE__"), "consumed");
    assert!(show.row("DEAD LETTER").len() == 5 && show.stdout.contains("card declined"), "{show:#?}");
    let show = broker.json(&["dlq", "show", &partition_id, "t1"]).await;
    assert_eq!(show["message"]["transactionId"], "t1");
    assert_eq!(show["deadLetters"][0]["errorMessage"], "card declined");

    let retried = broker.run(&["dlq", "retry", &partition_id, "t1"]).await.success();
    assert!(retried.stdout.starts_with("pushed again to pay"), "{retried:#?}");
    assert!(retried.stdout.contains("1 dead letter removed"), "{retried:#?}");
    let retried = broker.json(&["dlq", "retry", &partition_id, "t2"]).await;
    assert_eq!(retried["result"], "moved");
    let again = broker.json(&["pop", "pay", "--batch", "10", "--auto-ack"]).await;
    let payloads: Vec<_> = again["messages"].as_array().unwrap().iter().map(|m| m["data"]["amount"].clone()).collect();
    assert_eq!(payloads, vec![serde_json::json!(1), serde_json::json!(2)], "the retried messages are delivered again");

    let deleted = broker.json(&["dlq", "delete", &partition_id, "t3", "--yes"]).await;
    assert_eq!(deleted["deletedDeadLetters"], 1);
    let deleted = broker.run(&["dlq", "delete", &partition_id, "t4", "-y"]).await.success();
    assert_eq!(deleted.stdout, "deleted 1 dead letter\n");
    assert_eq!(broker.json(&["dlq", "list"]).await["total"], 0);
}

#[actix_web::test]
async fn a_dead_letter_whose_message_retention_removed_is_still_shown() {
    let broker = TestBroker::start_with(|config| config.maintenance.interval_ms = 100).await;
    broker.run(&["queues", "configure", "brief", "--retry-limit", "0"]).await.success();
    let pushed = broker.json(&["push", "brief", "--transaction-id", "gone", r#"{"amount": 7}"#]).await;
    let partition_id = pushed["partitionId"].as_str().unwrap().to_owned();
    pop_and_ack(&broker, "brief", "dlq", None).await;
    broker
        .run(&["queues", "configure", "brief", "--retention-enabled", "true", "--retention-seconds", "1"])
        .await
        .success();
    let message = &format!("{}/api/v1/messages/{partition_id}/gone", broker.url);
    crate::helpers::eventually("retention removes the message", || async move {
        reqwest::get(message).await.expect("an answer").status() == reqwest::StatusCode::NOT_FOUND
    })
    .await;

    let show = broker.run(&["dlq", "show", &partition_id, "gone"]).await.success();
    assert_eq!((show.field("queue"), show.field("transaction id")), ("brief", "gone"));
    assert!(show.field("status").starts_with("removed from the log by retention"), "{show:#?}");
    assert_eq!(show.field("data"), r#"{"amount": 7}"#, "the dead letter's own copy: {show:#?}");
    let show = broker.json(&["dlq", "show", &partition_id, "gone"]).await;
    assert!(show["message"].is_null(), "{show:#}");
    assert_eq!(show["deadLetters"][0]["transactionId"], "gone");

    broker.run(&["dlq", "show", &partition_id, "never"]).await.fails(4, "is not stored and has no dead letters");
}
