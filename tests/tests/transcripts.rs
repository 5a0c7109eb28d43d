//! `previous_response_id` over HTTP (issue 10): the gateway keeps the transcripts of responses
//! whose client did not ask for `store:false`, shared by the workers, within a byte budget,
//! and replays the chain upstream (the upstream keeps nothing).

use integration_tests::{
    client,
    fleet::{with_redis, REDIS_URL},
    requests::post_at,
    Stack, StackBuilder,
};
use serde_json::{json, Value};

async fn create(s: &Stack, key: &str, body: Value) -> (u16, Value) {
    // A new connection per request: workers differ, the store is shared.
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let (status, _, v) = post_at(&fresh, &s.url(), "/v1/responses", key, &body).await;
    (status, v)
}

fn last_upstream(s: &Stack) -> Value {
    s.mock
        .requests()
        .iter()
        .rev()
        .find(|r| r.path.ends_with("/responses"))
        .and_then(|r| r.json.clone())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_of_three_over_http_is_replayed_whole() {
    let s = StackBuilder::default().start();
    let (st, r1) = create(&s, &s.key, json!({"model":"gpt-5.5","input":"turn one"})).await;
    assert_eq!(st, 200);
    let (st, r2) = create(
        &s,
        &s.key,
        json!({"model":"gpt-5.5","input":"turn two","previous_response_id": r1["id"]}),
    )
    .await;
    assert_eq!(st, 200, "{r2}");
    // Streaming continuation of the continuation.
    let r = s.post_json("/v1/responses", &json!({"model":"gpt-5.5","input":"turn three","stream":true,"previous_response_id": r2["id"]})).await;
    assert_eq!(r.status(), 200);
    let _ = r.text().await.unwrap();
    let up = last_upstream(&s);
    assert!(up.get("previous_response_id").is_none(), "{up}");
    let text = serde_json::to_string(&up["input"]).unwrap();
    let order: Vec<usize> = [
        "turn one",
        "Hello from mock-codex",
        "turn two",
        "turn three",
    ]
    .iter()
    .map(|m| {
        text.find(m)
            .unwrap_or_else(|| panic!("{m} missing: {text}"))
    })
    .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "history order {order:?}"
    );
    assert_eq!(
        up["input"].as_array().unwrap().len(),
        5,
        "three user turns and two answers"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn another_key_or_store_false_cannot_continue() {
    let s = StackBuilder::default().start();
    let db = s.db.clone();
    let other = std::thread::spawn(move || admin::cli::keys_create(&db, "other").unwrap())
        .join()
        .unwrap();
    // The new key reaches the workers with the next snapshot.
    let mut ok = false;
    for _ in 0..50 {
        if create(&s, &other, json!({"model":"gpt-5.5","input":"x"}))
            .await
            .0
            == 200
        {
            ok = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(ok, "the second key works");
    let (_, mine) = create(&s, &s.key, json!({"model":"gpt-5.5","input":"secret"})).await;
    let (st, e) = create(
        &s,
        &other,
        json!({"model":"gpt-5.5","input":"y","previous_response_id": mine["id"]}),
    )
    .await;
    assert_eq!(st, 400);
    assert_eq!(e["error"]["code"], "previous_response_not_found", "{e}");

    let (_, unstored) = create(
        &s,
        &s.key,
        json!({"model":"gpt-5.5","input":"z","store":false}),
    )
    .await;
    let (st, e) = create(
        &s,
        &s.key,
        json!({"model":"gpt-5.5","input":"w","previous_response_id": unstored["id"]}),
    )
    .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (400, Some("previous_response_not_found"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_byte_budget_evicts_the_oldest() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c| c.transcript_cache_bytes = 16 * 8 * 1024)),
        ..Default::default()
    }
    .start();
    let (_, first) = create(&s, &s.key, json!({"model":"gpt-5.5","input":"the first"})).await;
    for i in 0..200 {
        let (st, _) = create(
            &s,
            &s.key,
            json!({"model":"gpt-5.5","input": format!("filler {i} {}", "x".repeat(2000))}),
        )
        .await;
        assert_eq!(st, 200);
    }
    let (st, e) = create(
        &s,
        &s.key,
        json!({"model":"gpt-5.5","input":"again","previous_response_id": first["id"]}),
    )
    .await;
    assert_eq!(st, 400, "evicted: {e}");
    assert_eq!(e["error"]["code"], "previous_response_not_found");
    let _ = client();
}

/// Two instances on one PostgreSQL database and one Redis: a chain started on one continues
/// on the other (the transcript travels through Redis), and the control instance without Redis
/// cannot continue it (it is Redis that carried it, not a shared process).
#[tokio::test(flavor = "multi_thread")]
async fn a_chain_started_on_one_instance_continues_on_another_through_redis() {
    let s = StackBuilder {
        postgres: true,
        tweak: with_redis(),
        ..StackBuilder::default()
    }
    .start();
    let second = |redis: Option<&str>| {
        s.another_instance(|cfg| cfg.sidecar.redis_url = redis.map(str::to_owned))
    };
    let b = second(Some(REDIS_URL));
    let on = |app: &codex_gateway::app::AppHandle, body: Value| {
        let url = format!("http://{}/v1/responses", app.data_addr);
        let key = s.key.clone();
        async move {
            let r = client()
                .post(url)
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap();
            let st = r.status().as_u16();
            (st, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (st, r1) = create(&s, &s.key, json!({"model":"gpt-5.5","input":"asked on A"})).await;
    assert_eq!(st, 200, "{r1}");
    let (st, r2) = on(
        &b,
        json!({"model":"gpt-5.5","input":"continued on B","previous_response_id": r1["id"]}),
    )
    .await;
    assert_eq!(st, 200, "{r2}");
    let up = last_upstream(&s);
    let text = serde_json::to_string(&up["input"]).unwrap();
    assert!(
        text.find("asked on A").unwrap() < text.find("continued on B").unwrap(),
        "{text}"
    );
    assert_eq!(up["input"].as_array().unwrap().len(), 3, "{text}");
    // And back: B's turn continues on A (A never saw it).
    let (st, _) = create(
        &s,
        &s.key,
        json!({"model":"gpt-5.5","input":"back on A","previous_response_id": r2["id"]}),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(last_upstream(&s)["input"].as_array().unwrap().len(), 5);

    // Control: an instance without Redis knows nothing of A's chain.
    let c = second(None);
    let (st, err) = on(
        &c,
        json!({"model":"gpt-5.5","input":"x","previous_response_id": r1["id"]}),
    )
    .await;
    assert_eq!(st, 400, "{err}");
    assert_eq!(err["error"]["code"], "previous_response_not_found", "{err}");
    tokio::task::block_in_place(|| {
        drop(b);
        drop(c);
    });
}
