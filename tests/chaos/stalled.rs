//! PostgreSQL that stalls or loses backends under the broker.
//!
//! - Stalled: a session of the test holds a lock that the broker's push (append), pop (lease
//!   claim) or ack needs, and the broker runs with a low `statement_timeout` / `lock_timeout`.
//!   Each request is answered 503 (the broker's JSON error, `Retry-After`) within a bound far
//!   below the client's timeout, leaves nothing half-done (no message stored, no lease granted,
//!   no cursor moved), gives its pool connection back (more stalled requests than connections
//!   leave the broker serving at once afterwards), and succeeds when sent again after the lock is
//!   released; a push sent again with its transaction id answers `queued`: it had not committed.
//! - Killed: the broker's backend is found blocked on such a lock and terminated while it waits
//!   (`pg_terminate_backend`): the request is answered 503 at once, not 500 and not a hang, the
//!   broker reconnects and the request sent again succeeds, one stored copy of a push; the LISTEN
//!   backend is terminated too, comes back, and a long poll parked on its broker is woken by a
//!   push through another broker.
//! - Storm: producers and consumers on two brokers while random broker backends are terminated
//!   every 100–300 ms; then the ledger must balance.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use queen_testkit::{BrokerProcess, TestDatabase, metric_at};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_postgres::Client;

use crate::ledger::extra_copies;
use crate::load::{Plan, Workload};
use crate::support::{assert_running, listen_backends, queen_binary, start_brokers};

/// Far beyond every bound below: a stalled request shows as a bound missed, not as a client
/// giving up.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How soon one stalled request is answered: its statement's timeout (at most 1 s here) and slack
/// for two busy cores.
const STALL_BOUND: Duration = Duration::from_secs(4);
/// How soon each of a crowd of stalled requests is answered: they take turns at the two pool
/// connections, each for at most a statement's timeout, or give up waiting for one after
/// `POOL_WAIT_MS`.
const CROWD_BOUND: Duration = Duration::from_secs(8);
/// How soon a request is served once nothing stalls it (it must not wait for a connection a
/// stalled request kept).
const SERVED_BOUND: Duration = Duration::from_secs(2);
/// How soon a request whose backend was terminated is answered after the termination.
const KILL_BOUND: Duration = Duration::from_secs(3);
/// Requests stalled at once, against a pool of two connections.
const CROWD: usize = 6;
const POOL_SIZE: &str = "2";
const POOL_WAIT_MS: &str = "2000";

/// What a client saw of one request.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    /// The JSON body; `Null` when there is none (204).
    body: Value,
    /// From sending the request to its whole answer.
    took: Duration,
    /// When the whole answer was in.
    at: Instant,
}

impl Answer {
    /// Checks the broker's refusal for a database it cannot use now: 503, `Retry-After`, and its
    /// JSON error (`success: false`, `code: "unavailable"`, a message), within `bound`.
    fn assert_unavailable(&self, what: &str, bound: Duration) {
        assert_eq!(self.status, StatusCode::SERVICE_UNAVAILABLE, "{what}: {self:?}");
        assert_eq!(self.body["success"], json!(false), "{what}: {self:?}");
        assert_eq!(self.body["code"], json!("unavailable"), "{what}: {self:?}");
        assert!(self.body["error"].as_str().is_some_and(|e| !e.is_empty()), "{what}: {self:?}");
        assert!(self.retry_after.is_some(), "{what}: a 503 without Retry-After: {self:?}");
        assert!(self.took < bound, "{what}: answered after {:?} (bound {bound:?})", self.took);
    }

    /// The status of a push's only item.
    fn pushed(&self) -> &str {
        assert_eq!(self.status, StatusCode::CREATED, "a push: {self:?}");
        self.body[0]["status"].as_str().unwrap_or_default()
    }

    /// The messages of a pop that found some.
    fn messages(&self) -> Vec<Value> {
        assert_eq!(self.status, StatusCode::OK, "a pop: {self:?}");
        self.body["messages"].as_array().cloned().unwrap_or_default()
    }

