//! What the chaos tests share.

use std::path::Path;
use std::time::Duration;

use queen_testkit::BrokerProcess;
use tokio_postgres::Client;

/// The broker binary cargo built for these tests.
pub fn queen_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// Starts `count` brokers on the database at `url`, each with the settings in `envs`.
pub async fn start_brokers(url: &str, count: usize, envs: &[(&str, &str)]) -> Vec<BrokerProcess> {
    let mut brokers = Vec::with_capacity(count);
    for _ in 0..count {
        brokers.push(BrokerProcess::start(queen_binary(), &["--database-url", url], envs).await);
    }
    brokers
}

/// Fails the test, with its log, if any of `brokers` has exited.
pub async fn assert_running(brokers: &mut [BrokerProcess]) {
    for (b, broker) in brokers.iter_mut().enumerate() {
        assert!(broker.wait(Duration::ZERO).await.is_none(), "broker {b} exited:\n{}", broker.log().join("\n"));
    }
}

/// The brokers' LISTEN backends on the database of `sql`, by process id, with whether each is
/// listening (idle after its `LISTEN`).
pub async fn listen_backends(sql: &Client) -> Vec<(i32, bool)> {
    sql.query(
        "SELECT pid, state = 'idle' AND query LIKE 'LISTEN%' FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = 'queen-listen' ORDER BY pid",
        &[],
    )
    .await
    .expect("pg_stat_activity")
    .iter()
    .map(|row| (row.get(0), row.get(1)))
    .collect()
}
