//! `queen-client`'s consume loop against a real `queen` process that is killed (SIGKILL) while a
//! producer pushes and the consumer works, and started again on the same port.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use queen_client::{Client, Message, Pop, PushItem, QueueConfig, RetryPolicy, SubscriptionMode};
use queen_testkit::{BrokerProcess, TestDatabase};

use crate::support::queen_binary;

const MESSAGES: usize = 900;
const BATCH: usize = 10;
const PARTITIONS: usize = 8;
/// The consumer's lease: what a pop whose answer the kill cut costs in waiting.
const LEASE: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_consumer_survives_its_broker_killed_and_restarted_losing_nothing() {
    let db = TestDatabase::create("e2e_client_restart").await;
    let mut broker = BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &[]).await;
    let port = broker.port().to_string();
    let client = Client::builder()
        .url(broker.url())
        .timeout(Duration::from_secs(10))
        .retry_policy(RetryPolicy::default().with_backoff(Duration::from_millis(50), Duration::from_millis(500)))
        .build()
        .expect("a client");
    client.configure(&QueueConfig::new("restart").lease_time(LEASE)).await.expect("configure");

    // Every delivery the handler saw: transaction id → delivery attempts.
    let handled: Arc<Mutex<HashMap<String, Vec<u32>>>> = Arc::default();
    // The consumer's own client does not retry: the consume loop's retries are what is tested.
    let consuming = Client::builder()
        .url(broker.url())
        .timeout(Duration::from_secs(10))
        .retry_policy(RetryPolicy::no_retries())
        .build()
        .expect("a client");
    let consumer = consuming
        .consumer(
            Pop::queue("restart").group("g").subscription_mode(SubscriptionMode::All).wait(Duration::from_secs(1)),
        )
        .concurrency(4)
        .lease_time(LEASE)
        .backoff(Duration::from_millis(50), Duration::from_millis(300))
        .start({
            let handled = Arc::clone(&handled);
            move |message: Message| {
                let handled = Arc::clone(&handled);
                async move {
                    handled
                        .lock()
                        .unwrap()
                        .entry(message.transaction_id.clone())
                        .or_default()
                        .push(message.delivery_attempt);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    Ok::<(), String>(())
                }
            }
        })
        .expect("a consumer");

    // The producer sends each batch until the broker says what became of it, with the same
    // transaction ids: a push the kill cut is stored once.
    let pushed = Arc::new(AtomicUsize::new(0));
    let producer = {
        let (client, pushed) = (client.clone(), Arc::clone(&pushed));
        tokio::spawn(async move {
            let mut pace = tokio::time::interval(Duration::from_millis(20));
            for batch in 0..MESSAGES / BATCH {
                pace.tick().await;
                let items: Vec<PushItem> = (batch * BATCH..(batch + 1) * BATCH)
                    .map(|n| {
                        PushItem::new("restart", &n)
                            .unwrap()
                            .with_partition(format!("p{}", n % PARTITIONS))
                            .with_transaction_id(format!("m{n}"))
                    })
                    .collect();
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    match client.push(&items).await {
                        Ok(outcomes) => {
                            assert!(outcomes.iter().all(|o| o.is_stored()), "{outcomes:?}");
                            break;
                        }
                        Err(error) => {
                            assert!(
                                error.is_retryable() && Instant::now() < deadline,
                                "the push failed for good: {error}"
                            );
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
                pushed.fetch_add(BATCH, Ordering::SeqCst);
            }
        })
    };

    // Kill the broker a third of the way through, and start it again on the same port.
    while pushed.load(Ordering::SeqCst) < MESSAGES / 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let handled_before_kill = consumer.stats().handled;
    broker.signal(Signal::SIGKILL);
    assert!(broker.wait(Duration::from_secs(10)).await.is_some(), "the broker died");
    let restarted = Instant::now();
    let args = ["--database-url", db.url(), "--host", "127.0.0.1", "--port", &port];
    let _broker = BrokerProcess::start(queen_binary(), &args, &[]).await;
    eprintln!("the broker was back on port {port} after {:?}", restarted.elapsed());

    producer.await.expect("the producer");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = handled.lock().unwrap().len();
        let group = client.consumer_group("g").await;
        if seen == MESSAGES && group.is_ok_and(|g| g.summary.total_lag == 0) {
            break;
        }
        assert!(Instant::now() < deadline, "not everything was handled and acknowledged: {seen} of {MESSAGES}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = consumer.shutdown().await.expect("the consumer stops cleanly");

    let handled = std::mem::take(&mut *handled.lock().unwrap());
    let missing: Vec<String> = (0..MESSAGES).map(|n| format!("m{n}")).filter(|id| !handled.contains_key(id)).collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
    assert_eq!(handled.len(), MESSAGES, "nothing was handled that was not pushed");
    // A message is handled twice only when its acknowledgement did not go through (refused
    // under a lease the kill let expire, or not sent before the lease ran out).
    let twice: Vec<&String> = handled.iter().filter(|(_, attempts)| attempts.len() > 1).map(|(id, _)| id).collect();
    let unacknowledged = stats.ack_refused + stats.ack_errors;
    assert!(
        twice.len() as u64 <= unacknowledged,
        "{} handled twice, but only {unacknowledged} acknowledgements failed: {twice:?}",
        twice.len()
    );
    // A redelivery without a second handling is a pop whose answer the kill cut.
    let redelivered = handled.values().filter(|attempts| attempts.iter().any(|a| *a > 1)).count();
    assert!(stats.pop_errors + stats.ack_retries >= 1, "the consumer noticed the broker was gone: {stats:?}");
    assert!(stats.handled > handled_before_kill, "it carried on after the restart");
    let stored: i64 = db
        .connect()
        .await
        .query_one("SELECT sum(last_offset)::bigint FROM queen.partitions", &[])
        .await
        .expect("the offsets")
        .get(0);
    assert_eq!(stored, MESSAGES as i64, "every push stored once");
    eprintln!(
        "{MESSAGES} messages handled and acknowledged; {} handled twice, {redelivered} delivered again after the kill, \
         {} pops and {} acknowledgement calls failed during the outage and were tried again, {unacknowledged} \
         acknowledgements did not go through",
        twice.len(),
        stats.pop_errors,
        stats.ack_retries
    );
}
