//! The TCP connection a request came on (under TLS, over HTTPS), as far as a pop needs it:
//! whether its client is still there.
//!
//! actix reads a client's end but keeps the request's handler (it allows half-closed connections)
//! until it writes the answer; so a client that went away would leave its poll parked, and the
//! next push would be claimed for it and leased to nobody until the lease ran out (a failed
//! delivery, on top). A parked pop therefore looks at its connection now and then and before it
//! claims anything, and every pop looks again once it has claimed: what was claimed for a client
//! that left meanwhile is given back.

use std::any::Any;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use actix_tls::accept::rustls_0_23::TlsStream;
use actix_web::dev::Extensions;
use actix_web::rt::net::TcpStream;
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, recv};

/// How often a parked long poll looks at its connection.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// A connection's socket (under its TLS layer, over HTTPS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientConnection(RawFd);

impl ClientConnection {
    /// Whether the client closed its end (or the connection broke). A peek that neither waits nor
    /// consumes: the end of the stream reads as zero bytes; a pipelined request's bytes, or
    /// nothing yet, mean the client is still there. Over HTTPS a leaving client's close_notify
    /// alert comes just before its end: actix reads a connection's bytes as they arrive (that is
    /// how it takes pipelined requests), through the TLS layer, so the alert is off the socket and
    /// the peek finds the end. A client that shut down only its sending half while it waits
    /// (which HTTP clients do not do) counts as gone.
    pub fn is_closed(self) -> bool {
        let mut byte = [0u8; 1];
        match recv(self.0, &mut byte, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(e, Errno::ECONNRESET | Errno::ENOTCONN | Errno::EPIPE | Errno::ETIMEDOUT),
        }
    }

    /// Resolves once the client is gone; never when `connection` is unknown.
    pub async fn closed(connection: Option<ClientConnection>) {
        let Some(connection) = connection else { return std::future::pending().await };
        let mut checks = tokio::time::interval(CHECK_EVERY);
        checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            checks.tick().await;
            if connection.is_closed() {
                return;
            }
        }
    }
}

/// The server's `on_connect` hook: keeps the connection's socket with the connection. The
/// descriptor stays open for as long as any of the connection's requests is being handled, since
/// actix closes it only after dropping them.
pub fn remember(connection: &dyn Any, data: &mut Extensions) {
    let socket = match (connection.downcast_ref::<TcpStream>(), connection.downcast_ref::<TlsStream<TcpStream>>()) {
        (Some(plain), _) => plain.as_raw_fd(),
        (None, Some(tls)) => tls.get_ref().0.as_raw_fd(),
        (None, None) => return,
    };
    data.insert(ClientConnection(socket));
}
