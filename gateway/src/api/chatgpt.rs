//! The Codex CLI's ChatGPT-mode surface: an unmodified Codex CLI logged in "with ChatGPT" and
//! pointed at the gateway (`chatgpt_base_url = "https://GATEWAY/backend-api/"`) calls the
//! routes the ChatGPT backend serves. The gateway key rides where the CLI puts its access
//! token (`Authorization: Bearer`), so `auth.json`'s `access_token` is a gateway key.
//!
//! # Key Components
//! The paths are rows of the route table (`super::route::Route::of_path`; `/backend-api/...`
//! or `/api/codex/...`), served by:
//! - `POST /backend-api/codex/responses`: the Responses surface, [`super::responses::serve`]
//!   (the very same route, lifecycle and pipeline as `/v1/responses`); the WebSocket upgrade
//!   of the same path is taken by [`super::ws::serve`] before routing
//!   ([`super::ws::wants_upgrade`]).
//! - `POST /backend-api/codex/responses/compact`: [`super::compact::serve`] (remote
//!   compaction v1, served through v2 on the same lifecycle).
//! - [`serve`], after the one front step authenticated the key:
//!   - `GET /backend-api/codex/models`: the Codex catalog shape of the published catalog, as
//!     the caller's key sees it (`ops::models_body`).
//!   - `GET /backend-api/wham/usage` (and `/api/codex/usage`): [`pool_usage`], the combined
//!     limits of the accounts the caller's key is served from (its account group, or the
//!     shared pool) in the upstream's `RateLimitStatusPayload` shape.
//!   - `GET /backend-api/wham/accounts/check` (and `/api/codex/accounts/check`):
//!     [`accounts_check`], workspace routing to the gateway's own origin.
//! - [`side_call`]: every other path under those prefixes (plugins, MCP, analytics, settings,
//!   reset credits...): a cheap 404 the CLI tolerates, without authentication; a body of up
//!   to 64 KiB is read and dropped so the connection is kept, a larger or chunked one is not
//!   read at all (the connection closes after the 404).
//!
//! # Error handling
//! A missing or unknown key is a 401 in the upstream's (OpenAI-shaped) error body, through
//! [`super::write_error`], the one HTTP error mapping.

use std::io;

use monoio::io::{AsyncReadRent, AsyncWriteRent};
use shared_state::{AccountStatus, ClientKey, Snapshot};

use super::{write_read_error, Route, JSON};
use crate::{
    ctx::WorkerCtx,
    server::h1::{Conn, Framing, Request},
};

/// The most body a side call's (unauthenticated) request may carry and still be read; past
/// it the body is not read and the connection closes after the 404.
const SIDE_CALL_BODY_CAP: usize = 64 * 1024;
/// The 5-hour window, in seconds.
const PRIMARY_WINDOW_S: i64 = 5 * 3600;
/// The weekly window, in seconds.
const SECONDARY_WINDOW_S: i64 = 7 * 24 * 3600;

