//! Sending a request: failover between broker URLs, `Retry-After`, bounded attempts, and reading
//! the answer into JSON or an [`Error`].

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::ErrorBody;
use crate::{Client, Error};

/// Every byte but the unreserved ones is escaped in a path segment, `/` included, so a name
/// always stays one segment (the broker decodes them).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// A name as one path segment.
pub(crate) fn seg(name: &str) -> impl std::fmt::Display + '_ {
    utf8_percent_encode(name, SEGMENT)
}

/// Whether a request may be sent again after an attempt whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replay {
    /// Sending it twice is harmless: reads, and writes the broker makes idempotent (pushes by
    /// their transaction ids, acks as cursor commits, extensions, seeks, settings).
    Always,
    /// Sent again only when the first attempt certainly did nothing: the connection could not be
    /// made, or the broker refused it as overloaded before doing anything.
    IfUnapplied,
}

/// One API request, ready to be sent to whichever broker.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    method: Method,
    /// Path and query, already encoded, starting with `/`.
    path: String,
    query: Vec<(&'static str, String)>,
    body: Option<Bytes>,
    content_type: &'static str,
    timeout: Option<Duration>,
    replay: Replay,
    /// One attempt per URL and no waiting (probes).
    one_round: bool,
}

impl Request {
    pub(crate) fn new(method: Method, path: String) -> Request {
        Request {
            method,
            path,
            query: Vec::new(),
            body: None,
            content_type: "application/json",
            timeout: None,
            replay: Replay::Always,
            one_round: false,
        }
    }

    pub(crate) fn get(path: String) -> Request {
        Request::new(Method::GET, path)
    }

    pub(crate) fn post(path: String) -> Request {
        Request::new(Method::POST, path)
    }

    pub(crate) fn delete(path: String) -> Request {
        Request::new(Method::DELETE, path)
    }

    /// A JSON body, encoded once: every attempt sends the same bytes.
    pub(crate) fn json(mut self, body: &impl Serialize) -> Result<Request, Error> {
        let bytes = serde_json::to_vec(body)
            .map_err(|e| Error::InvalidArgument(format!("the request body cannot be encoded as JSON: {e}")))?;
        self.body = Some(Bytes::from(bytes));
        Ok(self)
    }

    /// A body of another content type, sent as it is by every attempt.
    pub(crate) fn bytes(mut self, body: Vec<u8>, content_type: &'static str) -> Request {
        self.body = Some(Bytes::from(body));
        self.content_type = content_type;
        self
    }

    pub(crate) fn query(mut self, key: &'static str, value: impl ToString) -> Request {
        self.query.push((key, value.to_string()));
        self
    }

    pub(crate) fn query_opt(self, key: &'static str, value: Option<impl ToString>) -> Request {
        match value {
            Some(value) => self.query(key, value),
            None => self,
        }
    }

    pub(crate) fn timeout(mut self, timeout: Duration) -> Request {
        self.timeout = Some(timeout);
        self
    }

    pub(crate) fn replay(mut self, replay: Replay) -> Request {
        self.replay = replay;
        self
    }

    pub(crate) fn one_round(mut self) -> Request {
        self.one_round = true;
        self
    }

    fn url(&self, base: &str) -> Result<Url, Error> {
        let text = format!("{base}{}", self.path);
        let mut url = Url::parse(&text).map_err(|e| Error::InvalidArgument(format!("{text:?} is not a URL: {e}")))?;
        if !self.query.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (key, value) in &self.query {
                pairs.append_pair(key, value);
            }
        }
        Ok(url)
    }
}

/// A broker's answer, read whole.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) body: Bytes,
    pub(crate) url: String,
    retry_after: Option<Duration>,
    request_id: Option<String>,
    is_json: bool,
}

impl Answer {
    /// The answer when its status is a success, else the error it states.
    pub(crate) fn success(self) -> Result<Answer, Error> {
        if self.status.is_success() { Ok(self) } else { Err(self.into_error()) }
    }

