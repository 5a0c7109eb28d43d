//! Per-key limits on the data plane: admission (budgets, concurrency, requests per minute),
//! the settlement of each request's usage against the key's budgets, the key's own usage
//! (`GET /v1/usage`) and the limit metrics. The budget and RPM rules live here and only here
//! (in Rust for the process's counters, and in the Lua of [`ADMIT_LUA`] for the fleet's).
//!
//! # Key Components
//! - [`admit`]: the one admission rule, run on the request head after authentication (and on
//!   each WebSocket turn). Order: budgets spent (429 `insufficient_quota`, `Retry-After` until
//!   the UTC day / month ends), concurrency (429 `rate_limit_exceeded`, `Retry-After: 1`),
//!   budget held by requests in flight (429 `rate_limit_exceeded`, `Retry-After: 1`), then
//!   requests per minute (429 `rate_limit_exceeded`, `Retry-After` until the UTC minute ends;
//!   only an admitted request takes an RPM unit). Returns a [`KeySlot`] that holds the
//!   concurrency slot and the request's budget reservation until dropped.
//! - **Reserve at admission, settle at the end.** A key with a token (cost) budget reserves an
//!   estimate of the request's tokens (cost) at admission: the key's moving average of its
//!   recent requests here ([`KeyLive::learn`], newest weighted 1/4), or
//!   [`DEFAULT_TOKEN_ESTIMATE`] / [`DEFAULT_COST_ESTIMATE_MICROS`] before the first, never 0.
//!   A request is refused when `used >= budget`, or when other requests hold reservations and
//!   `used + reserved + estimate > budget`. With nothing reserved a request is admitted while
//!   anything is left: a lone request may overshoot by its own usage (what it will use is
//!   unknown until it ends), parallel requests may not add their overshoots up. At the end
//!   `pipeline::UsageGuard` records the real figure ([`Settlement::record`]) and the slot's
//!   drop gives the reservation back: every path (answer, error, client gone, panic) drops it.
//! - **Fleet-wide** (Redis configured, worker-side client up): a key with an RPM limit or a
//!   budget is admitted by one atomic Lua script ([`ADMIT_LUA`]: the fleet's RPM counter,
//!   used counters and reservations, checked and taken at once, one round trip bounded by
//!   [`FLEET_ADMIT_TIMEOUT`]); its usage is added to the fleet's counters by the worker
//!   itself ([`SETTLE_LUA`], in submission order before the reservation's release,
//!   [`RELEASE_LUA`]), so no instance ever sees a finished request as neither reserved nor
//!   used. Fleet reservations live in per-minute buckets read for [`HELD_WINDOW_MINUTES`]:
//!   a release lost with Redis (or with a killed process) frees itself by then. Fail-open:
//!   when the round trip fails (Redis down, breaker open, timeout) the request is decided on
//!   this process's counters, as without Redis (`/healthz` `key_limits` says which mode the
//!   sidecar's reconciliation is in). Keys without an RPM limit or budget never wait for Redis.
//! - The model allow-list and the account group are applied by `lifecycle::open` (the model
//!   is known only after the body is parsed); the cost of a request is computed by
//!   `pipeline::UsageGuard` when it finishes.
//! - [`open_ws_session`]: the per-key cap on open client WebSocket sessions
//!   (`max_ws_sessions_per_key`; 429 `too_many_websocket_sessions`, `Retry-After: 1`), taken
//!   before the 101 and held by a [`WsSessionSlot`] for the socket's life. An HTTP connection
//!   is bound to no key between its requests, so a key's HTTP share is its concurrency limit.
//! - [`usage`]: `GET /v1/usage`, the calling key's usage today and this month and its limits.
//!
//! # Error handling
//! Every refusal is an [`Error`] rendered by `api::write_error` in the route's dialect. A
//! Redis failure never refuses a request by itself (fail-open to the local counters, above).

