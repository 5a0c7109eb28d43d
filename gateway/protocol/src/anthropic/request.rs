//! Anthropic Messages request -> Codex Responses upstream body.
//!
//! # Key Components
//! - [`messages_to_responses`]: one DOM pass over the client body; the upstream body is built
//!   as a value and serialised once.
//! - [`MessagesRequestOptions`]: the resolved upstream model, its reasoning levels (clamping),
//!   an alias-forced effort and the `prompt_cache_key` to send.
//! - [`effort_for_budget`]: `thinking.budget_tokens` -> `reasoning.effort`.
//!
//! # Error handling
//! Every rejection is a [`MessagesError`] whose message starts with the offending path in
//! Anthropic's style (`messages.1.content.0.type: ...`); the gateway answers 400
//! `invalid_request_error`.

use sonic_rs::{json, Array, JsonContainerTrait, JsonValueMutTrait, JsonValueTrait, Value};

use crate::{
    effort::clamp_effort,
    tools::{ToolNameMap, MAX_TOOL_NAME_LEN},
};

/// Knobs for [`messages_to_responses`].
#[derive(Debug, Clone, Copy, Default)]
pub struct MessagesRequestOptions<'a> {
    /// The model slug to send upstream when it differs from the requested one (aliases).
    pub upstream_model: Option<&'a str>,
    /// The model's `supported_reasoning_levels`; a requested effort outside it is clamped.
    pub reasoning_levels: &'a [String],
    /// Effort forced by a model alias, used when the client asked for none.
    pub default_effort: Option<&'a str>,
    /// The `prompt_cache_key` to send (Anthropic has no such field; the gateway derives one).
    pub prompt_cache_key: Option<&'a str>,
}

/// A translated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessagesRequest {
    /// The Codex Responses body to send upstream (JSON).
    pub body: Vec<u8>,
    /// The model as the client requested it (echoed in every message).
    pub model: String,
    /// Whether the client asked for an SSE stream.
    pub stream: bool,
    /// Whether the client enabled extended thinking (reasoning is shown as thinking blocks).
    pub thinking: bool,
    /// `stop_sequences`, applied to the output by the response side.
    pub stop_sequences: Vec<String>,
    /// Shortened tool names, to restore on output.
    pub name_map: ToolNameMap,
    /// The `prompt_cache_key` sent upstream, an affinity signal.
    pub prompt_cache_key: Option<String>,
}

/// A client request that cannot be translated; maps to 400 `invalid_request_error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct MessagesError {
    /// Human message, led by the offending path.
    pub message: String,
}

fn err(message: impl Into<String>) -> MessagesError {
    MessagesError {
        message: message.into(),
    }
}

/// The reasoning effort for a thinking budget: up to 4,095 tokens `low`, up to 16,383
/// `medium`, up to 31,999 `high` (Claude Code's "ultrathink"), beyond `xhigh`; the caller
/// clamps it to the model's levels.
pub fn effort_for_budget(budget_tokens: u64) -> &'static str {
    match budget_tokens {
        0..=4095 => "low",
        4096..=16383 => "medium",
        16384..=31999 => "high",
        _ => "xhigh",
    }
}

