//! The sidecar end to end: spawn, snapshot publishing, /healthz and the admin API over a real
//! socket, event persistence, single-flight refresh, Redis leases, startup errors.

use std::{sync::Arc, time::Duration};

use admin::{
    lease::RedisLeases,
    storage::{AccountUpsert, Storage},
    SidecarConfig, SidecarError, SidecarHandle, SidecarShared,
};
use serde_json::{json, Value};
use shared_state::{
    channels, AccountEffect, AccountStatus, EventSender, Health, ModelCatalog, Secret,
    SharedCatalog, SharedSnapshot, Snapshot, UsageRecord, WorkerCommand, WorkerEvent,
    WorkerMailbox,
};

use crate::support::{both_backends, jwt, redis_url, wait_until, MockOAuth, TestDb, FAR_EXP};

pub const WAIT: Duration = Duration::from_secs(10);

pub struct Running {
    handle: Option<SidecarHandle>,
    pub snapshot: SharedSnapshot,
    pub health: Arc<Health>,
    pub catalog: SharedCatalog,
    tx: EventSender,
    pub boxes: Vec<WorkerMailbox>,
    pub base: String,
    http: reqwest::Client,
    /// The configured static admin token, sent by [`Running::req`] when it is given none.
    token: Option<String>,
}

/// The static admin token [`config`] configures.
pub const TEST_ADMIN_TOKEN: &str = "test-admin-token";

impl Running {
    pub fn start(cfg: SidecarConfig) -> Self {
        Self::try_start(cfg).expect("spawn")
    }

    pub fn try_start(cfg: SidecarConfig) -> Result<Self, SidecarError> {
        let token = cfg.admin_token.as_ref().map(|t| t.expose().to_owned());
        let snapshot = Snapshot::shared();
        let health = Arc::new(Health::default());
        let (tx, events) = channels::events();
        let (mailboxes, boxes) = channels::mailboxes(1);
        let catalog = ModelCatalog::embedded(Default::default()).shared();
        let handle = admin::spawn(
            cfg,
            SidecarShared {
                snapshot: Arc::clone(&snapshot),
                health: Arc::clone(&health),
                events,
                mailboxes,
                catalog: Arc::clone(&catalog),
            },
        )?;
        let base = format!("http://{}", handle.admin_addr);
        Ok(Self {
            handle: Some(handle),
            snapshot,
            health,
            catalog,
            tx,
            boxes,
            base,
            http: reqwest::Client::new(),
            token,
        })
    }

