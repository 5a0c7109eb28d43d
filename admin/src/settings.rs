//! Runtime settings that operators change without a restart: validation, text form and the
//! merge of stored overrides over the configured defaults.
//!
//! # Key Components
//! - One table ([`KEYS`] lists it) maps each field of [`shared_state::Settings`] to a key, a
//!   JSON form (for the admin API) and a parser with range checks. Stored values are text
//!   (numbers in decimal, enums in snake_case) in the `settings` table.
//! - [`effective`]: the configuration's settings with every valid stored override applied;
//!   this is what the sidecar publishes in each snapshot.
//! - [`apply`] / [`text_from_json`]: validate one change (CLI text / admin API JSON).
//!
//! | key | values | JSON form |
//! | --- | --- | --- |
//! | `max_attempts` | 1..=16 | number |
//! | `default_max_concurrency` | 0..=100000 (0 = unlimited) | number |
//! | `strategy` | `smart`, `round_robin`, `fill_first`, `sticky`, `quota_reset_priority` | string |
//! | `pause_threshold_pct` | (0, 100], or `off` (never pause on usage) | number, or `null` when off |
//! | `min_request_interval_ms` | 0..=60000 | number |
//! | `max_wait_for_account_ms` | 0..=60000 (0 = never wait; default 3000) | number |
//! | `service_tier` | `pass` (default), `strip`, `refuse` | string |
//! | `front_door_rps` | 0..=10000000 requests/s for this instance, all workers together (0 = off, default) | number |
//! | `front_door_burst` | 0..=10000000 requests at once over that rate (0 = one second's worth, default) | number |
//! | `per_ip_rps` | 0..=10000000 requests/s per client IP, an IPv6 client by its /64 (0 = off, default) | number |
//! | `per_ip_burst` | 0..=10000000 (0 = one second's worth of `per_ip_rps`, default) | number |
//! | `ip_allow_list` | IPv4/IPv6 addresses and CIDR blocks, separated by commas or spaces; empty = everyone (default) | string (canonical: `"10.0.0.0/8, ::1"`); PUT also takes an array of strings |
//! | `auto_clean_after_hours` | hours above 0 (fractions allowed), or `off` (default) | number, or `null` when off |
//! | `auto_clean_action` | `disable` (default) or `delete` | string |
//! | `auth_dir_write_back` | `true` / `false` (default) | boolean |
//! | `audit_retention_days` | 0..=36500 days (0 = keep forever; default 180) | number |
//!
//! The last four are the sidecar's own ([`SidecarSettings`], read by [`sidecar`]): the
//! auto-clean task (`crate::clean`), the watched auth directory (`crate::auth_dir`) and the
//! audit log's pruning (`crate::audit::prune_loop`) read them from storage at each round;
//! they are not part of the published snapshot.
//!
//! In `PUT /api/admin/settings`, JSON `null` removes the override (back to the configured
//! value); to turn `pause_threshold_pct` off over a configured threshold, send `"off"`.
//!
//! Every setting is hot: the data plane reads it from the published snapshot
//! (`Snapshot::settings`) at each request, never from its start-up configuration:
//! `max_attempts` in `gateway::lifecycle::open`, `strategy`, `pause_threshold_pct` and
//! `min_request_interval_ms` in `gateway::scheduler`, `max_wait_for_account_ms` and
//! `service_tier` in `gateway::lifecycle::open`, `default_max_concurrency` in the
//! published account entries (`publish`). `tests/tests/pool_state.rs` changes each
//! one through the admin API and checks the next request. The front-door limits
//! (`front_door_*`, `per_ip_*`, `ip_allow_list`) are read by `gateway::front_door` before
//! each request is routed (the allow-list also at accept); the allow-list is parsed here,
//! once per publish, never by the workers (`tests/tests/front_door_limits.rs`).
//! The snapshot's keys take their defaults from the configuration file: top-level
//! `max_attempts`, `[pool]` for the pool's, `[front_door]` for the front door's
//! (`deploy/config.example.toml`; `gateway::config`); a stored override wins.
//!
//! # Usage
//! ```
//! let mut s = shared_state::Settings::default();
//! admin::settings::apply(&mut s, "max_attempts", "5").unwrap();
//! assert_eq!(s.max_attempts, 5);
//! assert!(admin::settings::apply(&mut s, "max_attempts", "0").is_err());
//! ```
//!
//! # Error handling
//! [`SettingError`] names the key and the accepted range; the admin API turns it into an
//! OpenAI-shaped 400. An invalid value found in storage (written by hand) is skipped with a
//! warning and the default stays in force.