/// Parses the body as a JSON object.
pub(crate) fn parse_object(body: &[u8]) -> Result<Value, MessagesError> {
    let v: Value = sonic_rs::from_slice(body)
        .map_err(|e| err(format!("The request body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(err("The request body must be a JSON object."));
    }
    Ok(v)
}

/// Translates a client Messages body into the Codex Responses upstream body.
///
/// # Errors
/// A [`MessagesError`] naming the first offending field.
pub fn messages_to_responses(
    body: &[u8],
    opts: &MessagesRequestOptions<'_>,
) -> Result<MessagesRequest, MessagesError> {
    let v = parse_object(body)?;
    let model = match v.get("model") {
        Some(m) => m
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| err("model: must be a non-empty string"))?,
        None => return Err(err("model: Field required")),
    };
    match v.get("max_tokens") {
        None => return Err(err("max_tokens: Field required")),
        // 0 is documented (it pre-warms Anthropic's prompt cache); the Codex backend has no
        // output cap to set, so any non-negative integer is accepted and not forwarded.
        Some(m) if m.as_u64().is_none() => {
            return Err(err("max_tokens: Input should be a non-negative integer"))
        }
        Some(_) => {}
    }
    let stream = match v.get("stream") {
        None => false,
        Some(s) if s.is_null() => false,
        Some(s) => s
            .as_bool()
            .ok_or_else(|| err("stream: must be a boolean"))?,
    };
    let stop_sequences = match v.get("stop_sequences") {
        None => Vec::new(),
        Some(s) if s.is_null() => Vec::new(),
        Some(s) => {
            let arr = s
                .as_array()
                .ok_or_else(|| err("stop_sequences: must be an array of strings"))?;
            let mut out = Vec::with_capacity(arr.len());
            for (i, x) in arr.iter().enumerate() {
                let t = x
                    .as_str()
                    .ok_or_else(|| err(format!("stop_sequences.{i}: must be a string")))?;
                if !t.is_empty() {
                    out.push(t.to_owned());
                }
            }
            out
        }
    };

    // Tools first: they fix the shortened names that tool_choice and history reuse.
    let mut names = ToolNameMap::new();
    let tools_in: &[Value] = match v.get("tools") {
        None => &[],
        Some(t) if t.is_null() => &[],
        Some(t) => t
            .as_array()
            .map(|a| a.as_slice())
            .ok_or_else(|| err("tools: must be an array"))?,
    };
    let reserved: Vec<&str> = tools_in
        .iter()
        .filter_map(|t| t.get("name").and_then(|n| n.as_str()))
        .filter(|n| n.len() <= MAX_TOOL_NAME_LEN)
        .collect();
    let mut tools = Array::new();
    for (i, t) in tools_in.iter().enumerate() {
        if let Some(t) = tool(t, i, &mut names, &reserved)? {
            tools.push(t);
        }
    }
    check_top_level(&v)?;
    let edits = context_edits(&v)?;
    let keep_thinking = edits.thinking;

    let mut input = Array::new();
    if let Some(s) = v.get("system").filter(|s| !s.is_null()) {
        let parts = system_parts(s)?;
        if !parts.is_empty() {
            input.push(json!({"type": "message", "role": "developer", "content": parts}));
        }
    }
    let messages = v
        .get("messages")
        .ok_or_else(|| err("messages: Field required"))?
        .as_array()
        .ok_or_else(|| err("messages: must be an array"))?;
    // Assistant turns carrying thinking, counted for `clear_thinking`'s `keep`.
    let thinking_turns = messages
        .iter()
        .filter(|m| m.get("role").and_then(|r| r.as_str()) == Some("assistant"))
        .filter(|m| m.get("content").is_some_and(has_thinking))
        .count();
    let mut assistant_turn = 0usize;
    for (i, m) in messages.iter().enumerate() {
        if !m.is_object() {
            return Err(err(format!("messages.{i}: must be an object")));
        }
        let role = m
            .get("role")
            .and_then(|r| r.as_str())
            .ok_or_else(|| err(format!("messages.{i}.role: Field required")))?;
        let content = m
            .get("content")
            .ok_or_else(|| err(format!("messages.{i}.content: Field required")))?;
        match role {
            "user" => user_items(&mut input, content, i)?,
            "assistant" => {
                let keep = keep_thinking.keeps(assistant_turn, thinking_turns);
                if has_thinking(content) {
                    assistant_turn += 1;
                }
                assistant_items(&mut input, content, i, &mut names, &reserved, keep)?
            }
            // A system message inside the conversation (beta `mid-conversation-system`,
            // Claude Code lists its agent types this way): a developer message in place.
            "system" => {
                let parts = system_content(content, i)?;
                if !parts.is_empty() {
                    input.push(json!({"type": "message", "role": "developer", "content": parts}));
                }
            }
            other => {
                return Err(err(format!(
                "messages.{i}.role: Input should be 'user', 'assistant' or 'system', got '{other}'"
            )))
            }
        }
    }

    if let Some(c) = &edits.tools {
        clear_tool_uses(&mut input, c, super::count::count_tokens(body)?, &names);
    }

    let thinking = match v.get("thinking").filter(|t| !t.is_null()) {
        None => None,
        Some(t) => {
            let ty = t
                .get("type")
                .and_then(|x| x.as_str())
                .ok_or_else(|| err("thinking.type: Field required"))?;
            match t
                .get("display")
                .filter(|d| !d.is_null())
                .map(|d| d.as_str())
            {
                None | Some(Some("summarized" | "omitted")) => {}
                Some(_) => {
                    return Err(err(
                        "thinking.display: Input should be 'summarized' or 'omitted'",
                    ))
                }
            }
            match ty {
                "enabled" => {
                    let budget = match t.get("budget_tokens").filter(|b| !b.is_null()) {
                        None => None,
                        Some(b) => Some(b.as_u64().ok_or_else(|| {
                            err("thinking.budget_tokens: Input should be a valid integer")
                        })?),
                    };
                    Some(budget.map(effort_for_budget))
                }
                "adaptive" => Some(None),
                "disabled" => None,
                other => {
                    return Err(err(format!(
                        "thinking.type: Input should be 'enabled', 'adaptive' or 'disabled', got '{other}'"
                    )))
                }
            }
        }
    };
    // `display: "omitted"`: the client wants no thinking text, only the signatures, so no
    // summary is asked for (reasoning then comes back as `redacted_thinking`).
    let summarize = v
        .get("thinking")
        .and_then(|t| t.get("display"))
        .and_then(|d| d.as_str())
        != Some("omitted");
    let output_config = v.get("output_config").filter(|o| !o.is_null());
    if output_config.is_some_and(|o| !o.is_object()) {
        return Err(err("output_config: Input should be an object"));
    }
    let explicit_effort = match output_config
        .and_then(|o| o.get("effort"))
        .filter(|e| !e.is_null())
    {
        None => None,
        Some(e) => match e.as_str() {
            Some(e @ ("low" | "medium" | "high" | "xhigh" | "max" | "minimal" | "none")) => Some(e),
            _ => return Err(err(
                "output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'",
            )),
        },
    };
    let effort = explicit_effort
        .or(thinking.flatten())
        .or(opts.default_effort)
        .map(|e| match clamp_effort(e, opts.reasoning_levels) {
            // Anthropic's top effort; Codex's is `xhigh` (when the model's levels are unknown,
            // clamping cannot say it).
            "max" => "xhigh",
            e => e,
        });
    // Structured outputs: `output_config.format` (or the deprecated top-level
    // `output_format`) -> the Responses `text.format`.
    let format = match output_config
        .and_then(|o| o.get("format"))
        .filter(|f| !f.is_null())
    {
        Some(f) => Some(("output_config.format", f)),
        None => v
            .get("output_format")
            .filter(|f| !f.is_null())
            .map(|f| ("output_format", f)),
    };
    let text_format = match format {
        None => None,
        Some((path, f)) => Some(json_format(f, path)?),
    };

    let mut out = sonic_rs::Object::new();
    out.insert(&"model", opts.upstream_model.unwrap_or(model));
    out.insert(&"instructions", "");
    out.insert(&"input", Value::from(input));
    let has_tools = !tools.is_empty();
    if has_tools {
        out.insert(&"tools", Value::from(tools));
    }
    let mut parallel = true;
    if let Some(tc) = v.get("tool_choice").filter(|t| !t.is_null()) {
        let ty = tc
            .get("type")
            .and_then(|t| t.as_str())
            .ok_or_else(|| err("tool_choice.type: Field required"))?;
        let choice: Value = match ty {
            "auto" => "auto".into(),
            "any" => "required".into(),
            "none" => "none".into(),
            "tool" => {
                let name = tc
                    .get("name")
                    .and_then(|n| n.as_str())
                    .ok_or_else(|| err("tool_choice.name: Field required"))?;
                json!({"type": "function", "name": names.upstream_name(name, &reserved)})
            }
            other => {
                return Err(err(format!(
                "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none', got '{other}'"
            )))
            }
        };
        out.insert(&"tool_choice", choice);
        if tc
            .get("disable_parallel_tool_use")
            .and_then(|d| d.as_bool())
            == Some(true)
        {
            parallel = false;
        }
    }
    if has_tools || v.get("tool_choice").is_some() {
        out.insert(&"parallel_tool_calls", parallel);
    }
    if thinking.is_some() || effort.is_some() {
        let mut r = sonic_rs::Object::new();
        if let Some(e) = effort {
            r.insert(&"effort", e);
        }
        if thinking.is_some() && summarize {
            r.insert(&"summary", "auto");
        }
        out.insert(&"reasoning", Value::from(r));
    }
    if thinking.is_some() {
        out.insert(&"include", json!(["reasoning.encrypted_content"]));
    }
    if let Some(f) = text_format {
        out.insert(&"text", json!({"format": f}));
    }
    out.insert(&"store", false);
    out.insert(&"stream", true);
    if let Some(k) = opts.prompt_cache_key {
        out.insert(&"prompt_cache_key", k);
    }
    let body = sonic_rs::to_vec(&Value::from(out)).map_err(|e| err(e.to_string()))?;
    Ok(MessagesRequest {
        body,
        model: model.to_owned(),
        stream,
        thinking: thinking.is_some(),
        stop_sequences,
        name_map: names,
        prompt_cache_key: opts.prompt_cache_key.map(str::to_owned),
    })
}

/// Top-level fields of the Messages API (as documented, beta fields included) that the
/// translation does not otherwise read: their shapes are checked, so a malformed value is
/// refused as Anthropic would, and then they are dropped (the Codex backend has no
/// counterpart: prompt caching is automatic, sampling is fixed, there is no container, no
/// region, no speed mode, no fallback model). Fields not listed are ignored, so a client a
/// version ahead of this list still works.
fn check_top_level(v: &Value) -> Result<(), MessagesError> {
    let present = |k: &str| v.get(k).filter(|x| !x.is_null());
    for k in ["temperature", "top_p"] {
        if present(k).is_some_and(|x| x.as_f64().is_none()) {
            return Err(err(format!("{k}: Input should be a valid number")));
        }
    }
    if present("top_k").is_some_and(|x| x.as_u64().is_none()) {
        return Err(err("top_k: Input should be a non-negative integer"));
    }
    if let Some(m) = present("metadata") {
        if !m.is_object() {
            return Err(err("metadata: Input should be an object"));
        }
        // Claude Code sends a JSON document as this string; any string is fine.
        if m.get("user_id")
            .is_some_and(|u| !u.is_null() && !u.is_str())
        {
            return Err(err("metadata.user_id: Input should be a valid string"));
        }
    }
    for k in ["service_tier", "inference_geo", "speed"] {
        if present(k).is_some_and(|x| !x.is_str()) {
            return Err(err(format!("{k}: Input should be a valid string")));
        }
    }
    for k in ["cache_control", "diagnostics"] {
        if present(k).is_some_and(|x| !x.is_object()) {
            return Err(err(format!("{k}: Input should be an object")));
        }
    }
    if present("container").is_some_and(|x| !x.is_object() && !x.is_str()) {
        return Err(err("container: Input should be an object or a string"));
    }
    if let Some(m) = present("mcp_servers") {
        let servers = m
            .as_array()
            .ok_or_else(|| err("mcp_servers: Input should be an array"))?;
        if !servers.is_empty() {
            // Anthropic would connect to them on the model's behalf; nothing here can.
            return Err(err(
                "mcp_servers: MCP connectors are not available through this gateway; connect the MCP servers in the client instead",
            ));
        }
    }
    Ok(())
}

/// How many of the most recent assistant turns keep their thinking blocks
/// (`context_management` edit `clear_thinking_20251015`; without it, all are kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ThinkingKeep {
    All,
    Turns(u64),
}

impl ThinkingKeep {
    /// Whether the assistant turn `turn` (0-based, among the `total` turns that carry
    /// thinking) keeps its thinking.
    fn keeps(self, turn: usize, total: usize) -> bool {
        match self {
            ThinkingKeep::All => true,
            ThinkingKeep::Turns(n) => (total - turn.min(total)) as u64 <= n,
        }
    }
}

/// What `clear_tool_uses_20250919` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ToolClear {
    /// When it applies: the request's (estimated) input tokens, or its tool uses, reach it.
    trigger: Trigger,
    /// The most recent tool uses left alone.
    keep: usize,
    /// Clear only when at least this many (estimated) tokens go.
    clear_at_least: u64,
    /// Tools whose uses are never cleared.
    exclude: Vec<String>,
    /// Also clear the calls' inputs.
    clear_inputs: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    InputTokens(u64),
    ToolUses(u64),
}

/// The `context_management` edits this translation applies.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ContextEdits {
    thinking: ThinkingKeep,
    tools: Option<ToolClear>,
}

/// The placeholder of a cleared tool result (Anthropic leaves one so the model knows).
const CLEARED_RESULT: &str = "[tool result cleared to save context]";

