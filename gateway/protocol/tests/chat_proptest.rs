//! Property test: arbitrary well-formed upstream event sequences (text, reasoning, parallel
//! tool calls interleaved at random, noise events, any terminal or EOF, junk after the
//! terminal) always translate into a valid chat stream, and the aggregator agrees with it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod chat_support;

use chat_support::{check, frames, run_aggregate, run_stream, Event};
use codex_protocol::chat::{chat_to_responses, ChatRequestOptions, ToolNameMap};
use proptest::prelude::*;
use sonic_rs::{json, JsonContainerTrait, JsonValueMutTrait, JsonValueTrait, Value};

const LONG_TOOL: &str =
    "mcp__property_test_server__a_tool_name_that_is_definitely_longer_than_sixty_four_characters";

#[derive(Debug, Clone)]
enum Item {
    Message(Vec<String>),
    Reasoning(Vec<Vec<String>>),
    /// (long name?, argument chunks, stream deltas?, custom tool?)
    Call(bool, Vec<String>, bool, bool),
}

#[derive(Debug, Clone)]
enum Terminal {
    Completed { with_output: bool },
    Incomplete(&'static str),
    Failed,
    Error,
    Eof,
}

fn text() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[a-z \"\\\\\n\t{}:,é😀]{0,6}").unwrap()
}

fn item() -> impl Strategy<Value = Item> {
    prop_oneof![
        prop::collection::vec(text(), 0..4).prop_map(Item::Message),
        prop::collection::vec(prop::collection::vec(text(), 0..3), 1..3).prop_map(Item::Reasoning),
        (
            any::<bool>(),
            prop::collection::vec(text(), 0..4),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(l, a, d, c)| Item::Call(l, a, d, c)),
    ]
}

fn terminal() -> impl Strategy<Value = Terminal> {
    prop_oneof![
        3 => any::<bool>().prop_map(|with_output| Terminal::Completed { with_output }),
        1 => Just(Terminal::Incomplete("max_output_tokens")),
        1 => Just(Terminal::Incomplete("content_filter")),
        1 => Just(Terminal::Failed),
        1 => Just(Terminal::Error),
        1 => Just(Terminal::Eof),
    ]
}

fn ev(ty: &str, v: Value) -> Event {
    let mut v = v;
    if let Some(o) = v.as_object_mut() {
        o.insert("type", ty);
    }
    (ty.to_owned(), sonic_rs::to_vec(&v).unwrap())
}

/// What the client should see for one call.
#[derive(Debug, Clone)]
struct ExpectedCall {
    call_id: String,
    name: String,
    arguments: String,
}

struct Built {
    events: Vec<Event>,
    content: String,
    calls: Vec<ExpectedCall>,
    success: bool,
    finish_reason: Option<&'static str>,
}

