//! The client, its builder and its retry policy.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::Url;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use rustls_pki_types::CertificateDer;

use crate::Error;
use crate::tls;

/// How long a call may take unless the builder says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long making a connection may take: a broker that does not answer at all is given up for
/// the next one sooner than a slow call would be.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How much longer than its own `timeout` a long poll is waited for: the broker answers a long
/// poll at its timeout, and the answer needs time to arrive.
const DEFAULT_LONG_POLL_SLACK: Duration = Duration::from_secs(5);
/// How long an idle connection is kept for reuse: under the broker's keep-alive (75 s by default)
/// and the idle timeouts of the balancers commonly put in front of it (60 s), so that this end
/// closes an idle connection before the far end does.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How far a call is retried when a broker does not answer or answers that it cannot serve now.
///
/// Each call makes at most [`max_attempts`](RetryPolicy::max_attempts) attempts, and at least one
/// per broker URL. A failed attempt goes to the next URL at once; once every URL has failed in
/// turn, the client waits (the broker's `Retry-After` when it gave one, else an exponential
/// backoff from [`initial_backoff`](RetryPolicy::initial_backoff), both at most
/// [`max_backoff`](RetryPolicy::max_backoff)) and starts again. See the crate documentation for
/// which failures are retried, and for which calls.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts per call, the first included (at least 1; raised to the number of URLs).
    pub max_attempts: u32,
    /// The wait after the first round of failed attempts; doubled after each further round.
    pub initial_backoff: Duration,
    /// The longest wait between attempts, `Retry-After` included.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// Five attempts, waits of 200 ms doubling up to 5 s: about 3 s of retrying with one broker
    /// URL, enough to ride out a broker that is being replaced.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// No retries: one attempt per URL (so failover still happens with several URLs), no waits.
    pub fn no_retries() -> Self {
        RetryPolicy { max_attempts: 1, initial_backoff: Duration::ZERO, max_backoff: Duration::ZERO }
    }

    /// The same policy with `attempts` attempts per call.
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The same policy with these waits.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max.max(initial);
        self
    }
}

/// Builds a [`Client`]: broker URLs, bearer token, timeouts, retries and TLS trust.
///
/// ```
/// use std::time::Duration;
///
/// let client = queen_client::Client::builder()
///     .url("http://queen-a:6632")
///     .url("http://queen-b:6632")
///     .token("my-api-token")
///     .timeout(Duration::from_secs(10))
///     .build()?;
/// assert_eq!(client.urls().len(), 2);
/// # Ok::<(), queen_client::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ClientBuilder {
    urls: Vec<String>,
    token: Option<String>,
    timeout: Duration,
    connect_timeout: Duration,
    long_poll_slack: Duration,
    idle_timeout: Duration,
    retry: RetryPolicy,
    ca_certificates: Vec<CertificateDer<'static>>,
    native_roots: bool,
    /// An error found while configuring, reported by [`ClientBuilder::build`].
    deferred: Option<String>,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            urls: Vec::new(),
            token: None,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            long_poll_slack: DEFAULT_LONG_POLL_SLACK,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            retry: RetryPolicy::default(),
            ca_certificates: Vec::new(),
            native_roots: true,
            deferred: None,
        }
    }
}

impl ClientBuilder {
    /// Adds a broker URL, `http://host:port` or `https://host:port` (a path prefix is kept, for
    /// a broker behind a proxy that serves it under one). With several URLs, calls fail over
    /// from one to the next in the order given.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.urls.push(url.into());
        self
    }

    /// Adds several broker URLs.
    pub fn urls<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.urls.extend(urls.into_iter().map(Into::into));
        self
    }

    /// Sends `Authorization: Bearer <token>` with every request (a JWT or a static API token).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// How long any call may take (default 30 s), per attempt. Long polls get their own
    /// `timeout` plus [`long_poll_slack`](ClientBuilder::long_poll_slack) instead.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long making a connection may take (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How much longer than its own timeout a long poll is waited for (default 5 s).
    pub fn long_poll_slack(mut self, slack: Duration) -> Self {
        self.long_poll_slack = slack;
        self
    }

    /// How long a connection that carries no call is kept for the next one (default 30 s). Keep it
    /// under the idle timeout of whatever is at the far end, the broker (`http.keep_alive_seconds`,
    /// 75 s by default) or a balancer in front of it: a call sent on a connection the far end has
    /// just closed, or silently forgotten, fails.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// How calls are retried (default [`RetryPolicy::default`]).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Trusts the CA certificate(s) in `pem` for HTTPS brokers, in addition to the platform's
    /// roots: for brokers whose certificates come from a CA of their own.
    pub fn ca_certificate_pem(mut self, pem: impl AsRef<[u8]>) -> Self {
        match tls::certificates_from_pem(pem.as_ref()) {
            Ok(certs) => self.ca_certificates.extend(certs),
            Err(e) => self.deferred = Some(e.to_string()),
        }
        self
    }

    /// Whether to trust the platform's root certificates (default `true`). Turn it off to trust
    /// only the certificates given to [`ca_certificate_pem`](ClientBuilder::ca_certificate_pem).
    pub fn native_roots(mut self, trust: bool) -> Self {
        self.native_roots = trust;
        self
    }

    /// The client; fails on a bad URL or CA certificate, or without any URL.
    pub fn build(self) -> Result<Client, Error> {
        if let Some(problem) = self.deferred {
            return Err(Error::Config(problem));
        }
        if self.urls.is_empty() {
            return Err(Error::Config("no broker URL given".into()));
        }
        let bases = self.urls.iter().map(|url| parse_base(url)).collect::<Result<Vec<_>, _>>()?;
        let https = bases.iter().any(|base| base.starts_with("https:"));
        // The platform's roots are read only when some broker is reached over HTTPS.
        let tls = tls::client_config(&self.ca_certificates, self.native_roots && https)?;
        let mut headers = HeaderMap::new();
        if let Some(token) = &self.token {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| Error::Config("the token is not a valid HTTP header value".into()))?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .connect_timeout(self.connect_timeout)
            .pool_idle_timeout(self.idle_timeout)
            .tcp_nodelay(true)
            .default_headers(headers)
            .user_agent(concat!("queen-client/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
        let retry = RetryPolicy { max_attempts: self.retry.max_attempts.max(1), ..self.retry };
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                bases,
                current: AtomicUsize::new(0),
                timeout: self.timeout,
                long_poll_slack: self.long_poll_slack,
                retry,
            }),
        })
    }
}