/// `{"type": <ty>, "value": n}` (a trigger, `keep` or `clear_at_least`), else `default`.
fn typed_count(
    v: Option<&Value>,
    path: &str,
    types: &[&str],
) -> Result<Option<(String, u64)>, MessagesError> {
    let Some(v) = v.filter(|x| !x.is_null()) else {
        return Ok(None);
    };
    let ty = v
        .get("type")
        .and_then(|t| t.as_str())
        .filter(|t| types.contains(t));
    let n = v.get("value").and_then(|n| n.as_u64());
    match (ty, n) {
        (Some(t), Some(n)) => Ok(Some((t.to_owned(), n))),
        _ => Err(err(format!(
            "{path}: Input should be {{\"type\": \"{}\", \"value\": n}}",
            types.join("\" or \"")
        ))),
    }
}

/// `clear_tool_uses_20250919`'s settings, Anthropic's defaults filled in (trigger at 100,000
/// input tokens, keep 3 tool uses).
fn tool_clear(e: &Value, path: &str) -> Result<ToolClear, MessagesError> {
    let trigger = match typed_count(
        e.get("trigger"),
        &format!("{path}.trigger"),
        &["input_tokens", "tool_uses"],
    )? {
        None => Trigger::InputTokens(100_000),
        Some((t, n)) if t == "tool_uses" => Trigger::ToolUses(n),
        Some((_, n)) => Trigger::InputTokens(n),
    };
    let keep = typed_count(e.get("keep"), &format!("{path}.keep"), &["tool_uses"])?
        .map_or(3, |(_, n)| n as usize);
    let clear_at_least = typed_count(
        e.get("clear_at_least"),
        &format!("{path}.clear_at_least"),
        &["input_tokens"],
    )?
    .map_or(0, |(_, n)| n);
    let exclude = match e.get("exclude_tools").filter(|x| !x.is_null()) {
        None => Vec::new(),
        Some(x) => x
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect()
            })
            .ok_or_else(|| err(format!("{path}.exclude_tools: Input should be an array")))?,
    };
    let clear_inputs = match e.get("clear_tool_inputs").filter(|x| !x.is_null()) {
        None => false,
        Some(b) => b.as_bool().ok_or_else(|| {
            err(format!(
                "{path}.clear_tool_inputs: Input should be a valid boolean"
            ))
        })?,
    };
    Ok(ToolClear {
        trigger,
        keep,
        clear_at_least,
        exclude,
        clear_inputs,
    })
}

/// Applies `clear_tool_uses` to the translated input: once the trigger is reached, the
/// results (and, when asked, the inputs) of all but the `keep` most recent tool uses, minus
/// the excluded tools, are replaced by a placeholder, unless that would clear fewer than
/// `clear_at_least` tokens.
fn clear_tool_uses(input: &mut Array, c: &ToolClear, input_tokens: u64, names: &ToolNameMap) {
    let calls: Vec<(String, String)> = input
        .iter()
        .filter(|i| i.get("type").and_then(|t| t.as_str()) == Some("function_call"))
        .filter_map(|i| {
            let id = i.get("call_id")?.as_str()?.to_owned();
            let name = names.restore(i.get("name")?.as_str()?).to_owned();
            Some((id, name))
        })
        .collect();
    let triggered = match c.trigger {
        Trigger::InputTokens(n) => input_tokens >= n,
        Trigger::ToolUses(n) => calls.len() as u64 >= n,
    };
    if !triggered {
        return;
    }
    let cut = calls.len().saturating_sub(c.keep);
    let cleared: Vec<&str> = calls[..cut]
        .iter()
        .filter(|(_, name)| !c.exclude.iter().any(|x| x == name))
        .map(|(id, _)| id.as_str())
        .collect();
    if cleared.is_empty() {
        return;
    }
    let hit = |i: &Value, ty: &str| {
        i.get("type").and_then(|t| t.as_str()) == Some(ty)
            && i.get("call_id")
                .and_then(|x| x.as_str())
                .is_some_and(|id| cleared.contains(&id))
    };
    let mut tokens = 0u64;
    for i in input.iter() {
        if hit(i, "function_call_output") {
            tokens += i
                .get("output")
                .and_then(|o| o.as_str())
                .map_or(0, super::count::text_tokens);
        } else if c.clear_inputs && hit(i, "function_call") {
            tokens += i
                .get("arguments")
                .and_then(|o| o.as_str())
                .map_or(0, super::count::text_tokens);
        }
    }
    if tokens < c.clear_at_least {
        return;
    }
    for i in input.iter_mut() {
        if hit(i, "function_call_output") {
            if let Some(o) = i.as_object_mut() {
                o.insert(&"output", CLEARED_RESULT);
            }
        } else if c.clear_inputs && hit(i, "function_call") {
            if let Some(o) = i.as_object_mut() {
                o.insert(&"arguments", "{}");
            }
        }
    }
}

/// Reads `context_management`: the edits are checked; `clear_thinking_20251015` (its `keep`)
/// and `clear_tool_uses_20250919` (trigger, keep, `clear_at_least`, `exclude_tools`,
/// `clear_tool_inputs`; tokens estimated as `count_tokens` does) are applied to the history
/// sent upstream, as Anthropic applies them server-side; `compact_20260112` is accepted and
/// not applied (Codex compacts through its own endpoint).
fn context_edits(v: &Value) -> Result<ContextEdits, MessagesError> {
    let mut out = ContextEdits {
        thinking: ThinkingKeep::All,
        tools: None,
    };
    let Some(cm) = v.get("context_management").filter(|c| !c.is_null()) else {
        return Ok(out);
    };
    if !cm.is_object() {
        return Err(err("context_management: Input should be an object"));
    }
    let edits: &[Value] = match cm.get("edits").filter(|e| !e.is_null()) {
        None => &[],
        Some(e) => e
            .as_array()
            .map(|a| a.as_slice())
            .ok_or_else(|| err("context_management.edits: Input should be an array"))?,
    };
    for (i, e) in edits.iter().enumerate() {
        let path = format!("context_management.edits.{i}");
        let ty = e
            .get("type")
            .and_then(|t| t.as_str())
            .ok_or_else(|| err(format!("{path}.type: Field required")))?;
        match ty {
            "clear_thinking_20251015" => {
                out.thinking = match e.get("keep").filter(|k| !k.is_null()) {
                    None => ThinkingKeep::Turns(1),
                    Some(k) if k.as_str() == Some("all") => ThinkingKeep::All,
                    Some(k) => match k.get("type").and_then(|t| t.as_str()) {
                        Some("all") => ThinkingKeep::All,
                        Some("thinking_turns") => ThinkingKeep::Turns(
                            k.get("value").and_then(|n| n.as_u64()).ok_or_else(|| {
                                err(format!("{path}.keep.value: Input should be a positive integer"))
                            })?,
                        ),
                        _ => {
                            return Err(err(format!(
                                "{path}.keep: Input should be 'all' or {{\"type\": \"thinking_turns\", \"value\": n}}"
                            )))
                        }
                    },
                };
            }
            "clear_tool_uses_20250919" => out.tools = Some(tool_clear(e, &path)?),
            t if t.starts_with("clear_tool_uses_") || t.starts_with("compact_") => {}
            other => {
                return Err(err(format!(
                    "{path}.type: Input should be 'clear_tool_uses_20250919', 'clear_thinking_20251015' or 'compact_20260112', got '{other}'"
                )))
            }
        }
    }
    Ok(out)
}

/// Whether a message's content has a thinking block.
fn has_thinking(content: &Value) -> bool {
    content.as_array().is_some_and(|a| {
        a.iter().any(|b| {
            matches!(
                b.get("type").and_then(|t| t.as_str()),
                Some("thinking" | "redacted_thinking")
            )
        })
    })
}

/// `output_config.format` / `output_format`: `{"type":"json_schema","schema":{...}}` -> the
/// Responses `text.format` (strict, as Anthropic's structured outputs are).
fn json_format(f: &Value, path: &str) -> Result<Value, MessagesError> {
    if f.get("type").and_then(|t| t.as_str()) != Some("json_schema") {
        return Err(err(format!("{path}.type: Input should be 'json_schema'")));
    }
    let schema = f
        .get("schema")
        .filter(|s| s.is_object())
        .ok_or_else(|| err(format!("{path}.schema: Field required")))?;
    Ok(json!({"type": "json_schema", "name": "output", "schema": schema.clone(), "strict": true}))
}

