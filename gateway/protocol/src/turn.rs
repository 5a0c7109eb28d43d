//! One dialect-neutral reading of the upstream Responses events of a turn: every client
//! dialect's response side (Chat Completions in [`crate::chat`], Anthropic Messages in
//! [`crate::anthropic`], each streamed and aggregated) translates from these events and reads
//! no upstream JSON of its own.
//!
//! # Key Components
//! - [`visit`]: one upstream event (its SSE `event:` type, or "" / `message` to read `type`
//!   from the data, and its JSON data) -> a [`TurnEvent`] handed to the encoder, or nothing
//!   for an event no translator acts on (rate limits, `*.done` text events, unknown types) or
//!   a malformed non-terminal one.
//! - [`TurnEvent`]: the vocabulary: the response started; text, refusal, reasoning and
//!   tool-argument deltas; a tool call started; its arguments done; an output item done
//!   ([`Item`]: message, tool call, reasoning); the response finished ([`Finish`], with its
//!   [`Stop`] reason, usage and final output) or failed ([`Failure`]).
//!
//! What the events mean, and what the dialects make of them: docs/protocol.md#stream.
//!
//! # Performance
//! Each event is read once. Delta events (most of a stream) go through a small validated
//! scanner (`scan.rs`), not serde, and carry their `delta` as the raw JSON string token
//! borrowed from the data, which encoders copy into their output without unescaping; the other
//! events take one borrowed serde pass (`raw.rs`: strings without escapes are not copied,
//! argument values stay raw JSON). Nothing is allocated per delta event, and a final
//! `response.output` is parsed only when an encoder asks for it ([`Finish::output`]).
//!
//! # Error handling
//! Malformed events are skipped (`f` is not called), except terminal ones: a
//! `response.completed` / `.incomplete` whose data cannot be read still finishes the turn
//! (with no usage and no output), and a `response.failed` / `error` still fails it.

mod raw;
mod scan;

use std::borrow::Cow;

use sonic_rs::LazyValue;

use self::{
    raw::{RawEvent, RawItem, RawPart, RawResponse},
    scan::{scan_delta, DeltaFields},
};
use crate::events::Usage;

