//! Push and pop: payloads and every message field round-trip; duplicates; long polls; pops by
//! partition, by several partitions, by namespace and task; subscriptions; auto-ack.

use std::time::Duration;

use chrono::Utc;
use queen_client::serde_json::value::RawValue;
use queen_client::{Pop, PushItem, PushStatus, QueueConfig, SubscriptionFrom, SubscriptionMode};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::time::Instant;
use uuid::Uuid;

use crate::helpers::{TestBroker, eventually, nothing_left};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u64,
    lines: Vec<String>,
}

#[actix_web::test]
async fn pushed_messages_pop_back_with_their_payloads_and_every_field() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    let order = Order { id: 7, lines: vec!["tea".into(), "scones".into()] };
    let trace = Uuid::new_v4();
    let items = vec![
        PushItem::new("orders", &order)
            .unwrap()
            .with_partition("p1")
            .with_transaction_id("order-7")
            .with_trace_id(trace),
        PushItem::raw("orders", RawValue::from_string(r#"{"raw": [1, 2.50]}"#.into()).unwrap()).with_partition("p1"),
        PushItem::from_json("orders", b"null".to_vec()).unwrap().with_partition("p1"),
    ];
    let pushed = client.push(&items).await.expect("the push");
    assert_eq!(pushed.len(), 3);
    for (item, outcome) in items.iter().zip(&pushed) {
        assert_eq!(outcome.status, PushStatus::Queued);
        assert_eq!(outcome.transaction_id, item.transaction_id());
    }
    assert_eq!(Uuid::parse_str(items[1].transaction_id()).unwrap().get_version_num(), 7, "generated: UUIDv7");
    let partition_id = pushed[0].partition_id.clone().expect("a stored push names its partition");

    let before = Utc::now();
    let delivery = client.pop(&Pop::queue("orders").batch(10)).await.expect("the pop");
    assert_eq!(delivery.len(), 3);
    let lease = delivery.lease_id.expect("a leased pop");
    let [first, second, third] = &delivery.messages[..] else { panic!("three messages") };
    assert_eq!(first.json::<Order>().unwrap(), order);
    assert_eq!(first.transaction_id, "order-7");
    assert_eq!(first.id, pushed[0].message_id);
    assert_eq!(first.trace_id, Some(trace));
    assert_eq!(first.producer_sub, None);
    assert_eq!((first.queue.as_str(), first.partition.as_str()), ("orders", "p1"));
    assert_eq!(first.partition_id, partition_id);
    assert_eq!(first.lease_id, Some(lease));
    assert_eq!((first.consumer_group.as_str(), first.group()), ("__QUEUE_MODE__", None));
    assert_eq!(first.delivery_attempt, 1);
    assert!((before - first.created_at).num_seconds().abs() < 60, "created just now: {}", first.created_at);
    assert_eq!(second.data.get(), r#"{"raw": [1, 2.50]}"#, "raw JSON comes back byte for byte");
    assert_eq!(second.offset, first.offset + 1);
    assert_eq!(third.json::<Option<Order>>().unwrap(), None);

    // Without a partition, a push goes to `Default`.
    client.push_one(PushItem::new("orders", &json!({"to": "default"})).unwrap()).await.expect("a push");
    let default = client.pop(&Pop::partition("orders", "Default")).await.expect("a partition pop");
    assert_eq!(default.messages[0].partition, "Default");
    assert_eq!(default.messages[0].json::<serde_json::Value>().unwrap(), json!({"to": "default"}));
}

#[actix_web::test]
async fn a_transaction_id_pushed_again_answers_duplicate_with_the_stored_message() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    let item = PushItem::new("dedup", &1).unwrap().with_partition("0");
    let first = client.push_one(item.clone()).await.expect("a push");
    let again = client.push_one(item.clone()).await.expect("the same push");
    assert_eq!((first.status, again.status), (PushStatus::Queued, PushStatus::Duplicate));
    assert_eq!(again.message_id, first.message_id, "the duplicate names the stored message");
    assert!(first.is_stored() && again.is_stored());
    let elsewhere = client.push_one(item.with_partition("1")).await.expect("the same id elsewhere");
    assert_eq!(elsewhere.status, PushStatus::Queued, "ids are unique per partition");
    let popped = client.pop(&Pop::queue("dedup").batch(10).partitions(2)).await.expect("a pop");
    assert_eq!(popped.len(), 2, "two messages stored, not three");
    assert!(client.push(&[]).await.expect("no items").is_empty());
}

#[actix_web::test]
async fn a_long_poll_is_answered_by_a_push_and_an_empty_one_at_its_timeout() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    let waited = Instant::now();
    let empty = client.pop(&Pop::queue("poll").wait(Duration::from_millis(600))).await.expect("a long poll");
    assert!(empty.is_empty());
    assert!(waited.elapsed() >= Duration::from_millis(500), "it waited: {:?}", waited.elapsed());

    let poller = {
        let client = client.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let delivery = client.pop(&Pop::queue("poll").wait(Duration::from_secs(20))).await;
            (delivery, started.elapsed())
        })
    };
    eventually("the pop is parked", || async {
        client.metrics().await.expect("metrics").value("queen_long_poll_waiters", &[]).unwrap_or(0.0) >= 1.0
    })
    .await;
    let pushed_at = Instant::now();
    client.push_one(PushItem::new("poll", &"wake up").unwrap()).await.expect("a push");
    let (delivery, _) = poller.await.expect("the poller");
    let delivery = delivery.expect("the long poll");
    assert_eq!(delivery.messages[0].json::<String>().unwrap(), "wake up");
    assert!(pushed_at.elapsed() < Duration::from_secs(5), "answered by the push, not the timeout");
}

