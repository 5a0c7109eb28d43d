//! Chat Completions request -> Codex Responses upstream body (docs/protocol.md#request).
//!
//! # Key Components
//! - [`chat_to_responses`]: one borrowed serde pass over the client body (strings are not
//!   copied unless they carry escapes; schemas and arguments are copied as raw JSON), then the
//!   upstream body is written directly into one `Vec<u8>`.
//! - [`ChatRequestOptions`]: per-deployment knobs (default `prompt_cache_key`, upstream model
//!   override, the model's reasoning levels for clamping).
//! - [`ChatRequest`]: the upstream body plus what the response side needs.
//!
//! # Error handling
//! Every rejection is a [`ChatError`] with an OpenAI-style message and, where one applies,
//! the offending `param` (`messages[2].content[0].type`, `tool_choice`, ...).

use std::borrow::Cow;

use serde::{
    de::{self, MapAccess, SeqAccess, Visitor},
    Deserialize, Deserializer,
};
use sonic_rs::{JsonContainerTrait, JsonValueTrait, LazyValue};

use crate::{
    effort::clamp_effort,
    json::{write_str, write_string_value},
    tools::{ToolNameMap, MAX_TOOL_NAME_LEN},
};

/// The developer message added for `response_format: json_object` (the upstream, like OpenAI,
/// wants JSON to be mentioned in the conversation).
const JSON_OBJECT_HINT: &str = "Respond with a single valid JSON object.";

/// Knobs for [`chat_to_responses`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatRequestOptions<'a> {
    /// Used as `prompt_cache_key` when the client sent none (e.g. derived per client key).
    pub default_prompt_cache_key: Option<&'a str>,
    /// The model slug to send upstream when it differs from the requested one (aliases).
    /// [`ChatRequest::model`] always stays the client's requested name.
    pub upstream_model: Option<&'a str>,
    /// The model's `supported_reasoning_levels` (catalog); when non-empty, a requested effort
    /// outside it is clamped to the nearest supported level at or below it.
    pub reasoning_levels: &'a [String],
}

/// A translated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatRequest {
    /// The Codex Responses body to send upstream (JSON).
    pub body: Vec<u8>,
    /// The model as the client requested it (echoed in every chunk / completion).
    pub model: String,
    /// Whether the client asked for an SSE stream (`stream:true`).
    pub stream: bool,
    /// `stream_options.include_usage`: send the final usage chunk.
    pub include_usage: bool,
    /// Shortened tool names, to restore on output.
    pub name_map: ToolNameMap,
    /// The `prompt_cache_key` sent upstream (client's or the default), an affinity signal.
    pub prompt_cache_key: Option<String>,
}

/// A client request that cannot be translated; maps to 400 `invalid_request_error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ChatError {
    /// Human message.
    pub message: String,
    /// The offending parameter, when one applies.
    pub param: Option<String>,
}

// === impl ChatError ===

impl ChatError {
    fn new(message: impl Into<String>, param: Option<String>) -> Self {
        Self {
            message: message.into(),
            param,
        }
    }

    fn at(message: impl Into<String>, param: impl Into<String>) -> Self {
        Self::new(message, Some(param.into()))
    }
}

// ---------------------------------------------------------------------------------------------
// Borrowed views of the client body.

#[derive(Deserialize)]
struct RawChat<'a> {
    #[serde(borrow, default)]
    model: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    messages: Option<Vec<RawMessage<'a>>>,
    #[serde(borrow, default)]
    tools: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    tool_choice: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    parallel_tool_calls: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    reasoning_effort: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    reasoning: Option<RawReasoning<'a>>,
    #[serde(borrow, default)]
    response_format: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    verbosity: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    service_tier: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    prompt_cache_key: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    stream: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    stream_options: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    web_search_options: Option<LazyValue<'a>>,
}

#[derive(Deserialize)]
struct RawReasoning<'a> {
    #[serde(borrow, default)]
    effort: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    summary: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<Content<'a>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<RawToolCall<'a>>>,
    #[serde(borrow, default)]
    tool_call_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
}

/// `content`: a string or an array of parts.
enum Content<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<RawPart<'a>>),
}

#[derive(Deserialize)]
struct RawPart<'a> {
    #[serde(borrow, rename = "type", default)]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    image_url: Option<ImageUrlAny<'a>>,
    #[serde(borrow, default)]
    detail: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    file: Option<RawFile<'a>>,
    #[serde(borrow, default)]
    file_data: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    filename: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    file_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input_audio: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
}

/// `image_url`: a string (Responses style) or `{url, detail}` (Chat style).
#[derive(Deserialize)]
struct ImageUrl<'a> {
    #[serde(borrow, default)]
    url: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    detail: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawFile<'a> {
    #[serde(borrow, default)]
    file_data: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    filename: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    file_id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawToolCall<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "type", default)]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<RawCallBody<'a>>,
    #[serde(borrow, default)]
    custom: Option<RawCallBody<'a>>,
}

#[derive(Deserialize)]
struct RawCallBody<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    input: Option<LazyValue<'a>>,
}

