//! Failover to a standby under load: the standby falls a second behind, the primary is stopped
//! hard and the standby promoted; the brokers find the new primary through their multi-host URL
//! (`target_session_attrs=read-write`) by themselves.

use std::time::{Duration, Instant};

use base64::Engine;
use queen_testkit::BrokerProcess;
use reqwest::StatusCode;
use serde_json::json;

use crate::cluster::{Address, DATABASE, Pair, Replication};
use crate::load::{Plan, Workload};
use crate::support::{assert_running, start_brokers};

/// The reconnection bound the brokers must meet after a promotion.
const RECONNECT_BOUND: Duration = Duration::from_secs(10);

/// How long the standby is kept behind before the primary fails.
const STANDBY_LAG: Duration = Duration::from_secs(1);

/// What one failover run measured.
struct Failover {
    /// Per broker: from the promotion to its first acknowledged push.
    reconnect: Vec<Duration>,
    /// Acknowledged pushes missing after the failover.
    lost: Vec<String>,
    /// Pushes acknowledged while the standby was kept behind (including answers under way when
    /// it began, whose commits it had received).
    acknowledged_while_behind: usize,
    acknowledged: usize,
}

async fn fail_over(replication: Replication) -> Failover {
    let label = format!("failover_{replication:?}").to_lowercase();
    let pair = Pair::start(&label, replication).await;
    let mut brokers = start_brokers(&pair.url(), 2, &[]).await;
    let bases: Vec<String> = brokers.iter().map(BrokerProcess::url).collect();
    let workload = Workload::start(Plan::new(bases.clone(), "failover")).await;
    workload.until_acknowledged(300, Duration::from_secs(60)).await;

    // The standby falls behind (as over a slow network) and the primary fails: what it
    // acknowledged meanwhile exists only on it. With synchronous replication a commit waits for
    // the standby, so nothing can be acknowledged meanwhile.
    pair.stall_standby().await;
    let replicated = workload.ledger().acknowledged_ids();
    tokio::time::sleep(STANDBY_LAG).await;
    pair.primary.kill().await;
    pair.cut_replication();
    let acknowledged_while_behind = workload.ledger().acknowledged_count() - replicated.len();
    pair.standby.promote().await;
    let promoted = Instant::now();
    let http = queen_testkit::http().timeout(Duration::from_secs(5)).build().expect("a client");
    let mut reconnect = Vec::new();
    for (b, base) in bases.iter().enumerate() {
        for attempt in 0.. {
            let probe =
                json!({"items": [{"queue": "probe", "transactionId": format!("b{b}-{attempt}"), "payload": 1}]});
            let answer = http.post(format!("{base}/api/v1/push")).json(&probe).send().await;
            if answer.is_ok_and(|answer| answer.status() == StatusCode::CREATED) {
                break;
            }
            assert!(promoted.elapsed() < Duration::from_secs(60), "broker {b} never wrote to the new primary");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        reconnect.push(promoted.elapsed());
    }
    let new_primary = pair.standby.connect(DATABASE).await;
    // Both brokers listen again, on the new primary.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listening: i64 = new_primary
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'queen-listen'",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        if listening == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the brokers did not LISTEN on the new primary ({listening})");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Consumers resume: more is pushed and everything is consumed.
    workload.until_acknowledged(200, Duration::from_secs(60)).await;
    let ledger = workload.finish(&new_primary, Duration::from_secs(90)).await;
    // Sent after the promotion, a push can only have been written on the new primary.
    let sent_after_promotion = ledger.acknowledged_ids_sent_since(promoted);
    let summary = ledger.summary();
    println!("failover ({replication:?}): {summary}");
    let acknowledged = summary.acknowledged;
    let lost = match replication {
        Replication::Synchronous => {
            ledger.verify(&new_primary).await;
            Vec::new()
        }
        Replication::Asynchronous => ledger.verify_allowing_loss(&new_primary).await,
    };
    let wrongly_lost: Vec<&String> = lost.iter().filter(|id| replicated.contains(*id)).collect();
    assert!(wrongly_lost.is_empty(), "pushes the standby had received were lost: {wrongly_lost:?}");
    // Nor is one the new primary took (served over by cached segments of the old one, say).
    let lost_after: Vec<&String> = lost.iter().filter(|id| sent_after_promotion.contains(*id)).collect();
    assert!(lost_after.is_empty(), "pushes acknowledged after the promotion were lost: {lost_after:?}");
    assert_running(&mut brokers).await;
    Failover { reconnect, lost, acknowledged_while_behind, acknowledged }
}

