//! API tests: each starts a broker in-process on its own database and speaks HTTP to it.

mod bad_input;
mod capacity;
mod concurrency;
mod encryption;
mod expiry;
mod failures;
mod fanout;
mod fleet;
mod fusion;
mod group_admin;
mod groups;
mod helpers;
mod leases;
mod long_poll;
mod maintenance_mode;
mod messages;
mod namespaces;
mod operations;
mod overload;
mod queue_options;
mod retention;
mod seek;
mod storage;
mod subscription;
mod transactions;
mod visibility;
