//! The audit log of admin actions (issue 27): who changed what, when, from where, and the
//! before/after of what changed, with every secret redacted before anything is stored.
//!
//! # Key Components
//! - `crate::api::audit_layer::layer`: one Axum middleware around every authenticated admin
//!   API route (and `login_layer` around the login; both live with the router): each
//!   mutation (`POST`/`PUT`/`PATCH`/`DELETE`) is recorded with its actor ([`actor_of`]),
//!   action ([`action_of`], derived from the matched route, so a new route is audited
//!   without an edit here), object, HTTP status, the redacted
//!   request body, and, for settings, client keys, accounts and proxies, the fields that
//!   changed (`state_of` before and after the handler, [`changed`]). Rate-limited (429)
//!   answers are not recorded (an attacker cannot fill the table with refused logins).
//! - [`Affected`]: what a handler acting on many objects per call (bulk account actions, the
//!   batch test, an auto-clean run, an import or export, a proxy assignment) affected,
//!   attached to its response ([`Audited`]); the middleware folds it into the call's **one**
//!   entry (`object_id`: the affected ids, comma-separated, which the object filter matches;
//!   `details.affected` / `details.failed`), never one entry per object.
//! - [`record`]: the one writer; internal actors (`cli`, `auto-clean`, `auth-dir`) call it
//!   directly. A storage failure is logged, never returned: auditing never fails an action.
//! - [`prune`] / [`prune_loop`]: entries older than the `audit_retention_days` setting
//!   (default 180, 0 = forever) are deleted by the sidecar every [`PRUNE_EVERY`] (by `at_ms`,
//!   indexed, in batches); a prune that deleted anything is itself recorded
//!   (actor [`ACTOR_RETENTION`]).
//! - [`redact`]: secrets out of any JSON: values under secret-looking names (password, token,
//!   key, secret, cookie, authorization, code, content, ...), JWT-looking and gateway-key
//!   strings anywhere, URL credentials, queries and fragments, and long strings (pasted
//!   credential files). Request bodies over 256 KiB are recorded by size only.
//!
//! # Error handling
//! Nothing here fails the request it audits; an unreadable body is the handler's to refuse.

use axum::http::Method;
use serde_json::{json, Map, Value};

use crate::{
    auth::Principal,
    csv::{cell, rfc3339},
    storage::{audit::AuditWrite, Storage},
};

/// Redaction marker.
pub const REDACTED: &str = "[redacted]";
/// Strings longer than this are dropped from the details (a pasted credential file).
const MAX_STRING: usize = 256;

/// Actor of the command line helpers.
pub const ACTOR_CLI: &str = "cli";
/// Actor of the auto-clean task.
pub const ACTOR_AUTO_CLEAN: &str = "auto-clean";
/// Actor of the watched auth directory.
pub const ACTOR_AUTH_DIR: &str = "auth-dir";
/// Actor of the audit log's own pruning.
pub const ACTOR_RETENTION: &str = "audit-retention";
/// How often the sidecar prunes the audit log.
pub const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// What one call acting on many objects affected, for its one audit entry (see the module
/// docs). Ids only: never a secret.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Affected {
    /// The objects' type (`account`); `None`: the route's own object type.
    pub object_type: Option<&'static str>,
    /// The action recorded instead of the one derived from the route (`accounts.disable` for
    /// a bulk disable, so "who disabled account 17?" finds it with the single ones).
    pub action: Option<String>,
    /// Ids the call acted on.
    pub ids: Vec<i64>,
    /// Ids it was asked to act on and could not.
    pub failed: Vec<i64>,
}

/// A handler's answer with what it affected (the response extension the middleware reads).
pub type Audited<T> = (axum::Extension<Affected>, axum::Json<T>);

// === impl Affected ===

impl Affected {
    /// `ids` of `object_type` affected.
    pub fn of(object_type: &'static str, ids: impl IntoIterator<Item = i64>) -> Self {
        Self {
            object_type: Some(object_type),
            ids: ids.into_iter().collect(),
            ..Self::default()
        }
    }

    /// With the ids that failed.
    pub fn failed(mut self, ids: impl IntoIterator<Item = i64>) -> Self {
        self.failed = ids.into_iter().collect();
        self
    }

    /// Recorded as `action`.
    pub fn action(mut self, action: impl Into<String>) -> Self {
        self.action = Some(action.into());
        self
    }

    /// The answer `body` carrying this.
    pub fn with<T>(self, body: T) -> Audited<T> {
        (axum::Extension(self), axum::Json(body))
    }

    /// The ids as stored in `object_id`: comma-separated; `None` when there are none.
    pub fn ids_text(&self) -> Option<String> {
        (!self.ids.is_empty()).then(|| {
            self.ids
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        })
    }

