//! The LISTEN connection's keeper: connects, feeds the coordinator every fleet event, and when
//! the connection is lost tells the coordinator (which stops trusting what it knew) and
//! reconnects with a backoff.

use std::time::Duration;

use actix::Addr;
use queen_store::listen::listen;

use crate::actors::coordinator::{Coordinator, ListenLost, ListenRestored, Notice};

const FIRST_RETRY: Duration = Duration::from_millis(100);
const LAST_RETRY: Duration = Duration::from_secs(5);

/// Runs until the broker stops.
pub async fn keep_listening(pg: tokio_postgres::Config, coordinator: Addr<Coordinator>) {
    let mut retry = FIRST_RETRY;
    loop {
        match listen(&pg).await {
            Ok(mut listening) => {
                retry = FIRST_RETRY;
                // Sent once LISTEN took effect: a push after it arrives as a notice, one before it
                // is found by the scans that follow (the coordinator drops every view).
                coordinator.do_send(ListenRestored);
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