#[derive(Deserialize)]
struct RawTool<'a> {
    #[serde(borrow, rename = "type", default)]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<RawToolDef<'a>>,
    #[serde(borrow, default)]
    custom: Option<RawToolDef<'a>>,
    // Responses-style flat definitions are accepted too.
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    description: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    parameters: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    strict: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    format: Option<LazyValue<'a>>,
}

#[derive(Deserialize)]
struct RawToolDef<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    description: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    parameters: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    strict: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    format: Option<LazyValue<'a>>,
}

#[derive(Deserialize)]
struct RawToolChoice<'a> {
    #[serde(borrow, rename = "type", default)]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<RawNamed<'a>>,
    #[serde(borrow, default)]
    custom: Option<RawNamed<'a>>,
}

#[derive(Deserialize)]
struct RawNamed<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawResponseFormat<'a> {
    #[serde(borrow, rename = "type", default)]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    json_schema: Option<RawJsonSchema<'a>>,
}

#[derive(Deserialize)]
struct RawJsonSchema<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    description: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    schema: Option<LazyValue<'a>>,
    #[serde(borrow, default)]
    strict: Option<LazyValue<'a>>,
}

// === impl Content ===

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Content<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or an array of content parts")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(2));
                while let Some(p) = seq.next_element::<RawPart<'a>>()? {
                    parts.push(p);
                }
                Ok(Content::Parts(parts))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

// === impl ImageUrl ===

// `image_url` is either a bare string or an object; the derive above handles the object, this
// wrapper handles both.
struct ImageUrlAny<'a>(ImageUrl<'a>);

impl<'de: 'a, 'a> Deserialize<'de> for ImageUrlAny<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = ImageUrlAny<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a URL string or an object with `url`")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(ImageUrlAny(ImageUrl {
                    url: Some(Cow::Borrowed(v)),
                    detail: None,
                }))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(ImageUrlAny(ImageUrl {
                    url: Some(Cow::Owned(v.to_owned())),
                    detail: None,
                }))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                ImageUrl::deserialize(de::value::MapAccessDeserializer::new(map)).map(ImageUrlAny)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

// ---------------------------------------------------------------------------------------------
// The encoder.

