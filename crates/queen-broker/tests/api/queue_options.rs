//! `POST /api/v1/configure`: the echo of every option with its effective value, unknown options
//! refused by name, merging, checks, and a change reaching every broker at once.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

/// Every known option with its default, as a configure call that names none echoes them.
fn defaults() -> Value {
    json!({
        "leaseTime": 300, "retryLimit": 3, "retryDelay": 0, "priority": 0, "delayedProcessing": 0,
        "windowBuffer": 0, "maxSize": 0, "ttl": 0, "maxWaitTimeSeconds": 0, "deadLetterQueue": true,
        "dlqAfterMaxRetries": true, "retentionEnabled": false, "retentionSeconds": 0,
        "completedRetentionSeconds": 0, "encryptionEnabled": false, "dedupWindowSeconds": 0
    })
}

#[actix_web::test]
async fn configure_echoes_every_option_with_its_effective_value() {
    let app = TestApp::spawn().await;
    let created = app.configure("plain", json!({})).await;
    assert_eq!(created["options"], defaults());

    let changed = app.configure("plain", json!({"leaseTime": 5, "retryDelay": 250, "deadLetterQueue": false})).await;
    let mut expected = defaults();
    expected["leaseTime"] = json!(5);
    expected["retryDelay"] = json!(250);
    expected["deadLetterQueue"] = json!(false);
    assert_eq!(changed["options"], expected);

    // Merging: what a later call does not name (or names as null) keeps its stored value.
    let merged = app.configure("plain", json!({"retryLimit": 7, "leaseTime": null})).await;
    expected["retryLimit"] = json!(7);
    assert_eq!(merged["options"], expected);
    assert_eq!(app.get("/api/v1/resources/queues/plain").await.body["options"], expected, "reads echo the same");
}

#[actix_web::test]
async fn an_option_the_broker_does_not_act_on_is_refused_by_name_and_changes_nothing() {
    let app = TestApp::spawn().await;
    // `maxPartitions` is no queue option (a pop's `partitions` is), and `lease_time` is the
    // client's spelling before it turns it into camelCase: a user who sends either must learn that
    // it does not hold.
    for (options, named) in [
        (json!({"leaseTime": 30, "maxPartitions": 4}), "options.maxPartitions"),
        (json!({"lease_time": 30}), "options.lease_time"),
        (json!({"colour": null}), "options.colour"),
    ] {
        let answer = app.post("/api/v1/configure", &json!({"queue": "strict", "options": options})).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        let error = answer.body["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(&format!("{named} is not a queue option this broker acts on")), "{error}");
        assert!(error.contains("leaseTime, retryLimit"), "the answer lists the options: {error}");
    }
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 0, "no queue was created");

    app.configure("strict", json!({"leaseTime": 12})).await;
    let answer = app.post("/api/v1/configure", &json!({"queue": "strict", "options": {"leaseTime": 99, "x": 1}})).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    let stored = app.get("/api/v1/resources/queues/strict").await.body;
    assert_eq!(stored["options"]["leaseTime"], 12, "the known option of a refused call is not applied");
    assert_eq!(stored["options"].as_object().map(|o| o.len()), defaults().as_object().map(|o| o.len()));
    // The column earlier brokers kept unknown options in stays empty.
    assert_eq!(app.count("SELECT count(*) FROM queen.queues WHERE unknown_options <> '{}'").await, 0);
}

