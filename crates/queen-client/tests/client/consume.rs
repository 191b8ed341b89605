//! The consume loop: every message handled with N handlers at once and each partition in order;
//! failures retried into the dead-letter queue; a graceful stop; leases kept while handlers run
//! long; a broker that cannot be reached for a while.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use queen_client::{DeadLetterQuery, Message, Pop, PushItem, QueueConfig, SubscriptionMode};
use serde_json::json;
use tokio::sync::Semaphore;

use crate::helpers::{Proxy, TestBroker, client_of, eventually, nothing_left};

/// What handlers saw: each message's number, per partition in the order handled.
#[derive(Default, Clone)]
struct Seen(Arc<Mutex<HashMap<String, Vec<u64>>>>);

impl Seen {
    fn record(&self, message: &Message) -> u64 {
        let n = message.json::<serde_json::Value>().unwrap()["n"].as_u64().expect("a number");
        self.0.lock().unwrap().entry(message.partition.clone()).or_default().push(n);
        n
    }

    fn all(&self) -> Vec<u64> {
        let mut all: Vec<u64> = self.0.lock().unwrap().values().flatten().copied().collect();
        all.sort_unstable();
        all
    }
}

async fn push_spread(client: &queen_client::Client, queue: &str, count: u64, partitions: u64) {
    let items: Vec<PushItem> = (0..count)
        .map(|n| {
            PushItem::new(queue, &json!({"n": n}))
                .unwrap()
                .with_partition(format!("p{}", n % partitions))
                .with_transaction_id(format!("m{n}"))
        })
        .collect();
    client.push(&items).await.expect("a push");
}

/// The group has committed everything of the queue.
async fn all_committed(client: &queen_client::Client, group: &str) -> bool {
    client
        .consumer_group(group)
        .await
        .is_ok_and(|g| g.summary.total_lag == 0 && g.partitions.iter().all(|p| !p.lease_active))
}

#[actix_web::test]
async fn every_message_is_handled_once_by_n_handlers_at_once_each_partition_in_order() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    push_spread(&client, "work", 40, 4).await;
    let seen = Seen::default();
    let consumer = client
        .consumer(
            Pop::queue("work").group("workers").subscription_mode(SubscriptionMode::All).wait(Duration::from_secs(1)),
        )
        .concurrency(4)
        .start({
            let seen = seen.clone();
            move |message: Message| {
                let seen = seen.clone();
                async move {
                    seen.record(&message);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok::<(), String>(())
                }
            }
        })
        .expect("a consumer");
    eventually("every message is handled and acknowledged", || async { consumer.stats().acked == 40 }).await;
    let stats = consumer.shutdown().await.expect("a clean stop");
    assert_eq!(seen.all(), (0..40).collect::<Vec<_>>(), "each message once");
    assert_eq!((stats.handled, stats.completed, stats.failed, stats.ack_refused), (40, 40, 0, 0));
    assert_eq!(stats.max_in_flight, 4, "four handlers at once, never more");
    for (partition, numbers) in seen.0.lock().unwrap().iter() {
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{partition} handled in order: {numbers:?}");
    }
    assert!(all_committed(&client, "workers").await);
}

#[actix_web::test]
async fn failing_handlers_are_retried_until_the_dead_letter_queue_takes_the_message() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    client.configure(&QueueConfig::new("flaky").retry_limit(1)).await.expect("configure");
    push_spread(&client, "flaky", 12, 3).await;
    let seen = Seen::default();
    let consumer = client
        .consumer(Pop::queue("flaky").group("g").wait(Duration::from_secs(1)))
        .concurrency(3)
        .start({
            let seen = seen.clone();
            move |message: Message| {
                let n = seen.record(&message);
                // A panic in the handler's synchronous part, before its future exists.
                assert!(n != 10, "handler bug before its future");
                async move {
                    match n {
                        4 => Err(format!("message {} is poison", message.transaction_id)),
                        7 => panic!("handler bug"),
                        _ => Ok(()),
                    }
                }
            }
        })
        .expect("a consumer");
    eventually("the three poison messages are dead letters", || async {
        client.dead_letters(&DeadLetterQuery::new().queue("flaky")).await.is_ok_and(|page| page.total == 3)
    })
    .await;
    eventually("everything is committed", || async { all_committed(&client, "g").await }).await;
    let stats = consumer.shutdown().await.expect("a clean stop");
    let all = seen.all();
    let poison = |n| [4, 7, 10].contains(&n);
    let expected: Vec<u64> = (0..12).flat_map(|n| if poison(n) { vec![n, n] } else { vec![n] }).collect();
    assert_eq!(all, expected, "good messages once; each poison one retryLimit + 1 = 2 times");
    assert_eq!((stats.completed, stats.failed), (9, 6));
    let page = client.dead_letters(&DeadLetterQuery::new().queue("flaky")).await.expect("dead letters");
    let mut errors: Vec<String> = page.messages.iter().filter_map(|d| d.error_message.clone()).collect();
    errors.sort();
    assert_eq!(errors[0], "message m4 is poison", "the handler's error is kept with the dead letter");
    assert!(errors[1..].iter().all(|e| e.contains("panicked") && e.contains("handler bug")), "{errors:?}");
}

