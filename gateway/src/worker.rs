//! Thread-per-core workers (docs/conventions.md#threads, docs/io-traps.md#driver-fallback).
//!
//! # Key Components
//! - [`crate::ctx::WorkerCtx`]: everything one worker owns (`!Send`), built here.
//! - [`run`]: the body of a worker thread: pin to a core, build the monoio runtime (io_uring,
//!   explicit fallback to the legacy driver), accept on the worker's own `SO_REUSEPORT`
//!   listener, serve connections, obey sidecar commands, drain on shutdown.
//!
//! # Error handling
//! A connection's failure ends that connection only. Runtime construction failure falls back
//! to the legacy driver; failing that, the worker reports the error and the process exits.

use std::{
    panic::AssertUnwindSafe,
    rc::Rc,
    sync::{mpsc, Arc},
    time::{Duration, Instant},
};

use futures_util::FutureExt;
use monoio::net::TcpStream;
use shared_state::{snapshot::Health, EventSender, SharedSnapshot, WorkerCommand, WorkerMailbox};

use crate::{
    api,
    config::GatewayConfig,
    ctx::WorkerCtx,
    front_door::FrontDoor,
    metrics::{Guard, Registry},
    server::{
        admission::{Admitted, ConnGate, Refusal},
        h1::{Conn, Limits, ReadError},
    },
    upstream::Upstream,
};

/// What a worker thread is started with (all `Send`).
pub struct WorkerSeed {
    /// Worker index.
    pub id: usize,
    /// CPU to pin to, if any.
    pub cpu: Option<usize>,
    /// The pre-bound listener (SO_REUSEPORT).
    pub listener: std::net::TcpListener,
    /// Configuration.
    pub cfg: Arc<GatewayConfig>,
    /// Snapshot cell.
    pub snapshot: SharedSnapshot,
    /// Health flags.
    pub health: Arc<Health>,
    /// Facts to the sidecar.
    pub events: EventSender,
    /// Commands from the sidecar.
    pub mailbox: WorkerMailbox,
    /// Metrics.
    pub registry: Registry,
    /// Model catalog cell.
    pub catalog: shared_state::SharedCatalog,
    /// HTTP response transcripts (`previous_response_id`), shared by the workers.
    pub transcripts: Arc<shared_state::TranscriptStore>,
    /// The workers' Redis (shared transcripts), when configured and reachable by name.
    pub redis: Option<crate::redis::RedisTarget>,
    /// Who minted which account-bound blob, shared by the app's workers (`crate::owners`).
    pub owners: Arc<crate::owners::BlobOwners>,
    /// Open-connection caps, shared by the workers.
    pub conns: Arc<ConnGate>,
    /// Request rates and the IP allow-list (`crate::front_door`), shared by the workers.
    pub front_door: Arc<FrontDoor>,
}

/// A panic that escapes a worker's runtime (anything outside a connection's panic boundary:
/// the accept loop, the command loop) would leave its `SO_REUSEPORT` listener taking
/// connections nobody serves and its slots held. It is never hidden: the process aborts, and
/// its supervisor restarts it (systemd `Restart=always`, a container restart policy).
struct AbortOnEscapedPanic(usize);

impl Drop for AbortOnEscapedPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!(
                worker = self.0,
                "worker thread panicked; aborting the process"
            );
            std::process::abort();
        }
    }
}

/// Builds the worker's runtime (io_uring, else legacy) and runs `make(driver)` on it.
fn build_and_run<F, Fut>(force_legacy: bool, make: F) -> std::io::Result<()>
where
    F: FnOnce(&'static str) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    if !force_legacy {
        match monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .with_entries(4096)
            .enable_timer()
            .build()
        {
            Ok(mut rt) => {
                rt.block_on(make("io_uring"));
                return Ok(());
            }
            Err(e) => {
                tracing::warn!(error = %e, "io_uring unavailable; falling back to the legacy (epoll) driver")
            }
        }
    }
    let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()?;
    rt.block_on(make("legacy"));
    Ok(())
}

