//! The storage suite, run against both backends.

use std::{sync::Arc, time::Duration};

use admin::{
    publish::Publisher,
    storage::{AccountUpsert, Backend, QuotaUpdate, TokenUpdate, TokenWrite},
};
use shared_state::{
    channels, keys::hash_key_hex, AccountEffect, AccountStatus, Secret, Settings, Snapshot,
    UsageRecord, WorkerCommand,
};

use crate::support::{both_backends, jwt, TestDb, FAR_EXP};

fn upsert(account: &str, user: &str, email: Option<&str>, at: &str, rt: &str) -> AccountUpsert {
    AccountUpsert {
        chatgpt_account_id: account.into(),
        user_id: user.into(),
        email: email.map(Into::into),
        plan_type: Some("plus".into()),
        access_token: Secret::new(at),
        refresh_token: Secret::new(rt),
        id_token: Secret::new(""),
        access_expires_at: Some(FAR_EXP),
        last_refresh_at: None,
    }
}

fn usage(i: u64) -> UsageRecord {
    UsageRecord {
        key_id: 1,
        account_id: match i % 3 {
            0 => None,
            _ => Some(7),
        },
        route: "responses",
        model: format!("gpt-5-codex-{i}"),
        status: 200,
        stream: i % 2 != 1,
        input_tokens: i,
        cached_tokens: 1,
        output_tokens: 2 * i,
        reasoning_tokens: 3,
        ttfb_ms: (i % 2 != 1).then_some(12),
        latency_ms: 100 + i,
        error_code: match i % 5 {
            0 => Some("server_error".into()),
            _ => None,
        },
        started_at_ms: 1_700_000_000_000 + i,
        cost_micros: 10 * i,
        ..Default::default()
    }
}

async fn migrations_apply_and_ping(db: &TestDb) {
    let s = db.open().await;
    s.ping().await.unwrap();
    assert_eq!(
        s.backend(),
        if db.is_pg() {
            Backend::Postgres
        } else {
            Backend::Sqlite
        }
    );
    assert!(s.list_accounts().await.unwrap().is_empty());
    assert!(s.list_keys().await.unwrap().is_empty());
    assert_eq!(s.usage_count().await.unwrap(), 0);
    s.close().await.unwrap();
    // Re-opening re-runs migrations idempotently and keeps data.
    let s = db.open().await;
    s.upsert_account(&upsert("acc", "", None, "at", "rt"))
        .await
        .unwrap();
    s.close().await.unwrap();
    let s = db.open().await;
    assert_eq!(s.list_accounts().await.unwrap().len(), 1);
    if !db.is_pg() {
        assert!(db.target().data_dir.join(admin::DEFAULT_DB_FILE).exists());
        assert!(db.target().data_dir.join("secret.key").exists());
    }
}

async fn account_upsert_merges(db: &TestDb) {
    let s = db.open().await;
    let a = s
        .upsert_account(&upsert("acc-1", "user-1", Some("a@x.io"), "at-1", "rt-1"))
        .await
        .unwrap();
    assert!(a.created);
    // Same (account, user): merge, tokens replaced, email kept when absent.
    let mut u = upsert("acc-1", "user-1", None, "at-2", "rt-2");
    u.plan_type = Some("pro".into());
    let b = s.upsert_account(&u).await.unwrap();
    assert_eq!(
        b,
        admin::storage::UpsertOutcome {
            id: a.id,
            created: false
        }
    );
    let (row, sec) = s.get_account(a.id).await.unwrap().unwrap();
    assert_eq!(row.email.as_deref(), Some("a@x.io"));
    assert_eq!(row.plan_type.as_deref(), Some("pro"));
    assert_eq!(sec.access_token.expose(), "at-2");
    assert_eq!(sec.refresh_token.expose(), "rt-2");
    // An empty refresh token keeps the stored one.
    s.upsert_account(&upsert("acc-1", "user-1", None, "at-3", ""))
        .await
        .unwrap();
    let (_, sec) = s.get_account(a.id).await.unwrap().unwrap();
    assert_eq!(sec.access_token.expose(), "at-3");
    assert_eq!(sec.refresh_token.expose(), "rt-2");
    // Team workspaces: same account id, other user => another row; unknown user ('') too.
    let c = s
        .upsert_account(&upsert("acc-1", "user-2", None, "at", "rt"))
        .await
        .unwrap();
    assert!(c.created);
    let d = s
        .upsert_account(&upsert("acc-1", "", None, "at", "rt"))
        .await
        .unwrap();
    assert!(d.created);
    let d2 = s
        .upsert_account(&upsert("acc-1", "", None, "at", "rt"))
        .await
        .unwrap();
    assert_eq!(d2.id, d.id);
    assert!(!d2.created);
    assert_eq!(s.list_accounts().await.unwrap().len(), 3);
    // Re-import revives reauth_required but keeps an operator's disable.
    s.set_status(a.id, AccountStatus::ReauthRequired)
        .await
        .unwrap();
    s.set_status(c.id, AccountStatus::Disabled).await.unwrap();
    s.set_limits(a.id, Some(5), Some(2)).await.unwrap();
    s.upsert_account(&upsert("acc-1", "user-1", None, "at", "rt"))
        .await
        .unwrap();
    s.upsert_account(&upsert("acc-1", "user-2", None, "at", "rt"))
        .await
        .unwrap();
    let rows = s.list_accounts().await.unwrap();
    let ra = rows.iter().find(|r| r.id == a.id).unwrap();
    assert_eq!(ra.status, AccountStatus::Active);
    assert_eq!(
        (ra.weight, ra.max_concurrency),
        (5, 2),
        "operator limits survive a re-import"
    );
    assert_eq!(
        rows.iter().find(|r| r.id == c.id).unwrap().status,
        AccountStatus::Disabled
    );
    // Ordered by id.
    assert!(rows.windows(2).all(|w| w[0].id < w[1].id));
    // Delete.
    assert!(s.delete_account(d.id).await.unwrap());
    assert!(!s.delete_account(d.id).await.unwrap());
    assert!(s.get_account(d.id).await.unwrap().is_none());
}

