//! The Rust client of [Queen](https://github.com/queen-mq/queen-rs), a partitioned message
//! queue broker over PostgreSQL.
//!
//! Async (Tokio), typed, with failover across the brokers of a fleet. It covers the broker's
//! whole HTTP API: push, pop (by queue, partition, namespace or task; long polls; consumer
//! groups), acknowledgements, leases and their automatic renewal, transactions, consumer-group
//! administration (lag, seek, subscription, deletion), dead letters, queue configuration and
//! the dashboards' reads, maintenance mode, health and metrics; and a [`Consumer`] loop that
//! runs a handler per message.
//!
//! # Quick start
//!
//! ```no_run
//! use queen_client::{Ack, Client, Pop, PushItem};
//! use std::time::Duration;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new("http://localhost:6632")?;
//! client.push(&[PushItem::new("orders", &serde_json::json!({"id": 1}))?]).await?;
//! let delivery = client.pop(&Pop::queue("orders").batch(10).wait(Duration::from_secs(5))).await?;
//! for message in &delivery.messages {
//!     let order: serde_json::Value = message.json()?;
//!     println!("{order}");
//!     client.ack(&Ack::completed(message)).await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! A long-running consumer is better written with [`Client::consumer`], which acknowledges,
//! renews leases, limits concurrency, survives broker restarts and stops gracefully.
//!
//! # Failover and retries
//!
//! A client built with several URLs ([`ClientBuilder::url`]) sends each call to the broker that
//! answered last (sticky). A call whose attempt gets **no answer** (connection refused or reset,
//! a timeout) or an answer **502, 503 or 504** goes on to the next URL at once, round robin;
//! once every URL has failed in turn, the client waits (the broker's `Retry-After`, else an
//! exponential backoff) and goes round again, within the [`RetryPolicy`]'s attempts. A **429**
//! that carries `Retry-After` (a busy partition writer or group, too many long polls from this
//! client) is retried on the same broker after that wait. A 429 `queue_full`
//! ([`Error::QueueFull`]) and a 409 `limit_reached` ([`Error::LimitReached`]) are returned at
//! once: they pass only when consumers catch up or an operator acts. Every other answer (4xx,
//! 500) is returned as it is.
//!
//! Which calls are sent again when an attempt's outcome is unknown (the request may have reached
//! the broker and applied, and only its answer was lost), and why that is safe:
//!
//! | Call | Sent again | Why it is safe |
//! |---|---|---|
//! | reads: listings, lookups, status, health, metrics | yes | they change nothing |
//! | [`Client::push`] | yes | items carry transaction ids (generated when not given, before the first attempt): a push that was stored answers `duplicate` with the stored message's id, and nothing is stored twice |
//! | [`Client::pop`] | yes, but an auto-acked one | a pop whose answer was lost leased its messages to nobody: the lease expires and they are delivered again (the expiry counts as a failed delivery toward `retryLimit`) |
//! | [`Client::ack`], [`Client::ack_batch`] | yes, but one holding a `failed` that names no lease | an acknowledgement is a cursor commit: a repeated `completed` is a no-op (`noop: true`); a repeated `failed`/`retry`/`dlq` with its lease is refused (the lease was released), so its verdict may read refused though the first attempt applied |
//! | [`Client::extend_lease`], configure, subscription, maintenance switches | yes | doing them twice leaves the same state |
//! | [`Client::commit`] (transactions), [`Client::retry_dead_letter`], [`Client::delete_dead_letters`], seeks, group and queue deletion, an auto-acked pop, acks holding a `failed` without a lease | only when the first attempt certainly did nothing (the connection could not be made, or the broker answered `overloaded`) | a repeat of one that applied would be refused (rolled back, 404) or act again: a seek to the end skips what came meanwhile and releases leases taken meanwhile, a deletion answers "not found" or deletes a queue pushed again meanwhile, an auto-acked pop takes the next messages while the first ones are gone, a `failed` counts twice |
//!
//! # TLS
//!
//! `https://` brokers are verified against the platform's root certificates and any CA given
//! with [`ClientBuilder::ca_certificate_pem`]. The client brings its own rustls configuration
//! (ring provider): it does not need, nor install, a process-wide crypto provider.
//!
//! # Answers
//!
//! The answers of the protocol's calls are typed exactly, with `#[non_exhaustive]` structs.
//! The dashboards' reads ([`Client::overview`], [`Client::status`], [`Client::brokers`],
//! [`Client::history`], [`Client::analytics`], ...) are typed with the fields the broker serves
//! today plus an `extra` map that keeps what this client does not know. Payloads stay JSON text
//! ([`serde_json::value::RawValue`]) until asked for with [`Message::json`], and can be pushed as
//! JSON text ([`PushItem::raw`], [`PushItem::from_json`]) without being encoded again.
//!
//! Every answer also implements `Serialize`, as camelCase JSON like the broker's own answers
//! (the `extra` members included), so that it can be logged, stored or passed on and read back
//! as the same answer. Where the wire differs (a push's outcomes come in snake_case), the
//! answer is written in camelCase and read in either form.

#![warn(missing_docs)]

mod ack;
mod admin;
mod binary_push;
mod client;
mod consume;
mod dlq;
mod error;
mod framed_pop;
mod groups;
mod lease;
mod pop;
mod push;
mod tls;
mod transaction;
mod transport;

pub use ack::{Ack, AckResult, AckStatus, AckVerdict};
pub use admin::{
    Analytics, BrokerState, BrokerStatus, BrokerTraffic, Configured, Fleet, FleetBroker, Health, History, HistoryPoint,
    ListQuery, MaintenanceStatus, MaintenanceSummary, MaintenanceSwitches, MessageCounts, MessageListing, MetricFamily,
    MetricSample, Metrics, Overview, PartitionPage, PartitionSummary, QueueConfig, QueueDeleted, QueueGroupLag,
    QueueInfo, QueueOptions, QueuePage, QueueStatus, QueueStatusDetail, QueueStatusPage, QueueSummary, StoredMessage,
};
pub use client::{Client, ClientBuilder, RetryPolicy};
pub use consume::{ConsumeStats, Consumer, ConsumerHandle};
pub use dlq::{DeadLetter, DeadLetterPage, DeadLetterQuery, GroupProgress, MessageStatus, Requeued};
pub use error::{Error, ErrorBody};
pub use groups::{
    GroupDeleted, GroupDetail, GroupQueueLag, GroupSummary, LaggingCursor, PartitionLag, SeekTarget, Seeked,
    SeekedPartition, SubscriptionUpdated,
};
pub use lease::{LeaseExtension, LeaseGuard, RenewalState};
pub use pop::{Autopilot, Delivery, Message, Pop, QUEUE_MODE_GROUP, SubscriptionFrom, SubscriptionMode};
pub use push::{DEFAULT_PARTITION, PushItem, PushOutcome, PushStatus};
pub use transaction::{Committed, Transaction, TransactionResult};

// The README's examples compile too.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

/// Re-exported: the types of this crate's API come from these.
pub use chrono;
pub use reqwest::StatusCode;
pub use serde_json;
pub use uuid;

#[cfg(test)]
mod tests {
    /// The repository's README shows `examples/quickstart.rs` (which the build compiles) as it is.
    #[test]
    fn the_repository_readme_shows_the_quickstart_example() {
        let readme = include_str!("../../../README.md");
        let example = include_str!("../examples/quickstart.rs");
        assert!(
            readme.contains(&format!("```rust\n{example}```")),
            "README.md's Rust example is not examples/quickstart.rs: copy the file into it"
        );
    }
}
