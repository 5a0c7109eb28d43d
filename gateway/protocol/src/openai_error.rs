//! OpenAI-shaped error bodies: `{"error":{"message","type","code","param"}}`.
//!
//! # Key Components
//! - [`ErrorBody`]: the fields; [`ErrorBody::to_json`] encodes them with correct escaping.
//! - [`ErrorBody::sse_frame`]: the same object as a terminal SSE `error` event.

use serde::Serialize;

/// An OpenAI-shaped error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorBody {
    /// Human message.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `rate_limit_error`, `server_error`, ...
    #[serde(rename = "type")]
    pub error_type: String,
    /// Machine code.
    pub code: Option<String>,
    /// Offending parameter.
    pub param: Option<String>,
    /// Codex quota fields for `usage_limit_reached` (Codex CLI prints the reset time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resets_at: Option<u64>,
    /// Seconds until the reset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resets_in_seconds: Option<u64>,
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: &'a ErrorBody,
}

#[derive(Serialize)]
struct StreamEnvelope<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    error: &'a ErrorBody,
}

// === impl ErrorBody ===

impl ErrorBody {
    /// A new error body.
    pub fn new(message: impl Into<String>, error_type: &str, code: Option<&str>) -> Self {
        Self {
            message: message.into(),
            error_type: error_type.to_owned(),
            code: code.map(str::to_owned),
            param: None,
            resets_at: None,
            resets_in_seconds: None,
        }
    }

    /// Sets the offending parameter.
    pub fn with_param(mut self, param: Option<&str>) -> Self {
        self.param = param.map(str::to_owned);
        self
    }

    /// `{"error":{...}}` as JSON bytes.
    pub fn to_json(&self) -> Vec<u8> {
        sonic_rs::to_vec(&Envelope { error: self }).unwrap_or_else(|_| {
            br#"{"error":{"message":"internal error","type":"server_error","code":null,"param":null}}"#.to_vec()
        })
    }

    /// A terminal SSE event carrying this error (`event: error`, Responses-style
    /// `{"type":"error","error":{...}}`).
    pub fn sse_frame(&self) -> Vec<u8> {
        let data = sonic_rs::to_vec(&StreamEnvelope {
            ty: "error",
            error: self,
        })
        .unwrap_or_default();
        crate::sse::frame("error", &data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_and_escaping() {
        let e = ErrorBody::new(
            "bad \"key\"\n",
            "authentication_error",
            Some("invalid_api_key"),
        );
        let v: sonic_rs::Value = sonic_rs::from_slice(&e.to_json()).unwrap();
        use sonic_rs::JsonValueTrait;
        assert_eq!(v["error"]["message"].as_str(), Some("bad \"key\"\n"));
        assert_eq!(v["error"]["type"].as_str(), Some("authentication_error"));
        assert_eq!(v["error"]["code"].as_str(), Some("invalid_api_key"));
        assert!(v["error"]["param"].is_null());
        assert!(String::from_utf8(e.sse_frame())
            .unwrap()
            .starts_with("event: error\ndata: {\"type\":\"error\""));
    }
}
