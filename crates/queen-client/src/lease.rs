//! Leases: [`Client::extend_lease`] and automatic renewal with [`LeaseGuard`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use uuid::Uuid;

use crate::transport::Request;
use crate::{Client, Error};

/// The answer to a lease extension.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct LeaseExtension {
    /// The lease.
    pub lease_id: Uuid,
    /// Whether it was extended. `false` when it had already expired or been released: the
    /// messages it covered are, or will be, delivered again.
    pub success: bool,
    /// How many partitions it covers that were extended.
    #[serde(default)]
    pub renewed: u64,
    /// When it now expires.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    /// Why it was not extended.
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Serialize)]
struct ExtendBody {
    seconds: u32,
}

/// The shortest wait given one renewal attempt, however short the renewal period.
const MIN_RENEWAL_WAIT: Duration = Duration::from_secs(1);

impl Client {
    /// Extends a live lease on every partition it covers, to `seconds` from now (the queue's
    /// `leaseTime`, at least 60 s, when `None`); never shortens it. An expired or released lease answers
    /// `success: false`; a lease the broker never granted is [`Error::Status`] 404.
    pub async fn extend_lease(&self, lease_id: Uuid, seconds: Option<u32>) -> Result<LeaseExtension, Error> {
        self.extend_lease_within(lease_id, seconds, None).await
    }

    /// [`Client::extend_lease`], each attempt given `within` (the client's timeout when `None`).
    async fn extend_lease_within(
        &self,
        lease_id: Uuid,
        seconds: Option<u32>,
        within: Option<Duration>,
    ) -> Result<LeaseExtension, Error> {
        let mut request = Request::post(format!("/api/v1/lease/{lease_id}/extend"));
        if let Some(seconds) = seconds {
            if seconds == 0 {
                return Err(Error::InvalidArgument("a lease is extended by at least 1 second".into()));
            }
            request = request.json(&ExtendBody { seconds })?;
        }
        if let Some(within) = within {
            request = request.timeout(within);
        }
        self.call(request).await
    }

    /// Keeps a lease alive until the guard is stopped or dropped: every third of `lease_time` a
    /// background task extends it to `lease_time` from then, so it never comes closer than two
    /// thirds of its time to expiring while the guard lives.
    ///
    /// Give the lease time the lease was granted with (the pop's `leaseSeconds`, or the queue's
    /// `leaseTime`). The guard reports a lease it could not keep ([`LeaseGuard::is_lost`],
    /// [`LeaseGuard::lost`]): refused as expired or released, unknown, or not extended before it
    /// ran out because the brokers could not be reached. Acknowledgements under a lost lease are
    /// refused and its messages are delivered again.
    ///
    /// ```no_run
    /// # async fn example(client: queen_client::Client) -> Result<(), queen_client::Error> {
    /// use std::time::Duration;
    /// use queen_client::{Ack, Pop};
    ///
    /// let lease_time = Duration::from_secs(30);
    /// let delivery = client.pop(&Pop::queue("videos").lease_seconds(30)).await?;
    /// if let Some(lease) = delivery.lease_id {
    ///     let guard = client.keep_lease(lease, lease_time);
    ///     // ... work on the messages for as long as it takes ...
    ///     let state = guard.stop().await;
    ///     assert!(!state.is_lost());
    ///     client.ack_messages(&delivery.messages, queen_client::AckStatus::Completed).await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn keep_lease(&self, lease_id: Uuid, lease_time: Duration) -> LeaseGuard {
        let seconds = lease_time.as_secs_f64().ceil().max(1.0) as u32;
        self.keep_lease_every(lease_id, lease_time / 3, Some(seconds))
    }

    /// Keeps a lease alive by extending it every `every` by `seconds` (the queue's `leaseTime`,
    /// at least 60 s, when `None`), until the guard is stopped or dropped. See
    /// [`Client::keep_lease`].
    pub fn keep_lease_every(&self, lease_id: Uuid, every: Duration, seconds: Option<u32>) -> LeaseGuard {
        let every = every.max(Duration::from_millis(10));
        let (state_tx, state_rx) = watch::channel(RenewalState::Renewing { renewals: 0, expires_at: None });
        let (stop_tx, stop_rx) = oneshot::channel();
        // Until the first answer says when it expires, the lease is assumed to last three periods.
        let assumed = seconds.map_or(every * 3, |s| Duration::from_secs(u64::from(s)));
        let task = tokio::spawn(renew(self.clone(), lease_id, every, seconds, assumed, state_tx, stop_rx));
        LeaseGuard { lease_id, state: state_rx, stop: Some(stop_tx), task: Some(task) }
    }
}

