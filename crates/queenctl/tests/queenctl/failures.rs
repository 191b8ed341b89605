//! What scripts can trust: exit 3 when no broker answers, 4 for what does not exist, 1 for a
//! refusal, with the broker's reason on one line.

use crate::helpers::{TestBroker, dead_url, run};

#[actix_web::test]
async fn no_broker_is_exit_3_and_failover_finds_the_live_one() {
    let broker = TestBroker::start().await;
    let dead = dead_url().await;
    let down = run(&["--url", &dead, "status"], &[], None).await;
    down.fails(3, &format!("queenctl: error: cannot reach the broker ({dead}/api/v1/status): Connection refused"));
    assert_eq!(down.stderr.lines().count(), 1, "{down:#?}");
    // With several URLs and none answering, every one is named.
    let other_dead = dead_url().await;
    let all_down = run(&["--url", &format!("{dead},{other_dead}"), "status"], &[], None).await;
    all_down.fails(3, "; also tried ");
    for needle in ["Connection refused", &dead, &other_dead] {
        assert!(all_down.stderr.contains(needle), "stderr lacks {needle:?}: {all_down:#?}");
    }

    // Several URLs fail over: the dead one is skipped.
    let urls = format!("{dead},{}", broker.url);
    run(&["--url", &urls, "push", "q", "1"], &[], None).await.success();
    let status = run(&["status", "-o", "json"], &[("QUEEN_URL", &urls)], None).await.success();
    assert_eq!(status.json()["url"], broker.url.as_str());
}

#[actix_web::test]
async fn unknown_queues_groups_and_messages_are_exit_4() {
    let broker = TestBroker::start().await;
    broker.run(&["push", "real", "1"]).await.success();
    let not_found = [
        (vec!["queues", "show", "ghost"], "queue \"ghost\" not found (code: not_found, request id: "),
        (vec!["queues", "delete", "ghost", "--yes"], "queue \"ghost\" not found"),
        (vec!["groups", "show", "ghost"], "consumer group \"ghost\" not found"),
        (vec!["groups", "delete", "ghost", "--yes"], "consumer group \"ghost\" has no cursor or registration"),
        (vec!["seek", "g", "ghost", "--to-end"], "consumer group g does not read queue ghost"),
        (vec!["seek", "g", "ghost", "--to-end", "--create"], "404 Not Found"),
        (vec!["dlq", "show", "1", "ghost"], "message \"ghost\" of partition 1 is not stored and has no dead letters"),
        (vec!["dlq", "show", "999", "ghost", "-o", "json"], "is not stored and has no dead letters"),
        (vec!["dlq", "retry", "1", "ghost"], "no dead letter for message \"ghost\""),
        (vec!["dlq", "delete", "1", "ghost", "--yes"], "404 Not Found"),
    ];
    for (args, needle) in not_found {
        let answer = broker.run(&args).await;
        answer.fails(4, needle);
        assert!(answer.stdout.is_empty() && answer.stderr.lines().count() == 1, "{args:?}: {answer:#?}");
    }
    // A message that exists but has no dead letter is not found by `dlq show` either.
    let partition_id =
        broker.json(&["queues", "show", "real"]).await["partitions"][0]["id"].as_str().unwrap().to_owned();
    let pushed = broker.json(&["push", "real", "--transaction-id", "alive", "2"]).await;
    assert_eq!(pushed["partitionId"], partition_id.as_str());
    broker.run(&["dlq", "show", &partition_id, "alive"]).await.fails(4, "has no dead letters");
}

#[actix_web::test]
async fn a_broker_that_wants_a_token_gets_one_or_says_why_not() {
    const ADMIN: &str = "queenctl-admin-token-0123456789";
    const READER: &str = "queenctl-reader-token-0123456789";
    let broker = TestBroker::with_tokens(&[("ops", ADMIN, "admin"), ("dashboards", READER, "read-only")]).await;

    let anonymous = broker.run(&["status"]).await;
    anonymous.fails(1, "queenctl: error: the broker answered 401 Unauthorized: ");
    assert!(anonymous.stderr.contains("code: unauthorized"), "{anonymous:#?}");
    assert!(anonymous.stderr.contains("give one with --token or QUEEN_TOKEN"), "{anonymous:#?}");
    broker.run(&["push", "q", "1", "--token", "a-wrong-token-0123456789"]).await.fails(1, "401 Unauthorized");

    let pushed = broker.run(&["push", "q", "1", "--token", ADMIN]).await.success();
    assert_eq!(pushed.row("TRANSACTION ID").len(), 5);
    let args = ["--url", &broker.url, "queues", "show", "q", "-o", "json"];
    let shown = run(&args, &[("QUEEN_TOKEN", ADMIN)], None).await.success();
    assert_eq!(shown.json()["queue"]["messages"], 1);

    // A read-only token reads, and is refused what writes.
    broker.run(&["status", "--token", READER]).await.success();
    let refused = broker.run(&["push", "q", "2", "--token", READER]).await;
    refused.fails(1, "403 Forbidden");
    assert!(refused.stderr.contains("the token lacks the role or the queue scope"), "{refused:#?}");
}
