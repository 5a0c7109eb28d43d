//! The admin web app in a real browser (issue 13): Debian's Chromium driven by playwright-core
//! (`frontend/e2e/admin.e2e.mjs`, run with node) against the whole stack over real sockets.
//! The script logs in, imports an account file by drag and drop, adds one through the ChatGPT
//! login (PKCE, against mock-codex's token endpoint), creates a key and uses it,
//! sees the requests on the dashboard and in usage, disables an account, changes the
//! scheduler strategy and the front door's allow-list and per-IP rate (an invalid entry
//! refused inline) and looks at the ops page, where the scheduler board shows the data
//! plane's candidate order and an account disabled in the app leaves it and comes back; this
//! test then checks what the upstream saw (never the disabled account after the click), the
//! boards the page showed, and what the data plane runs with.
//! Screenshots of every page are kept under `target/admin-browser/`.
//!
//! Needs node, `frontend/node_modules` (`npm ci` in `frontend/`) and Chromium
//! (`CODEX_GATEWAY_CHROMIUM`, default `/usr/bin/chromium`); `tests/run.sh` installs them.
//! `CODEX_GATEWAY_SKIP_BROWSER=1` skips the test where they cannot be had.

use std::{path::PathBuf, process::Command, time::Duration};

use integration_tests::StackBuilder;

const PASSWORD: &str = "browser-test-password-1";
/// Accounts in the bulk import file.
const BULK_ACCOUNTS: usize = 1_200;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

