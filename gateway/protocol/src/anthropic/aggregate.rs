//! Codex Responses SSE events -> one Anthropic `message` object (non-streaming).
//!
//! # Key Components
//! - [`MessagesAggregator`]: runs the very same [`MessagesStream`] and folds the events it
//!   produces into the message, the way Anthropic's SDKs accumulate a stream, so a streamed
//!   and a non-streamed answer to the same upstream events always agree (blocks, ids,
//!   `stop_reason`, `stop_sequence`, usage, the fallback to `response.output`).
//!
//! # Error handling
//! [`MessagesAggregator::finish`] gives `None` when the upstream failed or ended without a
//! terminal event; the gateway answers with its classified error instead.

use sonic_rs::{JsonValueMutTrait, JsonValueTrait, Value};

use super::{MessagesRequest, MessagesStream, Usage};

/// Non-streaming translator for one Messages response.
#[derive(Debug)]
pub struct MessagesAggregator {
    stream: MessagesStream,
    message: Option<Value>,
    /// Accumulated `partial_json` of each tool_use block, by content index.
    partial: Vec<(usize, String)>,
    done: bool,
    buf: Vec<u8>,
}

// === impl MessagesAggregator ===

impl MessagesAggregator {
    /// An aggregator with the same knobs as [`MessagesStream::new`].
    pub fn new(stream: MessagesStream) -> Self {
        Self {
            stream,
            message: None,
            partial: Vec::new(),
            done: false,
            buf: Vec::new(),
        }
    }

    /// An aggregator for a translated request.
    pub fn for_request(req: &MessagesRequest, created: u64) -> Self {
        Self::new(MessagesStream::for_request(req, created))
    }

    /// True once a terminal event arrived.
    pub fn is_finished(&self) -> bool {
        self.stream.is_finished()
    }

    /// Token usage from the terminal event.
    pub fn usage(&self) -> Option<Usage> {
        self.stream.usage()
    }

    /// Folds one upstream event in.
    pub fn on_event(&mut self, event_type: &str, data: &[u8]) {
        self.buf.clear();
        self.stream.on_event(event_type, data, &mut self.buf);
        if self.buf.is_empty() {
            return;
        }
        let buf = std::mem::take(&mut self.buf);
        for frame in buf.split(|&b| b == b'\n') {
            if let Some(json) = frame.strip_prefix(b"data: ") {
                if let Ok(ev) = sonic_rs::from_slice::<Value>(json) {
                    self.apply(&ev);
                }
            }
        }
        self.buf = buf;
    }

    /// The `message` JSON body; `None` when the upstream failed or never finished.
    pub fn finish(mut self) -> Option<Vec<u8>> {
        if !self.done {
            return None;
        }
        let mut message = self.message.take()?;
        if let Some(content) = message.get_mut("content").and_then(|c| c.as_array_mut()) {
            for (index, json) in self.partial.drain(..) {
                if let Some(block) = content.get_mut(index) {
                    let input: Value = if json.trim().is_empty() {
                        Value::new_object()
                    } else {
                        sonic_rs::from_str(&json).unwrap_or_else(|_| Value::new_object())
                    };
                    if let Some(o) = block.as_object_mut() {
                        o.insert(&"input", input);
                    }
                }
            }
        }
        sonic_rs::to_vec(&message).ok()
    }

    fn apply(&mut self, ev: &Value) {
        let ty = ev.get("type").and_then(|t| t.as_str()).unwrap_or("");
        let index = ev
            .get("index")
            .and_then(|i| i.as_u64())
            .and_then(|i| usize::try_from(i).ok());
        match ty {
            "message_start" => self.message = ev.get("message").cloned(),
            "content_block_start" => {
                let (Some(block), Some(msg)) = (ev.get("content_block"), self.message.as_mut())
                else {
                    return;
                };
                if let Some(c) = msg.get_mut("content").and_then(|c| c.as_array_mut()) {
                    c.push(block.clone());
                }
            }
            "content_block_delta" => {
                let (Some(index), Some(delta)) = (index, ev.get("delta")) else {
                    return;
                };
                let dty = delta.get("type").and_then(|t| t.as_str()).unwrap_or("");
                if dty == "input_json_delta" {
                    let piece = delta
                        .get("partial_json")
                        .and_then(|p| p.as_str())
                        .unwrap_or("");
                    match self.partial.iter_mut().find(|(i, _)| *i == index) {
                        Some((_, s)) => s.push_str(piece),
                        None => self.partial.push((index, piece.to_owned())),
                    }
                    return;
                }
                let (field, piece) = match dty {
                    "text_delta" => ("text", delta.get("text")),
                    "thinking_delta" => ("thinking", delta.get("thinking")),
                    "signature_delta" => ("signature", delta.get("signature")),
                    _ => return,
                };
                let piece = piece.and_then(|p| p.as_str()).unwrap_or("");
                let Some(block) = self
                    .message
                    .as_mut()
                    .and_then(|m| m.get_mut("content"))
                    .and_then(|c| c.as_array_mut())
                    .and_then(|c| c.get_mut(index))
                else {
                    return;
                };
                let mut s = block
                    .get(field)
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_owned();
                s.push_str(piece);
                if let Some(o) = block.as_object_mut() {
                    o.insert(&field, s.as_str());
                }
            }
            "message_delta" => {
                let Some(msg) = self.message.as_mut().and_then(|m| m.as_object_mut()) else {
                    return;
                };
                if let Some(d) = ev.get("delta") {
                    for k in ["stop_reason", "stop_sequence"] {
                        if let Some(v) = d.get(k) {
                            msg.insert(&k, v.clone());
                        }
                    }
                }
                if let Some(u) = ev.get("usage") {
                    msg.insert(&"usage", u.clone());
                }
            }
            "message_stop" => self.done = true,
            _ => {}
        }
    }
}
