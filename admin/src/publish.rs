//! Building [`Snapshot`]s from storage and publishing them to the workers.
//!
//! # Key Components
//! - [`Publisher`]: owns the process-lifetime map `account id -> Arc<AccountLive>` (every
//!   snapshot for an account reuses the same live `Arc`, so a swap never resets in-flight
//!   counters), the version counter and the fingerprint of the last published content.
//! - [`Publisher::reload`]: reads accounts, keys and stored setting overrides, applies
//!   cooldowns and quota written by other instances to the live atomics, and publishes
//!   (`ArcSwap::store`, then [`WorkerCommand::SnapshotUpdated`] to every mailbox) only when the
//!   content changed or when forced. An account that left `active` (or was deleted) since the
//!   last publish also gets a [`WorkerCommand::EvictAccount`], whoever changed it (the admin
//!   API, the CLI in another process, another instance).
//! - Settings: the configured [`Settings`] are the defaults; valid rows of the `settings`
//!   table override them ([`crate::settings::effective`]).
//!
//! - Held tokens ([`Publisher::hold_tokens`]): rotated tokens a refresh could not store yet.
//!   The old refresh token is dead once the token endpoint answered, so they are the only
//!   live ones: every reload lays them over what storage returns (the data plane uses them
//!   at once) until [`Publisher::release_tokens`] after they were stored, and
//!   [`Publisher::publish_held`] publishes them even while storage cannot be read. With a
//!   journal ([`crate::held`]) every change is also written to the data directory, so a
//!   shutdown or a crash before storage takes them does not lose them.
//!
//! - Fleet invalidations ([`Publisher::announce`], [`Publisher::announced`]): a reload that
//!   published this instance's own change (an admin mutation, a refresh) and every persisted
//!   account effect (cooldown, status) are announced; `crate::pubsub` tells the other
//!   instances, which reload at once ([`Publisher::reload_quiet`]: not announced again).
//! - Token versions ([`Publisher::token_version`]): the snapshot version in which each
//!   account's access token last changed, whoever changed it (this instance's refresh,
//!   another instance's, an import), so a refresh request from a worker that used an older
//!   token is skipped.
//!
//! # Usage
//! The sidecar calls `reload_quiet(false)` every `reload_interval` and `reload(false)` after
//! every mutation; a token refresh calls `reload(true)` and remembers the returned version.
//!
//! # Error handling
//! A storage error leaves the current snapshot in place and is returned to the caller.

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex as SyncMutex, PoisonError},
};

use shared_state::{
    keys::KeyLive, AccountEffect, AccountEntry, AccountLive, AccountStatus, ClientKey, Settings,
    SharedSnapshot, Snapshot, WorkerCommand, WorkerMailboxes,
};
use tokio::sync::Mutex;

use crate::{
    error::StorageError,
    storage::{AccountRow, AccountSecrets, KeyRow, Storage, TokenUpdate},
};

/// Live state kept for one account across snapshots.
#[derive(Debug)]
struct LiveSlot {
    live: Arc<AccountLive>,
    /// `quota_updated_at` of the last stored quota copied into `live`.
    quota_applied_at: Option<i64>,
    /// Status in the last published snapshot.
    published_status: Option<AccountStatus>,
    /// Digest of the access token in the last published snapshot.
    token_digest: Option<u64>,
}

#[derive(Debug, Default)]
struct PubState {
    fingerprint: Option<u64>,
    live: HashMap<i64, LiveSlot>,
    /// Per client key: its live counters, kept across snapshots like accounts' (limits and
    /// budgets must not reset when a snapshot is swapped).
    key_live: HashMap<i64, Arc<KeyLive>>,
}

/// Builds and publishes snapshots.
#[derive(Debug)]
pub struct Publisher {
    snapshot: SharedSnapshot,
    mailboxes: WorkerMailboxes,
    /// The configured settings (defaults for keys without a stored override).
    defaults: Settings,
    state: Mutex<PubState>,
    /// Rotated tokens not stored yet, by account id (see the module docs).
    held: SyncMutex<HashMap<i64, TokenUpdate>>,
    /// Where the held tokens are also written, so a restart does not lose them.
    journal: std::sync::OnceLock<crate::held::HeldJournal>,
    /// Egress proxies' live health, by proxy id.
    egress: crate::egress::EgressBook,
    /// Woken when this instance changed something the fleet must see (`crate::pubsub`).
    announce: tokio::sync::Notify,
    /// Per account: the snapshot version in which its access token last changed.
    token_versions: SyncMutex<HashMap<i64, u64>>,
}

// === impl Publisher ===