use std::{
    fmt::Write as _,
    io,
    rc::Rc,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use monoio::io::{AsyncReadRent, AsyncWriteRent};
use shared_state::{
    keys::{self, Budget, KeyLimits, KeyLive},
    ClientKey, Health,
};

use crate::{
    ctx::WorkerCtx,
    error::{Error, ErrorKind, KeyLimit, Side},
    redis::{encode, Reply, WorkerRedis},
    server::h1::Conn,
};

/// The token estimate of a key's request before any of its requests finished here.
pub const DEFAULT_TOKEN_ESTIMATE: u64 = 1_000;
/// The cost estimate before any request finished here, micro-USD ($0.005: 1,000 tokens at a
/// blend of the default input and output prices).
pub const DEFAULT_COST_ESTIMATE_MICROS: u64 = 5_000;
/// Bound on the fleet admission's Redis round trip (connect included); past it the request is
/// decided locally (fail-open).
pub const FLEET_ADMIT_TIMEOUT: Duration = Duration::from_millis(200);
/// Minutes a fleet reservation counts (its bucket's and the previous ones'): a request still
/// running after that is counted when it ends, and a lost release frees itself.
pub const HELD_WINDOW_MINUTES: u64 = 5;
/// Time to live of a reservation bucket.
const HELD_TTL_MS: u64 = (HELD_WINDOW_MINUTES + 1) * 60_000;
/// Time to live of the fleet's budget counters (as `admin::key_limits` sets them).
const DAY_TTL_SECS: u64 = 2 * 86_400;
const MONTH_TTL_SECS: u64 = 33 * 86_400;

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

/// A fleet reservation: the reservation buckets and what was put in them.
struct FleetHold {
    redis: Rc<WorkerRedis>,
    /// `held_tokens` and `held_cost` buckets of the admission's minute.
    keys: [Vec<u8>; 2],
    amounts: [u64; 2],
}

/// A request admitted under its key's limits: its concurrency slot and its budget
/// reservations (this process's, and the fleet's when admitted through Redis), all given back
/// on drop, whatever path drops it.
pub struct KeySlot {
    live: Arc<KeyLive>,
    /// Reserved here: tokens, cost.
    held: [u64; 2],
    fleet: Option<FleetHold>,
}

impl std::fmt::Debug for KeySlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySlot")
            .field("held", &self.held)
            .field("fleet", &self.fleet.as_ref().map(|h| h.amounts))
            .finish_non_exhaustive()
    }
}

impl Drop for KeySlot {
    fn drop(&mut self) {
        self.live.leave();
        self.live.unreserve(Budget::Tokens, self.held[0]);
        self.live.unreserve(Budget::Cost, self.held[1]);
        if let Some(h) = self.fleet.take() {
            // Behind this worker's settlement of the same request (submitted when its usage
            // guard dropped, before this): the fleet never sees it neither held nor used.
            let cmd = encode(&[
                b"EVAL",
                RELEASE_LUA.as_bytes(),
                b"2",
                &h.keys[0],
                &h.keys[1],
                h.amounts[0].to_string().as_bytes(),
                h.amounts[1].to_string().as_bytes(),
            ]);
            h.redis.submit(cmd, Box::new(|_| {}));
        }
    }
}

