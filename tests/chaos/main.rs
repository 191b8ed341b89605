//! Fault injection: real `queen` processes while PostgreSQL fails over, restarts, loses backends,
//! stalls or turns read-only, and while clients misbehave. Every test that moves messages checks
//! them with a per-message ledger (`ledger.rs`), or with a map of their own (`binary_formats.rs`,
//! whose client is queen-client rather than raw HTTP).

mod binary_formats;
mod cluster;
mod failover;
mod ledger;
mod load;
mod lost_listen;
mod read_only;
mod restarts;
mod slow_clients;
mod stalled;
mod support;
