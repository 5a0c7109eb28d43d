//! The two directions between the runtimes: facts from workers to the sidecar, commands from
//! the sidecar to each worker. Both are bounded crossbeam queues paired with a
//! `tokio::sync::Notify` as the cross-runtime waker (`notify_one` stores a permit, so no wakeup
//! is lost; monoio's `sync` feature lets a monoio task await it).
//!
//! # Key Components
//! - [`WorkerEvent`] / [`EventSender`] / [`Events`]: worker -> sidecar facts over two
//!   queues: usage records, and control facts (account effects including quota observations,
//!   refresh requests), so usage never delays an account event or a refresh.
//! - [`UsageRecord`]: one request's usage; [`UsageStats`]: the usage path's counters.
//! - [`WorkerCommand`] / [`WorkerMailbox`] / [`WorkerMailboxes`]: sidecar -> worker commands.
//!
//! # Error handling
//! Sending never blocks the data plane. A full event queue returns the event to the caller
//! ([`EventSender::try_send`]), which keeps it in a worker-local spool and retries.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use tokio::sync::Notify;

use crate::AccountEffect;

/// Capacity of the worker -> sidecar queue.
pub const EVENT_QUEUE: usize = 65_536;

/// How a request reached the upstream (the attempt that committed, or the last one tried).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// No attempt reached the upstream.
    #[default]
    None,
    /// HTTP/2 (TLS or h2c).
    H2,
    /// HTTP/1.1.
    H1,
    /// A pooled upstream Responses WebSocket.
    Ws,
    /// A WebSocket turn that went over HTTP instead (connect failed, upgrade refused, breaker
    /// open, message too big).
    HttpFallback,
}

// === impl Transport ===

impl Transport {
    /// The stored name: `h2`, `h1`, `ws`, `http_fallback`, or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::H2 => "h2",
            Self::H1 => "h1",
            Self::Ws => "ws",
            Self::HttpFallback => "http_fallback",
        }
    }

    /// The inverse of [`Transport::as_str`] (unknown names are `None`).
    pub fn parse(s: &str) -> Self {
        match s {
            "h2" => Self::H2,
            "h1" => Self::H1,
            "ws" => Self::Ws,
            "http_fallback" => Self::HttpFallback,
            _ => Self::None,
        }
    }
}

/// The route labels: the data plane's metrics label each route with one of these
/// (`gateway::api::route::Route::label`, `gateway::metrics::ROUTES`), and a [`UsageRecord`]
/// carries one (a record replayed from the spool has its route mapped back onto these;
/// anything else is `other`, the last).
pub const ROUTE_LABELS: [&str; 11] = [
    "responses",
    "responses_compact",
    "chat_completions",
    "messages",
    "messages_count_tokens",
    "models",
    "healthz",
    "metrics",
    "chatgpt",
    "usage",
    "other",
];

/// The `&'static` route label `s` (see [`ROUTE_LABELS`]).
pub fn usage_route(s: &str) -> &'static str {
    ROUTE_LABELS
        .iter()
        .copied()
        .find(|r| *r == s)
        .unwrap_or("other")
}

