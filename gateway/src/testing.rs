//! Test support for every read loop: the same bytes delivered over a real socket in a chosen
//! segmentation, exactly one segment per `read` call (docs/io-traps.md#testing-io-code).
//!
//! # Key Components
//! - [`Plan`]: how a byte string is cut: whole, one byte per read, or seeded random cuts.
//! - [`SegmentedIo`]: the server side of a real loopback TCP connection whose peer writes the
//!   next segment only when the code under test asks for more bytes and the previous segment
//!   was consumed, so every read returns exactly one segment (or less, when the reader's spare
//!   room is smaller). After the last segment the peer half-closes: the reader sees EOF.
//!
//! - [`FakeConnector`]: a scripted upstream ([`crate::connector::Connector`]) for the attempt
//!   loop and the pipeline: each attempt takes the next [`Step`] (a response, a stream cut into
//!   chunks and breaks, or a transport failure) and is recorded (account, body).
//! - [`Harness`]: a worker context over a snapshot of test accounts, with the receiving end of
//!   its facts (account effects, refresh requests, usage records).
//!
//! # Usage
//! Wrap the `SegmentedIo` in the codec under test (server `Conn`, upstream h1 client) inside a
//! `#[monoio::test_all]` test, so both drivers (io_uring and legacy) run it. The same for the
//! attempt loop: build a [`Harness`] and a [`FakeConnector`] inside the test.

use std::{
    collections::VecDeque,
    io::{Read, Write},
    net::{Shutdown, TcpListener},
    rc::Rc,
};

use monoio::{
    buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut},
    io::{AsyncReadRent, AsyncWriteRent},
    net::TcpStream,
    BufResult,
};

/// Largest segment written at once (fits an empty loopback receive buffer, so the blocking
/// write of the peer never waits for the reader).
pub const MAX_SEGMENT: usize = 64 * 1024;

/// How a byte string is cut into reads.
#[derive(Debug, Clone, Copy)]
pub enum Plan {
    /// As few reads as possible (segments of [`MAX_SEGMENT`]).
    Whole,
    /// One byte per read.
    EveryByte,
    /// Random cut points from this seed, segments of 1..=max bytes.
    Random {
        /// PRNG seed.
        seed: u64,
        /// Largest segment.
        max: usize,
    },
}

// === impl Plan ===

impl Plan {
    /// The standard set: whole, random splits over `seeds` seeds (small and large segments),
    /// and one byte per read when `every_byte` (costly for megabytes).
    pub fn standard(seeds: u64, every_byte: bool) -> Vec<Plan> {
        let mut v = vec![Plan::Whole];
        if every_byte {
            v.push(Plan::EveryByte);
        }
        for seed in 1..=seeds {
            v.push(Plan::Random {
                seed,
                max: if seed % 2 == 0 { 16 } else { 8 * 1024 },
            });
        }
        v
    }

    /// Cuts `data` into segments.
    pub fn cut(self, data: &[u8]) -> VecDeque<Vec<u8>> {
        let mut out = VecDeque::new();
        let mut rng = match self {
            Plan::Random { seed, .. } => seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            _ => 1,
        };
        let mut rest = data;
        while !rest.is_empty() {
            let n = match self {
                Plan::Whole => MAX_SEGMENT,
                Plan::EveryByte => 1,
                Plan::Random { max, .. } => {
                    // xorshift64*
                    rng ^= rng >> 12;
                    rng ^= rng << 25;
                    rng ^= rng >> 27;
                    let r = rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
                    1 + (r % max.clamp(1, MAX_SEGMENT) as u64) as usize
                }
            }
            .min(rest.len());
            out.push_back(rest[..n].to_vec());
            rest = &rest[n..];
        }
        out
    }
}

/// The reading side of a loopback connection fed one segment per read.
pub struct SegmentedIo {
    io: TcpStream,
    peer: std::net::TcpStream,
    segments: VecDeque<Vec<u8>>,
    /// Bytes written by the peer and not read yet.
    in_flight: usize,
    eof_sent: bool,
    /// Segments delivered so far.
    pub reads: usize,
}

// === impl SegmentedIo ===

impl SegmentedIo {
    /// A connection that will deliver `data` cut by `plan`.
    pub fn new(data: &[u8], plan: Plan) -> Self {
        Self::from_segments(plan.cut(data))
    }

