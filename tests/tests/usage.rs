//! Usage records end to end (issue 12): every field filled from its owner for HTTP (h1, h2c),
//! chat and WebSocket turns; hourly rollups and the CSV export; a PostgreSQL outage spooled and
//! replayed (with and without a restart in between); a full usage spool that does not delay a
//! 401 refresh; 1,000 concurrent streams with exactly 1,000 rows.
//!
//! `kill -9` of the real binary is in `gateway/root/tests/usage_crash.rs` (where Cargo builds it).

use std::{collections::HashMap, time::Duration};

use benches::{Behaviour, ErrorKind};
use codex_gateway::app::App;
use gateway::config::PlainHttp;
use integration_tests::{
    admin_api::usage_csv,
    http_get,
    wait::wait_for,
    ws_client::{connect_responses, turn},
    Stack, StackBuilder,
};
use serde_json::{json, Value};

async fn total_requests(s: &Stack) -> u64 {
    let v = s.admin_json("/api/admin/usage").await;
    v["totals"]["requests"].as_u64().unwrap_or(0)
}

async fn ws_turn(s: &Stack, body: Value) -> Vec<Value> {
    let (mut ws, _) = connect_responses(s, &s.key).await;
    turn(&mut ws, &body).await
}

/// One record per request with the fields filled by their owners: reasoning effort and
/// service tier from the request (every dialect), transport from the lifecycle (h1, h2c, a
/// WebSocket turn over the upstream WebSocket, and one that fell back to HTTP), failovers
/// from the lifecycle, error class from the classifier, tokens and time to first token from
/// the pipeline.
#[tokio::test(flavor = "multi_thread")]
async fn records_carry_every_field_for_http_ws_and_chat() {
    let s = StackBuilder {
        accounts: 2,
        ..StackBuilder::default()
    }
    .start();
    // 1. Responses over HTTP (h1 upstream), streamed, with effort and tier.
    let r = s
        .post_json(
            "/v1/responses",
            &json!({"model":"gpt-5.5","input":"a","stream":true,
            "reasoning":{"effort":"high"},"service_tier":"priority"}),
        )
        .await;
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    // 2. Chat, not streamed, effort in the chat dialect.
    let r = s
        .post_json(
            "/v1/chat/completions",
            &json!({"model":"gpt-5.5","messages":[{"role":"user","content":"b"}],
            "reasoning_effort":"low"}),
        )
        .await;
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    // 3. A WebSocket turn (over the upstream WebSocket).
    let evs = ws_turn(
        &s,
        json!({"type":"response.create","model":"gpt-5.5","input":"d","reasoning":{"effort":"medium"}}),
    )
    .await;
    assert_eq!(evs.last().unwrap()["type"], "response.completed");
    // 4. A WebSocket turn whose upstream upgrade is refused: it goes over HTTP.
    s.mock.set_ws_refuse_upgrade(Some(404));
    let evs = ws_turn(
        &s,
        json!({"type":"response.create","model":"gpt-5.5","input":"e"}),
    )
    .await;
    assert_eq!(evs.last().unwrap()["type"], "response.completed");
    s.mock.set_ws_refuse_upgrade(None);

    // 5. A failover (last: both accounts cool down after it): both are out of quota.
    let responses = || {
        s.mock
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/responses"))
            .count()
    };
    let first = responses();
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::UsageLimitReached).times(1),
    );
    s.mock.set_behaviour(
        "acct-1",
        Behaviour::error(ErrorKind::UsageLimitReached).times(1),
    );
    let r = s
        .post_json("/v1/responses", &json!({"model":"gpt-5.5","input":"c"}))
        .await;
    // Both accounts refused once: the request fails after one failover.
    let st = r.status().as_u16();
    r.text().await.unwrap();
    assert_eq!(responses() - first, 2, "two attempts");
    s.mock.clear_behaviour("acct-0");
    s.mock.clear_behaviour("acct-1");
    wait_for("5 records", Duration::from_secs(20), || async {
        total_requests(&s).await == 5
    })
    .await;
    let rows = usage_csv(&s, "").await;
    assert_eq!(rows.len(), 5, "{rows:?}");
    let by_input = |i: usize| &rows[i];
    // Rows come in id order = the order the sidecar received them; each request finished
    // before the next started.
    let a = by_input(0);
    assert_eq!(a["route"], "responses");
    assert_eq!(a["reasoning_effort"], "high");
    assert_eq!(a["service_tier"], "priority");
    assert_eq!(a["transport"], "h1");
    assert_eq!(a["status"], "200");
    assert_eq!(a["stream"], "true");
    assert_eq!(a["failovers"], "0");
    assert_eq!(a["error_class"], "");
    assert!(
        !a["ttft_ms"].is_empty() && !a["ttfb_ms"].is_empty(),
        "{a:?}"
    );
    assert!(a["output_tokens"].parse::<u64>().unwrap() > 0, "{a:?}");
    assert!(!a["account_id"].is_empty() && a["key_name"] == "test");
    assert_eq!(a["record_id"].len(), 32);

    let b = by_input(1);
    assert_eq!(b["route"], "chat_completions");
    assert_eq!(b["reasoning_effort"], "low");
    assert_eq!(b["stream"], "false");
    assert_eq!(b["transport"], "h1");

    let c = by_input(4);
    assert_eq!(c["failovers"], "1", "{c:?}");
    assert_eq!(c["status"], st.to_string());
    // Every account refused with usage_limit_reached: the answer is ours (no account left).
    assert_eq!(st, 429);
    assert_eq!(c["error_class"], "quota_exhausted", "{c:?}");
    assert_eq!(c["error_code"], "usage_limit_reached", "{c:?}");
    assert_eq!(c["ttft_ms"], "", "no output, no first token");

    let d = by_input(2);
    assert_eq!(d["transport"], "ws", "{d:?}");
    assert_eq!(d["reasoning_effort"], "medium");
    assert_eq!(d["stream"], "true");

    let e = by_input(3);
    assert_eq!(e["transport"], "http_fallback", "{e:?}");
    assert_eq!(e["status"], "200");
}

