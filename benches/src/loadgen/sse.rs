//! Incremental SSE event counting without buffering events.
//!
//! # Key Components
//! - [`EventScanner`]: fed body chunks as they arrive, it finds event boundaries (a blank
//!   line, `\n\n` or `\r\n\r\n`, also across chunks), keeps only the first 64 bytes of each
//!   event to classify it, and reports every complete event to a callback.
//! - [`Terminal`]: what an event means for the end of the stream: a successful end
//!   (`response.completed` / `response.incomplete` / `response.done` / `data: [DONE]`) or a
//!   failure (`response.failed`, `error`, a Chat `data: {"error":...}` frame).

/// Bytes of an event's first line kept for classification.
const HEAD: usize = 64;

/// What one event says about the end of its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terminal {
    /// Not a terminal event.
    No,
    /// The stream ended well.
    Ok,
    /// The stream ended with a failure event.
    Failed,
}

/// Streaming event counter for one response body.
#[derive(Debug)]
pub struct EventScanner {
    head: [u8; HEAD],
    head_len: usize,
    /// Bytes of the current line (without `\r`).
    line_len: usize,
    /// Lines in the current event so far.
    lines: usize,
}

impl Default for EventScanner {
    fn default() -> Self {
        Self {
            head: [0; HEAD],
            head_len: 0,
            line_len: 0,
            lines: 0,
        }
    }
}

// === impl EventScanner ===

impl EventScanner {
    /// Scans `chunk`, calling `on_event` once per complete (non-comment) event.
    pub fn feed(&mut self, chunk: &[u8], mut on_event: impl FnMut(Terminal)) {
        let mut rest = chunk;
        while !rest.is_empty() {
            match rest.iter().position(|&b| b == b'\n') {
                Some(p) => {
                    self.piece(&rest[..p]);
                    self.end_line(&mut on_event);
                    rest = &rest[p + 1..];
                }
                None => {
                    self.piece(rest);
                    break;
                }
            }
        }
    }

    fn piece(&mut self, bytes: &[u8]) {
        // `\r` only ever precedes `\n` in SSE from our upstreams; it does not make a line
        // non-empty.
        let content = bytes.iter().filter(|&&b| b != b'\r').count();
        if self.lines == 0 && self.head_len < HEAD {
            for &b in bytes {
                if b != b'\r' && self.head_len < HEAD {
                    self.head[self.head_len] = b;
                    self.head_len += 1;
                }
            }
        }
        self.line_len += content;
    }

    fn end_line(&mut self, on_event: &mut impl FnMut(Terminal)) {
        if self.line_len > 0 {
            self.lines += 1;
            self.line_len = 0;
            return;
        }
        // A blank line ends the event, if there is one.
        if self.lines > 0 {
            let head = &self.head[..self.head_len];
            if head.first() != Some(&b':') {
                on_event(classify(head));
            }
        }
        self.lines = 0;
        self.head_len = 0;
    }
}

fn field<'a>(line: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let rest = line.strip_prefix(name)?.strip_prefix(b":")?;
    Some(rest.strip_prefix(b" ").unwrap_or(rest))
}

fn by_type(ty: &[u8]) -> Terminal {
    match ty {
        b"response.completed" | b"response.incomplete" | b"response.done" => Terminal::Ok,
        b"response.failed" | b"error" => Terminal::Failed,
        _ => Terminal::No,
    }
}

/// Classifies an event by the first line kept in `head`.
pub fn classify(head: &[u8]) -> Terminal {
    if let Some(name) = field(head, b"event") {
        return by_type(name);
    }
    let Some(data) = field(head, b"data") else {
        return Terminal::No;
    };
    if data == b"[DONE]" {
        return Terminal::Ok;
    }
    if data.starts_with(b"{\"error\"") {
        return Terminal::Failed;
    }
    if let Some(rest) = data.strip_prefix(b"{\"type\":\"") {
        if let Some(end) = rest.iter().position(|&b| b == b'"') {
            return by_type(&rest[..end]);
        }
    }
    Terminal::No
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(chunks: &[&[u8]]) -> Vec<Terminal> {
        let mut s = EventScanner::default();
        let mut out = Vec::new();
        for c in chunks {
            s.feed(c, |t| out.push(t));
        }
        out
    }

    #[test]
    fn counts_events_across_chunk_boundaries() {
        let body = b"event: response.created\ndata: {}\n\n: keepalive\n\nevent: response.output_text.delta\r\ndata: {\"a\":1}\r\n\r\nevent: response.completed\ndata: {}\n\n";
        let whole = scan(&[body]);
        assert_eq!(whole, [Terminal::No, Terminal::No, Terminal::Ok]);
        for cut in 0..body.len() {
            let (a, b) = body.split_at(cut);
            assert_eq!(scan(&[a, b]), whole, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(scan(&bytes), whole);
    }

    #[test]
    fn classifies_terminals() {
        assert_eq!(classify(b"event: response.failed"), Terminal::Failed);
        assert_eq!(classify(b"event:error"), Terminal::Failed);
        assert_eq!(classify(b"data: [DONE]"), Terminal::Ok);
        assert_eq!(
            classify(b"data: {\"error\":{\"message\":\"x\"}}"),
            Terminal::Failed
        );
        assert_eq!(
            classify(b"data: {\"type\":\"response.incomplete\",\"sequence"),
            Terminal::Ok
        );
        assert_eq!(classify(b"data: {\"id\":\"chatcmpl\"}"), Terminal::No);
    }
}
