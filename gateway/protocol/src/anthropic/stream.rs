//! Codex Responses SSE events -> Anthropic Messages stream events.
//!
//! # Key Components
//! - [`MessagesStream`]: a small state machine fed one upstream event at a time; each call
//!   appends zero or more complete `event: <type>\ndata: {...}\n\n` frames.
//!
//! The sequence it produces is Anthropic's:
//! 1. `message_start` (empty content, zero usage) and `ping`, once, at `response.created`
//!    (or before the first block when that event is missing);
//! 2. per output item, in upstream order, one content block: `content_block_start`, its
//!    deltas (`text_delta`, `input_json_delta`, `thinking_delta` then `signature_delta`),
//!    `content_block_stop`; indexes count from 0;
//! 3. at the terminal, `message_delta` (`stop_reason`, `stop_sequence`, usage) and
//!    `message_stop`; or, when the upstream failed, nothing more: the gateway writes one
//!    `error` event ([`MessagesStream::fail`]).
//!
//! Text deltas are copied as raw JSON string tokens (no unescape / re-escape) unless stop
//! sequences are active, in which case text passes through the [`StopMatcher`].

use sonic_rs::JsonValueTrait;

use super::{
    error_frame, message_id, stop::StopMatcher, stop_reason, write_usage, MessagesRequest, Usage,
};
use crate::{
    json::{push_unescaped, write_str, write_u64},
    tools::ToolNameMap,
    turn::{self, Delta, Item, Part, ReasoningDelta, TurnEvent},
};

/// The content block being streamed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Open {
    Text {
        key: String,
    },
    Thinking {
        output_index: u64,
        part: Option<(u64, bool)>,
    },
    Tool {
        key: String,
        output_index: Option<u64>,
        args_sent: bool,
    },
}

/// Tool-call arguments that arrived before their `output_item.added`.
#[derive(Debug)]
struct PendingCall {
    key: String,
    output_index: Option<u64>,
    arguments: String,
}

/// Streaming translator for one Messages response.
#[derive(Debug)]
pub struct MessagesStream {
    model: String,
    created: u64,
    id: Option<String>,
    thinking: bool,
    names: ToolNameMap,
    stop: StopMatcher,
    started: bool,
    finished: bool,
    error_written: bool,
    /// The upstream ended in `response.failed` / `error`.
    upstream_failed: bool,
    next_index: u64,
    open: Option<(u64, Open)>,
    /// Keys of items already shown (streamed or whole).
    shown: Vec<String>,
    pending: Vec<PendingCall>,
    tool_used: bool,
    emitted_output: bool,
    usage: Option<Usage>,
}

/// The key of an item: its id, else its output index.
fn item_key(id: Option<&str>, output_index: Option<u64>) -> String {
    match id.filter(|s| !s.is_empty()) {
        Some(id) => id.to_owned(),
        None => format!("#{}", output_index.unwrap_or(u64::MAX)),
    }
}

fn frame_head(out: &mut Vec<u8>, ty: &str) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(ty.as_bytes());
    out.extend_from_slice(b"\ndata: {\"type\":\"");
    out.extend_from_slice(ty.as_bytes());
    out.push(b'"');
}

// === impl MessagesStream ===

impl MessagesStream {
    /// A translator for a client that asked for `model`; `thinking` shows reasoning as
    /// thinking blocks; `stop_sequences` cut the text; `name_map` restores tool names;
    /// `created` (unix seconds) names the message when the upstream sends no id.
    pub fn new(
        model: &str,
        created: u64,
        thinking: bool,
        stop_sequences: &[String],
        name_map: ToolNameMap,
    ) -> Self {
        Self {
            model: model.to_owned(),
            created,
            id: None,
            thinking,
            names: name_map,
            stop: StopMatcher::new(stop_sequences),
            started: false,
            finished: false,
            error_written: false,
            upstream_failed: false,
            next_index: 0,
            open: None,
            shown: Vec::new(),
            pending: Vec::new(),
            tool_used: false,
            emitted_output: false,
            usage: None,
        }
    }

    /// A translator for a translated request.
    pub fn for_request(req: &MessagesRequest, created: u64) -> Self {
        Self::new(
            &req.model,
            created,
            req.thinking,
            &req.stop_sequences,
            req.name_map.clone(),
        )
    }

