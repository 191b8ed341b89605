//! End-to-end tests: real `queen` processes, as an operator runs them.

mod process;
mod support;
