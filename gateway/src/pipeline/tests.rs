//! The forward loop over a scripted upstream (`crate::testing::FakeConnector`), on both
//! drivers: what the encoder and the sink see, the account effect of a failure after the
//! commit, and the one usage record of every exit.

use std::io;

use codex_protocol::sse::SseEvent;
use shared_state::{ClientKey, UsageRecord, WorkerEvent};

use super::{forward, Aggregate, AggregateJson, Encoder, Sink, UsageGuard};
use crate::{
    error::Error,
    lifecycle::{open_with, Committed},
    testing::{ok_stream, plan, FakeConnector, Harness, Step},
};

const BODY: &str = r#"{"model":"gpt-5","input":"hi","stream":true}"#;

/// Writes each event's type on a line; a break as `broken`.
struct Lines {
    streaming: bool,
}

impl Encoder for Lines {
    fn streaming(&self) -> bool {
        self.streaming
    }

    fn event(&mut self, ev: &SseEvent, out: &mut Vec<u8>) {
        out.extend_from_slice(ev.event_type().as_bytes());
        out.push(b'\n');
    }

    fn broken(&mut self, _: &Error, _: Option<&str>, out: &mut Vec<u8>) {
        out.extend_from_slice(b"broken\n");
    }

    fn finish(&mut self, failed: Option<&Error>, _: &mut Vec<u8>) -> Result<(), Error> {
        match failed {
            Some(e) if !self.streaming => Err(e.clone()),
            _ => Ok(()),
        }
    }
}

/// Records what reaches the client; `fail_sends`: the client is gone at the first write.
#[derive(Default)]
struct Recorder {
    calls: Vec<&'static str>,
    body: Vec<u8>,
    fail_sends: bool,
}

