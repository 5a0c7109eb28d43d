//! The admin API's own state, held by its services ([`crate::services::Accounts`],
//! [`crate::services::Ops`]) so that the services do not name the admin API.
//!
//! # Key Components
//! - [`PendingLogins`]: the OAuth logins in progress (`crate::api::accounts`);
//! - [`OpsSampler`]: the sampler of the data plane's metrics (`crate::api::ops`).
//!
//! # Error handling
//! A failed scrape is returned as its message; a poisoned lock gives no rate or burn
//! (zeros, `None`) and a login that cannot be found.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Mutex,
    time::Duration,
};

use shared_state::Secret;

/// How long an OAuth login may take between start and finish.
pub(crate) const LOGIN_TTL: Duration = Duration::from_secs(15 * 60);

/// OAuth logins started and not finished: `state -> (PKCE verifier, started at ms)`.
#[derive(Debug, Default)]
pub(crate) struct PendingLogins {
    inner: Mutex<HashMap<String, (Secret, u64)>>,
}

// === impl PendingLogins ===

impl PendingLogins {
    pub(crate) fn insert(&self, state: String, verifier: Secret, now: u64) {
        if let Ok(mut m) = self.inner.lock() {
            let ttl = u64::try_from(LOGIN_TTL.as_millis()).unwrap_or(u64::MAX);
            m.retain(|_, (_, at)| now < *at + ttl);
            m.insert(state, (verifier, now));
        }
    }

    pub(crate) fn take(&self, state: &str, now: u64) -> Option<Secret> {
        let ttl = u64::try_from(LOGIN_TTL.as_millis()).unwrap_or(u64::MAX);
        let mut m = self.inner.lock().ok()?;
        let (v, at) = m.remove(state)?;
        (now < at + ttl).then_some(v)
    }
}

/// One parsed `/metrics` scrape.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scrape {
    /// Requests answered (every route but healthz/metrics).
    pub(crate) requests: f64,
    /// Requests answered with a status >= 400.
    pub(crate) errors: f64,
    pub(crate) open_streams: f64,
    pub(crate) ws_sessions: f64,
    pub(crate) attempts: f64,
    pub(crate) failovers: f64,
    /// Per worker: driver and `metric -> value` of every `worker="N"` sample.
    pub(crate) workers: BTreeMap<u32, (String, BTreeMap<String, f64>)>,
}

/// Parses the Prometheus text the data plane serves.
pub(crate) fn parse_metrics(text: &str) -> Scrape {
    let mut s = Scrape::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (head, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (head, ""),
        };
        let label = |k: &str| -> Option<&str> {
            labels.split(',').find_map(|kv| {
                let (lk, lv) = kv.split_once('=')?;
                (lk.trim() == k).then(|| lv.trim().trim_matches('"'))
            })
        };
        let short = name.strip_prefix("codex_gateway_").unwrap_or(name);
        if let Some(w) = label("worker").and_then(|w| w.parse::<u32>().ok()) {
            let e = s.workers.entry(w).or_default();
            if short == "worker_driver" {
                e.0 = label("driver").unwrap_or("unknown").to_owned();
            } else {
                *e.1.entry(short.to_owned()).or_default() += v;
            }
            continue;
        }
        match short {
            "requests_total" => {
                if matches!(label("route"), Some("healthz" | "metrics")) {
                    continue;
                }
                s.requests += v;
                if label("status")
                    .and_then(|st| st.parse::<u16>().ok())
                    .is_some_and(|st| st >= 400)
                {
                    s.errors += v;
                }
            }
            "open_streams" => s.open_streams = v,
            "ws_sessions" => s.ws_sessions = v,
            "upstream_attempts_total" => s.attempts = v,
            "failovers_total" => s.failovers = v,
            _ => {}
        }
    }
    s
}

#[derive(Debug, Clone)]
struct RateSample {
    at_ms: u64,
    requests: f64,
    errors: f64,
    attempts: f64,
    /// Per worker: its counters (`*_total` samples).
    workers: BTreeMap<u32, BTreeMap<String, f64>>,
}

#[derive(Debug, Default)]
struct SamplerState {
    rates: VecDeque<RateSample>,
    quota: VecDeque<(u64, f64)>,
}

/// Scrapes the data plane and keeps short histories for rates and quota burn.
#[derive(Debug)]
pub(crate) struct OpsSampler {
    url: Option<String>,
    http: Option<reqwest::Client>,
    state: Mutex<SamplerState>,
}

/// How far back rates look (the newest sample at least this old is the base).
const RATE_WINDOW_MS: u64 = 5_000;
/// How far back quota burn looks.
const BURN_WINDOW_MS: u64 = 30 * 60_000;

// === impl OpsSampler ===