/// h2c upstream: the transport says h2.
#[tokio::test(flavor = "multi_thread")]
async fn h2c_upstream_is_recorded_as_h2() {
    let s = StackBuilder {
        plain_http: PlainHttp::H2c,
        ..StackBuilder::default()
    }
    .start();
    let r = s
        .post_json("/v1/responses", &json!({"model":"gpt-5.5","input":"a"}))
        .await;
    assert_eq!(r.status(), 200);
    wait_for("1 record", Duration::from_secs(20), || async {
        total_requests(&s).await == 1
    })
    .await;
    let rows = usage_csv(&s, "").await;
    assert_eq!(rows[0]["transport"], "h2");
}

/// Hourly rollups count each request (and its cost) once per (hour, key, account, model); the
/// grouped CSV sums them; the window and the parameters are checked; the export needs admin auth.
#[tokio::test(flavor = "multi_thread")]
async fn rollups_and_csv_export() {
    let s = StackBuilder::default().start();
    for i in 0..6 {
        let model = if i < 4 { "gpt-5.5" } else { "gpt-5.4" };
        let r = s
            .post_json("/v1/responses", &json!({"model": model, "input": "x"}))
            .await;
        assert_eq!(r.status(), 200);
    }
    wait_for("6 records", Duration::from_secs(20), || async {
        total_requests(&s).await == 6
    })
    .await;
    let raw = usage_csv(&s, "").await;
    let hourly = usage_csv(&s, "?group_by=hour").await;
    let mut want: HashMap<(String, String), u64> = HashMap::new();
    for r in &raw {
        let hour = r["started_at_ms"].parse::<i64>().unwrap() / 3_600_000 * 3_600_000;
        *want
            .entry((hour.to_string(), r["model"].clone()))
            .or_default() += 1;
    }
    let got: HashMap<(String, String), u64> = hourly
        .iter()
        .map(|r| {
            (
                (r["hour_ms"].clone(), r["model"].clone()),
                r["requests"].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, want, "{hourly:?}");
    let out_tokens: u64 = raw
        .iter()
        .map(|r| r["output_tokens"].parse::<u64>().unwrap())
        .sum();
    let by_model = usage_csv(&s, "?group_by=model").await;
    assert_eq!(by_model.len(), 2, "{by_model:?}");
    assert_eq!(
        by_model
            .iter()
            .map(|r| r["output_tokens"].parse::<u64>().unwrap())
            .sum::<u64>(),
        out_tokens
    );
    let five = by_model.iter().find(|r| r["model"] == "gpt-5.5").unwrap();
    assert_eq!(five["requests"], "4");
    assert_eq!(five["key_id"], "", "grouped by model only");
    let by_key = usage_csv(&s, "?group_by=key").await;
    assert_eq!(by_key.len(), 1);
    assert_eq!(by_key[0]["requests"], "6");
    assert_eq!(by_key[0]["key_name"], "test");
    // Cost is rolled up: the key's rollups add up to its records' cost (priced by default).
    let raw_cost: u64 = raw
        .iter()
        .map(|r| r["cost_micros"].parse::<u64>().unwrap())
        .sum();
    assert!(raw_cost > 0, "{raw:?}");
    assert_eq!(by_key[0]["cost_micros"], raw_cost.to_string());
    assert_eq!(
        by_key[0]["cost_usd"],
        format!("{}.{:06}", raw_cost / 1_000_000, raw_cost % 1_000_000)
    );
    let hourly_cost: u64 = hourly
        .iter()
        .map(|r| r["cost_micros"].parse::<u64>().unwrap())
        .sum();
    assert_eq!(hourly_cost, raw_cost);
    // A window before everything: no rows; RFC 3339 accepted.
    assert!(usage_csv(&s, "?to=2020-01-01T00:00:00Z").await.is_empty());
    assert!(usage_csv(&s, "?group_by=hour&to=1000").await.is_empty());
    // Bad parameters: OpenAI-shaped 400s.
    for q in ["?group_by=week", "?from=yesterday", "?from=2000&to=1000"] {
        let r = s
            .admin_get(&format!("/api/admin/usage/export.csv{q}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{q}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{q}: {v}");
    }
    // Admin auth.
    let r = http_get(&format!("{}/api/admin/usage/export.csv", s.admin_url())).await;
    assert_eq!(r.status(), 401);
}

async fn pg_rows(url: &str) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM usage_records")
        .fetch_one(&mut c)
        .await
        .unwrap();
    let (dupes,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM (SELECT record_id FROM usage_records GROUP BY record_id HAVING COUNT(*) > 1) d",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!(dupes, 0, "no record stored twice");
    n
}

async fn ask(s: &Stack, n: usize) {
    for _ in 0..n {
        let r = s.post_responses_x(true).await;
        assert_eq!(r.status(), 200);
        r.text().await.unwrap();
    }
}

/// PostgreSQL goes away: requests are served from the snapshot and their records wait in the
/// durable spool; when it returns they are stored. A second outage spans a gateway restart:
/// the records spooled before the restart are replayed by the next process, exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_outage_is_spooled_and_replayed_across_a_restart() {
    let mut s = StackBuilder {
        postgres: true,
        ..StackBuilder::default()
    }
    .start();
    let url = s._pg.as_ref().unwrap().url.clone();

    // Outage 1, no restart.
    s._pg.as_ref().unwrap().go_down();
    ask(&s, 10).await;
    wait_for("10 spooled", Duration::from_secs(20), || async {
        s.metric("codex_gateway_usage_spool_records").await == 10
    })
    .await;
    assert!(s.metric("codex_gateway_usage_spool_bytes").await > 0);
    s._pg.as_ref().unwrap().come_back();
    wait_for("10 rows", Duration::from_secs(60), || async {
        pg_rows(&url).await == 10
    })
    .await;
    wait_for("spool empty", Duration::from_secs(10), || async {
        s.metric("codex_gateway_usage_spool_bytes").await == 0
    })
    .await;

    // Outage 2 across a restart: the process stops while storage is down.
    s._pg.as_ref().unwrap().go_down();
    ask(&s, 15).await;
    wait_for("15 spooled", Duration::from_secs(20), || async {
        s.metric("codex_gateway_usage_spool_records").await == 15
    })
    .await;
    tokio::task::block_in_place(|| s.app.shutdown());
    let spools: Vec<_> = std::fs::read_dir(s.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("usage-spool-"))
        .collect();
    assert_eq!(spools.len(), 1, "the spool file outlives the process");
    s._pg.as_ref().unwrap().come_back();
    let mut cfg = s.cfg.clone();
    cfg.listen = s.app.data_addr;
    s.app = tokio::task::block_in_place(|| App::spawn(cfg)).expect("restart");
    wait_for("25 rows", Duration::from_secs(60), || async {
        pg_rows(&url).await == 25
    })
    .await;
    assert_eq!(s.metric("codex_gateway_usage_replayed_total").await, 15);
    assert_eq!(s.metric("codex_gateway_usage_dropped_total").await, 0);
    assert_eq!(total_requests(&s).await, 25);
}

/// The usage spool is full (its bound is tiny and the database refuses usage rows): a 401
/// still gets its refresh at once (control facts have their own queue), and the request is
/// answered; when usage rows are accepted again every record is stored.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_usage_spool_does_not_delay_a_refresh() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c| c.sidecar.usage.spool_max_bytes = 1)),
        ..StackBuilder::default()
    }
    .start();
    let db = format!(
        "sqlite://{}",
        s.dir.path().join(admin::DEFAULT_DB_FILE).display()
    );
    let exec = |sql: &'static str| {
        let db = db.clone();
        async move {
            use sqlx::Connection;
            let mut c = sqlx::SqliteConnection::connect(&db).await.unwrap();
            sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
        }
    };
    exec("CREATE TRIGGER block_usage BEFORE INSERT ON usage_records BEGIN SELECT RAISE(ABORT, 'usage blocked by the test'); END;").await;
    ask(&s, 5).await;
    wait_for(
        "the spool at its bound",
        Duration::from_secs(20),
        || async { s.metric("codex_gateway_usage_spool_full").await == 1 },
    )
    .await;
    // The access token is rejected once: refresh, then the same account again.
    s.mock.set_behaviour(
        "acct-0",
        Behaviour::error(ErrorKind::TokenInvalidated).times(1),
    );
    let r = s
        .post_json("/v1/responses", &json!({"model":"gpt-5.5","input":"after"}))
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(s.mock.token_calls(), 1, "refreshed while usage was stuck");
    assert_eq!(s.metric("codex_gateway_usage_spool_full").await, 1);
    exec("DROP TRIGGER block_usage").await;
    wait_for("6 rows", Duration::from_secs(90), || async {
        total_requests(&s).await == 6
    })
    .await;
    assert_eq!(s.metric("codex_gateway_usage_dropped_total").await, 0);
}

