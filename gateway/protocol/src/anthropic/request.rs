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

use sonic_rs::{json, Array, JsonContainerTrait, JsonValueTrait, Value};

use crate::chat::{request::clamp_effort, ToolNameMap, MAX_TOOL_NAME_LEN};

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
        Some(m) if m.as_u64().is_none_or(|n| n == 0) => {
            return Err(err("max_tokens: must be a positive integer"))
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
        tools.push(tool(t, i, &mut names, &reserved)?);
    }

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
            "assistant" => assistant_items(&mut input, content, i, &mut names, &reserved)?,
            other => {
                return Err(err(format!(
                    "messages.{i}.role: Input should be 'user' or 'assistant', got '{other}'"
                )))
            }
        }
    }

    let thinking = match v.get("thinking").filter(|t| !t.is_null()) {
        None => None,
        Some(t) => {
            let ty = t
                .get("type")
                .and_then(|x| x.as_str())
                .ok_or_else(|| err("thinking.type: Field required"))?;
            match ty {
                "enabled" => {
                    let budget = t.get("budget_tokens").and_then(|b| b.as_u64());
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
    let explicit_effort = v
        .get("output_config")
        .and_then(|o| o.get("effort"))
        .and_then(|e| e.as_str());
    let effort = explicit_effort
        .or(thinking.flatten())
        .or(opts.default_effort)
        .map(|e| clamp_effort(e, opts.reasoning_levels));

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
        if thinking.is_some() {
            r.insert(&"summary", "auto");
        }
        out.insert(&"reasoning", Value::from(r));
    }
    if thinking.is_some() {
        out.insert(&"include", json!(["reasoning.encrypted_content"]));
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

/// One tool definition.
fn tool(
    t: &Value,
    i: usize,
    names: &mut ToolNameMap,
    reserved: &[&str],
) -> Result<Value, MessagesError> {
    if !t.is_object() {
        return Err(err(format!("tools.{i}: must be an object")));
    }
    let ty = t.get("type").and_then(|x| x.as_str()).unwrap_or("custom");
    if ty.starts_with("web_search") {
        return Ok(json!({"type": "web_search"}));
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
    Ok(Value::from(o))
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
                                    _ => {
                                        return Err(err(format!(
                                            "{cpath}.type: Input should be 'text', 'image' or 'document'"
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
            // Echoed assistant-only blocks and cache hints carry nothing for the upstream.
            "thinking" | "redacted_thinking" => {}
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
            // Server-side tool traffic of Anthropic's own tools has no Codex counterpart.
            "server_tool_use" | "web_search_tool_result" => {}
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
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"x"}]}"#,
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
    }
}
