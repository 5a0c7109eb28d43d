//! Server-sent events: incremental splitting of upstream bytes into events, byte-faithfully.
//!
//! # Key Components
//! - [`SseSplitter`]: feed it bytes as they arrive ([`SseSplitter::push`]); take complete
//!   events with [`SseSplitter::next_event`]. Each [`SseEvent`] keeps the exact frame bytes
//!   (for forwarding) and zero-copy slices of its `event:` name and `data:` payload.
//! - [`frame`]: encodes one `event: X\ndata: Y\n\n` frame.
//!
//! # Error handling
//! An event larger than the configured limit is an [`SseError::EventTooLarge`]; the caller
//! treats it as an upstream protocol failure.

use bytes::{Bytes, BytesMut};

/// Default maximum size of one SSE event (upstream `response.completed` can be large).
pub const DEFAULT_MAX_EVENT: usize = 32 * 1024 * 1024;

/// One complete SSE event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The frame exactly as received, including its terminating blank line.
    pub frame: Bytes,
    /// The `event:` field, if any.
    pub event: Option<Bytes>,
    /// The `data:` payload (multi-line data joined with `\n`).
    pub data: Bytes,
    /// Where [`SseEvent::event_type`] reads the name, decided once when the event was split
    /// (every event's name is read several times: the lifecycle, the pipeline, encoders).
    name: Name,
}

/// Where an event's name comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Name {
    /// One of the names the gateway knows ([`crate::events::known_type`]): read for free.
    Known(&'static str),
    /// The `event:` field, another name.
    Field,
    /// No usable `event:` field: the JSON `type` of the data, else "message".
    Data,
}

// === impl SseEvent ===

impl SseEvent {
    /// The event name: the `event:` field, else the JSON `type` of the data, else "message".
    pub fn event_type(&self) -> &str {
        match self.name {
            Name::Known(name) => name,
            Name::Field | Name::Data => self.event_type_read(),
        }
    }

    /// [`SseEvent::event_type`] read from the event itself.
    fn event_type_read(&self) -> &str {
        if let Some(e) = &self.event {
            if let Ok(s) = std::str::from_utf8(e) {
                return s;
            }
        }
        crate::events::event_type(&self.data).unwrap_or("message")
    }

    /// Where the name of an event with these fields is read.
    fn name_of(event: Option<&[u8]>, data: &[u8]) -> Name {
        if let Some(e) = event {
            if let Some(known) = crate::events::known_type(e) {
                return Name::Known(known);
            }
            if std::str::from_utf8(e).is_ok() {
                return Name::Field;
            }
        }
        match crate::events::event_type(data).and_then(|t| crate::events::known_type(t.as_bytes()))
        {
            Some(known) => Name::Known(known),
            None => Name::Data,
        }
    }

    /// True for the `data: [DONE]` sentinel some servers add.
    pub fn is_done_sentinel(&self) -> bool {
        self.data.as_ref() == b"[DONE]"
    }
}

/// Errors while splitting a stream.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SseError {
    /// One event exceeded the limit.
    #[error("upstream SSE event exceeds {0} bytes")]
    EventTooLarge(usize),
    /// An event that is not UTF-8 (SSE is UTF-8 and every payload is JSON). Refused here, once
    /// per event, so no later reader (lazy JSON field reads, the translators) ever sees
    /// invalid UTF-8 as a `&str`.
    #[error("upstream SSE event is not valid UTF-8")]
    InvalidUtf8,
}

/// Incremental SSE splitter.
#[derive(Debug)]
pub struct SseSplitter {
    buf: BytesMut,
    scanned: usize,
    max_event: usize,
    /// The line breaks (`\n`, `\r`) of the event being searched, in order, as the boundary
    /// search met them: the first [`BREAKS`] of them. The frame's lines are cut at these
    /// instead of searching the frame again (its data line is most of it).
    breaks: [u32; BREAKS],
    n_breaks: u8,
}

/// Line breaks kept per event: `event:`, `data:` and the blank line of the usual frame, with
/// room for a few more lines (the rest are searched again).
const BREAKS: usize = 6;

impl Default for SseSplitter {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_EVENT)
    }
}

// === impl SseSplitter ===

impl SseSplitter {
    /// A splitter that rejects events larger than `max_event` bytes.
    pub fn new(max_event: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            scanned: 0,
            max_event,
            breaks: [0; BREAKS],
            n_breaks: 0,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Gives the buffer's allocation back when it holds no partial event (a stream gone
    /// quiet); the next [`SseSplitter::push`] allocates what it needs.
    pub fn trim(&mut self) {
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
            self.scanned = 0;
            self.n_breaks = 0;
        }
    }