/// Runs one worker thread to completion. `ready` gets `Ok(driver)` once the worker accepts.
pub fn run(seed: WorkerSeed, ready: mpsc::Sender<Result<&'static str, String>>) {
    let _backstop = AbortOnEscapedPanic(seed.id);
    if let Some(cpu) = seed.cpu {
        if let Err(e) = monoio::utils::bind_to_cpu_set(Some(cpu)) {
            tracing::debug!(cpu, error = ?e, "cannot pin worker");
        }
    }
    let ready2 = ready.clone();
    let force_legacy = seed.cfg.force_legacy_driver;
    let res = build_and_run(force_legacy, move |driver| worker_main(seed, driver, ready));
    if let Err(e) = res {
        let _ = ready2.send(Err(format!("cannot build a monoio runtime: {e}")));
    }
}

async fn worker_main(
    seed: WorkerSeed,
    driver: &'static str,
    ready: mpsc::Sender<Result<&'static str, String>>,
) {
    let WorkerSeed {
        id,
        listener,
        cfg,
        snapshot,
        health,
        events,
        mailbox,
        registry,
        catalog,
        transcripts,
        redis,
        owners,
        conns,
        front_door,
        ..
    } = seed;
    let metrics = registry.worker(id);
    metrics.set_driver(driver);
    let upstream = match Upstream::new(cfg.upstream.clone(), Arc::clone(&metrics)) {
        Ok(u) => u,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    // A second descriptor of the same socket, to take it out of service synchronously at
    // drain (see below).
    let control = listener.try_clone().ok();
    let listener = match monoio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(format!("listener: {e}")));
            return;
        }
    };
    // One Redis client per worker: transcripts, blob owners and the key limits share it.
    let redis = redis.map(|t| Rc::new(crate::redis::WorkerRedis::new(t)));
    let owners = Rc::new(crate::owners::Owners::new(owners, redis.clone()));
    let transcripts = Rc::new(crate::transcripts::Transcripts::new(
        transcripts,
        redis,
        cfg.transcript_ttl,
    ));
    let ctx = Rc::new(WorkerCtx::new(
        id,
        Arc::clone(&cfg),
        snapshot,
        health,
        upstream,
        metrics,
        registry,
        catalog,
        events,
        transcripts,
        owners,
    ));
    ctx.upstream.start_background();
    // The idle deadlines of this worker's open streams (`crate::deadline`).
    let _deadlines = crate::deadline::install();
    ctx.health.beat(id, shared_state::now_ms());
    tracing::info!(worker = id, driver, "worker ready");
    let _ = ready.send(Ok(driver));

    let drain = Rc::new(tokio::sync::Notify::new());
    {
        let ctx = Rc::clone(&ctx);
        let drain = Rc::clone(&drain);
        monoio::spawn(async move {
            while let Some(cmd) = mailbox.recv().await {
                match cmd {
                    WorkerCommand::Drain => {
                        ctx.start_drain();
                        drain.notify_one();
                    }
                    WorkerCommand::EvictAccount { account_id } => {
                        ctx.upstream.evict_account(account_id)
                    }
                    WorkerCommand::SnapshotUpdated { .. } => {}
                }
                ctx.flush_spool();
            }
        });
    }
    {
        let ctx = Rc::clone(&ctx);
        monoio::spawn(async move {
            loop {
                // The heartbeat `/healthz` reads: a worker whose loop is stuck stops beating.
                ctx.health.beat(ctx.id, shared_state::now_ms());
                ctx.flush_spool();
                monoio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }

    let mut accept_log = AcceptLog::default();
    let refusals = refusal_bound(conns.max_total(), cfg.workers);
    loop {
        monoio::select! {
            _ = drain.notified() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let ctx = Rc::clone(&ctx);
                    // An address not on the allow-list takes no connection place.
                    if !FrontDoor::allows(&ctx.snapshot.load().settings, peer.ip()) {
                        monoio::spawn(refuse_unlisted(ctx, stream, refusals));
                    } else {
                        match conns.admit(peer.ip()) {
                            Ok(place) => {
                                let door = Arc::clone(&front_door);
                                monoio::spawn(serve_connection_caught(
                                    ctx, stream, place, peer.ip(), door,
                                ));
                            }
                            Err(refusal) => {
                                monoio::spawn(refuse_connection(ctx, stream, refusal, refusals));
                            }
                        }
                    }
                }
                Err(e) => {
                    ctx.metrics.guard(Guard::AcceptFailed);
                    accept_log.failed(id, &e, Instant::now());
                    // Out of descriptors, accepting again at once fails again: give
                    // connections time to close.
                    let wait = if e.raw_os_error() == Some(libc::EMFILE)
                        || e.raw_os_error() == Some(libc::ENFILE)
                    {
                        100
                    } else {
                        10
                    };
                    monoio::time::sleep(Duration::from_millis(wait)).await;
                }
            }
        }
    }
    // Leave the SO_REUSEPORT group now, synchronously. Dropping the listener only queues an
    // io_uring close, and an accept the kernel still holds (the one `select!` dropped) keeps
    // the socket listening until the ring is torn down: connections the kernel routes to it
    // meanwhile (a restarted gateway on the same port, the other instance behind the balancer)
    // would be accepted by nobody and hang. `shutdown` on a listening socket unhashes it at
    // once, fails that accept, and resets connections still in its backlog.
    if let Some(c) = &control {
        let _ = socket2::SockRef::from(c).shutdown(std::net::Shutdown::Both);
    }
    drop(control);
    drop(listener);
    let deadline = Instant::now() + cfg.shutdown_grace;
    while ctx.active() > 0 && Instant::now() < deadline {
        monoio::time::sleep(Duration::from_millis(20)).await;
    }
    ctx.flush_spool();
    tracing::info!(worker = id, left = ctx.active(), "worker drained");
}

