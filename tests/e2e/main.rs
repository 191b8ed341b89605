//! End-to-end tests: real `queen` processes, as an operator runs them.

mod fleet;
mod process;
mod support;
