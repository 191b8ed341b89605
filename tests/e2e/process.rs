//! Starting, configuring and stopping the broker process.

use std::time::Duration;

use nix::sys::signal::Signal;
use queen_store::embedded::{EmbeddedOptions, EmbeddedPostgres};
use queen_testkit::{BrokerProcess, TestDatabase, target_dir};
use reqwest::StatusCode;

use crate::support::{queen_binary, round_trip};

#[tokio::test]
async fn the_broker_serves_a_configured_database() {
    let db = TestDatabase::create("e2e_configured").await;
    let broker = BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &[]).await;
    let http = queen_testkit::http().build().expect("an HTTP client");
    for probe in ["/health", "/ready"] {
        let answer = http.get(format!("{}{probe}", broker.url())).send().await.expect(probe);
        assert_eq!(answer.status(), StatusCode::OK, "{probe}");
    }
    round_trip(&broker.url(), "configured").await;
}

#[tokio::test]
async fn with_no_database_configured_the_broker_runs_and_owns_its_own_postgresql() {
    let data_dir = target_dir().join(format!("e2e-embedded-{}", uuid::Uuid::new_v4().simple()));
    let data_arg = data_dir.to_string_lossy().into_owned();
    let mut broker = BrokerProcess::start(queen_binary(), &["--data-dir", &data_arg], &[]).await;
    let first = broker.log().first().cloned().unwrap_or_default();
    assert!(
        first.contains("embedded PostgreSQL") && first.contains(&data_arg),
        "the first log line says where the embedded database lives: {first}"
    );
    round_trip(&broker.url(), "embedded").await;
    let pid_file = data_dir.join("pg").join("postmaster.pid");
    assert!(pid_file.exists(), "the embedded server runs");

    // A one-off `queen migrate` on the same data directory adopts the server and leaves it running.
    let migrate =
        tokio::process::Command::new(queen_binary()).args(["migrate", "--data-dir", &data_arg]).output().await;
    let migrate = migrate.expect("queen migrate runs");
    assert!(migrate.status.success(), "migrate: {}", String::from_utf8_lossy(&migrate.stderr));
    assert!(pid_file.exists(), "migrate left the broker's PostgreSQL running");
    round_trip(&broker.url(), "embedded-after-migrate").await;

    broker.signal(Signal::SIGTERM);
    let status = broker.wait(Duration::from_secs(60)).await.expect("the broker exits after SIGTERM");
    assert!(status.success(), "exit status {status:?}; log:\n{}", broker.log().join("\n"));
    assert!(!pid_file.exists(), "the broker stopped the PostgreSQL it owns");
    std::fs::remove_dir_all(&data_dir).expect("the data dir can be removed");
}

