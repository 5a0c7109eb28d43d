//! The access log: one JSON line per request, off the data plane's hot path.
//!
//! # Key Components
//! - [`line`]: a usage record as one access-log line: the request id, the key's NAME (never
//!   the key), route, model, account, status, transport, bytes out, time to first byte (and
//!   token), duration, failovers, error class and code, tokens. The workers already hand
//!   every request's usage record to the sidecar; the usage loop derives the line from it,
//!   so the data plane does no extra work for them. A request answered without a usage
//!   record (refused before its lifecycle: 401, 404, admission 429, an unreadable request)
//!   is sent as a `WorkerEvent::Access` record, only while the access log is on.
//! - [`AccessLog`]: a bounded queue to a writer thread of its own (file I/O never runs on
//!   the sidecar's Tokio thread). [`AccessLog::push`] never blocks: a full queue drops the
//!   line and counts it (`codex_gateway_access_log_dropped_total`).
//! - The writer: appends to `path` (or stdout for `-`), one `write` per batch of lines
//!   queued together; before a write would take the file past `max_bytes` it rotates:
//!   `path.{keep-1}` -> `path.{keep}`, ..., `path` -> `path.1` (the oldest beyond `keep`
//!   deleted), and starts a new `path`.
//!
//! # Error handling
//! An I/O error is logged (once per failure streak) and the lines of that batch are
//! dropped and counted; the next batch reopens the file.

use std::{
    fs::{File, OpenOptions},
    io::{self, Write},
    path::{Path, PathBuf},
    sync::{atomic::Ordering, Arc},
};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use shared_state::{config::AccessLogConfig, Snapshot, UsageRecord, UsageStats};

/// Lines the queue holds before new ones are dropped.
pub const QUEUE: usize = 65_536;

/// The sidecar's handle on the access-log writer.
#[derive(Debug, Clone)]
pub struct AccessLog {
    tx: Sender<Vec<u8>>,
    stats: Arc<UsageStats>,
}

// === impl AccessLog ===

