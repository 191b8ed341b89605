//! The embedded local PostgreSQL.
//!
//! With no database configured, the broker owns a PostgreSQL cluster under its data directory and
//! runs it with the server binaries installed on the machine (`initdb`, `pg_ctl`). The test harness
//! uses the same code for the shared test cluster, which many test processes bring up at once: every
//! start and stop holds an exclusive lock on `<data_dir>.lock`, so they take turns and later ones
//! adopt the server the first one started.
//!
//! PostgreSQL refuses to run as root. When we are root, the server programs run as the `postgres`
//! OS user (`nobody` if there is none), which is given the data directory and the server log.
//!
//! Dropping an [`EmbeddedPostgres`] does not stop the server; only [`EmbeddedPostgres::stop`] does.

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output};

use nix::unistd::{Gid, Uid, User, geteuid};
use tokio::process::Command;
use tracing::info;

/// The programs a bin dir must hold to be usable.
const SERVER_BINARIES: [&str; 2] = ["initdb", "pg_ctl"];

/// Where Debian and Ubuntu install each major version's binaries, as `<root>/<version>/bin`.
const VERSIONED_ROOT: &str = "/usr/lib/postgresql";

/// Seconds `pg_ctl` waits for the server to start or stop.
const PG_CTL_TIMEOUT_SECS: &str = "60";

/// How many lines of the server log a failed start reports.
const LOG_TAIL_LINES: usize = 20;

/// Longest Unix socket path the kernel accepts (`sun_path` is 108 bytes including the final NUL).
const MAX_SOCKET_PATH_LEN: usize = 107;

/// Where a cluster lives and how it is run.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// The cluster's data directory (PGDATA), created with its parents if missing. Its siblings
    /// `<name>.lock` and `<name>.log` hold the start lock and the server log.
    pub data_dir: PathBuf,
    /// Directory holding `initdb` and `pg_ctl`; `None` discovers it with [`find_bin_dir`].
    pub bin_dir: Option<PathBuf>,
    /// TCP port on 127.0.0.1; `None` picks a free one. Ignored when adopting a running cluster.
    pub port: Option<u16>,
    /// Extra server settings, each passed as `-c name=value`.
    pub settings: Vec<(String, String)>,
}

/// A file [`EmbeddedPostgres::start_with_files`] places in the data directory: a `pg_hba.conf`,
/// a server certificate and its key, ...
#[derive(Debug, Clone)]
pub struct DataFile {
    /// A plain file name (no directories), relative to the data directory.
    pub name: String,
    pub contents: Vec<u8>,
}

/// A running local PostgreSQL cluster, started or adopted by [`EmbeddedPostgres::start`].
#[derive(Debug)]
pub struct EmbeddedPostgres {
    cluster: Cluster,
    port: u16,
    /// The superuser's password; `None` for a cluster made before passwords were set, which
    /// trusts loopback connections.
    password: Option<String>,
    /// Found running rather than started by this process.
    adopted: bool,
    /// The settings it was started with, for [`EmbeddedPostgres::start_again_if_stopped`].
    settings: Vec<(String, String)>,
}

