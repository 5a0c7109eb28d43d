//! Interop with an independent implementation: `tungstenite` (no deflate) as the peer over an
//! in-memory duplex, in both roles, through the handshake and messages both ways.

use std::{
    cell::RefCell,
    collections::VecDeque,
    io::{self, Read, Write},
    rc::Rc,
};

use tungstenite::{handshake::HandshakeError as TError, Message as TMessage};

use crate::ws::{
    accept, client_request, client_verify, response_head, Decoder, Encoder, Limits, Message, Role,
};

/// tungstenite's end of the duplex: reads what we wrote (would block when empty) and writes
/// where we read.
struct Pipe {
    incoming: Inbox,
    outgoing: Outbox,
}

/// Bytes on their way to tungstenite.
type Inbox = Rc<RefCell<VecDeque<u8>>>;
/// Bytes tungstenite wrote.
type Outbox = Rc<RefCell<Vec<u8>>>;

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut q = self.incoming.borrow_mut();
        if q.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        // Short reads on purpose: at most 1000 bytes at a time.
        let n = buf.len().min(q.len()).min(1000);
        for (slot, b) in buf.iter_mut().zip(q.drain(..n)) {
            *slot = b;
        }
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.outgoing.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn pipe() -> (Pipe, Inbox, Outbox) {
    let incoming = Rc::new(RefCell::new(VecDeque::new()));
    let outgoing = Rc::new(RefCell::new(Vec::new()));
    (
        Pipe {
            incoming: incoming.clone(),
            outgoing: outgoing.clone(),
        },
        incoming,
        outgoing,
    )
}

fn lower_headers(headers: &[httparse::Header<'_>]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8(h.value.to_vec()).unwrap(),
            )
        })
        .collect()
}

