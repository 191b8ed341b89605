//! The Queen broker.

pub mod actors;
pub mod auth;
pub mod backoff;
pub mod broker;
pub mod cli;
pub mod config;
pub mod connection;
pub mod database;
pub mod error;
pub mod http;
pub mod listener_tls;
pub mod metrics;
pub mod names;
pub mod pressure;
pub mod services;
pub mod startup;
pub mod telemetry;