/// Zero lost under load (the short form of `benches/README.md` "Usage: zero lost"): 1,000
/// concurrent streams, exactly 1,000 rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_concurrent_streams_leave_a_thousand_rows() {
    let n: usize = std::env::var("CODEX_GATEWAY_USAGE_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let s = StackBuilder {
        accounts: 4,
        tweak: Some(Box::new(|c| {
            c.sidecar.settings.default_max_concurrency = 10_000
        })),
        ..StackBuilder::default()
    }
    .start();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let req = s
            .post("/v1/responses")
            .json(&json!({"model":"gpt-5.5","input":format!("q{i}"),"stream":true}));
        tasks.push(tokio::spawn(async move {
            let r = req.send().await.unwrap();
            let st = r.status().as_u16();
            let body = r.text().await.unwrap_or_default();
            (st, body.contains("response.completed"))
        }));
    }
    let mut ok = 0;
    for t in tasks {
        let (st, done) = t.await.unwrap();
        assert_eq!(st, 200);
        ok += usize::from(done);
    }
    assert_eq!(ok, n, "every stream completed");
    wait_for("every row", Duration::from_secs(60), || async {
        total_requests(&s).await == n as u64
    })
    .await;
    assert_eq!(s.metric("codex_gateway_usage_dropped_total").await, 0);
    assert_eq!(
        s.metric("codex_gateway_usage_persisted_total").await,
        n as i64
    );
}