impl Failover {
    /// Prints what was measured, and checks the reconnection bound.
    fn report(&self, replication: Replication) {
        println!(
            "failover ({replication:?} standby {STANDBY_LAG:?} behind): brokers wrote again {:?} after the \
             promotion; {} pushes acknowledged, {} of them while the standby was behind, {} lost",
            self.reconnect,
            self.acknowledged,
            self.acknowledged_while_behind,
            self.lost.len()
        );
        for (b, took) in self.reconnect.iter().enumerate() {
            assert!(*took < RECONNECT_BOUND, "broker {b} took {took:?} to reach the new primary");
        }
    }
}

#[tokio::test]
async fn failover_to_a_synchronous_standby_loses_no_acknowledged_push() {
    fail_over(Replication::Synchronous).await.report(Replication::Synchronous);
}

/// With asynchronous replication, the pushes acknowledged inside the replication lag are lost
/// with the primary, and only those; every other promise holds. The standby is held a second
/// behind so that the lag is measurable on loopback; the count is reported (see README).
#[tokio::test]
async fn failover_to_a_lagging_asynchronous_standby_loses_only_what_it_had_not_received() {
    let run = fail_over(Replication::Asynchronous).await;
    run.report(Replication::Asynchronous);
    assert!(!run.lost.is_empty(), "acknowledged pushes the standby never received cannot survive it");
}

/// The broker's bound on a write PostgreSQL does not answer, in these tests.
const ANSWER_WITHIN: &str = "10000";

/// How soon a write whose commit waits on a silent synchronous standby is answered: the broker's
/// bound on such a write, and slack for two busy cores.
const SILENT_STANDBY_BOUND: Duration = Duration::from_secs(15);

/// A broker on a primary with a synchronous standby, its bound on an unanswered write at 10 s,
/// and the calls to it.
async fn broker_on_a_synchronous_pair(name: &str) -> (Pair, Vec<BrokerProcess>, Api) {
    let pair = Pair::start(name, Replication::Synchronous).await;
    // The lock timeout stays under the bound, as the broker requires.
    let envs = [("QUEEN_DATABASE__ANSWER_WITHIN_MS", ANSWER_WITHIN), ("QUEEN_DATABASE__LOCK_TIMEOUT_MS", "5000")];
    let brokers = start_brokers(&pair.url(), 1, &envs).await;
    let api = Api::new(&brokers[0].url());
    (pair, brokers, api)
}

