//! Codex Responses SSE events -> one `chat.completion` body (docs/protocol.md#non-stream-and-usage).
//!
//! # Key Components
//! - [`ChatAggregator`]: fed the same events as [`super::ChatStream`]; [`ChatAggregator::finish`]
//!   returns the JSON body or the upstream failure.
//!
//! The message is built from the most authoritative source available:
//! `response.completed.response.output` when non-empty, else the `response.output_item.done`
//! items (ordered by `output_index`; the backend may send an empty `output`), else the deltas.
//! `reasoning_content` prefers the streamed reasoning deltas (joined with `"\n\n"` between
//! parts), else the items' summaries.
//!
//! # Error handling
//! `response.failed` / `error` give a [`ChatUpstreamFailure`]; so does [`ChatAggregator::finish`]
//! before any terminal event (`code: "stream_disconnected"`). Events after the terminal are
//! ignored.

use sonic_rs::JsonValueTrait;

use super::{finish_reason, write_usage, ChatRequest, ChatUpstreamFailure, ToolNameMap, Usage};
use crate::{
    json::{push_unescaped, write_str, write_u64},
    turn::{self, Item, Part, Stop, TurnEvent},
};

/// A finished output item, owned.
#[derive(Debug)]
enum DoneItem {
    Message {
        text: String,
        refusal: String,
    },
    Call {
        call_id: String,
        name: String,
        arguments: String,
    },
    Reasoning {
        text: String,
    },
}

/// A tool call assembled from `output_item.added` + argument deltas.
#[derive(Debug)]
struct DeltaCall {
    item_id: String,
    output_index: Option<u64>,
    call_id: String,
    name: String,
    arguments: String,
}

/// Non-streaming translator for one chat completion.
#[derive(Debug)]
pub struct ChatAggregator {
    model: String,
    created: u64,
    id: Option<String>,
    names: ToolNameMap,
    text: String,
    refusal: String,
    reasoning: String,
    reasoning_key: Option<(u64, u64, bool)>,
    calls: Vec<DeltaCall>,
    /// `(output_index or arrival order, item)`.
    done: Vec<(u64, DoneItem)>,
    /// Items of a non-empty `response.output`.
    final_items: Option<Vec<DoneItem>>,
    /// Why the response ended, once it did.
    stop: Option<Stop>,
    failure: Option<ChatUpstreamFailure>,
    usage: Option<Usage>,
    service_tier: Option<String>,
}

// === impl ChatAggregator ===

impl ChatAggregator {
    /// An aggregator for a client that asked for `model`; `created` is used until
    /// `response.created` gives the upstream's; `name_map` restores shortened tool names.
    pub fn new(model: &str, created: u64, name_map: ToolNameMap) -> Self {
        Self {
            model: model.to_owned(),
            created,
            id: None,
            names: name_map,
            text: String::new(),
            refusal: String::new(),
            reasoning: String::new(),
            reasoning_key: None,
            calls: Vec::new(),
            done: Vec::new(),
            final_items: None,
            stop: None,
            failure: None,
            usage: None,
            service_tier: None,
        }
    }

    /// An aggregator for a translated request.
    pub fn for_request(req: &ChatRequest, created: u64) -> Self {
        Self::new(&req.model, created, req.name_map.clone())
    }

    /// Sets the id used when the upstream sends no `response.created`.
    pub fn with_fallback_id(mut self, id: &str) -> Self {
        if self.id.is_none() {
            self.id = Some(id.to_owned());
        }
        self
    }

    /// True once a terminal event arrived.
    pub fn is_finished(&self) -> bool {
        self.stop.is_some() || self.failure.is_some()
    }

    /// Token usage from the terminal event, for accounting.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// The service tier the upstream actually used.
    pub fn service_tier(&self) -> Option<&str> {
        self.service_tier.as_deref()
    }

    /// Folds one upstream event in (its SSE `event:` type, or "" to read it from the data).
    pub fn on_event(&mut self, event_type: &str, data: &[u8]) {
        if self.is_finished() {
            return;
        }
        turn::visit(event_type, data, |event| self.apply(event));
    }