    /// The body as `T`.
    pub(crate) fn json<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(|e| Error::Decode {
            url: self.url.clone(),
            reason: format!("{e} (in {} bytes{})", self.body.len(), if self.is_json { "" } else { " of non-JSON" }),
        })
    }

    /// The body as text.
    pub(crate) fn text(&self) -> Result<String, Error> {
        String::from_utf8(self.body.to_vec())
            .map_err(|_| Error::Decode { url: self.url.clone(), reason: "the answer is not UTF-8 text".into() })
    }

    /// The error an answer with an error status states.
    pub(crate) fn into_error(self) -> Error {
        let body = ErrorBody::parse(self.status, &self.body, self.request_id);
        let url = self.url;
        // A creation limit is answered 409 (429 by earlier brokers).
        if matches!(self.status, StatusCode::CONFLICT | StatusCode::TOO_MANY_REQUESTS) {
            match body.code.as_deref() {
                Some("queue_full") if self.status == StatusCode::TOO_MANY_REQUESTS => {
                    return Error::QueueFull {
                        queue: body.detail_str("queue").unwrap_or_default().to_owned(),
                        depth: body.detail_i64("depth").unwrap_or_default(),
                        max_size: body.detail_i64("maxSize").unwrap_or_default(),
                        retry_after: self.retry_after,
                        request_id: body.request_id,
                        url,
                    };
                }
                Some("limit_reached") => {
                    return Error::LimitReached {
                        limit: body.detail_str("limit").unwrap_or_default().to_owned(),
                        held: body.detail_i64("held").unwrap_or_default(),
                        max: body.detail_i64("max").unwrap_or_default(),
                        body: Box::new(body),
                        url,
                    };
                }
                _ => {}
            }
        }
        Error::Status { url, status: self.status, body: Box::new(body), retry_after: self.retry_after }
    }

    fn code_is(&self, code: &str) -> bool {
        // Only error answers are looked into, and they are small.
        serde_json::from_slice::<ErrorBody>(&self.body).is_ok_and(|body| body.code.as_deref() == Some(code))
    }
}

/// What one attempt came to.
enum Attempt {
    /// An answer to hand to the caller, whatever its status.
    Answered(Answer),
    /// No answer, or 502/503/504: the next URL may do better.
    Failover { error: Error, retry_after: Option<Duration>, unapplied: bool },
    /// 429 with `Retry-After`: this broker asks to come back later.
    Wait { error: Error, retry_after: Duration, unapplied: bool },
}

/// `Retry-After` in seconds (the broker sends whole seconds; a fraction is accepted, a date is
/// not: the backoff applies then).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let seconds: f64 = text.parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds.min(3600.0)))
}

/// `error`, naming the other URLs of `tried` when no answer came.
fn naming_tried(error: Error, mut tried: Vec<String>) -> Error {
    match error {
        Error::Transport { url, source, .. } => {
            tried.retain(|t| *t != url);
            Error::Transport { url, source, tried }
        }
        other => other,
    }
}

/// A factor in `[0.8, 1.2)`, so that clients that failed together do not all retry together.
/// `wait` spread over its lower fifth or so (0.6 to 1.0 of it), never longer.
pub(crate) fn spread(wait: Duration) -> Duration {
    wait.mul_f64(jitter() - 0.2)
}

pub(crate) fn jitter() -> f64 {
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    0.8 + (random % 4000) as f64 / 10_000.0
}

impl Client {
    /// Sends `request`, failing over and retrying as the [`RetryPolicy`](crate::RetryPolicy)
    /// allows; the answer whatever its status, or the last failure.
    pub(crate) async fn send(&self, request: &Request) -> Result<Answer, Error> {
        let inner = &*self.inner;
        let urls = inner.bases.len();
        let attempts = if request.one_round { urls } else { (inner.retry.max_attempts as usize).max(urls) };
        let mut index = inner.current.load(Ordering::Relaxed) % urls;
        let (mut failed_in_round, mut round) = (0usize, 0u32);
        // The URLs that failed, each once: a transport error names them all, not only the last.
        let mut tried: Vec<String> = Vec::new();
        for attempt in 1.. {
            let outcome = self.attempt(request, index).await?;
            let (error, wait, unapplied, failover) = match outcome {
                Attempt::Answered(answer) => {
                    // Sticky: later calls start at the broker that answered.
                    inner.current.store(index, Ordering::Relaxed);
                    return Ok(answer);
                }
                Attempt::Failover { error, retry_after, unapplied } => (error, retry_after, unapplied, true),
                Attempt::Wait { error, retry_after, unapplied } => (error, Some(retry_after), unapplied, false),
            };
            if let Some(url) = error.url().filter(|url| !tried.iter().any(|t| t == url)) {
                tried.push(url.to_owned());
            }
            if (request.replay == Replay::IfUnapplied && !unapplied) || attempt >= attempts {
                return Err(naming_tried(error, tried));
            }
            if failover {
                let next = (index + 1) % urls;
                // Round robin from the failed URL; a concurrent call may have moved on already.
                let _ = inner.current.compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
                tracing::debug!(url = %inner.bases[index], next = %inner.bases[next], %error, "queen-client: failing over");
                index = next;
                failed_in_round += 1;
                if failed_in_round < urls {
                    continue;
                }
                failed_in_round = 0;
            }
            if request.one_round {
                return Err(naming_tried(error, tried));
            }
            round += 1;
            // Jittered below the bound, not capped after: clients that reached the bound together
            // would otherwise all come back at once, every time.
            let backoff =
                inner.retry.initial_backoff.saturating_mul(1 << (round - 1).min(16)).min(inner.retry.max_backoff);
            let pause = wait.unwrap_or_else(|| spread(backoff)).min(inner.retry.max_backoff);
            tracing::debug!(?pause, %error, "queen-client: retrying");
            tokio::time::sleep(pause).await;
        }
        unreachable!("the attempts loop returns")
    }

