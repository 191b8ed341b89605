//! Queues and the broker: configuration, listings, dashboards' reads, the fleet and its history,
//! a full queue, typed refusals, maintenance mode, health, metrics and bearer tokens.

use std::time::Duration;

use queen_client::{
    Ack, BrokerState, Client, Error, History, ListQuery, Pop, PushItem, PushStatus, QueueConfig, StatusCode,
};
use queen_testkit::target_dir;
use serde_json::json;

use crate::helpers::{TestBroker, client_of, eventually};

#[actix_web::test]
async fn queues_are_configured_read_listed_and_deleted() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    let config = QueueConfig::new("billing.invoices")
        .namespace("billing")
        .task("invoices")
        .lease_time(Duration::from_secs(60))
        .retry_limit(5)
        .retry_delay(Duration::from_millis(250))
        .max_size(1000)
        .priority(3)
        .dead_letter_queue(true)
        .option("retentionEnabled", json!(true));
    let configured = client.configure(&config).await.expect("configure");
    assert!(configured.configured);
    let options = &configured.options;
    assert_eq!((options.lease_time, options.retry_limit, options.retry_delay), (60, 5, 250));
    assert_eq!((options.max_size, options.priority, options.dead_letter_queue), (1000, 3, true));
    assert!(options.retention_enabled, "an option named by its wire name acts");
    assert!(options.extra.is_empty(), "{:?}", options.extra);
    assert_eq!(configured.namespace.as_deref(), Some("billing"));
    // A later configure merges: options not given keep their value.
    let merged = client.configure(&QueueConfig::new("billing.invoices").retry_limit(1)).await.expect("configure");
    assert_eq!((merged.options.retry_limit, merged.options.lease_time), (1, 60));

    client
        .push(&[PushItem::new("billing.invoices", &1).unwrap(), PushItem::new("billing.invoices", &2).unwrap()])
        .await
        .expect("a push");
    let queue = client.queue("billing.invoices").await.expect("the queue");
    assert_eq!((queue.name.as_str(), queue.partitions, queue.messages), ("billing.invoices", 1, 2));
    assert_eq!(queue.options.lease_time, 60);
    client.push_one(PushItem::new("elsewhere", &1).unwrap()).await.expect("a push");
    let listed = client.list_queues(&ListQuery::new().namespace("billing")).await.expect("the queues");
    assert_eq!(listed.queues.iter().map(|q| q.name.as_str()).collect::<Vec<_>>(), ["billing.invoices"]);
    assert_eq!(listed.queues[0].messages.pushed, 2);
    let everything = client.list_queues(&ListQuery::new().limit(1)).await.expect("a page");
    assert_eq!((everything.queues.len(), everything.limit), (1, 1));
    let partitions = client.list_partitions(&ListQuery::new().queue("billing.invoices")).await.expect("partitions");
    assert_eq!((partitions.partitions.len(), partitions.partitions[0].messages_stored), (1, 2));

    let deleted = client.delete_queue("billing.invoices").await.expect("a deletion");
    assert!(deleted.deleted && deleted.existed);
    assert!(client.queue("billing.invoices").await.unwrap_err().is_not_found());
    assert!(!client.delete_queue("billing.invoices").await.expect("a deletion").existed);
}

#[actix_web::test]
async fn a_full_queue_and_bad_requests_are_typed_errors() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    client.configure(&QueueConfig::new("small").max_size(2)).await.expect("configure");
    client.push(&[PushItem::new("small", &1).unwrap(), PushItem::new("small", &2).unwrap()]).await.expect("a push");
    let full = client.push_one(PushItem::new("small", &3).unwrap()).await.unwrap_err();
    match &full {
        Error::QueueFull { queue, depth, max_size, retry_after, request_id, .. } => {
            assert_eq!((queue.as_str(), *depth, *max_size), ("small", 2, 2));
            assert_eq!(*retry_after, Some(Duration::from_secs(1)));
            assert!(request_id.is_some());
        }
        other => panic!("queue_full, not {other:?}"),
    }
    assert!(full.is_retryable());
    assert_eq!((full.status(), full.code()), (Some(StatusCode::TOO_MANY_REQUESTS), Some("queue_full")));
    assert_eq!(client.queue("small").await.expect("the queue").messages, 2, "nothing of the push was stored");

    let bad = client.push_one(PushItem::new("no/slashes", &1).unwrap()).await.unwrap_err();
    assert_eq!((bad.status(), bad.code()), (Some(StatusCode::BAD_REQUEST), Some("bad_request")), "{bad}");
    assert!(bad.request_id().is_some(), "the broker's request id, to find its log lines");
    assert!(bad.to_string().contains("queue"), "the broker's words: {bad}");
    assert!(!bad.is_retryable());
    assert!(matches!(client.pop(&Pop::queue("small").batch(0)).await, Err(Error::InvalidArgument(_))));
    assert!(matches!(PushItem::from_json("small", b"{nope".to_vec()), Err(Error::InvalidArgument(_))));
}

