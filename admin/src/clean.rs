//! Auto-clean (issue 27): accounts banned upstream or needing a new login for longer than
//! `auto_clean_after_hours` are disabled or deleted (`auto_clean_action`). Each pass that
//! acted is **one** audit entry listing the accounts ([`audit_entry`]): actor `auto-clean` for
//! the background task, the operator for `POST /api/admin/auto-clean/run` (the API's audit
//! middleware records that call). Off by default (runtime settings, `crate::settings`).
//!
//! # Key Components
//! - [`run_once`]: one pass over the stored accounts (also `POST /api/admin/auto-clean/run`,
//!   with a dry run that only lists what would be cleaned).
//! - [`run`]: the supervised loop: settings read from storage every round, so a change takes
//!   effect without a restart (within [`OFF_RECHECK`] when it was off); while on, a round every
//!   tenth of the threshold, between 1 s and 60 s.
//!
//! "For longer than" is measured from the account's `updated_at`: the last change of its
//! status, tokens or limits, so an operator's later edit of a dead account restarts its clock
//! (it is never cleaned early).
//!
//! # Error handling
//! A storage failure skips the round (logged); the next round tries again.

use std::time::Duration;

use serde::Serialize;
use serde_json::json;
use shared_state::{AccountEffect, AccountStatus};
use tokio::sync::watch;

use crate::{
    error::StorageError,
    services::Store,
    settings::{CleanAction, SidecarSettings},
};

/// How often a loop that found auto-clean off looks at the settings again.
pub const OFF_RECHECK: Duration = Duration::from_secs(10);

/// One account auto-clean acted on (or would, in a dry run).
#[derive(Debug, Clone, Serialize)]
pub struct Cleaned {
    /// Account id.
    pub id: i64,
    /// Email or account id.
    pub label: String,
    /// Its status (`banned` / `reauth_required`).
    pub status: &'static str,
    /// Since when (its `updated_at`, Unix ms).
    pub since: i64,
    /// `disable` or `delete`.
    pub action: &'static str,
}

