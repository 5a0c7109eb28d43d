//! Borrowed serde views of the upstream Responses events: the one place their JSON shape is
//! spelled out. [`super::visit`] turns them into the neutral [`super::TurnEvent`]s.
//!
//! # Key Components
//! - [`RawEvent`]: one borrowed serde pass over an event's data; strings without escapes are
//!   not copied, argument values stay raw JSON so they can be copied into output as they are.
//! - [`RawItem`] / [`RawPart`] / [`RawResponse`]: output items, their parts, and the
//!   `response` object of lifecycle and terminal events.
//!
//! # Error handling
//! [`RawEvent::parse`] returns `None` for malformed data; the reader skips such events, except
//! terminal ones, which still terminate with defaults.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use sonic_rs::{JsonValueTrait, LazyValue};

use crate::events::Usage;

/// One upstream event, borrowed from its data (delta events go through
/// [`super::scan::scan_delta`] instead).
#[derive(Debug, Deserialize, Default)]
pub(crate) struct RawEvent<'a> {
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub item_id: Option<Cow<'a, str>>,
    #[serde(default)]
    pub output_index: Option<u64>,
    #[serde(borrow, default)]
    pub item: Option<RawItem<'a>>,
    #[serde(borrow, default)]
    pub response: Option<RawResponse<'a>>,
    /// `function_call_arguments.done`
    #[serde(borrow, default)]
    pub arguments: Option<LazyValue<'a>>,
    /// `custom_tool_call_input.done`
    #[serde(borrow, default)]
    pub input: Option<LazyValue<'a>>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub name: Option<Cow<'a, str>>,
}

/// An output item (`output_item.added/.done`, `response.output[]`).
#[derive(Debug, Deserialize, Default)]
pub(crate) struct RawItem<'a> {
    #[serde(borrow, rename = "type", default, deserialize_with = "opt_cow")]
    pub ty: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub call_id: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub arguments: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    pub input: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    pub content: Option<Vec<RawPart<'a>>>,
    #[serde(borrow, default)]
    pub summary: Option<Vec<RawPart<'a>>>,
    /// A reasoning item's `encrypted_content` (Anthropic thinking signatures).
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub encrypted_content: Option<Cow<'a, str>>,
}

/// A content / summary part of an item.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct RawPart<'a> {
    #[serde(borrow, rename = "type", default, deserialize_with = "opt_cow")]
    pub ty: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub text: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub refusal: Option<Cow<'a, str>>,
}

/// `response` of lifecycle / terminal events.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct RawResponse<'a> {
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub created_at: Option<LazyValue<'a>>,
    #[serde(default)]
    pub usage: Option<RawUsage>,
    #[serde(borrow, default)]
    pub incomplete_details: Option<RawIncomplete<'a>>,
    /// Parsed only when needed (it can be large, and may be empty).
    #[serde(borrow, default)]
    pub output: Option<LazyValue<'a>>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub service_tier: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize, Default)]
pub(crate) struct RawIncomplete<'a> {
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub reason: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize, Default)]
pub(crate) struct RawUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    input_tokens_details: Option<RawInputDetails>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    output_tokens_details: Option<RawOutputDetails>,
    #[serde(default)]
    total_tokens: Option<u64>,
}

#[derive(Debug, Deserialize, Default)]
struct RawInputDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Debug, Deserialize, Default)]
struct RawOutputDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

/// An optional string borrowed from the data when it has no escapes. (A plain
/// `Option<Cow<str>>` field is always copied: serde borrows only a bare `Cow` field.)
fn opt_cow<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Option::<Borrowed<'de>>::deserialize(d)?.map(|b| b.0))
}

// === impl RawEvent ===

impl<'a> RawEvent<'a> {
    /// Parses an event's data; `None` when it is not a JSON object of the expected shape, or
    /// nests deeper than a recursive reader may go ([`crate::depth`]).
    pub(crate) fn parse(data: &'a [u8]) -> Option<Self> {
        if !crate::depth::check(data) {
            return None;
        }
        sonic_rs::from_slice(data).ok()
    }
}

// === impl RawResponse ===

impl RawResponse<'_> {
    /// `created_at` as unix seconds (integers, or floats truncated).
    pub(crate) fn created_at(&self) -> Option<u64> {
        let v = self.created_at.as_ref()?;
        v.as_u64().or_else(|| v.as_f64().map(|f| f as u64))
    }

    /// The usage, when present.
    pub(crate) fn usage(&self) -> Option<Usage> {
        self.usage.as_ref().map(RawUsage::to_usage)
    }

    /// The parsed `output` items; empty when absent, empty or malformed.
    pub(crate) fn output_items(&self) -> Vec<RawItem<'_>> {
        match &self.output {
            Some(o) if o.is_array() => sonic_rs::from_str(o.as_raw_str()).unwrap_or_default(),
            _ => Vec::new(),
        }
    }
}

// === impl RawUsage ===

impl RawUsage {
    fn to_usage(&self) -> Usage {
        let input_tokens = self.input_tokens.unwrap_or(0);
        let output_tokens = self.output_tokens.unwrap_or(0);
        Usage {
            input_tokens,
            cached_tokens: self
                .input_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            output_tokens,
            reasoning_tokens: self
                .output_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
            total_tokens: self
                .total_tokens
                .filter(|t| *t > 0)
                .unwrap_or(input_tokens + output_tokens),
        }
    }
}
