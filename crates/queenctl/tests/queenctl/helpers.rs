//! A broker per test, in-process on a database of its own, and the real `queenctl` binary run
//! against it.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use queen_broker::config::Config;
use queen_testkit::{TestDatabase, target_dir};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// How long a condition may take to come true, or a command to end, before a test fails.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A broker running on this test's thread, on a fresh database.
pub struct TestBroker {
    pub url: String,
    pub _db: TestDatabase,
}

fn test_label() -> String {
    std::thread::current().name().unwrap_or("queenctl").rsplit("::").next().unwrap_or("queenctl").to_owned()
}

impl TestBroker {
    pub async fn start() -> TestBroker {
        Self::start_with(|_| {}).await
    }

    /// A broker whose configuration `tweak` adjusts first.
    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> TestBroker {
        let db = TestDatabase::create(&format!("ctl_{}", test_label())).await;
        let url = queen_testkit::in_process::serve(&db, tweak).await;
        TestBroker { url, _db: db }
    }

    /// A broker with authentication on, taking these static tokens: `(name, token, role)`.
    pub async fn with_tokens(tokens: &[(&str, &str, &str)]) -> TestBroker {
        let entries: String = tokens
            .iter()
            .map(|(name, token, role)| {
                format!("[[token]]\nname = \"{name}\"\ntoken = \"{token}\"\nrole = \"{role}\"\n")
            })
            .collect();
        let file = temp_file("tokens.toml", &entries);
        Self::start_with(move |config| config.auth.tokens_file = Some(file.into())).await
    }

    /// Runs `queenctl --url <this broker> args...`.
    pub async fn run(&self, args: &[&str]) -> Run {
        run(&with_url(&self.url, args), &[], None).await
    }

    /// Runs `queenctl --url <this broker> args... --output json` and insists it succeeded; its
    /// JSON document.
    pub async fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["--output", "json"]);
        self.run(&args).await.success().json()
    }
}

pub fn with_url<'a>(url: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["--url", url];
    all.extend_from_slice(args);
    all
}

/// What a run of `queenctl` showed.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Insists on exit 0; the run.
    #[track_caller]
    pub fn success(self) -> Run {
        assert_eq!(self.code, 0, "queenctl failed: {self:#?}");
        self
    }

    /// Insists on `code`, with one `queenctl: error:` line on stderr containing `needle`.
    #[track_caller]
    pub fn fails(&self, code: i32, needle: &str) {
        assert_eq!(self.code, code, "{self:#?}");
        assert!(self.stderr.contains(needle), "stderr lacks {needle:?}: {self:#?}");
        assert!(!self.stderr.contains("panicked"), "{self:#?}");
    }

    /// Insists on a usage error (exit 2) whose message contains `needle`, before any request.
    #[track_caller]
    pub fn usage_error(&self, needle: &str) {
        self.fails(2, needle);
        assert!(self.stdout.is_empty(), "{self:#?}");
    }

    /// Stdout as one JSON document.
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:#?}"))
    }

    /// Stdout's lines.
    pub fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }

    /// The cells of the table row whose first cell is `first`.
    #[track_caller]
    pub fn row(&self, first: &str) -> Vec<&str> {
        self.stdout
            .lines()
            .map(|line| line.split("  ").map(str::trim).filter(|cell| !cell.is_empty()).collect::<Vec<_>>())
            .find(|cells| cells.first() == Some(&first))
            .unwrap_or_else(|| panic!("no row starts with {first:?}: {self:#?}"))
    }

    /// The value of a `key: value` line.
    #[track_caller]
    pub fn field(&self, key: &str) -> &str {
        self.stdout
            .lines()
            .find_map(|line| line.strip_prefix(key).and_then(|rest| rest.strip_prefix(':')).map(str::trim))
            .unwrap_or_else(|| panic!("no {key:?} line: {self:#?}"))
    }
}

/// The `queenctl` binary, with nothing of the environment that would steer it.
pub fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_queenctl"));
    command.args(args).env_remove("QUEEN_URL").env_remove("QUEEN_TOKEN").envs(env.iter().copied());
    command.kill_on_drop(true);
    command
}

/// Runs `queenctl args...` to its end (at most [`DEADLINE`]), `stdin` given as its input, or
/// none (not a terminal either way).
pub async fn run(args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>) -> Run {
    let mut command = command(args, env);
    command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().expect("queenctl starts");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("a stdin pipe");
        pipe.write_all(input).await.expect("the input is written");
        drop(pipe);
    }
    let output = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("queenctl {args:?} did not end within {DEADLINE:?}"))
        .expect("queenctl's output");
    Run {
        code: output.status.code().expect("an exit code, not a signal"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

/// A `queenctl` left running (`tail`), its output gathered as it comes.
pub struct Background {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

fn gather(pipe: impl AsyncRead + Unpin + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&text);
    tokio::spawn(async move {
        let mut lines = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut sink = sink.lock().unwrap();
            sink.push_str(&line);
            sink.push('\n');
        }
    });
    text
}

impl Background {
    pub fn start(url: &str, args: &[&str]) -> Background {
        let mut command = command(&with_url(url, args), &[]);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("queenctl starts");
        let stdout = gather(child.stdout.take().expect("a stdout pipe"));
        let stderr = gather(child.stderr.take().expect("a stderr pipe"));
        Background { child, stdout, stderr }
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until stderr holds `needle`.
    pub async fn wait_for_stderr(&self, needle: &str) {
        let deadline = Instant::now() + DEADLINE;
        while !self.stderr().contains(needle) {
            assert!(Instant::now() < deadline, "stderr never showed {needle:?}: {:?}", self.stderr());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until stdout has `count` lines.
    pub async fn wait_for_lines(&self, count: usize) {
        let deadline = Instant::now() + DEADLINE;
        while self.stdout().lines().count() < count {
            assert!(Instant::now() < deadline, "stdout never had {count} lines: {:?}", self.stdout());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends SIGINT, as Ctrl-C does.
    pub fn interrupt(&self) {
        self.signal(nix::sys::signal::Signal::SIGINT);
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = self.child.id().expect("still running") as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).expect("a signal sent");
    }

    /// Waits for the end (at most [`DEADLINE`]); what it showed.
    pub async fn finish(mut self) -> Run {
        let status = tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("queenctl did not end within {DEADLINE:?}; stderr: {}", self.stderr()))
            .expect("queenctl's status");
        // The pipes close with the process; let the readers take the last lines.
        let closed = Instant::now() + Duration::from_millis(500);
        while Instant::now() < closed && Arc::strong_count(&self.stdout) + Arc::strong_count(&self.stderr) > 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Run { code: status.code().expect("an exit code, not a signal"), stdout: self.stdout(), stderr: self.stderr() }
    }
}

/// Waits until `check` holds, polling; fails the test after [`DEADLINE`].
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + DEADLINE;
    while !check().await {
        assert!(Instant::now() < deadline, "gave up waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A URL nothing listens on: connections to it are refused.
pub async fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("an address"));
    drop(listener);
    url
}

/// A file under the target directory with `text` in it; its path.
pub fn temp_file(name: &str, text: &str) -> String {
    let dir = target_dir().join("queenctl-tests");
    std::fs::create_dir_all(&dir).expect("a directory");
    let path = dir.join(format!("{}-{name}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, text).expect("the file is written");
    path.to_str().expect("a UTF-8 path").to_owned()
}
