//! Raw-socket clients for the front-door tests: HTTP/1.1 requests and WebSocket frames
//! written and read by hand over blocking sockets, so a test controls every byte and can stop
//! reading (the hostile clients of `tests/tests/hardening_*.rs`).

// Test helpers fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

use crate::Stack;

/// A connection to the data plane (20 s read timeout).
pub fn connect(s: &Stack) -> TcpStream {
    let c = TcpStream::connect(s.app.data_addr).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    c.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    c
}

/// Status, lower-cased head and body (by content-length) of one response.
pub fn read_response(c: &mut TcpStream) -> (u16, String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 65536];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        let n = c.read(&mut tmp).expect("read head");
        assert!(n > 0, "closed before a response head");
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status: u16 = head[9..12].parse().expect("status");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |v| v.trim().parse().expect("length"));
    buf.drain(..head_end);
    while buf.len() < len {
        let n = c.read(&mut tmp).expect("read body");
        assert!(n > 0, "closed inside a body");
        buf.extend_from_slice(&tmp[..n]);
    }
    buf.truncate(len);
    (status, head, buf)
}

/// True when the server closes (EOF or reset) within the read timeout; bytes are skipped.
pub fn closed(c: &mut TcpStream) -> bool {
    let mut tmp = [0u8; 4096];
    loop {
        match c.read(&mut tmp) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

/// A client WebSocket opened by hand over a blocking socket whose receive buffer is
/// `rcvbuf` bytes (set before connecting, so the window agrees): the 101 is read, nothing
/// after it. Returns the status line when the upgrade was refused, with the rest of the answer.
pub fn ws_connect(s: &Stack, rcvbuf: Option<usize>) -> Result<TcpStream, (u16, String, Vec<u8>)> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    if let Some(n) = rcvbuf {
        sock.set_recv_buffer_size(n).unwrap();
    }
    sock.connect(&s.app.data_addr.into()).unwrap();
    let mut c: TcpStream = sock.into();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!(
        "GET /v1/responses HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {}\r\nupgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        s.key
    );
    c.write_all(head.as_bytes()).unwrap();
    // Byte by byte up to the blank line: nothing after the 101 is consumed.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(c.read(&mut b).unwrap(), 1, "closed in the handshake answer");
        head.push(b[0]);
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let status: u16 = text[9..12].parse().unwrap();
    if status == 101 {
        return Ok(c);
    }
    let len: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; len];
    c.read_exact(&mut body).unwrap();
    Err((status, text, body))
}

/// Sends one masked text frame.
pub fn ws_send_text(c: &mut TcpStream, payload: &[u8]) {
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut f = vec![0x81u8];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n <= 0xffff => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    c.write_all(&f).unwrap();
}

/// Reads one server frame (unmasked, uncompressed: no extension was offered): opcode and
/// payload.
pub fn ws_read_frame(c: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut read = |n: usize| -> std::io::Result<Vec<u8>> {
        let mut out = vec![0u8; n];
        let mut got = 0;
        while got < n {
            let k = c.read(&mut out[got..])?;
            if k == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            got += k;
        }
        Ok(out)
    };
    let h = read(2)?;
    assert_eq!(h[0] & 0x70, 0, "no extension was negotiated");
    let len = match h[1] & 0x7f {
        126 => u16::from_be_bytes(read(2)?.try_into().unwrap()) as usize,
        127 => u64::from_be_bytes(read(8)?.try_into().unwrap()) as usize,
        n => n as usize,
    };
    Ok((h[0] & 0x0f, read(len)?))
}