use serde_json::{Map, Value};
use shared_state::{
    ip_list::IpAllowList,
    snapshot::{ServiceTierPolicy, Strategy},
    Settings,
};

/// Why a setting change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    /// Not a setting we know.
    #[error("unknown setting {0:?} (known: {known})", known = KEYS.join(", "))]
    UnknownKey(String),
    /// The value is out of range or of the wrong type.
    #[error("invalid value for {key}: {reason}")]
    Invalid {
        /// The setting.
        key: String,
        /// What is accepted.
        reason: String,
    },
}

/// One setting: its key, its JSON form and its parser.
struct Spec {
    key: &'static str,
    get: fn(&Settings) -> Value,
    set: fn(&mut Settings, &str) -> Result<(), String>,
}

fn parse_u32(v: &str, min: u32, max: u32) -> Result<u32, String> {
    v.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| format!("expected an integer from {min} to {max}, got {v:?}"))
}

fn parse_pct(v: &str) -> Result<Option<f64>, String> {
    let t = v.trim();
    if ["off", "none", "null"].contains(&t.to_ascii_lowercase().as_str()) {
        return Ok(None);
    }
    t.parse::<f64>()
        .ok()
        .filter(|p| p.is_finite() && *p > 0.0 && *p <= 100.0)
        .map(Some)
        .ok_or_else(|| format!("expected a percent above 0 and at most 100, or \"off\", got {v:?}"))
}

/// Most upstream attempts one request may make.
pub const MAX_ATTEMPTS_LIMIT: u32 = 16;
/// Largest accepted default per-account concurrency limit.
pub const MAX_CONCURRENCY_LIMIT: u32 = 100_000;
/// Largest accepted minimum spacing of request starts on one account, ms.
pub const MAX_REQUEST_INTERVAL_MS: u64 = 60_000;
/// Longest accepted wait for a cooling account, ms (a request holds its client that long).
pub const MAX_WAIT_FOR_ACCOUNT_MS: u64 = 60_000;
/// Largest accepted front-door rate or burst (requests per second, requests).
pub const MAX_FRONT_DOOR_RATE: u32 = 10_000_000;