    /// A connection that will deliver exactly these segments.
    pub fn from_segments(segments: VecDeque<Vec<u8>>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let peer =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        peer.set_nodelay(true).expect("nodelay");
        let (server, _) = listener.accept().expect("accept");
        server.set_nonblocking(true).expect("nonblocking");
        Self {
            io: TcpStream::from_std(server).expect("monoio stream"),
            peer,
            segments,
            in_flight: 0,
            eof_sent: false,
            reads: 0,
        }
    }

    /// Everything the code under test wrote to the peer so far (reads until `n` bytes or a
    /// short timeout).
    pub fn written(&mut self, at_least: usize) -> Vec<u8> {
        let mut out = Vec::new();
        self.peer
            .set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .expect("timeout");
        let mut buf = [0u8; 8192];
        while out.len() < at_least {
            match self.peer.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
        out
    }

    /// Never half-closes after the last segment: a reader that wants more bytes waits (tests
    /// use this to prove a malformed input is refused without waiting).
    pub fn hold_open(mut self) -> Self {
        self.eof_sent = true;
        self
    }

    /// Segments not delivered yet.
    pub fn pending_segments(&self) -> usize {
        self.segments.len()
    }

    fn feed(&mut self) {
        if self.in_flight > 0 {
            return;
        }
        match self.segments.pop_front() {
            Some(seg) => {
                self.peer.write_all(&seg).expect("peer write");
                self.in_flight = seg.len();
                self.reads += 1;
            }
            None if !self.eof_sent => {
                let _ = self.peer.shutdown(Shutdown::Write);
                self.eof_sent = true;
            }
            None => {}
        }
    }
}

impl AsyncReadRent for SegmentedIo {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        self.feed();
        let (res, buf) = self.io.read(buf).await;
        if let Ok(n) = res {
            self.in_flight = self.in_flight.saturating_sub(n);
        }
        (res, buf)
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        self.feed();
        let (res, buf) = self.io.readv(buf).await;
        if let Ok(n) = res {
            self.in_flight = self.in_flight.saturating_sub(n);
        }
        (res, buf)
    }
}

impl AsyncWriteRent for SegmentedIo {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        self.io.write(buf).await
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        self.io.writev(buf).await
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        self.io.flush().await
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        self.io.shutdown().await
    }
}

/// One scripted attempt of a [`FakeConnector`].
pub struct Step {
    reply: Result<crate::upstream::UpstreamResponse, crate::upstream::UpstreamError>,
    /// Runs when the attempt is sent, with its account id (e.g. publishes a refreshed token).
    after: Option<Box<dyn FnOnce(i64)>>,
}

// === impl Step ===

impl Step {
    /// An answer with `status` and the whole `body` in one chunk.
    pub fn reply(status: u16, body: &str) -> Self {
        Self::chunks(
            status,
            vec![Ok(bytes::Bytes::copy_from_slice(body.as_bytes()))],
        )
    }

    /// A 200 SSE stream of these `(event type, data)` events, in one chunk.
    pub fn sse(events: &[(&str, &str)]) -> Self {
        Self::reply(200, &sse(events))
    }

    /// An answer with `status` whose body is these chunks and breaks, in turn.
    pub fn chunks(
        status: u16,
        chunks: Vec<Result<bytes::Bytes, crate::upstream::UpstreamError>>,
    ) -> Self {
        Self {
            reply: Ok(crate::upstream::UpstreamResponse {
                status,
                headers: crate::upstream::Head::Pairs(vec![(
                    "content-type".into(),
                    if status == 200 {
                        "text/event-stream"
                    } else {
                        "application/json"
                    }
                    .into(),
                )]),
                body: crate::upstream::UpstreamBody::Scripted(chunks.into()),
                protocol: "http/1.1",
            }),
            after: None,
        }
    }

    /// No answer: the transport failed.
    pub fn fail(e: crate::upstream::UpstreamError) -> Self {
        Self {
            reply: Err(e),
            after: None,
        }
    }

    /// Runs `f` with the attempt's account id when this step is sent.
    pub fn then(mut self, f: impl FnOnce(i64) + 'static) -> Self {
        self.after = Some(Box::new(f));
        self
    }
}

