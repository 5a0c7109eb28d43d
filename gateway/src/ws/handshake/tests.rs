//! Handshake tests: the RFC 6455 §1.3 example, real clients' requests, every refusal, and
//! the client side's checks.

use super::*;

fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

fn request(extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v = h(&[
        ("host", "server.example.com"),
        ("upgrade", "websocket"),
        ("connection", "Upgrade"),
        ("sec-websocket-key", KEY),
        ("sec-websocket-version", "13"),
    ]);
    v.extend(h(extra));
    v
}

fn without(name: &str) -> Vec<(String, String)> {
    request(&[])
        .into_iter()
        .filter(|(n, _)| n != name)
        .collect()
}

fn with(name: &str, value: &str) -> Vec<(String, String)> {
    let mut v = without(name);
    v.push((name.into(), value.into()));
    v
}

#[test]
fn rfc6455_example_key() {
    assert_eq!(accept_key(KEY), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    let hs = accept(&request(&[])).unwrap();
    assert_eq!(hs.accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    assert_eq!(hs.deflate, None);
    assert_eq!(hs.extensions, None);
}

#[test]
fn response_head_bytes() {
    let hs = accept(&request(&[(
        "sec-websocket-extensions",
        "permessage-deflate; client_max_window_bits",
    )]))
    .unwrap();
    let head = response_head(
        &hs,
        &[("x-request-id", "abc"), ("x-bad", "a\r\nset-cookie: x")],
    );
    assert_eq!(
        String::from_utf8(head).unwrap(),
        "HTTP/1.1 101 Switching Protocols\r\n\
         upgrade: websocket\r\n\
         connection: Upgrade\r\n\
         sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\
         sec-websocket-extensions: permessage-deflate\r\n\
         x-request-id: abc\r\n\
         \r\n"
    );
}

#[test]
fn real_client_requests() {
    // Codex CLI (tungstenite with deflate) and the OpenAI SDKs.
    let hs = accept(&request(&[(
        "sec-websocket-extensions",
        "permessage-deflate; client_max_window_bits",
    )]))
    .unwrap();
    assert_eq!(hs.deflate, Some(DeflateParams::default()));
    assert_eq!(hs.extensions.as_deref(), Some("permessage-deflate"));
    // Chrome.
    let chrome = h(&[
        ("host", "localhost:8080"),
        ("connection", "Upgrade"),
        ("pragma", "no-cache"),
        ("upgrade", "websocket"),
        ("origin", "http://localhost:8080"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "x3JJHMbDL1EzLkh9GBhXDw=="),
        (
            "sec-websocket-extensions",
            "permessage-deflate; client_max_window_bits",
        ),
    ]);
    let hs = accept(&chrome).unwrap();
    assert_eq!(hs.accept, accept_key("x3JJHMbDL1EzLkh9GBhXDw=="));
    assert!(hs.deflate.is_some());
    // Firefox: "keep-alive, Upgrade".
    let hs = accept(&with("connection", "keep-alive, Upgrade")).unwrap();
    assert_eq!(hs.deflate, None);
    // Case-insensitive tokens.
    assert!(accept(&with("upgrade", "WebSocket")).is_ok());
    assert!(accept(&with("connection", "UPGRADE")).is_ok());
    // Python websockets with a server window limit it cannot get, then a plain offer.
    let hs = accept(&request(&[
        (
            "sec-websocket-extensions",
            "permessage-deflate; server_max_window_bits=10; client_max_window_bits",
        ),
        (
            "sec-websocket-extensions",
            "permessage-deflate; client_max_window_bits",
        ),
    ]))
    .unwrap();
    assert_eq!(hs.extensions.as_deref(), Some("permessage-deflate"));
    // Only the window-limited offer: no extension, but the upgrade still succeeds.
    let hs = accept(&request(&[(
        "sec-websocket-extensions",
        "permessage-deflate; server_max_window_bits=10",
    )]))
    .unwrap();
    assert_eq!(hs.deflate, None);
    assert_eq!(hs.extensions, None);
}

#[test]
fn refusals() {
    let cases: Vec<(Vec<(String, String)>, HandshakeError)> = vec![
        (without("upgrade"), HandshakeError::NotUpgrade),
        (with("upgrade", "h2c"), HandshakeError::NotUpgrade),
        (with("upgrade", "websocket/13"), HandshakeError::NotUpgrade),
        (without("connection"), HandshakeError::ConnectionNotUpgrade),
        (
            with("connection", "keep-alive"),
            HandshakeError::ConnectionNotUpgrade,
        ),
        (
            without("sec-websocket-version"),
            HandshakeError::MissingVersion,
        ),
        (
            with("sec-websocket-version", "8"),
            HandshakeError::UnsupportedVersion,
        ),
        (
            with("sec-websocket-version", "13, 8"),
            HandshakeError::UnsupportedVersion,
        ),
        (
            request(&[("sec-websocket-version", "13")]),
            HandshakeError::UnsupportedVersion,
        ),
        (without("sec-websocket-key"), HandshakeError::MissingKey),
        (
            request(&[("sec-websocket-key", KEY)]),
            HandshakeError::MissingKey,
        ),
        (
            with("sec-websocket-key", "not base64!"),
            HandshakeError::InvalidKey,
        ),
        (
            with("sec-websocket-key", "AAAAAAAAAAAAAAAAAAAA"),
            HandshakeError::InvalidKey,
        ),
        (
            with("sec-websocket-key", "AAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
            HandshakeError::InvalidKey,
        ),
        (with("sec-websocket-key", ""), HandshakeError::InvalidKey),
    ];
    for (headers, expected) in cases {
        let err = accept(&headers).unwrap_err();
        assert_eq!(err, expected, "{headers:?}");
        assert!(!err.message().is_empty());
    }
    let err = accept(&with("sec-websocket-version", "8")).unwrap_err();
    assert_eq!(err.status(), 426);
    assert_eq!(err.headers(), &[("sec-websocket-version", "13")]);
    let err = accept(&without("sec-websocket-key")).unwrap_err();
    assert_eq!(err.status(), 400);
    assert!(err.headers().is_empty());
    assert!(!is_upgrade_request(&without("upgrade")));
    assert!(is_upgrade_request(&request(&[])));
}

fn parse_request(bytes: &[u8]) -> (String, Vec<(String, String)>) {
    let text = std::str::from_utf8(bytes).unwrap();
    assert!(text.ends_with("\r\n\r\n"));
    let mut lines = text.trim_end().split("\r\n");
    let start = lines.next().unwrap().to_string();
    let headers = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    (start, headers)
}

fn server_answer(hs: &ClientHandshake, ext: Option<&str>) -> Vec<(String, String)> {
    let mut v = h(&[
        ("upgrade", "websocket"),
        ("connection", "Upgrade"),
        ("sec-websocket-accept", &accept_key(&hs.key)),
    ]);
    if let Some(e) = ext {
        v.push(("sec-websocket-extensions".into(), e.into()));
    }
    v
}

#[test]
fn client_request_is_accepted_by_our_server() {
    let (hs, bytes) = client_request(
        "chatgpt.com",
        "/backend-api/codex/responses",
        &[
            ("authorization", "Bearer t".to_string()),
            ("x-evil", "a\nb".to_string()),
        ],
        true,
    );
    let (start, headers) = parse_request(&bytes);
    assert_eq!(start, "GET /backend-api/codex/responses HTTP/1.1");
    assert!(headers.contains(&("host".into(), "chatgpt.com".into())));
    assert!(headers.contains(&("authorization".into(), "Bearer t".into())));
    assert!(!headers.iter().any(|(n, _)| n == "x-evil"));
    assert!(headers.contains(&(
        "sec-websocket-extensions".into(),
        "permessage-deflate; client_max_window_bits".into()
    )));
    let server = accept(&headers).unwrap();
    assert_eq!(server.accept, hs.expected_accept);
    assert_eq!(
        client_verify(&hs, 101, &server_answer(&hs, server.extensions.as_deref())),
        Ok(Some(DeflateParams::default()))
    );
    // Fresh keys each time.
    let (other, _) = client_request("h", "/", &[], false);
    assert_ne!(other.key, hs.key);
    // Without the offer there is no extensions header.
    let (_, bytes) = client_request("h", "/", &[], false);
    assert!(!parse_request(&bytes)
        .1
        .iter()
        .any(|(n, _)| n == "sec-websocket-extensions"));
}

#[test]
fn client_verify_checks() {
    let (hs, _) = client_request("h", "/", &[], true);
    let good = server_answer(&hs, None);
    assert_eq!(client_verify(&hs, 101, &good), Ok(None));
    assert_eq!(
        client_verify(&hs, 200, &good),
        Err(HandshakeError::UnexpectedStatus(200))
    );
    assert_eq!(client_verify(&hs, 200, &good).unwrap_err().status(), 502);
    // Wrong or missing accept.
    let mut wrong = server_answer(&hs, None);
    wrong[2].1 = accept_key("AAAAAAAAAAAAAAAAAAAAAA==");
    assert_eq!(
        client_verify(&hs, 101, &wrong),
        Err(HandshakeError::InvalidAccept)
    );
    let missing: Vec<_> = good
        .iter()
        .filter(|(n, _)| n != "sec-websocket-accept")
        .cloned()
        .collect();
    assert_eq!(
        client_verify(&hs, 101, &missing),
        Err(HandshakeError::InvalidAccept)
    );
    let no_upgrade: Vec<_> = good
        .iter()
        .filter(|(n, _)| n != "upgrade")
        .cloned()
        .collect();
    assert_eq!(
        client_verify(&hs, 101, &no_upgrade),
        Err(HandshakeError::NotUpgrade)
    );
    let no_conn: Vec<_> = good
        .iter()
        .filter(|(n, _)| n != "connection")
        .cloned()
        .collect();
    assert_eq!(
        client_verify(&hs, 101, &no_conn),
        Err(HandshakeError::ConnectionNotUpgrade)
    );
    // Extensions the server may choose.
    assert_eq!(
        client_verify(
            &hs,
            101,
            &server_answer(
                &hs,
                Some("permessage-deflate; server_no_context_takeover; server_max_window_bits=12")
            )
        ),
        Ok(Some(DeflateParams {
            server_no_context_takeover: true,
            server_max_window_bits: Some(12),
            ..DeflateParams::default()
        }))
    );
    // ...and those it may not.
    for bad in [
        "permessage-deflate; client_max_window_bits=10",
        "x-webkit-deflate-frame",
        "permessage-deflate; foo",
    ] {
        assert!(
            matches!(
                client_verify(&hs, 101, &server_answer(&hs, Some(bad))),
                Err(HandshakeError::Extension(_))
            ),
            "{bad}"
        );
    }
    // An extension we did not offer at all.
    let (plain, _) = client_request("h", "/", &[], false);
    assert!(matches!(
        client_verify(
            &plain,
            101,
            &server_answer(&plain, Some("permessage-deflate"))
        ),
        Err(HandshakeError::Extension(_))
    ));
    // A subprotocol we did not ask for.
    let mut proto = server_answer(&plain, None);
    proto.push(("sec-websocket-protocol".into(), "chat".into()));
    assert_eq!(
        client_verify(&plain, 101, &proto),
        Err(HandshakeError::UnexpectedProtocol)
    );
    let (asked, _) = client_request(
        "h",
        "/",
        &[("sec-websocket-protocol", "chat".into())],
        false,
    );
    let mut proto = server_answer(&asked, None);
    proto.push(("sec-websocket-protocol".into(), "chat".into()));
    assert_eq!(client_verify(&asked, 101, &proto), Ok(None));
}