const SPECS: &[Spec] = &[
    Spec {
        key: "max_attempts",
        get: |s| Value::from(s.max_attempts),
        set: |s, v| {
            s.max_attempts = parse_u32(v, 1, MAX_ATTEMPTS_LIMIT)?;
            Ok(())
        },
    },
    Spec {
        key: "default_max_concurrency",
        get: |s| Value::from(s.default_max_concurrency),
        set: |s, v| {
            s.default_max_concurrency = parse_u32(v, 0, MAX_CONCURRENCY_LIMIT)?;
            Ok(())
        },
    },
    Spec {
        key: "strategy",
        get: |s| Value::from(s.strategy.as_str()),
        set: |s, v| {
            s.strategy = v.trim().parse::<Strategy>().map_err(|e| e.to_string())?;
            Ok(())
        },
    },
    Spec {
        key: "pause_threshold_pct",
        get: |s| s.pause_threshold_pct.map_or(Value::Null, Value::from),
        set: |s, v| {
            s.pause_threshold_pct = parse_pct(v)?;
            Ok(())
        },
    },
    Spec {
        key: "min_request_interval_ms",
        get: |s| Value::from(s.min_request_interval_ms),
        set: |s, v| {
            s.min_request_interval_ms = v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|n| *n <= MAX_REQUEST_INTERVAL_MS)
                .ok_or_else(|| {
                    format!("expected an integer from 0 to {MAX_REQUEST_INTERVAL_MS}, got {v:?}")
                })?;
            Ok(())
        },
    },
    Spec {
        key: "max_wait_for_account_ms",
        get: |s| Value::from(s.max_wait_for_account_ms),
        set: |s, v| {
            s.max_wait_for_account_ms = v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|n| *n <= MAX_WAIT_FOR_ACCOUNT_MS)
                .ok_or_else(|| {
                    format!("expected an integer from 0 to {MAX_WAIT_FOR_ACCOUNT_MS}, got {v:?}")
                })?;
            Ok(())
        },
    },
    Spec {
        key: "service_tier",
        get: |s| Value::from(s.service_tier.as_str()),
        set: |s, v| {
            s.service_tier = v.parse::<ServiceTierPolicy>()?;
            Ok(())
        },
    },
    Spec {
        key: "front_door_rps",
        get: |s| Value::from(s.front_door_rps),
        set: |s, v| {
            s.front_door_rps = parse_u32(v, 0, MAX_FRONT_DOOR_RATE)?;
            Ok(())
        },
    },
    Spec {
        key: "front_door_burst",
        get: |s| Value::from(s.front_door_burst),
        set: |s, v| {
            s.front_door_burst = parse_u32(v, 0, MAX_FRONT_DOOR_RATE)?;
            Ok(())
        },
    },
    Spec {
        key: "per_ip_rps",
        get: |s| Value::from(s.per_ip_rps),
        set: |s, v| {
            s.per_ip_rps = parse_u32(v, 0, MAX_FRONT_DOOR_RATE)?;
            Ok(())
        },
    },
    Spec {
        key: "per_ip_burst",
        get: |s| Value::from(s.per_ip_burst),
        set: |s, v| {
            s.per_ip_burst = parse_u32(v, 0, MAX_FRONT_DOOR_RATE)?;
            Ok(())
        },
    },
    Spec {
        key: "ip_allow_list",
        get: |s| Value::from(s.ip_allow_list.to_string()),
        set: |s, v| {
            s.ip_allow_list = v.parse::<IpAllowList>().map_err(|e| e.to_string())?;
            Ok(())
        },
    },
];

/// Every setting key, in display order.
pub const KEYS: &[&str] = &[
    "max_attempts",
    "default_max_concurrency",
    "strategy",
    "pause_threshold_pct",
    "min_request_interval_ms",
    "max_wait_for_account_ms",
    "service_tier",
    "front_door_rps",
    "front_door_burst",
    "per_ip_rps",
    "per_ip_burst",
    "ip_allow_list",
    "auto_clean_after_hours",
    "auto_clean_action",
    "auth_dir_write_back",
    "audit_retention_days",
];

/// What auto-clean does to an account banned or needing re-login for too long.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CleanAction {
    /// Set its status to `disabled` (kept, listed, re-enabled by hand).
    #[default]
    Disable,
    /// Delete it.
    Delete,
}

// === impl CleanAction ===

impl CleanAction {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Delete => "delete",
        }
    }
}

/// Settings only the sidecar reads (stored like the others; not in the snapshot).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SidecarSettings {
    /// Auto-clean accounts banned or needing re-login for longer than this (hours); `None`:
    /// off (the default).
    pub auto_clean_after_hours: Option<f64>,
    /// What auto-clean does.
    pub auto_clean_action: CleanAction,
    /// Write refreshed tokens back to the files of the watched auth directory.
    pub auth_dir_write_back: bool,
    /// How long audit log entries are kept.
    pub audit_retention_days: RetentionDays,
}

/// Default of [`SidecarSettings::audit_retention_days`]: about six months.
pub const DEFAULT_AUDIT_RETENTION_DAYS: u32 = 180;
/// Longest accepted `audit_retention_days` (a century).
pub const MAX_AUDIT_RETENTION_DAYS: u32 = 36_500;