    /// Folds one neutral event in.
    fn apply(&mut self, event: TurnEvent<'_>) {
        match event {
            TurnEvent::Started(r) => {
                if let Some(id) = r.id {
                    self.id = Some(id.into_owned());
                }
                if let Some(c) = r.created_at {
                    self.created = c;
                }
            }
            TurnEvent::Text(d) => {
                if let Some(t) = d.token {
                    push_unescaped(&mut self.text, t);
                }
            }
            TurnEvent::Refusal(d) => {
                if let Some(t) = d.token {
                    push_unescaped(&mut self.refusal, t);
                }
            }
            TurnEvent::Reasoning(r) => {
                let Some(t) = r.token else { return };
                let key = (r.output_index, r.part, r.summary);
                if self.reasoning_key.is_some_and(|k| k != key) {
                    self.reasoning.push_str("\n\n");
                }
                self.reasoning_key = Some(key);
                push_unescaped(&mut self.reasoning, t);
            }
            TurnEvent::ToolArgs(d) => {
                let Some(t) = d.token else { return };
                let i = self.call_slot(d.item_id, d.output_index, None);
                if let Some(c) = self.calls.get_mut(i) {
                    push_unescaped(&mut c.arguments, t);
                }
            }
            TurnEvent::ToolCallStart { call, output_index } => {
                let item_id = call.id.as_deref().unwrap_or("");
                if self.find_call(Some(item_id), output_index).is_some() {
                    return;
                }
                self.calls.push(DeltaCall {
                    item_id: item_id.to_owned(),
                    output_index,
                    call_id: call.call_id.as_deref().unwrap_or(item_id).to_owned(),
                    name: call.name.as_deref().unwrap_or("").to_owned(),
                    arguments: call
                        .arguments
                        .as_ref()
                        .and_then(|a| a.as_str())
                        .unwrap_or("")
                        .to_owned(),
                });
            }
            TurnEvent::ToolArgsDone(ev) => {
                let full = ev.arguments.as_ref().and_then(|a| a.as_str());
                let i = self.call_slot(ev.item_id.as_deref(), ev.output_index, ev.name.as_deref());
                if let Some(c) = self.calls.get_mut(i) {
                    if let Some(f) = full {
                        c.arguments = f.to_owned();
                    }
                    if c.name.is_empty() {
                        if let Some(n) = ev.name.as_deref() {
                            c.name = n.to_owned();
                        }
                    }
                }
            }
            TurnEvent::ItemDone { item, output_index } => {
                let order = output_index.unwrap_or(self.done.len() as u64);
                self.done.push((order, done_item(&item)));
            }
            TurnEvent::Finished(f) => {
                self.usage = f.usage();
                self.service_tier = f.service_tier().map(str::to_owned);
                let items: Vec<DoneItem> = f.output().map(|(_, i)| done_item(&i)).collect();
                if !items.is_empty() {
                    self.final_items = Some(items);
                }
                self.stop = Some(f.stop);
            }
            TurnEvent::Failed(f) => {
                if let Some(u) = f.usage {
                    self.usage = Some(u);
                }
                self.failure = Some(ChatUpstreamFailure::from_event(&f));
            }
        }
    }

