//! Runs a real embedded PostgreSQL through its life: create and start, adopt, stop, restart past a
//! stale postmaster.pid, stop.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use futures::FutureExt;
use queen_store::embedded::{EmbeddedOptions, EmbeddedPostgres};
use tokio_postgres::NoTls;

#[tokio::test]
async fn starts_adopts_stops_and_restarts_a_cluster() {
    // Under target/ rather than /tmp: when we are root the server runs as `postgres`, which must be
    // able to enter every parent directory.
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("embedded-{}", uuid::Uuid::new_v4()));
    let mut running = None;
    let outcome = AssertUnwindSafe(lifecycle(&scratch.join("pgdata"), &mut running)).catch_unwind().await;

    // After a failed assertion the server may still run; stop it before removing its files.
    if let Some(cluster) = running
        && let Err(e) = cluster.stop().await
    {
        eprintln!("cannot stop the test cluster in {}: {e}", cluster.data_dir().display());
    }
    if let Err(e) = std::fs::remove_dir_all(&scratch) {
        eprintln!("cannot remove {}: {e}", scratch.display());
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// The test proper; `running` holds the handle of a server it has started and not yet stopped.
async fn lifecycle(data_dir: &Path, running: &mut Option<EmbeddedPostgres>) {
    let first = running.insert(start(data_dir, "first start").await);
    assert!(data_dir.join("PG_VERSION").is_file(), "the first start must create the cluster");
    let (first_url, first_port) = (first.url("postgres"), first.port());
    assert_eq!(select_one(&first_url).await, 1);
    let without_password = format!("postgres://postgres@127.0.0.1:{first_port}/postgres");
    assert!(
        tokio_postgres::connect(&without_password, NoTls).await.is_err(),
        "the superuser needs its password on loopback"
    );

    assert!(!first.adopted(), "the first start started the server");
    let adopted = start(data_dir, "second start").await;
    assert_eq!(adopted.port(), first_port, "a second start must adopt the running server");
    assert!(adopted.adopted());
    adopted.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
    assert!(
        tokio_postgres::connect(&first_url, NoTls).await.is_err(),
        "the server still accepts connections after stop"
    );
    let first = running.take().expect("the first handle");
    first.stop().await.unwrap_or_else(|e| panic!("stopping a stopped cluster: {e}"));

    write_stale_pid_file(data_dir, first_port);
    let restarted = running.insert(start(data_dir, "restart").await);
    assert_eq!(select_one(&restarted.url("postgres")).await, 1);
    let restarted = running.take().expect("the restarted handle");
    restarted.stop().await.unwrap_or_else(|e| panic!("final stop: {e}"));
}

async fn start(data_dir: &Path, what: &str) -> EmbeddedPostgres {
    let options = EmbeddedOptions { data_dir: data_dir.to_path_buf(), bin_dir: None, port: None, settings: Vec::new() };
    EmbeddedPostgres::start(options).await.unwrap_or_else(|e| panic!("{what}: {e}"))
}

async fn select_one(url: &str) -> i32 {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connecting to the cluster");
    let connection = tokio::spawn(connection);
    let one = client.query_one("SELECT 1", &[]).await.expect("SELECT 1").get(0);
    drop(client);
    connection.await.expect("the connection task").expect("the connection");
    one
}

/// Leaves a postmaster.pid as a crashed server would: naming a process that no longer exists.
fn write_stale_pid_file(data_dir: &Path, port: u16) {
    let mut exited = std::process::Command::new("true").spawn().expect("spawning `true`");
    let dead_pid = exited.id();
    exited.wait().expect("waiting for `true`");
    let dir = data_dir.display();
    let contents = format!("{dead_pid}\n{dir}\n1700000000\n{port}\n{dir}\n127.0.0.1\n  0  0\nready   \n");
    std::fs::write(data_dir.join("postmaster.pid"), contents).expect("writing a stale postmaster.pid");
}