impl Publisher {
    /// A publisher writing into `snapshot`; `defaults` are the configured settings.
    pub fn new(snapshot: SharedSnapshot, mailboxes: WorkerMailboxes, defaults: Settings) -> Self {
        Self {
            snapshot,
            mailboxes,
            defaults,
            state: Mutex::new(PubState::default()),
            held: SyncMutex::new(HashMap::new()),
            journal: std::sync::OnceLock::new(),
            egress: crate::egress::EgressBook::default(),
            announce: tokio::sync::Notify::new(),
            token_versions: SyncMutex::new(HashMap::new()),
        }
    }

    /// Tells the fleet (through `crate::pubsub`, when Redis is configured) that this instance
    /// changed shared state: the other instances reload at once. Announcements coalesce.
    pub fn announce(&self) {
        self.announce.notify_one();
    }

    /// Resolves at the next [`Self::announce`] (one waiter: the pub/sub publisher).
    pub async fn announced(&self) {
        self.announce.notified().await;
    }

    /// The snapshot version in which `id`'s access token last changed (`None`: unknown).
    pub fn token_version(&self, id: i64) -> Option<u64> {
        self.token_versions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .copied()
    }

    fn set_token_version(&self, id: i64, version: u64) {
        self.token_versions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, version);
    }

    fn held_map(&self) -> std::sync::MutexGuard<'_, HashMap<i64, TokenUpdate>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `tokens` (a refresh's rotation that could not be stored) as the account's
    /// tokens until [`Self::release_tokens`]. Returns `true` when none were held before (the
    /// caller starts the writer; otherwise the running writer picks the newer ones up).
    pub(crate) fn hold_tokens(&self, id: i64, tokens: TokenUpdate) -> bool {
        let mut held = self.held_map();
        let first = held.insert(id, tokens).is_none();
        self.journal_held(&held);
        first
    }

    /// From now on, every change of the held tokens is also written to `journal`.
    pub(crate) fn set_journal(&self, journal: crate::held::HeldJournal) {
        let _ = self.journal.set(journal);
        self.journal_held(&self.held_map());
    }

    /// Writes the held tokens to the journal (logged, not returned: they stay held in memory
    /// and their writer keeps trying storage).
    fn journal_held(&self, held: &HashMap<i64, TokenUpdate>) {
        let Some(j) = self.journal.get() else {
            return;
        };
        let snap = self.snapshot.load();
        let acct = |id| snap.account(id).map(|a| a.chatgpt_account_id.clone());
        if let Err(e) = j.save(held, acct) {
            tracing::error!(error = %e, "cannot write the held-token journal; held tokens are in memory only");
        }
    }

    /// Replaces the tokens held for `id` with `tokens` when some are held (their writer
    /// stores the newest); `false` when none are held.
    pub(crate) fn replace_held(&self, id: i64, tokens: &TokenUpdate) -> bool {
        let mut held = self.held_map();
        match held.get_mut(&id) {
            Some(t) => {
                *t = tokens.clone();
                self.journal_held(&held);
                true
            }
            None => false,
        }
    }

    /// The tokens held for `id`, if any.
    pub(crate) fn held_tokens(&self, id: i64) -> Option<TokenUpdate> {
        self.held_map().get(&id).cloned()
    }

    /// Stops holding `stored` for `id` (they are in storage now). Returns `false` when newer
    /// tokens are held meanwhile (they still need storing).
    pub(crate) fn release_tokens(&self, id: i64, stored: &TokenUpdate) -> bool {
        let mut held = self.held_map();
        match held.get(&id) {
            Some(t) if t.access_token == stored.access_token => {
                held.remove(&id);
                self.journal_held(&held);
                true
            }
            Some(_) => false,
            None => true,
        }
    }

    /// Lays held tokens over what storage returned.
    fn overlay_held(&self, accounts: &mut [(AccountRow, AccountSecrets)]) {
        let held = self.held_map();
        if held.is_empty() {
            return;
        }
        for (row, secrets) in accounts.iter_mut() {
            if let Some(t) = held.get(&row.id) {
                secrets.access_token = t.access_token.clone();
                if let Some(r) = t.refresh_token.as_ref().filter(|r| !r.is_empty()) {
                    secrets.refresh_token = r.clone();
                }
                if let Some(i) = t.id_token.as_ref().filter(|i| !i.is_empty()) {
                    secrets.id_token = i.clone();
                }
                if t.access_expires_at.is_some() {
                    row.access_expires_at = t.access_expires_at;
                }
                if let Some(p) = t.plan_type.as_ref().filter(|p| !p.is_empty()) {
                    row.plan_type = Some(p.clone());
                }
            }
        }
    }

    /// Publishes the tokens held for `id` without reading storage (it may be down): the
    /// current snapshot with that account's access token replaced. Returns the version, or
    /// `None` when nothing is held or the account is not published.
    pub async fn publish_held(&self, id: i64) -> Option<u64> {
        let st = self.state.lock().await;
        let t = self.held_tokens(id)?;
        let cur = self.snapshot.load_full();
        let old = cur.account(id)?;
        let entry = Arc::new(AccountEntry {
            id: old.id,
            label: old.label.clone(),
            chatgpt_account_id: old.chatgpt_account_id.clone(),
            user_id: old.user_id.clone(),
            plan: t
                .plan_type
                .clone()
                .filter(|p| !p.is_empty())
                .or_else(|| old.plan.clone()),
            access_token: t.access_token.clone(),
            access_expires_at: t.access_expires_at.or(old.access_expires_at),
            status: old.status,
            weight: old.weight,
            max_concurrency: old.max_concurrency,
            live: Arc::clone(&old.live),
            group: old.group.clone(),
            egress: old.egress.clone(),
        });
        let accounts = cur
            .accounts
            .iter()
            .map(|a| {
                if a.id == id {
                    Arc::clone(&entry)
                } else {
                    Arc::clone(a)
                }
            })
            .collect();
        let version = cur.version + 1;
        self.snapshot.store(Arc::new(Snapshot {
            version,
            accounts,
            keys: cur.keys.clone(),
            settings: cur.settings.clone(),
        }));
        self.set_token_version(id, version);
        drop(st);
        self.announce();
        self.mailboxes
            .broadcast(&WorkerCommand::SnapshotUpdated { version });
        tracing::debug!(version, account = id, "published held tokens");
        Some(version)
    }

    /// The configured settings (what a key without a stored override falls back to).
    pub fn defaults(&self) -> &Settings {
        &self.defaults
    }

    /// The snapshot currently published.
    pub fn current(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Egress proxies' live health.
    pub fn egress(&self) -> &crate::egress::EgressBook {
        &self.egress
    }

    /// The mailboxes of the workers.
    pub fn mailboxes(&self) -> &WorkerMailboxes {
        &self.mailboxes
    }

    /// The live state of an account, if it is known.
    pub async fn live(&self, id: i64) -> Option<Arc<AccountLive>> {
        self.state
            .lock()
            .await
            .live
            .get(&id)
            .map(|s| Arc::clone(&s.live))
    }

    /// Re-reads storage and publishes a new snapshot when its content changed (or `force`),
    /// and announces the change to the fleet ([`Self::announce`]): the reload after this
    /// instance changed something. Returns the published version, or `None` when nothing
    /// changed.
    ///
    /// The announcement is made even when this reload publishes nothing: a quiet reload
    /// running at the same time (the periodic one, or one after another instance's
    /// invalidation) may have read and published this instance's change first, and the
    /// other instances must hear of it all the same.
    pub async fn reload(
        &self,
        storage: &dyn Storage,
        force: bool,
    ) -> Result<Option<u64>, StorageError> {
        let v = self.reload_quiet(storage, force).await?;
        self.announce();
        Ok(v)
    }

    /// [`Self::reload`] without the announcement: the periodic reload and the reload an
    /// invalidation from another instance triggers (what they find was announced already).
    pub async fn reload_quiet(
        &self,
        storage: &dyn Storage,
        force: bool,
    ) -> Result<Option<u64>, StorageError> {
        // Holding the lock across the load serializes reloads, so the newest read publishes last.
        let mut st = self.state.lock().await;
        let mut accounts = storage.load_accounts().await?;
        let keys = storage.list_keys().await?;
        let stored_settings = storage.load_settings().await?;
        self.overlay_held(&mut accounts);
        let egress_input = crate::egress::EgressInput::load(storage).await?;
        let fp = fingerprint(&accounts, &keys, &stored_settings)
            ^ egress_input.fingerprint().rotate_left(17);

        // Cooldowns and quota persisted by other instances reach the live atomics even when
        // nothing else changed (they are not part of the snapshot content).
        for (row, _) in &accounts {
            match st.live.get_mut(&row.id) {
                Some(slot) => {
                    if let Some(e) = stored_cooldown(row) {
                        slot.live.apply(&e);
                    }
                    if row.quota_updated_at.is_some()
                        && row.quota_updated_at > slot.quota_applied_at
                    {
                        slot.live.apply(&stored_quota(row));
                        slot.quota_applied_at = row.quota_updated_at;
                    }
                }
                None => {
                    let live = Arc::new(AccountLive::default());
                    if let Some(e) = stored_cooldown(row) {
                        live.apply(&e);
                    }
                    live.apply(&stored_quota(row));
                    st.live.insert(
                        row.id,
                        LiveSlot {
                            live,
                            quota_applied_at: row.quota_updated_at,
                            published_status: None,
                            token_digest: None,
                        },
                    );
                }
            }
        }
        // Deleted accounts: forget their live state, evict their sockets once published.
        let mut evict = Vec::new();
        st.live.retain(|id, _| {
            let keep = present(&accounts, *id);
            if !keep {
                evict.push(*id);
            }
            keep
        });

        if !force && st.fingerprint == Some(fp) {
            return Ok(None);
        }

        let (settings, skipped) = crate::settings::effective(&self.defaults, &stored_settings);
        for e in skipped {
            tracing::warn!(error = %e, "ignoring a stored setting; the configured value stays");
        }
        let mut egress = self.egress.build(&egress_input).await;
        let version = self.snapshot.load().version + 1;
        let mut new_tokens = Vec::new();
        let mut entries = Vec::with_capacity(accounts.len());
        for (row, secrets) in accounts {
            let Some(slot) = st.live.get_mut(&row.id) else {
                continue;
            };
            // A data-plane override is pending until the same status is persisted; an
            // operator moving the account back to active lifts it, and the stored cooldown
            // (possibly cleared by whoever re-enabled it) is the one that stands.
            let reactivated = row.status == AccountStatus::Active
                && slot
                    .published_status
                    .is_some_and(|s| s != AccountStatus::Active);
            slot.live.apply(&if reactivated {
                AccountEffect::OperatorStatus {
                    status: row.status,
                    cooldown_until_ms: u64::try_from(row.cooldown_until_ms).unwrap_or(0),
                }
            } else {
                AccountEffect::StatusStored(row.status)
            });
            if secrets.decrypt_failed && slot.published_status.is_none() {
                tracing::error!(
                    account = row.id,
                    "stored tokens do not decrypt with the current secret key; account unusable"
                );
            }
            if slot.published_status == Some(AccountStatus::Active)
                && row.status != AccountStatus::Active
            {
                evict.push(row.id);
            }
            slot.published_status = Some(row.status);
            let digest = token_digest(&secrets);
            if slot.token_digest != Some(digest) {
                slot.token_digest = Some(digest);
                new_tokens.push(row.id);
            }
            let proxy = egress.remove(&row.id);
            let mut e = entry(row, secrets, Arc::clone(&slot.live), &settings);
            e.egress = proxy;
            entries.push(Arc::new(e));
        }
        entries.sort_by_key(|e| e.id);

        // Keys seen for the first time (start-up, a new key) start from what storage says they
        // spent today and this month, so budgets survive a restart.
        let fresh: Vec<i64> = keys
            .iter()
            .filter(|k| k.revoked_at.is_none() && !st.key_live.contains_key(&k.id))
            .map(|k| k.id)
            .collect();
        if !fresh.is_empty() {
            seed_key_live(storage, &mut st.key_live, &fresh).await?;
        }
        st.key_live
            .retain(|id, _| keys.iter().any(|k| k.id == *id && k.revoked_at.is_none()));
        let mut key_map = HashMap::with_capacity(keys.len());
        for k in keys.into_iter().filter(|k| k.revoked_at.is_none()) {
            let mut h = [0u8; 32];
            if hex::decode_to_slice(&k.key_hash, &mut h).is_err() {
                tracing::warn!(
                    key = k.id,
                    "stored key hash is not 64 hex chars; ignoring key"
                );
                continue;
            }
            let live = Arc::clone(st.key_live.entry(k.id).or_default());
            key_map.insert(
                h,
                ClientKey {
                    id: k.id,
                    name: k.name,
                    limits: Arc::new(k.limits),
                    live,
                    tag: Arc::from(&k.key_hash[..16]),
                },
            );
        }

        let accounts_n = entries.len();
        let keys_n = key_map.len();
        self.snapshot.store(Arc::new(Snapshot {
            version,
            accounts: entries,
            keys: key_map,
            settings,
        }));
        st.fingerprint = Some(fp);
        for id in new_tokens {
            self.set_token_version(id, version);
        }
        drop(st);
        for account_id in evict {
            self.mailboxes
                .broadcast(&WorkerCommand::EvictAccount { account_id });
        }
        self.mailboxes
            .broadcast(&WorkerCommand::SnapshotUpdated { version });
        tracing::debug!(
            version,
            accounts = accounts_n,
            keys = keys_n,
            "published snapshot"
        );
        Ok(Some(version))
    }
}

