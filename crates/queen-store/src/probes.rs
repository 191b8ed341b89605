//! What the broker's probes ask of PostgreSQL: that it answers, and whether it takes writes.
//! Their errors are tokio-postgres's own: a probe that fails is an answer, not a failure of the
//! broker's work, and is not counted with those ([`crate::failure_counts`]).

use tokio_postgres::{Client, Error};

/// One round trip that touches nothing.
pub async fn ping(client: &Client) -> Result<(), Error> {
    client.simple_query("SELECT 1").await?;
    Ok(())
}

/// Whether a new transaction of this session is read-only (`default_transaction_read_only` on,
/// or a hot standby), so that no write can succeed.
pub async fn transactions_read_only(client: &Client) -> Result<bool, Error> {
    let row = client.query_one("SELECT current_setting('transaction_read_only') = 'on'", &[]).await?;
    Ok(row.get(0))
}
