//! The HTTP API: one module per resource. Paths and shapes follow the contract the official
//! `queen-mq` client speaks; every error is a JSON body.

mod ack;
mod analytics;
#[cfg(test)]
mod arbitrary_bodies;
pub mod authorize;
mod binary_push;
mod body;
mod configure;
mod consumer_groups;
pub mod content_encoding;
pub mod cross_site;
mod dashboard;
mod depth;
mod dlq;
pub mod dns_rebinding;
mod framed_pop;
pub mod gate;
mod health;
mod kv;
pub mod leading_slashes;
mod lease;
mod locks;
mod messages;
mod offset_reads;
mod pop;
mod push;
pub mod request_id;
mod resources;
mod status;
mod system;
mod timers;
mod traces;
mod transaction;
pub mod uri_text;

pub use push::parse_items as parse_push_body;
pub use status::mark_start;

use std::fmt;

use actix_web::body::BoxBody;
use actix_web::dev::ServiceRequest;
use actix_web::middleware::{Next, from_fn};
use actix_web::{HttpRequest, HttpResponse, web};
use authorize::{Access, Scope};
use chrono::{DateTime, Datelike, SecondsFormat, Timelike, Utc};

use crate::auth::Role;
use crate::error::ApiError;

/// The request's path as the router reads it: percent-escapes decoded (but of `/`, `%` and
/// `+`), so `/%61pi/v1/push` routes as `/api/v1/push`. The middlewares that act on API requests
/// (and the public paths of auth) read this one, not the path as sent.
pub fn routed_path(req: &actix_web::dev::ServiceRequest) -> &str {
    req.match_info().as_str()
}

/// Whether the request is for the API, as the router will take it ([`routed_path`]).
pub fn is_api(req: &actix_web::dev::ServiceRequest) -> bool {
    routed_path(req).starts_with("/api/")
}

/// Times as the API writes them: RFC 3339 in UTC with microseconds and `Z`.
pub fn timestamp(at: DateTime<Utc>) -> String {
    Timestamp(at).to_string()
}

/// [`timestamp`] written straight into an answer: every delivered message carries one, and
/// serialized this way it costs no string of its own.
pub struct Timestamp(pub DateTime<Utc>);

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.0;
        if !(0..=9999).contains(&at.year()) {
            return f.write_str(&at.to_rfc3339_opts(SecondsFormat::Micros, true));
        }
        // chrono holds a leap second as nanoseconds past 1e9 of second 59; RFC 3339 writes 60.
        let (second, nanos) = match at.nanosecond() {
            leap @ 1_000_000_000.. => (at.second() + 1, leap - 1_000_000_000),
            nanos => (at.second(), nanos),
        };
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{second:02}.{:06}Z",
            at.year(),
            at.month(),
            at.day(),
            at.hour(),
            at.minute(),
            nanos / 1000
        )
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Serializes an id as a JSON string, the way the clients read partition ids, without a string
/// of its own.
pub fn id_text<S: serde::Serializer>(id: &i64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(id)
}

/// What every answer that carries a stored message says about it.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredMessageJson<'a> {
    pub id: uuid::Uuid,
    pub transaction_id: &'a str,
    pub trace_id: Option<uuid::Uuid>,
    /// Who pushed it: the pushing token's subject with auth on, else null.
    pub producer_sub: Option<&'a str>,
    pub queue: &'a str,
    pub partition: &'a str,
    #[serde(serialize_with = "id_text")]
    pub partition_id: i64,
    pub offset: i64,
    pub created_at: Timestamp,
    pub data: &'a serde_json::value::RawValue,
}

/// Families of the official client's API this broker does not offer: the client reads their 404
/// as "not supported by this broker".
const NOT_OFFERED: [(&str, &str); 2] =
    [("/api/v1/ephemeral/", "ephemeral (in-memory) queues"), ("/streams/v1/", "the streams runtime")];

async fn no_such_route(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let path = req.path();
    if let Some((_, family)) = NOT_OFFERED.iter().find(|(prefix, _)| path.starts_with(prefix)) {
        return Err(ApiError::NotFound(format!("{family}: not offered by this broker ({path})")));
    }
    Err(ApiError::NotFound(format!("no route for {} {}", req.method(), path)))
}