    /// Folds this into `e` (one entry for the whole call). The route's own object id (a
    /// proxy's, for an assignment of accounts to it) is kept; the affected ids then go into
    /// the details only.
    pub fn fold_into(&self, e: &mut AuditWrite) {
        if let Some(a) = &self.action {
            e.action = a.clone();
        }
        let mut details = e
            .details
            .as_deref()
            .and_then(|d| serde_json::from_str::<Value>(d).ok())
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        if let Some(m) = details.as_object_mut() {
            if let Some(t) = self.object_type {
                m.insert("affected_type".into(), json!(t));
            }
            m.insert("affected".into(), json!(self.ids));
            if !self.failed.is_empty() {
                m.insert("failed".into(), json!(self.failed));
            }
        }
        e.details = json_text(&details);
        if e.object_id.is_none() {
            if let Some(t) = self.object_type {
                e.object_type = Some(t.to_owned());
            }
            e.object_id = self.ids_text();
        }
    }
}

/// An internal actor's entry (no HTTP status, no source).
pub fn internal(
    actor: &str,
    action: &str,
    object_type: &str,
    object_id: Option<String>,
    details: Value,
) -> AuditWrite {
    AuditWrite {
        at_ms: crate::storage::now_ms_i64(),
        actor: actor.to_owned(),
        action: action.to_owned(),
        object_type: Some(object_type.to_owned()),
        object_id,
        details: json_text(&redact(&details)),
        ..AuditWrite::default()
    }
}

/// Appends `e` (its JSON texts already redacted); a failure is logged, never returned.
pub async fn record(storage: &dyn Storage, e: &AuditWrite) {
    if let Err(err) = storage.audit().append_audit(e).await {
        tracing::warn!(error = %err, action = %e.action, "cannot write the audit log");
    }
}

pub(crate) fn json_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::Object(m) if m.is_empty() => None,
        v => Some(v.to_string()),
    }
}

/// The CSV export's header line.
pub const CSV_HEADER: &str =
    "id,time,actor,source,action,object_type,object_id,status,details,before,after\n";

/// Appends one entry as a CSV line (the columns of [`CSV_HEADER`]).
pub fn csv_row(out: &mut String, r: &crate::storage::audit::AuditRow) {
    let e = &r.entry;
    let cols = [
        r.id.to_string(),
        rfc3339(e.at_ms),
        e.actor.clone(),
        e.source.clone().unwrap_or_default(),
        e.action.clone(),
        e.object_type.clone().unwrap_or_default(),
        e.object_id.clone().unwrap_or_default(),
        e.status.to_string(),
        e.details.clone().unwrap_or_default(),
        e.before.clone().unwrap_or_default(),
        e.after.clone().unwrap_or_default(),
    ];
    for (i, c) in cols.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        cell(out, c);
    }
    out.push('\n');
}

/// Whether a JSON member name holds a secret.
fn secret_name(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    const PARTS: &[&str] = &[
        "password",
        "passwd",
        "token",
        "secret",
        "cookie",
        "authorization",
        "credential",
        "verifier",
        "content",
        "api_key",
        "apikey",
        "private",
    ];
    const EXACT: &[&str] = &["key", "code", "text", "state", "files", "auth", "session"];
    PARTS.iter().any(|p| k.contains(p)) || EXACT.contains(&k.as_str())
}

/// Whether a string looks like a secret wherever it appears.
fn secret_value(s: &str) -> bool {
    let t = s.trim();
    let jwt = t.starts_with("eyJ") && t.matches('.').count() >= 2;
    jwt || ["cg-", "cgadm-", "sk-", "rt_", "Bearer "]
        .iter()
        .any(|p| t.starts_with(p))
}

/// `v` with every secret replaced by [`REDACTED`] (see the module docs).
pub fn redact(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    // Numbers and flags are never secrets (`tokens_per_day`).
                    let plain = matches!(v, Value::Null | Value::Number(_) | Value::Bool(_));
                    let v = if secret_name(k) && !plain {
                        Value::String(REDACTED.into())
                    } else {
                        redact(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(redact).collect()),
        Value::String(s) => {
            if secret_value(s) {
                Value::String(REDACTED.into())
            } else if s.len() > MAX_STRING {
                Value::String(format!("[{} bytes]", s.len()))
            } else if s.contains("://") {
                // Queries and fragments carry codes and states (an OAuth callback): dropped.
                let base = s.split(['?', '#']).next().unwrap_or_default();
                Value::String(shared_state::secret::redact_url(base))
            } else {
                v.clone()
            }
        }
        other => other.clone(),
    }
}

