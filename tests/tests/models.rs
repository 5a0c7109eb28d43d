//! `/v1/models` in both shapes, aliases, and unknown models.

use std::time::Duration;

use integration_tests::{client, http_get, wait::wait_for, StackBuilder};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread")]
async fn models_list_shapes_aliases_and_unknown_models() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c: &mut codex_gateway::config::Config| {
            c.gateway.strict_models = true;
            c.sidecar.model_aliases.insert(
                "fast".into(),
                shared_state::catalog::parse_alias("gpt-5.5@low"),
            );
        })),
        ..StackBuilder::default()
    }
    .start();
    let c = client();
    let r = c
        .get(format!("{}/v1/models", s.url()))
        .bearer_auth(&s.key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"gpt-5.5") && ids.contains(&"fast"), "{ids:?}");
    let r = c
        .get(format!("{}/v1/models?client_version=0.171.0", s.url()))
        .bearer_auth(&s.key)
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let first = &v["models"][0];
    assert!(
        first["slug"].is_string() && first.get("base_instructions").is_none(),
        "{first}"
    );
    let r = c
        .get(format!("{}/v1/models", s.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // alias -> slug + effort upstream
    let r = s
        .post_json("/v1/responses", &json!({"model":"fast","input":"x"}))
        .await;
    assert_eq!(r.status(), 200);
    let up: Value = serde_json::from_slice(&s.mock.requests().pop().unwrap().body).unwrap();
    assert_eq!(up["model"], "gpt-5.5");
    assert_eq!(up["reasoning"]["effort"], "low");
    let r = s
        .post_json(
            "/v1/chat/completions",
            &json!({"model":"fast","messages":[{"role":"user","content":"x"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["model"], "fast", "the client sees its own model name");
    let up: Value = serde_json::from_slice(&s.mock.requests().pop().unwrap().body).unwrap();
    assert_eq!(up["model"], "gpt-5.5");

    // unknown model: 404 model_not_found, nothing sent upstream
    let before = s.mock.responses_requests();
    for path in ["/v1/responses", "/v1/chat/completions"] {
        let r = s
            .post_json(
                path,
                &json!({"model":"gpt-nope","input":"x","messages":[{"role":"user","content":"x"}]}),
            )
            .await;
        assert_eq!(r.status(), 404, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["param"], "model");
    }
    assert_eq!(s.mock.responses_requests(), before);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_catalog_is_fetched_from_the_upstream_and_enforced() {
    let s = StackBuilder::default().start();
    wait_for("the catalog fetch", Duration::from_secs(10), || async {
        s.app.catalog.load().source == shared_state::catalog::CatalogSource::Upstream
    })
    .await;
    let models_req = s.mock.models_requests();
    let r = models_req.first().expect("a /models request");
    assert!(r.query.as_deref().unwrap_or("").contains("client_version="));
    assert_eq!(r.account_id(), Some("acct-0"));
    // not strict by configuration, but the upstream's catalog is authoritative
    let r = s
        .post_json("/v1/responses", &json!({"model":"gpt-nope","input":"x"}))
        .await;
    assert_eq!(r.status(), 404);
    let r = s.post_responses_x(false).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_catalog_is_asked_as_the_configured_client_version() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c: &mut codex_gateway::config::Config| {
            c.gateway.wire.version = "0.999.7".to_owned();
        })),
        ..StackBuilder::default()
    }
    .start();
    wait_for("the catalog fetch", Duration::from_secs(10), || async {
        !s.mock.models_requests().is_empty()
    })
    .await;
    let r = s.mock.models_requests().remove(0);
    assert_eq!(
        r.query.as_deref(),
        Some("client_version=0.999.7"),
        "the configured wire version"
    );
    assert_eq!(r.header("version"), Some("0.999.7"));
    // the data plane presents the same version
    let resp = s.post_responses_x(false).await;
    assert_eq!(resp.status(), 200);
    let up = s.mock.requests().pop().unwrap();
    assert_eq!(up.header("version"), Some("0.999.7"));
}

/// `GET /v1/models/{id}`: a model or alias in OpenAI's shape; 404 `model_not_found` for an
/// unknown id or a prefix alias; 401 without a key.
#[tokio::test(flavor = "multi_thread")]
async fn one_model_by_id() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c: &mut codex_gateway::config::Config| {
            c.sidecar.model_aliases.insert(
                "fast".into(),
                shared_state::catalog::parse_alias("gpt-5.5@low"),
            );
            c.sidecar.model_aliases.insert(
                "claude-*".into(),
                shared_state::catalog::parse_alias("gpt-5.5"),
            );
        })),
        ..StackBuilder::default()
    }
    .start();
    let get = |path: &str| {
        client()
            .get(format!("{}{path}", s.url()))
            .bearer_auth(&s.key)
            .send()
    };
    let r = get("/v1/models/gpt-5.5").await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v,
        json!({"id": "gpt-5.5", "object": "model", "created": 1_700_000_000u64, "owned_by": "openai"})
    );
    let v: Value = get("/v1/models/fast").await.unwrap().json().await.unwrap();
    assert_eq!(v["id"], "fast");
    assert_eq!(v["owned_by"], "codex-gateway");
    // A name the `claude-*` prefix alias maps is a model; the pattern itself is not.
    let v: Value = get("/v1/models/claude-sonnet-4-5")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["id"], "claude-sonnet-4-5");
    assert_eq!(v["owned_by"], "codex-gateway");
    for id in ["gpt-nope", "claude-*", "claude-%2A"] {
        let r = get(&format!("/v1/models/{id}")).await.unwrap();
        assert_eq!(r.status(), 404, "{id}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    }
    let r = http_get(&format!("{}/v1/models/gpt-5.5", s.url())).await;
    assert_eq!(r.status(), 401);
}

/// A key restricted to some models sees only those, in every listing (`/v1/models` in both
/// shapes, the Codex CLI's `/backend-api/codex/models`, `/v1/models/{id}`); an unrestricted
/// key sees everything.
#[tokio::test(flavor = "multi_thread")]
async fn a_restricted_key_sees_only_its_models() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c: &mut codex_gateway::config::Config| {
            c.sidecar.model_aliases.insert(
                "fast".into(),
                shared_state::catalog::parse_alias("gpt-5.5@low"),
            );
        })),
        ..StackBuilder::default()
    }
    .start();
    let key = s
        .create_key("restricted", json!({"allowed_models": ["gpt-5.5"]}))
        .await
        .key;
    let get = |path: &str, key: &str| {
        client()
            .get(format!("{}{path}", s.url()))
            .bearer_auth(key)
            .send()
    };
    let ids = |v: &Value, list: &str, field: &str| -> Vec<String> {
        v[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m[field].as_str().unwrap().to_owned())
            .collect()
    };
    let v: Value = get("/v1/models", &key).await.unwrap().json().await.unwrap();
    assert_eq!(ids(&v, "data", "id"), ["gpt-5.5"]);
    let v: Value = get("/v1/models?client_version=0.171.0", &key)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ids(&v, "models", "slug"), ["gpt-5.5"]);
    let r = get("/backend-api/codex/models?client_version=0.171.0", &key)
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(ids(&v, "models", "slug"), ["gpt-5.5"]);
    assert_eq!(get("/v1/models/gpt-5.5", &key).await.unwrap().status(), 200);
    for id in ["fast", "gpt-6-sol"] {
        let r = get(&format!("/v1/models/{id}"), &key).await.unwrap();
        assert_eq!(r.status(), 404, "{id} is not the key's");
    }
    // The unrestricted key sees the whole catalog and the alias.
    let v: Value = get("/v1/models", &s.key)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let all = ids(&v, "data", "id");
    assert!(all.len() > 2 && all.contains(&"fast".to_owned()), "{all:?}");
    let v: Value = get("/backend-api/codex/models", &s.key)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(ids(&v, "models", "slug").len() > 1);
}