    /// True once a terminal (success or failure) was seen.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Token usage from the terminal event.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Ends the stream with Anthropic's `error` event (a failure after the stream began:
    /// the gateway's classification decides `error_type` and `message`). Written once, and
    /// never after a successful `message_stop`.
    pub fn fail(&mut self, out: &mut Vec<u8>, error_type: &str, message: &str) {
        if self.error_written || (self.finished && !self.upstream_failed) {
            return;
        }
        out.extend_from_slice(&error_frame(error_type, message));
        self.error_written = true;
        self.finished = true;
    }

    /// Translates one upstream event (its SSE `event:` type, or "" to read `type` from the
    /// data, and its JSON data), appending complete frames to `out`.
    pub fn on_event(&mut self, event_type: &str, data: &[u8], out: &mut Vec<u8>) {
        if self.finished {
            return;
        }
        turn::visit(event_type, data, |event| self.apply(event, out));
    }

    /// Translates one neutral event.
    fn apply(&mut self, event: TurnEvent<'_>, out: &mut Vec<u8>) {
        match event {
            TurnEvent::Started(r) => {
                if !self.started {
                    if let Some(id) = r.id {
                        self.id = Some(id.into_owned());
                    }
                    if let Some(c) = r.created_at {
                        self.created = c;
                    }
                }
                self.start(out);
            }
            TurnEvent::Text(d) | TurnEvent::Refusal(d) => {
                if self.stop.matched().is_some() {
                    return;
                }
                let key = item_key(d.item_id, d.output_index);
                let Some(t) = d.token else { return };
                self.ensure_text(out, &key);
                self.text(out, TextPiece::Raw(t));
            }
            TurnEvent::Reasoning(r) => self.reasoning(out, &r),
            TurnEvent::ToolArgs(d) => self.args_delta(out, &d),
            TurnEvent::ToolCallStart { call, output_index } => {
                if self.stop.matched().is_some() {
                    return;
                }
                let key = item_key(call.id.as_deref(), output_index);
                if self.shown.contains(&key) || self.is_open_tool(&key, output_index) {
                    return;
                }
                self.close_open(out);
                let call_id = call.call_id.as_deref().unwrap_or(&key).to_owned();
                let name = call.name.as_deref().unwrap_or("").to_owned();
                self.open_tool(out, key.clone(), output_index, &call_id, &name);
                let mut initial = self.take_pending(&key, output_index);
                if initial.is_empty() {
                    if let Some(a) = call.arguments.as_ref().and_then(|a| a.as_str()) {
                        initial = a.to_owned();
                    }
                }
                if !initial.is_empty() {
                    let mut raw = Vec::with_capacity(initial.len() + 2);
                    write_str(&mut raw, &initial);
                    self.json_delta(out, &raw);
                }
            }
            TurnEvent::ToolArgsDone(ev) => {
                let Some(full) = ev.arguments.as_ref().filter(|a| a.is_str()) else {
                    return;
                };
                let key = item_key(ev.item_id.as_deref(), ev.output_index);
                if self.is_open_tool(&key, ev.output_index) {
                    if !self.open_args_sent() && full.as_raw_str().len() > 2 {
                        self.json_delta(out, full.as_raw_str().as_bytes());
                    }
                } else if !self.shown.contains(&key) {
                    let text = full.as_str().unwrap_or("").to_owned();
                    match self.pending_slot(&key, ev.output_index) {
                        Some(i) => self.pending[i].arguments = text,
                        None => self.pending.push(PendingCall {
                            key,
                            output_index: ev.output_index,
                            arguments: text,
                        }),
                    }
                }
            }
            TurnEvent::ItemDone { item, output_index } => {
                self.item_done(out, &item, output_index);
            }
            TurnEvent::Finished(f) => {
                self.usage = f.usage();
                if !self.emitted_output {
                    // Nothing streamed: fall back to the final output items.
                    for (i, item) in f.output() {
                        self.item_done(out, &item, Some(i));
                    }
                }
                self.flush_pending(out);
                self.close_open(out);
                let (reason, seq) = match self.stop.matched() {
                    Some(s) => ("stop_sequence", Some(s.to_owned())),
                    None => (stop_reason(f.stop, self.tool_used), None),
                };
                self.start(out);
                frame_head(out, "message_delta");
                out.extend_from_slice(b",\"delta\":{\"stop_reason\":");
                write_str(out, reason);
                out.extend_from_slice(b",\"stop_sequence\":");
                match &seq {
                    Some(s) => write_str(out, s),
                    None => out.extend_from_slice(b"null"),
                }
                out.extend_from_slice(b"},\"usage\":");
                write_usage(out, &self.usage.unwrap_or_default());
                out.extend_from_slice(b"}\n\n");
                frame_head(out, "message_stop");
                out.extend_from_slice(b"}\n\n");
                self.finished = true;
            }
            TurnEvent::Failed(f) => {
                if let Some(u) = f.usage {
                    self.usage = Some(u);
                }
                // The gateway classifies the failure once and calls `fail`.
                self.finished = true;
                self.upstream_failed = true;
            }
        }
    }

