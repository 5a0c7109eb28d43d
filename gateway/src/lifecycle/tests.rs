/// The h2 client sends every upstream header name as `HeaderName::from_static` (which
/// panics on a name that is not a lower-case token): every forwarded name must be one.
#[test]
fn forwarded_header_names_are_static_header_names() {
    for n in super::PASSTHROUGH_HEADERS {
        assert_eq!(http::HeaderName::from_static(n).as_str(), *n);
    }
}

// --- the attempt loop over a scripted connector (both drivers) -----------------------------

use shared_state::{AccountEffect, AccountStatus, WorkerEvent};

use super::{open_with, Next, Trace};
use crate::{
    error::ErrorKind,
    testing::{ok_stream, plan, FakeConnector, Harness, Step},
    upstream::UpstreamError,
};

const BODY: &str = r#"{"model":"gpt-5","input":"hi","stream":true}"#;

fn json_err(status: u16, body: &str) -> Step {
    Step::reply(status, body)
}

fn cooled(h: &Harness, id: i64) -> bool {
    h.account(id).live.is_cooling(shared_state::now_ms())
}

/// A 429 before the commit: the account cools, the next one serves (one failover).
#[monoio::test_all(timer_enabled = true)]
async fn rate_limited_then_the_next_account_commits() {
    let h = Harness::new(3);
    let conn = FakeConnector::new([
        json_err(429, r#"{"error":{"type":"rate_limit_exceeded"}}"#),
        ok_stream(),
    ]);
    let mut trace = Trace::default();
    let c = open_with(&h.ctx, &conn, &plan(1, BODY, None), &mut trace)
        .await
        .expect("committed");
    let tried = conn.accounts();
    assert_eq!(tried.len(), 2);
    assert_ne!(tried[0], tried[1], "failover goes to another account");
    assert_eq!(c.account.id, tried[1]);
    assert_eq!(trace.failovers, 1);
    assert!(c.finished, "the whole stream was in the first chunk");
    assert!(cooled(&h, tried[0]) && !cooled(&h, tried[1]));
    assert!(h.control().iter().any(|e| matches!(
        e,
        WorkerEvent::Account { account_id, effect: AccountEffect::CooldownUntil { .. } }
            if *account_id == tried[0]
    )));
}

/// A 401: one refresh, then the same account with the new token.
#[monoio::test_all(timer_enabled = true)]
async fn token_rejected_refreshes_then_the_same_account() {
    let h = Harness::new(3);
    let cell = h.ctx.snapshot.clone();
    let conn = FakeConnector::new([
        json_err(401, r#"{"error":{"code":"token_expired"}}"#).then(move |id| {
            // The sidecar's refresh, published while the request waits.
            crate::testing::publish(&cell, id, |a| {
                a.access_token = shared_state::Secret::new("fresh")
            })
        }),
        ok_stream(),
    ]);
    let mut trace = Trace::default();
    let c = open_with(&h.ctx, &conn, &plan(2, BODY, None), &mut trace)
        .await
        .expect("committed");
    let tried = conn.accounts();
    assert_eq!(tried.len(), 2);
    assert_eq!(tried[0], tried[1], "the same account after the refresh");
    assert_eq!(c.account.id, tried[0]);
    assert_eq!(c.account.access_token.expose(), "fresh");
    assert_eq!(
        trace.failovers, 1,
        "the retry after a refresh is an attempt"
    );
    assert!(h.control().iter().any(|e| matches!(
        e,
        WorkerEvent::RefreshRequest { account_id, .. } if *account_id == tried[0]
    )));
    assert!(
        !cooled(&h, tried[0]),
        "a rejected token does not cool the account"
    );
}