/// What a pass did.
#[derive(Debug, Clone, Serialize)]
pub struct Pass {
    /// `auto_clean`.
    pub object: &'static str,
    /// Whether auto-clean is on.
    pub enabled: bool,
    /// The threshold in hours (`null`: off).
    pub after_hours: Option<f64>,
    /// `disable` or `delete`.
    pub action: &'static str,
    /// Nothing was changed.
    pub dry_run: bool,
    /// The accounts acted on.
    pub cleaned: Vec<Cleaned>,
    /// Why the pass stopped before the end (a storage error after it had acted: what it did
    /// is still listed, and audited); the next round goes on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

/// One pass (see the module docs).
pub async fn run_once(store: &Store, dry_run: bool) -> Result<Pass, StorageError> {
    let stored = store.storage.load_settings().await?;
    let s: SidecarSettings = crate::settings::sidecar(&stored);
    let mut pass = Pass {
        object: "auto_clean",
        enabled: s.auto_clean_after_hours.is_some(),
        after_hours: s.auto_clean_after_hours,
        action: s.auto_clean_action.as_str(),
        dry_run,
        cleaned: Vec::new(),
        stopped: None,
    };
    let Some(hours) = s.auto_clean_after_hours else {
        return Ok(pass);
    };
    // Whole milliseconds; at least 1 ms.
    #[allow(clippy::cast_possible_truncation)]
    let after_ms = ((hours * 3_600_000.0) as i64).max(1);
    let now = crate::storage::now_ms_i64();
    for a in store.storage.list_accounts().await? {
        if !matches!(
            a.status,
            AccountStatus::Banned | AccountStatus::ReauthRequired
        ) {
            continue;
        }
        if now.saturating_sub(a.updated_at) < after_ms {
            continue;
        }
        let c = Cleaned {
            id: a.id,
            label: a.label(),
            status: a.status.as_str(),
            since: a.updated_at,
            action: s.auto_clean_action.as_str(),
        };
        if !dry_run {
            let done = match act(store, &a, s.auto_clean_action).await {
                Ok(done) => done,
                // What was done so far is reported (and audited) all the same.
                Err(e) if !pass.cleaned.is_empty() => {
                    tracing::warn!(error = %e, "auto-clean round stopped early");
                    pass.stopped = Some(e.to_string());
                    break;
                }
                Err(e) => return Err(e),
            };
            if !done {
                continue;
            }
            tracing::info!(
                account = a.id,
                status = c.status,
                action = c.action,
                "auto-clean"
            );
        }
        pass.cleaned.push(c);
    }
    if !dry_run && !pass.cleaned.is_empty() {
        store.republish().await;
    }
    Ok(pass)
}

/// Disables or deletes `a` unless its status changed since the listing (several instances
/// share the database: the one that acted first wins); whether it acted.
async fn act(
    store: &Store,
    a: &crate::storage::AccountRow,
    action: CleanAction,
) -> Result<bool, StorageError> {
    let still_dead = store
        .storage
        .get_account(a.id)
        .await?
        .is_some_and(|(now, _)| now.status == a.status);
    if !still_dead {
        return Ok(false);
    }
    match action {
        CleanAction::Disable => {
            let ok = store
                .storage
                .set_status(a.id, AccountStatus::Disabled)
                .await?;
            if ok {
                if let Some(live) = store.publisher.live(a.id).await {
                    live.apply(&AccountEffect::OperatorStatus {
                        status: AccountStatus::Disabled,
                        cooldown_until_ms: live.cooldown_until_ms(),
                    });
                }
            }
            Ok(ok)
        }
        CleanAction::Delete => store.storage.delete_account(a.id).await,
    }
}

/// The one audit entry of a pass that acted (`None`: a dry run, or nothing cleaned), as the
/// internal actor `auto-clean`: the accounts' ids (`object_id`, comma-separated), each one's
/// label, status and since when, and the status before and after.
pub fn audit_entry(pass: &Pass) -> Option<crate::storage::audit::AuditWrite> {
    if pass.dry_run || pass.cleaned.is_empty() {
        return None;
    }
    let delete = pass.action == CleanAction::Delete.as_str();
    let affected = crate::audit::Affected::of("account", pass.cleaned.iter().map(|c| c.id)).action(
        if delete {
            "accounts.delete"
        } else {
            "accounts.disable"
        },
    );
    let mut e = crate::audit::internal(
        crate::audit::ACTOR_AUTO_CLEAN,
        "auto-clean",
        "account",
        None,
        json!({
            "after_hours": pass.after_hours,
            "accounts": pass.cleaned.iter().map(|c| json!({
                "id": c.id,
                "label": c.label,
                "status": c.status,
                "status_since": c.since,
            })).collect::<Vec<_>>(),
        }),
    );
    affected.fold_into(&mut e);
    let before = match pass.cleaned.as_slice() {
        [one] => json!({"status": one.status}),
        many => json!({"status": many
            .iter()
            .map(|c| (c.id.to_string(), json!(c.status)))
            .collect::<serde_json::Map<_, _>>()}),
    };
    e.before = Some(before.to_string());
    e.after = Some(
        if delete {
            json!({"deleted": true})
        } else {
            json!({"status": "disabled"})
        }
        .to_string(),
    );
    Some(e)
}

/// The auto-clean loop (see the module docs).
pub(crate) async fn run(store: Store, mut stop: watch::Receiver<bool>) {
    loop {
        let wait = match run_once(&store, false).await {
            Ok(p) => {
                if let Some(e) = audit_entry(&p) {
                    crate::audit::record(store.storage.as_ref(), &e).await;
                }
                p.after_hours.map_or(OFF_RECHECK, |h| {
                    Duration::from_secs_f64((h * 360.0).clamp(1.0, 60.0))
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "auto-clean round failed");
                OFF_RECHECK
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
