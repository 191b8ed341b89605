//! `GET /api/v1/pop/queue/{queue}`, `GET /api/v1/pop/queue/{queue}/partition/{partition}` and
//! `GET /api/v1/pop?namespace=&task=`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use queen_store::cursors::CursorSeed;
use serde::Serialize;
use uuid::Uuid;

use super::body::{iso_time, path_name, query_bool, query_int, strict_query};
use super::{StoredMessageJson, Timestamp, framed_pop};
use crate::broker::Broker;
use crate::broker::pop::{Delivery, PopRequest, PopSource, pop};
use crate::connection::ClientConnection;
use crate::error::ApiError;
use crate::names::{self, NameKind, QUEUE_MODE_GROUP};

/// The parameters of every pop route. A queue route takes `namespace` and `task` too, without
/// acting on them: the official clients send a builder's namespace and task on every pop, and the
/// queue in the path names the source (`docs/architecture.md`, *Unknown body members and query
/// parameters*).
const PARAMETERS: &[&str] = &[
    "autopilot",
    "batch",
    "partitions",
    "wait",
    "timeout",
    "consumerGroup",
    "namespace",
    "task",
    "autoAck",
    "subscriptionMode",
    "subscriptionFrom",
    "conflation",
    "leaseSeconds",
    "frames",
];

pub async fn pop_queue(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let source = PopSource::Queue { queue: queue_of(&req)?, partition: None };
    handle(broker, req, source).await
}

pub async fn pop_partition(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let partition = path_name(&req, "partition", NameKind::Partition)?;
    let source = PopSource::Queue { queue: queue_of(&req)?, partition: Some(partition) };
    handle(broker, req, source).await
}

/// A pop from every queue of a namespace and/or task, the higher priority first.
pub async fn pop_namespace(broker: web::Data<Broker>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let query = strict_query(&req, PARAMETERS)?;
    let label = |key: &str| -> Result<Option<String>, ApiError> {
        let value = query.get(key).filter(|v| !v.is_empty()).cloned();
        if let Some(value) = &value {
            // What configure lets a queue carry, a pop may ask for.
            names::check_label(key, value).map_err(ApiError::BadRequest)?;
        }
        Ok(value)
    };
    let (namespace, task) = (label("namespace")?, label("task")?);
    if namespace.is_none() && task.is_none() {
        return Err(ApiError::bad_request("a pop without a queue needs a namespace, a task, or both"));
    }
    handle(broker, req, PopSource::Namespace { namespace, task }).await
}

fn queue_of(req: &HttpRequest) -> Result<String, ApiError> {
    path_name(req, "queue", NameKind::Queue)
}

async fn handle(broker: web::Data<Broker>, req: HttpRequest, source: PopSource) -> Result<HttpResponse, ApiError> {
    let query = strict_query(&req, PARAMETERS)?;
    let client = client_address(&req, broker.config.limits.trust_forwarded_for);
    let (mut request, autopilot) = parse_query(&broker, source, &query, client)?;
    let framed = query_bool(&query, "frames")?.unwrap_or(false);
    request.connection = req.conn_data::<ClientConnection>().copied();
    let started = std::time::Instant::now();
    // Timed whatever comes of it: a stalled database's 503s are the answers to see.
    let delivery = pop(&broker, &request).await;
    let wait = if request.wait { "true" } else { "false" };
    broker.metrics.pop_duration.with_label_values(&[wait]).observe(started.elapsed().as_secs_f64());
    let delivery = delivery?;
    let conflation = ConflationEcho::of(&request, &delivery);
    if delivery.paused {
        let paused = Empty { success: true, messages: [], paused: true, conflation };
        return Ok(HttpResponse::Ok().json(paused));
    }
    if delivery.messages.is_empty() {
        // The client checks the echo on every answer to a conflating pop: an empty one is a body.
        return Ok(match conflation {
            Some(_) => HttpResponse::Ok().json(Empty { success: true, messages: [], paused: false, conflation }),
            None => HttpResponse::NoContent().finish(),
        });
    }
    // The width applied: a pop of one partition claims that one alone.
    let partitions = match request.source {
        PopSource::Queue { partition: Some(_), .. } => 1,
        _ => request.max_partitions,
    };
    let autopilot = autopilot.then_some(AutopilotEcho { partitions, batch: request.batch, wait_ms: 0 });
    let own_keys = OwnKeys { autopilot, conflation };
    if framed {
        let own_json = (!own_keys.is_empty())
            .then(|| serde_json::to_vec(&own_keys))
            .transpose()
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        // A delivery QPF1 cannot carry (several queues of a namespace pop) is answered as JSON.
        if let Some(body) = framed_pop::encode(&delivery, &request.group, own_json.as_deref()) {
            return Ok(HttpResponse::Ok().content_type(framed_pop::CONTENT_TYPE).body(body));
        }
    }
    Ok(HttpResponse::Ok().json(PopAnswer::new(&request, &delivery, own_keys)))
}