#[actix_web::test]
async fn every_known_option_is_checked_and_a_bad_value_writes_nothing() {
    let app = TestApp::spawn().await;
    for (option, value) in [
        ("leaseTime", json!(0)),
        ("retryLimit", json!(-1)),
        ("retryDelay", json!("soon")),
        ("priority", json!(1.5)),
        ("delayedProcessing", json!(-2)),
        ("windowBuffer", json!(true)),
        ("maxSize", json!(-10)),
        ("ttl", json!("1h")),
        ("maxWaitTimeSeconds", json!(-1)),
        ("deadLetterQueue", json!("no")),
        ("dlqAfterMaxRetries", json!(0)),
        ("retentionEnabled", json!("yes")),
        ("retentionSeconds", json!(-1)),
        ("completedRetentionSeconds", json!([])),
        ("encryptionEnabled", json!("on")),
        ("dedupWindowSeconds", json!(-5)),
    ] {
        let answer = app.post("/api/v1/configure", &json!({"queue": "checked", "options": {option: value}})).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{option}: {answer:?}");
        let error = answer.body["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(&format!("options.{option} must be")), "{error}");
    }
    assert_eq!(app.count("SELECT count(*) FROM queen.queues").await, 0);
}

/// Moves every segment of the queue `age` into the past.
pub(crate) async fn age_queue(app: &TestApp, queue: &str, age: &str) {
    let sql = "UPDATE queen.log_segments s SET created_at = s.created_at - $2::text::interval
                 FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                WHERE s.partition_id = p.id AND q.name = $1";
    app.db.connect().await.execute(sql, &[&queue, &age]).await.expect("age the segments");
}

/// Past the dedup window an id is new again, but the very message stored under it (its message
/// id: a push buffered during maintenance, replayed again after the window) is still a duplicate,
/// not stored twice.
#[actix_web::test]
async fn past_the_dedup_window_the_same_message_written_again_is_still_a_duplicate() {
    use queen_store::log::{AppendPolicy, Appended, NewMessage, append};

    let app = TestApp::spawn().await;
    app.configure("replayed", json!({"dedupWindowSeconds": 60})).await;
    let first = app.push_one("replayed", "p", "order-9", json!(1)).await;
    age_queue(&app, "replayed", "2 hours").await;
    let destination = app.destination("replayed", "p").await;
    let client = app.store_connection("replaying").await;
    let policy = AppendPolicy { dedup_window_seconds: 60, ..AppendPolicy::default() };
    let message = |message_id: &str| NewMessage {
        message_id: message_id.parse().expect("a message id"),
        transaction_id: "order-9".into(),
        trace_id: None,
        producer: None,
        payload: b"1".to_vec(),
        received: None,
    };
    let again = append(&client, destination, &[message(first["message_id"].as_str().unwrap())], &policy).await;
    assert!(matches!(again.expect("the append").outcomes[..], [Appended::Duplicate { offset: 1, .. }]));
    let other = append(&client, destination, &[message(&uuid::Uuid::now_v7().to_string())], &policy).await;
    assert!(matches!(other.expect("the append").outcomes[..], [Appended::Queued { offset: 2, .. }]));
}

/// An id released from its dedup window is released with the write of its new message, in one
/// transaction: when that write fails, the id still names its stored message (and the offsets an
/// ack by lookup needs are not lost), and the push sent again finds it as before.
#[actix_web::test]
async fn an_id_is_released_from_its_window_only_with_the_write_that_stores_it_again() {
    use queen_store::log::{AppendPolicy, NewMessage, append};

    let app = TestApp::spawn().await;
    app.configure("released", json!({"dedupWindowSeconds": 60})).await;
    app.push_one("released", "p", "order-5", json!(1)).await;
    age_queue(&app, "released", "2 hours").await;
    // The write of the new message fails once the old one's index row is gone, as a write can
    // fail for its own reasons (a timeout, a lost connection) after the release.
    let sql = app.db.connect().await;
    sql.batch_execute(
        "CREATE FUNCTION fail_once_released() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NOT EXISTS (SELECT 1 FROM queen.log_message_ids WHERE transaction_id = 'order-5') THEN
                 RAISE EXCEPTION 'the write fails';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER fail_once_released BEFORE INSERT ON queen.log_segments
             FOR EACH ROW EXECUTE FUNCTION fail_once_released();",
    )
    .await
    .expect("the failing trigger");
    let destination = app.destination("released", "p").await;
    let client = app.store_connection("releasing").await;
    let policy = AppendPolicy { dedup_window_seconds: 60, ..AppendPolicy::default() };
    let message = NewMessage {
        message_id: uuid::Uuid::now_v7(),
        transaction_id: "order-5".into(),
        trace_id: None,
        producer: None,
        payload: b"2".to_vec(),
        received: None,
    };
    let failed = append(&client, destination, std::slice::from_ref(&message), &policy).await;
    assert!(failed.is_err(), "{failed:?}");
    let index = "SELECT count(*) FROM queen.log_message_ids WHERE transaction_id = 'order-5' AND message_offset = 1";
    assert_eq!(app.count(index).await, 1, "the id still names the stored message");

    sql.batch_execute("DROP TRIGGER fail_once_released ON queen.log_segments").await.expect("the trigger dropped");
    let again = append(&client, destination, &[message], &policy).await.expect("the append");
    assert!(matches!(again.outcomes[..], [queen_store::log::Appended::Queued { offset: 2, .. }]));
    let earlier = "SELECT earlier_offsets FROM queen.log_message_ids WHERE transaction_id = 'order-5'";
    let earlier: Vec<i64> = sql.query_one(earlier, &[]).await.expect("the index row").get(0);
    assert_eq!(earlier, [1], "the new row keeps where the id was stored before");
}

#[actix_web::test]
async fn a_transaction_id_is_a_duplicate_only_within_the_dedup_window() {
    let app = TestApp::spawn_with(|config| config.maintenance.interval_ms = 100).await;
    app.configure("windowed", json!({"dedupWindowSeconds": 60, "retentionEnabled": true, "retentionSeconds": 3600}))
        .await;
    let first = app.push_one("windowed", "p", "order-7", json!(1)).await;
    assert_eq!(app.push_one("windowed", "p", "order-7", json!(1)).await["status"], "duplicate", "inside the window");

    age_queue(&app, "windowed", "2 hours").await;
    let second = app.push_one("windowed", "p", "order-7", json!(2)).await;
    assert_eq!(second["status"], "queued", "past the window the id is new again");
    assert_ne!(second["message_id"], first["message_id"]);
    let message = app.get(&format!("/api/v1/messages/{}/order-7", second["partition_id"].as_str().unwrap())).await;
    assert_eq!(message.body["data"], 2, "the id names the newer message");

    // Retention removes the old message (2 h old, retention 1 h) but not the new one's id.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while app.count("SELECT count(*) FROM queen.log_segments").await > 1 {
        assert!(std::time::Instant::now() < deadline, "retention never ran");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(app.push_one("windowed", "p", "order-7", json!(3)).await["status"], "duplicate");
    let served: Vec<Value> =
        app.pop("queue/windowed", "batch=10").await.messages().iter().map(|m| m["data"].clone()).collect();
    assert_eq!(served, vec![json!(2)]);

    // Without a window, an id stays a duplicate for as long as its message is stored.
    app.push_one("forever", "p", "once", json!(1)).await;
    age_queue(&app, "forever", "400 days").await;
    assert_eq!(app.push_one("forever", "p", "once", json!(1)).await["status"], "duplicate");
}
