//! The client against real brokers: each test starts a broker in-process on a database of its own
//! and speaks to it through `queen_client` only (`connections` alone uses a stand-in far end, for
//! what a broker does not do).

mod acks;
mod admin;
mod connections;
mod consume;
mod failover;
mod groups;
mod helpers;
mod leases;
mod push_pop;
mod tls;
mod transactions;