/// The top-level members of two objects that differ: `(before, after)`, each `None` when
/// nothing changed.
pub fn changed(before: &Value, after: &Value) -> (Option<Value>, Option<Value>) {
    let empty = Map::new();
    let b = before.as_object().unwrap_or(&empty);
    let a = after.as_object().unwrap_or(&empty);
    let mut ob = Map::new();
    let mut oa = Map::new();
    for k in b.keys().chain(a.keys()) {
        let (x, y) = (b.get(k), a.get(k));
        if x != y && !ob.contains_key(k) && !oa.contains_key(k) {
            ob.insert(k.clone(), x.cloned().unwrap_or(Value::Null));
            oa.insert(k.clone(), y.cloned().unwrap_or(Value::Null));
        }
    }
    if ob.is_empty() {
        (None, None)
    } else {
        (Some(Value::Object(ob)), Some(Value::Object(oa)))
    }
}

/// Who made an authenticated request, as stored.
pub async fn actor_of(storage: &dyn Storage, p: &Principal) -> String {
    match p {
        Principal::Session => "session".into(),
        Principal::StaticToken => "static_token".into(),
        Principal::Token { id, .. } => {
            let name = storage
                .list_admin_tokens()
                .await
                .ok()
                .and_then(|ts| ts.into_iter().find(|t| t.id == *id).map(|t| t.name));
            match name {
                Some(n) => format!("token:{n}#{id}"),
                None => format!("token#{id}"),
            }
        }
    }
}