async fn tokens_encrypted_at_rest(db: &TestDb) {
    let s = db.open().await;
    let at = jwt("acc-enc", "u", "e@x", "plus", FAR_EXP);
    let mut u = upsert("acc-enc", "u", None, &at, "rt-plain-secret");
    u.id_token = Secret::new("id-plain-secret");
    let id = s.upsert_account(&u).await.unwrap().id;
    let (a, r, i) = db.raw_token_columns(id).await;
    for (col, plain) in [
        (&a, at.as_str()),
        (&r, "rt-plain-secret"),
        (&i, "id-plain-secret"),
    ] {
        assert!(col.starts_with("v2:"), "stored form is versioned: {col}");
        assert!(!col.contains(plain), "plaintext must not be stored");
    }
    let (_, sec) = s.get_account(id).await.unwrap().unwrap();
    assert_eq!(sec.access_token.expose(), at);
    assert_eq!(sec.refresh_token.expose(), "rt-plain-secret");
    assert_eq!(sec.id_token.expose(), "id-plain-secret");
    assert!(!sec.decrypt_failed);

    // Refresh without a new refresh token keeps the old one; with one replaces it.
    let upd = TokenUpdate {
        access_token: Secret::new("at-new"),
        refresh_token: None,
        id_token: None,
        access_expires_at: Some(123),
        email: Some("new@x".into()),
        plan_type: None,
        fence: None,
    };
    assert_eq!(s.update_tokens(id, &upd).await.unwrap(), TokenWrite::Stored);
    let (row, sec) = s.get_account(id).await.unwrap().unwrap();
    assert_eq!(sec.access_token.expose(), "at-new");
    assert_eq!(sec.refresh_token.expose(), "rt-plain-secret");
    assert_eq!(sec.id_token.expose(), "id-plain-secret");
    assert_eq!(row.access_expires_at, Some(123));
    assert_eq!(row.email.as_deref(), Some("new@x"));
    assert_eq!(row.plan_type.as_deref(), Some("plus"));
    assert!(row.last_refresh_at.is_some());
    let upd = TokenUpdate {
        access_token: Secret::new("at-3"),
        refresh_token: Some(Secret::new("rt-3")),
        id_token: Some(Secret::new("id-3")),
        access_expires_at: None,
        email: None,
        plan_type: None,
        fence: None,
    };
    assert_eq!(s.update_tokens(id, &upd).await.unwrap(), TokenWrite::Stored);
    let (_, sec) = s.get_account(id).await.unwrap().unwrap();
    assert_eq!(sec.refresh_token.expose(), "rt-3");
    assert_eq!(sec.id_token.expose(), "id-3");
    assert_eq!(
        s.update_tokens(id + 1000, &upd).await.unwrap(),
        TokenWrite::NoAccount
    );
    let (_, r, _) = db.raw_token_columns(id).await;
    assert!(r.starts_with("v2:") && !r.contains("rt-3"));
}

/// Token writes are fenced: a refresh under an older lease (a lower fence) never overwrites
/// what a refresh under a newer one stored; the same fence may write again (a held rotation's
/// retry); a write without a lease (no Redis, the CLI) is never refused.
async fn token_writes_are_fenced(db: &TestDb) {
    let s = db.open().await;
    let id = s
        .upsert_account(&upsert("acc-f", "", None, "at-0", "rt-0"))
        .await
        .unwrap()
        .id;
    let upd = |n: u32, fence: Option<i64>| TokenUpdate {
        access_token: Secret::new(format!("at-{n}")),
        refresh_token: Some(Secret::new(format!("rt-{n}"))),
        id_token: None,
        access_expires_at: None,
        email: None,
        plan_type: None,
        fence,
    };
    let tokens = || async {
        let (row, sec) = s.get_account(id).await.unwrap().unwrap();
        (
            sec.access_token.expose().to_owned(),
            sec.refresh_token.expose().to_owned(),
            row.refresh_fence,
        )
    };
    assert_eq!(tokens().await.2, 0);
    // The newer holder (fence 5) stores first...
    assert_eq!(
        s.update_tokens(id, &upd(2, Some(5))).await.unwrap(),
        TokenWrite::Stored
    );
    assert_eq!(tokens().await, ("at-2".into(), "rt-2".into(), 5));
    // ...the holder whose lease was lost (fence 4) finishes later: refused, nothing changes.
    assert_eq!(
        s.update_tokens(id, &upd(1, Some(4))).await.unwrap(),
        TokenWrite::Fenced
    );
    assert_eq!(tokens().await, ("at-2".into(), "rt-2".into(), 5));
    // The same fence writes again (a held rotation's retry), a higher one too.
    assert_eq!(
        s.update_tokens(id, &upd(3, Some(5))).await.unwrap(),
        TokenWrite::Stored
    );
    assert_eq!(
        s.update_tokens(id, &upd(4, Some(9))).await.unwrap(),
        TokenWrite::Stored
    );
    assert_eq!(tokens().await, ("at-4".into(), "rt-4".into(), 9));
    // No lease: written, the stored fence stays.
    assert_eq!(
        s.update_tokens(id, &upd(5, None)).await.unwrap(),
        TokenWrite::Stored
    );
    assert_eq!(tokens().await, ("at-5".into(), "rt-5".into(), 9));
    s.close().await.unwrap();
}

