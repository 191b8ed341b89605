//! `status` and `maintenance`, in both output forms.

use crate::helpers::{TestBroker, eventually, run};

#[actix_web::test]
async fn status_and_maintenance_in_both_forms() {
    let broker = TestBroker::start().await;
    broker.run(&["push", "mq", "1"]).await.success();

    let status = run(&["status"], &[("QUEEN_URL", &broker.url)], None).await.success();
    assert_eq!(status.field("url"), broker.url);
    assert!(status.field("broker").ends_with("(ok)"), "{status:#?}");
    assert_eq!((status.field("queues"), status.field("messages")), ("1", "1 stored, 1 pushed"));
    assert_eq!((status.field("push maintenance"), status.field("pop maintenance")), ("off", "off"));
    let status = broker.json(&["status"]).await;
    assert_eq!((status["status"]["status"].as_str(), status["status"]["queues"].as_i64()), (Some("ok"), Some(1)));
    assert_eq!(status["maintenance"]["maintenanceMode"], false);

    let shown = broker.run(&["maintenance"]).await.success();
    assert_eq!(shown.field("push maintenance"), "off");
    let on = broker.run(&["maintenance", "on"]).await.success();
    assert_eq!((on.field("push maintenance"), on.field("pop maintenance")), ("ON", "off"));
    // Pushes are buffered while it is on, and stored once it is off.
    let buffered = broker.run(&["push", "mq", "--transaction-id", "late", "2"]).await.success();
    assert_eq!(buffered.row("late")[1..], ["buffered", buffered.row("late")[2], "-", "-"]);
    let journal = broker.json(&["maintenance", "status"]).await;
    assert_eq!((journal["maintenanceMode"].as_bool(), journal["bufferedMessages"].as_u64()), (Some(true), Some(1)));
    let off = broker.json(&["maintenance", "off"]).await;
    assert_eq!(off["maintenanceMode"], false);
    eventually("the buffered push is stored", || async {
        broker.json(&["queues", "show", "mq"]).await["queue"]["messages"] == 2
    })
    .await;

    let paused = broker.json(&["maintenance", "on", "--pop"]).await;
    assert_eq!(
        (paused["popMaintenanceMode"].as_bool(), paused["maintenanceMode"].as_bool()),
        (Some(true), Some(false))
    );
    let nothing = broker.run(&["pop", "mq"]).await.success();
    assert!(nothing.stdout.is_empty() && nothing.stderr.contains("pops are paused"), "{nothing:#?}");
    assert_eq!(broker.json(&["pop", "mq"]).await["paused"], true);
    let resumed = broker.run(&["maintenance", "off", "--pop"]).await.success();
    assert_eq!(resumed.field("pop maintenance"), "off");
    assert_eq!(broker.json(&["pop", "mq", "--batch", "5"]).await["messages"].as_array().unwrap().len(), 2);
}
