use std::process::ExitCode;

use clap::Parser;
use queen_broker::cli::{Cli, Command};
use queen_broker::config::Config;
use queen_broker::database::Database;
use queen_broker::startup::{Application, migrate_with_retries};

/// mimalloc rather than glibc's malloc: the broker's CPU per message is 2–11 % lower with it in
/// every loaded scenario of `queen-bench` (docs/architecture.md, *Crates*).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let huge_pages_refused = refuse_transparent_huge_pages();
    let cli = Cli::parse();
    let config = match Config::load(cli.config.as_deref(), cli.overrides()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("queen: {e}");
            return ExitCode::from(2);
        }
    };
    queen_broker::telemetry::init(&config.log);
    let unread =
        queen_broker::config::unread_upstream_variables(std::env::vars_os().filter_map(|(n, _)| n.into_string().ok()));
    let unused = config.database.unused_beside_url();
    if !unused.is_empty() {
        tracing::warn!(
            settings = %unused.join(", "),
            "database.url (DATABASE_URL) is set and names the server whole: these settings are not used"
        );
    }
    if !unread.is_empty() {
        tracing::warn!(
            variables = %unread.join(", "),
            "upstream Queen settings this broker does not read (it has no such mechanism): they change nothing"
        );
    }
    if let Err(e) = huge_pages_refused {
        tracing::warn!(error = %e, "transparent huge pages could not be refused; resident memory may be higher");
    }
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
    database.close_if_started_here().await;
    Ok(result?)
}

/// A transparent huge page is 2 MiB made resident as soon as one byte of it is touched; backing
/// the allocator's arena, they took the broker's peak resident memory from 37 to 51 MiB under
/// `push-b100`. mimalloc is built not to ask for them (`no_thp`); this also refuses the ones a
/// machine whose THP setting is `always` hands out unasked. First thing in `main`, before the
/// arena is touched more than by the runtime's start. Child processes inherit the setting: an
/// embedded PostgreSQL started by the broker runs without transparent huge pages too (its shared
/// memory's `huge_pages` are explicit ones, which this does not touch).
fn refuse_transparent_huge_pages() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    return nix::sys::prctl::set_thp_disable(true).map_err(|e| e.to_string());
    #[cfg(not(target_os = "linux"))]
    Ok(())
}
