//! WebSocket mode of loadgen: Responses WebSocket sessions (`GET .../responses` with
//! `Upgrade: websocket`), several `response.create` turns per socket, one at a time.
//!
//! # Key Components
//! - [`WsConfig`]: turns per session, `previous_response_id` chaining, think time, and the
//!   `idle` variant (do the turns, then hold the socket open and silent until the deadline).
//! - [`WsTarget`]: the handshake URI and the `response.create` frame sent each turn.
//! - `user`: one virtual user: connect, run the turns, close (and reconnect for the next
//!   session), or hold the socket idle.
//!
//! # Usage
//! Each text (or binary) frame the server sends during a turn is one event. The turn's *time
//! to first event* goes into `ttfb_ms`, the time to its terminal event
//! (`response.completed` / `response.incomplete` / `response.done`, or the failure events
//! `response.failed` / `error`) into `latency_ms`, and the time between two frames of a turn
//! into `gap_ms`. `open` counts sockets (101 received, not yet closed). With `chain`, each turn
//! names the previous turn's `response.id` as `previous_response_id`.
//!
//! No `permessage-deflate` is offered: tungstenite has no compression, so every peer (the
//! gateway, nginx, mock-codex) is measured uncompressed.
//!
//! # Error handling
//! A handshake answered with a non-101 status counts under `status` by code; other handshake
//! failures under `connect`; a send or receive failure under `io` (the socket is dropped and a
//! new one opened); a turn ending in `response.failed` / `error` under `stream_failed` (the
//! socket is kept); a socket closed mid-turn under `truncated`; an idle socket closed by the
//! peer under `closed`.

use std::{sync::atomic::Ordering::Relaxed, time::Duration};

use anyhow::Context as _;
use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use http::Uri;
use tokio::{net::TcpStream, time::Instant};
use tokio_tungstenite::{
    tungstenite::{
        self, client::IntoClientRequest as _, handshake::client::Request,
        protocol::WebSocketConfig, Message,
    },
    WebSocketStream,
};

use super::{take_budget, Inflight, Outcome, Shared, Stats, Terminal};

/// What each WebSocket session does.
#[derive(Debug, Clone, Default)]
pub struct WsConfig {
    /// Turns per socket; 0: turns until the deadline (or the `requests` budget) on one socket,
    /// or, with `idle`, no turn at all (the socket is opened and held).
    pub turns: u64,
    /// Each turn after the first names the previous turn's `response.id` as
    /// `previous_response_id` (dropped after a failed turn).
    pub chain: bool,
    /// Pause between two turns of a socket.
    pub think_time: Duration,
    /// After its turns, a session holds its socket open and silent until the deadline (no
    /// reconnect); for memory per idle session.
    pub idle: bool,
}

/// The handshake URI and the turn frame.
#[derive(Debug)]
pub(super) struct WsTarget {
    uri: Uri,
    /// The `response.create` frame (the body with `"type":"response.create"`).
    create: serde_json::Map<String, serde_json::Value>,
    /// `create` rendered, for turns without `previous_response_id`.
    create_text: String,
}

type Socket = WebSocketStream<TcpStream>;

// === impl WsTarget ===

impl WsTarget {
    /// `uri` is `ws://` or `http://` (the same socket either way); `body` a JSON object, the
    /// `response.create` frame (`type` is added when missing).
    pub(super) fn new(uri: &Uri, body: &Bytes) -> anyhow::Result<Self> {
        let authority = uri.authority().context("URL without host")?;
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let uri: Uri = format!("ws://{authority}{path}").parse()?;
        let v: serde_json::Value =
            serde_json::from_slice(body).context("the WebSocket turn body must be JSON")?;
        let serde_json::Value::Object(mut create) = v else {
            anyhow::bail!("the WebSocket turn body must be a JSON object");
        };
        create
            .entry("type")
            .or_insert_with(|| serde_json::Value::String("response.create".to_owned()));
        let create_text = serde_json::Value::Object(create.clone()).to_string();
        Ok(Self {
            uri,
            create,
            create_text,
        })
    }