impl AccessLog {
    /// Starts the writer thread; `None` when `cfg` has no path (no access log).
    pub fn start(cfg: &AccessLogConfig, stats: Arc<UsageStats>) -> Option<Self> {
        let path = cfg.path.clone()?;
        let (tx, rx) = crossbeam_channel::bounded(QUEUE);
        let mut w = Writer {
            out: if cfg.is_stdout() {
                Out::Stdout
            } else {
                Out::File {
                    path,
                    file: None,
                    size: 0,
                }
            },
            max_bytes: cfg.max_bytes,
            keep: cfg.keep,
            stats: Arc::clone(&stats),
            failing: false,
        };
        let spawned = std::thread::Builder::new()
            .name("codex-access-log".into())
            .spawn(move || w.run(&rx));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the access log writer; no access log");
            return None;
        }
        Some(Self { tx, stats })
    }

    /// Queues one line (newline included); a full queue drops it and counts.
    pub fn push(&self, line: Vec<u8>) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(line) {
            self.stats
                .access_log_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `record` as one access-log line (with its newline): names from `snap` (the key's name and
/// the account's label; ids stay when the name is gone).
pub fn line(record: &UsageRecord, snap: &Snapshot) -> Vec<u8> {
    let key_name = snap
        .keys
        .values()
        .find(|k| k.id == record.key_id)
        .map(|k| k.name.as_str());
    let account = record
        .account_id
        .and_then(|id| snap.account(id))
        .map(|a| a.label.as_str());
    let ts = time::OffsetDateTime::from_unix_timestamp_nanos(
        i128::from(record.started_at_ms) * 1_000_000,
    )
    .ok()
    .and_then(|t| {
        t.format(&time::format_description::well_known::Rfc3339)
            .ok()
    })
    .unwrap_or_default();
    let v = serde_json::json!({
        "ts": ts,
        "request_id": record.request_id,
        // 0: a request refused before any key was known to be valid.
        "key_id": (record.key_id != 0).then_some(record.key_id),
        "key_name": key_name,
        "route": record.route,
        "model": record.model,
        "account_id": record.account_id,
        "account": account,
        "status": record.status,
        "stream": record.stream,
        "transport": record.transport.as_str(),
        "bytes_out": record.bytes_out,
        "ttfb_ms": record.ttfb_ms,
        "ttft_ms": record.ttft_ms,
        "duration_ms": record.latency_ms,
        "failovers": record.failovers,
        "error_class": record.error_class,
        "error_code": record.error_code,
        "input_tokens": record.input_tokens,
        "cached_tokens": record.cached_tokens,
        "output_tokens": record.output_tokens,
    });
    let mut out = serde_json::to_vec(&v).unwrap_or_default();
    out.push(b'\n');
    out
}

enum Out {
    Stdout,
    File {
        path: PathBuf,
        file: Option<File>,
        size: u64,
    },
}

struct Writer {
    out: Out,
    max_bytes: u64,
    keep: u32,
    stats: Arc<UsageStats>,
    /// In a failure streak (logged once).
    failing: bool,
}

// === impl Writer ===

impl Writer {
    /// Writes what arrives until every sender is gone.
    fn run(&mut self, rx: &Receiver<Vec<u8>>) {
        let mut batch: Vec<Vec<u8>> = Vec::new();
        while let Ok(first) = rx.recv() {
            batch.push(first);
            batch.extend(rx.try_iter().take(4096));
            let lines = batch.len() as u64;
            match self.write(&batch) {
                Ok(()) => self.failing = false,
                Err(e) => {
                    self.stats
                        .access_log_dropped
                        .fetch_add(lines, Ordering::Relaxed);
                    if !self.failing {
                        tracing::error!(error = %e, "access log write failed; lines dropped");
                        self.failing = true;
                    }
                }
            }
            batch.clear();
        }
    }

    fn write(&mut self, lines: &[Vec<u8>]) -> io::Result<()> {
        match &mut self.out {
            Out::Stdout => {
                let mut o = io::stdout().lock();
                for l in lines {
                    o.write_all(l)?;
                }
                o.flush()
            }
            Out::File { path, file, size } => {
                // One write per run of lines that fits the bound; rotate in between.
                let mut buf: Vec<u8> = Vec::new();
                for l in lines {
                    let len = l.len() as u64;
                    if *size + buf.len() as u64 + len > self.max_bytes
                        && *size + buf.len() as u64 > 0
                    {
                        append(path, file, size, &buf)?;
                        buf.clear();
                        rotate(path, self.keep)?;
                        *file = None;
                        *size = 0;
                    }
                    buf.extend_from_slice(l);
                }
                append(path, file, size, &buf)
            }
        }
    }
}

/// Appends `buf` to the open file (opening it, and reading its size, when closed).
fn append(path: &Path, file: &mut Option<File>, size: &mut u64, buf: &[u8]) -> io::Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    if file.is_none() {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let f = OpenOptions::new().create(true).append(true).open(path)?;
        *size = f.metadata()?.len();
        *file = Some(f);
    }
    let Some(f) = file.as_mut() else {
        return Ok(());
    };
    match f.write_all(buf) {
        Ok(()) => {
            *size += buf.len() as u64;
            Ok(())
        }
        Err(e) => {
            // Reopened by the next batch.
            *file = None;
            Err(e)
        }
    }
}

/// `path.N` for a rotated file.
fn rotated(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

/// Shifts the rotated files up by one (the oldest beyond `keep` deleted) and moves `path`
/// to `path.1` (deleted when `keep` is 0).
fn rotate(path: &Path, keep: u32) -> io::Result<()> {
    if keep == 0 {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let _ = std::fs::remove_file(rotated(path, keep));
    for n in (1..keep).rev() {
        let from = rotated(path, n);
        if from.exists() {
            std::fs::rename(&from, rotated(path, n + 1))?;
        }
    }
    std::fs::rename(path, rotated(path, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(path: &Path, max_bytes: u64, keep: u32) -> Writer {
        Writer {
            out: Out::File {
                path: path.to_path_buf(),
                file: None,
                size: 0,
            },
            max_bytes,
            keep,
            stats: Arc::new(UsageStats::default()),
            failing: false,
        }
    }

    #[test]
    fn rotates_before_the_bound_and_keeps_n_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let mut w = writer(&path, 100, 2);
        let line = |i: u32| format!("{{\"n\":{i:040}}}\n").into_bytes(); // 48 bytes
        for i in 0..7 {
            w.write(&[line(i)]).unwrap();
        }
        // Two lines per file: 0-1 and 2-3 rotated away (the oldest deleted), 2..5 kept.
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(path.clone()), String::from_utf8(line(6)).unwrap());
        assert_eq!(read(rotated(&path, 1)).lines().count(), 2);
        assert!(read(rotated(&path, 1)).contains(&format!("{:040}", 5)));
        assert!(read(rotated(&path, 2)).contains(&format!("{:040}", 3)));
        assert!(!rotated(&path, 3).exists());
        for f in [path.clone(), rotated(&path, 1), rotated(&path, 2)] {
            assert!(std::fs::metadata(f).unwrap().len() <= 100);
        }
        // A batch larger than the bound is split across files.
        let many: Vec<Vec<u8>> = (10..15).map(line).collect();
        w.write(&many).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() <= 100);
    }

    #[test]
    fn keep_zero_truncates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        let mut w = writer(&path, 60, 0);
        w.write(&[vec![b'x'; 49], vec![b'y'; 49]]).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), vec![b'y'; 49]);
        assert!(!rotated(&path, 1).exists());
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let stats = Arc::new(UsageStats::default());
        let (tx, _rx) = crossbeam_channel::bounded(1);
        let log = AccessLog {
            tx,
            stats: Arc::clone(&stats),
        };
        log.push(b"a\n".to_vec());
        log.push(b"b\n".to_vec());
        log.push(b"c\n".to_vec());
        assert_eq!(stats.access_log_dropped.load(Ordering::Relaxed), 2);
    }
}