fn refuse(limit: KeyLimit, retry_after_ms: u64) -> Error {
    rejected(match limit {
        KeyLimit::Rpm(_) => Rejection::Rpm,
        KeyLimit::Concurrency(_) => Rejection::Concurrency,
        KeyLimit::WsSessions(_) => Rejection::WsSessions,
        KeyLimit::TokensPerDay(_) | KeyLimit::TokensPerMonth(_) => Rejection::Tokens,
        KeyLimit::CostPerDay(_) | KeyLimit::CostPerMonth(_) => Rejection::Cost,
        KeyLimit::BudgetHeld { cost: false } => Rejection::Tokens,
        KeyLimit::BudgetHeld { cost: true } => Rejection::Cost,
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

/// How a budget stands for one more request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Budgeted {
    /// Admit.
    Fits,
    /// Spent: refuse until the period ends.
    Spent,
    /// What is left is held by requests in flight: refuse for now.
    Held,
}

/// The budget rule (the fleet's Lua in [`ADMIT_LUA`] is the same rule): `used` of `limit`
/// spent, `reserved` held by requests in flight, `estimate` for this one.
fn budget_rule(used: u64, reserved: u64, estimate: u64, limit: u64) -> Budgeted {
    if used >= limit {
        Budgeted::Spent
    } else if reserved > 0 && used.saturating_add(reserved).saturating_add(estimate) > limit {
        Budgeted::Held
    } else {
        Budgeted::Fits
    }
}

/// The estimates a request of `live` reserves: (tokens, cost), 0 for a budget kind the key
/// does not have.
fn estimates(l: &KeyLimits, live: &KeyLive) -> [u64; 2] {
    let tokens = (l.tokens_per_day.is_some() || l.tokens_per_month.is_some()).then(|| {
        match live.average(Budget::Tokens) {
            0 => DEFAULT_TOKEN_ESTIMATE,
            a => a,
        }
    });
    let cost =
        (l.cost_per_day_micros.is_some() || l.cost_per_month_micros.is_some()).then(|| match live
            .average(Budget::Cost)
        {
            0 => DEFAULT_COST_ESTIMATE_MICROS,
            a => a.max(1),
        });
    [tokens.unwrap_or(0), cost.unwrap_or(0)]
}

fn fleet_limited(l: &KeyLimits) -> bool {
    l.rpm.is_some()
        || l.tokens_per_day.is_some()
        || l.tokens_per_month.is_some()
        || l.cost_per_day_micros.is_some()
        || l.cost_per_month_micros.is_some()
}

/// Admits one request of `key` at `now_ms`, or refuses it (see the module docs): on this
/// process's counters, then, for a key with an RPM limit or a budget and a worker-side Redis,
/// atomically on the fleet's.
// The data plane's one error type, as every handler returns it.
#[allow(clippy::result_large_err)]
pub async fn admit(ctx: &WorkerCtx, key: &ClientKey, now_ms: u64) -> Result<KeySlot, Error> {
    let redis = ctx
        .transcripts
        .redis()
        .filter(|r| fleet_limited(&key.limits) && !r.breaker_open());
    let mut slot = admit_here(key, now_ms, redis.is_some())?;
    if let Some(redis) = redis {
        // Boxed: only limited keys with Redis carry this state, not every request future.
        match Box::pin(admit_fleet(redis, key, now_ms, &slot)).await {
            Ok(hold) => {
                slot.fleet = Some(hold);
                return Ok(slot);
            }
            Err(Some(e)) => return Err(e),
            Err(None) => {
                // Fail-open: the unit this process's counters would have taken.
                take_rpm_here(key, now_ms)?;
            }
        }
    }
    Ok(slot)
}

/// The admission on this process's counters. `fleet_next`: the fleet's script decides next,
/// so the RPM unit is only checked here (the script takes it).
#[allow(clippy::result_large_err)]
fn admit_here(key: &ClientKey, now_ms: u64, fleet_next: bool) -> Result<KeySlot, Error> {
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
    let est = estimates(l, live);
    // (limit, used, budget kind, refusal when spent)
    let budgets = [
        (
            l.tokens_per_day,
            live.day.tokens.value(day),
            Budget::Tokens,
            KeyLimit::TokensPerDay as fn(u64) -> KeyLimit,
            day_left,
        ),
        (
            l.tokens_per_month,
            live.month.tokens.value(month),
            Budget::Tokens,
            KeyLimit::TokensPerMonth,
            month_left,
        ),
        (
            l.cost_per_day_micros,
            live.day.cost_micros.value(day),
            Budget::Cost,
            KeyLimit::CostPerDay,
            day_left,
        ),
        (
            l.cost_per_month_micros,
            live.month.cost_micros.value(month),
            Budget::Cost,
            KeyLimit::CostPerMonth,
            month_left,
        ),
    ];
    for (limit, used, _, spent, left) in budgets {
        if let Some(n) = limit.filter(|&n| used >= n) {
            return Err(refuse(spent(n), left));
        }
    }
    if !live.try_enter(l.max_concurrency) {
        return Err(refuse(
            KeyLimit::Concurrency(l.max_concurrency.unwrap_or(0)),
            1000,
        ));
    }
    // From here every refusal drops the slot: the concurrency unit and whatever was
    // reserved go back.
    let mut slot = KeySlot {
        live: Arc::clone(live),
        held: [0, 0],
        fleet: None,
    };
    // The reservations, each kind in one compare-and-swap against every budget of its kind.
    for (i, kind) in [Budget::Tokens, Budget::Cost].into_iter().enumerate() {
        if est[i] == 0 {
            continue;
        }
        let check = |reserved: u64| {
            for (limit, used, k, spent, left) in budgets {
                let Some(n) = limit.filter(|_| k == kind) else {
                    continue;
                };
                match budget_rule(used, reserved, est[i], n) {
                    Budgeted::Fits => {}
                    Budgeted::Spent => return Err(refuse(spent(n), left)),
                    Budgeted::Held => {
                        return Err(refuse(
                            KeyLimit::BudgetHeld {
                                cost: kind == Budget::Cost,
                            },
                            1000,
                        ))
                    }
                }
            }
            Ok(())
        };
        live.reserve(kind, est[i], check)?;
        slot.held[i] = est[i];
    }
    if fleet_next {
        let minute = keys::minute_of(now_ms);
        if let Some(rpm) = l.rpm.filter(|&n| live.minute.value(minute) >= u64::from(n)) {
            return Err(refuse(
                KeyLimit::Rpm(rpm),
                keys::minute_end_ms(minute).saturating_sub(now_ms),
            ));
        }
    } else {
        take_rpm_here(key, now_ms)?;
    }
    live.touch(now_ms);
    Ok(slot)
}

/// Takes this minute's RPM unit on this process's counters (pushed to the fleet by the
/// sidecar).
#[allow(clippy::result_large_err)]
fn take_rpm_here(key: &ClientKey, now_ms: u64) -> Result<(), Error> {
    let minute = keys::minute_of(now_ms);
    match key.limits.rpm {
        Some(rpm) => {
            if !key.live.minute.try_take(minute, u64::from(rpm)) {
                return Err(refuse(
                    KeyLimit::Rpm(rpm),
                    keys::minute_end_ms(minute).saturating_sub(now_ms),
                ));
            }
        }
        None => key.live.minute.add(minute, 1),
    }
    Ok(())
}

fn redis_key(tag: &str, name: &str, period: u64) -> Vec<u8> {
    format!("codex-gateway:limits:{tag}:{name}:{period}").into_bytes()
}

/// The fleet's admission: RPM, budgets and reservations checked and taken in one step.
///
/// `KEYS`: 1 the minute's RPM counter; 2-5 the used counters (day tokens, month tokens, day
/// cost, month cost); 6-10 and 11-15 the token and cost reservation buckets of this minute
/// and the [`HELD_WINDOW_MINUTES`] - 1 before it. `ARGV`: 1 the RPM limit, 2-5 the budgets
/// (-1: none); 6-7 the token and cost estimates (0: no reservation); 8-11 this process's
/// view of the used counters (a floor: the fleet counter may be missing or behind); 12-15
/// this process's increments not pushed yet; 16 this process's view of the RPM counter;
/// 17 the buckets' time to live (ms). Returns `{0, rpm count}` admitted, `{j, used}` budget
/// `j` spent, `{10 + j, used}` budget `j` held by requests in flight, `{5, count}` over RPM.
pub const ADMIT_LUA: &str = r#"
local function num(k) return tonumber(redis.call('GET', k) or '0') or 0 end
local held = {0, 0}
for i = 6, 10 do held[1] = held[1] + num(KEYS[i]) end
for i = 11, 15 do held[2] = held[2] + num(KEYS[i]) end
local est = {tonumber(ARGV[6]), tonumber(ARGV[7])}
for j = 1, 4 do
  local limit = tonumber(ARGV[1 + j])
  if limit >= 0 then
    local used = math.max(num(KEYS[1 + j]) + tonumber(ARGV[11 + j]), tonumber(ARGV[7 + j]))
    local b = 2
    if j <= 2 then b = 1 end
    if used >= limit then return {j, used} end
    if held[b] > 0 and used + held[b] + est[b] > limit then return {10 + j, used} end
  end
end
local rpm = tonumber(ARGV[1])
local n = math.max(num(KEYS[1]), tonumber(ARGV[16]))
if rpm >= 0 and n >= rpm then return {5, n} end
n = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], 120)
if est[1] > 0 then
  redis.call('INCRBY', KEYS[6], est[1])
  redis.call('PEXPIRE', KEYS[6], ARGV[17])
