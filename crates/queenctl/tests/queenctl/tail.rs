//! `tail`: messages printed as they arrive; a throwaway group that disturbs no one and is gone
//! afterwards; or a named group that consumes.

use serde_json::Value;

use crate::helpers::{Background, TestBroker};

/// The names of the consumer groups the broker lists.
async fn group_names(broker: &TestBroker) -> Vec<String> {
    let groups = broker.json(&["groups", "list"]).await;
    groups.as_array().expect("a list").iter().map(|g| g["name"].as_str().expect("a name").to_owned()).collect()
}

#[actix_web::test]
async fn tail_prints_what_arrives_and_leaves_no_group_behind() {
    let broker = TestBroker::start().await;
    broker.run(&["push", "live", r#""before""#]).await.success();

    let tail = Background::start(&broker.url, &["tail", "live", "--count", "3"]);
    tail.wait_for_stderr("Ctrl-C to stop").await;
    assert!(tail.stderr().contains("as a throwaway consumer group queenctl-tail-"), "{}", tail.stderr());
    assert!(group_names(&broker).await.iter().any(|name| name.starts_with("queenctl-tail-")));
    for (partition, n) in [("a", 1), ("b", 2), ("a", 3)] {
        broker.run(&["push", "live", "-p", partition, &format!("{{\"n\": {n}}}")]).await.success();
    }
    let printed = tail.finish().await.success();
    let lines = printed.lines();
    assert_eq!(lines.len(), 3, "{printed:#?}");
    for n in 1..=3 {
        assert!(lines.iter().any(|line| line.ends_with(&format!("{{\"n\": {n}}}"))), "{printed:#?}");
    }
    assert!(lines.iter().any(|line| line.contains("  b/1  ")), "partition and offset are shown: {printed:#?}");
    assert!(!printed.stdout.contains("before"), "only what was pushed after it started: {printed:#?}");

    assert!(group_names(&broker).await.iter().all(|name| !name.starts_with("queenctl-tail-")));
    // Nobody was disturbed: queue mode still gets every message.
    let everything = broker.json(&["pop", "live", "--batch", "10", "--partitions", "3", "--auto-ack"]).await;
    assert_eq!(everything["messages"].as_array().expect("messages").len(), 4);
}

/// A token that may pop but not remove a group is refused the throwaway group, before tail
/// registers anything it could not remove; with --group it reads as that group.
#[actix_web::test]
async fn tail_without_a_group_needs_a_token_that_can_remove_its_group_and_leaves_none() {
    const ADMIN: &str = "queenctl-admin-token-0123456789";
    const WRITER: &str = "queenctl-writer-token-0123456789";
    let broker = TestBroker::with_tokens(&[("ops", ADMIN, "admin"), ("app", WRITER, "read-write")]).await;
    broker.run(&["push", "guarded", r#"{"n": 1}"#, "--token", WRITER]).await.success();
    let refused = broker.run(&["tail", "guarded", "--count", "1", "--from", "all", "--token", WRITER]).await;
    refused.fails(2, "pass --group G");
    let groups = broker.json(&["groups", "list", "--token", ADMIN]).await;
    assert_eq!(groups, serde_json::json!([]), "nothing registered");

    let named = broker.run(&["tail", "guarded", "--count", "1", "--from", "all", "-g", "app", "--token", WRITER]).await;
    let named = named.success();
    assert!(named.stdout.contains(r#"{"n": 1}"#), "{named:#?}");
}

#[actix_web::test]
async fn tail_stops_on_ctrl_c_prints_json_lines_and_deletes_its_group() {
    let broker = TestBroker::start().await;
    broker.run(&["push", "stream", r#"{"n": 1}"#]).await.success();

    let tail = Background::start(&broker.url, &["tail", "stream", "--from", "all", "-o", "json"]);
    tail.wait_for_lines(1).await;
    broker.run(&["push", "stream", r#"{"n": 2}"#]).await.success();
    tail.wait_for_lines(2).await;
    assert!(group_names(&broker).await.iter().any(|name| name.starts_with("queenctl-tail-")));

    tail.interrupt();
    let stopped = tail.finish().await.success();
    let messages: Vec<Value> =
        stopped.lines().iter().map(|line| serde_json::from_str(line).expect("one JSON object per line")).collect();
    assert_eq!(messages.len(), 2, "{stopped:#?}");
    assert_eq!((messages[0]["data"]["n"].as_i64(), messages[1]["data"]["n"].as_i64()), (Some(1), Some(2)));
    assert_eq!(messages[1]["queue"], "stream");
    assert!(stopped.stderr.contains("stopping"), "{stopped:#?}");
    assert!(group_names(&broker).await.iter().all(|name| !name.starts_with("queenctl-tail-")));
}

#[actix_web::test]
async fn tail_whose_terminal_hangs_up_still_deletes_its_group() {
    let broker = TestBroker::start().await;
    broker.run(&["push", "stream", r#"{"n": 1}"#]).await.success();

    let tail = Background::start(&broker.url, &["tail", "stream", "--from", "all"]);
    tail.wait_for_lines(1).await;
    assert!(group_names(&broker).await.iter().any(|name| name.starts_with("queenctl-tail-")));

    tail.signal(nix::sys::signal::Signal::SIGHUP);
    tail.finish().await.success();
    assert!(group_names(&broker).await.iter().all(|name| !name.starts_with("queenctl-tail-")));
}

#[actix_web::test]
async fn tail_as_a_named_group_acknowledges_what_it_printed() {
    let broker = TestBroker::start().await;
    for n in 1..=3 {
        broker.run(&["push", "audit-me", &n.to_string()]).await.success();
    }
    let tail = Background::start(&broker.url, &["tail", "audit-me", "--group", "audit", "--from", "all", "-n", "2"]);
    let printed = tail.finish().await.success();
    assert_eq!(printed.lines().len(), 2, "{printed:#?}");
    assert!(printed.stderr.contains("as consumer group audit"), "{printed:#?}");

    let audit = broker.json(&["groups", "show", "audit"]).await;
    assert_eq!((audit["totalLag"].as_i64(), audit["queues"][0]["totalConsumed"].as_i64()), (Some(1), Some(2)));
    let rest = broker.json(&["pop", "audit-me", "--group", "audit", "--batch", "5", "--auto-ack"]).await;
    assert_eq!(rest["messages"].as_array().expect("messages").len(), 1);
    assert_eq!(rest["messages"][0]["data"], 3);
}

/// A named group's tail whose reader is gone (its output a closed pipe, as under `| head`) gives
/// back what it could not print: the group gets those messages at once, not after their lease.
#[actix_web::test]
async fn tail_as_a_named_group_gives_back_what_it_could_not_print() {
    let broker = TestBroker::start().await;
    for n in 1..=3 {
        broker.run(&["push", "piped", &n.to_string()]).await.success();
    }
    let mut command = crate::helpers::command(
        &crate::helpers::with_url(&broker.url, &["tail", "piped", "--group", "reader", "--from", "all"]),
        &[],
    );
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("queenctl starts");
    drop(child.stdout.take());
    // It ends quietly, as a command under `| head` does.
    tokio::time::timeout(crate::helpers::DEADLINE, child.wait()).await.expect("it ends").expect("a status");
    let again = broker.json(&["pop", "piped", "--group", "reader", "--batch", "5", "--auto-ack"]).await;
    let data: Vec<&Value> = again["messages"].as_array().expect("messages").iter().map(|m| &m["data"]).collect();
    assert_eq!(data, [1, 2, 3], "{again}");
}