    /// The `chat.completion` JSON body, or the upstream failure (including EOF before a
    /// terminal event).
    ///
    /// # Errors
    /// The [`ChatUpstreamFailure`] of a `response.failed` / `error` event, or
    /// [`ChatUpstreamFailure::disconnected`] when no terminal event arrived.
    pub fn finish(mut self) -> Result<Vec<u8>, ChatUpstreamFailure> {
        if let Some(f) = self.failure.take() {
            return Err(f);
        }
        let Some(stop) = self.stop else {
            return Err(ChatUpstreamFailure::disconnected());
        };

        let mut items = match self.final_items.take() {
            Some(items) => items,
            None => {
                self.done.sort_by_key(|(order, _)| *order);
                self.done.drain(..).map(|(_, d)| d).collect()
            }
        };
        let has_message = items.iter().any(|i| matches!(i, DoneItem::Message { .. }));
        let has_call = items.iter().any(|i| matches!(i, DoneItem::Call { .. }));

        let (mut text, mut refusal) = if has_message {
            (String::new(), String::new())
        } else {
            (
                std::mem::take(&mut self.text),
                std::mem::take(&mut self.refusal),
            )
        };
        let mut item_reasoning = String::new();
        let mut calls: Vec<(String, String, String)> = Vec::new();
        for item in items.drain(..) {
            match item {
                DoneItem::Message {
                    text: t,
                    refusal: r,
                } => {
                    text.push_str(&t);
                    refusal.push_str(&r);
                }
                DoneItem::Call {
                    call_id,
                    name,
                    arguments,
                } => calls.push((call_id, name, arguments)),
                DoneItem::Reasoning { text: t } => {
                    if !t.is_empty() {
                        if !item_reasoning.is_empty() {
                            item_reasoning.push_str("\n\n");
                        }
                        item_reasoning.push_str(&t);
                    }
                }
            }
        }
        if !has_call {
            calls = self
                .calls
                .drain(..)
                .map(|c| (c.call_id, c.name, c.arguments))
                .collect();
        }
        let reasoning = if self.reasoning.is_empty() {
            item_reasoning
        } else {
            std::mem::take(&mut self.reasoning)
        };
        let finish_reason = finish_reason(stop, !calls.is_empty());

        let mut out = Vec::with_capacity(256 + text.len() + reasoning.len());
        out.extend_from_slice(b"{\"id\":\"chatcmpl-");
        match &self.id {
            Some(id) => {
                let mut tmp = Vec::with_capacity(id.len() + 2);
                write_str(&mut tmp, id);
                out.extend_from_slice(&tmp[1..]);
            }
            None => {
                out.extend_from_slice(b"gw");
                write_u64(&mut out, self.created);
                out.push(b'"');
            }
        }
        out.extend_from_slice(b",\"object\":\"chat.completion\",\"created\":");
        write_u64(&mut out, self.created);
        out.extend_from_slice(b",\"model\":");
        write_str(&mut out, &self.model);
        out.extend_from_slice(
            b",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":",
        );
        if text.is_empty() && !calls.is_empty() {
            out.extend_from_slice(b"null");
        } else {
            write_str(&mut out, &text);
        }
        if !reasoning.is_empty() {
            out.extend_from_slice(b",\"reasoning_content\":");
            write_str(&mut out, &reasoning);
        }
        if !refusal.is_empty() {
            out.extend_from_slice(b",\"refusal\":");
            write_str(&mut out, &refusal);
        }
        if !calls.is_empty() {
            out.extend_from_slice(b",\"tool_calls\":[");
            for (i, (call_id, name, arguments)) in calls.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(b"{\"id\":");
                write_str(&mut out, call_id);
                out.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
                write_str(&mut out, self.names.restore(name));
                out.extend_from_slice(b",\"arguments\":");
                write_str(&mut out, arguments);
                out.extend_from_slice(b"}}");
            }
            out.push(b']');
        }
        out.extend_from_slice(b"},\"finish_reason\":");
        write_str(&mut out, finish_reason);
        out.extend_from_slice(b"}],\"usage\":");
        write_usage(&mut out, &self.usage.unwrap_or_default());
        out.push(b'}');
        Ok(out)
    }

    fn find_call(&self, item_id: Option<&str>, output_index: Option<u64>) -> Option<usize> {
        if let Some(id) = item_id.filter(|s| !s.is_empty()) {
            if let Some(i) = self.calls.iter().position(|c| c.item_id == id) {
                return Some(i);
            }
        }
        let oi = output_index?;
        self.calls.iter().position(|c| {
            c.output_index == Some(oi)
                && (c.item_id.is_empty() || item_id.is_none_or(str::is_empty))
        })
    }

    /// The call an argument event belongs to, created when `output_item.added` was skipped.
    fn call_slot(
        &mut self,
        item_id: Option<&str>,
        output_index: Option<u64>,
        name: Option<&str>,
    ) -> usize {
        match self.find_call(item_id, output_index) {
            Some(i) => i,
            None => {
                let item_id = item_id.unwrap_or("").to_owned();
                self.calls.push(DeltaCall {
                    call_id: item_id.clone(),
                    item_id,
                    output_index,
                    name: name.unwrap_or("").to_owned(),
                    arguments: String::new(),
                });
                self.calls.len() - 1
            }
        }
    }
}

/// Owns the parts of a finished item the completion needs.
fn done_item(item: &Item<'_>) -> DoneItem {
    match item {
        Item::Message(m) => {
            let mut text = String::new();
            let mut refusal = String::new();
            for p in m.parts() {
                match p {
                    Part::Text(t) => text.push_str(t),
                    Part::Refusal(r) => refusal.push_str(r),
                }
            }
            DoneItem::Message { text, refusal }
        }
        Item::ToolCall(call) => {
            let item_id = call.id.as_deref().unwrap_or("");
            DoneItem::Call {
                call_id: call.call_id.as_deref().unwrap_or(item_id).to_owned(),
                name: call.name.as_deref().unwrap_or("").to_owned(),
                arguments: call
                    .arguments
                    .as_ref()
                    .and_then(|a| a.as_str())
                    .unwrap_or("")
                    .to_owned(),
            }
        }
        Item::Reasoning(r) => DoneItem::Reasoning {
            text: r.summary_text(),
        },
    }
}
