//! A path that starts with several slashes (a client whose base URL ends in one) is routed as if
//! it started with one. Slashes further in are left alone: a transaction id may hold `//`, and
//! merging them would route a read, retry or delete of message `a//b` to message `a/b`.

use actix_web::Error;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Uri;
use actix_web::http::uri::PathAndQuery;
use actix_web::middleware::Next;

pub async fn collapse(
    mut req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    if req.path().starts_with("//") {
        let uri = &req.head().uri;
        // The path comes first: trimming the whole keeps the query string as it was.
        let path_and_query = format!("/{}", uri.path_and_query().map_or("", |pq| pq.as_str()).trim_start_matches('/'));
        let mut parts = uri.clone().into_parts();
        // Built from a valid path and query with slashes taken away: still valid.
        if let Ok(path_and_query) = PathAndQuery::try_from(path_and_query)
            && let Ok(uri) = Uri::from_parts({
                parts.path_and_query = Some(path_and_query);
                parts
            })
        {
            req.match_info_mut().get_mut().update(&uri);
            req.head_mut().uri = uri;
        }
    }
    next.call(req).await
}
