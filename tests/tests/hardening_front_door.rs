//! Hostile clients against the real front door (issue 15): request smuggling refused with 400
//! and a closed connection, total head and body deadlines (slowloris), slow readers that stop
//! reading a stream (the account's slot is released), the per-stream output cap, and the
//! connection caps. Real sockets; deadlines are short configured values, never performance
//! figures.

// Test helpers fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use integration_tests::{
    raw::{closed, connect, read_response, ws_connect, ws_read_frame, ws_send_text},
    Stack, StackBuilder,
};

fn upstream_requests(s: &Stack) -> usize {
    s.mock
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/responses"))
        .count()
}

fn ok_request(s: &Stack) -> u16 {
    let body = br#"{"model":"gpt-5.5","input":"hi"}"#;
    let mut c = connect(s);
    let head = format!(
        "POST /v1/responses HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        s.key,
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body).unwrap();
    read_response(&mut c).0
}

/// Each smuggling vector, written whole and then one byte per write: 400 in OpenAI's error
/// shape, `connection: close`, the connection really closes, and the request hidden behind
/// it is never served (nothing reaches the upstream).
#[test]
fn smuggling_vectors_get_400_and_a_closed_connection() {
    let s = StackBuilder::default().start();
    let smuggled = "GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n";
    let auth = format!("authorization: Bearer {}\r\n", s.key);
    let h = format!(
        "POST /v1/responses HTTP/1.1\r\nhost: gw\r\n{auth}content-type: application/json\r\n"
    );
    let vectors = [
        format!("{h}content-length: 4\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"),
        format!("{h}transfer-encoding: chunked\r\ncontent-length: 4\r\n\r\n0\r\n\r\n{smuggled}"),
        format!("{h}content-length: 2\r\ncontent-length: 2\r\n\r\n{{}}{smuggled}"),
        format!("{h}content-length: 2\r\ncontent-length: 40\r\n\r\n{{}}{smuggled}"),
        format!("{h}x-folded: a\r\n b\r\ncontent-length: 2\r\n\r\n{{}}{smuggled}"),
        format!("{h}transfer-encoding: chunked, identity\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n{smuggled}"),
        format!("{h}transfer-encoding: chunked\r\n\r\n-2\r\n{{}}\r\n0\r\n\r\n{smuggled}"),
        format!("{h}transfer-encoding: chunked\r\n\r\n2;a=b c\r\n{{}}\r\n0\r\n\r\n{smuggled}"),
        format!(
            "{h}transfer-encoding: chunked\r\n\r\n1ffffffffffffffff\r\n{{}}\r\n0\r\n\r\n{smuggled}"
        ),
        format!("{h}transfer-encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n{smuggled}"),
    ];
    for wire in &vectors {
        for one_byte in [false, true] {
            let mut c = connect(&s);
            if one_byte {
                for b in wire.as_bytes() {
                    if c.write_all(&[*b]).is_err() {
                        break; // refused before the end: fine
                    }
                }
            } else {
                c.write_all(wire.as_bytes()).unwrap();
            }
            let (status, head, body) = read_response(&mut c);
            assert_eq!(status, 400, "{wire:?} one_byte={one_byte}: {head}");
            assert!(head.contains("connection: close"), "{head}");
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert!(v["error"]["message"].is_string(), "{v}");
            assert!(closed(&mut c), "{wire:?}: the connection closes");
        }
    }
    assert_eq!(upstream_requests(&s), 0, "nothing reached the upstream");
}

