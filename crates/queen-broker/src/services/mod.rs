//! Background services of a broker.

pub mod announcer;
pub mod listener;
pub mod maintenance;
pub mod timers;
