//! Remote compaction v1 (issue 24): `POST /v1/responses/compact` and
//! `/backend-api/codex/responses/compact` answer `{"output":[...]}` with one `compaction`
//! item, served through remote compaction v2 (the retired upstream endpoint is never called):
//! the request goes upstream as an ordinary streamed `/responses` whose last input item is
//! `compaction_trigger`, on the pool's usual rules, over both upstream transports; the
//! compaction blob is bound to the account that minted it like any other (issue 23).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use benches::RecordedRequest;
use gateway::config::PlainHttp;
use integration_tests::{Stack, StackBuilder};
use serde_json::{json, Value};

fn stack(plain_http: PlainHttp) -> Stack {
    StackBuilder {
        accounts: 2,
        workers: 1,
        plain_http,
        strategy: Some(shared_state::snapshot::Strategy::FillFirst),
        ..StackBuilder::default()
    }
    .start()
}

/// The recorded upstream requests.
fn upstream(s: &Stack) -> Vec<RecordedRequest> {
    s.mock
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/responses"))
        .collect()
}

async fn compact(s: &Stack, path: &str, body: &Value) -> (u16, Value) {
    let r = s.post_json(path, body).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

fn history() -> Vec<Value> {
    vec![
        json!({"type": "message", "role": "user", "content": "a long conversation"}),
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "indeed"}]}),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_v1_is_served_through_v2_on_both_upstream_transports() {
    for plain_http in [PlainHttp::H1, PlainHttp::H2c] {
        let s = stack(plain_http);
        for path in [
            "/v1/responses/compact",
            "/responses/compact",
            "/backend-api/codex/responses/compact",
        ] {
            s.mock.clear_requests();
            let (status, v) = compact(
                &s,
                path,
                &json!({"model": "gpt-5.5", "instructions": "be brief", "input": history()}),
            )
            .await;
            assert_eq!(status, 200, "{plain_http:?} {path}: {v}");
            let output = v["output"].as_array().unwrap();
            assert_eq!(output.len(), 1, "{v}");
            assert_eq!(output[0]["type"], "compaction", "{v}");
            assert!(output[0]["encrypted_content"].is_string(), "{v}");
            let reqs = upstream(&s);
            assert_eq!(reqs.len(), 1, "{path}");
            assert!(reqs[0].path.ends_with("/responses"), "{}", reqs[0].path);
            let sent = reqs[0].json.as_ref().unwrap();
            let input = sent["input"].as_array().unwrap();
            assert_eq!(input.len(), 3, "{sent}");
            assert_eq!(input[2]["type"], "compaction_trigger");
            assert_eq!(sent["stream"], true);
            assert_eq!(sent["store"], false);
        }
        // A string input is one user message, then the trigger.
        s.mock.clear_requests();
        let (status, v) = compact(
            &s,
            "/v1/responses/compact",
            &json!({"model": "gpt-5.5", "input": "summarise us"}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let sent = upstream(&s)[0].json.clone().unwrap();
        assert_eq!(sent["input"][0]["role"], "user");
        assert_eq!(sent["input"][1]["type"], "compaction_trigger");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_compaction_requests_are_refused_before_the_upstream() {
    let s = stack(PlainHttp::H1);
    for (body, param) in [
        (json!({"model": "gpt-5.5", "input": 5}), "input"),
        (
            json!({"model": "gpt-5.5", "input": [], "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
    ] {
        let (status, v) = compact(&s, "/v1/responses/compact", &body).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    let r = integration_tests::client()
        .get(format!("{}/v1/responses/compact", s.url()))
        .bearer_auth(&s.key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    let r = integration_tests::client()
        .post(format!("{}/v1/responses/compact", s.url()))
        .json(&json!({"model": "gpt-5.5", "input": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(upstream(&s).is_empty());
}

/// The compaction item replaces the history in the next turns: it goes back to the account
/// that minted it, and when that account runs dry the turn moves to another one without it
/// (the real backend refuses another account's compaction blob).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_blob_stays_with_its_account() {
    let s = stack(PlainHttp::H2c);
    let (status, v) = compact(
        &s,
        "/v1/responses/compact",
        &json!({"model": "gpt-5.5", "input": history()}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let minter = upstream(&s)[0].account_id().unwrap().to_owned();
    let item = v["output"][0].clone();
    let next = json!({
        "model": "gpt-5.5", "stream": false, "store": false,
        "input": [item, {"type": "message", "role": "user", "content": "go on"}],
    });
    s.mock.clear_requests();
    let r = s.post_json("/v1/responses", &next).await;
    assert_eq!(r.status(), 200);
    let reqs = upstream(&s);
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].account_id(), Some(minter.as_str()));
    assert_eq!(reqs[0].blobs().len(), 1, "the compaction item went along");
    // The minter runs dry: the next turn goes elsewhere, without the foreign blob.
    s.mock
        .set_behaviour(&minter, "error=usage_limit_reached".parse().unwrap());
    s.mock.clear_requests();
    let r = s.post_json("/v1/responses", &next).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let reqs = upstream(&s);
    let served = reqs.last().unwrap();
    assert_ne!(served.account_id(), Some(minter.as_str()));
    assert!(served.foreign_blobs().is_empty(), "{}", served.body_text());
    assert!(served.body_text().contains("go on"));
}