/// The embedded PostgreSQL killed under the broker (the kernel's out-of-memory killer, say) is
/// started again by the broker, on the same port: pushes answer 503 meanwhile, then go through,
/// and what was acknowledged before is still there.
#[tokio::test]
async fn an_embedded_postgresql_killed_under_the_broker_is_started_again() {
    let data_dir = target_dir().join(format!("e2e-embedded-killed-{}", uuid::Uuid::new_v4().simple()));
    let data_arg = data_dir.to_string_lossy().into_owned();
    let mut broker = BrokerProcess::start(queen_binary(), &["--data-dir", &data_arg], &[]).await;
    let http = queen_testkit::http().build().expect("an HTTP client");
    let push = |txn: &'static str| {
        let body = serde_json::json!({"items": [{"queue": "killed", "transactionId": txn, "payload": txn}]});
        http.post(format!("{}/api/v1/push", broker.url())).json(&body).send()
    };
    assert_eq!(push("before").await.expect("an answer").status(), StatusCode::CREATED);

    let pid_file = data_dir.join("pg").join("postmaster.pid");
    let postmaster = |text: &str| text.lines().next().and_then(|pid| pid.trim().parse::<i32>().ok());
    let killed = postmaster(&std::fs::read_to_string(&pid_file).expect("postmaster.pid")).expect("its pid");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(killed), Signal::SIGKILL).expect("the postmaster killed");

    // Backends the postmaster left may answer a statement or two before they notice: the restart
    // shows in the pid file, which names the new postmaster once it runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let running = || std::fs::read_to_string(&pid_file).ok().and_then(|text| postmaster(&text));
    while running().is_none_or(|pid| pid == killed) {
        assert!(std::time::Instant::now() < deadline, "the broker never started its PostgreSQL again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    loop {
        let answer = push("after").await.expect("an answer");
        if answer.status() == StatusCode::CREATED {
            break;
        }
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE, "503 until the pool reconnects");
        assert!(std::time::Instant::now() < deadline, "the broker did not reconnect");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let popped = http.get(format!("{}/api/v1/pop/queue/killed?batch=10", broker.url())).send().await.expect("a pop");
    let popped: serde_json::Value = popped.json().await.expect("JSON");
    let ids: Vec<&str> =
        popped["messages"].as_array().expect("messages").iter().filter_map(|m| m["transactionId"].as_str()).collect();
    assert_eq!(ids, ["before", "after"], "{popped}");
    assert!(
        broker.log().iter().any(|line| line.contains("started it again")),
        "the broker says what it did: {:?}",
        broker.log()
    );

    broker.signal(Signal::SIGTERM);
    let status = broker.wait(Duration::from_secs(60)).await.expect("the broker exits after SIGTERM");
    assert!(status.success(), "exit status {status:?}; log:\n{}", broker.log().join("\n"));
    assert!(!pid_file.exists(), "the broker stopped the PostgreSQL it started again");
    std::fs::remove_dir_all(&data_dir).expect("the data dir can be removed");
}

