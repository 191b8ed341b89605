//! The broker reads request bodies as they are sent: a body with a `Content-Encoding` (gzip,
//! say) would reach the handlers still encoded and be refused as bad JSON without a word about
//! why. An API request naming any encoding but `identity` is refused (415) saying so; a push or
//! transaction is compressed in its own format instead (QPB1, QTB1).

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::CONTENT_ENCODING;
use actix_web::middleware::Next;
use actix_web::{Error, ResponseError};

use crate::error::ApiError;

pub async fn refuse(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, Error> {
    let encoding =
        req.headers().get(CONTENT_ENCODING).map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    if let Some(encoding) = encoding.filter(|encoding| !encoding.trim().eq_ignore_ascii_case("identity"))
        && super::is_api(&req)
    {
        let refusal = ApiError::UnsupportedMediaType(format!(
            "Content-Encoding {:?} is not taken: send the body as it is (a push or transaction may be \
             compressed in its binary form)",
            encoding.trim()
        ))
        .error_response();
        return Ok(req.into_response(refusal).map_into_right_body());
    }
    next.call(req).await.map(ServiceResponse::map_into_left_body)
}