#[test]
fn admin_app_in_a_real_browser() {
    if std::env::var("CODEX_GATEWAY_SKIP_BROWSER").is_ok_and(|v| v == "1") {
        eprintln!("CODEX_GATEWAY_SKIP_BROWSER=1: skipping the browser test");
        return;
    }
    let root = repo_root();
    let frontend = root.join("frontend");
    let chromium =
        std::env::var("CODEX_GATEWAY_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        PathBuf::from(&chromium).exists(),
        "Chromium not found at {chromium} (apt-get install chromium, or run tests/run.sh; \
         CODEX_GATEWAY_SKIP_BROWSER=1 skips)"
    );
    assert!(
        frontend.join("node_modules/playwright-core").is_dir(),
        "frontend/node_modules is missing: run `npm ci` in frontend/ (tests/run.sh does)"
    );
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let shots = target.join("admin-browser");

    let s = StackBuilder {
        accounts: 3,
        workers: 2,
        // The upstream over h2c: the ops page shows each worker's pooled h2 connections.
        plain_http: gateway::config::PlainHttp::H2c,
        // The upstream reports 41 % / 17 % used (the quota bars and the dashboard's mean).
        mock: benches::MockConfig {
            default_quota: (41.0, 17.0),
            ..benches::MockConfig::default()
        },
        admin_password: Some(PASSWORD.into()),
        ..StackBuilder::default()
    }
    .start();
    // The file the operator drops: an auth.json for an account the upstream knows.
    let t = s
        .mock
        .add_account(benches::MockAccount::new("acct-browser"));
    let auth = s.dir.path().join("browser-auth.json");
    std::fs::write(
        &auth,
        serde_json::json!({
            "auth_mode": "chatgpt", "OPENAI_API_KEY": null,
            "tokens": {"id_token": t.id_token, "access_token": t.access_token,
                       "refresh_token": t.refresh_token, "account_id": t.account_id},
            "last_refresh": "2026-11-29T00:00:00Z"
        })
        .to_string(),
    )
    .expect("write auth.json");

    // A second file with 1,200 accounts the upstream does not know (the app disables them in
    // bulk right after the import): the accounts table must stay fast at that size.
    let bulk: Vec<serde_json::Value> = (0..BULK_ACCOUNTS)
        .map(|i| {
            let id = format!("bulk-{i:04}");
            let claims = serde_json::json!({
                "email": format!("{id}@example.com"), "exp": 4_000_000_000u64,
                "https://api.openai.com/auth": {"chatgpt_account_id": id, "chatgpt_user_id": format!("u-{id}"), "chatgpt_plan_type": if i % 3 == 0 { "pro" } else { "plus" }},
            });
            serde_json::json!({"type": "codex", "access_token": shared_state::jwt::encode_unsigned(&claims.to_string()), "account_id": id})
        })
        .collect();
    let bulk_file = s.dir.path().join("bulk-accounts.json");
    std::fs::write(&bulk_file, serde_json::Value::Array(bulk).to_string()).expect("write bulk");

    let started = std::time::Instant::now();
    let out = Command::new(std::env::var("CODEX_GATEWAY_NODE").unwrap_or_else(|_| "node".into()))
        .arg("e2e/admin.e2e.mjs")
        .current_dir(&frontend)
        .env("ADMIN_URL", s.admin_url())
        .env("GATEWAY_URL", s.url())
        .env("ADMIN_PASSWORD", PASSWORD)
        .env("AUTH_FILE", &auth)
        .env("IMPORT_ACCOUNT", "acct-browser")
        .env("BULK_FILE", &bulk_file)
        .env("BULK_COUNT", BULK_ACCOUNTS.to_string())
        .env("DISABLE_ACCOUNT", "acct-0")
        .env("MOVE_ACCOUNT", "acct-1")
        .env("SCREENSHOT_DIR", &shots)
        .env("CHROMIUM", &chromium)
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "{stdout}\n{stderr}\n(browser run took {:?})",
        started.elapsed()
    );
    assert!(
        out.status.success(),
        "the browser script failed: {}",
        out.status
    );
    let result: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT "))
        .map(|j| serde_json::from_str(j).expect("RESULT json"))
        .expect("a RESULT line");
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(
        result["workers"], 2,
        "the ops page shows every worker: {result}"
    );
    assert_eq!(
        result["console_errors"],
        serde_json::json!([]),
        "no script errors in the page: {result}"
    );

    // The scheduler board as the page showed it: candidates first, numbered 1..n in the
    // scheduler's order, each with the scheduler's tier; then the accounts it cannot pick
    // (the disabled acct-0 always; acct-1 while disabled, back among the candidates after).
    let board = |k: &str| -> Vec<(String, Option<u32>, Option<String>)> {
        result[k]
            .as_array()
            .unwrap_or_else(|| panic!("{k} missing: {result}"))
            .iter()
            .map(|r| {
                (
                    r["id"].as_str().unwrap_or_default().to_owned(),
                    r["position"].as_str().and_then(|p| p.parse().ok()),
                    r["tier"].as_str().map(str::to_owned),
                )
            })
            .collect()
    };
    let candidates = |rows: &[(String, Option<u32>, Option<String>)]| -> Vec<String> {
        let n = rows.iter().take_while(|r| r.1.is_some()).count();
        assert!(
            rows[n..].iter().all(|r| r.1.is_none()),
            "candidates first: {rows:?}"
        );
        let pos: Vec<u32> = rows[..n].iter().filter_map(|r| r.1).collect();
        assert_eq!(pos, (1..=n as u32).collect::<Vec<_>>(), "{rows:?}");
        for r in rows {
            assert!(
                matches!(
                    r.2.as_deref(),
                    Some("healthy" | "warm" | "risky" | "quarantine")
                ),
                "the scheduler's tier on every row: {rows:?}"
            );
        }
        rows[..n].iter().map(|r| r.0.clone()).collect()
    };
    let before = candidates(&board("board_before"));
    let disabled = candidates(&board("board_disabled"));
    let enabled = candidates(&board("board_enabled"));
    assert_eq!(
        board("board_before").len(),
        5,
        "every account on the board (three, the imported one, the OAuth one)"
    );
    assert!(!before.contains(&"acct-0".to_owned()), "{before:?}");
    assert!(before.contains(&"acct-1".to_owned()), "{before:?}");
    assert!(!disabled.contains(&"acct-1".to_owned()), "{disabled:?}");
    let mut rest = before.clone();
    rest.retain(|a| a != "acct-1");
    assert_eq!(disabled, rest, "the others keep their order");
    assert!(enabled.contains(&"acct-1".to_owned()), "{enabled:?}");

    // What the upstream saw: nothing for the disabled account after the click.
    let served = s.served_by();
    let after = usize::try_from(result["sent_after_disable"].as_u64().expect("count")).expect("n");
    assert!(after >= 6 && served.len() >= after, "{served:?}");
    let tail = &served[served.len() - after..];
    assert!(
        tail.iter().all(|a| a != "acct-0"),
        "the disabled account served after the click: {tail:?}"
    );
    assert!(tail.iter().any(|a| a == "acct-browser"), "{tail:?}");
    // The imported account and the strategy change reached the data plane.
    let snap = s.app.snapshot.load();
    assert!(snap
        .accounts
        .iter()
        .any(|a| a.chatgpt_account_id == "acct-browser"));
    assert_eq!(snap.settings.strategy.as_str(), "round_robin");
    // The front door's settings saved in the app are published (the page shows the list in
    // its canonical form).
    assert_eq!(result["allow_list"], "127.0.0.0/8, ::1", "{result}");
    assert_eq!(snap.settings.ip_allow_list.to_string(), "127.0.0.0/8, ::1");
    assert_eq!(snap.settings.per_ip_rps, 1000);
    assert_eq!(s.account("acct-0").status, "disabled");
    // The limits set in the app are stored (and published) for the key.
    let db = s.db.clone();
    let keys = std::thread::spawn(move || admin::cli::keys_list(&db).unwrap())
        .join()
        .unwrap();
    let k = keys.iter().find(|k| k.name == "browser-e2e").unwrap();
    assert_eq!(k.limits.rpm, Some(1000));
    assert_eq!(k.limits.tokens_per_day, Some(100_000_000));
    let bulk_disabled = snap
        .accounts
        .iter()
        .filter(|a| a.chatgpt_account_id.starts_with("bulk-"))
        .filter(|a| a.effective_status().as_str() != "active")
        .count();
    assert_eq!(bulk_disabled, BULK_ACCOUNTS, "bulk disable from the app");
    let proxy_row = result["proxy_row"].as_str().unwrap_or_default();
    assert!(
        proxy_row.contains("socks5://e2e@127.0.0.1:1") && !proxy_row.contains("hidden-pw"),
        "the proxies page lists the proxy without its password: {proxy_row:?}"
    );
    let tested = result["test_results"].as_str().unwrap_or_default();
    assert!(
        tested.contains("ok") && tested.contains("200"),
        "the batch test of one account from the app: {tested:?}"
    );
    let audit = result["audit_table"].as_str().unwrap_or_default();
    assert!(
        audit.contains("accounts.disable")
            && audit.contains("proxies.create")
            && !audit.contains("hidden-pw"),
        "the audit page lists the app's actions, no password: {audit:?}"
    );
    assert!(
        result["rows_in_dom"].as_u64().unwrap_or(u64::MAX) < 150,
        "the accounts table renders a window, not every row: {result}"
    );
    for page in [
        "login",
        "dashboard",
        "accounts",
        "keys-created",
        "keys-limits",
        "usage",
        "settings-invalid",
        "proxies",
        "ops",
    ] {
        let p = shots.join(format!("{page}.png"));
        let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        assert!(len > 10_000, "screenshot {} missing or empty", p.display());
    }
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "the browser run took too long"
    );
}