    /// Bytes buffered but not yet part of a complete event.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Returns the next complete event, `Ok(None)` when more bytes are needed.
    pub fn next_event(&mut self) -> Result<Option<SseEvent>, SseError> {
        loop {
            let Some(end) = self.find_boundary() else {
                // keep 3 bytes of overlap so a boundary split across pushes is found
                self.scanned = self.buf.len().saturating_sub(3);
                if self.buf.len() > self.max_event {
                    return Err(SseError::EventTooLarge(self.max_event));
                }
                return Ok(None);
            };
            self.scanned = 0;
            // The limit holds however the stream was cut: an event that arrives whole in one
            // push is refused like one that arrives in pieces.
            if end > self.max_event {
                return Err(SseError::EventTooLarge(self.max_event));
            }
            // Checked before the frame is taken, so the error repeats on every call (like the
            // size limit) and a caller that calls again never skips past a refused event.
            // SIMD, chosen at run time (AVX2 where the CPU has it): every byte of every event
            // passes here.
            if simdutf8::basic::from_utf8(&self.buf[..end]).is_err() {
                return Err(SseError::InvalidUtf8);
            }
            let frame = self.buf.split_to(end).freeze();
            let breaks = usize::from(self.n_breaks);
            self.n_breaks = 0;
            if let Some(ev) = parse_frame(frame, &self.breaks[..breaks]) {
                return Ok(Some(ev));
            }
            // comment-only or empty frame: keep looking
        }
    }

    /// Finds the end (exclusive) of the first event terminated by a blank line, from
    /// `scanned` on (`memchr` to the next line break, then a look at the bytes after it),
    /// noting the line breaks it meets.
    fn find_boundary(&mut self) -> Option<usize> {
        let buf = &self.buf[..];
        let mut i = self.scanned;
        if i >= buf.len() {
            return None;
        }
        while let Some(off) = memchr::memchr2(b'\n', b'\r', buf.get(i..)?) {
            i += off;
            // A search resumed over the last bytes meets their breaks again.
            let n = usize::from(self.n_breaks);
            if n < BREAKS && (n == 0 || (self.breaks[n - 1] as usize) < i) {
                if let Ok(at) = u32::try_from(i) {
                    self.breaks[n] = at;
                    self.n_breaks += 1;
                }
            }
            if buf[i] == b'\n' {
                if buf.get(i + 1) == Some(&b'\n') {
                    return Some(i + 2);
                }
                if buf.get(i + 1) == Some(&b'\r') && buf.get(i + 2) == Some(&b'\n') {
                    return Some(i + 3);
                }
            } else if buf.get(i + 1) == Some(&b'\r') {
                return Some(i + 2);
            }
            i += 1;
        }
        None
    }
}

/// Splits a frame into its fields. `breaks`: the first line breaks of the frame, in order and
/// with none left out before the last of them (past it, lines are searched).
fn parse_frame(frame: Bytes, breaks: &[u32]) -> Option<SseEvent> {
    let mut event = None;
    let mut data: Option<Bytes> = None;
    let mut joined: Option<Vec<u8>> = None;
    let mut pos = 0;
    let mut known = breaks.iter().map(|&b| b as usize);
    let bytes = frame.as_ref();
    while pos < bytes.len() {
        // The first line break at or after `pos`.
        let line_end = loop {
            match known.next() {
                Some(b) if b < pos => continue,
                Some(b) => break b,
                // Past the breaks the search kept: most often the frame's last byte.
                None => break next_break(bytes, pos),
            }
        };
        let line = &bytes[pos..line_end];
        // `data:` and `event:` lines without a search for their colon.
        let (field, value_start) = if line.starts_with(b"data:") {
            (&line[..4], Some(pos + 5))
        } else if line.starts_with(b"event:") {
            (&line[..5], Some(pos + 6))
        } else if line.is_empty() {
            (line, None)
        } else {
            match memchr::memchr(b':', line) {
                Some(0) => (&line[..0], None), // comment
                Some(c) => (&line[..c], Some(pos + c + 1)),
                None => (line, Some(line_end)),
            }
        };
        if let Some(mut vs) = value_start {
            if bytes.get(vs) == Some(&b' ') {
                vs += 1;
            }
            let value = || frame.slice(vs.min(line_end)..line_end);
            match field {
                b"event" => event = Some(value()),
                b"data" => match (&mut joined, &data) {
                    (Some(j), _) => {
                        j.push(b'\n');
                        j.extend_from_slice(&value());
                    }
                    (None, Some(first)) => {
                        let mut j = first.to_vec();
                        j.push(b'\n');
                        j.extend_from_slice(&value());
                        joined = Some(j);
                    }
                    (None, None) => data = Some(value()),
                },
                _ => {}
            }
        }
        pos = line_end;
        if bytes.get(pos) == Some(&b'\r') {
            pos += 1;
        }
        if bytes.get(pos) == Some(&b'\n') {
            pos += 1;
        }
    }
    let data = match joined {
        Some(j) => Bytes::from(j),
        None => data?,
    };
    let name = SseEvent::name_of(event.as_deref(), &data);
    Some(SseEvent {
        frame,
        event,
        data,
        name,
    })
}

