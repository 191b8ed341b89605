//! Long polls: answered by a push, or empty at their timeout, holding no database connection.

use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::TestApp;

/// Waits until the broker reports `n` parked long polls.
pub async fn until_parked(app: &TestApp, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let parked = app.metric("queen_long_poll_waiters").await as usize;
        if parked >= n {
            return;
        }
        assert!(Instant::now() < deadline, "only {parked} of {n} pops parked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Once one pop is parked, pushes one message (its payload is its transaction id); when.
pub async fn push_once_parked(app: &TestApp, queue: &str, partition: &str, transaction_id: &str) -> Instant {
    until_parked(app, 1).await;
    let pushed_at = Instant::now();
    app.push_one(queue, partition, transaction_id, json!(transaction_id)).await;
    pushed_at
}

#[actix_web::test]
async fn a_waiting_pop_answers_as_soon_as_a_push_arrives() {
    let app = TestApp::spawn().await;
    let waiting = app.pop("queue/wake", "batch=1&wait=true&timeout=20000");
    let (answer, pushed_at) = futures::join!(waiting, push_once_parked(&app, "wake", "p", "hello"));
    let latency = pushed_at.elapsed();
    assert_eq!(answer.transaction_ids(), vec!["hello"]);
    assert!(latency < Duration::from_secs(2), "answered {latency:?} after the push, with a 20 s timeout");
}

/// Every time a queue-wide pop asked where to look (`queen_pop_candidate_plans_total`).
async fn plans(app: &TestApp) -> f64 {
    let mut total = 0.0;
    for kind in ["full", "candidates", "skipped"] {
        total += app.metric(&format!("queen_pop_candidate_plans_total{{kind=\"{kind}\"}}")).await;
    }
    total
}

#[actix_web::test]
async fn a_push_wakes_one_waiting_pop_of_each_group_and_the_others_look_only_at_their_timeout() {
    let app = TestApp::spawn().await;
    let waiting = &app;
    let pop = move |group: &'static str| async move {
        let query = format!("batch=10&wait=true&timeout=3000&consumerGroup={group}");
        waiting.pop("queue/turns", &query).await
    };
    let (answers, planned_before) = futures::join!(join_all(["g", "g", "h", "h"].map(pop)), async {
        until_parked(&app, 4).await;
        let planned = plans(&app).await;
        app.push_one("turns", "p", "only", json!(1)).await;
        planned
    });
    let delivered: Vec<Vec<String>> = answers.iter().map(|answer| answer.transaction_ids()).collect();
    for (group, answers) in ["g", "h"].into_iter().zip(delivered.chunks(2)) {
        let mut answers = answers.to_vec();
        answers.sort();
        assert_eq!(answers, [vec![], vec!["only".to_owned()]], "one pop of group {group} received it");
    }
    // The message's pop of each group planned once; the group's other pop stayed parked until
    // its timeout, where it looked once more. Woken by the push, it would have planned twice.
    assert_eq!(plans(&app).await - planned_before, 4.0, "two deliveries and two looks at the timeout");
}

#[actix_web::test]
async fn a_waiting_pop_with_nothing_to_deliver_answers_empty_at_its_timeout() {
    let app = TestApp::spawn().await;
    let started = Instant::now();
    let answer = app.pop("queue/quiet", "batch=1&wait=true&timeout=1000").await;
    let waited = started.elapsed();
    assert_eq!(answer.status, StatusCode::NO_CONTENT);
    assert!(waited >= Duration::from_millis(950), "answered after {waited:?}, before its timeout");
    assert!(waited < Duration::from_millis(3000), "answered after {waited:?}, long past its timeout");
}

#[actix_web::test]
async fn a_pop_that_does_not_wait_answers_at_once() {
    let app = TestApp::spawn().await;
    let started = Instant::now();
    let answer = app.pop("queue/none", "batch=1&wait=false&timeout=30000").await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT);
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[actix_web::test]
async fn waiting_pops_hold_no_database_connection() {
    const WAITERS: usize = 8;
    let app = TestApp::spawn_with(|config| {
        config.database.pool_size = 2;
        config.database.pool_wait_timeout_ms = 1000;
    })
    .await;
    let routes: Vec<String> = (0..WAITERS).map(|i| format!("queue/idle-{i}")).collect();
    let waiters = routes.iter().map(|route| app.pop(route, "batch=1&wait=true&timeout=8000"));
    let busy = async {
        until_parked(&app, WAITERS).await;
        // With 8 pops parked and 2 connections, work still flows: the waiters hold none.
        let started = Instant::now();
        app.push_one("work", "p", "w", json!(1)).await;
        let popped = app.pop("queue/work", "batch=1").await;
        assert_eq!(popped.transaction_ids(), vec!["w"]);
        let connections = app
            .count("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'queen'")
            .await;
        assert!(connections <= 2, "{connections} broker connections with a pool of 2");
        let elapsed = started.elapsed();
        // Release the waiters so the test ends promptly.
        for i in 0..WAITERS {
            app.push_one(&format!("idle-{i}"), "p", "done", json!(1)).await;
        }
        elapsed
    };
    let (answers, elapsed) = futures::join!(join_all(waiters), busy);
    assert!(elapsed < Duration::from_secs(1), "push and pop took {elapsed:?} beside parked pops");
    assert!(answers.iter().all(|a| a.status == StatusCode::OK), "every waiter was woken by its push");
}

#[actix_web::test]
async fn a_pool_of_one_connection_is_left_to_the_requests() {
    let app = TestApp::spawn_with(|config| {
        config.database.pool_size = 1;
        config.database.pool_wait_timeout_ms = 1000;
    })
    .await;
    // Every push is announced to the fleet on a connection of the pool: a kept one would leave the
    // second push none.
    for i in 0..3 {
        let pushed = app.push_one("single", "p", &format!("m{i}"), json!(i)).await;
        assert_eq!(pushed["status"], "queued", "push {i}: {pushed}");
    }
    let popped = app.pop("queue/single", "batch=10").await;
    assert_eq!(popped.transaction_ids(), vec!["m0", "m1", "m2"]);
    let acked = app.ack_all(&popped.messages(), "completed", None).await;
    assert!(acked.iter().all(|a| a["success"] == true), "{acked:?}");
}

/// Sends a long poll on a raw connection, waits until it parks, then closes the connection the
/// way a client that gives up does.
async fn abandon_a_long_poll(app: &TestApp, queue: &str) {
    let socket = send_a_pop(app, &format!("/queue/{queue}?batch=1&wait=true&timeout=30000")).await;
    until_parked(app, 1).await;
    close_and_wait_for_the_broker(socket).await;
}

/// Sends `GET /api/v1/pop{target}` on a raw connection of its own.
async fn send_a_pop(app: &TestApp, target: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let address = app.base.trim_start_matches("http://");
    let mut socket = tokio::net::TcpStream::connect(address).await.expect("a connection");
    let request = format!("GET /api/v1/pop{target} HTTP/1.1\r\nHost: {address}\r\n\r\n");
    socket.write_all(request.as_bytes()).await.expect("the request");
    socket
}

/// Closes `socket` as a client that gives up does, and waits until the broker's end has the close.
async fn close_and_wait_for_the_broker(socket: tokio::net::TcpStream) {
    let client_port = socket.local_addr().expect("the client's address").port();
    let broker_port = socket.peer_addr().expect("the broker's address").port();
    drop(socket);
    until_the_broker_received_the_close(broker_port, client_port).await;
}

/// Waits until the kernel has handed the broker's end (on `broker_port`) of the connection from
/// `client_port` the client's FIN (the socket is in CLOSE_WAIT, or gone): from then on the broker
/// can see that its client left. On a loaded machine the FIN may be processed after a request sent
/// on another connection just after it. Both ports are matched: other tests' connections run
/// beside this one, and one of them may have `client_port` at its far end.
pub async fn until_the_broker_received_the_close(broker_port: u16, client_port: u16) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp")
            + &std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
        // Columns: slot, local address:port, remote address:port, state (hex): 08 is CLOSE_WAIT,
        // 09 LAST_ACK once the broker closed its end too.
        let waiting = table.lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = |at: usize| {
                fields
                    .get(at)
                    .and_then(|address| address.rsplit(':').next())
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
            };
            port(1) == Some(broker_port)
                && port(2) == Some(client_port)
                && !matches!(fields.get(3), Some(&"08") | Some(&"09"))
        });
        if !waiting {
            return;
        }
        assert!(Instant::now() < deadline, "the broker's end of port {client_port} never saw the close");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[actix_web::test]
