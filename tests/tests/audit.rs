//! The audit log of admin actions (issue 27), through the running gateway: every kind of
//! mutation (session login/logout, tokens, keys and their limits, settings, accounts, proxies,
//! imports, the CLI) is recorded with its actor, action, object and before/after; the list
//! filters by actor, action and time; the CSV export has the same rows; and no secret the test
//! used (admin password, admin and client keys, account tokens, a proxy password) appears in
//! the stored rows, the listing or the CSV. On SQLite and PostgreSQL.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use integration_tests::{
    admin_api::{auth_json, call_as as call, login, session_of},
    client,
    logs::{assert_not_logged, capture_trace_logs},
    Stack, StackBuilder, ADMIN_TOKEN,
};
use reqwest::{header, Method};
use serde_json::{json, Value};

const PASSWORD: &str = "audit-password-7f3a91";
const PROXY_PASSWORD: &str = "proxy-secret-55e1";

/// An admin call with the static token ([`ADMIN_TOKEN`]) and `body` (not sent on `GET`):
/// status, headers and JSON body.
async fn admin(
    s: &Stack,
    method: Method,
    path: &str,
    body: Value,
) -> (reqwest::StatusCode, header::HeaderMap, Value) {
    call(s, method, path, Some(ADMIN_TOKEN), None, Some(body)).await
}

async fn audit(s: &Stack, query: &str) -> Vec<Value> {
    let (st, _, v) = admin(
        s,
        Method::GET,
        &format!("/api/admin/audit{query}"),
        Value::Null,
    )
    .await;
    assert_eq!(st, 200, "{v}");
    v["data"].as_array().unwrap().clone()
}

fn find<'a>(rows: &'a [Value], action: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["action"] == action)
        .unwrap_or_else(|| panic!("no {action} entry in {rows:#?}"))
}

/// Every stored audit row as one text per row (all columns), straight from the database.
async fn stored_rows(s: &Stack) -> Vec<String> {
    use sqlx::Connection;
    let sql = "SELECT CAST(id AS TEXT) || '|' || CAST(at_ms AS TEXT) || '|' || actor || '|' || \
               COALESCE(source, '') || '|' || action || '|' || COALESCE(object_type, '') || '|' \
               || COALESCE(object_id, '') || '|' || CAST(status AS TEXT) || '|' || \
               COALESCE(details, '') || '|' || COALESCE(before_json, '') || '|' || \
               COALESCE(after_json, '') FROM audit_log ORDER BY id";
    match &s.db.database_url {
        Some(url) => {
            let mut c = sqlx::PgConnection::connect(url).await.unwrap();
            sqlx::query_scalar::<_, String>(sql)
                .fetch_all(&mut c)
                .await
                .unwrap()
        }
        None => {
            let path = s.dir.path().join("codex-gateway.db");
            let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                .await
                .unwrap();
            sqlx::query_scalar::<_, String>(sql)
                .fetch_all(&mut c)
                .await
                .unwrap()
        }
    }
}

