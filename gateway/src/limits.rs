//! Per-key limits on the data plane: admission (budgets, concurrency, requests per minute),
//! the key's own usage (`GET /v1/usage`) and the limit metrics. Nothing here awaits: every
//! check reads the key's process-wide counters ([`shared_state::keys::KeyLive`]), which the
//! sidecar reconciles with Redis in the background (`admin::key_limits`).
//!
//! # Key Components
//! - [`admit`]: the one admission rule, run on the request head after authentication (and on
//!   each WebSocket turn). Order: budgets (429 `insufficient_quota`, `Retry-After` until the
//!   UTC day / month ends), concurrency (429 `rate_limit_exceeded`, `Retry-After: 1`), then
//!   requests per minute (429 `rate_limit_exceeded`, `Retry-After` until the UTC minute ends;
//!   only an admitted request takes an RPM unit). Returns a [`KeySlot`] that holds the
//!   concurrency slot until dropped.
//! - The model allow-list and the account group are applied by `lifecycle::open` (the model
//!   is known only after the body is parsed); the cost of a request is computed and counted
//!   by `pipeline::UsageGuard` when it finishes.
//! - [`open_ws_session`]: the per-key cap on open client WebSocket sessions
//!   (`max_ws_sessions_per_key`; 429 `too_many_websocket_sessions`, `Retry-After: 1`), taken
//!   before the 101 and held by a [`WsSessionSlot`] for the socket's life. An HTTP connection
//!   is bound to no key between its requests, so a key's HTTP share is its concurrency limit.
//! - [`usage`]: `GET /v1/usage`, the calling key's usage today and this month and its limits.
//!
//! # Error handling
//! Every refusal is an [`Error`] rendered by `api::write_error` in the route's dialect.

use std::{
    fmt::Write as _,
    io,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use monoio::io::{AsyncReadRent, AsyncWriteRent};
use shared_state::{
    keys::{self, KeyLive},
    ClientKey, Health,
};

use crate::{
    error::{Error, ErrorKind, KeyLimit, Side},
    server::h1::Conn,
};

/// Why a request was refused by a key limit (for the metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Requests per minute.
    Rpm,
    /// Requests in flight.
    Concurrency,
    /// A token budget.
    Tokens,
    /// A cost budget.
    Cost,
    /// The model allow-list.
    Model,
    /// Open WebSocket sessions.
    WsSessions,
}

const REJECTION_NAMES: [&str; 6] = [
    "rpm",
    "concurrency",
    "tokens",
    "cost",
    "model",
    "ws_sessions",
];
static REJECTIONS: [AtomicU64; 6] = [
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
];

/// Counts a refusal.
pub fn rejected(r: Rejection) {
    REJECTIONS[r as usize].fetch_add(1, Ordering::Relaxed);
}

/// A concurrency slot of one key, released on drop.
#[derive(Debug)]
pub struct KeySlot {
    live: Arc<KeyLive>,
}

impl Drop for KeySlot {
    fn drop(&mut self) {
        self.live.leave();
    }
}

fn refuse(limit: KeyLimit, retry_after_ms: u64) -> Error {
    rejected(match limit {
        KeyLimit::Rpm(_) => Rejection::Rpm,
        KeyLimit::Concurrency(_) => Rejection::Concurrency,
        KeyLimit::WsSessions(_) => Rejection::WsSessions,
        KeyLimit::TokensPerDay(_) | KeyLimit::TokensPerMonth(_) => Rejection::Tokens,
        KeyLimit::CostPerDay(_) | KeyLimit::CostPerMonth(_) => Rejection::Cost,
    });
    Error::new(
        ErrorKind::KeyLimit {
            limit,
            retry_after: retry_after_ms.div_ceil(1000).max(1),
        },
        Side::Downstream,
    )
}

/// An open client WebSocket session of one key, given back on drop.
#[derive(Debug)]
pub struct WsSessionSlot {
    live: Arc<KeyLive>,
}

impl Drop for WsSessionSlot {
    fn drop(&mut self) {
        self.live.close_ws();
    }
}