    fn frame(&self, previous: Option<&str>) -> String {
        match previous {
            None => self.create_text.clone(),
            Some(id) => {
                let mut m = self.create.clone();
                m.insert(
                    "previous_response_id".to_owned(),
                    serde_json::Value::String(id.to_owned()),
                );
                serde_json::Value::Object(m).to_string()
            }
        }
    }

    fn request(&self, s: &Shared) -> Result<Request, tungstenite::Error> {
        let mut req = (&self.uri).into_client_request()?;
        let h = req.headers_mut();
        for (k, v) in &s.headers {
            h.insert(k.clone(), v.clone());
        }
        Ok(req)
    }
}

/// Counts a socket as open while it lives.
struct OpenSocket<'a>(&'a Stats);

impl<'a> OpenSocket<'a> {
    fn new(stats: &'a Stats) -> Self {
        let now_open = stats.open.fetch_add(1, Relaxed) + 1;
        stats.open_peak.fetch_max(now_open, Relaxed);
        Self(stats)
    }
}

impl Drop for OpenSocket<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
    }
}

/// Opens one socket: TCP connect and handshake, within the idle timeout.
async fn connect(s: &Shared, target: &WsTarget) -> Option<Socket> {
    let st = &s.stats;
    let t0 = Instant::now();
    let req = match target.request(s) {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(error = %e, "bad handshake request");
            st.connect.fetch_add(1, Relaxed);
            return None;
        }
    };
    let handshake = async {
        let tcp = super::tcp_connect(s)
            .await
            .map_err(tungstenite::Error::Io)?;
        let _ = tcp.set_nodelay(true);
        // Small buffers: thousands of idle sockets should not weigh on the load generator.
        let config = WebSocketConfig::default()
            .read_buffer_size(4096)
            .write_buffer_size(0);
        tokio_tungstenite::client_async_with_config(req, tcp, Some(config)).await
    };
    match tokio::time::timeout(s.cfg.idle_timeout, handshake).await {
        Ok(Ok((ws, _resp))) => {
            st.connect_time.record_duration(t0.elapsed());
            st.sessions.fetch_add(1, Relaxed);
            Some(ws)
        }
        Ok(Err(tungstenite::Error::Http(resp))) => {
            if let Ok(mut m) = st.status.lock() {
                *m.entry(resp.status().as_u16()).or_default() += 1;
            }
            None
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "WebSocket handshake failed");
            st.connect.fetch_add(1, Relaxed);
            None
        }
        Err(_) => {
            st.timeout.fetch_add(1, Relaxed);
            None
        }
    }
}

/// One virtual user: sessions back to back (or one session held idle).
pub(super) async fn user(s: &Shared, w: &WsConfig) {
    let Some(target) = &s.ws else { return };
    // 0 turns: until the deadline, or none at all for an idle session.
    let limit = match (w.turns, w.idle) {
        (0, false) => u64::MAX,
        (n, _) => n,
    };
    // The first turn's budget is taken before connecting: a failed connect uses it up, as
    // in HTTP mode (so a `requests` run against a dead target ends).
    while !s.stop.load(Relaxed) && (limit == 0 || take_budget(s)) {
        let Some(mut ws) = connect(s, target).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let open = OpenSocket::new(&s.stats);
        let mut previous: Option<String> = None;
        let mut alive = true;
        let mut exhausted = false;
        for done in 0..limit {
            if done > 0 {
                if s.stop.load(Relaxed) {
                    break;
                }
                if !take_budget(s) {
                    exhausted = true;
                    break;
                }
                if !w.think_time.is_zero() {
                    tokio::time::sleep(w.think_time).await;
                }
            }
            let mut guard = Inflight::new(&s.stats);
            let (outcome, id) = turn(s, target, &mut ws, previous.as_deref(), w.chain).await;
            guard.finish(matches!(outcome, Outcome::Ok));
            previous = id;
            if matches!(outcome, Outcome::Broken) {
                alive = false;
                break;
            }
        }
        if w.idle {
            if alive {
                hold(s, &mut ws).await;
            }
            drop(open);
            return;
        }
        if alive {
            close(s, &mut ws).await;
        }
        drop(open);
        if exhausted {
            return;
        }
    }
}

