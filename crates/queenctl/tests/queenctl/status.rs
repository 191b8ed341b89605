//! `status` (with the fleet's brokers) and `maintenance`, in both output forms.

use crate::helpers::{TestBroker, eventually, run};

#[actix_web::test]
async fn status_and_maintenance_in_both_forms() {
    // Heartbeats every second, so that the fleet lists this broker at once.
    let broker = TestBroker::start_with(|config| config.stats.sample_interval_seconds = 1).await;
    broker.run(&["push", "mq", "1"]).await.success();
    eventually("the broker's heartbeat is recorded", || async {
        broker.json(&["status"]).await["fleet"]["brokers"].as_array().is_some_and(|brokers| !brokers.is_empty())
    })
    .await;

    let status = run(&["status"], &[("QUEEN_URL", &broker.url)], None).await.success();
    assert_eq!(status.field("url"), broker.url);
    let id = status.field("broker").strip_suffix(" (ok)").unwrap_or_else(|| panic!("{status:#?}")).to_owned();
    assert_eq!((status.field("queues"), status.field("messages")), ("1", "1 stored, 1 pushed"));
    assert_eq!((status.field("push maintenance"), status.field("pop maintenance")), ("off", "off"));
    // The fleet's table: this broker, live, with an empty journal, and the one that answered.
    assert_eq!(status.row("BROKER"), ["BROKER", "STATE", "VERSION", "STARTED", "LAST SEEN", "BUFFERED", "THIS ONE"]);
    let row = status.row(&id);
    assert_eq!((row[1], row[2], row[5], row[6]), ("live", env!("CARGO_PKG_VERSION"), "0", "yes"), "{status:#?}");
    assert!(row[3] <= row[4], "started before last seen: {row:?}");
    let status = broker.json(&["status"]).await;
    assert_eq!((status["status"]["status"].as_str(), status["status"]["queues"].as_i64()), (Some("ok"), Some(1)));
    assert_eq!(status["maintenance"]["maintenanceMode"], false);
    let fleet = &status["fleet"];
    assert_eq!((fleet["heartbeatSeconds"].as_u64(), fleet["maintenance"]["push"].as_bool()), (Some(1), Some(false)));
    let listed = &fleet["brokers"][0];
    assert_eq!((listed["id"].as_str(), listed["state"].as_str()), (Some(id.as_str()), Some("live")), "{fleet:#}");
    assert_eq!((listed["self"].as_bool(), listed["bufferedMessages"].as_i64()), (Some(true), Some(0)));

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