/// Serves one connection inside a panic boundary: a panic in its task is logged and counted,
/// and dropping the task's state closes the socket and releases every slot it held (RAII
/// guards), so the client sees the connection end instead of a hang and the worker goes on.
async fn serve_connection_caught(
    ctx: Rc<WorkerCtx>,
    stream: TcpStream,
    place: Admitted,
    peer: std::net::IpAddr,
    door: Arc<FrontDoor>,
) {
    let metrics = Arc::clone(&ctx.metrics);
    let id = ctx.id;
    metrics.connection_delta(1);
    let served = AssertUnwindSafe(serve_connection(ctx, stream, peer, door))
        .catch_unwind()
        .await;
    metrics.connection_delta(-1);
    drop(place);
    if let Err(panic) = served {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        metrics.panic();
        tracing::error!(worker = id, panic = %what, "connection task panicked; connection closed");
    }
}

/// The time budgets of a client connection, from the configuration.
pub(crate) fn client_limits(cfg: &GatewayConfig) -> Limits {
    Limits {
        head: cfg.client_header_timeout,
        body: cfg.client_body_timeout,
        body_min_rate: cfg.client_body_min_rate,
        write: cfg.client_write_timeout,
    }
}

/// How often a worker logs failed accepts (each is counted in `/metrics` either way).
const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(10);

/// The accept loop's log of failures, at most one line per [`ACCEPT_LOG_EVERY`] with the
/// number of failures since the last line: a worker out of descriptors fails hundreds of
/// accepts a second, and one line each would flood the log (and the disk under it).
#[derive(Debug, Default)]
struct AcceptLog {
    last: Option<Instant>,
    since: u64,
}

