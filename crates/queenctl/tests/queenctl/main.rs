//! `queenctl` against real brokers: each test starts a broker in-process on a database of its
//! own, runs the real binary, and checks what a user sees: stdout, stderr and the exit code.

mod dlq;
mod failures;
mod files;
mod groups;
mod helpers;
mod https;
mod push_pop;
mod queues;
mod status;
mod tail;
mod usage;