/// Translates a client Chat Completions body into a Codex Responses upstream body.
///
/// # Errors
/// A [`ChatError`] when the body is not a JSON object, `model` or `messages` is missing or
/// malformed, a message has no valid role, a content part or tool is malformed, or an option
/// has the wrong type.
pub fn chat_to_responses(
    body: &[u8],
    opts: &ChatRequestOptions<'_>,
) -> Result<ChatRequest, ChatError> {
    // sonic-rs checks the input's UTF-8 only after deserializing, and its lazy values make
    // `&str`s of the raw bytes before that (a debug assertion inside sonic-rs fires on
    // invalid UTF-8; found by the fuzz target `chat`): check first.
    if std::str::from_utf8(body).is_err() {
        return Err(ChatError::new(NOT_JSON, None));
    }
    let raw: RawChat<'_> = sonic_rs::from_slice(body).map_err(|e| diagnose(body, &e))?;

    let model = match &raw.model {
        None => {
            return Err(ChatError::at(
                "Missing required parameter: 'model'.",
                "model",
            ))
        }
        Some(m) => match m.as_str() {
            Some(s) if !s.is_empty() => s.to_owned(),
            _ => {
                return Err(ChatError::at(
                    "'model' must be a non-empty string.",
                    "model",
                ))
            }
        },
    };
    let messages = match raw.messages.as_deref() {
        None => {
            return Err(ChatError::at(
                "Missing required parameter: 'messages'.",
                "messages",
            ))
        }
        Some([]) => {
            return Err(ChatError::at(
                "'messages' must contain at least one message.",
                "messages",
            ))
        }
        Some(m) => m,
    };
    let stream = opt_bool(raw.stream.as_ref(), "stream")?.unwrap_or(false);
    let include_usage = match &raw.stream_options {
        None => false,
        Some(so) if so.is_object() => opt_bool(
            so.get("include_usage").as_ref(),
            "stream_options.include_usage",
        )?
        .unwrap_or(false),
        Some(_) => {
            return Err(ChatError::at(
                "'stream_options' must be an object.",
                "stream_options",
            ))
        }
    };

    let mut out = Vec::with_capacity(body.len() + 256);
    out.extend_from_slice(b"{\"model\":");
    write_str(&mut out, opts.upstream_model.unwrap_or(&model));
    out.extend_from_slice(b",\"instructions\":\"\"");

    // Tools first: they fix the shortened names that tool_choice and history reuse.
    let mut names = ToolNameMap::new();
    let tool_values = collect_tools(raw.tools.as_ref())?;
    let tools = tool_values
        .iter()
        .enumerate()
        .map(|(i, lv)| {
            if !lv.is_object() {
                return Err(ChatError::at(
                    "Each tool must be an object.",
                    format!("tools[{i}]"),
                ));
            }
            sonic_rs::from_str::<RawTool<'_>>(lv.as_raw_str())
                .map_err(|e| ChatError::at(format!("Invalid tool: {e}"), format!("tools[{i}]")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let reserved: Vec<&str> = tools
        .iter()
        .filter_map(|t| tool_def_name(t))
        .filter(|n| n.len() <= MAX_TOOL_NAME_LEN)
        .collect();
    let web_search_options = raw.web_search_options.as_ref().filter(|w| w.is_object());
    if !tools.is_empty() || web_search_options.is_some() {
        out.extend_from_slice(b",\"tools\":[");
        let mut first = true;
        for (i, (tool, lv)) in tools.iter().zip(tool_values.iter()).enumerate() {
            sep(&mut out, &mut first);
            write_tool(&mut out, tool, lv, i, &mut names, &reserved)?;
        }
        if let Some(ws) = web_search_options {
            sep(&mut out, &mut first);
            out.extend_from_slice(b"{\"type\":\"web_search\"");
            if let Some(size) = ws.get("search_context_size").filter(|s| s.is_str()) {
                out.extend_from_slice(b",\"search_context_size\":");
                out.extend_from_slice(size.as_raw_str().as_bytes());
            }
            out.push(b'}');
        }
        out.push(b']');
    }

    if let Some(tc) = &raw.tool_choice {
        out.extend_from_slice(b",\"tool_choice\":");
        write_tool_choice(&mut out, tc, &mut names, &reserved)?;
    }
    if let Some(p) = opt_bool(raw.parallel_tool_calls.as_ref(), "parallel_tool_calls")? {
        out.extend_from_slice(if p {
            b",\"parallel_tool_calls\":true"
        } else {
            b",\"parallel_tool_calls\":false"
        });
    }

    // text.format (also decides the json_object hint message).
    let mut text_format: Vec<u8> = Vec::new();
    let mut json_hint = false;
    if let Some(rf) = &raw.response_format {
        json_hint = write_response_format(&mut text_format, rf)?;
    }

    out.extend_from_slice(b",\"input\":[");
    let mut first = true;
    if json_hint {
        sep(&mut out, &mut first);
        write_text_message(&mut out, "developer", "input_text", JSON_OBJECT_HINT);
    }
    let mut deferred_images: Vec<&ImageUrl<'_>> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.role.as_deref().ok_or_else(|| {
            ChatError::at(
                "Each message needs a 'role'.",
                format!("messages[{i}].role"),
            )
        })?;
        if role != "tool" && !deferred_images.is_empty() {
            write_image_message(&mut out, &mut first, &deferred_images);
            deferred_images.clear();
        }
        match role {
            "system" | "developer" => write_system(&mut out, &mut first, m, i)?,
            "user" => write_user(&mut out, &mut first, m, i)?,
            "assistant" => write_assistant(&mut out, &mut first, m, i, &mut names, &reserved)?,
            "tool" => write_tool_output(&mut out, &mut first, m, i, &mut deferred_images)?,
            "function" => {
                return Err(ChatError::at(
                    "The deprecated 'function' role is not supported; use 'tool' messages with 'tool_call_id'.",
                    format!("messages[{i}].role"),
                ))
            }
            other => {
                return Err(ChatError::at(
                    format!(
                        "Invalid role '{other}': expected one of 'system', 'developer', 'user', 'assistant', 'tool'."
                    ),
                    format!("messages[{i}].role"),
                ))
            }
        }
    }
    if !deferred_images.is_empty() {
        write_image_message(&mut out, &mut first, &deferred_images);
    }
    out.push(b']');

    // reasoning: always ask for summaries, or no reasoning deltas are streamed.
    let (effort, summary) = reasoning_of(&raw)?;
    out.extend_from_slice(b",\"reasoning\":{");
    if let Some(effort) = effort {
        out.extend_from_slice(b"\"effort\":");
        write_str(&mut out, clamp_effort(effort, opts.reasoning_levels));
        out.push(b',');
    }
    out.extend_from_slice(b"\"summary\":");
    write_str(&mut out, summary.unwrap_or("auto"));
    out.push(b'}');

    let verbosity = match &raw.verbosity {
        None => None,
        Some(v) => Some(
            v.as_str()
                .ok_or_else(|| ChatError::at("'verbosity' must be a string.", "verbosity"))?,
        ),
    };
    if !text_format.is_empty() || verbosity.is_some() {
        out.extend_from_slice(b",\"text\":{");
        if !text_format.is_empty() {
            out.extend_from_slice(b"\"format\":");
            out.extend_from_slice(&text_format);
        }
        if let Some(v) = verbosity {
            if !text_format.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(b"\"verbosity\":");
            write_str(&mut out, v);
        }
        out.push(b'}');
    }

    if raw
        .service_tier
        .as_ref()
        .and_then(|t| t.as_str())
        .is_some_and(|t| t == "priority" || t == "fast")
    {
        out.extend_from_slice(b",\"service_tier\":\"priority\"");
    }

    let prompt_cache_key = match &raw.prompt_cache_key {
        Some(k) => Some(
            k.as_str()
                .ok_or_else(|| {
                    ChatError::at("'prompt_cache_key' must be a string.", "prompt_cache_key")
                })?
                .to_owned(),
        ),
        None => opts.default_prompt_cache_key.map(str::to_owned),
    };
    if let Some(k) = &prompt_cache_key {
        out.extend_from_slice(b",\"prompt_cache_key\":");
        write_str(&mut out, k);
    }

    out.extend_from_slice(
        b",\"store\":false,\"stream\":true,\"include\":[\"reasoning.encrypted_content\"]}",
    );

    Ok(ChatRequest {
        body: out,
        model,
        stream,
        include_usage,
        name_map: names,
        prompt_cache_key,
    })
}

fn sep(out: &mut Vec<u8>, first: &mut bool) {
    if *first {
        *first = false;
    } else {
        out.push(b',');
    }
}

fn opt_bool(v: Option<&LazyValue<'_>>, param: &str) -> Result<Option<bool>, ChatError> {
    match v {
        None => Ok(None),
        Some(v) if v.is_null() => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| ChatError::at(format!("'{param}' must be a boolean."), param)),
    }
}