async fn method_not_allowed(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed(format!("{} is not allowed on {}", req.method(), req.path())))
}

/// A resource whose other methods answer 405 with a JSON body.
fn resource(path: &str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(method_not_allowed))
}

/// What a route needs: with auth off, every route is served to anyone.
const PUBLIC: Access = Access::Public;
const fn read_only(scope: Scope) -> Access {
    Access::Role(Role::ReadOnly, scope)
}
const fn read_write(scope: Scope) -> Access {
    Access::Role(Role::ReadWrite, scope)
}
const fn admin(scope: Scope) -> Access {
    Access::Role(Role::Admin, scope)
}

/// Declares every route once: [`ROUTES`] (what README's route table must list) and [`routes`]
/// (the registration, each route behind its access check) come from the same lines, so no route
/// can be served without a role. Order matters where a literal segment competes with a parameter.
/// A path marked `#by_method` is taken only by its own methods: a request of another method goes
/// on to the next route its path matches, instead of being answered 405 there.
macro_rules! api {
    ($($path:literal $(#$by_method:ident)? { $($method:ident => $handler:path, $access:expr;)+ })+) => {
        /// Every route the broker serves: method, path pattern, and what it needs.
        pub const ROUTES: &[(&str, &str, Access)] = &[$($((stringify!($method), $path, $access),)+)+];

        /// Registers every route.
        pub fn routes(cfg: &mut web::ServiceConfig) {
            $(
                let by_method = false $(|| { let _ = stringify!($by_method); true })?;
                let registered = match by_method {
                    true => resource($path).guard(only(&[$(stringify!($method)),+])),
                    false => resource($path),
                };
                cfg.service(registered$(.route(web::$method().to($handler).wrap(from_fn(
                    move |req: ServiceRequest, next: Next<BoxBody>| authorize::authorize($access, req, next),
                ))))+);
            )+
            cfg.default_service(web::to(no_such_route));
        }
    };
}

/// A guard that passes requests of these methods (lower case, as the routes name them).
fn only(methods: &'static [&'static str]) -> impl actix_web::guard::Guard {
    actix_web::guard::fn_guard(move |ctx| methods.iter().any(|m| ctx.head().method.as_str().eq_ignore_ascii_case(m)))
}

api! {
    "/health" { get => health::health, PUBLIC; }
    "/ready" { get => health::ready, PUBLIC; }
    "/metrics" { get => health::metrics, read_only(Scope::Fleet); }
    "/dashboard" { get => dashboard::asset, PUBLIC; }
    "/dashboard/{asset:.*}" { get => dashboard::asset, PUBLIC; }
    "/api/v1/configure" { post => configure::handle, admin(Scope::Body); }
    "/api/v1/push" { post => push::handle, read_write(Scope::Body); }
    "/api/v1/pop" { get => pop::pop_namespace, read_write(Scope::Fleet); }
    "/api/v1/pop/queue/{queue}" { get => pop::pop_queue, read_write(Scope::PathQueue); }
    "/api/v1/pop/queue/{queue}/partition/{partition}" { get => pop::pop_partition, read_write(Scope::PathQueue); }
    "/api/v1/ack" { post => ack::single, read_write(Scope::Body); }
    "/api/v1/ack/batch" { post => ack::batch, read_write(Scope::Body); }
    "/api/v1/lease/{lease_id}/extend" { post => lease::extend, read_write(Scope::PathLease); }
    "/api/v1/transaction" { post => transaction::handle, read_write(Scope::Body); }
    "/api/v1/kv" { post => kv::handle, read_write(Scope::Fleet); }
    "/api/v1/locks" { post => locks::handle, read_write(Scope::Fleet); }
    "/api/v1/timers" { post => timers::batch, read_write(Scope::Body); }
    "/api/v1/timers/{queue}" { get => timers::list, read_only(Scope::PathQueue); }
    // The key is the rest of the path: it may contain `/`.
    "/api/v1/timers/{queue}/{key:.+}" {
        get => timers::peek, read_only(Scope::PathQueue);
        delete => timers::cancel, read_write(Scope::PathQueue);
    }
    "/api/v1/fetch" { post => offset_reads::fetch, read_only(Scope::Body); }
    "/api/v1/partitions/changed" { post => offset_reads::changed, read_only(Scope::Body); }
    "/api/v1/resources/overview" { get => status::overview, read_only(Scope::Fleet); }
    "/api/v1/resources/queues" { get => status::queues, read_only(Scope::Fleet); }
    "/api/v1/resources/namespaces" { get => status::namespaces, read_only(Scope::Fleet); }
    "/api/v1/resources/tasks" { get => status::tasks, read_only(Scope::Fleet); }
    "/api/v1/resources/partitions" { get => status::partitions, read_only(Scope::QueryQueue); }
    "/api/v1/status" { get => status::status, read_only(Scope::Fleet); }
    "/api/v1/status/queues" { get => status::queue_statuses, read_only(Scope::Fleet); }
    "/api/v1/status/queues/{queue}" { get => status::queue_status, read_only(Scope::PathQueue); }
    "/api/v1/status/analytics" { get => status::analytics, read_only(Scope::Fleet); }
    "/api/v1/status/brokers" { get => status::brokers, read_only(Scope::Fleet); }
    "/api/v1/status/history" { get => status::history, read_only(Scope::Fleet); }
    "/api/v1/analytics/system-metrics" { get => analytics::system_metrics, read_only(Scope::Fleet); }
    "/api/v1/analytics/worker-metrics" { get => analytics::worker_metrics, read_only(Scope::Fleet); }
    "/api/v1/messages" { get => status::list_messages, read_only(Scope::QueryQueue); }
    "/api/v1/resources/queues/{queue}/depth" { get => depth::queue_depth, read_only(Scope::PathQueue); }
    "/api/v1/resources/queues/{queue}" {
        get => resources::get_queue, read_only(Scope::PathQueue);
        delete => resources::delete_queue, admin(Scope::PathQueue);
    }
    "/api/v1/dlq" { get => dlq::list, read_only(Scope::QueryQueue); }
    // Before the message route, whose transaction id may contain `/` (and end in `/retry`: a
    // read or deletion of such a message goes on to it).
    "/api/v1/messages/{partition_id}/{transaction_id:.+}/retry" #by_method {
        post => dlq::retry, admin(Scope::PathPartition);
    }
    "/api/v1/messages/{partition_id}/{transaction_id:.+}" {
        get => messages::get, read_only(Scope::PathPartition);
        delete => dlq::delete, admin(Scope::PathPartition);
    }
    "/api/v1/traces" { post => traces::record, read_write(Scope::Body); }
    // Before the message's events, which `by-name/{name}` would otherwise match.
    "/api/v1/traces/names" { get => traces::names, read_only(Scope::Fleet); }
    "/api/v1/traces/by-name/{name:.+}" { get => traces::by_name, read_only(Scope::Fleet); }
    "/api/v1/traces/{partition_id}/{transaction_id:.+}" { get => traces::of_message, read_only(Scope::PathPartition); }
    "/api/v1/consumer-groups" { get => consumer_groups::list, read_only(Scope::Fleet); }
    // Before `{group}`: a literal beats the parameter only when registered first.
    "/api/v1/consumer-groups/lagging" { get => consumer_groups::lagging, read_only(Scope::Fleet); }
    "/api/v1/consumer-groups/{group}" {
        get => consumer_groups::detail, read_only(Scope::Fleet);
        delete => consumer_groups::delete_group, admin(Scope::Fleet);
    }
    "/api/v1/consumer-groups/{group}/subscription" {
        post => consumer_groups::update_subscription, admin(Scope::Fleet);
    }
    "/api/v1/consumer-groups/{group}/queues/{queue}" {
        delete => consumer_groups::delete_group_on_queue, admin(Scope::PathQueue);
    }
    "/api/v1/consumer-groups/{group}/queues/{queue}/seek" { post => consumer_groups::seek_queue, admin(Scope::PathQueue); }
    "/api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition_id}/seek" {
        post => consumer_groups::seek_partition, admin(Scope::PathPartition);
    }
    "/api/v1/stats/refresh" { post => consumer_groups::refresh_stats, admin(Scope::Fleet); }
    "/api/v1/system/maintenance" {
        get => system::status, read_only(Scope::Fleet);
        post => system::set_push, admin(Scope::Fleet);
    }
    "/api/v1/system/maintenance/pop" {
        get => system::status, read_only(Scope::Fleet);
        post => system::set_pop, admin(Scope::Fleet);
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};

    use super::{ROUTES, Timestamp};

    /// Written straight into an answer, a time reads exactly as chrono's RFC 3339 writes it.
    #[test]
    fn timestamps_are_written_as_rfc_3339_with_microseconds() {
        let day = NaiveDate::from_ymd_opt(2026, 12, 4).expect("a date");
        let at = |h, m, s, nanos| day.and_hms_nano_opt(h, m, s, nanos).expect("a time").and_utc();
        let times: [DateTime<Utc>; 7] = [
            DateTime::UNIX_EPOCH,
            Utc::now(),
            at(17, 38, 21, 123_456_789),
            at(0, 0, 0, 999),
            at(23, 59, 59, 1_250_000_000),
            NaiveDate::from_ymd_opt(1, 1, 1).expect("a date").and_hms_opt(0, 0, 0).expect("a time").and_utc(),
            NaiveDate::from_ymd_opt(10_000, 1, 1).expect("a date").and_hms_opt(0, 0, 0).expect("a time").and_utc(),
        ];
        for time in times {
            let expected = time.to_rfc3339_opts(SecondsFormat::Micros, true);
            assert_eq!(Timestamp(time).to_string(), expected);
            assert_eq!(serde_json::to_string(&Timestamp(time)).expect("JSON"), format!("\"{expected}\""));
        }
        assert_eq!(Timestamp(at(23, 59, 59, 1_250_000_000)).to_string(), "2026-12-04T23:59:60.250000Z");
    }

    /// README's route → role table lists exactly the routes the router serves, each with the
    /// role it needs: a route added without a role, or a role changed, fails here.
    #[test]
    fn the_readme_route_table_is_the_router() {
        let readme = include_str!("../../../../README.md");
        let table =
            readme.split("<!-- routes:begin -->").nth(1).and_then(|rest| rest.split("<!-- routes:end -->").next());
        let table = table.expect("README.md has the route table between <!-- routes:begin --> and <!-- routes:end -->");
        let mut listed: Vec<(String, String, String)> = table
            .lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
                let unquote = |cell: &str| cell.trim_matches('`').to_owned();
                (cells.len() == 4 && cells[0].starts_with('`'))
                    .then(|| (unquote(cells[0]), unquote(cells[1]), format!("{} / {}", cells[2], cells[3])))
            })
            .collect();
        let mut served: Vec<(String, String, String)> = ROUTES
            .iter()
            .map(|(method, path, access)| {
                (
                    method.to_ascii_uppercase(),
                    (*path).to_owned(),
                    format!("{} / {}", access.label(), access.scope_label()),
                )
            })
            .collect();
        listed.sort();
        served.sort();
        let missing: Vec<_> = served.iter().filter(|route| !listed.contains(route)).collect();
        let stale: Vec<_> = listed.iter().filter(|route| !served.contains(route)).collect();
        assert!(missing.is_empty() && stale.is_empty(), "README's route table lacks {missing:?} and lists {stale:?}");
    }

    /// Handlers parse and render: every operation goes through `broker::*`. What a handler must
    /// not reach for, whoever adds the next route.
    #[test]
    fn no_handler_talks_to_the_database_or_an_actor() {
        const BEYOND_THE_EDGE: [&str; 9] = [
            "broker.pool",
            ".coordinator",
            "broker.groups",
            "broker.writers",
            "broker.journal",
            "deadpool",
            "tokio_postgres",
            ".query(",
            "do_send(",
        ];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).expect("src/http") {
            let path = entry.expect("an entry").path();
            let source = std::fs::read_to_string(&path).expect("a source file");
            let code = source.split("#[cfg(test)]").next().unwrap_or_default();
            for needle in BEYOND_THE_EDGE {
                assert!(!code.contains(needle), "{} uses {needle:?}: move it into broker::*", path.display());
            }
            checked += 1;
        }
        assert!(checked > 10, "read the handlers ({checked} files)");
    }
}