/// A head sent one byte at a time, slower than the head budget allows, is refused (408) and
/// closed once the *total* budget is spent, though each byte arrives well within any per-read
/// timeout. The same for a body trickling below the minimum rate.
#[test]
fn trickled_heads_and_bodies_hit_their_total_deadlines() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c| {
            c.gateway.client_header_timeout = Duration::from_secs(1);
            c.gateway.client_body_timeout = Duration::from_secs(1);
            c.gateway.client_body_min_rate = 1024;
        })),
        ..Default::default()
    }
    .start();
    // Head: a byte every 300 ms (a per-read timeout of 1 s would never fire).
    let mut c = connect(&s);
    let head = format!(
        "POST /v1/responses HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {}\r\ncontent-length: 2\r\n\r\n{{}}",
        s.key
    );
    let t0 = Instant::now();
    let mut refused = false;
    for b in head.as_bytes() {
        if c.write_all(&[*b]).is_err() {
            refused = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
        if t0.elapsed() > Duration::from_secs(8) {
            break;
        }
    }
    let _ = refused;
    assert!(closed(&mut c), "the trickled head's connection closes");
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    // Body: the head at once, then 10 bytes per second of a 1000-byte body.
    let mut c = connect(&s);
    let head = format!(
        "POST /v1/responses HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {}\r\ncontent-length: 1000\r\n\r\n",
        s.key
    );
    c.write_all(head.as_bytes()).unwrap();
    let t0 = Instant::now();
    let writer = {
        let mut c = c.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..1000 {
                if c.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let (status, _, body) = read_response(&mut c);
    assert_eq!(status, 408, "{}", String::from_utf8_lossy(&body));
    assert!(closed(&mut c));
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    drop(c);
    writer.join().unwrap();
    assert_eq!(upstream_requests(&s), 0);
}

/// Slowloris: 2,000 connections each sending one header byte per second are all closed
/// within the head budget (plus slack), and normal requests are served meanwhile.
/// (The benchmark runs 10,000; see docs/hardening.md.)
#[test]
fn slowloris_connections_are_closed_and_do_not_starve_others() {
    const N: usize = 2000;
    let budget = Duration::from_secs(3);
    let s = StackBuilder {
        tweak: Some(Box::new(move |c| c.gateway.client_header_timeout = budget)),
        ..Default::default()
    }
    .start();
    let prefix = b"POST /v1/responses HTTP/1.1\r\nhost: gw\r\nx-slow: ".to_vec();
    let mut conns: Vec<(TcpStream, Instant, Option<Instant>)> = Vec::with_capacity(N);
    for _ in 0..N {
        let c = TcpStream::connect(s.app.data_addr).expect("connect");
        c.set_nodelay(true).unwrap();
        c.set_nonblocking(true).unwrap();
        conns.push((c, Instant::now(), None));
    }
    let mut sent = 0usize;
    let started = Instant::now();
    let mut served = 0;
    while conns.iter().any(|c| c.2.is_none()) && started.elapsed() < budget * 4 {
        for (c, first, done) in conns.iter_mut() {
            if done.is_some() {
                continue;
            }
            let b = prefix.get(sent).copied().unwrap_or(b'a');
            if sent == 0 {
                *first = Instant::now();
            }
            let _ = c.write(&[b]);
            let mut tmp = [0u8; 512];
            match c.read(&mut tmp) {
                Ok(0) => *done = Some(Instant::now()),
                Ok(_) => {} // the 408; EOF follows
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => *done = Some(Instant::now()),
            }
        }
        sent += 1;
        // Normal clients are served while the slow ones hold their connections.
        assert_eq!(ok_request(&s), 200, "a normal request during the attack");
        served += 1;
        std::thread::sleep(Duration::from_millis(1000));
    }
    let open = conns.iter().filter(|c| c.2.is_none()).count();
    assert_eq!(open, 0, "{open} of {N} slow connections still open");
    let worst = conns
        .iter()
        .map(|(_, first, done)| done.map_or(Duration::MAX, |d| d - *first))
        .max()
        .unwrap();
    // Closed within the budget (plus the 1 s polling step and scheduling slack).
    assert!(worst < budget + Duration::from_secs(3), "worst {worst:?}");
    assert!(served >= 3);
    assert_eq!(ok_request(&s), 200);
}

/// Makes every answer of the stack's first account `tokens` tokens long; its account id.
fn long_answers(s: &Stack, tokens: u64) -> String {
    let acct = s.accounts[0].account_id.clone();
    s.mock.set_behaviour(
        &acct,
        benches::Behaviour {
            tokens: Some(tokens),
            ..Default::default()
        },
    );
    acct
}

/// One worker on `legacy` or io_uring, a 1 s write deadline, and an account whose answers
/// are 5 million tokens long (a stream that outlasts any test).
fn endless_answer_stack(legacy: bool) -> (Stack, String) {
    let s = StackBuilder {
        legacy,
        workers: 1,
        tweak: Some(Box::new(|c| {
            c.gateway.client_write_timeout = Duration::from_secs(1);
        })),
        ..Default::default()
    }
    .start();
    let acct = long_answers(&s, 5_000_000);
    (s, acct)
}

/// Asserts that `acct` holds its one slot (`held` says why it should), waits (up to 30 s)
/// until it holds none, and asserts that it was released (`released` names by what).
fn slot_held_then_released(s: &Stack, acct: &str, held: &str, released: &str) {
    assert_eq!(s.in_flight(acct), 1, "{held}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.in_flight(acct) != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(s.in_flight(acct), 0, "{released}");
}

/// A streaming client that stops reading (tiny receive buffer) while the upstream sends a
/// large answer: past the write deadline the stream is closed, the upstream stream and the
/// account's slot are released, and other requests are served by that account meanwhile.
#[test]
fn a_slow_reader_releases_its_account_slot() {
    for legacy in [true, false] {
        let (s, acct) = endless_answer_stack(legacy);
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.connect(&s.app.data_addr.into()).unwrap();
        let mut c: TcpStream = sock.into();
        let body = br#"{"model":"gpt-5.5","input":"write a lot","stream":true}"#;
        let head = format!(
            "POST /v1/responses HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            s.key,
            body.len()
        );
        c.write_all(head.as_bytes()).unwrap();
        c.write_all(body).unwrap();
        // Read the first bytes (the stream is open and holds the slot), then stop reading.
        let mut first = [0u8; 1024];
        let n = c.read(&mut first).unwrap();
        assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
        slot_held_then_released(
            &s,
            &acct,
            &format!("legacy={legacy}: the stream holds the slot"),
            &format!("legacy={legacy}: the slow reader's slot was released"),
        );
        // The connection was closed by the gateway: reading on eventually hits EOF/reset.
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = 0usize;
        let mut tmp = vec![0u8; 65536];

        let t0 = Instant::now();
        let end = loop {
            match c.read(&mut tmp) {
                Ok(0) => break "eof".to_owned(),
                Ok(n) => got += n,
                Err(e) => break format!("{e:?}"),
            }
        };
        assert!(
            end == "eof" || end.contains("ConnectionReset"),
            "legacy={legacy}: the stream is closed: {end} after {got} bytes in {:?}",
            t0.elapsed()
        );
        s.mock.clear_behaviour(&acct);
        assert_eq!(ok_request(&s), 200);
        let m = metrics(&s);
        assert!(
            m.contains("codex_gateway_client_timeouts_total{phase=\"write\"} 1"),
            "{m}"
        );
    }
}

fn metrics(s: &Stack) -> String {
    let mut c = connect(s);
    c.write_all(b"GET /metrics HTTP/1.1\r\nhost: gw\r\n\r\n")
        .unwrap();
    String::from_utf8(read_response(&mut c).2).unwrap()
}

/// A runaway stream past `max_stream_output_bytes` ends with one `response.failed`
/// (`stream_output_limit`) and releases its slot; non-streamed answers get a 502.
#[test]
fn the_stream_output_cap_ends_a_runaway_stream() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c| c.gateway.max_stream_output_bytes = 64 * 1024)),
        ..Default::default()
    }
    .start();
    let acct = long_answers(&s, 100_000);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let r = s
            .post("/v1/responses")
            .body(r#"{"model":"gpt-5.5","input":"hi","stream":true}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        let events = integration_tests::parse_sse(&text);
        let (last, data) = events.last().unwrap();
        assert_eq!(last, "response.failed", "{data}");
        assert!(data.contains("stream_output_limit"), "{data}");
        assert!(text.len() < 256 * 1024, "{}", text.len());
        let r = s
            .post("/v1/responses")
            .body(r#"{"model":"gpt-5.5","input":"hi"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 502);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "stream_output_limit", "{v}");
    });
    assert_eq!(s.in_flight(&acct), 0);
    // Small answers are untouched.
    s.mock.clear_behaviour(&acct);
    assert_eq!(ok_request(&s), 200);
}