fn collect_tools<'a>(tools: Option<&LazyValue<'a>>) -> Result<Vec<LazyValue<'a>>, ChatError> {
    let Some(tools) = tools else {
        return Ok(Vec::new());
    };
    if !tools.is_array() {
        return Err(ChatError::at("'tools' must be an array.", "tools"));
    }
    let Some(iter) = tools.clone().into_array_iter() else {
        return Err(ChatError::at("'tools' must be an array.", "tools"));
    };
    iter.map(|t| t.map_err(|e| ChatError::at(format!("Invalid 'tools': {e}"), "tools")))
        .collect()
}

/// The name a tool definition declares (function or custom).
fn tool_def_name<'t>(t: &'t RawTool<'_>) -> Option<&'t str> {
    t.function
        .as_ref()
        .and_then(|f| f.name.as_deref())
        .or_else(|| t.custom.as_ref().and_then(|c| c.name.as_deref()))
        .or(t.name.as_deref())
}

fn write_opt_raw(out: &mut Vec<u8>, key: &[u8], v: Option<&LazyValue<'_>>) {
    if let Some(v) = v.filter(|v| !v.is_null()) {
        out.extend_from_slice(key);
        out.extend_from_slice(v.as_raw_str().as_bytes());
    }
}

fn write_tool(
    out: &mut Vec<u8>,
    tool: &RawTool<'_>,
    raw: &LazyValue<'_>,
    i: usize,
    names: &mut ToolNameMap,
    reserved: &[&str],
) -> Result<(), ChatError> {
    let ty = tool
        .ty
        .as_deref()
        .ok_or_else(|| ChatError::at("Each tool needs a 'type'.", format!("tools[{i}].type")))?;
    match ty {
        "function" => {
            let (name, description, parameters, strict) = match &tool.function {
                Some(f) => (
                    f.name.as_deref(),
                    f.description.as_ref(),
                    f.parameters.as_ref(),
                    f.strict.as_ref(),
                ),
                None => (
                    tool.name.as_deref(),
                    tool.description.as_ref(),
                    tool.parameters.as_ref(),
                    tool.strict.as_ref(),
                ),
            };
            let name = name.filter(|n| !n.is_empty()).ok_or_else(|| {
                ChatError::at(
                    "A function tool needs a non-empty 'function.name'.",
                    format!("tools[{i}].function.name"),
                )
            })?;
            out.extend_from_slice(b"{\"type\":\"function\",\"name\":");
            write_str(out, names.upstream_name(name, reserved));
            write_opt_raw(out, b",\"description\":", description);
            match parameters.filter(|p| !p.is_null()) {
                Some(p) => {
                    out.extend_from_slice(b",\"parameters\":");
                    out.extend_from_slice(p.as_raw_str().as_bytes());
                }
                None => out
                    .extend_from_slice(b",\"parameters\":{\"type\":\"object\",\"properties\":{}}"),
            }
            write_opt_raw(out, b",\"strict\":", strict);
            out.push(b'}');
        }
        "custom" => {
            let (name, description, format) = match &tool.custom {
                Some(c) => (c.name.as_deref(), c.description.as_ref(), c.format.as_ref()),
                None => (
                    tool.name.as_deref(),
                    tool.description.as_ref(),
                    tool.format.as_ref(),
                ),
            };
            let name = name.filter(|n| !n.is_empty()).ok_or_else(|| {
                ChatError::at(
                    "A custom tool needs a non-empty 'custom.name'.",
                    format!("tools[{i}].custom.name"),
                )
            })?;
            out.extend_from_slice(b"{\"type\":\"custom\",\"name\":");
            write_str(out, names.upstream_name(name, reserved));
            write_opt_raw(out, b",\"description\":", description);
            write_opt_raw(out, b",\"format\":", format);
            out.push(b'}');
        }
        t if t.starts_with("web_search") => {
            // Keep the options, normalize the type.
            out.extend_from_slice(b"{\"type\":\"web_search\"");
            if let Some(iter) = raw.clone().into_object_iter() {
                for kv in iter {
                    let (k, v) = kv.map_err(|e| {
                        ChatError::at(format!("Invalid tool: {e}"), format!("tools[{i}]"))
                    })?;
                    let k: &str = &k;
                    if k == "type" {
                        continue;
                    }
                    out.push(b',');
                    write_str(out, k);
                    out.push(b':');
                    out.extend_from_slice(v.as_raw_str().as_bytes());
                }
            }
            out.push(b'}');
        }
        _ => out.extend_from_slice(raw.as_raw_str().as_bytes()),
    }
    Ok(())
}