/// A synchronous standby that stops answering: PostgreSQL never times out a commit, so without a
/// bound of the broker's own each write of the delivery path would wait for as long as the
/// standby stays silent. A push (creating its queue or not), a group's first pop and first pop of
/// a partition, an auto-acked pop's claim, an ack, a transaction and a key/value, lock or timers
/// call are each answered 503 instead (whether they took effect is unknown), a lease extension
/// does not wait, and once the standby answers again, each sent again takes effect once: nothing
/// is stored or acked twice.
#[tokio::test]
async fn writes_whose_commit_waits_on_a_silent_standby_are_answered_503_and_take_effect_once() {
    let (pair, mut brokers, api) = broker_on_a_synchronous_pair("silent_standby").await;
    // Before: the queues and partitions exist (but `silent-new`, which a push creates while the
    // standby is silent); groups `g`, `t` and `x` each hold a lease on the first message of
    // `silent`, and `h` has read and acked it; `newcomer` pops for the first time while it is.
    // The writes touch no row another of them locks.
    for id in ["first", "second", "third"] {
        assert_eq!(api.push("silent", id).await.status(), StatusCode::CREATED);
    }
    for queue in ["silent-push", "silent-next"] {
        assert_eq!(api.push(queue, "seed").await.status(), StatusCode::CREATED);
    }
    let leased_to_g = api.pop("g", 1).await.expect("g pops").remove(0);
    let leased_to_t = api.pop("t", 1).await.expect("t pops").remove(0);
    let leased_to_x = api.pop("x", 1).await.expect("x pops").remove(0);
    // Group `c` reads partition p1 of `silent-cursor`; p2, new to it, needs a cursor made.
    for (partition, id) in [("p1", "cursor-1"), ("p2", "cursor-2")] {
        assert_eq!(api.push_to("silent-cursor", partition, id).await.status(), StatusCode::CREATED);
    }
    assert_eq!(api.pop_partition("c", "p1").await.status(), StatusCode::OK);
    let first_of_h = api.pop("h", 1).await.expect("h pops").remove(0);
    assert_eq!(api.ack("h", &first_of_h).await.status(), StatusCode::OK);

    pair.stall_standby().await;
    let sent = Instant::now();
    let transaction = json!({"operations": [
        ack_op(&leased_to_t, "t"),
        {"type": "push", "items": [{"queue": "silent-next", "partition": "p", "transactionId": "pushed-in-transaction", "payload": 1}]},
    ]});
    let kv_put = json!({"operations": [{"op": "put", "ns": "silent", "key": "k", "value": 1, "forever": true}]});
    let acquire = json!({"operations": [{"op": "acquire", "name": "silent-lock", "ttlSeconds": 60, "owner": "me"}]});
    let payload = base64::engine::general_purpose::STANDARD.encode(b"{\"timer\": 1}");
    let schedule = json!({"operations": [{"op": "schedule", "queue": "silent-push", "timerKey": "t1",
                                          "payload": payload, "delayMs": 3_600_000, "txn": "timer-1"}]});
    let (kv_written, locked, scheduled) =
        (api.post("kv", &kv_put), api.post("locks", &acquire), api.post("timers", &schedule));
    // A push to `silent-push` once commits wait for the standby: queued behind `during`'s write,
    // it is answered within the bound too, not after that write's bound and then its own.
    let watcher = pair.primary.connect("postgres").await;
    let queued = async {
        let deadline = Instant::now() + Duration::from_secs(5);
        let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'";
        while watcher.query_one(waiting, &[]).await.expect("pg_stat_activity").get::<_, i64>(0) == 0 {
            assert!(Instant::now() < deadline, "no commit waits for the standby");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        api.push("silent-push", "queued-during").await
    };
    let (
        pushed,
        queued,
        created,
        registered,
        cursor_made,
        claimed,
        acked,
        transacted,
        extended,
        kv_written,
        locked,
        scheduled,
    ) = tokio::join!(
        api.push("silent-push", "during"),
        queued,
        api.push("silent-new", "created-during"),
        // A group's first pop registers it.
        api.pop_answer("newcomer", 1, ""),
        api.pop_partition("c", "p2"),
        // Auto-acked: a claim that takes a lease commits without waiting for the standby.
        api.pop_answer("h", 1, "&autoAck=true"),
        api.ack("g", &leased_to_g),
        api.transaction(&transaction),
        // A lease, taken or extended, does not wait for the standby either.
        api.extend(&leased_to_x),
        kv_written,
        locked,
        scheduled,
    );
    let took = sent.elapsed();
    assert_eq!(extended.status(), StatusCode::OK, "the lease extension: {:?}", extended.text().await);
    let (status, text) = (queued.status(), queued.text().await.unwrap_or_default());
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "the queued push: {text}");
    assert!(text.contains("whether it took effect is unknown"), "the queued push: {text}");
    let answers = [
        ("push", pushed),
        ("creation", created),
        ("registration", registered),
        ("cursor creation", cursor_made),
        ("pop", claimed),
        ("ack", acked),
        ("transaction", transacted),
        ("key/value write", kv_written),
        ("lock", locked),
        ("timer", scheduled),
    ];
    api.assert_unanswered(answers, took).await;

    // The standby answers again, and the commits it held go through; each write is sent again.
    pair.resume_standby();
    let pushed = api.until_done(|| api.push("silent-push", "during")).await;
    let status = pushed.json::<serde_json::Value>().await.expect("JSON")[0]["status"].as_str().map(str::to_owned);
    assert!(matches!(status.as_deref(), Some("duplicate" | "queued")), "{status:?}");
    api.until_done(|| api.push("silent-new", "created-during")).await;
    let second_of_c = api.until_done(|| api.pop_partition("c", "p2")).await.json::<serde_json::Value>().await;
    assert_eq!(second_of_c.expect("JSON")["messages"][0]["transactionId"], "cursor-2");
    for (route, body) in [("kv", &kv_put), ("locks", &acquire), ("timers", &schedule)] {
        api.until_done(|| api.post(route, body)).await;
    }
    let first_of_newcomer =
        api.until_done(|| api.pop_answer("newcomer", 1, "")).await.json::<serde_json::Value>().await;
    assert_eq!(first_of_newcomer.expect("JSON")["messages"][0]["transactionId"], "first", "registered, it reads");
    let acked = api.until_done(|| api.ack("g", &leased_to_g)).await.json::<serde_json::Value>().await;
    assert_eq!(acked.expect("JSON")[0]["success"], true, "the ack sent again is taken (a no-op if the first was)");
    // A bundle's ack needs its lease still live, and the first commit, if it went through,
    // released it: the bundle sent again is then refused, with nothing of it applied twice.
    let transacted = api.until_answered(|| api.transaction(&transaction)).await;
    let (status, body) = (transacted.status(), transacted.text().await.expect("a body"));
    let refused_as_done = status == StatusCode::CONFLICT && body.contains("not the live lease");
    assert!(status == StatusCode::OK || refused_as_done, "{status} {body}");

    // `g` and `t` are left with the messages after their first, each once. `h`'s claim, answered
    // 503, went through once the standby answered: auto-acked, it consumed what it claimed, as
    // when the answer to an auto-acked pop is lost; the rest comes once.
    for group in ["g", "t"] {
        assert_eq!(ids(&api.pop_all(group).await), ["second", "third"], "group {group}");
    }
    let rest_of_h = api.pop_all("h").await;
    assert!(matches!(ids(&rest_of_h)[..], ["third"] | ["second", "third"]), "{:?}", ids(&rest_of_h));
    let primary = pair.primary.connect(DATABASE).await;
    for id in ["during", "pushed-in-transaction", "created-during"] {
        let stored: i64 = primary
            .query_one("SELECT count(*) FROM queen.log_message_ids WHERE transaction_id = $1", &[&id])
            .await
            .expect("a count")
            .get(0);
        assert_eq!(stored, 1, "{id} stored once, whether the first commit went through or not");
    }
    assert_running(&mut brokers).await;
}

