//! Failover across the brokers of a fleet (two brokers on one database): a dead URL, no URL
//! answering, a broker that dies while in use, a broker that answers 503; and a 429 retried after
//! its Retry-After.

use std::time::Duration;

use queen_client::{Ack, AckVerdict, Error, Pop, PushItem, RetryPolicy, Transaction};
use tokio::time::Instant;

use crate::helpers::{Proxy, TestBroker, client_of, dead_url, eventually, nothing_left};

#[actix_web::test]
async fn with_the_first_url_dead_calls_go_to_the_next_and_stay_there() {
    let broker = TestBroker::start().await;
    let second = broker.another(|_| {}).await;
    let dead = dead_url().await;
    let client = client_of(&[&dead, &second, &broker.url]);
    client.push_one(PushItem::new("fo", &1).unwrap().with_transaction_id("one")).await.expect("a push");
    assert_eq!(client.current_url(), second, "the broker that answered is used from now on");
    let delivery = client.pop(&Pop::queue("fo").group("g")).await.expect("a pop");
    assert_eq!(delivery.messages[0].transaction_id, "one");
    // A transaction is sent again only when it cannot have applied: a refused connection.
    let transaction = Transaction::new().ack(Ack::completed(&delivery.messages[0]));
    let fresh = client_of(&[&dead, &broker.url]);
    let committed = fresh.commit(&transaction).await.expect("a commit through the live broker");
    assert!(matches!(&committed.results[..], [queen_client::TransactionResult::Ack(a)] if a.success));
    assert_eq!(fresh.current_url(), broker.url);
}

#[actix_web::test]
async fn when_no_url_answers_the_error_names_every_url_tried() {
    let (one, two) = (dead_url().await, dead_url().await);
    let client = client_of(&[&one, &two]);
    let error = client.status().await.unwrap_err();
    let Error::Transport { url, tried, .. } = &error else { panic!("no answer, not {error:?}") };
    let mut every: Vec<&str> = tried.iter().chain([url]).map(String::as_str).collect();
    every.sort_unstable();
    let mut expected = [format!("{one}/api/v1/status"), format!("{two}/api/v1/status")];
    expected.sort_unstable();
    assert_eq!(every, expected, "each URL once: {error}");
    let text = error.to_string();
    assert!(text.contains(&one) && text.contains(&two) && text.contains("also tried"), "{text}");

    let alone = client_of(&[&one]).status().await.unwrap_err();
    assert!(matches!(&alone, Error::Transport { tried, .. } if tried.is_empty()), "{alone:?}");
}

#[actix_web::test]
async fn a_broker_that_dies_in_use_is_failed_over_to_the_next_and_nothing_is_lost() {
    let broker = TestBroker::start().await;
    let second = broker.another(|_| {}).await;
    let mut first = Proxy::start(&broker.url).await;
    let client = client_of(&[&first.url, &second]);
    let items: Vec<PushItem> =
        (0..4).map(|n| PushItem::new("dies", &n).unwrap().with_partition(format!("p{n}"))).collect();
    client.push(&items).await.expect("a push through the first broker");
    assert_eq!(client.current_url(), first.url);
    let delivery = client.pop(&Pop::queue("dies").group("g").batch(2).partitions(2)).await.expect("a pop");
    assert_eq!(delivery.len(), 2);

    // A long poll is parked on the first broker when it dies.
    let waiters = |url: String| async move {
        let metrics = queen_client::Client::new(url).unwrap().metrics().await.expect("metrics");
        metrics.value("queen_long_poll_waiters", &[]).unwrap_or(0.0)
    };
    let parked = {
        let client = client.clone();
        tokio::spawn(async move { client.pop(&Pop::queue("idle").wait(Duration::from_secs(2))).await })
    };
    eventually("the long poll is parked on the first broker", || async { waiters(broker.url.clone()).await >= 1.0 })
        .await;
    first.kill().await;
    // Cut off, it is sent again to the second broker, which parks it and answers it at its
    // timeout. It is not woken by a push here: the first broker lives on behind the dead proxy,
    // where the long poll that was cut off stays parked until its timeout and would claim what
    // arrives, under a lease nobody receives.
    eventually("the long poll is parked on the second broker", || async { waiters(second.clone()).await >= 1.0 }).await;
    let answered = parked.await.expect("the poller").expect("the long poll, retried on the second broker");
    assert!(answered.is_empty());

    // Acks of the dead broker's lease go through the second one; so does everything after.
    let acked = client.ack_messages(&delivery.messages, queen_client::AckStatus::Completed).await.expect("an ack");
    assert!(acked.iter().all(|a| a.verdict() == AckVerdict::Applied), "{acked:?}");
    assert_eq!(client.current_url(), second);
    let rest = client.pop(&Pop::queue("dies").group("g").batch(10).partitions(4)).await.expect("a pop");
    assert_eq!(rest.len(), 2, "the other two messages");
    client.ack_messages(&rest.messages, queen_client::AckStatus::Completed).await.expect("an ack");
    assert!(nothing_left(&client, Pop::queue("dies").group("g")).await, "all four consumed, none lost");
}