fn write_tool_choice(
    out: &mut Vec<u8>,
    tc: &LazyValue<'_>,
    names: &mut ToolNameMap,
    reserved: &[&str],
) -> Result<(), ChatError> {
    if let Some(s) = tc.as_str() {
        return match s {
            "auto" | "none" | "required" => {
                write_str(out, s);
                Ok(())
            }
            other => Err(ChatError::at(
                format!("Invalid 'tool_choice' '{other}': expected 'auto', 'none', 'required' or an object."),
                "tool_choice",
            )),
        };
    }
    if !tc.is_object() {
        return Err(ChatError::at(
            "'tool_choice' must be a string or an object.",
            "tool_choice",
        ));
    }
    let choice: RawToolChoice<'_> = sonic_rs::from_str(tc.as_raw_str())
        .map_err(|e| ChatError::at(format!("Invalid 'tool_choice': {e}"), "tool_choice"))?;
    let (ty, named) = match choice.ty.as_deref() {
        Some("function") => ("function", choice.function.as_ref()),
        Some("custom") => ("custom", choice.custom.as_ref()),
        Some(_) => {
            // allowed_tools, web_search, ... pass through.
            out.extend_from_slice(tc.as_raw_str().as_bytes());
            return Ok(());
        }
        None => {
            return Err(ChatError::at(
                "'tool_choice' needs a 'type'.",
                "tool_choice.type",
            ))
        }
    };
    let name = named
        .and_then(|n| n.name.as_deref())
        .or(choice.name.as_deref())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ChatError::at(
                format!("'tool_choice' of type '{ty}' needs '{ty}.name'."),
                format!("tool_choice.{ty}.name"),
            )
        })?;
    out.extend_from_slice(b"{\"type\":");
    write_str(out, ty);
    out.extend_from_slice(b",\"name\":");
    write_str(out, names.upstream_name(name, reserved));
    out.push(b'}');
    Ok(())
}

/// Writes the `text.format` object into `out` (left empty for `text`); returns whether the
/// json_object hint message is needed.
fn write_response_format(out: &mut Vec<u8>, rf: &LazyValue<'_>) -> Result<bool, ChatError> {
    if !rf.is_object() {
        return Err(ChatError::at(
            "'response_format' must be an object.",
            "response_format",
        ));
    }
    let f: RawResponseFormat<'_> = sonic_rs::from_str(rf.as_raw_str())
        .map_err(|e| ChatError::at(format!("Invalid 'response_format': {e}"), "response_format"))?;
    match f.ty.as_deref() {
        Some("text") => Ok(false),
        Some("json_object") => {
            out.extend_from_slice(b"{\"type\":\"json_object\"}");
            Ok(true)
        }
        Some("json_schema") => {
            let js = f.json_schema.as_ref().ok_or_else(|| {
                ChatError::at(
                    "'response_format' of type 'json_schema' needs 'json_schema'.",
                    "response_format.json_schema",
                )
            })?;
            let schema = js.schema.as_ref().filter(|s| s.is_object()).ok_or_else(|| {
                ChatError::at(
                    "'response_format.json_schema.schema' must be an object.",
                    "response_format.json_schema.schema",
                )
            })?;
            out.extend_from_slice(b"{\"type\":\"json_schema\",\"name\":");
            write_str(out, js.name.as_deref().unwrap_or("response"));
            write_opt_raw(out, b",\"description\":", js.description.as_ref());
            write_opt_raw(out, b",\"strict\":", js.strict.as_ref());
            out.extend_from_slice(b",\"schema\":");
            out.extend_from_slice(schema.as_raw_str().as_bytes());
            out.push(b'}');
            Ok(false)
        }
        Some(other) => Err(ChatError::at(
            format!("Invalid 'response_format.type' '{other}': expected 'text', 'json_object' or 'json_schema'."),
            "response_format.type",
        )),
        None => Err(ChatError::at(
            "'response_format' needs a 'type'.",
            "response_format.type",
        )),
    }
}

/// `(effort, summary)` from `reasoning_effort`, else the `reasoning` object.
fn reasoning_of<'r>(raw: &'r RawChat<'_>) -> Result<(Option<&'r str>, Option<&'r str>), ChatError> {
    let obj = raw.reasoning.as_ref();
    let effort = match &raw.reasoning_effort {
        Some(e) => Some(e.as_str().ok_or_else(|| {
            ChatError::at("'reasoning_effort' must be a string.", "reasoning_effort")
        })?),
        None => obj.and_then(|r| r.effort.as_deref()),
    };
    let summary = obj
        .and_then(|r| r.summary.as_deref())
        .filter(|s| matches!(*s, "auto" | "concise" | "detailed"));
    Ok((effort, summary))
}

