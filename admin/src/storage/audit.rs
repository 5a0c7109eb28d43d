//! Audit log storage (issue 27): the `audit_log` table, migration 0020.
//!
//! # Key Components
//! - [`AuditStore`]: append, list and prune, reached through [`super::Storage::audit`];
//!   stamped out for both backends by `impl_audit_store!` (the SQL is identical, as in
//!   `sql.rs`). Pruning deletes by `at_ms` through its index (`audit_log_at`), in batches of
//!   [`PRUNE_BATCH`] so a large first prune never holds SQLite's write lock for long.
//! - [`AuditWrite`] (what is appended: already redacted by [`crate::audit`]), [`AuditRow`],
//!   [`AuditFilter`].
//!
//! Nothing here redacts: callers go through [`crate::audit::record`], which does.

use super::StorageFuture;

/// One audit entry to append (every text already free of secrets).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditWrite {
    /// When, Unix ms.
    pub at_ms: i64,
    /// Who: `session`, `token:<name>#<id>`, `static_token`, `cli`, `auto-clean`, `auth-dir`.
    pub actor: String,
    /// From where (the client IP of an API call).
    pub source: Option<String>,
    /// What: `accounts.disable`, `settings.update`, ...
    pub action: String,
    /// The object's type (`account`, `key`, `settings`, ...).
    pub object_type: Option<String>,
    /// The object's id; for an action on many objects, their ids separated by commas.
    pub object_id: Option<String>,
    /// HTTP status of an API call (0: an internal actor).
    pub status: i64,
    /// JSON: the redacted request, or what an internal actor did.
    pub details: Option<String>,
    /// JSON: the changed fields before.
    pub before: Option<String>,
    /// JSON: the changed fields after.
    pub after: Option<String>,
}

/// One stored audit entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditRow {
    /// Storage id (grows with time).
    pub id: i64,
    /// The entry.
    #[serde(flatten)]
    pub entry: AuditWriteView,
}

/// [`AuditWrite`] as listed (JSON texts parsed back in the API).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditWriteView {
    /// When, Unix ms.
    pub at_ms: i64,
    /// Who.
    pub actor: String,
    /// From where.
    pub source: Option<String>,
    /// What.
    pub action: String,
    /// Object type.
    pub object_type: Option<String>,
    /// Object id.
    pub object_id: Option<String>,
    /// HTTP status (0: internal).
    pub status: i64,
    /// JSON text.
    pub details: Option<String>,
    /// JSON text.
    pub before: Option<String>,
    /// JSON text.
    pub after: Option<String>,
}

/// Which entries [`AuditStore::list_audit`] returns; `None` fields do not filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Actor contains this text.
    pub actor: Option<String>,
    /// Action starts with this text (`accounts` matches `accounts.disable`).
    pub action: Option<String>,
    /// Only this object type (`account`, `key`, ...).
    pub object_type: Option<String>,
    /// Only this object id (also an entry whose comma-separated list holds it: a bulk
    /// action).
    pub object_id: Option<String>,
    /// At or after, Unix ms.
    pub since_ms: Option<i64>,
    /// Before, Unix ms.
    pub until_ms: Option<i64>,
    /// Only ids below this one (paging backwards, newest first).
    pub before_id: Option<i64>,
}

/// Audit storage, on both backends.
pub trait AuditStore: Send + Sync {
    /// Appends one entry; returns its id.
    fn append_audit<'a>(&'a self, e: &'a AuditWrite) -> StorageFuture<'a, i64>;
    /// Entries matching `f`, newest first, at most `limit`.
    fn list_audit<'a>(&'a self, f: &'a AuditFilter, limit: u32)
        -> StorageFuture<'a, Vec<AuditRow>>;
    /// Deletes entries older than `before_ms` (Unix ms), at most [`PRUNE_BATCH`] (the oldest
    /// first); returns how many went. Callers repeat while a full batch went.
    fn prune_audit(&self, before_ms: i64) -> StorageFuture<'_, u64>;
}

/// Most entries one [`AuditStore::prune_audit`] call deletes.
pub const PRUNE_BATCH: i64 = 5_000;