/// `(action, object type, object id)` of a mutation on the route `matched` (as declared,
/// `{id}` for parameters; the `/api/admin` prefix optional) reached at `path`.
pub fn action_of(method: &Method, matched: &str, path: &str) -> (String, String, Option<String>) {
    let strip = |s: &str| -> Vec<String> {
        s.trim_start_matches("/api/admin")
            .split('/')
            .filter(|x| !x.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let pat = strip(matched);
    let real = strip(path);
    let id = pat
        .iter()
        .position(|s| s.starts_with('{'))
        .and_then(|i| real.get(i).cloned());
    let words: Vec<&str> = pat
        .iter()
        .filter(|s| !s.starts_with('{'))
        .map(String::as_str)
        .collect();
    let first = words.first().copied().unwrap_or("unknown");
    let object = match first {
        "accounts" => "account",
        "keys" => "key",
        "tokens" => "admin_token",
        "proxies" => "proxy",
        "login" | "logout" => "session",
        other => other,
    }
    .to_owned();
    let verb = match *method {
        Method::PATCH | Method::PUT => "update",
        Method::DELETE => "delete",
        _ => "create",
    };
    let last_is_param = pat.last().is_some_and(|s| s.starts_with('{'));
    let action = if last_is_param || (words.len() == 1 && !matches!(first, "login" | "logout")) {
        format!("{first}.{verb}")
    } else if *method == Method::PUT || *method == Method::PATCH {
        format!("{}.update", words.join("."))
    } else {
        words.join(".")
    };
    (action, object, id)
}

/// Deletes the entries older than `retention` at `now_ms` (every batch until none is left);
/// returns how many went (`Ok(0)` when kept forever). A prune that deleted anything records
/// one entry saying so.
pub async fn prune(
    storage: &dyn Storage,
    retention: crate::settings::RetentionDays,
    now_ms: i64,
) -> Result<u64, crate::error::StorageError> {
    let Some(cutoff) = retention.cutoff_ms(now_ms) else {
        return Ok(0);
    };
    let mut total = 0u64;
    loop {
        let n = storage.audit().prune_audit(cutoff).await?;
        total += n;
        if n < crate::storage::audit::PRUNE_BATCH.unsigned_abs() {
            break;
        }
        // Between batches, others write.
        tokio::task::yield_now().await;
    }
    if total > 0 {
        tracing::info!(deleted = total, days = retention.0, "audit log pruned");
        let e = internal(
            ACTOR_RETENTION,
            "audit.prune",
            "audit_log",
            None,
            json!({"deleted": total, "retention_days": retention.0, "before": cutoff}),
        );
        record(storage, &e).await;
    }
    Ok(total)
}

/// [`prune`] with the stored `audit_retention_days` (read at each call, so a change takes
/// effect at the next round).
pub async fn prune_stored(
    storage: &dyn Storage,
    now_ms: i64,
) -> Result<u64, crate::error::StorageError> {
    let stored = storage.load_settings().await?;
    let s = crate::settings::sidecar(&stored);
    prune(storage, s.audit_retention_days, now_ms).await
}

/// The sidecar's pruning loop: a round at start, then every [`PRUNE_EVERY`]; a storage
/// failure skips the round (logged).
pub(crate) async fn prune_loop(
    storage: std::sync::Arc<dyn Storage>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(PRUNE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if let Err(e) = prune_stored(storage.as_ref(), crate::storage::now_ms_i64()).await {
            tracing::warn!(error = %e, "audit log prune failed");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_call_on_many_objects_folds_into_one_entry() {
        // A bulk call on the accounts route: the ids become the object id and the details.
        let mut e = AuditWrite {
            action: "accounts.bulk".into(),
            object_type: Some("account".into()),
            details: Some(r#"{"ids":[3,1,99],"action":"disable"}"#.into()),
            ..AuditWrite::default()
        };
        Affected::of("account", [3, 1])
            .failed([99])
            .action("accounts.disable")
            .fold_into(&mut e);
        assert_eq!(e.action, "accounts.disable");
        assert_eq!(e.object_id.as_deref(), Some("3,1"));
        let d: Value = serde_json::from_str(e.details.as_deref().unwrap()).unwrap();
        assert_eq!(d["affected"], json!([3, 1]));
        assert_eq!(d["failed"], json!([99]));
        assert_eq!(d["action"], "disable", "the request's details stay");
        // A route with its own object (a proxy's assignment): that id stays, the accounts go
        // into the details only; an action without failures lists none.
        let mut e = AuditWrite {
            action: "proxies.assign".into(),
            object_type: Some("proxy".into()),
            object_id: Some("7".into()),
            ..AuditWrite::default()
        };
        Affected::of("account", [5]).fold_into(&mut e);
        assert_eq!(
            (
                e.action.as_str(),
                e.object_type.as_deref(),
                e.object_id.as_deref()
            ),
            ("proxies.assign", Some("proxy"), Some("7"))
        );
        let d: Value = serde_json::from_str(e.details.as_deref().unwrap()).unwrap();
        assert_eq!(d, json!({"affected_type": "account", "affected": [5]}));
        // Nothing affected (a dry run): no object id.
        assert_eq!(Affected::of("account", []).ids_text(), None);
    }

    #[test]
    fn actions_from_routes() {
        let a = |m: Method, pat: &str, path: &str| action_of(&m, pat, path);
        assert_eq!(
            a(
                Method::POST,
                "/api/admin/accounts/{id}/disable",
                "/api/admin/accounts/7/disable"
            ),
            (
                "accounts.disable".into(),
                "account".into(),
                Some("7".into())
            )
        );
        assert_eq!(
            a(Method::PATCH, "/api/admin/keys/{id}", "/api/admin/keys/3").0,
            "keys.update"
        );
        assert_eq!(a(Method::DELETE, "/keys/{id}", "/keys/3").0, "keys.delete");
        assert_eq!(a(Method::POST, "/keys", "/keys").0, "keys.create");
        assert_eq!(
            a(Method::PUT, "/settings", "/settings").0,
            "settings.update"
        );
        assert_eq!(
            a(Method::POST, "/accounts/bulk", "/accounts/bulk").0,
            "accounts.bulk"
        );
        assert_eq!(
            a(Method::PUT, "/accounts/{id}/proxy", "/accounts/2/proxy"),
            (
                "accounts.proxy.update".into(),
                "account".into(),
                Some("2".into())
            )
        );
        assert_eq!(a(Method::POST, "/logout", "/logout").0, "logout");
        assert_eq!(a(Method::POST, "/tokens", "/tokens").1, "admin_token");
    }

    #[test]
    fn secrets_are_redacted() {
        let v = json!({
            "password": "hunter2",
            "name": "ci",
            "url": "http://user:pw@proxy:8080",
            "callback_url": "http://localhost:1455/auth/callback?code=oauth-code-1&state=st",
            "nested": [{"refresh_token": "rt_x"}, "eyJhbGciOi.eyJzdWIi.sig", "cg-abcdef"],
            "files": [{"name": "a.json", "content": "{...}"}],
            "long": "x".repeat(300),
            "weight": 3,
            "tokens_per_day": 5,
            "pool": null,
        });
        let r = redact(&v);
        let s = r.to_string();
        for secret in [
            "hunter2",
            "pw@",
            "rt_x",
            "eyJhbGciOi",
            "cg-abcdef",
            "xxxxxxxx",
            "oauth-code-1",
        ] {
            assert!(!s.contains(secret), "{secret} in {s}");
        }
        assert_eq!(r["name"], "ci");
        assert_eq!(r["weight"], 3);
        assert_eq!(r["tokens_per_day"], 5);
        assert_eq!(r["pool"], Value::Null);
    }

    #[test]
    fn only_changed_members() {
        let (b, a) = changed(
            &json!({"x": 1, "y": 2}),
            &json!({"x": 1, "y": 3, "z": true}),
        );
        assert_eq!(b.unwrap(), json!({"y": 2, "z": null}));
        assert_eq!(a.unwrap(), json!({"y": 3, "z": true}));
        assert_eq!(changed(&json!({"x": 1}), &json!({"x": 1})), (None, None));
    }
}
