//! `groups` and `seek`, in both output forms.

use crate::helpers::{Run, TestBroker};

/// Pushes `count` messages to partition `p` of `queue`; the partition's id.
async fn push(broker: &TestBroker, queue: &str, count: u32) -> String {
    let mut partition_id = String::new();
    for n in 1..=count {
        let pushed =
            broker.json(&["push", queue, "-p", "p", "--transaction-id", &format!("m{n}"), &n.to_string()]).await;
        partition_id = pushed["partitionId"].as_str().expect("a partition id").to_owned();
    }
    partition_id
}

/// Pops up to `batch` messages as `group` and acknowledges the last, committing them all.
async fn consume(broker: &TestBroker, queue: &str, group: &str, batch: u32) {
    let delivery = broker.json(&["pop", queue, "--group", group, "--batch", &batch.to_string()]).await;
    let last = delivery["messages"].as_array().expect("messages").last().expect("a message").clone();
    let (partition_id, transaction_id) =
        (last["partitionId"].as_str().unwrap(), last["transactionId"].as_str().unwrap());
    let lease = last["leaseId"].as_str().unwrap();
    broker.run(&["ack", partition_id, transaction_id, "--lease", lease, "--group", group]).await.success();
}

fn group<'a>(list: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    list.as_array().expect("a list").iter().find(|g| g["name"] == name)
}

#[actix_web::test]
async fn groups_are_listed_shown_found_lagging_and_deleted_in_both_forms() {
    let broker = TestBroker::start().await;
    push(&broker, "gq", 3).await;
    consume(&broker, "gq", "billing", 1).await;
    consume(&broker, "gq", "audit", 3).await;

    let list = broker.run(&["groups", "list"]).await.success();
    assert!(list.lines()[0].starts_with("GROUP"), "{list:#?}");
    let billing = list.row("billing");
    assert_eq!((billing[1], billing[2], billing[3], billing[6]), ("gq", "1", "2", "1"));
    let list = broker.json(&["groups", "list"]).await;
    assert_eq!(group(&list, "billing").expect("billing")["totalLag"], 2);
    assert_eq!(group(&list, "audit").expect("audit")["queues"][0]["totalConsumed"], 3);

    let show = broker.run(&["groups", "show", "billing"]).await.success();
    assert_eq!(show.field("unread"), "2 messages");
    assert!(show.field("queue gq").starts_with("2 unread"), "{show:#?}");
    let cursor = show.row("gq");
    assert_eq!((cursor[1], cursor[3], cursor[4], cursor[5]), ("p", "1", "3", "2"));
    let show = broker.json(&["groups", "show", "billing"]).await;
    assert_eq!(
        (show["partitions"][0]["committed"].as_i64(), show["partitions"][0]["lastOffset"].as_i64()),
        (Some(1), Some(3))
    );

    let lagging = broker.run(&["groups", "lagging", "--min-lag-seconds", "0"]).await.success();
    assert_eq!(lagging.row("billing")[6], "2", "{lagging:#?}");
    assert!(!lagging.stdout.contains("audit"), "audit has read everything: {lagging:#?}");
    let lagging = broker.json(&["groups", "lagging", "--min-lag-seconds", "0"]).await;
    assert!(lagging.as_array().unwrap().iter().any(|c| c["consumerGroup"] == "billing" && c["lagMessages"] == 2));
    let none = broker.run(&["groups", "lagging"]).await.success();
    assert_eq!((none.stdout.as_str(), none.stderr.trim()), ("", "no cursor lags 1h00m or more"));
    assert_eq!(broker.json(&["groups", "lagging"]).await, serde_json::json!([]));

    let deleted = broker.json(&["groups", "delete", "billing", "--queue", "gq", "--yes"]).await;
    assert_eq!(deleted["deletedPartitions"], 1);
    assert_eq!((deleted["queue"].as_str(), deleted["metadataDeleted"].as_bool()), (Some("gq"), Some(true)));
    let deleted: Run = broker.run(&["groups", "delete", "audit", "-y"]).await.success();
    assert_eq!(deleted.stdout, "deleted consumer group audit: 1 cursor and its registration\n");
    let list = broker.json(&["groups", "list"]).await;
    assert!(group(&list, "billing").is_none() && group(&list, "audit").is_none(), "{list:#}");
}