/// One finished request, for usage accounting. Each fact has one owner on the data plane:
/// the lifecycle (account, transport, failovers, time to first byte), the pipeline (tokens,
/// time to first token, status), the classifier (error class), the request (model, effort,
/// tier).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UsageRecord {
    /// Unique id of the record ([`UsageRecord::new_id`], set when the record is built; 0:
    /// not set, the sidecar assigns one). Stored in a unique column: a record replayed from
    /// the durable spool after a crash between the database commit and the spool's
    /// truncation is not counted twice.
    pub id: u128,
    /// Client key id.
    pub key_id: i64,
    /// Account that served the request (None when no attempt was accepted).
    pub account_id: Option<i64>,
    /// Route, e.g. `responses` or `chat_completions` (see [`ROUTE_LABELS`]).
    pub route: &'static str,
    /// Model requested by the client.
    pub model: String,
    /// HTTP status the client got (200 for streams that committed).
    pub status: u16,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// Tokens in.
    pub input_tokens: u64,
    /// Cached tokens in.
    pub cached_tokens: u64,
    /// Tokens out.
    pub output_tokens: u64,
    /// Reasoning tokens out.
    pub reasoning_tokens: u64,
    /// Upstream time to first byte, ms.
    pub ttfb_ms: Option<u64>,
    /// Total duration, ms.
    pub latency_ms: u64,
    /// OpenAI error code when the request failed.
    pub error_code: Option<String>,
    /// Unix ms at the start of the request.
    pub started_at_ms: u64,
    /// Cost at the configured prices, micro-USD (computed once, when the request finished).
    pub cost_micros: u64,
    /// `reasoning.effort` of the (normalised) request, when it set one.
    pub reasoning_effort: Option<String>,
    /// `service_tier` of the (normalised) request, when it set one.
    pub service_tier: Option<String>,
    /// How the request reached the upstream.
    pub transport: Transport,
    /// Time from the start of the request to the first output event, ms.
    pub ttft_ms: Option<u64>,
    /// Attempts that failed over to another account (or the same one after a refresh)
    /// before the outcome.
    pub failovers: u32,
    /// Failure class when the request failed: the classifier's name for an upstream failure
    /// (`usage_limit`, `auth_expired`, ...), ours otherwise (`upstream_connect`,
    /// `client_gone`, ...).
    pub error_class: Option<String>,
    /// The gateway request id (`x-request-id`: the client's when well-formed, else ours; one
    /// per WebSocket turn). Empty for records stored before it existed.
    pub request_id: String,
    /// Body bytes written to the client (the access log's `bytes_out`; not stored).
    pub bytes_out: u64,
}

// === impl UsageRecord ===

impl UsageRecord {
    /// A fresh record id: a random 64-bit process nonce and a process-wide counter, unique
    /// across processes and restarts (with overwhelming probability) without coordination.
    pub fn new_id() -> u128 {
        static NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        static SEQ: AtomicU64 = AtomicU64::new(1);
        let nonce = *NONCE.get_or_init(|| {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            h.write_u32(std::process::id());
            h.finish() | 1
        });
        (u128::from(nonce) << 64) | u128::from(SEQ.fetch_add(1, Ordering::Relaxed))
    }

    /// The id as stored: 32 lower-case hex digits.
    pub fn id_hex(&self) -> String {
        let hex = Self::hex_id(self.id);
        // Hex digits are ASCII: never the empty fallback.
        std::str::from_utf8(&hex).unwrap_or_default().to_owned()
    }

    /// `id` as stored ([`UsageRecord::id_hex`]) without allocating: 32 lower-case hex digits,
    /// the same as `format!("{id:032x}")`. Twice per record on the usage path (spool line,
    /// INSERT): about 170 instructions a call, `format!` about 740.
    pub fn hex_id(id: u128) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (half, word) in [(id >> 64) as u64, id as u64].into_iter().enumerate() {
            for (i, c) in out[half * 16..half * 16 + 16].iter_mut().enumerate() {
                *c = DIGITS[((word >> (60 - 4 * i)) & 0xf) as usize];
            }
        }
        out
    }
}

/// Usage-path counters shared by the workers and the sidecar, rendered into the data plane's
/// `/metrics` ([`UsageStats::render`]).
#[derive(Debug, Default)]
pub struct UsageStats {
    /// Records in the durable spool not yet in the database (gauge).
    pub spooled_records: AtomicU64,
    /// Bytes of the durable spool file (gauge).
    pub spool_bytes: AtomicU64,
    /// 1 while the durable spool is at its byte bound (gauge): records wait in the queue and
    /// then in the workers' local spools.
    pub spool_full: AtomicU64,
    /// Records committed to the database.
    pub persisted: AtomicU64,
    /// Records adopted from a spool file left by an earlier process (kill -9, crash, shutdown
    /// with storage down).
    pub replayed: AtomicU64,
    /// Records the database already held (a replay after a crash between commit and
    /// truncation); not counted twice.
    pub duplicates: AtomicU64,
    /// Records that could not be written to the spool file (I/O error): kept in memory only.
    pub spool_write_errors: AtomicU64,
    /// Records dropped because a worker's local spool was full (the only place usage is
    /// ever dropped; see docs/architecture.md "Usage records").
    pub dropped: AtomicU64,
    /// Access-log lines dropped (its queue full, or a write failed): the access log never
    /// holds anything up.
    pub access_log_dropped: AtomicU64,
}