fn write_text_message(out: &mut Vec<u8>, role: &str, part_type: &str, text: &str) {
    out.extend_from_slice(b"{\"type\":\"message\",\"role\":");
    write_str(out, role);
    out.extend_from_slice(b",\"content\":[{\"type\":");
    write_str(out, part_type);
    out.extend_from_slice(b",\"text\":");
    write_str(out, text);
    out.extend_from_slice(b"}]}");
}

fn part_type<'p>(p: &'p RawPart<'_>, i: usize, j: usize) -> Result<&'p str, ChatError> {
    p.ty.as_deref().ok_or_else(|| {
        ChatError::at(
            "Each content part needs a 'type'.",
            format!("messages[{i}].content[{j}].type"),
        )
    })
}

fn part_text<'p>(p: &'p RawPart<'_>, i: usize, j: usize) -> Result<&'p str, ChatError> {
    p.text.as_deref().ok_or_else(|| {
        ChatError::at(
            "A text content part needs 'text'.",
            format!("messages[{i}].content[{j}].text"),
        )
    })
}

fn write_system(
    out: &mut Vec<u8>,
    first: &mut bool,
    m: &RawMessage<'_>,
    i: usize,
) -> Result<(), ChatError> {
    match &m.content {
        None => Ok(()),
        Some(Content::Text(t)) => {
            if !t.is_empty() {
                sep(out, first);
                write_text_message(out, "developer", "input_text", t);
            }
            Ok(())
        }
        Some(Content::Parts(parts)) => {
            let mut opened = false;
            for (j, p) in parts.iter().enumerate() {
                match part_type(p, i, j)? {
                    "text" | "input_text" => {
                        let t = part_text(p, i, j)?;
                        if !opened {
                            sep(out, first);
                            out.extend_from_slice(
                                b"{\"type\":\"message\",\"role\":\"developer\",\"content\":[",
                            );
                            opened = true;
                        } else {
                            out.push(b',');
                        }
                        out.extend_from_slice(b"{\"type\":\"input_text\",\"text\":");
                        write_str(out, t);
                        out.push(b'}');
                    }
                    other => {
                        return Err(ChatError::at(
                            format!("Content part type '{other}' is not supported in system/developer messages."),
                            format!("messages[{i}].content[{j}].type"),
                        ))
                    }
                }
            }
            if opened {
                out.extend_from_slice(b"]}");
            }
            Ok(())
        }
    }
}

fn write_image_part(out: &mut Vec<u8>, url: &str, detail: Option<&str>) {
    out.extend_from_slice(b"{\"type\":\"input_image\",\"image_url\":");
    write_str(out, url);
    if let Some(d) = detail {
        out.extend_from_slice(b",\"detail\":");
        write_str(out, d);
    }
    out.push(b'}');
}

fn write_user(
    out: &mut Vec<u8>,
    first: &mut bool,
    m: &RawMessage<'_>,
    i: usize,
) -> Result<(), ChatError> {
    match &m.content {
        None => Err(ChatError::at(
            "A user message needs 'content'.",
            format!("messages[{i}].content"),
        )),
        Some(Content::Text(t)) => {
            sep(out, first);
            write_text_message(out, "user", "input_text", t);
            Ok(())
        }
        Some(Content::Parts(parts)) => {
            sep(out, first);
            out.extend_from_slice(b"{\"type\":\"message\",\"role\":\"user\",\"content\":[");
            for (j, p) in parts.iter().enumerate() {
                if j > 0 {
                    out.push(b',');
                }
                match part_type(p, i, j)? {
                    "text" | "input_text" => {
                        out.extend_from_slice(b"{\"type\":\"input_text\",\"text\":");
                        write_str(out, part_text(p, i, j)?);
                        out.push(b'}');
                    }
                    "image_url" | "input_image" => {
                        let img = p.image_url.as_ref().map(|u| &u.0);
                        let url = img.and_then(|u| u.url.as_deref()).ok_or_else(|| {
                            ChatError::at(
                                "An image content part needs 'image_url.url'.",
                                format!("messages[{i}].content[{j}].image_url"),
                            )
                        })?;
                        let detail = img
                            .and_then(|u| u.detail.as_deref())
                            .or(p.detail.as_deref());
                        write_image_part(out, url, detail);
                    }
                    "file" | "input_file" => {
                        let f = p.file.as_ref();
                        let data = f
                            .and_then(|f| f.file_data.as_deref())
                            .or(p.file_data.as_deref());
                        let name = f
                            .and_then(|f| f.filename.as_deref())
                            .or(p.filename.as_deref());
                        let id = f
                            .and_then(|f| f.file_id.as_deref())
                            .or(p.file_id.as_deref());
                        if data.is_none() && id.is_none() {
                            return Err(ChatError::at(
                                "A file content part needs 'file.file_data' or 'file.file_id'.",
                                format!("messages[{i}].content[{j}].file"),
                            ));
                        }
                        out.extend_from_slice(b"{\"type\":\"input_file\"");
                        for (k, v) in [
                            (&b",\"file_data\":"[..], data),
                            (&b",\"filename\":"[..], name),
                            (&b",\"file_id\":"[..], id),
                        ] {
                            if let Some(v) = v {
                                out.extend_from_slice(k);
                                write_str(out, v);
                            }
                        }
                        out.push(b'}');
                    }
                    "input_audio" => {
                        let a = p
                            .input_audio
                            .as_ref()
                            .filter(|a| a.is_object())
                            .ok_or_else(|| {
                                ChatError::at(
                                    "An audio content part needs an 'input_audio' object.",
                                    format!("messages[{i}].content[{j}].input_audio"),
                                )
                            })?;
                        out.extend_from_slice(b"{\"type\":\"input_audio\",\"input_audio\":");
                        out.extend_from_slice(a.as_raw_str().as_bytes());
                        out.push(b'}');
                    }
                    other => {
                        return Err(ChatError::at(
                            format!("Unsupported content part type '{other}'."),
                            format!("messages[{i}].content[{j}].type"),
                        ))
                    }
                }
            }
            out.extend_from_slice(b"]}");
            Ok(())
        }
    }
}