/// The global cap answers 503 and the per-IP cap 429, in OpenAI's error shape with
/// `retry-after`; a freed place is usable again.
#[test]
fn connection_caps_refuse_with_openai_errors() {
    for (global, per_ip, status, code) in [
        (3, 0, 503, "too_many_connections"),
        (0, 3, 429, "too_many_connections_per_ip"),
    ] {
        let s = StackBuilder {
            tweak: Some(Box::new(move |c| {
                c.max_connections = global;
                c.max_connections_per_ip = per_ip;
            })),
            ..Default::default()
        }
        .start();
        let mut held: Vec<TcpStream> = (0..3).map(|_| connect(&s)).collect();
        // The held connections are admitted: each answers a request.
        for c in held.iter_mut() {
            c.write_all(b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n")
                .unwrap();
            assert_eq!(read_response(c).0, 200);
        }
        let mut extra = connect(&s);
        let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n");
        let (st, head, body) = read_response(&mut extra);
        assert_eq!(st, status, "{head}");
        assert!(head.contains("retry-after: 1"), "{head}");
        assert!(head.contains("connection: close"), "{head}");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], code, "{v}");
        assert!(closed(&mut extra));
        drop(held.pop());
        std::thread::sleep(Duration::from_millis(200));
        let mut again = connect(&s);
        again
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n")
            .unwrap();
        assert_eq!(
            read_response(&mut again).0,
            200,
            "a freed place is reusable"
        );
        let m = metrics_on(&mut held[0]);
        let reason = if global > 0 { "global" } else { "per_ip" };
        assert!(
            m.contains(&format!(
                "codex_gateway_connections_refused_total{{reason=\"{reason}\"}} 1"
            )),
            "{m}"
        );
    }
}

