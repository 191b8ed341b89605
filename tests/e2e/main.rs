//! End-to-end tests: real `queen` processes, as an operator runs them.

mod client;
mod fleet;
mod kv_fleet;
mod maintenance;
mod overload;
mod process;
mod support;
mod timers_fleet;