fn write_assistant(
    out: &mut Vec<u8>,
    first: &mut bool,
    m: &RawMessage<'_>,
    i: usize,
    names: &mut ToolNameMap,
    reserved: &[&str],
) -> Result<(), ChatError> {
    // Text (and refusal) parts -> one assistant message; empty -> skipped.
    let mut opened = false;
    let mut open = |out: &mut Vec<u8>| {
        if opened {
            out.push(b',');
        } else {
            sep(out, first);
            out.extend_from_slice(b"{\"type\":\"message\",\"role\":\"assistant\",\"content\":[");
            opened = true;
        }
    };
    match &m.content {
        None => {}
        Some(Content::Text(t)) if t.is_empty() => {}
        Some(Content::Text(t)) => {
            open(out);
            out.extend_from_slice(b"{\"type\":\"output_text\",\"text\":");
            write_str(out, t);
            out.push(b'}');
        }
        Some(Content::Parts(parts)) => {
            for (j, p) in parts.iter().enumerate() {
                match part_type(p, i, j)? {
                    "text" | "output_text" | "input_text" => {
                        let t = part_text(p, i, j)?;
                        if !t.is_empty() {
                            open(out);
                            out.extend_from_slice(b"{\"type\":\"output_text\",\"text\":");
                            write_str(out, t);
                            out.push(b'}');
                        }
                    }
                    "refusal" => {
                        if let Some(r) = p.refusal.as_deref().filter(|r| !r.is_empty()) {
                            open(out);
                            out.extend_from_slice(b"{\"type\":\"refusal\",\"refusal\":");
                            write_str(out, r);
                            out.push(b'}');
                        }
                    }
                    // Other assistant parts (audio, echoed thinking) carry nothing replayable.
                    _ => {}
                }
            }
        }
    }
    if let Some(r) = m.refusal.as_deref().filter(|r| !r.is_empty()) {
        open(out);
        out.extend_from_slice(b"{\"type\":\"refusal\",\"refusal\":");
        write_str(out, r);
        out.push(b'}');
    }
    if opened {
        out.extend_from_slice(b"]}");
    }

    for (j, call) in m.tool_calls.iter().flatten().enumerate() {
        let id = call
            .id
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                ChatError::at(
                    "Each tool call needs an 'id'.",
                    format!("messages[{i}].tool_calls[{j}].id"),
                )
            })?;
        let custom = call.ty.as_deref() == Some("custom");
        let body = if custom { &call.custom } else { &call.function };
        let key = if custom { "custom" } else { "function" };
        let body = body.as_ref().ok_or_else(|| {
            ChatError::at(
                format!("A tool call needs '{key}'."),
                format!("messages[{i}].tool_calls[{j}].{key}"),
            )
        })?;
        let name = body
            .name
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                ChatError::at(
                    format!("A tool call needs '{key}.name'."),
                    format!("messages[{i}].tool_calls[{j}].{key}.name"),
                )
            })?;
        sep(out, first);
        if custom {
            out.extend_from_slice(b"{\"type\":\"custom_tool_call\",\"call_id\":");
        } else {
            out.extend_from_slice(b"{\"type\":\"function_call\",\"call_id\":");
        }
        write_str(out, id);
        out.extend_from_slice(b",\"name\":");
        write_str(out, names.upstream_name(name, reserved));
        if custom {
            out.extend_from_slice(b",\"input\":");
            match body.input.as_ref() {
                Some(v) => write_string_value(out, v),
                None => out.extend_from_slice(b"\"\""),
            }
        } else {
            out.extend_from_slice(b",\"arguments\":");
            match body.arguments.as_ref() {
                Some(v) => write_string_value(out, v),
                None => out.extend_from_slice(b"\"{}\""),
            }
        }
        out.push(b'}');
    }
    Ok(())
}