fn metrics_on(c: &mut TcpStream) -> String {
    c.write_all(b"GET /metrics HTTP/1.1\r\nhost: gw\r\n\r\n")
        .unwrap();
    String::from_utf8(read_response(c).2).unwrap()
}

/// `metrics_token`: `/metrics` answers 401 (OpenAI error shape) without the bearer token or
/// with a wrong one, 200 with it.
#[test]
fn metrics_can_be_put_behind_a_token() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c| {
            c.gateway.metrics_token = Some(shared_state::Secret::new("m-token-1"));
        })),
        ..Default::default()
    }
    .start();
    for (auth, status) in [
        ("", 401),
        ("authorization: Bearer m-token-2\r\n", 401),
        ("authorization: Bearer m-token-1\r\n", 200),
    ] {
        let mut c = connect(&s);
        c.write_all(format!("GET /metrics HTTP/1.1\r\nhost: gw\r\n{auth}\r\n").as_bytes())
            .unwrap();
        let (st, _, body) = read_response(&mut c);
        assert_eq!(st, status, "{auth:?}");
        let text = String::from_utf8_lossy(&body);
        if status == 200 {
            assert!(text.contains("codex_gateway_client_connections"), "{text}");
        } else {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert!(v["error"]["message"].is_string(), "{v}");
        }
    }
}