/// Days audit entries are kept ([`DEFAULT_AUDIT_RETENTION_DAYS`] unless set; 0: forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionDays(pub u32);

// === impl RetentionDays ===

impl Default for RetentionDays {
    fn default() -> Self {
        Self(DEFAULT_AUDIT_RETENTION_DAYS)
    }
}

impl RetentionDays {
    /// The instant before which entries go (Unix ms) at `now_ms`; `None`: kept forever.
    pub fn cutoff_ms(self, now_ms: i64) -> Option<i64> {
        (self.0 > 0).then(|| now_ms.saturating_sub(i64::from(self.0) * 86_400_000))
    }
}

/// Longest accepted `auto_clean_after_hours` (a year).
pub const MAX_CLEAN_HOURS: f64 = 8760.0;

/// One sidecar setting.
struct SidecarSpec {
    key: &'static str,
    get: fn(&SidecarSettings) -> Value,
    set: fn(&mut SidecarSettings, &str) -> Result<(), String>,
}

const SIDECAR_SPECS: &[SidecarSpec] = &[
    SidecarSpec {
        key: "auto_clean_after_hours",
        get: |s| s.auto_clean_after_hours.map_or(Value::Null, Value::from),
        set: |s, v| {
            let t = v.trim();
            if ["off", "none", "null", "0", ""].contains(&t.to_ascii_lowercase().as_str()) {
                s.auto_clean_after_hours = None;
                return Ok(());
            }
            s.auto_clean_after_hours = Some(
                t.parse::<f64>()
                    .ok()
                    .filter(|h| h.is_finite() && *h > 0.0 && *h <= MAX_CLEAN_HOURS)
                    .ok_or_else(|| {
                        format!(
                            "expected hours above 0 and at most {MAX_CLEAN_HOURS}, or \"off\", got {v:?}"
                        )
                    })?,
            );
            Ok(())
        },
    },
    SidecarSpec {
        key: "auto_clean_action",
        get: |s| Value::from(s.auto_clean_action.as_str()),
        set: |s, v| {
            s.auto_clean_action = match v.trim() {
                "disable" => CleanAction::Disable,
                "delete" => CleanAction::Delete,
                _ => return Err(format!("expected \"disable\" or \"delete\", got {v:?}")),
            };
            Ok(())
        },
    },
    SidecarSpec {
        key: "auth_dir_write_back",
        get: |s| Value::from(s.auth_dir_write_back),
        set: |s, v| {
            s.auth_dir_write_back = match v.trim() {
                "true" | "on" | "1" => true,
                "false" | "off" | "0" => false,
                _ => return Err(format!("expected true or false, got {v:?}")),
            };
            Ok(())
        },
    },
    SidecarSpec {
        key: "audit_retention_days",
        get: |s| Value::from(s.audit_retention_days.0),
        set: |s, v| {
            s.audit_retention_days = RetentionDays(parse_u32(v, 0, MAX_AUDIT_RETENTION_DAYS)?);
            Ok(())
        },
    },
];

fn sidecar_spec(key: &str) -> Option<&'static SidecarSpec> {
    SIDECAR_SPECS.iter().find(|s| s.key == key)
}

/// The sidecar's settings from the stored overrides (invalid ones skipped: the default stays).
pub fn sidecar(stored: &[(String, String)]) -> SidecarSettings {
    let mut s = SidecarSettings::default();
    for (k, v) in stored {
        if let Some(spec) = sidecar_spec(k) {
            if let Err(e) = (spec.set)(&mut s, v) {
                tracing::warn!(key = %k, error = %e, "invalid stored setting skipped");
            }
        }
    }
    s
}

/// The sidecar's settings as JSON members.
pub fn sidecar_json(s: &SidecarSettings) -> Map<String, Value> {
    SIDECAR_SPECS
        .iter()
        .map(|x| (x.key.to_owned(), (x.get)(s)))
        .collect()
}

