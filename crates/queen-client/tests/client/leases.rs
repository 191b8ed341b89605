//! Leases: extension, and a guard that keeps one alive past its lease time or says it is lost.

use std::time::Duration;

use chrono::Utc;
use queen_client::{Ack, AckVerdict, Pop, PushItem, RenewalState};
use tokio::time::Instant;

use crate::helpers::{TestBroker, eventually};

#[actix_web::test]
async fn an_extension_says_when_the_lease_now_expires_and_unknown_leases_are_not_found() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    client.push_one(PushItem::new("extend", &1).unwrap()).await.expect("a push");
    let delivery = client.pop(&Pop::queue("extend").lease_seconds(5)).await.expect("a pop");
    let lease = delivery.lease_id.expect("a lease");
    let extended = client.extend_lease(lease, Some(120)).await.expect("an extension");
    assert!(extended.success && extended.renewed == 1, "{extended:?}");
    let expires = extended.expires_at.expect("when it expires");
    assert!((expires - Utc::now()).num_seconds() > 100, "about two minutes from now: {expires}");
    assert!(client.extend_lease(lease, None).await.expect("by the queue's lease time").success);

    let unknown = client.extend_lease(uuid::Uuid::now_v7(), None).await.unwrap_err();
    assert!(unknown.is_not_found(), "{unknown}");
    client.ack(&Ack::completed(&delivery.messages[0])).await.expect("an ack");
    let released = client.extend_lease(lease, None).await.expect("an answer");
    assert!(!released.success && released.error.is_some(), "a released lease cannot be extended: {released:?}");
}

#[actix_web::test]
async fn a_renewed_lease_outlives_its_lease_time_and_a_lost_one_is_reported() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    client.push_one(PushItem::new("slow", &"work").unwrap()).await.expect("a push");
    let lease_time = Duration::from_secs(1);
    let delivery = client.pop(&Pop::queue("slow").group("g").lease_seconds(1)).await.expect("a pop");
    let guard = client.keep_lease(delivery.lease_id.expect("a lease"), lease_time);
    // Three lease times pass; another consumer of the group keeps getting nothing.
    let started = Instant::now();
    let rival = Pop::queue("slow").group("g");
    while started.elapsed() < lease_time * 3 {
        assert!(client.pop(&rival).await.expect("a rival pop").is_empty(), "the lease was kept");
        assert!(!guard.is_lost());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let state = guard.stop().await;
    assert!(matches!(state, RenewalState::Stopped { renewals } if renewals >= 5), "{state:?}");
    let verdict = client.ack(&Ack::completed(&delivery.messages[0])).await.expect("an ack");
    assert_eq!(verdict.verdict(), AckVerdict::Applied, "acknowledged under the lease it kept");

    // A lease let go expires and goes to another consumer; a guard on it reports it lost.
    client.push_one(PushItem::new("slow", &"more").unwrap()).await.expect("a push");
    let abandoned = client.pop(&Pop::queue("slow").group("g").lease_seconds(1)).await.expect("a pop");
    let taken = client.pop(&rival.clone().wait(Duration::from_secs(10))).await.expect("the rival's long poll");
    assert_eq!(taken.messages[0].transaction_id, abandoned.messages[0].transaction_id);
    assert_eq!(taken.messages[0].delivery_attempt, 2, "the expiry counted as a delivery");
    let late = client.keep_lease_every(abandoned.lease_id.expect("a lease"), Duration::from_millis(50), Some(1));
    let reason = tokio::time::timeout(Duration::from_secs(10), late.lost()).await.expect("reported in time");
    assert!(reason.is_some_and(|r| !r.is_empty()), "lost, with a reason");
    assert!(late.is_lost());
    eventually("the guard says so", || async { late.state().is_lost() }).await;
}