/// A broker URL as a base that paths are appended to: `http(s)` only, no credentials, no query or
/// fragment, the trailing `/` dropped.
fn parse_base(url: &str) -> Result<String, Error> {
    let mut parsed = Url::parse(url).map_err(|e| Error::Config(format!("a broker URL is not a URL: {e}")))?;
    // Refused before the URL is shown anywhere: errors, logs and `queenctl status` name it. The
    // broker takes a bearer token, never a user name and password.
    if !parsed.username().is_empty() || parsed.password().is_some() {
        let _ = parsed.set_username("");
        let _ = parsed.set_password(None);
        return Err(Error::Config(format!(
            "the broker URL {:?} carries a user name or password; the broker takes a bearer token instead",
            parsed.as_str()
        )));
    }
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(Error::Config(format!("{url:?} is not an http:// or https:// URL")));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(Error::Config(format!("{url:?}: a broker URL has no query or fragment")));
    }
    Ok(parsed.as_str().trim_end_matches('/').to_owned())
}

/// A client of one broker, or of a fleet of brokers with failover between them.
///
/// Cheap to clone: clones share one connection pool and one notion of which broker is in use.
/// Every call is `async` and needs a Tokio runtime.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) http: reqwest::Client,
    pub(crate) bases: Vec<String>,
    /// The URL calls start at: the last one that answered.
    pub(crate) current: AtomicUsize,
    pub(crate) timeout: Duration,
    pub(crate) long_poll_slack: Duration,
    pub(crate) retry: RetryPolicy,
}

impl Client {
    /// A builder.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// A client of the broker at `url` with every default.
    ///
    /// ```
    /// let client = queen_client::Client::new("http://localhost:6632")?;
    /// # Ok::<(), queen_client::Error>(())
    /// ```
    pub fn new(url: impl Into<String>) -> Result<Client, Error> {
        Client::builder().url(url).build()
    }

    /// The broker URLs, in failover order.
    pub fn urls(&self) -> Vec<String> {
        self.inner.bases.clone()
    }

    /// The URL calls go to first: the broker that answered last.
    pub fn current_url(&self) -> String {
        let index = self.inner.current.load(Ordering::Relaxed) % self.inner.bases.len();
        self.inner.bases[index].clone()
    }

    /// The timeout of calls that are not long polls.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_checked_and_trimmed() {
        assert_eq!(parse_base("http://h:6632/").unwrap(), "http://h:6632");
        assert_eq!(parse_base("https://h/queen/").unwrap(), "https://h/queen");
        assert!(parse_base("ftp://h").is_err());
        assert!(parse_base("h:6632").is_err());
        assert!(parse_base("http://h/?x=1").is_err());
        let credentials = parse_base("https://ops:secret@h:6632").unwrap_err().to_string();
        assert!(credentials.contains("\"https://h:6632/\" carries a user name or password"), "{credentials}");
        assert!(!credentials.contains("secret") && !credentials.contains("ops"), "{credentials}");
        assert!(!parse_base("not a url, secret").unwrap_err().to_string().contains("secret"));
    }

    #[test]
    fn a_client_needs_a_url_and_a_valid_ca() {
        assert!(matches!(Client::builder().build(), Err(Error::Config(_))));
        let bad_ca = Client::builder().url("https://h").ca_certificate_pem("nonsense").build();
        assert!(matches!(bad_ca, Err(Error::Config(_))));
        let client = Client::builder().urls(["http://a", "http://b/"]).build().unwrap();
        assert_eq!(client.urls(), vec!["http://a", "http://b"]);
    }
}
