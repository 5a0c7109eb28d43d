//! Credential import: every file format, directories, merges, refresh-token lines, and the
//! blocking CLI helpers.

use std::path::PathBuf;

use admin::{
    import::import_paths,
    oauth::{build_http_client, OAuthClient},
};
use serde_json::json;
use shared_state::AccountStatus;

use crate::support::{jwt, write, MockOAuth, TestDb, FAR_EXP};

fn oauth(url: &str) -> OAuthClient {
    OAuthClient::new(build_http_client(None).unwrap(), url)
}

fn official(account: &str, user: &str, email: &str, rt: &str) -> serde_json::Value {
    json!({
        "auth_mode": "chatgpt",
        "OPENAI_API_KEY": null,
        "tokens": {
            "id_token": jwt(account, user, email, "pro", FAR_EXP),
            "access_token": jwt(account, user, email, "pro", FAR_EXP),
            "refresh_token": rt,
            "account_id": account,
        },
        "last_refresh": "2025-09-01T10:00:00.123456Z",
    })
}

fn cpa(account: &str, email: &str, rt: &str) -> serde_json::Value {
    json!({
        "type": "codex",
        "id_token": jwt(account, "user-cpa", email, "plus", FAR_EXP),
        "access_token": jwt(account, "user-cpa", email, "plus", FAR_EXP),
        "refresh_token": rt,
        "account_id": account,
        "email": email,
        "last_refresh": "2025-09-01T10:00:00+02:00",
        "expired": "2030-01-01T00:00:00Z",
    })
}

#[tokio::test]
async fn import_official_auth_json() {
    let db = TestDb::sqlite();
    let s = db.open().await;
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "auth.json",
        &official("acc-off", "user-1", "o@x.io", "rt-off").to_string(),
    );
    let sum = import_paths(s.as_ref(), &oauth("http://127.0.0.1:9/unused"), &[f]).await;
    assert_eq!(sum.added.len(), 1, "{sum}");
    assert!(sum.updated.is_empty() && sum.skipped.is_empty(), "{sum}");
    let rows = s.list_accounts().await.unwrap();
    assert_eq!(rows[0].chatgpt_account_id, "acc-off");
    assert_eq!(rows[0].user_id, "user-1");
    assert_eq!(rows[0].email.as_deref(), Some("o@x.io"));
    assert_eq!(rows[0].plan_type.as_deref(), Some("pro"));
    assert_eq!(rows[0].access_expires_at, Some(FAR_EXP));
    assert_eq!(rows[0].last_refresh_at, Some(1_756_720_800_123));
    let (_, sec) = s.get_account(rows[0].id).await.unwrap().unwrap();
    assert_eq!(sec.refresh_token.expose(), "rt-off");
    assert!(sum.to_string().starts_with("1 added, 0 updated, 0 skipped"));
}

#[tokio::test]
async fn import_cpa_flat_and_arrays_and_reimport_merges() {
    let db = TestDb::sqlite();
    let s = db.open().await;
    let dir = tempfile::tempdir().unwrap();
    let flat = write(
        dir.path(),
        "codex-a.json",
        &cpa("acc-cpa", "c@x.io", "rt-c").to_string(),
    );
    let arr = write(
        dir.path(),
        "many.json",
        &json!([cpa("acc-arr1", "a1@x", "rt-a1"), official("acc-arr2", "u2", "a2@x", "rt-a2"), {"hello": 1}]).to_string(),
    );
    let o = oauth("http://127.0.0.1:9/unused");
    let sum = import_paths(s.as_ref(), &o, &[flat.clone(), arr]).await;
    assert_eq!(sum.added.len(), 3, "{sum}");
    assert_eq!(sum.skipped.len(), 1, "{sum}");
    assert!(sum.skipped[0].0.ends_with("many.json[2]"), "{sum}");
    let rows = s.list_accounts().await.unwrap();
    let c = rows
        .iter()
        .find(|r| r.chatgpt_account_id == "acc-cpa")
        .unwrap();
    assert_eq!(c.user_id, "user-cpa");
    assert_eq!(c.plan_type.as_deref(), Some("plus"));
    assert_eq!(c.last_refresh_at, Some(1_756_713_600_000));

    // Re-importing the same account merges.
    let mut v = cpa("acc-cpa", "c@x.io", "rt-c2");
    v["id_token"] = json!(jwt("acc-cpa", "user-cpa", "c@x.io", "pro", FAR_EXP));
    std::fs::write(&flat, v.to_string()).unwrap();
    let sum = import_paths(s.as_ref(), &o, &[flat]).await;
    assert_eq!((sum.added.len(), sum.updated.len()), (0, 1), "{sum}");
    let rows = s.list_accounts().await.unwrap();
    assert_eq!(rows.len(), 3);
    let c = rows
        .iter()
        .find(|r| r.chatgpt_account_id == "acc-cpa")
        .unwrap();
    assert_eq!(c.plan_type.as_deref(), Some("pro"));
    assert_eq!(
        s.get_account(c.id)
            .await
            .unwrap()
            .unwrap()
            .1
            .refresh_token
            .expose(),
        "rt-c2"
    );
}

