//! The Responses WebSocket end to end (issue 10): a real WebSocket client against the gateway
//! in front of mock-codex, on both monoio drivers.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use integration_tests::{
    ws_client::{self, connect_responses, read_turn, responses_request, send_json, Ws},
    Stack, StackBuilder,
};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest, Message};

async fn connect(s: &Stack) -> Ws {
    let mut req = responses_request(s, &s.key);
    req.headers_mut().insert(
        "session-id",
        "0199a213-81c0-7800-8aa1-bbab2a035a53".parse().unwrap(),
    );
    ws_client::connect(req).await.0
}

async fn send(ws: &mut Ws, v: Value) {
    send_json(ws, &v).await;
}

/// Sends `v` and reads its turn (see [`ws_client::turn`]).
async fn exchange(ws: &mut Ws, v: Value) -> Vec<Value> {
    ws_client::turn(ws, &v).await
}

fn types(evs: &[Value]) -> Vec<&str> {
    evs.iter()
        .map(|e| e["type"].as_str().unwrap_or(""))
        .collect()
}

fn upstream_inputs(s: &Stack) -> Vec<Value> {
    s.mock
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/responses"))
        .filter_map(|r| r.json.clone())
        .collect()
}

fn stacks() -> Vec<Stack> {
    [false, true]
        .into_iter()
        .map(|legacy| {
            StackBuilder {
                legacy,
                ..Default::default()
            }
            .start()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_turns_on_one_socket_the_second_by_previous_response_id() {
    for s in stacks() {
        let mut ws = connect(&s).await;
        let t1 = exchange(&mut ws, json!({"type":"response.create","model":"gpt-5.5","input":"first question","stream":true})).await;
        let ty = types(&t1);
        assert_eq!(ty.first(), Some(&"response.created"), "{ty:?}");
        assert_eq!(ty.last(), Some(&"response.completed"), "{ty:?}");
        assert!(ty.contains(&"response.output_text.delta"));
        assert!(
            !ty.contains(&"codex.rate_limits"),
            "quota frames are stripped"
        );
        let id = t1[0]["response"]["id"].as_str().unwrap().to_owned();

        let t2 = exchange(&mut ws, json!({"type":"response.create","model":"gpt-5.5","previous_response_id": id,
            "input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"second question"}]}]})).await;
        assert_eq!(types(&t2).last(), Some(&"response.completed"));

        // Both turns went over one pooled upstream WebSocket, the second as the exact
        // continuation: previous_response_id and only the new item.
        assert_eq!(
            s.mock.ws_handshakes(),
            1,
            "one upstream socket for the conversation"
        );
        let ups = upstream_inputs(&s);
        assert_eq!(ups.len(), 2);
        let last = ups.last().unwrap();
        assert_eq!(last["previous_response_id"], id.as_str(), "{last}");
        let input = last["input"].as_array().unwrap();
        assert_eq!(input.len(), 1, "only the new item: {last}");
        assert_eq!(input[0]["content"][0]["text"], "second question");
        let metrics = s.metrics_text().await;
        let idle: i64 = metrics
            .lines()
            .filter(|l| l.starts_with("codex_gateway_upstream_ws_idle{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<i64>().ok())
            .sum();
        assert_eq!(idle, 1, "the socket is back in the pool between turns");
        let _ = ws.close(None).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn warm_up_then_a_turn_with_only_the_new_items() {
    let s = StackBuilder::default().start();
    let mut ws = connect(&s).await;
    let base = json!([{"type":"message","role":"developer","content":[{"type":"input_text","text":"BASE PROMPT ".repeat(2000)}]}]);
    let w = exchange(&mut ws, json!({"type":"response.create","model":"gpt-5.5","generate":false,"store":false,"input": base})).await;
    assert_eq!(types(&w), vec!["response.created", "response.completed"]);
    assert_eq!(w[1]["response"]["output"], json!([]));
    assert!(
        upstream_inputs(&s).is_empty(),
        "a warm-up spends no upstream turn"
    );
    let id = w[0]["response"]["id"].as_str().unwrap().to_owned();

    let t = exchange(&mut ws, json!({"type":"response.create","model":"gpt-5.5","store":false,"previous_response_id":id,
        "input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"say hi"}]}]})).await;
    assert_eq!(types(&t).last(), Some(&"response.completed"));
    let ups = upstream_inputs(&s);
    assert_eq!(ups.len(), 1);
    let input = ups[0]["input"].as_array().unwrap();
    assert_eq!(input.len(), 2, "the warm-up's base prompt and the new item");
    assert_eq!(input[0]["role"], "developer");
    assert_eq!(input[1]["content"][0]["text"], "say hi");
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_previous_response_id_is_an_error_event_and_the_socket_lives_on() {
    let s = StackBuilder::default().start();
    let mut ws = connect(&s).await;
    let e = exchange(&mut ws, json!({"type":"response.create","model":"gpt-5.5","input":"x","previous_response_id":"resp_nope"})).await;
    assert_eq!(e.len(), 1);
    assert_eq!(e[0]["type"], "error");
    assert_eq!(e[0]["status"], 400);
    assert_eq!(
        e[0]["error"]["code"], "previous_response_not_found",
        "{}",
        e[0]
    );
    send(
        &mut ws,
        json!({"type":"response.create","model":"gpt-5.5","input":"y"}),
    )
    .await;
    assert_eq!(
        types(&read_turn(&mut ws).await).last(),
        Some(&"response.completed")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_create_during_a_turn_is_refused_and_nothing_is_lost() {
    let s = StackBuilder::default().start();
    let mut ws = connect(&s).await;
    send(
        &mut ws,
        json!({"type":"response.create","model":"gpt-5.5","input":"slow",
        "client_metadata":{"x-mock-inter-event-delay-ms":"100"}}),
    )
    .await;
    send(
        &mut ws,
        json!({"type":"response.create","model":"gpt-5.5","input":"too early"}),
    )
    .await;
    let mut errors = 0;
    let mut completed = 0;
    while completed == 0 {
        for ev in read_turn(&mut ws).await {
            match ev["type"].as_str() {
                Some("error") => errors += 1,
                Some("response.completed") => completed += 1,
                _ => {}
            }
        }
    }
    assert_eq!((errors, completed), (1, 1));
    assert_eq!(upstream_inputs(&s).len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn handshake_needs_a_key_and_errors_are_http() {
    let s = StackBuilder::default().start();
    let req = format!("ws://{}/v1/responses", s.app.data_addr)
        .into_client_request()
        .unwrap();
    match tokio_tungstenite::connect_async(req).await {
        Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 401),
        other => panic!("expected a 401, got {:?}", other.map(|(_, r)| r.status())),
    }
}

/// A handshake the gateway refuses is answered by the one error mapping: its status and
/// headers (426 with `sec-websocket-version: 13` for a version we do not speak), the OpenAI
/// error body, the Responses route's metrics.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_handshake_is_an_http_error_with_its_headers() {
    let s = StackBuilder::default().start();
    let mut req = responses_request(&s, &s.key);
    req.headers_mut()
        .insert("sec-websocket-version", "8".parse().unwrap());
    let resp = match tokio_tungstenite::connect_async(req).await {
        Err(tungstenite::Error::Http(resp)) => resp,
        other => panic!("expected a 426, got {:?}", other.map(|(_, r)| r.status())),
    };
    assert_eq!(resp.status(), 426);
    assert_eq!(resp.headers()["sec-websocket-version"], "13");
    let v: Value = serde_json::from_slice(resp.body().as_deref().unwrap()).unwrap();
    assert_eq!(v["error"]["code"], "websocket_handshake_failed", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(
        s.metric("codex_gateway_requests_total{route=\"responses\",status=\"426\"}")
            .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failure_after_output_ends_the_turn_not_the_socket() {
    // Two accounts: the overload after output cools the first one (its effect applies even
    // after the commit), the next turn goes to the other.
    let s = StackBuilder {
        accounts: 2,
        ..Default::default()
    }
    .start();
    let mut ws = connect(&s).await;
    let t = exchange(
        &mut ws,
        json!({"type":"response.create","model":"gpt-5.5","input":"x",
        "client_metadata":{"x-mock-fail-after-output":"server_is_overloaded"}}),
    )
    .await;
    assert!(types(&t).contains(&"response.output_text.delta"));
    assert_eq!(types(&t).last(), Some(&"response.failed"));
    send(
        &mut ws,
        json!({"type":"response.create","model":"gpt-5.5","input":"again"}),
    )
    .await;
    assert_eq!(
        types(&read_turn(&mut ws).await).last(),
        Some(&"response.completed")
    );
    // Ping/pong and a clean close.
    ws.send(Message::Ping(b"hb".to_vec().into())).await.unwrap();
    loop {
        match ws.next().await {
            Some(Ok(Message::Pong(p))) => {
                assert_eq!(&p[..], b"hb");
                break;
            }
            Some(Ok(_)) => continue,
            other => panic!("no pong: {other:?}"),
        }
    }
    ws.close(None).await.unwrap();
}

/// The account that served a turn runs out of quota: the continuation is replayed, whole, on
/// another account (the upstream holds no state the gateway depends on).
#[tokio::test(flavor = "multi_thread")]
async fn a_continuation_moves_to_another_account_when_the_first_is_out_of_quota() {
    let s = StackBuilder {
        accounts: 2,
        ..Default::default()
    }
    .start();
    let mut ws = connect(&s).await;
    let t1 = exchange(
        &mut ws,
        json!({"type":"response.create","model":"gpt-5.5","input":"remember pelican"}),
    )
    .await;
    assert_eq!(types(&t1).last(), Some(&"response.completed"));
    let id = t1[0]["response"]["id"].as_str().unwrap().to_owned();
    let first = s.served_by().last().cloned().expect("served");
    s.mock.set_behaviour(
        &first,
        benches::Behaviour::error(benches::ErrorKind::UsageLimitReached),
    );
    let t2 = exchange(&mut ws, json!({"type":"response.create","model":"gpt-5.5","previous_response_id":id,"input":"what word?"})).await;
    assert_eq!(
        types(&t2).last(),
        Some(&"response.completed"),
        "{:?}",
        t2.last()
    );
    let served = s.served_by();
    let second = served.last().unwrap();
    assert_ne!(
        second, &first,
        "the continuation moved to the other account"
    );
    let last = upstream_inputs(&s).pop().unwrap();
    let text = serde_json::to_string(&last["input"]).unwrap();
    assert!(
        text.contains("remember pelican") && text.contains("what word?"),
        "{text}"
    );
}

/// The gateway's WebSocket read loop under segmentation: a handshake and a ~60 KB
/// `response.create` (compressed with permessage-deflate, plus a ping) written over a raw
/// socket in random pieces with pauses, on both drivers; the turn is answered, the ping too.
#[test]
fn frames_split_at_random_points_over_a_raw_socket() {
    use std::io::{Read, Write};

    use gateway::ws::{
        codec::{Decoder, Encoder, Limits, Message as WsMsg, Role},
        handshake,
    };
    for legacy in [false, true] {
        let s = StackBuilder {
            legacy,
            ..Default::default()
        }
        .start();
        let mut c = std::net::TcpStream::connect(s.app.data_addr).unwrap();
        c.set_nodelay(true).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let (hs, head) = handshake::client_request(
            &s.app.data_addr.to_string(),
            "/v1/responses",
            &[("authorization", format!("Bearer {}", s.key))],
            true,
        );
        let payload = json!({"type":"response.create","model":"gpt-5.5",
            "input": format!("{} SPLIT-END", "segmented input ".repeat(4000))})
        .to_string();
        let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(legacy);
        let mut pieces = |c: &mut std::net::TcpStream, data: &[u8]| {
            let mut rest = data;
            while !rest.is_empty() {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let n = (1 + (rng % 3000) as usize).min(rest.len());
                c.write_all(&rest[..n]).unwrap();
                rest = &rest[n..];
                if rng.is_multiple_of(3) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        };
        pieces(&mut c, &head);
        // Read the 101 head.
        let mut buf = Vec::new();
        let mut tmp = [0u8; 16384];
        let head_end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            let n = c.read(&mut tmp).unwrap();
            assert!(n > 0, "closed during the handshake");
            buf.extend_from_slice(&tmp[..n]);
        };
        let text = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let mut lines = text.split("\r\n");
        let status: u16 = lines.next().unwrap()[9..12].parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let deflate = handshake::client_verify(&hs, status, &headers).expect("101");
        assert!(deflate.is_some(), "permessage-deflate accepted");
        buf.drain(..head_end);
        let mut enc = Encoder::new(Role::Client, deflate);
        let mut frames = Vec::new();
        enc.ping(&mut frames, b"split-ping");
        enc.text(&mut frames, payload.as_bytes());
        pieces(&mut c, &frames);
        let mut dec = Decoder::new(Role::Client, Limits::default(), deflate);
        let (mut pong, mut done) = (false, false);
        while !(pong && done) {
            match dec.decode(&mut buf).expect("valid server frames") {
                Some(WsMsg::Pong(p)) => {
                    assert_eq!(p, b"split-ping");
                    pong = true;
                }
                Some(WsMsg::Text(t)) => {
                    let v: Value = serde_json::from_slice(&t).unwrap();
                    assert_ne!(v["type"], "error", "{v}");
                    done |= v["type"] == "response.completed";
                }
                Some(other) => panic!("unexpected {other:?}"),
                None => {
                    let n = c.read(&mut tmp).unwrap();
                    assert!(n > 0, "closed before the turn ended");
                    buf.extend_from_slice(&tmp[..n]);
                }
            }
        }
        let sent = upstream_inputs(&s).pop().unwrap();
        assert!(
            sent.to_string().contains("SPLIT-END"),
            "the whole message went upstream"
        );
    }
}

/// The upstream socket that produced a response dies between turns: the continuation is
/// replayed whole on a fresh socket (the upstream's connection-local state is gone).
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_upstream_socket_means_a_replay_on_a_fresh_one() {
    let s = StackBuilder::default().start();
    let mut ws = connect(&s).await;
    let t1 = exchange(
        &mut ws,
        json!({"type":"response.create","model":"gpt-5.5","input":"first question"}),
    )
    .await;
    let id = t1[0]["response"]["id"].as_str().unwrap().to_owned();
    assert_eq!(s.mock.ws_kill_all(), 1);
    integration_tests::wait::wait_for(
        "the upstream socket gone",
        std::time::Duration::from_secs(10),
        async || s.mock.ws_open() == 0,
    )
    .await;
    let t2 = exchange(&mut ws, json!({"type":"response.create","model":"gpt-5.5","previous_response_id":id,"input":"second question"})).await;
    assert_eq!(
        types(&t2).last(),
        Some(&"response.completed"),
        "{:?}",
        t2.last()
    );
    assert_eq!(s.mock.ws_handshakes(), 2, "a fresh upstream socket");
    let last = upstream_inputs(&s).pop().unwrap();
    assert!(last.get("previous_response_id").is_none(), "{last}");
    let text = serde_json::to_string(&last["input"]).unwrap();
    assert!(
        text.contains("first question")
            && text.contains("Hello from mock-codex")
            && text.contains("second question"),
        "{text}"
    );
}

/// An origin that refuses the upgrade: turns go over HTTP, and after a few refusals the
/// breaker stops trying WebSocket.
#[tokio::test(flavor = "multi_thread")]
async fn refused_upgrades_fall_back_to_http_and_open_the_breaker() {
    let s = StackBuilder {
        mock: benches::MockConfig {
            ws_refuse_upgrade: Some(426),
            ..Default::default()
        },
        ..Default::default()
    }
    .start();
    let mut ws = connect(&s).await;
    for i in 0..6 {
        send(
            &mut ws,
            json!({"type":"response.create","model":"gpt-5.5","input":format!("turn {i}")}),
        )
        .await;
        assert_eq!(
            types(&read_turn(&mut ws).await).last(),
            Some(&"response.completed")
        );
    }
    let http = s
        .mock
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/responses"))
        .count();
    assert_eq!(http, 6, "every turn was served over HTTP");
    assert_eq!(
        s.mock.ws_rejected_handshakes(),
        3,
        "the breaker opened after three refusals"
    );
}

/// Clients that send no session signal at all, many at once: each socket's turns still stay
/// on one account and one pooled upstream socket (the socket is the conversation), whatever
/// the load on the accounts does to the pick.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sockets_turns_stay_on_one_upstream_socket_under_load() {
    let s = StackBuilder {
        accounts: 4,
        ..Default::default()
    }
    .start();
    let sessions = (0..8).map(|n| {
        let s = &s;
        async move {
            let (mut ws, _) = connect_responses(s, &s.key).await;
            let mut prev: Option<String> = None;
            for i in 0..4 {
                let mut body = json!({"type":"response.create","model":"gpt-5.5",
                    "input":format!("session {n} turn {i}"),
                    "client_metadata":{"x-mock-inter-event-delay-ms":"15"}});
                if let Some(p) = &prev {
                    body["previous_response_id"] = json!(p);
                }
                let t = exchange(&mut ws, body).await;
                assert_eq!(types(&t).last(), Some(&"response.completed"));
                prev = t[0]["response"]["id"].as_str().map(str::to_owned);
            }
        }
    });
    futures_util::future::join_all(sessions).await;
    assert_eq!(
        s.mock.ws_handshakes(),
        8,
        "one upstream socket per client socket for all its turns"
    );
}

/// Idle pooled upstream sockets are pinged: a healthy one answers and is reused for the exact
/// continuation; one that went silent with its TCP connection open (no FIN, no RST) is found
/// dead and closed, so the next turn replays on a fresh socket at once instead of waiting on
/// the dead one until the first-byte timeout.
#[tokio::test(flavor = "multi_thread")]
async fn idle_upstream_sockets_are_pinged_and_dead_ones_replaced() {
    for legacy in [false, true] {
        let s = StackBuilder {
            legacy,
            tweak: Some(Box::new(|c| {
                c.gateway.upstream.ws_ping_interval = Duration::from_millis(200);
                c.gateway.upstream.ws_pong_timeout = Duration::from_millis(300);
                c.gateway.upstream.first_byte_timeout = Duration::from_secs(15);
            })),
            ..Default::default()
        }
        .start();
        let mut ws = connect(&s).await;
        let t1 = exchange(
            &mut ws,
            json!({"type":"response.create","model":"gpt-5.5","input":"first question"}),
        )
        .await;
        let id1 = t1[0]["response"]["id"].as_str().unwrap().to_owned();
        // Several liveness rounds on a healthy socket: it stays pooled and exact.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let t2 = exchange(&mut ws, json!({"type":"response.create","model":"gpt-5.5","previous_response_id":id1,"input":"second question"})).await;
        assert_eq!(types(&t2).last(), Some(&"response.completed"), "{t2:?}");
        assert_eq!(
            s.mock.ws_handshakes(),
            1,
            "legacy={legacy}: the pinged socket was reused"
        );
        let last = upstream_inputs(&s).pop().unwrap();
        assert_eq!(
            last["previous_response_id"],
            json!(id1),
            "exact continuation"
        );
        assert_eq!(s.metric("codex_gateway_upstream_ws_dead_total").await, 0);
        let id2 = t2.last().unwrap()["response"]["id"]
            .as_str()
            .unwrap()
            .to_owned();

        // The upstream socket goes silent: the ping finds it dead.
        assert_eq!(s.mock.ws_freeze_all(), 1);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while s.metric("codex_gateway_upstream_ws_dead_total").await == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "legacy={legacy}: never found dead"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // (Reused, the dead socket would hold this turn until the first-byte timeout and
        // end it with an error.)
        let t3 = exchange(&mut ws, json!({"type":"response.create","model":"gpt-5.5","previous_response_id":id2,"input":"third question"})).await;
        assert_eq!(types(&t3).last(), Some(&"response.completed"), "{t3:?}");
        assert_eq!(s.mock.ws_handshakes(), 2, "a fresh upstream socket");
        let last = upstream_inputs(&s).pop().unwrap();
        assert!(
            last.get("previous_response_id").is_none(),
            "replayed: {last}"
        );
        s.mock.ws_kill_all();
    }
}

/// A turn too big for the upstream's WebSocket (close 1009 before any output) goes over HTTP
/// once and completes; it does not count against the origin (later small turns still use
/// WebSocket).
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_too_big_for_the_upstream_websocket_goes_over_http_once() {
    for legacy in [false, true] {
        let s = StackBuilder {
            legacy,
            mock: benches::MockConfig {
                ws_max_message_bytes: Some(64 * 1024),
                ..Default::default()
            },
            ..Default::default()
        }
        .start();
        let mut ws = connect(&s).await;
        let big = "x".repeat(200 * 1024);
        for round in 0..4 {
            let t = exchange(&mut ws, json!({"type":"response.create","model":"gpt-5.5","input":[{"type":"message","role":"user","content":[{"type":"input_text","text": big}]}]})).await;
            assert_eq!(
                types(&t).last(),
                Some(&"response.completed"),
                "legacy={legacy} round {round}: {:?}",
                t.last()
            );
        }
        let reqs = s.mock.requests();
        let http = reqs
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/responses"))
            .count();
        assert_eq!(http, 4, "legacy={legacy}: each big turn over HTTP");
        assert_eq!(s.metric("codex_gateway_upstream_ws_too_big_total").await, 4);
        // The origin is not taken for broken: a small turn still goes over WebSocket.
        let t = exchange(
            &mut ws,
            json!({"type":"response.create","model":"gpt-5.5","input":"small"}),
        )
        .await;
        assert_eq!(types(&t).last(), Some(&"response.completed"));
        let last = s.mock.requests().pop().unwrap();
        assert_eq!(
            last.method, "WS",
            "legacy={legacy}: the small turn used WebSocket"
        );
    }
}

/// An upstream WebSocket that hangs mid-turn, after output, ends the turn at the upstream idle
/// timeout (kept on the worker's deadline wheel, not a runtime timer per event) with the
/// failure in the turn's own events; the client's socket lives on for the next turn. Both
/// drivers.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_whose_upstream_socket_hangs_ends_at_the_idle_timeout() {
    const IDLE: Duration = Duration::from_millis(400);
    for legacy in [false, true] {
        let s = StackBuilder {
            legacy,
            tweak: Some(Box::new(|c: &mut codex_gateway::config::Config| {
                c.gateway.upstream.idle_timeout = IDLE;
            })),
            ..Default::default()
        }
        .start();
        let mut ws = connect(&s).await;
        let t0 = std::time::Instant::now();
        let t = exchange(
            &mut ws,
            json!({"type":"response.create","model":"gpt-5.5","input":"x",
            "client_metadata":{"x-mock-stall-after":"5"}}),
        )
        .await;
        let took = t0.elapsed();
        assert!(took >= IDLE, "legacy={legacy}: ended early: {took:?}");
        assert!(
            took < IDLE * 10,
            "legacy={legacy}: not at the idle timeout: {took:?}"
        );
        assert!(types(&t).contains(&"response.output_text.delta"), "{t:?}");
        let last = t.last().unwrap().to_string();
        assert!(last.contains("upstream_timeout"), "legacy={legacy}: {last}");
        assert!(
            s.mock.ws_requests() >= 1,
            "the turn went over an upstream WebSocket"
        );
        let t = exchange(
            &mut ws,
            json!({"type":"response.create","model":"gpt-5.5","input":"again"}),
        )
        .await;
        assert_eq!(
            types(&t).last(),
            Some(&"response.completed"),
            "legacy={legacy}"
        );
    }
}