end
if est[2] > 0 then
  redis.call('INCRBY', KEYS[11], est[2])
  redis.call('PEXPIRE', KEYS[11], ARGV[17])
end
return {0, n}
"#;

/// A finished request's usage added to the fleet's used counters. `KEYS`: day requests,
/// tokens, cost, then month requests, tokens, cost. `ARGV`: 1-2 the day's and month's time to
/// live (s), then per key its amount and its seed (this process's synced view, set first when
/// the counter is missing, as the sidecar's first push would). Returns the totals.
pub const SETTLE_LUA: &str = r#"
local out = {}
for i = 1, #KEYS do
  local ttl = ARGV[2]
  if i <= 3 then ttl = ARGV[1] end
  if redis.call('EXISTS', KEYS[i]) == 0 then
    redis.call('SET', KEYS[i], ARGV[2 + 2 * i], 'EX', ttl)
  end
  out[i] = redis.call('INCRBY', KEYS[i], ARGV[1 + 2 * i])
  redis.call('EXPIRE', KEYS[i], ttl)
end
return out
"#;

/// A reservation given back: `KEYS` its token and cost buckets, `ARGV` the amounts. A bucket
/// that expired is left alone.
pub const RELEASE_LUA: &str = r#"
for i = 1, #KEYS do
  if tonumber(ARGV[i]) > 0 and redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('DECRBY', KEYS[i], ARGV[i])
  end