/// One tool definition; `None` for a tool with no upstream counterpart that is safe to
/// leave out (Anthropic's tool search: every deferred tool is sent in full anyway).
fn tool(
    t: &Value,
    i: usize,
    names: &mut ToolNameMap,
    reserved: &[&str],
) -> Result<Option<Value>, MessagesError> {
    if !t.is_object() {
        return Err(err(format!("tools.{i}: must be an object")));
    }
    let ty = t.get("type").and_then(|x| x.as_str()).unwrap_or("custom");
    if ty.starts_with("web_search") {
        return Ok(Some(json!({"type": "web_search"})));
    }
    if ty.starts_with("tool_search_tool") {
        return Ok(None);
    }
    if ty != "custom" {
        return Err(err(format!(
            "tools.{i}.type: the Anthropic-defined tool '{ty}' is not available through this gateway; define it as a custom tool with an input_schema"
        )));
    }
    let name = t
        .get("name")
        .and_then(|n| n.as_str())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err(format!("tools.{i}.name: Field required")))?;
    let schema = match t.get("input_schema") {
        Some(s) if s.is_object() => s.clone(),
        Some(_) => return Err(err(format!("tools.{i}.input_schema: must be an object"))),
        None => return Err(err(format!("tools.{i}.input_schema: Field required"))),
    };
    let mut o = sonic_rs::Object::new();
    o.insert(&"type", "function");
    o.insert(&"name", names.upstream_name(name, reserved));
    if let Some(d) = t.get("description").and_then(|d| d.as_str()) {
        o.insert(&"description", d);
    }
    o.insert(&"parameters", schema);
    o.insert(&"strict", false);
    Ok(Some(Value::from(o)))
}

/// `system`: a string or text blocks -> `input_text` parts.
fn system_parts(s: &Value) -> Result<Array, MessagesError> {
    let mut parts = Array::new();
    if let Some(t) = s.as_str() {
        if !t.is_empty() {
            parts.push(json!({"type": "input_text", "text": t}));
        }
        return Ok(parts);
    }
    let blocks = s
        .as_array()
        .ok_or_else(|| err("system: must be a string or an array of text blocks"))?;
    for (j, b) in blocks.iter().enumerate() {
        if b.get("type").and_then(|t| t.as_str()) != Some("text") {
            return Err(err(format!("system.{j}.type: Input should be 'text'")));
        }
        let t = b
            .get("text")
            .and_then(|t| t.as_str())
            .ok_or_else(|| err(format!("system.{j}.text: Field required")))?;
        if !t.is_empty() {
            parts.push(json!({"type": "input_text", "text": t}));
        }
    }
    Ok(parts)
}

/// The content of a `system` message inside `messages`: a string or text blocks.
fn system_content(content: &Value, i: usize) -> Result<Array, MessagesError> {
    let mut parts = Array::new();
    for (j, b) in blocks(content, i)?.iter().enumerate() {
        let ty = block_type(b, i, j)?;
        if ty != "text" {
            return Err(err(format!(
                "messages.{i}.content.{j}.type: Input should be 'text' in a system message, got '{ty}'"
            )));
        }
        let t = block_text(b, &format!("messages.{i}.content.{j}"))?;
        if !t.is_empty() {
            parts.push(json!({"type": "input_text", "text": t}));
        }
    }
    Ok(parts)
}

/// `content` as a list of blocks (a string is one text block).
fn blocks(content: &Value, i: usize) -> Result<Vec<Value>, MessagesError> {
    if let Some(t) = content.as_str() {
        return Ok(vec![json!({"type": "text", "text": t})]);
    }
    let arr = content.as_array().ok_or_else(|| {
        err(format!(
            "messages.{i}.content: must be a string or an array of content blocks"
        ))
    })?;
    for (j, b) in arr.iter().enumerate() {
        if !b.is_object() {
            return Err(err(format!("messages.{i}.content.{j}: must be an object")));
        }
    }
    Ok(arr.iter().cloned().collect())
}

fn block_type(b: &Value, i: usize, j: usize) -> Result<&str, MessagesError> {
    b.get("type")
        .and_then(|t| t.as_str())
        .ok_or_else(|| err(format!("messages.{i}.content.{j}.type: Field required")))
}

fn block_text<'v>(b: &'v Value, path: &str) -> Result<&'v str, MessagesError> {
    b.get("text")
        .and_then(|t| t.as_str())
        .ok_or_else(|| err(format!("{path}.text: Field required")))
}

/// An `image` block -> `input_image`.
fn image_part(b: &Value, path: &str) -> Result<Value, MessagesError> {
    let src = b
        .get("source")
        .filter(|s| s.is_object())
        .ok_or_else(|| err(format!("{path}.source: Field required")))?;
    let url = match src.get("type").and_then(|t| t.as_str()) {
        Some("base64") => {
            let mt = src
                .get("media_type")
                .and_then(|m| m.as_str())
                .ok_or_else(|| err(format!("{path}.source.media_type: Field required")))?;
            let data = src
                .get("data")
                .and_then(|d| d.as_str())
                .ok_or_else(|| err(format!("{path}.source.data: Field required")))?;
            format!("data:{mt};base64,{data}")
        }
        Some("url") => src
            .get("url")
            .and_then(|u| u.as_str())
            .ok_or_else(|| err(format!("{path}.source.url: Field required")))?
            .to_owned(),
        _ => {
            return Err(err(format!(
                "{path}.source.type: Input should be 'base64' or 'url'"
            )))
        }
    };
    Ok(json!({"type": "input_image", "image_url": url}))
}

/// A `document` block -> `input_file` (PDF, by data or URL) or `input_text` (plain text).
fn document_part(b: &Value, path: &str) -> Result<Value, MessagesError> {
    let src = b
        .get("source")
        .filter(|s| s.is_object())
        .ok_or_else(|| err(format!("{path}.source: Field required")))?;
    let filename = b
        .get("title")
        .and_then(|t| t.as_str())
        .unwrap_or("document.pdf");
    match src.get("type").and_then(|t| t.as_str()) {
        Some("base64") => {
            let mt = src
                .get("media_type")
                .and_then(|m| m.as_str())
                .unwrap_or("application/pdf");
            let data = src
                .get("data")
                .and_then(|d| d.as_str())
                .ok_or_else(|| err(format!("{path}.source.data: Field required")))?;
            Ok(json!({"type": "input_file", "filename": filename,
                      "file_data": format!("data:{mt};base64,{data}")}))
        }
        Some("url") => {
            let url = src
                .get("url")
                .and_then(|u| u.as_str())
                .ok_or_else(|| err(format!("{path}.source.url: Field required")))?;
            Ok(json!({"type": "input_file", "file_url": url}))
        }
        Some("text") => {
            let data = src
                .get("data")
                .and_then(|d| d.as_str())
                .ok_or_else(|| err(format!("{path}.source.data: Field required")))?;
            Ok(json!({"type": "input_text", "text": data}))
        }
        Some("content") => {
            let mut text = String::new();
            for c in src
                .get("content")
                .and_then(|c| c.as_array())
                .map(|a| a.as_slice())
                .unwrap_or(&[])
            {
                if let Some(t) = c.get("text").and_then(|t| t.as_str()) {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(t);
                }
            }
            Ok(json!({"type": "input_text", "text": text}))
        }
        _ => Err(err(format!(
            "{path}.source.type: Input should be 'base64', 'url', 'text' or 'content'"
        ))),
    }
}

/// A `search_result` block (RAG with citations) as text: its title, source and content.
fn search_result_text(b: &Value, path: &str) -> Result<String, MessagesError> {
    let field = |k: &str| {
        b.get(k)
            .and_then(|x| x.as_str())
            .ok_or_else(|| err(format!("{path}.{k}: Field required")))
    };
    let mut out = format!("{} ({})", field("title")?, field("source")?);
    let content = b
        .get("content")
        .and_then(|c| c.as_array())
        .ok_or_else(|| err(format!("{path}.content: Field required")))?;
    for (k, c) in content.iter().enumerate() {
        out.push('\n');
        out.push_str(block_text(c, &format!("{path}.content.{k}"))?);
    }
    Ok(out)
}

