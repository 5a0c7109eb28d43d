//! Secrets proven absent (issue 15): a full run at `trace` level (import, requests, a token
//! refresh with rotation, upstream failures, admin calls with right and wrong passwords)
//! never shows an access token, refresh token, id token, client key or admin password in a
//! log line, in `/metrics` or in an admin API response (the one answer that creates a key
//! carries that new key, once, by design). Also: a missing or replaced secret key refuses
//! start-up when stored tokens do not open with it (storage-level cases and file modes:
//! `admin/tests/admin/storage.rs`).

// Test helpers fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use benches::{Behaviour, ErrorKind, MockConfig};
use integration_tests::{
    logs::{assert_not_logged, capture_trace_logs, secret_probe},
    StackBuilder,
};
use serde_json::json;

const ADMIN_PASSWORD: &str = "adm-pw-7hQm2VxK9sLr4Ty8";

#[tokio::test(flavor = "multi_thread")]
async fn no_secret_in_trace_logs_metrics_or_admin_responses() {
    // Everything at trace, the mock upstream's own logs aside (it is the token issuer).
    let logs = capture_trace_logs();
    let s = StackBuilder {
        accounts: 2,
        mock: MockConfig {
            strict_tokens: true,
            ..MockConfig::default()
        },
        tweak: Some(Box::new(|c| {
            c.sidecar.admin_token = Some(shared_state::Secret::new(ADMIN_PASSWORD));
        })),
        ..StackBuilder::default()
    }
    .start();
    let mut secrets: Vec<String> = vec![s.key.clone(), ADMIN_PASSWORD.to_owned()];
    for t in &s.accounts {
        secrets.extend([
            t.access_token.clone(),
            t.refresh_token.clone(),
            t.id_token.clone(),
        ]);
    }
    // Requests: plain, streamed, chat; a rejected key.
    for body in [
        json!({"model":"gpt-5.5","input":"hi"}),
        json!({"model":"gpt-5.5","input":"hi","stream":true}),
    ] {
        let r = s.post_json("/v1/responses", &body).await;
        assert_eq!(r.status(), 200);
        let _ = r.text().await.unwrap();
    }
    let r = s
        .post_json(
            "/v1/chat/completions",
            &json!({"model":"gpt-5.5","messages":[{"role":"user","content":"hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let r = integration_tests::client()
        .post(format!("{}/v1/responses", s.url()))
        .bearer_auth(format!("{}x", s.key))
        .json(&json!({"model":"gpt-5.5","input":"hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // A 401 upstream: refresh with rotation, then the retried request.
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::TokenInvalidated).times(1),
    );
    s.mock.set_behaviour(
        "acct-1",
        Behaviour::error(ErrorKind::TokenInvalidated).times(1),
    );
    for _ in 0..2 {
        let r = s.post_responses_x(false).await;
        assert_eq!(r.status(), 200);
    }
    assert!(s.mock.token_calls() >= 1, "a refresh happened");
    for id in ["acct-0", "acct-1"] {
        let t = s.mock.account_tokens(id).unwrap();
        secrets.extend([t.access_token, t.refresh_token, t.id_token]);
    }
    // Failures of other kinds (logged at warn with their causes).
    for kind in [
        ErrorKind::ServerIsOverloaded,
        ErrorKind::Internal,
        ErrorKind::UsageLimitReached,
    ] {
        for id in ["acct-0", "acct-1"] {
            s.mock.set_behaviour(id, Behaviour::error(kind).times(1));
        }
        let r = s.post_responses_x(false).await;
        let _ = r.text().await;
    }
    // Admin calls: right and wrong passwords, reads, a key creation, a refresh on demand.
    let admin = integration_tests::client();
    let mut answers = Vec::new();
    for path in [
        "/api/admin/accounts",
        "/api/admin/keys",
        "/api/admin/settings",
        "/api/admin/usage",
        "/healthz",
    ] {
        let r = admin
            .get(format!("{}{path}", s.admin_url()))
            .bearer_auth(ADMIN_PASSWORD)
            .send()
            .await
            .unwrap();
        answers.push((path, r.status().as_u16(), r.text().await.unwrap()));
        let r = admin
            .get(format!("{}{path}", s.admin_url()))
            .bearer_auth(format!("{ADMIN_PASSWORD}-wrong"))
            .send()
            .await
            .unwrap();
        answers.push((path, r.status().as_u16(), r.text().await.unwrap()));
    }
    let accounts: serde_json::Value = serde_json::from_str(&answers[0].2).unwrap();
    let first_id = accounts["data"][0]["id"]
        .as_i64()
        .or_else(|| accounts[0]["id"].as_i64())
        .unwrap_or(1);
    let r = admin
        .post(format!(
            "{}/api/admin/accounts/{first_id}/refresh",
            s.admin_url()
        ))
        .bearer_auth(ADMIN_PASSWORD)
        .send()
        .await
        .unwrap();
    answers.push(("refresh", r.status().as_u16(), r.text().await.unwrap()));
    let r = admin
        .post(format!("{}/api/admin/keys", s.admin_url()))
        .bearer_auth(ADMIN_PASSWORD)
        .json(&json!({"name": "second"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let created: serde_json::Value = r.json().await.unwrap();
    let new_key = created["key"].as_str().unwrap().to_owned();
    secrets.push(new_key.clone());
    // The new key works (and so is logged as used, never shown).
    let r = integration_tests::client()
        .post(format!("{}/v1/responses", s.url()))
        .bearer_auth(&new_key)
        .json(&json!({"model":"gpt-5.5","input":"hi"}))
        .send()
        .await
        .unwrap();
    // (The accounts may be cooling down after the usage-limit failures: not a 401 is enough.)
    assert_ne!(r.status(), 401);
    for id in ["acct-0", "acct-1"] {
        let t = s.mock.account_tokens(id).unwrap();
        secrets.extend([t.access_token, t.refresh_token, t.id_token]);
    }
    let metrics = s.metrics_text().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = logs.text();
    assert!(
        log.lines().count() > 100,
        "trace logs were captured: {}",
        log.len()
    );
    assert!(log.contains("TRACE"), "trace level was on");
    secrets.retain(|t| !t.is_empty());
    secrets.sort();
    secrets.dedup();
    assert!(secrets.len() >= 10, "{}", secrets.len());
    for secret in &secrets {
        // A JWT's signature-free prefix would be a leak too: check the distinctive tail.
        let probe = secret_probe(secret);
        assert_not_logged(&log, secret);
        assert!(!metrics.contains(probe), "a secret reached /metrics");
        for (path, status, body) in &answers {
            assert!(
                !body.contains(probe),
                "a secret reached the admin answer of {path} ({status}): {body}"
            );
        }
    }
    // JWT payloads carry the e-mail and ids, not secrets; but a whole JWT must not appear.
    assert!(!log.contains("eyJ"), "a JWT-shaped string reached the logs");
}

/// The gateway refuses to start when its secret key was replaced or lost (before: a new key
/// was written, every account became unusable and `/healthz` said 200), and starts again with
/// the original key.
#[test]
fn a_replaced_or_missing_secret_key_refuses_start_up() {
    let mut s = StackBuilder::default().start();
    s.app.shutdown();
    let key_path = s.dir.path().join("secret.key");
    let original = std::fs::read(&key_path).unwrap();
    let mut cfg = s.cfg.clone();
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.sidecar.admin_listen = "127.0.0.1:0".parse().unwrap();
    std::fs::write(&key_path, "CQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=\n").unwrap();
    let err = codex_gateway::app::App::spawn(cfg.clone())
        .err()
        .expect("a replaced key refuses start-up")
        .to_string();
    assert!(err.contains("do not open with the secret key"), "{err}");
    std::fs::remove_file(&key_path).unwrap();
    let err = codex_gateway::app::App::spawn(cfg.clone())
        .err()
        .expect("a missing key refuses start-up")
        .to_string();
    assert!(err.contains("missing"), "{err}");
    assert!(
        !key_path.exists(),
        "no new key was written over encrypted tokens"
    );
    std::fs::write(&key_path, original).unwrap();
    let mut app = codex_gateway::app::App::spawn(cfg).expect("the original key starts");
    app.shutdown();
}
