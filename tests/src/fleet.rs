//! More than one gateway instance on one storage (PostgreSQL, usually with Redis), as a fleet
//! behind a load balancer runs.
//!
//! # Key Components
//! - [`Stack::another_instance`]: one more gateway on the stack's configuration, own ports.
//! - [`REDIS_URL`] / [`with_redis`]: the tests' Redis, configured on a stack.
//! - [`instance_url`]: an instance's data-plane URL.

use codex_gateway::app::{App, AppHandle};
use codex_gateway::config::Config;

use crate::{ConfigTweak, Stack};

/// The Redis server the tests use (database 0; `tests/run.sh` starts it).
pub const REDIS_URL: &str = "redis://127.0.0.1:6379/0";

/// A [`crate::StackBuilder::tweak`] that configures [`REDIS_URL`] (fleet-wide limits,
/// transcripts and refresh leases).
pub fn with_redis() -> Option<ConfigTweak> {
    Some(Box::new(|c: &mut Config| {
        c.sidecar.redis_url = Some(REDIS_URL.into());
    }))
}

/// `http://ADDR` of an instance's data plane (see [`Stack::url`] for the stack's own).
pub fn instance_url(h: &AppHandle) -> String {
    format!("http://{}", h.data_addr)
}

// === impl Stack ===

impl Stack {
    /// Starts one more gateway instance on this stack's configuration (the same storage,
    /// Redis and upstream; its own data and admin ports), `tweak` applied to its
    /// configuration. Blocks while it starts (inside a multi-thread runtime, through
    /// `block_in_place`).
    pub fn another_instance(&self, tweak: impl FnOnce(&mut Config)) -> AppHandle {
        let mut cfg = self.cfg.clone();
        cfg.listen = "127.0.0.1:0".parse().expect("addr");
        cfg.sidecar.admin_listen = "127.0.0.1:0".parse().expect("addr");
        tweak(&mut cfg);
        tokio::task::block_in_place(|| App::spawn(cfg)).expect("another gateway instance")
    }
}