impl AcceptLog {
    /// Records a failed accept; `true` when a line was logged for it.
    fn failed(&mut self, worker: usize, e: &std::io::Error, now: Instant) -> bool {
        self.since += 1;
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < ACCEPT_LOG_EVERY)
        {
            return false;
        }
        tracing::warn!(worker, error = %e, failures = self.since, "accept failed");
        self.last = Some(now);
        self.since = 0;
        true
    }
}

/// Most refusals a worker answers at once; past it (a flood) a refused connection is closed
/// without an answer, so refusing never holds more than this many sockets per worker.
const MAX_REFUSALS_IN_FLIGHT: usize = 256;

/// Refusals one worker answers at once: [`MAX_REFUSALS_IN_FLIGHT`], and under a connection
/// cap no more than an eighth of the cap across the workers, so the sockets refusals hold
/// (each lingers briefly) fit beside the admitted ones within the descriptor limit the
/// automatic cap was derived from.
fn refusal_bound(max_connections: usize, workers: usize) -> usize {
    if max_connections == 0 {
        return MAX_REFUSALS_IN_FLIGHT;
    }
    (max_connections / (8 * workers.max(1))).clamp(1, MAX_REFUSALS_IN_FLIGHT)
}

thread_local! {
    static REFUSALS_IN_FLIGHT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Answers a connection over a cap (503 global, 429 per IP, OpenAI error shape) and closes
/// it after a short linger, so the client reads the answer rather than a reset.
async fn refuse_connection(ctx: Rc<WorkerCtx>, stream: TcpStream, refusal: Refusal, bound: usize) {
    ctx.metrics.guard(match refusal {
        Refusal::Global => Guard::RefusedGlobal,
        Refusal::PerIp => Guard::RefusedPerIp,
    });
    if REFUSALS_IN_FLIGHT.get() >= bound {
        return; // dropping the stream closes it
    }
    REFUSALS_IN_FLIGHT.set(REFUSALS_IN_FLIGHT.get() + 1);
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            REFUSALS_IN_FLIGHT.set(REFUSALS_IN_FLIGHT.get().saturating_sub(1));
        }
    }
    let _done = Done;
    let mut conn = Conn::with_limits(
        stream,
        Limits {
            write: Duration::from_secs(1),
            ..client_limits(&ctx.cfg)
        },
    );
    // Before any request: OpenAI's shape (no route says otherwise).
    let r = crate::error::Error::new(
        crate::error::ErrorKind::ConnectionCap(refusal),
        crate::error::Side::Downstream,
    )
    .render(crate::error::Dialect::OpenAi);
    let retry = r.retry_after.unwrap_or(1).to_string();
    let headers = [api::JSON, ("retry-after", retry.as_str())];
    if conn
        .write_response(r.status, &headers, &r.body, false)
        .await
        .is_ok()
    {
        conn.linger(Duration::from_millis(500), 64 * 1024).await;
    }
}

/// Answers the one request of a connection from an address not on `ip_allow_list` with a
/// 403 in its route's dialect (`/healthz` and `/metrics` are served: the front door never
/// limits them) and closes it. It holds no connection place; past the worker's refusal
/// bound (a flood) the connection is closed unanswered, and counted all the same.
async fn refuse_unlisted(ctx: Rc<WorkerCtx>, stream: TcpStream, bound: usize) {
    if REFUSALS_IN_FLIGHT.get() >= bound {
        ctx.metrics.guard(Guard::FrontDoorNotAllowed);
        return; // dropping the stream closes it
    }
    REFUSALS_IN_FLIGHT.set(REFUSALS_IN_FLIGHT.get() + 1);
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            REFUSALS_IN_FLIGHT.set(REFUSALS_IN_FLIGHT.get().saturating_sub(1));
        }
    }
    let _done = Done;
    let budget = Duration::from_secs(5);
    let mut conn = Conn::with_limits(
        stream,
        Limits {
            head: ctx.cfg.client_header_timeout.min(budget),
            write: Duration::from_secs(1),
            ..client_limits(&ctx.cfg)
        },
    );
    let Ok(mut req) = conn.read_head(budget).await else {
        return;
    };
    let _guard = ctx.request_started();
    if api::Route::of_path(&req.path).front_door_exempt() && !api::ws::wants_upgrade(&req) {
        req.keep_alive = false;
        let _ = api::handle(&ctx, &mut conn, req).await;
        return;
    }
    let refusal = crate::front_door::Refusal::NotAllowed;
    let _ = api::refuse_front_door(&ctx, &mut conn, &req, refusal).await;
    conn.linger(Duration::from_millis(500), 64 * 1024).await;
}

