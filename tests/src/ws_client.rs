//! A client's side of a WebSocket the tests hold (tokio-tungstenite).
//!
//! # Key Components
//! - [`next_json_event`]: the next JSON text event, within a bound.

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::{Error, Message};

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