/// Why the embedded PostgreSQL could not be set up, started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(
        "PostgreSQL server binaries (initdb, pg_ctl) not found in {searched}; install them \
         (apt-get install postgresql) or point Queen at a server with database.url / PG_HOST"
    )]
    BinariesNotFound { searched: String },

    #[error(
        "the PostgreSQL cluster in {data_dir} was made by PostgreSQL {version}, and no server binaries of that \
         version are installed (found: {found}); install them, or set embedded.bin_dir to them"
    )]
    NoBinariesOfClusterVersion { data_dir: String, version: String, found: String },

    #[error(
        "Queen runs as root, which PostgreSQL refuses, and there is neither a `postgres` nor a `nobody` user to \
         run it as; create a `postgres` system user or run Queen as an unprivileged user"
    )]
    NoServerUser,

    #[error(
        "PostgreSQL runs as user `{user}` because Queen runs as root, but that user cannot enter {} (mode {mode:04o}); \
         make it traversable (chmod o+x) or put the data directory elsewhere",
        dir.display()
    )]
    NotTraversable { dir: PathBuf, user: String, mode: u32 },

    #[error("the data directory {} does not name a directory", path.display())]
    InvalidDataDir { path: PathBuf },

    #[error("initdb could not create a cluster in {} ({status}): {stderr}", data_dir.display())]
    Initdb { data_dir: PathBuf, status: ExitStatus, stderr: String },

    #[error(
        "pg_ctl could not start PostgreSQL in {} ({status}): {stderr}\nlast lines of {}:\n{log_tail}",
        data_dir.display(),
        log.display()
    )]
    Start { data_dir: PathBuf, status: ExitStatus, stderr: String, log: PathBuf, log_tail: String },

    #[error("pg_ctl could not stop PostgreSQL in {} ({status}): {stderr}", data_dir.display())]
    Stop { data_dir: PathBuf, status: ExitStatus, stderr: String },

    #[error("cannot read the port of the running server from line 4 of {}", path.display())]
    PostmasterPid { path: PathBuf },

    #[error("{action}: {cause}")]
    Io { action: String, cause: io::Error },
}

/// Wraps an io error with what we were doing, for `map_err`.
fn io_error(action: impl Into<String>) -> impl FnOnce(io::Error) -> EmbeddedError {
    let action = action.into();
    move |cause| EmbeddedError::Io { action, cause }
}

impl EmbeddedPostgres {
    /// Starts the cluster in `opts.data_dir`, creating it first if needed, or adopts it if it is
    /// already running (`opts.port` and `opts.settings` then have no effect).
    pub async fn start(opts: EmbeddedOptions) -> Result<Self, EmbeddedError> {
        Self::start_with_files(opts, &[]).await
    }

    /// As [`EmbeddedPostgres::start`], placing `files` in the data directory first (after
    /// `initdb`, before the server starts; replacing files of the same name; owned by the server
    /// user and readable by it alone, as PostgreSQL wants of a key). A running cluster is adopted
    /// as it is, and the files are not written.
    pub async fn start_with_files(opts: EmbeddedOptions, files: &[DataFile]) -> Result<Self, EmbeddedError> {
        if let Some(file) = files.iter().find(|file| !is_plain_file_name(&file.name)) {
            return Err(EmbeddedError::Io {
                action: format!("placing {:?} in the data directory", file.name),
                cause: io::Error::new(io::ErrorKind::InvalidInput, "not a plain file name"),
            });
        }
        let bin_dir = find_bin_dir(opts.bin_dir.as_deref(), &opts.data_dir)?;
        let server_user = server_user()?;
        let cluster = Cluster { data_dir: absolute_data_dir(&opts.data_dir).await?, bin_dir, server_user };
        // Held until we return: a concurrent start waits, then finds the server running and adopts it.
        let _lock = cluster.lock().await?;

        cluster.prepare_data_dir().await?;
        if !cluster.data_dir.join("PG_VERSION").exists() {
            cluster.initdb().await?;
        }
        let password = cluster.password().await?;
        if let Some(port) = cluster.running_port().await? {
            info!(data_dir = %cluster.data_dir.display(), port, "adopting the running PostgreSQL");
            return Ok(Self { cluster, port, password, adopted: true, settings: opts.settings });
        }
        let port = match opts.port {
            Some(port) => port,
            None => free_port()?,
        };
        for file in files {
            write_private(&cluster.data_dir.join(&file.name), &file.contents, cluster.server_user.as_ref()).await?;
        }
        cluster.start_server(port, &opts.settings).await?;
        Ok(Self { cluster, port, password, adopted: false, settings: opts.settings })
    }

