//! Response building helpers shared by the routes.
//!
//! # Key Components
//! - [`Body`]: the one body type of the service (full bodies and SSE streams, boxed).
//! - [`json`], [`detail`], [`openai_error`]: the upstream's error body shapes.

use std::{convert::Infallible, io};

use bytes::Bytes;
use http::{header::HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};

/// The response body type of every route.
pub(crate) type Body = UnsyncBoxBody<Bytes, io::Error>;

/// A full (non-streaming) body.
pub(crate) fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// A response with a status and a full body of the given content type.
pub(crate) fn with_body(
    status: u16,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    r
}

/// `application/json` response.
pub(crate) fn json(status: u16, body: impl Into<Bytes>) -> Response<Body> {
    with_body(status, "application/json", body)
}

/// `{"detail":"..."}`, the FastAPI-style body of the Codex backend's validation errors.
pub(crate) fn detail(status: u16, msg: &str) -> Response<Body> {
    json(status, serde_json::json!({ "detail": msg }).to_string())
}

/// `{"error":{"message","type","code"}}`.
pub(crate) fn openai_error(
    status: u16,
    message: &str,
    ty: &str,
    code: Option<&str>,
) -> Response<Body> {
    let err = serde_json::json!({"error": {"message": message, "type": ty, "code": code}});
    json(status, err.to_string())
}

/// `{"error":{"message","type":"invalid_request_error","code"},"status":N}`: the shape of the
/// backend's authentication errors (`token_invalidated`, ...).
pub(crate) fn auth_error(status: u16, message: &str, code: &str) -> Response<Body> {
    let err = serde_json::json!({
        "error": {"message": message, "type": "invalid_request_error", "code": code},
        "status": status,
    });
    json(status, err.to_string())
}

/// Inserts a header; values that are not valid header bytes are skipped.
pub(crate) fn set_header(r: &mut Response<Body>, name: &'static str, value: impl AsRef<str>) {
    if let Ok(v) = HeaderValue::from_str(value.as_ref()) {
        r.headers_mut().insert(HeaderName::from_static(name), v);
    }
}