fn write_tool_output<'m>(
    out: &mut Vec<u8>,
    first: &mut bool,
    m: &'m RawMessage<'_>,
    i: usize,
    deferred_images: &mut Vec<&'m ImageUrl<'m>>,
) -> Result<(), ChatError> {
    let call_id = m
        .tool_call_id
        .as_deref()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            ChatError::at(
                "A tool message needs 'tool_call_id'.",
                format!("messages[{i}].tool_call_id"),
            )
        })?;
    sep(out, first);
    out.extend_from_slice(b"{\"type\":\"function_call_output\",\"call_id\":");
    write_str(out, call_id);
    out.extend_from_slice(b",\"output\":");
    match &m.content {
        None => out.extend_from_slice(b"\"\""),
        Some(Content::Text(t)) => write_str(out, t),
        Some(Content::Parts(parts)) => {
            let mut joined = String::new();
            for p in parts {
                match p.ty.as_deref() {
                    Some("image_url" | "input_image") => {
                        if let Some(img) = p
                            .image_url
                            .as_ref()
                            .map(|u| &u.0)
                            .filter(|u| u.url.is_some())
                        {
                            deferred_images.push(img);
                        }
                    }
                    _ => {
                        if let Some(t) = p.text.as_deref() {
                            if !joined.is_empty() {
                                joined.push('\n');
                            }
                            joined.push_str(t);
                        }
                    }
                }
            }
            write_str(out, &joined);
        }
    }
    out.push(b'}');
    Ok(())
}

/// Images returned by tools go into one synthetic user message after the tool outputs.
fn write_image_message(out: &mut Vec<u8>, first: &mut bool, images: &[&ImageUrl<'_>]) {
    sep(out, first);
    out.extend_from_slice(b"{\"type\":\"message\",\"role\":\"user\",\"content\":[");
    let mut inner_first = true;
    for img in images {
        if let Some(url) = img.url.as_deref() {
            sep(out, &mut inner_first);
            write_image_part(out, url, img.detail.as_deref());
        }
    }
    out.extend_from_slice(b"]}");
}

/// Turns a serde failure into the most specific error we can find (error path only).
/// The message for a body that is not JSON at all.
const NOT_JSON: &str =
    "We could not parse the JSON body of your request. The OpenAI API expects a JSON payload.";

fn diagnose(body: &[u8], e: &sonic_rs::Error) -> ChatError {
    let v: sonic_rs::Value = match sonic_rs::from_slice(body) {
        Ok(v) => v,
        Err(_) => return ChatError::new(NOT_JSON, None),
    };
    let Some(obj) = v.as_object() else {
        return ChatError::new("The request body must be a JSON object.", None);
    };
    if let Some(msgs) = obj.get(&"messages").filter(|m| !m.is_null()) {
        let Some(arr) = msgs.as_array() else {
            return ChatError::at("'messages' must be an array of messages.", "messages");
        };
        for (i, m) in arr.iter().enumerate() {
            let Some(mo) = m.as_object() else {
                return ChatError::at("Each message must be an object.", format!("messages[{i}]"));
            };
            if mo.get(&"role").is_some_and(|r| !r.is_null() && !r.is_str()) {
                return ChatError::at("'role' must be a string.", format!("messages[{i}].role"));
            }
            if let Some(c) = mo.get(&"content").filter(|c| !c.is_null()) {
                if let Some(parts) = c.as_array() {
                    for (j, p) in parts.iter().enumerate() {
                        if !p.is_object() {
                            return ChatError::at(
                                "Each content part must be an object.",
                                format!("messages[{i}].content[{j}]"),
                            );
                        }
                    }
                } else if !c.is_str() {
                    return ChatError::at(
                        "'content' must be a string or an array of content parts.",
                        format!("messages[{i}].content"),
                    );
                }
            }
            if let Some(tc) = mo.get(&"tool_calls").filter(|t| !t.is_null()) {
                if !tc.is_array() {
                    return ChatError::at(
                        "'tool_calls' must be an array.",
                        format!("messages[{i}].tool_calls"),
                    );
                }
            }
            if mo
                .get(&"tool_call_id")
                .is_some_and(|t| !t.is_null() && !t.is_str())
            {
                return ChatError::at(
                    "'tool_call_id' must be a string.",
                    format!("messages[{i}].tool_call_id"),
                );
            }
        }
        return ChatError::at(format!("Invalid 'messages': {e}"), "messages");
    }
    ChatError::new(format!("Invalid request body: {e}"), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the fuzz target `chat` (tests/fuzz): invalid UTF-8 inside a string panicked
    /// inside sonic-rs (a debug assertion; unchecked `&str`s in release) instead of a 400.
    #[test]
    fn invalid_utf8_is_a_clean_error() {
        let body =
            b"{\"model\":\"\xe3\xe3\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}";
        let e = chat_to_responses(body, &ChatRequestOptions::default()).unwrap_err();
        assert_eq!(e.message, NOT_JSON);
    }
}
