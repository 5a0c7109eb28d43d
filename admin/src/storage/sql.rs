//! The SQL both backends share, stamped out for each pool type by `impl_storage!`.
//!
//! # Key Components
//! - `impl_storage!(Type, Db)`: implements [`super::Storage`] for a struct with fields
//!   `pool: sqlx::Pool<Db>` and `cipher: Cipher`. Every statement uses `$N` placeholders
//!   (SQLite accepts them), `ON CONFLICT ... DO UPDATE` and `RETURNING` (SQLite >= 3.35, which
//!   sqlx bundles), and only `BIGINT`/`TEXT`/`DOUBLE`/`BOOLEAN` column types, so the text is
//!   identical; only the schema files differ.
//!
//! # Error handling
//! Driver errors become [`crate::error::StorageError::Db`]; an unknown stored status loads as
//! `disabled` with a warning rather than failing the whole list.

/// Columns of [`super::AccountRow`], in select order.
pub(super) const ACCOUNT_COLS: &str = "id, chatgpt_account_id, user_id, email, plan_type, status, \
     weight, max_concurrency, access_expires_at, last_refresh_at, cooldown_until_ms, \
     cooldown_reason, primary_used_pct, primary_reset_at, secondary_used_pct, \
     secondary_reset_at, quota_updated_at, created_at, updated_at, account_group, refresh_fence";

/// Columns of [`super::KeyRow`], in select order.
pub(super) const KEY_COLS: &str = "id, name, key_hash, key_prefix, created_at, revoked_at, \
     rpm_limit, max_concurrency, tokens_per_day, tokens_per_month, cost_per_day_micros, \
     cost_per_month_micros, allowed_models, account_group, service_tier, expires_at, enabled, \
     last_used_at";

/// Sets every limit column of one key (`$11` = now, `$13` = the key's id).
pub(super) const UPDATE_KEY_LIMITS: &str = "UPDATE api_keys SET rpm_limit = $1, \
     max_concurrency = $2, tokens_per_day = $3, tokens_per_month = $4, \
     cost_per_day_micros = $5, cost_per_month_micros = $6, allowed_models = $7, \
     account_group = $8, expires_at = $9, enabled = $10, updated_at = $11, \
     service_tier = $12 WHERE id = $13";

/// Requests, tokens and cost per key since `$1` (Unix ms).
pub(super) const KEY_SPEND: &str = "SELECT key_id, COUNT(*) AS requests, \
     CAST(COALESCE(SUM(input_tokens + output_tokens), 0) AS BIGINT) AS tokens, \
     CAST(COALESCE(SUM(cost_micros), 0) AS BIGINT) AS cost_micros \
     FROM usage_records WHERE started_at_ms >= $1 GROUP BY key_id";

pub(super) const UPSERT_ACCOUNT: &str = "INSERT INTO accounts (chatgpt_account_id, user_id, \
     email, plan_type, status, access_token_enc, refresh_token_enc, id_token_enc, \
     access_expires_at, last_refresh_at, created_at, updated_at) \
     VALUES ($1, $2, $3, $4, 'active', $5, $6, $7, $8, $9, $10, $10) \
     ON CONFLICT (chatgpt_account_id, user_id) DO UPDATE SET \
     email = COALESCE(excluded.email, accounts.email), \
     plan_type = COALESCE(excluded.plan_type, accounts.plan_type), \
     access_token_enc = excluded.access_token_enc, \
     refresh_token_enc = CASE WHEN excluded.refresh_token_enc = '' \
         THEN accounts.refresh_token_enc ELSE excluded.refresh_token_enc END, \
     id_token_enc = CASE WHEN excluded.id_token_enc = '' \
         THEN accounts.id_token_enc ELSE excluded.id_token_enc END, \
     access_expires_at = excluded.access_expires_at, \
     last_refresh_at = COALESCE(excluded.last_refresh_at, accounts.last_refresh_at), \
     status = CASE WHEN accounts.status = 'reauth_required' THEN 'active' ELSE accounts.status END, \
     updated_at = excluded.updated_at \
     RETURNING id";

pub(super) const UPDATE_TOKENS: &str = "UPDATE accounts SET access_token_enc = $1, \
     refresh_token_enc = COALESCE($2, refresh_token_enc), \
     id_token_enc = COALESCE($3, id_token_enc), \
     access_expires_at = COALESCE($4, access_expires_at), \
     email = COALESCE($5, email), plan_type = COALESCE($6, plan_type), \
     last_refresh_at = $7, updated_at = $7, \
     refresh_fence = CASE WHEN $9 > refresh_fence THEN $9 ELSE refresh_fence END \
     WHERE id = $8 AND ($9 IS NULL OR refresh_fence <= $9)";

pub(super) const RECORD_QUOTA: &str = "UPDATE accounts SET \
     primary_used_pct = COALESCE($1, primary_used_pct), \
     primary_reset_at = COALESCE($2, primary_reset_at), \
     secondary_used_pct = COALESCE($3, secondary_used_pct), \
     secondary_reset_at = COALESCE($4, secondary_reset_at), \
     quota_updated_at = $5 WHERE id = $6";

pub(super) const USAGE_INSERT_HEAD: &str = "INSERT INTO usage_records (key_id, account_id, route, \
     model, status, stream, input_tokens, cached_tokens, output_tokens, reasoning_tokens, \
     ttfb_ms, latency_ms, error_code, started_at_ms, cost_micros, record_id, reasoning_effort, service_tier, \
     transport, ttft_ms, failovers, error_class, request_id) ";

/// What follows the values of a usage INSERT: a record already stored (spool replay) is
/// skipped.
pub(super) const USAGE_INSERT_TAIL: &str = " ON CONFLICT (record_id) DO NOTHING";

/// What the INSERT of a batch that holds a stored record adds to [`USAGE_INSERT_TAIL`]: the
/// ids of the inserted rows come back, so only those go into the rollups (added from the
/// records in memory: decoding one column per row instead of thirteen). Only then: SQLite
/// collects `RETURNING` rows in a temporary table (about 7,500 instructions a record) and
/// sqlx decodes each one (about 3,000 more; callgrind, issue 25).
pub(super) const USAGE_INSERT_RETURNING: &str = " RETURNING record_id";

/// Adds one group of inserted records to its hourly rollup row.
pub(super) const ROLLUP_UPSERT: &str = "INSERT INTO usage_hourly (hour_ms, key_id, account_id, \
     model, requests, errors, input_tokens, cached_tokens, output_tokens, reasoning_tokens, \
     failovers, latency_ms_sum, cost_micros) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
     ON CONFLICT (hour_ms, key_id, account_id, model) DO UPDATE SET \
     requests = usage_hourly.requests + excluded.requests, \
     errors = usage_hourly.errors + excluded.errors, \
     input_tokens = usage_hourly.input_tokens + excluded.input_tokens, \
     cached_tokens = usage_hourly.cached_tokens + excluded.cached_tokens, \
     output_tokens = usage_hourly.output_tokens + excluded.output_tokens, \
     reasoning_tokens = usage_hourly.reasoning_tokens + excluded.reasoning_tokens, \
     failovers = usage_hourly.failovers + excluded.failovers, \
     latency_ms_sum = usage_hourly.latency_ms_sum + excluded.latency_ms_sum, \
     cost_micros = usage_hourly.cost_micros + excluded.cost_micros";

/// Every column of a raw record, for the CSV export (`$5`: after this id, `$6`: limit).
pub(super) const USAGE_ROWS: &str = "SELECT id, record_id, started_at_ms, key_id, account_id, \
     route, model, reasoning_effort, service_tier, transport, status, stream, input_tokens, \
     cached_tokens, output_tokens, reasoning_tokens, ttfb_ms, ttft_ms, latency_ms, failovers, \
     error_code, error_class, cost_micros, request_id FROM usage_records \
     WHERE ($1 IS NULL OR started_at_ms >= $1) AND ($2 IS NULL OR started_at_ms < $2) \
       AND ($3 IS NULL OR key_id = $3) AND ($4 IS NULL OR account_id = $4) AND id > $5 \
     ORDER BY id LIMIT $6";

