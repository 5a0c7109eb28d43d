#![allow(clippy::unwrap_used)]
mod chat_support;
use codex_protocol::chat::*;
#[test]
fn bench() {
    let events = chat_support::fixture("text.sse");
    let mut deltas = Vec::new();
    for (t, d) in &events { if t == "response.output_text.delta" { deltas.push((t.clone(), d.clone())); } }
    let t = std::time::Instant::now();
    let mut s = ChatStream::new("gpt-5", 1, false, ToolNameMap::new());
    let mut out = Vec::with_capacity(1 << 20);
    let n = 1_000_000;
    for i in 0..n { let (ty, d) = &deltas[i % deltas.len()]; s.on_event(ty, d, &mut out); if out.len() > 1 << 19 { out.clear(); } }
    println!("stream delta: {:?}/event (data {} bytes)", t.elapsed() / n as u32, deltas[0].1.len());
    let t = std::time::Instant::now();
    let mut a = ChatAggregator::new("gpt-5", 1, ToolNameMap::new());
    for i in 0..n { let (ty, d) = &deltas[i % deltas.len()]; a.on_event(ty, d); }
    println!("agg delta: {:?}/event", t.elapsed() / n as u32);
    let all = chat_support::fixture("parallel_tools.sse");
    let t = std::time::Instant::now();
    let n = 20_000;
    for _ in 0..n { let mut s = ChatStream::new("gpt-5", 1, true, ToolNameMap::new()); out.clear(); for (ty, d) in &all { s.on_event(ty, d, &mut out); } }
    println!("whole tools stream ({} events): {:?}", all.len(), t.elapsed() / n as u32);
}
