//! A client's side of a WebSocket the tests hold (tokio-tungstenite).
//!
//! # Key Components
//! - [`Ws`]: a client WebSocket to a gateway.
//! - [`responses_request`] / [`connect_responses`]: the upgrade of `/v1/responses` with a key.
//! - [`send_json`] / [`turn`]: a request on the socket, and the events of its turn.
//! - [`next_json_event`] / [`read_turn`]: the next JSON text event, or all of a turn's.

use std::time::Duration;

use futures_util::{SinkExt, Stream, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::{
    client::IntoClientRequest, handshake::client::Request, handshake::client::Response, Error,
    Message,
};

use crate::Stack;

/// A client WebSocket to a gateway's data plane (plain TCP).
pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The upgrade request of `ws://{data plane}/v1/responses` with `key` as its bearer (callers
/// add their own headers before connecting).
pub fn responses_request(s: &Stack, key: &str) -> Request {
    let mut req = format!("ws://{}/v1/responses", s.app.data_addr)
        .into_client_request()
        .expect("upgrade request");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {key}").parse().expect("header value"),
    );
    req
}

/// Opens `/v1/responses` on the stack's data plane with `key` (see [`responses_request`]);
/// asserts the upgrade (101). Answers the socket and the handshake's response.
pub async fn connect_responses(s: &Stack, key: &str) -> (Ws, Response) {
    connect(responses_request(s, key)).await
}

/// Connects with `req`; asserts the upgrade (101). Answers the socket and the handshake's
/// response.
pub async fn connect(req: Request) -> (Ws, Response) {
    let (ws, resp) = tokio_tungstenite::connect_async(req)
        .await
        .expect("upgrade");
    assert_eq!(resp.status(), 101);
    (ws, resp)
}

/// The next text frame on `ws`, parsed as JSON (other frames skipped); panics when none comes
/// within 20 s, when the socket ends or fails, or when the text is not JSON.
pub async fn next_json_event<S>(ws: &mut S) -> Value
where
    S: Stream<Item = Result<Message, Error>> + Unpin,
{
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("an event in time")
            .expect("socket open")
            .expect("frame");
        if let Message::Text(t) = msg {
            return serde_json::from_str(&t).expect("JSON event");
        }
    }
}

/// Whether `event` ends a turn: `response.completed`, `response.failed`,
/// `response.incomplete` or an `error` event.
pub fn ends_turn(event: &Value) -> bool {
    matches!(
        event["type"].as_str(),
        Some("response.completed" | "response.failed" | "response.incomplete" | "error")
    )
}

/// The events of one turn on `ws`, up to and with the one that ends it ([`ends_turn`]); each
/// read as [`next_json_event`] reads it.
pub async fn read_turn<S>(ws: &mut S) -> Vec<Value>
where
    S: Stream<Item = Result<Message, Error>> + Unpin,
{
    let mut out = Vec::new();
    loop {
        let v = next_json_event(ws).await;
        let done = ends_turn(&v);
        out.push(v);
        if done {
            return out;
        }
    }
}

/// Sends `v` as one text frame.
pub async fn send_json(ws: &mut Ws, v: &Value) {
    ws.send(Message::text(v.to_string()))
        .await
        .expect("send a text frame");
}

/// Sends `request` and reads its turn ([`read_turn`]).
pub async fn turn(ws: &mut Ws, request: &Value) -> Vec<Value> {
    send_json(ws, request).await;
    read_turn(ws).await
}
