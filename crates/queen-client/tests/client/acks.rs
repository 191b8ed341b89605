//! Acknowledgements: commits, per-item verdicts, failures into the dead-letter queue, and the
//! dead letters' listing, re-queuing and deletion.

use chrono::{Duration as TimeDelta, Utc};
use queen_client::{Ack, AckStatus, AckVerdict, DeadLetterQuery, Error, Pop, PushItem, QueueConfig, StatusCode};
use serde_json::json;

use crate::helpers::{TestBroker, nothing_left};

#[actix_web::test]
async fn an_acknowledged_message_is_not_delivered_again() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    client.push_one(PushItem::new("done", &1).unwrap()).await.expect("a push");
    let pop = Pop::queue("done").group("g");
    let delivery = client.pop(&pop).await.expect("a pop");
    let message = &delivery.messages[0];
    assert_eq!(message.group(), Some("g"));
    let verdict = client.ack(&Ack::completed(message)).await.expect("an ack");
    assert_eq!(verdict.verdict(), AckVerdict::Applied);
    assert!(verdict.lease_released, "the whole leased span is done");
    assert!(nothing_left(&client, pop.clone()).await, "committed: a second pop gets nothing");
    let again = client.ack(&Ack::completed(message)).await.expect("the same ack");
    assert_eq!(again.verdict(), AckVerdict::Noop, "a repeated completion changes nothing");
}

#[actix_web::test]
async fn a_batch_answers_a_verdict_per_item_and_refusals_are_not_errors() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    let items: Vec<PushItem> =
        (1..=3).map(|n| PushItem::new("verdicts", &n).unwrap().with_transaction_id(format!("m{n}"))).collect();
    client.push(&items).await.expect("a push");
    let delivery = client.pop(&Pop::queue("verdicts").group("g").batch(3)).await.expect("a pop");
    let [m1, m2, m3] = &delivery.messages[..] else { panic!("three messages") };
    let ghost = Ack::by_id(m1.partition_id.clone(), "ghost", AckStatus::Completed).with_group("g");
    let results = client.ack_batch(&[Ack::completed(m2), ghost]).await.expect("a batch ack");
    assert_eq!(results[0].verdict(), AckVerdict::Applied);
    match results[1].verdict() {
        AckVerdict::Refused(reason) => assert!(reason.contains("unresolv"), "{reason}"),
        other => panic!("an unknown transaction id is refused, not {other:?}"),
    }
    let late = client.ack(&Ack::failed(m1, "too late")).await.expect("an ack");
    assert!(!late.success && late.error.as_deref().is_some_and(|e| e.contains("committed")), "{late:?}");
    let rest = client.ack_messages(std::slice::from_ref(m3), AckStatus::Completed).await.expect("an ack");
    assert_eq!(rest[0].verdict(), AckVerdict::Applied);
    assert!(nothing_left(&client, Pop::queue("verdicts").group("g")).await);

    let mixed = client.ack_batch(&[Ack::completed(m1), Ack::completed(m1).with_group("other")]).await;
    assert!(matches!(mixed, Err(Error::InvalidArgument(_))), "one batch, one group: {mixed:?}");
    assert!(client.ack_batch(&[]).await.expect("nothing to send").is_empty());
}