#[actix_web::test]
async fn a_conflating_group_is_shown_as_such() {
    let broker = TestBroker::start().await;
    push(&broker, "ticks", 2).await;
    let url = format!("{}/api/v1/pop/queue/ticks?consumerGroup=ticker&conflation=true", broker.url);
    let popped = reqwest::get(url).await.expect("a pop");
    assert!(popped.status().is_success(), "{popped:?}");

    let show = broker.run(&["groups", "show", "ticker"]).await.success();
    assert!(show.field("queue ticks").contains("conflating"), "{show:#?}");
    let shown = broker.json(&["groups", "show", "ticker"]).await;
    assert_eq!(shown["queues"][0]["conflation"], true, "{shown:#}");
    let plain = broker.json(&["groups", "list"]).await;
    assert_eq!(group(&plain, "ticker").expect("ticker")["queues"][0]["conflation"], true);
}

#[actix_web::test]
async fn seek_moves_a_group_back_and_to_the_end_in_both_forms() {
    let broker = TestBroker::start().await;
    let partition_id = push(&broker, "sq", 3).await;
    consume(&broker, "sq", "g", 3).await;

    let back = broker.run(&["seek", "g", "sq", "--to", "2000-01-01"]).await.success();
    assert_eq!(back.lines()[0], "moved 1 cursor of group g on sq to 2000-01-01T00:00:00.000Z");
    assert_eq!(back.row(&partition_id), vec![partition_id.as_str(), "p", "0"]);
    let again = broker.json(&["pop", "sq", "--group", "g", "--batch", "10", "--auto-ack"]).await;
    assert_eq!(again["messages"].as_array().expect("messages").len(), 3, "read again from the start");

    broker.run(&["seek", "g", "sq", "--to", "2000-01-01T00:00:00Z"]).await.success();
    let end = broker.json(&["seek", "g", "sq", "--to-end"]).await;
    assert_eq!((end["seekToEnd"].as_bool(), end["partitionsUpdated"].as_i64()), (Some(true), Some(1)));
    assert_eq!(end["partitions"][0]["committed"], 3);
    let nothing = broker.run(&["pop", "sq", "--group", "g"]).await.success();
    assert_eq!(nothing.stderr.trim(), "no messages");

    let one = broker.json(&["seek", "g", "sq", "--to", "2000-01-01", "--partition-id", &partition_id]).await;
    assert_eq!(
        (one["partitions"][0]["partitionId"].as_str(), one["partitions"][0]["committed"].as_i64()),
        (Some(partition_id.as_str()), Some(0))
    );
}

#[actix_web::test]
async fn seek_refuses_a_group_that_does_not_read_the_queue_unless_told_to_create_it() {
    let broker = TestBroker::start().await;
    push(&broker, "sq", 2).await;
    consume(&broker, "sq", "billing", 2).await;
    push(&broker, "other", 1).await;

    broker.run(&["seek", "biling", "sq", "--to-end"]).await.fails(4, "consumer group biling does not read queue sq");
    broker.run(&["seek", "billing", "other", "--to-end"]).await.fails(4, "does not read queue other");
    let list = broker.json(&["groups", "list"]).await;
    assert!(group(&list, "biling").is_none(), "a refused seek starts no group: {list:#}");
    assert_eq!(group(&list, "billing").expect("billing")["queues"].as_array().map(Vec::len), Some(1));

    let created = broker.json(&["seek", "auditing", "sq", "--to-end", "--create"]).await;
    assert_eq!(created["partitions"][0]["committed"], 2);
    let list = broker.json(&["groups", "list"]).await;
    assert!(group(&list, "auditing").is_some(), "{list:#}");
}
