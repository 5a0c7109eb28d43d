//! Upstream over TLS + HTTP/2 with a private CA, and the gateway on PostgreSQL (usage persisted,
//! `/healthz` 503 while storage is down).

use std::time::{Duration, Instant};

use benches::MockConfig;
use integration_tests::{client, pg_exec, tls_material, StackBuilder};
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
            .post("/v1/responses")
            .json(&json!({"model":"gpt-5.5","input":"x","stream":stream}))
            .send()
            .await
            .unwrap();
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
    let r = s
        .post("/v1/responses")
        .json(&json!({"model":"gpt-5.5","input":"x"}))
        .send()
        .await
        .unwrap();
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
    let r = s
        .post("/v1/responses")
        .json(&json!({"model":"gpt-5.5","input":"x"}))
        .send()
        .await
        .unwrap();
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

#[tokio::test(flavor = "multi_thread")]
async fn healthz_is_503_while_storage_is_down() {
    let s = StackBuilder {
        postgres: true,
        ..StackBuilder::default()
    }
    .start();
    let name = s._pg.as_ref().unwrap().name.clone();
    let admin = integration_tests::pg_admin_url();
    let down = format!("ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false; SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'");
    let a2 = admin.clone();
    std::thread::spawn(move || pg_exec(&a2, &down))
        .join()
        .unwrap();
    let wait_for = |want: u16| {
        let data = format!("{}/healthz", s.url());
        let adm = format!("{}/healthz", s.admin_url());
        async move {
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let a = client().get(&data).send().await.unwrap().status().as_u16();
                let b = client().get(&adm).send().await.unwrap().status().as_u16();
                if a == want && b == want {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "healthz stayed {a}/{b}, wanted {want}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    wait_for(503).await;
    let up = format!("ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true");
    std::thread::spawn(move || pg_exec(&admin, &up))
        .join()
        .unwrap();
    wait_for(200).await;
}
