//! Bad arguments and usage: a clear line on stderr, exit 2, and nothing sent.

use crate::helpers::{TestBroker, run};

#[actix_web::test]
async fn bad_arguments_exit_2_with_a_clear_error() {
    let broker = TestBroker::start().await;
    let url = broker.url.as_str();
    let usage = |args: &'static [&'static str]| {
        let mut all = vec!["--url", url];
        all.extend_from_slice(args);
        async move { run(&all, &[], None).await }
    };

    usage(&["push", "q", "1", "--bogus"]).await.usage_error("queenctl: error: unexpected argument '--bogus'");
    usage(&["frobnicate"]).await.usage_error("unrecognized subcommand 'frobnicate'");
    usage(&["push", "q"]).await.usage_error("<PAYLOAD|--file <FILE>>");
    usage(&["push", "q", "{not json"]).await.usage_error("queenctl: error: the payload is not JSON");
    usage(&["push", "q", "hello"]).await.usage_error(r#"a JSON string needs its quotes: '"hello"'"#);
    usage(&["seek", "g", "q", "--to", "not a time"]).await.usage_error("\"not a time\" is not an ISO-8601 time");
    usage(&["seek", "g", "q"]).await.usage_error("<--to-end|--to <TIME>>");
    usage(&["dlq", "list", "--from", "last week"]).await.usage_error("is not an ISO-8601 time");
    usage(&["tail", "q", "--from", "soon"]).await.usage_error("is not `all`, `new` or an ISO-8601 time");
    usage(&["ack", "1", "t", "--lease", "not-a-uuid"]).await.usage_error("invalid value 'not-a-uuid' for '--lease");
    usage(&["ack", "1", "t", "--status", "maybe"]).await.usage_error("invalid value 'maybe' for '--status");
    usage(&["pop", "q", "--batch", "0"]).await.usage_error("invalid value '0' for '--batch");
    usage(&["queues", "configure", "q", "--set", "novalue"]).await.usage_error("\"novalue\" is not KEY=VALUE");
    usage(&["status", "--ca-cert", "/nonexistent/ca.pem"]).await.usage_error("cannot read the CA certificate");
    run(&["--url", "ftp://example", "status"], &[], None).await.usage_error("is not an http:// or https:// URL");

    // Destructive commands on a non-terminal stdin need --yes, and do nothing without it.
    broker.run(&["push", "keep", "1"]).await.success();
    broker.run(&["pop", "keep", "--group", "keepers", "--auto-ack"]).await.success();
    usage(&["queues", "delete", "keep"]).await.usage_error("refusing to delete queue keep");
    usage(&["groups", "delete", "keepers"]).await.usage_error("stdin is not a terminal, so pass --yes");
    usage(&["dlq", "delete", "1", "t"]).await.usage_error("pass --yes");
    assert_eq!(broker.json(&["queues", "show", "keep"]).await["queue"]["messages"], 1);
    assert_eq!(broker.json(&["groups", "show", "keepers"]).await["name"], "keepers");

    // Help is not an error, and documents the exit codes.
    let help = usage(&["--help"]).await.success();
    assert!(help.stdout.contains("Exit codes:") && help.stdout.contains("4  not found"), "{help:#?}");
}
