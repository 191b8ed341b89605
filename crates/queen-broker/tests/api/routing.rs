//! The routing rule of `docs/scale-out.md`: on a distributed PostgreSQL (Citus) every statement of
//! the push, pop, ack and lease paths is routed to the shard of one partition (or of a short list
//! of partitions resolved first). The broker runs its paths on a server that records every
//! statement (`pg_stat_statements`), and each recorded statement that touches a per-partition table
//! is checked: each reference to such a table must be bound to its distribution column through
//! parameters or joins. Statements that span partitions by nature are listed, each with its cost
//! on a distributed cluster in the document.

use std::collections::{HashMap, HashSet};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

/// Maintenance passes span partitions by design (`docs/scale-out.md` lists them apart): none runs
/// while the paths are recorded.
fn no_maintenance(config: &mut queen_broker::config::Config) {
    config.maintenance.interval_ms = 3_600_000;
}

/// Drives every path a client uses: pushes (new queue, new partitions, batches, a duplicate), pops
/// by partition and by queue, with a group, with autoAck and long polls woken by a push, acks
/// (completed, failed, in batches), a lease extension, and a transaction.
async fn exercise_the_paths(app: &TestApp) {
    app.push(json!([{"queue": "orders", "partition": "p1", "transactionId": "a", "payload": 1}])).await;
    let items: Vec<Value> =
        (0..30).map(|i| json!({"queue": "orders", "partition": format!("p{}", i % 3 + 1), "payload": i})).collect();
    app.push(Value::Array(items)).await;
    let duplicate = app.push_one("orders", "p1", "a", json!(1)).await;
    assert_eq!(duplicate["status"], "duplicate", "{duplicate}");

    let by_partition = app.pop("queue/orders/partition/p1", "batch=2").await;
    assert_eq!(by_partition.messages().len(), 2, "{by_partition:?}");
    let lease = by_partition.messages()[0]["leaseId"].as_str().expect("a lease").to_owned();
    let extended = app.post(&format!("/api/v1/lease/{lease}/extend"), &json!({})).await;
    assert_eq!(extended.body["success"], true, "{extended:?}");
    // A broker that did not grant the lease knows none of its partitions.
    let other = TestApp::spawn_on(&app.db, no_maintenance).await;
    let elsewhere = app.http.post(format!("{other}/api/v1/lease/{lease}/extend")).json(&json!({})).send().await;
    let elsewhere: Value = elsewhere.expect("an extension elsewhere").json().await.expect("JSON");
    assert_eq!(elsewhere["success"], true, "{elsewhere:?}");
    app.ack_all(&by_partition.messages()[..1], "completed", None).await;
    app.ack_all(&by_partition.messages()[1..], "failed", None).await;

    let grouped = app.pop("queue/orders", "batch=10&partitions=3&consumerGroup=g").await;
    assert!(!grouped.messages().is_empty(), "{grouped:?}");
    app.ack_all(&grouped.messages(), "completed", Some("g")).await;
    let single = app.pop("queue/orders", "batch=1&consumerGroup=g").await.messages().remove(0);
    let ack = json!({"transactionId": single["transactionId"], "partitionId": single["partitionId"],
                     "leaseId": single["leaseId"], "status": "completed", "consumerGroup": "g"});
    assert_eq!(app.post("/api/v1/ack", &ack).await.status, StatusCode::OK);

    let auto = app.pop("queue/orders", "batch=5&autoAck=true&consumerGroup=audit").await;
    assert_eq!(auto.messages().len(), 5, "{auto:?}");

    let waiting = app.pop("queue/quiet", "wait=true&timeout=10000&consumerGroup=w");
    let pushing = async {
        // The long poll parks first when the queue does not exist yet; either way it is served.
        app.push(json!([{"queue": "quiet", "partition": "only", "payload": "wake"}])).await;
    };
    let (woken, ()) = tokio::join!(waiting, pushing);
    let woken = if woken.messages().is_empty() { app.pop("queue/quiet", "consumerGroup=w").await } else { woken };
    assert_eq!(woken.messages().len(), 1, "{woken:?}");

    let staged = app.pop("queue/orders", "batch=1").await.messages().remove(0);
    let bundle = json!({
        "operations": [
            {"type": "ack", "transactionId": staged["transactionId"], "partitionId": staged["partitionId"],
             "status": "completed", "leaseId": staged["leaseId"]},
            {"type": "push", "items": [{"queue": "billing", "partition": "b", "transactionId": "t1", "payload": 2}]}],
        "requiredLeases": [staged["leaseId"]],
    });
    let answer = app.post("/api/v1/transaction", &bundle).await;
    assert_eq!(answer.body["success"], true, "{answer:?}");
}

