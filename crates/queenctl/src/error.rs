//! What a command can fail with, and the exit code each failure means to a script.

use std::process::ExitCode;

use queen_client::{Error, StatusCode};

/// The exit codes, as documented in `queenctl --help` and the crate's README.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The broker refused or failed the operation.
    Failed = 1,
    /// Bad arguments or usage (clap's own errors exit 2 as well).
    Usage = 2,
    /// No broker could be reached.
    Unreachable = 3,
    /// The queue, group, message or dead letter does not exist.
    NotFound = 4,
}

/// A failed command: its exit code and the one line said about it on stderr.
#[derive(Debug)]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
    /// Stdout was closed under us (`queenctl ... | head`): end quietly, as other tools do.
    pub quiet: bool,
}

impl Failure {
    pub fn new(exit: Exit, message: impl Into<String>) -> Failure {
        Failure { exit, message: message.into(), quiet: false }
    }

    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::new(Exit::Usage, message)
    }

    pub fn failed(message: impl Into<String>) -> Failure {
        Failure::new(Exit::Failed, message)
    }

    pub fn not_found(message: impl Into<String>) -> Failure {
        Failure::new(Exit::NotFound, message)
    }

    /// Prints the failure's line on stderr; the process's exit code.
    pub fn report(&self) -> ExitCode {
        if self.quiet {
            return ExitCode::SUCCESS;
        }
        eprintln!("queenctl: error: {}", self.message);
        ExitCode::from(self.exit as u8)
    }
}

impl From<std::io::Error> for Failure {
    fn from(error: std::io::Error) -> Failure {
        let quiet = error.kind() == std::io::ErrorKind::BrokenPipe;
        Failure { exit: Exit::Failed, message: format!("cannot write the output: {error}"), quiet }
    }
}

/// The innermost cause of an error: for a transport error, what the socket said ("Connection
/// refused (os error 111)") rather than reqwest's "error sending request".
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// ` (code: ..., request id: ...)`, or nothing when the answer carried neither.
fn code_and_request_id(code: Option<&str>, request_id: Option<&str>) -> String {
    let parts: Vec<String> = [code.map(|c| format!("code: {c}")), request_id.map(|r| format!("request id: {r}"))]
        .into_iter()
        .flatten()
        .collect();
    if parts.is_empty() { String::new() } else { format!(" ({})", parts.join(", ")) }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        let ids = code_and_request_id(error.code(), error.request_id());
        match &error {
            Error::Transport { url, source, tried, .. } => {
                let what = if error.is_timeout() { "no answer in time".to_owned() } else { root_cause(source) };
                // After failover the last URL's cause is shown, and every other URL tried named.
                let also = if tried.is_empty() { String::new() } else { format!("; also tried {}", tried.join(", ")) };
                Failure::new(Exit::Unreachable, format!("cannot reach the broker ({url}): {what}{also}"))
            }
            Error::Status { status, body, .. } => {
                let exit = if *status == StatusCode::NOT_FOUND { Exit::NotFound } else { Exit::Failed };
                let hint = match *status {
                    StatusCode::UNAUTHORIZED => {
                        "; the broker needs a valid token: give one with --token or QUEEN_TOKEN"
                    }
                    StatusCode::FORBIDDEN => "; the token lacks the role or the queue scope this needs",
                    _ => "",
                };
                Failure::new(exit, format!("the broker answered {status}: {}{ids}{hint}", body.error))
            }
            Error::InvalidArgument(_) | Error::Config(_) => Failure::usage(error.to_string()),
            // Full queues, creation limits, rolled-back transactions, unreadable answers, and
            // whatever later versions of the client add: the operation did not succeed.
            _ => Failure::failed(format!("{error}{ids}")),
        }
    }
}

pub type Result<T = ()> = std::result::Result<T, Failure>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_request_ids_are_shown_when_there_are_some() {
        assert_eq!(code_and_request_id(None, None), "");
        assert_eq!(code_and_request_id(Some("not_found"), Some("r1")), " (code: not_found, request id: r1)");
        assert_eq!(code_and_request_id(None, Some("r1")), " (request id: r1)");
    }

    #[test]
    fn client_side_refusals_are_usage_errors() {
        let failure = Failure::from(Error::InvalidArgument("a pop's batch must be at least 1".into()));
        assert_eq!(failure.exit, Exit::Usage);
        assert_eq!(Failure::from(Error::Config("no broker URL given".into())).exit, Exit::Usage);
    }
}
