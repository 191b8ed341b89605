//! The LISTEN connection's keeper: connects, feeds the coordinator every fleet event, and when
//! the connection is lost tells the coordinator (which stops trusting what it knew) and
//! reconnects with a backoff.

use std::time::Duration;

use actix::Addr;
use queen_store::Pool;
use queen_store::listen::{listen, recently_pushed};

use crate::actors::coordinator::{Coordinator, ListenLost, ListenRestored, Notice};

const FIRST_RETRY: Duration = Duration::from_millis(100);
const LAST_RETRY: Duration = Duration::from_secs(5);

/// Runs until the broker stops.
pub async fn keep_listening(pg: tokio_postgres::Config, pool: Pool, coordinator: Addr<Coordinator>, hot_seconds: f64) {
    let mut retry = FIRST_RETRY;
    loop {
        match listen(&pg).await {
            Ok(mut listening) => {
                retry = FIRST_RETRY;
                // Read after LISTEN took effect: a push either shows here or arrives as a notice.
                let recent = match pool.get().await {
                    Ok(client) => recently_pushed(&client, hot_seconds).await.unwrap_or_default(),
                    Err(_) => Vec::new(),
                };
                coordinator.do_send(ListenRestored { recent });
                while let Some(event) = listening.events.recv().await {
                    coordinator.do_send(Notice(event));
                }
                tracing::warn!("lost the LISTEN connection; reconnecting");
                coordinator.do_send(ListenLost);
            }
            Err(e) => tracing::warn!(error = %e, "cannot open the LISTEN connection; retrying"),
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(LAST_RETRY);
    }
}
