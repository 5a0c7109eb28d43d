//! The data plane's one error type and the one place that turns it into a client response.
//!
//! # Key Components
//! - [`Error`]: `kind` + where it came from ([`Side`]) + an optional cause. Built with the
//!   constructors; never logged with secrets.
//! - [`ErrorKind`]: every way a request can fail, from bad client input to exhausted accounts.
//! - [`Error::to_openai`]: the exhaustive mapping to HTTP status, OpenAI-shaped body and extra
//!   headers. HTTP responses and terminal SSE events both come from it.
//! - [`Dialect`] / [`Error::render`]: the same mapping in the client's dialect (the route's,
//!   `api::Route::dialect`): the kind decides status, type, code and extra headers (a 426's
//!   `upgrade`), the dialect only the body's shape: OpenAI's, or
//!   Anthropic's (`{"type":"error","error":{"type","message"}}`, [`Error::to_anthropic`],
//!   also used for the stream's `error` event after the commit); status, message and
//!   `Retry-After` always come from [`Error::to_openai`].
//! - The request id ([`crate::request_id`]) rides where each dialect's real API puts it: the
//!   `x-request-id` header always (written by the HTTP codec); in Anthropic's error body too
//!   (top-level `request_id`, [`Error::render_as`]); never in OpenAI's body (OpenAI sends the
//!   header only); a top-level `request_id` on our WebSocket `error` events
//!   ([`Error::ws_error_event`]), which have no headers.

use std::fmt;

use codex_protocol::{classify::Failure, classify::FailureClass, openai_error::ErrorBody};

/// Which side of the proxy an error comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client sent something wrong.
    Downstream,
    /// The upstream failed or refused.
    Upstream,
    /// Our own fault.
    Internal,
}

/// Every failure the data plane can report.
#[derive(Debug, Clone, PartialEq)]
pub enum ErrorKind {
    /// No or unknown client key.
    Unauthorized {
        /// Whether a key was presented at all.
        key_present: bool,
    },
    /// The body exceeded the limit.
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// Malformed request (JSON or fields).
    BadRequest {
        /// Message.
        message: String,
        /// Offending parameter.
        param: Option<String>,
    },
    /// `previous_response_id` cannot be resolved.
    ContinuationNotFound,
    /// Unknown route.
    NotFound,
    /// Known route, wrong method.
    MethodNotAllowed,
    /// `GET /v1/responses` without `Upgrade: websocket`: the resource is the Responses
    /// WebSocket (426, with `Upgrade: websocket`).
    UpgradeRequired,
    /// A request the HTTP/1.1 codec could not read (`server::h1::ReadError::Reject`: bad
    /// framing, a head over its limits, a read past its deadline): its status and message.
    BadHttpRequest {
        /// HTTP status (400, 408, 431, 501...).
        status: u16,
        /// What was wrong.
        message: String,
    },
    /// A WebSocket upgrade request the handshake refused (`ws::handshake::accept`).
    WsHandshake(crate::ws::handshake::HandshakeError),
    /// Unknown model.
    ModelNotFound(String),
    /// The upstream answered with an error we return to the client.
    Upstream(Failure),
    /// Could not reach the upstream.
    UpstreamConnect,
    /// The upstream did not answer in time.
    UpstreamTimeout,
    /// The upstream broke the protocol or the connection after the request was sent.
    UpstreamProtocol,
    /// Every upstream connection of this worker is at its stream limit (nothing was sent).
    UpstreamSaturated,
    /// No account can serve: all are out of quota until `earliest_reset` (unix seconds).
    QuotaExhausted {
        /// Earliest reset among the accounts.
        earliest_reset: Option<u64>,
    },
    /// No account can serve for another reason.
    NoAccountAvailable,
    /// Storage down or draining.
    Unavailable,
    /// Something of ours broke.
    Internal,
    /// The response passed `max_stream_output_bytes` (a runaway stream): it was ended.
    OutputLimit {
        /// The limit in bytes.
        limit: u64,
    },
    /// Refused at the front door (`crate::front_door`): the instance's or the client IP's
    /// request rate (429 with `Retry-After`), or an address not on the allow-list (403).
    FrontDoor(crate::front_door::Refusal),
    /// A connection refused at accept, before any request (`crate::server::admission`): the
    /// process's open-connection cap (503) or the client IP's (429), both `Retry-After: 1`.
    ConnectionCap(crate::server::admission::Refusal),
    /// The client key is over one of its limits (`gateway::limits`).
    KeyLimit {
        /// Which limit.
        limit: KeyLimit,
        /// Seconds until it lifts (`Retry-After`).
        retry_after: u64,
    },
}

/// A per-key limit a request was refused for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLimit {
    /// Requests per minute.
    Rpm(u32),
    /// Requests in flight.
    Concurrency(u32),
    /// Open client WebSocket sessions (`max_ws_sessions_per_key`).
    WsSessions(u32),
    /// Tokens per UTC day.
    TokensPerDay(u64),
    /// Tokens per UTC month.
    TokensPerMonth(u64),
    /// Cost per UTC day, micro-USD.
    CostPerDay(u64),
    /// Cost per UTC month, micro-USD.
    CostPerMonth(u64),
    /// What is left of a token (`cost: false`) or cost budget is held by the key's requests
    /// in flight (`gateway::limits`: reserve at admission, settle at the end).
    BudgetHeld {
        /// A cost budget (else a token budget).
        cost: bool,
    },
}