impl OpsSampler {
    /// A sampler of `metrics_url` (none: no data-plane metrics).
    pub fn new(url: Option<String>) -> Self {
        let http = url.as_ref().and_then(|_| {
            reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(2))
                .build()
                .ok()
        });
        Self {
            url,
            http,
            state: Mutex::new(SamplerState::default()),
        }
    }

    pub(crate) async fn scrape(&self) -> Result<Scrape, String> {
        let (Some(url), Some(http)) = (&self.url, &self.http) else {
            return Err("the data plane's metrics address is not configured".into());
        };
        let resp = http.get(url).send().await.map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("/metrics answered {}", resp.status()));
        }
        let text = resp.text().await.map_err(|e| e.to_string())?;
        Ok(parse_metrics(&text))
    }

    /// Records a scrape and returns `(requests/s, errors/s, attempts/s)` over the last few
    /// seconds (zeros until two samples exist). Each worker's counters get their rate too,
    /// added to its metrics as `<name>_per_s` (e.g. `worker_events_per_s`).
    pub(crate) fn rates(&self, s: &mut Scrape, now: u64) -> (f64, f64, f64) {
        let Ok(mut st) = self.state.lock() else {
            return (0.0, 0.0, 0.0);
        };
        let cur = RateSample {
            at_ms: now,
            requests: s.requests,
            errors: s.errors,
            attempts: s.attempts,
            workers: s
                .workers
                .iter()
                .map(|(id, (_, m))| {
                    let counters = m
                        .iter()
                        .filter(|(k, _)| k.ends_with("_total"))
                        .map(|(k, v)| (k.clone(), *v))
                        .collect();
                    (*id, counters)
                })
                .collect(),
        };
        while st.rates.len() > 2 && st.rates[1].at_ms + RATE_WINDOW_MS <= now {
            st.rates.pop_front();
        }
        let out = match st.rates.front() {
            Some(base) if now > base.at_ms && cur.requests >= base.requests => {
                let dt = (now - base.at_ms) as f64 / 1000.0;
                for (id, counters) in &cur.workers {
                    let (Some(then), Some((_, m))) = (base.workers.get(id), s.workers.get_mut(id))
                    else {
                        continue;
                    };
                    for (k, v) in counters {
                        if let Some(b) = then.get(k).filter(|b| v >= b) {
                            let name = format!("{}_per_s", k.trim_end_matches("_total"));
                            m.insert(name, (v - b) / dt);
                        }
                    }
                }
                (
                    (cur.requests - base.requests) / dt,
                    (cur.errors - base.errors).max(0.0) / dt,
                    (cur.attempts - base.attempts).max(0.0) / dt,
                )
            }
            _ => (0.0, 0.0, 0.0),
        };
        st.rates.push_back(cur);
        if st.rates.len() > 256 {
            st.rates.pop_front();
        }
        out
    }

    /// Records the mean quota use and returns its rise per hour over the burn window.
    pub(crate) fn burn(&self, mean_pct: f64, now: u64) -> Option<f64> {
        let mut st = self.state.lock().ok()?;
        while st
            .quota
            .front()
            .is_some_and(|(t, _)| t + BURN_WINDOW_MS < now)
        {
            st.quota.pop_front();
        }
        st.quota.push_back((now, mean_pct));
        if st.quota.len() > 4_096 {
            st.quota.pop_front();
        }
        let (t0, p0) = *st.quota.front()?;
        if now < t0 + 60_000 {
            return None;
        }
        Some((mean_pct - p0) / ((now - t0) as f64 / 3_600_000.0))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_data_plane_metrics() {
        let text = "# HELP x y\n\
            codex_gateway_requests_total{route=\"responses\",status=\"200\"} 7\n\
            codex_gateway_requests_total{route=\"responses\",status=\"502\"} 2\n\
            codex_gateway_requests_total{route=\"healthz\",status=\"200\"} 50\n\
            codex_gateway_open_streams 3\n\
            codex_gateway_upstream_h2_connections{worker=\"0\"} 2\n\
            codex_gateway_upstream_h2_connections{worker=\"1\"} 1\n\
            codex_gateway_worker_driver{worker=\"0\",driver=\"io_uring\"} 1\n\
            codex_gateway_worker_driver{worker=\"1\",driver=\"legacy\"} 1\n";
        let s = parse_metrics(text);
        assert_eq!(s.requests, 9.0);
        assert_eq!(s.errors, 2.0);
        assert_eq!(s.open_streams, 3.0);
        assert_eq!(s.workers.len(), 2);
        assert_eq!(s.workers[&0].0, "io_uring");
        assert_eq!(s.workers[&1].0, "legacy");
        assert_eq!(s.workers[&0].1["upstream_h2_connections"], 2.0);
    }

    #[test]
    fn rates_and_burn() {
        let o = OpsSampler::new(None);
        let mut s = parse_metrics(
            "codex_gateway_worker_events_total{worker=\"0\"} 100\n\
             codex_gateway_worker_open_streams{worker=\"0\"} 4\n",
        );
        assert_eq!(o.rates(&mut s, 1_000), (0.0, 0.0, 0.0));
        let mut s = parse_metrics(
            "codex_gateway_worker_events_total{worker=\"0\"} 700\n\
             codex_gateway_worker_open_streams{worker=\"0\"} 4\n",
        );
        s.requests = 10.0;
        s.errors = 2.0;
        let (r, e, _) = o.rates(&mut s, 3_000);
        assert!((r - 5.0).abs() < 1e-9 && (e - 1.0).abs() < 1e-9);
        // Each worker's counters get a rate; gauges do not.
        assert_eq!(s.workers[&0].1["worker_events_per_s"], 300.0);
        assert!(!s.workers[&0].1.contains_key("worker_open_streams_per_s"));
        assert_eq!(o.burn(10.0, 0), None);
        let b = o.burn(20.0, 600_000).unwrap();
        assert!((b - 60.0).abs() < 1e-9, "{b}");
    }

    #[test]
    fn pending_logins_expire_and_are_single_use() {
        let p = PendingLogins::default();
        p.insert("s".into(), Secret::new("v"), 1_000);
        assert!(p.take("s", 1_000 + 1).is_some());
        assert!(p.take("s", 1_000 + 1).is_none(), "single use");
        p.insert("t".into(), Secret::new("v"), 1_000);
        assert!(p.take("t", 1_000 + 16 * 60_000).is_none(), "expired");
    }
}
