//! Overload bounds: how much of each kind of work the broker holds at once.
//!
//! Under overload the broker refuses work rather than queue it: a request takes its place in a
//! [`Bound`] before anything of it is done, and one that does not fit is answered at once, having
//! written nothing, with `Retry-After`. A bound of the whole broker answers 503 (another broker of
//! the fleet may have room, and the official client tries the next one); a bound of one partition,
//! one consumer group or one client address answers 429 (the excess is that partition's
//! producers', that group's consumers' or that client's, and the client retries in place without
//! giving up on the broker). Every refusal is counted in `queen_overload_refusals_total{bound}`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use prometheus::IntCounter;

use crate::metrics::Metrics;

/// What a bound limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limited {
    /// Bytes of request bodies held across the broker (`limits.body_bytes_in_flight`).
    BodyBytes,
    /// Long polls parked across the broker (`limits.parked_long_polls`).
    LongPolls,
    /// Long polls one client address has parked on the broker (`limits.long_polls_per_client`).
    ClientLongPolls,
    /// Messages waiting for the coordinator (`limits.coordinator_messages`).
    Coordinator,
    /// Push requests waiting for the push journal.
    Journal,
    /// Push requests one partition writer holds, queued or being written (`push.writer_mailbox`).
    PartitionWriter,
    /// Ack calls one consumer group's actor holds, queued or being committed
    /// (`limits.group_ack_calls`).
    GroupLeases,
}

impl Limited {
    /// The `bound` label of refusals.
    pub fn label(self) -> &'static str {
        match self {
            Limited::BodyBytes => "body_bytes",
            Limited::LongPolls => "long_polls",
            Limited::ClientLongPolls => "client_long_polls",
            Limited::Coordinator => "coordinator",
            Limited::Journal => "push_journal",
            Limited::PartitionWriter => "partition_writer",
            Limited::GroupLeases => "group_leases",
        }
    }

    /// Whether the bound is the whole broker's rather than one partition's, one group's or one
    /// client's.
    pub fn is_broker_wide(self) -> bool {
        !matches!(self, Limited::PartitionWriter | Limited::GroupLeases | Limited::ClientLongPolls)
    }

    fn what(self) -> &'static str {
        match self {
            Limited::BodyBytes => "bytes of request bodies are held by the broker",
            Limited::LongPolls => "long polls are parked on the broker",
            Limited::ClientLongPolls => "long polls are parked on the broker from this client address",
            Limited::Coordinator => "messages wait for the broker's coordinator",
            Limited::Journal => "pushes wait for the push journal",
            Limited::PartitionWriter => "pushes wait for this partition",
            Limited::GroupLeases => "ack calls wait for this consumer group",
        }
    }
}

/// Work refused because a bound was reached; nothing of it was done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
// The text names a connection: the official clients' consume loop polls again on an error that
// says "connection", and stops on any other, so a full broker would end its consumers.
#[error("overloaded: {limit} {}, the most allowed; retry later, on a new connection to this broker or another", limited.what())]
pub struct Refused {
    pub limited: Limited,
    pub limit: usize,
}

/// A limit on how much of one kind of work is held at once.
#[derive(Debug)]
pub struct Bound {
    limited: Limited,
    limit: usize,
    held: AtomicUsize,
    refusals: IntCounter,
}

impl Bound {
    pub fn new(limited: Limited, limit: usize, metrics: &Metrics) -> Arc<Self> {
        let refusals = metrics.overload_refusals.with_label_values(&[limited.label()]);
        Arc::new(Self { limited, limit, held: AtomicUsize::new(0), refusals })
    }

    /// Another bound like this one, holding nothing (one per actor of a kind).
    pub fn sibling(&self) -> Arc<Self> {
        let Bound { limited, limit, refusals, .. } = self;
        Arc::new(Self { limited: *limited, limit: *limit, held: AtomicUsize::new(0), refusals: refusals.clone() })
    }

    /// Holds `amount` more until the returned [`Held`] is dropped; refused (and counted) when
    /// that would pass the limit.
    pub fn hold(self: &Arc<Self>, amount: usize) -> Result<Held, Refused> {
        self.take(amount)?;
        Ok(Held { bound: Arc::clone(self), amount })
    }

    /// Holds `amount` more if it fits, for work the caller may leave undone (not a refusal).
    pub fn try_hold(self: &Arc<Self>, amount: usize) -> Option<Held> {
        self.fit(amount).then(|| Held { bound: Arc::clone(self), amount })
    }

    /// How much is held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    fn take(&self, amount: usize) -> Result<(), Refused> {
        if self.fit(amount) {
            return Ok(());
        }
        self.refusals.inc();
        Err(Refused { limited: self.limited, limit: self.limit })
    }

    /// Adds `amount` to what is held if the total stays within the limit.
    fn fit(&self, amount: usize) -> bool {
        let fits = |held: usize| held.checked_add(amount).filter(|&total| total <= self.limit);
        self.held.fetch_update(Ordering::SeqCst, Ordering::SeqCst, fits).is_ok()
    }
}

/// A share of a [`Bound`], given back when dropped.
#[derive(Debug)]
pub struct Held {
    bound: Arc<Bound>,
    amount: usize,
}