async fn status_cooldown_quota_limits(db: &TestDb) {
    let s = db.open().await;
    let id = s
        .upsert_account(&upsert("acc-q", "", None, "at", "rt"))
        .await
        .unwrap()
        .id;
    let before = s.get_account(id).await.unwrap().unwrap().0;
    assert_eq!(before.status, AccountStatus::Active);
    assert_eq!((before.weight, before.max_concurrency), (1, 0));
    assert!(s.set_status(id, AccountStatus::Banned).await.unwrap());
    assert!(!s.set_status(id + 99, AccountStatus::Banned).await.unwrap());
    assert!(s
        .set_cooldown(id, 1_900_000_000_000, Some("usage_limit_reached"))
        .await
        .unwrap());
    let q = QuotaUpdate {
        primary_pct: Some(42.5),
        primary_reset_at: Some(1_800_000_000),
        secondary_pct: None,
        secondary_reset_at: None,
    };
    assert!(s.record_quota(id, q).await.unwrap());
    let q2 = QuotaUpdate {
        secondary_pct: Some(7.0),
        ..Default::default()
    };
    assert!(s.record_quota(id, q2).await.unwrap());
    assert!(s.set_limits(id, None, Some(3)).await.unwrap());
    let r = s.get_account(id).await.unwrap().unwrap().0;
    assert_eq!(r.status, AccountStatus::Banned);
    assert_eq!(r.cooldown_until_ms, 1_900_000_000_000);
    assert_eq!(r.cooldown_reason.as_deref(), Some("usage_limit_reached"));
    assert_eq!(r.primary_used_pct, Some(42.5));
    assert_eq!(r.primary_reset_at, Some(1_800_000_000));
    assert_eq!(
        r.secondary_used_pct,
        Some(7.0),
        "None fields keep, Some fields write"
    );
    assert!(r.quota_updated_at.is_some());
    assert_eq!((r.weight, r.max_concurrency), (1, 3));
    // Cooldown and quota writes do not count as content changes for the snapshot.
    assert!(s.set_cooldown(id, 0, None).await.unwrap());
    let r2 = s.get_account(id).await.unwrap().unwrap().0;
    assert_eq!(r2.updated_at, r.updated_at);
    assert_eq!(r2.cooldown_until_ms, 0);
}

async fn keys_create_list_revoke(db: &TestDb) {
    let s = db.open().await;
    let (plain, row) = admin::cli::create_key(s.as_ref(), "laptop").await.unwrap();
    assert!(plain.starts_with(shared_state::keys::KEY_PREFIX));
    assert_eq!(row.key_prefix, &plain[..10]);
    assert_eq!(row.key_hash, hash_key_hex(&plain));
    assert!(row.revoked_at.is_none());
    let found = s
        .find_key_by_hash(&hash_key_hex(&plain))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.id, row.id);
    assert!(s
        .find_key_by_hash(&hash_key_hex("sk-cg-nope"))
        .await
        .unwrap()
        .is_none());
    let (_p2, r2) = admin::cli::create_key(s.as_ref(), "ci").await.unwrap();
    let (_p3, r3) = admin::cli::create_key(s.as_ref(), "ci").await.unwrap();
    let keys = s.list_keys().await.unwrap();
    assert_eq!(
        keys.iter().map(|k| k.id).collect::<Vec<_>>(),
        vec![row.id, r2.id, r3.id]
    );
    assert!(s.revoke_key(row.id).await.unwrap());
    assert!(!s.revoke_key(row.id).await.unwrap(), "already revoked");
    assert_eq!(s.revoke_keys_by_name("ci").await.unwrap(), 2);
    assert_eq!(s.revoke_keys_by_name("ci").await.unwrap(), 0);
    assert!(s
        .list_keys()
        .await
        .unwrap()
        .iter()
        .all(|k| k.revoked_at.is_some()));
    // The hash is unique.
    assert!(s
        .create_key("dup", &row.key_hash, "sk-cg-dup")
        .await
        .is_err());
}