    /// Starts the server again, on the same port and with the same settings, when it is no
    /// longer running (killed, or crashed past its own recovery); whether it had to. A server
    /// another process started again meanwhile is left as it is (the start lock orders them).
    pub async fn start_again_if_stopped(&self) -> Result<bool, EmbeddedError> {
        let cluster = &self.cluster;
        let _lock = cluster.lock().await?;
        if cluster.is_running().await? {
            return Ok(false);
        }
        cluster.start_server(self.port, &self.settings).await?;
        Ok(true)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the server was found running (another process started it) rather than started here.
    pub fn adopted(&self) -> bool {
        self.adopted
    }

    /// The absolute data directory (PGDATA).
    pub fn data_dir(&self) -> &Path {
        &self.cluster.data_dir
    }

    pub fn bin_dir(&self) -> &Path {
        &self.cluster.bin_dir
    }

    /// Connection URL for `database` as the `postgres` superuser, over TCP on loopback.
    pub fn url(&self, database: &str) -> String {
        match &self.password {
            Some(password) => format!("postgres://postgres:{password}@127.0.0.1:{}/{database}", self.port),
            None => format!("postgres://postgres@127.0.0.1:{}/{database}", self.port),
        }
    }

    /// Stops the server (fast shutdown: open sessions are ended) and waits for it to exit.
    /// Stopping a cluster that is not running is not an error.
    pub async fn stop(&self) -> Result<(), EmbeddedError> {
        let cluster = &self.cluster;
        let _lock = cluster.lock().await?;
        if !cluster.is_running().await? {
            info!(data_dir = %cluster.data_dir.display(), "PostgreSQL is already stopped");
            return Ok(());
        }
        info!(data_dir = %cluster.data_dir.display(), "stopping PostgreSQL");
        let mut pg_ctl = cluster.command("pg_ctl");
        pg_ctl.arg("-D").arg(&cluster.data_dir).args(["-m", "fast", "-w", "-t", PG_CTL_TIMEOUT_SECS, "stop"]);
        let output = output_of(pg_ctl).await?;
        if !output.status.success() {
            return Err(EmbeddedError::Stop {
                data_dir: cluster.data_dir.clone(),
                status: output.status,
                stderr: stderr_text(&output),
            });
        }
        Ok(())
    }
}

/// The OS user the server programs run as when we are root.
#[derive(Debug)]
struct ServerUser {
    name: String,
    uid: Uid,
    gid: Gid,
}

/// `None` when we are not root: the server programs then run as ourselves.
fn server_user() -> Result<Option<ServerUser>, EmbeddedError> {
    if !geteuid().is_root() {
        return Ok(None);
    }
    for name in ["postgres", "nobody"] {
        let user = User::from_name(name)
            .map_err(|errno| EmbeddedError::Io { action: format!("looking up user `{name}`"), cause: errno.into() })?;
        if let Some(user) = user {
            return Ok(Some(ServerUser { name: user.name, uid: user.uid, gid: user.gid }));
        }
    }
    Err(EmbeddedError::NoServerUser)
}

/// A cluster's files and how its programs are run.
#[derive(Debug)]
struct Cluster {
    /// Absolute, with its parent's symlinks resolved, so every process derives the same lock file.
    data_dir: PathBuf,
    bin_dir: PathBuf,
    server_user: Option<ServerUser>,
}

impl Cluster {
    /// `<data_dir>.<extension>`, a sibling of the data directory.
    fn sibling(&self, extension: &str) -> PathBuf {
        let mut path = self.data_dir.clone().into_os_string();
        path.push(".");
        path.push(extension);
        PathBuf::from(path)
    }

