//! `encryptionEnabled`: with the broker's key (`QUEEN_ENCRYPTION_KEY`), an encrypted queue's
//! segments, dead letters and buffered pushes are stored sealed (AES-256-GCM) and every read gives
//! the plain data back. The tests look at the bytes PostgreSQL and the journal hold.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

const KEY: &str = "7f3c9a1e5b2d4f6081a3c5e7092b4d6f8a1c3e5f7092b4d6e8f0a2c4e6081b3d";

/// A payload whose text must never be found at rest.
fn secret(n: i64) -> Value {
    json!({"card": format!("SECRET-MARKER-{n}")})
}

async fn encrypted_app() -> TestApp {
    TestApp::spawn_with(|config| config.encryption.key = Some(KEY.into())).await
}

/// Whether any of the bytes the query returns holds the marker.
async fn stored_in_plain_text(app: &TestApp, sql: &str) -> bool {
    let rows = app.db.connect().await.query(sql, &[]).await.expect("stored bytes");
    assert!(!rows.is_empty(), "{sql} found nothing to look at");
    rows.iter().any(|row| row.get::<_, Vec<u8>>(0).windows(13).any(|w| w == b"SECRET-MARKER"))
}

#[actix_web::test]
async fn an_encrypted_queue_is_sealed_at_rest_and_read_back_in_plain() {
    let app = encrypted_app().await;
    let configured = app.configure("vault", json!({"encryptionEnabled": true, "retryLimit": 0})).await;
    assert_eq!(configured["options"]["encryptionEnabled"], true);
    let pushed = app.push_one("vault", "p", "t1", secret(1)).await;
    app.push_one("vault", "p", "t2", secret(2)).await;
    let bundle = json!({"operations": [{"type": "push", "items": [
        {"queue": "vault", "partition": "p", "transactionId": "t3", "payload": secret(3)}]}]});
    assert_eq!(app.post("/api/v1/transaction", &bundle).await.status, StatusCode::OK);
    assert!(!stored_in_plain_text(&app, "SELECT body FROM queen.log_segments").await, "segments are sealed");

    let partition = pushed["partition_id"].as_str().expect("partition_id");
    let read = app.get(&format!("/api/v1/messages/{partition}/t1")).await;
    assert_eq!(read.body["data"], secret(1));
    let listed = app.get("/api/v1/messages?queue=vault&limit=10").await;
    assert_eq!(listed.body["messages"].as_array().map(Vec::len), Some(3), "{listed:?}");

    // Popped in plain; the failed one is dead-lettered (retryLimit 0), sealed at rest too.
    let popped = app.pop("queue/vault", "batch=10").await.messages();
    let data: Vec<Value> = popped.iter().map(|m| m["data"].clone()).collect();
    assert_eq!(data, vec![secret(1), secret(2), secret(3)]);
    app.ack_all(&popped[..1], "failed", None).await;
    assert!(!stored_in_plain_text(&app, "SELECT payload FROM queen.log_dlq").await, "dead letters are sealed");
    let letters = app.get("/api/v1/dlq?queue=vault").await;
    assert_eq!(letters.body["messages"][0]["data"], secret(1));

    // Back from the DLQ as a new message, sealed again, and served in plain.
    let retried = app.post(&format!("/api/v1/messages/{partition}/t1/retry"), &json!({})).await;
    assert_eq!(retried.status, StatusCode::OK, "{retried:?}");
    assert!(!stored_in_plain_text(&app, "SELECT body FROM queen.log_segments").await);
    let again = app.pop("queue/vault", "batch=10&consumerGroup=late&subscriptionMode=all").await;
    assert_eq!(again.messages().last().map(|m| m["data"].clone()), Some(secret(1)));
}

