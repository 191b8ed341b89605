//! PostgreSQL servers of a test's own, which it may stop hard, restart, promote or reconfigure:
//! one server, or a primary with a streaming-replication standby made with `pg_basebackup`.
//!
//! Each lives under `<target dir>/chaos-<random>/` and is stopped (immediately) and removed when
//! its value is dropped, so a failing test leaves no server running.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_store::embedded::{EmbeddedOptions, EmbeddedPostgres};
use queen_testkit::target_dir;
use tokio_postgres::{Client, NoTls};

/// The database the brokers of a chaos test use.
pub const DATABASE: &str = "queen_chaos";

/// Settings every chaos server runs with. Durability against a machine crash is not under test
/// (every fault here leaves the operating system up), so `fsync` is off for speed; what a commit
/// waits for is `synchronous_commit`, which stays on.
const SETTINGS: [(&str, &str); 5] = [
    ("fsync", "off"),
    ("synchronous_commit", "on"),
    ("max_connections", "200"),
    ("shared_buffers", "64MB"),
    ("wal_level", "replica"),
];

/// One PostgreSQL server.
pub struct Server {
    embedded: EmbeddedPostgres,
    settings: Vec<(String, String)>,
}

impl Server {
    /// Starts a new server in `dir` with `extra` settings besides [`SETTINGS`].
    async fn start_in(dir: &Path, port: Option<u16>, extra: &[(&str, String)]) -> Server {
        let settings: Vec<(String, String)> = SETTINGS
            .iter()
            .map(|&(name, value)| (name.to_owned(), value.to_owned()))
            .chain(extra.iter().map(|(name, value)| ((*name).to_owned(), value.clone())))
            .collect();
        let options = EmbeddedOptions { data_dir: dir.to_path_buf(), bin_dir: None, port, settings: settings.clone() };
        let embedded = EmbeddedPostgres::start(options)
            .await
            .unwrap_or_else(|e| panic!("cannot start PostgreSQL in {}: {e}", dir.display()));
        Server { embedded, settings }
    }

    pub fn port(&self) -> u16 {
        self.embedded.port()
    }

    /// The superuser's URL of `database`.
    pub fn url(&self, database: &str) -> String {
        self.embedded.url(database)
    }

    /// The superuser's password, which is in its URL.
    fn password(&self) -> String {
        let url = self.url("postgres");
        let credentials = &url["postgres://".len()..url.find('@').expect("a URL with credentials")];
        credentials.split_once(':').map(|(_, password)| password.to_owned()).unwrap_or_default()
    }

    /// A connection to `database` as the superuser.
    pub async fn connect(&self, database: &str) -> Client {
        connect(&self.url(database)).await.unwrap_or_else(|e| panic!("cannot connect to {database}: {e}"))
    }

    /// Stops the server as a crash would: no checkpoint, sessions cut (`pg_ctl stop -m immediate`).
    pub async fn kill(&self) {
        self.pg_ctl(&["stop", "-m", "immediate", "-w"]).await;
    }

    /// Stops the server cleanly (`-m fast`).
    pub async fn stop(&self) {
        self.embedded.stop().await.expect("PostgreSQL stops");
    }

    /// Starts the stopped server again, on its port, with its settings.
    pub async fn start_again(&mut self) {
        let options = EmbeddedOptions {
            data_dir: self.embedded.data_dir().to_path_buf(),
            bin_dir: Some(self.embedded.bin_dir().to_path_buf()),
            port: Some(self.port()),
            settings: self.settings.clone(),
        };
        self.embedded = EmbeddedPostgres::start(options).await.expect("PostgreSQL starts again");
    }

    /// Makes a standby the primary and waits until it takes writes.
    pub async fn promote(&self) {
        self.pg_ctl(&["promote", "-w"]).await;
    }