/// Opens a client WebSocket session of `key` under the per-key cap `limit` (0: none), or
/// refuses it with 429 `too_many_websocket_sessions`.
// The data plane's one error type, as every handler returns it.
#[allow(clippy::result_large_err)]
pub fn open_ws_session(key: &ClientKey, limit: u32) -> Result<WsSessionSlot, Error> {
    if !key.live.try_open_ws(limit) {
        return Err(refuse(KeyLimit::WsSessions(limit), 1000));
    }
    Ok(WsSessionSlot {
        live: Arc::clone(&key.live),
    })
}

/// Admits one request of `key` at `now_ms`, or refuses it (see the module docs). Budgets are
/// checked against what was spent so far: a request admitted under its budget may overshoot
/// it by its own usage.
// The data plane's one error type, as every handler returns it.
#[allow(clippy::result_large_err)]
pub fn admit(key: &ClientKey, now_ms: u64) -> Result<KeySlot, Error> {
    let l = &*key.limits;
    let live = &key.live;
    if !l.usable_at(now_ms) {
        return Err(Error::new(
            ErrorKind::Unauthorized { key_present: true },
            Side::Downstream,
        ));
    }
    let (day, month) = (keys::day_of(now_ms), keys::month_of(now_ms));
    let day_left = keys::day_start_ms(day + 1).saturating_sub(now_ms);
    let month_left = keys::month_start_ms(month + 1).saturating_sub(now_ms);
    let over = |limit: Option<u64>, used: &keys::Counter, period| {
        limit.filter(|&l| used.value(period) >= l)
    };
    if let Some(n) = over(l.tokens_per_day, &live.day.tokens, day) {
        return Err(refuse(KeyLimit::TokensPerDay(n), day_left));
    }
    if let Some(n) = over(l.tokens_per_month, &live.month.tokens, month) {
        return Err(refuse(KeyLimit::TokensPerMonth(n), month_left));
    }
    if let Some(n) = over(l.cost_per_day_micros, &live.day.cost_micros, day) {
        return Err(refuse(KeyLimit::CostPerDay(n), day_left));
    }
    if let Some(n) = over(l.cost_per_month_micros, &live.month.cost_micros, month) {
        return Err(refuse(KeyLimit::CostPerMonth(n), month_left));
    }
    if !live.try_enter(l.max_concurrency) {
        return Err(refuse(
            KeyLimit::Concurrency(l.max_concurrency.unwrap_or(0)),
            1000,
        ));
    }
    let slot = KeySlot {
        live: Arc::clone(live),
    };
    let minute = keys::minute_of(now_ms);
    match l.rpm {
        Some(rpm) => {
            if !live.minute.try_take(minute, u64::from(rpm)) {
                return Err(refuse(
                    KeyLimit::Rpm(rpm),
                    keys::minute_end_ms(minute).saturating_sub(now_ms),
                ));
            }
        }
        None => live.minute.add(minute, 1),
    }
    live.touch(now_ms);
    Ok(slot)
}

/// The limit metrics, appended to `/metrics`.
pub fn render_metrics(health: &Health, out: &mut String) {
    let _ = writeln!(
        out,
        "# HELP codex_gateway_key_limit_rejections_total Requests refused by a client key's limits."
    );
    let _ = writeln!(
        out,
        "# TYPE codex_gateway_key_limit_rejections_total counter"
    );
    for (i, name) in REJECTION_NAMES.iter().enumerate() {
        let _ = writeln!(
            out,
            "codex_gateway_key_limit_rejections_total{{limit=\"{name}\"}} {}",
            REJECTIONS[i].load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP codex_gateway_key_limits_local 1 while per-key limits are enforced on this instance's counters alone (Redis not configured or unreachable)."
    );
    let _ = writeln!(out, "# TYPE codex_gateway_key_limits_local gauge");
    let _ = writeln!(
        out,
        "codex_gateway_key_limits_local {}",
        u8::from(!health.key_limits_fleet())
    );
}

/// `"fleet"` or `"local"`, for `/healthz` and `/v1/usage`.
pub fn enforcement(health: &Health) -> &'static str {
    if health.key_limits_fleet() {
        "fleet"
    } else {
        "local"
    }
}

