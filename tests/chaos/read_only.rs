//! PostgreSQL refusing writes live, under load: switched read-only (`default_transaction_read_only`
//! set with `ALTER SYSTEM` and reloaded, which the sessions the brokers pool pick up at their next
//! statement), and, where the machine lets the test mount a small tmpfs, out of disk space (the
//! brokers' database in a tablespace on it, filled up by a ballast file).
//!
//! While writes are refused, pushes answer 503 `unavailable` with `Retry-After` and a message that
//! says why, pops and acks answer what they can or 503 (never 500), and `/ready` answers 503 while
//! PostgreSQL is read-only. Once writes are accepted again the brokers recover by themselves, and
//! the ledger balances.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use queen_testkit::{BrokerProcess, target_dir};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use crate::cluster::{DATABASE, Single};
use crate::load::{Plan, Workload};
use crate::support::{assert_running, start_brokers};

/// The queue the workload uses; probes go to [`PROBE_QUEUE`], which the ledger does not check.
const QUEUE: &str = "read_only";
const PROBE_QUEUE: &str = "probe";

/// How long anything the test waits for may take.
const PATIENCE: Duration = Duration::from_secs(15);

/// How soon after the fault ends each broker must take pushes and be ready again: nothing is
/// reconnected, the next statement of each pooled session takes writes.
const RECOVERY_BOUND: Duration = Duration::from_secs(5);

/// Pushes each broker must refuse in a row, once it refuses, before writes are allowed again.
const REFUSALS: usize = 10;

/// What a client saw of one request.
#[derive(Debug, Clone)]
struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    body: Value,
}

async fn answer(request: reqwest::RequestBuilder) -> Option<Answer> {
    let response = request.send().await.ok()?;
    let status = response.status();
    let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let text = response.text().await.ok()?;
    let body = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
    Some(Answer { status, retry_after, body })
}

/// Pushes one probe message with `id` to the broker at `base`: 16 KiB of hex digits, which do not
/// compress much, so that storing it needs new pages when the disk is full.
async fn push_probe(http: &reqwest::Client, base: &str, id: &str) -> Option<Answer> {
    let pad: String = (0..512).map(|_| uuid::Uuid::new_v4().simple().to_string()).collect();
    let body = json!({"items": [{"queue": PROBE_QUEUE, "transactionId": id, "payload": {"probe": id, "pad": pad}}]});
    answer(http.post(format!("{base}/api/v1/push")).json(&body)).await
}

/// Asserts that `answer` is the 503 a refused write gets: `unavailable`, `Retry-After`, and an
/// error that says `why`.
fn assert_refused(what: &str, answer: &Answer, why: &str) {
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{what}: {answer:?}");
    assert_eq!(answer.body["code"], "unavailable", "{what}: {answer:?}");
    assert_eq!(answer.body["success"], false, "{what}: {answer:?}");
    let error = answer.body["error"].as_str().unwrap_or_default();
    assert!(error.contains(why), "{what}: the error does not say {why:?}: {answer:?}");
    assert_eq!(answer.retry_after.as_deref(), Some("1"), "{what}: {answer:?}");
}

/// How PostgreSQL refuses writes, and how the test makes it do so and stop.
enum Fault<'a> {
    /// `default_transaction_read_only` on, set through `admin` (a superuser session) and seen by
    /// `own`, a session opened before and never setting it (as the brokers' pooled ones).
    ReadOnly { admin: &'a Client, own: &'a Client },
    /// The tablespace of the brokers' database is full.
    DiskFull { disk: &'a Tmpfs },
}

impl Fault<'_> {
    /// What the error of a refused write says.
    fn why(&self) -> &'static str {
        match self {
            Fault::ReadOnly { .. } => "PostgreSQL is read-only",
            Fault::DiskFull { .. } => "PostgreSQL is out of disk space",
        }
    }

    /// Brings the fault on, and waits until a session of the test's own sees it.
    async fn begin(&self) {
        match self {
            Fault::ReadOnly { admin, own } => {
                // Not in one batch: ALTER SYSTEM refuses to run in a transaction block.
                admin.batch_execute("ALTER SYSTEM SET default_transaction_read_only = on").await.expect("ALTER SYSTEM");
                admin.batch_execute("SELECT pg_reload_conf()").await.expect("reload");
                until_read_only_is(own, "on").await;
                let refused = own.batch_execute("CREATE TABLE read_only_probe ()").await.expect_err("a write refused");
                assert_eq!(refused.code(), Some(&SqlState::READ_ONLY_SQL_TRANSACTION), "{refused}");
            }
            Fault::DiskFull { disk } => {
                let written = disk.fill();
                println!("disk full: a ballast of {} KiB fills the tmpfs", written / 1024);
            }
        }
    }

    async fn end(&self) {
        match self {
            Fault::ReadOnly { admin, own } => {
                admin.batch_execute("ALTER SYSTEM RESET default_transaction_read_only").await.expect("ALTER SYSTEM");
                admin.batch_execute("SELECT pg_reload_conf()").await.expect("reload");
                until_read_only_is(own, "off").await;
            }
            Fault::DiskFull { disk } => disk.free(),
        }
    }
}

