//! Data-plane requests the integration tests repeat.
//!
//! # Key Components
//! - [`Stack::post_responses_x`]: the smallest Responses request (`gpt-5.5`, input `x`).

use serde_json::json;

use crate::Stack;

// === impl Stack ===

impl Stack {
    /// `POST /v1/responses` of the smallest request (`{"model":"gpt-5.5","input":"x"}`, with
    /// `"stream":true` when `stream`) with the stack's key: the response, body unread.
    pub async fn post_responses_x(&self, stream: bool) -> reqwest::Response {
        let body = if stream {
            json!({"model": "gpt-5.5", "input": "x", "stream": true})
        } else {
            json!({"model": "gpt-5.5", "input": "x"})
        };
        self.post("/v1/responses")
            .json(&body)
            .send()
            .await
            .expect("POST /v1/responses")
    }
}