end
return 0
"#;

/// The fleet's admission round trip. `Err(Some)`: refused; `Err(None)`: Redis failed (the
/// caller decides locally).
async fn admit_fleet(
    redis: &Rc<WorkerRedis>,
    key: &ClientKey,
    now_ms: u64,
    slot: &KeySlot,
) -> Result<FleetHold, Option<Error>> {
    let l = &*key.limits;
    let live = &*key.live;
    let tag = &*key.tag;
    let (minute, day, month) = (
        keys::minute_of(now_ms),
        keys::day_of(now_ms),
        keys::month_of(now_ms),
    );
    let mut keys: Vec<Vec<u8>> = vec![
        redis_key(tag, "rpm", minute),
        redis_key(tag, "day_tokens", day),
        redis_key(tag, "month_tokens", month),
        redis_key(tag, "day_cost", day),
        redis_key(tag, "month_cost", month),
    ];
    for name in ["held_tokens", "held_cost"] {
        for m in 0..HELD_WINDOW_MINUTES {
            keys.push(redis_key(tag, name, minute.saturating_sub(m)));
        }
    }
    let opt = |v: Option<u64>| v.map_or(-1i128, i128::from).to_string();
    let counters = [
        (&live.day.tokens, day),
        (&live.month.tokens, month),
        (&live.day.cost_micros, day),
        (&live.month.cost_micros, month),
    ];
    let mut argv: Vec<String> = vec![
        opt(l.rpm.map(u64::from)),
        opt(l.tokens_per_day),
        opt(l.tokens_per_month),
        opt(l.cost_per_day_micros),
        opt(l.cost_per_month_micros),
        slot.held[0].to_string(),
        slot.held[1].to_string(),
    ];
    argv.extend(counters.iter().map(|(c, p)| c.value(*p).to_string()));
    argv.extend(counters.iter().map(|(c, p)| c.unpushed(*p).to_string()));
    argv.push(live.minute.value(minute).to_string());
    argv.push(HELD_TTL_MS.to_string());
    let nkeys = keys.len().to_string();
    let mut args: Vec<&[u8]> = vec![b"EVAL", ADMIT_LUA.as_bytes(), nkeys.as_bytes()];
    args.extend(keys.iter().map(Vec::as_slice));
    args.extend(argv.iter().map(String::as_bytes));
    redis.start_writer();
    let reply = match redis
        .pipeline_within(&[encode(&args)], FLEET_ADMIT_TIMEOUT)
        .await
    {
        Ok(mut r) => r.pop(),
        Err(e) => {
            tracing::debug!(error = %e, "fleet admission failed; deciding on local counters");
            return Err(None);
        }
    };
    let (code, n) = match reply {
        Some(Reply::Array(Some(v))) => match v.as_slice() {
            [Reply::Integer(c), Reply::Integer(n)] => (*c, u64::try_from(*n).unwrap_or(0)),
            _ => return Err(None),
        },
        other => {
            tracing::debug!(reply = ?other, "fleet admission: unexpected reply; deciding locally");
            return Err(None);
        }
    };
    let day_left = keys::day_start_ms(day + 1).saturating_sub(now_ms);
    let month_left = keys::month_start_ms(month + 1).saturating_sub(now_ms);
    let spent = |j: i64| -> Option<(KeyLimit, u64)> {
        Some(match j {
            1 => (KeyLimit::TokensPerDay(l.tokens_per_day?), day_left),
            2 => (KeyLimit::TokensPerMonth(l.tokens_per_month?), month_left),
            3 => (KeyLimit::CostPerDay(l.cost_per_day_micros?), day_left),
            4 => (KeyLimit::CostPerMonth(l.cost_per_month_micros?), month_left),
            _ => return None,
        })
    };
    match code {
        0 => {
            live.minute.observe(minute, n);
            Ok(FleetHold {
                redis: Rc::clone(redis),
                keys: [
                    redis_key(tag, "held_tokens", minute),
                    redis_key(tag, "held_cost", minute),
                ],
                amounts: slot.held,
            })
        }
        5 => {
            live.minute.observe(minute, n);
            let rpm = l.rpm.unwrap_or(0);
            Err(Some(refuse(
                KeyLimit::Rpm(rpm),
                keys::minute_end_ms(minute).saturating_sub(now_ms),
            )))
        }
        1..=4 => {
            // What the fleet spent: the next request is refused here without a round trip.
            let (c, p) = counters[(code - 1) as usize];
            c.observe(p, n);
            match spent(code) {
                Some((limit, left)) => Err(Some(refuse(limit, left))),
                None => Err(None),
            }
        }
        11..=14 => Err(Some(refuse(
            KeyLimit::BudgetHeld { cost: code >= 13 },
            1000,
        ))),
        _ => Err(None),
    }
}