/// `/backend-api/wham/usage` answers from the caller's view too: a key of an account group sees
/// that group's combined limits, the shared pool's key those of the accounts without a group.
#[tokio::test(flavor = "multi_thread")]
async fn wham_usage_reports_the_keys_group() {
    let s = StackBuilder {
        accounts: 3,
        ..StackBuilder::default()
    }
    .start();
    let accounts = s.admin_json("/api/admin/accounts").await;
    for a in accounts["data"].as_array().unwrap() {
        if a["chatgpt_account_id"] == "acct-0" {
            continue;
        }
        let r = s
            .admin_patch(&format!("/api/admin/accounts/{}", a["id"]))
            .json(&json!({"account_group": "team-a"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let team = s
        .create_key("team", json!({"account_group": "team-a"}))
        .await
        .key;
    s.mock.set_quota("acct-0", 90.0, 80.0);
    s.mock.set_quota("acct-1", 20.0, 10.0);
    s.mock.set_quota("acct-2", 40.0, 30.0);
    let ids: Vec<i64> = accounts["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_i64().unwrap())
        .collect();
    for id in ids {
        let r = s
            .admin_post(&format!("/api/admin/accounts/{id}/quota"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    // The group's accounts reach the workers with the next snapshot.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let snap = s.app.snapshot.load();
        let grouped = snap
            .accounts
            .iter()
            .filter(|a| a.group.as_deref() == Some("team-a"))
            .count();
        if grouped == 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "groups never published"
        );
        drop(snap);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let usage = |key: String| {
        let url = format!("{}/backend-api/wham/usage", s.url());
        async move {
            let r = client().get(url).bearer_auth(key).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        }
    };
    let v = usage(team).await;
    assert_eq!(v["rate_limit"]["primary_window"]["used_percent"], 30, "{v}");
    assert_eq!(
        v["rate_limit"]["secondary_window"]["used_percent"], 20,
        "{v}"
    );
    let v = usage(s.key.clone()).await;
    assert_eq!(v["rate_limit"]["primary_window"]["used_percent"], 90, "{v}");
    assert_eq!(
        v["rate_limit"]["secondary_window"]["used_percent"], 80,
        "{v}"
    );
}
