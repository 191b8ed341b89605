//! The schema the broker stands on.

use crate::helpers::TestApp;

#[actix_web::test]
async fn start_up_applies_every_migration_and_a_rerun_applies_none() {
    let app = TestApp::spawn().await;
    let latest = queen_store::migrations::latest_version();
    assert_eq!(app.count("SELECT count(*) FROM queen.schema_migrations").await, i64::from(latest));
    let mut client = app.db.connect().await;
    let report = queen_store::migrations::migrate(&mut client).await.expect("a rerun succeeds");
    assert!(report.applied.is_empty());
    assert_eq!(report.current, latest);
}

/// A database in another encoding than UTF-8 would refuse names and ids it cannot represent at
/// write time; start-up refuses it instead, saying why, and leaves it untouched.
#[actix_web::test]
async fn a_database_not_in_utf8_is_refused_at_start_up_and_left_untouched() {
    let options = "ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0";
    let db = queen_testkit::TestDatabase::create_with("latin1", options).await;
    let config = queen_testkit::in_process::config(&db, |_| {});
    let error = match queen_broker::startup::Application::build(config).await {
        Ok(_) => panic!("the broker started on a LATIN1 database"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("encoding is LATIN1") && error.contains("UTF8"), "{error}");
    let schemas = db.connect().await.query_one("SELECT count(*) FROM pg_namespace WHERE nspname = 'queen'", &[]).await;
    assert_eq!(schemas.expect("the count").get::<_, i64>(0), 0, "nothing was created");
}

#[actix_web::test]
async fn segment_bodies_are_stored_without_a_second_compression() {
    let app = TestApp::spawn().await;
    let storage: String = app
        .db
        .connect()
        .await
        .query_one(
            "SELECT attstorage::text FROM pg_attribute
              WHERE attrelid = 'queen.log_segments'::regclass AND attname = 'body'",
            &[],
        )
        .await
        .expect("the column exists")
        .get(0);
    assert_eq!(storage, "e", "EXTERNAL storage: out of line, not compressed again");
}
