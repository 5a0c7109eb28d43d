//! The model catalog refresher over real sockets: a mock Codex `/models` serving a different
//! catalog per account (so per plan), recording headers. The merged catalog lands in the
//! shared cell with source `Upstream`; `ETag` / 304; a failed fetch keeps the last good
//! catalog (the embedded one before the first success); a 401 refreshes the token; aliases
//! survive every refresh; the admin API view and refresh-now.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use admin::storage::{AccountUpsert, Storage};
use axum::{
    extract::State,
    http::{HeaderMap, StatusCode, Uri},
    response::{IntoResponse, Response},
    Router,
};
use reqwest::Method as M;
use serde_json::{json, Value};
use shared_state::{
    catalog::{parse_alias, CatalogSource},
    AccountStatus, Secret,
};

use crate::{
    sidecar::{config, Running, WAIT},
    support::{jwt, wait_until, MockOAuth, TestDb, FAR_EXP},
};

// ===== mock Codex `/models` =====

#[derive(Debug, Clone)]
struct Hit {
    path: String,
    query: String,
    authorization: Option<String>,
    account_id: Option<String>,
    originator: Option<String>,
    user_agent: Option<String>,
    version: Option<String>,
    if_none_match: Option<String>,
}

#[derive(Default)]
struct St {
    hits: Vec<Hit>,
    /// Catalog and ETag per `ChatGPT-Account-Id`.
    catalogs: HashMap<String, (Value, String)>,
    /// Every request answers this until cleared.
    forced: Option<(u16, String)>,
    rejected: HashSet<String>,
}

struct MockModels {
    origin: String,
    st: Arc<Mutex<St>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

async fn handler(State(st): State<Arc<Mutex<St>>>, uri: Uri, headers: HeaderMap) -> Response {
    let h = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let hit = Hit {
        path: uri.path().to_owned(),
        query: uri.query().unwrap_or_default().to_owned(),
        authorization: h("authorization"),
        account_id: h("chatgpt-account-id"),
        originator: h("originator"),
        user_agent: h("user-agent"),
        version: h("version"),
        if_none_match: h("if-none-match"),
    };
    let mut s = st.lock().unwrap();
    s.hits.push(hit.clone());
    if let Some((code, body)) = s.forced.clone() {
        return (StatusCode::from_u16(code).unwrap(), body).into_response();
    }
    let token = hit
        .authorization
        .as_deref()
        .and_then(|a| a.strip_prefix("Bearer "))
        .unwrap_or_default();
    if s.rejected.contains(token) {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": {"code": "token_expired"}})),
        )
            .into_response();
    }
    let Some((body, etag)) = hit
        .account_id
        .as_deref()
        .and_then(|a| s.catalogs.get(a).cloned())
    else {
        return (StatusCode::NOT_FOUND, "no catalog").into_response();
    };
    if hit.if_none_match.as_deref() == Some(etag.as_str()) {
        return (StatusCode::NOT_MODIFIED, [("etag", etag)]).into_response();
    }
    (StatusCode::OK, [("etag", etag)], axum::Json(body)).into_response()
}

impl MockModels {
    fn start() -> Self {
        let st = Arc::new(Mutex::new(St::default()));
        let (addr_tx, addr_rx) = std::sync::mpsc::channel::<SocketAddr>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let state = Arc::clone(&st);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(l.local_addr().unwrap()).unwrap();
                let app = Router::new().fallback(handler).with_state(state);
                axum::serve(l, app)
                    .with_graceful_shutdown(async move {
                        let _ = stop_rx.await;
                    })
                    .await
                    .unwrap();
            });
        });
        let addr = addr_rx.recv().unwrap();
        Self {
            origin: format!("http://{addr}"),
            st,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    fn codex_base(&self) -> String {
        format!("{}/backend-api/codex", self.origin)
    }

    fn serve(&self, account: &str, slugs: &[&str], etag: &str) {
        self.st
            .lock()
            .unwrap()
            .catalogs
            .insert(account.to_owned(), (catalog(slugs), etag.to_owned()));
    }

    fn force(&self, v: Option<(u16, &str)>) {
        self.st.lock().unwrap().forced = v.map(|(c, b)| (c, b.to_owned()));
    }

    fn reject(&self, token: &str, on: bool) {
        let mut s = self.st.lock().unwrap();
        if on {
            s.rejected.insert(token.to_owned());
        } else {
            s.rejected.remove(token);
        }
    }

    fn hits(&self) -> Vec<Hit> {
        self.st.lock().unwrap().hits.clone()
    }
}

