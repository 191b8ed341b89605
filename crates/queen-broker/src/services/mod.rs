//! Background services of a broker.

pub mod maintenance;
