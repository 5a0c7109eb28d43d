//! Lazy JSON field extraction with sonic-rs (`codex_protocol::events`): the per-event work the
//! gateway does on every forwarded event (`event_type`) and once per response
//! (`usage_of_terminal`), against `serde_json` full parses as a yardstick.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use benches::mock::render_answer;
use codex_protocol::{
    events::{classify_event, event_type, usage_of_terminal},
    sse::SseSplitter,
};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};

/// The `data:` payload of every event of a default answer with `deltas` deltas.
fn payloads(deltas: usize) -> Vec<Vec<u8>> {
    let mut s = SseSplitter::default();
    for e in render_answer("gpt-5.1-codex", &"tok ".repeat(deltas), deltas) {
        s.push(&e);
    }
    let mut out = Vec::new();
    while let Some(ev) = s.next_event().unwrap() {
        out.push(ev.data.to_vec());
    }
    out
}

fn bench(c: &mut Criterion) {
    let small = payloads(8);
    let delta = small[4].clone();
    let completed = small.last().unwrap().clone();
    // A terminal event with a large output (1,000 deltas of text repeated in `output`).
    let big_completed = payloads(1000).last().unwrap().clone();
    assert_eq!(event_type(&delta), Some("response.output_text.delta"));
    assert!(usage_of_terminal(&completed).is_some());

    let mut g = c.benchmark_group("events");
    g.throughput(Throughput::Elements(1));
    g.bench_function("event_type/delta", |b| {
        b.iter(|| black_box(event_type(black_box(&delta))))
    });
    g.bench_function(format!("event_type/completed_{}b", completed.len()), |b| {
        b.iter(|| black_box(event_type(black_box(&completed))))
    });
    g.bench_function(
        format!("event_type/completed_{}b", big_completed.len()),
        |b| b.iter(|| black_box(event_type(black_box(&big_completed)))),
    );
    g.bench_function("classify_event/delta", |b| {
        b.iter(|| black_box(classify_event(black_box("response.output_text.delta"))))
    });
    g.bench_function(format!("usage_of_terminal/{}b", completed.len()), |b| {
        b.iter(|| black_box(usage_of_terminal(black_box(&completed))))
    });
    g.bench_function(format!("usage_of_terminal/{}b", big_completed.len()), |b| {
        b.iter(|| black_box(usage_of_terminal(black_box(&big_completed))))
    });
    g.bench_function("serde_json_full_parse/delta", |b| {
        b.iter(|| {
            black_box(serde_json::from_slice::<serde_json::Value>(black_box(&delta)).unwrap())
        })
    });
    g.bench_function(
        format!("serde_json_full_parse/completed_{}b", completed.len()),
        |b| {
            b.iter(|| {
                black_box(
                    serde_json::from_slice::<serde_json::Value>(black_box(&completed)).unwrap(),
                )
            })
        },
    );
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
