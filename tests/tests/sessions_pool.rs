//! Sessions survive the pool (issue 23): account-bound blobs (reasoning `encrypted_content`,
//! compaction items, docs/protocol.md#account-bound-blobs) never reach an account that did not mint
//! them, and a refusal of blobs we had no record of is recovered by one stripped retry on the
//! same account. mock-codex binds its blobs to the minting account like the real backend
//! (`RecordedRequest::foreign_blobs` says what each account received).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use benches::{MockHandle, RecordedRequest};
use integration_tests::{claude_alias, requests::blob_turn, sdk::run_python, Stack, StackBuilder};
use serde_json::{json, Value};

/// A reasoning item minted by `account` directly on the mock (as another gateway, or this
/// client's history from before, would carry it).
async fn minted_reasoning(mock: &MockHandle, account: &str) -> Value {
    let body = json!({
        "model": "gpt-5.1-codex", "instructions": "", "stream": true, "store": false,
        "input": [{"type": "message", "role": "user", "content": "hi"}],
        "include": ["reasoning.encrypted_content"],
    });
    let text = integration_tests::client()
        .post(format!("{}/responses", mock.base_url()))
        .header("authorization", "Bearer at-direct")
        .header("chatgpt-account-id", account)
        .header("x-mock-reasoning", "1")
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let done = integration_tests::parse_sse(&text)
        .into_iter()
        .rev()
        .find(|(t, _)| t == "response.completed")
        .expect("completed");
    let v: Value = serde_json::from_str(&done.1).unwrap();
    mock.clear_requests();
    v["response"]["output"][0].clone()
}

/// The recorded `/responses` requests.
fn upstream(mock: &MockHandle) -> Vec<RecordedRequest> {
    mock.requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/responses"))
        .collect()
}

fn one_account() -> Stack {
    StackBuilder {
        accounts: 1,
        workers: 1,
        ..StackBuilder::default()
    }
    .start()
}