/// Key limits and account groups round-trip; key spend (with the stored cost) is what
/// budgets start from after a restart; a new key's live counters in the snapshot are seeded
/// with it.
async fn key_limits_groups_and_spend(db: &TestDb) {
    use shared_state::keys::{day_of, KeyLimits};
    let s = db.open().await;
    let (plain, row) = admin::cli::create_key(s.as_ref(), "limited").await.unwrap();
    assert_eq!(
        row.limits,
        KeyLimits::unlimited(),
        "a new key has no limits"
    );
    let limits = KeyLimits {
        rpm: Some(60),
        max_concurrency: Some(4),
        tokens_per_day: Some(1_000),
        tokens_per_month: Some(u64::MAX),
        cost_per_day_micros: Some(2_500_000),
        cost_per_month_micros: None,
        allowed_models: vec!["gpt-5.5".into(), "gpt-6*".into()],
        account_group: Some("team-a".into()),
        service_tier: Some(shared_state::snapshot::ServiceTierPolicy::Strip),
        expires_at_ms: Some(4_102_444_800_000),
        enabled: false,
    };
    assert!(s.update_key_limits(row.id, &limits).await.unwrap());
    assert!(!s.update_key_limits(row.id + 1000, &limits).await.unwrap());
    let got = s
        .find_key_by_hash(&hash_key_hex(&plain))
        .await
        .unwrap()
        .unwrap();
    let mut want = limits.clone();
    want.tokens_per_month = Some(i64::MAX as u64); // saturates into BIGINT
    assert_eq!(got.limits, want);
    s.touch_keys(&[(row.id, 5_000), (row.id, 4_000)])
        .await
        .unwrap();
    let got = s
        .find_key_by_hash(&hash_key_hex(&plain))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.last_used_at, Some(5_000), "last use only moves forward");
    // The service tier policy unset again (NULL: the global setting applies); an unknown
    // stored name loads as unset.
    let mut unset = want.clone();
    unset.service_tier = None;
    assert!(s.update_key_limits(row.id, &unset).await.unwrap());
    let tier = async || {
        s.find_key_by_hash(&hash_key_hex(&plain))
            .await
            .unwrap()
            .unwrap()
            .limits
            .service_tier
    };
    assert_eq!(tier().await, None);
    db.raw_exec("UPDATE api_keys SET service_tier = 'refuse'", &[])
        .await;
    assert_eq!(
        tier().await,
        Some(shared_state::snapshot::ServiceTierPolicy::Refuse)
    );
    db.raw_exec("UPDATE api_keys SET service_tier = 'turbo'", &[])
        .await;
    assert_eq!(tier().await, None);
    assert!(s.update_key_limits(row.id, &want).await.unwrap());

    let acc = crate::sidecar::seed_account(s.as_ref(), "acct-g", "rt").await;
    assert!(s.set_account_group(acc, Some("team-a")).await.unwrap());
    let rows = s.list_accounts().await.unwrap();
    assert_eq!(rows[0].account_group.as_deref(), Some("team-a"));
    assert!(s.set_account_group(acc, None).await.unwrap());
    assert_eq!(s.list_accounts().await.unwrap()[0].account_group, None);

    let now = shared_state::now_ms();
    let mut recs: Vec<UsageRecord> = (1..=3).map(usage).collect();
    for r in &mut recs {
        r.key_id = row.id;
        r.started_at_ms = now;
    }
    recs[0].started_at_ms = 1_000; // long ago: not in today's spend
    s.insert_usage(&recs).await.unwrap();
    let today = shared_state::keys::day_start_ms(day_of(now)) as i64;
    let spend = s.key_spend(today).await.unwrap();
    let mine = spend.iter().find(|k| k.key_id == row.id).unwrap();
    // usage(i): input i, output 2i, cost 10i
    assert_eq!(mine.requests, 2);
    assert_eq!(mine.tokens, (2 + 4) + (3 + 6));
    assert_eq!(mine.cost_micros, 20 + 30);

    // A fresh publisher seeds the key's counters from storage.
    s.update_key_limits(row.id, &KeyLimits::unlimited())
        .await
        .unwrap();
    let snap = Snapshot::shared();
    let (mailboxes, _boxes) = channels::mailboxes(1);
    let p = Publisher::new(Arc::clone(&snap), mailboxes, Settings::default());
    p.reload(s.as_ref(), true).await.unwrap();
    let cur = snap.load();
    let k = cur.key(&plain).unwrap();
    assert_eq!(k.live.day.tokens.value(day_of(now)), 15);
    assert_eq!(k.live.day.cost_micros.value(day_of(now)), 50);
    assert_eq!(k.live.day.requests.value(day_of(now)), 2);
}

async fn usage_insert_batch(db: &TestDb) {
    let s = db.open().await;
    let recs: Vec<UsageRecord> = (0..450).map(usage).collect();
    assert_eq!(s.insert_usage(&recs).await.unwrap(), 450);
    assert_eq!(s.insert_usage(&[]).await.unwrap(), 0);
    assert_eq!(s.usage_count().await.unwrap(), 450);
    // Extreme values survive (u64 saturates into BIGINT).
    let mut big = usage(1);
    big.input_tokens = u64::MAX;
    s.insert_usage(&[big]).await.unwrap();
    assert_eq!(s.usage_count().await.unwrap(), 451);
}

