//! Egress proxy storage (issue 14): the `proxies` table (passwords sealed like account tokens)
//! and `account_proxies` (an account's proxy or pool; no row = direct). Migration 0007.
//!
//! # Key Components
//! - [`ProxyStore`]: the proxy methods, reached through [`super::Storage::proxies`]; stamped
//!   out for both backends by `impl_proxy_store!` (the SQL is identical, as in `sql.rs`).
//! - [`ProxyRow`], [`ProxyWrite`], [`ProxyAssignment`], [`ProxyCheck`].
//!
//! # Error handling
//! A password that does not open with the key loads as absent with `decrypt_failed` (the
//! publisher then keeps the proxy's accounts off the network rather than sending them direct).

use shared_state::{egress::ProxyUrlError, ProxyUrl, Secret};

use super::StorageFuture;

/// A stored proxy, its password opened.
#[derive(Debug, Clone)]
pub struct ProxyRow {
    /// Id.
    pub id: i64,
    /// Unique name.
    pub name: String,
    /// URL without the password.
    pub url: String,
    /// The password, when there is one.
    pub password: Option<Secret>,
    /// The stored password did not open with the current key.
    pub decrypt_failed: bool,
    /// Pool name.
    pub pool: Option<String>,
    /// Whether accounts may use it.
    pub enabled: bool,
    /// Last admin test (ms).
    pub last_check_at: Option<i64>,
    /// Whether the last test reached the origin.
    pub last_check_ok: Option<bool>,
    /// Latency of the last test (ms).
    pub last_check_ms: Option<i64>,
    /// Error of the last test.
    pub last_check_error: Option<String>,
    /// Created (ms).
    pub created_at: i64,
    /// Updated (ms).
    pub updated_at: i64,
}

// === impl ProxyRow ===

impl ProxyRow {
    /// The parsed URL with its password.
    pub fn parsed(&self) -> Result<ProxyUrl, ProxyUrlError> {
        let mut u = ProxyUrl::parse(&self.url)?;
        u.password = self.password.clone();
        Ok(u)
    }
}

/// What create and update write.
#[derive(Debug, Clone)]
pub struct ProxyWrite {
    /// Unique name.
    pub name: String,
    /// The URL, password included (stored apart, sealed).
    pub url: ProxyUrl,
    /// Pool name.
    pub pool: Option<String>,
    /// Enabled.
    pub enabled: bool,
}

/// An account's egress.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProxyAssignment {
    /// No proxy.
    Direct,
    /// This proxy.
    Proxy(i64),
    /// One enabled proxy of this pool.
    Pool(String),
}

/// The result of an admin test.
#[derive(Debug, Clone)]
pub struct ProxyCheck {
    /// Reached the origin through the proxy.
    pub ok: bool,
    /// How long it took (ms).
    pub latency_ms: i64,
    /// What failed.
    pub error: Option<String>,
    /// When (ms).
    pub at: i64,
}

/// Proxy storage, on both backends.
pub trait ProxyStore: Send + Sync {
    /// Every proxy, by id.
    fn list_proxies(&self) -> StorageFuture<'_, Vec<ProxyRow>>;
    /// Creates a proxy (a taken name is a database constraint error).
    fn create_proxy<'a>(&'a self, p: &'a ProxyWrite) -> StorageFuture<'a, i64>;
    /// Replaces a proxy's fields (the password is sealed again under the new name).
    fn update_proxy<'a>(&'a self, id: i64, p: &'a ProxyWrite) -> StorageFuture<'a, bool>;
    /// Deletes a proxy (the caller makes sure no account uses it).
    fn delete_proxy(&self, id: i64) -> StorageFuture<'_, bool>;
    /// Stores the result of a test.
    fn record_proxy_check<'a>(&'a self, id: i64, c: &'a ProxyCheck) -> StorageFuture<'a, bool>;
    /// Every account's assignment (accounts without one are direct).
    fn list_proxy_assignments(&self) -> StorageFuture<'_, Vec<(i64, ProxyAssignment)>>;
    /// Sets an account's egress.
    fn set_account_proxy<'a>(
        &'a self,
        account_id: i64,
        a: &'a ProxyAssignment,
    ) -> StorageFuture<'a, ()>;
}