fn entry(
    row: AccountRow,
    secrets: AccountSecrets,
    live: Arc<AccountLive>,
    settings: &Settings,
) -> AccountEntry {
    let label = row.label();
    AccountEntry {
        id: row.id,
        label,
        chatgpt_account_id: row.chatgpt_account_id,
        user_id: Some(row.user_id).filter(|u| !u.is_empty()),
        plan: row.plan_type,
        access_token: secrets.access_token,
        access_expires_at: row.access_expires_at,
        status: row.status,
        weight: row.weight.max(1),
        max_concurrency: if row.max_concurrency == 0 {
            settings.default_max_concurrency
        } else {
            row.max_concurrency
        },
        live,
        group: row.account_group.filter(|g| !g.is_empty()).map(Arc::from),
        egress: None,
    }
}

/// Creates the live counters of `fresh` keys, seeded with their stored usage of today and
/// this month (UTC).
async fn seed_key_live(
    storage: &dyn Storage,
    map: &mut HashMap<i64, Arc<KeyLive>>,
    fresh: &[i64],
) -> Result<(), StorageError> {
    use shared_state::keys::{day_of, day_start_ms, month_of, month_start_ms, PeriodCounters};
    let now = shared_state::now_ms();
    let (day, month) = (day_of(now), month_of(now));
    let since = |ms: u64| i64::try_from(ms).unwrap_or(i64::MAX);
    let today = storage.key_spend(since(day_start_ms(day))).await?;
    let this_month = storage.key_spend(since(month_start_ms(month))).await?;
    let seed = |id: i64, period: u64, c: &PeriodCounters, v: &[crate::storage::KeySpend]| {
        if let Some(s) = v.iter().find(|s| s.key_id == id) {
            c.requests.seed(period, s.requests);
            c.tokens.seed(period, s.tokens);
            c.cost_micros.seed(period, s.cost_micros);
        }
    };
    for id in fresh {
        let live = Arc::clone(map.entry(*id).or_default());
        seed(*id, day, &live.day, &today);
        seed(*id, month, &live.month, &this_month);
    }
    Ok(())
}

