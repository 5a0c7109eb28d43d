//! `sse`: the upstream SSE splitter (`codex_protocol::sse::SseSplitter`).
//!
//! Input: byte 0 picks the largest push (0 or 1: one byte at a time), byte 1 seeds the cut
//! points (see [`cut`]: one cut pattern per execution, the fuzzer explores them), byte 2 picks
//! the event size limit (255: the default, else a small one), the rest is the stream.
//! Invariants:
//! - the events (and the error that stops them) are the same whole and pushed in pieces;
//! - no event is larger than the limit;
//! - each event is byte-faithful: its frame ends with a blank line, is a piece of the stream
//!   (the pieces in order, never overlapping), and splitting the frame alone gives the same
//!   event back;
//! - `frame(event, data)` for a single-line event splits back to that event.

use codex_protocol::sse::{frame, SseError, SseEvent, SseSplitter, DEFAULT_MAX_EVENT};

use crate::memio::{self, cut};

fn events(segments: Vec<&[u8]>, max: usize) -> (Vec<SseEvent>, Option<SseError>) {
    let mut s = SseSplitter::new(max);
    let mut out = Vec::new();
    for seg in segments {
        s.push(seg);
        loop {
            match s.next_event() {
                Ok(Some(ev)) => out.push(ev),
                Ok(None) => break,
                Err(e) => return (out, Some(e)),
            }
        }
    }
    (out, None)
}

fn ends_with_blank_line(f: &[u8]) -> bool {
    f.ends_with(b"\n\n") || f.ends_with(b"\n\r\n") || f.ends_with(b"\r\r")
}

/// The fuzz target.
pub fn run(data: &[u8]) {
    let [max_seg, seed, limit, stream @ ..] = data else {
        return;
    };
    let max_event = match limit {
        255 => DEFAULT_MAX_EVENT,
        n => usize::from(*n) * 4 + 1,
    };
    let whole = events(memio::whole(stream), max_event);
    let split = events(
        cut(stream, u64::from(*seed), usize::from(*max_seg)),
        max_event,
    );
    assert_eq!(whole, split, "pushed in pieces of at most {max_seg}");
    let mut at = 0usize;
    for ev in &whole.0 {
        assert!(ev.frame.len() <= max_event, "event over the limit");
        assert!(ends_with_blank_line(&ev.frame), "frame {:?}", ev.frame);
        let off = stream[at..]
            .windows(ev.frame.len())
            .position(|w| w == ev.frame.as_ref())
            .unwrap_or_else(|| panic!("frame not in the stream after {at}"));
        at += off + ev.frame.len();
        let (again, err) = events(vec![&ev.frame[..]], max_event);
        assert_eq!((again.as_slice(), err), (std::slice::from_ref(ev), None));
    }
    // The encoder: a one-line event name and data (no CR/LF, no leading space) round-trip.
    if let Some(ev) = whole.0.first() {
        let name = ev.event_type();
        let clean = |b: &[u8]| !b.iter().any(|&c| c == b'\r' || c == b'\n');
        if clean(name.as_bytes())
            && clean(&ev.data)
            && !name.starts_with(' ')
            && !ev.data.starts_with(b" ")
        {
            let f = frame(name, &ev.data);
            let (back, err) = events(vec![&f[..]], DEFAULT_MAX_EVENT);
            assert_eq!(err, None);
            assert_eq!(back.len(), 1);
            assert_eq!(back[0].data, ev.data);
            assert_eq!(back[0].event.as_deref(), Some(name.as_bytes()));
        }
    }
}