/// A side call ([`Route::SideCall`]): a cheap 404 in the backend's shape, without a key.
pub async fn side_call<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    mut req: Request,
    keep: bool,
) -> io::Result<bool> {
    // Anyone may call these (no key is asked for), so what is read is bounded by a small
    // cap, not the inference body limit: a small body (the CLI's analytics and settings
    // calls) is read and dropped so the connection lives on; a larger or unsized one is
    // not read at all, and the 404 closes the connection (the worker lingers briefly so
    // the client reads the answer, as after a 401).
    let small = match req.framing {
        Framing::None => true,
        Framing::Length(n) => n <= SIDE_CALL_BODY_CAP,
        Framing::Chunked => false,
    };
    if small {
        if let Err(e) = conn.read_body(&mut req, SIDE_CALL_BODY_CAP).await {
            return Ok(write_read_error(ctx, conn, Route::SideCall, e).await);
        }
    }
    ctx.metrics.request(Route::SideCall.label(), 404);
    conn.write_response(404, &[JSON], br#"{"detail":"Not Found"}"#, keep)
        .await?;
    Ok(keep && small)
}

/// Serves an authenticated ChatGPT-backend `GET` other than inference (which is the
/// Responses surface's): [`Route::CodexModels`], [`Route::PoolUsage`],
/// [`Route::AccountsCheck`].
pub async fn serve<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    req: Request,
    route: Route,
    key: &ClientKey,
    keep: bool,
) -> io::Result<bool> {
    let body = match route {
        Route::CodexModels => {
            let body = super::ops::models_body(ctx, key, true);
            ctx.metrics.request(route.label(), 200);
            return conn
                .write_response(200, &[JSON], &body, keep)
                .await
                .map(|()| keep);
        }
        Route::PoolUsage => pool_usage(
            &ctx.snapshot.load(),
            req.header("chatgpt-account-id"),
            shared_state::now_ms(),
            key.limits.account_group.as_deref(),
        ),
        Route::AccountsCheck => {
            let origin = match &ctx.cfg.chatgpt_origin {
                Some(o) => o.clone(),
                None => format!("https://{}", req.header("host").unwrap_or("localhost")),
            };
            accounts_check(req.header("chatgpt-account-id"), &origin)
        }
        // The dispatch hands this surface no other route.
        _ => {
            let e = crate::error::Error::new(
                crate::error::ErrorKind::NotFound,
                crate::error::Side::Internal,
            );
            return super::write_error(ctx, conn, route, &e, keep).await;
        }
    };
    ctx.metrics.request(route.label(), 200);
    conn.write_response(200, &[JSON], body.as_bytes(), keep)
        .await?;
    Ok(keep)
}

/// The account id the answers name: the one the CLI sent (its `auth.json` `account_id`), so
/// its workspace lookup finds itself; otherwise a fixed one.
fn account_id(sent: Option<&str>) -> String {
    sent.filter(|s| !s.is_empty() && s.len() <= 128 && !s.chars().any(char::is_control))
        .unwrap_or("codex-gateway")
        .to_owned()
}

/// `GET /wham/accounts/check`: one workspace, the CLI's own account id, whose backend origin
/// is the gateway (`chatgpt_origin`, else `https://` + the request's `Host`: the CLI accepts
/// only https origins, so the gateway is reached through TLS).
pub fn accounts_check(sent_account: Option<&str>, origin: &str) -> String {
    let id = account_id(sent_account);
    let v = sonic_rs::json!({
        "accounts": [{
            "id": id,
            "plan_type": "pro",
            "workspace_backend_origin": origin,
            "account_routing_override": "NO_CONSTRAINT",
            "name": "codex-gateway",
            "structure": "personal",
        }],
        "account_ordering": [id],
        "default_account_id": id,
    });
    sonic_rs::to_string(&v).unwrap_or_default()
}

/// One window of the pool, combined over the accounts that can serve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolWindow {
    /// Mean used percent (each account counts as one equal share of the pool).
    pub used_percent: f64,
    /// When the first account's window resets (capacity comes back), unix seconds; 0 unknown.
    pub reset_at: u64,
}

/// The pool's combined limits: `(primary, secondary, plan, limit_reached)` over active
/// accounts with a token (cooling or exhausted ones count as fully used).
pub fn pool_windows(
    snap: &Snapshot,
    now_ms: u64,
    group: Option<&str>,
) -> (PoolWindow, PoolWindow, String, bool) {
    let now_s = now_ms / 1000;
    let (mut n, mut p_sum, mut s_sum) = (0usize, 0f64, 0f64);
    let (mut p_reset, mut s_reset) = (u64::MAX, u64::MAX);
    let mut any_free = false;
    let mut plan: Option<&str> = None;
    for a in snap.accounts.iter() {
        // Only the accounts that can serve the caller: its key's group (none: the shared
        // pool), as the scheduler picks them.
        if a.effective_status() != AccountStatus::Active
            || a.access_token.is_empty()
            || a.group.as_deref() != group
        {
            continue;
        }
        n += 1;
        let live = &a.live;
        let (p, s) = crate::scheduler::quota_pcts(live, now_ms);
        let cooling = live.is_cooling(now_ms);
        let (p, s) = if cooling { (100.0, s.max(p)) } else { (p, s) };
        p_sum += p;
        s_sum += s;
        if !cooling && p < 100.0 && s < 100.0 {
            any_free = true;
        }
        if live.primary_reset_at() > now_s {
            p_reset = p_reset.min(live.primary_reset_at());
        }
        if live.secondary_reset_at() > now_s {
            s_reset = s_reset.min(live.secondary_reset_at());
        }
        if let Some(pl) = a.plan.as_deref() {
            plan = Some(best_plan(plan, pl));
        }
    }
    let mean = |sum: f64| if n == 0 { 100.0 } else { sum / n as f64 };
    let known = |r: u64| if r == u64::MAX { 0 } else { r };
    (
        PoolWindow {
            used_percent: mean(p_sum),
            reset_at: known(p_reset),
        },
        PoolWindow {
            used_percent: mean(s_sum),
            reset_at: known(s_reset),
        },
        plan.unwrap_or("pro").to_owned(),
        !any_free,
    )
}

