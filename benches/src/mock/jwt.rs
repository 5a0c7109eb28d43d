//! Unsigned JWTs with the claim layout of real ChatGPT tokens (docs/protocol.md#jwt-claims), in the
//! same encoding as `shared_state::jwt::encode_unsigned` (reimplemented: the mock does not
//! depend on the gateway's crates).

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use serde_json::json;

use super::MockAccount;

/// The Codex CLI OAuth client id.
pub(crate) const CLIENT_ID: &str = "app_EMoamEEZ73f0CkXaXp7hrann";
const ISSUER: &str = "https://auth.openai.com";

/// `base64url(header).base64url(payload).sig` with header `{"alg":"none","typ":"JWT"}`.
pub(crate) fn encode_unsigned(payload_json: &str) -> String {
    let h = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let p = URL_SAFE_NO_PAD.encode(payload_json.as_bytes());
    format!("{h}.{p}.sig")
}

fn auth_claim(a: &MockAccount) -> serde_json::Value {
    json!({
        "chatgpt_account_id": a.chatgpt_account_id,
        "chatgpt_user_id": a.chatgpt_user_id,
        "user_id": a.chatgpt_user_id,
        "chatgpt_plan_type": a.plan_type,
    })
}

/// An access token: auth + profile claims, `exp`, and a random `jti` so every token differs.
pub(crate) fn access_token(a: &MockAccount, iat: u64, exp: u64, jti: &str) -> String {
    let payload = json!({
        "aud": ["https://api.openai.com/v1"],
        "client_id": CLIENT_ID,
        "email": a.email,
        "exp": exp,
        "iat": iat,
        "iss": ISSUER,
        "jti": jti,
        "scp": ["openid", "profile", "email", "offline_access"],
        "sub": format!("auth0|{}", a.chatgpt_user_id),
        "https://api.openai.com/auth": auth_claim(a),
        "https://api.openai.com/profile": {"email": a.email, "email_verified": true},
    });
    encode_unsigned(&payload.to_string())
}

/// An id token: top-level `email` and the auth claim.
pub(crate) fn id_token(a: &MockAccount, iat: u64, exp: u64) -> String {
    let mut auth = auth_claim(a);
    if let Some(o) = auth.as_object_mut() {
        o.insert("organizations".into(), json!([]));
    }
    let payload = json!({
        "aud": [CLIENT_ID],
        "email": a.email,
        "email_verified": true,
        "exp": exp,
        "iat": iat,
        "iss": ISSUER,
        "sub": format!("auth0|{}", a.chatgpt_user_id),
        "https://api.openai.com/auth": auth,
    });
    encode_unsigned(&payload.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn payload(token: &str) -> serde_json::Value {
        let mut parts = token.split('.');
        assert_eq!(
            URL_SAFE_NO_PAD.decode(parts.next().unwrap()).unwrap(),
            br#"{"alg":"none","typ":"JWT"}"#
        );
        let p = URL_SAFE_NO_PAD.decode(parts.next().unwrap()).unwrap();
        assert_eq!(parts.next(), Some("sig"));
        serde_json::from_slice(&p).unwrap()
    }

    #[test]
    fn access_token_has_chatgpt_claims() {
        let a = MockAccount::new("acc-1").with_plan("pro");
        let p = payload(&access_token(&a, 10, 20, "j"));
        let auth = &p["https://api.openai.com/auth"];
        assert_eq!(auth["chatgpt_account_id"], "acc-1");
        assert_eq!(auth["chatgpt_user_id"], "user-acc-1");
        assert_eq!(auth["chatgpt_plan_type"], "pro");
        assert_eq!(p["email"], "acc-1@mock-codex.test");
        assert_eq!(p["exp"], 20);
        let id = payload(&id_token(&a, 10, 20));
        assert_eq!(
            id["https://api.openai.com/auth"]["chatgpt_account_id"],
            "acc-1"
        );
    }
}