/// A record id is stored once: a replay of the durable spool (the same ids again, alone or
/// mixed with new ones) inserts only the new ones, and the hourly rollups count each record
/// once. Every new field round-trips; retention prunes raw rows and rollups apart.
async fn usage_dedup_rollups_and_retention(db: &TestDb) {
    use admin::storage::{UsageFilter, HOUR_MS};
    let s = db.open().await;
    let hour = 1_700_002_800_000i64 / HOUR_MS * HOUR_MS;
    let mk = |i: u64| UsageRecord {
        id: UsageRecord::new_id(),
        key_id: 3,
        account_id: i.is_multiple_of(2).then_some(9),
        route: "chat_completions",
        model: "gpt-5".into(),
        status: if i == 3 { 502 } else { 200 },
        stream: true,
        input_tokens: 10,
        cached_tokens: 4,
        output_tokens: 20,
        reasoning_tokens: 5,
        ttfb_ms: Some(7),
        latency_ms: 100,
        error_code: (i == 3).then(|| "upstream_error".into()),
        started_at_ms: (hour + (i as i64) * 60_000) as u64,
        reasoning_effort: Some("high".into()),
        service_tier: Some("priority".into()),
        transport: shared_state::Transport::HttpFallback,
        ttft_ms: Some(42),
        failovers: 2,
        error_class: (i == 3).then(|| "server_is_overloaded".into()),
        cost_micros: 17,
        request_id: format!("req_{i}"),
        bytes_out: 0,
    };
    let recs: Vec<UsageRecord> = (0..4).map(mk).collect();
    assert_eq!(s.insert_usage(&recs[..2]).await.unwrap(), 2);
    // A replay of all four: the first two are already stored.
    assert_eq!(s.insert_usage(&recs).await.unwrap(), 2);
    assert_eq!(s.insert_usage(&recs).await.unwrap(), 0);
    assert_eq!(s.usage_count().await.unwrap(), 4);

    let rows = s.usage_rows(UsageFilter::default(), 0, 100).await.unwrap();
    assert_eq!(rows.len(), 4);
    let r = &rows[3];
    assert_eq!(r.record_id.as_deref(), Some(recs[3].id_hex().as_str()));
    assert_eq!(r.reasoning_effort.as_deref(), Some("high"));
    assert_eq!(r.service_tier.as_deref(), Some("priority"));
    assert_eq!(r.transport.as_deref(), Some("http_fallback"));
    assert_eq!((r.ttft_ms, r.failovers), (Some(42), 2));
    assert_eq!(r.error_class.as_deref(), Some("server_is_overloaded"));
    assert_eq!(r.route, "chat_completions");
    assert_eq!(r.request_id.as_deref(), Some("req_3"));
    // Found by its request id (migration 0021).
    let by_id = s.usage_by_request_id("req_3", 10).await.unwrap();
    assert_eq!(by_id, vec![r.clone()]);
    assert!(s.usage_by_request_id("req_9", 10).await.unwrap().is_empty());
    // Paging by id.
    let page = s
        .usage_rows(UsageFilter::default(), rows[1].id, 1)
        .await
        .unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].id, rows[2].id);

    let roll = s.usage_rollups(UsageFilter::default()).await.unwrap();
    assert_eq!(roll.len(), 2, "{roll:?}");
    let with = roll.iter().find(|r| r.account_id == Some(9)).unwrap();
    let without = roll.iter().find(|r| r.account_id.is_none()).unwrap();
    assert_eq!(with.hour_ms, hour);
    assert_eq!(with.totals.requests, 2);
    assert_eq!(without.totals.requests, 2);
    assert_eq!(without.totals.errors, 1);
    assert_eq!(with.totals.input_tokens + without.totals.input_tokens, 40);
    assert_eq!(with.failovers + without.failovers, 8);
    assert_eq!(with.latency_ms_sum, 200);
    // Cost is rolled up too (17 per record; the replayed duplicates add nothing).
    assert_eq!((with.cost_micros, without.cost_micros), (34, 34));

    // Retention: raw records before `hour + 2 min` go; the rollup hour stays.
    let (raw, rolled) = s.prune_usage(Some(hour + 2 * 60_000), None).await.unwrap();
    assert_eq!((raw, rolled), (2, 0));
    assert_eq!(s.usage_count().await.unwrap(), 2);
    assert_eq!(
        s.usage_rollups(UsageFilter::default()).await.unwrap().len(),
        2
    );
    let (raw, rolled) = s.prune_usage(None, Some(hour + HOUR_MS)).await.unwrap();
    assert_eq!((raw, rolled), (0, 2));
    assert!(s
        .usage_rollups(UsageFilter::default())
        .await
        .unwrap()
        .is_empty());
}

/// A record twice in one batch (the same id) is stored once and rolled up once; the rollup
/// sums come from the records whose ids the INSERT returned.
async fn usage_repeated_record_in_a_batch_counts_once(db: &TestDb) {
    use admin::storage::{UsageFilter, HOUR_MS};
    let s = db.open().await;
    let mut a = usage(3);
    a.id = UsageRecord::new_id();
    a.started_at_ms = 7 * HOUR_MS as u64;
    let mut b = usage(6);
    b.id = UsageRecord::new_id();
    b.started_at_ms = a.started_at_ms;
    b.model = a.model.clone();
    assert_eq!(
        s.insert_usage(&[a.clone(), a.clone(), b.clone()])
            .await
            .unwrap(),
        2
    );
    assert_eq!(s.usage_count().await.unwrap(), 2);
    let roll = s.usage_rollups(UsageFilter::default()).await.unwrap();
    assert_eq!(roll.len(), 1, "{roll:?}");
    assert_eq!(roll[0].totals.requests, 2);
    assert_eq!(roll[0].totals.input_tokens, a.input_tokens + b.input_tokens);
    assert_eq!(roll[0].cost_micros, a.cost_micros + b.cost_micros);
    // All of them again (a replay): nothing stored, nothing added.
    assert_eq!(s.insert_usage(&[a, b]).await.unwrap(), 0);
    let again = s.usage_rollups(UsageFilter::default()).await.unwrap();
    assert_eq!(again[0].totals.requests, 2);
}

