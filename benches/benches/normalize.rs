//! Request normalization (`codex_protocol::normalize::normalize_responses`) of the client's
//! `/v1/responses` body, for a small request, a request the Codex CLI 0.171.0 sent (38 KB,
//! recorded: the fuzz corpus' `seed-codex-cli-0.171.0-recorded`) and a ~1 MiB one (a long
//! Codex conversation: many input items, tools, large tool outputs); and the JSON nesting-depth
//! scan (`codex_protocol::depth::check`) every request body passes first, on the same bodies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use codex_protocol::normalize::normalize_responses;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use serde_json::{json, Value};

fn small() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": "gpt-5.1-codex",
        "instructions": "You are a helpful assistant.",
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "Say hello."}]}],
        "stream": true,
        "temperature": 0.2,
        "max_output_tokens": 512,
        "store": true,
        "prompt_cache_key": "conv-1",
    }))
    .unwrap()
}

/// About `target` bytes: a Codex-style conversation with tools and tool outputs.
fn large(target: usize) -> Vec<u8> {
    let tools: Vec<Value> = (0..20)
        .map(|i| {
            json!({"type": "function", "name": format!("tool_{i}"),
                   "description": "Runs a command in the workspace and returns its output.",
                   "parameters": {"type": "object", "properties": {
                       "cmd": {"type": "string"}, "workdir": {"type": "string"},
                       "timeout_ms": {"type": "integer"}}, "required": ["cmd"]}})
        })
        .collect();
    let chunk = "fn main() { println!(\"hello, world\"); }\n".repeat(40);
    let mut input = Vec::new();
    let mut size = 0;
    let mut i = 0;
    while size < target {
        let items = [
            json!({"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": format!("Step {i}: run the tests")}]}),
            json!({"type": "function_call", "call_id": format!("call_{i}"), "name": "tool_1",
                   "arguments": "{\"cmd\":\"cargo test\"}"}),
            json!({"type": "function_call_output", "call_id": format!("call_{i}"), "output": chunk}),
        ];
        for it in items {
            size += it.to_string().len();
            input.push(it);
        }
        i += 1;
    }
    serde_json::to_vec(&json!({
        "model": "gpt-5.1-codex",
        "instructions": "You are Codex, a coding agent.".repeat(100),
        "input": input,
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "stream": true,
        "store": false,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "conv-1",
    }))
    .unwrap()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("normalize_responses");
    let recorded = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fuzz/corpus/normalize/seed-codex-cli-0.171.0-recorded"
    ))
    .expect("the recorded Codex CLI request");
    // The corpus file's first byte is the fuzz target's mode; the rest is the body.
    let codex_cli = recorded[1..].to_vec();
    let bodies = [
        ("small", small()),
        ("codex_cli", codex_cli),
        ("1MiB", large(1 << 20)),
    ];
    for (name, body) in &bodies {
        normalize_responses(body).unwrap();
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(format!("{name}_{}b", body.len()), |b| {
            b.iter(|| black_box(normalize_responses(black_box(body)).unwrap()))
        });
    }
    g.finish();
    // The nesting-depth scan every body now passes before any parser (issue 28): what it
    // adds per request, beside the normaliser above.
    let mut g = c.benchmark_group("json_depth_check");
    for (name, body) in &bodies {
        assert!(codex_protocol::depth::check(body));
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(format!("{name}_{}b", body.len()), |b| {
            b.iter(|| black_box(codex_protocol::depth::check(black_box(body))))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
