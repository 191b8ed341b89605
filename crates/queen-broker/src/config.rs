//! Configuration: typed settings, loaded in layers (later wins): built-in defaults (the same
//! values as `config/queen.toml`), a config file, environment variables with the upstream names
//! as aliases (`PG_HOST`, `DB_POOL_SIZE`, ...), `QUEEN_*` environment variables (`QUEEN_HTTP__PORT`
//! is `http.port`), and command-line flags.

use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub http: HttpConfig,
    pub database: DatabaseConfig,
    pub embedded: EmbeddedConfig,
    pub push: PushConfig,
    pub pop: PopConfig,
    pub maintenance: MaintenanceConfig,
    pub buffer: BufferConfig,
    pub limits: LimitsConfig,
    pub encryption: EncryptionConfig,
    pub auth: AuthConfig,
    pub metrics: MetricsConfig,
    pub stats: StatsConfig,
    pub timers: TimersConfig,
    pub log: LogConfig,
}

/// The most HTTP worker threads a broker starts.
pub const MAX_HTTP_WORKERS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    pub host: String,
    pub port: u16,
    /// HTTP worker threads; 0 means one per CPU; at most [`MAX_HTTP_WORKERS`].
    pub workers: usize,
    /// Largest request body accepted; larger ones get 413.
    pub max_body_bytes: usize,
    /// On SIGTERM, how long in-flight requests may take to finish before the broker exits.
    pub shutdown_timeout_seconds: u64,
    /// Connections open at once, across workers; more wait to be accepted. Each may hold up to
    /// about 160 KiB of the request it is reading, besides what `limits` bounds.
    pub max_connections: usize,
    /// How long a new connection may take to deliver its first request's head before it is
    /// answered 408 and closed (slow clients). Counted from when a worker first looks at the
    /// connection, so a busy broker reads heads late: generous, unlike actix's 5 s.
    pub request_head_timeout_ms: u64,
    /// How long a request's whole body may take to arrive, counted from when its handler starts
    /// reading it; a body still incomplete then is answered 408 with `Connection: close` (slow
    /// clients). actix bounds only the head (`request_head_timeout_ms`), not the body.
    pub request_body_timeout_ms: u64,
    /// How long a connection may sit idle between requests before the broker closes it. Longer
    /// than the idle timeouts of clients and load balancers (httpx 5 s, nginx and AWS load
    /// balancers 60 s), so that they close first: a broker that closes first may do so while a
    /// request is on its way, and the client sees that call fail. actix's default is 5 s.
    pub keep_alive_seconds: u64,
    /// HTTPS: the certificate chain the listener serves, PEM (the server's certificate first);
    /// set with `tls_key_file`, or neither for plain HTTP. Reloaded when it changes or on SIGHUP.
    pub tls_cert_file: Option<PathBuf>,
    /// HTTPS: the private key of `tls_cert_file`, PEM (PKCS#8, PKCS#1 or SEC1).
    pub tls_key_file: Option<PathBuf>,
    /// Serve API requests that a browser made for a page of another origin (`Sec-Fetch-Site`
    /// `cross-site` or `same-site`), refused (403) by default: see `http::cross_site`.
    pub allow_cross_site: bool,
    /// Host names, comma-separated and without ports, that a request over loopback may name in
    /// its `Host` besides IP addresses, `localhost` and this machine's name; `*` allows any
    /// (see `http::dns_rebinding`).
    pub allowed_hosts: String,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            host: "0.0.0.0".into(),
            port: 6632,
            workers: 0,
            max_body_bytes: 16 * 1024 * 1024,
            shutdown_timeout_seconds: 30,
            max_connections: 16 * 1024,
            request_head_timeout_ms: 30_000,
            request_body_timeout_ms: 30_000,
            keep_alive_seconds: 75,
            tls_cert_file: None,
            tls_key_file: None,
            allow_cross_site: false,
            allowed_hosts: String::new(),
        }
    }
}

impl HttpConfig {
    /// The certificate and key files of HTTPS, when the listener serves it (an empty path is
    /// no path). `Config::validate` holds them together.
    pub fn tls_files(&self) -> Option<(&Path, &Path)> {
        fn set(path: &Option<PathBuf>) -> Option<&Path> {
            path.as_deref().filter(|p| !p.as_os_str().is_empty())
        }
        set(&self.tls_cert_file).zip(set(&self.tls_key_file))
    }

    /// The entries of `allowed_hosts`, trimmed and lowercased (host names are not case-sensitive).
    pub fn allowed_host_names(&self) -> impl Iterator<Item = String> + '_ {
        self.allowed_hosts.split(',').map(|name| name.trim().to_ascii_lowercase()).filter(|name| !name.is_empty())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// A full connection URL; wins over the separate fields below.
    pub url: Option<String>,
    /// With neither `url` nor `host`, Queen runs its own embedded PostgreSQL.
    pub host: Option<String>,
    pub port: u16,
    pub name: String,
    pub user: String,
    pub password: Option<String>,
    pub pool_size: usize,
    pub pool_wait_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub statement_timeout_ms: u64,
    pub lock_timeout_ms: u64,
    /// How long a request waits for PostgreSQL to answer one of its writes before answering 503
    /// with the write's outcome unknown; see [`DatabaseConfig::answer_within`].
    pub answer_within_ms: u64,
    /// TLS to the server, as libpq's `sslmode`: `disable`, `prefer` (the default), `require`,
    /// `verify-ca`, `verify-full`. The URL's own `sslmode` wins; see [`DatabaseConfig::tls`].
    pub sslmode: Option<String>,
    /// The CA certificates (PEM) the server's certificate must chain to, the only ones trusted;
    /// `system` for the platform's store (what `verify-full` uses without this).
    pub sslrootcert: Option<PathBuf>,
    /// A client certificate (PEM) to present, with `sslkey`.
    pub sslcert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub sslkey: Option<PathBuf>,
    /// Upstream's `PG_USE_SSL`, used when no `sslmode` is given: false is `disable`, true is
    /// `require` (`verify-full` with `ssl_reject_unauthorized = true`).
    pub use_ssl: Option<bool>,
    /// Upstream's `PG_SSL_REJECT_UNAUTHORIZED`: with `use_ssl = true`, true is `verify-full` and
    /// false is `require`; no effect otherwise.
    pub ssl_reject_unauthorized: Option<bool>,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: None,
            host: None,
            port: 5432,
            name: "postgres".into(),
            user: "postgres".into(),
            password: None,
            pool_size: 20,
            pool_wait_timeout_ms: 5000,
            connect_timeout_ms: 5000,
            statement_timeout_ms: 30_000,
            lock_timeout_ms: 10_000,
            // Under the official clients' 30 s request timeout, so they get the 503 (and retry on
            // it) rather than give up first.
            answer_within_ms: 25_000,
            sslmode: None,
            sslrootcert: None,
            sslcert: None,
            sslkey: None,
            use_ssl: None,
            ssl_reject_unauthorized: None,
        }
    }
}

