//! The `queen` command line.

use std::fmt::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use figment::Figment;
use figment::providers::Serialized;

use crate::config::ENV_ALIASES;

#[derive(Debug, Parser)]
#[command(name = "queen", version, about = "Queen: a partitioned message queue broker over PostgreSQL", after_help = env_help())]
pub struct Cli {
    /// A TOML configuration file (see config/queen.toml for every setting)
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on [http.host]
    #[arg(long, global = true)]
    pub host: Option<String>,
    /// Port to listen on [http.port]
    #[arg(long, global = true)]
    pub port: Option<u16>,
    /// PostgreSQL to use, as a URL; without one Queen runs an embedded PostgreSQL [database.url]
    #[arg(long, global = true, value_name = "URL")]
    pub database_url: Option<String>,
    /// Where the embedded PostgreSQL keeps its data [embedded.data_dir]
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Where this broker journals pushes accepted during push maintenance [buffer.dir]
    #[arg(long, global = true, value_name = "DIR")]
    pub buffer_dir: Option<PathBuf>,
    /// Log filter, e.g. info or debug [log.level]
    #[arg(long, global = true, value_name = "FILTER")]
    pub log_level: Option<String>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Run the broker (the default)
    Serve,
    /// Bring the database schema up to date, then exit
    Migrate,
}

impl Cli {
    /// The settings the flags set, as the last configuration layer.
    pub fn overrides(&self) -> Figment {
        let mut figment = Figment::new();
        if let Some(host) = &self.host {
            figment = figment.merge(Serialized::default("http.host", host));
        }
        if let Some(port) = self.port {
            figment = figment.merge(Serialized::default("http.port", port));
        }
        if let Some(url) = &self.database_url {
            figment = figment.merge(Serialized::default("database.url", url));
        }
        if let Some(dir) = &self.data_dir {
            figment = figment.merge(Serialized::default("embedded.data_dir", dir));
        }
        if let Some(dir) = &self.buffer_dir {
            figment = figment.merge(Serialized::default("buffer.dir", dir));
        }
        if let Some(level) = &self.log_level {
            figment = figment.merge(Serialized::default("log.level", level));
        }
        figment
    }
}

fn env_help() -> String {
    let mut help = String::from(
        "Environment: QUEEN_<SECTION>__<KEY> sets any setting (QUEEN_HTTP__PORT=7000 is http.port).\n\
         Upstream Queen's names are accepted too:\n",
    );
    for (name, setting) in ENV_ALIASES {
        let _ = writeln!(help, "  {name:<24} {setting}");
    }
    help.push_str("Precedence: defaults < --config file < upstream names < QUEEN_* < flags.");
    help
}
