//! Structured logs through `tracing`.

use tracing_subscriber::EnvFilter;

use crate::config::LogConfig;

/// Installs the global subscriber. The filter was validated with the configuration.
pub fn init(config: &LogConfig) {
    let filter = config.filter().unwrap_or_else(|_| EnvFilter::new("info"));
    let colours = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colours);
    let _ = if config.format == "json" { builder.json().try_init() } else { builder.try_init() };
}