async fn serve_connection(
    ctx: Rc<WorkerCtx>,
    stream: TcpStream,
    peer: std::net::IpAddr,
    door: Arc<FrontDoor>,
) {
    let mut conn = Conn::with_limits(stream, client_limits(&ctx.cfg));
    loop {
        if ctx.is_draining() {
            break;
        }
        let req = conn.read_head(ctx.cfg.client_idle_timeout).await;
        let _guard = ctx.request_started();
        // A malformed head (smuggling attempts included) is answered and the connection
        // closed; linger first so the client reads the answer rather than a reset. A timed
        // out head is not waited for any longer.
        let mut linger = false;
        if let Err(ReadError::Reject { status, .. }) = &req {
            if *status == 408 {
                ctx.metrics.guard(Guard::HeadTimeout);
            } else {
                linger = true;
            }
        }
        // The front door, before the upgrade and before routing (`crate::front_door`).
        let refused = match &req {
            Ok(r) if !api::Route::of_path(&r.path).front_door_exempt() => {
                door.admit(&ctx.snapshot.load().settings, peer).err()
            }
            _ => None,
        };
        let keep = match (req, refused) {
            (Ok(req), Some(refusal)) => {
                api::refuse_front_door(&ctx, &mut conn, &req, refusal).await
            }
            (Ok(req), None) if api::ws::wants_upgrade(&req) => {
                // The connection becomes a WebSocket and never serves HTTP again.
                // Boxed: an HTTP connection's task must not reserve a WebSocket session's state.
                Box::pin(api::ws::serve(&ctx, conn, req)).await;
                return;
            }
            (Ok(req), None) => api::handle(&ctx, &mut conn, req).await.unwrap_or(false),
            (Err(e), _) => api::write_read_error(&ctx, &mut conn, api::Route::NotFound, e).await,
        };
        if conn.body_unread() || linger {
            // Answered without reading the body (rejected before authentication, or a
            // framing error): drain briefly so the client reads the answer, not a reset.
            conn.linger(Duration::from_secs(2), 64 * 1024 * 1024).await;
            break;
        }
        if !keep {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_accepts_are_logged_at_most_once_per_period() {
        let mut log = AcceptLog::default();
        let e = std::io::Error::from_raw_os_error(libc::EMFILE);
        let t0 = Instant::now();
        assert!(log.failed(0, &e, t0));
        let logged = (1..=3000u64)
            .filter(|i| log.failed(0, &e, t0 + Duration::from_millis(*i)))
            .count();
        assert_eq!(
            logged, 0,
            "3,000 failures within the period log nothing more"
        );
        assert_eq!(log.since, 3000);
        assert!(log.failed(0, &e, t0 + ACCEPT_LOG_EVERY + Duration::from_millis(1)));
        assert_eq!(log.since, 0);
    }

    #[test]
    fn refusals_in_flight_fit_beside_the_cap() {
        assert_eq!(refusal_bound(0, 2), MAX_REFUSALS_IN_FLIGHT);
        assert_eq!(refusal_bound(384, 2), 24);
        assert_eq!(refusal_bound(9488, 2), MAX_REFUSALS_IN_FLIGHT);
        assert_eq!(refusal_bound(9488, 16), 74);
        assert_eq!(refusal_bound(3, 16), 1);
    }
}
