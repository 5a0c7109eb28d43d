//! The client-facing HTTP/1.1 front door over raw sockets: authentication before the body,
//! `Expect: 100-continue`, `HEAD`, production-sized bodies written at random split points, and
//! the panic boundary around each connection (issue 8).

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use integration_tests::{raw::closed, Stack, StackBuilder};

fn connect(s: &Stack) -> TcpStream {
    let c = TcpStream::connect(s.app.data_addr).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    c.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    c
}

/// A response read off the socket: status, lower-cased head, body (by content-length).
struct Resp {
    status: u16,
    head: String,
    body: Vec<u8>,
}

/// Reads one response; `has_body: false` for answers to HEAD.
fn read_response(c: &mut TcpStream, buf: &mut Vec<u8>, has_body: bool) -> Resp {
    let mut tmp = [0u8; 65536];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        let n = c.read(&mut tmp).expect("read head");
        assert!(
            n > 0,
            "closed before a response head: {:?}",
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    buf.drain(..head_end);
    let status: u16 = head[9..12].parse().expect("status");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |v| v.trim().parse().expect("length"));
    let len = if has_body && status != 100 { len } else { 0 };
    while buf.len() < len {
        let n = c.read(&mut tmp).expect("read body");
        assert!(n > 0, "closed inside a response body");
        buf.extend_from_slice(&tmp[..n]);
    }
    let body = buf.drain(..len).collect();
    Resp { status, head, body }
}

/// A Codex-CLI-sized body (`len` bytes of input) with a marker at the very end.
fn big_body(len: usize, stream: bool) -> Vec<u8> {
    let filler: String = (0..len).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    format!(
        r#"{{"model":"gpt-5.5","stream":{stream},"input":[{{"type":"message","role":"user","content":[{{"type":"input_text","text":"{filler} END-MARKER"}}]}}]}}"#
    )
    .into_bytes()
}

fn post_head(key: &str, len: usize, extra: &str) -> String {
    format!(
        "POST /v1/responses HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n{extra}\r\n"
    )
}

#[test]
fn unauthenticated_body_is_never_read_and_no_100_continue() {
    let s = StackBuilder::default().start();
    for extra in ["expect: 100-continue\r\n", ""] {
        let mut c = connect(&s);
        // A 10 MB body is announced; only the head is sent.
        c.write_all(post_head("sk-wrong", 10 << 20, extra).as_bytes())
            .unwrap();
        let mut buf = Vec::new();
        let r = read_response(&mut c, &mut buf, true);
        assert_eq!(r.status, 401, "{}", r.head);
        assert!(r.head.contains("connection: close"), "{}", r.head);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert!(v["error"]["message"].is_string(), "{v}");
        assert!(closed(&mut c), "the connection closes after the refusal");
    }
}

#[test]
fn expect_continue_after_authentication_then_the_answer() {
    let s = StackBuilder::default().start();
    let body = big_body(40 * 1024, false);
    let mut c = connect(&s);
    c.write_all(post_head(&s.key, body.len(), "expect: 100-continue\r\n").as_bytes())
        .unwrap();
    let mut buf = Vec::new();
    let r = read_response(&mut c, &mut buf, false);
    assert_eq!(r.status, 100, "{}", r.head);
    c.write_all(&body).unwrap();
    let r = read_response(&mut c, &mut buf, true);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["status"], "completed", "{v}");
}

#[test]
fn head_healthz_keeps_the_connection_usable() {
    let s = StackBuilder::default().start();
    let mut c = connect(&s);
    c.write_all(
        b"HEAD /healthz HTTP/1.1\r\nhost: gw\r\n\r\nGET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n",
    )
    .unwrap();
    let mut buf = Vec::new();
    let head = read_response(&mut c, &mut buf, false);
    assert_eq!(head.status, 200);
    let get = read_response(&mut c, &mut buf, true);
    assert_eq!(get.status, 200, "the GET after HEAD parses as a response");
    // HEAD announced the length of the very body GET sends.
    assert!(
        head.head
            .contains(&format!("content-length: {}", get.body.len())),
        "{}",
        head.head
    );
    let v: serde_json::Value = serde_json::from_slice(&get.body).unwrap();
    assert_eq!(v["status"], "ok", "{v}");
}

