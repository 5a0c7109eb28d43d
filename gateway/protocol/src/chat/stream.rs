//! Codex Responses SSE events -> `chat.completion.chunk` frames (docs/protocol.md#stream).
//!
//! # Key Components
//! - [`ChatStream`]: a small state machine fed one upstream event at a time. Each call appends
//!   zero or more complete `data: {...}\n\n` frames to the caller's buffer.
//!
//! The frame sequence it produces is always:
//! 1. a role chunk `delta:{role:"assistant",content:""}`, once, before any other chunk (it is
//!    written lazily, so a stream that fails before any output sends only the error);
//! 2. content / `reasoning_content` / `refusal` deltas, tool-call announces
//!    (`{index, id, type:"function", function:{name, arguments:""}}`) and argument deltas with
//!    the same stable `index` (matched by `item_id`, falling back to `output_index`);
//! 3. exactly one terminal: either a `delta:{}` chunk with `finish_reason`, a usage chunk
//!    (`choices:[]`, only with `include_usage`) and `data: [DONE]`, or one
//!    `data: {"error":{...}}` frame and no `[DONE]`.
//!
//! Deltas are copied into chunks as raw JSON string tokens (no unescape / re-escape), and the
//! per-chunk prefix (`id`, `object`, `created`, `model`) is built once.
//!
//! # Error handling
//! `response.failed`, `error` and [`ChatStream::finish`] before a terminal each produce one
//! error frame; the failure stays readable through [`ChatStream::failure`]. Events after the
//! terminal are ignored. Malformed non-terminal events are skipped.

use sonic_rs::{JsonValueTrait, LazyValue};

use super::{finish_reason, write_usage, ChatRequest, ChatUpstreamFailure, ToolNameMap, Usage};
use crate::{
    json::{push_unescaped, write_str, write_u64},
    turn::{self, Delta, Item, Part, ReasoningDelta, TurnEvent},
};

/// One tool call seen in the stream.
#[derive(Debug)]
struct ToolSlot {
    /// Upstream item id (may be empty when unknown).
    item_id: String,
    output_index: Option<u64>,
    /// The chat `index`, once announced.
    index: Option<u32>,
    /// Whether any argument text was sent to the client.
    args_sent: bool,
    /// Arguments received before the announce (no `output_item.added` seen).
    buffered: String,
    /// Upstream name, when known before the announce.
    name: String,
}

/// Streaming translator for one chat completion.
#[derive(Debug)]
pub struct ChatStream {
    model: String,
    created: u64,
    id: Option<String>,
    include_usage: bool,
    names: ToolNameMap,
    /// `data: {"id":..,"object":"chat.completion.chunk","created":..,"model":..` (no brace
    /// closed), built when the first chunk is written.
    head: Vec<u8>,
    started: bool,
    finished: bool,
    emitted_output: bool,
    tools: Vec<ToolSlot>,
    announced: u32,
    /// `(output_index, part index, is_summary)` of the last reasoning delta.
    reasoning_key: Option<(u64, u64, bool)>,
    /// Message items that streamed text deltas (their `.done` text is not repeated).
    text_items: Vec<String>,
    usage: Option<Usage>,
    service_tier: Option<String>,
    failure: Option<ChatUpstreamFailure>,
}

// === impl ChatStream ===

impl ChatStream {
    /// A translator for a client that asked for `model`. `created` (unix seconds) is used
    /// until `response.created` gives the upstream's; `name_map` restores shortened tool names.
    pub fn new(model: &str, created: u64, include_usage: bool, name_map: ToolNameMap) -> Self {
        Self {
            model: model.to_owned(),
            created,
            id: None,
            include_usage,
            names: name_map,
            head: Vec::new(),
            started: false,
            finished: false,
            emitted_output: false,
            tools: Vec::new(),
            announced: 0,
            reasoning_key: None,
            text_items: Vec::new(),
            usage: None,
            service_tier: None,
            failure: None,
        }
    }

    /// A translator for a translated request (model, `include_usage`, name map).
    pub fn for_request(req: &ChatRequest, created: u64) -> Self {
        Self::new(&req.model, created, req.include_usage, req.name_map.clone())
    }

    /// Sets the id used when the upstream sends no `response.created` (the chunk id is
    /// `chatcmpl-<id>`). Without it, the fallback is derived from `created`.
    pub fn with_fallback_id(mut self, id: &str) -> Self {
        if self.id.is_none() {
            self.id = Some(id.to_owned());
        }
        self
    }

    /// True once a terminal (success, failure or [`ChatStream::finish`]) was written.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// True once any frame was written (the client has seen output).
    pub fn has_started(&self) -> bool {
        self.started || self.finished
    }

