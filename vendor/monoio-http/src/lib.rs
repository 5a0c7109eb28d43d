// codex-gateway (vendor/README.md): the published crate predates this lint; its warnings are
// not ours to fix in a vendored copy.
#![allow(unknown_lints, mismatched_lifetime_syntaxes)]

pub mod common;
pub mod h1;
pub mod h2;
pub mod util;