/// A 401 whose refresh ends in re-authentication: the next account.
#[monoio::test_all(timer_enabled = true)]
async fn token_rejected_without_a_fresh_token_moves_on() {
    let h = Harness::new(2);
    let cell = h.ctx.snapshot.clone();
    let conn = FakeConnector::new([
        json_err(401, r#"{"error":{"code":"token_revoked"}}"#).then(move |id| {
            crate::testing::publish(&cell, id, |a| a.status = AccountStatus::ReauthRequired)
        }),
        ok_stream(),
    ]);
    let c = open_with(&h.ctx, &conn, &plan(3, BODY, None), &mut Trace::default())
        .await
        .expect("committed");
    let tried = conn.accounts();
    assert_eq!(tried.len(), 2);
    assert_ne!(tried[0], tried[1]);
    assert_eq!(c.account.id, tried[1]);
}

/// A second 401 right after a refresh: re-authentication required, the next account.
#[monoio::test_all(timer_enabled = true)]
async fn token_rejected_twice_needs_reauth_and_moves_on() {
    let h = Harness::new(2);
    let cell = h.ctx.snapshot.clone();
    let conn = FakeConnector::new([
        json_err(401, r#"{"error":{"code":"token_expired"}}"#).then(move |id| {
            crate::testing::publish(&cell, id, |a| {
                a.access_token = shared_state::Secret::new("fresh")
            })
        }),
        json_err(401, r#"{"error":{"code":"token_expired"}}"#),
        ok_stream(),
    ]);
    let c = open_with(&h.ctx, &conn, &plan(4, BODY, None), &mut Trace::default())
        .await
        .expect("committed");
    let tried = conn.accounts();
    assert_eq!(tried.len(), 3);
    assert_eq!(tried[0], tried[1]);
    assert_ne!(tried[1], tried[2]);
    assert_eq!(c.account.id, tried[2]);
    assert_eq!(
        h.account(tried[0]).effective_status(),
        AccountStatus::ReauthRequired
    );
}

/// After the commit, a broken stream ends the response: no other account is tried.
#[monoio::test_all(timer_enabled = true)]
async fn a_failure_after_the_commit_never_switches_account() {
    let h = Harness::new(3);
    let first = crate::testing::sse(&[
        (
            "response.created",
            r#"{"type":"response.created","response":{"id":"r"}}"#,
        ),
        (
            "response.output_text.delta",
            r#"{"type":"response.output_text.delta","delta":"a"}"#,
        ),
    ]);
    let conn = FakeConnector::new([
        Step::chunks(
            200,
            vec![
                Ok(bytes::Bytes::from(first)),
                Err(UpstreamError::Protocol {
                    sent: true,
                    message: "reset".into(),
                }),
            ],
        ),
        ok_stream(),
    ]);
    let mut c = open_with(&h.ctx, &conn, &plan(5, BODY, None), &mut Trace::default())
        .await
        .expect("committed");
    assert!(!c.finished);
    let mut batch = Vec::new();
    match c.next_events(&mut batch).await {
        Next::Broken(e) => assert!(matches!(e.kind, ErrorKind::UpstreamProtocol), "{e}"),
        _ => panic!("the break reaches the stream"),
    }
    assert_eq!(conn.accounts().len(), 1, "never resent after the commit");
    assert_eq!(conn.left(), 1);
}