impl DatabaseConfig {
    /// Whether a server to connect to was configured (otherwise the embedded default applies).
    pub fn is_external(&self) -> bool {
        self.url.is_some() || self.host.is_some()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddedConfig {
    /// Where the embedded PostgreSQL keeps its cluster (`<data_dir>/pg`).
    pub data_dir: PathBuf,
    /// Directory of the PostgreSQL server programs; found automatically when unset.
    pub bin_dir: Option<PathBuf>,
    /// Port of the embedded server on 127.0.0.1; a free one is picked when unset.
    pub port: Option<u16>,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self { data_dir: PathBuf::from("queen-data"), bin_dir: None, port: None }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PushConfig {
    /// Most items one push request may carry.
    pub max_items: usize,
    /// Most messages fused into one segment; a longer queue of pushes is written as several.
    pub max_segment_messages: usize,
    /// Most payload bytes fused into one segment.
    pub max_segment_bytes: usize,
    /// Push requests one partition writer holds (queued or being written) before refusing more
    /// with 429.
    pub writer_mailbox: usize,
    /// How long a partition writer with nothing to do stays for the partition's next push
    /// (and a consumer group's ack actor, at least 1 s); 0 stops a writer as soon as its last
    /// push is answered, so a broker holds writers only for partitions being written.
    pub writer_idle_seconds: u64,
}

impl Default for PushConfig {
    fn default() -> Self {
        Self {
            max_items: 10_000,
            max_segment_messages: 10_000,
            max_segment_bytes: 8 * 1024 * 1024,
            writer_mailbox: 1024,
            writer_idle_seconds: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PopConfig {
    /// `batch` when a pop names none.
    pub default_batch: u32,
    /// `batch` chosen for an `autopilot=true` pop that names none.
    pub autopilot_batch: u32,
    /// Largest `batch` accepted.
    pub max_batch: u32,
    /// Largest `partitions` accepted.
    pub max_partitions: u32,
    /// `timeout` (ms) when a pop names none.
    pub default_timeout_ms: u64,
    /// Largest long-poll `timeout` (ms) accepted.
    pub max_timeout_ms: u64,
    /// Queue-wide pops are planned from the group's view of where work is (the last scan and the
    /// partitions announced since); off, every such pop scans the queue's partitions.
    pub plan_from_views: bool,
    /// A group's view of where its work is (and its empty-scan watermark) is re-verified by a
    /// full scan at most this often.
    pub scan_refresh_seconds: u64,
    /// Memory for decoded segments that pops took part of, so the next pops slice them instead
    /// of reading and decompressing them again; 0 turns the cache off.
    pub segment_cache_bytes: u64,
    /// Most payload bytes one pop hands out: it delivers fewer than `batch` messages rather than
    /// pass it, and always at least one. It bounds the segments a pop decodes and its answer, and
    /// the payloads of a page of timers or of dead letters.
    pub max_answer_bytes: usize,
    /// While a consumer group's stream on a queue is dense, its long-poll pops start at most this
    /// often on this broker (or once per batch's worth of the stream, when that arrives sooner),
    /// so that each carries more and the group's cycles leave the producers more of the machine.
    /// Dense: a slot's worth of its recent deliveries fills a tenth of a pop's batch, and its last
    /// pop took everything it could short of its batch. A pop waits one slot for each of the
    /// group's pops ahead of it, never past its `timeout`. 0 (the default) never holds a pop.
    pub dense_interval_ms: u64,
    /// Where a new named group starts when its first pop names no `subscriptionMode` or
    /// `subscriptionFrom`: `all` (the oldest retained message) or `new` (what is pushed from
    /// then on); upstream's empty value is `all`.
    pub default_subscription_mode: String,
}

impl Default for PopConfig {
    fn default() -> Self {
        Self {
            default_batch: 1,
            autopilot_batch: 100,
            max_batch: 10_000,
            max_partitions: 100,
            default_timeout_ms: 30_000,
            max_timeout_ms: 600_000,
            plan_from_views: true,
            scan_refresh_seconds: 30,
            segment_cache_bytes: 64 * 1024 * 1024,
            max_answer_bytes: 16 * 1024 * 1024,
            dense_interval_ms: 0,
            default_subscription_mode: "all".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MaintenanceConfig {
    /// Time between maintenance passes (retention, partition clean-up).
    pub interval_ms: u64,
    /// An empty partition idle this many days is deleted.
    pub partition_cleanup_days: u32,
    /// Segments deleted per transaction by retention.
    pub batch_segments: u32,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        Self { interval_ms: 60_000, partition_cleanup_days: 30, batch_segments: 1000 }
    }
}

/// The push journal: where pushes accepted during push maintenance wait for the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BufferConfig {
    /// This broker's journal directory, created when first needed; never shared by two brokers.
    pub dir: PathBuf,
    /// Most messages replayed into the log per step of a drain.
    pub drain_batch_messages: usize,
    /// A journal file is closed, and drained on its own, once it holds this many bytes.
    pub file_max_bytes: u64,
    /// Most bytes the journal's files hold together; a push past it is refused (503) rather than
    /// taken into files the disk or the volume may not hold (a Kubernetes `emptyDir` past its
    /// `sizeLimit` gets the pod evicted, and the journal with it).
    pub max_bytes: u64,
}

impl Default for BufferConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("queen-data/buffer"),
            drain_batch_messages: 1000,
            file_max_bytes: 64 * 1024 * 1024,
            max_bytes: 1024 * 1024 * 1024,
        }
    }
}

/// How much work the broker holds at once; past a bound it refuses work (`crate::pressure`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Bytes of request bodies held at once, across every request, with what compressed ones
    /// decompress to; past it, 503. At least `http.max_body_bytes`, so that any body the broker
    /// accepts can be held alone (a compressed one that, inflated, cannot is a 413).
    pub body_bytes_in_flight: usize,
    /// Long-polling pops parked at once; a pop that would park past it is answered 503.
    pub parked_long_polls: usize,
    /// Ack calls one consumer group's actor holds (queued or being committed); past it, 429.
    pub group_ack_calls: usize,
    /// Messages waiting for the coordinator; past it, pops are answered 503.
    pub coordinator_messages: usize,
    /// Long polls one client address has parked on this broker at once; a pop that would park
    /// past it is answered 429. 0 = no limit.
    pub long_polls_per_client: usize,
    /// The client address is the last one of `X-Forwarded-For` (the one the proxy in front of the
    /// broker appended) rather than the TCP peer's. Only behind one proxy that sets the header:
    /// otherwise a client picks its own.
    pub trust_forwarded_for: bool,
    /// Queues the fleet will create, counted in PostgreSQL; past it a request that would create
    /// one is answered 409 (`limit_reached`) and creates nothing. 0 = no limit. The same on every broker.
    pub max_queues: u64,
    /// Partitions one queue will hold, the same way. 0 = no limit.
    pub max_partitions_per_queue: u64,
    /// Named consumer groups one queue will have (registered, or with cursors; queue mode does
    /// not count), the same way. 0 = no limit.
    pub max_groups_per_queue: u64,
}

impl LimitsConfig {
    /// What the fleet creates at most, for the store (0 = no limit).
    pub fn creation(&self) -> queen_store::queues::CreationLimits {
        let limit = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        queen_store::queues::CreationLimits {
            queues: limit(self.max_queues),
            partitions_per_queue: limit(self.max_partitions_per_queue),
            groups_per_queue: limit(self.max_groups_per_queue),
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            body_bytes_in_flight: 64 * 1024 * 1024,
            parked_long_polls: 10_000,
            group_ack_calls: 4096,
            coordinator_messages: 16 * 1024,
            long_polls_per_client: 1000,
            trust_forwarded_for: false,
            max_queues: 10_000,
            max_partitions_per_queue: 100_000,
            max_groups_per_queue: 1000,
        }
    }
}

/// Encryption at rest of the queues configured with `encryptionEnabled`.
#[derive(Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncryptionConfig {
    /// The AES-256-GCM key, 64 hexadecimal characters (`QUEEN_ENCRYPTION_KEY`). Every broker of a
    /// fleet needs the same one. Without it, a queue cannot be configured to encrypt.
    pub key: Option<String>,
}

/// Never shows the key (configurations end up in logs and panics).
impl std::fmt::Debug for EncryptionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptionConfig").field("key", &self.key.as_ref().map(|_| "<set>")).finish()
    }
}

impl EncryptionConfig {
    /// The cipher of the configured key; `None` without one.
    pub fn cipher(&self) -> Result<Option<queen_log::Cipher>, ConfigError> {
        self.key
            .as_deref()
            .filter(|key| !key.is_empty())
            .map(queen_log::Cipher::from_hex)
            .transpose()
            .map_err(|e| invalid("encryption.key", e.to_string()))
    }
}

