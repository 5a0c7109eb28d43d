//! The model catalog refresher: fetches the upstream `/models` once per distinct plan, merges
//! the answers and publishes the result into the [`SharedCatalog`] the workers read.
//!
//! # Key Components
//! - [`CatalogRefresher`]: the shared cell, the configured aliases (re-applied to every
//!   published catalog), the [`ModelsClient`], the per-plan cache (last good body and its
//!   `ETag`) and the status the admin API shows.
//! - [`refresh`]: one round. Eligible accounts (active, with an access token) are grouped by
//!   plan; per plan the first account in id order is asked, with `If-None-Match` when a body
//!   is cached (304 keeps it). A 401 hands that account to the single-flight token refresh
//!   and asks the plan's next account (at most [`MAX_ACCOUNTS_PER_PLAN`]). The cached bodies
//!   of the current plans are merged (plans in name order, union by slug) with
//!   `ModelCatalog::merge_codex_json(.., CatalogSource::Upstream, aliases)` and stored when
//!   anything changed. Rounds are serialized.
//! - [`run`]: the first round [`FIRST_DELAY`] after start, then every interval; earlier when
//!   the set of plans among eligible accounts changes (checked every [`PLAN_CHECK`]); after a
//!   failed fetch, again within [`RETRY_AFTER_FAILURE`].
//!
//! # Error handling
//! A failed fetch keeps that plan's last good body (and so the last good catalog; the
//! embedded one until the first success) and is logged as a warning. Nothing is fatal.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use shared_state::{
    catalog::{CatalogSource, ModelAlias},
    AccountEntry, AccountStatus, ModelCatalog, SharedCatalog,
};
use tokio::{sync::watch, time::Instant};

use super::Catalog;
use crate::models::{ModelsAnswer, ModelsClient, ModelsError};

/// Delay of the first round after startup.
pub const FIRST_DELAY: Duration = Duration::from_millis(250);
/// How often the loop looks for a changed set of plans.
pub const PLAN_CHECK: Duration = Duration::from_secs(2);
/// The next round after a failed fetch comes at most this much later.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(60);
/// Accounts of one plan asked in one round (the next one only after a 401).
pub const MAX_ACCOUNTS_PER_PLAN: usize = 2;

/// The last good answer for one plan.
#[derive(Debug)]
struct PlanCache {
    body: Vec<u8>,
    etag: Option<String>,
}

#[derive(Debug, Default)]
struct Book {
    /// Last good body per plan (only plans that still have an eligible account).
    plans: BTreeMap<String, PlanCache>,
    /// The plans of the last round.
    known: BTreeSet<String>,
}

/// What the admin API shows about one plan.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct PlanStatus {
    /// The account asked last.
    pub account_id: Option<i64>,
    /// `ETag` of the cached body.
    pub etag: Option<String>,
    /// Models in the cached body.
    pub models: usize,
    /// Last 200 or 304 (Unix ms).
    pub checked_at: Option<u64>,
    /// Last 200 (Unix ms).
    pub fetched_at: Option<u64>,
    /// The error of the last round, if it failed.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Status {
    pub last_attempt_at: Option<u64>,
    pub last_published_at: Option<u64>,
    pub plans: BTreeMap<String, PlanStatus>,
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Outcome {
    /// Plans asked.
    pub plans: usize,
    /// 200 answers.
    pub fetched: usize,
    /// 304 answers.
    pub not_modified: usize,
    /// Plans whose fetch failed.
    pub failed: usize,
    /// A new catalog was stored.
    pub published: bool,
}

/// The catalog refresher's state (one per sidecar, in [`Catalog`]).
#[derive(Debug)]
pub(crate) struct CatalogRefresher {
    /// The cell the workers read.
    pub catalog: SharedCatalog,
    /// Aliases applied to every published catalog.
    pub aliases: HashMap<String, ModelAlias>,
    /// The upstream client.
    pub client: ModelsClient,
    /// Background refresh interval (zero: only on request).
    pub interval: Duration,
    book: tokio::sync::Mutex<Book>,
    status: Mutex<Status>,
}

// === impl CatalogRefresher ===

impl CatalogRefresher {
    pub fn new(
        catalog: SharedCatalog,
        aliases: HashMap<String, ModelAlias>,
        client: ModelsClient,
        interval: Duration,
    ) -> Self {
        // The configured aliases win over whatever the embedded catalog was built with.
        let current = catalog.load();
        if current.source == CatalogSource::Embedded
            && !aliases.is_empty()
            && current.aliases != aliases
        {
            catalog.store(Arc::new(ModelCatalog::embedded(aliases.clone())));
        }
        drop(current);
        Self {
            catalog,
            aliases,
            client,
            interval,
            book: tokio::sync::Mutex::new(Book::default()),
            status: Mutex::new(Status::default()),
        }
    }

    fn status_mut(&self) -> MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the status.
    pub fn status(&self) -> Status {
        self.status_mut().clone()
    }

    /// True when the plans among eligible accounts differ from the last round's (false while
    /// a round runs).
    fn plans_changed(&self, publisher: &crate::publish::Publisher) -> bool {
        let Ok(book) = self.book.try_lock() else {
            return false;
        };
        let snap = publisher.current();
        let now: BTreeSet<String> = snap
            .accounts
            .iter()
            .filter(|a| eligible(a))
            .map(|a| plan_key(a))
            .collect();
        now != book.known
    }
}

/// Whether an account may be asked for the catalog.
fn eligible(a: &AccountEntry) -> bool {
    a.effective_status() == AccountStatus::Active && !a.access_token.is_empty()
}

