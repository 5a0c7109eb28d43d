//! The two directions between the runtimes: facts from workers to the sidecar, commands from
//! the sidecar to each worker. Both are bounded crossbeam queues paired with a
//! `tokio::sync::Notify` as the cross-runtime waker (`notify_one` stores a permit, so no wakeup
//! is lost; monoio's `sync` feature lets a monoio task await it).
//!
//! # Key Components
//! - [`WorkerEvent`] / [`EventSender`] / [`Events`]: worker -> sidecar facts (usage, account
//!   effects including quota observations, refresh requests).
//! - [`WorkerCommand`] / [`WorkerMailbox`] / [`WorkerMailboxes`]: sidecar -> worker commands.
//!
//! # Error handling
//! Sending never blocks the data plane. A full event queue returns the event to the caller
//! ([`EventSender::try_send`]), which keeps it in a worker-local spool and retries.

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use tokio::sync::Notify;

use crate::AccountEffect;

/// Capacity of the worker -> sidecar queue.
pub const EVENT_QUEUE: usize = 65_536;

/// One finished request, for usage accounting.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageRecord {
    /// Client key id.
    pub key_id: i64,
    /// Account that served the request (None when no attempt was accepted).
    pub account_id: Option<i64>,
    /// Route, e.g. `responses` or `chat.completions`.
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
}

/// A fact a worker reports to the sidecar.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerEvent {
    /// A finished request.
    Usage(UsageRecord),
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

/// Creates the worker -> sidecar channel.
pub fn events() -> (EventSender, Events) {
    let (tx, rx) = crossbeam_channel::bounded(EVENT_QUEUE);
    let notify = Arc::new(Notify::new());
    (
        EventSender {
            tx,
            notify: Arc::clone(&notify),
        },
        Events { rx, notify },
    )
}

/// Worker side of the fact channel (cheap to clone, `Send`).
#[derive(Debug, Clone)]
pub struct EventSender {
    tx: Sender<WorkerEvent>,
    notify: Arc<Notify>,
}

// === impl EventSender ===

impl EventSender {
    /// Sends without blocking; a full queue hands the event back.
    pub fn try_send(&self, ev: WorkerEvent) -> Result<(), WorkerEvent> {
        match self.tx.try_send(ev) {
            Ok(()) => {
                self.notify.notify_one();
                Ok(())
            }
            Err(TrySendError::Full(ev)) | Err(TrySendError::Disconnected(ev)) => Err(ev),
        }
    }
}

/// Sidecar side of the fact channel.
#[derive(Debug)]
pub struct Events {
    rx: Receiver<WorkerEvent>,
    notify: Arc<Notify>,
}

// === impl Events ===

impl Events {
    /// Takes every queued event without waiting.
    pub fn drain(&self) -> impl Iterator<Item = WorkerEvent> + '_ {
        self.rx.try_iter()
    }

    /// Waits until a worker signals new events (may wake spuriously).
    pub async fn wait(&self) {
        if self.rx.is_empty() {
            self.notify.notified().await;
        }
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

    #[test]
    fn events_roundtrip_and_full_queue_returns_event() {
        let (tx, rx) = events();
        tx.try_send(WorkerEvent::RefreshRequest {
            account_id: 1,
            seen_version: 2,
        })
        .unwrap();
        let got: Vec<_> = rx.drain().collect();
        assert_eq!(got.len(), 1);
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