/// The tables spread by a key over shards (migration 17), with that key.
const DISTRIBUTED: [(&str, &str); 11] = [
    ("partitions", "id"),
    ("log_segments", "partition_id"),
    ("log_message_ids", "partition_id"),
    ("log_consumers", "partition_id"),
    ("log_dlq", "partition_id"),
    ("message_traces", "partition_id"),
    ("message_trace_names", "partition_id"),
    ("partition_names", "queue_id"),
    ("kv", "ns"),
    ("kv_version_floors", "ns"),
    ("timers", "queue"),
];

/// Statements that span partitions by nature, each found by a fragment of its normalised text and
/// named as in the table of spanning statements in `docs/scale-out.md`, which gives their cost.
const SPANNING: [(&str, &str); 5] = [
    (
        "queue-wide candidate scan",
        "from queen.partitions p left join queen.log_consumers c on c.partition_id = p.id and c.consumer_group = $2 where p.queue_id = $1",
    ),
    (
        "a group's cursors on a queue",
        "from queen.log_consumers c join queen.partitions p on p.id = c.partition_id join queen.queues q on q.id = p.queue_id where q.name = $1",
    ),
    ("lease lookup by id", "c.lease_id ="),
    ("lag sample", "insert into queen.lag_samples"),
    ("next timer due", "from queen.timers where fire_at is not null"),
];

/// Statements each path must have run, routed: the test fails rather than pass on a path it
/// never exercised.
const MUST_ROUTE: [(&str, &str); 9] = [
    ("the append", "insert into queen.log_segments"),
    ("the duplicate lookup", "from queen.log_message_ids where partition_id = $1"),
    ("the partition lookup", "from queen.partition_names where queue_id = $1"),
    ("the cursor creation", "insert into queen.log_consumers"),
    ("the claim", "with candidate as"),
    ("the segment read", "from queen.log_segments s where s.partition_id = r.partition_id"),
    ("the ack", "update queen.log_consumers c set committed"),
    ("the lease extension", "c.partition_id = any($3) and c.lease_id = $1"),
    ("the required lease check", "on c.partition_id = h.partition_id and c.lease_id = h.lease_id"),
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    Param,
    Symbol(String),
}

const KEYWORDS: [&str; 30] = [
    "where",
    "join",
    "left",
    "right",
    "inner",
    "cross",
    "on",
    "set",
    "using",
    "for",
    "order",
    "limit",
    "returning",
    "values",
    "select",
    "group",
    "union",
    "from",
    "with",
    "as",
    "and",
    "or",
    "not",
    "lateral",
    "having",
    "offset",
    "default",
    "overriding",
    "window",
    "into",
];

/// Words, `$n` parameters and symbols of normalised SQL, lower-cased, without comments, string
/// contents or casts (`::type` and `::type[]` go).
fn tokens(sql: &str) -> Vec<Token> {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut after_cast = false;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '-' && chars.get(i + 1) == Some(&'-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '\'' {
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push(Token::Symbol("'".into()));
        } else if c == '$' && chars.get(i + 1).is_some_and(char::is_ascii_digit) {
            i += 1;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            out.push(Token::Param);
        } else if c.is_alphanumeric() || c == '_' || c == '"' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '.' || chars[i] == '"')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect::<String>().replace('"', "").to_lowercase();
            if std::mem::take(&mut after_cast) {
                // A cast's type, and the brackets of an array type.
                while chars.get(i) == Some(&'[') && chars.get(i + 1) == Some(&']') {
                    i += 2;
                }
                continue;
            }
            out.push(Token::Word(word));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            after_cast = true;
            i += 2;
        } else {
            let pair: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let symbol = if ["<=", ">=", "<>", "!="].contains(&pair.as_str()) { pair } else { c.to_string() };
            i += symbol.len();
            out.push(Token::Symbol(symbol));
        }
    }
    out
}

/// Union-find over the terms of a statement (`alias.column`, or the one node standing for every
/// value resolved before the statement's shards are chosen: parameters and what was computed
/// from them).
#[derive(Default)]
struct Terms {
    parent: HashMap<String, String>,
}

const RESOLVED: &str = "$resolved";

impl Terms {
    fn root(&mut self, term: &str) -> String {
        let parent = self.parent.entry(term.to_owned()).or_insert_with(|| term.to_owned()).clone();
        if parent == term {
            return parent;
        }
        let root = self.root(&parent);
        self.parent.insert(term.to_owned(), root.clone());
        root
    }

    fn join(&mut self, a: &str, b: &str) {
        let (a, b) = (self.root(a), self.root(b));
        self.parent.insert(a, b);
    }
}

/// How a statement reaches the shards.
#[derive(Debug, PartialEq, Eq)]
enum Routing {
    /// It touches no distributed table.
    Local,
    /// Every reference to a distributed table is bound to its distribution key by values known
    /// before it runs: one shard per partition (or per key) it names.
    Routed,
    /// These references are not: the statement goes to every shard.
    Spans(Vec<String>),
}

