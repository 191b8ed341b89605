//! `queenctl`, the operators' command line of the Queen broker. Everything it does goes
//! through `queen_client`; this file parses, runs, and turns failures into exit codes.

mod cli;
mod commands;
mod context;
mod error;
mod output;
mod time;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        // `--help` and `--version`, on stdout.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        // Usage errors: clap's own text, under the prefix of every other error; exit 2.
        Err(e) => {
            eprint!("queenctl: {}", e.render());
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return error::Failure::failed(format!("cannot start the runtime: {e}")).report(),
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}