/// A user turn: content parts become user messages; each `tool_result` becomes a
/// `function_call_output` in place (images it carries follow in a user message).
fn user_items(input: &mut Array, content: &Value, i: usize) -> Result<(), MessagesError> {
    let mut parts = Array::new();
    let mut deferred = Array::new();
    let flush = |input: &mut Array, parts: &mut Array| {
        if !parts.is_empty() {
            let p = std::mem::take(parts);
            input.push(json!({"type": "message", "role": "user", "content": p}));
        }
    };
    for (j, b) in blocks(content, i)?.iter().enumerate() {
        let path = format!("messages.{i}.content.{j}");
        match block_type(b, i, j)? {
            "text" => {
                let t = block_text(b, &path)?;
                if !deferred.is_empty() {
                    flush(input, &mut deferred);
                }
                parts.push(json!({"type": "input_text", "text": t}));
            }
            "image" => parts.push(image_part(b, &path)?),
            "document" => parts.push(document_part(b, &path)?),
            "tool_result" => {
                flush(input, &mut parts);
                let call_id = b
                    .get("tool_use_id")
                    .and_then(|t| t.as_str())
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| err(format!("{path}.tool_use_id: Field required")))?;
                let mut text = String::new();
                match b.get("content").filter(|c| !c.is_null()) {
                    None => {}
                    Some(c) => {
                        if let Some(t) = c.as_str() {
                            text.push_str(t);
                        } else if let Some(arr) = c.as_array() {
                            for (k, cb) in arr.iter().enumerate() {
                                let cpath = format!("{path}.content.{k}");
                                match cb.get("type").and_then(|t| t.as_str()) {
                                    Some("text") => {
                                        if !text.is_empty() {
                                            text.push('\n');
                                        }
                                        text.push_str(block_text(cb, &cpath)?);
                                    }
                                    Some("image") => deferred.push(image_part(cb, &cpath)?),
                                    Some("document") => {
                                        deferred.push(document_part(cb, &cpath)?)
                                    }
                                    Some("search_result") => {
                                        if !text.is_empty() {
                                            text.push('\n');
                                        }
                                        text.push_str(&search_result_text(cb, &cpath)?);
                                    }
                                    // A tool search's answer: the named deferred tool is
                                    // already among the upstream's tools.
                                    Some("tool_reference") => {
                                        let name = cb
                                            .get("tool_name")
                                            .and_then(|n| n.as_str())
                                            .ok_or_else(|| {
                                                err(format!("{cpath}.tool_name: Field required"))
                                            })?;
                                        if !text.is_empty() {
                                            text.push('\n');
                                        }
                                        text.push_str(&format!("Tool loaded: {name}"));
                                    }
                                    _ => {
                                        return Err(err(format!(
                                            "{cpath}.type: Input should be 'text', 'image', 'document', 'search_result' or 'tool_reference'"
                                        )))
                                    }
                                }
                            }
                        } else {
                            return Err(err(format!(
                                "{path}.content: must be a string or an array of content blocks"
                            )));
                        }
                    }
                }
                input.push(
                    json!({"type": "function_call_output", "call_id": call_id, "output": text}),
                );
            }
            "search_result" => {
                let t = search_result_text(b, &path)?;
                if !deferred.is_empty() {
                    flush(input, &mut deferred);
                }
                parts.push(json!({"type": "input_text", "text": t}));
            }
            // Echoed assistant-only blocks, and files placed in Anthropic's code-execution
            // container, carry nothing for the upstream.
            "thinking" | "redacted_thinking" | "container_upload" => {}
            other => {
                return Err(err(format!(
                "{path}.type: the content block type '{other}' is not supported in a user message"
            )))
            }
        }
    }
    flush(input, &mut deferred);
    flush(input, &mut parts);
    Ok(())
}