    /// Takes the exclusive lock on `<data_dir>.lock`, waiting for whoever holds it; released on drop.
    async fn lock(&self) -> Result<File, EmbeddedError> {
        let path = self.sibling("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_error(format!("opening the lock file {}", path.display())))?;
        let action = format!("locking {}", path.display());
        match file.try_lock() {
            Ok(()) => Ok(file),
            Err(TryLockError::WouldBlock) => {
                info!(lock = %path.display(), "waiting for another process to finish starting or stopping PostgreSQL");
                blocking(move || file.lock().map(|()| file)).await.map_err(io_error(action))
            }
            Err(TryLockError::Error(cause)) => Err(EmbeddedError::Io { action, cause }),
        }
    }

    /// Creates the data directory if missing and, when the server runs as another user, makes sure
    /// that user can reach it and owns it.
    async fn prepare_data_dir(&self) -> Result<(), EmbeddedError> {
        let created = match tokio::fs::DirBuilder::new().mode(0o700).create(&self.data_dir).await {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(cause) => {
                return Err(EmbeddedError::Io { action: format!("creating {}", self.data_dir.display()), cause });
            }
        };
        let Some(user) = &self.server_user else {
            return Ok(());
        };
        check_traversable(&self.data_dir, user)?;
        let owner = tokio::fs::metadata(&self.data_dir)
            .await
            .map_err(io_error(format!("reading {}", self.data_dir.display())))?
            .uid();
        // A data directory we own already has the right owner throughout; walking it would be slow.
        if created || owner != user.uid.as_raw() {
            let action = format!("giving {} to user `{}`", self.data_dir.display(), user.name);
            let (dir, uid, gid) = (self.data_dir.clone(), user.uid.as_raw(), user.gid.as_raw());
            blocking(move || chown_tree(&dir, uid, gid)).await.map_err(io_error(action))?;
        }
        Ok(())
    }

    /// Creates the cluster. Its superuser gets a random password, kept in `<data_dir>.password`
    /// (readable only by us): the server listens on loopback, where any local user could
    /// otherwise connect as superuser.
    async fn initdb(&self) -> Result<(), EmbeddedError> {
        info!(data_dir = %self.data_dir.display(), "initialising a new PostgreSQL cluster");
        let password = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        let password_file = self.sibling("password");
        write_private(&password_file, password.as_bytes(), None).await?;
        // initdb runs as the server user, who must be able to read the password it sets.
        let initdb_file = self.sibling("pwinit");
        write_private(&initdb_file, password.as_bytes(), self.server_user.as_ref()).await?;
        let mut initdb = self.command("initdb");
        initdb.arg("-D").arg(&self.data_dir).args(["-U", "postgres", "--auth-local=peer", "--auth-host=scram-sha-256"]);
        initdb.arg("--pwfile").arg(&initdb_file).args(["-E", "UTF8", "--no-instructions"]);
        let output = output_of(initdb).await;
        let _ = tokio::fs::remove_file(&initdb_file).await;
        let output = output?;
        if !output.status.success() {
            return Err(EmbeddedError::Initdb {
                data_dir: self.data_dir.clone(),
                status: output.status,
                stderr: stderr_text(&output),
            });
        }
        Ok(())
    }

    /// The superuser's password, when the cluster has one.
    async fn password(&self) -> Result<Option<String>, EmbeddedError> {
        let path = self.sibling("password");
        match tokio::fs::read_to_string(&path).await {
            Ok(password) => Ok(Some(password.trim().to_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(cause) => Err(EmbeddedError::Io { action: format!("reading {}", path.display()), cause }),
        }
    }

    /// The port of the server running on this cluster, if one is.
    async fn running_port(&self) -> Result<Option<u16>, EmbeddedError> {
        let pid_file = self.data_dir.join("postmaster.pid");
        // A crashed server leaves its postmaster.pid behind, so the file alone proves nothing.
        if !pid_file.exists() || !self.is_running().await? {
            return Ok(None);
        }
        let text =
            tokio::fs::read_to_string(&pid_file).await.map_err(io_error(format!("reading {}", pid_file.display())))?;
        parse_postmaster_port(&text).map(Some).ok_or(EmbeddedError::PostmasterPid { path: pid_file })
    }

    async fn is_running(&self) -> Result<bool, EmbeddedError> {
        let mut pg_ctl = self.command("pg_ctl");
        pg_ctl.arg("-D").arg(&self.data_dir).arg("status");
        // Exit status 0 means running; 3 not running; 4 no usable data directory.
        Ok(output_of(pg_ctl).await?.status.success())
    }

    async fn start_server(&self, port: u16, settings: &[(String, String)]) -> Result<(), EmbeddedError> {
        let log = self.sibling("log");
        self.prepare_log_file(&log).await?;
        info!(data_dir = %self.data_dir.display(), port, "starting PostgreSQL");
        let mut pg_ctl = self.command("pg_ctl");
        pg_ctl
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "-o"])
            .arg(server_options(port, &self.data_dir, settings))
            .arg("start");
        let output = output_of(pg_ctl).await?;
        if !output.status.success() {
            let log_tail = match tokio::fs::read(&log).await {
                Ok(bytes) => tail_lines(&String::from_utf8_lossy(&bytes), LOG_TAIL_LINES),
                Err(e) => format!("(cannot read the log: {e})"),
            };
            return Err(EmbeddedError::Start {
                data_dir: self.data_dir.clone(),
                status: output.status,
                stderr: stderr_text(&output),
                log,
                log_tail,
            });
        }
        Ok(())
    }

    /// Creates the server log up front when the server runs as another user: its directory is ours,
    /// so that user could not create the file itself.
    async fn prepare_log_file(&self, log: &Path) -> Result<(), EmbeddedError> {
        let Some(user) = &self.server_user else {
            return Ok(());
        };
        let (path, uid, gid) = (log.to_path_buf(), user.uid.as_raw(), user.gid.as_raw());
        blocking(move || {
            OpenOptions::new().create(true).append(true).open(&path)?;
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))
        })
        .await
        .map_err(io_error(format!("preparing the server log {}", log.display())))
    }