/// Who may call the API (`crate::auth`). Off unless JWTs are enabled or a tokens file is given;
/// `/health` and `/ready` are always public.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Verify `Authorization: Bearer` JWTs (`JWT_ENABLED`).
    pub jwt_enabled: bool,
    /// `HS256`, `RS256`, `EdDSA`, or `auto` (the token's own `alg`, among the key material given).
    pub jwt_algorithm: String,
    /// The HMAC secret of HS256 tokens (`JWT_SECRET`).
    pub jwt_secret: Option<String>,
    /// A PEM public key for RS256 or EdDSA tokens (`JWT_PUBLIC_KEY`).
    pub jwt_public_key: Option<String>,
    /// A JWKS document to take RS256/EdDSA keys from, by `kid` (`JWT_JWKS_URL`).
    pub jwt_jwks_url: Option<String>,
    /// How often the JWKS is fetched again (`JWT_JWKS_REFRESH_INTERVAL`, seconds).
    pub jwt_jwks_refresh_seconds: u64,
    /// How long one JWKS fetch may take (`JWT_JWKS_TIMEOUT_MS`).
    pub jwt_jwks_timeout_ms: u64,
    /// A token signed with a key the JWKS does not hold makes the broker fetch it again, at most
    /// this often (seconds), so a key rotation is picked up without waiting for the refresh.
    pub jwt_jwks_min_refetch_seconds: u64,
    /// Required `iss`, when set (`JWT_ISSUER`).
    pub jwt_issuer: Option<String>,
    /// Required `aud`, when set (`JWT_AUDIENCE`).
    pub jwt_audience: Option<String>,
    /// Leeway on `exp` and `nbf`, seconds (`JWT_CLOCK_SKEW`).
    pub jwt_clock_skew_seconds: u64,
    /// Paths served without a token, comma-separated: exact, or a prefix when ending in `/`
    /// (`JWT_SKIP_PATHS`). `/health` and `/ready` are public whatever this says; `/metrics` is
    /// public while listed here, and needs the read-only role otherwise.
    pub jwt_skip_paths: String,
    /// Claim holding one role name (`JWT_ROLES_CLAIM`).
    pub jwt_roles_claim: String,
    /// Claim holding an array of role names (`JWT_ROLES_ARRAY_CLAIM`).
    pub jwt_roles_array_claim: String,
    /// The role names tokens carry (`JWT_ROLE_ADMIN`, `JWT_ROLE_READ_WRITE`, `JWT_ROLE_READ_ONLY`).
    pub role_admin: String,
    pub role_read_write: String,
    pub role_read_only: String,
    /// Static API tokens, a TOML file of `[[token]]` entries (name, token or sha256, role, queues).
    pub tokens_file: Option<PathBuf>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            jwt_enabled: false,
            jwt_algorithm: "HS256".into(),
            jwt_secret: None,
            jwt_public_key: None,
            jwt_jwks_url: None,
            jwt_jwks_refresh_seconds: 3600,
            jwt_jwks_timeout_ms: 5000,
            jwt_jwks_min_refetch_seconds: 10,
            jwt_issuer: None,
            jwt_audience: None,
            jwt_clock_skew_seconds: 30,
            jwt_skip_paths: "/health,/ready,/metrics".into(),
            jwt_roles_claim: "role".into(),
            jwt_roles_array_claim: "roles".into(),
            role_admin: "admin".into(),
            role_read_write: "read-write".into(),
            role_read_only: "read-only".into(),
            tokens_file: None,
        }
    }
}

/// Never shows the secret.
impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("jwt_enabled", &self.jwt_enabled)
            .field("jwt_algorithm", &self.jwt_algorithm)
            .field("jwt_secret", &self.jwt_secret.as_ref().map(|_| "<set>"))
            .field("jwt_public_key", &self.jwt_public_key.is_some())
            .field("jwt_jwks_url", &self.jwt_jwks_url)
            .field("jwt_issuer", &self.jwt_issuer)
            .field("jwt_audience", &self.jwt_audience)
            .field("tokens_file", &self.tokens_file)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Queues with series of their own; the others are counted together under `queue="_other"`.
    pub max_queue_labels: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self { max_queue_labels: 1000 }
    }
}

/// What the dashboard's fleet list and history are made of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatsConfig {
    /// Every broker records its heartbeat and its traffic this often, and one broker of the fleet
    /// samples the consumer lag; the history's resolution.
    pub sample_interval_seconds: u64,
}

impl Default for StatsConfig {
    fn default() -> Self {
        Self { sample_interval_seconds: 10 }
    }
}

/// The sweep that delivers due timers (`POST /api/v1/timers`), on every broker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimersConfig {
    /// The shortest time between two sweeps of a broker: a due timer the broker knows of is
    /// delivered within about this long. Knowing of it means it was scheduled through this
    /// broker, or seen by its last probe for the next due timer.
    pub sweep_interval_ms: u64,
    /// The longest an idle broker goes without probing for the next due timer (one index probe):
    /// how late a timer scheduled through another broker that died since can be delivered.
    pub idle_probe_ms: u64,
    /// Failed deliveries (its queue full, a creation limit, ...) after which a timer is held:
    /// kept with its last error and not tried again until it is rescheduled. The wait between
    /// attempts doubles from 1 s to at most a minute.
    pub max_attempts: u32,
}

impl Default for TimersConfig {
    fn default() -> Self {
        Self { sweep_interval_ms: 200, idle_probe_ms: 2000, max_attempts: 20 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A tracing filter: `info`, `debug`, `queen_broker=debug,info`, ...
    pub level: String,
    /// `text` or `json`.
    pub format: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { level: "info".into(), format: "text".into() }
    }
}

impl LogConfig {
    /// The tracing filter `level` names. A bare word must be a level: tracing would read any
    /// other (`warning`, a typo) as a target's name and log nothing else. Upstream Queen's names
    /// for levels (`warning`, `err`, `critical`) read as the nearest level.
    pub fn filter(&self) -> Result<tracing_subscriber::EnvFilter, String> {
        let mut directives = Vec::new();
        for directive in self.level.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            if directive.contains(['=', '[']) {
                directives.push(directive.to_owned());
                continue;
            }
            let level = match directive.to_ascii_lowercase().as_str() {
                "warning" => "warn".to_owned(),
                "err" | "critical" => "error".to_owned(),
                level @ ("error" | "warn" | "info" | "debug" | "trace" | "off") => level.to_owned(),
                _ => {
                    return Err(format!(
                        "{directive:?} is not a level (error, warn, info, debug, trace, off); a target is named with \
                         its level, as queen_broker=debug"
                    ));
                }
            };
            directives.push(level);
        }
        tracing_subscriber::EnvFilter::try_new(directives.join(",")).map_err(|e| e.to_string())
    }
}

/// Upstream Queen's environment variable names, accepted as aliases.
pub const ENV_ALIASES: &[(&str, &str)] = &[
    ("HOST", "http.host"),
    ("PORT", "http.port"),
    ("DATABASE_URL", "database.url"),
    ("PG_HOST", "database.host"),
    ("PG_PORT", "database.port"),
    ("PG_DB", "database.name"),
    ("PG_USER", "database.user"),
    ("PG_PASSWORD", "database.password"),
    ("DB_POOL_SIZE", "database.pool_size"),
    ("DB_CONNECTION_TIMEOUT", "database.connect_timeout_ms"),
    ("DB_STATEMENT_TIMEOUT", "database.statement_timeout_ms"),
    ("DB_LOCK_TIMEOUT", "database.lock_timeout_ms"),
    ("PG_USE_SSL", "database.use_ssl"),
    ("PG_SSL_REJECT_UNAUTHORIZED", "database.ssl_reject_unauthorized"),
    ("DEFAULT_BATCH_SIZE", "pop.default_batch"),
    ("DEFAULT_TIMEOUT", "pop.default_timeout_ms"),
    ("DEFAULT_SUBSCRIPTION_MODE", "pop.default_subscription_mode"),
    ("LOG_LEVEL", "log.level"),
    ("RETENTION_INTERVAL", "maintenance.interval_ms"),
    ("RETENTION_BATCH_SIZE", "maintenance.batch_segments"),
    ("PARTITION_CLEANUP_DAYS", "maintenance.partition_cleanup_days"),
    ("FILE_BUFFER_DIR", "buffer.dir"),
    ("QUEEN_ENCRYPTION_KEY", "encryption.key"),
    ("FILE_BUFFER_MAX_BATCH", "buffer.drain_batch_messages"),
    ("JWT_ENABLED", "auth.jwt_enabled"),
    ("JWT_ALGORITHM", "auth.jwt_algorithm"),
    ("JWT_SECRET", "auth.jwt_secret"),
    ("JWT_PUBLIC_KEY", "auth.jwt_public_key"),
    ("JWT_JWKS_URL", "auth.jwt_jwks_url"),
    ("JWT_JWKS_REFRESH_INTERVAL", "auth.jwt_jwks_refresh_seconds"),
    ("JWT_JWKS_TIMEOUT_MS", "auth.jwt_jwks_timeout_ms"),
    ("JWT_ISSUER", "auth.jwt_issuer"),
    ("JWT_AUDIENCE", "auth.jwt_audience"),
    ("JWT_CLOCK_SKEW", "auth.jwt_clock_skew_seconds"),
    ("JWT_SKIP_PATHS", "auth.jwt_skip_paths"),
    ("JWT_ROLES_CLAIM", "auth.jwt_roles_claim"),
    ("JWT_ROLES_ARRAY_CLAIM", "auth.jwt_roles_array_claim"),
    ("JWT_ROLE_ADMIN", "auth.role_admin"),
    ("JWT_ROLE_READ_WRITE", "auth.role_read_write"),
    ("JWT_ROLE_READ_ONLY", "auth.role_read_only"),
];