impl Sink for Recorder {
    async fn begin(&mut self, _: &[(&'static str, String)]) -> io::Result<()> {
        self.calls.push("begin");
        Ok(())
    }

    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.calls.push("send");
        if self.fail_sends {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        self.body.extend_from_slice(bytes);
        Ok(())
    }

    async fn end(&mut self, last: &[u8]) -> io::Result<bool> {
        self.calls.push("end");
        self.body.extend_from_slice(last);
        Ok(true)
    }

    async fn whole(&mut self, _: &[(&'static str, String)], body: &[u8]) -> io::Result<bool> {
        self.calls.push("whole");
        self.body.extend_from_slice(body);
        Ok(true)
    }

    async fn error(&mut self, _: &Error) -> io::Result<bool> {
        self.calls.push("error");
        Ok(true)
    }
}

/// Opens `plan`'s request over `conn` the way `pipeline::open` does, and forwards it.
async fn run(
    h: &Harness,
    conn: &FakeConnector,
    streaming: bool,
    sink: &mut Recorder,
) -> (io::Result<bool>, UsageRecord) {
    let key = ClientKey::unlimited(1, "k");
    let res = {
        let mut usage = UsageGuard::start(
            &h.ctx,
            &key,
            "responses",
            "gpt-5".into(),
            streaming,
            "req-1",
        );
        let c: Committed = open_with(&h.ctx, conn, &plan(1, BODY, None), &mut usage.trace)
            .await
            .expect("committed");
        forward(&h.ctx, c, &mut usage, &mut Lines { streaming }, sink).await
    };
    h.ctx.flush_spool();
    let mut records: Vec<UsageRecord> = h
        .events
        .drain_usage()
        .filter_map(|e| match e {
            WorkerEvent::Usage(r) => Some(*r),
            _ => None,
        })
        .collect();
    assert_eq!(records.len(), 1, "one usage record per request");
    (res, records.remove(0))
}

fn text(sink: &Recorder) -> String {
    String::from_utf8_lossy(&sink.body).into_owned()
}

/// A streamed answer after a failover: every client-visible event once, in order, quota
/// frames observed and stripped, one record with the tokens, the account and the failover.
#[monoio::test_all(timer_enabled = true)]
async fn a_stream_reaches_the_client_once_and_is_recorded_once() {
    let h = Harness::new(2);
    let conn = FakeConnector::new([
        Step::reply(429, r#"{"error":{"type":"rate_limit_exceeded"}}"#),
        Step::sse(&[
            (
                "response.created",
                r#"{"type":"response.created","response":{"id":"resp_1"}}"#,
            ),
            (
                "codex.rate_limits",
                r#"{"type":"codex.rate_limits","rate_limits":{"primary":{"used_percent":42.0}}}"#,
            ),
            (
                "response.output_text.delta",
                r#"{"type":"response.output_text.delta","delta":"hi"}"#,
            ),
            (
                "response.completed",
                r#"{"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}}"#,
            ),
        ]),
    ]);
    let mut sink = Recorder::default();
    let (res, rec) = run(&h, &conn, true, &mut sink).await;
    assert!(res.expect("answered"));
    assert_eq!(
        text(&sink),
        "response.created\nresponse.output_text.delta\nresponse.completed\n"
    );
    assert_eq!(sink.calls.first(), Some(&"begin"));
    assert_eq!(sink.calls.last(), Some(&"end"));
    let served = conn.accounts()[1];
    assert_eq!(rec.status, 200);
    assert_eq!(rec.account_id, Some(served));
    assert_eq!((rec.input_tokens, rec.output_tokens), (3, 1));
    assert_eq!(rec.failovers, 1);
    assert_eq!(rec.error_code, None);
}

/// A `response.failed` after the commit: forwarded as it is, the account bears its effect,
/// and no other account is tried.
#[monoio::test_all(timer_enabled = true)]
async fn a_failure_after_the_commit_is_forwarded_and_charged_to_the_account() {
    let h = Harness::new(2);
    let conn = FakeConnector::new([
        Step::sse(&[
            (
                "response.output_text.delta",
                r#"{"type":"response.output_text.delta","delta":"a"}"#,
            ),
            (
                "response.failed",
                r#"{"type":"response.failed","response":{"error":{"code":"rate_limit_exceeded","message":"slow down"}}}"#,
            ),
        ]),
        ok_stream(),
    ]);
    let mut sink = Recorder::default();
    let (res, rec) = run(&h, &conn, true, &mut sink).await;
    assert!(res.expect("answered"));
    assert_eq!(text(&sink), "response.output_text.delta\nresponse.failed\n");
    let served = conn.accounts()[0];
    assert_eq!(conn.left(), 1, "never another account after the commit");
    assert!(h.account(served).live.is_cooling(shared_state::now_ms()));
    assert_eq!(
        rec.status, 200,
        "a streamed response is a 200 whatever happened in it"
    );
    assert!(rec.error_code.is_some());
}

/// The upstream closes before a terminal event: the encoder closes the response in its
/// dialect; the record carries the error.
#[monoio::test_all(timer_enabled = true)]
async fn a_stream_cut_short_is_closed_in_the_dialect() {
    let h = Harness::new(1);
    let conn = FakeConnector::new([Step::sse(&[(
        "response.output_text.delta",
        r#"{"type":"response.output_text.delta","delta":"a"}"#,
    )])]);
    let mut sink = Recorder::default();
    let (res, rec) = run(&h, &conn, true, &mut sink).await;
    assert!(res.expect("answered"));
    assert_eq!(text(&sink), "response.output_text.delta\nbroken\n");
    assert_eq!(rec.status, 200);
    assert_eq!(rec.error_class.as_deref(), Some("upstream_protocol"));
}

/// The client is gone at the first write: the loop ends, the record says so (499).
#[monoio::test_all(timer_enabled = true)]
async fn a_client_gone_mid_stream_is_recorded_as_499() {
    let h = Harness::new(1);
    let conn = FakeConnector::new([Step::sse(&[(
        "response.output_text.delta",
        r#"{"type":"response.output_text.delta","delta":"a"}"#,
    )])]);
    let mut sink = Recorder {
        fail_sends: true,
        ..Default::default()
    };
    let (res, rec) = run(&h, &conn, true, &mut sink).await;
    assert!(res.is_err());
    assert_eq!(rec.status, 499);
    assert_eq!(rec.error_code.as_deref(), Some("client_gone"));
}

/// A buffered dialect answers once, whole, at the end; a failure becomes its error.
#[monoio::test_all(timer_enabled = true)]
async fn a_buffered_dialect_answers_once() {
    #[derive(Default)]
    struct Count(usize);
    impl Aggregate for Count {
        fn on_event(&mut self, _: &str, _: &[u8]) {
            self.0 += 1;
        }
        fn render(self) -> Result<Vec<u8>, Error> {
            Ok(format!("{} events", self.0).into_bytes())
        }
    }
    let h = Harness::new(1);
    let conn = FakeConnector::new([ok_stream()]);
    let key = ClientKey::unlimited(1, "k");
    let mut sink = Recorder::default();
    {
        let mut usage = UsageGuard::start(&h.ctx, &key, "chat", "gpt-5".into(), false, "req-2");
        let c = open_with(&h.ctx, &conn, &plan(1, BODY, None), &mut usage.trace)
            .await
            .expect("committed");
        let mut enc = AggregateJson::new(Count::default());
        assert!(forward(&h.ctx, c, &mut usage, &mut enc, &mut sink)
            .await
            .expect("answered"));
    }
    assert_eq!(sink.calls, vec!["whole"]);
    assert_eq!(text(&sink), "3 events");
}