async fn renew(
    client: Client,
    lease_id: Uuid,
    every: Duration,
    seconds: Option<u32>,
    assumed: Duration,
    state: watch::Sender<RenewalState>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut renewals = 0u64;
    let mut deadline = Instant::now() + assumed;
    let mut ticker = tokio::time::interval_at(Instant::now() + every, every);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let lost = |renewals, reason: String| RenewalState::Lost { renewals, reason };
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = ticker.tick() => {}
        }
        // Each attempt is given one renewal period, not the client's timeout (as long as a
        // lease, by default): a broker that stalls is failed over from while the lease still holds.
        let result = tokio::select! {
            _ = &mut stop => break,
            result = client.extend_lease_within(lease_id, seconds, Some(every.max(MIN_RENEWAL_WAIT))) => result,
        };
        match result {
            Ok(extension) if extension.success => {
                renewals += 1;
                let granted = match (extension.expires_at, seconds) {
                    (Some(at), _) => (at - Utc::now()).to_std().unwrap_or_default(),
                    (None, Some(s)) => Duration::from_secs(u64::from(s)),
                    (None, None) => assumed,
                };
                deadline = Instant::now() + granted;
                state.send_replace(RenewalState::Renewing { renewals, expires_at: extension.expires_at });
            }
            Ok(extension) => {
                let reason = extension.error.unwrap_or_else(|| "the lease could not be extended".into());
                state.send_replace(lost(renewals, reason));
                return;
            }
            Err(error) if error.is_not_found() => {
                state.send_replace(lost(renewals, format!("the broker does not know the lease: {error}")));
                return;
            }
            Err(error) if Instant::now() >= deadline => {
                state.send_replace(lost(renewals, format!("the lease ran out before it could be extended: {error}")));
                return;
            }
            Err(error) => tracing::warn!(%lease_id, %error, "queen-client: a lease renewal failed; trying again"),
        }
    }
    state.send_replace(RenewalState::Stopped { renewals });
}

/// What a [`LeaseGuard`] has come to. Serialized with its name as `state`:
/// `{"state": "renewing", "renewals": 2, "expiresAt": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "camelCase", rename_all_fields = "camelCase")]
#[non_exhaustive]
pub enum RenewalState {
    /// Renewing; the lease is live as far as the guard knows.
    Renewing {
        /// Extensions so far.
        renewals: u64,
        /// When the lease expires, after the last extension.
        expires_at: Option<DateTime<Utc>>,
    },
    /// The lease could not be kept; the guard stopped renewing.
    Lost {
        /// Extensions before it was lost.
        renewals: u64,
        /// Why.
        reason: String,
    },
    /// Stopped by its owner with the lease kept.
    Stopped {
        /// Extensions made.
        renewals: u64,
    },
}

impl RenewalState {
    /// Whether the lease was lost.
    pub fn is_lost(&self) -> bool {
        matches!(self, RenewalState::Lost { .. })
    }

    /// How many extensions were made.
    pub fn renewals(&self) -> u64 {
        match self {
            RenewalState::Renewing { renewals, .. }
            | RenewalState::Lost { renewals, .. }
            | RenewalState::Stopped { renewals } => *renewals,
        }
    }
}

/// Keeps a lease alive from a background task until stopped or dropped; made by
/// [`Client::keep_lease`].
#[derive(Debug)]
#[must_use = "the lease is renewed only while the guard lives"]
pub struct LeaseGuard {
    lease_id: Uuid,
    state: watch::Receiver<RenewalState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl LeaseGuard {
    /// The lease kept.
    pub fn lease_id(&self) -> Uuid {
        self.lease_id
    }

    /// Where renewal stands.
    pub fn state(&self) -> RenewalState {
        self.state.borrow().clone()
    }

    /// Whether the lease was lost.
    pub fn is_lost(&self) -> bool {
        self.state.borrow().is_lost()
    }

    /// How many extensions were made so far.
    pub fn renewals(&self) -> u64 {
        self.state.borrow().renewals()
    }

    /// Resolves when the lease is lost, with the reason; `None` if renewal ends otherwise. Lets
    /// work give up as soon as its messages are going to be delivered again.
    pub async fn lost(&self) -> Option<String> {
        let mut state = self.state.clone();
        let ended = state.wait_for(|s| !matches!(s, RenewalState::Renewing { .. })).await.ok()?;
        match &*ended {
            RenewalState::Lost { reason, .. } => Some(reason.clone()),
            _ => None,
        }
    }

    /// Stops renewing (the lease stays until it expires or is acknowledged); the final state.
    pub async fn stop(mut self) -> RenewalState {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.state()
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
