//! The edge's part in a graceful shutdown: every request is counted while it is under way (until
//! its answer is written, or its client left), and once the broker is shutting down a new API
//! request is refused (503, `Connection: close`) before it does anything. The requests under way
//! then finish while every worker, actor and database connection they need still runs, and a
//! refused client tries another broker.

use std::pin::Pin;
use std::task::{Context, Poll};

use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::ConnectionType;
use actix_web::middleware::Next;
use actix_web::web::Bytes;
use actix_web::{Error, ResponseError, web};

use crate::broker::{Broker, UnderWay};
use crate::error::ApiError;

pub async fn admit(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<Counted<EitherBody<impl MessageBody, BoxBody>>>, Error> {
    let Some(broker) = req.app_data::<web::Data<Broker>>().cloned() else {
        return next
            .call(req)
            .await
            .map(|answered| answered.map_body(|_, body| Counted::new(EitherBody::left(body), None)));
    };
    let under_way = Some(broker.request_under_way());
    if broker.is_shutting_down() && super::is_api(&req) {
        let mut refusal = ApiError::Unavailable(
            "the broker is shutting down and closes this connection; retry on another broker".into(),
        )
        .error_response();
        refusal.head_mut().set_connection_type(ConnectionType::Close);
        return Ok(req.into_response(refusal).map_body(|_, body| Counted::new(EitherBody::right(body), under_way)));
    }
    // Under way until its answer is written (or its client left): a large pop answer to a slow
    // consumer, cut by the shutdown's end, would leave its batch leased to nobody.
    next.call(req).await.map(|answered| answered.map_body(|_, body| Counted::new(EitherBody::left(body), under_way)))
}

pin_project_lite::pin_project! {
    /// An answer's body, which keeps its request counted as under way until it is dropped:
    /// written to the end, or given up with its connection.
    pub struct Counted<B> {
        #[pin]
        body: B,
        under_way: Option<UnderWay>,
    }
}

impl<B> Counted<B> {
    fn new(body: B, under_way: Option<UnderWay>) -> Self {
        Counted { body, under_way }
    }
}

impl<B: MessageBody> MessageBody for Counted<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Self::Error>>> {
        self.project().body.poll_next(cx)
    }
}
