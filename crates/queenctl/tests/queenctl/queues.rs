//! `queues`: configured, listed, shown and deleted, in both output forms.

use crate::helpers::TestBroker;

#[actix_web::test]
async fn queues_are_configured_listed_shown_and_deleted_in_both_forms() {
    let broker = TestBroker::start().await;
    let configured = broker
        .run(&[
            "queues",
            "configure",
            "shop-orders",
            "--namespace",
            "shop",
            "--task",
            "billing",
            "--lease-time",
            "45",
            "--retry-limit",
            "2",
            "--set",
            "retentionSeconds=3600",
        ])
        .await
        .success();
    assert_eq!(
        (configured.field("namespace"), configured.field("leaseTime"), configured.field("retryLimit")),
        ("shop", "45", "2")
    );
    assert_eq!(configured.field("retentionSeconds"), "3600");
    assert_eq!(configured.stderr, "");
    let refused =
        broker.run(&["queues", "configure", "shop-orders", "--set", "customThing=abc", "--lease-time", "9"]).await;
    refused.fails(1, "options.customThing is not a queue option this broker acts on");
    assert_eq!(broker.json(&["queues", "show", "shop-orders"]).await["queue"]["options"]["leaseTime"], 45);
    let changed = broker
        .json(&["queues", "configure", "shop-orders", "--max-size", "1000", "--dead-letter-queue", "false"])
        .await;
    assert_eq!(changed["options"]["maxSize"], 1000);
    assert_eq!(changed["options"]["deadLetterQueue"], false);
    assert_eq!(changed["options"]["leaseTime"], 45, "options not given keep their value");
    broker.json(&["queues", "configure", "plain"]).await;

    broker.run(&["push", "shop-orders", "1"]).await.success();
    broker.run(&["push", "shop-orders", "-p", "second", "2"]).await.success();
    broker.run(&["pop", "shop-orders", "--group", "reports", "--auto-ack"]).await.success();

    let list = broker.run(&["queues", "list"]).await.success();
    assert_eq!(list.row("shop-orders")[1..6], ["shop", "billing", "2", "2", "2"]);
    assert_eq!(list.row("plain")[1..4], ["-", "-", "0"]);
    assert!(!list.stderr.contains("may be more"), "a page short of its limit is all there is: {list:#?}");
    let first = broker.run(&["queues", "list", "--limit", "1"]).await.success();
    assert_eq!(first.lines().len(), 2, "a header and one queue: {first:#?}");
    assert!(first.stderr.contains("1 queues shown from offset 0; there may be more: --offset 1"), "{first:#?}");
    let shop = broker.json(&["queues", "list", "--namespace", "shop"]).await;
    let names: Vec<_> = shop["queues"].as_array().unwrap().iter().map(|q| q["name"].clone()).collect();
    assert_eq!(names, vec![serde_json::json!("shop-orders")]);
    assert_eq!(broker.json(&["queues", "list", "--task", "nothing"]).await["queues"], serde_json::json!([]));

    let show = broker.run(&["queues", "show", "shop-orders"]).await.success();
    assert_eq!((show.field("messages"), show.field("partitions"), show.field("maxSize")), ("2", "2", "1000"));
    assert_eq!(show.row("reports")[1..3], ["2", "1"], "the group's partitions and lag: {show:#?}");
    assert_eq!(show.row("second")[2..4], ["1", "1"]);
    let show = broker.json(&["queues", "show", "shop-orders"]).await;
    assert_eq!(
        (show["queue"]["messages"].as_i64(), show["queue"]["options"]["leaseTime"].as_i64()),
        (Some(2), Some(45))
    );
    assert_eq!(show["partitions"].as_array().unwrap().len(), 2);
    assert_eq!(show["consumerGroups"][0]["name"], "reports");

    let deleted = broker.run(&["queues", "delete", "plain", "--yes"]).await.success();
    assert_eq!(deleted.stdout, "deleted queue plain\n");
    let deleted = broker.json(&["queues", "delete", "shop-orders", "-y"]).await;
    assert_eq!(deleted, serde_json::json!({"deleted": true, "existed": true, "queue": "shop-orders"}));
    let none = broker.run(&["queues", "list"]).await.success();
    assert_eq!((none.stdout.as_str(), none.stderr.trim()), ("", "no queues"));
}
