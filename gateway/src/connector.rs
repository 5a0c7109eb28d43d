//! The upstream seam: what one attempt needs from an upstream, and the Codex backend as its one
//! implementation.
//!
//! # Key Components
//! - [`Connector`]: sends one attempt's request for one account and says what of the answer
//!   the client may see. Native `async fn`, `!Send` like the rest of a worker's hot path; the
//!   lifecycle is generic over it (no boxing, no `dyn`), so the product's one connector
//!   compiles to direct calls. A second upstream is one more implementation.
//! - [`Codex`]: the ChatGPT Codex backend: our upstream client ([`crate::upstream`]) and the
//!   account-scoped identity it presents (docs/protocol.md#identity-headers): the identity
//!   headers ([`WireValues`], the per-account installation id, the Cloudflare cookies this
//!   account was given), the installation id inside the payload
//!   (docs/protocol.md#one-installation-per-account), and the turn state bound to the account
//!   that issued it ([`turn_state`]).
//!
//! What a failure does (account effects, the retry decision) is not a connector's business:
//! the lifecycle classifies and [`crate::policy`] decides.

use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use shared_state::AccountEntry;

use crate::upstream::{ws::WsRoute, Upstream, UpstreamError, UpstreamRequest, UpstreamResponse};

/// One attempt's request, as the lifecycle hands it to a [`Connector`].
#[derive(Clone, Copy)]
pub struct Outgoing<'a> {
    /// The account the attempt runs on (its token, its egress).
    pub account: &'a AccountEntry,
    /// The body to send (already the one this account may receive: [`Connector::body_for`]).
    pub body: &'a Bytes,
    /// The upstream WebSocket route of a client WebSocket turn (`None`: plain HTTP).
    pub ws: Option<&'a WsRoute>,
    /// The client's session headers to forward (`lifecycle::PASSTHROUGH_HEADERS`).
    pub passthrough: &'a [(&'static str, String)],
}

/// An upstream the lifecycle can run attempts on.
///
/// `!Send` by design (one worker's hot path): the `async fn` carries no `Send` bound.
#[allow(async_fn_in_trait)]
pub trait Connector {
    /// The body `account` receives in place of `body` (account-scoped identity inside the
    /// payload), or `None` to send `body` as it is.
    fn body_for(&self, account: &AccountEntry, body: &Bytes) -> Option<Bytes>;

    /// Sends one attempt's request; the response head and its streaming body.
    async fn send(&self, out: Outgoing<'_>) -> Result<UpstreamResponse, UpstreamError>;

    /// The response headers the client sees, from a successful response's head.
    fn client_headers(
        &self,
        account: &AccountEntry,
        resp: &UpstreamResponse,
    ) -> Vec<(&'static str, String)>;

    /// How the response reached us, for the usage record; `ws_asked`: the attempt asked for
    /// the upstream WebSocket.
    fn transport(&self, resp: &UpstreamResponse, ws_asked: bool) -> shared_state::Transport;

    /// The idle timeout between two chunks of a response body.
    fn idle_timeout(&self) -> Duration;
}

/// The ChatGPT Codex backend over this worker's upstream client, with the worker's identity
/// header values.
pub struct Codex<'a> {
    upstream: &'a Upstream,
    wire: &'a WireValues,
}

// === impl Codex ===

impl<'a> Codex<'a> {
    /// The connector of one worker.
    pub fn new(upstream: &'a Upstream, wire: &'a WireValues) -> Self {
        Self { upstream, wire }
    }
}

impl Connector for Codex<'_> {
    fn body_for(&self, account: &AccountEntry, body: &Bytes) -> Option<Bytes> {
        // One installation per account, inside the payload too
        // (docs/protocol.md#one-installation-per-account).
        let iid = installation_id(account);
        codex_protocol::normalize::with_installation_id(body, iid.to_str().unwrap_or_default())
            .map(Bytes::from)
    }

