//! Consumer-group administration: lag, seek, subscription updates, deletion.

use chrono::{Duration as TimeDelta, Utc};
use queen_client::{AckStatus, Pop, PushItem, SeekTarget, SubscriptionMode};

use crate::helpers::{TestBroker, nothing_left};

async fn push_numbers(client: &queen_client::Client, queue: &str, numbers: std::ops::Range<u32>) {
    let items: Vec<PushItem> = numbers
        .map(|n| PushItem::new(queue, &n).unwrap().with_partition("p").with_transaction_id(format!("m{n}")))
        .collect();
    client.push(&items).await.expect("a push");
}

/// Pops everything `group` can get from `queue` and acknowledges it; the numbers, in order.
async fn drain(client: &queen_client::Client, queue: &str, group: &str) -> Vec<u32> {
    let delivery = client
        .pop(&Pop::queue(queue).group(group).subscription_mode(SubscriptionMode::All).batch(100))
        .await
        .expect("a pop");
    client.ack_messages(&delivery.messages, AckStatus::Completed).await.expect("an ack");
    delivery.messages.iter().map(|m| m.json::<u32>().unwrap()).collect()
}

#[actix_web::test]
async fn groups_are_listed_with_their_lag_and_lagging_cursors_are_found() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    push_numbers(&client, "lag", 0..5).await;
    let two = client.pop(&Pop::queue("lag").group("g").batch(2)).await.expect("a pop");
    client.ack_messages(&two.messages, AckStatus::Completed).await.expect("an ack");

    let groups = client.consumer_groups().await.expect("the groups");
    let g = groups.iter().find(|g| g.name == "g").expect("g is listed");
    assert_eq!(g.total_lag, 3);
    assert_eq!((g.queues[0].queue.as_str(), g.queues[0].total_consumed), ("lag", 2));
    let detail = client.consumer_group("g").await.expect("g");
    assert_eq!(detail.partitions[0].committed, 2);
    assert_eq!(detail.partitions[0].last_offset, 5);
    let lagging = client.lagging_groups(0).await.expect("lagging cursors");
    assert!(lagging.iter().any(|c| c.consumer_group == "g" && c.partition.lag_messages == 3), "{lagging:?}");
    assert!(client.lagging_groups(3600).await.expect("none an hour behind").iter().all(|c| c.consumer_group != "g"));
    assert!(client.consumer_group("nobody").await.unwrap_err().is_not_found());
}

#[actix_web::test]
async fn seeking_to_the_end_skips_and_seeking_to_a_time_reads_again() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    let before = Utc::now() - TimeDelta::minutes(1);
    push_numbers(&client, "seek", 0..4).await;
    assert_eq!(drain(&client, "seek", "s").await, [0, 1, 2, 3]);

    let back = client.seek("s", "seek", SeekTarget::Time(before)).await.expect("a seek");
    assert_eq!((back.partitions_updated, back.seek_to_end), (1, false));
    assert_eq!(drain(&client, "seek", "s").await, [0, 1, 2, 3], "read again, in order");

    push_numbers(&client, "seek", 4..6).await;
    let end = client.seek("s", "seek", SeekTarget::End).await.expect("a seek");
    assert!(end.seek_to_end && end.partitions[0].committed == 6, "{end:?}");
    assert!(nothing_left(&client, Pop::queue("seek").group("s")).await, "the backlog is skipped");
    push_numbers(&client, "seek", 6..7).await;
    assert_eq!(drain(&client, "seek", "s").await, [6], "only what came after");

    // One partition: an empty body is the end; a time reads again.
    let partition_id = end.partitions[0].partition_id.clone();
    push_numbers(&client, "seek", 7..9).await;
    let skipped = client.seek_partition("s", "seek", &partition_id, SeekTarget::End).await.expect("a seek");
    assert_eq!(skipped.partitions[0].committed, 9);
    assert!(nothing_left(&client, Pop::queue("seek").group("s")).await);
    client.seek_partition("s", "seek", &partition_id, SeekTarget::Time(before)).await.expect("a seek");
    assert_eq!(drain(&client, "seek", "s").await, (0..9).collect::<Vec<_>>());
}

#[actix_web::test]
async fn a_deleted_group_starts_again_and_a_subscription_update_moves_its_start() {
    let broker = TestBroker::start().await;
    let client = broker.client();
    push_numbers(&client, "again", 0..3).await;
    push_numbers(&client, "other", 0..2).await;
    assert_eq!(drain(&client, "again", "d").await.len(), 3);
    assert_eq!(drain(&client, "other", "d").await.len(), 2);

    let on_one = client.delete_consumer_group_on_queue("d", "other", false).await.expect("a deletion");
    assert_eq!(
        (on_one.queue.as_deref(), on_one.deleted_partitions, on_one.metadata_deleted),
        (Some("other"), 1, false)
    );
    assert_eq!(drain(&client, "other", "d").await.len(), 2, "read again on that queue");
    assert!(drain(&client, "again", "d").await.is_empty(), "not on the other queue");

    let updated = client.update_subscription("d", Utc::now()).await.expect("an update");
    assert!(updated.rows_updated >= 1 && updated.queues.contains(&"again".to_owned()), "{updated:?}");
    assert!(client.update_subscription("nobody", Utc::now()).await.unwrap_err().is_not_found());

    let deleted = client.delete_consumer_group("d", true).await.expect("a deletion");
    assert!(deleted.deleted_partitions >= 2 && deleted.metadata_deleted, "{deleted:?}");
    assert_eq!(drain(&client, "again", "d").await, [0, 1, 2], "subscribed afresh, from the start");
}
