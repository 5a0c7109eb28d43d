//! Decoding the claims of a ChatGPT OAuth JWT (id token or access token), without verifying
//! the signature (docs/protocol.md#jwt-claims: the upstream verifies; we only read identity).
//!
//! # Key Components
//! - [`Claims`]: the identity fields the pool needs (account id, user id, plan, email, exp).
//! - [`decode_claims`]: base64url-decodes the payload segment and extracts [`Claims`].

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};

/// Identity read from a ChatGPT JWT.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims {
    /// `https://api.openai.com/auth`.`chatgpt_account_id`.
    pub account_id: Option<String>,
    /// `chatgpt_user_id` (or `user_id`) inside the auth claim.
    pub user_id: Option<String>,
    /// `chatgpt_plan_type` (free, plus, pro, team, ...).
    pub plan_type: Option<String>,
    /// Top-level `email`, or `https://api.openai.com/profile`.`email`.
    pub email: Option<String>,
    /// `exp` in Unix seconds.
    pub exp: Option<i64>,
}

/// Why a token's claims could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JwtError {
    /// Not three dot-separated segments.
    #[error("token is not a JWT")]
    NotJwt,
    /// The payload is not base64url JSON.
    #[error("JWT payload is not valid base64url JSON")]
    BadPayload,
}

/// Reads identity claims from a JWT.
pub fn decode_claims(token: &str) -> Result<Claims, JwtError> {
    let mut parts = token.split('.');
    let (_h, p, _s) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(h), Some(p), Some(s), None) => (h, p, s),
        _ => return Err(JwtError::NotJwt),
    };
    let raw = URL_SAFE_NO_PAD
        .decode(p.trim_end_matches('='))
        .map_err(|_| JwtError::BadPayload)?;
    let v: sonic_rs::Value = sonic_rs::from_slice(&raw).map_err(|_| JwtError::BadPayload)?;
    use sonic_rs::JsonValueTrait;
    let auth = v.get("https://api.openai.com/auth");
    let s = |val: Option<&sonic_rs::Value>| val.and_then(|x| x.as_str()).map(str::to_owned);
    let email = s(v.get("email")).or_else(|| {
        s(v.get("https://api.openai.com/profile")
            .and_then(|p| p.get("email")))
    });
    Ok(Claims {
        account_id: s(auth.and_then(|a| a.get("chatgpt_account_id"))),
        user_id: s(auth.and_then(|a| a.get("chatgpt_user_id")))
            .or_else(|| s(auth.and_then(|a| a.get("user_id")))),
        plan_type: s(auth.and_then(|a| a.get("chatgpt_plan_type"))),
        email,
        exp: v.get("exp").and_then(|e| e.as_i64()),
    })
}

/// Builds an unsigned JWT (`alg: none`) from a JSON payload. Used by the mock upstream, the
/// demo mode and tests to mint tokens with the claims real ChatGPT tokens carry.
pub fn encode_unsigned(payload_json: &str) -> String {
    let h = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let p = URL_SAFE_NO_PAD.encode(payload_json.as_bytes());
    format!("{h}.{p}.sig")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_chatgpt_claims() {
        let t = encode_unsigned(
            r#"{"email":"a@b.c","exp":1900000000,"https://api.openai.com/auth":{"chatgpt_account_id":"acc-1","chatgpt_user_id":"user-1","chatgpt_plan_type":"plus"}}"#,
        );
        let c = decode_claims(&t).unwrap();
        assert_eq!(c.account_id.as_deref(), Some("acc-1"));
        assert_eq!(c.user_id.as_deref(), Some("user-1"));
        assert_eq!(c.plan_type.as_deref(), Some("plus"));
        assert_eq!(c.email.as_deref(), Some("a@b.c"));
        assert_eq!(c.exp, Some(1_900_000_000));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(decode_claims("abc"), Err(JwtError::NotJwt));
        assert_eq!(decode_claims("a.!!!.c"), Err(JwtError::BadPayload));
    }
}
