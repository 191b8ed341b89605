//! The binary formats under broker backends terminated at random: a producer pushing QPB1 frames
//! groups (the official clients' `binary_push` with `push_compression`, here through
//! `queen_client::Client::push_binary`, which mints the message ids) and a consumer popping QPF1
//! answers (`framed_pop`). Both go through the client's retries, which send a call again after a
//! 503 or a lost answer; a call that still fails is sent again by the test, with the same
//! transaction ids, for at most 30 s. Every push answered must be delivered and committed once, under the id its
//! push was answered with.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_client::{Ack, AckVerdict, Client, Pop, PushItem, PushStatus, QueueConfig, RetryPolicy};
use queen_testkit::{BrokerProcess, TestDatabase, metric_at};
use uuid::Uuid;

use crate::stalled::storm;
use crate::support::{assert_running, queen_binary};

const QUEUE: &str = "storm_binary";
const GROUP: &str = "g";
const PARTITIONS: usize = 4;
const PUSH_SIZE: usize = 5;

/// Transaction id → message id.
type Ids = Arc<Mutex<HashMap<String, Uuid>>>;

/// How long one call may keep failing, retries included, before the broker counts as not having
/// recovered.
const RECOVERY: Duration = Duration::from_secs(30);

/// `call` until it is answered, at most for [`RECOVERY`].
async fn until_answered<T, Call, Answer>(what: &str, mut call: Call) -> T
where
    Call: FnMut() -> Answer,
    Answer: Future<Output = Result<T, queen_client::Error>>,
{
    let deadline = Instant::now() + RECOVERY;
    loop {
        match call().await {
            Ok(answer) => return answer,
            Err(e) => {
                assert!(Instant::now() < deadline, "{what} kept failing for {RECOVERY:?}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Pushes batches of `PUSH_SIZE` binary until `producing` is cleared, each batch until it is
/// answered; notes the id each item was answered with.
async fn produce(client: Client, producing: Arc<AtomicBool>, pushed: Ids) {
    for batch in 0usize.. {
        if !producing.load(Ordering::SeqCst) {
            return;
        }
        let items: Vec<PushItem> = (0..PUSH_SIZE)
            .map(|i| {
                let id = format!("b{batch}-{i}");
                PushItem::new(QUEUE, &serde_json::json!({ "id": id }))
                    .expect("a payload")
                    .with_partition(format!("part{}", (batch * PUSH_SIZE + i) % PARTITIONS))
                    .with_transaction_id(id)
            })
            .collect();
        let outcomes = until_answered("a binary push", || client.push_binary(&items)).await;
        let mut pushed = pushed.lock().expect("the pushed ids");
        for outcome in outcomes {
            assert!(matches!(outcome.status, PushStatus::Queued | PushStatus::Duplicate), "pushed: {outcome:?}");
            // A push sent again after its first attempt was stored answers `duplicate` with the
            // stored message's id: the one the first attempt minted.
            pushed.insert(outcome.transaction_id, outcome.message_id);
        }
    }
}

/// Pops framed answers and acknowledges each message until `consuming` is cleared; notes the id
/// of each message whose acknowledgement committed, and counts a commit of a message already
/// committed.
async fn consume(client: Client, consuming: Arc<AtomicBool>, committed: Ids, twice: Arc<Mutex<Vec<String>>>) {
    let pop = Pop::queue(QUEUE).group(GROUP).batch(20).partitions(PARTITIONS as u32).wait(Duration::from_millis(500));
    let pop = pop.frames(true);
    while consuming.load(Ordering::SeqCst) {
        let Ok(delivery) = client.pop(&pop).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        for message in &delivery.messages {
            let ack = Ack::completed(message);
            let verdict = until_answered("an ack", || client.ack(&ack)).await;
            // Refused: the lease ran out during the storm, and the message comes again.
            if matches!(verdict.verdict(), AckVerdict::Applied | AckVerdict::Noop)
                && committed
                    .lock()
                    .expect("the committed ids")
                    .insert(message.transaction_id.clone(), message.id)
                    .is_some()
            {
                twice.lock().expect("the repeats").push(message.transaction_id.clone());
            }
        }
    }
}

#[tokio::test]
async fn binary_pushes_and_framed_pops_through_a_storm_of_killed_backends_lose_nothing() {
    let db = TestDatabase::create("chaos_storm_binary").await;
    let sql = db.connect().await;
    let mut broker = BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &[]).await;
    // Retries close together (the broker's `Retry-After` capped), so that the load goes on
    // through the storm and meets it mid-statement.
    let retries = RetryPolicy::default()
        .with_max_attempts(20)
        .with_backoff(Duration::from_millis(10), Duration::from_millis(100));
    let client = Client::builder().url(broker.url()).retry_policy(retries).build().expect("a client");
    // A delivery whose ack is lost to the storm comes back within seconds.
    client.configure(&QueueConfig::new(QUEUE).lease_time(Duration::from_secs(2))).await.expect("configured");

    let (pushed, committed): (Ids, Ids) = Default::default();
    let twice = Arc::new(Mutex::new(Vec::new()));
    let (producing, consuming) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicBool::new(true)));
    let producer = tokio::spawn(produce(client.clone(), Arc::clone(&producing), Arc::clone(&pushed)));
    let consumer =
        tokio::spawn(consume(client.clone(), Arc::clone(&consuming), Arc::clone(&committed), Arc::clone(&twice)));

    let storm = storm(&sql, Duration::from_secs(8)).await;
    producing.store(false, Ordering::SeqCst);
    producer.await.expect("the producer");
    let pushed = pushed.lock().expect("the pushed ids").clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    while committed.lock().expect("the committed ids").len() < pushed.len() {
        assert!(Instant::now() < deadline, "not everything pushed was committed within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    consuming.store(false, Ordering::SeqCst);
    consumer.await.expect("the consumer");

    let committed = committed.lock().expect("the committed ids").clone();
    let http = queen_testkit::http().build().expect("a client");
    let failed = metric_at(&http, &broker.url(), "queen_db_errors_total{kind=\"unavailable\"}").await;
    println!(
        "binary storm: {} kills in {} rounds ({:?}), {failed} operations failed on a lost connection; {} messages pushed and committed",
        storm.kills,
        storm.rounds,
        storm.kinds,
        pushed.len()
    );
    assert!(storm.kills >= 20, "the storm terminated backends: {storm:?}");
    assert!(failed >= 1.0, "no operation of the broker met a terminated backend");
    assert!(pushed.len() >= 50, "only {} messages were pushed", pushed.len());
    assert_eq!(*twice.lock().expect("the repeats"), Vec::<String>::new(), "committed twice");
    assert_eq!(committed, pushed, "each message committed under the id its push was answered with");
    assert_running(std::slice::from_mut(&mut broker)).await;
}