/// SSE frames of `(event type, data)` events.
pub fn sse(events: &[(&str, &str)]) -> String {
    events
        .iter()
        .map(|(t, d)| format!("event: {t}\ndata: {d}\n\n"))
        .collect()
}

/// A complete, successful Responses stream (created, one text delta, completed).
pub fn ok_stream() -> Step {
    Step::sse(&[
        (
            "response.created",
            r#"{"type":"response.created","response":{"id":"resp_1"}}"#,
        ),
        (
            "response.output_text.delta",
            r#"{"type":"response.output_text.delta","delta":"hi"}"#,
        ),
        (
            "response.completed",
            r#"{"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}}"#,
        ),
    ])
}

/// A scripted upstream: every attempt takes the next [`Step`]; an attempt past the script is
/// a test failure (the loop tried more than it should).
#[derive(Default)]
pub struct FakeConnector {
    steps: std::cell::RefCell<VecDeque<Step>>,
    /// (account id, body) of every attempt sent, in order.
    sent: std::cell::RefCell<Vec<(i64, bytes::Bytes)>>,
}

// === impl FakeConnector ===

impl FakeConnector {
    /// A connector answering with `steps`, in turn.
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Self {
            steps: std::cell::RefCell::new(steps.into_iter().collect()),
            sent: Default::default(),
        }
    }

    /// The account of every attempt sent, in order.
    pub fn accounts(&self) -> Vec<i64> {
        self.sent.borrow().iter().map(|(a, _)| *a).collect()
    }

    /// The body of the `i`th attempt.
    pub fn body(&self, i: usize) -> bytes::Bytes {
        self.sent.borrow()[i].1.clone()
    }

    /// Steps not taken.
    pub fn left(&self) -> usize {
        self.steps.borrow().len()
    }
}

impl crate::connector::Connector for FakeConnector {
    fn body_for(&self, _: &shared_state::AccountEntry, _: &bytes::Bytes) -> Option<bytes::Bytes> {
        None
    }

    async fn send(
        &self,
        out: crate::connector::Outgoing<'_>,
    ) -> Result<crate::upstream::UpstreamResponse, crate::upstream::UpstreamError> {
        self.sent
            .borrow_mut()
            .push((out.account.id, out.body.clone()));
        let step =
            self.steps.borrow_mut().pop_front().unwrap_or_else(|| {
                panic!("an attempt past the script, on account {}", out.account.id)
            });
        if let Some(f) = step.after {
            f(out.account.id);
        }
        step.reply
    }

    fn client_headers(
        &self,
        _: &shared_state::AccountEntry,
        _: &crate::upstream::UpstreamResponse,
    ) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    fn transport(&self, _: &crate::upstream::UpstreamResponse, _: bool) -> shared_state::Transport {
        shared_state::Transport::H1
    }

    fn idle_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(5)
    }
}

/// A worker context over a snapshot of accounts, and what it reports.
pub struct Harness {
    /// The context.
    pub ctx: crate::ctx::WorkerCtx,
    /// Its facts: account effects and refresh requests (control), usage records.
    pub events: shared_state::Events,
}

// === impl Harness ===

impl Harness {
    /// A worker (id 0) whose snapshot holds `accounts` (ids 1..=n, one slot each unlimited),
    /// with the default settings.
    pub fn new(n: i64) -> Self {
        use std::{sync::Arc, time::Duration};
        let cfg =
            crate::config::GatewayConfig::with_upstream("http://127.0.0.1:9").expect("config");
        let registry = crate::metrics::Registry::new(1);
        let metrics = registry.worker(0);
        let upstream = crate::upstream::Upstream::new(cfg.upstream.clone(), Arc::clone(&metrics))
            .expect("upstream");
        let snapshot = shared_state::Snapshot::shared();
        snapshot.store(Arc::new(shared_state::Snapshot {
            version: 1,
            accounts: (1..=n)
                .map(|id| Arc::new(crate::scheduler::tests::raw_entry(id, 1, 0)))
                .collect(),
            ..Default::default()
        }));
        let (tx, events) = shared_state::channels::events();
        let ttl = Duration::from_secs(60);
        let ctx = crate::ctx::WorkerCtx::new(
            0,
            Arc::new(cfg),
            snapshot,
            Arc::new(shared_state::snapshot::Health::default()),
            upstream,
            metrics,
            registry,
            shared_state::catalog::ModelCatalog::empty(Default::default()).shared(),
            tx,
            Rc::new(crate::transcripts::Transcripts::new(
                Arc::new(shared_state::transcripts::TranscriptStore::new(
                    1 << 20,
                    ttl,
                )),
                None,
                ttl,
            )),
            Rc::new(crate::owners::Owners::new(
                Arc::new(crate::owners::BlobOwners::new(1 << 20, ttl)),
                None,
            )),
        );
        Self { ctx, events }
    }

