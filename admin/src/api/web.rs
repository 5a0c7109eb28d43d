//! The admin web app (`frontend/`), embedded in the binary and served under `/` of the admin
//! listener.
//!
//! # Key Components
//! - [`serve`]: the router's fallback: `GET`/`HEAD` of a file under `frontend/dist/` answers it
//!   (hashed `assets/*` cached for a year, everything else `no-cache`); any other path without
//!   a file extension answers `index.html` (the app routes on the client). Every answer carries
//!   a strict `Content-Security-Policy` (scripts and connections to this origin only), and
//!   `X-Frame-Options: DENY` / `frame-ancestors 'none'` against clickjacking.
//!
//! The files are the committed build output (`admin/build.rs` embeds them); the app itself
//! holds no secret, so it is served without authentication: everything it shows comes from
//! `/api/admin/*`, which needs a login.

use axum::{
    extract::State,
    http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri},
    response::{IntoResponse, Response},
};

use crate::api::check_host_and_site;

mod assets {
    include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));
}

const NOT_BUILT: &str = "<!doctype html><meta charset=utf-8><title>codex-gateway admin</title>\
<p>The admin web app is not built into this binary: run <code>npm ci &amp;&amp; npm run build</code> \
in <code>frontend/</code> and rebuild. The admin API is at <code>/api/admin/</code>.</p>";

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
img-src 'self' data:; connect-src 'self'; font-src 'self' data:; object-src 'none'; \
base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "json" | "map" => "application/json",
        "woff2" => "font/woff2",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn find(path: &str) -> Option<&'static [u8]> {
    assets::ASSETS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, b)| *b)
}

/// How many files are embedded (0 when the app was not built).
pub fn embedded_files() -> usize {
    assets::ASSETS.len()
}

fn secure(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

/// Serves the web app (see the module docs).
pub(crate) async fn serve(
    State(session): State<std::sync::Arc<crate::services::Session>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = check_host_and_site(&session.auth, &headers) {
        return e.into_response();
    }
    if method != Method::GET && method != Method::HEAD {
        return secure((StatusCode::METHOD_NOT_ALLOWED, "method not allowed").into_response());
    }
    let path = uri.path().trim_start_matches('/');
    let (file, body) = match find(path) {
        Some(b) if !path.is_empty() => (path, b),
        _ => {
            let last = path.rsplit('/').next().unwrap_or("");
            if last.contains('.') {
                return secure((StatusCode::NOT_FOUND, "not found").into_response());
            }
            match find("index.html") {
                Some(b) => ("index.html", b),
                None => {
                    return secure(
                        (
                            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                            NOT_BUILT,
                        )
                            .into_response(),
                    )
                }
            }
        }
    };
    let cache = if file.starts_with("assets/") {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    secure(
        (
            [
                (header::CONTENT_TYPE, content_type(file)),
                (header::CACHE_CONTROL, cache),
            ],
            if method == Method::HEAD {
                &[][..]
            } else {
                body
            },
        )
            .into_response(),
    )
}