/// Every account out of quota: 429 with the earliest reset, after one attempt per account.
#[monoio::test_all(timer_enabled = true)]
async fn every_account_out_of_quota_gives_up_with_the_earliest_reset() {
    let h = Harness::new(3);
    let now_s = shared_state::now_ms() / 1000;
    let limit = |at: u64| {
        json_err(
            429,
            &format!(r#"{{"error":{{"type":"usage_limit_reached","resets_at":{at}}}}}"#),
        )
    };
    let conn = FakeConnector::new([
        limit(now_s + 3000),
        limit(now_s + 1000),
        limit(now_s + 2000),
    ]);
    let e = open_with(&h.ctx, &conn, &plan(6, BODY, None), &mut Trace::default())
        .await
        .err()
        .expect("given up");
    match e.kind {
        ErrorKind::QuotaExhausted { earliest_reset } => {
            assert_eq!(earliest_reset, Some(now_s + 1000))
        }
        k => panic!("{k:?}"),
    }
    let mut tried = conn.accounts();
    tried.sort();
    assert_eq!(tried, vec![1, 2, 3], "each account once");
}

/// Every attempt refused for an account-scoped reason other than quota: the last error, after
/// `max_attempts` (3) attempts.
#[monoio::test_all(timer_enabled = true)]
async fn attempts_stop_at_max_attempts_with_the_last_error() {
    let h = Harness::new(4);
    let overloaded = || json_err(503, r#"{"error":{"code":"server_is_overloaded"}}"#);
    let conn = FakeConnector::new([overloaded(), overloaded(), overloaded(), ok_stream()]);
    let e = open_with(&h.ctx, &conn, &plan(7, BODY, None), &mut Trace::default())
        .await
        .err()
        .expect("given up");
    assert!(matches!(e.kind, ErrorKind::Upstream(_)), "{e}");
    assert_eq!(conn.accounts().len(), 3);
    assert_eq!(conn.left(), 1);
    // Only the first overload cools its account (`policy::Prior::overloaded_elsewhere`).
    let cooling = (1..=4).filter(|&id| cooled(&h, id)).count();
    assert_eq!(cooling, 1);
}

/// A foreign blob: once more on the same account with every blob stripped, not an attempt;
/// no account effect.
#[monoio::test_all(timer_enabled = true)]
async fn an_unverifiable_blob_is_retried_once_stripped_on_the_same_account() {
    let body = r#"{"model":"gpt-5","input":[{"type":"reasoning","summary":[],"encrypted_content":"gAAAAforeign"},{"type":"message","role":"user","content":"hi"}]}"#;
    let refused = || {
        json_err(
            400,
            r#"{"error":{"type":"invalid_request_error","code":"invalid_encrypted_content","message":"x"}}"#,
        )
    };
    let h = Harness::new(2);
    let conn = FakeConnector::new([refused(), ok_stream()]);
    let mut trace = Trace::default();
    let c = open_with(&h.ctx, &conn, &plan(8, body, None), &mut trace)
        .await
        .expect("committed");
    let tried = conn.accounts();
    assert_eq!(tried, vec![c.account.id, c.account.id]);
    assert_eq!(trace.failovers, 0);
    let has_blob = |b: &bytes::Bytes| b.windows(12).any(|w| w == b"gAAAAforeign");
    assert!(has_blob(&conn.body(0)) && !has_blob(&conn.body(1)));
    assert!(h.control().is_empty(), "no account effect");

    // Refused again without blobs: given up, nothing more tried.
    let h = Harness::new(2);
    let conn = FakeConnector::new([refused(), refused(), ok_stream()]);
    let e = open_with(&h.ctx, &conn, &plan(9, body, None), &mut Trace::default())
        .await
        .err()
        .expect("given up");
    assert!(matches!(e.kind, ErrorKind::Upstream(_)), "{e}");
    assert_eq!(conn.accounts().len(), 2);
    assert_eq!(conn.left(), 1);
}

/// A request error goes back at once.
#[monoio::test_all(timer_enabled = true)]
async fn a_request_error_is_returned_at_once() {
    let h = Harness::new(2);
    let conn = FakeConnector::new([
        json_err(400, r#"{"detail":"Unsupported parameter: temperature"}"#),
        ok_stream(),
    ]);
    let e = open_with(&h.ctx, &conn, &plan(10, BODY, None), &mut Trace::default())
        .await
        .err()
        .expect("returned");
    match &e.kind {
        ErrorKind::Upstream(f) => {
            assert_eq!(f.class, codex_protocol::classify::FailureClass::Request)
        }
        k => panic!("{k:?}"),
    }
    assert_eq!(conn.accounts().len(), 1);
    assert!(h.control().is_empty(), "no account effect");
}

/// `cyber_policy`: the session moves to another account, this one is not penalised, and the
/// session keeps away from it.
#[monoio::test_all(timer_enabled = true)]
async fn a_content_refusal_moves_the_session_without_penalty() {
    let h = Harness::new(2);
    let conn = FakeConnector::new([
        json_err(
            400,
            r#"{"error":{"code":"cyber_policy","message":"flagged"}}"#,
        ),
        ok_stream(),
    ]);
    let session = format!("lifecycle-test-{}", std::process::id());
    let c = open_with(
        &h.ctx,
        &conn,
        &plan(11, BODY, Some(&session)),
        &mut Trace::default(),
    )
    .await
    .expect("committed");
    let tried = conn.accounts();
    assert_eq!(tried.len(), 2);
    assert_ne!(tried[0], tried[1]);
    assert_eq!(c.account.id, tried[1]);
    assert!(!cooled(&h, tried[0]));
    assert!(h.control().is_empty(), "no account effect");
}

/// Transport failures: nothing sent -> the next account; maybe sent -> never resent; the
/// worker's saturation -> given up at once.
#[monoio::test_all(timer_enabled = true)]
async fn transport_failures_are_resent_only_when_nothing_was_sent() {
    let h = Harness::new(2);
    let conn = FakeConnector::new([
        Step::fail(UpstreamError::Connect("refused".into())),
        ok_stream(),
    ]);
    let c = open_with(&h.ctx, &conn, &plan(12, BODY, None), &mut Trace::default())
        .await
        .expect("committed");
    let tried = conn.accounts();
    assert_eq!(tried.len(), 2);
    assert_ne!(tried[0], tried[1]);
    assert_eq!(c.account.id, tried[1]);

    for (e, kind) in [
        (
            UpstreamError::Timeout { sent: true },
            ErrorKind::UpstreamTimeout,
        ),
        (UpstreamError::Saturated, ErrorKind::UpstreamSaturated),
    ] {
        let h = Harness::new(2);
        let conn = FakeConnector::new([Step::fail(e), ok_stream()]);
        let got = open_with(&h.ctx, &conn, &plan(13, BODY, None), &mut Trace::default())
            .await
            .err()
            .expect("given up");
        assert_eq!(
            std::mem::discriminant(&got.kind),
            std::mem::discriminant(&kind)
        );
        assert_eq!(conn.accounts().len(), 1);
    }
}

/// A 200 that ends before any output: the outcome is ambiguous, never resent.
#[monoio::test_all(timer_enabled = true)]
async fn a_stream_ending_before_output_is_not_resent() {
    let h = Harness::new(2);
    let conn = FakeConnector::new([
        Step::sse(&[(
            "response.created",
            r#"{"type":"response.created","response":{"id":"r"}}"#,
        )]),
        ok_stream(),
    ]);
    let e = open_with(&h.ctx, &conn, &plan(14, BODY, None), &mut Trace::default())
        .await
        .err()
        .expect("given up");
    assert!(matches!(e.kind, ErrorKind::UpstreamProtocol), "{e}");
    assert_eq!(conn.accounts().len(), 1);
}

/// A `response.failed` before any output is a refusal like an HTTP error: an in-stream
/// overload fails over.
#[monoio::test_all(timer_enabled = true)]
async fn a_failure_event_before_output_fails_over() {
    let h = Harness::new(2);
    let conn = FakeConnector::new([
        Step::sse(&[
            (
                "response.created",
                r#"{"type":"response.created","response":{"id":"r"}}"#,
            ),
            (
                "response.failed",
                r#"{"type":"response.failed","response":{"error":{"code":"server_is_overloaded","message":"busy"}}}"#,
            ),
        ]),
        ok_stream(),
    ]);
    let c = open_with(&h.ctx, &conn, &plan(15, BODY, None), &mut Trace::default())
        .await
        .expect("committed");
    let tried = conn.accounts();
    assert_eq!(tried.len(), 2);
    assert_ne!(tried[0], tried[1]);
    assert_eq!(c.account.id, tried[1]);
    assert!(cooled(&h, tried[0]));
}
