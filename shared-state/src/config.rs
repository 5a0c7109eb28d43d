//! Start-up configuration values that the gateway's configuration loader parses and the
//! sidecar acts on (the composition root hands them over).
//!
//! # Key Components
//! - [`UsageConfig`]: the durable usage spool's bound and the retention of usage records.

/// The sidecar's periodic snapshot reload (the fallback behind Redis invalidations).
pub const DEFAULT_RELOAD_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// Time to live of a Redis refresh lease (renewed every third of it while a refresh runs).
pub const REFRESH_LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// Usage records: the durable spool and retention (see `docs/architecture.md`, "Usage
/// records").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageConfig {
    /// Most bytes of the durable usage spool file (`usage_spool_max_bytes`); at the bound
    /// records wait in the queue and the workers' local spools.
    pub spool_max_bytes: u64,
    /// Keep raw usage records this many days (`usage_retention_days`; 0: forever).
    pub retention_days: u32,
    /// Keep hourly rollups this many days (`usage_rollup_retention_days`; 0: forever).
    pub rollup_retention_days: u32,
}

impl Default for UsageConfig {
    fn default() -> Self {
        Self {
            spool_max_bytes: 256 * 1024 * 1024,
            retention_days: 90,
            rollup_retention_days: 730,
        }
    }
}