#[actix_web::test]
async fn without_a_key_encryption_is_refused_and_never_silently_plain() {
    let app = TestApp::spawn().await;
    let answer =
        app.post("/api/v1/configure", &json!({"queue": "naked", "options": {"encryptionEnabled": true}})).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    assert!(answer.body["error"].as_str().is_some_and(|e| e.contains("no encryption key")), "{answer:?}");
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 0);

    // A broker with the key encrypts a queue; one without it refuses to write or read it.
    let keyed = TestApp::spawn_on(&app.db, |config| config.encryption.key = Some(KEY.into())).await;
    let body = json!({"queue": "shared-vault", "options": {"encryptionEnabled": true}});
    assert_eq!(app.http.post(format!("{keyed}/api/v1/configure")).json(&body).send().await.unwrap().status(), 200);
    let item = json!({"items": [{"queue": "shared-vault", "payload": secret(9)}]});
    assert_eq!(app.http.post(format!("{keyed}/api/v1/push")).json(&item).send().await.unwrap().status(), 201);
    let refused = app.post("/api/v1/push", &item).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE, "{refused:?}");
    assert!(refused.body["error"].as_str().is_some_and(|e| e.contains("no encryption key")));
    let unreadable = app.pop("queue/shared-vault", "batch=1").await;
    assert_eq!(unreadable.status, StatusCode::SERVICE_UNAVAILABLE, "{unreadable:?}");
    assert!(!stored_in_plain_text(&app, "SELECT body FROM queen.log_segments").await);

    // Nor does an `autoAck` pop lose the message, though its claim committed the group's cursor:
    // the cursor moves back, and the broker with the key delivers it.
    let auto = "batch=1&consumerGroup=auto&autoAck=true";
    let unread = app.pop("queue/shared-vault", auto).await;
    assert_eq!(unread.status, StatusCode::SERVICE_UNAVAILABLE, "{unread:?}");
    let url = format!("{keyed}/api/v1/pop/queue/shared-vault?{auto}");
    let delivered: Value = app.http.get(url).send().await.unwrap().json().await.unwrap();
    assert_eq!(delivered["messages"][0]["data"], secret(9), "{delivered}");

    // Nor does it take them into its journal during push maintenance, where they would sit in
    // plain text and never replay: it knows the queue is encrypted.
    let (on, off) = (json!({"enabled": true}), json!({"enabled": false}));
    assert_eq!(app.post("/api/v1/system/maintenance", &on).await.status, StatusCode::OK);
    let journaled = app.post("/api/v1/push", &item).await;
    assert_eq!(journaled.status, StatusCode::SERVICE_UNAVAILABLE, "{journaled:?}");
    assert!(journaled.body["error"].as_str().is_some_and(|e| e.contains("no encryption key")), "{journaled:?}");
    assert_eq!(app.post("/api/v1/system/maintenance", &off).await.status, StatusCode::OK);
}

#[actix_web::test]
async fn buffered_pushes_are_sealed_in_the_journal_too() {
    let app = encrypted_app().await;
    app.configure("journaled-vault", json!({"encryptionEnabled": true})).await;
    let on = app.post("/api/v1/system/maintenance", &json!({"enabled": true})).await;
    assert_eq!(on.status, StatusCode::OK, "{on:?}");
    let buffered = app.push_one("journaled-vault", "p", "b1", secret(7)).await;
    assert_eq!(buffered["status"], "buffered");
    let dir = std::path::PathBuf::from(on.body["bufferDirectory"].as_str().expect("bufferDirectory"));
    let mut journaled = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the journal directory") {
        journaled.extend(std::fs::read(entry.expect("an entry").path()).expect("a journal file"));
    }
    assert!(journaled.windows(4).any(|w| w == b"QSE1"), "a sealed payload is in the journal");
    assert!(!journaled.windows(13).any(|w| w == b"SECRET-MARKER"), "no plain text in the journal");

    app.post("/api/v1/system/maintenance", &json!({"enabled": false})).await;
    let popped = app.pop("queue/journaled-vault", "batch=1&wait=true&timeout=10000").await;
    assert_eq!(popped.messages()[0]["data"], secret(7));
    assert!(!stored_in_plain_text(&app, "SELECT body FROM queen.log_segments").await);
}