/// Upstream Queen's environment variables that this broker does not read: tuning of mechanisms it
/// does not have (worker threads, libqueen's batching, UDP peer sync, its metrics tables), each
/// reported at start-up when set, so that a fleet moved over learns what its settings no longer do.
const UPSTREAM_UNREAD: &[&str] = &[
    "NUM_WORKERS",
    "WORKER_ID",
    "WEBAPP_ROOT",
    "DB_IDLE_TIMEOUT",
    "DB_TCP_USER_TIMEOUT_MS",
    "DB_KEEPALIVES_IDLE",
    "DB_KEEPALIVES_INTERVAL",
    "DB_KEEPALIVES_COUNT",
    "DB_THREAD_POOL_SERVICE_THREADS",
    "LIBQUEEN_INFLIGHT_DEADLINE_MS",
    "POP_WAIT_INITIAL_INTERVAL_MS",
    "POP_WAIT_BACKOFF_THRESHOLD",
    "POP_WAIT_BACKOFF_MULTIPLIER",
    "POP_WAIT_MAX_INTERVAL_MS",
    "SIDECAR_POOL_SIZE",
    "SIDECAR_MICRO_BATCH_WAIT_MS",
    "QUEEN_CONCURRENCY_MODE",
    "EVICTION_INTERVAL",
    "EVICTION_BATCH_SIZE",
    "METRICS_RETENTION_DAYS",
    "METRICS_SAMPLE_INTERVAL_MS",
    "METRICS_AGGREGATE_INTERVAL_S",
    "STATS_INTERVAL_MS",
    "STATS_RECONCILE_INTERVAL_MS",
    "STATS_HISTORY_RETENTION_DAYS",
    "PARTITION_LOOKUP_RECONCILE_INTERVAL_MS",
    "FILE_BUFFER_FLUSH_MS",
    "FILE_BUFFER_EVENTS_PER_FILE",
    "QUEEN_UDP_PEERS",
    "QUEEN_UDP_NOTIFY_PORT",
    "QUEEN_SYNC_ENABLED",
    "QUEEN_SYNC_SECRET",
    "QUEEN_SYNC_HEARTBEAT_MS",
    "QUEEN_SYNC_DEAD_THRESHOLD_MS",
    "QUEEN_CACHE_REFRESH_INTERVAL_MS",
];

/// The upstream variables of [`UPSTREAM_UNREAD`] that `vars` sets, for a warning at start-up.
pub fn unread_upstream_variables(vars: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut set: Vec<String> =
        vars.into_iter().filter(|name| UPSTREAM_UNREAD.iter().any(|u| name.eq_ignore_ascii_case(u))).collect();
    set.sort();
    set
}

/// A setting that cannot be used, named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting {setting}: {problem}")]
pub struct ConfigError {
    pub setting: String,
    pub problem: String,
}

fn invalid(setting: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError { setting: setting.into(), problem: problem.into() }
}

/// `QUEEN_<SECTION>__<KEY>` variables. Other `QUEEN_*` variables (the official client reads
/// `QUEEN_SDK_POP_AUTOPILOT`, say) are not settings and are left alone. Text settings are left
/// to [`text_from_env`].
fn queen_env() -> Env {
    Env::prefixed("QUEEN_")
        .filter(|key| key.as_str().contains("__") && !is_text_setting(&key.as_str().replace("__", ".")))
        .split("__")
}

/// A `QUEEN_<SECTION>_<KEY>` variable naming a setting with one underscore where two belong
/// (`QUEEN_DATABASE_URL`) would be left alone as not a setting, and the broker would start
/// without it (on its embedded database, for that one): it stops start-up, naming the variable
/// to set. Upstream names and their aliases (`QUEEN_ENCRYPTION_KEY`) are read as they are.
fn refuse_one_underscore_settings(vars: &[(String, String)]) -> Result<(), ConfigError> {
    let Ok(serde_json::Value::Object(sections)) = serde_json::to_value(Config::default()) else { return Ok(()) };
    for (name, value) in vars {
        let Some(rest) = name.get(..6).filter(|prefix| prefix.eq_ignore_ascii_case("QUEEN_")).map(|_| &name[6..])
        else {
            continue;
        };
        // Kubernetes' service links for a Service named queen-http (QUEEN_HTTP_PORT=tcp://...).
        if value.starts_with("tcp://") || value.starts_with("udp://") {
            continue;
        }
        if rest.contains("__") || ENV_ALIASES.iter().any(|(alias, _)| name.eq_ignore_ascii_case(alias)) {
            continue;
        }
        for (section, keys) in &sections {
            let serde_json::Value::Object(keys) = keys else { continue };
            for key in keys.keys() {
                if rest.eq_ignore_ascii_case(&format!("{section}_{key}")) {
                    let meant = format!("QUEEN_{}__{}", section.to_uppercase(), key.to_uppercase());
                    return Err(invalid(&format!("{section}.{key}"), format!("{name} is not read; set {meant}")));
                }
            }
        }
    }
    Ok(())
}