    /// Token usage from the terminal event, for accounting.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// The service tier the upstream actually used, from the terminal event.
    pub fn service_tier(&self) -> Option<&str> {
        self.service_tier.as_deref()
    }

    /// The failure that ended the stream, if it failed.
    pub fn failure(&self) -> Option<&ChatUpstreamFailure> {
        self.failure.as_ref()
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
            }
            TurnEvent::Text(d) => {
                if let Some(id) = d.item_id {
                    if !self.text_items.iter().any(|t| t == id) {
                        self.text_items.push(id.to_owned());
                    }
                }
                if let Some(t) = d.token {
                    self.delta_raw(out, b"{\"content\":", t.as_bytes());
                }
            }
            TurnEvent::Refusal(d) => {
                if let Some(t) = d.token {
                    self.delta_raw(out, b"{\"refusal\":", t.as_bytes());
                }
            }
            TurnEvent::Reasoning(r) => self.reasoning(out, &r),
            TurnEvent::ToolArgs(d) => self.args_delta(out, &d),
            TurnEvent::ToolCallStart { call, output_index } => {
                let item_id = call.id.as_deref().unwrap_or("");
                if self.find_slot(Some(item_id), output_index).is_some() {
                    return;
                }
                let args = call
                    .arguments
                    .as_ref()
                    .filter(|a| a.as_str().is_some_and(|s| !s.is_empty()));
                let slot = self.tools.len();
                self.tools.push(ToolSlot {
                    item_id: item_id.to_owned(),
                    output_index,
                    index: None,
                    args_sent: false,
                    buffered: String::new(),
                    name: String::new(),
                });
                let call_id = call.call_id.as_deref().unwrap_or(item_id);
                let name = call.name.as_deref().unwrap_or("");
                self.announce(out, slot, call_id, name, ArgText::Raw(args));
            }
            TurnEvent::ToolArgsDone(ev) => {
                let full = ev.arguments.as_ref();
                match self.find_slot(ev.item_id.as_deref(), ev.output_index) {
                    Some(i) => {
                        if let Some(n) = ev.name.as_deref() {
                            if self.tools[i].name.is_empty() {
                                self.tools[i].name = n.to_owned();
                            }
                        }
                        match (self.tools[i].index, self.tools[i].args_sent) {
                            (Some(index), false) => {
                                if let Some(f) = nonempty_str(full) {
                                    self.tools[i].args_sent = true;
                                    self.args_chunk(out, index, f.as_bytes());
                                }
                            }
                            (Some(_), true) => {}
                            (None, _) => {
                                if let Some(f) = full.and_then(|f| f.as_str()) {
                                    self.tools[i].buffered = f.to_owned();
                                }
                            }
                        }
                    }
                    None => self.tools.push(ToolSlot {
                        item_id: ev.item_id.as_deref().unwrap_or("").to_owned(),
                        output_index: ev.output_index,
                        index: None,
                        args_sent: false,
                        buffered: full.and_then(|f| f.as_str()).unwrap_or("").to_owned(),
                        name: ev.name.as_deref().unwrap_or("").to_owned(),
                    }),
                }
            }
            TurnEvent::ItemDone { item, output_index } => {
                self.item_done(out, &item, output_index);
            }
            TurnEvent::Finished(f) => {
                self.usage = f.usage();
                self.service_tier = f.service_tier().map(str::to_owned);
                if !self.emitted_output {
                    // Nothing streamed: fall back to the final output items.
                    for (i, item) in f.output() {
                        self.item_done(out, &item, Some(i));
                    }
                }
                self.flush_unannounced(out);
                let reason = finish_reason(f.stop, self.announced > 0);
                self.finish_ok(out, reason);
            }
            TurnEvent::Failed(f) => {
                if let Some(u) = f.usage {
                    self.usage = Some(u);
                }
                let failure = ChatUpstreamFailure::from_event(&f);
                self.fail(out, failure);
            }
        }
    }

    /// Handles upstream EOF: when no terminal event arrived, writes one error frame
    /// (`code: "stream_disconnected"`); otherwise writes nothing.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.finished {
            self.fail(out, ChatUpstreamFailure::disconnected());
        }
    }

    // --- internals -----------------------------------------------------------------------

    /// A reasoning delta (`reasoning_content`; a blank line between parts).
    fn reasoning(&mut self, out: &mut Vec<u8>, r: &ReasoningDelta<'_>) {
        let key = (r.output_index, r.part, r.summary);
        let Some(d) = r.token else { return };
        let sep = self.reasoning_key.is_some_and(|k| k != key);
        self.reasoning_key = Some(key);
        self.start(out);
        self.open_chunk(out);
        out.extend_from_slice(b"{\"reasoning_content\":");
        if sep {
            // `"\n\n` + the raw token without its opening quote.
            out.extend_from_slice(b"\"\\n\\n");
            out.extend_from_slice(d.as_bytes().get(1..).unwrap_or_default());
        } else {
            out.extend_from_slice(d.as_bytes());
        }
        out.push(b'}');
        close_chunk(out);
        self.emitted_output = true;
    }

    /// A piece of a tool call's arguments.
    fn args_delta(&mut self, out: &mut Vec<u8>, f: &Delta<'_>) {
        let Some(d) = f.token else { return };
        match self.find_slot(f.item_id, f.output_index) {
            Some(i) => match self.tools[i].index {
                Some(index) => {
                    self.tools[i].args_sent = true;
                    self.args_chunk(out, index, d.as_bytes());
                }
                None => push_unescaped(&mut self.tools[i].buffered, d),
            },
            None => {
                let mut buffered = String::new();
                push_unescaped(&mut buffered, d);
                self.tools.push(ToolSlot {
                    item_id: f.item_id.unwrap_or("").to_owned(),
                    output_index: f.output_index,
                    index: None,
                    args_sent: false,
                    buffered,
                    name: String::new(),
                });
            }
        }
    }

    fn fail(&mut self, out: &mut Vec<u8>, failure: ChatUpstreamFailure) {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(&failure.to_json());
        out.extend_from_slice(b"\n\n");
        self.failure = Some(failure);
        self.finished = true;
    }

    fn finish_ok(&mut self, out: &mut Vec<u8>, reason: &str) {
        self.start(out);
        out.extend_from_slice(&self.head);
        out.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":");
        write_str(out, reason);
        out.extend_from_slice(b"}]}\n\n");
        if self.include_usage {
            out.extend_from_slice(&self.head);
            out.extend_from_slice(b",\"choices\":[],\"usage\":");
            write_usage(out, &self.usage.unwrap_or_default());
            out.extend_from_slice(b"}\n\n");
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        self.finished = true;
    }

    /// Writes the role chunk once (and freezes id / created).
    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let mut head = Vec::with_capacity(96 + self.model.len());
        head.extend_from_slice(b"data: {\"id\":\"chatcmpl-");
        match &self.id {
            Some(id) => {
                // write_str adds quotes; splice its escaped body after our prefix.
                let mut tmp = Vec::with_capacity(id.len() + 2);
                write_str(&mut tmp, id);
                head.extend_from_slice(&tmp[1..]);
            }
            None => {
                head.extend_from_slice(b"gw");
                let mut n = Vec::new();
                write_u64(&mut n, self.created);
                head.extend_from_slice(&n);
                head.push(b'"');
            }
        }
        head.extend_from_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        write_u64(&mut head, self.created);
        head.extend_from_slice(b",\"model\":");
        write_str(&mut head, &self.model);
        self.head = head;
        self.open_chunk(out);
        out.extend_from_slice(b"{\"role\":\"assistant\",\"content\":\"\"}");
        close_chunk(out);
    }

    fn open_chunk(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.head);
        out.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":");
    }

    /// One chunk whose delta is `prefix` + a raw JSON token + `}`.
    fn delta_raw(&mut self, out: &mut Vec<u8>, prefix: &[u8], raw: &[u8]) {
        self.start(out);
        self.open_chunk(out);
        out.extend_from_slice(prefix);
        out.extend_from_slice(raw);
        out.push(b'}');
        close_chunk(out);
        self.emitted_output = true;
    }

    fn args_chunk(&mut self, out: &mut Vec<u8>, index: u32, raw: &[u8]) {
        self.start(out);
        self.open_chunk(out);
        out.extend_from_slice(b"{\"tool_calls\":[{\"index\":");
        write_u64(out, u64::from(index));
        out.extend_from_slice(b",\"function\":{\"arguments\":");
        out.extend_from_slice(raw);
        out.extend_from_slice(b"}}]}");
        close_chunk(out);
        self.emitted_output = true;
    }

    /// Announces tool slot `slot` with its call id, (upstream) name and initial arguments.
    fn announce(
        &mut self,
        out: &mut Vec<u8>,
        slot: usize,
        call_id: &str,
        name: &str,
        args: ArgText<'_, '_>,
    ) {
        let index = self.announced;
        self.announced += 1;
        self.start(out);
        self.open_chunk(out);
        out.extend_from_slice(b"{\"tool_calls\":[{\"index\":");
        write_u64(out, u64::from(index));
        out.extend_from_slice(b",\"id\":");
        write_str(out, call_id);
        out.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
        write_str(out, self.names.restore(name));
        out.extend_from_slice(b",\"arguments\":");
        let sent = match args {
            ArgText::Raw(Some(v)) if v.is_str() => {
                out.extend_from_slice(v.as_raw_str().as_bytes());
                v.as_raw_str().len() > 2
            }
            ArgText::Text(t) => {
                write_str(out, t);
                !t.is_empty()
            }
            ArgText::Raw(_) => {
                out.extend_from_slice(b"\"\"");
                false
            }
        };
        out.extend_from_slice(b"}}]}");
        close_chunk(out);
        self.emitted_output = true;
        if let Some(s) = self.tools.get_mut(slot) {
            s.index = Some(index);
            s.args_sent |= sent;
        }
    }

    fn find_slot(&self, item_id: Option<&str>, output_index: Option<u64>) -> Option<usize> {
        if let Some(id) = item_id.filter(|s| !s.is_empty()) {
            if let Some(i) = self.tools.iter().position(|t| t.item_id == id) {
                return Some(i);
            }
        }
        let oi = output_index?;
        self.tools.iter().position(|t| {
            t.output_index == Some(oi)
                && (t.item_id.is_empty() || item_id.is_none_or(str::is_empty))
        })
    }

    /// `output_item.done` (or a final output item when nothing streamed).
    fn item_done(&mut self, out: &mut Vec<u8>, item: &Item<'_>, output_index: Option<u64>) {
        match item {
            Item::Message(m) => {
                let id = m.id.as_deref().unwrap_or("");
                if !id.is_empty() && self.text_items.iter().any(|t| t == id) {
                    return;
                }
                let mut text = String::new();
                let mut refusal = String::new();
                for p in m.parts() {
                    match p {
                        Part::Text(t) => text.push_str(t),
                        Part::Refusal(r) => refusal.push_str(r),
                    }
                }
                if !text.is_empty() {
                    let mut raw = Vec::with_capacity(text.len() + 2);
                    write_str(&mut raw, &text);
                    self.delta_raw(out, b"{\"content\":", &raw);
                }
                if !refusal.is_empty() {
                    let mut raw = Vec::with_capacity(refusal.len() + 2);
                    write_str(&mut raw, &refusal);
                    self.delta_raw(out, b"{\"refusal\":", &raw);
                }
            }
            Item::ToolCall(call) => {
                let item_id = call.id.as_deref().unwrap_or("");
                let full = call.arguments.as_ref();
                match self.find_slot(Some(item_id), output_index) {
                    Some(i) => match self.tools[i].index {
                        Some(index) => {
                            if !self.tools[i].args_sent {
                                if let Some(f) = nonempty_str(full) {
                                    self.tools[i].args_sent = true;
                                    self.args_chunk(out, index, f.as_bytes());
                                }
                            }
                        }
                        None => {
                            let call_id = call.call_id.as_deref().unwrap_or(item_id);
                            let name = call.name.as_deref().unwrap_or("");
                            if full.is_some_and(|f| f.is_str()) {
                                self.announce(out, i, call_id, name, ArgText::Raw(full));
                            } else {
                                let buffered = std::mem::take(&mut self.tools[i].buffered);
                                self.announce(out, i, call_id, name, ArgText::Text(&buffered));
                            }
                        }
                    },
                    None => {
                        let slot = self.tools.len();
                        self.tools.push(ToolSlot {
                            item_id: item_id.to_owned(),
                            output_index,
                            index: None,
                            args_sent: false,
                            buffered: String::new(),
                            name: String::new(),
                        });
                        let call_id = call.call_id.as_deref().unwrap_or(item_id);
                        let name = call.name.as_deref().unwrap_or("");
                        self.announce(out, slot, call_id, name, ArgText::Raw(full));
                    }
                }
            }
            Item::Reasoning(_) => {}
        }
    }

    /// Announces tool calls whose `output_item.added` / `.done` never came.
    fn flush_unannounced(&mut self, out: &mut Vec<u8>) {
        for i in 0..self.tools.len() {
            if self.tools[i].index.is_some() {
                continue;
            }
            let buffered = std::mem::take(&mut self.tools[i].buffered);
            let name = std::mem::take(&mut self.tools[i].name);
            let call_id = self.tools[i].item_id.clone();
            self.announce(out, i, &call_id, &name, ArgText::Text(&buffered));
        }
    }
}

/// Arguments for an announce: a raw JSON string token, or decoded text.
enum ArgText<'v, 'a> {
    Raw(Option<&'v LazyValue<'a>>),
    Text(&'v str),
}

fn close_chunk(out: &mut Vec<u8>) {
    out.extend_from_slice(b",\"finish_reason\":null}]}\n\n");
}

/// The raw token of a non-empty JSON string value.
fn nonempty_str<'v>(v: Option<&'v LazyValue<'_>>) -> Option<&'v str> {
    v.filter(|v| v.is_str())
        .map(|v| v.as_raw_str())
        .filter(|r| r.len() > 2)
}
