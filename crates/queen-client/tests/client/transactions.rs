//! Transactions: acknowledgements and pushes together, or nothing at all.

use std::time::Duration;

use queen_client::{Ack, AckVerdict, Error, Pop, PushItem, PushStatus, Transaction, TransactionResult};
use serde_json::json;

use crate::helpers::{TestBroker, nothing_left};

#[actix_web::test]
async fn a_transaction_acknowledges_and_pushes_together() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    client.push_one(PushItem::new("in", &json!({"v": 1})).unwrap()).await.expect("a push");
    let message = client.pop(&Pop::queue("in").group("g")).await.expect("a pop").messages.remove(0);
    let out = PushItem::new("out", &json!({"v": 2})).unwrap().with_transaction_id("out-1");
    let transaction = Transaction::new().ack(Ack::completed(&message)).push([out.clone()]);
    let committed = client.commit(&transaction).await.expect("a commit");
    assert!(committed.transaction_id.is_some());
    match &committed.results[..] {
        [TransactionResult::Ack(ack), TransactionResult::Push(pushed)] => {
            assert_eq!(ack.verdict(), AckVerdict::Applied);
            assert_eq!((pushed.status, pushed.transaction_id.as_str()), (PushStatus::Queued, "out-1"));
        }
        other => panic!("an ack's verdict and a push's outcome, in order: {other:?}"),
    }
    assert!(nothing_left(&client, Pop::queue("in").group("g")).await, "the input is committed");
    let output = client.pop(&Pop::queue("out")).await.expect("a pop");
    assert_eq!(output.messages[0].json::<serde_json::Value>().unwrap(), json!({"v": 2}));

    // The same push again in a transaction stores nothing new.
    let again = client.commit(&Transaction::new().push([out])).await.expect("a commit");
    assert!(matches!(&again.results[..], [TransactionResult::Push(p)] if p.status == PushStatus::Duplicate));
    assert!(matches!(client.commit(&Transaction::new()).await, Err(Error::InvalidArgument(_))));
}

#[actix_web::test]
async fn a_transaction_under_a_lease_no_longer_live_rolls_back_whole() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    client.push_one(PushItem::new("a", &"a").unwrap()).await.expect("a push");
    client.push_one(PushItem::new("b", &"b").unwrap()).await.expect("a push");
    let a = client.pop(&Pop::queue("a").group("g").lease_seconds(1)).await.expect("a pop");
    let b = client.pop(&Pop::queue("b").group("g").lease_seconds(60)).await.expect("a pop");
    // A's lease runs out and another consumer takes its message.
    let retaken = client.pop(&Pop::queue("a").group("g").wait(Duration::from_secs(10))).await.expect("a pop");
    assert_eq!(retaken.len(), 1);

    let transaction = Transaction::new()
        .ack(Ack::completed(&a.messages[0]))
        .ack(Ack::completed(&b.messages[0]))
        .push([PushItem::new("c", &"c").unwrap()]);
    match client.commit(&transaction).await {
        Err(Error::RolledBack { reason, transaction_id, .. }) => {
            assert!(reason.contains("lease"), "the reason names the lease: {reason}");
            assert!(transaction_id.is_some());
        }
        other => panic!("rolled back, not {other:?}"),
    }
    assert!(nothing_left(&client, Pop::queue("c")).await, "the push did not happen");
    let alone = client.ack(&Ack::completed(&b.messages[0])).await.expect("an ack");
    assert_eq!(alone.verdict(), AckVerdict::Applied, "b's ack did not happen either: it applies now");

    let fenced = Transaction::new().push([PushItem::new("c", &"c").unwrap()]).require_lease(a.lease_id.unwrap());
    let error = client.commit(&fenced).await.unwrap_err();
    assert!(matches!(&error, Error::RolledBack { reason, .. } if reason.contains("required lease")), "{error}");
    assert_eq!(error.code(), Some("rolled_back"));
    assert!(nothing_left(&client, Pop::queue("c")).await);
}