/// Keeps an idle socket open until the deadline cuts the user, answering pings; a peer that
/// closes it counts under `closed`.
async fn hold(s: &Shared, ws: &mut Socket) {
    loop {
        match ws.next().await {
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                s.stats.closed.fetch_add(1, Relaxed);
                return;
            }
            Some(Ok(_)) => {}
        }
    }
}

/// Sends a close frame and waits (briefly) for the peer's.
async fn close(s: &Shared, ws: &mut Socket) {
    let done = async {
        if ws.close(None).await.is_err() {
            return;
        }
        while let Some(Ok(_)) = ws.next().await {}
    };
    let _ = tokio::time::timeout(s.cfg.idle_timeout.min(Duration::from_secs(2)), done).await;
}

/// One turn: `response.create`, then frames until the terminal event. Returns the outcome and,
/// with `chain` and a completed turn, the response id for the next turn.
async fn turn(
    s: &Shared,
    target: &WsTarget,
    ws: &mut Socket,
    previous: Option<&str>,
    chain: bool,
) -> (Outcome, Option<String>) {
    let st = &s.stats;
    let idle = s.cfg.idle_timeout;
    let frame = target.frame(previous);
    let t0 = Instant::now();
    match tokio::time::timeout(idle, ws.send(Message::text(frame))).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "send failed");
            st.io.fetch_add(1, Relaxed);
            return (Outcome::Broken, None);
        }
        Err(_) => {
            st.timeout.fetch_add(1, Relaxed);
            return (Outcome::Broken, None);
        }
    }
    let mut first = true;
    let mut last_event: Option<Instant> = None;
    loop {
        let msg = match tokio::time::timeout(idle, ws.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(None) | Ok(Some(Err(tungstenite::Error::ConnectionClosed))) => {
                st.truncated.fetch_add(1, Relaxed);
                st.latency.record_duration(t0.elapsed());
                return (Outcome::Broken, None);
            }
            Ok(Some(Err(e))) => {
                tracing::debug!(error = %e, "receive failed");
                st.io.fetch_add(1, Relaxed);
                return (Outcome::Broken, None);
            }
            Err(_) => {
                st.timeout.fetch_add(1, Relaxed);
                return (Outcome::Broken, None);
            }
        };
        let data: &[u8] = match &msg {
            Message::Text(t) => t.as_bytes(),
            Message::Binary(b) => b,
            Message::Close(_) => {
                st.truncated.fetch_add(1, Relaxed);
                st.latency.record_duration(t0.elapsed());
                return (Outcome::Broken, None);
            }
            _ => continue, // ping / pong (tungstenite queues the pong)
        };
        let now = Instant::now();
        if first {
            first = false;
            st.ttfb.record_duration(now - t0);
        }
        if let Some(prev) = last_event {
            st.gap.record_duration(now - prev);
        }
        last_event = Some(now);
        st.bytes.fetch_add(data.len() as u64, Relaxed);
        st.events.fetch_add(1, Relaxed);
        match classify(data) {
            Terminal::No => {}
            Terminal::Ok => {
                st.latency.record_duration(now - t0);
                let id = if chain { response_id(data) } else { None };
                return (Outcome::Ok, id);
            }
            Terminal::Failed => {
                st.latency.record_duration(now - t0);
                st.stream_failed.fetch_add(1, Relaxed);
                return (Outcome::Failed, None);
            }
        }
    }
}

