//! An in-memory monoio stream that delivers chosen segments, one per `read` (the sans-socket
//! twin of `gateway::testing::SegmentedIo`, fast enough for millions of executions).
//!
//! # Key Components
//! - [`cut`]: deterministic cut points from a seed (1..=max bytes per segment).
//! - [`MemIo`]: each `read` returns at most the rest of the current segment (less when the
//!   reader's spare room is smaller), then EOF after the last one; writes are accepted and
//!   counted. No `unsafe`: reads go through monoio's own `AsyncReadRent for &[u8]`.

use std::collections::VecDeque;

use monoio::{
    buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut},
    io::{AsyncReadRent, AsyncWriteRent},
    BufResult,
};

/// Cuts `data` into segments of 1..=`max` bytes chosen by an xorshift PRNG seeded by `seed`
/// (`max == 0`: one segment).
pub fn cut(data: &[u8], seed: u64, max: usize) -> VecDeque<Vec<u8>> {
    let mut out = VecDeque::new();
    if max == 0 {
        if !data.is_empty() {
            out.push_back(data.to_vec());
        }
        return out;
    }
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut rest = data;
    while !rest.is_empty() {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        let r = rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        let n = (1 + (r % max as u64) as usize).min(rest.len());
        out.push_back(rest[..n].to_vec());
        rest = &rest[n..];
    }
    out
}

/// A stream that reads the given segments and swallows writes.
pub struct MemIo {
    segments: VecDeque<Vec<u8>>,
    /// Bytes of the front segment already read.
    pos: usize,
    /// Bytes written by the code under test.
    pub written: usize,
}

// === impl MemIo ===

impl MemIo {
    /// A stream that will deliver exactly these segments, then EOF.
    pub fn new(segments: VecDeque<Vec<u8>>) -> Self {
        Self {
            segments,
            pos: 0,
            written: 0,
        }
    }

    fn advance(&mut self, n: usize) {
        self.pos += n;
        if self.segments.front().is_some_and(|s| self.pos >= s.len()) {
            self.segments.pop_front();
            self.pos = 0;
        }
    }
}

impl AsyncReadRent for MemIo {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        let Some(seg) = self.segments.front() else {
            return (Ok(0), buf);
        };
        let mut rest: &[u8] = &seg[self.pos..];
        let (res, buf) = rest.read(buf).await;
        if let Ok(n) = res {
            self.advance(n);
        }
        (res, buf)
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        let Some(seg) = self.segments.front() else {
            return (Ok(0), buf);
        };
        let mut rest: &[u8] = &seg[self.pos..];
        let (res, buf) = rest.readv(buf).await;
        if let Ok(n) = res {
            self.advance(n);
        }
        (res, buf)
    }
}

impl AsyncWriteRent for MemIo {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        let n = buf.bytes_init();
        self.written += n;
        (Ok(n), buf)
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // Nothing under test writes vectored; refuse loudly rather than pretend.
        let err = std::io::Error::new(std::io::ErrorKind::Unsupported, "writev");
        (Err(err), buf)
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_covers_the_data() {
        let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        for (seed, max) in [(0, 0), (1, 1), (2, 7), (3, 300)] {
            let segs = cut(&data, seed, max);
            assert_eq!(segs.iter().flatten().copied().collect::<Vec<u8>>(), data);
            assert!(segs
                .iter()
                .all(|s| !s.is_empty() && (max == 0 || s.len() <= max)));
        }
    }
}