    /// The transaction ids of a pop's messages.
    fn transaction_ids(&self) -> Vec<String> {
        self.messages().iter().map(|m| m["transactionId"].as_str().unwrap_or_default().to_owned()).collect()
    }

    /// Whether an ack's only item committed its message.
    fn committed(&self) -> bool {
        assert_eq!(self.status, StatusCode::OK, "an ack: {self:?}");
        self.body[0]["success"] == json!(true) && self.body[0]["noop"] == json!(false)
    }
}

/// A broker, spoken to over HTTP.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    fn new(base: String) -> Api {
        let http = queen_testkit::http().timeout(CLIENT_TIMEOUT).build().expect("an HTTP client");
        Api { http, base }
    }

    async fn send(request: reqwest::RequestBuilder) -> Answer {
        let started = Instant::now();
        let answer = request.send().await.expect("the broker answers");
        let status = answer.status();
        let retry_after = answer.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let bytes = answer.bytes().await.expect("a whole answer");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("not JSON ({e}): {bytes:?}"))
        };
        Answer { status, retry_after, body, took: started.elapsed(), at: Instant::now() }
    }

    async fn configure(&self, queue: &str) {
        let options = json!({"queue": queue, "options": {"leaseTime": 60, "retryLimit": 10}});
        let answer = Self::send(self.http.post(format!("{}/api/v1/configure", self.base)).json(&options)).await;
        assert_eq!(answer.status, StatusCode::OK, "configure: {answer:?}");
    }

    async fn push(&self, queue: &str, partition: &str, transaction_id: &str) -> Answer {
        let items = json!({"items": [{
            "queue": queue, "partition": partition, "transactionId": transaction_id,
            "payload": {"id": transaction_id},
        }]});
        Self::send(self.http.post(format!("{}/api/v1/push", self.base)).json(&items)).await
    }

    /// Pops from one partition for `group`; `extra` is more of the query (`&wait=true...`).
    async fn pop(&self, queue: &str, partition: &str, group: &str, extra: &str) -> Answer {
        let url = format!("{}/api/v1/pop/queue/{queue}/partition/{partition}?consumerGroup={group}{extra}", self.base);
        Self::send(self.http.get(url)).await
    }

    /// Acks a popped message as completed, under the lease it came with.
    async fn ack(&self, group: &str, message: &Value) -> Answer {
        let ack = json!({
            "transactionId": message["transactionId"], "partitionId": message["partitionId"],
            "leaseId": message["leaseId"], "status": "completed", "consumerGroup": group,
        });
        Self::send(self.http.post(format!("{}/api/v1/ack", self.base)).json(&ack)).await
    }
}

/// The id of partition `partition` of `queue`.
async fn partition_id(sql: &Client, queue: &str, partition: &str) -> i64 {
    sql.query_one(
        "SELECT p.id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 AND p.name = $2",
        &[&queue, &partition],
    )
    .await
    .expect("the partition exists")
    .get(0)
}

/// How many stored messages carry `transaction_id`.
async fn copies(sql: &Client, transaction_id: &str) -> i64 {
    sql.query_one("SELECT count(*) FROM queen.log_message_ids WHERE transaction_id = $1", &[&transaction_id])
        .await
        .expect("log_message_ids")
        .get(0)
}

/// A group's cursor on a partition: (committed, whether `lease_expires_at` is set).
async fn cursor(sql: &Client, partition_id: i64, group: &str) -> Option<(i64, bool)> {
    sql.query_opt(
        "SELECT committed, lease_expires_at IS NOT NULL FROM queen.log_consumers
          WHERE partition_id = $1 AND consumer_group = $2",
        &[&partition_id, &group],
    )
    .await
    .expect("log_consumers")
    .map(|row| (row.get(0), row.get(1)))
}

/// A session of the test that holds locks the broker needs, in a transaction of its own.
struct Holder(Client);

