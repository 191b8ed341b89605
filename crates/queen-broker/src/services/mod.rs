//! Background services of a broker.

pub mod listener;
pub mod maintenance;
pub mod timers;