/// The higher of two plan names (what the pool offers is its best plan).
fn best_plan<'a>(a: Option<&'a str>, b: &'a str) -> &'a str {
    const RANK: [&str; 6] = ["free", "go", "plus", "team", "business", "pro"];
    let rank = |p: &str| RANK.iter().position(|r| *r == p);
    match a {
        None => b,
        Some(a) if rank(b) > rank(a) => b,
        Some(a) => a,
    }
}

/// `GET /wham/usage`: the pool's combined limits in the upstream's shape (integers, as the
/// CLI's `RateLimitWindowSnapshot` reads them).
pub fn pool_usage(
    snap: &Snapshot,
    sent_account: Option<&str>,
    now_ms: u64,
    group: Option<&str>,
) -> String {
    let (p, s, plan, reached) = pool_windows(snap, now_ms, group);
    let now_s = (now_ms / 1000) as i64;
    let window = |w: PoolWindow, len: i64| {
        let reset_at = if w.reset_at == 0 {
            now_s + len
        } else {
            w.reset_at as i64
        };
        sonic_rs::json!({
            "used_percent": w.used_percent.round().clamp(0.0, 100.0) as i64,
            "limit_window_seconds": len,
            "reset_after_seconds": (reset_at - now_s).max(0),
            "reset_at": reset_at,
        })
    };
    let v = sonic_rs::json!({
        "user_id": "codex-gateway",
        "account_id": account_id(sent_account),
        "email": null,
        "plan_type": plan,
        "rate_limit": {
            "allowed": !reached,
            "limit_reached": reached,
            "primary_window": window(p, PRIMARY_WINDOW_S),
            "secondary_window": window(s, SECONDARY_WINDOW_S),
        },
        "credits": {"has_credits": false, "unlimited": false, "balance": "0"},
        "additional_rate_limits": [],
    });
    sonic_rs::to_string(&v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_check_echoes_the_account_and_names_the_origin() {
        use sonic_rs::JsonValueTrait;
        let v: sonic_rs::Value =
            sonic_rs::from_str(&accounts_check(Some("acct-1"), "https://gw.example:8443"))
                .expect("json");
        let a = &v["accounts"][0];
        assert_eq!(a["id"].as_str(), Some("acct-1"));
        assert_eq!(
            a["workspace_backend_origin"].as_str(),
            Some("https://gw.example:8443")
        );
        assert_eq!(
            a["account_routing_override"].as_str(),
            Some("NO_CONSTRAINT")
        );
        assert_eq!(v["default_account_id"].as_str(), Some("acct-1"));
        let v: sonic_rs::Value =
            sonic_rs::from_str(&accounts_check(Some("a\nb"), "https://x")).expect("json");
        assert_eq!(v["accounts"][0]["id"].as_str(), Some("codex-gateway"));
    }

    #[test]
    fn plans_rank() {
        assert_eq!(best_plan(None, "plus"), "plus");
        assert_eq!(best_plan(Some("plus"), "pro"), "pro");
        assert_eq!(best_plan(Some("pro"), "plus"), "pro");
        assert_eq!(best_plan(Some("pro"), "weird"), "pro");
    }
}
