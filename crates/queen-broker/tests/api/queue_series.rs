//! Per-queue metric series: they go with their queue, on every broker, and only so many queues get
//! series of their own; the others are counted together under `queue="_other"`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::TestApp;

async fn prometheus_text(http: &reqwest::Client, base: &str) -> String {
    http.get(format!("{base}/metrics?format=prometheus")).send().await.expect("metrics").text().await.expect("text")
}

/// The samples of the scrape that carry `queue="<queue>"`.
fn series_of(text: &str, queue: &str) -> Vec<String> {
    let label = format!("queue=\"{queue}\"");
    text.lines().filter(|line| !line.starts_with('#') && line.contains(&label)).map(str::to_owned).collect()
}

/// Pushes `n` messages to the queue in one request.
async fn push(app: &TestApp, queue: &str, n: usize) {
    let items: Vec<Value> =
        (0..n).map(|i| json!({"queue": queue, "transactionId": format!("{queue}-{i}"), "payload": i})).collect();
    app.push(Value::Array(items)).await;
}

#[actix_web::test]
async fn a_deleted_queues_series_leave_metrics() {
    let app = TestApp::spawn().await;
    for queue in ["gone", "kept"] {
        push(&app, queue, 2).await;
        let read = app.pop(&format!("queue/{queue}"), "batch=1&consumerGroup=g").await.messages();
        app.ack_all(&read, "completed", Some("g")).await;
    }
    let before = prometheus_text(&app.http, &app.base).await;
    let gone = series_of(&before, "gone");
    for family in ["queen_messages_pushed_total", "queen_messages_acked_total", "queen_consumer_group_lag_messages"] {
        assert!(gone.iter().any(|line| line.starts_with(family)), "{family} of gone is missing from:\n{before}");
    }

    assert_eq!(app.delete("/api/v1/resources/queues/gone").await.body["deleted"], true);
    let after = prometheus_text(&app.http, &app.base).await;
    assert_eq!(series_of(&after, "gone"), Vec::<String>::new());
    assert_eq!(series_of(&after, "kept").len(), series_of(&before, "kept").len());
}

#[actix_web::test]
async fn a_queue_deleted_through_another_broker_leaves_this_ones_metrics() {
    let app = TestApp::spawn().await;
    let other = TestApp::spawn_on(&app.db, |_| {}).await;
    push(&app, "elsewhere", 1).await;
    assert!(!series_of(&prometheus_text(&app.http, &app.base).await, "elsewhere").is_empty());

    let deleted = app.http.delete(format!("{other}/api/v1/resources/queues/elsewhere")).send().await.expect("DELETE");
    assert!(deleted.status().is_success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = series_of(&prometheus_text(&app.http, &app.base).await, "elsewhere");
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "still on /metrics: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_web::test]
async fn queues_past_the_cap_are_counted_together_and_nothing_is_lost() {
    let app = TestApp::spawn_with(|config| config.metrics.max_queue_labels = 2).await;
    for (queue, n) in [("q1", 1), ("q2", 2), ("q3", 3), ("q4", 4)] {
        push(&app, queue, n).await;
    }
    // Groups reading the queues past the cap (before the first scrape reads the lag).
    for (queue, group) in [("q3", "a"), ("q4", "b")] {
        app.pop(&format!("queue/{queue}"), &format!("batch=1&consumerGroup={group}&autoAck=true")).await;
    }
    let pushed = |queue: &str| format!("queen_messages_pushed_total{{queue=\"{queue}\"}}");
    assert_eq!(app.metric(&pushed("q1")).await, 1.0);
    assert_eq!(app.metric(&pushed("q2")).await, 2.0);
    assert_eq!(app.metric(&pushed("_other")).await, 7.0, "q3 and q4 together");
    // Their lag is one series, whatever their groups.
    let lag =
        |queue: &str, group: &str| format!("queen_consumer_group_lag_messages{{group=\"{group}\",queue=\"{queue}\"}}");
    assert_eq!(app.metric(&lag("_other", "_other")).await, 5.0, "q3's 2 left for a, q4's 3 for b");
    let text = prometheus_text(&app.http, &app.base).await;
    assert!(series_of(&text, "q3").is_empty() && series_of(&text, "q4").is_empty(), "{text}");
    assert!(!text.contains("group=\"a\"") && !text.contains("group=\"b\""), "{text}");

    // A deleted queue gives its place to the next queue; the total still counts every push.
    app.delete("/api/v1/resources/queues/q1").await;
    push(&app, "q5", 5).await;
    assert_eq!(app.metric(&pushed("q5")).await, 5.0);
    assert_eq!(app.metric(&pushed("_other")).await, 7.0);
    let analytics = app.get("/api/v1/status/analytics").await;
    assert_eq!(analytics.body["broker"]["messagesPushed"], 15, "{analytics:?}");
}