#[tokio::test]
async fn queen_migrate_brings_a_database_up_to_date_and_can_run_again() {
    let db = TestDatabase::create("e2e_migrate").await;
    for run in 0..2 {
        let output = tokio::process::Command::new(queen_binary())
            .args(["migrate", "--database-url", db.url()])
            .output()
            .await
            .expect("queen migrate runs");
        assert!(output.status.success(), "run {run}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let client = db.connect().await;
    let applied: i64 =
        client.query_one("SELECT count(*) FROM queen.schema_migrations", &[]).await.expect("migrations").get(0);
    assert_eq!(applied, i64::from(queen_store::migrations::latest_version()));

    // A schema a newer broker migrated: this one refuses to start on it, saying why.
    let future = queen_store::migrations::latest_version() + 1;
    client
        .execute(
            "INSERT INTO queen.schema_migrations (version, name, checksum) VALUES ($1, 'from_the_future', 'x')",
            &[&future],
        )
        .await
        .expect("a newer migration recorded");
    let output = tokio::process::Command::new(queen_binary())
        .args(["--database-url", db.url(), "--host", "127.0.0.1", "--port", "0"])
        .output()
        .await
        .expect("queen runs");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{log}");
    assert!(log.contains("newer than this broker knows") && log.contains("upgrade the broker"), "{log}");
}

#[tokio::test]
async fn an_invalid_setting_stops_start_up_with_one_line_naming_it() {
    for (variable, value, setting) in [
        ("QUEEN_DATABASE__POOL_SIZE", "0", "database.pool_size"),
        ("DB_POOL_SIZE", "many", "database.pool_size"),
        ("QUEEN_HTTP__PORT", "99999", "http.port"),
    ] {
        let output =
            tokio::process::Command::new(queen_binary()).env(variable, value).output().await.expect("queen runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{variable}={value}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(setting), "{variable}={value} should name {setting}: {stderr}");
    }
}

#[tokio::test]
async fn the_broker_answers_503_while_postgresql_is_down_and_recovers_when_it_is_back() {
    // A PostgreSQL of this test's own, so it can be stopped.
    let data_dir = target_dir().join(format!("e2e-outage-{}", uuid::Uuid::new_v4().simple()));
    let options = || EmbeddedOptions { data_dir: data_dir.join("pg"), bin_dir: None, port: None, settings: Vec::new() };
    let server = EmbeddedPostgres::start(options()).await.expect("a PostgreSQL for the test");
    let port = server.port();
    let broker = BrokerProcess::start(queen_binary(), &["--database-url", &server.url("postgres")], &[]).await;
    round_trip(&broker.url(), "before").await;

    server.stop().await.expect("PostgreSQL stops");
    let http = queen_testkit::http().build().expect("an HTTP client");
    let push = |txn: &'static str| {
        let body = serde_json::json!({"items": [{"queue": "outage", "transactionId": txn, "payload": 1}]});
        http.post(format!("{}/api/v1/push", broker.url())).json(&body).send()
    };
    let down = push("while-down").await.expect("an answer while PostgreSQL is down");
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(down.headers().get("retry-after").map(|v| v.as_bytes()), Some(&b"1"[..]));
    let request_id = down.headers().get("x-request-id").cloned().expect("a request id");
    let error: serde_json::Value = down.json().await.expect("a JSON error");
    assert_eq!(error["code"], "unavailable", "{error}");
    assert_eq!(error["error"], queen_broker::broker::DATABASE_UNAVAILABLE, "the broker's words, not PostgreSQL's");
    assert_eq!(error["requestId"].as_str().map(str::as_bytes), Some(request_id.as_bytes()));
    let health = http.get(format!("{}/health", broker.url())).send().await.expect("health");
    assert_eq!(health.status(), StatusCode::OK, "liveness does not fail because PostgreSQL is down");
    let ready = http.get(format!("{}/ready", broker.url())).send().await.expect("ready");
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);

    let server = EmbeddedPostgres::start(EmbeddedOptions { port: Some(port), ..options() })
        .await
        .expect("PostgreSQL starts again");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let answer = push("after").await.expect("an answer");
        if answer.status() == StatusCode::CREATED {
            break;
        }
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(std::time::Instant::now() < deadline, "the broker did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    round_trip(&broker.url(), "recovered").await;
    drop(broker);
    server.stop().await.expect("PostgreSQL stops");
    std::fs::remove_dir_all(&data_dir).expect("the data dir can be removed");
}

#[tokio::test]
async fn help_lists_the_settings_and_their_environment_names() {
    let output = tokio::process::Command::new(queen_binary()).arg("--help").output().await.expect("queen --help");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for name in [
        "--config",
        "--port",
        "--database-url",
        "QUEEN_<SECTION>__<KEY>",
        "PG_HOST",
        "PG_PASSWORD",
        "DB_POOL_SIZE",
        "PARTITION_CLEANUP_DAYS",
        "RETENTION_INTERVAL",
    ] {
        assert!(help.contains(name), "--help does not mention {name}:\n{help}");
    }
}

#[tokio::test]
async fn sigterm_under_load_loses_no_acknowledged_push_and_exits_cleanly() {
    let db = TestDatabase::create("e2e_sigterm").await;
    let mut broker = BrokerProcess::start(
        queen_binary(),
        &["--database-url", db.url()],
        &[("QUEEN_HTTP__SHUTDOWN_TIMEOUT_SECONDS", "10")],
    )
    .await;
    let base = broker.url();
    let http = queen_testkit::http().timeout(Duration::from_secs(30)).build().expect("a client");

    // A long poll parked on an empty queue, and a lease the broker granted.
    let parked = {
        let (http, base) = (http.clone(), base.clone());
        tokio::spawn(async move {
            let answer = http.get(format!("{base}/api/v1/pop/queue/idle?wait=true&timeout=30000")).send().await;
            (answer.map(|a| a.status()), std::time::Instant::now())
        })
    };
    let seed = serde_json::json!({"items": [{"queue": "leased", "transactionId": "l", "payload": 1}]});
    http.post(format!("{base}/api/v1/push")).json(&seed).send().await.expect("push");
    let leased = http.get(format!("{base}/api/v1/pop/queue/leased?batch=1")).send().await.expect("pop");
    assert_eq!(leased.status(), StatusCode::OK);
    let leased: serde_json::Value = leased.json().await.expect("a pop answer");
    let leased = leased["messages"][0].clone();

    // Producers push until the broker stops answering; every 201 is recorded.
    let acknowledged = std::sync::Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let mut producers = Vec::new();
    for p in 0..4 {
        let (http, base, acknowledged) = (http.clone(), base.clone(), std::sync::Arc::clone(&acknowledged));
        producers.push(tokio::spawn(async move {
            for i in 0.. {
                let id = format!("p{p}-{i}");
                let body = serde_json::json!({"items": [{"queue": "load", "partition": format!("p{p}"), "transactionId": id, "payload": i}]});
                let Ok(answer) = http.post(format!("{base}/api/v1/push")).json(&body).send().await else { return };
                let status = answer.status();
                // A response is always whole: a 201 with its JSON, or an error before any byte.
                let Ok(json) = answer.json::<serde_json::Value>().await else { panic!("a half-answered push ({status})") };
                if status == StatusCode::CREATED {
                    assert_eq!(json[0]["status"], "queued");
                    acknowledged.lock().await.push(id);
                } else {
                    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{json}");
                }
            }
        }));
    }
    while acknowledged.lock().await.len() < 100 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let signalled = std::time::Instant::now();
    broker.signal(Signal::SIGTERM);
    let (parked_status, answered_at) = parked.await.expect("the long poll");
    assert_eq!(parked_status.expect("the long poll was answered"), StatusCode::NO_CONTENT);
    assert!(
        answered_at.duration_since(signalled) < Duration::from_secs(5),
        "the parked long poll was answered at once"
    );
    let status = broker.wait(Duration::from_secs(20)).await.expect("the broker exits within its shutdown bound");
    assert!(status.success(), "exit status {status:?}; log:\n{}", broker.log().join("\n"));
    for producer in producers {
        producer.await.expect("a producer");
    }

    let client = db.connect().await;
    let stored: std::collections::HashSet<String> = client
        .query("SELECT transaction_id FROM queen.log_message_ids", &[])
        .await
        .expect("ids")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let acknowledged = acknowledged.lock().await;
    let lost: Vec<&String> = acknowledged.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(lost.is_empty(), "acknowledged pushes missing after shutdown: {lost:?}");
    // The lease the broker granted outlives it: its consumer acknowledges through another broker.
    let other = BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &[]).await;
    let ack =
        serde_json::json!({"transactionId": "l", "partitionId": leased["partitionId"], "leaseId": leased["leaseId"]});
    let acked = http.post(format!("{}/api/v1/ack", other.url())).json(&ack).send().await.expect("ack");
    let acked: serde_json::Value = acked.json().await.expect("an ack answer");
    assert_eq!(acked[0]["success"], true, "the lease was left alone: {acked}");
}

/// A pop answered just before SIGTERM, whose consumer reads it slowly, is written to the end
/// before the broker exits: cut, its batch would stay leased to nobody and be delivered again.
#[tokio::test]
async fn an_answer_still_being_read_at_sigterm_is_written_whole() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let db = TestDatabase::create("e2e_slow_reader").await;
    let mut broker = BrokerProcess::start(queen_binary(), &["--database-url", db.url()], &[]).await;
    let http = queen_testkit::http().timeout(Duration::from_secs(30)).build().expect("a client");
    // More than the kernel's buffers on both sides of the connection hold.
    let payload = "x".repeat(12 * 1024 * 1024);
    let push = serde_json::json!({"items": [{"queue": "large", "transactionId": "big", "payload": payload}]});
    let pushed = http.post(format!("{}/api/v1/push", broker.url())).json(&push).send().await.expect("push");
    assert_eq!(pushed.status(), StatusCode::CREATED);

    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.set_recv_buffer_size(64 * 1024).expect("a small receive buffer");
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], broker.port()));
    let mut stream = socket.connect(address).await.expect("a connection");
    let request = "GET /api/v1/pop/queue/large?batch=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).await.expect("the request");
    let mut received = Vec::new();
    let mut chunk = vec![0; 64 * 1024];
    let head_end = loop {
        let n = stream.read(&mut chunk).await.expect("the answer's head");
        assert!(n > 0, "the connection closed before the answer's head");
        received.extend_from_slice(&chunk[..n]);
        if let Some(at) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&received[..head_end]).to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .expect("a content length");

    broker.signal(Signal::SIGTERM);
    // About 3 MB/s: seconds past the broker's own second for connections left open.
    loop {
        let n = stream.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        received.extend_from_slice(&chunk[..n]);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(received.len() - head_end, length, "the answer was cut");
    let status = broker.wait(Duration::from_secs(40)).await.expect("the broker exits");
    assert!(status.success(), "exit status {status:?}; log:\n{}", broker.log().join("\n"));
}