/// The pop as the query asks for it, and whether the broker chose knobs for it (autopilot).
fn parse_query(
    broker: &Broker,
    source: PopSource,
    query: &BTreeMap<String, String>,
    client: Option<IpAddr>,
) -> Result<(PopRequest, bool), ApiError> {
    let limits = &broker.config.pop;
    let autopilot = query_bool(query, "autopilot")?.unwrap_or(false);
    let batch = query_int(query, "batch", 1, u64::from(limits.max_batch))?;
    let partitions = query_int(query, "partitions", 1, u64::from(limits.max_partitions))?;
    let default_batch = if autopilot { limits.autopilot_batch } else { limits.default_batch };
    let timeout_ms = query_int(query, "timeout", 0, limits.max_timeout_ms)?.unwrap_or(limits.default_timeout_ms);
    let group = names::group_or_queue_mode(query.get("consumerGroup").map(String::as_str)).to_owned();
    names::check(NameKind::ConsumerGroup, "consumerGroup", &group).map_err(ApiError::BadRequest)?;
    let auto_ack = query_bool(query, "autoAck")?.unwrap_or(false);
    let conflation = query_bool(query, "conflation")?.unwrap_or(false);
    if conflation && group == QUEUE_MODE_GROUP {
        return Err(ApiError::bad_request("conflation needs a consumerGroup: queue mode cannot conflate"));
    }
    if conflation && auto_ack {
        return Err(ApiError::bad_request(
            "conflation cannot be combined with autoAck: a conflating delivery is retired by its ack",
        ));
    }
    let lease_seconds = query_int(query, "leaseSeconds", 1, 7 * 24 * 3600)?.map(|s| s as i32);
    let subscription = subscription_seed(
        query.get("subscriptionMode").map(String::as_str),
        query.get("subscriptionFrom").map(String::as_str),
        &limits.default_subscription_mode,
    )?;
    // Queue mode always sees the backlog.
    let seed = if group == QUEUE_MODE_GROUP { CursorSeed::Oldest } else { subscription };
    let request = PopRequest {
        source,
        group,
        batch: batch.map_or(default_batch, |b| b as u32),
        max_partitions: partitions.map_or(1, |p| p as u32),
        auto_ack,
        wait: query_bool(query, "wait")?.unwrap_or(false),
        timeout: Duration::from_millis(timeout_ms),
        lease_seconds,
        seed,
        conflation,
        client,
        connection: None,
    };
    Ok((request, autopilot && (batch.is_none() || partitions.is_none())))
}

/// The client's address, whose parked long polls are counted apart: the TCP peer's, or, with
/// `limits.trust_forwarded_for` (behind a proxy, whose own address every client would share), the
/// last address of `X-Forwarded-For`: the one the proxy in front of the broker appended, since
/// whatever comes before it is what the client itself sent and may be made up.
fn client_address(req: &HttpRequest, trust_forwarded_for: bool) -> Option<IpAddr> {
    let forwarded = trust_forwarded_for
        .then(|| req.headers().get("x-forwarded-for"))
        .flatten()
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.rsplit(',').next())
        .and_then(parse_address);
    forwarded.or_else(|| req.peer_addr().map(|peer| peer.ip())).map(|ip| ip.to_canonical())
}

/// An address as `X-Forwarded-For` may carry it: `192.0.2.1`, `2001:db8::1`, or with a port
/// (`192.0.2.1:4711`, `[2001:db8::1]:4711`).
fn parse_address(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    text.parse::<IpAddr>().ok().or_else(|| text.parse::<SocketAddr>().ok().map(|address| address.ip()))
}

/// Where a new group starts, from `subscriptionMode` and `subscriptionFrom` (which wins; the mode
/// is checked all the same), or from `default_mode` (`pop.default_subscription_mode`) when the
/// pop names neither.
fn subscription_seed(mode: Option<&str>, from: Option<&str>, default_mode: &str) -> Result<CursorSeed, ApiError> {
    let by_mode = match mode {
        None if from.is_none() && default_mode == "new" => CursorSeed::End,
        None | Some("all" | "from_beginning") => CursorSeed::Oldest,
        Some("new" | "new-only") => CursorSeed::End,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "subscriptionMode must be one of all, from_beginning, new, new-only; not {other:?}"
            )));
        }
    };
    let Some(from) = from else { return Ok(by_mode) };
    if from.eq_ignore_ascii_case("now") {
        return Ok(CursorSeed::End);
    }
    let at = iso_time("subscriptionFrom", from).map_err(|_| {
        ApiError::bad_request(format!("subscriptionFrom must be `now` or an ISO-8601 timestamp, not {from:?}"))
    })?;
    Ok(CursorSeed::From(at))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AutopilotEcho {
    partitions: u32,
    batch: u32,
    wait_ms: u32,
}

/// What a pop that asked for conflation is told, on every answer: applied, or refused because the
/// group is registered without it (it is then served every message).
#[derive(Serialize, Clone, Copy)]
#[serde(rename_all = "camelCase")]
enum ConflationEcho {
    #[serde(rename = "conflation")]
    Applied(bool),
    #[serde(rename = "conflationConflict")]
    Conflict(bool),
}