/// One upstream event in the neutral vocabulary; strings borrow the event's data.
#[derive(Debug)]
pub(crate) enum TurnEvent<'a> {
    /// `response.created` / `.in_progress` / `.queued`.
    Started(Started<'a>),
    /// Output text (`response.output_text.delta`).
    Text(Delta<'a>),
    /// Refusal text (`response.refusal.delta`).
    Refusal(Delta<'a>),
    /// Reasoning text (`response.reasoning_summary_text.delta` / `.reasoning_text.delta`).
    Reasoning(ReasoningDelta<'a>),
    /// A piece of a tool call's arguments (`response.function_call_arguments.delta`,
    /// `response.custom_tool_call_input.delta`).
    ToolArgs(Delta<'a>),
    /// A tool call began (`response.output_item.added` of a function or custom tool call;
    /// other items that begin are not events).
    ToolCallStart {
        /// The call as announced (its arguments are usually still empty).
        call: ToolCall<'a>,
        /// `output_index`.
        output_index: Option<u64>,
    },
    /// A tool call's arguments are complete (`response.function_call_arguments.done`,
    /// `response.custom_tool_call_input.done`).
    ToolArgsDone(ArgsDone<'a>),
    /// An output item is complete (`response.output_item.done` of a message, a tool call or a
    /// reasoning item; other items are not events).
    ItemDone {
        /// The finished item.
        item: Item<'a>,
        /// `output_index`.
        output_index: Option<u64>,
    },
    /// The response ended (`response.completed` / `.done` / `.incomplete`).
    Finished(Finish<'a>),
    /// The response failed (`response.failed` / `error`).
    Failed(Failure<'a>),
}

/// What a lifecycle event says about the response.
#[derive(Debug, Default)]
pub(crate) struct Started<'a> {
    /// `response.id`, when present and not empty.
    pub id: Option<Cow<'a, str>>,
    /// `response.created_at` as unix seconds (floats truncated).
    pub created_at: Option<u64>,
}

/// A text, refusal or argument delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delta<'a> {
    /// The `delta` as a validated raw JSON string token, quotes included; `None` when absent or
    /// empty (`""`).
    pub token: Option<&'a str>,
    /// `item_id` (ids carry no escapes).
    pub item_id: Option<&'a str>,
    /// `output_index`.
    pub output_index: Option<u64>,
}

/// A reasoning delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReasoningDelta<'a> {
    /// As [`Delta::token`].
    pub token: Option<&'a str>,
    /// `output_index` (0 when absent).
    pub output_index: u64,
    /// The part within the item: `summary_index` of a summary delta, `content_index` of a raw
    /// reasoning delta (0 when absent).
    pub part: u64,
    /// A summary delta (`reasoning_summary_text`), not raw reasoning text.
    pub summary: bool,
}

/// A function call or custom tool call item.
#[derive(Debug, Default)]
pub(crate) struct ToolCall<'a> {
    /// The item id.
    pub id: Option<Cow<'a, str>>,
    /// `call_id`, what the client answers with.
    pub call_id: Option<Cow<'a, str>>,
    /// The (upstream) tool name.
    pub name: Option<Cow<'a, str>>,
    /// `arguments` of a function call, `input` of a custom tool call, as raw JSON (a string
    /// when well-formed).
    pub arguments: Option<LazyValue<'a>>,
}

/// The end of a tool call's arguments.
#[derive(Debug, Default)]
pub(crate) struct ArgsDone<'a> {
    /// `item_id`.
    pub item_id: Option<Cow<'a, str>>,
    /// `output_index`.
    pub output_index: Option<u64>,
    /// `name`, when the event carries it.
    pub name: Option<Cow<'a, str>>,
    /// The whole arguments (`arguments`, or `input` of a custom tool call), as raw JSON.
    pub arguments: Option<LazyValue<'a>>,
}

/// A finished output item.
#[derive(Debug)]
pub(crate) enum Item<'a> {
    /// An assistant message.
    Message(Message<'a>),
    /// A function call or custom tool call.
    ToolCall(ToolCall<'a>),
    /// A reasoning item.
    Reasoning(Reasoning<'a>),
}

/// A message item.
#[derive(Debug, Default)]
pub(crate) struct Message<'a> {
    /// The item id.
    pub id: Option<Cow<'a, str>>,
    content: Vec<RawPart<'a>>,
}

/// One part of a message's content that a client sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part<'p> {
    /// `output_text` (its `text`, "" when absent).
    Text(&'p str),
    /// `refusal` (its `refusal`, "" when absent).
    Refusal(&'p str),
}

/// A reasoning item.
#[derive(Debug, Default)]
pub(crate) struct Reasoning<'a> {
    summary: Vec<RawPart<'a>>,
    /// `encrypted_content`, the account-bound reasoning (Anthropic thinking signatures).
    pub encrypted_content: Option<Cow<'a, str>>,
}

/// Why the response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// `response.completed`: the model finished its turn (or called tools).
    Completed,
    /// `response.incomplete` for the output limit (`max_output_tokens`, or any reason other
    /// than the content filter).
    MaxOutputTokens,
    /// `response.incomplete` with reason `content_filter`.
    ContentFilter,
}

/// A finished response.
#[derive(Debug)]
pub(crate) struct Finish<'a> {
    /// Why it ended.
    pub stop: Stop,
    response: Option<RawResponse<'a>>,
}

/// A failed response.
#[derive(Debug)]
pub(crate) struct Failure<'a> {
    /// Usage the failure event reported, if any.
    pub usage: Option<Usage>,
    data: &'a [u8],
}

/// The event types the translators act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Created,
    TextDelta,
    RefusalDelta,
    ReasoningSummaryDelta,
    ReasoningTextDelta,
    ItemAdded,
    ItemDone,
    ArgsDelta,
    ArgsDone,
    Completed,
    Incomplete,
    Failed,
    Other,
}