    // --- internals -----------------------------------------------------------------------

    /// A reasoning delta: a thinking block per reasoning item (only when thinking is on).
    fn reasoning(&mut self, out: &mut Vec<u8>, r: &ReasoningDelta<'_>) {
        if self.stop.matched().is_some() || !self.thinking {
            return;
        }
        let Some(d) = r.token else { return };
        let oi = r.output_index;
        let part = (r.part, r.summary);
        let sep = match &mut self.open {
            Some((
                _,
                Open::Thinking {
                    output_index,
                    part: p,
                },
            )) if *output_index == oi => {
                let sep = p.is_some_and(|p| p != part);
                *p = Some(part);
                sep
            }
            _ => {
                self.close_open(out);
                self.open_block(
                    out,
                    Open::Thinking {
                        output_index: oi,
                        part: Some(part),
                    },
                    b"{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}",
                );
                false
            }
        };
        self.block_delta(out, b"{\"type\":\"thinking_delta\",\"thinking\":");
        if sep {
            out.extend_from_slice(b"\"\\n\\n");
            out.extend_from_slice(d.as_bytes().get(1..).unwrap_or_default());
        } else {
            out.extend_from_slice(d.as_bytes());
        }
        out.extend_from_slice(b"}}\n\n");
    }

    /// A piece of a tool call's arguments: into the open tool block, or held until the call
    /// is announced.
    fn args_delta(&mut self, out: &mut Vec<u8>, f: &Delta<'_>) {
        if self.stop.matched().is_some() {
            return;
        }
        let Some(d) = f.token else { return };
        let key = item_key(f.item_id, f.output_index);
        if self.is_open_tool(&key, f.output_index) {
            self.json_delta(out, d.as_bytes());
        } else if !self.shown.contains(&key) {
            let i = match self.pending_slot(&key, f.output_index) {
                Some(i) => i,
                None => {
                    self.pending.push(PendingCall {
                        key,
                        output_index: f.output_index,
                        arguments: String::new(),
                    });
                    self.pending.len() - 1
                }
            };
            push_unescaped(&mut self.pending[i].arguments, d);
        }
    }

    /// `message_start` and `ping`, once.
    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        frame_head(out, "message_start");
        out.extend_from_slice(b",\"message\":{\"id\":");
        write_str(out, &message_id(self.id.as_deref(), self.created));
        out.extend_from_slice(b",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        write_str(out, &self.model);
        out.extend_from_slice(
            b",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}\n\n",
        );
        frame_head(out, "ping");
        out.extend_from_slice(b"}\n\n");
    }

    fn open_block(&mut self, out: &mut Vec<u8>, block: Open, content_block: &[u8]) {
        self.start(out);
        let index = self.next_index;
        self.next_index += 1;
        frame_head(out, "content_block_start");
        out.extend_from_slice(b",\"index\":");
        write_u64(out, index);
        out.extend_from_slice(b",\"content_block\":");
        out.extend_from_slice(content_block);
        out.extend_from_slice(b"}\n\n");
        self.open = Some((index, block));
        self.emitted_output = true;
    }

    /// Writes the head of a `content_block_delta` of the open block up to `delta` (the caller
    /// writes the rest of the delta object and `}}\n\n`).
    fn block_delta(&self, out: &mut Vec<u8>, delta_head: &[u8]) {
        frame_head(out, "content_block_delta");
        out.extend_from_slice(b",\"index\":");
        write_u64(out, self.open.as_ref().map_or(0, |(i, _)| *i));
        out.extend_from_slice(b",\"delta\":");
        out.extend_from_slice(delta_head);
    }

