//! Chat Completions translation (`codex_protocol::chat`): the request (`chat_to_responses`),
//! the per-event stream translation (`ChatStream::on_event`, the cost added to every forwarded
//! event of a `/v1/chat/completions` stream) and the non-stream aggregation
//! (`ChatAggregator`), on the exact events mock-codex sends.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use benches::mock::render_answer;
use codex_protocol::{
    chat::{chat_to_responses, ChatAggregator, ChatRequestOptions, ChatStream, ToolNameMap},
    sse::{SseEvent, SseSplitter},
};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};

fn events(deltas: usize) -> Vec<SseEvent> {
    let mut s = SseSplitter::default();
    for e in render_answer("gpt-5.1-codex", &"tok ".repeat(deltas), deltas) {
        s.push(&e);
    }
    let mut out = Vec::new();
    while let Some(ev) = s.next_event().unwrap() {
        out.push(ev);
    }
    out
}

const REQUEST: &[u8] = br#"{"model":"gpt-5.1-codex","stream":true,"stream_options":{"include_usage":true},"temperature":0.2,"max_tokens":512,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello."}],"tools":[{"type":"function","function":{"name":"run","description":"Run a command","parameters":{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]}}}]}"#;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("chat");
    g.throughput(Throughput::Elements(1));
    g.bench_function("chat_to_responses/small", |b| {
        b.iter(|| {
            black_box(
                chat_to_responses(black_box(REQUEST), &ChatRequestOptions::default()).unwrap(),
            )
        })
    });

    let evs = events(1000);
    let delta = evs
        .iter()
        .find(|e| e.event_type() == "response.output_text.delta")
        .unwrap()
        .clone();
    // Steady state: one more text delta on a started stream.
    let mut started = ChatStream::new("gpt-5.1-codex", 1_700_000_000, true, ToolNameMap::new());
    let mut out = Vec::with_capacity(4096);
    for e in evs.iter().take(5) {
        started.on_event(e.event_type(), &e.data, &mut out);
    }
    g.bench_function("stream_on_event/text_delta", |b| {
        b.iter(|| {
            out.clear();
            started.on_event(
                black_box("response.output_text.delta"),
                black_box(&delta.data),
                &mut out,
            );
            black_box(&out);
        })
    });

    g.throughput(Throughput::Elements(evs.len() as u64));
    g.bench_function(format!("stream_whole_answer/{}_events", evs.len()), |b| {
        let mut out = Vec::with_capacity(1 << 16);
        b.iter(|| {
            out.clear();
            let mut s = ChatStream::new("gpt-5.1-codex", 1_700_000_000, true, ToolNameMap::new());
            for e in &evs {
                s.on_event(e.event_type(), &e.data, &mut out);
            }
            assert!(s.is_finished());
            black_box(&out);
        })
    });
    g.bench_function(
        format!("aggregate_whole_answer/{}_events", evs.len()),
        |b| {
            b.iter(|| {
                let mut a = ChatAggregator::new("gpt-5.1-codex", 1_700_000_000, ToolNameMap::new());
                for e in &evs {
                    a.on_event(e.event_type(), &e.data);
                }
                black_box(a.finish().unwrap())
            })
        },
    );
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