fn routing(sql: &str) -> Routing {
    let tokens = tokens(sql);
    let word = |i: usize| match tokens.get(i) {
        Some(Token::Word(w)) => Some(w.as_str()),
        _ => None,
    };
    let symbol = |i: usize, s: &str| tokens.get(i) == Some(&Token::Symbol(s.into()));
    fn is_alias(w: Option<&str>) -> Option<&str> {
        w.filter(|w| !KEYWORDS.contains(w) && !w.contains('.'))
    }

    // Sources whose values are resolved before the statement picks shards: `unnest(...)` lists of
    // parameters, and the statement's CTEs (every distributed reference inside one is checked on
    // its own).
    let mut resolved: HashSet<String> = HashSet::new();
    let mut references: Vec<(String, String)> = Vec::new(); // (alias, distribution key)
    let mut inserts_rows = false;
    for i in 0..tokens.len() {
        match word(i) {
            Some("unnest") => {
                let mut depth = 0;
                let mut j = i + 1;
                while j < tokens.len() {
                    if symbol(j, "(") {
                        depth += 1;
                    } else if symbol(j, ")") {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    j += 1;
                }
                j += 1;
                if word(j) == Some("with") && word(j + 1) == Some("ordinality") {
                    j += 2;
                }
                if word(j) == Some("as") {
                    j += 1;
                }
                if let Some(alias) = is_alias(word(j)) {
                    resolved.insert(alias.to_owned());
                }
            }
            Some(name)
                if i > 0
                    && word(i + 1) == Some("as")
                    && symbol(i + 2, "(")
                    && (word(i - 1) == Some("with") || word(i - 1) == Some("recursive") || symbol(i - 1, ",")) =>
            {
                resolved.insert(name.to_owned());
            }
            Some(qualified) if qualified.starts_with("queen.") => {
                let table = &qualified["queen.".len()..];
                let Some(&(_, key)) = DISTRIBUTED.iter().find(|(t, _)| *t == table) else { continue };
                // An insert's rows go each to the shard of their own key.
                if i > 0 && word(i - 1) == Some("into") {
                    inserts_rows = true;
                    continue;
                }
                let mut j = i + 1;
                if word(j) == Some("as") {
                    j += 1;
                }
                let alias = is_alias(word(j)).unwrap_or(table).to_owned();
                references.push((alias, key.to_owned()));
            }
            _ => {}
        }
    }
    if references.is_empty() {
        return if inserts_rows { Routing::Routed } else { Routing::Local };
    }
    // Aliases given to a CTE where it is read (`FROM chosen ch`) are resolved as the CTE is.
    for i in 0..tokens.len().saturating_sub(1) {
        if let (Some(name), Some(alias)) = (word(i), is_alias(word(i + 1)))
            && resolved.contains(name)
        {
            resolved.insert(alias.to_owned());
        }
    }
    // Whom a bare column belongs to: the one reference of the statement, or its unaliased ones.
    let unaliased: Vec<String> = references
        .iter()
        .filter(|(alias, _)| references.len() == 1 || DISTRIBUTED.iter().any(|(t, _)| t == alias))
        .map(|(alias, _)| alias.clone())
        .collect();
    let term = |token: Option<&Token>| -> Option<String> {
        match token? {
            Token::Param => Some(RESOLVED.to_owned()),
            Token::Word(w) if KEYWORDS.contains(&w.as_str()) => None,
            Token::Word(w) => match w.split_once('.') {
                Some((alias, _)) if resolved.contains(alias) => Some(RESOLVED.to_owned()),
                Some(_) => Some(w.clone()),
                None => Some(w.clone()),
            },
            Token::Symbol(_) => None,
        }
    };
    let mut terms = Terms::default();
    let bind = |terms: &mut Terms, a: &str, b: &str| {
        let expand = |t: &str| -> Vec<String> {
            if t.contains('.') || t == RESOLVED {
                vec![t.to_owned()]
            } else {
                unaliased.iter().map(|table| format!("{table}.{t}")).collect()
            }
        };
        for x in expand(a) {
            for y in expand(b) {
                terms.join(&x, &y);
            }
        }
    };
    for i in 1..tokens.len() {
        if !symbol(i, "=") {
            continue;
        }
        let Some(left) = term(tokens.get(i - 1)) else { continue };
        let right = if word(i + 1) == Some("any") && symbol(i + 2, "(") {
            term(tokens.get(i + 3))
        } else {
            term(tokens.get(i + 1))
        };
        if let Some(right) = right {
            bind(&mut terms, &left, &right);
        }
    }
    // `(c.partition_id, c.consumer_group) IN (SELECT * FROM unnest($1, $2))`
    for i in 0..tokens.len() {
        if symbol(i, "(") && symbol(i + 2, ",") {
            let Some(first) = term(tokens.get(i + 1)) else { continue };
            let mut j = i + 3;
            while j < tokens.len() && !symbol(j, ")") {
                j += 1;
            }
            if word(j + 1) == Some("in")
                && symbol(j + 2, "(")
                && word(j + 3) == Some("select")
                && word(j + 6) == Some("unnest")
            {
                bind(&mut terms, &first, RESOLVED);
            }
        }
    }
    let resolved_root = terms.root(RESOLVED);
    let spanning: Vec<String> = references
        .iter()
        .filter(|(alias, key)| terms.root(&format!("{alias}.{key}")) != resolved_root)
        .map(|(alias, key)| format!("{alias}.{key}"))
        .collect();
    if spanning.is_empty() { Routing::Routed } else { Routing::Spans(spanning) }
}

fn normalised(sql: &str) -> String {
    let without_comments: Vec<&str> = sql.lines().map(|line| line.split("--").next().unwrap_or("")).collect();
    without_comments
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
        // PostgreSQL's own foreign-key checks spell their equality out.
        .replace("operator(pg_catalog.=)", "=")
}

#[test]
fn the_routing_check_tells_routed_from_spanning_statements() {
    let routed = [
        "UPDATE queen.partitions SET last_offset = last_offset + $2 WHERE id = $1",
        "SELECT 1 FROM queen.log_message_ids WHERE partition_id = $1::bigint AND transaction_id = $2",
        "SELECT s.body FROM unnest($1::bigint[]) AS r(partition_id) CROSS JOIN LATERAL \
         (SELECT * FROM queen.log_segments s WHERE s.partition_id = r.partition_id) s",
        "SELECT c.committed FROM queen.log_consumers c JOIN queen.partitions p ON p.id = c.partition_id WHERE p.id = ANY($1)",
        "WITH chosen AS (SELECT $1 AS partition_id) UPDATE queen.log_consumers c SET committed = 1 FROM chosen ch \
         WHERE c.partition_id = ch.partition_id",
        "SELECT * FROM queen.log_consumers c WHERE (c.partition_id, c.consumer_group) IN (SELECT * FROM unnest($1, $2))",
        "INSERT INTO queen.log_dlq (partition_id, queue_name) VALUES ($1, $2)",
    ];
    for sql in routed {
        assert_eq!(routing(sql), Routing::Routed, "{sql}");
    }
    let spanning = [
        "SELECT p.id FROM queen.partitions p WHERE p.queue_id = $1",
        "UPDATE queen.log_consumers c SET lease_expires_at = now() WHERE c.lease_id = $1",
        "SELECT c.committed FROM queen.log_consumers c JOIN queen.partitions p ON p.id = c.partition_id WHERE p.queue_id = $1",
        "SELECT count(*) FROM queen.log_dlq",
    ];
    for sql in spanning {
        assert!(matches!(routing(sql), Routing::Spans(_)), "{sql}");
    }
    assert_eq!(routing("SELECT name FROM queen.queues WHERE id = $1"), Routing::Local);
}

#[actix_web::test]
async fn every_statement_of_the_hot_paths_is_routed_to_one_partition() {
    let db = queen_testkit::statements_cluster::create_database("routing").await;
    let app = TestApp::spawn_in(db, no_maintenance).await;
    // What the broker ran to start (migrations) is not what its paths run.
    app.db
        .connect()
        .await
        .batch_execute(
            "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)",
        )
        .await
        .expect("a reset");
    exercise_the_paths(&app).await;

    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/scale-out.md"))
        .expect("docs/scale-out.md");
    let mut routed = Vec::new();
    let mut unlisted = Vec::new();
    for (query, _) in queen_testkit::statements_cluster::statements_of(&app.db).await {
        let sql = normalised(&query);
        match routing(&sql) {
            Routing::Local => {}
            Routing::Routed => routed.push(sql),
            Routing::Spans(references) => match SPANNING.iter().find(|(_, fragment)| sql.contains(fragment)) {
                Some((label, _)) => {
                    assert!(doc.contains(&format!("| {label} |")), "docs/scale-out.md gives no cost for \"{label}\"")
                }
                None => unlisted.push(format!("{references:?} in: {sql}")),
            },
        }
    }
    assert!(unlisted.is_empty(), "statements that span partitions and are not listed:\n{}", unlisted.join("\n\n"));
    for (path, fragment) in MUST_ROUTE {
        assert!(
            routed.iter().any(|sql| sql.contains(fragment)),
            "{path} ({fragment}) was not seen routed:\n{}",
            routed.join("\n")
        );
    }
}