    async fn send(&self, out: Outgoing<'_>) -> Result<UpstreamResponse, UpstreamError> {
        let up = self.upstream;
        let req = UpstreamRequest {
            method: "POST",
            path: format!("{}/responses", up.config().path_prefix),
            headers: identity_headers(self.wire, out.account, out.passthrough),
            body: out.body.clone(),
        };
        let resp = up
            .send_routed(out.account.id, out.account.egress.as_deref(), out.ws, req)
            .await?;
        cf_cookies::remember(out.account, &resp.headers, shared_state::now_ms());
        Ok(resp)
    }

    fn client_headers(
        &self,
        account: &AccountEntry,
        resp: &UpstreamResponse,
    ) -> Vec<(&'static str, String)> {
        CLIENT_VISIBLE_HEADERS
            .iter()
            .filter_map(|n| {
                resp.header(n).map(|v| match *n {
                    turn_state::HEADER => (*n, turn_state::bind(account, v)),
                    _ => (*n, v.to_owned()),
                })
            })
            .collect()
    }

    fn transport(&self, resp: &UpstreamResponse, ws_asked: bool) -> shared_state::Transport {
        match resp.protocol {
            "ws" => shared_state::Transport::Ws,
            // A WebSocket turn that went over HTTP instead.
            _ if ws_asked && self.upstream.config().websockets => {
                shared_state::Transport::HttpFallback
            }
            "h2" => shared_state::Transport::H2,
            _ => shared_state::Transport::H1,
        }
    }

    fn idle_timeout(&self) -> Duration {
        self.upstream.config().idle_timeout
    }
}

/// Upstream response headers clients may see (quota headers are stripped);
/// `x-codex-turn-state` tagged with the issuing account ([`turn_state::bind`]).
pub const CLIENT_VISIBLE_HEADERS: &[&str] = &[
    "x-codex-turn-state",
    "x-request-id",
    "x-oai-request-id",
    "openai-model",
    "x-models-etag",
    "x-reasoning-included",
];

/// Stable per-account installation id (`x-codex-installation-id`), derived so that one
/// account always presents the same installation.
fn installation_id(account: &AccountEntry) -> HeaderValue {
    use fnv128::digest;
    let h = digest(account.chatgpt_account_id.as_bytes(), account.id);
    // A UUID (version 4 layout) written digit by digit: no formatting machinery per request.
    let mut id = *b"00000000-0000-4000-8000-000000000000";
    let fields: [(u64, std::ops::Range<usize>); 5] = [
        (((h >> 96) as u32).into(), 0..8),
        (((h >> 80) as u16).into(), 9..13),
        ((((h >> 64) as u16) & 0xfff).into(), 15..18),
        ((((h >> 48) as u16) & 0xfff).into(), 20..23),
        ((h as u64) & 0xffff_ffff_ffff, 24..36),
    ];
    for (v, r) in fields {
        write_hex(&mut id[r], v);
    }
    HeaderValue::from_bytes(&id).unwrap_or(HeaderValue::from_static(""))
}

/// Writes the low `dst.len()` hex digits of `v` into `dst` (lower case, zero-padded).
fn write_hex(dst: &mut [u8], mut v: u64) {
    for d in dst.iter_mut().rev() {
        *d = b"0123456789abcdef"[(v & 0xf) as usize];
        v >>= 4;
    }
}

/// A tiny non-cryptographic 128-bit mix (FNV-1a based) for stable derived ids.
mod fnv128 {
    pub fn digest(data: &[u8], salt: i64) -> u128 {
        let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
        for b in data.iter().chain(salt.to_le_bytes().iter()) {
            h ^= u128::from(*b);
            h = h.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013B);
        }
        h
    }
}