/// The client WebSocket, on both drivers: a client that stops reading while a large turn
/// streams ends its session at the write deadline (the account's slot is released and the
/// deadline counted); when it reads again it finds the frames already on the wire, then a
/// Close 1008, then the end of the stream.
#[test]
fn a_websocket_client_that_stops_reading_releases_its_slot() {
    for legacy in [true, false] {
        let (s, acct) = endless_answer_stack(legacy);
        let mut c = ws_connect(&s, Some(4096)).unwrap();
        ws_send_text(
            &mut c,
            br#"{"type":"response.create","model":"gpt-5.5","input":"write a lot"}"#,
        );
        // The first event: the turn is running and holds the slot; then stop reading.
        let (op, _) = ws_read_frame(&mut c).unwrap();
        assert_eq!(op, 1, "legacy={legacy}: a text frame");
        slot_held_then_released(
            &s,
            &acct,
            &format!("legacy={legacy}: the turn holds the slot"),
            &format!("legacy={legacy}: the stalled session released its slot"),
        );
        // Reading again: the frames on the wire, then our Close 1008, then EOF.
        let mut frames = 0;
        let close = loop {
            match ws_read_frame(&mut c) {
                Ok((1, _)) => frames += 1,
                Ok((8, p)) => break p,
                Ok((op, _)) => panic!("legacy={legacy}: unexpected opcode {op}"),
                Err(e) => panic!("legacy={legacy}: no Close after {frames} frames: {e}"),
            }
        };
        assert_eq!(
            u16::from_be_bytes([close[0], close[1]]),
            1008,
            "legacy={legacy}: {:?}",
            String::from_utf8_lossy(&close[2..])
        );
        assert!(
            closed(&mut c),
            "legacy={legacy}: the socket closes after the Close"
        );
        s.mock.clear_behaviour(&acct);
        assert_eq!(ok_request(&s), 200);
        let m = metrics(&s);
        assert!(
            m.contains("codex_gateway_client_timeouts_total{phase=\"write\"} 1"),
            "legacy={legacy}: {m}"
        );
    }
}