/// What an event frame means for its turn, from its `type`: read from the frame's head when
/// the frame starts with `{"type"` (every event the Codex backend, mock-codex and the gateway
/// send), else from a full parse.
pub fn classify(frame: &[u8]) -> Terminal {
    let ty = match leading_type(frame) {
        Some(t) => std::borrow::Cow::Borrowed(t),
        None => match serde_json::from_slice::<serde_json::Value>(frame) {
            Ok(v) => match v.get("type").and_then(serde_json::Value::as_str) {
                Some(t) => std::borrow::Cow::Owned(t.as_bytes().to_vec()),
                None => return Terminal::No,
            },
            Err(_) => return Terminal::No,
        },
    };
    match &*ty {
        b"response.completed" | b"response.incomplete" | b"response.done" => Terminal::Ok,
        b"response.failed" | b"error" => Terminal::Failed,
        _ => Terminal::No,
    }
}

/// The value of a leading `"type"` key: `{ "type" : "VALUE"`.
fn leading_type(frame: &[u8]) -> Option<&[u8]> {
    let skip = |b: &[u8]| -> usize { b.iter().take_while(|c| c.is_ascii_whitespace()).count() };
    let mut i = skip(frame);
    let rest = frame.get(i..)?.strip_prefix(b"{")?;
    i = skip(rest);
    let rest = rest.get(i..)?.strip_prefix(b"\"type\"")?;
    i = skip(rest);
    let rest = rest.get(i..)?.strip_prefix(b":")?;
    i = skip(rest);
    let rest = rest.get(i..)?.strip_prefix(b"\"")?;
    let end = rest.iter().position(|&c| c == b'"' || c == b'\\')?;
    (rest[end] == b'"').then(|| &rest[..end])
}

/// `response.id` of a terminal event.
fn response_id(frame: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(frame).ok()?;
    v.get("response")?.get("id")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_frames() {
        assert_eq!(
            classify(br#"{"type":"response.completed","response":{}}"#),
            Terminal::Ok
        );
        assert_eq!(
            classify(br#" { "type" : "response.incomplete" }"#),
            Terminal::Ok
        );
        assert_eq!(
            classify(br#"{"type":"response.output_text.delta","delta":"x"}"#),
            Terminal::No
        );
        assert_eq!(
            classify(br#"{"type":"error","status":400,"error":{"type":"invalid_request_error"}}"#),
            Terminal::Failed
        );
        // `type` not first: a full parse finds the top-level one.
        assert_eq!(
            classify(br#"{"error":{"type":"invalid_request_error"},"type":"error"}"#),
            Terminal::Failed
        );
        assert_eq!(
            classify(br#"{"sequence_number":3,"type":"response.failed"}"#),
            Terminal::Failed
        );
        assert_eq!(classify(b"not json"), Terminal::No);
        assert_eq!(
            response_id(br#"{"type":"response.completed","response":{"id":"resp_1"}}"#),
            Some("resp_1".to_owned())
        );
    }

    #[test]
    fn frame_adds_type_and_previous_response_id() {
        let uri: Uri = "http://127.0.0.1:1/v1/responses"
            .parse()
            .unwrap_or_default();
        let t = WsTarget::new(&uri, &Bytes::from_static(br#"{"model":"m","input":[]}"#))
            .expect("target");
        assert_eq!(t.uri.to_string(), "ws://127.0.0.1:1/v1/responses");
        let v: serde_json::Value = serde_json::from_str(&t.frame(None)).unwrap_or_default();
        assert_eq!(v["type"], "response.create");
        assert!(v.get("previous_response_id").is_none());
        let v: serde_json::Value =
            serde_json::from_str(&t.frame(Some("resp_9"))).unwrap_or_default();
        assert_eq!(v["previous_response_id"], "resp_9");
        assert_eq!(v["model"], "m");
    }
}
