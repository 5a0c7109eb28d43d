//! Upstream over TLS + HTTP/2 with a private CA, and the gateway on PostgreSQL (usage persisted,
//! `/healthz` degraded while storage is down).

use std::time::{Duration, Instant};

use benches::MockConfig;
use integration_tests::{http_get, tls_material, StackBuilder};
use serde_json::{json, Value};

/// A stack whose mock serves TLS (h2 + http/1.1 by ALPN) with a certificate from a test CA; the
/// gateway trusts that CA only when `trust_ca`.
fn tls_stack(dir: &std::path::Path, trust_ca: bool) -> integration_tests::Stack {
    let tls = tls_material(dir);
    // Reserve a port so the upstream URL can name `localhost` (the certificate's name).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    StackBuilder {
        mock: MockConfig {
            tls: Some((tls.cert.clone(), tls.key.clone())),
            listen: format!("127.0.0.1:{port}").parse().unwrap(),
            ..MockConfig::default()
        },
        upstream_host: Some(format!("https://localhost:{port}/backend-api/codex")),
        upstream_ca: trust_ca.then_some(tls.ca),
        ..StackBuilder::default()
    }
    .start()
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_h2_upstream_with_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let s = tls_stack(dir.path(), true);
    for stream in [true, false, true] {
        let r = s
            .post_json(
                "/v1/responses",
                &json!({"model":"gpt-5.5","input":"x","stream":stream}),
            )
            .await;
        assert_eq!(r.status(), 200);
        let body = r.text().await.unwrap();
        assert!(body.contains("Hello from mock-codex"), "{body}");
    }
    let reqs = s.mock.requests();
    assert_eq!(reqs.len(), 3);
    assert!(
        reqs.iter().all(|r| r.version == "HTTP/2.0"),
        "ALPN must pick h2: {:?}",
        reqs.iter().map(|r| &r.version).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_upstream_without_the_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = tls_stack(dir.path(), false);
    let r = s.post_responses_x(false).await;
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_unreachable");
    assert_eq!(s.mock.responses_requests(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_backend_serves_and_persists_usage() {
    let s = StackBuilder {
        postgres: true,
        ..StackBuilder::default()
    }
    .start();
    let r = s.post_responses_x(false).await;
    assert_eq!(r.status(), 200);
    let url = s.db.database_url.clone().unwrap();
    // usage is persisted by the sidecar in batches
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = count_usage(&url).await;
        if n >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "usage record never persisted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn count_usage(url: &str) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    let (n,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM usage_records WHERE model = 'gpt-5.5' AND status = 200",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    n
}

/// While storage is down the data plane keeps serving from its last snapshot: its `/healthz`
/// stays 200 and says `degraded` / `storage: down`, and a request is still answered; the
/// admin listener, which needs storage, says 503. Both recover when storage is back.
#[tokio::test(flavor = "multi_thread")]
async fn healthz_reports_storage_down_while_the_data_plane_serves() {
    let s = StackBuilder {
        postgres: true,
        ..StackBuilder::default()
    }
    .start();
    let pg = s._pg.as_ref().unwrap();
    pg.go_down();
    let wait_for = |want_admin: u16, want_storage: &'static str| {
        let data = format!("{}/healthz", s.url());
        let adm = format!("{}/healthz", s.admin_url());
        async move {
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let r = http_get(&data).await;
                let a = r.status().as_u16();
                let body: serde_json::Value = r.json().await.unwrap();
                let b = http_get(&adm).await.status().as_u16();
                if a == 200 && body["storage"] == want_storage && b == want_admin {
                    return body;
                }
                assert!(
                    Instant::now() < deadline,
                    "healthz stayed {a} {body} / admin {b}, wanted storage {want_storage}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let body = wait_for(503, "down").await;
    assert_eq!(body["status"], "degraded", "{body}");
    assert_eq!(body["workers"]["alive"], body["workers"]["total"], "{body}");
    // Still serving from the snapshot.
    let r = s.post_responses_x(false).await;
    assert_eq!(r.status(), 200);
    pg.come_back();
    let body = wait_for(200, "up").await;
    assert_eq!(body["status"], "ok", "{body}");
}

/// `/healthz` says what is degraded: an unreachable upstream (connect refused) and Redis
/// (configured and up).
#[tokio::test(flavor = "multi_thread")]
async fn healthz_reports_the_upstream_and_redis() {
    let s = StackBuilder {
        tweak: Some(Box::new(|c| {
            c.sidecar.redis_url = Some("redis://127.0.0.1:6379/0".into());
        })),
        ..StackBuilder::default()
    }
    .start();
    let health = || async {
        let r = http_get(&format!("{}/healthz", s.url())).await;
        assert_eq!(r.status(), 200);
        r.json::<serde_json::Value>().await.unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let h = health().await;
        if h["redis"] == "up" {
            assert_eq!(h["status"], "ok", "{h}");
            assert_eq!(h["upstream"], "ok", "{h}");
            assert_eq!(h["accounts"]["schedulable"], 1, "{h}");
            break;
        }
        assert!(Instant::now() < deadline, "redis never reported up: {h}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The upstream goes away: a request fails to connect, and health says so.
    s.mock.shutdown();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = s.post_responses_x(false).await;
    let h = health().await;
    assert_eq!(h["upstream"], "unreachable", "{h}");
    assert_eq!(h["status"], "degraded", "{h}");
}