/// The password column's AEAD binding.
pub(super) fn binding(name: &str) -> crate::crypto::Binding<'_> {
    crate::crypto::Binding {
        table: "proxies",
        column: "password_enc",
        row: [name, ""],
    }
}

pub(super) const PROXY_COLS: &str = "id, name, url, password_enc, pool, enabled, last_check_at, \
     last_check_ok, last_check_ms, last_check_error, created_at, updated_at";

/// Implements [`ProxyStore`] for `$ty { pool: sqlx::Pool<$db>, cipher: Cipher }`.
macro_rules! impl_proxy_store {
    ($ty:ty, $db:ty) => {
        // === impl $ty (proxies) ===

        impl $ty {
            fn proxy_row(
                &self,
                r: &<$db as sqlx::Database>::Row,
            ) -> Result<$crate::storage::proxies::ProxyRow, $crate::error::StorageError> {
                use sqlx::Row;
                let name: String = r.try_get("name")?;
                let enc: String = r.try_get("password_enc")?;
                let (password, decrypt_failed) = if enc.is_empty() {
                    (None, false)
                } else {
                    match self
                        .cipher
                        .open(&enc, &$crate::storage::proxies::binding(&name))
                    {
                        Ok(p) => (Some(p), false),
                        Err(_) => (None, true),
                    }
                };
                Ok($crate::storage::proxies::ProxyRow {
                    id: r.try_get("id")?,
                    name,
                    url: r.try_get("url")?,
                    password,
                    decrypt_failed,
                    pool: r.try_get("pool")?,
                    enabled: r.try_get("enabled")?,
                    last_check_at: r.try_get("last_check_at")?,
                    last_check_ok: r.try_get("last_check_ok")?,
                    last_check_ms: r.try_get("last_check_ms")?,
                    last_check_error: r.try_get("last_check_error")?,
                    created_at: r.try_get("created_at")?,
                    updated_at: r.try_get("updated_at")?,
                })
            }

            fn seal_proxy(
                &self,
                p: &$crate::storage::proxies::ProxyWrite,
            ) -> Result<(String, String), $crate::error::StorageError> {
                let mut url = p.url.clone();
                let enc = match url.password.take() {
                    Some(pw) => self
                        .cipher
                        .seal(&pw, &$crate::storage::proxies::binding(&p.name))?,
                    None => String::new(),
                };
                Ok((url.redacted(), enc))
            }
        }

        impl $crate::storage::proxies::ProxyStore for $ty {
            fn list_proxies(
                &self,
            ) -> $crate::storage::StorageFuture<'_, Vec<$crate::storage::proxies::ProxyRow>> {
                Box::pin(async move {
                    let sql = format!(
                        "SELECT {} FROM proxies ORDER BY id",
                        $crate::storage::proxies::PROXY_COLS
                    );
                    let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
                    rows.iter().map(|r| self.proxy_row(r)).collect()
                })
            }

            fn create_proxy<'a>(
                &'a self,
                p: &'a $crate::storage::proxies::ProxyWrite,
            ) -> $crate::storage::StorageFuture<'a, i64> {
                Box::pin(async move {
                    use sqlx::Row;
                    let (url, enc) = self.seal_proxy(p)?;
                    let now = $crate::storage::now_ms_i64();
                    let r = sqlx::query(
                        "INSERT INTO proxies (name, url, password_enc, pool, enabled, \
                         created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $6) \
                         RETURNING id",
                    )
                    .bind(&p.name)
                    .bind(url)
                    .bind(enc)
                    .bind(&p.pool)
                    .bind(p.enabled)
                    .bind(now)
                    .fetch_one(&self.pool)
                    .await?;
                    Ok(r.try_get("id")?)
                })
            }

            fn update_proxy<'a>(
                &'a self,
                id: i64,
                p: &'a $crate::storage::proxies::ProxyWrite,
            ) -> $crate::storage::StorageFuture<'a, bool> {
                Box::pin(async move {
                    let (url, enc) = self.seal_proxy(p)?;
                    let res = sqlx::query(
                        "UPDATE proxies SET name = $1, url = $2, password_enc = $3, pool = $4, \
                         enabled = $5, updated_at = $6 WHERE id = $7",
                    )
                    .bind(&p.name)
                    .bind(url)
                    .bind(enc)
                    .bind(&p.pool)
                    .bind(p.enabled)
                    .bind($crate::storage::now_ms_i64())
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn delete_proxy(&self, id: i64) -> $crate::storage::StorageFuture<'_, bool> {
                Box::pin(async move {
                    let res = sqlx::query("DELETE FROM proxies WHERE id = $1")
                        .bind(id)
                        .execute(&self.pool)
                        .await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn record_proxy_check<'a>(
                &'a self,
                id: i64,
                c: &'a $crate::storage::proxies::ProxyCheck,
            ) -> $crate::storage::StorageFuture<'a, bool> {
                Box::pin(async move {
                    let res = sqlx::query(
                        "UPDATE proxies SET last_check_at = $1, last_check_ok = $2, \
                         last_check_ms = $3, last_check_error = $4 WHERE id = $5",
                    )
                    .bind(c.at)
                    .bind(c.ok)
                    .bind(c.latency_ms)
                    .bind(&c.error)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                    Ok(res.rows_affected() > 0)
                })
            }

            fn list_proxy_assignments(
                &self,
            ) -> $crate::storage::StorageFuture<
                '_,
                Vec<(i64, $crate::storage::proxies::ProxyAssignment)>,
            > {
                Box::pin(async move {
                    use sqlx::Row;
                    let rows = sqlx::query(
                        "SELECT account_id, proxy_id, pool FROM account_proxies \
                         ORDER BY account_id",
                    )
                    .fetch_all(&self.pool)
                    .await?;
                    let mut out = Vec::with_capacity(rows.len());
                    for r in &rows {
                        let id: i64 = r.try_get("account_id")?;
                        let proxy: Option<i64> = r.try_get("proxy_id")?;
                        let pool: Option<String> = r.try_get("pool")?;
                        let a = match (proxy, pool) {
                            (Some(p), _) => $crate::storage::proxies::ProxyAssignment::Proxy(p),
                            (None, Some(p)) => $crate::storage::proxies::ProxyAssignment::Pool(p),
                            (None, None) => $crate::storage::proxies::ProxyAssignment::Direct,
                        };
                        out.push((id, a));
                    }
                    Ok(out)
                })
            }

            fn set_account_proxy<'a>(
                &'a self,
                account_id: i64,
                a: &'a $crate::storage::proxies::ProxyAssignment,
            ) -> $crate::storage::StorageFuture<'a, ()> {
                Box::pin(async move {
                    use $crate::storage::proxies::ProxyAssignment as A;
                    let (proxy, pool) = match a {
                        A::Direct => {
                            sqlx::query("DELETE FROM account_proxies WHERE account_id = $1")
                                .bind(account_id)
                                .execute(&self.pool)
                                .await?;
                            return Ok(());
                        }
                        A::Proxy(p) => (Some(*p), None),
                        A::Pool(p) => (None, Some(p.clone())),
                    };
                    sqlx::query(
                        "INSERT INTO account_proxies (account_id, proxy_id, pool, updated_at) \
                         VALUES ($1, $2, $3, $4) ON CONFLICT (account_id) DO UPDATE SET \
                         proxy_id = excluded.proxy_id, pool = excluded.pool, \
                         updated_at = excluded.updated_at",
                    )
                    .bind(account_id)
                    .bind(proxy)
                    .bind(pool)
                    .bind($crate::storage::now_ms_i64())
                    .execute(&self.pool)
                    .await?;
                    Ok(())
                })
            }
        }
    };
}

pub(super) use impl_proxy_store;