/// Maps an event type to its [`Kind`]; an empty or `message` type is read from the data
/// (`data:`-only frames).
fn kind_of(event_type: &str, data: &[u8]) -> Kind {
    let ty = if event_type.is_empty() || event_type == "message" {
        crate::events::event_type(data).unwrap_or(event_type)
    } else {
        event_type
    };
    match ty {
        "response.output_text.delta" => Kind::TextDelta,
        "response.function_call_arguments.delta" | "response.custom_tool_call_input.delta" => {
            Kind::ArgsDelta
        }
        "response.reasoning_summary_text.delta" => Kind::ReasoningSummaryDelta,
        "response.reasoning_text.delta" => Kind::ReasoningTextDelta,
        "response.output_item.added" => Kind::ItemAdded,
        "response.output_item.done" => Kind::ItemDone,
        "response.function_call_arguments.done" | "response.custom_tool_call_input.done" => {
            Kind::ArgsDone
        }
        "response.refusal.delta" => Kind::RefusalDelta,
        "response.created" | "response.in_progress" | "response.queued" => Kind::Created,
        "response.completed" | "response.done" => Kind::Completed,
        "response.incomplete" => Kind::Incomplete,
        "response.failed" | "error" => Kind::Failed,
        _ => Kind::Other,
    }
}

/// Reads one upstream event (see the module docs) and hands it to `f`; `None` (and `f` not
/// called) for an event no translator acts on.
///
/// A visitor rather than a returned event: each kind builds its event where `f` takes it, so
/// a delta event is never copied (the event is a few hundred bytes; the deltas use 40).
#[inline(always)]
pub(crate) fn visit<'a, R>(
    event_type: &str,
    data: &'a [u8],
    f: impl FnOnce(TurnEvent<'a>) -> R,
) -> Option<R> {
    // The delta events (most of a stream) are read here, the rest out of line.
    let kind = kind_of(event_type, data);
    match kind {
        Kind::TextDelta => Some(f(TurnEvent::Text(Delta::of(&scan_delta(data)?)))),
        Kind::RefusalDelta => Some(f(TurnEvent::Refusal(Delta::of(&scan_delta(data)?)))),
        Kind::ArgsDelta => Some(f(TurnEvent::ToolArgs(Delta::of(&scan_delta(data)?)))),
        Kind::ReasoningSummaryDelta | Kind::ReasoningTextDelta => {
            let d = scan_delta(data)?;
            let summary = kind == Kind::ReasoningSummaryDelta;
            let part = if summary {
                d.summary_index
            } else {
                d.content_index
            };
            Some(f(TurnEvent::Reasoning(ReasoningDelta {
                token: nonempty(d.delta),
                output_index: d.output_index.unwrap_or(0),
                part: part.unwrap_or(0),
                summary,
            })))
        }
        Kind::Other => None,
        Kind::Created
        | Kind::ItemAdded
        | Kind::ArgsDone
        | Kind::ItemDone
        | Kind::Completed
        | Kind::Incomplete
        | Kind::Failed => read_parsed(kind, data).map(f),
    }
}

/// [`visit`] as a returned event (tests).
#[cfg(test)]
pub(crate) fn read<'a>(event_type: &str, data: &'a [u8]) -> Option<TurnEvent<'a>> {
    visit(event_type, data, |e| e)
}

/// The events read by one borrowed serde pass.
#[inline(never)]
fn read_parsed(kind: Kind, data: &[u8]) -> Option<TurnEvent<'_>> {
    Some(match kind {
        Kind::Other
        | Kind::TextDelta
        | Kind::RefusalDelta
        | Kind::ArgsDelta
        | Kind::ReasoningSummaryDelta
        | Kind::ReasoningTextDelta => return None,
        Kind::Created => {
            let started = match RawEvent::parse(data).and_then(|e| e.response) {
                Some(r) => Started {
                    created_at: r.created_at(),
                    id: r.id.filter(|s| !s.is_empty()),
                },
                None => Started::default(),
            };
            TurnEvent::Started(started)
        }
        Kind::ItemAdded => {
            let ev = RawEvent::parse(data)?;
            match Item::of(ev.item?)? {
                Item::ToolCall(call) => TurnEvent::ToolCallStart {
                    call,
                    output_index: ev.output_index,
                },
                Item::Message(_) | Item::Reasoning(_) => return None,
            }
        }
        Kind::ArgsDone => {
            let ev = RawEvent::parse(data)?;
            TurnEvent::ToolArgsDone(ArgsDone {
                item_id: ev.item_id,
                output_index: ev.output_index,
                name: ev.name,
                arguments: ev.arguments.or(ev.input),
            })
        }
        Kind::ItemDone => {
            let ev = RawEvent::parse(data)?;
            TurnEvent::ItemDone {
                item: Item::of(ev.item?)?,
                output_index: ev.output_index,
            }
        }
        Kind::Completed | Kind::Incomplete => {
            let response = RawEvent::parse(data).and_then(|e| e.response);
            let stop = if kind == Kind::Completed {
                Stop::Completed
            } else {
                match response
                    .as_ref()
                    .and_then(|r| r.incomplete_details.as_ref())
                    .and_then(|d| d.reason.as_deref())
                {
                    Some("content_filter") => Stop::ContentFilter,
                    _ => Stop::MaxOutputTokens,
                }
            };
            TurnEvent::Finished(Finish { stop, response })
        }
        Kind::Failed => TurnEvent::Failed(Failure {
            usage: RawEvent::parse(data)
                .and_then(|e| e.response)
                .and_then(|r| r.usage()),
            data,
        }),
    })
}