// === impl UsageStats ===

impl UsageStats {
    /// Prometheus text exposition of these counters.
    pub fn render(&self, o: &mut String) {
        use std::fmt::Write;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rows: [(&str, &str, &str, u64); 9] = [
            (
                "codex_gateway_usage_spool_records",
                "gauge",
                "Usage records in the durable spool, not yet in the database.",
                g(&self.spooled_records),
            ),
            (
                "codex_gateway_usage_spool_bytes",
                "gauge",
                "Size of the durable usage spool file.",
                g(&self.spool_bytes),
            ),
            (
                "codex_gateway_usage_spool_full",
                "gauge",
                "1 while the durable usage spool is at usage_spool_max_bytes.",
                g(&self.spool_full),
            ),
            (
                "codex_gateway_usage_persisted_total",
                "counter",
                "Usage records committed to the database.",
                g(&self.persisted),
            ),
            (
                "codex_gateway_usage_replayed_total",
                "counter",
                "Usage records replayed from a spool left by an earlier process.",
                g(&self.replayed),
            ),
            (
                "codex_gateway_usage_duplicates_total",
                "counter",
                "Replayed usage records the database already held (not counted twice).",
                g(&self.duplicates),
            ),
            (
                "codex_gateway_usage_spool_write_errors_total",
                "counter",
                "Usage records the spool file could not take (kept in memory only).",
                g(&self.spool_write_errors),
            ),
            (
                "codex_gateway_usage_dropped_total",
                "counter",
                "Usage records dropped because a worker's local spool was full.",
                g(&self.dropped),
            ),
            (
                "codex_gateway_access_log_dropped_total",
                "counter",
                "Access-log lines dropped (queue full or write failed).",
                g(&self.access_log_dropped),
            ),
        ];
        for (name, ty, help, v) in rows {
            let _ = writeln!(o, "# HELP {name} {help}");
            let _ = writeln!(o, "# TYPE {name} {ty}");
            let _ = writeln!(o, "{name} {v}");
        }
    }
}

/// A fact a worker reports to the sidecar.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerEvent {
    /// A finished request. Boxed: a record is 272 bytes, and both queues' slots are as large
    /// as the largest variant (65,536 slots each: 37 MiB resident with the record inline,
    /// 11 MiB boxed).
    Usage(Box<UsageRecord>),
    /// A request answered without a usage record (refused before its lifecycle: 401, 404,
    /// admission 429, an unreadable or malformed request): only its access-log line, never
    /// stored. Sent only while the access log is on, once (never spooled: a full queue drops
    /// it and counts, `UsageStats::access_log_dropped`).
    Access(Box<UsageRecord>),
    /// An account effect the data plane decided and already applied (failure policy, quota
    /// signals); the sidecar persists it when [`AccountEffect::is_persisted`].
    Account {
        /// Account id.
        account_id: i64,
        /// The effect.
        effect: AccountEffect,
    },
    /// The upstream rejected the account's access token: refresh it (single-flight) and
    /// publish a new snapshot.
    RefreshRequest {
        /// Account id.
        account_id: i64,
        /// Snapshot version the rejected token came from (stale requests are coalesced).
        seen_version: u64,
    },
}

// === impl WorkerEvent ===

impl WorkerEvent {
    /// True for a usage record or an access-log record (the usage queue); false for control
    /// facts.
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::Usage(_) | Self::Access(_))
    }
}

