//! The harness against a real server: databases are distinct, isolated and really dropped.

use queen_testkit::{TestDatabase, shared_cluster_url};
use tokio_postgres::{Client, NoTls};

#[tokio::test]
async fn test_databases_are_distinct_and_isolated() {
    let a = TestDatabase::create("harness isolation").await;
    let b = TestDatabase::create("harness isolation").await;
    assert_ne!(a.name(), b.name());
    assert!(a.name().starts_with("queen_test_harness_isolation_"), "{}", a.name());
    assert!(a.url().ends_with(&format!("/{}", a.name())), "{}", a.url());

    let (in_a, in_b) = (a.connect().await, b.connect().await);
    assert_eq!(current_database(&in_a).await, a.name());
    assert_eq!(current_database(&in_b).await, b.name());
    in_a.batch_execute("CREATE TABLE only_in_a (id int)").await.expect("creating a table");
    assert!(table_exists(&in_a, "only_in_a").await);
    assert!(!table_exists(&in_b, "only_in_a").await, "a table created in one database shows in another");

    a.drop_database().await;
    b.drop_database().await;
}

#[tokio::test]
async fn dropped_test_databases_are_gone() {
    let admin = connect(&shared_cluster_url().await).await;

    let explicit = TestDatabase::create("harness explicit drop").await;
    let name = explicit.name().to_owned();
    assert!(database_exists(&admin, &name).await);
    // An open session must not keep the database alive.
    let _session = explicit.connect().await;
    explicit.drop_database().await;
    assert!(!database_exists(&admin, &name).await, "{name} survived drop_database");

    let implicit = TestDatabase::create("harness implicit drop").await;
    let name = implicit.name().to_owned();
    let _session = implicit.connect().await;
    drop(implicit);
    assert!(!database_exists(&admin, &name).await, "{name} survived Drop");
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connecting to the test cluster");
    tokio::spawn(connection);
    client
}

async fn current_database(client: &Client) -> String {
    client.query_one("SELECT current_database()::text", &[]).await.expect("current_database()").get(0)
}

async fn table_exists(client: &Client, table: &str) -> bool {
    let row = client.query_one("SELECT to_regclass($1) IS NOT NULL", &[&table]).await.expect("to_regclass");
    row.get(0)
}

async fn database_exists(admin: &Client, name: &str) -> bool {
    let row = admin
        .query_one("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", &[&name])
        .await
        .expect("querying pg_database");
    row.get(0)
}