    fn close_open(&mut self, out: &mut Vec<u8>) {
        let Some((index, block)) = self.open.take() else {
            return;
        };
        let key = match &block {
            Open::Text { key } => {
                if self.stop.matched().is_none() {
                    let rest = self.stop.flush();
                    if !rest.is_empty() {
                        self.open = Some((index, block.clone()));
                        self.text(out, TextPiece::Plain(&rest));
                        self.open = None;
                    }
                }
                key.clone()
            }
            Open::Thinking { output_index, .. } => format!("#reasoning{output_index}"),
            Open::Tool { key, .. } => key.clone(),
        };
        frame_head(out, "content_block_stop");
        out.extend_from_slice(b",\"index\":");
        write_u64(out, index);
        out.extend_from_slice(b"}\n\n");
        self.shown.push(key);
    }

    fn ensure_text(&mut self, out: &mut Vec<u8>, key: &str) {
        if matches!(&self.open, Some((_, Open::Text { key: k })) if k == key) {
            return;
        }
        self.close_open(out);
        self.open_block(
            out,
            Open::Text {
                key: key.to_owned(),
            },
            b"{\"type\":\"text\",\"text\":\"\"}",
        );
    }

    /// Text into the open text block, through the stop matcher when it is active.
    fn text(&mut self, out: &mut Vec<u8>, piece: TextPiece<'_>) {
        if self.stop.is_active() && !matches!(piece, TextPiece::Plain(_)) {
            let mut plain = String::new();
            match piece {
                TextPiece::Raw(raw) => push_unescaped(&mut plain, raw),
                TextPiece::Decoded(t) => plain.push_str(t),
                TextPiece::Plain(_) => {}
            }
            let shown = self.stop.push(&plain);
            if !shown.is_empty() {
                self.block_delta(out, b"{\"type\":\"text_delta\",\"text\":");
                write_str(out, &shown);
                out.extend_from_slice(b"}}\n\n");
            }
            return;
        }
        self.block_delta(out, b"{\"type\":\"text_delta\",\"text\":");
        match piece {
            TextPiece::Raw(raw) => out.extend_from_slice(raw.as_bytes()),
            TextPiece::Decoded(t) | TextPiece::Plain(t) => write_str(out, t),
        }
        out.extend_from_slice(b"}}\n\n");
    }

    fn json_delta(&mut self, out: &mut Vec<u8>, raw: &[u8]) {
        self.block_delta(out, b"{\"type\":\"input_json_delta\",\"partial_json\":");
        out.extend_from_slice(raw);
        out.extend_from_slice(b"}}\n\n");
        if let Some((_, Open::Tool { args_sent, .. })) = &mut self.open {
            *args_sent = true;
        }
    }

    fn open_tool(
        &mut self,
        out: &mut Vec<u8>,
        key: String,
        output_index: Option<u64>,
        call_id: &str,
        name: &str,
    ) {
        let mut cb = Vec::with_capacity(64 + call_id.len() + name.len());
        cb.extend_from_slice(b"{\"type\":\"tool_use\",\"id\":");
        write_str(&mut cb, call_id);
        cb.extend_from_slice(b",\"name\":");
        write_str(&mut cb, self.names.restore(name));
        cb.extend_from_slice(b",\"input\":{}}");
        self.open_block(
            out,
            Open::Tool {
                key,
                output_index,
                args_sent: false,
            },
            &cb,
        );
        self.tool_used = true;
    }

    fn is_open_tool(&self, key: &str, output_index: Option<u64>) -> bool {
        match &self.open {
            Some((
                _,
                Open::Tool {
                    key: k,
                    output_index: oi,
                    ..
                },
            )) => {
                k == key || (key.starts_with('#') && output_index.is_some() && *oi == output_index)
            }
            _ => false,
        }
    }

    fn open_args_sent(&self) -> bool {
        matches!(
            &self.open,
            Some((
                _,
                Open::Tool {
                    args_sent: true,
                    ..
                }
            ))
        )
    }

    fn pending_slot(&self, key: &str, output_index: Option<u64>) -> Option<usize> {
        self.pending.iter().position(|p| {
            p.key == key
                || (output_index.is_some()
                    && p.output_index == output_index
                    && (key.starts_with('#') || p.key.starts_with('#')))
        })
    }

    fn take_pending(&mut self, key: &str, output_index: Option<u64>) -> String {
        match self.pending_slot(key, output_index) {
            Some(i) => self.pending.remove(i).arguments,
            None => String::new(),
        }
    }

