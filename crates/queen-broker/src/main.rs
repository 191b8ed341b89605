use std::process::ExitCode;

use clap::Parser;
use queen_broker::cli::{Cli, Command};
use queen_broker::config::Config;
use queen_broker::database::Database;
use queen_broker::startup::{Application, migrate_with_retries};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::load(cli.config.as_deref(), cli.overrides()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("queen: {e}");
            return ExitCode::from(2);
        }
    };
    queen_broker::telemetry::init(&config.log);
    let result = actix_web::rt::System::new().block_on(async move {
        match cli.command.unwrap_or(Command::Serve) {
            Command::Serve => Application::build(config).await?.run_until_stopped().await.map_err(Into::into),
            Command::Migrate => migrate(config).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("queen: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn migrate(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    let database = Database::open(&config).await?;
    let pool = queen_store::pool::build_pool(database.target.clone(), &config.database.pool_settings())?;
    let result = migrate_with_retries(&pool).await;
    database.close().await;
    Ok(result?)
}