/// Settings whose values are text, with whether they are optional. figment reads a variable's
/// value as a literal (`12345678` a number, `true` a boolean, `[x]` an array, quotes taken off,
/// spaces trimmed), which would refuse or alter a password, a secret or a path; these settings
/// take the value as written instead, and an optional one given an empty value stays unset.
const TEXT_SETTINGS: &[(&str, Presence)] = &[
    ("http.host", Presence::Required),
    ("http.tls_cert_file", Presence::Optional),
    ("http.tls_key_file", Presence::Optional),
    ("http.allowed_hosts", Presence::Required),
    ("database.url", Presence::Optional),
    ("database.host", Presence::Optional),
    ("database.name", Presence::Required),
    ("database.user", Presence::Required),
    ("database.password", Presence::Optional),
    ("database.sslmode", Presence::Optional),
    ("database.sslrootcert", Presence::Optional),
    ("database.sslcert", Presence::Optional),
    ("database.sslkey", Presence::Optional),
    ("embedded.data_dir", Presence::Required),
    ("embedded.bin_dir", Presence::Optional),
    ("pop.default_subscription_mode", Presence::Required),
    ("buffer.dir", Presence::Required),
    ("encryption.key", Presence::Optional),
    ("auth.jwt_algorithm", Presence::Required),
    ("auth.jwt_secret", Presence::Optional),
    ("auth.jwt_public_key", Presence::Optional),
    ("auth.jwt_jwks_url", Presence::Optional),
    ("auth.jwt_issuer", Presence::Optional),
    ("auth.jwt_audience", Presence::Optional),
    ("auth.jwt_skip_paths", Presence::Required),
    ("auth.jwt_roles_claim", Presence::Required),
    ("auth.jwt_roles_array_claim", Presence::Required),
    ("auth.role_admin", Presence::Required),
    ("auth.role_read_write", Presence::Required),
    ("auth.role_read_only", Presence::Required),
    ("auth.tokens_file", Presence::Optional),
    ("log.level", Presence::Required),
    ("log.format", Presence::Required),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presence {
    Required,
    Optional,
}

fn is_text_setting(path: &str) -> bool {
    TEXT_SETTINGS.iter().any(|(text, _)| path.eq_ignore_ascii_case(text))
}

/// The text settings `vars` set, as the layer `queen_vars` says (upstream names when false,
/// `QUEEN_<SECTION>__<KEY>` when true), each value as written.
fn text_from_env(vars: &[(String, String)], queen_vars: bool) -> Figment {
    let mut figment = Figment::new();
    for (name, value) in vars {
        let path = if queen_vars {
            match name.get(..6) {
                Some(prefix) if prefix.eq_ignore_ascii_case("QUEEN_") => name[6..].replace("__", "."),
                _ => continue,
            }
        } else {
            let Some((_, path)) = ENV_ALIASES.iter().find(|(alias, _)| name.eq_ignore_ascii_case(alias)) else {
                continue;
            };
            (*path).to_owned()
        };
        let Some((setting, presence)) = TEXT_SETTINGS.iter().find(|(text, _)| path.eq_ignore_ascii_case(text)) else {
            continue;
        };
        if value.is_empty() && *presence == Presence::Optional {
            continue;
        }
        figment = figment.merge(Serialized::default(setting, value));
    }
    figment
}

impl Config {
    /// Loads every layer. `overrides` are the command-line flags (only the keys they set).
    pub fn load(file: Option<&Path>, overrides: Figment) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            if !file.is_file() {
                return Err(invalid("--config", format!("{} is not a readable file", file.display())));
            }
            figment = figment.merge(Toml::file(file));
        }
        let aliases = Env::raw().filter_map(|key| {
            ENV_ALIASES
                .iter()
                .find(|(name, _)| key.as_str().eq_ignore_ascii_case(name))
                .filter(|(_, path)| !is_text_setting(path))
                .map(|(_, path)| (*path).into())
        });
        let vars: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
            .collect();
        refuse_one_underscore_settings(&vars)?;
        let figment = figment
            .merge(aliases)
            .merge(text_from_env(&vars, false))
            .merge(queen_env())
            .merge(text_from_env(&vars, true));
        let config: Config = figment.merge(overrides).extract().map_err(|e| {
            let setting = e.path.join(".");
            let problem = e.kind.to_string();
            let source = e.metadata.as_ref().map(|m| format!(" (from {})", m.name)).unwrap_or_default();
            invalid(if setting.is_empty() { "configuration" } else { &setting }, format!("{problem}{source}"))
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what the types alone do not.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let db = &self.database;
        if db.pool_size == 0 {
            return Err(invalid("database.pool_size", "must be at least 1"));
        }
        // 0 is no timeout here. For the connection and the pool it would not mean "no limit" (as
        // libpq's connect_timeout): every wait would end at once. PostgreSQL reads it as no limit,
        // and a statement or a lock wait could then outlast every bound of the broker's (and an
        // idle transaction's, derived from the statement timeout).
        for (name, value) in [
            ("database.connect_timeout_ms", db.connect_timeout_ms),
            ("database.pool_wait_timeout_ms", db.pool_wait_timeout_ms),
            ("database.statement_timeout_ms", db.statement_timeout_ms),
            ("database.lock_timeout_ms", db.lock_timeout_ms),
        ] {
            if value == 0 {
                return Err(invalid(name, "must be at least 1"));
            }
        }
        // PostgreSQL takes at most 2^31 - 1 ms, and the idle-in-transaction timeout the pool
        // derives is twice the statement timeout: past these every connection is refused.
        for (name, value, most) in [
            ("database.statement_timeout_ms", db.statement_timeout_ms, 1_073_741_823),
            ("database.lock_timeout_ms", db.lock_timeout_ms, 2_147_483_647),
        ] {
            if value > most {
                return Err(invalid(name, format!("must be at most {most}")));
            }
        }
        if let Some(url) = &db.url {
            let (url, _) = queen_store::tls::split_tls_params(url);
            url.parse::<tokio_postgres::Config>().map_err(|e| invalid("database.url", e.to_string()))?;
        }
        db.tls()?.connector().map_err(|e| invalid(&db.tls_setting(e.setting()), e.to_string()))?;
        // Shorter would give up on writes PostgreSQL answers in its ordinary time under load, or
        // answer a write that waited for a row lock as unknown rather than as the clean refusal
        // of its lock timeout.
        if db.answer_within_ms < 1000 || db.answer_within_ms <= db.lock_timeout_ms {
            return Err(invalid(
                "database.answer_within_ms",
                "must be at least 1000 and above database.lock_timeout_ms",
            ));
        }
        // A request is written as one segment at most that large, and readers refuse a segment
        // that decodes past queen_store::log::MAX_SEGMENT_RAW_BYTES: half of it leaves room for
        // the frames' own bytes.
        let most = queen_store::log::MAX_SEGMENT_RAW_BYTES / 2;
        if self.http.max_body_bytes < 1024 || self.http.max_body_bytes > most {
            return Err(invalid("http.max_body_bytes", format!("must be 1024 to {most}")));
        }
        // Each worker is a thread with its own runtime, started before the first request.
        if self.http.workers > MAX_HTTP_WORKERS {
            return Err(invalid("http.workers", format!("must be at most {MAX_HTTP_WORKERS} (0: one per CPU)")));
        }
        if self.http.max_connections == 0 {
            return Err(invalid("http.max_connections", "must be at least 1"));
        }
        if self.http.request_head_timeout_ms < 1000 {
            return Err(invalid("http.request_head_timeout_ms", "must be at least 1000"));
        }
        if self.http.request_body_timeout_ms < 1000 {
            return Err(invalid("http.request_body_timeout_ms", "must be at least 1000"));
        }
        // Bounded above so that deadlines computed from them cannot overflow.
        for (name, value, least) in [
            ("http.keep_alive_seconds", self.http.keep_alive_seconds, 1),
            ("http.shutdown_timeout_seconds", self.http.shutdown_timeout_seconds, 0),
        ] {
            if !(least..=86_400).contains(&value) {
                return Err(invalid(name, format!("must be between {least} and 86400")));
            }
        }
        if let Some(name) = self.http.allowed_host_names().find(|name| name != "*" && name.contains([':', '/', '*'])) {
            return Err(invalid(
                "http.allowed_hosts",
                format!("{name:?} is not a host name (no scheme, port or pattern)"),
            ));
        }
        let set = |path: &Option<PathBuf>| path.as_ref().is_some_and(|p| !p.as_os_str().is_empty());
        match (set(&self.http.tls_cert_file), set(&self.http.tls_key_file)) {
            (true, false) => return Err(invalid("http.tls_key_file", "must be set with http.tls_cert_file")),
            (false, true) => return Err(invalid("http.tls_cert_file", "must be set with http.tls_key_file")),
            _ => {}
        }
        let push = &self.push;
        if push.max_items == 0 || push.max_segment_messages == 0 || push.max_segment_bytes == 0 {
            return Err(invalid("push", "max_items, max_segment_messages and max_segment_bytes must be positive"));
        }
        if push.max_segment_bytes > most {
            return Err(invalid("push.max_segment_bytes", format!("must be at most {most}")));
        }
        if push.writer_mailbox == 0 {
            return Err(invalid("push.writer_mailbox", "must be at least 1"));
        }
        let pop = &self.pop;
        for (name, value) in [("pop.default_batch", pop.default_batch), ("pop.autopilot_batch", pop.autopilot_batch)] {
            if value == 0 || value > pop.max_batch {
                return Err(invalid(name, format!("must be between 1 and pop.max_batch ({})", pop.max_batch)));
            }
        }
        if pop.max_partitions == 0 {
            return Err(invalid("pop.max_partitions", "must be at least 1"));
        }
        if pop.default_timeout_ms > pop.max_timeout_ms {
            return Err(invalid("pop.default_timeout_ms", "must not exceed pop.max_timeout_ms"));
        }
        if pop.dense_interval_ms > 1000 {
            return Err(invalid("pop.dense_interval_ms", "must be at most 1000"));
        }
        if pop.max_answer_bytes < 1024 {
            return Err(invalid("pop.max_answer_bytes", "must be at least 1024"));
        }
        if !matches!(pop.default_subscription_mode.as_str(), "all" | "new" | "") {
            return Err(invalid("pop.default_subscription_mode", "must be `all` or `new`"));
        }
        if self.maintenance.interval_ms < 100 {
            return Err(invalid("maintenance.interval_ms", "must be at least 100"));
        }
        // 0 would delete every partition the moment it is empty, and every group's cursor on it;
        // past a century PostgreSQL cannot compute the cut-off, and every pass fails on it.
        if !(1..=36_500).contains(&self.maintenance.partition_cleanup_days) {
            return Err(invalid("maintenance.partition_cleanup_days", "must be between 1 and 36500"));
        }
        if !(1..=3600).contains(&self.stats.sample_interval_seconds) {
            return Err(invalid("stats.sample_interval_seconds", "must be between 1 and 3600"));
        }
        if self.maintenance.batch_segments == 0 {
            return Err(invalid("maintenance.batch_segments", "must be at least 1"));
        }
        let timers = &self.timers;
        if !(10..=60_000).contains(&timers.sweep_interval_ms) {
            return Err(invalid("timers.sweep_interval_ms", "must be between 10 and 60000"));
        }
        if !(timers.sweep_interval_ms..=600_000).contains(&timers.idle_probe_ms) {
            return Err(invalid("timers.idle_probe_ms", "must be between timers.sweep_interval_ms and 600000"));
        }
        if !(1..=1000).contains(&timers.max_attempts) {
            return Err(invalid("timers.max_attempts", "must be between 1 and 1000"));
        }
        if self.buffer.drain_batch_messages == 0 {
            return Err(invalid("buffer.drain_batch_messages", "must be at least 1"));
        }
        if self.buffer.file_max_bytes < 4096 {
            return Err(invalid("buffer.file_max_bytes", "must be at least 4096"));
        }
        if self.buffer.max_bytes < self.buffer.file_max_bytes {
            return Err(invalid("buffer.max_bytes", "must be at least buffer.file_max_bytes"));
        }
        let limits = &self.limits;
        if limits.body_bytes_in_flight < self.http.max_body_bytes {
            return Err(invalid("limits.body_bytes_in_flight", "must be at least http.max_body_bytes"));
        }
        for (name, value) in [
            ("limits.parked_long_polls", limits.parked_long_polls),
            ("limits.group_ack_calls", limits.group_ack_calls),
            ("limits.coordinator_messages", limits.coordinator_messages),
        ] {
            if value == 0 {
                return Err(invalid(name, "must be at least 1"));
            }
        }
        self.encryption.cipher()?;
        crate::auth::check(&self.auth)?;
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return Err(invalid("log.format", "must be `text` or `json`"));
        }
        self.log.filter().map_err(|e| invalid("log.level", e))?;
        Ok(())
    }
}

