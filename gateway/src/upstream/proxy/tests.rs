//! The proxy handshakes under segmentation: every reply delivered whole, one byte per read and
//! at seeded random cuts, on both drivers; bytes after the reply stay in the socket.

use shared_state::{egress::ProxyFailureKind, ProxyUrl};

use super::{handshake, Target};
use crate::{
    testing::{Plan, SegmentedIo},
    wire::read_more,
};

const EXTRA: &[u8] = b"\x16\x03\x01 tunnel bytes";

fn target() -> Target<'static> {
    Target {
        host: "chatgpt.com",
        port: 443,
        addr: Some("203.0.113.7:443".parse().unwrap()),
    }
}

/// Everything left in the socket after the handshake.
async fn rest(io: &mut SegmentedIo) -> Vec<u8> {
    let mut buf = Vec::new();
    while let Ok(n) = read_more(io, &mut buf, 64).await {
        if n == 0 {
            break;
        }
    }
    buf
}

async fn run(url: &str, reply: &[u8], plan: Plan) -> (Result<(), super::ProxyError>, SegmentedIo) {
    let url = ProxyUrl::parse(url).unwrap();
    let mut io = SegmentedIo::new(reply, plan);
    let r = handshake(&mut io, &url, target()).await;
    (r, io)
}

fn plans() -> Vec<Plan> {
    Plan::standard(6, true)
}

#[monoio::test_all(timer_enabled = true)]
async fn connect_with_auth_leaves_the_tunnel_bytes() {
    let reply = [
        &b"HTTP/1.1 200 Connection established\r\nProxy-Agent: t\r\n\r\n"[..],
        EXTRA,
    ]
    .concat();
    for plan in plans() {
        let (r, mut io) = run("http://alice:pa%3Ass@p:3128", &reply, plan).await;
        assert_eq!(r, Ok(()), "{plan:?}");
        assert_eq!(rest(&mut io).await, EXTRA, "{plan:?}");
        let sent = String::from_utf8(io.written(1)).unwrap();
        // base64("alice:pa:ss")
        assert_eq!(
            sent,
            "CONNECT chatgpt.com:443 HTTP/1.1\r\nHost: chatgpt.com:443\r\n\
             Proxy-Authorization: Basic YWxpY2U6cGE6c3M=\r\n\r\n",
            "{plan:?}"
        );
    }
}

#[monoio::test_all(timer_enabled = true)]
async fn connect_without_credentials_sends_no_authorization() {
    for plan in plans() {
        let (r, mut io) = run("http://p:3128", b"HTTP/1.0 200 OK\r\n\r\n", plan).await;
        assert_eq!(r, Ok(()), "{plan:?}");
        let sent = String::from_utf8(io.written(1)).unwrap();
        assert!(!sent.contains("Proxy-Authorization"), "{sent}");
        assert!(rest(&mut io).await.is_empty());
    }
}

#[monoio::test_all(timer_enabled = true)]
async fn connect_error_replies() {
    let cases: [(&[u8], ProxyFailureKind); 5] = [
        (
            b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\nContent-Length: 0\r\n\r\n",
            ProxyFailureKind::Auth,
        ),
        (
            b"HTTP/1.1 502 Bad Gateway\r\n\r\n",
            ProxyFailureKind::Refused,
        ),
        (b"HTTP/1.1 200 OK\r\nX-Half: ", ProxyFailureKind::Protocol),
        (b"SSH-2.0-OpenSSH\r\n\r\n", ProxyFailureKind::Protocol),
        (b"", ProxyFailureKind::Protocol),
    ];
    for (reply, kind) in cases {
        for plan in plans() {
            let (r, _) = run("http://u:p@p:3128", reply, plan).await;
            assert_eq!(r.map_err(|e| e.kind), Err(kind), "{plan:?} {reply:?}");
        }
    }
}