/// The reload after this instance's own change announces it to the fleet even when a quiet
/// reload (the periodic one, or one after another instance's invalidation) got there first and
/// published the change itself: otherwise the other instances would hear of it only at their
/// next periodic reload.
async fn own_change_is_announced_after_a_quiet_reload_published_it(db: &TestDb) {
    let s = db.open().await;
    let snap = Snapshot::shared();
    let (mailboxes, _boxes) = channels::mailboxes(1);
    let p = Publisher::new(Arc::clone(&snap), mailboxes, Settings::default());
    p.reload_quiet(s.as_ref(), true).await.unwrap();
    let announced = || async {
        tokio::time::timeout(Duration::from_millis(200), p.announced())
            .await
            .is_ok()
    };
    // A mutation, then a quiet reload that publishes it before the mutation's own reload.
    admin::cli::create_key(s.as_ref(), "k").await.unwrap();
    assert!(p.reload_quiet(s.as_ref(), false).await.unwrap().is_some());
    assert!(!announced().await, "a quiet reload announces nothing");
    assert_eq!(p.reload(s.as_ref(), false).await.unwrap(), None);
    assert!(
        announced().await,
        "the mutation's reload announces the change"
    );
}

async fn snapshot_reuses_live_arcs(db: &TestDb) {
    let s = db.open().await;
    let a = s
        .upsert_account(&upsert("acc-a", "u", Some("a@x"), "at-a", "rt"))
        .await
        .unwrap()
        .id;
    let b = s
        .upsert_account(&upsert("acc-b", "", None, "at-b", "rt"))
        .await
        .unwrap()
        .id;
    s.set_cooldown(b, 4_000_000_000_000, Some("usage_limit_reached"))
        .await
        .unwrap();
    s.record_quota(
        b,
        QuotaUpdate {
            primary_pct: Some(80.0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let (plain, key) = admin::cli::create_key(s.as_ref(), "k").await.unwrap();

    let snap = Snapshot::shared();
    let (mailboxes, boxes) = channels::mailboxes(2);
    let settings = Settings {
        max_attempts: 4,
        default_max_concurrency: 9,
        ..Settings::default()
    };
    let p = Publisher::new(Arc::clone(&snap), mailboxes, settings);
    assert_eq!(p.reload(s.as_ref(), false).await.unwrap(), Some(1));
    let s1 = snap.load_full();
    assert_eq!(s1.version, 1);
    assert_eq!(s1.settings.max_attempts, 4);
    let ea = s1.account(a).unwrap();
    assert_eq!(ea.label, "a@x");
    assert_eq!(ea.user_id.as_deref(), Some("u"));
    assert_eq!(ea.access_token.expose(), "at-a");
    assert_eq!(ea.max_concurrency, 9, "default concurrency applies");
    assert_eq!(ea.plan.as_deref(), Some("plus"));
    let eb = s1.account(b).unwrap();
    assert_eq!(eb.label, "acc-b");
    assert!(eb.user_id.is_none());
    assert!(
        eb.live.is_cooling(shared_state::now_ms()),
        "persisted cooldown applied"
    );
    assert_eq!(eb.live.primary_used_pct(), 80.0, "persisted quota applied");
    assert_eq!(s1.key(&plain).map(|k| k.id), Some(key.id));
    for mb in &boxes {
        let cmd = tokio::time::timeout(Duration::from_secs(1), mb.recv())
            .await
            .unwrap();
        assert_eq!(cmd, Some(WorkerCommand::SnapshotUpdated { version: 1 }));
    }

    // Nothing changed: no publish.
    assert_eq!(p.reload(s.as_ref(), false).await.unwrap(), None);
    assert_eq!(snap.load().version, 1);

    // A live lease and counters survive a content change.
    let lease = ea.live.try_acquire(0).unwrap();
    s.set_limits(a, Some(3), None).await.unwrap();
    assert_eq!(p.reload(s.as_ref(), false).await.unwrap(), Some(2));
    let s2 = snap.load_full();
    let ea2 = s2.account(a).unwrap();
    assert!(
        Arc::ptr_eq(&ea.live, &ea2.live),
        "same live Arc across snapshots"
    );
    assert_eq!(ea2.weight, 3);
    assert_eq!(ea2.live.in_flight(), 1);
    drop(lease);
    assert_eq!(ea.live.in_flight(), 0);

    // A cooldown written elsewhere reaches the existing live entry without a publish.
    s.set_cooldown(a, 4_100_000_000_000, Some("x"))
        .await
        .unwrap();
    assert_eq!(p.reload(s.as_ref(), false).await.unwrap(), None);
    assert_eq!(ea.live.cooldown_until_ms(), 4_100_000_000_000);

    // Data-plane override clears once the same status is persisted.
    ea.live
        .apply(&AccountEffect::Status(AccountStatus::ReauthRequired));
    s.set_status(a, AccountStatus::ReauthRequired)
        .await
        .unwrap();
    p.reload(s.as_ref(), false).await.unwrap().unwrap();
    let s3 = snap.load_full();
    assert_eq!(s3.account(a).unwrap().status, AccountStatus::ReauthRequired);
    assert!(ea.live.status_override().is_none());

    // Revoked keys and deleted accounts disappear; a forced reload always publishes.
    s.revoke_key(key.id).await.unwrap();
    s.delete_account(b).await.unwrap();
    let v = p.reload(s.as_ref(), false).await.unwrap().unwrap();
    let s4 = snap.load_full();
    assert_eq!(s4.version, v);
    assert!(s4.key(&plain).is_none());
    assert!(s4.account(b).is_none());
    assert!(p.live(b).await.is_none());
    assert_eq!(p.reload(s.as_ref(), true).await.unwrap(), Some(v + 1));
    assert!(Arc::ptr_eq(&snap.load().account(a).unwrap().live, &ea.live));
}

async fn settings_rows_and_plan_type(db: &TestDb) {
    let s = db.open().await;
    assert!(s.load_settings().await.unwrap().is_empty());
    s.write_settings(&[
        ("strategy".into(), Some("round_robin".into())),
        ("max_attempts".into(), Some("5".into())),
    ])
    .await
    .unwrap();
    s.write_settings(&[
        ("max_attempts".into(), Some("6".into())),
        ("strategy".into(), None),
        ("absent".into(), None),
    ])
    .await
    .unwrap();
    assert_eq!(
        s.load_settings().await.unwrap(),
        vec![("max_attempts".to_owned(), "6".to_owned())]
    );
    s.write_settings(&[]).await.unwrap();

    let id = s
        .upsert_account(&upsert("acc-p", "u", None, "at", "rt"))
        .await
        .unwrap()
        .id;
    let before = s.get_account(id).await.unwrap().unwrap().0.updated_at;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(s.set_plan_type(id, "plus").await.unwrap());
    assert_eq!(
        s.get_account(id).await.unwrap().unwrap().0.updated_at,
        before,
        "same plan: no change"
    );
    assert!(s.set_plan_type(id, "pro").await.unwrap());
    let row = s.get_account(id).await.unwrap().unwrap().0;
    assert_eq!(row.plan_type.as_deref(), Some("pro"));
    assert!(row.updated_at > before);
    assert!(!s.set_plan_type(9999, "pro").await.unwrap());
}

async fn usage_summary_groups_and_filters(db: &TestDb) {
    use admin::storage::{UsageFilter, UsageTotals};
    let s = db.open().await;
    let rec = |key: i64, account: Option<i64>, status: u16, err: Option<&str>, at: u64| {
        let mut r = usage(1);
        r.key_id = key;
        r.account_id = account;
        r.status = status;
        r.error_code = err.map(Into::into);
        r.input_tokens = 10;
        r.cached_tokens = 4;
        r.output_tokens = 20;
        r.reasoning_tokens = 5;
        r.started_at_ms = at;
        r
    };
    let records = vec![
        rec(1, Some(7), 200, None, 1_000),
        rec(1, Some(7), 200, Some("stream_failed"), 2_000),
        rec(1, Some(8), 502, Some("upstream_error"), 3_000),
        rec(2, Some(8), 200, None, 4_000),
        rec(2, None, 429, Some("rate_limited"), 5_000),
    ];
    s.insert_usage(&records).await.unwrap();
    let all = s.usage_summary(UsageFilter::default()).await.unwrap();
    let t = |requests, errors| UsageTotals {
        requests,
        input_tokens: 10 * requests,
        cached_tokens: 4 * requests,
        output_tokens: 20 * requests,
        reasoning_tokens: 5 * requests,
        errors,
    };
    assert_eq!(all.totals, t(5, 3));
    assert_eq!(all.by_key, vec![(1, t(3, 2)), (2, t(2, 1))]);
    assert_eq!(
        all.by_account,
        vec![(None, t(1, 1)), (Some(7), t(2, 1)), (Some(8), t(2, 1))]
    );
    let f = s
        .usage_summary(UsageFilter {
            since_ms: Some(2_000),
            until_ms: Some(5_000),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(f.totals, t(3, 2));
    let f = s
        .usage_summary(UsageFilter {
            key_id: Some(2),
            account_id: Some(8),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(f.totals, t(1, 0));
    assert_eq!(f.by_account, vec![(Some(8), t(1, 0))]);
    let none = s
        .usage_summary(UsageFilter {
            since_ms: Some(10_000),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(none.totals, UsageTotals::default());
    assert!(none.by_key.is_empty() && none.by_account.is_empty());
}

/// A ciphertext only opens in its own row and column; a missing or replaced secret key
/// refuses to open the store (never a new key over encrypted tokens); legacy v1 columns
/// (no associated data) are re-sealed bound to their row at open.
async fn secret_key_checked_and_ciphertexts_bound(db: &TestDb) {
    use base64::Engine;
    use chacha20poly1305::{aead::Aead, KeyInit};
    let s = db.open().await;
    let a = s
        .upsert_account(&upsert("acc-a", "u", None, "at-a", "rt-a"))
        .await
        .unwrap()
        .id;
    let b = s
        .upsert_account(&upsert("acc-b", "u", None, "at-b", "rt-b"))
        .await
        .unwrap()
        .id;
    s.close().await.unwrap();
    let key_path = db.target().data_dir.join("secret.key");
    let key_text = std::fs::read_to_string(&key_path).unwrap();
    let refused = |r: Result<std::sync::Arc<dyn admin::Storage>, admin::StorageError>| match r {
        Err(e @ admin::StorageError::KeyMismatch { .. }) => e.to_string(),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("opened with a key that does not open the tokens"),
    };

    // Another row's ciphertext pasted into B's column does not open there.
    let (a_at, _, _) = db.raw_token_columns(a).await;
    let (b_at, _, _) = db.raw_token_columns(b).await;
    db.raw_exec(
        &format!("UPDATE accounts SET access_token_enc = $1 WHERE id = {b}"),
        &[&a_at],
    )
    .await;
    let msg = refused(admin::storage::open(&db.target()).await);
    assert!(msg.contains("1 of 4"), "{msg}");
    db.raw_exec(
        &format!("UPDATE accounts SET access_token_enc = $1 WHERE id = {b}"),
        &[&b_at],
    )
    .await;

    // A replaced key, then a missing one: refused, and no key is written over the tokens.
    std::fs::write(
        &key_path,
        base64::engine::general_purpose::STANDARD.encode([9u8; 32]),
    )
    .unwrap();
    let msg = refused(admin::storage::open(&db.target()).await);
    assert!(
        msg.contains("4 of 4") && msg.contains("secret.key"),
        "{msg}"
    );
    std::fs::remove_file(&key_path).unwrap();
    let msg = refused(admin::storage::open(&db.target()).await);
    assert!(msg.contains("missing"), "{msg}");
    assert!(!key_path.exists(), "no new key next to encrypted tokens");
    std::fs::write(&key_path, &key_text).unwrap();

    // A legacy v1 column (no associated data) opens and is re-sealed as v2 at open.
    let key: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(key_text.trim())
        .unwrap()
        .try_into()
        .unwrap();
    let aead = chacha20poly1305::ChaCha20Poly1305::new((&key).into());
    let nonce = [5u8; 12];
    let ct = aead.encrypt((&nonce).into(), &b"rt-legacy"[..]).unwrap();
    let v1 = format!(
        "v1:{}",
        base64::engine::general_purpose::STANDARD.encode([&nonce[..], &ct[..]].concat())
    );
    db.raw_exec(
        &format!("UPDATE accounts SET refresh_token_enc = $1 WHERE id = {a}"),
        &[&v1],
    )
    .await;
    let s = db.open().await;
    let (_, rt, _) = db.raw_token_columns(a).await;
    assert!(rt.starts_with("v2:"), "re-sealed: {rt}");
    let (_, sec) = s.get_account(a).await.unwrap().unwrap();
    assert_eq!(sec.refresh_token.expose(), "rt-legacy");
    assert!(!sec.decrypt_failed);
    s.close().await.unwrap();
    #[cfg(unix)]
    if !db.is_pg() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let dir = db.target().data_dir;
        assert_eq!(mode(&dir), 0o700, "data directory");
        assert_eq!(
            mode(&dir.join(admin::DEFAULT_DB_FILE)),
            0o600,
            "database file"
        );
        assert_eq!(mode(&key_path), 0o600, "key file");
        for f in std::fs::read_dir(&dir).unwrap() {
            let p = f.unwrap().path();
            assert_eq!(mode(&p) & 0o077, 0, "{} is private", p.display());
        }
    }
}

/// `secrets rotate`: every token column is re-encrypted with the new key in one transaction,
/// the key file is replaced, the tokens still open, and the old key no longer opens them.
async fn secrets_rotate_reencrypts_and_installs_the_key(db: &TestDb) {
    let s = db.open().await;
    let id = s
        .upsert_account(&upsert("acc-r", "u", None, "at-r", "rt-r"))
        .await
        .unwrap()
        .id;
    s.close().await.unwrap();
    let key_path = db.target().data_dir.join("secret.key");
    let old_key = std::fs::read_to_string(&key_path).unwrap();
    let (before, _, _) = db.raw_token_columns(id).await;
    let target = db.target();
    let rotated = tokio::task::spawn_blocking(move || admin::cli::secrets_rotate(&target, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rotated.columns, 2);
    assert_eq!(rotated.key_file.as_deref(), Some(key_path.as_path()));
    let new_key = std::fs::read_to_string(&key_path).unwrap();
    assert_ne!(new_key, old_key);
    assert_eq!(new_key.trim(), rotated.new_key_base64.expose());
    assert!(!db.target().data_dir.join("secret.key.new").exists());
    let (after, _, _) = db.raw_token_columns(id).await;
    assert_ne!(before, after);
    let s = db.open().await;
    let (_, sec) = s.get_account(id).await.unwrap().unwrap();
    assert_eq!(sec.access_token.expose(), "at-r");
    assert_eq!(sec.refresh_token.expose(), "rt-r");
    s.close().await.unwrap();
    // The old key is refused now.
    std::fs::write(&key_path, &old_key).unwrap();
    assert!(matches!(
        admin::storage::open(&db.target()).await,
        Err(admin::StorageError::KeyMismatch { .. })
    ));
    std::fs::write(&key_path, &new_key).unwrap();
    // A given key (base64) is used as it is.
    let target = db.target();
    let given = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [4u8; 32]);
    let g = given.clone();
    let r = tokio::task::spawn_blocking(move || admin::cli::secrets_rotate(&target, Some(&g)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.new_key_base64.expose(), given);
    let s = db.open().await;
    assert_eq!(
        s.get_account(id)
            .await
            .unwrap()
            .unwrap()
            .1
            .refresh_token
            .expose(),
        "rt-r"
    );
    s.close().await.unwrap();
}

both_backends!(
    secrets_rotate_reencrypts_and_installs_the_key,
    secret_key_checked_and_ciphertexts_bound,
    settings_rows_and_plan_type,
    usage_summary_groups_and_filters,
    migrations_apply_and_ping,
    account_upsert_merges,
    tokens_encrypted_at_rest,
    token_writes_are_fenced,
    status_cooldown_quota_limits,
    keys_create_list_revoke,
    key_limits_groups_and_spend,
    usage_insert_batch,
    usage_dedup_rollups_and_retention,
    usage_repeated_record_in_a_batch_counts_once,
    snapshot_reuses_live_arcs,
    own_change_is_announced_after_a_quiet_reload_published_it,
);