impl DatabaseConfig {
    /// The connection settings for an external server (the URL without our TLS parameters:
    /// [`DatabaseConfig::tls`] has them).
    /// Every connection of the broker (the pool's, LISTEN's, start-up's) is bounded by
    /// `connect_timeout_ms`, host by host (`queen_store::connect`).
    /// The server settings given beside `url`, which the URL replaces whole: a `url` from a file
    /// beats a later layer's `PG_HOST`, and the operator is told so at start-up.
    pub fn unused_beside_url(&self) -> Vec<&'static str> {
        let default = DatabaseConfig::default();
        if self.url.is_none() {
            return Vec::new();
        }
        [
            ("database.host", self.host.is_some()),
            ("database.port", self.port != default.port),
            ("database.name", self.name != default.name),
            ("database.user", self.user != default.user),
            ("database.password", self.password.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect()
    }

    pub fn pg_config(&self) -> tokio_postgres::Config {
        // Checked by `Config::validate`.
        let from_url = self.url.as_ref().and_then(|url| queen_store::tls::split_tls_params(url).0.parse().ok());
        let mut config: tokio_postgres::Config = from_url.unwrap_or_else(|| {
            let mut config = tokio_postgres::Config::new();
            config
                .host(self.host.as_deref().unwrap_or("localhost"))
                .port(self.port)
                .dbname(&self.name)
                .user(&self.user);
            if let Some(password) = &self.password {
                config.password(password);
            }
            config
        });
        config.connect_timeout(Duration::from_millis(self.connect_timeout_ms));
        config
    }

    /// How the connections to an external server use TLS. Each of `sslmode`, `sslrootcert`,
    /// `sslcert` and `sslkey` comes from the URL's query when it has it (as the URL's other parts
    /// win over the separate settings), else from the setting of that name. The mode, in order:
    /// the URL's `sslmode`; `sslmode`; upstream's `use_ssl` (`PG_USE_SSL`): false is `disable`,
    /// true is `require`, or `verify-full` when `ssl_reject_unauthorized`
    /// (`PG_SSL_REJECT_UNAUTHORIZED`) is true; else libpq's default, `prefer`. Empty values are
    /// unset. The files are read by [`queen_store::tls::TlsSettings::connector`].
    pub fn tls(&self) -> Result<queen_store::tls::TlsSettings, ConfigError> {
        use queen_store::tls::{RootCert, SslMode, TlsSettings};
        let from_url = self.url_tls();
        let text = |from_url: &Option<String>, setting: &Option<String>| {
            from_url.clone().or_else(|| setting.clone()).filter(|value| !value.is_empty())
        };
        let path = |path: &Option<PathBuf>| path.as_ref().map(|p| p.to_string_lossy().into_owned());
        let mode = match text(&from_url.sslmode, &self.sslmode) {
            Some(mode) => mode
                .parse()
                .map_err(|e: queen_store::tls::TlsError| invalid(&self.tls_setting("sslmode"), e.to_string()))?,
            None => match (self.use_ssl, self.ssl_reject_unauthorized) {
                (Some(false), _) => SslMode::Disable,
                (Some(true), Some(true)) => SslMode::VerifyFull,
                (Some(true), _) => SslMode::Require,
                (None, _) => SslMode::Prefer,
            },
        };
        Ok(TlsSettings {
            mode,
            root_cert: text(&from_url.sslrootcert, &path(&self.sslrootcert)).map(|value| RootCert::parse(&value)),
            client_cert: text(&from_url.sslcert, &path(&self.sslcert)).map(PathBuf::from),
            client_key: text(&from_url.sslkey, &path(&self.sslkey)).map(PathBuf::from),
        })
    }

    /// The TLS parameters the URL carries.
    fn url_tls(&self) -> queen_store::tls::ConnectionTls {
        self.url.as_deref().map(|url| queen_store::tls::split_tls_params(url).1).unwrap_or_default()
    }

    /// The setting a TLS parameter came from: `database.url` when the URL has it, else
    /// `database.<parameter>`.
    fn tls_setting(&self, parameter: &str) -> String {
        if parameter == "url" || self.url_tls().has(parameter) {
            "database.url".into()
        } else {
            format!("database.{parameter}")
        }
    }

    /// How long the broker waits for PostgreSQL to answer a write a request makes (an append, an
    /// ack commit, a lease claim, a transaction, a route's commit) before answering 503, its
    /// outcome unknown, and discarding the connection. Statements are bounded by PostgreSQL's own
    /// timeouts, but a commit waiting for a synchronous standby or the WAL disk is never timed out.
    pub fn answer_within(&self) -> Duration {
        Duration::from_millis(self.answer_within_ms)
    }

    pub fn pool_settings(&self) -> queen_store::pool::PoolSettings {
        queen_store::pool::PoolSettings {
            max_size: self.pool_size,
            wait_timeout: Duration::from_millis(self.pool_wait_timeout_ms),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            statement_timeout: Duration::from_millis(self.statement_timeout_ms),
            lock_timeout: Duration::from_millis(self.lock_timeout_ms),
            application_name: "queen".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_config_file_holds_the_built_in_defaults() {
        let shipped = include_str!("../../../config/queen.toml");
        let parsed: Config = Figment::from(Toml::string(shipped)).extract().expect("config/queen.toml parses");
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().expect("defaults validate");
    }

    /// The official clients give a request 30 s (`timeout_millis`); a write PostgreSQL leaves
    /// unanswered must be answered 503 before that, so they retry on the broker's answer.
    #[test]
    fn an_unanswered_write_is_answered_before_the_clients_give_up() {
        assert!(Config::default().database.answer_within() < Duration::from_secs(30));
    }

    #[test]
    fn an_invalid_value_names_its_setting() {
        let mut config = Config::default();
        config.database.pool_size = 0;
        assert_eq!(config.validate().unwrap_err().setting, "database.pool_size");
        let mut config = Config::default();
        config.pop.dense_interval_ms = 1000;
        config.validate().expect("a second at most");
        config.pop.dense_interval_ms = 1001;
        assert_eq!(config.validate().unwrap_err().setting, "pop.dense_interval_ms");
        let mut config = Config::default();
        config.database.answer_within_ms = 999;
        assert_eq!(config.validate().unwrap_err().setting, "database.answer_within_ms");
        let mut config = Config::default();
        config.database.lock_timeout_ms = config.database.answer_within_ms;
        assert_eq!(config.validate().unwrap_err().setting, "database.answer_within_ms", "above the lock timeout");
        let mut config = Config::default();
        config.http.max_body_bytes = 300 << 20;
        assert_eq!(config.validate().unwrap_err().setting, "http.max_body_bytes", "a segment readers would refuse");
        for listed in ["queen.internal:6632", "http://queen.internal", "*.internal"] {
            let mut config = Config::default();
            config.http.allowed_hosts = format!("localhost, {listed}");
            assert_eq!(config.validate().unwrap_err().setting, "http.allowed_hosts", "{listed}");
        }
        let mut config = Config::default();
        config.http.allowed_hosts = " Queen.Internal ,*,".into();
        config.validate().expect("names and the wildcard");
        assert_eq!(config.http.allowed_host_names().collect::<Vec<_>>(), ["queen.internal", "*"]);
        let mut config = Config::default();
        config.push.max_segment_bytes = 300 << 20;
        assert_eq!(config.validate().unwrap_err().setting, "push.max_segment_bytes");
        for setting in [
            "database.connect_timeout_ms",
            "database.pool_wait_timeout_ms",
            "database.statement_timeout_ms",
            "database.lock_timeout_ms",
            "maintenance.partition_cleanup_days",
        ] {
            let mut config = Config::default();
            match setting {
                "database.connect_timeout_ms" => config.database.connect_timeout_ms = 0,
                "database.pool_wait_timeout_ms" => config.database.pool_wait_timeout_ms = 0,
                "database.statement_timeout_ms" => config.database.statement_timeout_ms = 0,
                "database.lock_timeout_ms" => config.database.lock_timeout_ms = 0,
                _ => config.maintenance.partition_cleanup_days = 0,
            }
            assert_eq!(config.validate().unwrap_err().setting, setting, "0 is refused");
        }
    }

    /// Values past what PostgreSQL takes, or that overflow a deadline computed from them, or that
    /// let anyone make the broker fetch a JWKS back to back, are refused naming the setting.
    #[test]
    fn values_too_large_for_what_they_feed_are_refused() {
        type Case = (&'static str, fn(&mut Config));
        let cases: [Case; 9] = [
            ("http.workers", |c| c.http.workers = 1_000_000),
            ("database.statement_timeout_ms", |c| c.database.statement_timeout_ms = 1_073_741_824),
            ("database.lock_timeout_ms", |c| {
                c.database.lock_timeout_ms = 2_147_483_648;
                c.database.answer_within_ms = 2_147_483_649;
            }),
            ("http.keep_alive_seconds", |c| c.http.keep_alive_seconds = u64::MAX),
            ("http.shutdown_timeout_seconds", |c| c.http.shutdown_timeout_seconds = u64::MAX),
            ("maintenance.partition_cleanup_days", |c| c.maintenance.partition_cleanup_days = 99_999_999),
            ("auth.jwt_clock_skew_seconds", |c| c.auth.jwt_clock_skew_seconds = u64::MAX),
            ("auth.jwt_jwks_refresh_seconds", |c| c.auth.jwt_jwks_refresh_seconds = u64::MAX),
            ("auth.jwt_jwks_min_refetch_seconds", |c| c.auth.jwt_jwks_min_refetch_seconds = 0),
        ];
        for (setting, make) in cases {
            let mut config = Config::default();
            if setting.starts_with("auth.") {
                config.auth.jwt_enabled = true;
                config.auth.jwt_secret = Some("a secret long enough for HS256, 32 bytes".into());
            }
            make(&mut config);
            assert_eq!(config.validate().unwrap_err().setting, setting);
        }
    }

    #[test]
    fn server_settings_beside_a_url_are_named_as_unused() {
        let mut database = DatabaseConfig { host: Some("elsewhere".into()), ..DatabaseConfig::default() };
        assert!(database.unused_beside_url().is_empty(), "without a URL they are used");
        database.url = Some("postgres://u@h/db".into());
        database.user = "someone".into();
        assert_eq!(database.unused_beside_url(), ["database.host", "database.user"]);
    }

    #[test]
    fn upstream_variables_this_broker_does_not_read_are_named() {
        let vars = ["NUM_WORKERS", "PG_HOST", "queen_sync_enabled", "PATH"].map(str::to_owned);
        assert_eq!(unread_upstream_variables(vars), ["NUM_WORKERS", "queen_sync_enabled"]);
        for (alias, _) in ENV_ALIASES {
            assert!(!UPSTREAM_UNREAD.contains(alias), "{alias} is read");
        }
    }

    #[test]
    fn a_setting_named_with_one_underscore_too_few_is_refused_naming_the_variable_to_set() {
        let vars = |name: &str| vec![(name.to_owned(), "x".to_owned())];
        let refused = refuse_one_underscore_settings(&vars("QUEEN_DATABASE_URL")).expect_err("one underscore");
        assert_eq!(refused.setting, "database.url");
        assert!(refused.problem.contains("set QUEEN_DATABASE__URL"), "{}", refused.problem);
        let service_link = vec![("QUEEN_HTTP_PORT".to_owned(), "tcp://10.0.0.1:6632".to_owned())];
        assert!(refuse_one_underscore_settings(&service_link).is_ok(), "a Kubernetes service link");
        for fine in ["QUEEN_DATABASE__URL", "QUEEN_ENCRYPTION_KEY", "QUEEN_SDK_POP_AUTOPILOT", "DATABASE_URL"] {
            refuse_one_underscore_settings(&vars(fine)).unwrap_or_else(|e| panic!("{fine}: {e:?}"));
        }
    }

    #[test]
    fn a_log_level_is_a_level_or_names_its_target() {
        let filter = |level: &str| LogConfig { level: level.into(), ..LogConfig::default() }.filter();
        for level in ["info", "WARN", "queen_broker=debug,info", "off", "warning", "critical"] {
            filter(level).unwrap_or_else(|e| panic!("{level}: {e}"));
        }
        let refused = filter("inf0").expect_err("not a level");
        assert!(refused.contains("\"inf0\" is not a level"), "{refused}");
        let mut config = Config::default();
        config.log.level = "warn,inf0".into();
        assert_eq!(config.validate().unwrap_err().setting, "log.level");
    }

    #[test]
    fn the_listeners_certificate_and_key_are_set_together_or_not_at_all() {
        let mut config = Config::default();
        assert_eq!(config.http.tls_files(), None, "plain HTTP by default");
        config.http.tls_cert_file = Some("/etc/queen/tls/tls.crt".into());
        assert_eq!(config.validate().unwrap_err().setting, "http.tls_key_file");
        config.http.tls_key_file = Some("/etc/queen/tls/tls.key".into());
        config.validate().expect("both set");
        assert!(config.http.tls_files().is_some());
        config.http.tls_cert_file = Some("".into());
        assert_eq!(config.validate().unwrap_err().setting, "http.tls_cert_file", "an empty path is no path");
    }

    #[test]
    fn an_encryption_key_is_checked_and_never_shown() {
        let mut config = Config::default();
        config.encryption.key = Some("abc".into());
        assert_eq!(config.validate().unwrap_err().setting, "encryption.key");
        let key = "0123456789abcdef".repeat(4);
        config.encryption.key = Some(key.clone());
        config.validate().expect("64 hex characters");
        assert!(!format!("{config:?}").contains(&key), "the key leaked into Debug");
    }

    #[test]
    #[allow(clippy::result_large_err, reason = "figment::Jail's closures return figment's own error")]
    fn only_section_keyed_queen_variables_are_settings() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("QUEEN_HTTP__PORT", "7000");
            jail.set_env("QUEEN_SDK_POP_AUTOPILOT", "off");
            jail.set_env("QUEEN_COMPAT_PYTHON", "/usr/bin/python3");
            let config = Config::load(None, Figment::new()).map_err(|e| e.to_string())?;
            assert_eq!(config.http.port, 7000);
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err, reason = "figment::Jail's closures return figment's own error")]
    fn later_layers_win_file_then_upstream_names_then_queen_variables_then_flags() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("queen.toml", "[http]\nport = 7001\nworkers = 3\n[database]\npool_size = 3\n")?;
            let file = Some(Path::new("queen.toml"));
            let load = |flags: Figment| Config::load(file, flags).map_err(|e| e.to_string());
            assert_eq!(load(Figment::new())?.http.port, 7001, "the file over the defaults");
            jail.set_env("PORT", "7002");
            jail.set_env("DB_POOL_SIZE", "4");
            assert_eq!(load(Figment::new())?.http.port, 7002, "upstream names over the file");
            jail.set_env("QUEEN_HTTP__PORT", "7003");
            let config = load(Figment::new())?;
            assert_eq!(
                (config.http.port, config.database.pool_size),
                (7003, 4),
                "QUEEN_ variables over upstream names"
            );
            let config = load(Figment::new().merge(Serialized::default("http.port", 7004)))?;
            assert_eq!((config.http.port, config.http.workers), (7004, 3), "flags over everything; the rest stays");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err, reason = "figment::Jail's closures return figment's own error")]
    fn text_settings_take_a_variable_as_written() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("PG_PASSWORD", "12345678");
            jail.set_env("PG_USER", " 'x' ");
            jail.set_env("QUEEN_DATABASE__NAME", "[queen]");
            jail.set_env("JWT_SECRET", "true");
            jail.set_env("QUEEN_LOG__LEVEL", "warn");
            jail.set_env("DATABASE_URL", "");
            jail.set_env("PG_HOST", "");
            jail.set_env("PORT", "7005");
            let config = Config::load(None, Figment::new()).map_err(|e| e.to_string())?;
            let db = &config.database;
            assert_eq!(
                (db.password.as_deref(), db.user.as_str(), db.name.as_str(), config.auth.jwt_secret.as_deref()),
                (Some("12345678"), " 'x' ", "[queen]", Some("true"))
            );
            assert_eq!((db.url.as_deref(), db.host.as_deref()), (None, None), "empty is unset: the embedded default");
            assert_eq!((config.log.level.as_str(), config.http.port), ("warn", 7005));
            jail.set_env("QUEEN_DATABASE__PASSWORD", "007");
            let config = Config::load(None, Figment::new()).map_err(|e| e.to_string())?;
            assert_eq!(config.database.password.as_deref(), Some("007"), "QUEEN_ variables over upstream names");
            Ok(())
        });
    }

    /// Every setting that holds text is in [`TEXT_SETTINGS`], and every one listed holds text.
    #[test]
    fn the_text_settings_are_exactly_the_settings_that_hold_text() {
        fn leaves(value: &serde_json::Value, path: String, out: &mut Vec<(String, serde_json::Value)>) {
            match value {
                serde_json::Value::Object(members) => {
                    for (key, member) in members {
                        let path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                        leaves(member, path, out);
                    }
                }
                leaf => out.push((path, leaf.clone())),
            }
        }
        let mut all = Vec::new();
        leaves(&serde_json::to_value(Config::default()).expect("the defaults serialize"), String::new(), &mut all);
        for (path, default) in &all {
            let takes_text = Figment::from(Serialized::defaults(Config::default()))
                .merge(Serialized::default(path, "text"))
                .extract::<Config>()
                .is_ok();
            assert_eq!(
                is_text_setting(path),
                default.is_string() || (default.is_null() && takes_text),
                "{path} (default {default}): TEXT_SETTINGS must list exactly the settings that hold text"
            );
        }
        for (text, _) in TEXT_SETTINGS {
            assert!(all.iter().any(|(path, _)| path == text), "{text} is not a setting");
        }
    }

    #[test]
    fn every_alias_names_a_real_setting() {
        let mut full = Config::default();
        full.database.url = Some("postgres://localhost/queen".into());
        full.database.host = Some("db".into());
        full.database.password = Some("secret".into());
        full.database.use_ssl = Some(true);
        full.database.ssl_reject_unauthorized = Some(true);
        full.encryption.key = Some("00".repeat(32));
        full.auth.jwt_secret = Some("secret".into());
        full.auth.jwt_public_key = Some("pem".into());
        full.auth.jwt_jwks_url = Some("http://127.0.0.1/jwks".into());
        full.auth.jwt_issuer = Some("issuer".into());
        full.auth.jwt_audience = Some("audience".into());
        let figment = Figment::from(Serialized::defaults(full));
        for (alias, path) in ENV_ALIASES {
            assert!(figment.find_value(path).is_ok(), "{alias} maps to {path}, which is not a setting");
        }
    }

    #[test]
    fn tls_settings_come_from_the_url_then_the_settings_then_upstream_names() {
        use queen_store::tls::{RootCert, SslMode};
        let mode = |url: Option<&str>, sslmode: Option<&str>, use_ssl: Option<bool>, reject: Option<bool>| {
            let db = DatabaseConfig {
                url: url.map(Into::into),
                sslmode: sslmode.map(Into::into),
                use_ssl,
                ssl_reject_unauthorized: reject,
                ..DatabaseConfig::default()
            };
            db.tls().expect("valid settings").mode
        };
        assert_eq!(mode(None, None, None, None), SslMode::Prefer, "libpq's default");
        assert_eq!(mode(Some("postgres://db/q"), None, None, None), SslMode::Prefer);
        assert_eq!(mode(None, Some("verify-ca"), None, None), SslMode::VerifyCa);
        assert_eq!(mode(None, Some(""), None, None), SslMode::Prefer, "empty is unset");
        assert_eq!(mode(Some("postgres://db/q?sslmode=require"), Some("disable"), None, None), SslMode::Require);
        assert_eq!(mode(Some("postgres://db/q"), Some("verify-full"), None, None), SslMode::VerifyFull);
        // Upstream's names, when no sslmode is given.
        assert_eq!(mode(None, None, Some(false), None), SslMode::Disable);
        assert_eq!(mode(None, None, Some(false), Some(true)), SslMode::Disable);
        assert_eq!(mode(None, None, Some(true), None), SslMode::Require, "upstream: PG_USE_SSL=true is require");
        assert_eq!(mode(None, None, Some(true), Some(false)), SslMode::Require);
        assert_eq!(mode(None, None, Some(true), Some(true)), SslMode::VerifyFull);
        assert_eq!(mode(None, None, None, Some(true)), SslMode::Prefer, "no effect without PG_USE_SSL");
        assert_eq!(mode(None, Some("disable"), Some(true), Some(true)), SslMode::Disable, "sslmode wins");
        assert_eq!(mode(Some("postgres://db/q?sslmode=prefer"), None, Some(true), Some(true)), SslMode::Prefer);

        let db = DatabaseConfig {
            url: Some("postgres://db/q?sslrootcert=/from/url.pem&sslkey=system".into()),
            sslrootcert: Some("/from/setting.pem".into()),
            sslcert: Some("/c.pem".into()),
            sslkey: Some("/k.pem".into()),
            ..DatabaseConfig::default()
        };
        let tls = db.tls().expect("valid settings");
        assert_eq!(tls.root_cert, Some(RootCert::File("/from/url.pem".into())));
        assert_eq!(tls.client_cert.as_deref(), Some(Path::new("/c.pem")));
        assert_eq!(tls.client_key.as_deref(), Some(Path::new("system")), "only sslrootcert knows `system`");
        let system = DatabaseConfig { sslrootcert: Some("system".into()), ..DatabaseConfig::default() };
        assert_eq!(system.tls().expect("valid").root_cert, Some(RootCert::System));
        // tokio-postgres never sees our parameters.
        let url = "postgres://u@db:6000/q?sslmode=verify-full&application_name=x&sslrootcert=/ca.pem";
        let pg = DatabaseConfig { url: Some(url.into()), ..DatabaseConfig::default() }.pg_config();
        assert_eq!((pg.get_hosts().len(), pg.get_ports(), pg.get_application_name()), (1, &[6000][..], Some("x")));
    }

    #[test]
    #[allow(clippy::result_large_err, reason = "figment::Jail's closures return figment's own error")]
    fn upstream_ssl_variables_choose_the_mode() {
        use queen_store::tls::SslMode;
        figment::Jail::expect_with(|jail| {
            let mode = || -> Result<SslMode, String> {
                let config = Config::load(None, Figment::new()).map_err(|e| e.to_string())?;
                config.database.tls().map(|tls| tls.mode).map_err(|e| e.to_string())
            };
            jail.set_env("PG_USE_SSL", "false");
            assert_eq!(mode()?, SslMode::Disable);
            jail.set_env("PG_USE_SSL", "true");
            assert_eq!(mode()?, SslMode::Require);
            jail.set_env("PG_SSL_REJECT_UNAUTHORIZED", "false");
            assert_eq!(mode()?, SslMode::Require);
            jail.set_env("PG_SSL_REJECT_UNAUTHORIZED", "true");
            jail.create_file("ca.pem", &queen_testkit::tls_cluster::TestCertificates::generate().ca_pem)?;
            jail.set_env("QUEEN_DATABASE__SSLROOTCERT", "ca.pem");
            assert_eq!(mode()?, SslMode::VerifyFull);
            jail.set_env("QUEEN_DATABASE__SSLMODE", "require");
            jail.set_env("QUEEN_DATABASE__SSLROOTCERT", "");
            assert_eq!(mode()?, SslMode::Require, "an sslmode wins over upstream's names");
            jail.set_env("PG_USE_SSL", "yes");
            let error = Config::load(None, Figment::new()).expect_err("not a boolean");
            assert_eq!(error.setting, "database.use_ssl");
            Ok(())
        });
    }

    #[test]
    fn inconsistent_tls_settings_stop_start_up_naming_the_setting() {
        let setting = |tweak: &dyn Fn(&mut DatabaseConfig)| {
            let mut config = Config::default();
            config.database.url = Some("postgres://db/queen".into());
            tweak(&mut config.database);
            let error = config.validate().expect_err("inconsistent");
            assert!(!error.to_string().contains('\n'), "{error}");
            (error.setting, error.problem)
        };
        let (name, problem) = setting(&|db| db.sslmode = Some("verify_full".into()));
        assert_eq!(name, "database.sslmode");
        assert!(problem.contains("verify-full"), "{problem}");
        let (name, _) = setting(&|db| db.url = Some("postgres://db/queen?sslmode=allow".into()));
        assert_eq!(name, "database.url");
        let (name, problem) = setting(&|db| db.sslkey = Some("/etc/queen/client.key".into()));
        assert_eq!(name, "database.sslcert");
        assert!(problem.contains("without sslcert"), "{problem}");
        let (name, _) = setting(&|db| db.sslcert = Some("/etc/queen/client.crt".into()));
        assert_eq!(name, "database.sslkey");
        let (name, problem) = setting(&|db| db.sslmode = Some("verify-ca".into()));
        assert_eq!(name, "database.sslrootcert");
        assert!(problem.contains("needs sslrootcert"), "{problem}");
        let missing = "/nonexistent/queen-ca.pem";
        let (name, problem) = setting(&|db| {
            db.sslmode = Some("verify-full".into());
            db.sslrootcert = Some(missing.into());
        });
        assert_eq!(name, "database.sslrootcert");
        assert!(problem.contains("cannot read") && problem.contains(missing), "{problem}");
        let (name, _) =
            setting(&|db| db.url = Some(format!("postgres://db/queen?sslmode=require&sslrootcert={missing}")));
        assert_eq!(name, "database.url", "named where it was given");
    }
}
