//! The HTTP API: one module per resource. Paths and shapes follow the contract the official
//! `queen-mq` client speaks; every error is a JSON body.

mod ack;
mod body;
mod configure;
mod consumer_groups;
mod dlq;
pub mod gate;
mod health;
mod lease;
mod messages;
mod pop;
mod push;
pub mod request_id;
mod resources;
mod status;
mod system;
mod transaction;

pub use push::parse_items as parse_push_body;
pub use status::mark_start;

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, SecondsFormat, Utc};

use crate::error::ApiError;

/// Times as the API writes them: RFC 3339 in UTC with microseconds and `Z`.
pub fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// What every answer that carries a stored message says about it.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredMessageJson<'a> {
    pub id: uuid::Uuid,
    pub transaction_id: &'a str,
    pub trace_id: Option<uuid::Uuid>,
    pub queue: &'a str,
    pub partition: &'a str,
    pub partition_id: String,
    pub offset: i64,
    pub created_at: String,
    pub data: &'a serde_json::value::RawValue,
}

async fn no_such_route(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound(format!("no route for {} {}", req.method(), req.path())))
}

async fn method_not_allowed(req: HttpRequest) -> HttpResponse {
    HttpResponse::MethodNotAllowed()
        .json(serde_json::json!({"error": format!("{} is not allowed on {}", req.method(), req.path()), "code": "method_not_allowed"}))
}

/// A resource whose other methods answer 405 with a JSON body.
fn resource(path: &str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(method_not_allowed))
}

/// Registers every route.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/health").route(web::get().to(health::health)))
        .service(resource("/ready").route(web::get().to(health::ready)))
        .service(resource("/metrics").route(web::get().to(health::metrics)))
        .service(
            web::scope("/api/v1")
                .service(resource("/configure").route(web::post().to(configure::handle)))
                .service(resource("/push").route(web::post().to(push::handle)))
                .service(resource("/pop").route(web::get().to(pop::pop_namespace)))
                .service(resource("/pop/queue/{queue}").route(web::get().to(pop::pop_queue)))
                .service(resource("/pop/queue/{queue}/partition/{partition}").route(web::get().to(pop::pop_partition)))
                .service(resource("/ack").route(web::post().to(ack::single)))
                .service(resource("/ack/batch").route(web::post().to(ack::batch)))
                .service(resource("/lease/{lease_id}/extend").route(web::post().to(lease::extend)))
                .service(resource("/transaction").route(web::post().to(transaction::handle)))
                .service(resource("/resources/overview").route(web::get().to(status::overview)))
                .service(resource("/resources/queues").route(web::get().to(status::queues)))
                .service(resource("/resources/partitions").route(web::get().to(status::partitions)))
                .service(resource("/status").route(web::get().to(status::status)))
                .service(resource("/status/queues").route(web::get().to(status::queue_statuses)))
                .service(resource("/status/queues/{queue}").route(web::get().to(status::queue_status)))
                .service(resource("/status/analytics").route(web::get().to(status::analytics)))
                .service(resource("/messages").route(web::get().to(status::list_messages)))
                .service(
                    resource("/resources/queues/{queue}")
                        .route(web::get().to(resources::get_queue))
                        .route(web::delete().to(resources::delete_queue)),
                )
                .service(resource("/dlq").route(web::get().to(dlq::list)))
                // Before the message route, whose transaction id may contain `/`.
                .service(
                    resource("/messages/{partition_id}/{transaction_id:.+}/retry").route(web::post().to(dlq::retry)),
                )
                .service(
                    resource("/messages/{partition_id}/{transaction_id:.+}")
                        .route(web::get().to(messages::get))
                        .route(web::delete().to(dlq::delete)),
                )
                .service(resource("/consumer-groups").route(web::get().to(consumer_groups::list)))
                // Before `{group}`: a literal beats the parameter only when registered first.
                .service(resource("/consumer-groups/lagging").route(web::get().to(consumer_groups::lagging)))
                .service(
                    resource("/consumer-groups/{group}")
                        .route(web::get().to(consumer_groups::detail))
                        .route(web::delete().to(consumer_groups::delete_group)),
                )
                .service(
                    resource("/consumer-groups/{group}/subscription")
                        .route(web::post().to(consumer_groups::update_subscription)),
                )
                .service(
                    resource("/consumer-groups/{group}/queues/{queue}")
                        .route(web::delete().to(consumer_groups::delete_group_on_queue)),
                )
                .service(
                    resource("/consumer-groups/{group}/queues/{queue}/seek")
                        .route(web::post().to(consumer_groups::seek_queue)),
                )
                .service(
                    resource("/consumer-groups/{group}/queues/{queue}/partitions/{partition_id}/seek")
                        .route(web::post().to(consumer_groups::seek_partition)),
                )
                .service(resource("/stats/refresh").route(web::post().to(consumer_groups::refresh_stats)))
                .service(
                    resource("/system/maintenance")
                        .route(web::get().to(system::status))
                        .route(web::post().to(system::set_push)),
                )
                .service(
                    resource("/system/maintenance/pop")
                        .route(web::get().to(system::status))
                        .route(web::post().to(system::set_pop)),
                ),
        )
        .default_service(web::to(no_such_route));
}

#[cfg(test)]
mod tests {
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