/// A history replaying `item` (with a tool round trip that must survive the cleaning).
fn history(item: &Value, meta: Value) -> Value {
    json!({
        "model": "gpt-5.5",
        "stream": true,
        "store": false,
        "include": ["reasoning.encrypted_content"],
        "client_metadata": meta,
        "input": [
            {"type": "message", "role": "user", "content": "first"},
            item,
            {"type": "function_call", "call_id": "call_1", "name": "exec", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
            {"type": "message", "role": "user", "content": "again"},
        ],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_foreign_blobs_are_stripped_and_retried_once_on_the_same_account() {
    let s = one_account();
    // Both refusal shapes the upstream uses.
    for (round, shape) in ["code", "null"].into_iter().enumerate() {
        let foreign = minted_reasoning(&s.mock, "acct-elsewhere").await;
        let r = s
            .post_json(
                "/v1/responses",
                &history(&foreign, json!({"x-mock-blob-error": shape})),
            )
            .await;
        assert_eq!(r.status(), 200, "shape {shape}");
        let text = r.text().await.unwrap();
        assert!(text.contains("response.completed"), "{text}");
        let reqs = upstream(&s.mock);
        assert_eq!(
            reqs.len(),
            2,
            "one refusal, one stripped retry (shape {shape})"
        );
        assert!(
            reqs.iter().all(|r| r.account_id() == Some("acct-0")),
            "same account"
        );
        assert_eq!(reqs[0].foreign_blobs().len(), 1);
        assert!(reqs[1].blobs().is_empty(), "the retry carries no blob");
        // Everything portable survived the cleaning.
        let input = reqs[1].json.as_ref().unwrap()["input"]
            .as_array()
            .unwrap()
            .clone();
        let calls: Vec<&Value> = input.iter().filter(|i| i["call_id"] == "call_1").collect();
        assert_eq!(calls.len(), 2, "{input:?}");
        let reasoning: Vec<&Value> = input.iter().filter(|i| i["type"] == "reasoning").collect();
        assert_eq!(reasoning.len(), 1, "the summary stays");
        assert!(reasoning[0]["summary"][0]["text"].is_string());
        s.mock.clear_requests();
        // It cost the account nothing.
        let a = s.account("acct-0");
        assert_eq!(a.status, "active");
        assert_eq!(a.cooling_ms, 0);
        assert_eq!(
            s.metric("codex_gateway_encrypted_items_stripped_total")
                .await,
            round as i64 + 1
        );
    }
    assert_eq!(s.metric("codex_gateway_failovers_total").await, 0);
}

/// A streamed request without blobs that the upstream refuses with `error`: answered 400
/// after one upstream request (nothing to strip, no retry).
async fn refused_without_retry(s: &Stack, error: &str) {
    let r = s
        .post_json(
            "/v1/responses",
            &json!({"model": "gpt-5.5", "input": "x", "stream": true,
            "client_metadata": {"x-mock-error": error}}),
        )
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(upstream(&s.mock).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stripped_retry_never_loops_and_plain_request_errors_are_not_retried() {
    let s = one_account();
    // A plain invalid_request_error: returned as is, one upstream request.
    refused_without_retry(&s, "context_length_exceeded").await;
    s.mock.clear_requests();

    // An upstream that refuses even the stripped body (forced): one retry, then the error.
    let foreign = minted_reasoning(&s.mock, "acct-elsewhere").await;
    let r = s
        .post_json(
            "/v1/responses",
            &history(
                &foreign,
                json!({"x-mock-error": "invalid_encrypted_content"}),
            ),
        )
        .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_encrypted_content");
    assert_eq!(upstream(&s.mock).len(), 2, "exactly one retry");
    s.mock.clear_requests();

    // A refusal of a body without blobs has nothing to strip: no retry.
    refused_without_retry(&s, "invalid_encrypted_content").await;
    assert_eq!(s.account("acct-0").status, "active");
    assert_eq!(s.account("acct-0").cooling_ms, 0);
}

fn two_accounts(strategy: shared_state::snapshot::Strategy) -> Stack {
    let s = StackBuilder {
        accounts: 2,
        workers: 1,
        strategy: Some(strategy),
        // Anthropic model names resolve to a catalog model.
        tweak: claude_alias(),
        ..StackBuilder::default()
    }
    .start();
    for a in ["acct-0", "acct-1"] {
        s.mock.set_behaviour(a, "reasoning=1".parse().unwrap());
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_account_runs_dry_continues_on_another_without_its_blobs() {
    let s = two_accounts(shared_state::snapshot::Strategy::FillFirst);
    let mut input = vec![json!({"type": "message", "role": "user", "content": "first"})];
    let (status, resp) = blob_turn(&s.url(), &s.key, &input).await;
    assert_eq!(status, 200);
    assert_eq!(s.served_by(), ["acct-0"]);
    let reasoning = resp["output"][0].clone();
    assert_eq!(reasoning["type"], "reasoning");
    assert!(reasoning["encrypted_content"].is_string());
    input.extend(resp["output"].as_array().unwrap().iter().cloned());
    input.push(json!({"type": "message", "role": "user", "content": "second"}));

    // acct-0 runs dry between the turns.
    s.mock.set_behaviour(
        "acct-0",
        "error=usage_limit_reached,reasoning=1".parse().unwrap(),
    );
    s.mock.clear_requests();
    let (status, resp) = blob_turn(&s.url(), &s.key, &input).await;
    assert_eq!(status, 200, "{resp}");
    let reqs = upstream(&s.mock);
    let on_1: Vec<&RecordedRequest> = reqs
        .iter()
        .filter(|r| r.account_id() == Some("acct-1"))
        .collect();
    assert_eq!(
        on_1.len(),
        1,
        "cleaned before sending: no refusal, no retry"
    );
    assert!(on_1[0].foreign_blobs().is_empty());
    assert!(on_1[0].blobs().is_empty());
    // The history's portable parts went along.
    assert!(on_1[0].body_text().contains("first") && on_1[0].body_text().contains("second"));
    assert_eq!(
        s.metric("codex_gateway_session_account_switches_total")
            .await,
        1
    );
    assert_eq!(
        s.metric("codex_gateway_encrypted_items_stripped_total")
            .await,
        1
    );

    // The third turn carries acct-1's blob (and no longer acct-0's): served as it is.
    input.extend(resp["output"].as_array().unwrap().iter().cloned());
    input.push(json!({"type": "message", "role": "user", "content": "third"}));
    input.retain(|i| i != &reasoning);
    s.mock.clear_requests();
    let (status, _) = blob_turn(&s.url(), &s.key, &input).await;
    assert_eq!(status, 200);
    let reqs = upstream(&s.mock);
    assert!(reqs.iter().all(|r| r.foreign_blobs().is_empty()));
    assert_eq!(reqs.last().unwrap().account_id(), Some("acct-1"));
    assert_eq!(reqs.last().unwrap().blobs().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_route_to_the_account_that_minted_them_without_a_session_id() {
    let s = two_accounts(shared_state::snapshot::Strategy::RoundRobin);
    // Turns until acct-1 minted a blob.
    let first = vec![json!({"type": "message", "role": "user", "content": "first"})];
    let mut minted = None;
    for _ in 0..6 {
        s.mock.clear_requests();
        let (status, resp) = blob_turn(&s.url(), &s.key, &first).await;
        assert_eq!(status, 200);
        if s.served_by() == ["acct-1"] {
            minted = Some(resp);
            break;
        }
    }
    let resp = minted.expect("round robin reaches acct-1");
    let mut input = first.clone();
    input.extend(resp["output"].as_array().unwrap().iter().cloned());
    input.push(json!({"type": "message", "role": "user", "content": "second"}));
    s.mock.clear_requests();
    for _ in 0..4 {
        let (status, _) = blob_turn(&s.url(), &s.key, &input).await;
        assert_eq!(status, 200);
    }
    // Every continuation went to the minter, whatever the round robin's turn.
    assert_eq!(s.served_by(), ["acct-1"; 4]);
    assert!(upstream(&s.mock)
        .iter()
        .all(|r| r.foreign_blobs().is_empty()));
    assert_eq!(
        s.metric("codex_gateway_session_account_switches_total")
            .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_accounts_show_two_installations_in_all_three_places() {
    let s = two_accounts(shared_state::snapshot::Strategy::RoundRobin);
    let turn_meta =
        json!({"installation_id": "client-iid", "session_id": "s1", "request_kind": "turn"})
            .to_string();
    for _ in 0..4 {
        let r = s
            .post("/v1/responses")
            .header("x-codex-installation-id", "client-iid")
            .header("x-codex-turn-metadata", &turn_meta)
            .json(&json!({
                "model": "gpt-5.5", "stream": true, "input": "hi",
                "client_metadata": {
                    "thread_id": "t1",
                    "x-codex-installation-id": "client-iid",
                    "x-codex-turn-metadata": turn_meta,
                },
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap();
    }
    let mut ids = std::collections::BTreeMap::new();
    for r in upstream(&s.mock) {
        let header = r.header("x-codex-installation-id").unwrap().to_owned();
        let meta: Value = serde_json::from_str(r.header("x-codex-turn-metadata").unwrap()).unwrap();
        let body = &r.json.as_ref().unwrap()["client_metadata"];
        let body_meta: Value =
            serde_json::from_str(body["x-codex-turn-metadata"].as_str().unwrap()).unwrap();
        // One id per account, the same in the header, the turn metadata and the body.
        assert_eq!(meta["installation_id"], header.as_str());
        assert_eq!(body["x-codex-installation-id"], header.as_str());
        assert_eq!(body_meta["installation_id"], header.as_str());
        // Everything else the client said is kept.
        assert_eq!(meta["session_id"], "s1");
        assert_eq!(body["thread_id"], "t1");
        let prev = ids.insert(r.account_id().unwrap().to_owned(), header.clone());
        assert!(prev.is_none_or(|p| p == header), "one id per account");
    }
    assert_eq!(ids.len(), 2, "{ids:?}");
    let v: Vec<&String> = ids.values().collect();
    assert_ne!(v[0], v[1]);
    assert!(v.iter().all(|i| i.as_str() != "client-iid"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_thinking_signatures_survive_an_account_switch() {
    let s = two_accounts(shared_state::snapshot::Strategy::FillFirst);
    let ask = json!({"model": "claude-sonnet-4-5", "max_tokens": 16000,
        "thinking": {"type": "enabled", "budget_tokens": 10000},
        "messages": [{"role": "user", "content": "think"}]});
    let r = s.post_json("/v1/messages", &ask).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(s.served_by(), ["acct-0"]);
    let sig = v["content"][0]["signature"].as_str().unwrap().to_owned();
    assert!(benches::mock::blob_minted_for(&sig, "acct-0"));

    s.mock.set_behaviour(
        "acct-0",
        "error=usage_limit_reached,reasoning=1".parse().unwrap(),
    );
    s.mock.clear_requests();
    let follow = json!({"model": "claude-sonnet-4-5", "max_tokens": 16000,
        "thinking": {"type": "enabled", "budget_tokens": 10000},
        "messages": [{"role": "user", "content": "think"},
                     {"role": "assistant", "content": v["content"].clone()},
                     {"role": "user", "content": "again"}]});
    let r = s.post_json("/v1/messages", &follow).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let reqs = upstream(&s.mock);
    let on_1: Vec<&RecordedRequest> = reqs
        .iter()
        .filter(|r| r.account_id() == Some("acct-1"))
        .collect();
    assert_eq!(on_1.len(), 1);
    assert!(on_1[0].blobs().is_empty(), "acct-0's signature stays home");
    assert!(reqs
        .iter()
        .filter(|r| r.account_id() == Some("acct-0"))
        .all(|r| r.blobs() == vec![sig.clone()]));
    assert_eq!(
        s.metric("codex_gateway_session_account_switches_total")
            .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_level_block_cools_the_one_account_it_happened_on() {
    let s = StackBuilder {
        accounts: 3,
        workers: 1,
        strategy: Some(shared_state::snapshot::Strategy::FillFirst),
        ..StackBuilder::default()
    }
    .start();
    for a in ["acct-0", "acct-1", "acct-2"] {
        s.mock.set_behaviour(a, "error=cloudflare".parse().unwrap());
    }
    let r = s.post_responses_x(true).await;
    assert!(!r.status().is_success());
    let tried = s.served_by();
    assert!(tried.len() >= 2, "failed over: {tried:?}");
    let cooling: Vec<&str> = ["acct-0", "acct-1", "acct-2"]
        .into_iter()
        .filter(|a| s.account(a).cooling_ms > 0)
        .collect();
    assert_eq!(
        cooling,
        [tried[0].as_str()],
        "only the first block cools its account"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_refresh_presents_the_configured_wire_identity() {
    let s = StackBuilder {
        accounts: 1,
        workers: 1,
        mock: benches::MockConfig {
            strict_tokens: true,
            ..Default::default()
        },
        tweak: Some(Box::new(|c: &mut codex_gateway::config::Config| {
            c.gateway.wire.originator = "codex_exec".to_owned();
            c.gateway.wire.user_agent = "codex_exec/0.171.0 (test wire profile)".to_owned();
        })),
        ..StackBuilder::default()
    }
    .start();
    let before = s.mock.token_requests().len();
    s.mock.revoke_access_token("acct-0");
    let r = s.post_responses_x(true).await;
    assert_eq!(r.status(), 200, "refreshed once, then served");
    let calls = s.mock.token_requests();
    let refresh = &calls[before..];
    assert_eq!(refresh.len(), 1, "one token call");
    assert_eq!(
        refresh[0].header("user-agent"),
        Some("codex_exec/0.171.0 (test wire profile)")
    );
    assert_eq!(refresh[0].header("originator"), Some("codex_exec"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transcript_replay_after_an_account_switch_carries_no_foreign_blob() {
    let s = two_accounts(shared_state::snapshot::Strategy::FillFirst);
    // `store` not false: the gateway keeps the transcript for `previous_response_id`.
    let r = s
        .post_json(
            "/v1/responses",
            &json!({"model": "gpt-5.5", "input": "first",
            "include": ["reasoning.encrypted_content"]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let id = v["id"].as_str().unwrap().to_owned();
    assert_eq!(s.served_by(), ["acct-0"]);
    assert!(v["output"][0]["encrypted_content"].is_string(), "{v}");

    s.mock.set_behaviour(
        "acct-0",
        "error=usage_limit_reached,reasoning=1".parse().unwrap(),
    );
    s.mock.clear_requests();
    let r = s
        .post_json(
            "/v1/responses",
            &json!({"model": "gpt-5.5", "input": "second", "previous_response_id": id,
            "include": ["reasoning.encrypted_content"]}),
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let reqs = upstream(&s.mock);
    let on_1: Vec<&RecordedRequest> = reqs
        .iter()
        .filter(|r| r.account_id() == Some("acct-1"))
        .collect();
    assert_eq!(on_1.len(), 1);
    assert!(on_1[0].blobs().is_empty(), "the replayed blob stayed home");
    assert!(
        on_1[0].body_text().contains("first"),
        "the history was replayed"
    );
    // The replay did carry acct-0's blob: offered to its minter first (which was dry).
    let on_0: Vec<&RecordedRequest> = reqs
        .iter()
        .filter(|r| r.account_id() == Some("acct-0"))
        .collect();
    assert_eq!(on_0.len(), 1);
    assert_eq!(on_0[0].blobs().len(), 1);
    assert!(on_0[0].foreign_blobs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_compaction_stays_with_its_minter() {
    let s = two_accounts(shared_state::snapshot::Strategy::FillFirst);
    // Remote compaction v2: the history ends in a compaction_trigger; the answer is one
    // compaction item that replaces the history in later requests.
    let history = vec![
        json!({"type": "message", "role": "user", "content": "a long history"}),
        json!({"type": "compaction_trigger"}),
    ];
    let (status, resp) = blob_turn(&s.url(), &s.key, &history).await;
    assert_eq!(status, 200);
    let out = resp["output"].as_array().unwrap().clone();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0]["type"], "compaction");
    assert_eq!(s.served_by(), ["acct-0"]);

    s.mock.set_behaviour(
        "acct-0",
        "error=usage_limit_reached,reasoning=1".parse().unwrap(),
    );
    s.mock.clear_requests();
    let next = vec![
        out[0].clone(),
        json!({"type": "message", "role": "user", "content": "go on"}),
    ];
    let (status, _) = blob_turn(&s.url(), &s.key, &next).await;
    assert_eq!(status, 200);
    let reqs = upstream(&s.mock);
    let on_1: Vec<&RecordedRequest> = reqs
        .iter()
        .filter(|r| r.account_id() == Some("acct-1"))
        .collect();
    assert_eq!(on_1.len(), 1, "cleaned before sending");
    let input = on_1[0].json.as_ref().unwrap()["input"]
        .as_array()
        .unwrap()
        .clone();
    assert!(input.iter().all(|i| i["type"] != "compaction"), "{input:?}");
    assert!(on_1[0].body_text().contains("go on"));
    assert!(
        s.metric("codex_gateway_encrypted_items_stripped_total")
            .await
            >= 1
    );
}

/// Runs `sdk_thinking_switch.py PHASE` against the stack, `stdin` piped in; its stdout.
fn sdk_thinking(s: &Stack, phase: &str, stdin: &str) -> String {
    run_python(
        "sdk_thinking_switch.py",
        &[&s.url(), &s.key, phase],
        stdin,
        "Anthropic",
    )
}

/// Issue 23 with the official Anthropic SDK: a conversation that sends our thinking block
/// (its signature carries account-bound encrypted reasoning) back continues after the pool
/// switched accounts, and the new account never receives the foreign blob.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_sdk_with_thinking_continues_after_an_account_switch() {
    let s = two_accounts(shared_state::snapshot::Strategy::FillFirst);
    let first = tokio::task::block_in_place(|| sdk_thinking(&s, "first", ""));
    assert_eq!(s.served_by(), ["acct-0"]);
    let blocks: Value = serde_json::from_str(first.trim()).unwrap();
    let sig = blocks[0]["signature"].as_str().unwrap().to_owned();
    assert!(benches::mock::blob_minted_for(&sig, "acct-0"));
    s.mock.set_behaviour(
        "acct-0",
        "error=usage_limit_reached,reasoning=1".parse().unwrap(),
    );
    s.mock.clear_requests();
    let second = tokio::task::block_in_place(|| sdk_thinking(&s, "second", &first));
    assert!(second.contains("text"), "{second}");
    let reqs = upstream(&s.mock);
    let on_1: Vec<&RecordedRequest> = reqs
        .iter()
        .filter(|r| r.account_id() == Some("acct-1"))
        .collect();
    assert_eq!(on_1.len(), 1, "served by acct-1, cleaned before sending");
    assert!(on_1[0].foreign_blobs().is_empty());
    assert!(on_1[0].body_text().contains("And again."));
}