/// A broker that cannot start after it started its embedded PostgreSQL (its port is taken) stops
/// that server rather than leave it running without a broker.
#[tokio::test]
async fn a_broker_that_fails_to_start_stops_the_postgresql_it_started() {
    let data_dir = target_dir().join(format!("e2e-embedded-failed-{}", uuid::Uuid::new_v4().simple()));
    let data_arg = data_dir.to_string_lossy().into_owned();
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to hold");
    let port = held.local_addr().expect("its address").port().to_string();
    let started = tokio::process::Command::new(queen_binary())
        .args(["--data-dir", &data_arg, "--host", "127.0.0.1", "--port", &port])
        .env_remove("QUEEN_DATABASE__URL")
        .env_remove("DATABASE_URL")
        .output()
        .await
        .expect("queen runs");
    let log = String::from_utf8_lossy(&started.stderr);
    assert!(!started.status.success(), "{log}");
    assert!(log.contains("cannot listen"), "{log}");
    assert!(log.contains("embedded PostgreSQL ready"), "it got as far as its PostgreSQL: {log}");
    assert!(!data_dir.join("pg").join("postmaster.pid").exists(), "the embedded server was left running: {log}");
    std::fs::remove_dir_all(&data_dir).expect("the data dir can be removed");
}

/// Two brokers sharing one embedded data directory: the one that adopted the server leaves it
/// running for the other when it stops, and the last one to stop stops it.
#[tokio::test]
async fn brokers_sharing_an_embedded_postgresql_leave_it_to_the_last_one() {
    let data_dir = target_dir().join(format!("e2e-embedded-shared-{}", uuid::Uuid::new_v4().simple()));
    let dir = |name: &str| data_dir.join(name).to_string_lossy().into_owned();
    let (data_arg, first_buffer, second_buffer) = (dir("data"), dir("buffer-1"), dir("buffer-2"));
    let mut first =
        BrokerProcess::start(queen_binary(), &["--data-dir", &data_arg, "--buffer-dir", &first_buffer], &[]).await;
    let mut second =
        BrokerProcess::start(queen_binary(), &["--data-dir", &data_arg, "--buffer-dir", &second_buffer], &[]).await;
    assert!(second.log().iter().any(|line| line.contains("adopt")), "{:?}", second.log());
    round_trip(&first.url(), "shared-first").await;
    round_trip(&second.url(), "shared-second").await;
    let pid_file = data_dir.join("data").join("pg").join("postmaster.pid");
    let postmaster = || std::fs::read_to_string(&pid_file).ok().and_then(|text| text.lines().next().map(str::to_owned));
    let running = postmaster().expect("the embedded server runs");

    second.signal(Signal::SIGTERM);
    let status = second.wait(Duration::from_secs(60)).await.expect("the second broker exits");
    assert!(status.success(), "exit status {status:?}; log:\n{}", second.log().join("\n"));
    assert_eq!(postmaster().as_deref(), Some(running.as_str()), "the server the first broker uses was stopped");
    round_trip(&first.url(), "shared-after").await;

    first.signal(Signal::SIGTERM);
    let status = first.wait(Duration::from_secs(60)).await.expect("the first broker exits");
    assert!(status.success(), "exit status {status:?}; log:\n{}", first.log().join("\n"));
    assert!(!pid_file.exists(), "the last broker stopped the server");
    std::fs::remove_dir_all(&data_dir).expect("the data dir can be removed");
}