    /// Runs `pg_ctl <args> -D <data dir>` as the owner of the data directory.
    async fn pg_ctl(&self, args: &[&str]) {
        let data_dir = self.embedded.data_dir();
        let mut pg_ctl = as_owner_of(data_dir, self.embedded.bin_dir().join("pg_ctl"));
        pg_ctl.args(args).arg("-D").arg(data_dir);
        let output = pg_ctl.output().await.expect("pg_ctl runs");
        assert!(output.status.success(), "pg_ctl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }
}

/// `program`, to be run as the owner of `dir` (we may be root, which PostgreSQL refuses).
fn as_owner_of(dir: &Path, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
    let meta = std::fs::metadata(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut command = tokio::process::Command::new(program);
    command.current_dir(dir);
    if nix::unistd::geteuid().is_root() {
        command.uid(meta.uid()).gid(meta.gid());
    }
    command
}

pub async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// A directory under the target directory for one test's servers, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Scratch {
        let dir = target_dir().join(format!("chaos-{label}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }
}

/// Stops whatever server still runs in a scratch directory, and removes it.
fn stop_and_remove(scratch: &Path, servers: &[&Server]) {
    for server in servers {
        let data_dir = server.embedded.data_dir();
        if data_dir.join("postmaster.pid").exists() {
            let meta = std::fs::metadata(data_dir);
            let mut pg_ctl = std::process::Command::new(server.embedded.bin_dir().join("pg_ctl"));
            pg_ctl.args(["stop", "-m", "immediate", "-w", "-D"]).arg(data_dir);
            if let (true, Ok(meta)) = (nix::unistd::geteuid().is_root(), meta) {
                use std::os::unix::process::CommandExt;
                pg_ctl.uid(meta.uid()).gid(meta.gid());
            }
            let _ = pg_ctl.output();
        }
    }
    let _ = std::fs::remove_dir_all(scratch);
}

/// One server of a test's own, with [`DATABASE`] created.
pub struct Single {
    pub server: Server,
    scratch: Scratch,
}

impl Single {
    pub async fn start(label: &str, extra: &[(&str, String)]) -> Single {
        let scratch = Scratch::new(label);
        let server = Server::start_in(&scratch.0.join("pg"), None, extra).await;
        let admin = server.connect("postgres").await;
        admin.batch_execute(&format!("CREATE DATABASE {DATABASE}")).await.expect("the test database");
        Single { server, scratch }
    }

    pub fn url(&self) -> String {
        self.server.url(DATABASE)
    }
}

impl Drop for Single {
    fn drop(&mut self) {
        stop_and_remove(&self.scratch.0, &[&self.server]);
    }
}

/// How the primary waits for its standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// A commit returns once the standby has flushed it (`synchronous_standby_names`).
    Synchronous,
    /// A commit returns at once; the standby follows as it can.
    Asynchronous,
}

/// A primary and a standby streaming from it.
pub struct Pair {
    pub primary: Server,
    pub standby: Server,
    link: Link,
    scratch: Scratch,
}

/// The standby's `application_name`, which `synchronous_standby_names` names.
const STANDBY_NAME: &str = "standby";

impl Pair {
    /// Starts a primary, copies it with `pg_basebackup`, starts the copy as its standby, waits
    /// until it streams (synchronously if asked), and creates [`DATABASE`].
    pub async fn start(label: &str, replication: Replication) -> Pair {
        let scratch = Scratch::new(label);
        let names = match replication {
            Replication::Synchronous => STANDBY_NAME.to_owned(),
            Replication::Asynchronous => String::new(),
        };
        let primary = Server::start_in(
            &scratch.0.join("primary"),
            None,
            &[("max_wal_senders", "5".into()), ("synchronous_standby_names", names)],
        )
        .await;
        let standby_dir = scratch.0.join("standby");
        base_backup(&primary, &scratch.0.join("primary"), &standby_dir).await;
        let link = Link::to(primary.port()).await;
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres password={} application_name={STANDBY_NAME}",
            link.port,
            primary.password()
        );
        let standby =
            Server::start_in(&standby_dir, None, &[("primary_conninfo", conninfo), ("hot_standby", "on".into())]).await;
        let admin = primary.connect("postgres").await;
        let wanted = match replication {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let state: Option<String> = admin
                .query_opt("SELECT sync_state FROM pg_stat_replication WHERE application_name = $1", &[&STANDBY_NAME])
                .await
                .expect("pg_stat_replication")
                .map(|row| row.get(0));
            if state.as_deref() == Some(wanted) {
                break;
            }
            assert!(Instant::now() < deadline, "the standby is not streaming ({state:?})");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        admin.batch_execute(&format!("CREATE DATABASE {DATABASE}")).await.expect("the test database");
        Pair { primary, standby, link, scratch }
    }

    /// The URL brokers use: both servers, the one that takes writes chosen at each connection.
    pub fn url(&self) -> String {
        let primary = self.primary.url(DATABASE);
        let (credentials, _) = primary.split_once('@').expect("a URL with credentials");
        format!(
            "{credentials}@127.0.0.1:{},127.0.0.1:{}/{DATABASE}?target_session_attrs=read-write&connect_timeout=2",
            self.primary.port(),
            self.standby.port()
        )
    }
}

impl Pair {
    /// Waits until the standby has received everything the primary wrote so far, then holds
    /// back what the primary sends it from then on (as a slow network would), so that it falls
    /// behind. What was held back never reaches it: [`Pair::cut_replication`] drops it.
    pub async fn stall_standby(&self) {
        let primary = self.primary.connect("postgres").await;
        let standby = self.standby.connect("postgres").await;
        let written: String =
            primary.query_one("SELECT pg_current_wal_lsn()::text", &[]).await.expect("the primary's LSN").get(0);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let caught_up: bool = standby
                .query_one("SELECT pg_last_wal_receive_lsn() >= $1::text::pg_lsn", &[&written])
                .await
                .expect("the standby's LSN")
                .get(0);
            if caught_up {
                break;
            }
            assert!(Instant::now() < deadline, "the standby did not catch up");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.link.flowing.send_replace(false);
    }

    /// Lets a stalled standby catch up: the replication connections are closed (what they held
    /// back dropped) and the standby reconnects through the relay, flowing again, from where it
    /// stopped.
    pub fn resume_standby(&self) {
        self.link.flowing.send_replace(true);
        self.cut_replication();
    }

    /// Closes the replication connections, dropping whatever they held back.
    pub fn cut_replication(&self) {
        for task in self.link.connections.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            task.abort();
        }
    }
}

/// The standby's way to the primary: a TCP relay of the test's own, which can hold back what
/// the primary sends.
struct Link {
    port: u16,
    flowing: Arc<tokio::sync::watch::Sender<bool>>,
    connections: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Link {
    async fn to(primary_port: u16) -> Link {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a relay port");
        let port = listener.local_addr().expect("the relay's address").port();
        let flowing = Arc::new(tokio::sync::watch::Sender::new(true));
        let connections: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (held, flow) = (Arc::clone(&connections), Arc::clone(&flowing));
        let accepting = tokio::spawn(async move {
            while let Ok((standby, _)) = listener.accept().await {
                let flow = flow.subscribe();
                let relay = tokio::spawn(async move {
                    let Ok(primary) = tokio::net::TcpStream::connect(("127.0.0.1", primary_port)).await else { return };
                    let (mut from_primary, mut to_primary) = primary.into_split();
                    let (mut from_standby, mut to_standby) = standby.into_split();
                    let up = tokio::io::copy(&mut from_standby, &mut to_primary);
                    let down = relay_while_flowing(&mut from_primary, &mut to_standby, flow);
                    let _ = futures::join!(up, down);
                });
                held.lock().unwrap_or_else(|p| p.into_inner()).push(relay);
            }
        });
        Link { port, flowing, connections, accepting }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.accepting.abort();
        for task in self.connections.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            task.abort();
        }
    }
}

/// Copies `from` to `to` while `flow` says so; when it does not, stops reading, so that what is
/// sent stays in the sockets' buffers.
async fn relay_while_flowing(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    mut flow: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0; 64 * 1024];
    loop {
        if flow.wait_for(|flowing| *flowing).await.is_err() {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        // Held back after the read: nothing read after the stall is passed on.
        if !*flow.borrow() || to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        stop_and_remove(&self.scratch.0, &[&self.primary, &self.standby]);
    }
}

/// Copies the running `primary` (whose data directory is `primary_dir`) into `standby_dir` as a
/// standby of it, with the superuser's password file beside it as the embedded server keeps it.
async fn base_backup(primary: &Server, primary_dir: &Path, standby_dir: &Path) {
    let owner = std::fs::metadata(primary_dir).expect("the primary's data directory");
    std::fs::DirBuilder::new().mode(0o700).create(standby_dir).expect("the standby's data directory");
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(standby_dir, Some(owner.uid()), Some(owner.gid())).expect("chown");
    }
    let bin_dir = primary.embedded.bin_dir();
    let mut backup = as_owner_of(standby_dir, bin_dir.join("pg_basebackup"));
    backup
        .args(["-h", "127.0.0.1", "-p", &primary.port().to_string(), "-U", "postgres", "-X", "stream", "-R", "-D"])
        .arg(standby_dir)
        .env("PGPASSWORD", primary.password());
    let output = backup.output().await.expect("pg_basebackup runs");
    assert!(output.status.success(), "pg_basebackup: {}", String::from_utf8_lossy(&output.stderr));
    let password_file = |dir: &Path| {
        let mut name = dir.as_os_str().to_owned();
        name.push(".password");
        PathBuf::from(name)
    };
    std::fs::copy(password_file(primary_dir), password_file(standby_dir)).expect("the password file");
}

/// One address for whichever local server it points at now, as a DNS name, a virtual IP or a
/// Kubernetes Service moved between servers is: each new connection goes to the current target,
/// and connections already made stay where they went.
pub struct Address {
    port: u16,
    target: Arc<std::sync::atomic::AtomicU16>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Address {
    pub async fn pointing_at(port: u16) -> Address {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a relay port");
        let own = listener.local_addr().expect("the relay's address").port();
        let target = Arc::new(std::sync::atomic::AtomicU16::new(port));
        let current = Arc::clone(&target);
        let accepting = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let port = current.load(std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Address { port: own, target, accepting }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn point_at(&self, port: u16) {
        self.target.store(port, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Address {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}