/// Waits until `session` has `default_transaction_read_only` at `value` (a reload reaches each
/// session at its next statement, once the postmaster has signalled it).
async fn until_read_only_is(session: &Client, value: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now: String = session.query_one("SHOW default_transaction_read_only", &[]).await.expect("SHOW").get(0);
        if now == value {
            return;
        }
        assert!(Instant::now() < deadline, "default_transaction_read_only stayed {now}, not {value}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What one run measured, for the report.
#[derive(Debug)]
struct Observed {
    /// The first refused push, as the client saw it.
    refused_push: Answer,
    /// Statuses of pops (a fresh group each) and of an ack while writes were refused.
    pops: Vec<StatusCode>,
    ack: StatusCode,
    /// `/ready` of each broker while writes were refused.
    ready: Vec<Answer>,
    /// Per broker, from the end of the fault (its first statement).
    recovery: Vec<Recovery>,
    /// Pushes of the workload acknowledged while the fault lasted (after both brokers refused).
    acknowledged_during_fault: usize,
}

/// The server process ids of the brokers' pooled sessions (not their LISTEN sessions).
async fn pooled_sessions(db: &Client) -> Vec<i32> {
    let rows = db
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'queen'",
            &[],
        )
        .await
        .expect("pg_stat_activity");
    rows.iter().map(|row| row.get(0)).collect()
}

/// How soon one broker was back after the fault.
#[derive(Debug)]
struct Recovery {
    /// Until it took a push.
    pushed: Duration,
    /// Until `/ready` answered 200.
    ready: Duration,
}

/// Runs the workload on two brokers over `database` of `pg`, brings `fault` on, checks what
/// clients see while it lasts, ends it, and checks that the brokers recover and the ledger
/// balances.
async fn refuse_writes_under_load(pg: &Single, database: &str, fault: Fault<'_>) -> Observed {
    let url = pg.server.url(database);
    let mut brokers = start_brokers(&url, 2, &[]).await;
    let bases: Vec<String> = brokers.iter().map(BrokerProcess::url).collect();
    let http = queen_testkit::http().timeout(Duration::from_secs(5)).build().expect("a client");

    // A message delivered (and not yet acked) to group `probe`, to ack while writes are refused.
    let pushed = push_probe(&http, &bases[0], "held").await.expect("a probe push");
    assert_eq!(pushed.status, StatusCode::CREATED, "{pushed:?}");
    let pop = format!("{}/api/v1/pop/queue/{PROBE_QUEUE}?batch=1&consumerGroup=probe", bases[0]);
    let popped = answer(http.get(pop)).await.expect("a probe pop");
    assert_eq!(popped.status, StatusCode::OK, "{popped:?}");
    let held = popped.body["messages"][0].clone();

    let workload = Workload::start(Plan::new(bases.clone(), QUEUE)).await;
    workload.until_acknowledged(150, PATIENCE).await;

    let watch = pg.server.connect(database).await;
    let pooled_before = pooled_sessions(&watch).await;
    fault.begin().await;
    let why = fault.why();
    // Each broker refuses a push, then every one of the next `REFUSALS`.
    let mut refused_push = None;
    for (b, base) in bases.iter().enumerate() {
        let deadline = Instant::now() + PATIENCE;
        for attempt in 0.. {
            let id = format!("refused-b{b}-{attempt}");
            match push_probe(&http, base, &id).await {
                Some(answer) if answer.status == StatusCode::SERVICE_UNAVAILABLE => {
                    assert_refused(&format!("broker {b}: the first refused push"), &answer, why);
                    refused_push.get_or_insert(answer);
                    break;
                }
                Some(answer) => {
                    assert_eq!(answer.status, StatusCode::CREATED, "broker {b}: a push as writes stop: {answer:?}");
                }
                None => panic!("broker {b}: a push got no answer"),
            }
            assert!(Instant::now() < deadline, "broker {b} never refused a push");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // From here on every broker refuses writes. A workload push sent before may still be
    // answered `queued` (its transaction began before the fault); one sent after must not be.
    let refusing_since = Instant::now();
    let disk_full = matches!(fault, Fault::DiskFull { .. });
    for (b, base) in bases.iter().enumerate() {
        let deadline = Instant::now() + PATIENCE;
        let mut refusals = 0;
        for attempt in 0.. {
            let answer = push_probe(&http, base, &format!("again-b{b}-{attempt}")).await.expect("an answer");
            // Out of disk space, a write that fits in a page with room left may still succeed.
            if disk_full && answer.status == StatusCode::CREATED {
                assert!(Instant::now() < deadline, "broker {b} refused {refusals} pushes only");
                continue;
            }
            assert_refused(&format!("broker {b}: a push while writes are refused"), &answer, why);
            refusals += 1;
            if refusals == REFUSALS {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // Pops: each in a group of its own, which must be registered and leased (writes).
    let mut pops = Vec::new();
    for (b, base) in bases.iter().enumerate() {
        let pop = format!("{base}/api/v1/pop/queue/{QUEUE}?batch=5&consumerGroup=fresh{b}");
        let popped = answer(http.get(pop)).await.expect("a pop is answered");
        match popped.status {
            StatusCode::OK | StatusCode::NO_CONTENT => {}
            _ => assert_refused(&format!("broker {b}: a pop while writes are refused"), &popped, why),
        }
        pops.push(popped.status);
    }
    let ack = json!({"acknowledgments": [{
        "transactionId": held["transactionId"], "partitionId": held["partitionId"], "leaseId": held["leaseId"],
        "status": "completed"}], "consumerGroup": "probe"});
    let acked = answer(http.post(format!("{}/api/v1/ack/batch", bases[1])).json(&ack)).await.expect("an ack");
    match acked.status {
        StatusCode::OK => {}
        _ => assert_refused("an ack while writes are refused", &acked, why),
    }

    // Readiness: not ready while read-only (it cannot take a push); out of disk space, PostgreSQL
    // still takes what fits and the broker cannot tell that without writing, so it stays ready.
    let mut ready = Vec::new();
    for (b, base) in bases.iter().enumerate() {
        let wanted = if disk_full { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
        let deadline = Instant::now() + PATIENCE;
        let seen = loop {
            let seen = answer(http.get(format!("{base}/ready"))).await.expect("/ready answers");
            if seen.status == wanted {
                break seen;
            }
            assert!(Instant::now() < deadline, "broker {b}: /ready answered {seen:?}, not {wanted}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if !disk_full {
            assert_eq!(seen.body["database"], "read-only", "broker {b}: /ready says why: {seen:?}");
        }
        let health = answer(http.get(format!("{base}/health"))).await.expect("/health answers");
        assert_eq!(health.status, StatusCode::OK, "broker {b}: /health stays up: {health:?}");
        ready.push(seen);
    }
    // What refused the writes were the sessions the brokers had pooled before, not new ones:
    // none of them was ended.
    let pooled_now = pooled_sessions(&watch).await;
    let gone: Vec<_> = pooled_before.iter().filter(|pid| !pooled_now.contains(pid)).collect();
    assert!(gone.is_empty(), "pooled sessions {gone:?} ended during the fault");
    println!("{} sessions pooled before the fault, all still there; {} now", pooled_before.len(), pooled_now.len());
    let acknowledged_during_fault = workload.ledger().acknowledged_ids_sent_since(refusing_since).len();
    if !disk_full {
        assert_eq!(acknowledged_during_fault, 0, "pushes were acknowledged while PostgreSQL was read-only");
    }

    let ended = Instant::now();
    fault.end().await;
    let recovery = futures::future::join_all(bases.iter().enumerate().map(|(b, base)| {
        let (http, why) = (&http, why);
        async move {
            for attempt in 0.. {
                match push_probe(http, base, &format!("back-b{b}-{attempt}")).await {
                    Some(answer) if answer.status == StatusCode::CREATED => break,
                    Some(answer) => assert_refused(&format!("broker {b}: a push as writes resume"), &answer, why),
                    None => panic!("broker {b}: a push got no answer"),
                }
                assert!(ended.elapsed() < PATIENCE, "broker {b} never took a push again");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let pushed = ended.elapsed();
            while answer(http.get(format!("{base}/ready"))).await.map(|a| a.status) != Some(StatusCode::OK) {
                assert!(ended.elapsed() < PATIENCE, "broker {b}: /ready never answered 200 again");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Recovery { pushed, ready: ended.elapsed() }
        }
    }))
    .await;
    for (b, back) in recovery.iter().enumerate() {
        assert!(back.pushed.max(back.ready) < RECOVERY_BOUND, "broker {b} recovered slowly: {back:?}");
    }
    workload.until_acknowledged(150, PATIENCE).await;

    let db = pg.server.connect(database).await;
    let finishing = Instant::now();
    let ledger = workload.finish(&db, Duration::from_secs(30)).await;
    println!(
        "{database}: {:?}, drained {:?} after the producers were told to stop",
        ledger.summary(),
        finishing.elapsed()
    );
    ledger.verify(&db).await;
    assert_running(&mut brokers).await;
    for (b, broker) in brokers.iter().enumerate() {
        let log = broker.log();
        let line = log.iter().find(|line| line.contains(why));
        assert!(line.is_some(), "broker {b} logged no line that says {why:?}:\n{}", log.join("\n"));
        println!("broker {b} logged: {}", line.expect("a line"));
    }
    let observed = Observed {
        refused_push: refused_push.expect("a refused push"),
        pops,
        ack: acked.status,
        ready,
        recovery,
        acknowledged_during_fault,
    };
    println!("{database}: {observed:#?}");
    observed
}

#[tokio::test]
async fn read_only_postgres_refuses_pushes_with_503_and_the_brokers_recover_by_themselves() {
    let pg = Single::start("read_only", &[]).await;
    let admin = pg.server.connect("postgres").await;
    let own = pg.server.connect(DATABASE).await;
    let observed = refuse_writes_under_load(&pg, DATABASE, Fault::ReadOnly { admin: &admin, own: &own }).await;
    assert_eq!(observed.acknowledged_during_fault, 0);
    assert!(observed.pops.iter().all(|&status| status == StatusCode::SERVICE_UNAVAILABLE), "{observed:?}");
    assert_eq!(observed.ack, StatusCode::SERVICE_UNAVAILABLE, "{observed:?}");
    assert!(observed.ready.iter().all(|ready| ready.status == StatusCode::SERVICE_UNAVAILABLE), "{observed:?}");
    println!("read-only: the client saw {}", observed.refused_push.body);
    println!("read-only: pushes taken again after {:?}", observed.recovery);
}

/// Size of the tmpfs the disk-full test's database lives on: room for a fresh database (a copy
/// of `template1`) and the schema, not much more.
const DISK_MIB: u64 = 32;

#[tokio::test]
async fn read_only_disk_full_refuses_pushes_with_503_and_the_brokers_recover_by_themselves() {
    // Declared first, so dropped last: after the server on it has stopped.
    let Some(disk) = Tmpfs::mount("read_only_disk", DISK_MIB) else {
        println!("SKIPPED: disk full needs a tmpfs to fill, and this process may not mount one (not root?)");
        return;
    };
    let pg = Single::start("read_only_disk", &[]).await;
    let admin = pg.server.connect("postgres").await;
    let data_dir: String = admin.query_one("SHOW data_directory", &[]).await.expect("SHOW").get(0);
    let location = disk.tablespace_owned_like(Path::new(&data_dir));
    admin
        .batch_execute(&format!("CREATE TABLESPACE queen_small LOCATION '{}'", location.display()))
        .await
        .expect("a tablespace on the tmpfs");
    admin.batch_execute("CREATE DATABASE queen_disk TABLESPACE queen_small").await.expect("a database on it");
    let observed = refuse_writes_under_load(&pg, "queen_disk", Fault::DiskFull { disk: &disk }).await;
    assert!(observed.ready.iter().all(|ready| ready.status == StatusCode::OK), "{observed:?}");
    println!("disk full: the client saw {}", observed.refused_push.body);
    println!("disk full: pushes taken again after {:?}", observed.recovery);
}

/// A small tmpfs mounted for one test, which holds a tablespace and, to fill it up, a ballast
/// file. Unmounted when dropped (lazily, so that it goes even if a server still has a file open
/// on it), and its mount point removed.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `mib` MiB under the target directory; `None` if this process may not.
    fn mount(label: &str, mib: u64) -> Option<Tmpfs> {
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let dir = target_dir().join(format!("chaos-{label}-{}-tmpfs", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a mount point");
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m,mode=0755"), "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|status| status.success());
        if !mounted {
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(Tmpfs { dir })
    }

    /// An empty directory on the tmpfs owned by the owner of `data_dir`, as a tablespace must be.
    fn tablespace_owned_like(&self, data_dir: &Path) -> PathBuf {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let owner = std::fs::metadata(data_dir).expect("the data directory");
        let location = self.dir.join("tablespace");
        std::fs::create_dir(&location).expect("the tablespace's directory");
        std::fs::set_permissions(&location, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::os::unix::fs::chown(&location, Some(owner.uid()), Some(owner.gid())).expect("chown");
        location
    }

    fn ballast(&self) -> PathBuf {
        self.dir.join("ballast")
    }

    /// Writes the ballast until the tmpfs has no page left; returns how many bytes it took.
    fn fill(&self) -> u64 {
        use std::io::Write;
        let mut file = std::fs::File::create(self.ballast()).expect("the ballast file");
        let mut written = 0;
        for chunk in [1 << 20, 4096] {
            let block = vec![0xA5u8; chunk];
            while file.write_all(&block).is_ok() {
                written += chunk as u64;
            }
        }
        written
    }

    fn free(&self) {
        std::fs::remove_file(self.ballast()).expect("the ballast is removed");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}