/// The cache key of an account's plan (`unknown` when not known).
fn plan_key(a: &AccountEntry) -> String {
    a.plan
        .as_deref()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map_or_else(|| "unknown".to_owned(), str::to_ascii_lowercase)
}

fn count_models(body: &[u8]) -> usize {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("models").and_then(|m| m.as_array()).map(Vec::len))
        .unwrap_or(0)
}

/// One refresh round (see the module docs).
pub(crate) async fn refresh(catalog: &Arc<Catalog>) -> Outcome {
    let r = &catalog.refresher;
    let mut book = r.book.lock().await;
    let snap = catalog.publisher.current();
    let version = snap.version;
    let mut by_plan: BTreeMap<String, Vec<Arc<AccountEntry>>> = BTreeMap::new();
    for a in snap.accounts.iter().filter(|a| eligible(a)) {
        by_plan.entry(plan_key(a)).or_default().push(Arc::clone(a));
    }
    drop(snap);
    let now_ms = shared_state::now_ms();
    r.status_mut().last_attempt_at = Some(now_ms);

    let plans: BTreeSet<String> = by_plan.keys().cloned().collect();
    let mut changed = plans != book.known;
    let mut out = Outcome {
        plans: plans.len(),
        ..Outcome::default()
    };
    for (plan, accounts) in &by_plan {
        let etag = book.plans.get(plan).and_then(|c| c.etag.clone());
        let mut asked = None;
        let mut error: Option<String> = None;
        let mut fresh = false;
        for acc in accounts.iter().take(MAX_ACCOUNTS_PER_PLAN) {
            asked = Some(acc.id);
            // As the account: through its egress proxy when it has one (never direct instead).
            let client = match catalog.egress.usage_for(acc.id, r.client.usage()) {
                Ok(u) => r.client.with_usage(u),
                Err(why) => {
                    error = Some(why);
                    continue;
                }
            };
            match client
                .fetch(&acc.access_token, &acc.chatgpt_account_id, etag.as_deref())
                .await
            {
                Ok(ModelsAnswer::Fresh { body, etag }) => {
                    changed |= book.plans.get(plan).is_none_or(|c| c.body != body);
                    book.plans.insert(plan.clone(), PlanCache { body, etag });
                    out.fetched += 1;
                    fresh = true;
                    error = None;
                    break;
                }
                Ok(ModelsAnswer::NotModified) => {
                    out.not_modified += 1;
                    error = None;
                    break;
                }
                Err(ModelsError::Unauthorized) => {
                    tracing::info!(
                        account = acc.id,
                        plan = %plan,
                        "model catalog fetch: access token rejected; refreshing"
                    );
                    super::refresh::request(&catalog.refresh, acc.id, version);
                    error = Some(ModelsError::Unauthorized.to_string());
                }
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
        if let Some(e) = &error {
            out.failed += 1;
            tracing::warn!(
                plan = %plan,
                account = ?asked,
                error = %e,
                "model catalog fetch failed; keeping the last good catalog"
            );
        }
        let cached = book.plans.get(plan);
        let mut st = r.status_mut();
        let ps = st.plans.entry(plan.clone()).or_default();
        ps.account_id = asked;
        ps.etag = cached.and_then(|c| c.etag.clone());
        ps.models = cached.map_or(0, |c| count_models(&c.body));
        if error.is_none() {
            ps.checked_at = Some(shared_state::now_ms());
            if fresh {
                ps.fetched_at = ps.checked_at;
            }
        }
        ps.error = error;
    }
    // Plans without an eligible account no longer contribute models.
    book.plans.retain(|p, _| plans.contains(p));
    r.status_mut().plans.retain(|p, _| plans.contains(p));
    book.known = plans;

    if book.plans.is_empty() {
        // Nothing fetched yet (or no eligible account): keep what is published.
        return out;
    }
    if !changed && r.catalog.load().source == CatalogSource::Upstream {
        return out;
    }
    let bodies: Vec<&[u8]> = book.plans.values().map(|c| c.body.as_slice()).collect();
    match ModelCatalog::merge_codex_json(&bodies, CatalogSource::Upstream, r.aliases.clone()) {
        Ok(cat) => {
            tracing::info!(
                plans = bodies.len(),
                models = cat.models.len(),
                aliases = cat.aliases.len(),
                "published the upstream model catalog"
            );
            r.catalog.store(Arc::new(cat));
            r.status_mut().last_published_at = Some(shared_state::now_ms());
            out.published = true;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot merge the model catalogs; keeping the last good one");
        }
    }
    out
}

/// Refreshes the catalog until `stop` (`catalog.refresher.interval` must be non-zero).
pub(crate) async fn run(catalog: Arc<Catalog>, mut stop: watch::Receiver<bool>) {
    let every = catalog.refresher.interval;
    tracing::info!(url = %catalog.refresher.client.url(), every = ?every, "model catalog refresher started");
    let mut due = Instant::now() + FIRST_DELAY;
    loop {
        let wake = due.min(Instant::now() + PLAN_CHECK);
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if Instant::now() < due && !catalog.refresher.plans_changed(&catalog.publisher) {
            continue;
        }
        let out = tokio::select! {
            out = refresh(&catalog) => out,
            _ = stop.wait_for(|s| *s) => return,
        };
        let next = if out.failed > 0 {
            every.min(RETRY_AFTER_FAILURE)
        } else {
            every
        };
        due = Instant::now() + next;
    }
}