fn spec(key: &str) -> Result<&'static Spec, SettingError> {
    SPECS
        .iter()
        .find(|s| s.key == key)
        .ok_or_else(|| SettingError::UnknownKey(key.to_owned()))
}

/// Validates `value` (text form) and writes it into `settings` (a sidecar setting is only
/// validated: it is not part of [`Settings`]).
pub fn apply(settings: &mut Settings, key: &str, value: &str) -> Result<(), SettingError> {
    let invalid = |reason| SettingError::Invalid {
        key: key.to_owned(),
        reason,
    };
    if let Some(s) = sidecar_spec(key) {
        return (s.set)(&mut SidecarSettings::default(), value).map_err(invalid);
    }
    (spec(key)?.set)(settings, value).map_err(invalid)
}

/// The JSON form of one setting (a sidecar setting: its default).
pub fn get(settings: &Settings, key: &str) -> Result<Value, SettingError> {
    if let Some(s) = sidecar_spec(key) {
        return Ok((s.get)(&SidecarSettings::default()));
    }
    Ok((spec(key)?.get)(settings))
}

/// Every setting as a JSON object (what `GET /api/admin/settings` shows).
pub fn to_json(settings: &Settings) -> Map<String, Value> {
    SPECS
        .iter()
        .map(|s| (s.key.to_owned(), (s.get)(settings)))
        .collect()
}

/// The text form of a JSON value for `key`, validated; `Ok(None)` for `null` (back to the
/// default).
pub fn text_from_json(key: &str, v: &Value) -> Result<Option<String>, SettingError> {
    if sidecar_spec(key).is_none() {
        spec(key)?;
    }
    let text = match v {
        Value::Null => return Ok(None),
        Value::String(s) => s.trim().to_owned(),
        // The allow-list also as an array of entries.
        Value::Array(items) if key == "ip_allow_list" && items.iter().all(Value::is_string) => {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(", ")
        }
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => {
            return Err(SettingError::Invalid {
                key: key.to_owned(),
                reason: "expected a number or a string".into(),
            })
        }
    };
    apply(&mut Settings::default(), key, &text)?;
    Ok(Some(text))
}