#[actix_web::test]
async fn dashboards_health_and_metrics_answer() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    let items: Vec<PushItem> = (0..3).map(|n| PushItem::new("watched", &json!({"n": n})).unwrap()).collect();
    client.push(&items).await.expect("a push");
    client.pop(&Pop::queue("watched").group("g").batch(1)).await.expect("a pop");

    let overview = client.overview().await.expect("the overview");
    assert_eq!((overview.queues, overview.messages.pushed, overview.active_leases), (1, 3, 1));
    let status = client.status().await.expect("the status");
    assert_eq!(status.status, "ok");
    assert!(!status.broker.is_empty() && status.queues == 1);
    let statuses = client.queue_statuses(&ListQuery::new()).await.expect("queue statuses");
    let watched = &statuses.queues[0];
    assert_eq!((watched.name.as_str(), watched.consumer_groups[0].name.as_str()), ("watched", "g"));
    let detail = client.queue_status("watched").await.expect("a queue's status");
    assert_eq!((detail.queue.name.as_str(), detail.partitions.len()), ("watched", 1));
    assert!(client.queue_status("nothing").await.unwrap_err().is_not_found());
    let analytics = client.analytics().await.expect("analytics");
    assert_eq!(analytics.broker.messages_pushed, 3.0);
    assert_eq!(analytics.totals.queues, 1);

    let newest = client.newest_messages("watched", None, Some(2)).await.expect("the newest messages");
    let numbers: Vec<serde_json::Value> = newest.messages.iter().map(|m| m.json().unwrap()).collect();
    assert_eq!(numbers, [json!({"n": 2}), json!({"n": 1})], "newest first");

    let health = client.health().await.expect("health");
    assert_eq!((health.status.as_str(), health.database.as_str()), ("healthy", "connected"));
    assert_eq!(client.ready().await.expect("ready").status, "ready");
    let metrics = client.metrics().await.expect("metrics");
    assert_eq!(metrics.value("queen_messages_pushed_total", &[("queue", "watched")]), Some(3.0));
    let text = client.metrics_prometheus().await.expect("the Prometheus text");
    assert!(text.contains("# TYPE queen_messages_pushed_total counter"), "{}", &text[..text.len().min(500)]);
}

/// The history's traffic summed over its points: pushed, delivered, acknowledged.
fn traffic(history: &History) -> (i64, i64, i64) {
    history.points.iter().fold((0, 0, 0), |(p, d, a), point| (p + point.pushed, d + point.delivered, a + point.acked))
}

#[actix_web::test]
async fn the_fleet_lists_every_broker_and_its_history_counts_their_traffic() {
    // Samples every second, so that heartbeats and traffic show at once.
    let broker = TestBroker::start_with(|config| config.stats.sample_interval_seconds = 1).await;
    let other_url = broker.another(|config| config.stats.sample_interval_seconds = 1).await;
    let (client, other) = (broker.client(), client_of(&[&other_url]));

    eventually("both brokers are listed live", || async {
        client
            .brokers()
            .await
            .is_ok_and(|fleet| fleet.brokers.len() == 2 && fleet.brokers.iter().all(|b| b.state == BrokerState::Live))
    })
    .await;
    let fleet = client.brokers().await.expect("the fleet");
    assert_eq!(fleet.heartbeat_seconds, 1);
    assert!(!fleet.maintenance.push && !fleet.maintenance.pop);
    let port = |url: &str| format!(":{}:", url.rsplit(':').next().expect("a port"));
    let mine: Vec<_> = fleet.brokers.iter().filter(|b| b.is_self).collect();
    assert_eq!(mine.len(), 1, "one broker answered: {fleet:?}");
    assert!(mine[0].id.contains(&port(&broker.url)), "{fleet:?}");
    for b in &fleet.brokers {
        assert!(!b.version.is_empty() && b.buffer_healthy && b.buffered_messages == 0, "{b:?}");
        assert!(b.started_at <= b.last_seen_at, "{b:?}");
    }
    let seen_by_other = other.brokers().await.expect("the fleet, from the other broker");
    let theirs = seen_by_other.brokers.iter().find(|b| b.is_self).expect("the other broker answered");
    assert!(theirs.id.contains(&port(&other_url)), "{seen_by_other:?}");

    // Five pushed through one broker, two of them taken and acknowledged through the other.
    let items: Vec<PushItem> = (0..5).map(|n| PushItem::new("charted", &n).unwrap()).collect();
    client.push(&items).await.expect("a push");
    let delivery = other.pop(&Pop::queue("charted").group("g").batch(2)).await.expect("a pop");
    let acks: Vec<Ack> = delivery.messages.iter().map(Ack::completed).collect();
    other.ack_batch(&acks).await.expect("acknowledgements");
    eventually("the history counts both brokers' traffic", || async {
        client.history(5).await.is_ok_and(|history| traffic(&history) == (5, 2, 2))
    })
    .await;
    let history = client.history(5).await.expect("the history");
    assert_eq!(history.interval_seconds, 1);
    // Five minutes at one second: every interval is a point, those without traffic included.
    assert!((300..=302).contains(&history.points.len()), "{} points", history.points.len());
    assert_eq!(history.from, history.points.first().map(|p| p.at));
    assert_eq!(history.to, history.points.last().map(|p| p.at));
    eventually("a lag sample counts the three messages g has not read", || async {
        client.history(1).await.is_ok_and(|history| history.points.iter().rev().find_map(|p| p.lag_messages) == Some(3))
    })
    .await;
    for minutes in [0, 1441] {
        let refused = client.history(minutes).await.unwrap_err();
        assert_eq!(refused.status(), Some(StatusCode::BAD_REQUEST), "{minutes} minutes: {refused}");
    }

    // The switches are the fleet's: turned on through one broker, the other says so.
    client.set_pop_maintenance(true).await.expect("pop maintenance on");
    eventually("the other broker reports pop maintenance", || async {
        other.brokers().await.is_ok_and(|fleet| fleet.maintenance.pop && !fleet.maintenance.push)
    })
    .await;
}