/// Builds the per-item event queues, interleaves them with `picks`, inserts noise, then the
/// terminal (at the end for successes, at `cut` for failures / EOF) and junk after it.
fn build(
    items: &[Item],
    picks: &[u8],
    noise: &[u8],
    term: &Terminal,
    cut: usize,
    short_name: &str,
) -> Built {
    let mut queues: Vec<Vec<Event>> = Vec::new();
    let mut final_items: Vec<Value> = Vec::new();
    for (oi, it) in items.iter().enumerate() {
        let mut q = Vec::new();
        match it {
            Item::Message(chunks) => {
                let id = format!("msg_{oi}");
                q.push(ev("response.output_item.added", json!({"output_index": oi, "item": {"id": id, "type": "message", "role": "assistant", "content": []}})));
                q.push(ev("response.content_part.added", json!({"item_id": id, "output_index": oi, "content_index": 0, "part": {"type": "output_text", "text": ""}})));
                for c in chunks {
                    q.push(ev(
                        "response.output_text.delta",
                        json!({"item_id": id, "output_index": oi, "content_index": 0, "delta": c}),
                    ));
                }
                let full: String = chunks.concat();
                let item = json!({"id": id, "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": full, "annotations": []}]});
                q.push(ev(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": oi, "content_index": 0, "text": full}),
                ));
                q.push(ev(
                    "response.output_item.done",
                    json!({"output_index": oi, "item": item.clone()}),
                ));
                final_items.push(item);
            }
            Item::Reasoning(parts) => {
                let id = format!("rs_{oi}");
                q.push(ev("response.output_item.added", json!({"output_index": oi, "item": {"id": id, "type": "reasoning", "summary": []}})));
                for (si, p) in parts.iter().enumerate() {
                    q.push(ev(
                        "response.reasoning_summary_part.added",
                        json!({"item_id": id, "output_index": oi, "summary_index": si}),
                    ));
                    for c in p {
                        q.push(ev("response.reasoning_summary_text.delta", json!({"item_id": id, "output_index": oi, "summary_index": si, "delta": c})));
                    }
                }
                let summary: Vec<Value> = parts
                    .iter()
                    .map(|p| json!({"type": "summary_text", "text": p.concat()}))
                    .collect();
                let item = json!({"id": id, "type": "reasoning", "encrypted_content": "enc", "summary": summary});
                q.push(ev(
                    "response.output_item.done",
                    json!({"output_index": oi, "item": item.clone()}),
                ));
                final_items.push(item);
            }
            Item::Call(long, chunks, deltas, custom) => {
                let id = format!("fc_{oi}");
                let call_id = format!("call_{oi}");
                let name = if *long { short_name } else { "get_weather" };
                let (ty, field, dty, donety) = if *custom {
                    (
                        "custom_tool_call",
                        "input",
                        "response.custom_tool_call_input.delta",
                        "response.custom_tool_call_input.done",
                    )
                } else {
                    (
                        "function_call",
                        "arguments",
                        "response.function_call_arguments.delta",
                        "response.function_call_arguments.done",
                    )
                };
                let mut added = json!({"id": id, "type": ty, "call_id": call_id, "name": name});
                added.as_object_mut().unwrap().insert(field, "");
                q.push(ev(
                    "response.output_item.added",
                    json!({"output_index": oi, "item": added}),
                ));
                if *deltas {
                    for c in chunks {
                        q.push(ev(
                            dty,
                            json!({"item_id": id, "output_index": oi, "delta": c}),
                        ));
                    }
                }
                let full: String = chunks.concat();
                let mut done = json!({"item_id": id, "output_index": oi});
                done.as_object_mut().unwrap().insert(field, full.as_str());
                q.push(ev(donety, done));
                let mut item = json!({"id": id, "type": ty, "call_id": call_id, "name": name});
                item.as_object_mut().unwrap().insert(field, full.as_str());
                q.push(ev(
                    "response.output_item.done",
                    json!({"output_index": oi, "item": item.clone()}),
                ));
                final_items.push(item);
            }
        }
        queues.push(q);
    }

    // Interleave the queues (per-item order kept), sprinkling noise events.
    let mut body = Vec::new();
    let mut heads = vec![0usize; queues.len()];
    let mut step = 0usize;
    loop {
        let live: Vec<usize> = (0..queues.len())
            .filter(|&i| heads[i] < queues[i].len())
            .collect();
        if live.is_empty() {
            break;
        }
        let pick = picks.get(step % picks.len().max(1)).copied().unwrap_or(0) as usize;
        let q = live[pick % live.len()];
        body.push(queues[q][heads[q]].clone());
        heads[q] += 1;
        if noise.get(step % noise.len().max(1)).copied().unwrap_or(0) % 7 == 0 {
            body.push(ev(
                "codex.rate_limits",
                json!({"rate_limits": {"primary": {"used_percent": 1.0}}}),
            ));
        }
        step += 1;
    }

    let usage = json!({"input_tokens": 11, "input_tokens_details": {"cached_tokens": 3}, "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 18});
    let (success, finish_reason) = match term {
        Terminal::Completed { .. } => (true, None),
        Terminal::Incomplete(r) => (
            true,
            Some(if *r == "content_filter" {
                "content_filter"
            } else {
                "length"
            }),
        ),
        _ => (false, None),
    };
    if !success {
        body.truncate(cut.min(body.len()));
    }

    let mut events = vec![
        ev(
            "response.created",
            json!({"response": {"id": "resp_prop", "created_at": 1_700_000_000u64, "status": "in_progress", "output": []}}),
        ),
        ev(
            "response.in_progress",
            json!({"response": {"id": "resp_prop", "status": "in_progress"}}),
        ),
    ];
    events.extend(body);

    // Expectations from the events actually delivered.
    let mut content = String::new();
    let mut calls: Vec<ExpectedCall> = Vec::new();
    let mut call_ids: Vec<String> = Vec::new();
    for (ty, data) in &events {
        let v: Value = sonic_rs::from_slice(data).unwrap();
        match ty.as_str() {
            "response.output_text.delta" => content.push_str(v["delta"].as_str().unwrap()),
            "response.output_item.added" if v["item"]["call_id"].is_str() => {
                let call_id = v["item"]["call_id"].as_str().unwrap().to_owned();
                let name = v["item"]["name"].as_str().unwrap();
                calls.push(ExpectedCall {
                    call_id: call_id.clone(),
                    name: if name == short_name {
                        LONG_TOOL.to_owned()
                    } else {
                        name.to_owned()
                    },
                    arguments: String::new(),
                });
                call_ids.push(format!("fc_{}", v["output_index"].as_u64().unwrap()));
            }
            "response.function_call_arguments.delta" | "response.custom_tool_call_input.delta" => {
                let i = call_ids
                    .iter()
                    .position(|c| c == v["item_id"].as_str().unwrap())
                    .unwrap();
                calls[i].arguments.push_str(v["delta"].as_str().unwrap());
            }
            "response.function_call_arguments.done" | "response.custom_tool_call_input.done" => {
                let i = call_ids
                    .iter()
                    .position(|c| c == v["item_id"].as_str().unwrap())
                    .unwrap();
                let full = v["arguments"].as_str().or(v["input"].as_str()).unwrap();
                // The stream sends the full text only when no delta was seen; either way the
                // client ends up with the full arguments.
                calls[i].arguments = full.to_owned();
            }
            _ => {}
        }
    }

    match term {
        Terminal::Completed { with_output } => {
            let output = if *with_output {
                Value::from(final_items)
            } else {
                json!([])
            };
            events.push(ev("response.completed", json!({"response": {"id": "resp_prop", "status": "completed", "output": output, "usage": usage}})));
        }
        Terminal::Incomplete(r) => {
            events.push(ev("response.incomplete", json!({"response": {"id": "resp_prop", "status": "incomplete", "incomplete_details": {"reason": r}, "output": [], "usage": usage}})));
        }
        Terminal::Failed => {
            events.push(ev("response.failed", json!({"response": {"id": "resp_prop", "status": "failed", "error": {"code": "server_error", "message": "boom \"quoted\""}, "usage": usage}})));
        }
        Terminal::Error => {
            events.push(ev(
                "error",
                json!({"code": "rate_limit_exceeded", "message": "slow down", "param": null}),
            ));
        }
        Terminal::Eof => {}
    }
    if !matches!(term, Terminal::Eof) {
        // Junk after the terminal must be ignored.
        events.push(ev(
            "response.output_text.delta",
            json!({"item_id": "late", "output_index": 99, "delta": "LATE"}),
        ));
        events.push(ev(
            "response.completed",
            json!({"response": {"id": "late", "output": []}}),
        ));
    }
    Built {
        events,
        content,
        calls,
        success,
        finish_reason,
    }
}

fn name_map() -> (ToolNameMap, String) {
    let body = format!(
        r#"{{"model":"gpt-5","messages":[{{"role":"user","content":"x"}}],"tools":[{{"type":"function","function":{{"name":"{LONG_TOOL}"}}}}]}}"#
    );
    let req = chat_to_responses(body.as_bytes(), &ChatRequestOptions::default()).unwrap();
    let short = req.name_map.shortened(LONG_TOOL).unwrap().to_owned();
    (req.name_map, short)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn stream_is_always_well_formed(
        items in prop::collection::vec(item(), 0..6),
        picks in prop::collection::vec(any::<u8>(), 1..40),
        noise in prop::collection::vec(any::<u8>(), 1..10),
        term in terminal(),
        cut in 0usize..40,
        include_usage in any::<bool>(),
    ) {
        let (names, short) = name_map();
        let b = build(&items, &picks, &noise, &term, cut, &short);
        let (stream, out) = run_stream(&b.events, include_usage, names.clone());
        let f = frames(&out);
        let s = check(&f);

        // Content and tool calls arrive intact, in order, with stable indexes and restored names.
        prop_assert_eq!(&s.content, &b.content);
        prop_assert_eq!(s.tools.len(), b.calls.len());
        for (got, want) in s.tools.iter().zip(&b.calls) {
            prop_assert_eq!(&got.id, &want.call_id);
            prop_assert_eq!(&got.name, &want.name);
            prop_assert_eq!(&got.arguments, &want.arguments);
        }

        if b.success {
            prop_assert!(s.done && s.error.is_none());
            let want_reason = b.finish_reason.unwrap_or(if b.calls.is_empty() { "stop" } else { "tool_calls" });
            prop_assert_eq!(s.finish_reason.as_deref(), Some(want_reason));
            prop_assert_eq!(s.usage.is_some(), include_usage);
            prop_assert_eq!(s.id.as_str(), "chatcmpl-resp_prop");
            prop_assert_eq!(stream.usage().map(|u| u.total_tokens), Some(18));
        } else {
            prop_assert!(!s.done);
            let e = s.error.as_ref().unwrap();
            let code = e["error"]["code"].as_str().unwrap();
            let want = match term {
                Terminal::Failed => "server_error",
                Terminal::Error => "rate_limit_exceeded",
                _ => "stream_disconnected",
            };
            prop_assert_eq!(code, want);
            prop_assert!(stream.failure().is_some());
        }

        // The aggregator agrees with the stream.
        let agg = run_aggregate(&b.events, names);
        match agg.finish() {
            Ok(body) => {
                prop_assert!(b.success);
                let v: Value = sonic_rs::from_slice(&body).unwrap();
                let m = &v["choices"][0]["message"];
                // Items are ordered by output_index, the stream by arrival: compare text
                // exactly only when there is one message, tool calls by id.
                let messages = items.iter().filter(|i| matches!(i, Item::Message(_))).count();
                let agg_content = m["content"].as_str().unwrap_or("");
                if messages <= 1 {
                    prop_assert_eq!(agg_content, s.content.as_str());
                } else {
                    prop_assert_eq!(agg_content.len(), s.content.len());
                }
                let calls = m["tool_calls"].as_array().map_or(0, |a| a.len());
                prop_assert_eq!(calls, s.tools.len());
                for i in 0..calls {
                    let c = &m["tool_calls"][i];
                    let t = s.tools.iter().find(|t| Some(t.id.as_str()) == c["id"].as_str()).unwrap();
                    prop_assert_eq!(c["function"]["name"].as_str(), Some(t.name.as_str()));
                    prop_assert_eq!(c["function"]["arguments"].as_str(), Some(t.arguments.as_str()));
                }
                prop_assert_eq!(v["choices"][0]["finish_reason"].as_str(), s.finish_reason.as_deref());
                prop_assert_eq!(m["reasoning_content"].as_str().unwrap_or(""), s.reasoning.as_str());
            }
            Err(e) => {
                prop_assert!(!b.success);
                prop_assert!(!e.message.is_empty());
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_break_the_stream(
        events in prop::collection::vec(
            (prop::sample::select(vec![
                "response.output_text.delta", "response.output_item.added", "response.output_item.done",
                "response.function_call_arguments.delta", "response.function_call_arguments.done",
                "response.reasoning_summary_text.delta", "response.completed", "response.failed", "error", "",
            ]), prop::collection::vec(any::<u8>(), 0..40)),
            0..12,
        ),
        include_usage in any::<bool>(),
    ) {
        let events: Vec<Event> = events.into_iter().map(|(t, d)| (t.to_owned(), d)).collect();
        let (_, out) = run_stream(&events, include_usage, ToolNameMap::new());
        check(&frames(&out));
        let _ = run_aggregate(&events, ToolNameMap::new()).finish();
    }
}
