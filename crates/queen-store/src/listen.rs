//! The LISTEN connection: a dedicated connection (not from the pool) that receives the fleet's
//! events.

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use crate::StoreError;
use crate::events::{CHANNEL, Event};
use crate::tls::PgTarget;

/// `application_name` of the LISTEN connection, so operators (and tests) can find it.
pub const LISTEN_APPLICATION_NAME: &str = "queen-listen";

/// A live LISTEN connection. Events arrive on `events`, which ends when the connection is lost;
/// dropping the value closes the connection.
pub struct Listening {
    _client: tokio_postgres::Client,
    pub events: mpsc::UnboundedReceiver<Notice>,
}

/// An event, and the backend process of the session that sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub sender_pid: i32,
    pub event: Event,
}

/// Connects (over `target`'s TLS, as the pool does) and listens on [`CHANNEL`]. The connection
/// task runs on the current runtime.
pub async fn listen(target: &PgTarget) -> Result<Listening, StoreError> {
    let mut pg = target.config.clone();
    pg.application_name(LISTEN_APPLICATION_NAME);
    let connecting = crate::connect::connect(&pg, &target.tls);
    // Bounded as the pool's connections are: a host that accepts and never answers would
    // otherwise hold the attempt for good.
    let (client, mut connection) = match pg.get_connect_timeout() {
        Some(&bound) => {
            let whole = crate::connect::whole_attempt(bound, &pg);
            tokio::time::timeout(whole, connecting)
                .await
                .map_err(|_| StoreError::Unavailable(format!("no host answered within {} ms", whole.as_millis())))??
        }
        None => connecting.await?,
    };
    let (sender, events) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(notice)) => {
                    if let Some(event) = Event::decode(notice.payload()) {
                        if sender.send(Notice { sender_pid: notice.process_id(), event }).is_err() {
                            break;
                        }
                    } else {
                        tracing::debug!(payload = notice.payload(), "ignoring an event this broker does not know");
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the LISTEN connection failed");
                    break;
                }
            }
        }
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    Ok(Listening { _client: client, events })
}