/// A push that found its queue plain, held up (by a capped queue's share) until after the queue
/// was made encrypted, meets at the partition's writer a push that found it encrypted. Fused,
/// they would be written under one policy; each is written under its own, so nothing pushed after
/// encryption was turned on lands in plain text.
#[actix_web::test]
async fn a_push_from_before_encryption_does_not_take_a_later_one_into_plain_text() {
    let app = encrypted_app().await;
    app.configure("capped", json!({"maxSize": 100})).await;
    app.push_one("capped", "p", "seed", json!(0)).await;
    app.push_one("late-vault", "p", "seed", json!(0)).await;
    let hold = async |queue: &str| {
        let holder = app.db.connect().await;
        let row = "SELECT 1 FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 FOR UPDATE OF p";
        holder.batch_execute("BEGIN").await.expect("a transaction");
        assert_eq!(holder.execute(row, &[&queue]).await.expect("the lock"), 1);
        holder
    };
    let appends_waiting = async |count: i64| {
        let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                       AND wait_event_type = 'Lock' AND query LIKE '%queen.partitions%'";
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while app.count(waiting).await < count {
            assert!(std::time::Instant::now() < deadline, "{count} appends wait for the held partitions");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    let writer_queue = async |count: f64| {
        let queued = r#"queen_actor_queued_requests{actor="partition_writer"}"#;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while app.metric(queued).await < count {
            assert!(std::time::Instant::now() < deadline, "{count} pushes wait at the writer");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    let item = |queue: &str, id: &str, payload: Value| json!({"queue": queue, "partition": "p", "transactionId": id, "payload": payload});
    let push = async |items: Vec<Value>| app.post("/api/v1/push", &json!({ "items": items })).await;

    // An append of the plain queue in flight, held.
    let vault_row = hold("late-vault").await;
    let in_flight = push(vec![item("late-vault", "in-flight", json!(1))]);
    // A push found the queue plain, and waits on the capped queue's share.
    let capped_row = hold("capped").await;
    let from_before = push(vec![item("capped", "c", json!(2)), item("late-vault", "from-before", json!(3))]);
    let pushes = async {
        let (in_flight, from_before, after) = futures::join!(in_flight, from_before, async {
            appends_waiting(2).await;
            app.configure("late-vault", json!({"encryptionEnabled": true})).await;
            let after = push(vec![item("late-vault", "after", secret(4))]);
            let releasing = async {
                writer_queue(1.0).await;
                capped_row.batch_execute("COMMIT").await.expect("the capped queue's partition");
                writer_queue(2.0).await;
                vault_row.batch_execute("COMMIT").await.expect("the vault's partition");
            };
            futures::join!(after, releasing).0
        });
        [in_flight, from_before, after]
    };
    for answer in pushes.await {
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    }
    assert!(
        !stored_in_plain_text(&app, "SELECT body FROM queen.log_segments").await,
        "the push made after encryption was turned on is sealed"
    );
    let popped = app.pop("queue/late-vault", "batch=10").await.messages();
    let ids: Vec<&str> = popped.iter().filter_map(|m| m["transactionId"].as_str()).collect();
    assert_eq!(ids, ["seed", "in-flight", "after", "from-before"], "in the order the writer took them");
    assert_eq!(popped[2]["data"], secret(4));
}

/// A broker started with another key than its fleet's would answer every read of sealed data with
/// an error and seal what the fleet cannot open: it refuses to start, saying why.
#[actix_web::test]
async fn a_broker_with_another_key_than_its_fleets_does_not_start() {
    let app = encrypted_app().await;
    let other = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let config = queen_testkit::in_process::config(&app.db, |config| config.encryption.key = Some(other.into()));
    let refused = queen_broker::startup::Application::build(config).await.err().expect("it does not start");
    assert!(refused.to_string().contains("start every broker of the fleet with the same key"), "{refused}");
    // The same key starts again, and so does a broker without one (it serves plain queues).
    TestApp::spawn_on(&app.db, |config| config.encryption.key = Some(KEY.into())).await;
    TestApp::spawn_on(&app.db, |_| {}).await;

    // Data sealed before any check was recorded (by older brokers) is what a first key must open.
    app.post("/api/v1/configure", &json!({"queue": "vault", "options": {"encryptionEnabled": true}})).await;
    app.push(json!([{"queue": "vault", "payload": secret(1)}])).await;
    let forget = "DELETE FROM queen.system_state WHERE key = 'encryption_key_check'";
    app.db.connect().await.batch_execute(forget).await.expect("the check forgotten");
    let config = queen_testkit::in_process::config(&app.db, |config| config.encryption.key = Some(other.into()));
    let refused = queen_broker::startup::Application::build(config).await.err().expect("it does not start");
    assert!(refused.to_string().contains("the same key"), "{refused}");
    TestApp::spawn_on(&app.db, |config| config.encryption.key = Some(KEY.into())).await;
    assert_eq!(app.count("SELECT count(*) FROM queen.system_state WHERE key = 'encryption_key_check'").await, 1);
}

/// A broker without a key, in a fleet that has recorded one, cannot tell during push maintenance
/// whether a queue it has not seen is encrypted: it refuses to journal pushes to it (their payloads
/// would reach its disk in plain text) and journals those to queues it knows are plain.
#[actix_web::test]
async fn a_keyless_broker_of_a_sealing_fleet_journals_only_queues_it_knows_are_plain() {
    let keyed = encrypted_app().await;
    let keyless = TestApp::spawn_on(&keyed.db, |_| {}).await;
    let push = |queue: &str| {
        let body = json!({"items": [{"queue": queue, "payload": secret(3)}]});
        keyed.http.post(format!("{keyless}/api/v1/push")).json(&body).send()
    };
    assert_eq!(push("plain").await.expect("a push").status(), StatusCode::CREATED, "it is cached as plain");
    let (on, off) = (json!({"enabled": true}), json!({"enabled": false}));
    assert_eq!(keyed.post("/api/v1/system/maintenance", &on).await.status, StatusCode::OK);
    let unseen = push("unseen").await.expect("a push");
    assert_eq!(unseen.status(), StatusCode::SERVICE_UNAVAILABLE);
    let error: Value = unseen.json().await.expect("JSON");
    assert!(error["error"].as_str().is_some_and(|e| e.contains("may be encrypted")), "{error}");
    let plain: Value = push("plain").await.expect("a push").json().await.expect("JSON");
    assert_eq!(plain[0]["status"], "buffered", "{plain}");
    assert_eq!(keyed.post("/api/v1/system/maintenance", &off).await.status, StatusCode::OK);
}
