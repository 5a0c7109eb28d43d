//! Test support for every read loop: the same bytes delivered over a real socket in a chosen
//! segmentation, exactly one segment per `read` call (docs/io-traps.md#testing-io-code).
//!
//! # Key Components
//! - [`Plan`]: how a byte string is cut: whole, one byte per read, or seeded random cuts.
//! - [`SegmentedIo`]: the server side of a real loopback TCP connection whose peer writes the
//!   next segment only when the code under test asks for more bytes and the previous segment
//!   was consumed, so every read returns exactly one segment (or less, when the reader's spare
//!   room is smaller). After the last segment the peer half-closes: the reader sees EOF.
//!
//! # Usage
//! Wrap the `SegmentedIo` in the codec under test (server `Conn`, upstream h1 client) inside a
//! `#[monoio::test_all]` test, so both drivers (io_uring and legacy) run it.

use std::{
    collections::VecDeque,
    io::{Read, Write},
    net::{Shutdown, TcpListener},
};

use monoio::{
    buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut},
    io::{AsyncReadRent, AsyncWriteRent},
    net::TcpStream,
    BufResult,
};

/// Largest segment written at once (fits an empty loopback receive buffer, so the blocking
/// write of the peer never waits for the reader).
pub const MAX_SEGMENT: usize = 64 * 1024;

/// How a byte string is cut into reads.
#[derive(Debug, Clone, Copy)]
pub enum Plan {
    /// As few reads as possible (segments of [`MAX_SEGMENT`]).
    Whole,
    /// One byte per read.
    EveryByte,
    /// Random cut points from this seed, segments of 1..=max bytes.
    Random {
        /// PRNG seed.
        seed: u64,
        /// Largest segment.
        max: usize,
    },
}

// === impl Plan ===

impl Plan {
    /// The standard set: whole, random splits over `seeds` seeds (small and large segments),
    /// and one byte per read when `every_byte` (costly for megabytes).
    pub fn standard(seeds: u64, every_byte: bool) -> Vec<Plan> {
        let mut v = vec![Plan::Whole];
        if every_byte {
            v.push(Plan::EveryByte);
        }
        for seed in 1..=seeds {
            v.push(Plan::Random {
                seed,
                max: if seed % 2 == 0 { 16 } else { 8 * 1024 },
            });
        }
        v
    }

    /// Cuts `data` into segments.
    pub fn cut(self, data: &[u8]) -> VecDeque<Vec<u8>> {
        let mut out = VecDeque::new();
        let mut rng = match self {
            Plan::Random { seed, .. } => seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            _ => 1,
        };
        let mut rest = data;
        while !rest.is_empty() {
            let n = match self {
                Plan::Whole => MAX_SEGMENT,
                Plan::EveryByte => 1,
                Plan::Random { max, .. } => {
                    // xorshift64*
                    rng ^= rng >> 12;
                    rng ^= rng << 25;
                    rng ^= rng >> 27;
                    let r = rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
                    1 + (r % max.clamp(1, MAX_SEGMENT) as u64) as usize
                }
            }
            .min(rest.len());
            out.push_back(rest[..n].to_vec());
            rest = &rest[n..];
        }
        out
    }
}

/// The reading side of a loopback connection fed one segment per read.
pub struct SegmentedIo {
    io: TcpStream,
    peer: std::net::TcpStream,
    segments: VecDeque<Vec<u8>>,
    /// Bytes written by the peer and not read yet.
    in_flight: usize,
    eof_sent: bool,
    /// Segments delivered so far.
    pub reads: usize,
}

// === impl SegmentedIo ===

impl SegmentedIo {
    /// A connection that will deliver `data` cut by `plan`.
    pub fn new(data: &[u8], plan: Plan) -> Self {
        Self::from_segments(plan.cut(data))
    }

    /// A connection that will deliver exactly these segments.
    pub fn from_segments(segments: VecDeque<Vec<u8>>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let peer =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        peer.set_nodelay(true).expect("nodelay");
        let (server, _) = listener.accept().expect("accept");
        server.set_nonblocking(true).expect("nonblocking");
        Self {
            io: TcpStream::from_std(server).expect("monoio stream"),
            peer,
            segments,
            in_flight: 0,
            eof_sent: false,
            reads: 0,
        }
    }

    /// Everything the code under test wrote to the peer so far (reads until `n` bytes or a
    /// short timeout).
    pub fn written(&mut self, at_least: usize) -> Vec<u8> {
        let mut out = Vec::new();
        self.peer
            .set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .expect("timeout");
        let mut buf = [0u8; 8192];
        while out.len() < at_least {
            match self.peer.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
        out
    }

    /// Never half-closes after the last segment: a reader that wants more bytes waits (tests
    /// use this to prove a malformed input is refused without waiting).
    pub fn hold_open(mut self) -> Self {
        self.eof_sent = true;
        self
    }

    /// Segments not delivered yet.
    pub fn pending_segments(&self) -> usize {
        self.segments.len()
    }

    fn feed(&mut self) {
        if self.in_flight > 0 {
            return;
        }
        match self.segments.pop_front() {
            Some(seg) => {
                self.peer.write_all(&seg).expect("peer write");
                self.in_flight = seg.len();
                self.reads += 1;
            }
            None if !self.eof_sent => {
                let _ = self.peer.shutdown(Shutdown::Write);
                self.eof_sent = true;
            }
            None => {}
        }
    }
}

impl AsyncReadRent for SegmentedIo {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        self.feed();
        let (res, buf) = self.io.read(buf).await;
        if let Ok(n) = res {
            self.in_flight = self.in_flight.saturating_sub(n);
        }
        (res, buf)
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        self.feed();
        let (res, buf) = self.io.readv(buf).await;
        if let Ok(n) = res {
            self.in_flight = self.in_flight.saturating_sub(n);
        }
        (res, buf)
    }
}

impl AsyncWriteRent for SegmentedIo {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        self.io.write(buf).await
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        self.io.writev(buf).await
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        self.io.flush().await
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        self.io.shutdown().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_cover_the_data() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        for plan in Plan::standard(6, true) {
            let segs = plan.cut(&data);
            assert_eq!(segs.iter().flatten().copied().collect::<Vec<u8>>(), data);
            assert!(segs.iter().all(|s| !s.is_empty() && s.len() <= MAX_SEGMENT));
        }
        assert_eq!(Plan::EveryByte.cut(&data).len(), data.len());
        assert!(Plan::Random { seed: 3, max: 16 }.cut(&data).len() > 1000);
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn one_segment_per_read() {
        let mut io =
            SegmentedIo::from_segments(VecDeque::from(vec![b"ab".to_vec(), b"cde".to_vec()]));
        let (r, b) = io.read(Vec::with_capacity(64)).await;
        assert_eq!((r.unwrap(), b.as_slice()), (2, &b"ab"[..]));
        let (r, b) = io.read(Vec::with_capacity(64)).await;
        assert_eq!((r.unwrap(), b.as_slice()), (3, &b"cde"[..]));
        let (r, _) = io.read(Vec::with_capacity(64)).await;
        assert_eq!(r.unwrap(), 0, "EOF after the last segment");
    }
}
