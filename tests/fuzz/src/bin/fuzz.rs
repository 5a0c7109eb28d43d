//! The libFuzzer driver: one binary for every target, chosen by `FUZZ_TARGET` (one link of
//! the gateway instead of one per target). Built by `tests/fuzz/run.sh` with coverage
//! instrumentation; see docs/fuzzing.md.
#![no_main]
// libfuzzer-sys exports the `#[no_mangle]` entry point libFuzzer calls.
#![allow(unsafe_code)]

use std::sync::OnceLock;

static TARGET: OnceLock<fn(&[u8])> = OnceLock::new();

fn target() -> fn(&[u8]) {
    *TARGET.get_or_init(|| {
        let name = std::env::var("FUZZ_TARGET").unwrap_or_default();
        codex_gateway_fuzz::target(&name).unwrap_or_else(|| {
            let names: Vec<&str> = codex_gateway_fuzz::TARGETS
                .iter()
                .map(|(n, _)| *n)
                .collect();
            eprintln!("FUZZ_TARGET must be one of: {}", names.join(" "));
            std::process::exit(2)
        })
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| target()(data));
