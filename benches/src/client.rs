//! The part of the Queen HTTP API the load generator speaks: push, pop, batch ack, health and
//! metrics, with the request and answer shapes of the wire contract.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::generator::PayloadStamp;

/// Bound on any call that is not a long poll.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Slack a long poll gets past its own `timeout` before the client gives up on it.
const LONG_POLL_SLACK: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{url}: {source}")]
    Transport { url: String, source: reqwest::Error },
    #[error("{url} answered HTTP {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("{url}: unexpected answer: {reason}")]
    Answer { url: String, reason: String },
}

/// A broker's HTTP API.
#[derive(Debug, Clone)]
pub struct QueenClient {
    http: reqwest::Client,
    base: String,
}

/// One item of a push body.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PushItem<'a> {
    pub queue: &'a str,
    pub partition: String,
    pub transaction_id: String,
    pub payload: Box<RawValue>,
}

#[derive(Serialize)]
struct PushBody<'a> {
    items: &'a [PushItem<'a>],
}

/// The answer to one push item, in the item's position.
#[derive(Debug, Deserialize)]
pub struct PushResult {
    pub status: String,
    pub transaction_id: String,
}

/// What a pop asks for.
#[derive(Debug, Clone)]
pub struct PopQuery<'a> {
    pub queue: &'a str,
    /// `None` pops in queue mode.
    pub group: Option<&'a str>,
    pub batch: usize,
    /// Partitions one queue-wide pop may claim.
    pub partitions: usize,
    /// Long-poll for this long; `None` answers at once.
    pub wait: Option<Duration>,
}

/// A delivered message, as much of it as the load generator reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoppedMessage {
    pub transaction_id: String,
    pub partition_id: String,
    pub partition: String,
    pub lease_id: Option<String>,
    pub data: Box<RawValue>,
}

impl PoppedMessage {
    /// The send stamp of a message this generator made; `None` for any other payload.
    pub fn stamp(&self) -> Option<PayloadStamp> {
        serde_json::from_str(self.data.get()).ok()
    }
}

#[derive(Deserialize)]
struct PopAnswer {
    #[serde(default)]
    messages: Vec<PoppedMessage>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AckItem<'a> {
    transaction_id: &'a str,
    partition_id: &'a str,
    status: &'static str,
    lease_id: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AckBody<'a> {
    acknowledgments: Vec<AckItem<'a>>,
    consumer_group: Option<&'a str>,
}

#[derive(Deserialize)]
struct AckResult {
    success: bool,
    error: Option<String>,
}

/// The acknowledgements of a batch ack the broker refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AckRefusals {
    pub count: usize,
    pub first_error: Option<String>,
}

impl QueenClient {
    /// A client of the broker at `base_url`, sending `token` as a bearer token when given.
    pub fn new(base_url: &str, token: Option<&str>) -> Result<Self, ClientError> {
        let base = base_url.trim_end_matches('/').to_owned();
        // reqwest is built with rustls and no provider of its own.
        queen_store::tls::install_crypto_provider();
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token {
            let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                ClientError::Answer { url: base.clone(), reason: "the token is not a valid header value".into() }
            })?;
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .default_headers(headers)
            .build()
            .map_err(|source| ClientError::Transport { url: base.clone(), source })?;
        Ok(Self { http, base })
    }

    /// Pushes the items; one result per item, in order.
    pub async fn push(&self, items: &[PushItem<'_>]) -> Result<Vec<PushResult>, ClientError> {
        let url = format!("{}/api/v1/push", self.base);
        let request = self.http.post(&url).timeout(CALL_TIMEOUT).json(&PushBody { items });
        let results: Vec<PushResult> = self.call_json(&url, request).await?;
        if results.len() != items.len() {
            return Err(ClientError::Answer {
                url,
                reason: format!("{} results for {} items", results.len(), items.len()),
            });
        }
        if let Some((item, result)) = items.iter().zip(&results).find(|(i, r)| i.transaction_id != r.transaction_id) {
            return Err(ClientError::Answer {
                url,
                reason: format!("the result for {} names {}", item.transaction_id, result.transaction_id),
            });
        }
        Ok(results)
    }

    /// Pops from any partition of the queue; an empty answer (204) is an empty vector.
    pub async fn pop(&self, query: &PopQuery<'_>) -> Result<Vec<PoppedMessage>, ClientError> {
        let mut url = format!(
            "{}/api/v1/pop/queue/{}?batch={}&partitions={}",
            self.base, query.queue, query.batch, query.partitions
        );
        let mut timeout = CALL_TIMEOUT;
        match query.wait {
            Some(wait) => {
                url.push_str(&format!("&wait=true&timeout={}", wait.as_millis()));
                timeout = wait + LONG_POLL_SLACK;
            }
            None => url.push_str("&wait=false"),
        }
        if let Some(group) = query.group {
            url.push_str(&format!("&consumerGroup={group}&subscriptionMode=all"));
        }
        let response = self.send(&url, self.http.get(&url).timeout(timeout)).await?;
        if response.status() == reqwest::StatusCode::NO_CONTENT {
            return Ok(Vec::new());
        }
        let answer: PopAnswer = decode(&url, response).await?;
        Ok(answer.messages)
    }

    /// Acknowledges the messages as `completed` in one `/ack/batch` call.
    pub async fn ack(&self, group: Option<&str>, messages: &[PoppedMessage]) -> Result<AckRefusals, ClientError> {
        let url = format!("{}/api/v1/ack/batch", self.base);
        let body = AckBody {
            acknowledgments: messages
                .iter()
                .map(|m| AckItem {
                    transaction_id: &m.transaction_id,
                    partition_id: &m.partition_id,
                    status: "completed",
                    lease_id: m.lease_id.as_deref(),
                })
                .collect(),
            consumer_group: group,
        };
        let results: Vec<AckResult> =
            self.call_json(&url, self.http.post(&url).timeout(CALL_TIMEOUT).json(&body)).await?;
        let refused: Vec<&AckResult> = results.iter().filter(|r| !r.success).collect();
        Ok(AckRefusals {
            count: refused.len(),
            first_error: refused.first().map(|r| r.error.clone().unwrap_or_else(|| "refused".into())),
        })
    }

    /// `GET /ready` answered 200.
    pub async fn ready(&self) -> Result<(), ClientError> {
        let url = format!("{}/ready", self.base);
        self.send(&url, self.http.get(&url).timeout(Duration::from_secs(5))).await.map(drop)
    }

    /// The Prometheus text of `GET /metrics`.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let url = format!("{}/metrics?format=prometheus", self.base);
        let response = self.send(&url, self.http.get(&url).timeout(CALL_TIMEOUT)).await?;
        response.text().await.map_err(|source| ClientError::Transport { url, source })
    }

    async fn call_json<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        let response = self.send(url, request).await?;
        decode(url, response).await
    }

    /// Sends the request; any status other than 2xx is an error carrying the body.
    async fn send(&self, url: &str, request: reqwest::RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let response = request.send().await.map_err(|source| ClientError::Transport { url: url.to_owned(), source })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.text().await.unwrap_or_default();
        Err(ClientError::Status { url: url.to_owned(), status: status.as_u16(), body })
    }
}

async fn decode<T: serde::de::DeserializeOwned>(url: &str, response: reqwest::Response) -> Result<T, ClientError> {
    let bytes = response.bytes().await.map_err(|source| ClientError::Transport { url: url.to_owned(), source })?;
    serde_json::from_slice(&bytes).map_err(|e| ClientError::Answer { url: url.to_owned(), reason: e.to_string() })
}