/// Every column of the raw records of one request id (a client's id may repeat), oldest
/// first (`$2`: limit).
pub(super) const USAGE_BY_REQUEST_ID: &str = "SELECT id, record_id, started_at_ms, key_id, \
     account_id, route, model, reasoning_effort, service_tier, transport, status, stream, \
     input_tokens, cached_tokens, output_tokens, reasoning_tokens, ttfb_ms, ttft_ms, latency_ms, \
     failovers, error_code, error_class, cost_micros, request_id FROM usage_records \
     WHERE request_id = $1 ORDER BY id LIMIT $2";

/// Hourly rollups in a window.
pub(super) const USAGE_ROLLUPS: &str = "SELECT hour_ms, key_id, account_id, model, requests, \
     errors, input_tokens, cached_tokens, output_tokens, reasoning_tokens, failovers, \
     latency_ms_sum, cost_micros FROM usage_hourly \
     WHERE ($1 IS NULL OR hour_ms >= $1) AND ($2 IS NULL OR hour_ms < $2) \
       AND ($3 IS NULL OR key_id = $3) AND ($4 IS NULL OR account_id = $4) \
     ORDER BY hour_ms, key_id, account_id, model";

/// Rows per multi-row usage INSERT: a batch of any size is cut into chunks of these sizes
/// only (largest first), so each connection prepares at most this many distinct INSERT
/// statements, once, and reuses them from its statement cache (sqlx keeps 100 per
/// connection). A statement per batch size made every new size a new statement: SQLite
/// parsed and planned an INSERT of up to 200 rows × 23 binds again whenever a batch of a
/// size not in the cache came (benches/results/2026-12-02.md). 128 rows are 2,944 binds, far
/// below both engines' limits (SQLite 32,766, PostgreSQL 65,535).
pub(super) const USAGE_CHUNKS: [usize; 8] = [128, 64, 32, 16, 8, 4, 2, 1];

/// Bind parameters per usage row ([`USAGE_INSERT_HEAD`]'s columns).
pub(super) const USAGE_COLS: usize = 23;

/// Bytes a usage row's bind values take encoded for PostgreSQL, about (a length prefix and
/// the value each): what [`USAGE_COLS`] values reserve at once.
pub(super) const USAGE_ROW_BYTES: usize = 384;

/// The chunks a batch of `n` records is inserted in, as (rows, INSERT statement): as many
/// 128s as fit, then at most one of each smaller power of two. `numbered`: `$N` placeholders
/// (PostgreSQL); otherwise `?` (SQLite, where a `$N` is a *named* parameter: its parser and
/// `sqlite3_bind_parameter_name` look names up in a list, quadratic in the binds of a
/// 128-row INSERT). `returning`: with [`USAGE_INSERT_RETURNING`].
pub(super) fn usage_chunks(
    mut n: usize,
    numbered: bool,
    returning: bool,
) -> impl Iterator<Item = (usize, &'static str)> {
    std::iter::from_fn(move || {
        let i = USAGE_CHUNKS.iter().position(|&s| s <= n)?;
        n -= USAGE_CHUNKS[i];
        Some((USAGE_CHUNKS[i], usage_insert_sql(i, numbered, returning)))
    })
}

/// The multi-row usage INSERT of `USAGE_CHUNKS[i]` rows, built once per placeholder style
/// and tail.
fn usage_insert_sql(i: usize, numbered: bool, returning: bool) -> &'static str {
    static SETS: [std::sync::OnceLock<Vec<String>>; 4] = [const { std::sync::OnceLock::new() }; 4];
    let build = || {
        USAGE_CHUNKS
            .iter()
            .map(|&rows| {
                use std::fmt::Write as _;
                let mut q = String::with_capacity(USAGE_INSERT_HEAD.len() + rows * 150 + 80);
                q.push_str(USAGE_INSERT_HEAD);
                q.push_str("VALUES ");
                for r in 0..rows {
                    q.push_str(if r == 0 { "(" } else { ", (" });
                    for c in 0..USAGE_COLS {
                        if c > 0 {
                            q.push_str(", ");
                        }
                        if numbered {
                            let _ = write!(q, "${}", r * USAGE_COLS + c + 1);
                        } else {
                            q.push('?');
                        }
                    }
                    q.push(')');
                }
                q.push_str(USAGE_INSERT_TAIL);
                if returning {
                    q.push_str(USAGE_INSERT_RETURNING);
                }
                q
            })
            .collect::<Vec<_>>()
    };
    &SETS[usize::from(numbered) * 2 + usize::from(returning)].get_or_init(build)[i]
}

/// A record id as stored ([`shared_state::UsageRecord::hex_id`]) as text.
pub(super) fn id_str(id: &[u8; 32]) -> &str {
    // Hex digits are ASCII: never the empty fallback.
    std::str::from_utf8(id).unwrap_or_default()
}

/// Usage totals grouped by `(key_id, account_id)`. `SUM` of a `BIGINT` is `NUMERIC` on
/// PostgreSQL, hence the casts; `$N IS NULL OR ...` turns an absent filter off.
pub(super) const USAGE_GROUPS: &str = "SELECT key_id, account_id, COUNT(*) AS requests, \
     CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT) AS input_tokens, \
     CAST(COALESCE(SUM(cached_tokens), 0) AS BIGINT) AS cached_tokens, \
     CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT) AS output_tokens, \
     CAST(COALESCE(SUM(reasoning_tokens), 0) AS BIGINT) AS reasoning_tokens, \
     CAST(COALESCE(SUM(CASE WHEN status >= 400 OR error_code IS NOT NULL THEN 1 ELSE 0 END), 0) \
         AS BIGINT) AS errors \
     FROM usage_records \
     WHERE ($1 IS NULL OR started_at_ms >= $1) AND ($2 IS NULL OR started_at_ms < $2) \
       AND ($3 IS NULL OR key_id = $3) AND ($4 IS NULL OR account_id = $4) \
     GROUP BY key_id, account_id";

pub(super) const UPSERT_SETTING: &str = "INSERT INTO settings (key, value, updated_at) \
     VALUES ($1, $2, $3) \
     ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at";

/// Columns of [`super::AdminTokenRow`], in select order.
pub(super) const ADMIN_TOKEN_COLS: &str =
    "id, name, token_hash, token_prefix, created_at, last_used_at, revoked_at, scope, expires_at";

/// Usage totals per `(bucket, key, account, model)`; `$5` is the bucket width in ms.
pub(super) const USAGE_BUCKETS: &str = "SELECT (started_at_ms / $5) * $5 AS bucket, key_id, \
     account_id, model, COUNT(*) AS requests, \
     CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT) AS input_tokens, \
     CAST(COALESCE(SUM(cached_tokens), 0) AS BIGINT) AS cached_tokens, \
     CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT) AS output_tokens, \
     CAST(COALESCE(SUM(reasoning_tokens), 0) AS BIGINT) AS reasoning_tokens, \
     CAST(COALESCE(SUM(CASE WHEN status >= 400 OR error_code IS NOT NULL THEN 1 ELSE 0 END), 0) \
         AS BIGINT) AS errors \
     FROM usage_records \
     WHERE ($1 IS NULL OR started_at_ms >= $1) AND ($2 IS NULL OR started_at_ms < $2) \
       AND ($3 IS NULL OR key_id = $3) AND ($4 IS NULL OR account_id = $4) \
     GROUP BY bucket, key_id, account_id, model ORDER BY bucket";

pub(super) const RECENT_FAILURES: &str = "SELECT id, key_id, account_id, route, model, status, \
     stream, ttfb_ms, latency_ms, error_code, started_at_ms, error_class, request_id \
     FROM usage_records WHERE status >= 400 OR error_code IS NOT NULL \
     ORDER BY started_at_ms DESC, id DESC LIMIT $1";

