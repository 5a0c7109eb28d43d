//! Load-test and integration-test harness for codex-gateway.
//!
//! # Key Components
//! - [`mock`]: `mock-codex`, an in-process (or standalone, see `src/bin/mock-codex.rs`) mock of
//!   the ChatGPT Codex upstream: `POST /backend-api/codex/responses` (SSE) and the Responses
//!   WebSocket, `/codex/models`, `/wham/usage` and the OAuth token endpoint, with per-request,
//!   per-account and per-process failure controls.
//! - [`loadgen`]: the load generator behind `src/bin/loadgen.rs`: N concurrent SSE streams or
//!   JSON requests with ramp-up, latency / gap percentiles, and the target process's CPU per
//!   event and RSS per open stream.
//!
//! # Usage
//! ```no_run
//! use benches::{MockAccount, MockCodex, MockConfig};
//!
//! # fn main() -> anyhow::Result<()> {
//! let mock = MockCodex::start(MockConfig::default())?;
//! let tokens = mock.add_account(MockAccount::new("acct-1"));
//! println!("upstream {} token url {}", mock.base_url(), mock.token_url());
//! # let _ = tokens;
//! # Ok(())
//! # }
//! ```

pub mod loadgen;
pub mod mock;

pub use mock::{
    Behaviour, ErrorKind, IssuedTokens, MockAccount, MockCodex, MockConfig, MockHandle,
    RecordedRequest, RefreshError,
};