/// A data-plane error.
#[derive(Debug, Clone)]
pub struct Error {
    /// What failed.
    pub kind: ErrorKind,
    /// Where it came from.
    pub side: Side,
    /// Lower-level cause, for logs (never contains secrets).
    pub cause: Option<String>,
}

/// The client dialect an error is rendered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `{"error":{"message","type","code","param"}}` (OpenAI and Codex clients).
    OpenAi,
    /// `{"type":"error","error":{"type","message"}}` (Anthropic Messages clients).
    Anthropic,
}

/// An error as an HTTP answer in one dialect.
#[derive(Debug, Clone)]
pub struct HttpRendering {
    /// HTTP status.
    pub status: u16,
    /// JSON body.
    pub body: Vec<u8>,
    /// `Retry-After` seconds, when meaningful.
    pub retry_after: Option<u64>,
    /// Other headers the kind answers with (the same in every dialect).
    pub headers: &'static [(&'static str, &'static str)],
}

/// The client-facing rendering of an [`Error`].
#[derive(Debug, Clone)]
pub struct Rendered {
    /// HTTP status.
    pub status: u16,
    /// OpenAI-shaped body.
    pub body: ErrorBody,
    /// `Retry-After` seconds, when meaningful.
    pub retry_after: Option<u64>,
}

/// Anthropic's error body (`codex_protocol::anthropic::error_json`), with the top-level
/// `request_id` Anthropic's API answers when one is given.
pub fn anthropic_error_body(error_type: &str, message: &str, request_id: Option<&str>) -> Vec<u8> {
    let mut out = codex_protocol::anthropic::error_json(error_type, message);
    if let (Some(id), Some(b'}')) = (request_id, out.last()) {
        out.pop();
        out.extend_from_slice(b",\"request_id\":");
        out.extend_from_slice(sonic_rs::to_string(id).unwrap_or_default().as_bytes());
        out.push(b'}');
    }
    out
}

// === impl Error ===

impl Error {
    /// A new error.
    pub fn new(kind: ErrorKind, side: Side) -> Self {
        Self {
            kind,
            side,
            cause: None,
        }
    }

    /// Attaches a cause for logs.
    pub fn with_cause(mut self, cause: impl fmt::Display) -> Self {
        self.cause = Some(cause.to_string());
        self
    }