/// The body of `GET /v1/usage` for `key` at `now_ms`.
pub fn usage_json(key: &ClientKey, health: &Health, now_ms: u64) -> Vec<u8> {
    let l = &*key.limits;
    let live = &key.live;
    let (day, month) = (keys::day_of(now_ms), keys::month_of(now_ms));
    let period = |c: &keys::PeriodCounters, p: u64, start: u64, end: u64| {
        let cost = c.cost_micros.value(p);
        sonic_rs::json!({
            "start": start / 1000,
            "end": end / 1000,
            "requests": c.requests.value(p),
            "tokens": c.tokens.value(p),
            "cost_micros": cost,
            "cost_usd": cost as f64 / 1e6,
        })
    };
    let usd = |m: Option<u64>| m.map(|m| m as f64 / 1e6);
    let body = sonic_rs::json!({
        "object": "usage",
        "key": {"id": key.id, "name": key.name.as_str()},
        "today": period(&live.day, day, keys::day_start_ms(day), keys::day_start_ms(day + 1)),
        "month": period(&live.month, month, keys::month_start_ms(month), keys::month_start_ms(month + 1)),
        "current": {
            "requests_this_minute": live.minute.value(keys::minute_of(now_ms)),
            "in_flight": live.in_flight(),
            "websocket_sessions": live.ws_sessions(),
        },
        "limits": {
            "rpm": l.rpm,
            "max_concurrency": l.max_concurrency,
            "tokens_per_day": l.tokens_per_day,
            "tokens_per_month": l.tokens_per_month,
            "cost_per_day_usd": usd(l.cost_per_day_micros),
            "cost_per_month_usd": usd(l.cost_per_month_micros),
            "allowed_models": &l.allowed_models,
            "account_group": l.account_group.as_deref(),
            "expires_at": l.expires_at_ms.map(|e| e / 1000),
        },
        "enforcement": enforcement(health),
    });
    sonic_rs::to_vec(&body).unwrap_or_default()
}