/// Creates the worker -> sidecar channels: one queue for usage records and one for every
/// other fact (account effects, refresh requests), each with its own waker, so a usage
/// backlog never delays an account event or a refresh request.
pub fn events() -> (EventSender, Events) {
    let (usage_tx, usage_rx) = crossbeam_channel::bounded(EVENT_QUEUE);
    let (control_tx, control_rx) = crossbeam_channel::bounded(EVENT_QUEUE);
    let usage_notify = Arc::new(Notify::new());
    let control_notify = Arc::new(Notify::new());
    let stats = Arc::new(UsageStats::default());
    (
        EventSender {
            usage: usage_tx,
            control: control_tx,
            usage_notify: Arc::clone(&usage_notify),
            control_notify: Arc::clone(&control_notify),
            stats: Arc::clone(&stats),
        },
        Events {
            usage: usage_rx,
            control: control_rx,
            usage_notify,
            control_notify,
            stats,
        },
    )
}

/// Worker side of the fact channels (cheap to clone, `Send`).
#[derive(Debug, Clone)]
pub struct EventSender {
    usage: Sender<WorkerEvent>,
    control: Sender<WorkerEvent>,
    usage_notify: Arc<Notify>,
    control_notify: Arc<Notify>,
    stats: Arc<UsageStats>,
}

// === impl EventSender ===

impl EventSender {
    /// Sends without blocking; a full queue hands the event back. Usage records go to the
    /// usage queue, every other fact to the control queue.
    // The event comes back by value to be kept in the caller's spool: boxing it would cost an
    // allocation per record on the hot path.
    #[allow(clippy::result_large_err)]
    pub fn try_send(&self, ev: WorkerEvent) -> Result<(), WorkerEvent> {
        let (tx, notify) = if ev.is_usage() {
            (&self.usage, &self.usage_notify)
        } else {
            (&self.control, &self.control_notify)
        };
        match tx.try_send(ev) {
            Ok(()) => {
                notify.notify_one();
                Ok(())
            }
            Err(TrySendError::Full(ev)) | Err(TrySendError::Disconnected(ev)) => Err(ev),
        }
    }

    /// The usage counters (shared with the sidecar).
    pub fn stats(&self) -> &Arc<UsageStats> {
        &self.stats
    }
}

/// Sidecar side of the fact channels.
#[derive(Debug)]
pub struct Events {
    usage: Receiver<WorkerEvent>,
    control: Receiver<WorkerEvent>,
    usage_notify: Arc<Notify>,
    control_notify: Arc<Notify>,
    stats: Arc<UsageStats>,
}

// === impl Events ===

impl Events {
    /// Takes every queued control fact (account effects, refresh requests) without waiting.
    pub fn drain_control(&self) -> impl Iterator<Item = WorkerEvent> + '_ {
        self.control.try_iter()
    }

    /// Takes queued usage records without waiting.
    pub fn drain_usage(&self) -> impl Iterator<Item = WorkerEvent> + '_ {
        self.usage.try_iter()
    }

    /// Usage records waiting in the queue.
    pub fn usage_queued(&self) -> usize {
        self.usage.len()
    }

    /// Waits until a worker signals control facts (may wake spuriously).
    pub async fn wait_control(&self) {
        if self.control.is_empty() {
            self.control_notify.notified().await;
        }
    }

    /// Waits until a worker signals usage records (may wake spuriously).
    pub async fn wait_usage(&self) {
        if self.usage.is_empty() {
            self.usage_notify.notified().await;
        }
    }

    /// The usage counters (shared with the workers).
    pub fn stats(&self) -> &Arc<UsageStats> {
        &self.stats
    }
}

/// A command from the sidecar to one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerCommand {
    /// A new snapshot was published (workers drop caches keyed by older versions).
    SnapshotUpdated {
        /// The new version.
        version: u64,
    },
    /// Close pooled upstream sockets that belong to this account.
    EvictAccount {
        /// Account id.
        account_id: i64,
    },
    /// Stop accepting; finish open streams.
    Drain,
}