#[tokio::test]
async fn import_directory_skips_invalid_without_aborting() {
    let db = TestDb::sqlite();
    let s = db.open().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("creds");
    write(
        &root,
        "a/auth.json",
        &official("acc-d1", "u", "d1@x", "rt-d1").to_string(),
    );
    write(
        &root,
        "b/c/deep.JSON",
        &cpa("acc-d2", "d2@x", "rt-d2").to_string(),
    );
    write(&root, "broken.json", "{ not json");
    write(
        &root,
        "other.json",
        r#"{"type":"claude","access_token":"x"}"#,
    );
    write(
        &root,
        "noid.json",
        r#"{"type":"codex","access_token":"not-a-jwt","refresh_token":"r"}"#,
    );
    write(&root, "empty.txt", "\n\n");
    write(&root, "README.md", "ignored: not json/txt");
    // The AT-only line form: a JWT per line.
    write(
        &root,
        "ats.txt",
        &format!(
            "# access tokens\n{}\n",
            jwt("acc-at", "u-at", "at@x", "team", FAR_EXP)
        ),
    );
    let missing = dir.path().join("does-not-exist.json");
    let sum = import_paths(
        s.as_ref(),
        &oauth("http://127.0.0.1:9/unused"),
        &[root, missing],
    )
    .await;
    assert_eq!(sum.added.len(), 3, "{sum}");
    let reasons: Vec<String> = sum
        .skipped
        .iter()
        .map(|(s, r)| format!("{s}: {r}"))
        .collect();
    assert_eq!(sum.skipped.len(), 5, "{reasons:#?}");
    assert!(reasons
        .iter()
        .any(|r| r.contains("broken.json") && r.contains("invalid JSON")));
    assert!(reasons
        .iter()
        .any(|r| r.contains("other.json") && r.contains("not codex")));
    assert!(reasons
        .iter()
        .any(|r| r.contains("noid.json") && r.contains("chatgpt_account_id")));
    assert!(reasons.iter().any(|r| r.contains("empty.txt")));
    assert!(reasons
        .iter()
        .any(|r| r.contains("does-not-exist.json") && r.contains("cannot read")));
    assert!(!reasons.iter().any(|r| r.contains("README")));
    let at_only = s
        .list_accounts()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.chatgpt_account_id == "acc-at")
        .unwrap();
    assert_eq!(at_only.plan_type.as_deref(), Some("team"));
    let (_, sec) = s.get_account(at_only.id).await.unwrap().unwrap();
    assert!(sec.refresh_token.is_empty());
    assert!(!sec.access_token.is_empty());
}