    /// A 400 with a message and parameter.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self::new(
            ErrorKind::BadRequest {
                message: message.into(),
                param: param.map(str::to_owned),
            },
            Side::Downstream,
        )
    }

    /// An upstream failure returned to the client.
    pub fn upstream(f: Failure) -> Self {
        Self::new(ErrorKind::Upstream(f), Side::Upstream)
    }

    /// The `response.failed` event data for a failure after the commit (Responses shape).
    pub fn response_failed_event(&self, response_id: Option<&str>) -> Vec<u8> {
        let r = self.to_openai();
        let data = sonic_rs::json!({
            "type": "response.failed",
            "response": {
                "id": response_id.unwrap_or(""),
                "object": "response",
                "status": "failed",
                "error": {"code": r.body.code, "message": r.body.message, "type": r.body.error_type},
            }
        });
        sonic_rs::to_vec(&data).unwrap_or_default()
    }

    /// One terminal SSE event for a failure after the commit (Responses shape).
    pub fn response_failed_frame(&self, response_id: Option<&str>) -> Vec<u8> {
        codex_protocol::sse::frame("response.failed", &self.response_failed_event(response_id))
    }

    /// The WebSocket `error` event for a failure before the commit (the Responses WebSocket
    /// shape: `{"type":"error","status":..,"error":{"type","code","message","param"}}`), with
    /// the turn's `request_id` at the top level (a WebSocket event has no headers).
    pub fn ws_error_event(&self, request_id: &str) -> Vec<u8> {
        let r = self.to_openai();
        let data = sonic_rs::json!({
            "type": "error",
            "status": r.status,
            "request_id": request_id,
            "error": {
                "type": r.body.error_type,
                "code": r.body.code,
                "message": r.body.message,
                "param": r.body.param,
            }
        });
        sonic_rs::to_vec(&data).unwrap_or_default()
    }

    /// Anthropic's rendering: `(error type, message)`, the type following the status of
    /// [`Error::to_openai`] (400 `invalid_request_error`, 401 `authentication_error`, 403
    /// `permission_error`, 404 `not_found_error`, 413 `request_too_large`, 429
    /// `rate_limit_error`, 503 `overloaded_error`, other 5xx `api_error`).
    pub fn to_anthropic(&self) -> (&'static str, Rendered) {
        let r = self.to_openai();
        (
            codex_protocol::anthropic::error_type_for_status(r.status),
            r,
        )
    }

    /// The HTTP answer in `dialect` (same status and `Retry-After` in both), without a
    /// request id in the body.
    pub fn render(&self, dialect: Dialect) -> HttpRendering {
        self.render_as(dialect, None)
    }

    /// The HTTP answer in `dialect`; Anthropic's body carries `request_id` at the top level
    /// when given, as Anthropic's API does (OpenAI's body never does: its id is the header).
    pub fn render_as(&self, dialect: Dialect, request_id: Option<&str>) -> HttpRendering {
        let headers = self.headers();
        match dialect {
            Dialect::OpenAi => {
                let r = self.to_openai();
                HttpRendering {
                    status: r.status,
                    body: r.body.to_json(),
                    retry_after: r.retry_after,
                    headers,
                }
            }
            Dialect::Anthropic => {
                let (ty, r) = self.to_anthropic();
                HttpRendering {
                    status: r.status,
                    body: anthropic_error_body(ty, &r.body.message, request_id),
                    retry_after: r.retry_after,
                    headers,
                }
            }
        }
    }

    /// The headers the kind answers with beside the body and `Retry-After`: how to upgrade
    /// (426), the WebSocket version we speak (a handshake's 426).
    fn headers(&self) -> &'static [(&'static str, &'static str)] {
        match &self.kind {
            ErrorKind::UpgradeRequired => &[("upgrade", "websocket"), ("connection", "upgrade")],
            ErrorKind::WsHandshake(h) => h.headers(),
            _ => &[],
        }
    }

    /// The failure class stored in usage records: the classifier's class name for an
    /// upstream failure (`codex_protocol::classify`, the one owner), the kind's name for ours.
    pub fn class(&self) -> &'static str {
        match &self.kind {
            ErrorKind::Upstream(f) => f.class.name(),
            ErrorKind::Unauthorized { .. } => "unauthorized",
            ErrorKind::BodyTooLarge { .. } => "body_too_large",
            ErrorKind::BadRequest { .. } => "bad_request",
            ErrorKind::ContinuationNotFound => "previous_response_not_found",
            ErrorKind::NotFound => "not_found",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::UpgradeRequired => "upgrade_required",
            ErrorKind::BadHttpRequest { status: 408, .. } => "timeout",
            ErrorKind::BadHttpRequest { .. } => "bad_http_request",
            ErrorKind::WsHandshake(_) => "websocket_handshake_failed",
            ErrorKind::ModelNotFound(_) => "model_not_found",
            ErrorKind::UpstreamConnect => "upstream_connect",
            ErrorKind::UpstreamTimeout => "upstream_timeout",
            ErrorKind::UpstreamProtocol => "upstream_protocol",
            ErrorKind::UpstreamSaturated => "upstream_saturated",
            ErrorKind::QuotaExhausted { .. } => "quota_exhausted",
            ErrorKind::NoAccountAvailable => "no_account_available",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
            ErrorKind::OutputLimit { .. } => "output_limit",
            ErrorKind::FrontDoor(crate::front_door::Refusal::NotAllowed) => {
                "front_door_not_allowed"
            }
            ErrorKind::FrontDoor(_) => "front_door_rate_limit",
            ErrorKind::ConnectionCap(_) => "connection_cap",
            ErrorKind::KeyLimit { limit, .. } => match limit {
                KeyLimit::Rpm(_) | KeyLimit::Concurrency(_) | KeyLimit::WsSessions(_) => {
                    "key_rate_limit"
                }
                KeyLimit::TokensPerDay(_)
                | KeyLimit::TokensPerMonth(_)
                | KeyLimit::CostPerDay(_)
                | KeyLimit::CostPerMonth(_)
                | KeyLimit::BudgetHeld { .. } => "key_budget",
            },
        }
    }

    /// The machine code used in usage records and metrics.
    pub fn code(&self) -> String {
        self.to_openai()
            .body
            .code
            .unwrap_or_else(|| "error".to_owned())
    }

    /// The one mapping from error to HTTP status and OpenAI-shaped body.
    pub fn to_openai(&self) -> Rendered {
        let r = |status, body, retry_after| Rendered {
            status,
            body,
            retry_after,
        };
        match &self.kind {
            ErrorKind::Unauthorized { key_present } => r(
                401,
                ErrorBody::new(
                    if *key_present {
                        "Incorrect API key provided. Check the key you passed in the Authorization header."
                    } else {
                        "You didn't provide an API key. Pass it as `Authorization: Bearer sk-...` or `x-api-key`."
                    },
                    "invalid_request_error",
                    Some(if *key_present { "invalid_api_key" } else { "missing_api_key" }),
                ),
                None,
            ),
            ErrorKind::BodyTooLarge { limit } => r(
                413,
                ErrorBody::new(
                    format!("Request body exceeds the limit of {limit} bytes."),
                    "invalid_request_error",
                    Some("request_too_large"),
                ),
                None,
            ),
            ErrorKind::BadRequest { message, param } => r(
                400,
                ErrorBody::new(message.clone(), "invalid_request_error", Some("invalid_request"))
                    .with_param(param.as_deref()),
                None,
            ),
            ErrorKind::ContinuationNotFound => r(
                400,
                ErrorBody::new(
                    "Previous response not found: it is unknown, expired, belongs to another key, or was created with store:false. Resend the full conversation in `input`.",
                    "invalid_request_error",
                    Some("previous_response_not_found"),
                )
                .with_param(Some("previous_response_id")),
                None,
            ),
            ErrorKind::NotFound => r(
                404,
                ErrorBody::new("Unknown route.", "invalid_request_error", Some("not_found")),
                None,
            ),
            ErrorKind::MethodNotAllowed => r(
                405,
                ErrorBody::new(
                    "Method not allowed for this route.",
                    "invalid_request_error",
                    Some("method_not_allowed"),
                ),
                None,
            ),
            ErrorKind::UpgradeRequired => r(
                426,
                ErrorBody::new(
                    "GET /v1/responses is the Responses WebSocket: send Upgrade: websocket, or POST for HTTP.",
                    "invalid_request_error",
                    Some("invalid_request"),
                ),
                None,
            ),
            ErrorKind::BadHttpRequest { status, message } => r(
                *status,
                ErrorBody::new(
                    message.clone(),
                    "invalid_request_error",
                    Some("bad_http_request"),
                ),
                None,
            ),
            ErrorKind::WsHandshake(h) => r(
                h.status(),
                ErrorBody::new(
                    h.message().to_owned(),
                    "invalid_request_error",
                    Some("websocket_handshake_failed"),
                ),
                None,
            ),
            ErrorKind::ModelNotFound(m) => r(
                404,
                ErrorBody::new(
                    format!("The model `{m}` does not exist or you do not have access to it."),
                    "invalid_request_error",
                    Some("model_not_found"),
                )
                .with_param(Some("model")),
                None,
            ),
            ErrorKind::Upstream(f) => upstream_rendering(f),
            ErrorKind::UpstreamConnect => r(
                502,
                ErrorBody::new(
                    "Could not reach the upstream Codex service.",
                    "server_error",
                    Some("upstream_unreachable"),
                ),
                None,
            ),
            ErrorKind::UpstreamTimeout => r(
                504,
                ErrorBody::new(
                    "The upstream Codex service did not answer in time.",
                    "server_error",
                    Some("upstream_timeout"),
                ),
                None,
            ),
            ErrorKind::UpstreamProtocol => r(
                502,
                ErrorBody::new(
                    "The upstream Codex service closed the stream before completing the response.",
                    "server_error",
                    Some("stream_disconnected"),
                ),
                None,
            ),
            ErrorKind::UpstreamSaturated => r(
                503,
                ErrorBody::new(
                    "The gateway's upstream connections are at capacity; retry shortly.",
                    "server_error",
                    Some("upstream_saturated"),
                ),
                Some(1),
            ),
            ErrorKind::QuotaExhausted { earliest_reset } => {
                let now = shared_state::now_ms() / 1000;
                let retry = earliest_reset.map(|r| r.saturating_sub(now).max(1));
                let mut body = ErrorBody::new(
                    "The usage limit has been reached on every account in the pool.",
                    "usage_limit_reached",
                    Some("usage_limit_reached"),
                );
                body.resets_at = *earliest_reset;
                body.resets_in_seconds = retry;
                r(429, body, retry)
            }
            ErrorKind::NoAccountAvailable => r(
                503,
                ErrorBody::new(
                    "No upstream account is available to serve this request right now.",
                    "server_error",
                    Some("no_account_available"),
                ),
                Some(5),
            ),
            ErrorKind::Unavailable => r(
                503,
                ErrorBody::new(
                    "The gateway is unavailable (storage down or shutting down).",
                    "server_error",
                    Some("service_unavailable"),
                ),
                Some(5),
            ),
            ErrorKind::ConnectionCap(refusal) => {
                use crate::server::admission::Refusal;
                match refusal {
                    Refusal::Global => r(
                        503,
                        ErrorBody::new(
                            "The gateway is at its connection limit; retry shortly.",
                            "server_error",
                            Some("too_many_connections"),
                        ),
                        Some(1),
                    ),
                    Refusal::PerIp => r(
                        429,
                        ErrorBody::new(
                            "Too many open connections from this address; close some or retry shortly.",
                            "rate_limit_error",
                            Some("too_many_connections_per_ip"),
                        ),
                        Some(1),
                    ),
                }
            }
            ErrorKind::FrontDoor(refusal) => {
                use crate::front_door::Refusal;
                match *refusal {
                    Refusal::Global { rps, retry_after } => r(
                        429,
                        ErrorBody::new(
                            format!("The gateway is receiving more requests than it serves ({rps} per second). Please try again in {}s.", retry_after.max(1)),
                            "requests",
                            Some("rate_limit_exceeded"),
                        ),
                        Some(retry_after.max(1)),
                    ),
                    Refusal::PerIp { rps, retry_after } => r(
                        429,
                        ErrorBody::new(
                            format!("Rate limit reached for requests from your address ({rps} per second). Please try again in {}s.", retry_after.max(1)),
                            "requests",
                            Some("rate_limit_exceeded"),
                        ),
                        Some(retry_after.max(1)),
                    ),
                    Refusal::NotAllowed => r(
                        403,
                        ErrorBody::new(
                            "This gateway does not serve requests from your address.",
                            "request_forbidden",
                            Some("ip_not_allowed"),
                        ),
                        None,
                    ),
                }
            }
            ErrorKind::KeyLimit { limit, retry_after } => {
                let retry = (*retry_after).max(1);
                let usd = |m: u64| format!("${:.2}", m as f64 / 1e6);
                let (message, ty, code) = match limit {
                    KeyLimit::Rpm(n) => (
                        format!("Rate limit reached for requests per minute (RPM) on this key: limit {n}. Please try again in {retry}s."),
                        "requests",
                        "rate_limit_exceeded",
                    ),
                    KeyLimit::Concurrency(n) => (
                        format!("Too many concurrent requests on this key: limit {n}. Please try again when one finishes."),
                        "requests",
                        "rate_limit_exceeded",
                    ),
                    KeyLimit::WsSessions(n) => (
                        format!("Too many open WebSocket sessions on this key: limit {n}. Close one or try again later."),
                        "requests",
                        "too_many_websocket_sessions",
                    ),
                    KeyLimit::TokensPerDay(n) => (
                        format!("This key exceeded its daily token budget ({n} tokens). It resets at 00:00 UTC."),
                        "insufficient_quota",
                        "insufficient_quota",
                    ),
                    KeyLimit::TokensPerMonth(n) => (
                        format!("This key exceeded its monthly token budget ({n} tokens). It resets on the 1st, 00:00 UTC."),
                        "insufficient_quota",
                        "insufficient_quota",
                    ),
                    KeyLimit::CostPerDay(m) => (
                        format!("This key exceeded its daily spend budget ({}). It resets at 00:00 UTC.", usd(*m)),
                        "insufficient_quota",
                        "insufficient_quota",
                    ),
                    KeyLimit::CostPerMonth(m) => (
                        format!("This key exceeded its monthly spend budget ({}). It resets on the 1st, 00:00 UTC.", usd(*m)),
                        "insufficient_quota",
                        "insufficient_quota",
                    ),
                    KeyLimit::BudgetHeld { cost } => (
                        format!("The rest of this key's {} budget is held by its requests in flight. Please try again in {retry}s or when one finishes.", if *cost { "spend" } else { "token" }),
                        "requests",
                        "rate_limit_exceeded",
                    ),
                };
                r(429, ErrorBody::new(message, ty, Some(code)), Some(retry))
            }
            ErrorKind::Internal => r(
                500,
                ErrorBody::new("Internal gateway error.", "server_error", Some("internal_error")),
                None,
            ),
            ErrorKind::OutputLimit { limit } => r(
                502,
                ErrorBody::new(
                    format!("The response exceeded the gateway's limit of {limit} bytes and was ended."),
                    "server_error",
                    Some("stream_output_limit"),
                ),
                None,
            ),
        }
    }
}