/// `max_ws_sessions_per_key`: past the cap an upgrade gets 429 in OpenAI's shape with
/// `retry-after`, before any 101; a closed session gives its place back.
#[test]
fn websocket_sessions_are_capped_per_key() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c| c.gateway.max_ws_sessions_per_key = 2)),
        ..Default::default()
    }
    .start();
    let a = ws_connect(&s, None).unwrap();
    let _b = ws_connect(&s, None).unwrap();
    let (status, head, body) = ws_connect(&s, None).unwrap_err();
    assert_eq!(status, 429, "{head}");
    assert!(head.contains("retry-after: 1"), "{head}");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "too_many_websocket_sessions", "{v}");
    assert_eq!(v["error"]["type"], "requests", "{v}");
    // An HTTP request of the same key is not refused by the cap.
    assert_eq!(ok_request(&s), 200);
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut refused = 1;
    let _c = loop {
        match ws_connect(&s, None) {
            Ok(c) => break c,
            Err((st, ..)) => {
                // Until the gateway has seen the close.
                refused += 1;
                assert_eq!(st, 429);
                assert!(
                    Instant::now() < deadline,
                    "the closed session's place came back"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let m = metrics(&s);
    assert!(
        m.contains(&format!(
            "codex_gateway_key_limit_rejections_total{{limit=\"ws_sessions\"}} {refused}"
        )),
        "{m}"
    );
}

// === Hardening, round two (issue 28) ===

/// `depth` levels of `[` and as many `]`.
fn nested(depth: usize) -> Vec<u8> {
    let mut v = vec![b'['; depth];
    v.extend(std::iter::repeat_n(b']', depth));
    v
}

fn gzip(body: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(body).unwrap();
    e.finish().unwrap()
}

/// One request on a fresh connection: status and body.
fn call(s: &Stack, path: &str, extra: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut c = connect(s);
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n",
        s.key,
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body).unwrap();
    let (st, _, body) = read_response(&mut c);
    (st, body)
}

/// JSON nested 10,000 levels deep (17 KB, or about a hundred bytes gzip-compressed) used to
/// overflow a worker's stack and abort the whole process. On every data-plane route, plain
/// and compressed, at the top and inside a field, on both drivers: 400 in the route's
/// dialect, nothing upstream, and the gateway serves on.
#[test]
fn deeply_nested_json_is_refused_on_every_route() {
    let deep = nested(10_000);
    let mut in_field = br#"{"model":"gpt-5.5","input":"hi","metadata":"#.to_vec();
    in_field.extend_from_slice(&deep);
    in_field.push(b'}');
    for legacy in [true, false] {
        let s = StackBuilder {
            legacy,
            ..Default::default()
        }
        .start();
        for path in [
            "/v1/responses",
            "/v1/chat/completions",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/backend-api/codex/responses",
        ] {
            for (what, extra, body) in [
                ("top", "", deep.clone()),
                ("field", "", in_field.clone()),
                ("gzip", "content-encoding: gzip\r\n", gzip(&in_field)),
            ] {
                let (st, body) = call(&s, path, extra, &body);
                let v: serde_json::Value =
                    serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{path} {what}: {e}"));
                assert_eq!(st, 400, "legacy={legacy} {path} {what}: {v}");
                let message = if path.starts_with("/v1/messages") {
                    assert_eq!(v["type"], "error", "{path} {what}: {v}");
                    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
                    v["error"]["message"].as_str().unwrap().to_owned()
                } else {
                    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
                    v["error"]["message"].as_str().unwrap().to_owned()
                };
                assert!(message.contains("deeper than 128"), "{path} {what}: {v}");
            }
        }
        assert_eq!(upstream_requests(&s), 0, "legacy={legacy}");
        assert_eq!(ok_request(&s), 200, "legacy={legacy}: still serving");
        assert!(
            metrics(&s).contains("codex_gateway_json_too_deep_total 15"),
            "legacy={legacy}"
        );
    }
}

/// A WebSocket message nesting past the limit, wherever the nesting is (a field before
/// `type`, the request's input, a bare array): an error event, then Close 1009; the gateway
/// serves on. Both drivers.
#[test]
fn deeply_nested_websocket_messages_close_1009() {
    let deep = String::from_utf8(nested(10_000)).unwrap();
    let messages = [
        format!(r#"{{"deep":{deep},"type":"response.create"}}"#),
        format!(r#"{{"type":"response.create","model":"gpt-5.5","input":{deep}}}"#),
        deep.clone(),
    ];
    for legacy in [true, false] {
        let s = StackBuilder {
            legacy,
            ..Default::default()
        }
        .start();
        for m in &messages {
            let mut c = ws_connect(&s, None).unwrap();
            ws_send_text(&mut c, m.as_bytes());
            let (op, p) = ws_read_frame(&mut c).unwrap();
            assert_eq!(op, 1, "legacy={legacy}: an error event first");
            let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
            assert_eq!(v["type"], "error", "{v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("deeper than 128"),
                "{v}"
            );
            let (op, p) = ws_read_frame(&mut c).unwrap();
            assert_eq!(op, 8, "legacy={legacy}: then a Close");
            assert_eq!(u16::from_be_bytes([p[0], p[1]]), 1009, "legacy={legacy}");
        }
        assert_eq!(upstream_requests(&s), 0);
        assert_eq!(ok_request(&s), 200, "legacy={legacy}: still serving");
    }
}

/// Invalid messages get error events out of a per-turn budget (32), then Close 1008: a client
/// cannot make the gateway write for it without bound. An unsupported `type` is echoed
/// shortened (a 600 KB `type` used to come back as a 2.4 MB error event). Both drivers.
#[test]
fn websocket_error_events_are_bounded() {
    for legacy in [true, false] {
        let s = StackBuilder {
            legacy,
            ..Default::default()
        }
        .start();
        let mut c = ws_connect(&s, None).unwrap();
        let long_type = format!(r#"{{"type":"{}"}}"#, "x".repeat(600_000));
        ws_send_text(&mut c, long_type.as_bytes());
        let (op, p) = ws_read_frame(&mut c).unwrap();
        assert_eq!(op, 1);
        assert!(p.len() < 1024, "legacy={legacy}: {} bytes", p.len());
        let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
        assert_eq!(v["error"]["param"], "type", "{v}");
        for _ in 0..100 {
            ws_send_text(&mut c, br#"{"type":"nonsense"}"#);
        }
        let (errors, close) = errors_then_close(&mut c, legacy);
        assert_eq!(1 + errors, 32, "legacy={legacy}");
        assert_eq!(close, 1008);
        assert!(
            metrics(&s).contains("codex_gateway_ws_error_budget_closed_total 1"),
            "legacy={legacy}"
        );
    }
}

/// Reads text frames (error events) up to the server's Close: how many, and the Close code. A
/// failed read (a reset) fails the test.
fn errors_then_close(c: &mut std::net::TcpStream, legacy: bool) -> (usize, u16) {
    let mut errors = 0;
    loop {
        match ws_read_frame(c) {
            Ok((1, _)) => errors += 1,
            Ok((8, p)) => return (errors, u16::from_be_bytes([p[0], p[1]])),
            Ok((op, _)) => panic!("opcode {op}"),
            Err(e) => panic!("legacy={legacy}: after {errors} error events: {e}"),
        }
    }
}

/// A session closed on our side (here: its error budget spent) goes on reading, and dropping,
/// what its client still sends for a moment before it closes the socket: a socket closed with
/// unread bytes sends a reset, and the client then loses the error events and the Close that
/// say why (CI once saw `ECONNRESET` in the test above). This client goes on sending 4 MiB of
/// messages after the budget is spent, in one write, and only then reads. Both drivers.
#[test]
fn a_websocket_closed_on_our_side_is_not_reset() {
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let payload = br#"{"type":"nonsense"}"#;
    let mut frame = vec![0x81u8, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    let mut all = Vec::new();
    while all.len() < 4 << 20 {
        all.extend_from_slice(&frame);
    }
    for legacy in [true, false] {
        let s = StackBuilder {
            legacy,
            ..Default::default()
        }
        .start();
        let mut c = ws_connect(&s, None).unwrap();
        c.write_all(&all)
            .unwrap_or_else(|e| panic!("legacy={legacy}: the gateway stopped reading: {e}"));
        let (errors, close) = errors_then_close(&mut c, legacy);
        assert_eq!(errors, 32, "legacy={legacy}");
        assert_eq!(close, 1008);
        // Then the gateway's end of the stream, not a reset.
        let mut rest = [0u8; 64];
        assert_eq!(c.read(&mut rest).unwrap(), 0, "legacy={legacy}");
        assert_eq!(upstream_requests(&s), 0);
        assert_eq!(ok_request(&s), 200, "legacy={legacy}: still serving");
    }
}

/// What HTTP refuses, the WebSocket refuses: `input: 5` is an error event, not an empty turn
/// upstream.
#[test]
fn a_websocket_turn_with_a_non_list_input_is_refused() {
    let s = StackBuilder::default().start();
    let mut c = ws_connect(&s, None).unwrap();
    ws_send_text(
        &mut c,
        br#"{"type":"response.create","model":"gpt-5.5","input":5}"#,
    );
    let (op, p) = ws_read_frame(&mut c).unwrap();
    assert_eq!(op, 1);
    let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["param"], "input", "{v}");
    assert_eq!(upstream_requests(&s), 0);
    let (st, body) = call(&s, "/v1/responses", "", br#"{"model":"gpt-5.5","input":5}"#);
    assert_eq!(st, 400);
    let h: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(h["error"]["message"], v["error"]["message"]);
}

/// The key of `s`, by name: its id.
fn key_id(s: &Stack, rt: &tokio::runtime::Runtime) -> i64 {
    let keys: serde_json::Value = rt.block_on(async {
        s.admin_get("/api/admin/keys")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    let list = keys["data"].as_array().unwrap();
    list.iter()
        .find(|k| k["name"] == "test")
        .and_then(|k| k["id"].as_i64())
        .unwrap()
}

fn patch_key(s: &Stack, rt: &tokio::runtime::Runtime, id: i64, body: serde_json::Value) {
    let st = rt.block_on(async {
        s.admin_patch(&format!("/api/admin/keys/{id}"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .status()
    });
    assert_eq!(st, 200);
}

/// Reads frames up to the turn's terminal event (or an error event); the last frame's JSON.
fn ws_turn_end(c: &mut TcpStream) -> serde_json::Value {
    loop {
        let (op, p) = ws_read_frame(c).unwrap();
        assert_eq!(op, 1, "{}", String::from_utf8_lossy(&p));
        let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
        if matches!(
            v["type"].as_str(),
            Some("response.completed" | "response.failed" | "error")
        ) {
            return v;
        }
    }
}

/// An open WebSocket does not keep its key's old rights: every turn resolves the key again,
/// so lowered limits apply from the next turn and a disabled key gets `invalid_api_key` and
/// Close 1008. Both drivers.
#[test]
fn an_open_websocket_loses_a_revoked_keys_rights() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for legacy in [true, false] {
        let s = StackBuilder {
            legacy,
            ..Default::default()
        }
        .start();
        let id = key_id(&s, &rt);
        let mut c = ws_connect(&s, None).unwrap();
        let turn = br#"{"type":"response.create","model":"gpt-5.5","input":"hi"}"#;
        ws_send_text(&mut c, turn);
        assert_eq!(ws_turn_end(&mut c)["type"], "response.completed");
        // Lowered limits: another model only.
        patch_key(
            &s,
            &rt,
            id,
            serde_json::json!({"allowed_models": ["gpt-5.1-codex-mini"]}),
        );
        ws_send_text(&mut c, turn);
        let v = ws_turn_end(&mut c);
        assert_eq!(v["type"], "error", "legacy={legacy}: {v}");
        assert_eq!(
            v["error"]["code"], "model_not_found",
            "legacy={legacy}: {v}"
        );
        patch_key(&s, &rt, id, serde_json::json!({"allowed_models": []}));
        ws_send_text(&mut c, turn);
        assert_eq!(ws_turn_end(&mut c)["type"], "response.completed");
        // Disabled: refused, and the socket closes.
        patch_key(&s, &rt, id, serde_json::json!({"enabled": false}));
        ws_send_text(&mut c, turn);
        let v = ws_turn_end(&mut c);
        assert_eq!(
            v["error"]["code"], "invalid_api_key",
            "legacy={legacy}: {v}"
        );
        let (op, p) = ws_read_frame(&mut c).unwrap();
        assert_eq!(op, 8);
        assert_eq!(u16::from_be_bytes([p[0], p[1]]), 1008);
    }
}

/// The ChatGPT-mode side calls answer anyone with a 404: a body they carry is read only when
/// small (the connection is kept), a large or chunked one is not read at all (the 404 comes
/// at once and the connection closes), where 400 such connections used to hold 6.6 GB.
#[test]
fn side_calls_do_not_read_large_bodies() {
    let s = StackBuilder::default().start();
    let mut c = connect(&s);
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // A small body: read and dropped, the connection lives on.
    let small = r#"{"events":[]}"#;
    for _ in 0..2 {
        write!(
            c,
            "POST /backend-api/analytics/events HTTP/1.1\r\nhost: gw\r\ncontent-length: {}\r\n\r\n{small}",
            small.len()
        )
        .unwrap();
        let (st, head, _) = read_response(&mut c);
        assert_eq!(st, 404);
        assert!(!head.contains("connection: close"), "{head}");
    }
    // 16 MiB announced, none sent: the 404 does not wait for it.
    for framing in [
        "content-length: 16777216\r\n",
        "transfer-encoding: chunked\r\n",
    ] {
        let mut c = connect(&s);
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            c,
            "POST /api/anything/at/all HTTP/1.1\r\nhost: gw\r\n{framing}\r\n"
        )
        .unwrap();
        let (st, head, _) = read_response(&mut c);
        assert_eq!(st, 404, "{framing}");
        assert!(head.contains("connection: close"), "{framing}: {head}");
        assert!(closed(&mut c), "{framing}");
    }
}

#[test]
fn bearer_is_matched_without_regard_to_case() {
    let s = StackBuilder::default().start();
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let body = br#"{"model":"gpt-5.5","input":"hi"}"#;
        let mut c = connect(&s);
        let head = format!(
            "POST /v1/responses HTTP/1.1\r\nhost: gw\r\nauthorization: {scheme} {}\r\ncontent-length: {}\r\n\r\n",
            s.key,
            body.len()
        );
        c.write_all(head.as_bytes()).unwrap();
        c.write_all(body).unwrap();
        assert_eq!(read_response(&mut c).0, 200, "{scheme}");
    }
}
