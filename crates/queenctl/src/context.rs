//! What every command shares: the client built from the global flags, the output format, and
//! the confirmation of destructive commands.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use queen_client::Client;

use crate::error::{Failure, Result};
use crate::output::Format;

/// The flags every command takes (before or after the subcommand).
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub struct Global {
    /// The broker's URL; several, comma-separated, for failover across a fleet
    #[arg(long, env = "QUEEN_URL", default_value = "http://localhost:6632", global = true)]
    pub url: String,

    /// Bearer token (a JWT or a static API token) sent with every request
    #[arg(long, env = "QUEEN_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,

    /// Output: aligned columns for people, or JSON for scripts
    #[arg(long, short, value_enum, default_value_t = Format::Table, global = true)]
    pub output: Format,

    /// A PEM file of CA certificates to trust for https:// brokers, besides the system's
    #[arg(long, value_name = "FILE", global = true)]
    pub ca_cert: Option<PathBuf>,

    /// How long one request may take, in seconds (long polls wait their own time on top)
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..), global = true)]
    pub timeout: u64,
}

/// The client and the output format.
pub struct Ctx {
    pub client: Client,
    pub format: Format,
}

impl Ctx {
    pub fn new(global: &Global) -> Result<Ctx> {
        let urls: Vec<&str> = global.url.split(',').map(str::trim).filter(|url| !url.is_empty()).collect();
        if urls.is_empty() {
            return Err(Failure::usage("--url names no broker"));
        }
        let mut builder = Client::builder().urls(urls).timeout(Duration::from_secs(global.timeout));
        if let Some(token) = global.token.as_deref().filter(|token| !token.is_empty()) {
            builder = builder.token(token);
        }
        if let Some(path) = &global.ca_cert {
            let pem = std::fs::read(path)
                .map_err(|e| Failure::usage(format!("cannot read the CA certificate {}: {e}", path.display())))?;
            builder = builder.ca_certificate_pem(pem);
        }
        Ok(Ctx { client: builder.build()?, format: global.output })
    }

    pub fn json(&self) -> bool {
        self.format == Format::Json
    }
}

/// Asks before a destructive command: on a terminal, a `y` on stdin; elsewhere `--yes` must
/// have been given, since nobody is there to answer.
pub fn confirm(yes: bool, question: &str) -> Result {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::usage(format!(
            "refusing to {question} without confirmation: stdin is not a terminal, so pass --yes"
        )));
    }
    eprint!("{}? [y/N] ", capitalized(question));
    std::io::stderr().flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(Failure::usage("not confirmed; nothing was done")),
    }
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map(|first| first.to_uppercase().chain(chars).collect()).unwrap_or_default()
}