/// Reads every whole message tungstenite has for us (pings are answered by it).
fn read_all<S: Read + Write>(ws: &mut tungstenite::WebSocket<S>) -> Vec<TMessage> {
    let mut out = Vec::new();
    loop {
        match ws.read() {
            Ok(m) => out.push(m),
            Err(tungstenite::Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => return out,
            Err(e) => panic!("tungstenite: {e}"),
        }
    }
}

fn take_ours(dec: &mut Decoder, from: &Rc<RefCell<Vec<u8>>>, buf: &mut Vec<u8>) -> Vec<Message> {
    buf.append(&mut from.borrow_mut());
    let mut out = Vec::new();
    while let Some(m) = dec.decode(buf).unwrap() {
        out.push(m);
    }
    out
}

fn big_json(n: usize) -> String {
    let mut s = String::from("{\"input\":[");
    while s.len() < n {
        s.push_str("{\"type\":\"message\",\"content\":\"héllo wörld 🙂\"},");
    }
    s.push_str("{}]}");
    s
}

#[test]
fn tungstenite_client_against_our_server() {
    let (pipe, to_peer, from_peer) = pipe();
    let mid = match tungstenite::client("ws://gateway.test/v1/responses", pipe) {
        Err(TError::Interrupted(mid)) => mid,
        other => panic!("expected to wait for our answer: {:?}", other.map(|_| ())),
    };
    // Our server reads the request head.
    let request = std::mem::take(&mut *from_peer.borrow_mut());
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    assert!(req.parse(&request).unwrap().is_complete());
    assert_eq!(req.method, Some("GET"));
    let hs = accept(&lower_headers(req.headers)).unwrap();
    to_peer
        .borrow_mut()
        .extend(response_head(&hs, &[("x-test", "1")]));
    let (mut ws, response) = mid.handshake().unwrap();
    assert_eq!(response.status(), 101);

    let mut dec = Decoder::new(Role::Server, Limits::default(), hs.deflate);
    let mut enc = Encoder::new(Role::Server, hs.deflate);
    let mut buf = Vec::new();
    let json = big_json(300_000);
    ws.send(TMessage::text("hello")).unwrap();
    ws.send(TMessage::text(json.clone())).unwrap();
    ws.send(TMessage::binary(vec![1u8, 2, 3])).unwrap();
    ws.send(TMessage::Ping(b"p".to_vec().into())).unwrap();
    assert_eq!(
        take_ours(&mut dec, &from_peer, &mut buf),
        vec![
            Message::Text(b"hello".to_vec()),
            Message::Text(json.clone().into_bytes()),
            Message::Binary(vec![1, 2, 3]),
            Message::Ping(b"p".to_vec()),
        ]
    );

    let mut out = Vec::new();
    enc.text(&mut out, json.as_bytes());
    enc.binary(&mut out, &[0u8; 70_000]);
    enc.ping(&mut out, b"are you there");
    to_peer.borrow_mut().extend(out.drain(..));
    let got = read_all(&mut ws);
    assert_eq!(got.len(), 3);
    assert_eq!(got[0], TMessage::text(json));
    assert_eq!(got[1], TMessage::binary(vec![0u8; 70_000]));
    assert_eq!(got[2], TMessage::Ping(b"are you there".to_vec().into()));
    // tungstenite answers the ping by itself.
    ws.flush().unwrap();
    assert_eq!(
        take_ours(&mut dec, &from_peer, &mut buf),
        vec![Message::Pong(b"are you there".to_vec())]
    );

    // Closing handshake started by us.
    enc.close(&mut out, 1000, "bye");
    to_peer.borrow_mut().extend(out.drain(..));
    match ws.read() {
        Ok(TMessage::Close(Some(frame))) => {
            assert_eq!(u16::from(frame.code), 1000);
            assert_eq!(frame.reason.as_str(), "bye");
        }
        other => panic!("{other:?}"),
    }
    let _ = ws.flush();
    assert_eq!(
        take_ours(&mut dec, &from_peer, &mut buf),
        vec![Message::Close(Some((1000, "bye".into())))]
    );
}

#[test]
fn our_client_against_tungstenite_server() {
    let (pipe, to_peer, from_peer) = pipe();
    let (hs, request) = client_request(
        "gateway.test",
        "/backend-api/codex/responses",
        &[("authorization", "Bearer x".to_string())],
        true,
    );
    to_peer.borrow_mut().extend(request);
    // tungstenite without deflate ignores our offer.
    let mut ws = tungstenite::accept(pipe).unwrap();
    let response = std::mem::take(&mut *from_peer.borrow_mut());
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    assert!(resp.parse(&response).unwrap().is_complete());
    let deflate = client_verify(&hs, resp.code.unwrap(), &lower_headers(resp.headers)).unwrap();
    assert_eq!(deflate, None);

    let mut dec = Decoder::new(Role::Client, Limits::default(), deflate);
    let mut enc = Encoder::new(Role::Client, deflate);
    let mut buf = Vec::new();
    let json = big_json(100_000);
    let mut out = Vec::new();
    enc.text(&mut out, json.as_bytes());
    enc.text(&mut out, b"");
    enc.binary(&mut out, &[7u8; 300]);
    enc.pong(&mut out, b"unsolicited");
    to_peer.borrow_mut().extend(out.drain(..));
    let got = read_all(&mut ws);
    assert_eq!(
        got,
        vec![
            TMessage::text(json.clone()),
            TMessage::text(""),
            TMessage::binary(vec![7u8; 300]),
            TMessage::Pong(b"unsolicited".to_vec().into()),
        ]
    );

    ws.send(TMessage::text(json.clone())).unwrap();
    ws.send(TMessage::Ping(b"hb".to_vec().into())).unwrap();
    assert_eq!(
        take_ours(&mut dec, &from_peer, &mut buf),
        vec![
            Message::Text(json.into_bytes()),
            Message::Ping(b"hb".to_vec())
        ]
    );

    // Closing handshake started by the peer.
    ws.close(None).unwrap();
    let _ = ws.flush();
    assert_eq!(
        take_ours(&mut dec, &from_peer, &mut buf),
        vec![Message::Close(None)]
    );
}