#[actix_web::test]
async fn a_503_fails_over_and_a_429_is_retried_after_its_retry_after() {
    // The first broker takes one parked long poll at most: the next one is refused with 503.
    let broker = TestBroker::start_with(|config| config.limits.parked_long_polls = 1).await;
    let second = broker.another(|_| {}).await;
    let only_first = client_of(&[&broker.url]);
    let parked = {
        let client = only_first.clone();
        tokio::spawn(async move { client.pop(&Pop::queue("busy").group("a").wait(Duration::from_secs(8))).await })
    };
    let refusals = |bound: &'static str| {
        let client = only_first.clone();
        async move {
            let metrics = client.metrics().await.expect("metrics");
            metrics.value("queen_overload_refusals_total", &[("bound", bound)]).unwrap_or(0.0)
        }
    };
    eventually("the first long poll is parked", || async {
        only_first.metrics().await.expect("metrics").value("queen_long_poll_waiters", &[]).unwrap_or(0.0) >= 1.0
    })
    .await;
    let client = client_of(&[&broker.url, &second]);
    let answered = {
        let client = client.clone();
        tokio::spawn(async move { client.pop(&Pop::queue("busy").group("b").wait(Duration::from_secs(8))).await })
    };
    eventually("the second broker parks the refused long poll", || async { client.current_url() == second }).await;
    assert!(refusals("long_polls").await >= 1.0, "the first broker refused it");
    client.push_one(PushItem::new("busy", &"both").unwrap()).await.expect("a push");
    for poll in [parked, answered] {
        let delivery = poll.await.expect("a poller").expect("a long poll");
        assert_eq!(delivery.messages[0].json::<String>().unwrap(), "both");
    }

    // A broker allowing one parked long poll per client answers a second one 429 with
    // Retry-After: 1; the client waits that long and tries again, until the first is answered.
    let strict = TestBroker::start_with(|config| config.limits.long_polls_per_client = 1).await;
    let client = queen_client::Client::builder()
        .url(&strict.url)
        .retry_policy(RetryPolicy::default().with_max_attempts(6))
        .build()
        .expect("a client");
    let first_poll = {
        let client = client.clone();
        tokio::spawn(async move { client.pop(&Pop::queue("strict").wait(Duration::from_millis(1500))).await })
    };
    eventually("the first long poll is parked", || async {
        client.metrics().await.expect("metrics").value("queen_long_poll_waiters", &[]).unwrap_or(0.0) >= 1.0
    })
    .await;
    let started = Instant::now();
    let second_poll = client.pop(&Pop::queue("strict").wait(Duration::from_millis(200))).await;
    assert!(second_poll.expect("retried until it could park").is_empty());
    assert!(started.elapsed() >= Duration::from_millis(900), "it waited for Retry-After: {:?}", started.elapsed());
    let metrics = client.metrics().await.expect("metrics");
    assert!(metrics.value("queen_overload_refusals_total", &[("bound", "client_long_polls")]).unwrap_or(0.0) >= 1.0);
    assert!(first_poll.await.expect("the poller").expect("the first long poll").is_empty());
}

/// Calls that would act again if sent twice are not sent again once the broker may have acted on
/// them (its answer was lost): an auto-acked pop (a second would take the next messages while
/// the first ones are gone for the group) and a seek report the lost answer; a pop with a lease
/// is sent again (the lost lease's messages come back when it runs out).
#[actix_web::test]
async fn a_lost_answer_is_reported_for_calls_that_would_act_twice() {
    let broker = TestBroker::start().await;
    let losing = Proxy::losing_answers(&broker.url).await;
    let direct = client_of(&[&broker.url]);
    let items: Vec<PushItem> =
        (0..3).map(|n| PushItem::new("lost", &n).unwrap().with_transaction_id(format!("m{n}"))).collect();
    direct.push(&items).await.expect("a push");

    let client = client_of(&[&losing.url, &broker.url]);
    let auto_acked = client.pop(&Pop::queue("lost").group("g").batch(1).auto_ack(true)).await;
    assert!(matches!(auto_acked, Err(Error::Transport { .. })), "{auto_acked:?}");
    // m0 was consumed by the pop whose answer was lost; nothing else was.
    let next = direct.pop(&Pop::queue("lost").group("g").batch(10).auto_ack(true)).await.expect("a pop");
    let ids: Vec<&str> = next.messages.iter().map(|m| m.transaction_id.as_str()).collect();
    assert_eq!(ids, ["m1", "m2"]);

    let sought = client.seek("g", "lost", queen_client::SeekTarget::End).await;
    assert!(matches!(sought, Err(Error::Transport { .. })), "{sought:?}");

    // Answered by the second broker: the partition is leased to the lost answer for now.
    let leased = client.pop(&Pop::queue("lost").group("h").batch(1)).await.expect("sent again");
    assert!(leased.messages.is_empty(), "{leased:?}");
}