async fn a_long_poll_whose_client_left_claims_nothing_and_gives_its_place_back() {
    let app = TestApp::spawn().await;
    abandon_a_long_poll(&app, "left").await;
    a_push_to_a_left_poll_goes_to_a_consumer_that_is_there(&app, "left").await;
    abandon_a_long_poll(&app, "idle").await;
    until_no_poll_is_parked(&app).await;
}

#[actix_web::test]
async fn a_long_poll_whose_client_leaves_while_it_claims_gives_the_claim_back() {
    a_pop_whose_client_leaves_while_it_claims_gives_the_claim_back("wait=true&timeout=30000").await;
}

#[actix_web::test]
async fn a_pop_that_does_not_wait_whose_client_leaves_while_it_claims_gives_the_claim_back() {
    a_pop_whose_client_leaves_while_it_claims_gives_the_claim_back("wait=false").await;
}

/// A pop (`query`, of one message) whose look for messages waits behind a lock on the cursors: its
/// client is there when the look starts and gone (given up) when the look claims. The claim is
/// given back, and the message goes to the next consumer on its first delivery attempt.
async fn a_pop_whose_client_leaves_while_it_claims_gives_the_claim_back(query: &str) {
    let app = TestApp::spawn().await;
    // The group's cursor made (and the broker's statements prepared) before the lock below.
    app.push_one("held", "p", "first", json!(0)).await;
    let first = app.pop("queue/held", "batch=1").await.messages();
    app.ack_all(&first, "completed", None).await;
    app.push_one("held", "p", "second", json!(1)).await;

    leave_while_the_pop_looks(&app, &format!("/queue/held?batch=1&{query}")).await;

    // The look claims the message (the cursor's lease reaches it) and gives it back at once.
    let given_back = "SELECT count(*) FROM queen.log_consumers WHERE leased_until = 2 AND lease_expires_at IS NULL";
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.count(given_back).await < 1 {
        let leased = app.count("SELECT count(*) FROM queen.log_consumers WHERE lease_expires_at > now()").await;
        assert!(Instant::now() < deadline, "the claim was not given back ({leased} live leases)");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let popped = app.pop("queue/held", "batch=1&wait=true&timeout=5000").await;
    assert_eq!(popped.transaction_ids(), vec!["second"], "delivered to a consumer that is there");
    assert_eq!(popped.messages()[0]["deliveryAttempt"], 1, "the claim given back is not counted as a delivery");
}

/// Sends the pop at `path` while its look for messages waits behind a lock on the cursors, and
/// leaves (the client closes) before the lock is released.
async fn leave_while_the_pop_looks(app: &TestApp, path: &str) {
    let mut locker = app.db.connect().await;
    let lock = locker.transaction().await.expect("a transaction");
    lock.batch_execute("LOCK TABLE queen.log_consumers IN ACCESS EXCLUSIVE MODE").await.expect("the lock");
    let socket = send_a_pop(app, path).await;
    app.until_waiting_for_a_lock("AS not_before", "the pop's look never waited for the lock").await;
    close_and_wait_for_the_broker(socket).await;
    lock.rollback().await.expect("the lock released");
}

/// The same with `autoAck`, whose claim commits the cursor at delivery: the cursor moves back, and
/// the message goes to the next consumer rather than to nobody.
#[actix_web::test]
async fn an_auto_ack_pop_whose_client_leaves_while_it_claims_moves_the_cursor_back() {
    let app = TestApp::spawn().await;
    app.push_one("held", "p", "first", json!(0)).await;
    assert_eq!(app.pop("queue/held", "batch=1&autoAck=true").await.transaction_ids(), vec!["first"]);
    app.push_one("held", "p", "second", json!(1)).await;
    let claimed_at = "SELECT (extract(epoch FROM last_claimed_at) * 1000000)::bigint FROM queen.log_consumers";
    let first_claim = app.count(claimed_at).await;

    leave_while_the_pop_looks(&app, "/queue/held?batch=1&autoAck=true&wait=false").await;

    // The claim reached the message (it is the cursor's latest) and the cursor came back, with
    // what the group counts as delivered to it.
    let moved_back = format!(
        "SELECT count(*) FROM queen.log_consumers WHERE committed = 1 AND delivered_until = 1
            AND last_claimed_at > to_timestamp({first_claim} / 1000000.0)"
    );
    let moved_back = moved_back.as_str();
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.count(moved_back).await < 1 {
        assert!(Instant::now() < deadline, "the autoAck claim's cursor was not moved back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let popped = app.pop("queue/held", "batch=1&autoAck=true").await;
    assert_eq!(popped.transaction_ids(), vec!["second"], "delivered to a consumer that is there");
}

/// A namespace pop whose client leaves after it claimed on its first queue, while its look at the
/// second waits (to make the group's cursor there, behind an uncommitted one): what it claimed on
/// both queues is given back, and both messages go to the next consumer on their first attempt.
#[actix_web::test]
async fn a_namespace_pop_whose_client_leaves_while_it_claims_gives_back_what_it_claimed_on_every_queue() {
    let app = TestApp::spawn().await;
    let configured = app.post("/api/v1/configure", &json!({"queue": "team.first", "options": {"priority": 10}})).await;
    assert_eq!(configured.body["configured"], true, "{configured:?}");
    app.push_one("team.first", "p", "on-first", json!(1)).await;
    app.push_one("team.second", "p", "on-second", json!(2)).await;

    let mut blocker = app.db.connect().await;
    let block = blocker.transaction().await.expect("a transaction");
    let cursor = "INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
                  SELECT p.id, 'g', 0 FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                   WHERE q.name = 'team.second'";
    assert_eq!(block.execute(cursor, &[]).await.expect("the cursor"), 1);
    let pop = "?namespace=team&consumerGroup=g&batch=10&partitions=10";
    let socket = send_a_pop(&app, pop).await;
    let waited = "the pop's look at the second queue never waited";
    app.until_waiting_for_a_lock("INSERT INTO queen.log_consumers", waited).await;
    let first_claimed =
        "SELECT count(*) FROM queen.log_consumers WHERE consumer_group = 'g' AND lease_expires_at > now()";
    assert_eq!(app.count(first_claimed).await, 1, "the first queue was claimed before the second was looked at");
    close_and_wait_for_the_broker(socket).await;
    block.rollback().await.expect("the cursor withdrawn");

    let given_back = "SELECT count(*) FROM queen.log_consumers
                       WHERE consumer_group = 'g' AND leased_until IS NOT NULL AND lease_expires_at IS NULL";
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.count(given_back).await < 2 {
        let leased = app.count(first_claimed).await;
        assert!(Instant::now() < deadline, "not every claim was given back ({leased} live leases)");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let popped = app.get(&format!("/api/v1/pop{pop}&wait=true&timeout=5000")).await;
    let mut delivered = popped.transaction_ids();
    delivered.sort();
    assert_eq!(delivered, vec!["on-first", "on-second"], "delivered to a consumer that is there");
    let attempts: Vec<serde_json::Value> = popped.messages().iter().map(|m| m["deliveryAttempt"].clone()).collect();
    assert!(attempts.iter().all(|a| *a == 1), "the claims given back are not counted as deliveries: {attempts:?}");
}

/// Once a long poll of `queue` was left by its client (the broker's end has its close): pushed at
/// once, before the parked pop's periodic look at its connection, a message wakes the pop, which
/// must find its client gone rather than lease the message to nobody. (If something else woke it
/// first and it is looking as the push lands, it finds its client gone once it has claimed, and
/// gives the message back.)
pub async fn a_push_to_a_left_poll_goes_to_a_consumer_that_is_there(app: &TestApp, queue: &str) {
    app.push_one(queue, "p", "for-whoever-is-there", json!(1)).await;
    let popped = app.pop(&format!("queue/{queue}"), "batch=1&wait=true&timeout=5000").await;
    assert_eq!(popped.transaction_ids(), vec!["for-whoever-is-there"], "delivered to a consumer that is there");
    assert_eq!(popped.messages()[0]["deliveryAttempt"], 1, "never delivered to the client that left");
}

/// Left without anything to wake it, a poll gives its place back within its next look at its
/// connection.
pub async fn until_no_poll_is_parked(app: &TestApp) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while app.metric("queen_long_poll_waiters").await > 0.0 {
        assert!(Instant::now() < deadline, "the abandoned poll is still parked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Pushes `count` messages to `queue`/p in one request, their transaction ids `{prefix}-{i}`.
async fn push_batch(app: &TestApp, queue: &str, prefix: &str, count: usize) {
    let items: Vec<_> = (0..count)
        .map(|i| json!({"queue": queue, "partition": "p", "transactionId": format!("{prefix}-{i}"), "payload": i}))
        .collect();
    app.push(json!(items)).await;
}

/// Pops (`wait=true`, `batch`) and acks what came; the transaction ids delivered.
async fn pop_and_ack(app: &TestApp, queue: &str, batch: u32) -> Vec<String> {
    let answer = app.pop(&format!("queue/{queue}"), &format!("batch={batch}&wait=true&timeout=5000")).await;
    app.ack_all(&answer.messages(), "completed", None).await;
    answer.transaction_ids()
}

#[actix_web::test]
async fn while_a_groups_stream_is_dense_its_long_polls_start_an_interval_apart() {
    let app = TestApp::spawn_with(|config| config.pop.dense_interval_ms = 800).await;
    // 50 messages in a pop of 100: 50 a second makes 40 an interval, past a tenth of the batch.
    push_batch(&app, "dense", "a", 50).await;
    assert_eq!(pop_and_ack(&app, "dense", 100).await.len(), 50);
    // The next pop takes the group's first slot at once; the one after it waits for the next.
    push_batch(&app, "dense", "b", 5).await;
    let second_sent = Instant::now();
    assert_eq!(pop_and_ack(&app, "dense", 100).await.len(), 5);
    assert_eq!(app.metric("queen_pops_spaced_total").await, 0.0);
    push_batch(&app, "dense", "c", 5).await;
    // While it waits for its slot, it counts among the waiting long polls (and their bound).
    let (third, ()) = futures::join!(pop_and_ack(&app, "dense", 100), until_parked(&app, 1));
    let since_second = second_sent.elapsed();
    assert_eq!(third, (0..5).map(|i| format!("c-{i}")).collect::<Vec<_>>());
    assert!(
        since_second >= Duration::from_millis(800),
        "the third pop was answered {since_second:?} after the second was sent"
    );
    assert_eq!(app.metric("queen_pops_spaced_total").await, 1.0);
}

#[actix_web::test]
async fn a_light_stream_and_a_backlog_are_never_held() {
    let app = TestApp::spawn_with(|config| config.pop.dense_interval_ms = 1000).await;
    // One message a pop of 100, five in all: short of the tenth of the batch an interval needs.
    for i in 0..5 {
        push_batch(&app, "light", &format!("l{i}"), 1).await;
        assert_eq!(pop_and_ack(&app, "light", 100).await, vec![format!("l{i}-0")]);
    }
    // A backlog: every pop comes back full.
    push_batch(&app, "backlog", "b", 300).await;
    for _ in 0..3 {
        assert_eq!(pop_and_ack(&app, "backlog", 100).await.len(), 100);
    }
    assert_eq!(app.metric("queen_pops_spaced_total").await, 0.0, "no pop waited for a slot");
}

/// A push answered 503 because its commit went unanswered may commit after the answer: its copy
/// is stored but was never announced. The producer's resend finds it a duplicate, and that
/// resend tells waiting pops: a long poll parked meanwhile gets the message, not its timeout.
#[actix_web::test]
async fn the_resend_of_a_push_whose_first_copy_committed_unannounced_wakes_a_long_poll() {
    use queen_store::log::{AppendPolicy, NewMessage, append};

    let app = TestApp::spawn().await;
    app.push_one("late", "p", "first", json!("first")).await;
    let first = app.pop("queue/late", "batch=1").await.messages();
    app.ack_all(&first, "completed", None).await;
    let destination = app.destination("late", "p").await;
    let waiting = app.pop("queue/late", "batch=1&wait=true&timeout=20000");
    let resent = async {
        until_parked(&app, 1).await;
        // The first copy, committed where no broker announces it.
        let unannounced = NewMessage {
            message_id: uuid::Uuid::now_v7(),
            transaction_id: "late".into(),
            trace_id: None,
            producer: None,
            payload: b"\"late\"".to_vec(),
            received: None,
        };
        let client = app.store_connection("the first copy").await;
        append(&client, destination, &[unannounced], &AppendPolicy::default()).await.expect("stored");
        let resent_at = Instant::now();
        let again = app.push(json!([{"queue": "late", "partition": "p", "transactionId": "late", "payload": "late"}]));
        assert_eq!(again.await[0]["status"], "duplicate");
        resent_at
    };
    let (answer, resent_at) = futures::join!(waiting, resent);
    let latency = resent_at.elapsed();
    assert_eq!(answer.transaction_ids(), vec!["late"], "{answer:?}");
    assert!(latency < Duration::from_secs(10), "answered {latency:?} after the resend, with a 20 s timeout");
}

/// A pop whose claim finds its partition held by another claim (here the test's session holds
/// the cursor; in a fleet, a pop of another broker, which announces nothing here when it passes
/// the partition over or its lease runs out) looks again soon, rather than sleep to its timeout.
#[actix_web::test]
async fn a_long_poll_that_lost_its_partition_to_another_claim_looks_again() {
    let app = TestApp::spawn().await;
    app.push_one("contested", "p", "first", json!("first")).await;
    let first = app.pop("queue/contested", "batch=1&consumerGroup=g").await.messages();
    app.ack_all(&first, "completed", Some("g")).await;
    app.push_one("contested", "p", "second", json!("second")).await;

    let holder = app.hold_cursor("g").await;
    let waiting = app.pop("queue/contested", "batch=1&consumerGroup=g&wait=true&timeout=20000");
    let released = async {
        // Parked: it has looked, found the partition free, and claimed nothing.
        until_parked(&app, 1).await;
        holder.batch_execute("ROLLBACK").await.expect("the lock released");
        Instant::now()
    };
    let (answer, released_at) = futures::join!(waiting, released);
    let latency = released_at.elapsed();
    assert_eq!(answer.transaction_ids(), vec!["second"], "{answer:?}");
    assert!(latency < Duration::from_secs(5), "answered {latency:?} after the release, with a 20 s timeout");
}
