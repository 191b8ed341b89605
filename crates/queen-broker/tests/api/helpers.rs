//! A broker per test, on its own database, with typed request helpers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use queen_broker::config::Config;
use queen_testkit::{TestDatabase, metric_at, target_dir};
use reqwest::StatusCode;
use serde_json::{Value, json};

pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    pub db: TestDatabase,
}

/// An answer: status and JSON body (`Value::Null` when there is none).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
}

impl Answer {
    /// The messages of a pop answer; none for a 204.
    pub fn messages(&self) -> Vec<Value> {
        self.body.get("messages").and_then(Value::as_array).cloned().unwrap_or_default()
    }

    /// The integer `data[field]` of each message, in delivery order.
    pub fn data_ints(&self, field: &str) -> Vec<i64> {
        self.messages().iter().map(|m| m["data"][field].as_i64().expect("an integer field")).collect()
    }

    pub fn transaction_ids(&self) -> Vec<String> {
        self.messages().iter().map(|m| m["transactionId"].as_str().unwrap_or_default().to_owned()).collect()
    }
}

fn client() -> reqwest::Client {
    queen_testkit::http().timeout(Duration::from_secs(60)).build().expect("an HTTP client")
}

fn test_label() -> String {
    std::thread::current().name().unwrap_or("api").rsplit("::").next().unwrap_or("api").to_owned()
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with(|_| {}).await
    }

    /// A broker whose configuration `tweak` adjusts first.
    pub async fn spawn_with(tweak: impl FnOnce(&mut Config)) -> TestApp {
        let db = TestDatabase::create(&test_label()).await;
        let base = Self::start(&db, tweak).await;
        TestApp { base, http: client(), db }
    }

    /// A broker on a database the test made (on another cluster, say).
    pub async fn spawn_in(db: TestDatabase, tweak: impl FnOnce(&mut Config)) -> TestApp {
        let base = Self::start(&db, tweak).await;
        TestApp { base, http: client(), db }
    }

    /// A broker serving HTTPS (`tweak` sets its `http.tls_*` files), spoken to through `http`, a
    /// client that trusts its certificate.
    pub async fn spawn_https(http: reqwest::Client, tweak: impl FnOnce(&mut Config)) -> TestApp {
        let mut app = Self::spawn_with(tweak).await;
        app.base = app.base.replacen("http://", "https://", 1);
        app.http = http;
        app
    }

    /// Starts a second broker on another test's database (for fleet tests); its base URL.
    pub async fn spawn_on(db: &TestDatabase, tweak: impl FnOnce(&mut Config)) -> String {
        Self::start(db, tweak).await
    }

    async fn start(db: &TestDatabase, tweak: impl FnOnce(&mut Config)) -> String {
        queen_testkit::in_process::serve(db, tweak).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn answer(response: reqwest::Response) -> Answer {
        let status = response.status();
        let text = response.text().await.expect("a body");
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
        };
        Answer { status, body }
    }

    pub async fn get(&self, path: &str) -> Answer {
        Self::answer(self.http.get(self.url(path)).send().await.expect("GET")).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Answer {
        Self::answer(self.http.post(self.url(path)).json(body).send().await.expect("POST")).await
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> Answer {
        let request = self.http.post(self.url(path)).header("content-type", "application/json").body(body);
        Self::answer(request.send().await.expect("POST")).await
    }

    pub async fn delete(&self, path: &str) -> Answer {
        Self::answer(self.http.delete(self.url(path)).send().await.expect("DELETE")).await
    }

    /// Configures a queue and insists it worked; the answer's body.
    pub async fn configure(&self, queue: &str, options: Value) -> Value {
        let answer = self.post("/api/v1/configure", &json!({"queue": queue, "options": options})).await;
        assert_eq!(answer.body["configured"], true, "{answer:?}");
        answer.body
    }

    /// Pushes items and insists on a 201.
    pub async fn push(&self, items: Value) -> Vec<Value> {
        let answer = self.post("/api/v1/push", &json!({ "items": items })).await;
        assert_eq!(answer.status, StatusCode::CREATED, "push answered {answer:?}");
        answer.body.as_array().cloned().expect("an array")
    }

    /// Pushes one message and returns its result.
    pub async fn push_one(&self, queue: &str, partition: &str, transaction_id: &str, payload: Value) -> Value {
        let item = json!({"queue": queue, "partition": partition, "transactionId": transaction_id, "payload": payload});
        self.push(json!([item])).await.remove(0)
    }

    /// `GET /api/v1/pop/{route}?{query}` (route is `queue/q` or `queue/q/partition/p`).
    pub async fn pop(&self, route: &str, query: &str) -> Answer {
        self.get(&format!("/api/v1/pop/{route}?{query}")).await
    }

    /// Acknowledges messages of a pop answer with one status, as one batch call.
    pub async fn ack_all(&self, messages: &[Value], status: &str, group: Option<&str>) -> Vec<Value> {
        let answer = self.post("/api/v1/ack/batch", &ack_body(messages, status, group)).await;
        assert_eq!(answer.status, StatusCode::OK, "ack answered {answer:?}");
        answer.body.as_array().cloned().expect("an array")
    }

    /// The segment `created_at` of a pushed message (from its push result), read back through
    /// the message route.
    pub async fn segment_time(&self, pushed: &Value) -> chrono::DateTime<chrono::Utc> {
        let partition = pushed["partition_id"].as_str().expect("partition_id");
        let transaction = pushed["transaction_id"].as_str().expect("transaction_id");
        let message = self.get(&format!("/api/v1/messages/{partition}/{transaction}")).await;
        message.body["createdAt"].as_str().expect("createdAt").parse().expect("ISO-8601")
    }

    /// The value of one metric sample, e.g. `queen_long_poll_waiters` or
    /// `queen_pop_candidate_plans_total{kind="full"}`; 0 when absent.
    pub async fn metric(&self, sample: &str) -> f64 {
        metric_at(&self.http, &self.base, sample).await
    }

    /// A connection of the store's own kind to the test database, named `application_name`: for
    /// driving `queen_store` directly beside the broker (holding a transaction open, say).
    pub async fn store_connection(&self, application_name: &str) -> deadpool_postgres::Object {
        let target: tokio_postgres::Config = self.db.url().parse().expect("the database URL");
        store_pool(target, application_name).get().await.expect("a connection")
    }

    /// The ids of a queue and one of its partitions, by name, for calls into `queen_store`.
    pub async fn destination<'a>(&self, queue: &'a str, partition: &str) -> queen_store::log::Destination<'a> {
        let row = self
            .db
            .connect()
            .await
            .query_one(
                "SELECT q.id, p.id FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id
                  WHERE q.name = $1 AND p.name = $2",
                &[&queue, &partition],
            )
            .await
            .expect("the partition");
        queen_store::log::Destination { queue_id: row.get(0), queue, partition_id: row.get(1) }
    }

    /// One number from the database.
    pub async fn count(&self, sql: &str) -> i64 {
        self.db.connect().await.query_one(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
    }

    /// A session of the test's own holding the one cursor `group` has (`FOR UPDATE`) in a
    /// transaction, until it sends `ROLLBACK`.
    pub async fn hold_cursor(&self, group: &str) -> tokio_postgres::Client {
        let holder = self.db.connect().await;
        holder.batch_execute("BEGIN").await.expect("a transaction");
        let cursor = "SELECT 1 FROM queen.log_consumers WHERE consumer_group = $1 FOR UPDATE";
        assert_eq!(holder.execute(cursor, &[&group]).await.expect("the lock"), 1, "one cursor of {group}");
        holder
    }

    /// Waits until a statement on the test's database whose text contains `statement` waits for
    /// a lock (one the test holds), failing with `what` after 10 s.
    pub async fn until_waiting_for_a_lock(&self, statement: &str, what: &str) {
        let waiting = format!(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%{statement}%'"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.count(&waiting).await < 1 {
            assert!(std::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The body of one batch ack call acknowledging messages of a pop answer with one status.
pub fn ack_body(messages: &[Value], status: &str, group: Option<&str>) -> Value {
    let acks: Vec<Value> = messages
        .iter()
        .map(|m| {
            json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                   "leaseId": m["leaseId"], "status": status})
        })
        .collect();
    json!({"acknowledgments": acks, "consumerGroup": group})
}

/// The tables whose rows a refused request must leave alone.
const FINGERPRINTED: &[&str] = &[
    "queues",
    "partitions",
    "log_segments",
    "log_message_ids",
    "log_consumers",
    "log_dlq",
    "consumer_groups_metadata",
    "system_state",
    "message_traces",
    "message_trace_names",
    "kv",
    "kv_version_floors",
    "timers",
];

/// Every fingerprinted table's row count and row versions (`ctid`, `xmin`): any insert, update or
/// delete changes them, whatever the values.
pub async fn row_versions(db: &tokio_postgres::Client) -> BTreeMap<String, String> {
    let sql = FINGERPRINTED
        .iter()
        .map(|table| {
            format!(
                "SELECT '{table}', count(*) || ' ' || md5(coalesce(string_agg(x.ctid::text || ':' || x.xmin::text, \
                 ',' ORDER BY x.ctid), '')) FROM queen.{table} x"
            )
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let rows = db.query(&sql, &[]).await.expect("the row versions");
    rows.iter().map(|row| (row.get(0), row.get(1))).collect()
}

/// A static tokens file (`auth.tokens_file`) of its own under the target directory, removed when
/// dropped: keep it for as long as the broker reading it runs.
pub struct TokensFile(PathBuf);

impl TokensFile {
    pub fn new(text: &str) -> Self {
        let dir = target_dir().join("api-auth");
        std::fs::create_dir_all(&dir).expect("a directory");
        let path = dir.join(format!("{}.toml", uuid::Uuid::new_v4().simple()));
        std::fs::write(&path, text).expect("the tokens file");
        Self(path)
    }

    pub fn path(&self) -> PathBuf {
        self.0.clone()
    }
}

impl Drop for TokensFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A pool of one connection of the store's own kind to `target`, named `application_name`.
pub fn store_pool(target: tokio_postgres::Config, application_name: &str) -> deadpool_postgres::Pool {
    let settings = queen_store::pool::PoolSettings {
        max_size: 1,
        wait_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        statement_timeout: Duration::from_secs(30),
        lock_timeout: Duration::from_secs(10),
        application_name: application_name.into(),
    };
    queen_store::pool::build_pool(target, &settings).expect("a pool")
}