/// A digest of an account's access token (never the token itself).
fn token_digest(s: &AccountSecrets) -> u64 {
    let mut h = DefaultHasher::new();
    s.access_token.expose().hash(&mut h);
    h.finish()
}

/// Whether `id` is among `accounts` (ordered by id).
fn present(accounts: &[(AccountRow, AccountSecrets)], id: i64) -> bool {
    accounts.binary_search_by_key(&id, |(r, _)| r.id).is_ok()
}

/// The quota columns of a stored row, as an effect.
fn stored_quota(row: &AccountRow) -> AccountEffect {
    let secs = |v: Option<i64>| v.and_then(|s| u64::try_from(s).ok());
    AccountEffect::quota(
        row.primary_used_pct,
        secs(row.primary_reset_at),
        row.secondary_used_pct,
        secs(row.secondary_reset_at),
    )
}

/// The stored cooldown (set by this or another instance), as an effect; `None` when none.
fn stored_cooldown(row: &AccountRow) -> Option<AccountEffect> {
    let until = u64::try_from(row.cooldown_until_ms)
        .ok()
        .filter(|&u| u > 0)?;
    Some(AccountEffect::cooldown(
        until,
        row.cooldown_reason.as_deref().unwrap_or("stored"),
    ))
}

/// A cheap digest of everything a snapshot is built from (not cooldown/quota: those travel
/// through the live atomics).
fn fingerprint(
    accounts: &[(AccountRow, AccountSecrets)],
    keys: &[KeyRow],
    stored_settings: &[(String, String)],
) -> u64 {
    let mut h = DefaultHasher::new();
    accounts.len().hash(&mut h);
    for (r, s) in accounts {
        r.id.hash(&mut h);
        r.chatgpt_account_id.hash(&mut h);
        r.user_id.hash(&mut h);
        r.email.hash(&mut h);
        r.plan_type.hash(&mut h);
        r.status.as_str().hash(&mut h);
        r.weight.hash(&mut h);
        r.max_concurrency.hash(&mut h);
        r.access_expires_at.hash(&mut h);
        r.updated_at.hash(&mut h);
        r.account_group.hash(&mut h);
        s.access_token.expose().hash(&mut h);
        s.decrypt_failed.hash(&mut h);
    }
    keys.len().hash(&mut h);
    for k in keys {
        k.id.hash(&mut h);
        k.name.hash(&mut h);
        k.key_hash.hash(&mut h);
        k.revoked_at.hash(&mut h);
        k.limits.hash(&mut h);
    }
    stored_settings.hash(&mut h);
    h.finish()
}