#[actix_web::test]
async fn pops_take_one_partition_several_under_one_lease_or_a_namespace() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    let items: Vec<PushItem> = (0..6)
        .map(|n| {
            PushItem::new("wide", &n)
                .unwrap()
                .with_partition(format!("p{}", n % 3))
                .with_transaction_id(format!("m{n}"))
        })
        .collect();
    client.push(&items).await.expect("a push");

    let one = client.pop(&Pop::partition("wide", "p1").batch(10)).await.expect("a partition pop");
    let ids: Vec<&str> = one.messages.iter().map(|m| m.transaction_id.as_str()).collect();
    assert_eq!(ids, ["m1", "m4"], "only p1, in order");
    let rest = client.pop(&Pop::queue("wide").batch(100).partitions(3)).await.expect("a wide pop");
    assert_eq!(rest.len(), 4, "p0 and p2 (p1 is leased)");
    assert_eq!(rest.partitions_claimed, 2);
    assert!(rest.messages.iter().all(|m| m.lease_id == rest.lease_id), "one lease over every partition");
    let capped = client.pop(&Pop::queue("wide").group("g").batch(3).partitions(3)).await.expect("a capped pop");
    assert_eq!(capped.len(), 3, "batch is a cap over every partition");

    client.configure(&QueueConfig::new("shop.mail").namespace("shop").task("mail")).await.expect("configure");
    client.push_one(PushItem::new("shop.mail", &"hello").unwrap()).await.expect("a push");
    let by_task = client.pop(&Pop::namespace_task("shop", "mail").group("t")).await.expect("a task pop");
    assert_eq!(by_task.messages[0].queue, "shop.mail");
    let by_namespace = client.pop(&Pop::namespace("shop").group("n").wait(Duration::from_secs(5))).await.expect("pop");
    assert_eq!(by_namespace.messages[0].json::<String>().unwrap(), "hello");
    assert!(client.pop(&Pop::task("mail").group("n")).await.expect("pop").is_empty(), "n has it leased");
}

#[actix_web::test]
async fn groups_start_where_they_subscribe_and_auto_ack_commits_at_delivery() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    let push = |n: u32| {
        let client = client.clone();
        async move { client.push_one(PushItem::new("subs", &n).unwrap()).await.expect("a push") }
    };
    for n in 0..3 {
        push(n).await;
    }
    let all = client.pop(&Pop::queue("subs").group("all").subscription_mode(SubscriptionMode::All).batch(10)).await;
    assert_eq!(all.expect("a pop").len(), 3);
    let fresh = Pop::queue("subs").group("new").subscription_mode(SubscriptionMode::New).batch(10);
    assert!(client.pop(&fresh).await.expect("a pop").is_empty(), "new skips the backlog");
    let last = newest_created_at(&client, "subs").await;
    let from = last + chrono::Duration::microseconds(1);
    eventually("the clock moves past the backlog", || async { Utc::now() > from + chrono::Duration::milliseconds(5) })
        .await;
    push(3).await;
    let news = client.pop(&fresh).await.expect("a pop");
    assert_eq!(news.messages.iter().map(|m| m.json::<u32>().unwrap()).collect::<Vec<_>>(), [3]);
    let since = client
        .pop(&Pop::queue("subs").group("since").subscription_from(SubscriptionFrom::Time(from)).batch(10))
        .await
        .expect("a pop");
    assert_eq!(since.messages.iter().map(|m| m.json::<u32>().unwrap()).collect::<Vec<_>>(), [3]);

    let auto = client.pop(&Pop::queue("subs").group("auto").auto_ack(true).batch(2)).await.expect("an auto-ack pop");
    assert_eq!(auto.len(), 2);
    assert_eq!(auto.lease_id, None, "no lease: committed at delivery");
    let status =
        client.message(&auto.messages[0].partition_id, &auto.messages[0].transaction_id).await.expect("status");
    let progress = status.consumer_groups.iter().find(|g| g.name == "auto").expect("the group's progress");
    assert!(progress.consumed && progress.lease_expires_at.is_none());
    let more = client.pop(&Pop::queue("subs").group("auto").auto_ack(true).batch(10)).await.expect("a pop");
    assert_eq!(more.len(), 2, "the rest, once");
    assert!(nothing_left(&client, Pop::queue("subs").group("auto")).await);
}