/// What `pipeline::UsageGuard` needs to settle a finished request against its key's budgets.
#[derive(Clone)]
pub struct Settlement {
    live: Arc<KeyLive>,
    limits: Arc<KeyLimits>,
    tag: Arc<str>,
}

impl std::fmt::Debug for Settlement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settlement").finish_non_exhaustive()
    }
}

impl Settlement {
    /// The settlement of a request of `key`.
    pub fn of(key: &ClientKey) -> Self {
        Self {
            live: Arc::clone(&key.live),
            limits: Arc::clone(&key.limits),
            tag: Arc::clone(&key.tag),
        }
    }

    /// Records a finished request's real usage (`tokens`, `cost_micros`) at `now_ms`: in this
    /// process's counters at once, and in the fleet's by this worker (behind the request's
    /// own reservation, which its [`KeySlot`] gives back after) when the key has a budget and
    /// Redis is up; otherwise the sidecar pushes it with its next reconciliation. Feeds the
    /// key's estimate.
    pub fn record(&self, ctx: &WorkerCtx, now_ms: u64, tokens: u64, cost_micros: u64) {
        let live = &self.live;
        live.learn(tokens, cost_micros);
        let l = &*self.limits;
        let budgeted = l.tokens_per_day.is_some()
            || l.tokens_per_month.is_some()
            || l.cost_per_day_micros.is_some()
            || l.cost_per_month_micros.is_some();
        let redis = ctx
            .transcripts
            .redis()
            .filter(|r| budgeted && r.writer_running() && !r.breaker_open());
        let Some(redis) = redis else {
            live.record(now_ms, tokens, cost_micros);
            return;
        };
        let (day, month) = (keys::day_of(now_ms), keys::month_of(now_ms));
        let tag = &*self.tag;
        let parts: [(&keys::Counter, &str, u64, u64); 6] = [
            (&live.day.requests, "day_requests", day, 1),
            (&live.day.tokens, "day_tokens", day, tokens),
            (&live.day.cost_micros, "day_cost", day, cost_micros),
            (&live.month.requests, "month_requests", month, 1),
            (&live.month.tokens, "month_tokens", month, tokens),
            (&live.month.cost_micros, "month_cost", month, cost_micros),
        ];
        let keys: Vec<Vec<u8>> = parts
            .iter()
            .map(|(_, n, p, _)| redis_key(tag, n, *p))
            .collect();
        let mut argv: Vec<String> = vec![DAY_TTL_SECS.to_string(), MONTH_TTL_SECS.to_string()];
        for (c, _, p, n) in &parts {
            argv.push(n.to_string());
            argv.push(c.synced(*p).to_string());
            c.add_transit(*p, *n);
        }
        let mut args: Vec<&[u8]> = vec![b"EVAL", SETTLE_LUA.as_bytes(), b"6"];
        args.extend(keys.iter().map(Vec::as_slice));
        args.extend(argv.iter().map(String::as_bytes));
        let amounts: [u64; 6] = [1, tokens, cost_micros, 1, tokens, cost_micros];
        let live = Arc::clone(live);
        redis.submit(
            encode(&args),
            Box::new(move |reply| {
                let totals: Option<Vec<u64>> = match reply {
                    Some(Reply::Array(Some(v))) if v.len() == 6 => v
                        .iter()
                        .map(|r| match r {
                            Reply::Integer(n) => u64::try_from(*n).ok(),
                            _ => None,
                        })
                        .collect(),
                    _ => None,
                };
                let cells = [
                    (&live.day.requests, day),
                    (&live.day.tokens, day),
                    (&live.day.cost_micros, day),
                    (&live.month.requests, month),
                    (&live.month.tokens, month),
                    (&live.month.cost_micros, month),
                ];
                for (i, (c, p)) in cells.into_iter().enumerate() {
                    c.land(p, amounts[i], totals.as_ref().map(|t| t[i]));
                }
            }),
        );
    }
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
    conn.write_response(200, &[("content-type", "application/json")], &body, keep)
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
        drop(admit_here(&k, NOW, false).unwrap());
        drop(admit_here(&k, NOW, false).unwrap());
        let e = admit_here(&k, NOW, false).unwrap_err();
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
        assert!(admit_here(&k, NOW + 30_000, false).is_ok());
    }

    #[test]
    fn concurrency_slot_is_held_until_dropped() {
        let k = key(KeyLimits {
            max_concurrency: Some(1),
            ..KeyLimits::unlimited()
        });
        let slot = admit_here(&k, NOW, false).unwrap();
        assert!(matches!(
            kind(admit_here(&k, NOW, false).unwrap_err()),
            ErrorKind::KeyLimit {
                limit: KeyLimit::Concurrency(1),
                ..
            }
        ));
        drop(slot);
        assert!(admit_here(&k, NOW, false).is_ok());
    }

    #[test]
    fn rpm_refusal_gives_back_the_concurrency_slot() {
        let k = key(KeyLimits {
            rpm: Some(1),
            max_concurrency: Some(5),
            ..KeyLimits::unlimited()
        });
        let _a = admit_here(&k, NOW, false).unwrap();
        assert!(admit_here(&k, NOW, false).is_err());
        assert_eq!(k.live.in_flight(), 1);
    }

    #[test]
    fn budgets_refuse_once_spent_with_insufficient_quota() {
        let k = key(KeyLimits {
            tokens_per_day: Some(100),
            cost_per_month_micros: Some(5_000),
            ..KeyLimits::unlimited()
        });
        assert!(admit_here(&k, NOW, false).is_ok());
        k.live.record(NOW, 99, 0);
        assert!(admit_here(&k, NOW, false).is_ok());
        k.live.record(NOW, 1, 0);
        let e = admit_here(&k, NOW, false).unwrap_err();
        let r = e.to_openai();
        assert_eq!(r.status, 429);
        assert_eq!(r.body.code.as_deref(), Some("insufficient_quota"));
        assert_eq!(r.body.error_type, "insufficient_quota");
        // until 00:00 UTC
        assert_eq!(r.retry_after, Some(7 * 3600 - 30));
        // the next day admits; the monthly cost budget still counts
        let tomorrow = NOW + 7 * 3_600_000;
        assert!(admit_here(&k, tomorrow, false).is_ok());
        k.live.record(tomorrow, 0, 5_000);
        assert!(matches!(
            kind(admit_here(&k, tomorrow, false).unwrap_err()),
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
        assert!(admit_here(&k, NOW - 1, false).is_ok());
        assert_eq!(
            kind(admit_here(&k, NOW, false).unwrap_err()),
            ErrorKind::Unauthorized { key_present: true }
        );
        let k = key(KeyLimits {
            enabled: false,
            ..KeyLimits::unlimited()
        });
        assert_eq!(
            admit_here(&k, NOW, false).unwrap_err().to_openai().status,
            401
        );
    }

    #[test]
    fn anthropic_dialect_gets_rate_limit_error() {
        let k = key(KeyLimits {
            rpm: Some(0),
            ..KeyLimits::unlimited()
        });
        let e = admit_here(&k, NOW, false).unwrap_err();
        let r = e.render(crate::error::Dialect::Anthropic);
        assert_eq!(r.status, 429);
        let v: sonic_rs::Value = sonic_rs::from_slice(&r.body).unwrap();
        use sonic_rs::JsonValueTrait;
        assert_eq!(v["error"]["type"].as_str(), Some("rate_limit_error"));
        assert_eq!(r.retry_after, Some(30));
    }

    #[test]
    fn parallel_requests_reserve_their_estimate_and_give_it_back() {
        let k = key(KeyLimits {
            tokens_per_day: Some(500),
            ..KeyLimits::unlimited()
        });
        // No history: the default estimate. Alone, a request is admitted while anything is
        // left; a second one would need used + held + estimate <= budget.
        let a = admit_here(&k, NOW, false).unwrap();
        assert_eq!(k.live.reserved(Budget::Tokens), DEFAULT_TOKEN_ESTIMATE);
        let e = admit_here(&k, NOW, false).unwrap_err();
        let r = e.to_openai();
        assert_eq!(r.status, 429);
        assert_eq!(r.body.code.as_deref(), Some("rate_limit_exceeded"));
        assert_eq!(r.retry_after, Some(1));
        // the refusal gave its concurrency unit back
        assert_eq!(k.live.in_flight(), 1);
        k.live.record(NOW, 46, 0);
        k.live.learn(46, 0);
        drop(a);
        assert_eq!(k.live.reserved(Budget::Tokens), 0);
        // Learned 46 a request, 46 used: in flight together, 9 more fit (46 + 9 * 46 = 460;
        // a tenth would make 506).
        let mut held = Vec::new();
        while let Ok(s) = admit_here(&k, NOW, false) {
            held.push(s);
            assert!(held.len() < 100);
        }
        assert_eq!(held.len(), 9);
        drop(held);
        assert_eq!(k.live.reserved(Budget::Tokens), 0);
        assert_eq!(k.live.in_flight(), 0);
    }

    #[test]
    fn a_spent_budget_refuses_until_the_period_ends_even_with_nothing_held() {
        let k = key(KeyLimits {
            cost_per_day_micros: Some(10_000),
            ..KeyLimits::unlimited()
        });
        let a = admit_here(&k, NOW, false).unwrap();
        assert_eq!(k.live.reserved(Budget::Cost), DEFAULT_COST_ESTIMATE_MICROS);
        assert_eq!(k.live.reserved(Budget::Tokens), 0);
        // 4,000 used, 5,000 held, 5,000 more would pass the budget: held.
        k.live.record(NOW, 10, 4_000);
        assert!(matches!(
            kind(admit_here(&k, NOW, false).unwrap_err()),
            ErrorKind::KeyLimit {
                limit: KeyLimit::BudgetHeld { cost: true },
                retry_after: 1
            }
        ));
        drop(a);
        k.live.record(NOW, 10, 6_000);
        assert!(matches!(
            kind(admit_here(&k, NOW, false).unwrap_err()),
            ErrorKind::KeyLimit {
                limit: KeyLimit::CostPerDay(10_000),
                ..
            }
        ));
    }

    #[test]
    fn the_estimate_is_a_moving_average_never_zero() {
        let l = KeyLive::default();
        let limits = KeyLimits {
            tokens_per_month: Some(1),
            ..KeyLimits::unlimited()
        };
        assert_eq!(estimates(&limits, &l), [DEFAULT_TOKEN_ESTIMATE, 0]);
        l.learn(0, 0); // a failure without usage teaches nothing
        assert_eq!(estimates(&limits, &l)[0], DEFAULT_TOKEN_ESTIMATE);
        l.learn(100, 10);
        assert_eq!(estimates(&limits, &l)[0], 100);
        l.learn(500, 10);
        assert_eq!(estimates(&limits, &l)[0], 200);
        for _ in 0..50 {
            l.learn(1, 0);
        }
        assert_eq!(estimates(&limits, &l)[0], 1);
        assert_eq!(l.average(Budget::Cost), 1);
    }
}