#[tokio::test]
async fn import_refresh_token_lines_stores_rotated_token() {
    let mock = MockOAuth::start();
    mock.add_rt("rt-line-1", "acc-rt1", "u1", "r1@x", "plus");
    mock.add_rt("rt-line-2", "acc-rt2", "u2", "r2@x", "pro");
    let db = TestDb::sqlite();
    let s = db.open().await;
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "tokens.txt",
        "rt-line-1\n\n# comment\nrt-unknown\n  rt-line-2  \n",
    );
    let sum = import_paths(s.as_ref(), &oauth(&mock.url), &[f]).await;
    assert_eq!(sum.added.len(), 2, "{sum}");
    assert_eq!(sum.skipped.len(), 1, "{sum}");
    assert!(sum.skipped[0].0.ends_with("tokens.txt:4"), "{sum}");
    assert!(sum.skipped[0].1.contains("invalid_grant"), "{sum}");
    assert!(
        !sum.to_string().contains("rt-unknown"),
        "reasons never echo tokens"
    );
    assert_eq!(mock.calls(), 3);
    assert!(mock.is_used("rt-line-1"));
    let rows = s.list_accounts().await.unwrap();
    let r1 = rows
        .iter()
        .find(|r| r.chatgpt_account_id == "acc-rt1")
        .unwrap();
    assert_eq!(r1.email.as_deref(), Some("r1@x"));
    assert_eq!(r1.user_id, "u1");
    assert!(r1.last_refresh_at.is_some());
    let (_, sec) = s.get_account(r1.id).await.unwrap().unwrap();
    assert_eq!(
        Some(sec.refresh_token.expose().to_owned()),
        mock.current_rt("acc-rt1"),
        "the rotated RT is stored"
    );
    assert_ne!(sec.refresh_token.expose(), "rt-line-1");
    assert!(!sec.id_token.is_empty());

    // A transient endpoint failure is a skip with the reason, not an abort.
    mock.force(Some((503, r#"{"error":"temporarily_unavailable"}"#)));
    let f2 = write(dir.path(), "more.txt", "rt-whatever\n");
    let sum = import_paths(s.as_ref(), &oauth(&mock.url), &[f2]).await;
    assert_eq!(sum.skipped.len(), 1);
    assert!(sum.skipped[0].1.contains("503"), "{sum}");
}

/// The blocking CLI helpers (plain #[test]: they build their own runtime).
#[test]
fn cli_helpers_roundtrip() {
    let mock = MockOAuth::start();
    mock.add_rt("rt-cli", "acc-cli", "u", "cli@x", "plus");
    let db = TestDb::sqlite();
    let target = db.target();
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = vec![
        write(
            dir.path(),
            "auth.json",
            &official("acc-o", "u", "o@x", "rt").to_string(),
        ),
        write(dir.path(), "rt.txt", "rt-cli\n"),
    ];
    let sum = admin::cli::accounts_import(&target, &files, &mock.url).unwrap();
    assert_eq!(sum.added.len(), 2, "{sum}");
    let sum = admin::cli::accounts_import(&target, &files[..1], &mock.url).unwrap();
    assert_eq!(sum.updated.len(), 1, "{sum}");
    let rows = admin::cli::accounts_list(&target).unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r.status == AccountStatus::Active));
    let listed = serde_json::to_string(&rows).unwrap();
    assert!(
        !listed.contains("rt-") && !listed.contains("token_enc"),
        "no tokens in rows"
    );

    let k1 = admin::cli::keys_create(&target, "alice").unwrap();
    let _k2 = admin::cli::keys_create(&target, "bob").unwrap();
    assert!(admin::cli::keys_create(&target, "  ").is_err());
    let keys = admin::cli::keys_list(&target).unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0].key_prefix, &k1[..10]);
    assert!(
        !serde_json::to_string(&keys)
            .unwrap()
            .contains(&keys[0].key_hash),
        "hash not serialized"
    );
    assert_eq!(
        admin::cli::keys_revoke(&target, &keys[0].id.to_string()).unwrap(),
        1
    );
    assert_eq!(admin::cli::keys_revoke(&target, "bob").unwrap(), 1);
    assert!(matches!(
        admin::cli::keys_revoke(&target, "bob"),
        Err(admin::AdminError::NotFound(_))
    ));
    assert!(admin::cli::keys_list(&target)
        .unwrap()
        .iter()
        .all(|k| k.revoked_at.is_some()));

    // A bad URL is one clear error.
    let bad = admin::DbTarget {
        data_dir: target.data_dir.clone(),
        database_url: Some("mysql://u:pw@h/db".into()),
    };
    let e = admin::cli::accounts_list(&bad).unwrap_err().to_string();
    assert!(
        e.contains("unsupported database URL") && !e.contains("pw"),
        "{e}"
    );
}