    /// The account as the current snapshot has it.
    pub fn account(&self, id: i64) -> std::sync::Arc<shared_state::AccountEntry> {
        std::sync::Arc::clone(self.ctx.snapshot.load().account(id).expect("account"))
    }

    /// The control facts reported so far (account effects, refresh requests).
    pub fn control(&self) -> Vec<shared_state::WorkerEvent> {
        self.ctx.flush_spool();
        self.events.drain_control().collect()
    }
}

/// Publishes a snapshot in which account `id` is changed by `f` (its live state kept, as the
/// sidecar's publisher does), e.g. from a [`Step::then`] closure.
pub fn publish(
    cell: &shared_state::SharedSnapshot,
    id: i64,
    f: impl FnOnce(&mut shared_state::AccountEntry),
) {
    let old = cell.load_full();
    let mut f = Some(f);
    let accounts = old
        .accounts
        .iter()
        .map(|a| {
            if a.id != id {
                return std::sync::Arc::clone(a);
            }
            let mut e = shared_state::AccountEntry {
                id: a.id,
                label: a.label.clone(),
                chatgpt_account_id: a.chatgpt_account_id.clone(),
                user_id: a.user_id.clone(),
                plan: a.plan.clone(),
                access_token: a.access_token.clone(),
                access_expires_at: a.access_expires_at,
                status: a.status,
                weight: a.weight,
                max_concurrency: a.max_concurrency,
                live: std::sync::Arc::clone(&a.live),
                group: a.group.clone(),
                egress: a.egress.clone(),
            };
            if let Some(f) = f.take() {
                f(&mut e);
            }
            std::sync::Arc::new(e)
        })
        .collect();
    cell.store(std::sync::Arc::new(shared_state::Snapshot {
        version: old.version + 1,
        accounts,
        keys: old.keys.clone(),
        settings: old.settings.clone(),
    }));
}

/// A plan for `body` (a Responses body for model `gpt-5`) from key `key_id`, with the
/// session `affinity`.
pub fn plan(key_id: i64, body: &str, affinity: Option<&str>) -> crate::lifecycle::RequestPlan {
    crate::lifecycle::RequestPlan {
        route: "responses",
        model: "gpt-5".into(),
        body: bytes::Bytes::copy_from_slice(body.as_bytes()),
        asked: Default::default(),
        passthrough: Vec::new(),
        key_id,
        key_limits: std::sync::Arc::new(shared_state::keys::KeyLimits {
            enabled: true,
            ..Default::default()
        }),
        affinity_key: affinity.map(str::to_owned),
        upstream_ws: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_cover_the_data() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        for plan in Plan::standard(6, true) {
            let segs = plan.cut(&data);
            assert_eq!(segs.iter().flatten().copied().collect::<Vec<u8>>(), data);
            assert!(segs.iter().all(|s| !s.is_empty() && s.len() <= MAX_SEGMENT));
        }
        assert_eq!(Plan::EveryByte.cut(&data).len(), data.len());
        assert!(Plan::Random { seed: 3, max: 16 }.cut(&data).len() > 1000);
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn one_segment_per_read() {
        let mut io =
            SegmentedIo::from_segments(VecDeque::from(vec![b"ab".to_vec(), b"cde".to_vec()]));
        let (r, b) = io.read(Vec::with_capacity(64)).await;
        assert_eq!((r.unwrap(), b.as_slice()), (2, &b"ab"[..]));
        let (r, b) = io.read(Vec::with_capacity(64)).await;
        assert_eq!((r.unwrap(), b.as_slice()), (3, &b"cde"[..]));
        let (r, _) = io.read(Vec::with_capacity(64)).await;
        assert_eq!(r.unwrap(), 0, "EOF after the last segment");
    }
}