/// Upstream failures: request errors keep the upstream status and message; account-scoped
/// failures that reach the client (no other account left) keep their meaning.
fn upstream_rendering(f: &Failure) -> Rendered {
    let msg = f
        .message
        .clone()
        .unwrap_or_else(|| format!("The upstream Codex service returned HTTP {}.", f.status));
    // Status and type are the class's (the one table, `FailureClass::client_status`); the
    // code, the message and the hints are the upstream's where it gave them.
    let c = &f.class;
    let (status, ty, code, retry) = match c {
        FailureClass::Request => {
            let status = if (400..500).contains(&f.status) {
                f.status
            } else {
                c.client_status()
            };
            let code = f.code.clone().unwrap_or_else(|| {
                if msg.starts_with("Unsupported parameter") {
                    "unsupported_parameter".to_owned()
                } else {
                    "invalid_request".to_owned()
                }
            });
            (status, c.openai_type().to_owned(), code, None)
        }
        FailureClass::ContinuationNotFound => (
            c.client_status(),
            c.openai_type().to_owned(),
            "previous_response_not_found".to_owned(),
            None,
        ),
        FailureClass::UsageLimit { resets_at } => {
            let now = shared_state::now_ms() / 1000;
            let retry = resets_at.map(|r| r.saturating_sub(now).max(1));
            let mut body = ErrorBody::new(msg, c.openai_type(), Some(c.name()));
            body.resets_at = *resets_at;
            body.resets_in_seconds = retry;
            return Rendered {
                status: c.client_status(),
                body,
                retry_after: retry,
            };
        }
        FailureClass::RateLimited { retry_after_s } => (
            c.client_status(),
            c.openai_type().to_owned(),
            "rate_limit_exceeded".to_owned(),
            *retry_after_s,
        ),
        FailureClass::UsageNotIncluded | FailureClass::ModelNotSupported => (
            c.client_status(),
            c.openai_type().to_owned(),
            c.name().to_owned(),
            None,
        ),
        FailureClass::AuthExpired
        | FailureClass::Deactivated
        | FailureClass::Cloudflare
        | FailureClass::Forbidden => (
            c.client_status(),
            c.openai_type().to_owned(),
            "upstream_account_unavailable".to_owned(),
            None,
        ),
        FailureClass::Overloaded { retry_after_s } => (
            c.client_status(),
            c.openai_type().to_owned(),
            f.code
                .clone()
                .unwrap_or_else(|| "server_is_overloaded".to_owned()),
            Some(retry_after_s.unwrap_or(2)),
        ),
    };
    let mut body = ErrorBody::new(msg, &ty, Some(&code));
    body.param = f.param.clone();
    Rendered {
        status,
        body,
        retry_after: retry,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.to_openai();
        write!(f, "{} ({})", r.body.message, r.status)?;
        if let Some(c) = &self.cause {
            write!(f, ": {c}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;
    use codex_protocol::classify::classify_http;
    use sonic_rs::JsonValueTrait;

    #[test]
    fn every_kind_maps_to_an_openai_error() {
        let cases = [
            (ErrorKind::Unauthorized { key_present: false }, 401),
            (ErrorKind::BodyTooLarge { limit: 1 }, 413),
            (ErrorKind::NotFound, 404),
            (ErrorKind::UpstreamConnect, 502),
            (ErrorKind::UpstreamTimeout, 504),
            (ErrorKind::UpstreamSaturated, 503),
            (
                ErrorKind::QuotaExhausted {
                    earliest_reset: Some(u64::MAX / 2),
                },
                429,
            ),
            (ErrorKind::NoAccountAvailable, 503),
            (ErrorKind::Internal, 500),
            (ErrorKind::OutputLimit { limit: 1 }, 502),
            (
                ErrorKind::FrontDoor(crate::front_door::Refusal::Global {
                    rps: 5,
                    retry_after: 0,
                }),
                429,
            ),
            (
                ErrorKind::FrontDoor(crate::front_door::Refusal::PerIp {
                    rps: 1,
                    retry_after: 3,
                }),
                429,
            ),
            (
                ErrorKind::FrontDoor(crate::front_door::Refusal::NotAllowed),
                403,
            ),
        ];
        for (k, status) in cases {
            let r = Error::new(k, Side::Internal).to_openai();
            assert_eq!(r.status, status);
            assert!(!r.body.message.is_empty());
        }
    }

    #[test]
    fn anthropic_rendering_follows_the_one_mapping() {
        let cases: [(Error, u16, &str); 10] = [
            (
                Error::new(
                    ErrorKind::Unauthorized { key_present: true },
                    Side::Downstream,
                ),
                401,
                "authentication_error",
            ),
            (
                Error::bad_request("bad", Some("x")),
                400,
                "invalid_request_error",
            ),
            (
                Error::new(ErrorKind::ModelNotFound("m".into()), Side::Downstream),
                404,
                "not_found_error",
            ),
            (
                Error::new(
                    ErrorKind::QuotaExhausted {
                        earliest_reset: None,
                    },
                    Side::Upstream,
                ),
                429,
                "rate_limit_error",
            ),
            (
                Error::upstream(classify_http(
                    503,
                    None,
                    None,
                    br#"{"error":{"code":"server_is_overloaded","message":"busy"}}"#,
                )),
                503,
                "overloaded_error",
            ),
            (
                Error::new(ErrorKind::UpstreamProtocol, Side::Upstream),
                502,
                "api_error",
            ),
            (
                Error::new(ErrorKind::Internal, Side::Internal),
                500,
                "api_error",
            ),
            (
                Error::new(ErrorKind::BodyTooLarge { limit: 1 }, Side::Downstream),
                413,
                "request_too_large",
            ),
            (
                Error::new(
                    ErrorKind::FrontDoor(crate::front_door::Refusal::PerIp {
                        rps: 1,
                        retry_after: 2,
                    }),
                    Side::Downstream,
                ),
                429,
                "rate_limit_error",
            ),
            (
                Error::new(
                    ErrorKind::FrontDoor(crate::front_door::Refusal::NotAllowed),
                    Side::Downstream,
                ),
                403,
                "permission_error",
            ),
        ];
        for (e, status, ty) in cases {
            let h = e.render(Dialect::Anthropic);
            assert_eq!(h.status, status, "{e}");
            assert_eq!(h.status, e.render(Dialect::OpenAi).status);
            let v: sonic_rs::Value = sonic_rs::from_slice(&h.body).unwrap();
            assert_eq!(v["type"].as_str(), Some("error"));
            assert_eq!(v["error"]["type"].as_str(), Some(ty), "{e}");
            assert_eq!(
                v["error"]["message"].as_str(),
                Some(e.to_openai().body.message.as_str())
            );
        }
    }

    /// The one mapping decides status, type, code and headers for every kind; a dialect only
    /// shapes the body (Anthropic's type follows the status).
    #[test]
    fn each_kind_has_one_status_and_type_in_both_dialects() {
        use crate::{front_door::Refusal, ws::handshake::HandshakeError};
        let down = |k| Error::new(k, Side::Downstream);
        // (error, status, OpenAI type, OpenAI code, Anthropic type, extra headers)
        #[allow(clippy::type_complexity)]
        let cases: Vec<(Error, u16, &str, &str, &str, &[(&str, &str)])> = vec![
            (
                down(ErrorKind::Unauthorized { key_present: false }),
                401,
                "invalid_request_error",
                "missing_api_key",
                "authentication_error",
                &[],
            ),
            (
                down(ErrorKind::Unauthorized { key_present: true }),
                401,
                "invalid_request_error",
                "invalid_api_key",
                "authentication_error",
                &[],
            ),
            (
                down(ErrorKind::BodyTooLarge { limit: 9 }),
                413,
                "invalid_request_error",
                "request_too_large",
                "request_too_large",
                &[],
            ),
            (
                Error::bad_request("b", None),
                400,
                "invalid_request_error",
                "invalid_request",
                "invalid_request_error",
                &[],
            ),
            (
                down(ErrorKind::ContinuationNotFound),
                400,
                "invalid_request_error",
                "previous_response_not_found",
                "invalid_request_error",
                &[],
            ),
            (
                down(ErrorKind::NotFound),
                404,
                "invalid_request_error",
                "not_found",
                "not_found_error",
                &[],
            ),
            (
                down(ErrorKind::MethodNotAllowed),
                405,
                "invalid_request_error",
                "method_not_allowed",
                "invalid_request_error",
                &[],
            ),
            (
                down(ErrorKind::UpgradeRequired),
                426,
                "invalid_request_error",
                "invalid_request",
                "invalid_request_error",
                &[("upgrade", "websocket"), ("connection", "upgrade")],
            ),
            (
                down(ErrorKind::BadHttpRequest {
                    status: 400,
                    message: "m".into(),
                }),
                400,
                "invalid_request_error",
                "bad_http_request",
                "invalid_request_error",
                &[],
            ),
            (
                down(ErrorKind::BadHttpRequest {
                    status: 408,
                    message: "m".into(),
                }),
                408,
                "invalid_request_error",
                "bad_http_request",
                "invalid_request_error",
                &[],
            ),
            (
                down(ErrorKind::BadHttpRequest {
                    status: 431,
                    message: "m".into(),
                }),
                431,
                "invalid_request_error",
                "bad_http_request",
                "invalid_request_error",
                &[],
            ),
            (
                down(ErrorKind::BadHttpRequest {
                    status: 501,
                    message: "m".into(),
                }),
                501,
                "invalid_request_error",
                "bad_http_request",
                "api_error",
                &[],
            ),
            (
                down(ErrorKind::WsHandshake(HandshakeError::MissingKey)),
                400,
                "invalid_request_error",
                "websocket_handshake_failed",
                "invalid_request_error",
                &[],
            ),
            (
                down(ErrorKind::WsHandshake(HandshakeError::UnsupportedVersion)),
                426,
                "invalid_request_error",
                "websocket_handshake_failed",
                "invalid_request_error",
                &[("sec-websocket-version", "13")],
            ),
            (
                down(ErrorKind::ModelNotFound("m".into())),
                404,
                "invalid_request_error",
                "model_not_found",
                "not_found_error",
                &[],
            ),
            (
                Error::new(ErrorKind::UpstreamConnect, Side::Upstream),
                502,
                "server_error",
                "upstream_unreachable",
                "api_error",
                &[],
            ),
            (
                Error::new(ErrorKind::UpstreamTimeout, Side::Upstream),
                504,
                "server_error",
                "upstream_timeout",
                "api_error",
                &[],
            ),
            (
                Error::new(ErrorKind::UpstreamProtocol, Side::Upstream),
                502,
                "server_error",
                "stream_disconnected",
                "api_error",
                &[],
            ),
            (
                Error::new(ErrorKind::UpstreamSaturated, Side::Internal),
                503,
                "server_error",
                "upstream_saturated",
                "overloaded_error",
                &[],
            ),
            (
                Error::new(
                    ErrorKind::QuotaExhausted {
                        earliest_reset: None,
                    },
                    Side::Upstream,
                ),
                429,
                "usage_limit_reached",
                "usage_limit_reached",
                "rate_limit_error",
                &[],
            ),
            (
                Error::new(ErrorKind::NoAccountAvailable, Side::Upstream),
                503,
                "server_error",
                "no_account_available",
                "overloaded_error",
                &[],
            ),
            (
                Error::new(ErrorKind::Unavailable, Side::Internal),
                503,
                "server_error",
                "service_unavailable",
                "overloaded_error",
                &[],
            ),
            (
                Error::new(ErrorKind::Internal, Side::Internal),
                500,
                "server_error",
                "internal_error",
                "api_error",
                &[],
            ),
            (
                Error::new(ErrorKind::OutputLimit { limit: 1 }, Side::Upstream),
                502,
                "server_error",
                "stream_output_limit",
                "api_error",
                &[],
            ),
            (
                down(ErrorKind::FrontDoor(Refusal::Global {
                    rps: 1,
                    retry_after: 1,
                })),
                429,
                "requests",
                "rate_limit_exceeded",
                "rate_limit_error",
                &[],
            ),
            (
                down(ErrorKind::FrontDoor(Refusal::PerIp {
                    rps: 1,
                    retry_after: 1,
                })),
                429,
                "requests",
                "rate_limit_exceeded",
                "rate_limit_error",
                &[],
            ),
            (
                down(ErrorKind::ConnectionCap(
                    crate::server::admission::Refusal::Global,
                )),
                503,
                "server_error",
                "too_many_connections",
                "overloaded_error",
                &[],
            ),
            (
                down(ErrorKind::ConnectionCap(
                    crate::server::admission::Refusal::PerIp,
                )),
                429,
                "rate_limit_error",
                "too_many_connections_per_ip",
                "rate_limit_error",
                &[],
            ),
            (
                down(ErrorKind::FrontDoor(Refusal::NotAllowed)),
                403,
                "request_forbidden",
                "ip_not_allowed",
                "permission_error",
                &[],
            ),
            (
                down(ErrorKind::KeyLimit {
                    limit: KeyLimit::Rpm(1),
                    retry_after: 3,
                }),
                429,
                "requests",
                "rate_limit_exceeded",
                "rate_limit_error",
                &[],
            ),
            (
                down(ErrorKind::KeyLimit {
                    limit: KeyLimit::Concurrency(1),
                    retry_after: 3,
                }),
                429,
                "requests",
                "rate_limit_exceeded",
                "rate_limit_error",
                &[],
            ),
            (
                down(ErrorKind::KeyLimit {
                    limit: KeyLimit::WsSessions(1),
                    retry_after: 3,
                }),
                429,
                "requests",
                "too_many_websocket_sessions",
                "rate_limit_error",
                &[],
            ),
            (
                down(ErrorKind::KeyLimit {
                    limit: KeyLimit::TokensPerDay(1),
                    retry_after: 3,
                }),
                429,
                "insufficient_quota",
                "insufficient_quota",
                "rate_limit_error",
                &[],
            ),
            (
                down(ErrorKind::KeyLimit {
                    limit: KeyLimit::CostPerMonth(1),
                    retry_after: 3,
                }),
                429,
                "insufficient_quota",
                "insufficient_quota",
                "rate_limit_error",
                &[],
            ),
            (
                down(ErrorKind::KeyLimit {
                    limit: KeyLimit::BudgetHeld { cost: true },
                    retry_after: 3,
                }),
                429,
                "requests",
                "rate_limit_exceeded",
                "rate_limit_error",
                &[],
            ),
        ];
        for (e, status, ty, code, anthropic_ty, headers) in cases {
            let o = e.render(Dialect::OpenAi);
            let v: sonic_rs::Value = sonic_rs::from_slice(&o.body).unwrap();
            assert_eq!(o.status, status, "{e}");
            assert_eq!(v["error"]["type"].as_str(), Some(ty), "{e}");
            assert_eq!(v["error"]["code"].as_str(), Some(code), "{e}");
            assert_eq!(o.headers, headers, "{e}");
            assert_eq!(e.code(), code, "{e}");
            let a = e.render_as(Dialect::Anthropic, Some("req_9"));
            let v: sonic_rs::Value = sonic_rs::from_slice(&a.body).unwrap();
            assert_eq!(a.status, status, "{e}");
            assert_eq!(v["type"].as_str(), Some("error"));
            assert_eq!(v["error"]["type"].as_str(), Some(anthropic_ty), "{e}");
            assert_eq!(v["request_id"].as_str(), Some("req_9"));
            assert_eq!(
                (a.headers, a.retry_after),
                (o.headers, o.retry_after),
                "{e}"
            );
        }
    }

    /// The answers that were once written by hand (the 426 of a plain `GET /v1/responses`,
    /// the codec's rejections, the WebSocket handshake's refusals) keep their bytes now that
    /// the one mapping writes them.
    #[test]
    fn the_answers_once_built_by_hand_keep_their_bytes() {
        use crate::ws::handshake::HandshakeError;
        let upgrade =
            Error::new(ErrorKind::UpgradeRequired, Side::Downstream).render(Dialect::OpenAi);
        assert_eq!(upgrade.status, 426);
        assert_eq!(
            String::from_utf8(upgrade.body).unwrap(),
            r#"{"error":{"message":"GET /v1/responses is the Responses WebSocket: send Upgrade: websocket, or POST for HTTP.","type":"invalid_request_error","code":"invalid_request","param":null}}"#
        );
        assert_eq!(upgrade.retry_after, None);
        let reject = |status| {
            Error::new(
                ErrorKind::BadHttpRequest {
                    status,
                    message: "chunk line too long".into(),
                },
                Side::Downstream,
            )
        };
        let o = reject(400).render(Dialect::OpenAi);
        assert_eq!(
            String::from_utf8(o.body).unwrap(),
            r#"{"error":{"message":"chunk line too long","type":"invalid_request_error","code":"bad_http_request","param":null}}"#
        );
        for status in [400, 408, 413, 431, 501] {
            let a = reject(status).render_as(Dialect::Anthropic, Some("req_1"));
            assert_eq!(a.status, status);
            assert_eq!(
                a.body,
                anthropic_error_body(
                    codex_protocol::anthropic::error_type_for_status(status),
                    "chunk line too long",
                    Some("req_1")
                )
            );
        }
        assert_eq!(reject(408).class(), "timeout");
        assert_eq!(reject(400).class(), "bad_http_request");
        for h in [
            HandshakeError::NotUpgrade,
            HandshakeError::ConnectionNotUpgrade,
            HandshakeError::MissingVersion,
            HandshakeError::UnsupportedVersion,
            HandshakeError::MissingKey,
            HandshakeError::InvalidKey,
        ] {
            let r = Error::new(ErrorKind::WsHandshake(h.clone()), Side::Downstream)
                .render(Dialect::OpenAi);
            assert_eq!((r.status, r.headers), (h.status(), h.headers()));
            assert_eq!(
                r.body,
                ErrorBody::new(
                    h.message().to_owned(),
                    "invalid_request_error",
                    Some("websocket_handshake_failed")
                )
                .to_json()
            );
        }
    }

    #[test]
    fn the_request_id_rides_where_each_dialect_puts_it() {
        let e = Error::bad_request("bad", None);
        let a = e.render_as(Dialect::Anthropic, Some("req_1"));
        let v: sonic_rs::Value = sonic_rs::from_slice(&a.body).unwrap();
        assert_eq!(v["request_id"].as_str(), Some("req_1"));
        assert_eq!(v["error"]["message"].as_str(), Some("bad"));
        let o = e.render_as(Dialect::OpenAi, Some("req_1"));
        assert_eq!(
            o.body,
            e.render(Dialect::OpenAi).body,
            "OpenAI: the header only"
        );
        let w: sonic_rs::Value = sonic_rs::from_slice(&e.ws_error_event("req_2")).unwrap();
        assert_eq!(w["request_id"].as_str(), Some("req_2"));
        assert_eq!(w["type"].as_str(), Some("error"));
    }

    #[test]
    fn upstream_request_errors_keep_status_and_message() {
        let f = classify_http(
            400,
            None,
            None,
            br#"{"detail":"Unsupported parameter: foo"}"#,
        );
        let r = Error::upstream(f).to_openai();
        assert_eq!(r.status, 400);
        assert_eq!(r.body.message, "Unsupported parameter: foo");
        assert_eq!(r.body.code.as_deref(), Some("unsupported_parameter"));
    }
}