impl Held {
    /// Holds `amount` more of the same bound.
    pub fn grow(&mut self, amount: usize) -> Result<(), Refused> {
        self.bound.take(amount)?;
        self.amount += amount;
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.bound.held.fetch_sub(self.amount, Ordering::SeqCst);
    }
}

/// A limit on how much of one kind of work each client address holds at once. A client has an
/// entry only while it holds something, so the map is as large as the clients holding work.
#[derive(Debug)]
pub struct PerClient {
    limited: Limited,
    /// 0 = no limit (nothing is counted).
    limit: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
    refusals: IntCounter,
}

impl PerClient {
    pub fn new(limited: Limited, limit: usize, metrics: &Metrics) -> Arc<Self> {
        let refusals = metrics.overload_refusals.with_label_values(&[limited.label()]);
        Arc::new(Self { limited, limit, held: Mutex::new(HashMap::new()), refusals })
    }

    /// Holds one more for `client` until the returned [`ClientHeld`] is dropped; refused (and
    /// counted) when the client holds the limit already. Without a client address or a limit,
    /// nothing is counted.
    pub fn hold(self: &Arc<Self>, client: Option<IpAddr>) -> Result<ClientHeld, Refused> {
        let Some(client) = client.filter(|_| self.limit > 0) else { return Ok(ClientHeld(None)) };
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let count = held.entry(client).or_insert(0);
        if *count >= self.limit {
            // The entry was there already: a new one starts at 0, below any limit.
            drop(held);
            self.refusals.inc();
            return Err(Refused { limited: self.limited, limit: self.limit });
        }
        *count += 1;
        Ok(ClientHeld(Some((Arc::clone(self), client))))
    }
}

/// One client's share of a [`PerClient`] bound, given back when dropped (its entry removed when
/// the client holds nothing more).
#[derive(Debug)]
pub struct ClientHeld(Option<(Arc<PerClient>, IpAddr)>);

impl Drop for ClientHeld {
    fn drop(&mut self) {
        let Some((bound, client)) = self.0.take() else { return };
        let mut held = bound.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = held.get_mut(&client) {
            *count -= 1;
            if *count == 0 {
                held.remove(&client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl PerClient {
        /// How much `client` holds now.
        fn held_by(&self, client: IpAddr) -> usize {
            self.held.lock().unwrap().get(&client).copied().unwrap_or(0)
        }

        /// How many clients hold something now.
        fn clients(&self) -> usize {
            self.held.lock().unwrap().len()
        }
    }

    #[test]
    fn a_client_bound_counts_each_address_apart_and_forgets_an_address_holding_nothing() {
        let metrics = Metrics::new(10);
        let bound = PerClient::new(Limited::ClientLongPolls, 2, &metrics);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = bound.hold(Some(a)).expect("fits");
        let second = bound.hold(Some(a)).expect("exactly the limit");
        assert_eq!(bound.hold(Some(a)).unwrap_err(), Refused { limited: Limited::ClientLongPolls, limit: 2 });
        let other = bound.hold(Some(b)).expect("another address has room of its own");
        assert_eq!((bound.held_by(a), bound.held_by(b), bound.clients()), (2, 1, 2));
        drop(first);
        let third = bound.hold(Some(a)).expect("a place given back is taken again");
        drop((second, third, other));
        assert_eq!(bound.clients(), 0, "addresses that hold nothing are removed");
        assert_eq!(metrics.overload_refusals.with_label_values(&["client_long_polls"]).get(), 1);
        let _unknown = bound.hold(None).expect("without an address nothing is counted");
        let unlimited = PerClient::new(Limited::ClientLongPolls, 0, &metrics);
        let held: Vec<_> = (0..100).map(|_| unlimited.hold(Some(a)).expect("no limit")).collect();
        assert_eq!((held.len(), unlimited.clients(), bound.clients()), (100, 0, 0));
    }

    #[test]
    fn a_bound_refuses_past_its_limit_and_takes_more_once_holds_are_dropped() {
        let metrics = Metrics::new(10);
        let bound = Bound::new(Limited::BodyBytes, 10, &metrics);
        let mut first = bound.hold(4).expect("fits");
        first.grow(4).expect("still fits");
        assert_eq!(bound.hold(3).unwrap_err(), Refused { limited: Limited::BodyBytes, limit: 10 });
        assert!(first.grow(3).is_err(), "growing counts against the same limit");
        let second = bound.hold(2).expect("exactly the limit");
        assert_eq!(bound.held(), 10);
        drop(first);
        assert_eq!(bound.held(), 2);
        bound.hold(8).expect("room again");
        assert!(bound.try_hold(9).is_none(), "too much");
        assert!(bound.try_hold(8).is_some(), "room");
        drop(second);
        assert_eq!(metrics.overload_refusals.with_label_values(&["body_bytes"]).get(), 2, "try_hold refuses nothing");
    }

    #[test]
    fn siblings_count_apart_and_refusals_together() {
        let metrics = Metrics::new(10);
        let first = Bound::new(Limited::PartitionWriter, 1, &metrics);
        let second = first.sibling();
        let _a = first.hold(1).expect("fits");
        let _b = second.hold(1).expect("a sibling has a limit of its own");
        assert!(first.hold(1).is_err() && second.hold(1).is_err());
        assert_eq!(metrics.overload_refusals.with_label_values(&["partition_writer"]).get(), 2);
    }
}
