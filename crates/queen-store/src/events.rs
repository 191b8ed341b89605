//! Fleet events: what brokers tell each other through PostgreSQL `NOTIFY` on one channel.
//!
//! A push announces its partition after it committed, and so does an ack that releases a lease
//! over pending messages: the broker collects such notices and sends all it has in one
//! asynchronously committed statement ([`publish_after_commit`]). A `NOTIFY` inside the push
//! transaction would serialise every commit on PostgreSQL's notification lock, each waiting for
//! its own WAL flush. Seek, group deletion and subscription changes tell every
//! broker to forget what it knew about a group (its empty-scan watermark and candidates). A change
//! of the maintenance switches carries the whole new state.
//!
//! Payloads are short text: `p <queue id> <partition id> <queue>`,
//! `r <queue id, or 0 for every queue> <group>`, `q <queue id> <queue>` and
//! `m <revision> <push maintenance 0|1> <pop maintenance 0|1>`. Names come last, so they may
//! contain spaces.

use deadpool_postgres::GenericClient;

use crate::StoreError;
use crate::system_state::Modes;

/// The one channel every broker listens on.
pub const CHANNEL: &str = "queen_events";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Messages became available in the partition (pushed, or released by an ack).
    Available { queue_id: i64, partition_id: i64, queue: String },
    /// Forget what is known about the group on the queue (every queue when `queue_id` is 0).
    Reset { queue_id: i64, group: String },
    /// The queue was configured or deleted: forget what is cached of it.
    QueueChanged { queue_id: i64, queue: String },
    /// The maintenance switches changed; this is their state as of that change.
    ModesChanged(Modes),
}

impl Event {
    pub fn encode(&self) -> String {
        match self {
            Event::Available { queue_id, partition_id, queue } => format!("p {queue_id} {partition_id} {queue}"),
            Event::Reset { queue_id, group } => format!("r {queue_id} {group}"),
            Event::QueueChanged { queue_id, queue } => format!("q {queue_id} {queue}"),
            Event::ModesChanged(Modes { revision, push_maintenance, pop_maintenance }) => {
                format!("m {revision} {} {}", u8::from(*push_maintenance), u8::from(*pop_maintenance))
            }
        }
    }

    /// `None` for a payload this broker does not understand (from a newer broker, say).
    pub fn decode(payload: &str) -> Option<Event> {
        let (kind, rest) = payload.split_once(' ')?;
        let (first, rest) = rest.split_once(' ')?;
        // For `m`, the revision.
        let queue_id = first.parse().ok()?;
        match kind {
            "p" => {
                let (partition, queue) = rest.split_once(' ')?;
                Some(Event::Available { queue_id, partition_id: partition.parse().ok()?, queue: queue.to_owned() })
            }
            "r" => Some(Event::Reset { queue_id, group: rest.to_owned() }),
            "q" => Some(Event::QueueChanged { queue_id, queue: rest.to_owned() }),
            "m" => {
                let flag = |text: &str| match text {
                    "0" => Some(false),
                    "1" => Some(true),
                    _ => None,
                };
                let (push, pop) = rest.split_once(' ')?;
                let modes = Modes { revision: queue_id, push_maintenance: flag(push)?, pop_maintenance: flag(pop)? };
                Some(Event::ModesChanged(modes))
            }
            _ => None,
        }
    }
}

/// Publishes events about writes that have already committed, in one statement whose commit does
/// not wait for the WAL flush (`synchronous_commit` off for that transaction only): the notices
/// carry no data of their own, so losing them in a crash loses nothing that a scan would not
/// find again.
pub async fn publish_after_commit(client: &impl GenericClient, events: &[String]) -> Result<(), StoreError> {
    let statement = client
        .prepare_cached(
            "SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, e)
               FROM unnest($2::text[]) AS e",
        )
        .await?;
    client.execute(&statement, &[&CHANNEL, &events]).await?;
    Ok(())
}

/// The backend process of the session, which the notices it sends name as their sender.
pub async fn session_pid(client: &impl GenericClient) -> Result<i32, StoreError> {
    Ok(client.query_one("SELECT pg_backend_pid()", &[]).await?.get(0))
}

/// Publishes an event; inside a transaction it is delivered at commit, and not at all on
/// rollback.
pub async fn publish(client: &impl GenericClient, event: &Event) -> Result<(), StoreError> {
    client.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &event.encode()]).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_with_spaces_in_names() {
        let events = [
            Event::Available { queue_id: 3, partition_id: 44, queue: "orders eu".into() },
            Event::Reset { queue_id: 3, group: "billing team".into() },
            Event::Reset { queue_id: 0, group: "g".into() },
            Event::QueueChanged { queue_id: 9, queue: "billing eu".into() },
            Event::ModesChanged(Modes { revision: 12, push_maintenance: true, pop_maintenance: false }),
            Event::ModesChanged(Modes { revision: 13, push_maintenance: false, pop_maintenance: true }),
        ];
        for event in events {
            assert_eq!(Event::decode(&event.encode()), Some(event));
        }
        assert_eq!(Event::decode("z 1 2"), None);
        assert_eq!(Event::decode("p x 2 q"), None);
        assert_eq!(Event::decode(""), None);
        assert_eq!(Event::decode("m 3 1 2"), None, "flags are 0 or 1");
        assert_eq!(Event::decode("m 3 1"), None);
    }
}