#[actix_web::test]
async fn maintenance_mode_buffers_pushes_and_pauses_pops() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    let on = client.set_push_maintenance(true).await.expect("push maintenance on");
    assert!(on.maintenance_mode && !on.pop_maintenance_mode);
    let buffered = client.push_one(PushItem::new("later", &"kept").unwrap().with_partition("p")).await.expect("a push");
    assert_eq!((buffered.status, buffered.partition_id.as_deref()), (PushStatus::Buffered, None));
    assert!(!buffered.is_stored());
    assert_eq!(client.maintenance().await.expect("the switches").buffered_messages, 1);
    assert!(!client.set_push_maintenance(false).await.expect("push maintenance off").maintenance_mode);
    let delivered = client.pop(&Pop::queue("later").wait(Duration::from_secs(10))).await.expect("a pop");
    assert_eq!(delivered.messages[0].json::<String>().unwrap(), "kept", "replayed when maintenance ended");

    assert!(client.set_pop_maintenance(true).await.expect("pop maintenance on").pop_maintenance_mode);
    client.push_one(PushItem::new("later", &"held").unwrap()).await.expect("a push");
    let paused = client.pop(&Pop::queue("later")).await.expect("a pop");
    assert!(paused.paused && paused.is_empty());
    client.set_pop_maintenance(false).await.expect("pop maintenance off");
    eventually("pops are served again", || async {
        client
            .pop(&Pop::queue("later"))
            .await
            .is_ok_and(|d| d.messages.first().is_some_and(|m| m.data.get() == "\"held\""))
    })
    .await;
}

#[actix_web::test]
async fn a_bearer_token_is_sent_with_every_call_and_a_missing_one_is_a_typed_401() {
    const TOKEN: &str = "client-token-0123456789abcdef";
    let dir = target_dir().join("client-auth");
    std::fs::create_dir_all(&dir).expect("a directory");
    let file = dir.join(format!("{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, format!("[[token]]\nname = \"svc\"\ntoken = \"{TOKEN}\"\nrole = \"admin\"\n"))
        .expect("the tokens file");
    let broker = TestBroker::start_with(move |config| config.auth.tokens_file = Some(file)).await;

    let anonymous = client_of(&[&broker.url]);
    let refused = anonymous.push_one(PushItem::new("secured", &1).unwrap()).await.unwrap_err();
    assert_eq!((refused.status(), refused.code()), (Some(StatusCode::UNAUTHORIZED), Some("unauthorized")));
    assert!(refused.is_auth() && !refused.is_retryable());
    assert_eq!(anonymous.health().await.expect("health is public").status, "healthy");

    let client = Client::builder().url(&broker.url).token(TOKEN).build().expect("a client");
    client.push_one(PushItem::new("secured", &1).unwrap()).await.expect("a push with the token");
    let delivery = client.pop(&Pop::queue("secured")).await.expect("a pop with the token");
    assert_eq!(delivery.messages[0].producer_sub.as_deref(), Some("svc"), "the token's name is the producer");
    client.set_push_maintenance(false).await.expect("an admin call");
}