/// A delta token that carries text (`""` is the whole token of an empty one).
fn nonempty(token: Option<&str>) -> Option<&str> {
    token.filter(|t| t.len() > 2)
}

// === impl Delta ===

impl<'a> Delta<'a> {
    fn of(f: &DeltaFields<'a>) -> Self {
        Self {
            token: nonempty(f.delta),
            item_id: f.item_id,
            output_index: f.output_index,
        }
    }
}

// === impl Item ===

impl<'a> Item<'a> {
    /// The neutral view of an output item; `None` for item types no client sees.
    fn of(raw: RawItem<'a>) -> Option<Self> {
        Some(match raw.ty.as_deref()? {
            "message" => Self::Message(Message {
                id: raw.id,
                content: raw.content.unwrap_or_default(),
            }),
            "function_call" | "custom_tool_call" => Self::ToolCall(ToolCall {
                id: raw.id,
                call_id: raw.call_id,
                name: raw.name,
                arguments: raw.arguments.or(raw.input),
            }),
            "reasoning" => Self::Reasoning(Reasoning {
                summary: raw.summary.unwrap_or_default(),
                encrypted_content: raw.encrypted_content,
            }),
            _ => return None,
        })
    }
}

// === impl Message ===

impl Message<'_> {
    /// The text and refusal parts, in order (other parts are left out).
    pub(crate) fn parts(&self) -> impl Iterator<Item = Part<'_>> {
        self.content.iter().filter_map(|p| match p.ty.as_deref() {
            Some("output_text") => Some(Part::Text(p.text.as_deref().unwrap_or(""))),
            Some("refusal") => Some(Part::Refusal(p.refusal.as_deref().unwrap_or(""))),
            _ => None,
        })
    }
}

// === impl Reasoning ===

impl Reasoning<'_> {
    /// The summary parts' text joined by a blank line (empty parts left out).
    pub(crate) fn summary_text(&self) -> String {
        let mut text = String::new();
        for t in self.summary.iter().filter_map(|p| p.text.as_deref()) {
            if t.is_empty() {
                continue;
            }
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(t);
        }
        text
    }
}

// === impl Finish ===

impl Finish<'_> {
    /// `response.usage`, when present.
    pub(crate) fn usage(&self) -> Option<Usage> {
        self.response.as_ref().and_then(RawResponse::usage)
    }

    /// `response.service_tier`: the tier the upstream actually used.
    pub(crate) fn service_tier(&self) -> Option<&str> {
        self.response.as_ref()?.service_tier.as_deref()
    }

    /// The items of `response.output` that a client sees, each with its index in `output`
    /// (parsed on each call; empty when absent, empty or malformed).
    pub(crate) fn output(&self) -> impl Iterator<Item = (u64, Item<'_>)> {
        self.response
            .as_ref()
            .map(RawResponse::output_items)
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .filter_map(|(i, raw)| Some((i as u64, Item::of(raw)?)))
    }
}

// === impl Failure ===

impl Failure<'_> {
    /// The error object as raw JSON, read by [`crate::events::stream_error`] (every failure
    /// shape); `None` when the event carries none.
    pub(crate) fn error_json(&self) -> Option<String> {
        crate::events::stream_error(self.data)
    }
}

#[cfg(test)]
mod tests;