/// `x-codex-turn-state` is bound to the account that issued it (docs/protocol.md#turn-state): the
/// value a client sees is the upstream's, prefixed with a tag of the issuing account
/// (`cg1.<tag>.<upstream value>`), and a client's value goes upstream (unwrapped) only on an
/// attempt on that same account; on any other account, or when it carries no tag of ours,
/// it is dropped. Stateless, so it holds across workers, restarts and instances sharing the
/// database (the tag derives from the account's identity).
pub mod turn_state {
    use shared_state::AccountEntry;

    /// The header.
    pub const HEADER: &str = "x-codex-turn-state";
    const PREFIX: &str = "cg1.";

    fn tag(account: &AccountEntry) -> [u8; 16] {
        let h = super::fnv128::digest(account.chatgpt_account_id.as_bytes(), !account.id);
        let mut t = [0u8; 16];
        super::write_hex(&mut t, (h >> 64) as u64 ^ h as u64);
        t
    }

    /// What the client sees for the turn state `account` issued.
    pub fn bind(account: &AccountEntry, upstream: &str) -> String {
        let mut v = String::with_capacity(PREFIX.len() + 17 + upstream.len());
        v.push_str(PREFIX);
        // Hex digits: always UTF-8.
        v.push_str(std::str::from_utf8(&tag(account)).unwrap_or_default());
        v.push('.');
        v.push_str(upstream);
        v
    }

    /// The upstream value to send to `account` for the client's turn state, if `account`
    /// issued it.
    pub fn for_account<'a>(account: &AccountEntry, client: &'a str) -> Option<&'a str> {
        let (t, upstream) = client.strip_prefix(PREFIX)?.split_once('.')?;
        (t.as_bytes() == tag(account) && !upstream.is_empty()).then_some(upstream)
    }
}

/// A configured header value. The configuration refuses one that cannot be a header value
/// when it is loaded; only a configuration built in code can still hold one, and then an
/// optional header is not sent and a required one goes empty.
fn configured(v: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(v).ok()
}

