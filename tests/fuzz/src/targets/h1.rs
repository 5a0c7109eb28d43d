//! `h1`: the HTTP/1.1 server request reader (`gateway::server::h1::Conn`): heads, `Content-Length`
//! and chunked bodies, trailers, pipelined requests.
//!
//! Input: byte 0 picks the largest segment (0 or 1: one byte per read), byte 1 seeds the cut
//! points (see [`cut`]: at most [`MAX_SEGMENTS`](crate::memio::MAX_SEGMENTS) of them), the rest
//! is what the client sends. Invariants:
//! - the transcript (every request read, then the error that ended the connection) is the same
//!   whole and cut at the points the input chose (one cut pattern per execution: the fuzzer
//!   explores the patterns through bytes 0 and 1);
//! - every request read, written back out with `Content-Length` framing, reads back equal.

use std::{cell::RefCell, time::Duration};

use gateway::server::h1::{Conn, Framing, ReadError, Request};

use crate::memio::{self, cut, MemIo};

/// Body limit: small, so the 413 paths are reachable.
const MAX_BODY: usize = 8 * 1024;
/// Requests read per connection at most (a bounded transcript).
const MAX_REQUESTS: usize = 64;

thread_local! {
    static RUNTIME: RefCell<monoio::Runtime<monoio::time::TimeDriver<monoio::LegacyDriver>>> =
        RefCell::new(
            monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()
                .unwrap_or_else(|e| panic!("monoio runtime: {e}")),
        );
}

/// Runs `fut` to completion on this thread's runtime (nothing under test waits: the stream
/// is in memory).
pub(crate) fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    RUNTIME.with(|rt| rt.borrow_mut().block_on(fut))
}

/// What one connection read: requests, then how it ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Transcript {
    requests: Vec<Seen>,
    end: String,
}

/// The parts of a request a handler sees.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    method: String,
    path: String,
    query: Option<String>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    http10: bool,
    keep_alive: bool,
    framing: Framing,
    expect_continue: bool,
}

impl From<Request> for Seen {
    fn from(r: Request) -> Self {
        Self {
            method: r.method,
            path: r.path,
            query: r.query,
            headers: r.headers,
            body: r.body,
            http10: r.http10,
            keep_alive: r.keep_alive,
            framing: r.framing,
            expect_continue: r.expect_continue,
        }
    }
}

fn describe(e: &ReadError) -> String {
    match e {
        ReadError::Reject { status, message } => format!("{status} {message}"),
        ReadError::TooLarge => "413".into(),
        ReadError::Closed => "closed".into(),
        ReadError::Io(e) => format!("io {e}"),
    }
}

/// Reads requests from `segments` until the connection ends.
pub(crate) fn transcript(segments: Vec<&[u8]>) -> Transcript {
    block_on(async move {
        let mut conn = Conn::new(MemIo::new(segments));
        let mut requests = Vec::new();
        let end = loop {
            if requests.len() == MAX_REQUESTS {
                break "max".to_owned();
            }
            let mut req = match conn.read_head(Duration::from_secs(5)).await {
                Ok(r) => r,
                Err(e) => break describe(&e),
            };
            if let Err(e) = conn.read_body(&mut req, MAX_BODY).await {
                break describe(&e);
            }
            requests.push(Seen::from(req));
        };
        Transcript { requests, end }
    })
}

/// `req` written back out, framed by `Content-Length`.
fn serialize(req: &Seen) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(req.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.path.as_bytes());
    if let Some(q) = &req.query {
        out.push(b'?');
        out.extend_from_slice(q.as_bytes());
    }
    out.extend_from_slice(if req.http10 {
        b" HTTP/1.0\r\n"
    } else {
        b" HTTP/1.1\r\n"
    });
    for (n, v) in &req.headers {
        if n == "content-length" || n == "transfer-encoding" {
            continue;
        }
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !req.body.is_empty() {
        out.extend_from_slice(format!("content-length: {}\r\n", req.body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&req.body);
    out
}

/// The fuzz target.
pub fn run(data: &[u8]) {
    let [max, seed, wire @ ..] = data else {
        return;
    };
    let whole = transcript(memio::whole(wire));
    let split = transcript(cut(wire, u64::from(*seed), usize::from(*max)));
    assert_eq!(whole, split, "cut at seed {seed} max {max}");
    for req in &whole.requests {
        let again = transcript(memio::whole(&serialize(req)));
        let mut want = req.clone();
        want.headers
            .retain(|(n, _)| n != "content-length" && n != "transfer-encoding");
        want.framing = if want.body.is_empty() {
            Framing::None
        } else {
            Framing::Length(want.body.len())
        };
        let got = again.requests.first().map(|r| {
            let mut r = r.clone();
            r.headers
                .retain(|(n, _)| n != "content-length" && n != "transfer-encoding");
            r
        });
        assert_eq!(got.as_ref(), Some(&want), "round trip ended: {}", again.end);
    }
}