    /// A server program, run as the server user when there is one.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(program));
        // The inherited working directory may be closed to the server user (e.g. /root).
        command.current_dir(&self.data_dir);
        if let Some(user) = &self.server_user {
            command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        command
    }
}

/// Whether `name` names a file directly inside a directory.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// Writes `text` to a file only its owner can read: `owner`, or us when `None`.
async fn write_private(path: &Path, text: &[u8], owner: Option<&ServerUser>) -> Result<(), EmbeddedError> {
    let (path, text) = (path.to_path_buf(), text.to_owned());
    let ids = owner.map(|user| (user.uid.as_raw(), user.gid.as_raw()));
    let action = format!("writing {}", path.display());
    blocking(move || {
        let _ = std::fs::remove_file(&path);
        let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
        std::io::Write::write_all(&mut file, &text)?;
        if let Some((uid, gid)) = ids {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        }
        Ok(())
    })
    .await
    .map_err(io_error(action))
}

/// Runs `command` to completion, capturing its output.
async fn output_of(mut command: Command) -> Result<Output, EmbeddedError> {
    let program = Path::new(command.as_std().get_program()).display().to_string();
    command.output().await.map_err(io_error(format!("running {program}")))
}

fn stderr_text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).trim().to_owned()
}

/// Runs blocking filesystem work off the async executor.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> io::Result<T> + Send + 'static) -> io::Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(io::Error::other)?
}

/// `path` made absolute, with its parent created and canonicalised.
async fn absolute_data_dir(path: &Path) -> Result<PathBuf, EmbeddedError> {
    let absolute = std::path::absolute(path).map_err(io_error(format!("resolving {}", path.display())))?;
    let (Some(parent), Some(name)) = (absolute.parent(), absolute.file_name()) else {
        return Err(EmbeddedError::InvalidDataDir { path: path.to_path_buf() });
    };
    tokio::fs::create_dir_all(parent).await.map_err(io_error(format!("creating {}", parent.display())))?;
    let parent = tokio::fs::canonicalize(parent).await.map_err(io_error(format!("resolving {}", parent.display())))?;
    Ok(parent.join(name))
}

/// A port that is free on 127.0.0.1 right now. Another process could take it before the server
/// binds it; the start then fails and says so in the log tail.
fn free_port() -> Result<u16, EmbeddedError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io_error("finding a free port on 127.0.0.1"))?;
    let address = listener.local_addr().map_err(io_error("finding a free port on 127.0.0.1"))?;
    Ok(address.port())
}

/// Fails unless `user` can enter every directory above `data_dir`.
fn check_traversable(data_dir: &Path, user: &ServerUser) -> Result<(), EmbeddedError> {
    for dir in data_dir.ancestors().skip(1) {
        let meta = std::fs::metadata(dir).map_err(io_error(format!("reading {}", dir.display())))?;
        if !can_traverse(meta.mode(), meta.uid(), meta.gid(), user.uid.as_raw(), user.gid.as_raw()) {
            return Err(EmbeddedError::NotTraversable {
                dir: dir.to_path_buf(),
                user: user.name.clone(),
                mode: meta.mode() & 0o7777,
            });
        }
    }
    Ok(())
}