impl ConflationEcho {
    fn of(request: &PopRequest, delivery: &Delivery) -> Option<ConflationEcho> {
        match (request.conflation, delivery.conflation_conflict) {
            (false, _) => None,
            (true, false) => Some(ConflationEcho::Applied(true)),
            (true, true) => Some(ConflationEcho::Conflict(true)),
        }
    }
}

/// What an answer with messages says beside them; the JSON part of a framed answer.
#[derive(Serialize)]
struct OwnKeys {
    #[serde(skip_serializing_if = "Option::is_none")]
    autopilot: Option<AutopilotEcho>,
    #[serde(flatten)]
    conflation: Option<ConflationEcho>,
}

impl OwnKeys {
    fn is_empty(&self) -> bool {
        self.autopilot.is_none() && self.conflation.is_none()
    }
}

/// A pop's answer without messages, when it has something to say.
#[derive(Serialize)]
struct Empty {
    success: bool,
    messages: [(); 0],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    paused: bool,
    #[serde(flatten)]
    conflation: Option<ConflationEcho>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PopAnswer<'a> {
    success: bool,
    queue: &'a str,
    partition: &'a str,
    partition_id: String,
    lease_id: Option<Uuid>,
    consumer_group: &'a str,
    messages: Vec<MessageJson<'a>>,
    partitions_claimed: usize,
    #[serde(flatten)]
    own_keys: OwnKeys,
}

/// A message as the client reads it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageJson<'a> {
    #[serde(flatten)]
    stored: StoredMessageJson<'a>,
    lease_id: Option<Uuid>,
    consumer_group: &'a str,
    delivery_attempt: i32,
}

impl<'a> PopAnswer<'a> {
    fn new(request: &'a PopRequest, delivery: &'a Delivery, own_keys: OwnKeys) -> Self {
        let first = delivery.messages.first();
        PopAnswer {
            success: true,
            queue: first.map_or("", |m| &m.queue),
            partition: first.map_or("", |m| &m.partition),
            partition_id: first.map_or_else(String::new, |m| m.partition_id.to_string()),
            lease_id: delivery.lease_id,
            consumer_group: &request.group,
            messages: delivery
                .messages
                .iter()
                .map(|m| MessageJson {
                    stored: StoredMessageJson {
                        id: m.message_id,
                        transaction_id: &m.transaction_id,
                        trace_id: m.trace_id,
                        producer_sub: m.producer.as_deref(),
                        queue: &m.queue,
                        partition: &m.partition,
                        partition_id: m.partition_id,
                        offset: m.offset,
                        created_at: Timestamp(m.created_at),
                        data: &m.data,
                    },
                    lease_id: delivery.lease_id,
                    consumer_group: &request.group,
                    delivery_attempt: m.delivery_attempt,
                })
                .collect(),
            partitions_claimed: delivery.partitions_claimed,
            own_keys,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscription_settings() {
        assert_eq!(subscription_seed(None, None, "all").unwrap(), CursorSeed::Oldest);
        assert_eq!(subscription_seed(None, None, "new").unwrap(), CursorSeed::End, "the configured default");
        assert_eq!(subscription_seed(Some("all"), None, "new").unwrap(), CursorSeed::Oldest, "the pop's own mode wins");
        assert_eq!(subscription_seed(Some("new"), None, "all").unwrap(), CursorSeed::End);
        assert_eq!(subscription_seed(Some("all"), Some("now"), "all").unwrap(), CursorSeed::End);
        let at = subscription_seed(None, Some("2026-07-29T14:00:00Z"), "new").unwrap();
        assert_eq!(at, CursorSeed::From("2026-07-29T14:00:00Z".parse().unwrap()));
        assert!(subscription_seed(Some("sometimes"), None, "all").is_err());
        assert!(subscription_seed(None, Some("yesterday"), "all").is_err());
    }

    #[test]
    fn the_client_is_the_peer_unless_forwarded_for_is_trusted() {
        let peer: SocketAddr = "10.1.2.3:5555".parse().unwrap();
        let req = actix_web::test::TestRequest::default()
            .peer_addr(peer)
            .insert_header(("X-Forwarded-For", "198.51.100.9, 203.0.113.7"))
            .to_http_request();
        assert_eq!(client_address(&req, false), Some(peer.ip()), "the header is the client's own say");
        assert_eq!(
            client_address(&req, true),
            Some("203.0.113.7".parse().unwrap()),
            "the address the proxy appended, not the one the client claims"
        );
        let garbled = actix_web::test::TestRequest::default()
            .peer_addr(peer)
            .insert_header(("X-Forwarded-For", "unknown"))
            .to_http_request();
        assert_eq!(client_address(&garbled, true), Some(peer.ip()), "no address in the header: the peer");
        assert_eq!(parse_address(" [2001:db8::1]:4711"), Some("2001:db8::1".parse().unwrap()));
        assert_eq!(parse_address("192.0.2.1:80"), Some("192.0.2.1".parse().unwrap()));
        let mapped = actix_web::test::TestRequest::default().peer_addr("[::ffff:10.1.2.3]:1".parse().unwrap());
        assert_eq!(client_address(&mapped.to_http_request(), false), Some(peer.ip()), "IPv4 in IPv6 is IPv4");
    }
}