#[actix_web::test]
async fn a_stop_lets_handlers_in_flight_finish_acknowledges_them_and_gives_the_rest_back() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    push_spread(&client, "graceful", 9, 3).await;
    let gate = Arc::new(Semaphore::new(0));
    let consumer = client
        .consumer(Pop::queue("graceful").group("g").batch(9).wait(Duration::from_secs(1)))
        .concurrency(3)
        .lease_time(Duration::from_secs(60))
        .start({
            let gate = Arc::clone(&gate);
            move |_message: Message| {
                let gate = Arc::clone(&gate);
                async move {
                    gate.acquire().await.expect("the gate").forget();
                    Ok::<(), String>(())
                }
            }
        })
        .expect("a consumer");
    eventually("three handlers are running", || async { consumer.stats().in_flight == 3 }).await;
    consumer.stop();
    gate.add_permits(3);
    let stats = consumer.join().await.expect("a clean stop");
    assert_eq!((stats.handled, stats.completed, stats.acked), (3, 3, 3 + 3), "three handled; three given back");
    assert_eq!(stats.released, 6);
    // The six not started were given back at once: another consumer gets them now, not after
    // their 60 s lease, and nothing handled comes back.
    let rest = client.pop(&Pop::queue("graceful").group("g").batch(10).partitions(3)).await.expect("a pop");
    assert_eq!(rest.len(), 6);
    assert!(rest.messages.iter().all(|m| m.offset > 1), "the first of each partition was acknowledged");
}

#[actix_web::test]
async fn a_handler_running_past_its_lease_keeps_it() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    push_spread(&client, "long", 1, 1).await;
    let consumer = client
        .consumer(Pop::queue("long").group("g").wait(Duration::from_secs(1)))
        .lease_time(Duration::from_secs(1))
        .start(|_message: Message| async {
            tokio::time::sleep(Duration::from_millis(3000)).await;
            Ok::<(), String>(())
        })
        .expect("a consumer");
    eventually("the handler runs", || async { consumer.stats().in_flight == 1 }).await;
    // Three lease times: a rival of the group keeps getting nothing.
    while consumer.stats().in_flight == 1 {
        assert!(nothing_left(&client, Pop::queue("long").group("g")).await, "the lease was kept");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eventually("acknowledged", || async { consumer.stats().acked == 1 }).await;
    let stats = consumer.shutdown().await.expect("a clean stop");
    assert_eq!((stats.handled, stats.ack_refused, stats.lease_losses), (1, 0, 0));
}

#[actix_web::test]
async fn a_consumer_waits_out_a_broker_it_cannot_reach_and_carries_on() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    let mut proxy = Proxy::start(&broker.url).await;
    let port = proxy.url.rsplit(':').next().unwrap().to_owned();
    let seen = Seen::default();
    let consumer = client_of(&[&proxy.url])
        .consumer(Pop::queue("outage").group("g").wait(Duration::from_secs(1)))
        .concurrency(2)
        .backoff(Duration::from_millis(50), Duration::from_millis(300))
        .start({
            let seen = seen.clone();
            move |message: Message| {
                let seen = seen.clone();
                async move {
                    seen.record(&message);
                    Ok::<(), String>(())
                }
            }
        })
        .expect("a consumer");
    push_spread(&client, "outage", 10, 2).await;
    eventually("the first ten are handled", || async { consumer.stats().acked == 10 }).await;

    proxy.kill().await;
    eventually("pops fail while the broker cannot be reached", || async { consumer.stats().pop_errors >= 2 }).await;
    push_spread(&client, "outage", 20, 2).await;
    // The broker comes back on the same address.
    let _back = Proxy::start_on(&port, &broker.url).await;
    eventually("the other ten are handled", || async { consumer.stats().acked == 20 }).await;
    let stats = consumer.shutdown().await.expect("a clean stop");
    assert_eq!(seen.all(), (0..20).collect::<Vec<_>>(), "every message once");
    assert!(stats.pop_errors >= 2 && stats.handled == 20, "{stats:?}");
}

/// A completed acknowledgement waiting to be sent with others goes within the flush interval,
/// even while the partition's next handler is still running.
#[actix_web::test]
async fn a_completed_message_is_acknowledged_while_the_next_handler_still_runs() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    push_spread(&client, "slow-next", 2, 1).await;
    let release = Arc::new(Semaphore::new(0));
    let consumer = client
        .consumer(Pop::queue("slow-next").group("g").batch(2).wait(Duration::from_secs(1)))
        .start({
            let release = Arc::clone(&release);
            move |message: Message| {
                let release = Arc::clone(&release);
                async move {
                    if message.transaction_id == "m1" {
                        let _held = release.acquire().await.expect("released");
                    }
                    Ok::<(), String>(())
                }
            }
        })
        .expect("a consumer");
    eventually("m0 is acknowledged while m1's handler runs", || async {
        client.consumer_group("g").await.is_ok_and(|g| g.summary.total_lag == 1)
    })
    .await;
    release.add_permits(1);
    eventually("m1 is acknowledged", || all_committed(&client, "g")).await;
    consumer.shutdown().await.expect("a clean stop");
}

/// A stop waits for the pop in flight for at most its long poll (its wait and 5 s more), not
/// through the retries a broker that never answers would take it through.
#[actix_web::test]
async fn a_stop_gives_up_a_pop_that_a_silent_broker_never_answers() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("an address"));
    let (accepted, in_flight) = tokio::sync::oneshot::channel();
    let silent = tokio::spawn(async move {
        let (first, _) = listener.accept().await.expect("a connection");
        let _ = accepted.send(());
        let mut held = vec![first];
        while let Ok((connection, _)) = listener.accept().await {
            held.push(connection);
        }
    });
    let client = client_of(&[&url]);
    let consumer = client
        .consumer(Pop::queue("silent").group("g").wait(Duration::from_secs(1)))
        .start(|_message: Message| async { Ok::<_, String>(()) })
        .expect("a consumer");
    in_flight.await.expect("the pop went out");
    let stopping = std::time::Instant::now();
    let _ = consumer.shutdown().await;
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(10), "the stop waited {took:?}, past the pop's wait and 5 s");
    silent.abort();
}