/// `GET /v1/usage`: the calling key's own usage and limits (never another key's).
pub async fn usage<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &crate::ctx::WorkerCtx,
    conn: &mut Conn<S>,
    key: &ClientKey,
    keep: bool,
) -> io::Result<bool> {
    let body = usage_json(key, &ctx.health, shared_state::now_ms());
    ctx.metrics.request("usage", 200);
    conn.write_response(200, &[crate::api::JSON], &body, keep)
        .await?;
    Ok(keep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_state::keys::KeyLimits;

    fn key(limits: KeyLimits) -> ClientKey {
        ClientKey {
            limits: Arc::new(limits),
            ..ClientKey::unlimited(1, "k")
        }
    }

    fn kind(e: Error) -> ErrorKind {
        e.kind
    }

    const NOW: u64 = 1_796_058_030_000; // 2026-11-30T17:00:30Z

    #[test]
    fn websocket_sessions_are_capped_per_key() {
        let k = key(KeyLimits::unlimited());
        let a = open_ws_session(&k, 2).unwrap();
        let _b = open_ws_session(&k, 2).unwrap();
        let e = open_ws_session(&k, 2).unwrap_err();
        assert_eq!(
            kind(e.clone()),
            ErrorKind::KeyLimit {
                limit: KeyLimit::WsSessions(2),
                retry_after: 1
            }
        );
        let r = e.to_openai();
        assert_eq!(r.status, 429);
        assert_eq!(r.body.code.as_deref(), Some("too_many_websocket_sessions"));
        drop(a);
        assert_eq!(k.live.ws_sessions(), 1);
        let _c = open_ws_session(&k, 2).unwrap();
        // 0: no cap
        let more: Vec<_> = (0..10).map(|_| open_ws_session(&k, 0).unwrap()).collect();
        assert_eq!(k.live.ws_sessions(), 12);
        drop(more);
        assert_eq!(k.live.ws_sessions(), 2);
    }

    #[test]
    fn rpm_refuses_until_the_minute_ends() {
        let k = key(KeyLimits {
            rpm: Some(2),
            ..KeyLimits::unlimited()
        });
        drop(admit(&k, NOW).unwrap());
        drop(admit(&k, NOW).unwrap());
        let e = admit(&k, NOW).unwrap_err();
        assert_eq!(
            kind(e.clone()),
            ErrorKind::KeyLimit {
                limit: KeyLimit::Rpm(2),
                retry_after: 30
            }
        );
        let r = e.to_openai();
        assert_eq!(r.status, 429);
        assert_eq!(r.body.code.as_deref(), Some("rate_limit_exceeded"));
        assert_eq!(r.retry_after, Some(30));
        // the next minute admits again
        assert!(admit(&k, NOW + 30_000).is_ok());
    }

    #[test]
    fn concurrency_slot_is_held_until_dropped() {
        let k = key(KeyLimits {
            max_concurrency: Some(1),
            ..KeyLimits::unlimited()
        });
        let slot = admit(&k, NOW).unwrap();
        assert!(matches!(
            kind(admit(&k, NOW).unwrap_err()),
            ErrorKind::KeyLimit {
                limit: KeyLimit::Concurrency(1),
                ..
            }
        ));
        drop(slot);
        assert!(admit(&k, NOW).is_ok());
    }

    #[test]
    fn rpm_refusal_gives_back_the_concurrency_slot() {
        let k = key(KeyLimits {
            rpm: Some(1),
            max_concurrency: Some(5),
            ..KeyLimits::unlimited()
        });
        let _a = admit(&k, NOW).unwrap();
        assert!(admit(&k, NOW).is_err());
        assert_eq!(k.live.in_flight(), 1);
    }

    #[test]
    fn budgets_refuse_once_spent_with_insufficient_quota() {
        let k = key(KeyLimits {
            tokens_per_day: Some(100),
            cost_per_month_micros: Some(5_000),
            ..KeyLimits::unlimited()
        });
        assert!(admit(&k, NOW).is_ok());
        k.live.record(NOW, 99, 0);
        assert!(admit(&k, NOW).is_ok());
        k.live.record(NOW, 1, 0);
        let e = admit(&k, NOW).unwrap_err();
        let r = e.to_openai();
        assert_eq!(r.status, 429);
        assert_eq!(r.body.code.as_deref(), Some("insufficient_quota"));
        assert_eq!(r.body.error_type, "insufficient_quota");
        // until 00:00 UTC
        assert_eq!(r.retry_after, Some(7 * 3600 - 30));
        // the next day admits; the monthly cost budget still counts
        let tomorrow = NOW + 7 * 3_600_000;
        assert!(admit(&k, tomorrow).is_ok());
        k.live.record(tomorrow, 0, 5_000);
        assert!(matches!(
            kind(admit(&k, tomorrow).unwrap_err()),
            ErrorKind::KeyLimit {
                limit: KeyLimit::CostPerMonth(5_000),
                ..
            }
        ));
    }

    #[test]
    fn expired_and_disabled_keys_are_unauthorized() {
        let k = key(KeyLimits {
            expires_at_ms: Some(NOW),
            ..KeyLimits::unlimited()
        });
        assert!(admit(&k, NOW - 1).is_ok());
        assert_eq!(
            kind(admit(&k, NOW).unwrap_err()),
            ErrorKind::Unauthorized { key_present: true }
        );
        let k = key(KeyLimits {
            enabled: false,
            ..KeyLimits::unlimited()
        });
        assert_eq!(admit(&k, NOW).unwrap_err().to_openai().status, 401);
    }

    #[test]
    fn anthropic_dialect_gets_rate_limit_error() {
        let k = key(KeyLimits {
            rpm: Some(0),
            ..KeyLimits::unlimited()
        });
        let e = admit(&k, NOW).unwrap_err();
        let r = e.render(crate::error::Dialect::Anthropic);
        assert_eq!(r.status, 429);
        let v: sonic_rs::Value = sonic_rs::from_slice(&r.body).unwrap();
        use sonic_rs::JsonValueTrait;
        assert_eq!(v["error"]["type"].as_str(), Some("rate_limit_error"));
        assert_eq!(r.retry_after, Some(30));
    }
}