/// The first line break at or after `pos`, else the end.
fn next_break(bytes: &[u8], pos: usize) -> usize {
    let rest = &bytes[pos..];
    if rest.len() <= 4 {
        // The blank line that ends the frame: no search call for a byte or two.
        rest.iter().position(|&b| b == b'\n' || b == b'\r')
    } else {
        memchr::memchr2(b'\n', b'\r', rest)
    }
    .map_or(bytes.len(), |p| pos + p)
}

/// Encodes one SSE frame with an `event:` line.
pub fn frame(event: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(event.len() + data.len() + 16);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_across_arbitrary_chunking() {
        let stream = b"event: response.created\ndata: {\"type\":\"response.created\"}\n\n: ping\n\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\r\n\r\nevent: x\ndata: a\ndata: b\n\n";
        for step in 1..stream.len() {
            let mut s = SseSplitter::default();
            let mut got = vec![];
            for chunk in stream.chunks(step) {
                s.push(chunk);
                while let Some(ev) = s.next_event().unwrap() {
                    got.push(ev);
                }
            }
            assert_eq!(got.len(), 3, "step {step}");
            assert_eq!(got[0].event_type(), "response.created");
            assert_eq!(got[1].event_type(), "response.output_text.delta");
            assert_eq!(got[2].data.as_ref(), b"a\nb");
            let total: usize = got.iter().map(|e| e.frame.len()).sum();
            assert_eq!(
                total + b": ping\n\n".len(),
                stream.len(),
                "frames are byte-faithful"
            );
        }
    }

    /// A trim between any two pushes (a stream gone quiet at any point) changes nothing of
    /// what comes out, and gives the allocation back only when no partial event is held.
    #[test]
    fn trim_at_every_boundary_keeps_partial_events() {
        let stream = b"event: a\ndata: {\"x\":1}\n\nevent: b\ndata: {\"y\":2}\r\n\r\n";
        for cut in 1..stream.len() {
            let mut s = SseSplitter::default();
            let mut got = vec![];
            for part in [&stream[..cut], &stream[cut..]] {
                s.push(part);
                while let Some(ev) = s.next_event().unwrap() {
                    got.push(ev);
                }
                let pending = s.pending();
                s.trim();
                assert_eq!(s.pending(), pending, "cut {cut}");
                if pending == 0 {
                    assert_eq!(s.buf.capacity(), 0, "cut {cut}: allocation given back");
                }
            }
            let frames: Vec<u8> = got.iter().flat_map(|e| e.frame.to_vec()).collect();
            assert_eq!(frames, stream.to_vec(), "cut {cut}");
        }
    }

    #[test]
    fn oversized_event_is_an_error() {
        let mut s = SseSplitter::new(16);
        s.push(b"data: 0123456789012345678901234567890");
        assert_eq!(s.next_event(), Err(SseError::EventTooLarge(16)));
    }

    /// Broke the split invariant of the fuzz target `sse` (tests/fuzz): an event over the limit
    /// was refused when it arrived in pieces but accepted when it arrived whole in one push.
    #[test]
    fn the_limit_does_not_depend_on_the_split() {
        let stream = b"data: 0123456789012345678901234567890\n\n";
        for step in [1, 7, stream.len()] {
            let mut s = SseSplitter::new(16);
            let mut res = Ok(None);
            for chunk in stream.chunks(step) {
                s.push(chunk);
                res = s.next_event();
                if res.is_err() {
                    break;
                }
            }
            assert_eq!(res, Err(SseError::EventTooLarge(16)), "step {step}");
        }
        // At the limit exactly: accepted.
        let mut s = SseSplitter::new(10);
        s.push(b"data: 12\n\n");
        assert!(s.next_event().unwrap().is_some());
    }

    #[test]
    fn invalid_utf8_is_refused_at_every_split_and_valid_utf8_is_not() {
        // "é" and "😀" cut at every byte boundary are fine; one stray 0xFF byte in the second
        // event is refused, after the first event was delivered, whatever the split.
        let good = "data: {\"delta\":\"caf\u{e9} \u{1f600}\"}\n\n".as_bytes();
        let mut stream = good.to_vec();
        stream.extend_from_slice(b"event: x\ndata: {\"delta\":\"\xff\"}\n\n");
        for step in 1..=stream.len() {
            let mut s = SseSplitter::default();
            let mut got = Vec::new();
            let mut err = None;
            'push: for chunk in stream.chunks(step) {
                s.push(chunk);
                loop {
                    match s.next_event() {
                        Ok(Some(ev)) => got.push(ev),
                        Ok(None) => break,
                        Err(e) => {
                            err = Some(e);
                            break 'push;
                        }
                    }
                }
            }
            assert_eq!(got.len(), 1, "step {step}");
            assert_eq!(got[0].frame.as_ref(), good, "step {step}");
            assert_eq!(err, Some(SseError::InvalidUtf8), "step {step}");
            // The refused event is not consumed: asking again gives the same error.
            assert_eq!(s.next_event(), Err(SseError::InvalidUtf8));
        }
    }

    /// The splitter before it kept the line breaks it met and the event name (its
    /// `find_boundary`, `parse_frame` and `event_type`, verbatim): the reference.
    mod reference {
        use bytes::{Bytes, BytesMut};

        /// (frame, event, data, event name)
        pub type Event = (Bytes, Option<Bytes>, Bytes, String);

        pub fn split(chunks: &[&[u8]]) -> Vec<Event> {
            let mut buf = BytesMut::new();
            let mut scanned = 0;
            let mut out = Vec::new();
            for c in chunks {
                buf.extend_from_slice(c);
                loop {
                    let Some(end) = find_boundary(&buf, scanned) else {
                        scanned = buf.len().saturating_sub(3);
                        break;
                    };
                    scanned = 0;
                    let frame = buf.split_to(end).freeze();
                    if let Some((frame, event, data)) = parse_frame(frame) {
                        let name = event_type(event.as_deref(), &data).to_owned();
                        out.push((frame, event, data, name));
                    }
                }
            }
            out
        }

        fn event_type<'a>(event: Option<&'a [u8]>, data: &'a [u8]) -> &'a str {
            if let Some(e) = event {
                if let Ok(s) = std::str::from_utf8(e) {
                    return s;
                }
            }
            crate::events::event_type(data).unwrap_or("message")
        }

        fn find_boundary(buf: &[u8], from: usize) -> Option<usize> {
            let mut i = from;
            while let Some(off) = memchr::memchr2(b'\n', b'\r', buf.get(i..)?) {
                i += off;
                if buf[i] == b'\n' {
                    if buf.get(i + 1) == Some(&b'\n') {
                        return Some(i + 2);
                    }
                    if buf.get(i + 1) == Some(&b'\r') && buf.get(i + 2) == Some(&b'\n') {
                        return Some(i + 3);
                    }
                } else if buf.get(i + 1) == Some(&b'\r') {
                    return Some(i + 2);
                }
                i += 1;
            }
            None
        }

        fn parse_frame(frame: Bytes) -> Option<(Bytes, Option<Bytes>, Bytes)> {
            let mut event = None;
            let mut data: Option<Bytes> = None;
            let mut joined: Option<Vec<u8>> = None;
            let mut pos = 0;
            let bytes = frame.as_ref();
            while pos < bytes.len() {
                let line_end =
                    memchr::memchr2(b'\n', b'\r', &bytes[pos..]).map_or(bytes.len(), |p| pos + p);
                let line = &bytes[pos..line_end];
                let (field, value_start) = match memchr::memchr(b':', line) {
                    Some(0) => (&line[..0], None), // comment
                    Some(c) => {
                        let mut v = pos + c + 1;
                        if bytes.get(v) == Some(&b' ') {
                            v += 1;
                        }
                        (&line[..c], Some(v))
                    }
                    None => (line, Some(line_end)),
                };
                if let Some(vs) = value_start {
                    let value = frame.slice(vs.min(line_end)..line_end);
                    match field {
                        b"event" => event = Some(value),
                        b"data" => match (&mut joined, &data) {
                            (Some(j), _) => {
                                j.push(b'\n');
                                j.extend_from_slice(&value);
                            }
                            (None, Some(first)) => {
                                let mut j = first.to_vec();
                                j.push(b'\n');
                                j.extend_from_slice(&value);
                                joined = Some(j);
                            }
                            (None, None) => data = Some(value),
                        },
                        _ => {}
                    }
                }
                pos = line_end;
                if bytes.get(pos) == Some(&b'\r') {
                    pos += 1;
                }
                if bytes.get(pos) == Some(&b'\n') {
                    pos += 1;
                }
            }
            let data = match joined {
                Some(j) => Bytes::from(j),
                None => data?,
            };
            Some((frame, event, data))
        }
    }

    fn split(chunks: &[&[u8]]) -> Vec<reference::Event> {
        let mut s = SseSplitter::default();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c);
            while let Some(ev) = s.next_event().unwrap() {
                let name = ev.event_type().to_owned();
                out.push((ev.frame, ev.event, ev.data, name));
            }
        }
        out
    }

    /// Pieces SSE streams are made of: fields with and without their space, every line
    /// ending, comments, other fields, JSON with and without `type`, bytes past ASCII.
    const PIECES: &[&str] = &[
        "event: ",
        "event:",
        "data: ",
        "data:",
        "data",
        "event",
        ": ping",
        ":",
        " ",
        "id: 7",
        "retry: 10",
        "\n",
        "\r",
        "\r\n",
        "\n\n",
        "\r\n\r\n",
        "response.output_text.delta",
        "response.completed",
        "custom.name",
        r#"{"type":"response.created","response":{}}"#,
        r#"{"type":"response.mystery","x":1}"#,
        r#"{"x":1,"type":"codex.rate_limits"}"#,
        r#"{"type":"a\"b"}"#,
        "[DONE]",
        "caf\u{e9} \u{1f600}",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 3000,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Frames, fields and names are the reference's, whole and pushed in pieces.
        #[test]
        fn splits_as_the_reference(
            pieces in proptest::collection::vec(proptest::sample::select(PIECES), 0..40),
            cuts in proptest::collection::vec(1usize..24, 1..8),
        ) {
            let stream: Vec<u8> = pieces.concat().into_bytes();
            let want = reference::split(&[&stream]);
            proptest::prop_assert_eq!(&split(&[&stream]), &want);
            let mut chunks = Vec::new();
            let (mut at, mut k) = (0, 0);
            while at < stream.len() {
                let n = cuts[k % cuts.len()].min(stream.len() - at);
                chunks.push(&stream[at..at + n]);
                at += n;
                k += 1;
            }
            proptest::prop_assert_eq!(&split(&chunks), &want);
            proptest::prop_assert_eq!(&reference::split(&chunks), &want);
        }
    }

    /// Frames with more lines than the splitter keeps breaks for, cut at every byte.
    #[test]
    fn long_frames_split_as_the_reference_at_every_cut() {
        let stream = b"event: x\r\nid: 1\ndata: a\rdata: b\r\ndata:c\ndata: d\n: note\ndata: e\ndata: f\nretry: 3\ndata: {\"type\":\"error\"}\n\nevent: response.done\ndata: {}\r\n\r\n";
        let want = reference::split(&[stream]);
        assert_eq!(want.len(), 2);
        assert_eq!(
            want[0].2.as_ref(),
            b"a\nb\nc\nd\ne\nf\n{\"type\":\"error\"}"
        );
        for step in 1..=stream.len() {
            let chunks: Vec<&[u8]> = stream.chunks(step).collect();
            assert_eq!(split(&chunks), want, "step {step}");
        }
        for cut in 1..stream.len() {
            assert_eq!(split(&[&stream[..cut], &stream[cut..]]), want, "cut {cut}");
        }
    }

    #[test]
    fn names_are_known_read_or_defaulted() {
        let mut s = SseSplitter::default();
        s.push(b"event: response.output_text.delta\ndata: {}\n\nevent: custom\ndata: {}\n\ndata: {\"type\":\"response.completed\"}\n\ndata: {\"type\":\"x.y\"}\n\ndata: 1\n\n");
        let names: Vec<String> = std::iter::from_fn(|| s.next_event().unwrap())
            .map(|e| {
                assert_eq!(e.event_type(), e.event_type_read());
                e.event_type().to_owned()
            })
            .collect();
        assert_eq!(
            names,
            [
                "response.output_text.delta",
                "custom",
                "response.completed",
                "x.y",
                "message"
            ]
        );
    }

    #[test]
    fn done_sentinel() {
        let mut s = SseSplitter::default();
        s.push(b"data: [DONE]\n\n");
        assert!(s.next_event().unwrap().unwrap().is_done_sentinel());
    }
}