    async fn attempt(&self, request: &Request, index: usize) -> Result<Attempt, Error> {
        let inner = &*self.inner;
        let url = request.url(&inner.bases[index])?;
        let url_text = url.as_str().to_owned();
        let mut builder =
            inner.http.request(request.method.clone(), url).timeout(request.timeout.unwrap_or(inner.timeout));
        if let Some(body) = &request.body {
            builder = builder.header(CONTENT_TYPE, request.content_type).body(body.clone());
        }
        let response = match builder.send().await {
            Ok(response) => response,
            Err(source) => {
                // A connection that could not be made carried no request.
                let unapplied = source.is_connect();
                let error = Error::Transport { url: url_text, source, tried: Vec::new() };
                return Ok(Attempt::Failover { error, retry_after: None, unapplied });
            }
        };
        let status = response.status();
        let headers = response.headers().clone();
        let body = match response.bytes().await {
            Ok(body) => body,
            Err(source) => {
                let error = Error::Transport { url: url_text, source, tried: Vec::new() };
                return Ok(Attempt::Failover { error, retry_after: None, unapplied: false });
            }
        };
        let is_json =
            headers.get(CONTENT_TYPE).and_then(|value| value.to_str().ok()).is_some_and(|value| value.contains("json"));
        let request_id = headers.get("x-request-id").and_then(|value| value.to_str().ok()).map(str::to_owned);
        let wait = retry_after(&headers);
        let answer = Answer { status, body, url: url_text, retry_after: wait, request_id, is_json };
        Ok(match status {
            StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT => {
                let unapplied = answer.code_is("overloaded");
                Attempt::Failover { error: answer.into_error(), retry_after: wait, unapplied }
            }
            StatusCode::TOO_MANY_REQUESTS => match wait {
                // A full queue is the application's to handle (its consumers must catch up); a
                // creation limit carries no `Retry-After` and does not pass by waiting.
                Some(wait) if !answer.code_is("queue_full") => {
                    let unapplied = answer.code_is("overloaded");
                    Attempt::Wait { error: answer.into_error(), retry_after: wait, unapplied }
                }
                _ => Attempt::Answered(answer),
            },
            _ => Attempt::Answered(answer),
        })
    }

    /// Sends `request` and reads a successful answer's JSON body.
    pub(crate) async fn call<T: DeserializeOwned>(&self, request: Request) -> Result<T, Error> {
        self.send(&request).await?.success()?.json()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_one_path_segment() {
        assert_eq!(seg("orders.eu-1").to_string(), "orders.eu-1");
        assert_eq!(seg("a/b c%+").to_string(), "a%2Fb%20c%25%2B");
        assert_eq!(seg("ünï").to_string(), "%C3%BCn%C3%AF");
    }

    #[test]
    fn queries_are_form_encoded() {
        let request = Request::get("/api/v1/pop/queue/q".into()).query("consumerGroup", "a b&c");
        let url = request.url("http://h:1/prefix").unwrap();
        assert_eq!(url.as_str(), "http://h:1/prefix/api/v1/pop/queue/q?consumerGroup=a+b%26c");
    }

    #[test]
    fn retry_after_is_seconds() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, "1".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(1)));
        headers.insert(RETRY_AFTER, "0.5".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(500)));
        headers.insert(RETRY_AFTER, "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap());
        assert_eq!(retry_after(&headers), None);
    }

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status: StatusCode::from_u16(status).unwrap(),
            body: Bytes::copy_from_slice(body.as_bytes()),
            url: "http://h:1/api/v1/push".into(),
            retry_after: None,
            request_id: None,
            is_json: true,
        }
    }

    #[test]
    fn a_creation_limit_is_told_apart_from_other_refusals() {
        let limit = r#"{"error": "queue limit reached", "code": "limit_reached", "limit": "limits.max_queues", "held": 3, "max": 3}"#;
        for status in [409, 429] {
            let error = answer(status, limit).into_error();
            assert!(
                matches!(&error, Error::LimitReached { limit, held: 3, max: 3, .. } if limit == "limits.max_queues"),
                "{status}: {error:?}"
            );
            assert!(!error.is_retryable(), "waiting makes no room");
            assert_eq!(error.status(), Some(StatusCode::CONFLICT), "told as the broker answers it now");
        }
        let full = r#"{"error": "queue q is full", "code": "queue_full", "queue": "q", "depth": 5, "maxSize": 5}"#;
        assert!(matches!(answer(429, full).into_error(), Error::QueueFull { depth: 5, max_size: 5, .. }));
        let conflict = answer(409, r#"{"error": "the lease is gone", "code": "conflict"}"#).into_error();
        assert!(matches!(conflict, Error::Status { status: StatusCode::CONFLICT, .. }), "{conflict:?}");
    }

    #[test]
    fn jitter_stays_near_one() {
        for _ in 0..100 {
            let factor = jitter();
            assert!((0.8..1.2).contains(&factor), "{factor}");
        }
    }
}
