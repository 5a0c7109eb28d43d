//! An in-memory monoio stream that delivers chosen segments, one per `read` (the sans-socket
//! twin of `gateway::testing::SegmentedIo`, fast enough for millions of executions).
//!
//! # Key Components
//! - [`cut`]: deterministic cut points from a seed (1..=max bytes per segment, at most
//!   [`MAX_SEGMENTS`] of them, the rest in one last segment). The segments borrow the input:
//!   no copy, no allocation per segment.
//! - [`MemIo`]: each `read` returns at most the rest of the current segment (less when the
//!   reader's spare room is smaller), then EOF after the last one; writes are accepted and
//!   counted. No `unsafe`: reads go through monoio's own `AsyncReadRent for &[u8]`.

use std::collections::VecDeque;

use monoio::{
    buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut},
    io::{AsyncReadRent, AsyncWriteRent},
    BufResult,
};

/// Segments of 1..=`max` bytes cut by [`cut`] at most; what is left after them arrives in
/// [`TAIL_SEGMENT`]-byte pieces.
///
/// The cap bounds the cost of one execution: a reader that re-scans its buffer after every
/// read (the HTTP/1.1 head, a chunk-size line) costs O(reads x buffer), so one byte per read
/// over a 16 KiB input was the slowest thing the `h1` target did. With the cap, "one byte per
/// read" covers the first 256 bytes (a short head); larger `max` values spread the same
/// number of cuts over more of the input (up to 32 KiB), and the fuzzer explores the seeds and
/// sizes.
pub const MAX_SEGMENTS: usize = 256;

/// The size of the pieces after the first [`MAX_SEGMENTS`]: small enough that a limit
/// crossed late in a large input is still crossed between reads (a 70 KB head, read in
/// pieces, passes the 64 KiB head limit while still incomplete: the `h1` regression inputs
/// depend on it), large enough to cost a few reads per execution.
pub const TAIL_SEGMENT: usize = 1024;

/// Cuts `data` into segments of 1..=`max` bytes (`max` 0 counts as 1: one byte per read)
/// chosen by an xorshift PRNG seeded by `seed`; after [`MAX_SEGMENTS`] of them the rest comes
/// in [`TAIL_SEGMENT`]-byte pieces. Empty data: no segment.
pub fn cut(data: &[u8], seed: u64, max: usize) -> Vec<&[u8]> {
    let max = max.max(1) as u64;
    let mut out = Vec::new();
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut rest = data;
    while !rest.is_empty() {
        let n = if out.len() < MAX_SEGMENTS {
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            let r = rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
            (1 + (r % max) as usize).min(rest.len())
        } else {
            TAIL_SEGMENT.min(rest.len())
        };
        let (seg, tail) = rest.split_at(n);
        out.push(seg);
        rest = tail;
    }
    out
}

/// `data` as one segment (none when empty): the reference reading.
pub fn whole(data: &[u8]) -> Vec<&[u8]> {
    if data.is_empty() {
        Vec::new()
    } else {
        vec![data]
    }
}

/// A stream that reads the given segments and swallows writes.
pub struct MemIo<'a> {
    segments: VecDeque<&'a [u8]>,
    /// Bytes written by the code under test.
    pub written: usize,
}

// === impl MemIo ===

impl<'a> MemIo<'a> {
    /// A stream that will deliver exactly these segments, then EOF.
    pub fn new(segments: Vec<&'a [u8]>) -> Self {
        Self {
            segments: segments.into(),
            written: 0,
        }
    }

    fn advance(&mut self, n: usize) {
        if let Some(seg) = self.segments.front_mut() {
            *seg = &seg[n.min(seg.len())..];
            if seg.is_empty() {
                self.segments.pop_front();
            }
        }
    }
}

impl AsyncReadRent for MemIo<'_> {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        let Some(mut rest) = self.segments.front().copied() else {
            return (Ok(0), buf);
        };
        let (res, buf) = rest.read(buf).await;
        if let Ok(n) = res {
            self.advance(n);
        }
        (res, buf)
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        let Some(mut rest) = self.segments.front().copied() else {
            return (Ok(0), buf);
        };
        let (res, buf) = rest.readv(buf).await;
        if let Ok(n) = res {
            self.advance(n);
        }
        (res, buf)
    }
}

impl AsyncWriteRent for MemIo<'_> {
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
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        for (seed, max) in [(0, 0), (1, 1), (2, 7), (3, 300)] {
            let segs = cut(&data, seed, max);
            assert_eq!(segs.concat(), data);
            // The first MAX_SEGMENTS are 1..=max bytes, the rest TAIL_SEGMENT (the last less).
            let (head, tail) = segs.split_at(segs.len().min(MAX_SEGMENTS));
            assert!(head.iter().all(|s| !s.is_empty() && s.len() <= max.max(1)));
            assert!(tail
                .iter()
                .all(|s| !s.is_empty() && s.len() <= TAIL_SEGMENT));
            if let [body @ .., _] = tail {
                assert!(body.iter().all(|s| s.len() == TAIL_SEGMENT));
            }
        }
        // One byte per read: the first MAX_SEGMENTS bytes, then 1 KiB pieces.
        let bytes = cut(&data, 0, 1);
        assert_eq!(
            bytes.len(),
            MAX_SEGMENTS + (5000 - MAX_SEGMENTS).div_ceil(TAIL_SEGMENT)
        );
        assert!(cut(&[], 5, 5).is_empty());
        assert_eq!(whole(&data), vec![&data[..]]);
    }
}