/// The headers of one attempt on `account`: its token and ids, the configured identity, the
/// client's session headers (docs/protocol.md#identity-headers).
fn identity_headers(
    wire: &WireValues,
    account: &AccountEntry,
    passthrough: &[(&'static str, String)],
) -> Vec<(&'static str, HeaderValue)> {
    let mut h: Vec<(&'static str, HeaderValue)> = Vec::with_capacity(12 + passthrough.len());
    let mut bearer = String::with_capacity(7 + account.access_token.expose().len());
    bearer.push_str("Bearer ");
    bearer.push_str(account.access_token.expose());
    // From the String's own bytes (no copy); a token that cannot be a header value sends
    // none, and the upstream answers 401 (the account's refresh path).
    if let Ok(mut v) = HeaderValue::try_from(bearer) {
        v.set_sensitive(true);
        h.push(("authorization", v));
    }
    if let Ok(v) = HeaderValue::from_str(&account.chatgpt_account_id) {
        h.push(("chatgpt-account-id", v));
    }
    h.push(("originator", wire.originator.clone()));
    h.push(("user-agent", wire.user_agent.clone()));
    if let Some(v) = &wire.version {
        h.push(("version", v.clone()));
    }
    if let Some(v) = &wire.residency {
        h.push(("x-openai-internal-codex-residency", v.clone()));
    }
    h.push(("content-type", HeaderValue::from_static("application/json")));
    h.push(("accept", HeaderValue::from_static("text/event-stream")));
    // Cloudflare's cookies this account (through this egress) was given, sent back as a
    // browser would (the client's own `cookie` never passes).
    if let Some(c) = cf_cookies::header(account, shared_state::now_ms()) {
        h.push(("cookie", c));
    }
    let iid = installation_id(account);
    // The client's own id inside the turn metadata would link every pool account.
    let turn_metadata = passthrough
        .iter()
        .find(|(n, _)| *n == "x-codex-turn-metadata")
        .and_then(|(_, v)| {
            codex_protocol::normalize::turn_metadata_with_installation_id(
                v,
                iid.to_str().unwrap_or_default(),
            )
        });
    h.push(("x-codex-installation-id", iid));
    let mut has_beta = false;
    for (n, v) in passthrough {
        let v = if *n == turn_state::HEADER {
            // Only to the account that issued it.
            match turn_state::for_account(account, v) {
                Some(v) => v,
                None => continue,
            }
        } else if *n == "x-codex-turn-metadata" {
            turn_metadata.as_deref().unwrap_or(v)
        } else {
            v.as_str()
        };
        has_beta |= *n == "x-codex-beta-features";
        if let Ok(v) = HeaderValue::from_str(v) {
            h.push((n, v));
        }
    }
    if !has_beta {
        if let Some(v) = &wire.beta_features {
            h.push(("x-codex-beta-features", v.clone()));
        }
    }
    h
}

/// The configured identity header values ([`crate::config::WireProfile`]), built once per
/// worker: each request shares their bytes.
#[derive(Debug, Clone)]
pub struct WireValues {
    originator: HeaderValue,
    user_agent: HeaderValue,
    version: Option<HeaderValue>,
    residency: Option<HeaderValue>,
    beta_features: Option<HeaderValue>,
}

// === impl WireValues ===

impl WireValues {
    /// The values of `wire` (an empty optional one is not sent).
    pub fn new(wire: &crate::config::WireProfile) -> Self {
        let opt = |v: &str| (!v.is_empty()).then(|| configured(v)).flatten();
        Self {
            originator: configured(&wire.originator).unwrap_or(HeaderValue::from_static("")),
            user_agent: configured(&wire.user_agent).unwrap_or(HeaderValue::from_static("")),
            version: opt(&wire.version),
            residency: opt(&wire.residency),
            beta_features: opt(&wire.beta_features),
        }
    }
}

/// Cloudflare's cookies (`__cf_bm`, `cf_clearance`, `__cflb`), kept per account and egress
/// (docs/protocol.md#identity-headers: `Set-Cookie` kept per account) and sent back on that
/// account's later requests through the same egress, as a browser would. Process-wide (every
/// worker), in memory only, bounded; other cookies are ignored. Values are secrets of a kind:
/// never logged.
mod cf_cookies {
    use std::{collections::HashMap, sync::Mutex};

    use http::HeaderValue;
    use shared_state::AccountEntry;

    /// The cookies kept (others the upstream sets are not the gateway's business).
    const KEPT: &[&str] = &["__cf_bm", "cf_clearance", "__cflb"];
    /// Most (account, egress) jars at once.
    const MAX_JARS: usize = 100_000;
    /// How long a cookie without `Max-Age`/`Expires` is kept (`__cf_bm` lives 30 min).
    const DEFAULT_TTL_MS: u64 = 30 * 60 * 1000;

    /// (name, value, expires at ms).
    type Jar = Vec<(String, String, u64)>;

    static JARS: Mutex<Option<HashMap<(i64, i64), Jar>>> = Mutex::new(None);

    fn key(account: &AccountEntry) -> (i64, i64) {
        (account.id, account.egress.as_ref().map_or(0, |e| e.id))
    }

    /// Keeps the Cloudflare cookies of a response's `Set-Cookie` headers.
    pub fn remember(account: &AccountEntry, head: &crate::upstream::Head, now_ms: u64) {
        let mut found: Vec<(String, String, u64)> = Vec::new();
        let mut take = |v: &str| {
            if let Some(c) = parse(v, now_ms) {
                found.push(c);
            }
        };
        for v in head.get_all("set-cookie") {
            take(v);
        }
        if found.is_empty() {
            return;
        }
        let Ok(mut g) = JARS.lock() else {
            return;
        };
        let map = g.get_or_insert_with(HashMap::new);
        if map.len() >= MAX_JARS {
            map.retain(|_, j| {
                j.retain(|c| c.2 > now_ms);
                !j.is_empty()
            });
            if map.len() >= MAX_JARS {
                return;
            }
        }
        let jar = map.entry(key(account)).or_default();
        for c in found {
            jar.retain(|o| o.0 != c.0);
            // An expired (deleted) cookie just leaves the jar.
            if c.2 > now_ms {
                jar.push(c);
            }
        }
    }

    /// The `Cookie` header for the account's next request, if it holds any live cookie.
    pub fn header(account: &AccountEntry, now_ms: u64) -> Option<HeaderValue> {
        let g = JARS.lock().ok()?;
        let jar = g.as_ref()?.get(&key(account))?;
        let v = jar
            .iter()
            .filter(|c| c.2 > now_ms)
            .map(|c| format!("{}={}", c.0, c.1))
            .collect::<Vec<_>>()
            .join("; ");
        if v.is_empty() {
            return None;
        }
        let mut h = HeaderValue::from_str(&v).ok()?;
        h.set_sensitive(true);
        Some(h)
    }

    /// `name=value; Max-Age=..; ...` of a kept cookie: (name, value, expiry ms).
    fn parse(v: &str, now_ms: u64) -> Option<(String, String, u64)> {
        let mut parts = v.split(';');
        let (name, value) = parts.next()?.trim().split_once('=')?;
        if !KEPT.contains(&name) || value.len() > 4096 || !value.is_ascii() {
            return None;
        }
        let mut until = now_ms + DEFAULT_TTL_MS;
        for a in parts {
            if let Some((k, v)) = a.trim().split_once('=') {
                if k.eq_ignore_ascii_case("max-age") {
                    if let Ok(s) = v.trim().parse::<i64>() {
                        until = now_ms.saturating_add((s.max(0) as u64).saturating_mul(1000));
                    }
                }
            }
        }
        Some((name.to_owned(), value.to_owned(), until))
    }

    #[cfg(test)]
    #[allow(clippy::unwrap_used)]
    mod tests {
        use super::*;

        #[test]
        fn only_cloudflare_cookies_are_kept_with_their_lifetime() {
            assert_eq!(
                parse("__cf_bm=abc.def; path=/; Max-Age=60; HttpOnly", 1000),
                Some(("__cf_bm".into(), "abc.def".into(), 61_000))
            );
            assert_eq!(parse("session=secret; Path=/", 0), None);
            assert_eq!(parse("cf_clearance=x; Max-Age=0", 5).unwrap().2, 5);
        }
    }
}

#[cfg(test)]
mod tests {
    /// The installation id and the turn-state tag written digit by digit are what the
    /// formatted versions gave (an account keeps presenting the same installation, and turn
    /// states bound before the change still unwrap).
    #[test]
    fn installation_ids_keep_their_format_and_value() {
        use shared_state::AccountEntry;
        for (id, acct) in [
            (1, "acc-1"),
            (42, "c3d4e5f6-0000-4000-8000-abcdefabcdef"),
            (-7, ""),
        ] {
            let a = AccountEntry {
                chatgpt_account_id: acct.to_owned(),
                ..crate::scheduler::tests::raw_entry(id, 1, 0)
            };
            let h = super::fnv128::digest(acct.as_bytes(), id);
            let formatted = format!(
                "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
                (h >> 96) as u32,
                (h >> 80) as u16,
                ((h >> 64) as u16) & 0xfff,
                ((h >> 48) as u16) & 0xfff,
                (h as u64) & 0xffff_ffff_ffff
            );
            assert_eq!(super::installation_id(&a).to_str().unwrap(), formatted);
            let h = super::fnv128::digest(acct.as_bytes(), !id);
            let tag = format!("{:016x}", (h >> 64) as u64 ^ h as u64);
            let bound = super::turn_state::bind(&a, "up-1");
            assert_eq!(bound, format!("cg1.{tag}.up-1"));
            assert_eq!(super::turn_state::for_account(&a, &bound), Some("up-1"));
        }
    }
}