/// `defaults` with every valid stored override applied, plus the overrides that were skipped.
pub fn effective(
    defaults: &Settings,
    stored: &[(String, String)],
) -> (Settings, Vec<SettingError>) {
    let mut s = defaults.clone();
    let mut bad = Vec::new();
    for (k, v) in stored {
        if sidecar_spec(k).is_some() {
            continue;
        }
        if let Err(e) = apply(&mut s, k, v) {
            bad.push(e);
        }
    }
    (s, bad)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_field_has_one_key() {
        assert_eq!(KEYS.len(), SPECS.len() + SIDECAR_SPECS.len());
        let all = SPECS
            .iter()
            .map(|s| s.key)
            .chain(SIDECAR_SPECS.iter().map(|s| s.key));
        for (k, s) in KEYS.iter().zip(all) {
            assert_eq!(*k, s);
        }
        let j = to_json(&Settings::default());
        assert_eq!(j.len(), SPECS.len());
        assert_eq!(j["max_attempts"], json!(3));
    }

    #[test]
    fn day_two_pool_settings_validate() {
        let mut s = Settings::default();
        assert_eq!(s.max_wait_for_account_ms, 3000);
        assert_eq!(s.service_tier, ServiceTierPolicy::Pass);
        apply(&mut s, "max_wait_for_account_ms", "0").unwrap();
        assert_eq!(s.max_wait_for_account_ms, 0);
        for bad in ["-1", "60001", "x", "1.5"] {
            assert!(
                apply(&mut s, "max_wait_for_account_ms", bad).is_err(),
                "{bad}"
            );
        }
        apply(&mut s, "service_tier", " Strip ").unwrap();
        assert_eq!(s.service_tier, ServiceTierPolicy::Strip);
        assert!(apply(&mut s, "service_tier", "fast").is_err());
        let j = to_json(&s);
        assert_eq!(j["service_tier"], json!("strip"));
        assert_eq!(j["max_wait_for_account_ms"], json!(0));
    }

    #[test]
    fn front_door_settings_validate() {
        let mut s = Settings::default();
        assert_eq!((s.front_door_rps, s.per_ip_rps), (0, 0), "off by default");
        assert!(s.ip_allow_list.is_empty());
        apply(&mut s, "front_door_rps", "500").unwrap();
        apply(&mut s, "front_door_burst", "0").unwrap();
        apply(&mut s, "per_ip_rps", " 5 ").unwrap();
        apply(&mut s, "per_ip_burst", "20").unwrap();
        assert_eq!(
            (
                s.front_door_rps,
                s.front_door_burst,
                s.per_ip_rps,
                s.per_ip_burst
            ),
            (500, 0, 5, 20)
        );
        for key in [
            "front_door_rps",
            "front_door_burst",
            "per_ip_rps",
            "per_ip_burst",
        ] {
            for bad in ["-1", "1.5", "x", "10000001"] {
                assert!(apply(&mut s, key, bad).is_err(), "{key} {bad}");
            }
        }
        apply(
            &mut s,
            "ip_allow_list",
            "10.0.0.0/8,  2001:db8::/32 ::ffff:192.0.2.1",
        )
        .unwrap();
        assert!(s.ip_allow_list.allows("10.2.3.4".parse().unwrap()));
        assert!(!s.ip_allow_list.allows("11.2.3.4".parse().unwrap()));
        assert_eq!(
            to_json(&s)["ip_allow_list"],
            json!("10.0.0.0/8, 2001:db8::/32, 192.0.2.1")
        );
        // One bad entry refuses the change, naming the entry; the list in force stays.
        let e = apply(&mut s, "ip_allow_list", "10.0.0.0/8, 10.0.0.300").unwrap_err();
        assert!(e.to_string().contains("10.0.0.300"), "{e}");
        assert!(s.ip_allow_list.allows("10.2.3.4".parse().unwrap()));
        apply(&mut s, "ip_allow_list", "").unwrap();
        assert!(s.ip_allow_list.is_empty());
        // The admin API's JSON forms: a string, or an array of strings.
        assert_eq!(
            text_from_json("ip_allow_list", &json!(["127.0.0.1", " ::1 "])).unwrap(),
            Some("127.0.0.1, ::1".into())
        );
        assert!(text_from_json("ip_allow_list", &json!(["127.0.0.1", 5])).is_err());
        assert!(text_from_json("ip_allow_list", &json!("fe80::/129")).is_err());
        assert!(text_from_json("per_ip_rps", &json!(["1"])).is_err());
        assert_eq!(
            text_from_json("per_ip_rps", &json!(3)).unwrap(),
            Some("3".into())
        );
    }

    #[test]
    fn validates_ranges_and_types() {
        let mut s = Settings::default();
        apply(&mut s, "default_max_concurrency", "0").unwrap();
        apply(&mut s, "default_max_concurrency", " 12 ").unwrap();
        assert_eq!(s.default_max_concurrency, 12);
        for bad in ["0", "17", "-1", "x", "2.5", ""] {
            assert!(
                matches!(
                    apply(&mut s, "max_attempts", bad),
                    Err(SettingError::Invalid { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            apply(&mut s, "nope", "1"),
            Err(SettingError::UnknownKey(_))
        ));
        assert_eq!(
            text_from_json("max_attempts", &json!(4)).unwrap(),
            Some("4".into())
        );
        assert_eq!(
            text_from_json("max_attempts", &json!("4")).unwrap(),
            Some("4".into())
        );
        assert_eq!(text_from_json("max_attempts", &Value::Null).unwrap(), None);
        assert!(text_from_json("max_attempts", &json!([1])).is_err());
        assert!(text_from_json("max_attempts", &json!(99)).is_err());
    }

    #[test]
    fn scheduler_settings() {
        let mut s = Settings::default();
        apply(&mut s, "strategy", "round_robin").unwrap();
        assert_eq!(s.strategy, Strategy::RoundRobin);
        assert_eq!(get(&s, "strategy").unwrap(), json!("round_robin"));
        assert!(apply(&mut s, "strategy", "weighted").is_err());
        apply(&mut s, "pause_threshold_pct", "92.5").unwrap();
        assert_eq!(s.pause_threshold_pct, Some(92.5));
        assert_eq!(get(&s, "pause_threshold_pct").unwrap(), json!(92.5));
        for bad in ["0", "101", "-5", "NaN", "x"] {
            assert!(apply(&mut s, "pause_threshold_pct", bad).is_err(), "{bad}");
        }
        apply(&mut s, "pause_threshold_pct", "off").unwrap();
        assert_eq!(s.pause_threshold_pct, None);
        assert_eq!(get(&s, "pause_threshold_pct").unwrap(), Value::Null);
        assert_eq!(
            text_from_json("pause_threshold_pct", &json!(80)).unwrap(),
            Some("80".into())
        );
        apply(&mut s, "min_request_interval_ms", "250").unwrap();
        assert_eq!(s.min_request_interval_ms, 250);
        assert!(apply(&mut s, "min_request_interval_ms", "60001").is_err());
        for st in Strategy::ALL {
            apply(&mut s, "strategy", st.as_str()).unwrap();
        }
    }

    #[test]
    fn sidecar_settings() {
        let stored = [
            ("auto_clean_after_hours".to_owned(), "0.5".to_owned()),
            ("auto_clean_action".to_owned(), "delete".to_owned()),
            ("max_attempts".to_owned(), "2".to_owned()),
        ];
        let s = sidecar(&stored);
        assert_eq!(s.auto_clean_after_hours, Some(0.5));
        assert_eq!(s.auto_clean_action, CleanAction::Delete);
        assert!(!s.auth_dir_write_back);
        let (eff, bad) = effective(&Settings::default(), &stored);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(eff.max_attempts, 2);
        assert_eq!(
            text_from_json("auto_clean_after_hours", &json!(24)).unwrap(),
            Some("24".into())
        );
        assert_eq!(
            text_from_json("auth_dir_write_back", &json!(true)).unwrap(),
            Some("true".into())
        );
        for bad in ["-1", "x", "9000"] {
            assert!(text_from_json("auto_clean_after_hours", &json!(bad)).is_err());
        }
        assert!(text_from_json("auto_clean_action", &json!("burn")).is_err());
        assert_eq!(s.audit_retention_days, RetentionDays(180), "the default");
        assert_eq!(sidecar_json(&s)["audit_retention_days"], json!(180));
        let kept = sidecar(&[("audit_retention_days".to_owned(), "0".to_owned())]);
        assert_eq!(
            kept.audit_retention_days.cutoff_ms(1_000),
            None,
            "0: forever"
        );
        let week = sidecar(&[("audit_retention_days".to_owned(), "7".to_owned())]);
        assert_eq!(
            week.audit_retention_days.cutoff_ms(10 * 86_400_000),
            Some(3 * 86_400_000)
        );
        for bad in ["-1", "x", "1.5", "36501"] {
            assert!(
                text_from_json("audit_retention_days", &json!(bad)).is_err(),
                "{bad}"
            );
        }
        assert_eq!(sidecar(&[]), SidecarSettings::default());
        assert_eq!(sidecar_json(&s)["auto_clean_action"], json!("delete"));
    }

    #[test]
    fn stored_overrides_apply_over_defaults_and_bad_ones_are_skipped() {
        let defaults = Settings {
            max_attempts: 7,
            ..Settings::default()
        };
        let (s, bad) = effective(
            &defaults,
            &[
                ("default_max_concurrency".into(), "4".into()),
                ("max_attempts".into(), "zero".into()),
                ("retired_key".into(), "1".into()),
            ],
        );
        assert_eq!(s.max_attempts, 7);
        assert_eq!(s.default_max_concurrency, 4);
        assert_eq!(bad.len(), 2);
    }
}
