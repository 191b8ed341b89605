//! A broker in the test's own process: what the API, client and command-line tests talk to.

use queen_broker::config::Config;
use queen_broker::startup::Application;

use crate::{TestDatabase, target_dir};

/// Starts a broker on `db` inside the current actix system, as tests want one (loopback, a port
/// of its own, two workers, a small pool, a push journal directory of its own), then as `tweak`
/// says; its base URL. It serves until the test's runtime ends.
pub async fn serve(db: &TestDatabase, tweak: impl FnOnce(&mut Config)) -> String {
    let app = Application::build(config(db, tweak)).await.expect("the broker starts");
    let base = format!("http://127.0.0.1:{}", app.port());
    let hears_fleet = app.hears_fleet();
    actix_web::rt::spawn(app.run_until_stopped());
    // Tests count wake-ups and plans, which a broker without LISTEN yet adds to.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !hears_fleet.load(std::sync::atomic::Ordering::Relaxed) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    base
}

/// The configuration [`serve`] starts a broker with: loopback, a port of its own, two workers, a
/// small pool, a push journal directory of its own, then as `tweak` says.
pub fn config(db: &TestDatabase, tweak: impl FnOnce(&mut Config)) -> Config {
    let mut config = Config::default();
    config.http.host = "127.0.0.1".into();
    config.http.port = 0;
    config.http.workers = 2;
    config.database.url = Some(db.url().to_owned());
    config.database.pool_size = 8;
    // Created only if the test buffers pushes.
    config.buffer.dir = target_dir().join("test-buffers").join(uuid::Uuid::new_v4().simple().to_string());
    tweak(&mut config);
    config
}