impl Holder {
    /// Begins a transaction and takes what `lock` takes (a `LOCK TABLE` or a `SELECT ... FOR
    /// UPDATE`), until [`Holder::release`].
    async fn hold(&self, lock: &str) {
        self.0.batch_execute(&format!("BEGIN; {lock}")).await.unwrap_or_else(|e| panic!("{lock}: {e}"));
    }

    async fn release(&self) {
        self.0.batch_execute("ROLLBACK").await.expect("the lock is released");
    }
}

/// Waits until `condition` holds, polling, at most `limit`.
async fn until<F, Fut>(what: &str, limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !condition().await {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One broker with a pool of two connections and these statement and lock timeouts, on a
/// database of its own; a push, an ack and a pop each stalled by a lock, then a crowd of them.
async fn stalled(label: &str, statement_timeout_ms: &str, lock_timeout_ms: &str, fired: &str) {
    const QUEUE: &str = "stalled";
    let db = TestDatabase::create(label).await;
    let sql = db.connect().await;
    let holder = Holder(db.connect().await);
    let settings = [
        ("QUEEN_DATABASE__STATEMENT_TIMEOUT_MS", statement_timeout_ms),
        ("QUEEN_DATABASE__LOCK_TIMEOUT_MS", lock_timeout_ms),
        ("QUEEN_DATABASE__POOL_SIZE", POOL_SIZE),
        ("QUEEN_DATABASE__POOL_WAIT_TIMEOUT_MS", POOL_WAIT_MS),
    ];
    let mut broker = BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &settings).await;
    let api = Api::new(broker.url());
    api.configure(QUEUE).await;
    // Every partition the test uses, with a first message.
    for i in 0..CROWD {
        assert_eq!(api.push(QUEUE, &format!("p{i}"), &format!("seed{i}")).await.pushed(), "queued");
    }
    let p0 = partition_id(&sql, QUEUE, "p0").await;
    let mut took = BTreeMap::new();

    // A push whose append waits for the partition row.
    holder.hold(&format!("SELECT 1 FROM queen.partitions WHERE id = {p0} FOR UPDATE")).await;
    let answer = api.push(QUEUE, "p0", "m1").await;
    answer.assert_unavailable("a push to a locked partition", STALL_BOUND);
    took.insert("push", answer.took);
    assert_eq!(copies(&sql, "m1").await, 0, "the refused push stored nothing");
    holder.release().await;
    let again = api.push(QUEUE, "p0", "m1").await;
    assert_eq!(again.pushed(), "queued", "the push sent again had not committed before: {again:?}");
    assert_eq!(copies(&sql, "m1").await, 1);

    // An ack whose transaction waits for the cursor row.
    let popped = api.pop(QUEUE, "p0", "g", "&batch=1").await;
    assert_eq!(popped.transaction_ids(), ["seed0"]);
    let seed0 = popped.messages()[0].clone();
    holder
        .hold(&format!(
            "SELECT 1 FROM queen.log_consumers WHERE partition_id = {p0} AND consumer_group = 'g' FOR UPDATE"
        ))
        .await;
    let answer = api.ack("g", &seed0).await;
    answer.assert_unavailable("an ack of a locked cursor", STALL_BOUND);
    took.insert("ack", answer.took);
    assert_eq!(cursor(&sql, p0, "g").await, Some((0, true)), "the refused ack moved nothing; the lease stands");
    holder.release().await;
    assert!(api.ack("g", &seed0).await.committed(), "the ack sent again commits");
    assert_eq!(cursor(&sql, p0, "g").await, Some((1, false)), "committed, lease released");

    // A pop whose lease claim waits for the cursors' table (its candidates are read first).
    holder.hold("LOCK TABLE queen.log_consumers IN EXCLUSIVE MODE").await;
    let answer = api.pop(QUEUE, "p0", "g", "&batch=1").await;
    answer.assert_unavailable("a pop whose claim waits", STALL_BOUND);
    took.insert("pop", answer.took);
    assert_eq!(cursor(&sql, p0, "g").await, Some((1, false)), "the refused pop left no lease granted");
    holder.release().await;
    let popped = api.pop(QUEUE, "p0", "g", "&batch=1").await;
    assert_eq!(popped.transaction_ids(), ["m1"], "the pop sent again is served");
    assert!(api.ack("g", &popped.messages()[0]).await.committed());

    // More stalled requests than the pool has connections: pushes to every partition, and pops
    // of a new group, whose cursors cannot be made.
    holder.hold("LOCK TABLE queen.partitions, queen.log_consumers IN EXCLUSIVE MODE").await;
    let pushes: Vec<_> = (0..CROWD)
        .map(|i| {
            let api = api.clone();
            tokio::spawn(async move { api.push(QUEUE, &format!("p{i}"), &format!("crowd{i}")).await })
        })
        .collect();
    let pops: Vec<_> = (0..2)
        .map(|i| {
            let api = api.clone();
            tokio::spawn(async move { api.pop(QUEUE, &format!("p{i}"), "g2", "&batch=5").await })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for (i, answer) in futures::future::join_all(pushes).await.into_iter().enumerate() {
        let answer = answer.expect("a crowd push");
        answer.assert_unavailable(&format!("crowd push {i}"), CROWD_BOUND);
        slowest = slowest.max(answer.took);
    }
    for (i, answer) in futures::future::join_all(pops).await.into_iter().enumerate() {
        let answer = answer.expect("a crowd pop");
        answer.assert_unavailable(&format!("crowd pop {i}"), CROWD_BOUND);
        slowest = slowest.max(answer.took);
    }
    took.insert("slowest of the crowd", slowest);
    for i in 0..CROWD {
        assert_eq!(copies(&sql, &format!("crowd{i}")).await, 0, "a refused crowd push stored nothing");
    }
    let leased: i64 = sql
        .query_one(
            "SELECT count(*) FROM queen.log_consumers WHERE consumer_group = 'g2' AND lease_expires_at IS NOT NULL",
            &[],
        )
        .await
        .expect("log_consumers")
        .get(0);
    assert_eq!(leased, 0, "the refused pops left no lease granted");
    holder.release().await;

    // Served at once: no connection was kept by a stalled request.
    let served = Instant::now();
    assert_eq!(api.push(QUEUE, "p0", "after").await.pushed(), "queued");
    let popped = api.pop(QUEUE, "p0", "g", "&batch=1").await;
    assert_eq!(popped.transaction_ids(), ["after"]);
    assert!(api.ack("g", &popped.messages()[0]).await.committed());
    let served = served.elapsed();
    assert!(served < SERVED_BOUND, "push, pop and ack took {served:?} after the stall");
    took.insert("push+pop+ack after the crowd", served);
    // The crowd sent again: each push had not committed, and is stored once.
    for i in 0..CROWD {
        let id = format!("crowd{i}");
        assert_eq!(api.push(QUEUE, &format!("p{i}"), &id).await.pushed(), "queued", "{id} sent again");
        assert_eq!(copies(&sql, &id).await, 1, "{id} is stored once");
    }
    let popped = api.pop(QUEUE, "p0", "g2", "&batch=5").await;
    assert_eq!(popped.transaction_ids(), ["seed0", "m1", "after", "crowd0"], "the new group is served from the start");
    assert_eq!(extra_copies(&sql, QUEUE).await, Vec::<String>::new(), "no partition holds a second copy");

    assert_running(std::slice::from_mut(&mut broker)).await;
    println!(
        "stalled ({fired}; statement_timeout {statement_timeout_ms} ms, lock_timeout {lock_timeout_ms} ms): {took:?}"
    );
}

// In each, the other timeout is ten seconds, past `STALL_BOUND`: an answer within the bound is
// the timeout under test's.

#[tokio::test]
async fn stalled_by_lock_timeout_answers_503_quickly_and_leaves_nothing_half_applied() {
    stalled("chaos_stalled_lock", "10000", "500", "lock timeout").await;
}

#[tokio::test]
async fn stalled_by_statement_timeout_answers_503_quickly_and_leaves_nothing_half_applied() {
    stalled("chaos_stalled_statement", "1000", "10000", "statement timeout").await;
}

/// A broker backend of the test's database that waits for a lock, whose statement contains
/// `statement`: its pid and statement, once there is one.
async fn blocked_backend(sql: &Client, statement: &str) -> (i32, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = sql
            .query(
                "SELECT pid, query FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock' AND application_name = 'queen'
                    AND strpos(query, $1) > 0",
                &[&statement],
            )
            .await
            .expect("pg_stat_activity");
        match &rows[..] {
            [row] => return (row.get(0), row.get(1)),
            [] => {}
            more => panic!("{} broker backends wait in {statement:?}", more.len()),
        }
        assert!(Instant::now() < deadline, "no broker backend waits in {statement:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn terminate(sql: &Client, pid: i32) {
    let done: bool = sql.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.expect("terminate").get(0);
    assert!(done, "backend {pid} was terminated");
}

/// What one request blocked on a lock did when its backend was terminated.
struct Cut {
    answer: Answer,
    /// From the termination to the answer.
    after_kill: Duration,
    statement: String,
}

/// Sends `request` while `holder` holds `lock`, terminates the broker backend that waits in a
/// statement containing `statement`, and returns the answer (the lock is still held).
async fn cut<F>(sql: &Client, holder: &Holder, lock: &str, statement: &str, request: F) -> Cut
where
    F: std::future::Future<Output = Answer> + Send + 'static,
{
    holder.hold(lock).await;
    let pending = tokio::spawn(request);
    let (pid, query) = blocked_backend(sql, statement).await;
    let killed = Instant::now();
    terminate(sql, pid).await;
    let answer = pending.await.expect("the request");
    let after_kill = answer.at.saturating_duration_since(killed);
    Cut { answer, after_kill, statement: query.split_whitespace().take(6).collect::<Vec<_>>().join(" ") }
}

#[tokio::test]
async fn killed_backends_mid_operation_answer_503_and_the_retry_succeeds() {
    const QUEUE: &str = "killed";
    let db = TestDatabase::create("chaos_killed").await;
    let sql = db.connect().await;
    let holder = Holder(db.connect().await);
    // Nothing but the termination ends a wait.
    let settings = [
        ("QUEEN_DATABASE__STATEMENT_TIMEOUT_MS", "60000"),
        ("QUEEN_DATABASE__LOCK_TIMEOUT_MS", "60000"),
        ("QUEEN_DATABASE__ANSWER_WITHIN_MS", "120000"),
    ];
    let first = BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &settings).await;
    let sql = &sql;
    until("the first broker listens", Duration::from_secs(30), || async move { listen_backends(sql).await.len() == 1 })
        .await;
    let first_listener = listen_backends(sql).await[0].0;
    let second = BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &settings).await;
    until("both brokers listen", Duration::from_secs(30), || async move { listen_backends(sql).await.len() == 2 })
        .await;
    let (api, other) = (Api::new(first.url()), Api::new(second.url()));
    api.configure(QUEUE).await;
    assert_eq!(api.push(QUEUE, "p", "seed").await.pushed(), "queued");
    let p = partition_id(sql, QUEUE, "p").await;
    let mut report = Vec::new();

    // The append, terminated while it waits for the partition row.
    let lock = format!("SELECT 1 FROM queen.partitions WHERE id = {p} FOR UPDATE");
    let push = {
        let api = api.clone();
        async move { api.push(QUEUE, "p", "m1").await }
    };
    let cut_push = cut(sql, &holder, &lock, "UPDATE queen.partitions", push).await;
    cut_push.answer.assert_unavailable("a push whose backend was terminated", CLIENT_TIMEOUT);
    assert_eq!(copies(sql, "m1").await, 0, "the terminated append stored nothing");
    holder.release().await;
    let again = api.push(QUEUE, "p", "m1").await;
    assert_eq!(again.pushed(), "queued", "the push sent again: {again:?}");
    assert_eq!(copies(sql, "m1").await, 1, "one stored copy");
    report.push(("push", cut_push));

    // The ack, terminated while it waits for the cursor row: it completes the delivery its lease
    // made, so it is the one `UPDATE` of `queen_store::completed_spans`.
    let popped = api.pop(QUEUE, "p", "g", "&batch=1").await;
    assert_eq!(popped.transaction_ids(), ["seed"]);
    let seed = popped.messages()[0].clone();
    let lock =
        format!("SELECT 1 FROM queen.log_consumers WHERE partition_id = {p} AND consumer_group = 'g' FOR UPDATE");
    let ack = {
        let (api, seed) = (api.clone(), seed.clone());
        async move { api.ack("g", &seed).await }
    };
    let cut_ack = cut(sql, &holder, &lock, "UPDATE queen.log_consumers c", ack).await;
    cut_ack.answer.assert_unavailable("an ack whose backend was terminated", CLIENT_TIMEOUT);
    assert_eq!(cursor(sql, p, "g").await, Some((0, true)), "the terminated ack moved nothing");
    holder.release().await;
    assert!(api.ack("g", &seed).await.committed(), "the ack sent again commits");
    assert_eq!(cursor(sql, p, "g").await, Some((1, false)));
    report.push(("ack", cut_ack));

    // The lease claim, terminated while it waits for the cursors' table.
    let pop = {
        let api = api.clone();
        async move { api.pop(QUEUE, "p", "g", "&batch=1").await }
    };
    let lock = "LOCK TABLE queen.log_consumers IN EXCLUSIVE MODE";
    let cut_pop = cut(sql, &holder, lock, "WITH candidate AS", pop).await;
    cut_pop.answer.assert_unavailable("a pop whose backend was terminated", CLIENT_TIMEOUT);
    assert_eq!(cursor(sql, p, "g").await, Some((1, false)), "the terminated claim granted no lease");
    holder.release().await;
    let popped = api.pop(QUEUE, "p", "g", "&batch=1").await;
    assert_eq!(popped.transaction_ids(), ["m1"], "the pop sent again is served");
    assert!(api.ack("g", &popped.messages()[0]).await.committed());
    report.push(("pop", cut_pop));

    for (what, cut) in &report {
        assert!(cut.after_kill < KILL_BOUND, "the {what} was answered {:?} after the termination", cut.after_kill);
    }

    // The first broker's LISTEN backend, terminated under a long poll parked on that broker.
    let parked = {
        let api = api.clone();
        tokio::spawn(async move { api.pop("woken", "p", "w", "&wait=true&timeout=20000").await })
    };
    let (http, base) = (&api.http, api.base.as_str());
    until("the long poll parks", Duration::from_secs(10), || async move {
        metric_at(http, base, "queen_long_poll_waiters").await >= 1.0
    })
    .await;
    terminate(sql, first_listener).await;
    let lost = Instant::now();
    until("the first broker listens again", Duration::from_secs(10), || async move {
        let now = listen_backends(sql).await;
        now.len() == 2 && now.iter().all(|(pid, listening)| *pid != first_listener && *listening)
    })
    .await;
    let relistened = lost.elapsed();
    let pushed = Instant::now();
    assert_eq!(other.push("woken", "p", "late").await.pushed(), "queued");
    let woken = parked.await.expect("the long poll");
    assert_eq!(woken.transaction_ids(), ["late"], "the parked long poll is served the push");
    let woken_after = woken.at.saturating_duration_since(pushed);
    assert!(woken_after < KILL_BOUND, "the parked long poll was answered {woken_after:?} after the push");

    assert_eq!(extra_copies(sql, QUEUE).await, Vec::<String>::new(), "no partition holds a second copy");
    let mut brokers = [first, second];
    assert_running(&mut brokers).await;
    for (what, cut) in &report {
        println!(
            "killed {what}: waited in `{}`, answered {} {:?} after the termination ({:?} in all)",
            cut.statement, cut.answer.status, cut.after_kill, cut.answer.took
        );
    }
    println!(
        "killed LISTEN: listening again after {relistened:?}; the parked long poll woken {woken_after:?} after a push on the other broker"
    );
}

/// A small xorshift generator: the storm's choices need no more.
struct Dice(u64);

impl Dice {
    fn new() -> Dice {
        Dice((uuid::Uuid::new_v4().as_u128() as u64) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// What a backend was doing when it was terminated.
fn kind_of(application: &str, state: &str, query: &str) -> &'static str {
    if application == "queen-listen" {
        return "listen";
    }
    match state {
        "active" => {}
        "idle" => return "idle",
        s if s.starts_with("idle in transaction") => return "idle in transaction",
        _ => return "other",
    }
    if query.contains("INSERT INTO queen.log_segments") {
        "append"
    } else if query.contains("WITH candidate AS") {
        "claim"
    } else if query.contains("FOR UPDATE OF c") {
        "ack (cursor lock)"
    } else if query.contains("SET committed = u.high") {
        "ack (one statement)"
    } else if query.contains("FROM queen.log_message_ids") {
        "message id lookup"
    } else if query.contains("FROM queen.log_segments") {
        "segment read"
    } else if query.contains("queen.log_consumers") {
        "cursor write"
    } else if query.trim_start().to_ascii_uppercase().starts_with("COMMIT") {
        "commit"
    } else {
        "other statement"
    }
}

/// What the storm did.
#[derive(Debug, Default)]
pub(crate) struct Storm {
    pub(crate) rounds: u32,
    pub(crate) kills: u32,
    /// Kills by what the backend was doing.
    pub(crate) kinds: BTreeMap<&'static str, u32>,
}

/// Terminates random broker backends of `sql`'s database for `length`: each round all of them
/// (one round in four) or a random half, every 100–300 ms, noting what each was doing.
pub(crate) async fn storm(sql: &Client, length: Duration) -> Storm {
    let mut dice = Dice::new();
    let mut storm = Storm::default();
    let started = Instant::now();
    while started.elapsed() < length {
        storm.rounds += 1;
        let backends = sql
            .query(
                "SELECT pid, application_name, coalesce(state, ''), coalesce(query, '') FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name LIKE 'queen%' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("pg_stat_activity");
        let all = dice.next().is_multiple_of(4);
        for backend in &backends {
            if !all && dice.next().is_multiple_of(2) {
                continue;
            }
            let pid: i32 = backend.get(0);
            let killed: bool =
                sql.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.expect("terminate").get(0);
            if killed {
                storm.kills += 1;
                *storm.kinds.entry(kind_of(backend.get(1), backend.get(2), backend.get(3))).or_default() += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100 + dice.next() % 201)).await;
    }
    storm
}

/// How soon a push is answered, whatever the storm does to its backend.
const PROBE_BOUND: Duration = Duration::from_secs(5);

/// What the probe saw: a push every 50 ms, to each broker in turn, while the storm lasts.
#[derive(Debug, Default)]
struct Probed {
    /// Answers by HTTP status.
    statuses: BTreeMap<u16, u32>,
    slowest: Duration,
}

async fn probe(bases: Vec<String>, storming: Arc<AtomicBool>) -> Probed {
    let apis: Vec<Api> = bases.into_iter().map(Api::new).collect();
    let mut probed = Probed::default();
    for attempt in 0usize.. {
        if !storming.load(Ordering::SeqCst) {
            break;
        }
        let answer = apis[attempt % apis.len()].push("probe", "p", &format!("probe{attempt}")).await;
        *probed.statuses.entry(answer.status.as_u16()).or_default() += 1;
        probed.slowest = probed.slowest.max(answer.took);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    probed
}

#[tokio::test]
async fn storm_of_killed_backends_under_load_balances_the_ledger() {
    const QUEUE: &str = "storm";
    let db = TestDatabase::create("chaos_storm").await;
    // What each reconnection costs the brokers, roughly (the same client library, built alike).
    let connecting = Instant::now();
    let sql = db.connect().await;
    let connect_took = connecting.elapsed();
    let mut brokers = start_brokers(db.url(), 2, &[]).await;
    let bases: Vec<String> = brokers.iter().map(BrokerProcess::url).collect();
    let workload = Workload::start(Plan::new(bases.clone(), QUEUE)).await;
    workload.until_acknowledged(60, Duration::from_secs(30)).await;
    let before = workload.ledger().acknowledged_count();
    let storming = Arc::new(AtomicBool::new(true));
    let probe = tokio::spawn(probe(bases.clone(), Arc::clone(&storming)));
    let storm = storm(&sql, Duration::from_secs(8)).await;
    storming.store(false, Ordering::SeqCst);
    let during = workload.ledger().acknowledged_count() - before;
    let probed = probe.await.expect("the probe");
    println!("storm probe (a new connection takes about {connect_took:?}): {probed:?}");
    let slowest = probed.slowest;
    assert!(slowest < PROBE_BOUND, "a push during the storm was answered after {slowest:?}: {probed:?}");
    for status in probed.statuses.keys() {
        assert!(matches!(*status, 201 | 503), "a push during the storm was answered {status}: {probed:?}");
    }
    // The brokers recover: more is pushed, then everything is consumed.
    workload.until_acknowledged(60, Duration::from_secs(30)).await;
    let ledger = workload.finish(&sql, Duration::from_secs(60)).await;
    let summary = ledger.summary();
    println!(
        "storm: {} kills in {} rounds ({:?}); {} pushes acknowledged ({during} during the storm), {} deliveries, {} redeliveries",
        storm.kills, storm.rounds, storm.kinds, summary.acknowledged, summary.deliveries, summary.redeliveries
    );
    ledger.verify(&sql).await;
    assert!(storm.kills >= 20, "the storm terminated backends: {storm:?}");
    assert_running(&mut brokers).await;
}

/// How long each stall of the ledger test holds its lock: several lock timeouts.
const STALL: Duration = Duration::from_secs(3);

#[tokio::test]
async fn stalled_statements_under_load_answer_503_and_balance_the_ledger() {
    const QUEUE: &str = "stalled_load";
    let db = TestDatabase::create("chaos_stalled_load").await;
    let sql = db.connect().await;
    let holder = Holder(db.connect().await);
    let settings = [("QUEEN_DATABASE__LOCK_TIMEOUT_MS", "500"), ("QUEEN_DATABASE__STATEMENT_TIMEOUT_MS", "5000")];
    let mut brokers = start_brokers(db.url(), 2, &settings).await;
    let bases: Vec<String> = brokers.iter().map(BrokerProcess::url).collect();
    let workload = Workload::start(Plan::new(bases.clone(), QUEUE)).await;
    workload.until_acknowledged(100, Duration::from_secs(30)).await;
    let http = queen_testkit::http().build().expect("a client");
    let refused = "queen_db_errors_total{kind=\"refused\"}";
    let mut before = 0.0;
    for base in &bases {
        before += metric_at(&http, base, refused).await;
    }
    // Appends wait on the partition rows, then claims and acks on the cursor rows: each past the
    // lock timeout, while producers and consumers go on.
    for lock in ["LOCK TABLE queen.partitions IN EXCLUSIVE MODE", "LOCK TABLE queen.log_consumers IN EXCLUSIVE MODE"] {
        holder.hold(lock).await;
        tokio::time::sleep(STALL).await;
        holder.release().await;
        workload.until_acknowledged(50, Duration::from_secs(30)).await;
    }
    let mut after = 0.0;
    for base in &bases {
        after += metric_at(&http, base, refused).await;
    }
    assert!(after > before, "statements timed out on the held locks ({before} then {after})");
    let ledger = workload.finish(&sql, Duration::from_secs(60)).await;
    println!("stalled under load: {} statements timed out; {}", after - before, ledger.summary());
    ledger.verify(&sql).await;
    assert_running(&mut brokers).await;
}
