//! End-to-end tests: real `queen` processes, as an operator runs them.

mod fleet;
mod maintenance;
mod process;
mod support;
