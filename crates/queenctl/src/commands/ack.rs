//! `queenctl ack`: acknowledge one message; a refusal is a failure.

use clap::{Args, ValueEnum};
use queen_client::{Ack, AckResult, AckStatus, AckVerdict, uuid::Uuid};

use crate::context::Ctx;
use crate::error::{Failure, Result};
use crate::output::{self, Table};

const AFTER_HELP: &str = "\
Examples:
  queenctl ack 7 order-1 --lease 0192f0c4-5d1e-7b3a-9c2f-1a2b3c4d5e6f
  queenctl ack 7 order-1 --lease 0192f0c4-... --group billing --status failed --error 'card declined'
  queenctl ack 7 order-1 --group billing --status dlq

PARTITION_ID, TRANSACTION_ID and LEASE_ID are what `queenctl pop` prints. `completed` moves the
group's cursor past the message (and what its lease delivered before it); `failed` has it
delivered again, counting toward the queue's retryLimit; `retry` has it delivered again without
counting; `dlq` dead-letters it now. A refused acknowledgement (an expired lease, a message
already committed) exits 1.";

/// What the acknowledgement says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Status {
    Completed,
    Failed,
    Retry,
    Dlq,
}

impl From<Status> for AckStatus {
    fn from(status: Status) -> AckStatus {
        match status {
            Status::Completed => AckStatus::Completed,
            Status::Failed => AckStatus::Failed,
            Status::Retry => AckStatus::Retry,
            Status::Dlq => AckStatus::Dlq,
        }
    }
}

#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct AckArgs {
    /// The message's partition id
    pub partition_id: String,

    /// The message's transaction id
    pub transaction_id: String,

    /// The lease it was delivered under [default: none, refused while another consumer holds
    /// the partition]
    #[arg(long, value_name = "LEASE_ID")]
    pub lease: Option<Uuid>,

    /// The consumer group it was delivered to [default: queue mode]
    #[arg(long, short)]
    pub group: Option<String>,

    /// The verdict
    #[arg(long, short, value_enum, default_value_t = Status::Completed)]
    pub status: Status,

    /// Why it failed (kept with a dead letter)
    #[arg(long, value_name = "TEXT")]
    pub error: Option<String>,
}

pub async fn run(ctx: &Ctx, args: AckArgs) -> Result {
    let mut ack = Ack::by_id(args.partition_id, args.transaction_id, args.status.into());
    if let Some(lease) = args.lease {
        ack = ack.with_lease(lease);
    }
    if let Some(group) = args.group {
        ack = ack.with_group(group);
    }
    if let Some(error) = args.error {
        ack = ack.with_error(error);
    }
    let result = ctx.client.ack(&ack).await?;
    if ctx.json() {
        output::json(&result)?;
    } else {
        let mut table = Table::new(&["PARTITION ID", "TRANSACTION ID", "GROUP", "STATUS", "VERDICT"]);
        table.row(vec![
            result.partition_id.clone(),
            result.transaction_id.clone(),
            result.consumer_group.clone(),
            output::word(&result.status),
            verdict(&result),
        ]);
        output::print(&table.render())?;
    }
    match result.verdict() {
        AckVerdict::Refused(reason) => Err(Failure::failed(format!("the acknowledgement was refused: {reason}"))),
        _ => Ok(()),
    }
}

/// The verdict in a few words: `applied`, `no-op (already committed)`, `refused: ...`, and what
/// it did beyond the cursor.
pub fn verdict(result: &AckResult) -> String {
    let mut words = match result.verdict() {
        AckVerdict::Applied => "applied".to_owned(),
        AckVerdict::Noop => "no-op (already committed)".to_owned(),
        AckVerdict::Refused(reason) => format!("refused: {reason}"),
    };
    for (done, what) in
        [(result.dlq, "dead-lettered"), (result.dropped, "dropped"), (result.lease_released, "lease released")]
    {
        if done {
            words.push_str(", ");
            words.push_str(what);
        }
    }
    words
}