/// Whether a process with `uid`/`gid` (and no supplementary groups, as for our children) may
/// search a directory: the owner, group or other execute bit applies, whichever class matches first.
fn can_traverse(mode: u32, owner: u32, group: u32, uid: u32, gid: u32) -> bool {
    let bit = if owner == uid {
        0o100
    } else if group == gid {
        0o010
    } else {
        0o001
    };
    mode & bit != 0
}

/// Gives `path` and everything under it to `uid`/`gid`, without following symlinks.
fn chown_tree(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// The server's command line, for `pg_ctl -o`, which hands it to `/bin/sh`. TCP listens on loopback
/// only; the Unix socket goes in the data directory unless its path would exceed the kernel's limit,
/// in which case it is disabled, since we connect over TCP anyway.
fn server_options(port: u16, data_dir: &Path, settings: &[(String, String)]) -> OsString {
    let socket_path_len = data_dir.as_os_str().len() + format!("/.s.PGSQL.{port}").len();
    let socket_dir = if socket_path_len <= MAX_SOCKET_PATH_LEN { data_dir.as_os_str() } else { OsStr::new("") };
    let mut options = OsString::from(format!("-p {port} -c listen_addresses=127.0.0.1 -k "));
    options.push(shell_quote(socket_dir));
    for (name, value) in settings {
        options.push(" -c ");
        options.push(shell_quote(OsStr::new(&format!("{name}={value}"))));
    }
    options
}

/// `word` as one single-quoted shell word.
fn shell_quote(word: &OsStr) -> OsString {
    let mut quoted = vec![b'\''];
    for &byte in word.as_bytes() {
        if byte == b'\'' {
            quoted.extend_from_slice(b"'\\''");
        } else {
            quoted.push(byte);
        }
    }
    quoted.push(b'\'');
    OsString::from_vec(quoted)
}

/// The port in a `postmaster.pid`, whose lines are: pid, data directory, start time, port, ...
fn parse_postmaster_port(text: &str) -> Option<u16> {
    text.lines().nth(3)?.trim().parse().ok()
}

/// The last `count` lines of `text`.
fn tail_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

/// The directory holding the PostgreSQL server binaries: `explicit` if given, else the first of
/// `pg_config --bindir`, the newest `/usr/lib/postgresql/<version>/bin` and the `PATH` entries
/// that holds both `initdb` and `pg_ctl` (of the major version in `data_dir`'s `PG_VERSION`, when
/// a cluster is there).
pub fn find_bin_dir(explicit: Option<&Path>, data_dir: &Path) -> Result<PathBuf, EmbeddedError> {
    if let Some(dir) = explicit {
        return if has_server_binaries(dir) {
            Ok(dir.to_path_buf())
        } else {
            Err(EmbeddedError::BinariesNotFound { searched: dir.display().to_string() })
        };
    }
    let path_var = std::env::var_os("PATH");
    let candidates = pg_config_bindir()
        .into_iter()
        .chain(versioned_bin_dirs(Path::new(VERSIONED_ROOT)))
        .chain(path_var.iter().flat_map(std::env::split_paths))
        .filter(|dir| has_server_binaries(dir));
    let searched = || format!("`pg_config --bindir`, {VERSIONED_ROOT}/*/bin or PATH");
    match std::fs::read_to_string(data_dir.join("PG_VERSION")) {
        // An existing cluster runs only under its own major version: the newest binaries
        // installed beside it (an upgrade of the machine's packages) would refuse its files.
        Ok(version) => of_version(candidates, data_dir, version.trim()),
        Err(_) => candidates.into_iter().next().ok_or_else(|| EmbeddedError::BinariesNotFound { searched: searched() }),
    }
}

/// The first of `candidates` whose `pg_ctl` is of the cluster's major `version` (its PG_VERSION:
/// `15`, or `9.6`).
fn of_version(
    candidates: impl IntoIterator<Item = PathBuf>,
    data_dir: &Path,
    version: &str,
) -> Result<PathBuf, EmbeddedError> {
    let mut found = Vec::new();
    for dir in candidates {
        let Some(theirs) = server_version(&dir) else { continue };
        if theirs == version || theirs.starts_with(&format!("{version}.")) {
            return Ok(dir);
        }
        found.push(format!("{theirs} in {}", dir.display()));
    }
    Err(EmbeddedError::NoBinariesOfClusterVersion {
        data_dir: data_dir.display().to_string(),
        version: version.to_owned(),
        found: if found.is_empty() { "none".to_owned() } else { found.join(", ") },
    })
}

/// The version `<dir>/pg_ctl --version` reports (`pg_ctl (PostgreSQL) 15.10 (Debian ...)`).
fn server_version(dir: &Path) -> Option<String> {
    let output = std::process::Command::new(dir.join("pg_ctl")).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text.split_once(") ")?.1.split_whitespace().next()?;
    Some(version.to_owned())
}

/// What `pg_config --bindir` reports, if pg_config is installed.
fn pg_config_bindir() -> Option<PathBuf> {
    let output = std::process::Command::new("pg_config").arg("--bindir").output().ok()?;
    output.status.success().then(|| PathBuf::from(OsStr::from_bytes(output.stdout.trim_ascii_end())))
}

/// `<root>/<version>/bin` for each version directory under `root`, newest first.
fn versioned_bin_dirs(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut versions: Vec<(Vec<u32>, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            let version = name.to_str()?.split('.').map(|part| part.parse().ok()).collect::<Option<Vec<u32>>>()?;
            Some((version, entry.path().join("bin")))
        })
        .collect();
    versions.sort_by(|a, b| b.0.cmp(&a.0));
    versions.into_iter().map(|(_, dir)| dir).collect()
}

