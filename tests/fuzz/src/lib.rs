//! Coverage-guided fuzz targets for the gateway's parsers, on the stable toolchain.
//!
//! # Key Components
//! - [`TARGETS`]: every target by name; each is a plain `fn(&[u8])` that panics when an
//!   invariant breaks (more than "no panic": whole vs split input, round trips).
//! - [`run`]: dispatches by name. The libFuzzer driver (`src/bin/fuzz.rs`, feature
//!   `libfuzzer`) and the corpus replay (`tests/replay.rs`, an ordinary `cargo test`) both
//!   go through it, so an input that once failed keeps being checked in every test run.
//! - [`memio`]: an in-memory monoio stream delivering chosen segments, for the read loops.
//!
//! # Usage
//! `tests/fuzz/run.sh` builds the instrumented driver and runs it; docs/fuzzing.md says how.

pub mod memio;

/// The targets.
pub mod targets {
    pub mod anthropic;
    pub mod chat;
    pub mod depth;
    pub mod encoding;
    pub mod h1;
    pub mod import;
    pub mod normalize;
    pub mod resp;
    pub mod sse;
    mod translate;
    pub mod ws;
    pub mod ws_ext;
}

/// A target: its name and its entry.
pub type Target = (&'static str, fn(&[u8]));

/// Every target: its name (also its corpus directory under `tests/fuzz/corpus/`) and entry.
pub const TARGETS: &[Target] = &[
    ("h1", targets::h1::run),
    ("sse", targets::sse::run),
    ("ws", targets::ws::run),
    ("chat", targets::chat::run),
    ("anthropic", targets::anthropic::run),
    ("normalize", targets::normalize::run),
    ("resp", targets::resp::run),
    ("import", targets::import::run),
    ("encoding", targets::encoding::run),
    ("ws_ext", targets::ws_ext::run),
    ("depth", targets::depth::run),
];

/// The entry of the target called `name`.
pub fn target(name: &str) -> Option<fn(&[u8])> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}