/// An assistant turn: text -> assistant message, `tool_use` -> `function_call`, thinking
/// with our signature -> `reasoning` with its encrypted content.
fn assistant_items(
    input: &mut Array,
    content: &Value,
    i: usize,
    names: &mut ToolNameMap,
    reserved: &[&str],
    keep_thinking: bool,
) -> Result<(), MessagesError> {
    let mut parts = Array::new();
    let flush = |input: &mut Array, parts: &mut Array| {
        if !parts.is_empty() {
            let p = std::mem::take(parts);
            input.push(json!({"type": "message", "role": "assistant", "content": p}));
        }
    };
    for (j, b) in blocks(content, i)?.iter().enumerate() {
        let path = format!("messages.{i}.content.{j}");
        match block_type(b, i, j)? {
            "text" => {
                let t = block_text(b, &path)?;
                if !t.is_empty() {
                    parts.push(json!({"type": "output_text", "text": t}));
                }
            }
            "tool_use" => {
                flush(input, &mut parts);
                let id = b
                    .get("id")
                    .and_then(|t| t.as_str())
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| err(format!("{path}.id: Field required")))?;
                let name = b
                    .get("name")
                    .and_then(|t| t.as_str())
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| err(format!("{path}.name: Field required")))?;
                let args = match b.get("input") {
                    None => "{}".to_owned(),
                    Some(v) => sonic_rs::to_string(v).map_err(|e| err(e.to_string()))?,
                };
                input.push(json!({"type": "function_call", "call_id": id,
                                  "name": names.upstream_name(name, reserved),
                                  "arguments": args}));
            }
            // Cleared by `context_management` (`clear_thinking_20251015`).
            "thinking" | "redacted_thinking" if !keep_thinking => {}
            "thinking" => {
                let sig = b
                    .get("signature")
                    .and_then(|s| s.as_str())
                    .unwrap_or_default();
                if !sig.is_empty() {
                    flush(input, &mut parts);
                    let text = b.get("thinking").and_then(|t| t.as_str()).unwrap_or("");
                    let summary = if text.is_empty() {
                        json!([])
                    } else {
                        json!([{"type": "summary_text", "text": text}])
                    };
                    input.push(
                        json!({"type": "reasoning", "summary": summary, "encrypted_content": sig}),
                    );
                }
            }
            "redacted_thinking" => {
                if let Some(data) = b
                    .get("data")
                    .and_then(|d| d.as_str())
                    .filter(|d| !d.is_empty())
                {
                    flush(input, &mut parts);
                    input.push(
                        json!({"type": "reasoning", "summary": [], "encrypted_content": data}),
                    );
                }
            }
            // A summary left by Anthropic's server-side compaction: the history before it,
            // as the assistant's words.
            "compaction" => {
                if let Some(t) = b
                    .get("content")
                    .and_then(|c| c.as_str())
                    .filter(|t| !t.is_empty())
                {
                    parts.push(json!({"type": "output_text", "text": t}));
                }
            }
            // Server-side tool traffic of Anthropic's own tools (web search and fetch, code
            // execution, MCP connectors, tool search, containers) has no Codex counterpart.
            "server_tool_use"
            | "web_search_tool_result"
            | "web_fetch_tool_result"
            | "code_execution_tool_result"
            | "bash_code_execution_tool_result"
            | "text_editor_code_execution_tool_result"
            | "tool_search_tool_result"
            | "mcp_tool_use"
            | "mcp_tool_result"
            | "container_upload" => {}
            other => {
                return Err(err(format!(
                    "{path}.type: the content block type '{other}' is not supported in an assistant message"
                )))
            }
        }
    }
    flush(input, &mut parts);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tr(body: &str) -> (MessagesRequest, Value) {
        let r = messages_to_responses(body.as_bytes(), &MessagesRequestOptions::default())
            .unwrap_or_else(|e| panic!("{e}: {body}"));
        let v: Value = sonic_rs::from_slice(&r.body).unwrap();
        (r, v)
    }

    fn s(v: &Value) -> String {
        sonic_rs::to_string(v).unwrap()
    }

    /// Compares JSON values (object key order does not matter).
    #[track_caller]
    fn same(v: &Value, want: &str) {
        let want: Value = sonic_rs::from_str(want).unwrap();
        assert_eq!(*v, want, "{}", s(v));
    }

    #[test]
    fn plain_text_with_system_string_and_dropped_sampling() {
        let (r, v) = tr(
            r#"{"model":"claude-sonnet-4-5","max_tokens":1024,"system":"be brief","temperature":0.2,"top_p":0.9,"top_k":5,"metadata":{"user_id":"u"},
                "messages":[{"role":"user","content":"hi"}],"stop_sequences":["END"],"stream":true}"#,
        );
        assert_eq!(r.model, "claude-sonnet-4-5");
        assert!(r.stream && !r.thinking);
        assert_eq!(r.stop_sequences, vec!["END".to_owned()]);
        same(
            &v,
            r#"{"model":"claude-sonnet-4-5","instructions":"","input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"be brief"}]},{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}],"store":false,"stream":true}"#,
        );
        for f in crate::normalize::DROPPED_FIELDS {
            assert!(v.get(f).is_none(), "{f} must not reach the upstream");
        }
        assert!(v.get("top_k").is_none() && v.get("stop_sequences").is_none());
    }

    #[test]
    fn system_blocks_images_and_documents() {
        let (_, v) = tr(
            r#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":"b"}],
                "messages":[{"role":"user","content":[
                  {"type":"text","text":"look"},
                  {"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},
                  {"type":"image","source":{"type":"url","url":"https://x/y.png"}},
                  {"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBE"},"title":"r.pdf"},
                  {"type":"document","source":{"type":"text","media_type":"text/plain","data":"plain"}}]}]}"#,
        );
        let input = v["input"].as_array().unwrap();
        same(
            &input[0]["content"],
            r#"[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]"#,
        );
        let c = &input[1]["content"];
        assert_eq!(
            c[1]["image_url"].as_str(),
            Some("data:image/png;base64,AAAA")
        );
        assert_eq!(c[2]["image_url"].as_str(), Some("https://x/y.png"));
        assert_eq!(c[3]["type"].as_str(), Some("input_file"));
        assert_eq!(c[3]["filename"].as_str(), Some("r.pdf"));
        assert_eq!(
            c[3]["file_data"].as_str(),
            Some("data:application/pdf;base64,JVBE")
        );
        same(&c[4], r#"{"type":"input_text","text":"plain"}"#);
    }

    #[test]
    fn tool_use_round_trip_maps_ids_to_call_ids() {
        let (r, v) = tr(r#"{"model":"m","max_tokens":5,
                "tools":[{"name":"get_weather","description":"w","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}},
                         {"type":"web_search_20250305","name":"web_search","max_uses":3}],
                "tool_choice":{"type":"tool","name":"get_weather","disable_parallel_tool_use":true},
                "messages":[
                  {"role":"user","content":"weather?"},
                  {"role":"assistant","content":[{"type":"text","text":"checking"},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
                  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"},{"type":"image","source":{"type":"url","url":"https://x/c.png"}}]},{"type":"text","text":"and?"}]}]}"#);
        assert!(r.name_map.is_empty());
        same(
            &v["tools"],
            r#"[{"type":"function","name":"get_weather","description":"w","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":false},{"type":"web_search"}]"#,
        );
        same(
            &v["tool_choice"],
            r#"{"type":"function","name":"get_weather"}"#,
        );
        assert_eq!(v["parallel_tool_calls"].as_bool(), Some(false));
        let input = v["input"].as_array().unwrap();
        let kinds: Vec<String> = input
            .iter()
            .map(|i| {
                format!(
                    "{}:{}",
                    i["type"].as_str().unwrap(),
                    i["role"].as_str().unwrap_or("")
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "message:user",
                "message:assistant",
                "function_call:",
                "function_call_output:",
                "message:user",
                "message:user"
            ]
        );
        same(
            &input[2],
            r#"{"type":"function_call","call_id":"toolu_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"}"#,
        );
        same(
            &input[3],
            r#"{"type":"function_call_output","call_id":"toolu_1","output":"sunny"}"#,
        );
        // The tool's image follows the outputs, before the user's next words.
        assert_eq!(input[4]["content"][0]["type"].as_str(), Some("input_image"));
        assert_eq!(input[5]["content"][0]["text"].as_str(), Some("and?"));
    }

    #[test]
    fn tool_choice_variants_and_long_names() {
        for (tc, want) in [
            (r#"{"type":"auto"}"#, r#""auto""#),
            (r#"{"type":"any"}"#, r#""required""#),
            (r#"{"type":"none"}"#, r#""none""#),
        ] {
            let (_, v) = tr(&format!(
                r#"{{"model":"m","max_tokens":5,"tools":[{{"name":"t","input_schema":{{"type":"object"}}}}],"tool_choice":{tc},"messages":[{{"role":"user","content":"x"}}]}}"#
            ));
            same(&v["tool_choice"], want);
            assert_eq!(v["parallel_tool_calls"].as_bool(), Some(true));
        }
        let long = "n".repeat(80);
        let (r, v) = tr(&format!(
            r#"{{"model":"m","max_tokens":5,"tools":[{{"name":"{long}","input_schema":{{"type":"object"}}}}],"messages":[{{"role":"assistant","content":[{{"type":"tool_use","id":"t1","name":"{long}","input":{{}}}}]}}]}}"#
        ));
        let short = v["tools"][0]["name"].as_str().unwrap().to_owned();
        assert!(short.len() <= MAX_TOOL_NAME_LEN);
        assert_eq!(v["input"][0]["name"].as_str(), Some(short.as_str()));
        assert_eq!(r.name_map.restore(&short), long);
    }

    #[test]
    fn thinking_maps_to_reasoning_and_replays_signatures() {
        let (r, v) = tr(
            r#"{"model":"m","max_tokens":40000,"thinking":{"type":"enabled","budget_tokens":10000},
                "messages":[{"role":"user","content":"q"},
                  {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"gAAAenc"},{"type":"redacted_thinking","data":"gAAAred"},{"type":"thinking","thinking":"unsigned","signature":""},{"type":"text","text":"a"}]},
                  {"role":"user","content":"more"}]}"#,
        );
        assert!(r.thinking);
        same(&v["reasoning"], r#"{"effort":"medium","summary":"auto"}"#);
        same(&v["include"], r#"["reasoning.encrypted_content"]"#);
        let input = v["input"].as_array().unwrap();
        same(
            &input[1],
            r#"{"type":"reasoning","summary":[{"type":"summary_text","text":"hmm"}],"encrypted_content":"gAAAenc"}"#,
        );
        same(
            &input[2],
            r#"{"type":"reasoning","summary":[],"encrypted_content":"gAAAred"}"#,
        );
        assert_eq!(input[3]["role"].as_str(), Some("assistant"));
        assert_eq!(input.len(), 5);

        // Budgets, clamping to the model's levels, explicit effort, alias effort.
        assert_eq!(effort_for_budget(1024), "low");
        assert_eq!(effort_for_budget(4000), "low");
        assert_eq!(effort_for_budget(10_000), "medium");
        assert_eq!(effort_for_budget(31_999), "high");
        assert_eq!(effort_for_budget(64_000), "xhigh");
        let levels = vec!["low".to_owned(), "medium".to_owned(), "high".to_owned()];
        let opts = MessagesRequestOptions {
            reasoning_levels: &levels,
            default_effort: Some("low"),
            upstream_model: Some("gpt-5.5"),
            prompt_cache_key: Some("pck"),
        };
        let body = br#"{"model":"claude-opus-4-1","max_tokens":9,"thinking":{"type":"enabled","budget_tokens":60000},"messages":[{"role":"user","content":"x"}]}"#;
        let v: Value =
            sonic_rs::from_slice(&messages_to_responses(body, &opts).unwrap().body).unwrap();
        assert_eq!(v["reasoning"]["effort"].as_str(), Some("high"));
        assert_eq!(v["model"].as_str(), Some("gpt-5.5"));
        assert_eq!(v["prompt_cache_key"].as_str(), Some("pck"));
        let body = br#"{"model":"c","max_tokens":9,"messages":[{"role":"user","content":"x"}]}"#;
        let v: Value =
            sonic_rs::from_slice(&messages_to_responses(body, &opts).unwrap().body).unwrap();
        same(&v["reasoning"], r#"{"effort":"low"}"#);
        assert!(v.get("include").is_none());
        let body = br#"{"model":"c","max_tokens":9,"output_config":{"effort":"high"},"thinking":{"type":"adaptive"},"messages":[{"role":"user","content":"x"}]}"#;
        let v: Value =
            sonic_rs::from_slice(&messages_to_responses(body, &opts).unwrap().body).unwrap();
        same(&v["reasoning"], r#"{"effort":"high","summary":"auto"}"#);
    }

    #[test]
    fn rejections_name_the_field() {
        let bad = |body: &str, want: &str| {
            let e = messages_to_responses(body.as_bytes(), &MessagesRequestOptions::default())
                .unwrap_err();
            assert!(e.message.starts_with(want), "{} vs {want}", e.message);
        };
        bad("nope", "The request body is not valid JSON");
        bad("[]", "The request body must be a JSON object");
        bad(r#"{"max_tokens":5,"messages":[]}"#, "model: Field required");
        bad(
            r#"{"model":"m","messages":[]}"#,
            "max_tokens: Field required",
        );
        bad(
            r#"{"model":"m","max_tokens":5}"#,
            "messages: Field required",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"tool","content":"x"}]}"#,
            "messages.0.role",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"video"}]}]}"#,
            "messages.0.content.0.type",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result"}]}]}"#,
            "messages.0.content.0.tool_use_id",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"tools":[{"type":"bash_20250124","name":"bash"}],"messages":[]}"#,
            "tools.0.type",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"tools":[{"name":"t"}],"messages":[]}"#,
            "tools.0.input_schema",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"stop_sequences":[1],"messages":[]}"#,
            "stop_sequences.0",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"thinking":{"type":"sometimes"},"messages":[]}"#,
            "thinking.type",
        );
        bad(
            r#"{"model":"m","max_tokens":-1,"messages":[]}"#,
            "max_tokens",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"output_config":{"effort":"extreme"},"messages":[]}"#,
            "output_config.effort",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"output_config":{"format":{"type":"xml"}},"messages":[]}"#,
            "output_config.format.type",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"context_management":{"edits":[{"type":"forget_everything"}]},"messages":[]}"#,
            "context_management.edits.0.type",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":7}]},"messages":[]}"#,
            "context_management.edits.0.keep",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"metadata":{"user_id":{"id":1}},"messages":[]}"#,
            "metadata.user_id",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"temperature":"hot","messages":[]}"#,
            "temperature",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"mcp_servers":[{"type":"url","url":"https://x","name":"x"}],"messages":[]}"#,
            "mcp_servers",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"system","content":[{"type":"image","source":{"type":"url","url":"https://x"}}]}]}"#,
            "messages.0.content.0.type",
        );
        bad(
            r#"{"model":"m","max_tokens":5,"thinking":{"type":"adaptive","display":"loud"},"messages":[]}"#,
            "thinking.display",
        );
    }

    /// Claude Code 2.1: the second message is a system message (its agent types); it becomes
    /// a developer message in place, after the top-level system prompt and the first turn.
    #[test]
    fn system_messages_inside_messages_keep_their_position() {
        let (_, v) = tr(
            r#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"top","cache_control":{"type":"ephemeral"}}],
                "messages":[{"role":"user","content":"one"},
                  {"role":"system","content":[{"type":"text","text":"agents: a, b","cache_control":{"type":"ephemeral","ttl":"1h"}}]},
                  {"role":"assistant","content":"two"},
                  {"role":"system","content":"late note"},
                  {"role":"user","content":"three"}]}"#,
        );
        let roles: Vec<String> = v["input"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                format!(
                    "{}:{}",
                    i["role"].as_str().unwrap(),
                    i["content"][0]["text"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(
            roles,
            [
                "developer:top",
                "user:one",
                "developer:agents: a, b",
                "assistant:two",
                "developer:late note",
                "user:three"
            ]
        );
    }

    /// `thinking: adaptive` + `output_config.effort` set the effort as a budget does;
    /// `max` is Codex's `xhigh`; `display: omitted` asks no summary.
    #[test]
    fn adaptive_thinking_and_output_effort() {
        for (effort, want) in [
            ("low", "low"),
            ("medium", "medium"),
            ("high", "high"),
            ("max", "xhigh"),
        ] {
            let (r, v) = tr(&format!(
                r#"{{"model":"m","max_tokens":64000,"thinking":{{"type":"adaptive"}},"output_config":{{"effort":"{effort}"}},"messages":[{{"role":"user","content":"x"}}]}}"#
            ));
            assert!(r.thinking);
            same(
                &v["reasoning"],
                &format!(r#"{{"effort":"{want}","summary":"auto"}}"#),
            );
            same(&v["include"], r#"["reasoning.encrypted_content"]"#);
        }
        let (r, v) = tr(
            r#"{"model":"m","max_tokens":5,"thinking":{"type":"adaptive","display":"omitted"},"output_config":{"effort":"high"},"messages":[{"role":"user","content":"x"}]}"#,
        );
        assert!(r.thinking);
        same(&v["reasoning"], r#"{"effort":"high"}"#);
        // Effort without thinking: reasoning effort only, no summaries.
        let (r, v) = tr(
            r#"{"model":"m","max_tokens":5,"output_config":{"effort":"low"},"messages":[{"role":"user","content":"x"}]}"#,
        );
        assert!(!r.thinking);
        same(&v["reasoning"], r#"{"effort":"low"}"#);
        // A budget and the explicit effort: the explicit effort wins.
        let (_, v) = tr(
            r#"{"model":"m","max_tokens":5,"thinking":{"type":"enabled","budget_tokens":2000},"output_config":{"effort":"high"},"messages":[{"role":"user","content":"x"}]}"#,
        );
        assert_eq!(v["reasoning"]["effort"].as_str(), Some("high"));
    }

    fn thinking_history(edit: &str) -> Value {
        let body = format!(
            r#"{{"model":"m","max_tokens":5,"thinking":{{"type":"adaptive"}}{edit},"messages":[
              {{"role":"user","content":"q1"}},
              {{"role":"assistant","content":[{{"type":"thinking","thinking":"t1","signature":"sig1"}},{{"type":"text","text":"a1"}}]}},
              {{"role":"user","content":"q2"}},
              {{"role":"assistant","content":[{{"type":"redacted_thinking","data":"sig2"}},{{"type":"text","text":"a2"}}]}},
              {{"role":"user","content":"q3"}},
              {{"role":"assistant","content":[{{"type":"thinking","thinking":"t3","signature":"sig3"}},{{"type":"tool_use","id":"c","name":"f","input":{{}}}}]}},
              {{"role":"user","content":[{{"type":"tool_result","tool_use_id":"c","content":"ok"}}]}}]}}"#
        );
        tr(&body).1
    }

    fn kept_signatures(v: &Value) -> Vec<String> {
        v["input"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["type"].as_str() == Some("reasoning"))
            .map(|i| i["encrypted_content"].as_str().unwrap().to_owned())
            .collect()
    }

    /// `context_management` `clear_thinking_20251015`: `keep` applies to the history sent.
    #[test]
    fn clear_thinking_keeps_what_keep_says() {
        let all = ["sig1", "sig2", "sig3"];
        assert_eq!(kept_signatures(&thinking_history("")), all);
        for keep in [r#""all""#, r#"{"type":"all"}"#] {
            let edit = format!(
                r#","context_management":{{"edits":[{{"type":"clear_thinking_20251015","keep":{keep}}}]}}"#
            );
            assert_eq!(kept_signatures(&thinking_history(&edit)), all, "{keep}");
        }
        let edit = r#","context_management":{"edits":[{"type":"clear_thinking_20251015","keep":{"type":"thinking_turns","value":2}}]}"#;
        assert_eq!(kept_signatures(&thinking_history(edit)), ["sig2", "sig3"]);
        // No keep: Anthropic's default, the last turn's thinking only.
        let edit = r#","context_management":{"edits":[{"type":"clear_thinking_20251015"}]}"#;
        assert_eq!(kept_signatures(&thinking_history(edit)), ["sig3"]);
        // Tool-use clearing and compaction are accepted (not applied).
        let edit = r#","context_management":{"edits":[{"type":"clear_tool_uses_20250919","trigger":{"type":"input_tokens","value":30000},"keep":{"type":"tool_uses","value":3}},{"type":"compact_20260112"}]}"#;
        let v = thinking_history(edit);
        assert_eq!(kept_signatures(&v), all);
        assert!(v.get("context_management").is_none());
        // The text around cleared thinking stays.
        let edit = r#","context_management":{"edits":[{"type":"clear_thinking_20251015","keep":{"type":"thinking_turns","value":0}}]}"#;
        let v = thinking_history(edit);
        assert!(kept_signatures(&v).is_empty());
        assert_eq!(v["input"][1]["content"][0]["text"].as_str(), Some("a1"));
    }

    fn tool_history(edit: &str) -> Vec<(String, String)> {
        let mut msgs = vec![r#"{"role":"user","content":"go"}"#.to_owned()];
        for (i, tool) in ["Read", "Bash", "Read", "Bash"].iter().enumerate() {
            msgs.push(format!(
                r#"{{"role":"assistant","content":[{{"type":"tool_use","id":"c{i}","name":"{tool}","input":{{"n":{i}}}}}]}}"#
            ));
            msgs.push(format!(
                r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"c{i}","content":"result {i} {}"}}]}}"#,
                "word ".repeat(200)
            ));
        }
        let body = format!(
            r#"{{"model":"m","max_tokens":5{edit},"messages":[{}]}}"#,
            msgs.join(",")
        );
        let (_, v) = tr(&body);
        v["input"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| match i["type"].as_str()? {
                "function_call" => Some(("call".to_owned(), i["arguments"].as_str()?.to_owned())),
                "function_call_output" => Some((
                    "out".to_owned(),
                    i["output"].as_str()?.chars().take(8).collect(),
                )),
                _ => None,
            })
            .collect()
    }

    /// `clear_tool_uses_20250919`: past its trigger, older tool results (and inputs when
    /// asked) become a placeholder; the kept, the excluded and a too-small clearing stay.
    #[test]
    fn clear_tool_uses_clears_older_results() {
        let untouched = tool_history("");
        assert_eq!(untouched.len(), 8);
        assert!(untouched.iter().all(|(_, t)| t != CLEARED_RESULT));
        // Default trigger (100,000 input tokens) not reached: nothing cleared.
        let edit = r#","context_management":{"edits":[{"type":"clear_tool_uses_20250919"}]}"#;
        assert_eq!(tool_history(edit), untouched);
        let edit = r#","context_management":{"edits":[{"type":"clear_tool_uses_20250919","trigger":{"type":"tool_uses","value":3},"keep":{"type":"tool_uses","value":1},"exclude_tools":["Read"]}]}"#;
        let h = tool_history(edit);
        let cleared = &CLEARED_RESULT[..8];
        let outs: Vec<&str> = h
            .iter()
            .filter(|(k, _)| k == "out")
            .map(|(_, t)| t.as_str())
            .collect();
        assert_eq!(outs, ["result 0", cleared, "result 2", "result 3"]);
        assert_eq!(h[2], ("call".to_owned(), r#"{"n":1}"#.to_owned()));
        // Inputs too, by input tokens.
        let edit = r#","context_management":{"edits":[{"type":"clear_tool_uses_20250919","trigger":{"type":"input_tokens","value":100},"keep":{"type":"tool_uses","value":2},"clear_tool_inputs":true}]}"#;
        let h = tool_history(edit);
        assert_eq!(h[0], ("call".to_owned(), "{}".to_owned()));
        assert_eq!(h[1].1, cleared);
        assert_eq!(h[3].1, cleared);
        assert_eq!(h[4], ("call".to_owned(), r#"{"n":2}"#.to_owned()));
        assert_eq!(h[5].1, "result 2");
        // Too little to clear: nothing.
        let edit = r#","context_management":{"edits":[{"type":"clear_tool_uses_20250919","trigger":{"type":"tool_uses","value":1},"clear_at_least":{"type":"input_tokens","value":1000000}}]}"#;
        assert_eq!(tool_history(edit), untouched);
        // A malformed setting is refused.
        let e = messages_to_responses(
            br#"{"model":"m","max_tokens":5,"context_management":{"edits":[{"type":"clear_tool_uses_20250919","keep":3}]},"messages":[]}"#,
            &MessagesRequestOptions::default(),
        )
        .unwrap_err();
        assert!(
            e.message.starts_with("context_management.edits.0.keep"),
            "{}",
            e.message
        );
    }

    /// Every documented top-level field is accepted, and none reaches the upstream.
    #[test]
    fn documented_fields_are_accepted_and_dropped() {
        let (r, v) = tr(
            r#"{"model":"m","max_tokens":64000,"messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}],
            "metadata":{"user_id":"{\"device_id\":\"d\",\"account_uuid\":\"\",\"session_id\":\"s\"}"},
            "cache_control":{"type":"ephemeral"},"container":"cntr_1","diagnostics":{"previous_message_id":"msg_1"},
            "fallback_credit_token":"tok","fallbacks":"default","inference_geo":"us","mcp_servers":[],
            "service_tier":"auto","speed":"fast","stop_sequences":[],"stream":true,"temperature":1,"top_k":5,"top_p":0.99,
            "thinking":{"type":"disabled"},"tool_choice":{"type":"auto","disable_parallel_tool_use":false},"tools":[],
            "context_management":{"edits":[]},"output_config":{}}"#,
        );
        assert!(r.stream && !r.thinking);
        let mut keys: Vec<String> = v
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, _)| k.to_owned())
            .collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "input",
                "instructions",
                "model",
                "parallel_tool_calls",
                "store",
                "stream",
                "tool_choice"
            ]
        );
        // max_tokens 0 (cache pre-warming) is valid.
        tr(r#"{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#);
    }

    /// Structured outputs: `output_config.format` and the deprecated `output_format`.
    #[test]
    fn structured_outputs_map_to_text_format() {
        for body in [
            r#"{"model":"m","max_tokens":5,"output_config":{"format":{"type":"json_schema","schema":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false}}},"messages":[{"role":"user","content":"x"}]}"#,
            r#"{"model":"m","max_tokens":5,"output_format":{"type":"json_schema","schema":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false}},"messages":[{"role":"user","content":"x"}]}"#,
        ] {
            let (_, v) = tr(body);
            same(
                &v["text"],
                r#"{"format":{"type":"json_schema","name":"output","strict":true,"schema":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false}}}"#,
            );
        }
    }

    /// Claude Code's tool list: deferred tools (`defer_loading`) are sent in full, tool search
    /// tools are left out, tool results may carry `tool_reference` and `search_result` blocks.
    #[test]
    fn deferred_tools_tool_references_and_search_results() {
        let (_, v) = tr(r#"{"model":"m","max_tokens":5,
            "tools":[{"name":"Bash","description":"run","input_schema":{"type":"object","properties":{"command":{"type":"string"}}},"cache_control":{"type":"ephemeral"},"strict":false,"input_examples":[{"command":"ls"}]},
                     {"name":"WebFetch","input_schema":{"type":"object"},"defer_loading":true},
                     {"type":"tool_search_tool_regex_20251119","name":"tool_search_tool_regex"}],
            "messages":[{"role":"user","content":"x"},
              {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"ToolSearch","input":{"query":"select:WebFetch"}}]},
              {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"tool_reference","tool_name":"WebFetch"}]},
                {"type":"search_result","title":"Doc","source":"https://d","content":[{"type":"text","text":"body"}],"citations":{"enabled":true}}]}]}"#);
        let names: Vec<&str> = v["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["Bash", "WebFetch"]);
        assert!(v["tools"][0].get("cache_control").is_none());
        assert!(v["tools"][1].get("defer_loading").is_none());
        let input = v["input"].as_array().unwrap();
        same(
            &input[2],
            r#"{"type":"function_call_output","call_id":"t1","output":"Tool loaded: WebFetch"}"#,
        );
        assert_eq!(
            input[3]["content"][0]["text"].as_str(),
            Some(
                "Doc (https://d)
body"
            )
        );
    }

    /// The first request Claude Code 2.1.332 sent (`claude -p "say hi"`), as recorded in
    /// `tests/fixtures/claude-code/` (the integration suite replays all of them through the
    /// gateway to mock-codex).
    fn claude_code_request() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/claude-code/claude-code-2.1.332.jsonl"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let line: Value = sonic_rs::from_str(text.lines().next().unwrap()).unwrap();
        line["json"].clone()
    }

    fn claude_code_translated() -> (MessagesRequest, Value) {
        let body = sonic_rs::to_string(&claude_code_request()).unwrap();
        tr(&body)
    }

    #[test]
    fn claude_code_fixture_system_message_in_messages() {
        let req = claude_code_request();
        assert_eq!(req["messages"][1]["role"].as_str(), Some("system"));
        let (_, v) = claude_code_translated();
        let sys = &v["input"][2];
        assert_eq!(sys["role"].as_str(), Some("developer"));
        assert_eq!(
            sys["content"][0]["text"].as_str(),
            req["messages"][1]["content"][0]["text"].as_str()
        );
    }

    #[test]
    fn claude_code_fixture_adaptive_thinking_and_effort() {
        let req = claude_code_request();
        assert_eq!(req["thinking"]["type"].as_str(), Some("adaptive"));
        let effort = req["output_config"]["effort"].as_str().unwrap();
        let (r, v) = claude_code_translated();
        assert!(r.thinking);
        assert_eq!(v["reasoning"]["effort"].as_str(), Some(effort));
        same(&v["include"], r#"["reasoning.encrypted_content"]"#);
    }

    #[test]
    fn claude_code_fixture_context_management_metadata_and_max_tokens() {
        let req = claude_code_request();
        assert_eq!(
            req["context_management"]["edits"][0]["type"].as_str(),
            Some("clear_thinking_20251015")
        );
        assert!(req["metadata"]["user_id"]
            .as_str()
            .unwrap()
            .starts_with('{'));
        assert!(req["max_tokens"].as_u64().unwrap() >= 64000);
        let (_, v) = claude_code_translated();
        for f in [
            "context_management",
            "metadata",
            "max_tokens",
            "thinking",
            "output_config",
        ] {
            assert!(v.get(f).is_none(), "{f}");
        }
    }

    #[test]
    fn claude_code_fixture_cache_control_on_system_blocks() {
        let req = claude_code_request();
        assert!(req["system"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b.get("cache_control").is_some()));
        let (_, v) = claude_code_translated();
        let parts = v["input"][0]["content"].as_array().unwrap();
        assert_eq!(parts.len(), req["system"].as_array().unwrap().len());
        assert!(parts.iter().all(|p| p.get("cache_control").is_none()));
    }

    #[test]
    fn claude_code_fixture_tools_with_large_schemas() {
        let req = claude_code_request();
        let tools_in = req["tools"].as_array().unwrap();
        assert!(tools_in.len() >= 10);
        let (_, v) = claude_code_translated();
        let tools = v["tools"].as_array().unwrap();
        assert_eq!(tools.len(), tools_in.len());
        for (t, src) in tools.iter().zip(tools_in.iter()) {
            assert_eq!(t["name"], src["name"]);
            assert_eq!(t["parameters"], src["input_schema"]);
            assert!(t.get("defer_loading").is_none());
        }
    }
}