/// The admin routes' writes wait for their commit too: configure, a seek, a group's deletion and
/// a subscription update are answered 503 while the synchronous standby is silent, and take
/// effect when sent again once it streams.
#[tokio::test]
async fn admin_writes_whose_commit_waits_on_a_silent_standby_are_answered_503() {
    let (pair, mut brokers, api) = broker_on_a_synchronous_pair("silent_admin").await;
    for id in ["one", "two"] {
        assert_eq!(api.push_to("admin", "p", id).await.status(), StatusCode::CREATED);
    }
    for group in ["sought", "deleted", "subscribed"] {
        assert_eq!(api.pop_from("admin", "p", group).await.status(), StatusCode::OK, "group {group}");
    }

    pair.stall_standby().await;
    let sent = Instant::now();
    let configure = json!({"queue": "admin", "options": {"leaseTime": 45}});
    let to_end = json!({"toEnd": true});
    let start = json!({"subscriptionTimestamp": "2026-01-01T00:00:00Z"});
    let (configured, sought, deleted, subscribed) = tokio::join!(
        api.post("configure", &configure),
        api.post("consumer-groups/sought/queues/admin/seek", &to_end),
        api.delete("consumer-groups/deleted/queues/admin"),
        api.post("consumer-groups/subscribed/subscription", &start),
    );
    let took = sent.elapsed();
    let answers = [("configure", configured), ("seek", sought), ("deletion", deleted), ("subscription", subscribed)];
    api.assert_unanswered(answers, took).await;

    pair.resume_standby();
    api.until_done(|| api.post("configure", &configure)).await;
    api.until_done(|| api.post("consumer-groups/sought/queues/admin/seek", &to_end)).await;
    api.until_done(|| api.delete("consumer-groups/deleted/queues/admin")).await;
    api.until_done(|| api.post("consumer-groups/subscribed/subscription", &start)).await;
    assert_eq!(api.get("resources/queues/admin").await["options"]["leaseTime"], 45);
    // At the end, `sought` has nothing to read; `deleted` starts over from the first message.
    assert_eq!(api.pop_from("admin", "p", "sought").await.status(), StatusCode::NO_CONTENT);
    let again = api.pop_from("admin", "p", "deleted").await.json::<serde_json::Value>().await.expect("JSON");
    assert_eq!(again["messages"][0]["transactionId"], "one");
    assert_running(&mut brokers).await;
}

fn ids(messages: &[serde_json::Value]) -> Vec<&str> {
    messages.iter().map(|m| m["transactionId"].as_str().unwrap_or_default()).collect()
}

