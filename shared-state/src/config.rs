//! Start-up configuration values that the gateway's configuration loader parses and the
//! sidecar acts on (the composition root hands them over).
//!
//! # Key Components
//! - [`UsageConfig`]: the durable usage spool's bound and the retention of usage records.
//! - [`AccessLogConfig`]: where the access log goes (`[access_log]`) and its rotation.

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

/// The access log (`[access_log]`): one JSON line per request, written by the sidecar from
/// the usage records (see `docs/operations.md`, "Traceability").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLogConfig {
    /// `path`: a file, `-` for stdout; `None`: no access log.
    pub path: Option<std::path::PathBuf>,
    /// `max_bytes`: the file is rotated (`path.1`, `path.2`, ...) before it would pass this.
    pub max_bytes: u64,
    /// `keep`: rotated files kept (the oldest beyond are deleted; 0: none kept).
    pub keep: u32,
}

impl AccessLogConfig {
    /// Whether the log goes to stdout (`path = "-"`).
    pub fn is_stdout(&self) -> bool {
        self.path.as_deref() == Some(std::path::Path::new("-"))
    }
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        Self {
            path: None,
            max_bytes: 100 * 1024 * 1024,
            keep: 5,
        }
    }
}
