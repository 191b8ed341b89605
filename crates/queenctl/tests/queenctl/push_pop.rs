//! `push` of one message, `pop` and `ack`, in both output forms.

use crate::helpers::TestBroker;

#[actix_web::test]
async fn push_pop_and_ack_in_both_forms() {
    let broker = TestBroker::start().await;

    let pushed =
        broker.run(&["push", "orders", "-p", "eu", "--transaction-id", "order-1", r#"{"id": 1}"#]).await.success();
    assert!(pushed.lines()[0].starts_with("TRANSACTION ID"), "{pushed:#?}");
    let row = pushed.row("order-1");
    assert_eq!(row[1], "queued");
    let (message_id, partition_id) = (row[2].to_owned(), row[3].to_owned());

    // Pushed again: the broker answers duplicate, with the stored message's id.
    let again = broker.json(&["push", "orders", "-p", "eu", "--transaction-id", "order-1", r#"{"id": 1}"#]).await;
    assert_eq!(again["status"], "duplicate");
    assert_eq!(again["messageId"], message_id.as_str());
    assert_eq!(again["partitionId"], partition_id.as_str());
    // A negative number is a payload, not a flag.
    let negative = broker.json(&["push", "orders", "-p", "eu", "--transaction-id", "order-2", "-7"]).await;
    assert_eq!(negative["status"], "queued");
    assert_eq!(negative["offset"], 2);

    // Popped in queue mode: the row leads with what an acknowledgement names.
    let popped = broker.run(&["pop", "orders"]).await.success();
    let row = popped.row(&partition_id);
    assert_eq!((row[1], row[3], row[4], row[5], row[7]), ("order-1", "eu", "1", "1", r#"{"id": 1}"#));
    let lease = row[2].to_owned();
    assert!(popped.stderr.contains("queenctl ack PARTITION_ID TRANSACTION_ID --lease LEASE_ID"), "{popped:#?}");

    let acked = broker.run(&["ack", &partition_id, "order-1", "--lease", &lease]).await.success();
    let verdict = acked.row(&partition_id);
    assert_eq!((verdict[1], verdict[2], verdict[3]), ("order-1", "__QUEUE_MODE__", "completed"));
    assert!(verdict[4].starts_with("applied"), "{acked:#?}");
    // The same message again, failed: it is committed already, and the broker refuses.
    let refused = broker.run(&["ack", &partition_id, "order-1", "--lease", &lease, "--status", "failed"]).await;
    refused.fails(1, "queenctl: error: the acknowledgement was refused: the message is already committed");
    assert!(refused.row(&partition_id)[4].starts_with("refused"), "{refused:#?}");

    // A group of its own gets both messages, and acknowledges them in JSON.
    let delivery = broker.json(&["pop", "orders", "--group", "billing", "--batch", "5", "--wait", "1"]).await;
    let messages = delivery["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2, "{delivery:#}");
    assert_eq!(messages[1]["data"], -7);
    assert_eq!(messages[1]["consumerGroup"], "billing");
    let lease = delivery["leaseId"].as_str().expect("a lease");
    assert_eq!(messages[1]["leaseId"], lease);
    let verdict = broker.json(&["ack", &partition_id, "order-2", "--lease", lease, "--group", "billing"]).await;
    assert_eq!((verdict["success"].as_bool(), verdict["leaseReleased"].as_bool()), (Some(true), Some(true)));
    let unknown = broker.run(&["ack", &partition_id, "nope", "--group", "billing", "-o", "json"]).await;
    unknown.fails(1, "the acknowledgement was refused");
    assert_eq!(unknown.json()["success"], false);

    // Auto-ack: no lease, nothing left for queue mode afterwards.
    let auto = broker.json(&["pop", "orders", "--auto-ack"]).await;
    assert_eq!(auto["messages"][0]["transactionId"], "order-2");
    assert!(auto["leaseId"].is_null() && auto["messages"][0]["leaseId"].is_null(), "{auto:#}");
    let empty = broker.run(&["pop", "orders"]).await.success();
    assert_eq!((empty.stdout.as_str(), empty.stderr.trim()), ("", "no messages"));
    let empty = broker.json(&["pop", "orders", "--partition", "eu"]).await;
    assert_eq!(empty["messages"], serde_json::json!([]));
}