fn has_server_binaries(dir: &Path) -> bool {
    SERVER_BINARIES.iter().all(|name| {
        std::fs::metadata(dir.join(name)).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory under the system temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Self {
            let path = std::env::temp_dir().join(format!("queen-embedded-unit-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&path).expect("creating the scratch dir");
            Self(path)
        }

        /// Creates `<scratch>/<dir>` holding a file for each of `programs`, with the given mode.
        fn bin_dir(&self, dir: &str, programs: &[&str], mode: u32) -> PathBuf {
            let dir = self.0.join(dir);
            std::fs::create_dir_all(&dir).expect("creating a fake bin dir");
            for program in programs {
                let path = dir.join(program);
                std::fs::write(&path, "#!/bin/sh\n").expect("writing a fake program");
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("setting its mode");
            }
            dir
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn reads_the_port_from_line_four_of_postmaster_pid() {
        let pid_file =
            "4242\n/var/lib/queen/pg\n1732900000\n54321\n/var/lib/queen/pg\n127.0.0.1\n  5432001    32768\nready   \n";
        assert_eq!(parse_postmaster_port(pid_file), Some(54321));
        assert_eq!(parse_postmaster_port("4242\n/var/lib/queen/pg\n1732900000\n"), None);
        assert_eq!(parse_postmaster_port("4242\n/pg\n1732900000\nnot-a-port\n"), None);
    }

    #[test]
    fn a_bin_dir_needs_executable_initdb_and_pg_ctl() {
        let scratch = Scratch::new();
        assert!(has_server_binaries(&scratch.bin_dir("both", &["initdb", "pg_ctl"], 0o755)));
        assert!(!has_server_binaries(&scratch.bin_dir("only-initdb", &["initdb"], 0o755)));
        assert!(!has_server_binaries(&scratch.bin_dir("not-executable", &["initdb", "pg_ctl"], 0o644)));
        assert!(!has_server_binaries(&scratch.0.join("missing")));
    }

    #[test]
    fn an_explicit_bin_dir_is_used_as_is_or_reported_in_one_line() {
        let scratch = Scratch::new();
        let good = scratch.bin_dir("good", &["initdb", "pg_ctl"], 0o755);
        assert_eq!(find_bin_dir(Some(&good), &scratch.0).expect("a complete bin dir"), good);

        let empty = scratch.bin_dir("empty", &[], 0o755);
        let message = find_bin_dir(Some(&empty), &scratch.0).expect_err("an empty bin dir").to_string();
        assert!(message.contains(&*empty.to_string_lossy()), "{message}");
        assert!(message.contains("apt-get install postgresql"), "{message}");
        assert!(!message.contains('\n'), "{message}");
    }

    #[test]
    fn an_existing_cluster_gets_binaries_of_its_own_version() {
        let scratch = Scratch::new();
        let of = |version: &str| {
            let dir = scratch.bin_dir(version, &["initdb", "pg_ctl"], 0o755);
            let script = format!("#!/bin/sh\necho 'pg_ctl (PostgreSQL) {version} (Debian {version}-1)'\n");
            std::fs::write(dir.join("pg_ctl"), script).expect("writing a fake pg_ctl");
            dir
        };
        let (sixteen, fifteen, nine) = (of("16.4"), of("15.10"), of("9.6.24"));
        let candidates = || vec![sixteen.clone(), fifteen.clone(), nine.clone()];
        assert_eq!(of_version(candidates(), &scratch.0, "15").expect("15's"), fifteen);
        assert_eq!(of_version(candidates(), &scratch.0, "9.6").expect("9.6's"), nine);
        let message = of_version(candidates(), &scratch.0, "14").expect_err("no 14").to_string();
        assert!(message.contains("PostgreSQL 14") && message.contains("16.4 in"), "{message}");
        assert!(message.contains("embedded.bin_dir") && !message.contains('\n'), "{message}");
    }

    #[test]
    fn versioned_bin_dirs_come_newest_first_and_skip_other_entries() {
        let scratch = Scratch::new();
        for dir in ["9.6", "13", "15", "common", "16beta"] {
            std::fs::create_dir_all(scratch.0.join(dir)).expect("creating a version dir");
        }
        let expected: Vec<PathBuf> = ["15", "13", "9.6"].iter().map(|v| scratch.0.join(v).join("bin")).collect();
        assert_eq!(versioned_bin_dirs(&scratch.0), expected);
        assert!(versioned_bin_dirs(&scratch.0.join("missing")).is_empty());
    }

    #[test]
    fn traversal_follows_the_first_matching_permission_class() {
        let (postgres, other) = (101, 0);
        assert!(can_traverse(0o755, other, other, postgres, postgres));
        assert!(!can_traverse(0o750, other, other, postgres, postgres));
        assert!(can_traverse(0o750, other, postgres, postgres, postgres));
        assert!(can_traverse(0o700, postgres, other, postgres, postgres));
        // The owner class applies to the owner even when "other" would allow it.
        assert!(!can_traverse(0o001, postgres, other, postgres, postgres));
    }

    #[test]
    fn server_options_quote_paths_and_settings_for_the_shell() {
        let options = server_options(5433, Path::new("/srv/it's here/pg"), &[("work_mem".into(), "64MB".into())]);
        assert_eq!(options, "-p 5433 -c listen_addresses=127.0.0.1 -k '/srv/it'\\''s here/pg' -c 'work_mem=64MB'");
    }

    #[test]
    fn server_options_disable_the_socket_when_its_path_is_too_long() {
        let long = PathBuf::from(format!("/{}", "d".repeat(100)));
        let options = server_options(5433, &long, &[]);
        assert_eq!(options, "-p 5433 -c listen_addresses=127.0.0.1 -k ''");
    }

    #[test]
    fn only_plain_file_names_go_into_the_data_dir() {
        assert!(is_plain_file_name("pg_hba.conf"));
        assert!(is_plain_file_name("server.key"));
        for name in ["", ".", "..", "../postgresql.conf", "/etc/passwd", "sub/file"] {
            assert!(!is_plain_file_name(name), "{name:?}");
        }
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail_lines("a\nb", 5), "a\nb");
    }

    #[test]
    fn siblings_extend_the_data_dir_name() {
        let cluster =
            Cluster { data_dir: PathBuf::from("/srv/queen/pg.data"), bin_dir: PathBuf::new(), server_user: None };
        assert_eq!(cluster.sibling("lock"), Path::new("/srv/queen/pg.data.lock"));
        assert_eq!(cluster.sibling("log"), Path::new("/srv/queen/pg.data.log"));
    }
}