#[monoio::test_all(timer_enabled = true)]
async fn connect_reply_head_is_bounded() {
    let mut reply = b"HTTP/1.1 200 OK\r\n".to_vec();
    while reply.len() < 20_000 {
        reply.extend_from_slice(b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    let (r, _) = run("http://p:1", &reply, Plan::Whole).await;
    assert_eq!(r.map_err(|e| e.kind), Err(ProxyFailureKind::Protocol));
}

#[monoio::test_all(timer_enabled = true)]
async fn socks5h_with_credentials() {
    // method 2, auth ok, reply with a domain-name bound address, then tunnel bytes
    let reply = [
        &[5u8, 2][..],
        &[1, 0],
        &[5, 0, 0, 3, 9],
        b"proxy.lan",
        &[0x1f, 0x90],
        EXTRA,
    ]
    .concat();
    for plan in plans() {
        let (r, mut io) = run("socks5h://bob:s3cret@p:1080", &reply, plan).await;
        assert_eq!(r, Ok(()), "{plan:?}");
        assert_eq!(rest(&mut io).await, EXTRA, "{plan:?}");
        let sent = io.written(1);
        let want = [
            &[5u8, 2, 0, 2][..],
            &[1, 3],
            b"bob",
            &[6],
            b"s3cret",
            &[5, 1, 0, 3, 11],
            b"chatgpt.com",
            &[1, 187],
        ]
        .concat();
        assert_eq!(sent, want, "{plan:?}");
    }
}

#[monoio::test_all(timer_enabled = true)]
async fn socks5_without_auth_resolves_locally() {
    for (bound, extra) in [
        (vec![1u8, 10, 0, 0, 1, 0, 80], EXTRA),
        ([vec![4u8], vec![0; 16], vec![0, 80]].concat(), &b""[..]),
    ] {
        let reply = [&[5u8, 0][..], &[5, 0, 0], bound.as_slice(), extra].concat();
        for plan in plans() {
            let (r, mut io) = run("socks5://p:1080", &reply, plan).await;
            assert_eq!(r, Ok(()), "{plan:?}");
            assert_eq!(rest(&mut io).await, extra, "{plan:?}");
            // socks5:// sends the locally resolved address
            assert_eq!(
                io.written(1),
                vec![5, 1, 0, 5, 1, 0, 1, 203, 0, 113, 7, 1, 187],
                "{plan:?}"
            );
        }
    }
}

#[monoio::test_all(timer_enabled = true)]
async fn socks5_error_replies() {
    let cases: [(&str, Vec<u8>, ProxyFailureKind); 7] = [
        // credentials refused
        ("socks5://u:p@p:1", vec![5, 2, 1, 1], ProxyFailureKind::Auth),
        // no acceptable method
        ("socks5://u:p@p:1", vec![5, 0xff], ProxyFailureKind::Auth),
        // the proxy wants credentials we do not have
        ("socks5://p:1", vec![5, 2], ProxyFailureKind::Auth),
        // connection refused by the target
        (
            "socks5://p:1",
            vec![5, 0, 5, 5, 0, 1, 0, 0, 0, 0, 0, 0],
            ProxyFailureKind::Refused,
        ),
        // not SOCKS5
        (
            "socks5://p:1",
            b"HTTP/1.1 400".to_vec(),
            ProxyFailureKind::Protocol,
        ),
        // unknown address type
        (
            "socks5://p:1",
            vec![5, 0, 5, 0, 0, 9, 0, 0],
            ProxyFailureKind::Protocol,
        ),
        // closed inside the bound address
        (
            "socks5://p:1",
            vec![5, 0, 5, 0, 0, 1, 10, 0],
            ProxyFailureKind::Protocol,
        ),
    ];
    for (url, reply, kind) in cases {
        for plan in plans() {
            let (r, _) = run(url, &reply, plan).await;
            assert_eq!(r.map_err(|e| e.kind), Err(kind), "{url} {reply:?} {plan:?}");
        }
    }
}

/// The handshake returns as soon as the reply is complete, without asking for more bytes (the
/// origin has not spoken yet, and a proxy that waits for us must not deadlock us).
#[monoio::test_all(timer_enabled = true)]
async fn replies_complete_without_eof() {
    for (url, reply) in [
        ("http://p:1", b"HTTP/1.1 200 OK\r\n\r\n".to_vec()),
        ("socks5://p:1", vec![5, 0, 5, 0, 0, 1, 1, 2, 3, 4, 0, 80]),
    ] {
        for plan in plans() {
            let url = ProxyUrl::parse(url).unwrap();
            let mut io = SegmentedIo::new(&reply, plan).hold_open();
            let r = monoio::time::timeout(
                std::time::Duration::from_secs(5),
                handshake(&mut io, &url, target()),
            )
            .await;
            assert!(matches!(r, Ok(Ok(()))), "{plan:?}: {r:?}");
            assert_eq!(io.pending_segments(), 0, "{plan:?}");
        }
    }
}