async fn every_admin_action_is_audited_without_secrets(postgres: bool) {
    let s = StackBuilder {
        accounts: 2,
        postgres,
        admin_password: Some(PASSWORD.into()),
        ..StackBuilder::default()
    }
    .start();
    let started = shared_state::now_ms();

    // A failed and a successful login; the session makes a change and logs out.
    let (st, _, _) = login(&s, "wrong-guess-1234").await;
    assert_eq!(st, 401);
    let (st, h, _) = login(&s, PASSWORD).await;
    assert_eq!(st, 200);
    let cookie = session_of(&h);
    let (st, _, _) = call(
        &s,
        Method::POST,
        "/api/admin/accounts/1/disable",
        None,
        Some(&cookie),
        None,
    )
    .await;
    assert_eq!(st, 200);

    // A named admin token, used for a key with limits.
    let (st, _, tok) = admin(
        &s,
        Method::POST,
        "/api/admin/tokens",
        json!({"name": "ci-bot"}),
    )
    .await;
    assert_eq!(st, 200, "{tok}");
    let admin_token = tok["token"].as_str().unwrap().to_owned();
    let token_id = tok["id"].as_i64().unwrap();
    let (st, _, key) = call(
        &s,
        Method::POST,
        "/api/admin/keys",
        Some(&admin_token),
        None,
        Some(json!({"name": "team-a"})),
    )
    .await;
    assert_eq!(st, 200, "{key}");
    let client_key = key["key"].as_str().unwrap().to_owned();
    let key_id = key["id"].as_i64().unwrap();
    let (st, _, v) = call(
        &s,
        Method::PATCH,
        &format!("/api/admin/keys/{key_id}"),
        Some(&admin_token),
        None,
        Some(json!({"rpm": 60, "tokens_per_day": 100000})),
    )
    .await;
    assert_eq!(st, 200, "{v}");

    // Settings, a proxy with a password, an import of a credential file.
    let (st, _, v) = admin(
        &s,
        Method::PUT,
        "/api/admin/settings",
        json!({"max_attempts": 5, "auto_clean_after_hours": 48}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, _, proxy) = admin(
        &s,
        Method::POST,
        "/api/admin/proxies",
        json!({"name": "egress-1", "url": format!("http://user:{PROXY_PASSWORD}@127.0.0.1:9")}),
    )
    .await;
    assert_eq!(st, 200, "{proxy}");
    let extra = s.mock.add_account(benches::MockAccount::new("acct-audit"));
    let (st, _, v) = admin(
        &s,
        Method::POST,
        "/api/admin/accounts/import",
        json!({"files": [{"name": "auth.json", "content": auth_json(&extra)}]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    // The CLI (its own process in real life) writes to the same log.
    let db = s.db.clone();
    std::thread::spawn(move || admin::cli::settings_set(&db, "min_request_interval_ms", "25"))
        .join()
        .unwrap()
        .unwrap();
    let (st, _, _) = call(
        &s,
        Method::POST,
        "/api/admin/logout",
        None,
        Some(&cookie),
        None,
    )
    .await;
    assert_eq!(st, 200);
    let (st, _, _) = admin(
        &s,
        Method::DELETE,
        &format!("/api/admin/tokens/{token_id}"),
        json!({}),
    )
    .await;
    assert_eq!(st, 200);

    let rows = audit(&s, "?limit=1000").await;
    // Who.
    let login_failed = rows
        .iter()
        .find(|r| r["action"] == "login" && r["status"] == 401)
        .expect("failed login");
    assert_eq!(login_failed["actor"], "anonymous");
    assert_eq!(login_failed["source"], "127.0.0.1");
    let disable = find(&rows, "accounts.disable");
    assert_eq!(disable["actor"], "session");
    assert_eq!(disable["object_type"], "account");
    assert_eq!(disable["object_id"], "1");
    assert_eq!(disable["before"], json!({"status": "active"}));
    assert_eq!(disable["after"], json!({"status": "disabled"}));
    let key_create = find(&rows, "keys.create");
    assert_eq!(key_create["actor"], format!("token:ci-bot#{token_id}"));
    assert_eq!(key_create["object_id"], key_id.to_string());
    let key_update = find(&rows, "keys.update");
    assert_eq!(
        key_update["before"],
        json!({"rpm": null, "tokens_per_day": null})
    );
    assert_eq!(
        key_update["after"],
        json!({"rpm": 60, "tokens_per_day": 100000})
    );
    let settings = rows
        .iter()
        .find(|r| r["action"] == "settings.update" && r["actor"] == "static_token")
        .expect("settings entry");
    assert_eq!(
        settings["before"],
        json!({"max_attempts": 3, "auto_clean_after_hours": null})
    );
    assert_eq!(
        settings["after"],
        json!({"max_attempts": 5, "auto_clean_after_hours": 48.0})
    );
    let cli = rows
        .iter()
        .find(|r| r["action"] == "settings.update" && r["actor"] == "cli")
        .expect("CLI entry");
    assert_eq!(cli["after"], json!({"min_request_interval_ms": "25"}));
    let proxy_entry = find(&rows, "proxies.create");
    assert_eq!(proxy_entry["object_id"], proxy["id"].to_string());
    assert!(
        proxy_entry["details"]["url"]
            .as_str()
            .is_some_and(|u| u.contains("127.0.0.1:9")),
        "{proxy_entry}"
    );
    find(&rows, "accounts.import");
    find(&rows, "tokens.create");
    find(&rows, "tokens.delete");
    find(&rows, "logout");
    // The stack's own set-up went through the CLI too.
    assert!(rows
        .iter()
        .any(|r| r["actor"] == "cli" && r["action"] == "keys.create"));
    // Reads are not audited.
    assert!(rows.iter().all(|r| r["action"] != "audit"), "{rows:#?}");

    // Filters: actor (contains), action (prefix), time.
    let by_actor = audit(&s, "?actor=ci-bot").await;
    assert_eq!(by_actor.len(), 2, "{by_actor:#?}");
    assert!(by_actor
        .iter()
        .all(|r| r["actor"] == format!("token:ci-bot#{token_id}")));
    let by_action = audit(&s, "?action=keys").await;
    assert!(by_action
        .iter()
        .all(|r| r["action"].as_str().unwrap().starts_with("keys.")));
    assert!(by_action.len() >= 3, "{by_action:#?}");
    // "Who disabled account 1?" (The object filter also finds the set-up's import, one
    // entry listing every account it imported.)
    let by_object = audit(&s, "?object_type=account&object_id=1").await;
    assert_eq!(by_object.len(), 2, "{by_object:#?}");
    assert_eq!(by_object[0]["action"], "accounts.disable");
    assert_eq!(by_object[0]["actor"], "session");
    assert_eq!(by_object[1]["action"], "accounts.import");
    assert_eq!(by_object[1]["actor"], "cli");
    let future = audit(&s, &format!("?from={}", shared_state::now_ms() + 60_000)).await;
    assert!(future.is_empty());
    let before_start = audit(&s, &format!("?to={started}")).await;
    assert!(
        before_start.iter().all(|r| r["actor"] == "cli"),
        "only the set-up happened before the test: {before_start:#?}"
    );
    let (st, _, err) = admin(
        &s,
        Method::GET,
        "/api/admin/audit?from=yesterday",
        Value::Null,
    )
    .await;
    assert_eq!(st, 400);
    assert_eq!(err["error"]["param"], "from");

    // The CSV export: the same entries.
    let resp = client()
        .get(format!("{}/api/admin/audit/export.csv", s.admin_url()))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    let csv = resp.text().await.unwrap();
    assert!(csv.starts_with("id,time,actor,source,action,"), "{csv}");
    assert_eq!(csv.lines().count(), rows.len() + 1, "{csv}");
    assert!(csv.contains("accounts.disable"));
    let csv_keys = client()
        .get(format!(
            "{}/api/admin/audit/export.csv?action=keys.update",
            s.admin_url()
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(csv_keys.lines().count(), 2, "{csv_keys}");

    // No secret anywhere: stored rows, the listing, the CSV.
    let listing = serde_json::to_string(&rows).unwrap();
    let stored = stored_rows(&s).await;
    assert_eq!(stored.len(), rows.len());
    let stored = stored.join("\n");
    let mut secrets = vec![
        PASSWORD.to_owned(),
        PROXY_PASSWORD.to_owned(),
        ADMIN_TOKEN.to_owned(),
        admin_token.clone(),
        client_key.clone(),
        s.key.clone(),
        cookie.clone(),
    ];
    for a in s.accounts.iter().chain([&extra]) {
        secrets.extend([
            a.access_token.clone(),
            a.refresh_token.clone(),
            a.id_token.clone(),
        ]);
    }
    for secret in &secrets {
        for (what, text) in [
            ("stored rows", &stored),
            ("listing", &listing),
            ("CSV", &csv),
        ] {
            assert!(
                !text.contains(secret.as_str()),
                "a secret is in the {what}: {text}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_action_is_audited_without_secrets_sqlite() {
    every_admin_action_is_audited_without_secrets(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_action_is_audited_without_secrets_postgres() {
    every_admin_action_is_audited_without_secrets(true).await;
}

/// A read-only token cannot mutate, and what it was refused is not an action.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_are_not_actions() {
    let s = StackBuilder::default().start();
    let (_, _, tok) = admin(
        &s,
        Method::POST,
        "/api/admin/tokens",
        json!({"name": "viewer", "scope": "read"}),
    )
    .await;
    let read = tok["token"].as_str().unwrap().to_owned();
    let n = audit(&s, "").await.len();
    let (st, _, _) = call(
        &s,
        Method::POST,
        "/api/admin/accounts/1/disable",
        Some(&read),
        None,
        None,
    )
    .await;
    assert_eq!(st, 403);
    let (st, _, _) = call(
        &s,
        Method::POST,
        "/api/admin/accounts/1/disable",
        Some("cgadm-wrong"),
        None,
        None,
    )
    .await;
    assert_eq!(st, 401);
    assert_eq!(audit(&s, "").await.len(), n);
    // The read token may list the log.
    let (st, _, _) = call(&s, Method::GET, "/api/admin/audit", Some(&read), None, None).await;
    assert_eq!(st, 200);
}

/// The day-two admin features at `trace` level (audited actions with secrets in their bodies,
/// the batch test sending each account's token upstream, the auth directory importing a file
/// and writing rotated tokens back): no secret in any log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn day_two_admin_features_log_no_secret_at_trace_level() {
    let logs = capture_trace_logs();
    let auth = tempfile::tempdir().unwrap();
    let dir = auth.path().to_path_buf();
    let s = StackBuilder {
        accounts: 2,
        admin_password: Some(PASSWORD.into()),
        tweak: Some(Box::new(move |c: &mut codex_gateway::config::Config| {
            c.sidecar.auth_dir = Some(dir);
        })),
        ..StackBuilder::default()
    }
    .start();
    let (st, h, _) = login(&s, PASSWORD).await;
    assert_eq!(st, 200);
    let cookie = session_of(&h);
    let (st, _, _) = admin(
        &s,
        Method::POST,
        "/api/admin/proxies",
        json!({"name": "p", "url": format!("socks5://u:{PROXY_PASSWORD}@127.0.0.1:9")}),
    )
    .await;
    assert_eq!(st, 200);
    let (_, _, tok) = admin(
        &s,
        Method::POST,
        "/api/admin/tokens",
        json!({"name": "ops"}),
    )
    .await;
    let admin_token = tok["token"].as_str().unwrap().to_owned();
    admin(
        &s,
        Method::PUT,
        "/api/admin/settings",
        json!({"auth_dir_write_back": true}),
    )
    .await;
    // A file account: imported, then refreshed and written back.
    let file_acct = s.mock.add_account(benches::MockAccount::new("acct-file"));
    let file = auth.path().join("auth.json");
    std::fs::write(&file, auth_json(&file_acct)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let file_id = loop {
        let (_, _, list) = admin(&s, Method::GET, "/api/admin/accounts", Value::Null).await;
        if let Some(a) = list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["chatgpt_account_id"] == "acct-file")
        {
            break a["id"].as_i64().unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "file not imported");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    admin(
        &s,
        Method::POST,
        &format!("/api/admin/accounts/{file_id}/refresh"),
        json!({}),
    )
    .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let now = s.mock.account_tokens("acct-file").unwrap();
        if std::fs::read_to_string(&file)
            .unwrap()
            .contains(&now.refresh_token)
            && now.refresh_token != file_acct.refresh_token
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no write-back");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // The batch test of every account.
    let (st, _, v) = admin(
        &s,
        Method::POST,
        "/api/admin/accounts/test",
        json!({"ids": [1, 2, file_id]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["succeeded"], 3, "{v}");

    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let log = logs.text();
    assert!(log.contains("TRACE"), "trace level was on");
    let mut secrets = vec![
        PASSWORD.to_owned(),
        PROXY_PASSWORD.to_owned(),
        ADMIN_TOKEN.to_owned(),
        admin_token,
        s.key.clone(),
        cookie,
    ];
    for a in s.accounts.iter().chain([&file_acct]) {
        secrets.extend([
            a.access_token.clone(),
            a.refresh_token.clone(),
            a.id_token.clone(),
        ]);
    }
    for id in ["acct-0", "acct-1", "acct-file"] {
        let t = s.mock.account_tokens(id).unwrap();
        secrets.extend([t.access_token, t.refresh_token, t.id_token]);
    }
    for secret in secrets.iter().filter(|x| !x.is_empty()) {
        assert_not_logged(&log, secret);
    }
    assert!(!log.contains("eyJ"), "a JWT-shaped string reached the logs");
}
