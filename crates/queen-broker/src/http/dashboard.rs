//! `/dashboard`: the operators' web dashboard, a page and its scripts compiled into the binary
//! (nothing is fetched at run time). It reads and acts only through the HTTP API, with the
//! token the operator gives it, so the assets themselves are public: they hold no data.

use std::sync::LazyLock;

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// One embedded file: its name under `/dashboard/`, its media type and its bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! assets {
    ($($name:literal => $content_type:literal,)+) => {
        const ASSETS: &[Asset] = &[$(Asset {
            name: $name,
            content_type: $content_type,
            bytes: include_bytes!(concat!("../../dashboard/", $name)),
        },)+];
    };
}

// Every file of `crates/queen-broker/dashboard/`, the page first.
assets! {
    "index.html" => "text/html; charset=utf-8",
    "app.css" => "text/css; charset=utf-8",
    "app.js" => "text/javascript; charset=utf-8",
    "dom.js" => "text/javascript; charset=utf-8",
    "api.js" => "text/javascript; charset=utf-8",
    "ui.js" => "text/javascript; charset=utf-8",
    "charts.js" => "text/javascript; charset=utf-8",
    "actions.js" => "text/javascript; charset=utf-8",
    "overview.js" => "text/javascript; charset=utf-8",
    "queue.js" => "text/javascript; charset=utf-8",
    "groups.js" => "text/javascript; charset=utf-8",
    "dlq.js" => "text/javascript; charset=utf-8",
    "message.js" => "text/javascript; charset=utf-8",
    "icon.svg" => "image/svg+xml",
}

/// The page is served for `/dashboard` and `/dashboard/`; everything it loads comes from
/// `'self'`, and it runs no inline script or style, so the policy can forbid both.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One validator for every file: they change together, with the binary.
static ETAG: LazyLock<String> = LazyLock::new(|| {
    let mut digest = Sha256::new();
    for asset in ASSETS {
        digest.update(asset.name.as_bytes());
        digest.update(asset.bytes);
    }
    let hex: String = digest.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
});

/// `GET /dashboard` and `GET /dashboard/{asset}`.
pub async fn asset(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let name = match req.match_info().get("asset").unwrap_or_default() {
        "" => "index.html",
        name => name,
    };
    let asset = ASSETS
        .iter()
        .find(|asset| asset.name == name)
        .ok_or_else(|| ApiError::NotFound(format!("the dashboard has no file {name:?}")))?;
    let etag = ETAG.as_str();
    let fresh = req.headers().get(header::IF_NONE_MATCH).and_then(|value| value.to_str().ok()) == Some(etag);
    let mut answer = if fresh { HttpResponse::NotModified() } else { HttpResponse::Ok() };
    answer
        .insert_header((header::ETAG, etag))
        // Revalidated on every load, so a new broker version shows at once.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .insert_header((header::REFERRER_POLICY, "no-referrer"));
    if fresh {
        return Ok(answer.finish());
    }
    Ok(answer.content_type(asset.content_type).body(asset.bytes))
}

#[cfg(test)]
mod tests {
    use super::ASSETS;

    /// Every file the page names is embedded, and nothing embedded is unused.
    #[test]
    fn the_page_loads_exactly_the_embedded_files() {
        let page = std::str::from_utf8(ASSETS[0].bytes).expect("UTF-8");
        for asset in &ASSETS[1..] {
            assert!(page.contains(&format!("/dashboard/{}", asset.name)), "index.html loads {}", asset.name);
        }
        assert!(!page.contains("<script>") && !page.contains(" style="), "no inline script or style");
    }
}
