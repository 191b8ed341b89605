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
