//! `ws_ext`: `Sec-WebSocket-Extensions` negotiation of `permessage-deflate`
//! (`gateway::ws::deflate`): the server's choice among a client's offers and the client's
//! check of the server's answer.
//!
//! Input: header values separated by newlines. Invariants: whatever the server accepts, its
//! response value is accepted by our client as exactly the same parameters, and negotiating
//! over that response value again chooses the same; the client's check never panics.

use gateway::ws::deflate::{negotiate_offers, parse_response};

/// The fuzz target.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let values: Vec<&str> = text.split('\n').collect();
    let _ = parse_response(&values);
    if let Some(params) = negotiate_offers(&values) {
        let answer = params.response_value();
        assert_eq!(
            parse_response(&[answer.as_str()]),
            Ok(Some(params)),
            "our client refuses our server's answer {answer:?}"
        );
        assert_eq!(
            negotiate_offers(&[answer.as_str()]),
            Some(params),
            "{answer:?}"
        );
    }
}