impl Drop for MockModels {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A Codex `{"models":[...]}` body.
fn catalog(slugs: &[&str]) -> Value {
    let models: Vec<Value> = slugs
        .iter()
        .map(|s| {
            json!({
                "slug": s, "display_name": s, "visibility": "list", "supported_in_api": true,
                "supported_reasoning_levels": [
                    {"effort": "low", "description": "fast"},
                    {"effort": "high", "description": "deep"}
                ],
                "base_instructions": "You are Codex.", "model_messages": {"x": 1}
            })
        })
        .collect();
    json!({ "models": models })
}

async fn seed(s: &dyn Storage, account: &str, plan: &str) -> i64 {
    s.upsert_account(&AccountUpsert {
        chatgpt_account_id: account.into(),
        user_id: format!("user-{account}"),
        email: Some(format!("{account}@x.io")),
        plan_type: Some(plan.into()),
        access_token: Secret::new(jwt(account, "u", "e", plan, FAR_EXP)),
        refresh_token: Secret::new(format!("rt-{account}")),
        id_token: Secret::new(""),
        access_expires_at: Some(FAR_EXP),
        last_refresh_at: None,
    })
    .await
    .unwrap()
    .id
}

fn aliases() -> HashMap<String, shared_state::catalog::ModelAlias> {
    HashMap::from([
        ("fast".to_owned(), parse_alias("gpt-5.5@low")),
        ("big".to_owned(), parse_alias("gpt-pro-max")),
    ])
}

fn slugs(run: &Running) -> Vec<String> {
    let mut v: Vec<String> = run.catalog.load().models.keys().cloned().collect();
    v.sort();
    v
}

async fn refresh_now(run: &Running) -> Value {
    let (status, v) = run
        .req(M::POST, "/api/admin/models/refresh", None, None)
        .await;
    assert_eq!(status, 200, "{v}");
    v
}

#[tokio::test]
async fn refresher_merges_per_plan_catalogs_shortly_after_start() {
    let mock = MockModels::start();
    mock.serve("acc-plus-1", &["gpt-5.5", "gpt-plus-mini"], "\"plus-v1\"");
    mock.serve("acc-plus-2", &["gpt-wrong"], "\"x\"");
    mock.serve("acc-pro", &["gpt-5.5", "gpt-pro-max"], "\"pro-v1\"");
    mock.serve("acc-pro-off", &["gpt-wrong"], "\"x\"");
    mock.serve("acc-team", &["gpt-team-x"], "\"team-v1\"");
    let db = TestDb::sqlite();
    let s = db.open().await;
    let plus = seed(s.as_ref(), "acc-plus-1", "plus").await;
    seed(s.as_ref(), "acc-plus-2", "plus").await;
    let pro = seed(s.as_ref(), "acc-pro", "pro").await;
    let off = seed(s.as_ref(), "acc-pro-off", "pro").await;
    s.set_status(off, AccountStatus::Disabled).await.unwrap();

    let mut cfg = config(&db);
    cfg.upstream_base_url = mock.codex_base();
    cfg.catalog_refresh_interval = Duration::from_secs(3600);
    cfg.model_aliases = aliases();
    let started = Instant::now();
    let run = Running::start(cfg);
    assert!(
        wait_until(WAIT, || async {
            run.catalog.load().source == CatalogSource::Upstream
        })
        .await
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "first refresh soon after start: {:?}",
        started.elapsed()
    );
    assert_eq!(slugs(&run), ["gpt-5.5", "gpt-plus-mini", "gpt-pro-max"]);
    let cat = run.catalog.load_full();
    let fast = cat.resolve("fast").unwrap();
    assert_eq!((fast.slug, fast.effort), ("gpt-5.5", Some("low")));
    assert_eq!(fast.levels, ["low", "high"]);
    assert_eq!(cat.resolve("big").unwrap().slug, "gpt-pro-max");
    let codex = String::from_utf8_lossy(&cat.codex_body);
    assert!(!codex.contains("base_instructions") && !codex.contains("model_messages"));
    assert!(String::from_utf8_lossy(&cat.openai_body).contains("\"big\""));

    // One request per plan, as the first eligible account of each, with the Codex headers.
    let hits = mock.hits();
    let mut asked: Vec<&str> = hits
        .iter()
        .map(|h| h.account_id.as_deref().unwrap())
        .collect();
    asked.sort_unstable();
    assert_eq!(asked, ["acc-plus-1", "acc-pro"]);
    let snap = run.snapshot.load_full();
    for h in &hits {
        let id = if h.account_id.as_deref() == Some("acc-pro") {
            pro
        } else {
            plus
        };
        assert_eq!(h.path, "/backend-api/codex/models");
        assert_eq!(h.query, "client_version=0.171.0");
        assert_eq!(h.version.as_deref(), Some("0.171.0"));
        assert_eq!(
            h.authorization.as_deref(),
            Some(format!("Bearer {}", snap.account(id).unwrap().access_token.expose()).as_str())
        );
        assert_eq!(h.originator.as_deref(), Some(admin::DEFAULT_ORIGINATOR));
        assert_eq!(h.user_agent.as_deref(), Some(admin::DEFAULT_USER_AGENT));
        assert_eq!(h.if_none_match, None);
    }

    let (status, v) = run.req(M::GET, "/api/admin/models", None, None).await;
    assert_eq!(status, 200);
    assert_eq!(v["source"], "upstream");
    assert_eq!(
        v["slugs"],
        json!(["gpt-5.5", "gpt-plus-mini", "gpt-pro-max"])
    );
    assert_eq!(
        v["aliases"]["fast"],
        json!({"target": "gpt-5.5", "effort": "low"})
    );
    assert_eq!(v["aliases"]["big"]["effort"], Value::Null);
    assert_eq!(v["plans"]["plus"]["account_id"], plus);
    assert_eq!(v["plans"]["plus"]["etag"], "\"plus-v1\"");
    assert_eq!(v["plans"]["pro"]["models"], 2);
    assert_eq!(v["refresh_interval_s"], 3600);

    // A new plan joins without waiting for the interval.
    seed(s.as_ref(), "acc-team", "team").await;
    assert!(
        wait_until(WAIT, || async {
            run.catalog.load().models.contains_key("gpt-team-x")
        })
        .await,
        "a new plan triggers a refresh"
    );
    let cat = run.catalog.load_full();
    assert_eq!(cat.models.len(), 4);
    assert_eq!(cat.aliases, aliases(), "aliases survive the refresh");
}

#[tokio::test]
async fn etag_304_and_failures_keep_the_last_good_catalog() {
    let mock = MockModels::start();
    mock.serve("acc-plus", &["gpt-5.5", "gpt-plus-mini"], "\"plus-v1\"");
    mock.serve("acc-pro", &["gpt-pro-max"], "\"pro-v1\"");
    let db = TestDb::sqlite();
    let s = db.open().await;
    seed(s.as_ref(), "acc-plus", "plus").await;
    seed(s.as_ref(), "acc-pro", "pro").await;
    let mut cfg = config(&db);
    cfg.upstream_base_url = mock.codex_base();
    cfg.catalog_refresh_interval = Duration::ZERO; // on request only
    cfg.model_aliases = aliases();
    let run = Running::start(cfg);

    // Embedded until the first refresh, with the configured aliases applied.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(mock.hits().is_empty(), "interval 0: no background refresh");
    let cat = run.catalog.load_full();
    assert_eq!(cat.source, CatalogSource::Embedded);
    assert_eq!(cat.resolve("fast").unwrap().effort, Some("low"));

    let v = refresh_now(&run).await;
    assert_eq!(
        v["outcome"],
        json!({"plans": 2, "fetched": 2, "not_modified": 0, "failed": 0, "published": true})
    );
    assert_eq!(v["source"], "upstream");
    assert_eq!(slugs(&run), ["gpt-5.5", "gpt-plus-mini", "gpt-pro-max"]);
    let first = run.catalog.load_full();

    // Unchanged upstream: If-None-Match with the last ETag, 304, nothing republished.
    let v = refresh_now(&run).await;
    assert_eq!(v["outcome"]["not_modified"], 2);
    assert_eq!(v["outcome"]["published"], false);
    assert!(Arc::ptr_eq(&first, &run.catalog.load_full()));
    let hits = mock.hits();
    let inm: HashMap<&str, Option<&str>> = hits[2..]
        .iter()
        .map(|h| (h.account_id.as_deref().unwrap(), h.if_none_match.as_deref()))
        .collect();
    assert_eq!(inm["acc-plus"], Some("\"plus-v1\""));
    assert_eq!(inm["acc-pro"], Some("\"pro-v1\""));

    // One plan changes: a 200 for it, a 304 for the other, merged again.
    mock.serve("acc-plus", &["gpt-5.5", "gpt-plus-new"], "\"plus-v2\"");
    let v = refresh_now(&run).await;
    assert_eq!(v["outcome"]["fetched"], 1);
    assert_eq!(v["outcome"]["not_modified"], 1);
    assert_eq!(v["outcome"]["published"], true);
    assert_eq!(slugs(&run), ["gpt-5.5", "gpt-plus-new", "gpt-pro-max"]);
    assert_eq!(run.catalog.load().aliases, aliases(), "aliases re-applied");
    assert_eq!(v["plans"]["plus"]["etag"], "\"plus-v2\"");
    let good = run.catalog.load_full();

    // Upstream errors and a body that is not a catalog keep the last good catalog.
    for (code, body) in [(500, "boom"), (200, "{\"oops\":1}")] {
        mock.force(Some((code, body)));
        let v = refresh_now(&run).await;
        assert_eq!(v["outcome"]["failed"], 2, "{code}");
        assert_eq!(v["outcome"]["published"], false);
        assert_eq!(v["source"], "upstream");
        assert!(v["plans"]["plus"]["error"]
            .as_str()
            .unwrap()
            .contains(if code == 500 {
                "HTTP 500"
            } else {
                "unexpected /models body"
            }));
        assert!(Arc::ptr_eq(&good, &run.catalog.load_full()));
    }
    mock.force(None);
    let v = refresh_now(&run).await;
    assert_eq!(v["outcome"]["failed"], 0);
    assert_eq!(v["plans"]["plus"]["error"], Value::Null);
}

#[tokio::test]
async fn failed_first_fetch_keeps_embedded_and_401_refreshes_the_token() {
    let oauth = MockOAuth::start();
    oauth.add_rt("rt-acc-a", "acc-a", "user-acc-a", "a@x", "plus");
    let mock = MockModels::start();
    mock.serve("acc-a", &["gpt-plus-mini"], "\"a1\"");
    let db = TestDb::sqlite();
    let s = db.open().await;
    let id = seed(s.as_ref(), "acc-a", "plus").await;
    let mut cfg = config(&db);
    cfg.upstream_base_url = mock.codex_base();
    cfg.oauth_token_url = oauth.url.clone();
    cfg.catalog_refresh_interval = Duration::ZERO;
    let run = Running::start(cfg);

    mock.force(Some((503, "unavailable")));
    let v = refresh_now(&run).await;
    assert_eq!(v["outcome"]["failed"], 1);
    assert_eq!(v["source"], "embedded");
    let cat = run.catalog.load_full();
    assert_eq!(cat.source, CatalogSource::Embedded);
    assert!(cat.models.contains_key("gpt-5.5"), "embedded catalog kept");
    mock.force(None);

    // 401: the account goes to the token refresh; the catalog stays embedded meanwhile.
    let old = run
        .snapshot
        .load()
        .account(id)
        .unwrap()
        .access_token
        .clone();
    mock.reject(old.expose(), true);
    let v = refresh_now(&run).await;
    assert_eq!(v["outcome"]["failed"], 1);
    assert!(v["plans"]["plus"]["error"]
        .as_str()
        .unwrap()
        .contains("401"));
    assert_eq!(run.catalog.load().source, CatalogSource::Embedded);
    assert!(
        wait_until(WAIT, || async {
            run.snapshot.load().account(id).unwrap().access_token != old
        })
        .await,
        "token refreshed and republished"
    );
    assert_eq!(oauth.calls(), 1);

    let v = refresh_now(&run).await;
    assert_eq!(v["outcome"]["fetched"], 1);
    assert_eq!(v["source"], "upstream");
    assert_eq!(slugs(&run), ["gpt-plus-mini"]);
    let last = mock.hits().pop().unwrap();
    assert_ne!(
        last.authorization.as_deref(),
        Some(format!("Bearer {}", old.expose()).as_str())
    );
}