#[actix_web::test]
async fn failures_past_the_retry_limit_are_dead_lettered_then_listed_requeued_and_deleted() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    client.configure(&QueueConfig::new("fragile").retry_limit(1)).await.expect("configure");
    let items = [
        PushItem::new("fragile", &json!({"n": 1})).unwrap().with_partition("p").with_transaction_id("m1"),
        PushItem::new("fragile", &json!({"n": 2})).unwrap().with_partition("p").with_transaction_id("m2"),
        PushItem::new("fragile", &json!({"n": 3})).unwrap().with_partition("p").with_transaction_id("m3"),
    ];
    client.push(&items).await.expect("a push");
    let pop = Pop::queue("fragile").group("g");

    // Two deliveries of m1 fail: the second is past a retry limit of 1.
    for attempt in 1..=2 {
        let delivery = client.pop(&pop).await.expect("a pop");
        let message = &delivery.messages[0];
        assert_eq!((message.transaction_id.as_str(), message.delivery_attempt), ("m1", attempt));
        let verdict = client.ack(&Ack::failed(message, format!("boom {attempt}"))).await.expect("an ack");
        assert!(verdict.success);
        assert_eq!(verdict.dlq, attempt == 2, "dead-lettered on the last failure only");
    }
    // m2 goes to the dead-letter queue at once; m3 is done.
    let m2 = client.pop(&pop).await.expect("a pop").messages.remove(0);
    assert_eq!(m2.transaction_id, "m2");
    assert!(client.ack(&Ack::dlq(&m2)).await.expect("an ack").dlq);
    let m3 = client.pop(&pop).await.expect("a pop").messages.remove(0);
    assert_eq!(client.ack(&Ack::completed(&m3)).await.expect("an ack").verdict(), AckVerdict::Applied);

    let page = client.dead_letters(&DeadLetterQuery::new().queue("fragile")).await.expect("dead letters");
    assert_eq!(page.total, 2);
    let m1 = page.messages.iter().find(|d| d.transaction_id.as_deref() == Some("m1")).expect("m1 is a dead letter");
    assert_eq!(m1.error_message.as_deref(), Some("boom 2"));
    assert_eq!(m1.consumer_group, "g");
    assert_eq!(m1.json::<serde_json::Value>().expect("kept").unwrap(), json!({"n": 1}));
    let filtered = |query: DeadLetterQuery| {
        let client = client.clone();
        async move { client.dead_letters(&query).await.expect("dead letters") }
    };
    assert_eq!(filtered(DeadLetterQuery::new().queue("fragile").consumer_group("nobody")).await.total, 0);
    assert_eq!(filtered(DeadLetterQuery::new().queue("fragile").partition("p")).await.total, 2);
    assert_eq!(filtered(DeadLetterQuery::new().from(Utc::now() + TimeDelta::hours(1))).await.total, 0);
    assert_eq!(filtered(DeadLetterQuery::new().to(Utc::now() + TimeDelta::hours(1))).await.total, 2);
    let first = filtered(DeadLetterQuery::new().queue("fragile").limit(1)).await;
    let second = filtered(DeadLetterQuery::new().queue("fragile").limit(1).offset(1)).await;
    assert_eq!((first.messages.len(), second.messages.len(), first.total), (1, 1, 2));
    assert_ne!(first.messages[0].dead_letter_id, second.messages[0].dead_letter_id, "pages do not overlap");

    // The message itself, with the group's progress.
    let status = client.message(&m2.partition_id, "m1").await.expect("the message");
    assert_eq!(status.json::<serde_json::Value>().unwrap(), json!({"n": 1}));
    assert!(status.consumer_groups.iter().any(|g| g.name == "g" && g.consumed), "{:?}", status.consumer_groups);
    assert!(client.message(&m2.partition_id, "nothing").await.unwrap_err().is_not_found());

    // m1 goes back into the queue as a new message; m2's dead letter is deleted.
    let requeued = client.retry_dead_letter(&m2.partition_id, "m1").await.expect("a re-queue");
    assert_eq!(requeued.result, "moved");
    assert!(requeued.transaction_id.starts_with("dlq:"), "{}", requeued.transaction_id);
    let again = client.pop(&pop).await.expect("a pop").messages.remove(0);
    assert_eq!(
        (again.transaction_id.as_str(), again.json::<serde_json::Value>().unwrap()),
        (requeued.transaction_id.as_str(), json!({"n": 1}))
    );
    assert_eq!(client.delete_dead_letters(&m2.partition_id, "m2").await.expect("a deletion"), 1);
    assert_eq!(filtered(DeadLetterQuery::new().queue("fragile")).await.total, 0);
    let gone = client.delete_dead_letters(&m2.partition_id, "m2").await.unwrap_err();
    assert_eq!(gone.status(), Some(StatusCode::NOT_FOUND), "{gone}");
}
