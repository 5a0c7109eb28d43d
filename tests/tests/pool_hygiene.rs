//! The pool keeps itself clean (issue 27), through the running gateway against mock-codex:
//! auto-clean (off by default; dead accounts disabled, then deleted, once dead for longer
//! than the setting, each action audited as `auto-clean`) and the batch test (one request
//! per account straight to the upstream, bounded, never charged to a client key, the data
//! plane's counters untouched).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::time::Duration;

use benches::{Behaviour, ErrorKind};
use integration_tests::{admin_api::auth_json, wait::wait_for, Stack, StackBuilder};
use serde_json::{json, Value};

fn stack(accounts: usize) -> Stack {
    integration_tests::fill_first_stack(accounts)
}

/// Account id by ChatGPT account id, from the admin API (`None`: not listed).
async fn account(s: &Stack, chatgpt: &str) -> Option<Value> {
    let (_, v) = s
        .admin_call(reqwest::Method::GET, "/api/admin/accounts", Value::Null)
        .await;
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["chatgpt_account_id"] == chatgpt)
        .cloned()
}

async fn ask(s: &Stack) -> u16 {
    s.post_json("/v1/responses", &json!({"model": "gpt-5.5", "input": "x"}))
        .await
        .status()
        .as_u16()
}

async fn stored_status(s: &Stack, chatgpt: &str) -> Option<String> {
    account(s, chatgpt)
        .await
        .map(|a| a["status"].as_str().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_clean_disables_then_deletes_dead_accounts() {
    let s = stack(3);
    // acct-0 is deactivated upstream: the first request bans it (fill_first tries it first).
    s.mock
        .set_behaviour("acct-0", Behaviour::error(ErrorKind::AccountDeactivated));
    assert_eq!(ask(&s).await, 200);
    wait_for(
        "acct-0 banned in storage",
        Duration::from_secs(30),
        async || stored_status(&s, "acct-0").await.as_deref() == Some("banned"),
    )
    .await;
    let id0 = account(&s, "acct-0").await.unwrap()["id"].as_i64().unwrap();

    // Off by default: nothing happens, and the run says so.
    let (st, v) = s
        .admin_call(
            reqwest::Method::POST,
            "/api/admin/auto-clean/run",
            json!({}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["enabled"], false, "{v}");
    assert_eq!(v["cleaned"], json!([]));
    // On, with a day: the ban is too recent.
    s.put_settings(json!({"auto_clean_after_hours": 24})).await;
    let (_, v) = s
        .admin_call(
            reqwest::Method::POST,
            "/api/admin/auto-clean/run",
            json!({"dry_run": true}),
        )
        .await;
    assert_eq!(v["enabled"], true, "{v}");
    assert_eq!(v["cleaned"], json!([]), "{v}");
    assert_eq!(stored_status(&s, "acct-0").await.as_deref(), Some("banned"));

    // A threshold of 0.0005 h (1.8 s): the background task disables it by itself.
    s.put_settings(json!({"auto_clean_after_hours": 0.0005}))
        .await;
    wait_for(
        "acct-0 disabled by auto-clean",
        Duration::from_secs(30),
        async || stored_status(&s, "acct-0").await.as_deref() == Some("disabled"),
    )
    .await;
    assert_eq!(s.account("acct-0").status, "disabled");
    // The healthy accounts are untouched.
    for a in ["acct-1", "acct-2"] {
        assert_eq!(stored_status(&s, a).await.as_deref(), Some("active"), "{a}");
    }

    // Delete: acct-1 is banned next; once dead long enough it is deleted. acct-0, disabled
    // now, is not dead any more: it stays.
    s.put_settings(json!({"auto_clean_action": "delete", "auto_clean_after_hours": 0.0005}))
        .await;
    s.mock
        .set_behaviour("acct-1", Behaviour::error(ErrorKind::AccountDeactivated));
    let id1 = account(&s, "acct-1").await.unwrap()["id"].as_i64().unwrap();
    assert_eq!(ask(&s).await, 200);
    wait_for(
        "acct-1 deleted by auto-clean",
        Duration::from_secs(30),
        async || account(&s, "acct-1").await.is_none(),
    )
    .await;
    assert_eq!(
        stored_status(&s, "acct-0").await.as_deref(),
        Some("disabled")
    );
    assert_eq!(stored_status(&s, "acct-2").await.as_deref(), Some("active"));
    assert!(s
        .app
        .snapshot
        .load()
        .accounts
        .iter()
        .all(|a| a.chatgpt_account_id != "acct-1"));

    // Each action is in the audit log as auto-clean, with the status it had.
    let (_, log) = s
        .admin_call(
            reqwest::Method::GET,
            "/api/admin/audit?actor=auto-clean",
            Value::Null,
        )
        .await;
    let rows = log["data"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{log}");
    let disabled = rows
        .iter()
        .find(|r| r["action"] == "accounts.disable")
        .unwrap();
    assert_eq!(disabled["object_id"], id0.to_string());
    assert_eq!(disabled["before"], json!({"status": "banned"}));
    assert_eq!(disabled["after"], json!({"status": "disabled"}));
    let deleted = rows
        .iter()
        .find(|r| r["action"] == "accounts.delete")
        .unwrap();
    assert_eq!(deleted["object_id"], id1.to_string());
    assert_eq!(deleted["actor"], "auto-clean");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_test_reaches_each_account_directly() {
    let s = stack(4);
    s.mock
        .set_behaviour("acct-1", Behaviour::error(ErrorKind::UsageLimitReached));
    s.mock
        .set_behaviour("acct-2", Behaviour::error(ErrorKind::AccountDeactivated));
    let ids: Vec<i64> = {
        let mut v = Vec::new();
        for i in 0..4 {
            v.push(
                account(&s, &format!("acct-{i}")).await.unwrap()["id"]
                    .as_i64()
                    .unwrap(),
            );
        }
        v
    };
    s.mock.clear_requests();
    // acct-3 first: the results come back in the order asked, not the order they finished.
    let asked = vec![ids[3], ids[0], ids[1], ids[2], 9999];
    let (st, v) = s
        .admin_call(
            reqwest::Method::POST,
            "/api/admin/accounts/test",
            json!({"ids": asked, "model": "gpt-5.5", "concurrency": 2}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["succeeded"], 2, "{v}");
    assert_eq!(v["failed"], 3, "{v}");
    let r = v["results"].as_array().unwrap();
    let got: Vec<i64> = r.iter().map(|x| x["id"].as_i64().unwrap()).collect();
    assert_eq!(got, asked);
    for ok in [&r[0], &r[1]] {
        assert_eq!(ok["ok"], true, "{ok}");
        assert_eq!(ok["status"], 200, "{ok}");
        assert!(ok["error_class"].is_null(), "{ok}");
        assert!(ok["latency_ms"].as_u64().is_some(), "{ok}");
    }
    assert_eq!(r[2]["ok"], false);
    assert_eq!(r[2]["status"], 429, "{}", r[2]);
    assert_eq!(r[2]["error_class"], "usage_limit_reached", "{}", r[2]);
    assert_eq!(r[3]["ok"], false);
    assert_eq!(r[3]["status"], 401, "{}", r[3]);
    assert_eq!(r[3]["error_class"], "account_deactivated", "{}", r[3]);
    assert_eq!(r[4]["error_class"], "unknown_account", "{}", r[4]);

    // One request per known account, each with that account's own token.
    let seen = s
        .mock
        .requests()
        .into_iter()
        .filter(|q| q.path.ends_with("/responses"))
        .collect::<Vec<_>>();
    assert_eq!(seen.len(), 4, "{seen:?}");
    for i in 0..4 {
        let acct = format!("acct-{i}");
        let q = seen
            .iter()
            .find(|q| q.account_id() == Some(acct.as_str()))
            .unwrap_or_else(|| panic!("no request for {acct}"));
        assert_eq!(
            q.header("authorization"),
            Some(format!("Bearer {}", s.accounts[i].access_token).as_str())
        );
        assert_eq!(q.json.as_ref().unwrap()["model"], "gpt-5.5");
        assert_eq!(q.json.as_ref().unwrap()["stream"], true);
    }

    // Never through the data plane: no usage for any key, no account served anything, and
    // the failing accounts keep their status (a test reports, it does not judge).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, usage) = s
        .admin_call(reqwest::Method::GET, "/api/admin/usage", Value::Null)
        .await;
    assert_eq!(usage["totals"]["requests"], 0, "{usage}");
    for i in 0..4 {
        let a = account(&s, &format!("acct-{i}")).await.unwrap();
        assert_eq!(a["served"], 0, "{a}");
        assert_eq!(a["status"], "active", "{a}");
    }

    // Bad input is a clear 400.
    for (body, param) in [
        (json!({"ids": []}), "ids"),
        (json!({"ids": [1], "concurrency": 0}), "concurrency"),
        (json!({"ids": [1], "concurrency": 33}), "concurrency"),
    ] {
        let (st, v) = s
            .admin_call(reqwest::Method::POST, "/api/admin/accounts/test", body)
            .await;
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_dir_imports_disables_and_writes_back() {
    let auth = tempfile::tempdir().unwrap();
    let dir = auth.path().to_path_buf();
    let s = StackBuilder {
        accounts: 1,
        workers: 1,
        tweak: Some(Box::new(move |c: &mut codex_gateway::config::Config| {
            c.sidecar.auth_dir = Some(dir);
        })),
        ..StackBuilder::default()
    }
    .start();
    // A login dropped in as a file (one level down, as `$CODEX_HOME/auth.json` trees are).
    let t = s.mock.add_account(benches::MockAccount::new("acct-file"));
    std::fs::create_dir(auth.path().join("alice")).unwrap();
    let file = auth.path().join("alice/auth.json");
    std::fs::write(&file, auth_json(&t)).unwrap();
    wait_for(
        "the file's account imported",
        Duration::from_secs(30),
        async || stored_status(&s, "acct-file").await.as_deref() == Some("active"),
    )
    .await;
    let id = account(&s, "acct-file").await.unwrap()["id"]
        .as_i64()
        .unwrap();

    // Removed: disabled. Back: enabled.
    std::fs::remove_file(&file).unwrap();
    wait_for(
        "disabled after its file went",
        Duration::from_secs(30),
        async || stored_status(&s, "acct-file").await.as_deref() == Some("disabled"),
    )
    .await;
    // The data plane follows once the change is published (just after it is stored).
    wait_for(
        "the disable published to the data plane",
        Duration::from_secs(10),
        async || s.account("acct-file").status == "disabled",
    )
    .await;
    std::fs::write(&file, auth_json(&t)).unwrap();
    wait_for(
        "enabled when its file is back",
        Duration::from_secs(30),
        async || stored_status(&s, "acct-file").await.as_deref() == Some("active"),
    )
    .await;

    // Write-back: a refresh rotates the tokens; the file gets them, atomically (no temporary
    // left), and that write is not taken for a new file.
    let (st, v) = s
        .admin_call(
            reqwest::Method::PUT,
            "/api/admin/settings",
            json!({"auth_dir_write_back": true}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["auth_dir_write_back"], true);
    let (st, v) = s
        .admin_call(
            reqwest::Method::POST,
            &format!("/api/admin/accounts/{id}/refresh"),
            json!({}),
        )
        .await;
    assert_eq!(st, 202, "{v}");
    let rotated = async || {
        let now = s.mock.account_tokens("acct-file")?;
        (now.refresh_token != t.refresh_token).then_some(now)
    };
    wait_for("the refresh", Duration::from_secs(30), async || {
        rotated().await.is_some()
    })
    .await;
    let fresh = rotated().await.unwrap();
    wait_for(
        "the file rewritten with the rotated tokens",
        Duration::from_secs(30),
        async || {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
            v["tokens"]["refresh_token"] == fresh.refresh_token.as_str()
        },
    )
    .await;
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(v["tokens"]["access_token"], fresh.access_token.as_str());
    assert_eq!(v["tokens"]["account_id"], "acct-file");
    assert_eq!(v["auth_mode"], "chatgpt");
    assert_ne!(v["last_refresh"], "2026-11-29T00:00:00Z");
    let names: Vec<String> = std::fs::read_dir(auth.path().join("alice"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["auth.json"]);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    // The audit log tells the story, as auth-dir, without a token.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (_, log) = s
        .admin_call(
            reqwest::Method::GET,
            "/api/admin/audit?actor=auth-dir",
            Value::Null,
        )
        .await;
    let actions: Vec<&str> = log["data"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        vec![
            "accounts.import",
            "accounts.disable",
            "accounts.import",
            "accounts.enable",
            "accounts.write_back"
        ],
        "{log}"
    );
    let text = log.to_string();
    for secret in [
        &t.access_token,
        &t.refresh_token,
        &fresh.access_token,
        &fresh.refresh_token,
    ] {
        assert!(!text.contains(secret.as_str()), "a token in the audit log");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_credits_are_shown_per_account() {
    let s = stack(2);
    s.mock.set_reset_credits("acct-0", 3);
    for i in 0..2 {
        let id = account(&s, &format!("acct-{i}")).await.unwrap()["id"]
            .as_i64()
            .unwrap();
        let (st, v) = s
            .admin_call(
                reqwest::Method::POST,
                &format!("/api/admin/accounts/{id}/quota"),
                json!({}),
            )
            .await;
        assert!(st < 300, "{st} {v}");
    }
    wait_for(
        "acct-0's reset credits",
        Duration::from_secs(30),
        async || account(&s, "acct-0").await.unwrap()["reset_credits"] == 3,
    )
    .await;
    assert_eq!(account(&s, "acct-1").await.unwrap()["reset_credits"], 0);
}