/// Implements [`super::Storage`] for `$ty { pool: sqlx::Pool<$db>, cipher: Cipher }`.
macro_rules! impl_storage {
    ($ty:ty, $db:ty, $backend:expr) => {
        // === impl $ty (shared SQL) ===

        impl $ty {
            /// The bind values of a usage INSERT of `chunk` (ids as stored: `ids`, one per
            /// record), with room for all of them reserved at once (2,944 for 128 rows:
            /// `Query::bind` one by one moved the query and regrew the values each time).
            fn usage_args<'q>(
                chunk: &'q [shared_state::UsageRecord],
                ids: &'q [[u8; 32]],
            ) -> Result<<$db as sqlx::Database>::Arguments<'q>, sqlx::Error> {
                use sqlx::Arguments as _;
                use $crate::storage::to_i64;
                let mut a: <$db as sqlx::Database>::Arguments<'q> = Default::default();
                a.reserve(
                    chunk.len() * $crate::storage::sql::USAGE_COLS,
                    chunk.len() * $crate::storage::sql::USAGE_ROW_BYTES,
                );
                let mut add = || -> Result<(), sqlx::error::BoxDynError> {
                    for (r, id) in chunk.iter().zip(ids) {
                        a.add(r.key_id)?;
                        a.add(r.account_id)?;
                        a.add(r.route)?;
                        a.add(r.model.as_str())?;
                        a.add(i64::from(r.status))?;
                        a.add(r.stream)?;
                        a.add(to_i64(r.input_tokens))?;
                        a.add(to_i64(r.cached_tokens))?;
                        a.add(to_i64(r.output_tokens))?;
                        a.add(to_i64(r.reasoning_tokens))?;
                        a.add(r.ttfb_ms.map(to_i64))?;
                        a.add(to_i64(r.latency_ms))?;
                        a.add(r.error_code.as_deref())?;
                        a.add(to_i64(r.started_at_ms))?;
                        a.add(to_i64(r.cost_micros))?;
                        a.add($crate::storage::sql::id_str(id))?;
                        a.add(r.reasoning_effort.as_deref())?;
                        a.add(r.service_tier.as_deref())?;
                        a.add(r.transport.as_str())?;
                        a.add(r.ttft_ms.map(to_i64))?;
                        a.add(i64::from(r.failovers))?;
                        a.add(r.error_class.as_deref())?;
                        a.add(Some(r.request_id.as_str()).filter(|id| !id.is_empty()))?;
                    }
                    Ok(())
                };
                add().map_err(sqlx::Error::Encode)?;
                Ok(a)
            }

            fn usage_row(
                r: &<$db as sqlx::Database>::Row,
            ) -> Result<$crate::storage::UsageRow, $crate::error::StorageError> {
                use sqlx::Row;
                Ok($crate::storage::UsageRow {
                    id: r.try_get("id")?,
                    record_id: r.try_get("record_id")?,
                    started_at_ms: r.try_get("started_at_ms")?,
                    key_id: r.try_get("key_id")?,
                    account_id: r.try_get("account_id")?,
                    route: r.try_get("route")?,
                    model: r.try_get("model")?,
                    reasoning_effort: r.try_get("reasoning_effort")?,
                    service_tier: r.try_get("service_tier")?,
                    transport: r.try_get("transport")?,
                    status: r.try_get("status")?,
                    stream: r.try_get("stream")?,
                    input_tokens: r.try_get("input_tokens")?,
                    cached_tokens: r.try_get("cached_tokens")?,
                    output_tokens: r.try_get("output_tokens")?,
                    reasoning_tokens: r.try_get("reasoning_tokens")?,
                    ttfb_ms: r.try_get("ttfb_ms")?,
                    ttft_ms: r.try_get("ttft_ms")?,
                    latency_ms: r.try_get("latency_ms")?,
                    failovers: r.try_get("failovers")?,
                    error_code: r.try_get("error_code")?,
                    error_class: r.try_get("error_class")?,
                    cost_micros: r.try_get("cost_micros")?,
                    request_id: r.try_get("request_id")?,
                })
            }

            fn account_row(
                r: &<$db as sqlx::Database>::Row,
            ) -> Result<$crate::storage::AccountRow, $crate::error::StorageError> {
                use sqlx::Row;
                let status: String = r.try_get("status")?;
                let id: i64 = r.try_get("id")?;
                let status = shared_state::AccountStatus::parse(&status).unwrap_or_else(|| {
                    tracing::warn!(account = id, status = %status, "unknown stored status; treating as disabled");
                    shared_state::AccountStatus::Disabled
                });
                Ok($crate::storage::AccountRow {
                    id,
                    chatgpt_account_id: r.try_get("chatgpt_account_id")?,
                    user_id: r.try_get("user_id")?,
                    email: r.try_get("email")?,
                    plan_type: r.try_get("plan_type")?,
                    status,
                    weight: $crate::storage::to_u32(r.try_get("weight")?),
                    max_concurrency: $crate::storage::to_u32(r.try_get("max_concurrency")?),
                    access_expires_at: r.try_get("access_expires_at")?,
                    last_refresh_at: r.try_get("last_refresh_at")?,
                    cooldown_until_ms: r.try_get("cooldown_until_ms")?,
                    cooldown_reason: r.try_get("cooldown_reason")?,
                    primary_used_pct: r.try_get("primary_used_pct")?,
                    primary_reset_at: r.try_get("primary_reset_at")?,
                    secondary_used_pct: r.try_get("secondary_used_pct")?,
                    secondary_reset_at: r.try_get("secondary_reset_at")?,
                    quota_updated_at: r.try_get("quota_updated_at")?,
                    created_at: r.try_get("created_at")?,
                    updated_at: r.try_get("updated_at")?,
                    account_group: r.try_get("account_group")?,
                    refresh_fence: r.try_get("refresh_fence")?,
                })
            }

            fn account_full(
                &self,
                r: &<$db as sqlx::Database>::Row,
            ) -> Result<
                ($crate::storage::AccountRow, $crate::storage::AccountSecrets),
                $crate::error::StorageError,
            > {
                use sqlx::Row;
                let row = Self::account_row(r)?;
                let mut failed = false;
                let mut open = |col: &'static str| -> Result<shared_state::Secret, $crate::error::StorageError> {
                    let enc: String = r.try_get(col)?;
                    let at = $crate::crypto::Binding::account(col, &row.chatgpt_account_id, &row.user_id);
                    Ok(self.cipher.open(&enc, &at).unwrap_or_else(|_| {
                        failed = true;
                        shared_state::Secret::new("")
                    }))
                };
                let access_token = open("access_token_enc")?;
                let refresh_token = open("refresh_token_enc")?;
                let id_token = open("id_token_enc")?;
                Ok((
                    row,
                    $crate::storage::AccountSecrets {
                        access_token,
                        refresh_token,
                        id_token,
                        decrypt_failed: failed,
                    },
                ))
            }

            fn admin_token_row(
                r: &<$db as sqlx::Database>::Row,
            ) -> Result<$crate::storage::AdminTokenRow, $crate::error::StorageError> {
                use sqlx::Row;
                Ok($crate::storage::AdminTokenRow {
                    id: r.try_get("id")?,
                    name: r.try_get("name")?,
                    token_hash: r.try_get("token_hash")?,
                    token_prefix: r.try_get("token_prefix")?,
                    created_at: r.try_get("created_at")?,
                    last_used_at: r.try_get("last_used_at")?,
                    revoked_at: r.try_get("revoked_at")?,
                    scope: r.try_get("scope")?,
                    expires_at: r.try_get("expires_at")?,
                })
            }

            fn key_row(
                r: &<$db as sqlx::Database>::Row,
            ) -> Result<$crate::storage::KeyRow, $crate::error::StorageError> {
                use sqlx::Row;
                Ok($crate::storage::KeyRow {
                    id: r.try_get("id")?,
                    name: r.try_get("name")?,
                    key_hash: r.try_get("key_hash")?,
                    key_prefix: r.try_get("key_prefix")?,
                    created_at: r.try_get("created_at")?,
                    revoked_at: r.try_get("revoked_at")?,
                    limits: $crate::storage::key_limits_of(
                        [
                            r.try_get("rpm_limit")?,
                            r.try_get("max_concurrency")?,
                            r.try_get("tokens_per_day")?,
                            r.try_get("tokens_per_month")?,
                            r.try_get("cost_per_day_micros")?,
                            r.try_get("cost_per_month_micros")?,
                            r.try_get("expires_at")?,
                        ],
                        r.try_get("allowed_models")?,
                        r.try_get("account_group")?,
                        r.try_get("service_tier")?,
                        r.try_get("enabled")?,
                    ),
                    last_used_at: r.try_get("last_used_at")?,
                })
            }
        }

        impl $crate::storage::Storage for $ty {
            fn backend(&self) -> $crate::storage::Backend {
                $backend
            }

            fn proxies(&self) -> &dyn $crate::storage::proxies::ProxyStore {
                self
            }

            fn audit(&self) -> &dyn $crate::storage::audit::AuditStore {
                self
            }

            fn ping(&self) -> $crate::storage::StorageFuture<'_, ()> {
                Box::pin(async move {
                    sqlx::query("SELECT 1").execute(&self.pool).await?;
                    Ok(())
                })
            }

            fn upsert_account<'a>(
                &'a self,
                acc: &'a $crate::storage::AccountUpsert,
            ) -> $crate::storage::StorageFuture<'a, $crate::storage::UpsertOutcome> {
                Box::pin(async move {
                    use sqlx::Row;
                    let existing = sqlx::query(
                        "SELECT id FROM accounts WHERE chatgpt_account_id = $1 AND user_id = $2",
                    )
                    .bind(&acc.chatgpt_account_id)
                    .bind(&acc.user_id)
                    .fetch_optional(&self.pool)
                    .await?;
                    let bind = |col| {
                        $crate::crypto::Binding::account(col, &acc.chatgpt_account_id, &acc.user_id)
                    };
                    let at = self.cipher.seal(&acc.access_token, &bind("access_token_enc"))?;
                    let rt = self.cipher.seal(&acc.refresh_token, &bind("refresh_token_enc"))?;
                    let it = self.cipher.seal(&acc.id_token, &bind("id_token_enc"))?;
                    let row = sqlx::query($crate::storage::sql::UPSERT_ACCOUNT)
                        .bind(&acc.chatgpt_account_id)
                        .bind(&acc.user_id)
                        .bind(acc.email.as_deref().filter(|e| !e.is_empty()))
                        .bind(acc.plan_type.as_deref().filter(|p| !p.is_empty()))
                        .bind(at)
                        .bind(rt)
                        .bind(it)
                        .bind(acc.access_expires_at)
                        .bind(acc.last_refresh_at)
                        .bind($crate::storage::now_ms_i64())
                        .fetch_one(&self.pool)
                        .await?;
                    Ok($crate::storage::UpsertOutcome {
                        id: row.try_get("id")?,
                        created: existing.is_none(),
                    })
                })
            }

            fn check_secrets(
                &self,
            ) -> $crate::storage::StorageFuture<'_, $crate::storage::SecretCheck> {
                Box::pin(async move {
                    use sqlx::Row;
                    const COLS: [&str; 3] = ["access_token_enc", "refresh_token_enc", "id_token_enc"];
                    let mut tx = self.pool.begin().await?;
                    let rows = sqlx::query(
                        "SELECT id, chatgpt_account_id, user_id, access_token_enc, \
                         refresh_token_enc, id_token_enc FROM accounts ORDER BY id",
                    )
                    .fetch_all(&mut *tx)
                    .await?;
                    let mut check = $crate::storage::SecretCheck::default();
                    let mut reseal: Vec<(i64, &'static str, String)> = Vec::new();
                    for r in &rows {
                        let id: i64 = r.try_get("id")?;
                        let acct: String = r.try_get("chatgpt_account_id")?;
                        let user: String = r.try_get("user_id")?;
                        for col in COLS {
                            let enc: String = r.try_get(col)?;
                            if enc.is_empty() {
                                continue;
                            }
                            check.columns += 1;
                            let at = $crate::crypto::Binding::account(col, &acct, &user);
                            match self.cipher.open(&enc, &at) {
                                Ok(plain) if $crate::crypto::Cipher::is_legacy(&enc) => {
                                    reseal.push((id, col, self.cipher.seal(&plain, &at)?));
                                }
                                Ok(_) => {}
                                Err(_) => check.failed += 1,
                            }
                        }
                    }
                    // Egress proxy passwords (issue 14) are sealed with the same key.
                    let prows = sqlx::query(
                        "SELECT name, password_enc FROM proxies WHERE password_enc <> ''",
                    )
                    .fetch_all(&mut *tx)
                    .await?;
                    for r in &prows {
                        let name: String = r.try_get("name")?;
                        let enc: String = r.try_get("password_enc")?;
                        check.columns += 1;
                        if self
                            .cipher
                            .open(&enc, &$crate::storage::proxies::binding(&name))
                            .is_err()
                        {
                            check.failed += 1;
                        }
                    }
                    if check.failed > 0 {
                        // Nothing is rewritten with a key that does not open everything.
                        tx.rollback().await?;
                        return Ok(check);
                    }
                    for (id, col, enc) in &reseal {
                        let sql = format!("UPDATE accounts SET {col} = $1 WHERE id = $2");
                        sqlx::query(&sql).bind(enc).bind(id).execute(&mut *tx).await?;
                        check.resealed += 1;
                    }
                    tx.commit().await?;
                    Ok(check)
                })
            }

            fn rotate_secrets<'a>(
                &'a self,
                new: &'a $crate::crypto::Cipher,
            ) -> $crate::storage::StorageFuture<'a, usize> {
                Box::pin(async move {
                    use sqlx::Row;
                    const COLS: [&str; 3] = ["access_token_enc", "refresh_token_enc", "id_token_enc"];
                    let mut tx = self.pool.begin().await?;
                    let rows = sqlx::query(
                        "SELECT id, chatgpt_account_id, user_id, access_token_enc, \
                         refresh_token_enc, id_token_enc FROM accounts ORDER BY id",
                    )
                    .fetch_all(&mut *tx)
                    .await?;
                    let mut rewritten: Vec<(i64, &'static str, String)> = Vec::new();
                    for r in &rows {
                        let id: i64 = r.try_get("id")?;
                        let acct: String = r.try_get("chatgpt_account_id")?;
                        let user: String = r.try_get("user_id")?;
                        for col in COLS {
                            let enc: String = r.try_get(col)?;
                            if enc.is_empty() {
                                continue;
                            }
                            let at = $crate::crypto::Binding::account(col, &acct, &user);
                            // Any column that does not open aborts the whole rotation.
                            let plain = self.cipher.open(&enc, &at)?;
                            rewritten.push((id, col, new.seal(&plain, &at)?));
                        }
                    }
                    for (id, col, enc) in &rewritten {
                        let sql = format!("UPDATE accounts SET {col} = $1 WHERE id = $2");
                        sqlx::query(&sql).bind(enc).bind(id).execute(&mut *tx).await?;
                    }
                    // Egress proxy passwords (issue 14).
                    let prows = sqlx::query(
                        "SELECT id, name, password_enc FROM proxies WHERE password_enc <> ''",
                    )
                    .fetch_all(&mut *tx)
                    .await?;
                    let mut proxies = 0;
                    for r in &prows {
                        let id: i64 = r.try_get("id")?;
                        let name: String = r.try_get("name")?;
                        let enc: String = r.try_get("password_enc")?;
                        let at = $crate::storage::proxies::binding(&name);
                        let sealed = new.seal(&self.cipher.open(&enc, &at)?, &at)?;
                        sqlx::query("UPDATE proxies SET password_enc = $1 WHERE id = $2")
                            .bind(sealed)
                            .bind(id)
                            .execute(&mut *tx)
                            .await?;
                        proxies += 1;
                    }
                    tx.commit().await?;
                    Ok(rewritten.len() + proxies)
                })
            }

            fn list_accounts(
                &self,
            ) -> $crate::storage::StorageFuture<'_, Vec<$crate::storage::AccountRow>> {
                Box::pin(async move {
                    let sql = format!(
                        "SELECT {} FROM accounts ORDER BY id",
                        $crate::storage::sql::ACCOUNT_COLS
                    );
                    let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
                    rows.iter().map(Self::account_row).collect()
                })
            }

            fn load_accounts(
                &self,
            ) -> $crate::storage::StorageFuture<
                '_,
                Vec<($crate::storage::AccountRow, $crate::storage::AccountSecrets)>,
            > {
                Box::pin(async move {
                    let sql = format!(
                        "SELECT {}, access_token_enc, refresh_token_enc, id_token_enc \
                         FROM accounts ORDER BY id",
                        $crate::storage::sql::ACCOUNT_COLS
                    );
                    let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
                    rows.iter().map(|r| self.account_full(r)).collect()
                })
            }

            fn get_account(
                &self,
                id: i64,
            ) -> $crate::storage::StorageFuture<
                '_,
                Option<($crate::storage::AccountRow, $crate::storage::AccountSecrets)>,
            > {
                Box::pin(async move {
                    let sql = format!(
                        "SELECT {}, access_token_enc, refresh_token_enc, id_token_enc \
                         FROM accounts WHERE id = $1",
                        $crate::storage::sql::ACCOUNT_COLS
                    );
                    let row = sqlx::query(&sql).bind(id).fetch_optional(&self.pool).await?;
                    row.as_ref().map(|r| self.account_full(r)).transpose()
                })
            }

            fn set_status(
                &self,
                id: i64,
                status: shared_state::AccountStatus,
            ) -> $crate::storage::StorageFuture<'_, bool> {
                Box::pin(async move {
                    let res = sqlx::query(
                        "UPDATE accounts SET status = $1, updated_at = $2 WHERE id = $3",
                    )
                    .bind(status.as_str())
                    .bind($crate::storage::now_ms_i64())
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn set_limits(
                &self,
                id: i64,
                weight: Option<u32>,
                max_concurrency: Option<u32>,
            ) -> $crate::storage::StorageFuture<'_, bool> {
                Box::pin(async move {
                    let res = sqlx::query(
                        "UPDATE accounts SET weight = COALESCE($1, weight), \
                         max_concurrency = COALESCE($2, max_concurrency), updated_at = $3 \
                         WHERE id = $4",
                    )
                    .bind(weight.map(i64::from))
                    .bind(max_concurrency.map(i64::from))
                    .bind($crate::storage::now_ms_i64())
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn set_cooldown<'a>(
                &'a self,
                id: i64,
                until_ms: u64,
                reason: Option<&'a str>,
            ) -> $crate::storage::StorageFuture<'a, bool> {
                Box::pin(async move {
                    let res = sqlx::query(
                        "UPDATE accounts SET cooldown_until_ms = $1, cooldown_reason = $2 \
                         WHERE id = $3",
                    )
                    .bind($crate::storage::to_i64(until_ms))
                    .bind(reason)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn record_quota(
                &self,
                id: i64,
                q: $crate::storage::QuotaUpdate,
            ) -> $crate::storage::StorageFuture<'_, bool> {
                Box::pin(async move {
                    let res = sqlx::query($crate::storage::sql::RECORD_QUOTA)
                        .bind(q.primary_pct)
                        .bind(q.primary_reset_at.map($crate::storage::to_i64))
                        .bind(q.secondary_pct)
                        .bind(q.secondary_reset_at.map($crate::storage::to_i64))
                        .bind($crate::storage::now_ms_i64())
                        .bind(id)
                        .execute(&self.pool)
                        .await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn update_tokens<'a>(
                &'a self,
                id: i64,
                t: &'a $crate::storage::TokenUpdate,
            ) -> $crate::storage::StorageFuture<'a, $crate::storage::TokenWrite> {
                Box::pin(async move {
                    use sqlx::Row;
                    use $crate::storage::TokenWrite;
                    let mut tx = self.pool.begin().await?;
                    // Each column is sealed for its row (the AEAD associated data).
                    let Some(key) = sqlx::query(
                        "SELECT chatgpt_account_id, user_id FROM accounts WHERE id = $1",
                    )
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?
                    else {
                        tx.rollback().await?;
                        return Ok(TokenWrite::NoAccount);
                    };
                    let acct: String = key.try_get("chatgpt_account_id")?;
                    let user: String = key.try_get("user_id")?;
                    let bind = |col| $crate::crypto::Binding::account(col, &acct, &user);
                    let at = self.cipher.seal(&t.access_token, &bind("access_token_enc"))?;
                    let rt = match &t.refresh_token {
                        Some(s) if !s.is_empty() => {
                            Some(self.cipher.seal(s, &bind("refresh_token_enc"))?)
                        }
                        _ => None,
                    };
                    let it = match &t.id_token {
                        Some(s) if !s.is_empty() => Some(self.cipher.seal(s, &bind("id_token_enc"))?),
                        _ => None,
                    };
                    let res = sqlx::query($crate::storage::sql::UPDATE_TOKENS)
                        .bind(at)
                        .bind(rt)
                        .bind(it)
                        .bind(t.access_expires_at)
                        .bind(t.email.as_deref().filter(|e| !e.is_empty()))
                        .bind(t.plan_type.as_deref().filter(|p| !p.is_empty()))
                        .bind($crate::storage::now_ms_i64())
                        .bind(id)
                        // No lease (`None`): written whatever the stored fence.
                        .bind(t.fence)
                        .execute(&mut *tx)
                        .await?;
                    if res.rows_affected() == 0 {
                        // The row exists (read above): a newer lease's refresh stored first.
                        tx.rollback().await?;
                        return Ok(TokenWrite::Fenced);
                    }
                    tx.commit().await?;
                    Ok(TokenWrite::Stored)
                })
            }

            fn set_plan_type<'a>(
                &'a self,
                id: i64,
                plan_type: &'a str,
            ) -> $crate::storage::StorageFuture<'a, bool> {
                Box::pin(async move {
                    let res = sqlx::query(
                        "UPDATE accounts SET plan_type = $1, \
                         updated_at = CASE WHEN plan_type IS NULL OR plan_type <> $1 \
                             THEN $2 ELSE updated_at END \
                         WHERE id = $3",
                    )
                    .bind(plan_type)
                    .bind($crate::storage::now_ms_i64())
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn delete_account(&self, id: i64) -> $crate::storage::StorageFuture<'_, bool> {
                Box::pin(async move {
                    let res = sqlx::query("DELETE FROM accounts WHERE id = $1")
                        .bind(id)
                        .execute(&self.pool)
                        .await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn create_key<'a>(
                &'a self,
                name: &'a str,
                key_hash_hex: &'a str,
                key_prefix: &'a str,
            ) -> $crate::storage::StorageFuture<'a, $crate::storage::KeyRow> {
                Box::pin(async move {
                    let sql = format!(
                        "INSERT INTO api_keys (name, key_hash, key_prefix, created_at) \
                         VALUES ($1, $2, $3, $4) RETURNING {}",
                        $crate::storage::sql::KEY_COLS
                    );
                    let row = sqlx::query(&sql)
                        .bind(name)
                        .bind(key_hash_hex)
                        .bind(key_prefix)
                        .bind($crate::storage::now_ms_i64())
                        .fetch_one(&self.pool)
                        .await?;
                    Self::key_row(&row)
                })
            }

            fn list_keys(
                &self,
            ) -> $crate::storage::StorageFuture<'_, Vec<$crate::storage::KeyRow>> {
                Box::pin(async move {
                    let sql = format!(
                        "SELECT {} FROM api_keys ORDER BY id",
                        $crate::storage::sql::KEY_COLS
                    );
                    let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
                    rows.iter().map(Self::key_row).collect()
                })
            }

            fn find_key_by_hash<'a>(
                &'a self,
                key_hash_hex: &'a str,
            ) -> $crate::storage::StorageFuture<'a, Option<$crate::storage::KeyRow>> {
                Box::pin(async move {
                    let sql = format!(
                        "SELECT {} FROM api_keys WHERE key_hash = $1",
                        $crate::storage::sql::KEY_COLS
                    );
                    let row = sqlx::query(&sql)
                        .bind(key_hash_hex)
                        .fetch_optional(&self.pool)
                        .await?;
                    row.as_ref().map(Self::key_row).transpose()
                })
            }

            fn revoke_key(&self, id: i64) -> $crate::storage::StorageFuture<'_, bool> {
                Box::pin(async move {
                    let res = sqlx::query(
                        "UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
                    )
                    .bind($crate::storage::now_ms_i64())
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn revoke_keys_by_name<'a>(
                &'a self,
                name: &'a str,
            ) -> $crate::storage::StorageFuture<'a, usize> {
                Box::pin(async move {
                    let res = sqlx::query(
                        "UPDATE api_keys SET revoked_at = $1 WHERE name = $2 AND revoked_at IS NULL",
                    )
                    .bind($crate::storage::now_ms_i64())
                    .bind(name)
                    .execute(&self.pool)
                    .await?;
                    Ok(usize::try_from(res.rows_affected()).unwrap_or(usize::MAX))
                })
            }

            fn update_key_limits<'a>(
                &'a self,
                id: i64,
                limits: &'a shared_state::keys::KeyLimits,
            ) -> $crate::storage::StorageFuture<'a, bool> {
                Box::pin(async move {
                    let n = |v: Option<u64>| v.map($crate::storage::to_i64);
                    let models = (!limits.allowed_models.is_empty())
                        .then(|| serde_json::to_string(&limits.allowed_models).unwrap_or_default());
                    let res = sqlx::query($crate::storage::sql::UPDATE_KEY_LIMITS)
                        .bind(limits.rpm.map(i64::from))
                        .bind(limits.max_concurrency.map(i64::from))
                        .bind(n(limits.tokens_per_day))
                        .bind(n(limits.tokens_per_month))
                        .bind(n(limits.cost_per_day_micros))
                        .bind(n(limits.cost_per_month_micros))
                        .bind(models)
                        .bind(limits.account_group.as_deref())
                        .bind(n(limits.expires_at_ms))
                        .bind(limits.enabled)
                        .bind($crate::storage::now_ms_i64())
                        .bind(limits.service_tier.map(|t| t.as_str()))
                        .bind(id)
                        .execute(&self.pool)
                        .await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn touch_keys<'a>(
                &'a self,
                uses: &'a [(i64, i64)],
            ) -> $crate::storage::StorageFuture<'a, ()> {
                Box::pin(async move {
                    if uses.is_empty() {
                        return Ok(());
                    }
                    let mut tx = self.pool.begin().await?;
                    for (id, at) in uses {
                        sqlx::query(
                            "UPDATE api_keys SET last_used_at = $1 WHERE id = $2 \
                             AND (last_used_at IS NULL OR last_used_at < $1)",
                        )
                        .bind(*at)
                        .bind(*id)
                        .execute(&mut *tx)
                        .await?;
                    }
                    tx.commit().await?;
                    Ok(())
                })
            }

            fn key_spend(
                &self,
                since_ms: i64,
            ) -> $crate::storage::StorageFuture<'_, Vec<$crate::storage::KeySpend>> {
                Box::pin(async move {
                    use sqlx::Row;
                    let rows = sqlx::query($crate::storage::sql::KEY_SPEND)
                        .bind(since_ms)
                        .fetch_all(&self.pool)
                        .await?;
                    let n = |r: &<$db as sqlx::Database>::Row, c: &str| -> Result<u64, sqlx::Error> {
                        Ok(u64::try_from(r.try_get::<i64, _>(c)?).unwrap_or(0))
                    };
                    let mut out = Vec::with_capacity(rows.len());
                    for r in &rows {
                        out.push($crate::storage::KeySpend {
                            key_id: r.try_get("key_id")?,
                            requests: n(r, "requests")?,
                            tokens: n(r, "tokens")?,
                            cost_micros: n(r, "cost_micros")?,
                        });
                    }
                    Ok(out)
                })
            }

            fn set_account_group<'a>(
                &'a self,
                id: i64,
                group: Option<&'a str>,
            ) -> $crate::storage::StorageFuture<'a, bool> {
                Box::pin(async move {
                    let res = sqlx::query(
                        "UPDATE accounts SET account_group = $1, updated_at = $2 WHERE id = $3",
                    )
                    .bind(group)
                    .bind($crate::storage::now_ms_i64())
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn insert_usage<'a>(
                &'a self,
                records: &'a [shared_state::UsageRecord],
            ) -> $crate::storage::StorageFuture<'a, usize> {
                Box::pin(async move {
                    use sqlx::Row;
                    use $crate::storage::sql::{id_str, usage_chunks};
                    if records.is_empty() {
                        return Ok(0);
                    }
                    // `$N` placeholders on PostgreSQL, `?` on SQLite.
                    let numbered = <$db as sqlx::Database>::NAME == "PostgreSQL";
                    // Each record's id as stored (a record without one gets one here).
                    let ids: Vec<[u8; 32]> = records
                        .iter()
                        .map(|r| {
                            shared_state::UsageRecord::hex_id(if r.id == 0 {
                                shared_state::UsageRecord::new_id()
                            } else {
                                r.id
                            })
                        })
                        .collect();
                    // (hour, key, account or 0, model) -> [requests, errors, in, cached, out,
                    // reasoning, failovers, latency, cost]
                    let mut rollup: std::collections::BTreeMap<(i64, i64, i64, &str), [i64; 9]> =
                        std::collections::BTreeMap::new();
                    // Every record is new, but for a replay of the spool after a crash between
                    // the commit and the spool's truncation: insert without RETURNING and
                    // check the counts.
                    let mut tx = self.pool.begin().await?;
                    let mut all_new = true;
                    let mut at = 0;
                    for (size, sql) in usage_chunks(records.len(), numbered, false) {
                        let (chunk, chunk_ids) = (&records[at..at + size], &ids[at..at + size]);
                        at += size;
                        // One of a few fixed statements (prepared once per connection).
                        let args = Self::usage_args(chunk, chunk_ids)?;
                        let q = sqlx::query_with::<$db, _>(sql, args);
                        if q.execute(&mut *tx).await?.rows_affected() != size as u64 {
                            all_new = false;
                            break;
                        }
                    }
                    let inserted = if all_new {
                        for r in records {
                            $crate::storage::add_to_rollup(&mut rollup, r);
                        }
                        records.len()
                    } else {
                        // A record was stored already (or is twice in the batch): again from
                        // the start, learning from the returned ids which records are new.
                        tx.rollback().await?;
                        tx = self.pool.begin().await?;
                        let mut inserted = 0usize;
                        let mut at = 0;
                        for (size, sql) in usage_chunks(records.len(), numbered, true) {
                            let (chunk, chunk_ids) =
                                (&records[at..at + size], &ids[at..at + size]);
                            at += size;
                            let args = Self::usage_args(chunk, chunk_ids)?;
                            let rows = sqlx::query_with::<$db, _>(sql, args)
                                .fetch_all(&mut *tx)
                                .await?;
                            inserted += rows.len();
                            // Every row inserted: the whole chunk goes into the rollups;
                            // otherwise only the records whose ids came back.
                            let mut fresh: Option<std::collections::HashSet<String>> =
                                if rows.len() == chunk.len() {
                                    None
                                } else {
                                    let mut set =
                                        std::collections::HashSet::with_capacity(rows.len());
                                    for row in &rows {
                                        set.insert(row.try_get::<String, _>(0)?);
                                    }
                                    Some(set)
                                };
                            for (r, id) in chunk.iter().zip(chunk_ids) {
                                // Each returned id counts once (a record twice in one batch
                                // is stored once).
                                if fresh.as_mut().is_some_and(|f| !f.remove(id_str(id))) {
                                    continue;
                                }
                                $crate::storage::add_to_rollup(&mut rollup, r);
                            }
                        }
                        inserted
                    };
                    for ((hour, key, account, model), v) in &rollup {
                        let mut q = sqlx::query($crate::storage::sql::ROLLUP_UPSERT)
                            .bind(*hour)
                            .bind(*key)
                            .bind(*account)
                            .bind(*model);
                        for x in v {
                            q = q.bind(*x);
                        }
                        q.execute(&mut *tx).await?;
                    }
                    tx.commit().await?;
                    Ok(inserted)
                })
            }

            fn usage_rows(
                &self,
                filter: $crate::storage::UsageFilter,
                after_id: i64,
                limit: u32,
            ) -> $crate::storage::StorageFuture<'_, Vec<$crate::storage::UsageRow>> {
                Box::pin(async move {
                    let rows = sqlx::query($crate::storage::sql::USAGE_ROWS)
                        .bind(filter.since_ms)
                        .bind(filter.until_ms)
                        .bind(filter.key_id)
                        .bind(filter.account_id)
                        .bind(after_id)
                        .bind(i64::from(limit))
                        .fetch_all(&self.pool)
                        .await?;
                    rows.iter().map(Self::usage_row).collect()
                })
            }

            fn usage_rollups(
                &self,
                filter: $crate::storage::UsageFilter,
            ) -> $crate::storage::StorageFuture<'_, Vec<$crate::storage::UsageRollup>> {
                Box::pin(async move {
                    use sqlx::Row;
                    let rows = sqlx::query($crate::storage::sql::USAGE_ROLLUPS)
                        .bind(filter.since_ms)
                        .bind(filter.until_ms)
                        .bind(filter.key_id)
                        .bind(filter.account_id)
                        .fetch_all(&self.pool)
                        .await?;
                    let n = |r: &<$db as sqlx::Database>::Row, c: &str| -> Result<u64, sqlx::Error> {
                        Ok(u64::try_from(r.try_get::<i64, _>(c)?).unwrap_or(0))
                    };
                    let mut out = Vec::with_capacity(rows.len());
                    for r in &rows {
                        let account: i64 = r.try_get("account_id")?;
                        out.push($crate::storage::UsageRollup {
                            hour_ms: r.try_get("hour_ms")?,
                            key_id: r.try_get("key_id")?,
                            account_id: (account != 0).then_some(account),
                            model: r.try_get("model")?,
                            totals: $crate::storage::UsageTotals {
                                requests: n(r, "requests")?,
                                input_tokens: n(r, "input_tokens")?,
                                cached_tokens: n(r, "cached_tokens")?,
                                output_tokens: n(r, "output_tokens")?,
                                reasoning_tokens: n(r, "reasoning_tokens")?,
                                errors: n(r, "errors")?,
                            },
                            failovers: n(r, "failovers")?,
                            latency_ms_sum: n(r, "latency_ms_sum")?,
                            cost_micros: n(r, "cost_micros")?,
                        });
                    }
                    Ok(out)
                })
            }

            fn prune_usage(
                &self,
                raw_before_ms: Option<i64>,
                rollup_before_ms: Option<i64>,
            ) -> $crate::storage::StorageFuture<'_, (u64, u64)> {
                Box::pin(async move {
                    let mut raw = 0;
                    if let Some(t) = raw_before_ms {
                        raw = sqlx::query("DELETE FROM usage_records WHERE started_at_ms < $1")
                            .bind(t)
                            .execute(&self.pool)
                            .await?
                            .rows_affected();
                    }
                    let mut rolled = 0;
                    if let Some(t) = rollup_before_ms {
                        rolled = sqlx::query("DELETE FROM usage_hourly WHERE hour_ms < $1")
                            .bind(t)
                            .execute(&self.pool)
                            .await?
                            .rows_affected();
                    }
                    Ok((raw, rolled))
                })
            }

            fn usage_count(&self) -> $crate::storage::StorageFuture<'_, u64> {
                Box::pin(async move {
                    use sqlx::Row;
                    let row = sqlx::query("SELECT COUNT(*) AS n FROM usage_records")
                        .fetch_one(&self.pool)
                        .await?;
                    let n: i64 = row.try_get("n")?;
                    Ok(u64::try_from(n).unwrap_or(0))
                })
            }

            fn usage_summary(
                &self,
                filter: $crate::storage::UsageFilter,
            ) -> $crate::storage::StorageFuture<'_, $crate::storage::UsageSummary> {
                Box::pin(async move {
                    use sqlx::Row;
                    let rows = sqlx::query($crate::storage::sql::USAGE_GROUPS)
                        .bind(filter.since_ms)
                        .bind(filter.until_ms)
                        .bind(filter.key_id)
                        .bind(filter.account_id)
                        .fetch_all(&self.pool)
                        .await?;
                    let n = |r: &<$db as sqlx::Database>::Row, c: &str| -> Result<u64, sqlx::Error> {
                        Ok(u64::try_from(r.try_get::<i64, _>(c)?).unwrap_or(0))
                    };
                    let mut groups = Vec::with_capacity(rows.len());
                    for r in &rows {
                        groups.push((
                            r.try_get::<i64, _>("key_id")?,
                            r.try_get::<Option<i64>, _>("account_id")?,
                            $crate::storage::UsageTotals {
                                requests: n(r, "requests")?,
                                input_tokens: n(r, "input_tokens")?,
                                cached_tokens: n(r, "cached_tokens")?,
                                output_tokens: n(r, "output_tokens")?,
                                reasoning_tokens: n(r, "reasoning_tokens")?,
                                errors: n(r, "errors")?,
                            },
                        ));
                    }
                    Ok($crate::storage::UsageSummary::from_groups(groups))
                })
            }

            fn load_settings(
                &self,
            ) -> $crate::storage::StorageFuture<'_, Vec<(String, String)>> {
                Box::pin(async move {
                    let rows: Vec<(String, String)> =
                        sqlx::query_as("SELECT key, value FROM settings ORDER BY key")
                            .fetch_all(&self.pool)
                            .await?;
                    Ok(rows)
                })
            }

            fn write_settings<'a>(
                &'a self,
                changes: &'a [(String, Option<String>)],
            ) -> $crate::storage::StorageFuture<'a, ()> {
                Box::pin(async move {
                    if changes.is_empty() {
                        return Ok(());
                    }
                    let now = $crate::storage::now_ms_i64();
                    let mut tx = self.pool.begin().await?;
                    for (key, value) in changes {
                        match value {
                            Some(v) => {
                                sqlx::query($crate::storage::sql::UPSERT_SETTING)
                                    .bind(key)
                                    .bind(v)
                                    .bind(now)
                                    .execute(&mut *tx)
                                    .await?;
                            }
                            None => {
                                sqlx::query("DELETE FROM settings WHERE key = $1")
                                    .bind(key)
                                    .execute(&mut *tx)
                                    .await?;
                            }
                        }
                    }
                    tx.commit().await?;
                    Ok(())
                })
            }

            fn usage_buckets(
                &self,
                filter: $crate::storage::UsageFilter,
                bucket_ms: i64,
            ) -> $crate::storage::StorageFuture<'_, Vec<$crate::storage::UsageBucket>> {
                Box::pin(async move {
                    use sqlx::Row;
                    let rows = sqlx::query($crate::storage::sql::USAGE_BUCKETS)
                        .bind(filter.since_ms)
                        .bind(filter.until_ms)
                        .bind(filter.key_id)
                        .bind(filter.account_id)
                        .bind(bucket_ms.max(1))
                        .fetch_all(&self.pool)
                        .await?;
                    let n = |r: &<$db as sqlx::Database>::Row, c: &str| -> Result<u64, sqlx::Error> {
                        Ok(u64::try_from(r.try_get::<i64, _>(c)?).unwrap_or(0))
                    };
                    let mut out = Vec::with_capacity(rows.len());
                    for r in &rows {
                        out.push($crate::storage::UsageBucket {
                            bucket_ms: r.try_get("bucket")?,
                            key_id: r.try_get("key_id")?,
                            account_id: r.try_get("account_id")?,
                            model: r.try_get("model")?,
                            totals: $crate::storage::UsageTotals {
                                requests: n(r, "requests")?,
                                input_tokens: n(r, "input_tokens")?,
                                cached_tokens: n(r, "cached_tokens")?,
                                output_tokens: n(r, "output_tokens")?,
                                reasoning_tokens: n(r, "reasoning_tokens")?,
                                errors: n(r, "errors")?,
                            },
                        });
                    }
                    Ok(out)
                })
            }

            fn usage_by_request_id<'a>(
                &'a self,
                request_id: &'a str,
                limit: u32,
            ) -> $crate::storage::StorageFuture<'a, Vec<$crate::storage::UsageRow>> {
                Box::pin(async move {
                    let rows = sqlx::query($crate::storage::sql::USAGE_BY_REQUEST_ID)
                        .bind(request_id)
                        .bind(i64::from(limit))
                        .fetch_all(&self.pool)
                        .await?;
                    rows.iter().map(Self::usage_row).collect()
                })
            }

            fn recent_failures(
                &self,
                limit: u32,
            ) -> $crate::storage::StorageFuture<'_, Vec<$crate::storage::UsageEntry>> {
                Box::pin(async move {
                    use sqlx::Row;
                    let rows = sqlx::query($crate::storage::sql::RECENT_FAILURES)
                        .bind(i64::from(limit))
                        .fetch_all(&self.pool)
                        .await?;
                    let mut out = Vec::with_capacity(rows.len());
                    for r in &rows {
                        out.push($crate::storage::UsageEntry {
                            id: r.try_get("id")?,
                            key_id: r.try_get("key_id")?,
                            account_id: r.try_get("account_id")?,
                            route: r.try_get("route")?,
                            model: r.try_get("model")?,
                            status: r.try_get("status")?,
                            stream: r.try_get("stream")?,
                            ttfb_ms: r.try_get("ttfb_ms")?,
                            latency_ms: r.try_get("latency_ms")?,
                            error_code: r.try_get("error_code")?,
                            started_at_ms: r.try_get("started_at_ms")?,
                            error_class: r.try_get("error_class")?,
                            request_id: r.try_get("request_id")?,
                        });
                    }
                    Ok(out)
                })
            }

            fn admin_password_hash(&self) -> $crate::storage::StorageFuture<'_, Option<String>> {
                Box::pin(async move {
                    let row: Option<(String,)> =
                        sqlx::query_as("SELECT password_hash FROM admin_password WHERE id = 1")
                            .fetch_optional(&self.pool)
                            .await?;
                    Ok(row.map(|r| r.0))
                })
            }

            fn set_admin_password_hash<'a>(
                &'a self,
                hash: &'a str,
                only_if_absent: bool,
            ) -> $crate::storage::StorageFuture<'a, bool> {
                Box::pin(async move {
                    let now = $crate::storage::now_ms_i64();
                    let mut tx = self.pool.begin().await?;
                    let sql = if only_if_absent {
                        "INSERT INTO admin_password (id, password_hash, updated_at) \
                         VALUES (1, $1, $2) ON CONFLICT (id) DO NOTHING"
                    } else {
                        "INSERT INTO admin_password (id, password_hash, updated_at) \
                         VALUES (1, $1, $2) ON CONFLICT (id) DO UPDATE SET \
                         password_hash = excluded.password_hash, updated_at = excluded.updated_at"
                    };
                    let res = sqlx::query(sql)
                        .bind(hash)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                    if !only_if_absent {
                        sqlx::query("DELETE FROM admin_sessions")
                            .execute(&mut *tx)
                            .await?;
                    }
                    tx.commit().await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn create_admin_session<'a>(
                &'a self,
                id_hash: &'a str,
                expires_at_ms: i64,
            ) -> $crate::storage::StorageFuture<'a, ()> {
                Box::pin(async move {
                    sqlx::query(
                        "INSERT INTO admin_sessions (id_hash, created_at, expires_at) \
                         VALUES ($1, $2, $3)",
                    )
                    .bind(id_hash)
                    .bind($crate::storage::now_ms_i64())
                    .bind(expires_at_ms)
                    .execute(&self.pool)
                    .await?;
                    Ok(())
                })
            }

            fn admin_session_valid<'a>(
                &'a self,
                id_hash: &'a str,
                now_ms: i64,
            ) -> $crate::storage::StorageFuture<'a, bool> {
                Box::pin(async move {
                    let row: Option<(i64,)> = sqlx::query_as(
                        "SELECT expires_at FROM admin_sessions WHERE id_hash = $1 AND expires_at > $2",
                    )
                    .bind(id_hash)
                    .bind(now_ms)
                    .fetch_optional(&self.pool)
                    .await?;
                    Ok(row.is_some())
                })
            }

            fn delete_admin_sessions<'a>(
                &'a self,
                id_hash: Option<&'a str>,
            ) -> $crate::storage::StorageFuture<'a, u64> {
                Box::pin(async move {
                    let res = sqlx::query(
                        "DELETE FROM admin_sessions WHERE $1 IS NULL OR id_hash = $1 OR expires_at <= $2",
                    )
                    .bind(id_hash)
                    .bind($crate::storage::now_ms_i64())
                    .execute(&self.pool)
                    .await?;
                    Ok(res.rows_affected())
                })
            }

            fn create_admin_token<'a>(
                &'a self,
                name: &'a str,
                token_hash_hex: &'a str,
                token_prefix: &'a str,
                scope: &'a str,
                expires_at: Option<i64>,
            ) -> $crate::storage::StorageFuture<'a, $crate::storage::AdminTokenRow> {
                Box::pin(async move {
                    let sql = format!(
                        "INSERT INTO admin_tokens \
                         (name, token_hash, token_prefix, created_at, scope, expires_at) \
                         VALUES ($1, $2, $3, $4, $5, $6) RETURNING {}",
                        $crate::storage::sql::ADMIN_TOKEN_COLS
                    );
                    let row = sqlx::query(&sql)
                        .bind(name)
                        .bind(token_hash_hex)
                        .bind(token_prefix)
                        .bind($crate::storage::now_ms_i64())
                        .bind(scope)
                        .bind(expires_at)
                        .fetch_one(&self.pool)
                        .await?;
                    Self::admin_token_row(&row)
                })
            }

            fn list_admin_tokens(
                &self,
            ) -> $crate::storage::StorageFuture<'_, Vec<$crate::storage::AdminTokenRow>> {
                Box::pin(async move {
                    let sql = format!(
                        "SELECT {} FROM admin_tokens ORDER BY id",
                        $crate::storage::sql::ADMIN_TOKEN_COLS
                    );
                    let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
                    rows.iter().map(Self::admin_token_row).collect()
                })
            }

            fn find_admin_token<'a>(
                &'a self,
                token_hash_hex: &'a str,
            ) -> $crate::storage::StorageFuture<'a, Option<$crate::storage::AdminTokenRow>> {
                Box::pin(async move {
                    let sql = format!(
                        "SELECT {} FROM admin_tokens WHERE token_hash = $1 AND revoked_at IS NULL",
                        $crate::storage::sql::ADMIN_TOKEN_COLS
                    );
                    let row = sqlx::query(&sql)
                        .bind(token_hash_hex)
                        .fetch_optional(&self.pool)
                        .await?;
                    row.as_ref().map(Self::admin_token_row).transpose()
                })
            }

            fn touch_admin_token(
                &self,
                id: i64,
                now_ms: i64,
            ) -> $crate::storage::StorageFuture<'_, ()> {
                Box::pin(async move {
                    sqlx::query("UPDATE admin_tokens SET last_used_at = $1 WHERE id = $2")
                        .bind(now_ms)
                        .bind(id)
                        .execute(&self.pool)
                        .await?;
                    Ok(())
                })
            }

            fn revoke_admin_token(&self, id: i64) -> $crate::storage::StorageFuture<'_, bool> {
                Box::pin(async move {
                    let res = sqlx::query(
                        "UPDATE admin_tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
                    )
                    .bind($crate::storage::now_ms_i64())
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn close(&self) -> $crate::storage::StorageFuture<'_, ()> {
                Box::pin(async move {
                    self.pool.close().await;
                    Ok(())
                })
            }
        }
    };
}

