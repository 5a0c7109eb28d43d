//! `/v1/models` in both shapes, aliases, and unknown models.

use integration_tests::{client, StackBuilder};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread")]
async fn models_list_shapes_aliases_and_unknown_models() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c: &mut gateway::config::GatewayConfig| {
            c.strict_models = true;
            c.model_aliases.insert(
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
        .post("/v1/responses")
        .json(&json!({"model":"fast","input":"x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let up: Value = serde_json::from_slice(&s.mock.requests().pop().unwrap().body).unwrap();
    assert_eq!(up["model"], "gpt-5.5");
    assert_eq!(up["reasoning"]["effort"], "low");
    let r = s
        .post("/v1/chat/completions")
        .json(&json!({"model":"fast","messages":[{"role":"user","content":"x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["model"], "fast", "the client sees its own model name");
    let up: Value = serde_json::from_slice(&s.mock.requests().pop().unwrap().body).unwrap();
    assert_eq!(up["model"], "gpt-5.5");

    // unknown model: 404 model_not_found, nothing sent upstream
    let before = s.mock.responses_requests();
    for path in ["/v1/responses", "/v1/chat/completions"] {
        let r = s
            .post(path)
            .json(
                &json!({"model":"gpt-nope","input":"x","messages":[{"role":"user","content":"x"}]}),
            )
            .send()
            .await
            .unwrap();
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
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.app.catalog.load().source != shared_state::catalog::CatalogSource::Upstream {
        assert!(
            std::time::Instant::now() < deadline,
            "catalog never fetched"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let models_req = s.mock.models_requests();
    let r = models_req.first().expect("a /models request");
    assert!(r.query.as_deref().unwrap_or("").contains("client_version="));
    assert_eq!(r.account_id(), Some("acct-0"));
    // not strict by configuration, but the upstream's catalog is authoritative
    let r = s
        .post("/v1/responses")
        .json(&json!({"model":"gpt-nope","input":"x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = s
        .post("/v1/responses")
        .json(&json!({"model":"gpt-5.5","input":"x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_catalog_is_asked_as_the_configured_client_version() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c: &mut gateway::config::GatewayConfig| {
            c.wire.version = "0.999.7".to_owned();
        })),
        ..StackBuilder::default()
    }
    .start();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.mock.models_requests().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "catalog never fetched"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let r = s.mock.models_requests().remove(0);
    assert_eq!(
        r.query.as_deref(),
        Some("client_version=0.999.7"),
        "the configured wire version"
    );
    assert_eq!(r.header("version"), Some("0.999.7"));
    // the data plane presents the same version
    let resp = s
        .post("/v1/responses")
        .json(&json!({"model":"gpt-5.5","input":"x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let up = s.mock.requests().pop().unwrap();
    assert_eq!(up.header("version"), Some("0.999.7"));
}