/// 1 MB bodies (Content-Length and chunked) written in random pieces with pauses, so the
/// gateway reads them in many partial reads; then a keep-alive request on the same socket.
#[test]
fn large_bodies_in_random_pieces_over_keep_alive() {
    for legacy in [false, true] {
        let s = StackBuilder {
            legacy,
            ..Default::default()
        }
        .start();
        let body = big_body(1 << 20, false);
        let mut c = connect(&s);
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut pieces = |c: &mut TcpStream, data: &[u8]| {
            let mut rest = data;
            while !rest.is_empty() {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let n = (1 + (rng % 60_000) as usize).min(rest.len());
                c.write_all(&rest[..n]).unwrap();
                rest = &rest[n..];
                if rng.is_multiple_of(4) {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        };
        pieces(&mut c, post_head(&s.key, body.len(), "").as_bytes());
        pieces(&mut c, &body);
        let mut buf = Vec::new();
        let r = read_response(&mut c, &mut buf, true);
        assert_eq!(
            r.status,
            200,
            "legacy={legacy}: {}",
            String::from_utf8_lossy(&r.body)
        );
        // The upstream received the whole input: the marker at the very end is intact.
        let seen = s.mock.requests();
        let last = seen.last().expect("upstream request");
        assert!(
            String::from_utf8_lossy(&last.body).contains("END-MARKER"),
            "legacy={legacy}"
        );
        // Chunked, on the same connection.
        let mut wire = "POST /v1/responses HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n".to_string();
        wire.push_str(&format!("authorization: Bearer {}\r\n\r\n", s.key));
        let mut chunked = wire.into_bytes();
        for part in body.chunks(7919) {
            chunked.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
            chunked.extend_from_slice(part);
            chunked.extend_from_slice(b"\r\n");
        }
        chunked.extend_from_slice(b"0\r\n\r\n");
        pieces(&mut c, &chunked);
        let r = read_response(&mut c, &mut buf, true);
        assert_eq!(
            r.status,
            200,
            "legacy={legacy}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
}

fn metric(s: &Stack, name: &str) -> u64 {
    let mut c = connect(s);
    c.write_all(b"GET /metrics HTTP/1.1\r\nhost: gw\r\n\r\n")
        .unwrap();
    let r = read_response(&mut c, &mut Vec::new(), true);
    String::from_utf8_lossy(&r.body)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .map_or(0, |v| v.trim().parse().expect("metric value"))
}

/// A connection task that panics mid-stream (injected after the commit, while it holds the
/// account's concurrency slot) ends that connection only: the client sees the stream end
/// instead of a hang, the slot is released, the panic is counted, and the worker keeps
/// serving new connections.
#[test]
fn a_panicking_connection_task_is_contained() {
    for legacy in [false, true] {
        let s = StackBuilder {
            legacy,
            workers: 1,
            ..Default::default()
        }
        .start();
        let acct = s.accounts[0].account_id.clone();
        let body = br#"{"model":"gpt-5.5","input":"hi","stream":true}"#;
        let mut c = connect(&s);
        c.write_all(
            post_head(
                &s.key,
                body.len(),
                "x-codex-gateway-fault: panic-after-commit\r\n",
            )
            .as_bytes(),
        )
        .unwrap();
        c.write_all(body).unwrap();
        let t0 = Instant::now();
        assert!(closed(&mut c), "legacy={legacy}: the stream ends, no hang");
        assert!(t0.elapsed() < Duration::from_secs(15));
        let deadline = Instant::now() + Duration::from_secs(5);
        while s.in_flight(&acct) != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            s.in_flight(&acct),
            0,
            "legacy={legacy}: the slot was released"
        );
        assert_eq!(metric(&s, "codex_gateway_connection_panics_total"), 1);
        // The same (only) worker still serves requests, on new connections.
        for _ in 0..3 {
            let body = br#"{"model":"gpt-5.5","input":"hi"}"#;
            let mut c = connect(&s);
            c.write_all(post_head(&s.key, body.len(), "").as_bytes())
                .unwrap();
            c.write_all(body).unwrap();
            let r = read_response(&mut c, &mut Vec::new(), true);
            assert_eq!(r.status, 200, "legacy={legacy}");
        }
    }
}

fn zstd(data: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// What the Codex CLI's built-in provider sends over HTTP: `Content-Encoding: zstd` bodies
/// (docs/protocol.md#what-real-clients-send); other clients send gzip. Both stream, on both endpoints.
#[test]
fn compressed_request_bodies_stream() {
    let s = StackBuilder::default().start();
    let body = big_body(45 * 1024, true);
    let chat = br#"{"model":"gpt-5.5","stream":true,"messages":[{"role":"user","content":"hi COMPRESSED-CHAT"}]}"#;
    for (coding, encoded, path) in [
        ("zstd", zstd(&body), "/v1/responses"),
        ("gzip", gzip(&body), "/v1/responses"),
        ("zstd", zstd(chat), "/v1/chat/completions"),
        ("gzip", gzip(chat), "/v1/chat/completions"),
    ] {
        s.mock.clear_requests();
        let mut c = connect(&s);
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-encoding: {coding}\r\ncontent-length: {}\r\n\r\n",
            s.key,
            encoded.len()
        );
        c.write_all(head.as_bytes()).unwrap();
        c.write_all(&encoded).unwrap();
        let mut buf = Vec::new();
        let r = read_response(&mut c, &mut buf, false);
        assert_eq!(r.status, 200, "{coding} {path}: {}", r.head);
        assert!(r.head.contains("text/event-stream"), "{}", r.head);
        let upstream = s.mock.requests();
        let sent = upstream
            .iter()
            .find(|r| r.path.ends_with("/responses"))
            .expect("upstream request");
        let text = sent.body_text();
        assert!(
            text.contains("END-MARKER") || text.contains("COMPRESSED-CHAT"),
            "{coding} {path}: the upstream got the decoded JSON"
        );
        assert!(sent.header("content-encoding").is_none());
    }
}

#[test]
fn compressed_bombs_and_unknown_codings_are_refused() {
    let s = StackBuilder::default().start();
    let zeros = vec![b' '; 64 << 20];
    for (coding, encoded, status) in [
        ("zstd", zstd(&zeros), 413),
        ("gzip", gzip(&zeros), 413),
        ("br", b"abc".to_vec(), 400),
        ("zstd", b"definitely not zstd".to_vec(), 400),
    ] {
        let mut c = connect(&s);
        let head = format!(
            "POST /v1/responses HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {}\r\ncontent-encoding: {coding}\r\ncontent-length: {}\r\n\r\n",
            s.key,
            encoded.len()
        );
        c.write_all(head.as_bytes()).unwrap();
        c.write_all(&encoded).unwrap();
        let r = read_response(&mut c, &mut Vec::new(), true);
        assert_eq!(
            r.status,
            status,
            "{coding}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert!(v["error"]["message"].is_string(), "{v}");
    }
    assert_eq!(
        s.mock
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/responses"))
            .count(),
        0
    );
}

/// A drained gateway leaves its port at once: dropping a monoio listener only queues an
/// io_uring close, and the accept the kernel still held kept the socket in the
/// `SO_REUSEPORT` group, so a gateway restarted on the same port lost a share of its
/// connections to a listener nobody served (they hung; seen as a CI flake in refresh.rs).
#[test]
fn a_drained_gateway_leaves_its_port_and_a_restart_serves_every_connection() {
    let mut s = StackBuilder::default().start();
    for round in 0..3 {
        s.app.shutdown();
        // Nothing listens any more: every connect is refused, none is accepted into a void.
        for _ in 0..20 {
            match TcpStream::connect_timeout(&s.app.data_addr, Duration::from_secs(2)) {
                Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}"),
                Ok(_) => panic!("round {round}: a drained gateway still accepts connections"),
            }
        }
        let mut cfg = s.cfg.clone();
        cfg.listen = s.app.data_addr;
        s.app = codex_gateway::app::App::spawn(cfg).expect("restart");
        // Fresh connections right after the restart are all served.
        for _ in 0..40 {
            let mut c = connect(&s);
            c.write_all(b"GET /healthz HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n")
                .unwrap();
            let r = read_response(&mut c, &mut Vec::new(), true);
            assert_eq!(r.status, 200, "round {round}");
        }
    }
}
