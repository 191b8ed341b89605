//! One module per command group: its arguments and what it does.

pub mod ack;
pub mod dlq;
pub mod groups;
pub mod maintenance;
pub mod pop;
pub mod push;
pub mod queues;
pub mod seek;
pub mod status;
pub mod tail;

use crate::cli::{Cli, Command};
use crate::context::Ctx;
use crate::error::Result;

pub async fn run(cli: Cli) -> Result {
    let ctx = Ctx::new(&cli.global)?;
    match cli.command {
        Command::Push(args) => push::run(&ctx, args).await,
        Command::Pop(args) => pop::run(&ctx, args).await,
        Command::Ack(args) => ack::run(&ctx, args).await,
        Command::Tail(args) => tail::run(&ctx, args).await,
        Command::Seek(args) => seek::run(&ctx, args).await,
        Command::Groups(command) => groups::run(&ctx, command).await,
        Command::Dlq(command) => dlq::run(&ctx, command).await,
        Command::Queues(command) => queues::run(&ctx, command).await,
        Command::Status => status::run(&ctx).await,
        Command::Maintenance(args) => maintenance::run(&ctx, args).await,
    }
}
