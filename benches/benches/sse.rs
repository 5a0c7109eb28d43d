//! SSE event splitting (`codex_protocol::sse::SseSplitter`): the per-event framing cost of the
//! gateway's upstream read loop, on the exact bytes mock-codex sends.
//!
//! Inputs: a default answer (16 events, about 5 KiB) and a long answer (1,000 deltas), fed as
//! one buffer, one event per push (one HTTP/2 DATA frame per event, the production shape), and
//! in 61-byte pieces (worst case: boundaries split across pushes).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use benches::mock::render_answer;
use bytes::Bytes;
use codex_protocol::sse::SseSplitter;
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};

fn long_text(n: usize) -> String {
    "tok ".repeat(n)
}

fn split_all(chunks: &[&[u8]]) -> usize {
    let mut s = SseSplitter::default();
    let mut n = 0;
    for c in chunks {
        s.push(c);
        while let Some(ev) = s.next_event().unwrap() {
            black_box(&ev);
            n += 1;
        }
    }
    n
}

fn bench(c: &mut Criterion) {
    let inputs = [
        (
            "answer16",
            render_answer("gpt-5.1-codex", benches::mock::DEFAULT_TEXT, 8),
        ),
        (
            "answer1k",
            render_answer("gpt-5.1-codex", &long_text(1000), 1000),
        ),
    ];
    let mut g = c.benchmark_group("sse_split");
    for (name, events) in &inputs {
        let whole: Vec<u8> = events.iter().flat_map(|e| e.iter().copied()).collect();
        let n_events = events.len();
        g.throughput(Throughput::Elements(n_events as u64));
        let per_event: Vec<&[u8]> = events.iter().map(Bytes::as_ref).collect();
        g.bench_function(format!("{name}/per_event_push"), |b| {
            b.iter(|| assert_eq!(split_all(black_box(&per_event)), n_events))
        });
        let one = [whole.as_slice()];
        g.bench_function(format!("{name}/one_push"), |b| {
            b.iter(|| assert_eq!(split_all(black_box(&one)), n_events))
        });
        let small: Vec<&[u8]> = whole.chunks(61).collect();
        g.bench_function(format!("{name}/61b_pushes"), |b| {
            b.iter(|| assert_eq!(split_all(black_box(&small)), n_events))
        });
    }
    // A splitter that lives as long as the stream, one delta at a time (steady state).
    let delta = render_answer("gpt-5.1-codex", &long_text(4), 4)[4].clone();
    g.throughput(Throughput::Elements(1));
    g.bench_function("steady_delta", |b| {
        b.iter_batched_ref(
            SseSplitter::default,
            |s| {
                s.push(black_box(&delta));
                black_box(s.next_event().unwrap().unwrap());
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