    pub fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.shutdown();
        }
    }

    /// An admin API request with `token` (the configured static admin token when `None`);
    /// mutations always carry `Content-Type: application/json`.
    pub async fn req(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let token = token.or(self.token.as_deref());
        self.http_req(method, path, token, body).await
    }

    /// An admin API request without credentials.
    pub async fn req_anon(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.http_req(method, path, None, body).await
    }

    async fn http_req(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mutation = method != reqwest::Method::GET;
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        if let Some(b) = body {
            r = r.json(&b);
        } else if mutation {
            r = r.header("content-type", "application/json");
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let v = resp.json::<Value>().await.unwrap_or(Value::Null);
        (status, v)
    }

    pub fn version(&self) -> u64 {
        self.snapshot.load().version
    }

    pub fn send(&self, ev: WorkerEvent) {
        self.tx.try_send(ev).unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn config(db: &TestDb) -> SidecarConfig {
    let mut cfg = SidecarConfig::new(db.target(), "127.0.0.1:0".parse().unwrap());
    cfg.reload_interval = Duration::from_millis(200);
    cfg.oauth_token_url = "http://127.0.0.1:9/oauth/token".into();
    cfg.quota_poll_interval = Duration::ZERO;
    cfg.catalog_refresh_interval = Duration::ZERO;
    cfg.admin_token = Some(Secret::new(TEST_ADMIN_TOKEN));
    cfg
}

pub async fn seed_account(s: &dyn Storage, account: &str, rt: &str) -> i64 {
    s.upsert_account(&AccountUpsert {
        chatgpt_account_id: account.into(),
        user_id: format!("user-{account}"),
        email: Some(format!("{account}@x.io")),
        plan_type: Some("plus".into()),
        access_token: Secret::new(jwt(account, "u", "e", "plus", FAR_EXP)),
        refresh_token: Secret::new(rt),
        id_token: Secret::new(""),
        access_expires_at: Some(FAR_EXP),
        last_refresh_at: None,
    })
    .await
    .unwrap()
    .id
}

pub fn usage(i: u64) -> UsageRecord {
    UsageRecord {
        key_id: 1,
        account_id: Some(1),
        route: "chat.completions",
        model: "gpt-5".into(),
        status: 200,
        stream: true,
        input_tokens: i,
        cached_tokens: 0,
        output_tokens: i,
        reasoning_tokens: 0,
        ttfb_ms: Some(5),
        latency_ms: 10,
        error_code: None,
        started_at_ms: 1_700_000_000_000,
        ..Default::default()
    }
}

async fn spawn_publishes_snapshot_and_serves_healthz(db: &TestDb) {
    let s = db.open().await;
    let id = seed_account(s.as_ref(), "acc-s", "rt").await;
    let (plain, _) = admin::cli::create_key(s.as_ref(), "k").await.unwrap();
    s.close().await.unwrap();

    let mut cfg = config(db);
    cfg.settings.max_attempts = 7;
    let mut run = Running::start(cfg);
    // spawn() returned => the first snapshot is already published.
    let snap = run.snapshot.load_full();
    assert!(snap.version >= 1);
    assert_eq!(snap.settings.max_attempts, 7);
    assert_eq!(snap.account(id).unwrap().label, "acc-s@x.io");
    assert!(snap
        .account(id)
        .unwrap()
        .is_schedulable(shared_state::now_ms()));
    assert!(snap.key(&plain).is_some());
    assert!(run.health.storage_up());

    let (st, body) = run.req(reqwest::Method::GET, "/healthz", None, None).await;
    assert_eq!((st, body), (200, json!({"status": "ok"})));
    // The admin API is closed: anonymous requests are refused.
    let (st, body) = run
        .req_anon(reqwest::Method::GET, "/api/admin/accounts", None)
        .await;
    assert_eq!(st, 401, "{body}");
    assert_eq!(body["error"]["type"], "authentication_error");
    let (st, body) = run
        .req(reqwest::Method::GET, "/api/admin/accounts", None, None)
        .await;
    assert_eq!(st, 200);
    assert_eq!(body["data"][0]["id"], id);
    assert!(!body.to_string().contains("token_enc"));
    run.stop();
    // The port is released after shutdown.
    assert!(reqwest::get(format!("{}/healthz", run.base)).await.is_err());
}

async fn events_are_persisted_and_flushed_on_shutdown(db: &TestDb) {
    let s = db.open().await;
    let id = seed_account(s.as_ref(), "acc-ev", "rt").await;
    let mut run = Running::start(config(db));
    let v0 = run.version();
    for i in 0..250 {
        run.send(WorkerEvent::Usage(Box::new(usage(i))));
    }
    run.send(WorkerEvent::Account {
        account_id: id,
        effect: AccountEffect::quota(Some(55.0), Some(1_900_000_000), None, None),
    });
    run.send(WorkerEvent::Account {
        account_id: id,
        effect: AccountEffect::CooldownUntil {
            until_ms: 4_000_000_000_000,
            reason: "usage_limit_reached".into(),
        },
    });
    assert!(wait_until(WAIT, || async { s.usage_count().await.unwrap() == 250 }).await);
    assert!(
        wait_until(WAIT, || async {
            let r = s.get_account(id).await.unwrap().unwrap().0;
            r.primary_used_pct == Some(55.0) && r.cooldown_until_ms == 4_000_000_000_000
        })
        .await
    );
    // A status effect is persisted and republished.
    run.send(WorkerEvent::Account {
        account_id: id,
        effect: AccountEffect::Status(AccountStatus::Banned),
    });
    assert!(
        wait_until(WAIT, || async {
            run.snapshot.load().account(id).map(|a| a.status) == Some(AccountStatus::Banned)
        })
        .await
    );
    assert!(run.version() > v0);
    assert_eq!(
        s.get_account(id).await.unwrap().unwrap().0.status,
        AccountStatus::Banned
    );

    // Events sent right before shutdown are flushed by it.
    for i in 0..100 {
        run.send(WorkerEvent::Usage(Box::new(usage(1000 + i))));
    }
    run.stop();
    assert_eq!(s.usage_count().await.unwrap(), 350);
}

async fn admin_api_auth_and_mutations(db: &TestDb) {
    let s = db.open().await;
    let id = seed_account(s.as_ref(), "acc-api", "rt").await;
    let mut cfg = config(db);
    cfg.admin_token = Some(Secret::new("admin-secret"));
    cfg.reload_interval = Duration::from_secs(3600); // mutations must republish by themselves
    let run = Running::start(cfg);
    let tok = Some("admin-secret");
    use reqwest::Method as M;

    // Auth.
    let (st, body) = run.req_anon(M::GET, "/api/admin/accounts", None).await;
    assert_eq!(st, 401);
    assert_eq!(body["error"]["type"], "authentication_error");
    assert!(body["error"]["message"].is_string() && body["error"]["code"].is_string());
    let (st, _) = run
        .req(M::GET, "/api/admin/accounts", Some("wrong"), None)
        .await;
    assert_eq!(st, 401);
    let (st, _) = run.req_anon(M::GET, "/healthz", None).await;
    assert_eq!(st, 200, "healthz is never behind the admin token");

    // Accounts.
    let (st, body) = run.req(M::GET, "/api/admin/accounts", tok, None).await;
    assert_eq!(st, 200);
    let a = &body["data"][0];
    assert_eq!(a["id"], id);
    assert_eq!(a["chatgpt_account_id"], "acc-api");
    assert_eq!(a["email"], "acc-api@x.io");
    assert_eq!(a["plan"], "plus");
    assert_eq!(a["status"], "active");
    assert_eq!(a["in_flight"], 0);
    assert!(
        a.get("access_token").is_none() && !body.to_string().contains("eyJ"),
        "no tokens"
    );
    let live = Arc::clone(&run.snapshot.load().account(id).unwrap().live);
    let _lease = live.try_acquire(0).unwrap();
    let (_, body) = run.req(M::GET, "/api/admin/accounts", tok, None).await;
    assert_eq!(body["data"][0]["in_flight"], 1);

    let (st, body) = run
        .req(
            M::POST,
            &format!("/api/admin/accounts/{id}/disable"),
            tok,
            None,
        )
        .await;
    assert_eq!((st, body["status"].as_str()), (200, Some("disabled")));
    assert_eq!(
        run.snapshot.load().account(id).unwrap().status,
        AccountStatus::Disabled
    );
    let mut saw_evict = false;
    while let Ok(Some(cmd)) =
        tokio::time::timeout(Duration::from_millis(200), run.boxes[0].recv()).await
    {
        saw_evict |= cmd == WorkerCommand::EvictAccount { account_id: id };
    }
    assert!(saw_evict, "disable evicts the account's pooled sockets");
    live.apply(&AccountEffect::cooldown(u64::MAX / 2, "test"));
    let (st, body) = run
        .req(
            M::POST,
            &format!("/api/admin/accounts/{id}/enable"),
            tok,
            None,
        )
        .await;
    assert_eq!((st, body["status"].as_str()), (200, Some("active")));
    assert!(
        body["cooldown_until"].is_null(),
        "enable clears the cooldown"
    );
    assert!(run
        .snapshot
        .load()
        .account(id)
        .unwrap()
        .is_schedulable(shared_state::now_ms()));
    assert!(Arc::ptr_eq(
        &live,
        &run.snapshot.load().account(id).unwrap().live
    ));

    let (st, body) = run
        .req(
            M::PATCH,
            &format!("/api/admin/accounts/{id}"),
            tok,
            Some(json!({"weight": 4, "max_concurrency": 2})),
        )
        .await;
    assert_eq!(
        (
            st,
            body["weight"].as_u64(),
            body["max_concurrency"].as_u64()
        ),
        (200, Some(4), Some(2))
    );
    assert_eq!(run.snapshot.load().account(id).unwrap().weight, 4);
    let (st, body) = run
        .req(
            M::PATCH,
            &format!("/api/admin/accounts/{id}"),
            tok,
            Some(json!({"weight": 0})),
        )
        .await;
    assert_eq!(
        (st, body["error"]["type"].as_str()),
        (400, Some("invalid_request_error"))
    );

    let (st, body) = run
        .req(M::POST, "/api/admin/accounts/9999/disable", tok, None)
        .await;
    assert_eq!(
        (st, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (st, _) = run
        .req(M::POST, "/api/admin/accounts/abc/disable", tok, None)
        .await;
    assert_eq!(st, 400);
    let (st, body) = run.req(M::GET, "/api/admin/nope", tok, None).await;
    assert_eq!(
        (st, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );

    // Keys.
    let (st, body) = run
        .req(M::POST, "/api/admin/keys", tok, Some(json!({"name": "ci"})))
        .await;
    assert_eq!(st, 200);
    let key = body["key"].as_str().unwrap().to_owned();
    let key_id = body["id"].as_i64().unwrap();
    assert!(key.starts_with("sk-cg-"));
    assert_eq!(
        run.snapshot.load().key(&key).map(|k| k.id),
        Some(key_id),
        "published at once"
    );
    let (st, body) = run.req(M::GET, "/api/admin/keys", tok, None).await;
    assert_eq!(st, 200);
    assert_eq!(body["data"][0]["key_prefix"], &key[..10]);
    assert!(
        !body.to_string().contains(&key),
        "the key is shown only once"
    );
    let (st, _) = run
        .req(M::POST, "/api/admin/keys", tok, Some(json!({"name": ""})))
        .await;
    assert_eq!(st, 400);
    let (st, body) = run
        .req(M::POST, "/api/admin/keys", tok, Some(json!("oops")))
        .await;
    assert_eq!(
        (st, body["error"]["type"].as_str()),
        (400, Some("invalid_request_error"))
    );
    let (st, _) = run
        .req(M::DELETE, &format!("/api/admin/keys/{key_id}"), tok, None)
        .await;
    assert_eq!(st, 200);
    assert!(
        run.snapshot.load().key(&key).is_none(),
        "revocation published at once"
    );
    let (st, _) = run
        .req(M::DELETE, &format!("/api/admin/keys/{key_id}"), tok, None)
        .await;
    assert_eq!(st, 404);

    // Delete the account.
    let (st, body) = run
        .req(M::DELETE, &format!("/api/admin/accounts/{id}"), tok, None)
        .await;
    assert_eq!((st, body["deleted"].as_bool()), (200, Some(true)));
    assert!(run.snapshot.load().account(id).is_none());
    assert!(s.get_account(id).await.unwrap().is_none());
}

async fn reload_picks_up_changes_from_other_processes(db: &TestDb) {
    let run = Running::start(config(db));
    assert!(run.snapshot.load().accounts.is_empty());
    let v = run.version();
    // Another process (the CLI, another instance) writes to the same database.
    let s = db.open().await;
    let id = seed_account(s.as_ref(), "acc-other", "rt").await;
    assert!(wait_until(WAIT, || async { run.snapshot.load().account(id).is_some() }).await);
    let v2 = run.version();
    assert!(v2 > v);
    // Nothing changes => no new versions.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(run.version(), v2);
}

async fn settings_and_usage_api(db: &TestDb) {
    use shared_state::snapshot::Strategy;
    let s = db.open().await;
    let id = seed_account(s.as_ref(), "acc-set", "rt").await;
    let (_, key) = admin::cli::create_key(s.as_ref(), "team-a").await.unwrap();
    let mut cfg = config(db);
    cfg.settings.max_attempts = 5;
    cfg.reload_interval = Duration::from_secs(3600); // changes must republish by themselves
    let mut run = Running::start(cfg.clone());
    use reqwest::Method as M;

    let (st, body) = run.req(M::GET, "/api/admin/settings", None, None).await;
    assert_eq!(st, 200);
    assert_eq!(body["object"], "settings");
    assert_eq!(body["max_attempts"], 5, "the config is the default");
    assert_eq!(body["strategy"], "smart");
    assert_eq!(body["defaults"]["max_attempts"], 5);
    assert_eq!(body["overridden"], json!([]));

    let v0 = run.version();
    let (st, body) = run
        .req(
            M::PUT,
            "/api/admin/settings",
            None,
            Some(json!({"max_attempts": 9, "strategy": "fill_first",
                        "pause_threshold_pct": 90, "default_max_concurrency": 3})),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["max_attempts"], 9);
    assert_eq!(body["pause_threshold_pct"], 90.0);
    assert_eq!(body["defaults"]["max_attempts"], 5);
    let snap = run.snapshot.load_full();
    assert!(snap.version > v0, "republished at once");
    assert_eq!(snap.settings.max_attempts, 9);
    assert_eq!(snap.settings.strategy, Strategy::FillFirst);
    assert_eq!(snap.settings.pause_threshold_pct, Some(90.0));
    assert_eq!(
        snap.account(id).unwrap().max_concurrency,
        3,
        "the default concurrency applies to accounts without their own"
    );

    // Validation: OpenAI-shaped 400s, nothing written.
    for bad in [
        json!({"max_attempts": 0}),
        json!({"max_attempts": "many"}),
        json!({"strategy": "weighted"}),
        json!({"pause_threshold_pct": 250}),
        json!({"max_attempts": 4, "bogus": 1}),
        json!({}),
        json!([1, 2]),
    ] {
        let (st, body) = run
            .req(M::PUT, "/api/admin/settings", None, Some(bad.clone()))
            .await;
        assert_eq!(st, 400, "{bad}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{bad}");
        assert!(body["error"]["message"].is_string());
    }
    assert_eq!(run.snapshot.load().settings.max_attempts, 9);

    // GET round-trips through PUT; null resets to the configured value.
    let (_, view) = run.req(M::GET, "/api/admin/settings", None, None).await;
    let (st, _) = run
        .req(M::PUT, "/api/admin/settings", None, Some(view))
        .await;
    assert_eq!(st, 200);
    let (st, body) = run
        .req(
            M::PUT,
            "/api/admin/settings",
            None,
            Some(json!({"max_attempts": null})),
        )
        .await;
    assert_eq!((st, body["max_attempts"].as_u64()), (200, Some(5)));
    assert_eq!(run.snapshot.load().settings.max_attempts, 5);
    let mut overridden: Vec<String> = serde_json::from_value(body["overridden"].clone()).unwrap();
    overridden.sort();
    assert_eq!(
        overridden,
        [
            "audit_retention_days",
            "auth_dir_write_back",
            "auto_clean_action",
            "default_max_concurrency",
            "front_door_burst",
            "front_door_rps",
            "ip_allow_list",
            "max_wait_for_account_ms",
            "min_request_interval_ms",
            "pause_threshold_pct",
            "per_ip_burst",
            "per_ip_rps",
            "service_tier",
            "strategy"
        ]
    );

    // Usage totals by key and by account.
    let key_id = s.list_keys().await.unwrap()[0].id;
    let _ = key;
    let mut records = Vec::new();
    for i in 0..4u64 {
        let mut r = usage(i);
        r.key_id = key_id;
        r.account_id = Some(id);
        r.status = if i == 3 { 502 } else { 200 };
        r.started_at_ms = 1_000 * (i + 1);
        records.push(r);
    }
    s.insert_usage(&records).await.unwrap();
    let (st, body) = run.req(M::GET, "/api/admin/usage", None, None).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["object"], "usage");
    assert_eq!(body["totals"]["requests"], 4);
    assert_eq!(body["totals"]["input_tokens"], 6);
    assert_eq!(body["totals"]["output_tokens"], 6);
    assert_eq!(body["totals"]["errors"], 1);
    assert_eq!(body["by_key"][0]["key_id"], key_id);
    assert_eq!(body["by_key"][0]["name"], "team-a");
    assert_eq!(body["by_account"][0]["account_id"], id);
    assert_eq!(body["by_account"][0]["label"], "acc-set@x.io");
    let (st, body) = run
        .req(
            M::GET,
            &format!("/api/admin/usage?since_ms=2500&key_id={key_id}&account_id={id}"),
            None,
            None,
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(body["totals"]["requests"], 2);
    assert_eq!(body["filter"]["since_ms"], 2500);
    let (st, body) = run
        .req(M::GET, "/api/admin/usage?key_id=abc", None, None)
        .await;
    assert_eq!(
        (st, body["error"]["type"].as_str()),
        (400, Some("invalid_request_error"))
    );

    // Stored overrides survive a restart (the config stays the default).
    run.stop();
    let run = Running::start(cfg);
    let snap = run.snapshot.load_full();
    assert_eq!(snap.settings.max_attempts, 5);
    assert_eq!(snap.settings.strategy, Strategy::FillFirst);
    assert_eq!(snap.settings.default_max_concurrency, 3);
}

/// A record with text PostgreSQL cannot store (a NUL in a client-chosen model name) does not
/// stall usage: it is stored (the NUL replaced) with the records around it.
async fn unstorable_text_does_not_stall_usage(db: &TestDb) {
    let s = db.open().await;
    let mut run = Running::start(config(db));
    let mut bad = usage(1);
    bad.model = "gpt\0-5".into();
    bad.error_code = Some("x\0y".into());
    run.send(WorkerEvent::Usage(Box::new(bad)));
    for i in 0..10 {
        run.send(WorkerEvent::Usage(Box::new(usage(i))));
    }
    assert!(wait_until(WAIT, || async { s.usage_count().await.unwrap() == 11 }).await);
    run.stop();
}

/// A failure the data plane decided just before an operator enabled the account (its cooldown
/// still queued for the control loop, which persists effects up to 10 ms later) does not land
/// after the enable and undo it: the enable waits for the effects queued before it.
async fn an_enable_is_not_undone_by_a_failure_queued_before_it(db: &TestDb) {
    let s = db.open().await;
    let id = seed_account(s.as_ref(), "acc-settle", "rt").await;
    let run = Running::start(config(db));
    assert!(wait_until(WAIT, || async { run.snapshot.load().account(id).is_some() }).await);
    const FAR: u64 = 4_000_000_000_000;
    for round in 0..5 {
        // An intake now, so the cooldown below waits for the next one.
        run.send(WorkerEvent::Account {
            account_id: id,
            effect: AccountEffect::quota(Some(10.0 + f64::from(round)), None, None, None),
        });
        tokio::time::sleep(Duration::from_millis(2)).await;
        run.send(WorkerEvent::Account {
            account_id: id,
            effect: AccountEffect::CooldownUntil {
                until_ms: FAR,
                reason: "server_error".into(),
            },
        });
        let path = if round % 2 == 0 {
            format!("/api/admin/accounts/{id}/enable")
        } else {
            format!("/api/admin/accounts/{id}/reset-health")
        };
        let (st, body) = run.req(reqwest::Method::POST, &path, None, None).await;
        assert_eq!(st, 200, "{path}: {body}");
        // Past the control loop's intake and flush: nothing queued before the enable may
        // change it afterwards.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let row = s.get_account(id).await.unwrap().unwrap().0;
        assert_eq!(
            row.cooldown_until_ms, 0,
            "round {round} ({path}): stored cooldown"
        );
        let live = run
            .snapshot
            .load()
            .account(id)
            .unwrap()
            .live
            .cooldown_until_ms();
        assert_eq!(live, 0, "round {round} ({path}): live cooldown");
    }
}

both_backends!(
    an_enable_is_not_undone_by_a_failure_queued_before_it,
    unstorable_text_does_not_stall_usage,
    settings_and_usage_api,
    spawn_publishes_snapshot_and_serves_healthz,
    events_are_persisted_and_flushed_on_shutdown,
    admin_api_auth_and_mutations,
    reload_picks_up_changes_from_other_processes,
    admin_credential_bootstrap,
);

/// No credential at all: a password is generated and stored (by Argon2id hash only) and the
/// API stays closed; a configured password replaces it; a non-loopback admin listener is
/// refused while the operator set no credential.
async fn admin_credential_bootstrap(db: &TestDb) {
    use reqwest::Method as M;
    let mut cfg = config(db);
    cfg.admin_token = None;
    // Refused before anything listens: 0.0.0.0 without a credential.
    let mut open = cfg.clone();
    open.admin_listen = "0.0.0.0:0".parse().unwrap();
    match Running::try_start(open) {
        Err(SidecarError::AdminAuth(e)) => {
            assert!(
                e.to_string().contains("CODEX_GATEWAY_ADMIN_PASSWORD"),
                "{e}"
            )
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a non-loopback admin listener without a credential must be refused"),
    }
    let s = db.open().await;
    assert_eq!(s.admin_password_hash().await.unwrap(), None);

    // Loopback, no credential: generated, stored hashed, API closed.
    let mut run = Running::start(cfg.clone());
    let hash = s
        .admin_password_hash()
        .await
        .unwrap()
        .expect("a generated password");
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    let (st, _) = run.req_anon(M::GET, "/api/admin/accounts", None).await;
    assert_eq!(st, 401);
    let (st, body) = run
        .req_anon(
            M::POST,
            "/api/admin/login",
            Some(json!({"password": "guess"})),
        )
        .await;
    assert_eq!(
        (st, body["error"]["code"].as_str()),
        (401, Some("invalid_password"))
    );
    run.stop();
    // A restart keeps the stored password (nothing new generated).
    let mut run = Running::start(cfg.clone());
    assert_eq!(
        s.admin_password_hash().await.unwrap().as_deref(),
        Some(hash.as_str())
    );
    run.stop();

    // A configured password replaces it and logs in.
    let mut with_pw = cfg.clone();
    with_pw.admin_password = Some(Secret::new("hunter2-but-longer"));
    let mut run = Running::start(with_pw.clone());
    let (st, body) = run
        .req_anon(
            M::POST,
            "/api/admin/login",
            Some(json!({"password": "hunter2-but-longer"})),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    run.stop();
    assert_ne!(
        s.admin_password_hash().await.unwrap().as_deref(),
        Some(hash.as_str())
    );

    // Once the operator set a credential, a non-loopback listener is allowed.
    let mut open = with_pw;
    open.admin_listen = "0.0.0.0:0".parse().unwrap();
    let mut run = Running::try_start(open).expect("allowed with a credential");
    run.stop();
    s.close().await.unwrap();
}

#[tokio::test]
async fn refresh_request_rotates_tokens_single_flight() {
    let mock = MockOAuth::start();
    mock.add_rt("rt-0", "acc-r", "user-r", "r@x", "pro");
    let db = TestDb::sqlite();
    let s = db.open().await;
    let id = seed_account(s.as_ref(), "acc-r", "rt-0").await;
    let mut cfg = config(&db);
    cfg.oauth_token_url = mock.url.clone();
    let run = Running::start(cfg);
    let old_at = run
        .snapshot
        .load()
        .account(id)
        .unwrap()
        .access_token
        .clone();
    let seen = run.version();
    // A burst of requests for the same token => one refresh.
    for _ in 0..5 {
        run.send(WorkerEvent::RefreshRequest {
            account_id: id,
            seen_version: seen,
        });
    }
    assert!(
        wait_until(WAIT, || async {
            run.snapshot
                .load()
                .account(id)
                .map(|a| a.access_token != old_at)
                .unwrap_or(false)
        })
        .await,
        "a new access token is published"
    );
    let (row, sec) = s.get_account(id).await.unwrap().unwrap();
    assert_eq!(
        Some(sec.refresh_token.expose().to_owned()),
        mock.current_rt("acc-r"),
        "rotated RT persisted"
    );
    assert_eq!(
        sec.access_token,
        run.snapshot.load().account(id).unwrap().access_token,
        "persisted before published"
    );
    assert!(row.last_refresh_at.is_some());
    assert_eq!(row.plan_type.as_deref(), Some("pro"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mock.calls(), 1, "coalesced");

    // A stale request (seen before the refresh) is skipped.
    run.send(WorkerEvent::RefreshRequest {
        account_id: id,
        seen_version: seen,
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(mock.calls(), 1, "stale request skipped");

    // A request that saw the new token refreshes again; a response without refresh_token
    // keeps the stored one.
    mock.omit_refresh_token(true);
    let rt_before = s.get_account(id).await.unwrap().unwrap().1.refresh_token;
    let at_before = run
        .snapshot
        .load()
        .account(id)
        .unwrap()
        .access_token
        .clone();
    run.send(WorkerEvent::RefreshRequest {
        account_id: id,
        seen_version: run.version(),
    });
    assert!(wait_until(WAIT, || async { mock.calls() == 2 }).await);
    assert!(
        wait_until(WAIT, || async {
            run.snapshot
                .load()
                .account(id)
                .map(|a| a.access_token != at_before)
                .unwrap_or(false)
        })
        .await
    );
    assert_eq!(
        s.get_account(id).await.unwrap().unwrap().1.refresh_token,
        rt_before
    );

    // An operator can start a refresh from the admin API.
    mock.omit_refresh_token(false);
    let (st, body) = run
        .req(
            reqwest::Method::POST,
            &format!("/api/admin/accounts/{id}/refresh"),
            None,
            None,
        )
        .await;
    assert_eq!(st, 202, "{body}");
    assert!(wait_until(WAIT, || async { mock.calls() == 3 }).await);
    let (st, _) = run
        .req(
            reqwest::Method::POST,
            "/api/admin/accounts/999/refresh",
            None,
            None,
        )
        .await;
    assert_eq!(st, 404);
}

#[tokio::test]
async fn refresh_terminal_error_marks_reauth_required() {
    let mock = MockOAuth::start();
    let db = TestDb::sqlite();
    let s = db.open().await;
    let id = seed_account(s.as_ref(), "acc-dead", "rt-dead").await;
    let id2 = seed_account(s.as_ref(), "acc-ban", "rt-ban").await;
    let mut cfg = config(&db);
    cfg.oauth_token_url = mock.url.clone();
    let run = Running::start(cfg);
    mock.force(Some((
        400,
        r#"{"error":{"code":"refresh_token_reused","message":"already used"}}"#,
    )));
    run.send(WorkerEvent::RefreshRequest {
        account_id: id,
        seen_version: run.version(),
    });
    assert!(
        wait_until(WAIT, || async {
            run.snapshot.load().account(id).map(|a| a.status) == Some(AccountStatus::ReauthRequired)
        })
        .await
    );
    assert_eq!(
        s.get_account(id).await.unwrap().unwrap().0.status,
        AccountStatus::ReauthRequired
    );
    assert!(!run
        .snapshot
        .load()
        .account(id)
        .unwrap()
        .is_schedulable(shared_state::now_ms()));

    mock.force(Some((
        401,
        r#"{"error":{"message":"Your OpenAI account has been deactivated"}}"#,
    )));
    run.send(WorkerEvent::RefreshRequest {
        account_id: id2,
        seen_version: run.version(),
    });
    assert!(
        wait_until(WAIT, || async {
            run.snapshot.load().account(id2).map(|a| a.status) == Some(AccountStatus::Banned)
        })
        .await
    );
    assert_eq!(mock.calls(), 2);
}

#[tokio::test]
async fn redis_lease_is_exclusive_and_compare_and_delete() {
    let Some(url) = redis_url() else { return };
    let ttl = Duration::from_secs(30);
    let a = RedisLeases::connect(&url, "instance-a".into(), ttl)
        .await
        .unwrap_or_else(|e| panic!("{e} (CODEX_GATEWAY_SKIP_REDIS=1 to skip)"));
    let b = RedisLeases::connect(&url, "instance-b".into(), ttl)
        .await
        .unwrap();
    let account = i64::from(rand::random::<u32>()) + 1_000_000;
    let fa = a.try_acquire(account, 0).await.unwrap().expect("free");
    assert!(fa >= 1);
    assert_eq!(b.try_acquire(account, 0).await.unwrap(), None, "exclusive");
    assert!(
        !b.release(account, fa).await.unwrap(),
        "only the owner may release"
    );
    assert!(
        !b.renew(account, fa).await.unwrap(),
        "only the owner may renew"
    );
    assert!(a.renew(account, fa).await.unwrap());
    assert_eq!(
        b.try_acquire(account, 0).await.unwrap(),
        None,
        "still held by a"
    );
    assert!(a.release(account, fa).await.unwrap());
    assert!(
        !a.renew(account, fa).await.unwrap(),
        "a released lease is lost"
    );
    // Every lease gets a higher fence; the counter is raised to the stored fence first.
    let fb = b
        .try_acquire(account, 0)
        .await
        .unwrap()
        .expect("free again");
    assert_eq!(fb, fa + 1);
    assert!(
        !a.release(account, fb).await.unwrap(),
        "a's own id, b's lease"
    );
    assert!(b.release(account, fb).await.unwrap());
    let fc = a.try_acquire(account, fb + 100).await.unwrap().unwrap();
    assert_eq!(fc, fb + 101);
    assert!(a.release(account, fc).await.unwrap());
}

#[tokio::test]
async fn refresh_with_redis_lease() {
    let Some(url) = redis_url() else { return };
    let mock = MockOAuth::start();
    mock.add_rt("rt-l", "acc-l", "user-l", "l@x", "plus");
    let db = TestDb::sqlite();
    let s = db.open().await;
    let id = seed_account(s.as_ref(), "acc-l", "rt-l").await;
    let mut cfg = config(&db);
    cfg.oauth_token_url = mock.url.clone();
    cfg.redis_url = Some(url.clone());
    let run = Running::start(cfg);
    let old = run
        .snapshot
        .load()
        .account(id)
        .unwrap()
        .access_token
        .clone();
    run.send(WorkerEvent::RefreshRequest {
        account_id: id,
        seen_version: run.version(),
    });
    assert!(
        wait_until(WAIT, || async {
            run.snapshot
                .load()
                .account(id)
                .map(|a| a.access_token != old)
                .unwrap_or(false)
        })
        .await
    );
    // The lease was released: another owner can take it at once.
    let other = RedisLeases::connect(&url, "other".into(), Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        wait_until(WAIT, || async {
            match other.try_acquire(id, 0).await.unwrap() {
                Some(f) => other.release(id, f).await.unwrap(),
                None => false,
            }
        })
        .await
    );
    assert_eq!(mock.calls(), 1);
}

#[tokio::test]
async fn spawn_reports_startup_errors() {
    let db = TestDb::sqlite();
    // Unsupported URL.
    let mut cfg = config(&db);
    cfg.db.database_url = Some("mysql://root:pw@127.0.0.1/x".into());
    let e = Running::try_start(cfg).err().unwrap();
    assert!(
        matches!(e, SidecarError::Storage(admin::StorageError::BadUrl(_))),
        "{e}"
    );
    assert!(!e.to_string().contains("pw"));
    // Unreachable PostgreSQL.
    let mut cfg = config(&db);
    cfg.db.database_url = Some("postgres://u:secretpw@127.0.0.1:1/x".into());
    let e = Running::try_start(cfg).err().unwrap();
    assert!(
        matches!(
            e,
            SidecarError::Storage(admin::StorageError::Connect { .. })
        ),
        "{e}"
    );
    assert!(!e.to_string().contains("secretpw"), "{e}");
    // Unreachable Redis is not fatal: the sidecar starts and its health says Redis is down.
    let mut cfg = config(&db);
    cfg.redis_url = Some("redis://127.0.0.1:1".into());
    let mut run = Running::try_start(cfg).expect("starts without Redis");
    assert_eq!(run.health.redis_up(), Some(false));
    run.stop();
    // Admin port in use.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cfg = config(&db);
    cfg.admin_listen = taken.local_addr().unwrap();
    let e = Running::try_start(cfg).err().unwrap();
    assert!(matches!(e, SidecarError::Bind { .. }), "{e}");
    // Bad CA file.
    let mut cfg = config(&db);
    cfg.upstream_ca = Some(db.dir.path().join("missing.pem"));
    let e = Running::try_start(cfg).err().unwrap();
    assert!(matches!(e, SidecarError::HttpClient(_)), "{e}");
}

#[tokio::test]
async fn healthz_reports_storage_down() {
    let Some(db) = TestDb::pg().await else { return };
    let run = Running::start(config(&db));
    let (st, _) = run.req(reqwest::Method::GET, "/healthz", None, None).await;
    assert_eq!(st, 200);
    // Pull the database out from under the sidecar.
    let pg = db.pg.as_ref().unwrap();
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&pg.base_url)
        .await
        .unwrap();
    sqlx::query(&format!("DROP DATABASE {} WITH (FORCE)", pg.name))
        .execute(&mut c)
        .await
        .unwrap();
    assert!(wait_until(WAIT, || async { !run.health.storage_up() }).await);
    let (st, body) = run.req(reqwest::Method::GET, "/healthz", None, None).await;
    assert_eq!(st, 503);
    assert_eq!(body["storage"], "down");
    // Usage keeps being accepted (spooled) while storage is down; shutdown stays bounded.
    run.send(WorkerEvent::Usage(Box::new(usage(1))));
    let t = std::time::Instant::now();
    drop(run);
    assert!(t.elapsed() < Duration::from_secs(15));
}
