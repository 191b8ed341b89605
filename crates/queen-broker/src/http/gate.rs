//! The edge's part in a graceful shutdown: every request is counted while it is under way, and
//! once the broker is shutting down a new API request is refused (503, `Connection: close`)
//! before it does anything. The requests under way then finish while every worker, actor and
//! database connection they need still runs, and a refused client tries another broker.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::ConnectionType;
use actix_web::middleware::Next;
use actix_web::{Error, ResponseError, web};

use crate::broker::Broker;
use crate::error::ApiError;

pub async fn admit(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, Error> {
    let Some(broker) = req.app_data::<web::Data<Broker>>().cloned() else {
        return next.call(req).await.map(ServiceResponse::map_into_left_body);
    };
    let _under_way = broker.request_under_way();
    if broker.is_shutting_down() && super::is_api(&req) {
        let mut refusal = ApiError::Unavailable(
            "the broker is shutting down and closes this connection; retry on another broker".into(),
        )
        .error_response();
        refusal.head_mut().set_connection_type(ConnectionType::Close);
        return Ok(req.into_response(refusal).map_into_right_body());
    }
    next.call(req).await.map(ServiceResponse::map_into_left_body)
}