pub(super) use impl_storage;

#[cfg(test)]
mod usage_chunk_tests {
    use super::*;

    #[test]
    fn batches_are_cut_into_the_fixed_sizes_only() {
        for n in 0..=1_000 {
            let sizes: Vec<usize> = usage_chunks(n, true, false).map(|(s, _)| s).collect();
            assert_eq!(sizes.iter().sum::<usize>(), n, "n = {n}");
            assert!(sizes.iter().all(|s| USAGE_CHUNKS.contains(s)), "n = {n}");
            // Largest first, and below 128 at most one chunk of each size.
            assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "n = {n}");
            let small: Vec<_> = sizes.iter().filter(|&&s| s < 128).collect();
            let mut dedup = small.clone();
            dedup.dedup();
            assert_eq!(small, dedup, "n = {n}");
        }
        let sizes: Vec<usize> = usage_chunks(200, false, true).map(|(s, _)| s).collect();
        assert_eq!(sizes, [128, 64, 8]);
    }

    #[test]
    fn each_fixed_statement_has_a_placeholder_per_bind() {
        for (i, &rows) in USAGE_CHUNKS.iter().enumerate() {
            let binds = rows * USAGE_COLS;
            for returning in [false, true] {
                let pg = usage_insert_sql(i, true, returning);
                assert!(pg.contains(&format!("${binds})")), "{rows} rows");
                assert!(!pg.contains(&format!("${}", binds + 1)), "{rows} rows");
                assert!(!pg.contains('?'));
                let lite = usage_insert_sql(i, false, returning);
                assert_eq!(lite.matches('?').count(), binds, "{rows} rows");
                assert!(!lite.contains('$'));
                for sql in [pg, lite] {
                    // + the column list and ON CONFLICT (record_id)
                    assert_eq!(sql.matches('(').count(), rows + 2, "{rows} rows");
                    let tail = sql.strip_suffix(USAGE_INSERT_RETURNING);
                    assert_eq!(tail.is_some(), returning, "{rows} rows");
                    assert!(tail.unwrap_or(sql).ends_with(USAGE_INSERT_TAIL));
                }
                // The same text every time (the statement cache's key).
                assert!(std::ptr::eq(pg, usage_insert_sql(i, true, returning)));
                assert_eq!(
                    usage_chunks(rows, false, returning).next(),
                    Some((rows, lite))
                );
            }
            assert_ne!(
                usage_insert_sql(i, false, false),
                usage_insert_sql(i, false, true)
            );
        }
    }
}