    /// Announces calls whose `output_item.added` / `.done` never came.
    fn flush_pending(&mut self, out: &mut Vec<u8>) {
        if self.stop.matched().is_some() {
            return;
        }
        for p in std::mem::take(&mut self.pending) {
            self.close_open(out);
            let call_id = p.key.clone();
            self.open_tool(out, p.key, p.output_index, &call_id, "");
            if !p.arguments.is_empty() {
                let mut raw = Vec::new();
                write_str(&mut raw, &p.arguments);
                self.json_delta(out, &raw);
            }
            self.close_open(out);
        }
    }

    /// `output_item.done` (or a final output item when nothing streamed).
    fn item_done(&mut self, out: &mut Vec<u8>, item: &Item<'_>, output_index: Option<u64>) {
        if self.stop.matched().is_some() {
            return;
        }
        match item {
            Item::Message(m) => {
                let key = item_key(m.id.as_deref(), output_index);
                if matches!(&self.open, Some((_, Open::Text { key: k })) if *k == key) {
                    self.close_open(out);
                    return;
                }
                if self.shown.contains(&key) {
                    return;
                }
                let mut text = String::new();
                for p in m.parts() {
                    match p {
                        Part::Text(t) | Part::Refusal(t) => text.push_str(t),
                    }
                }
                if !text.is_empty() {
                    self.ensure_text(out, &key);
                    self.text(out, TextPiece::Decoded(&text));
                    self.close_open(out);
                }
            }
            Item::ToolCall(call) => {
                let key = item_key(call.id.as_deref(), output_index);
                let full = call.arguments.as_ref().filter(|a| a.is_str());
                if self.is_open_tool(&key, output_index) {
                    if !self.open_args_sent() {
                        if let Some(f) = full.filter(|f| f.as_raw_str().len() > 2) {
                            self.json_delta(out, f.as_raw_str().as_bytes());
                        }
                    }
                    self.close_open(out);
                    return;
                }
                if self.shown.contains(&key) {
                    return;
                }
                self.close_open(out);
                let call_id = call.call_id.as_deref().unwrap_or(&key).to_owned();
                let name = call.name.as_deref().unwrap_or("").to_owned();
                let pending = self.take_pending(&key, output_index);
                self.open_tool(out, key, output_index, &call_id, &name);
                match full.filter(|f| f.as_raw_str().len() > 2) {
                    Some(f) => self.json_delta(out, f.as_raw_str().as_bytes()),
                    None if !pending.is_empty() => {
                        let mut raw = Vec::new();
                        write_str(&mut raw, &pending);
                        self.json_delta(out, &raw);
                    }
                    None => {}
                }
                self.close_open(out);
            }
            Item::Reasoning(r) => {
                if !self.thinking {
                    return;
                }
                let oi = output_index.unwrap_or(0);
                let signature = r.encrypted_content.as_deref().unwrap_or("");
                if matches!(&self.open, Some((_, Open::Thinking { output_index: o, .. })) if *o == oi)
                {
                    if !signature.is_empty() {
                        self.signature(out, signature);
                    }
                    self.close_open(out);
                    return;
                }
                if self.shown.contains(&format!("#reasoning{oi}")) {
                    return;
                }
                let text = r.summary_text();
                self.close_open(out);
                if !text.is_empty() {
                    self.open_block(
                        out,
                        Open::Thinking {
                            output_index: oi,
                            part: None,
                        },
                        b"{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}",
                    );
                    self.block_delta(out, b"{\"type\":\"thinking_delta\",\"thinking\":");
                    write_str(out, &text);
                    out.extend_from_slice(b"}}\n\n");
                    if !signature.is_empty() {
                        self.signature(out, signature);
                    }
                    self.close_open(out);
                } else if !signature.is_empty() {
                    let mut cb = b"{\"type\":\"redacted_thinking\",\"data\":".to_vec();
                    write_str(&mut cb, signature);
                    cb.push(b'}');
                    self.open_block(
                        out,
                        Open::Thinking {
                            output_index: oi,
                            part: None,
                        },
                        &cb,
                    );
                    self.close_open(out);
                }
            }
        }
    }

    fn signature(&self, out: &mut Vec<u8>, signature: &str) {
        self.block_delta(out, b"{\"type\":\"signature_delta\",\"signature\":");
        write_str(out, signature);
        out.extend_from_slice(b"}}\n\n");
    }
}

/// Text for the open text block.
enum TextPiece<'a> {
    /// A raw JSON string token from a delta event.
    Raw(&'a str),
    /// Decoded text from a finished item.
    Decoded(&'a str),
    /// Text the stop matcher already released.
    Plain(&'a str),
}