/// `WHERE` clause and its text binds for `f` (placeholders `$1..`), then the id bound.
pub(super) fn filter_sql(f: &AuditFilter) -> (String, Vec<String>, Vec<i64>) {
    let mut conds = Vec::new();
    let mut texts = Vec::new();
    let mut ints = Vec::new();
    if let Some(a) = f.actor.as_deref().filter(|s| !s.is_empty()) {
        texts.push(a.to_owned());
        conds.push(format!("actor LIKE '%' || ${} || '%'", texts.len()));
    }
    if let Some(a) = f.action.as_deref().filter(|s| !s.is_empty()) {
        texts.push(a.to_owned());
        conds.push(format!("action LIKE ${} || '%'", texts.len()));
    }
    if let Some(v) = f.object_type.as_deref().filter(|s| !s.is_empty()) {
        texts.push(v.to_owned());
        conds.push(format!("object_type = ${}", texts.len()));
    }
    if let Some(v) = f.object_id.as_deref().filter(|s| !s.is_empty()) {
        texts.push(v.to_owned());
        let n = texts.len();
        // One id, or one of a bulk action's comma-separated ids.
        conds.push(format!(
            "(object_id = ${n} OR ',' || object_id || ',' LIKE '%,' || ${n} || ',%')"
        ));
    }
    let mut n = texts.len();
    for (v, op, col) in [
        (f.since_ms, ">=", "at_ms"),
        (f.until_ms, "<", "at_ms"),
        (f.before_id, "<", "id"),
    ] {
        if let Some(v) = v {
            n += 1;
            ints.push(v);
            conds.push(format!("{col} {op} ${n}"));
        }
    }
    let w = if conds.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conds.join(" AND "))
    };
    (w, texts, ints)
}

/// Implements [`AuditStore`] for `$ty { pool: sqlx::Pool<$db>, .. }`.
macro_rules! impl_audit_store {
    ($ty:ty, $db:ty) => {
        impl $crate::storage::audit::AuditStore for $ty {
            fn append_audit<'a>(
                &'a self,
                e: &'a $crate::storage::audit::AuditWrite,
            ) -> $crate::storage::StorageFuture<'a, i64> {
                Box::pin(async move {
                    use sqlx::Row;
                    let r = sqlx::query(
                        "INSERT INTO audit_log (at_ms, actor, source, action, object_type, \
                         object_id, status, details, before_json, after_json) VALUES \
                         ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
                    )
                    .bind(e.at_ms)
                    .bind(&e.actor)
                    .bind(&e.source)
                    .bind(&e.action)
                    .bind(&e.object_type)
                    .bind(&e.object_id)
                    .bind(e.status)
                    .bind(&e.details)
                    .bind(&e.before)
                    .bind(&e.after)
                    .fetch_one(&self.pool)
                    .await?;
                    Ok(r.try_get("id")?)
                })
            }

            fn list_audit<'a>(
                &'a self,
                f: &'a $crate::storage::audit::AuditFilter,
                limit: u32,
            ) -> $crate::storage::StorageFuture<'a, Vec<$crate::storage::audit::AuditRow>> {
                Box::pin(async move {
                    use sqlx::Row;
                    let (w, texts, ints) = $crate::storage::audit::filter_sql(f);
                    let sql = format!(
                        "SELECT id, at_ms, actor, source, action, object_type, object_id, \
                         status, details, before_json, after_json FROM audit_log {w} \
                         ORDER BY id DESC LIMIT {}",
                        limit.max(1)
                    );
                    let mut q = sqlx::query(&sql);
                    for t in &texts {
                        q = q.bind(t);
                    }
                    for i in &ints {
                        q = q.bind(*i);
                    }
                    let rows = q.fetch_all(&self.pool).await?;
                    let mut out = Vec::with_capacity(rows.len());
                    for r in &rows {
                        out.push($crate::storage::audit::AuditRow {
                            id: r.try_get("id")?,
                            entry: $crate::storage::audit::AuditWriteView {
                                at_ms: r.try_get("at_ms")?,
                                actor: r.try_get("actor")?,
                                source: r.try_get("source")?,
                                action: r.try_get("action")?,
                                object_type: r.try_get("object_type")?,
                                object_id: r.try_get("object_id")?,
                                status: r.try_get("status")?,
                                details: r.try_get("details")?,
                                before: r.try_get("before_json")?,
                                after: r.try_get("after_json")?,
                            },
                        });
                    }
                    Ok(out)
                })
            }

            fn prune_audit(&self, before_ms: i64) -> $crate::storage::StorageFuture<'_, u64> {
                Box::pin(async move {
                    let r = sqlx::query(
                        "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log \
                         WHERE at_ms < $1 ORDER BY at_ms LIMIT $2)",
                    )
                    .bind(before_ms)
                    .bind($crate::storage::audit::PRUNE_BATCH)
                    .execute(&self.pool)
                    .await?;
                    Ok(r.rows_affected())
                })
            }
        }
    };
}

pub(super) use impl_audit_store;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn filter_placeholders_are_numbered_in_bind_order() {
        let (w, t, i) = filter_sql(&AuditFilter {
            actor: Some("tok".into()),
            action: Some("accounts".into()),
            object_type: None,
            object_id: Some("7".into()),
            since_ms: Some(5),
            until_ms: None,
            before_id: Some(9),
        });
        assert_eq!(
            w,
            "WHERE actor LIKE '%' || $1 || '%' AND action LIKE $2 || '%' AND \
             (object_id = $3 OR ',' || object_id || ',' LIKE '%,' || $3 || ',%') \
             AND at_ms >= $4 AND id < $5"
        );
        assert_eq!(t, vec!["tok", "accounts", "7"]);
        assert_eq!(i, vec![5, 9]);
        assert_eq!(filter_sql(&AuditFilter::default()).0, "");
    }
}
