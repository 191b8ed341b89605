//! `push --file`: NDJSON files and stdin, checked whole before anything is sent.

use crate::helpers::{TestBroker, run, temp_file};

#[actix_web::test]
async fn a_file_of_thousands_of_lines_lands_exactly() {
    let broker = TestBroker::start().await;
    let mut text = String::new();
    for n in 1..=3000 {
        text.push_str(&format!("{{\"n\": {n}}}\n"));
        if n % 1000 == 0 {
            text.push_str("\n   \n");
        }
    }
    let file = temp_file("bulk.ndjson", &text);

    let pushed = broker.run(&["push", "bulk", "--file", &file, "--transaction-id", "b1", "--batch-size", "400"]).await;
    let pushed = pushed.success();
    assert_eq!(pushed.stdout, "pushed 3000 messages to bulk: 3000 queued, 0 duplicates\n");
    assert_eq!(pushed.stderr, "", "no progress bar when stderr is not a terminal");
    let shown = broker.json(&["queues", "show", "bulk"]).await;
    assert_eq!(shown["queue"]["messages"], 3000);

    // The same file with the same prefix stores nothing twice.
    let again = broker.json(&["push", "bulk", "-f", &file, "--transaction-id", "b1"]).await;
    assert_eq!(
        again,
        serde_json::json!({"queue": "bulk", "messages": 3000, "queued": 0, "duplicates": 3000, "buffered": 0})
    );

    // From stdin, blank lines skipped.
    let args = ["--url", &broker.url, "push", "bulk", "--file", "-", "-o", "json"];
    let piped = run(&args, &[], Some(b"1\n\n\"two\"\n[3]\n")).await.success();
    assert_eq!(piped.json()["queued"], 3);
    let shown = broker.run(&["queues", "show", "bulk"]).await.success();
    assert_eq!(shown.field("messages"), "3003");

    // In order, line by line, each under its prefix and line number.
    let first = broker.json(&["pop", "bulk", "--batch", "2"]).await;
    assert_eq!(first["messages"][0]["data"], serde_json::json!({"n": 1}));
    assert_eq!(first["messages"][0]["transactionId"], "b1:1");
    assert_eq!(first["messages"][1]["transactionId"], "b1:2");
}

#[actix_web::test]
async fn a_bad_line_is_named_and_nothing_of_the_file_is_pushed() {
    let broker = TestBroker::start().await;
    let file = temp_file("bad.ndjson", "{\"ok\": 1}\n{\"ok\": 2}\n{\"oops\": \n{\"ok\": 4}\nnope\n");
    let refused = broker.run(&["push", "careful", "--file", &file]).await;
    refused.usage_error("line 3: not one JSON value");
    assert!(refused.stderr.contains("1 more bad line; nothing was pushed"), "{refused:#?}");
    assert!(refused.stderr.starts_with("queenctl: error: ") && refused.stderr.lines().count() == 1, "{refused:#?}");
    broker.run(&["queues", "show", "careful"]).await.fails(4, "queue \"careful\" not found");
}