/// The creation time of the newest message of a queue, from the broker's listing.
async fn newest_created_at(client: &queen_client::Client, queue: &str) -> chrono::DateTime<Utc> {
    let listing = client.newest_messages(queue, None, Some(1)).await.expect("the newest message");
    listing.messages[0].created_at
}

#[actix_web::test]
async fn a_framed_pop_delivers_what_a_json_pop_delivers_field_for_field() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    let trace = Uuid::new_v4();
    for partition in ["a", "b"] {
        let items: Vec<PushItem> = (0..5)
            .map(|i| {
                let item = PushItem::new("framed", &json!({"p": partition, "i": i})).unwrap().with_partition(partition);
                if i == 2 { item.with_trace_id(trace) } else { item }
            })
            .collect();
        client.push(&items).await.expect("a push");
    }
    let pop = Pop::queue("framed").batch(7).partitions(2);
    let framed = client.pop(&pop.clone().group("framed").frames(true)).await.expect("a framed pop");
    let plain = client.pop(&pop.group("plain")).await.expect("a JSON pop");
    assert_eq!(framed.len(), 7, "the batch spans both partitions");
    assert_eq!(framed.partitions_claimed, plain.partitions_claimed);
    assert!(framed.lease_id.is_some());
    for (f, p) in framed.messages.iter().zip(&plain.messages) {
        assert_eq!(
            (f.id, &f.transaction_id, &f.partition_id, &f.partition, &f.queue, f.offset, f.trace_id, f.data.get()),
            (p.id, &p.transaction_id, &p.partition_id, &p.partition, &p.queue, p.offset, p.trace_id, p.data.get())
        );
        assert_eq!((f.delivery_attempt, &f.producer_sub), (p.delivery_attempt, &p.producer_sub));
        assert_eq!(f.created_at.timestamp_millis(), p.created_at.timestamp_millis());
        assert_eq!((f.consumer_group.as_str(), f.lease_id), ("framed", framed.lease_id));
    }
    // What a framed pop delivered acknowledges like any delivery: the group has nothing left.
    let results = client.ack_messages(&framed.messages, queen_client::AckStatus::Completed).await.expect("the acks");
    assert!(results.iter().all(|r| r.success), "{results:?}");
    let rest = client.pop(&Pop::queue("framed").batch(10).partitions(2).group("framed").frames(true)).await.unwrap();
    assert_eq!(rest.len(), 3);
    let seen: std::collections::HashSet<&str> =
        framed.messages.iter().chain(&rest.messages).map(|m| m.transaction_id.as_str()).collect();
    assert_eq!(seen.len(), 10, "every message once");
}

#[actix_web::test]
async fn a_binary_push_stores_what_a_json_push_stores_and_answers_the_same() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    let items: Vec<PushItem> = (0..4)
        .map(|i| {
            let partition = if i < 3 { "a" } else { "b" };
            PushItem::new("binary", &json!({"i": i, "text": "grüße"}))
                .unwrap()
                .with_partition(partition)
                .with_transaction_id(format!("t{i}"))
        })
        .collect();
    let pushed = client.push_binary(&items).await.expect("a binary push");
    assert!(pushed.iter().all(|o| o.status == PushStatus::Queued), "{pushed:?}");
    let again = client.push_binary(&items[..1]).await.expect("the same again");
    assert_eq!((again[0].status, again[0].message_id), (PushStatus::Duplicate, pushed[0].message_id));
    // An item with a trace id goes as JSON, and is stored all the same.
    let traced = PushItem::new("binary", &json!({"i": 4})).unwrap().with_partition("b").with_trace_id(Uuid::new_v4());
    assert_eq!(client.push_binary(&[traced]).await.expect("a traced push")[0].status, PushStatus::Queued);

    let delivery = client.pop(&Pop::queue("binary").batch(10).partitions(2)).await.expect("a pop");
    let popped: Vec<(String, Uuid, String)> =
        delivery.messages.iter().map(|m| (m.transaction_id.clone(), m.id, m.data.get().to_owned())).collect();
    assert_eq!(popped.len(), 5);
    for (item, outcome) in items.iter().zip(&pushed) {
        let found = popped.iter().find(|(t, ..)| t == item.transaction_id()).expect("the message");
        assert_eq!((found.1, found.2.as_str()), (outcome.message_id, item.payload().get()));
    }
}