fn ack_op(message: &serde_json::Value, group: &str) -> serde_json::Value {
    json!({"type": "ack", "transactionId": message["transactionId"], "partitionId": message["partitionId"],
           "leaseId": message["leaseId"], "status": "completed", "consumerGroup": group})
}

/// The calls of the silent-standby test, on one broker, to partition `p` of its queues.
struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    fn new(base: &str) -> Api {
        let http = queen_testkit::http().timeout(Duration::from_secs(60)).build().expect("a client");
        Api { base: base.to_owned(), http }
    }

    async fn push(&self, queue: &str, id: &str) -> reqwest::Response {
        self.push_to(queue, "p", id).await
    }

    async fn push_to(&self, queue: &str, partition: &str, id: &str) -> reqwest::Response {
        let item = json!({"queue": queue, "partition": partition, "transactionId": id, "payload": id});
        let body = json!({ "items": [item] });
        self.http.post(format!("{}/api/v1/push", self.base)).json(&body).send().await.expect("an answer")
    }

    /// A pop of queue `silent` without waiting, leased for a minute.
    async fn pop_answer(&self, group: &str, batch: u32, options: &str) -> reqwest::Response {
        let query = format!("batch={batch}&consumerGroup={group}&wait=false&leaseSeconds=60{options}");
        self.http.get(format!("{}/api/v1/pop/queue/silent?{query}", self.base)).send().await.expect("an answer")
    }

    /// A pop of one partition of queue `silent-cursor`, without waiting.
    async fn pop_partition(&self, group: &str, partition: &str) -> reqwest::Response {
        self.pop_from("silent-cursor", partition, group).await
    }

    /// A pop of one message of one partition, without waiting.
    async fn pop_from(&self, queue: &str, partition: &str, group: &str) -> reqwest::Response {
        let path = format!("/api/v1/pop/queue/{queue}/partition/{partition}");
        let query = format!("batch=1&consumerGroup={group}&wait=false");
        self.http.get(format!("{}{path}?{query}", self.base)).send().await.expect("an answer")
    }

    async fn pop(&self, group: &str, batch: u32) -> Option<Vec<serde_json::Value>> {
        let answer = self.pop_answer(group, batch, "").await;
        if answer.status() != StatusCode::OK {
            return None;
        }
        let body: serde_json::Value = answer.json().await.expect("JSON");
        body["messages"].as_array().cloned()
    }

    /// What `group` gets of queue `silent` until it has waited out a lease with nothing new,
    /// each message acked.
    async fn pop_all(&self, group: &str) -> Vec<serde_json::Value> {
        let mut got = Vec::new();
        let mut quiet_since = Instant::now();
        while quiet_since.elapsed() < Duration::from_secs(3) {
            let Some(messages) = self.pop(group, 10).await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            quiet_since = Instant::now();
            for message in messages {
                let acked = self.ack(group, &message).await.json::<serde_json::Value>().await.expect("JSON");
                assert_eq!(acked[0]["success"], true, "{acked}");
                got.push(message);
            }
        }
        got
    }

    async fn ack(&self, group: &str, message: &serde_json::Value) -> reqwest::Response {
        let ack = json!({"transactionId": message["transactionId"], "partitionId": message["partitionId"],
                         "leaseId": message["leaseId"], "status": "completed"});
        let body = json!({"acknowledgments": [ack], "consumerGroup": group});
        self.http.post(format!("{}/api/v1/ack/batch", self.base)).json(&body).send().await.expect("an answer")
    }

    async fn extend(&self, message: &serde_json::Value) -> reqwest::Response {
        let lease = message["leaseId"].as_str().expect("a lease");
        let body = json!({"seconds": 120});
        self.http
            .post(format!("{}/api/v1/lease/{lease}/extend", self.base))
            .json(&body)
            .send()
            .await
            .expect("an answer")
    }

    async fn post(&self, route: &str, body: &serde_json::Value) -> reqwest::Response {
        self.http.post(format!("{}/api/v1/{route}", self.base)).json(body).send().await.expect("an answer")
    }

    async fn delete(&self, route: &str) -> reqwest::Response {
        self.http.delete(format!("{}/api/v1/{route}", self.base)).send().await.expect("an answer")
    }

    async fn get(&self, route: &str) -> serde_json::Value {
        let answer = self.http.get(format!("{}/api/v1/{route}", self.base)).send().await.expect("an answer");
        answer.json().await.expect("JSON")
    }

    async fn transaction(&self, bundle: &serde_json::Value) -> reqwest::Response {
        self.http.post(format!("{}/api/v1/transaction", self.base)).json(bundle).send().await.expect("an answer")
    }

    /// Each write was answered 503 within the bound, saying that its outcome is unknown, and
    /// counted as given up on.
    async fn assert_unanswered<const N: usize>(&self, answers: [(&str, reqwest::Response); N], took: Duration) {
        for (what, answer) in answers {
            let status = answer.status();
            let text = answer.text().await.unwrap_or_default();
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "the {what}: {text}");
            assert!(text.contains("whether it took effect is unknown"), "the {what}: {text}");
        }
        assert!(took < SILENT_STANDBY_BOUND, "answered after {took:?}");
        let unanswered = queen_testkit::metric_at(&self.http, &self.base, "queen_db_errors_total{kind=\"unanswered\"}");
        assert_eq!(unanswered.await, N as f64, "each write given up on is counted");
    }

    /// Sends a write again until it succeeds (503 meanwhile, within a minute).
    async fn until_done<F: std::future::Future<Output = reqwest::Response>>(
        &self,
        send: impl Fn() -> F,
    ) -> reqwest::Response {
        let answer = self.until_answered(send).await;
        assert!(answer.status().is_success(), "{}: {:?}", answer.status(), answer.text().await);
        answer
    }

    /// Sends a write again until it is answered other than 503 (within a minute).
    async fn until_answered<F: std::future::Future<Output = reqwest::Response>>(
        &self,
        send: impl Fn() -> F,
    ) -> reqwest::Response {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let answer = send().await;
            if answer.status() != StatusCode::SERVICE_UNAVAILABLE {
                return answer;
            }
            assert!(Instant::now() < deadline, "still 503 a minute after the standby came back");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// How soon pushes go through once the address points at the primary again.
const BACK_ON_THE_PRIMARY: Duration = Duration::from_secs(3);

/// One address in front of the servers (no `target_session_attrs`) that pointed at the standby
/// for a while: the sessions the broker opened then refuse writes (503, read-only), and once the
/// address points at the primary again the broker drops them by itself and takes pushes at once,
/// rather than keep them refusing every write they carry until something else closes them.
#[tokio::test]
async fn sessions_opened_on_a_standby_behind_one_address_are_dropped_once_it_points_back() {
    let pair = Pair::start("standby_address", Replication::Asynchronous).await;
    let address = Address::pointing_at(pair.primary.port()).await;
    let primary_url = pair.primary.url(DATABASE);
    let (credentials, _) = primary_url.split_once('@').expect("a URL with credentials");
    let url = format!("{credentials}@127.0.0.1:{}/{DATABASE}?connect_timeout=2", address.port());
    let brokers = start_brokers(&url, 1, &[]).await;
    let base = brokers[0].url();
    let http = queen_testkit::http().timeout(Duration::from_secs(10)).build().expect("an HTTP client");
    let push = |id: String| {
        let body = json!({"items": [{"queue": "moved", "transactionId": id, "payload": {}}]});
        http.post(format!("{base}/api/v1/push")).json(&body).send()
    };
    assert_eq!(push("before".into()).await.expect("a push").status(), StatusCode::CREATED);

    // The address moves to the standby, and the broker's sessions on the primary end.
    address.point_at(pair.standby.port());
    let admin = pair.primary.connect("postgres").await;
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&DATABASE],
        )
        .await
        .expect("ending the broker's sessions");
    let deadline = Instant::now() + RECONNECT_BOUND;
    loop {
        let answer = push(format!("on-standby-{}", uuid::Uuid::new_v4())).await.expect("a push");
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        if status == StatusCode::SERVICE_UNAVAILABLE && text.contains("read-only") {
            break;
        }
        assert!(Instant::now() < deadline, "no push reached the standby: {status} {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Each pooled session is asked whether it is on a standby when next taken: the first pushes
    // go through, well before anything else might close those sessions.
    address.point_at(pair.primary.port());
    let deadline = Instant::now() + BACK_ON_THE_PRIMARY;
    loop {
        let answer = push(format!("back-{}", uuid::Uuid::new_v4())).await.expect("a push");
        if answer.status() == StatusCode::CREATED {
            break;
        }
        let (status, text) = (answer.status(), answer.text().await.unwrap_or_default());
        assert!(Instant::now() < deadline, "still refused with the address on the primary: {status} {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