/// Creates one mailbox per worker and the sidecar's broadcaster.
pub fn mailboxes(workers: usize) -> (WorkerMailboxes, Vec<WorkerMailbox>) {
    let mut senders = Vec::with_capacity(workers);
    let mut boxes = Vec::with_capacity(workers);
    for _ in 0..workers {
        let (tx, rx) = crossbeam_channel::bounded(1024);
        let notify = Arc::new(Notify::new());
        senders.push((tx, Arc::clone(&notify)));
        boxes.push(WorkerMailbox { rx, notify });
    }
    (WorkerMailboxes { senders }, boxes)
}

/// Sidecar side: sends commands to every worker.
#[derive(Debug, Clone, Default)]
pub struct WorkerMailboxes {
    senders: Vec<(Sender<WorkerCommand>, Arc<Notify>)>,
}

// === impl WorkerMailboxes ===

impl WorkerMailboxes {
    /// Sends `cmd` to every worker and wakes them. A worker whose mailbox is full or gone is
    /// skipped (commands are idempotent hints; snapshots carry the truth).
    pub fn broadcast(&self, cmd: &WorkerCommand) {
        for (tx, n) in &self.senders {
            if tx.try_send(cmd.clone()).is_ok() {
                n.notify_one();
            }
        }
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.senders.len()
    }

    /// True when there are no workers.
    pub fn is_empty(&self) -> bool {
        self.senders.is_empty()
    }
}

/// Worker side: its own command queue.
#[derive(Debug)]
pub struct WorkerMailbox {
    rx: Receiver<WorkerCommand>,
    notify: Arc<Notify>,
}

// === impl WorkerMailbox ===

impl WorkerMailbox {
    /// Waits for the next command.
    pub async fn recv(&self) -> Option<WorkerCommand> {
        loop {
            match self.rx.try_recv() {
                Ok(c) => return Some(c),
                Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
                Err(crossbeam_channel::TryRecvError::Empty) => self.notify.notified().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record replayed from the spool keeps its route, whichever route wrote it (a compact
    /// record used to come back as `other`).
    #[test]
    fn every_route_label_survives_a_replay() {
        for label in ROUTE_LABELS {
            let owned = label.to_owned();
            assert_eq!(usage_route(&owned), label);
        }
        assert_eq!(usage_route("responses_compact"), "responses_compact");
        assert_eq!(usage_route("no-such-route"), "other");
        assert_eq!(ROUTE_LABELS.last(), Some(&"other"));
    }

    #[test]
    fn hex_id_is_format_032x() {
        let mut ids = vec![0, 1, u128::MAX, 1 << 64, (1 << 64) - 1, 0xabc << 60];
        let mut x = 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835_u128;
        for _ in 0..200 {
            x = x
                .wrapping_mul(0x2545_f491_4f6c_dd1d)
                .wrapping_add(0x1234_5678_9abc);
            ids.push(x);
            ids.push(x >> (x % 128));
        }
        ids.push(UsageRecord::new_id());
        for id in ids {
            let want = format!("{id:032x}");
            assert_eq!(&UsageRecord::hex_id(id), want.as_bytes());
            let r = UsageRecord {
                id,
                ..Default::default()
            };
            assert_eq!(r.id_hex(), want);
        }
    }

    #[test]
    fn events_roundtrip_and_full_queue_returns_event() {
        let (tx, rx) = events();
        tx.try_send(WorkerEvent::RefreshRequest {
            account_id: 1,
            seen_version: 2,
        })
        .unwrap();
        tx.try_send(WorkerEvent::Usage(Box::default())).unwrap();
        let got: Vec<_> = rx.drain_control().collect();
        assert_eq!(got.len(), 1, "the refresh request is on the control queue");
        let got: Vec<_> = rx.drain_usage().collect();
        assert_eq!(got.len(), 1, "the usage record is on the usage queue");
    }

    #[test]
    fn broadcast_reaches_every_worker() {
        let (tx, boxes) = mailboxes(3);
        tx.broadcast(&WorkerCommand::Drain);
        for b in &boxes {
            assert_eq!(b.rx.try_recv().ok(), Some(WorkerCommand::Drain));
        }
    }
}
