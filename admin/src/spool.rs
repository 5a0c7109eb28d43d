//! The durable usage spool: usage records that are not in the database yet survive `kill -9`
//! and a restart.
//!
//! # Key Components
//! - [`Spool`]: one append-only file per process in the data directory
//!   (`usage-spool-<pid>-<nanos>.log`, locked with `flock` while the process lives), one JSON
//!   line per record. The sidecar appends what the workers sent as soon as it arrives (one
//!   `write` per wake-up: page cache, so a `kill -9` of the process loses nothing; `fdatasync`
//!   in batches, at most every [`SYNC_EVERY`], off the sidecar's thread), inserts batches into
//!   the database from its front, and truncates the file once everything in it is committed.
//!   A bounded in-memory mirror of the front ([`Spool::new`]'s `mem_cap`) spares re-reading the
//!   file in the common case; past it, batches are read back from the file.
//! - Replay: at start the spool adopts every spool file no live process holds (left by
//!   `kill -9`, a crash or a shutdown with storage down): their records are copied into the new
//!   file, then inserted like any other. Every record carries its id
//!   ([`UsageRecord::id`], a unique column): a crash between the database commit and the
//!   truncation replays records the database already holds, and they are skipped, not counted
//!   twice.
//!
//! # Bounds
//! The file holds at most `max_bytes` (`usage_spool_max_bytes`); at the bound the sidecar
//! stops taking records off the usage queue (`codex_gateway_usage_spool_full` is 1), so they
//! wait in the queue and then in each worker's local spool
//! (`gateway::ctx::USAGE_SPOOL_LIMIT`), past which they are dropped and counted
//! (`codex_gateway_usage_dropped_total`). A record the file cannot take (I/O error) is kept in
//! memory only, at most `mem_cap` of them (`codex_gateway_usage_spool_write_errors_total`).
//!
//! # Error handling
//! I/O errors are logged (on transition) and counted; a line that does not parse (a torn
//! write at a crash) is skipped and logged.

use std::{
    collections::VecDeque,
    fs::{File, OpenOptions},
    io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use serde::Deserialize;
use shared_state::{Transport, UsageRecord, UsageStats};

/// At most one `fdatasync` of the spool file per this interval.
pub const SYNC_EVERY: Duration = Duration::from_millis(50);
/// After an I/O error, records go to memory only for this long before the file is tried again.
const BROKEN_FOR: Duration = Duration::from_secs(5);
/// File name prefix of spool files in the data directory.
pub const FILE_PREFIX: &str = "usage-spool-";

/// One record as a spool line: what [`parse`] reads back. [`write_line`] writes the same
/// JSON without building one (serde's `Serialize` of this struct is the reference it is
/// tested against).
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct Line {
    id: String,
    key_id: i64,
    account_id: Option<i64>,
    route: String,
    model: String,
    status: u16,
    stream: bool,
    input_tokens: u64,
    cached_tokens: u64,
    output_tokens: u64,
    reasoning_tokens: u64,
    ttfb_ms: Option<u64>,
    latency_ms: u64,
    error_code: Option<String>,
    started_at_ms: u64,
    reasoning_effort: Option<String>,
    service_tier: Option<String>,
    transport: String,
    ttft_ms: Option<u64>,
    failovers: u32,
    error_class: Option<String>,
    /// Absent in lines written before costs were recorded.
    #[serde(default)]
    cost_micros: u64,
    /// Absent in lines written before request ids were recorded.
    #[serde(default)]
    request_id: String,
}

// === impl Line ===

impl Line {
    #[cfg(test)]
    fn of(r: &UsageRecord) -> Self {
        Self {
            id: r.id_hex(),
            key_id: r.key_id,
            account_id: r.account_id,
            route: r.route.to_owned(),
            model: r.model.clone(),
            status: r.status,
            stream: r.stream,
            input_tokens: r.input_tokens,
            cached_tokens: r.cached_tokens,
            output_tokens: r.output_tokens,
            reasoning_tokens: r.reasoning_tokens,
            ttfb_ms: r.ttfb_ms,
            latency_ms: r.latency_ms,
            error_code: r.error_code.clone(),
            started_at_ms: r.started_at_ms,
            reasoning_effort: r.reasoning_effort.clone(),
            service_tier: r.service_tier.clone(),
            transport: r.transport.as_str().to_owned(),
            ttft_ms: r.ttft_ms,
            failovers: r.failovers,
            error_class: r.error_class.clone(),
            cost_micros: r.cost_micros,
            request_id: r.request_id.clone(),
        }
    }

    fn into_record(self) -> Option<UsageRecord> {
        Some(UsageRecord {
            id: u128::from_str_radix(&self.id, 16).ok()?,
            key_id: self.key_id,
            account_id: self.account_id,
            route: shared_state::usage_route(&self.route),
            model: self.model,
            status: self.status,
            stream: self.stream,
            input_tokens: self.input_tokens,
            cached_tokens: self.cached_tokens,
            output_tokens: self.output_tokens,
            reasoning_tokens: self.reasoning_tokens,
            ttfb_ms: self.ttfb_ms,
            latency_ms: self.latency_ms,
            error_code: self.error_code,
            started_at_ms: self.started_at_ms,
            reasoning_effort: self.reasoning_effort,
            service_tier: self.service_tier,
            transport: Transport::parse(&self.transport),
            ttft_ms: self.ttft_ms,
            failovers: self.failovers,
            error_class: self.error_class,
            cost_micros: self.cost_micros,
            request_id: self.request_id,
            bytes_out: 0,
        })
    }
}

/// Parses one spool line (without its newline).
fn parse(line: &[u8]) -> Option<UsageRecord> {
    serde_json::from_slice::<Line>(line).ok()?.into_record()
}

/// Appends `r` as one spool line, without its newline: the bytes `serde_json` writes for
/// [`Line`] (the same keys in the same order, strings escaped the same way), written field by
/// field with no `Line` built and no string cloned. Once per record on the usage path:
/// [`Spool::append`] cost about 8,900 instructions a record through `Serialize`, 2,600 this
/// way (callgrind, `short` workload, issue 25).
fn write_line(buf: &mut Vec<u8>, r: &UsageRecord) {
    buf.extend_from_slice(b"{\"id\":\"");
    buf.extend_from_slice(&UsageRecord::hex_id(r.id));
    buf.extend_from_slice(b"\",\"key_id\":");
    push_i64(buf, r.key_id);
    buf.extend_from_slice(b",\"account_id\":");
    match r.account_id {
        Some(v) => push_i64(buf, v),
        None => buf.extend_from_slice(b"null"),
    }
    buf.extend_from_slice(b",\"route\":");
    push_str(buf, r.route);
    buf.extend_from_slice(b",\"model\":");
    push_str(buf, &r.model);
    buf.extend_from_slice(b",\"status\":");
    push_u64(buf, u64::from(r.status));
    buf.extend_from_slice(if r.stream {
        b",\"stream\":true,\"input_tokens\":"
    } else {
        b",\"stream\":false,\"input_tokens\":"
    });
    push_u64(buf, r.input_tokens);
    buf.extend_from_slice(b",\"cached_tokens\":");
    push_u64(buf, r.cached_tokens);
    buf.extend_from_slice(b",\"output_tokens\":");
    push_u64(buf, r.output_tokens);
    buf.extend_from_slice(b",\"reasoning_tokens\":");
    push_u64(buf, r.reasoning_tokens);
    buf.extend_from_slice(b",\"ttfb_ms\":");
    push_opt_u64(buf, r.ttfb_ms);
    buf.extend_from_slice(b",\"latency_ms\":");
    push_u64(buf, r.latency_ms);
    buf.extend_from_slice(b",\"error_code\":");
    push_opt_str(buf, r.error_code.as_deref());
    buf.extend_from_slice(b",\"started_at_ms\":");
    push_u64(buf, r.started_at_ms);
    buf.extend_from_slice(b",\"reasoning_effort\":");
    push_opt_str(buf, r.reasoning_effort.as_deref());
    buf.extend_from_slice(b",\"service_tier\":");
    push_opt_str(buf, r.service_tier.as_deref());
    buf.extend_from_slice(b",\"transport\":");
    push_str(buf, r.transport.as_str());
    buf.extend_from_slice(b",\"ttft_ms\":");
    push_opt_u64(buf, r.ttft_ms);
    buf.extend_from_slice(b",\"failovers\":");
    push_u64(buf, u64::from(r.failovers));
    buf.extend_from_slice(b",\"error_class\":");
    push_opt_str(buf, r.error_class.as_deref());
    buf.extend_from_slice(b",\"cost_micros\":");
    push_u64(buf, r.cost_micros);
    buf.extend_from_slice(b",\"request_id\":");
    push_str(buf, &r.request_id);
    buf.push(b'}');
}

/// Decimal digits of `v`, two at a time (as `itoa` does).
fn push_u64(buf: &mut Vec<u8>, mut v: u64) {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    while v >= 100 {
        let p = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        tmp[i..i + 2].copy_from_slice(&PAIRS[p..p + 2]);
    }
    if v >= 10 {
        let p = v as usize * 2;
        i -= 2;
        tmp[i..i + 2].copy_from_slice(&PAIRS[p..p + 2]);
    } else {
        i -= 1;
        tmp[i] = b'0' + v as u8;
    }
    buf.extend_from_slice(&tmp[i..]);
}

fn push_i64(buf: &mut Vec<u8>, v: i64) {
    if v < 0 {
        buf.push(b'-');
    }
    push_u64(buf, v.unsigned_abs());
}

fn push_opt_u64(buf: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => push_u64(buf, v),
        None => buf.extend_from_slice(b"null"),
    }
}

fn push_opt_str(buf: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(v) => push_str(buf, v),
        None => buf.extend_from_slice(b"null"),
    }
}

/// `s` as a JSON string, escaped as `serde_json` escapes it: `"` and `\` with a backslash,
/// the control characters below 0x20 as `\b \t \n \f \r` or `\u00xx`, everything else
/// (DEL, non-ASCII) as is.
fn push_str(buf: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    // The common case, nothing to escape: one pass without branches (vectorised).
    if !bytes.iter().fold(false, |esc, &b| {
        esc | (b < 0x20) | (b == b'"') | (b == b'\\')
    }) {
        buf.reserve(bytes.len() + 2);
        buf.push(b'"');
        buf.extend_from_slice(bytes);
        buf.push(b'"');
        return;
    }
    buf.push(b'"');
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b >= 0x20 && b != b'"' && b != b'\\' {
            continue;
        }
        buf.extend_from_slice(&bytes[start..i]);
        start = i + 1;
        match b {
            b'"' => buf.extend_from_slice(b"\\\""),
            b'\\' => buf.extend_from_slice(b"\\\\"),
            b'\n' => buf.extend_from_slice(b"\\n"),
            b'\r' => buf.extend_from_slice(b"\\r"),
            b'\t' => buf.extend_from_slice(b"\\t"),
            0x08 => buf.extend_from_slice(b"\\b"),
            0x0c => buf.extend_from_slice(b"\\f"),
            _ => buf.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]),
        }
    }
    buf.extend_from_slice(&bytes[start..]);
    buf.push(b'"');
}

/// Where a batch handed out by [`Spool::next_batch`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Records the file could not take (memory only).
    Volatile,
    /// The in-memory mirror of the file's front; `bytes` of the file.
    Mem { bytes: u64 },
    /// Read back from the file; `bytes` of it.
    Disk { bytes: u64 },
}

/// A batch to insert; hand it back to [`Spool::committed`] once the database has it.
#[derive(Debug)]
pub struct Batch {
    /// The records.
    pub records: Vec<UsageRecord>,
    from: Source,
}

/// The durable usage spool (see the module docs).
#[derive(Debug)]
pub struct Spool {
    path: PathBuf,
    file: File,
    /// Bytes in the file.
    len: u64,
    /// First byte of the file not yet committed to the database.
    read_off: u64,
    /// Records in `[read_off, len)`.
    records: u64,
    /// A prefix of the records in `[read_off, len)` with their line lengths.
    mem: VecDeque<(UsageRecord, u64)>,
    /// `mem` holds every record of `[read_off, len)`.
    mem_complete: bool,
    mem_cap: usize,
    /// Records the file could not take.
    volatile: VecDeque<UsageRecord>,
    max_bytes: u64,
    broken_until: Option<Instant>,
    dirty: bool,
    last_sync: Option<Instant>,
    syncing: Option<tokio::task::JoinHandle<()>>,
    stats: Arc<UsageStats>,
}

// === impl Spool ===

impl Spool {
    /// Creates this process's spool file in `dir` (locked while the process lives) and adopts
    /// every spool file there that no live process holds. Blocking file I/O: call at start.
    pub fn new(
        dir: &Path,
        max_bytes: u64,
        mem_cap: usize,
        stats: Arc<UsageStats>,
    ) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = dir.join(format!("{FILE_PREFIX}{}-{nanos}.log", std::process::id()));
        let mut opts = OpenOptions::new();
        opts.create_new(true).append(true).read(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let file = opts.open(&path)?;
        file.try_lock().map_err(|e| match e {
            std::fs::TryLockError::Error(e) => e,
            std::fs::TryLockError::WouldBlock => io::Error::other("spool file is locked"),
        })?;
        let mut spool = Self {
            path,
            file,
            len: 0,
            read_off: 0,
            records: 0,
            mem: VecDeque::new(),
            mem_complete: true,
            mem_cap: mem_cap.max(1),
            volatile: VecDeque::new(),
            max_bytes: max_bytes.max(1),
            broken_until: None,
            dirty: false,
            last_sync: None,
            syncing: None,
            stats,
        };
        spool.adopt(dir)?;
        spool.publish_stats();
        Ok(spool)
    }

    /// This process's spool file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Copies the records of every unlocked spool file in `dir` into ours, then removes them.
    fn adopt(&mut self, dir: &Path) -> io::Result<()> {
        let mut orphans: Vec<PathBuf> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p != &self.path
                    && p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(FILE_PREFIX) && n.ends_with(".log"))
            })
            .collect();
        orphans.sort();
        for orphan in orphans {
            let f = match OpenOptions::new().read(true).write(true).open(&orphan) {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(file = %orphan.display(), error = %e, "cannot open a usage spool file");
                    continue;
                }
            };
            if f.try_lock().is_err() {
                // A live process (another instance on this data directory) owns it.
                continue;
            }
            let mut adopted = 0u64;
            let mut torn = 0u64;
            let mut out = Vec::with_capacity(64 * 1024);
            let mut reader = BufReader::new(f);
            let mut line = Vec::new();
            loop {
                line.clear();
                if reader.read_until(b'\n', &mut line)? == 0 {
                    break;
                }
                if line.last() != Some(&b'\n') || parse(&line[..line.len() - 1]).is_none() {
                    // A torn write at a crash (or garbage): nothing of it can be trusted.
                    torn += 1;
                    continue;
                }
                out.extend_from_slice(&line);
                adopted += 1;
                if out.len() >= 1 << 20 {
                    self.write_raw(&out)?;
                    out.clear();
                }
            }
            self.write_raw(&out)?;
            self.records += adopted;
            self.file.sync_data()?;
            std::fs::remove_file(&orphan)?;
            if adopted > 0 {
                self.mem_complete = false;
            }
            self.stats.replayed.fetch_add(adopted, Ordering::Relaxed);
            tracing::info!(
                file = %orphan.display(),
                records = adopted,
                torn,
                "replaying usage records spooled by an earlier process"
            );
        }
        Ok(())
    }

    fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.file.write_all(bytes)?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Whether another record may be taken off the usage queue now.
    pub fn has_room(&self) -> bool {
        if self.is_broken() {
            self.volatile.len() < self.mem_cap
        } else {
            self.len < self.max_bytes
        }
    }

    fn is_broken(&self) -> bool {
        self.broken_until.is_some_and(|t| Instant::now() < t)
    }

    /// Records not yet committed (on disk or in memory only).
    pub fn pending(&self) -> u64 {
        self.records + self.volatile.len() as u64
    }

    /// Appends records (one write). Records the file cannot take are kept in memory only.
    pub fn append(&mut self, recs: Vec<UsageRecord>) {
        if recs.is_empty() {
            return;
        }
        if self.is_broken() {
            self.keep_volatile(recs);
            return;
        }
        let mut buf = Vec::with_capacity(recs.len() * 400);
        let mut lens = Vec::with_capacity(recs.len());
        for r in &recs {
            let before = buf.len();
            write_line(&mut buf, r);
            buf.push(b'\n');
            lens.push((buf.len() - before) as u64);
        }
        if let Err(e) = self.write_raw(&buf) {
            tracing::error!(
                error = %e,
                file = %self.path.display(),
                records = recs.len(),
                "cannot write the usage spool; keeping records in memory only"
            );
            // A partial write left a torn line: cut the file back to what we know.
            let _ = self.file.set_len(self.len);
            self.broken_until = Some(Instant::now() + BROKEN_FOR);
            self.keep_volatile(recs);
            return;
        }
        self.dirty = true;
        for (r, n) in recs.into_iter().zip(lens) {
            if n == 0 {
                self.volatile.push_back(r);
                continue;
            }
            self.records += 1;
            if self.mem_complete && self.mem.len() < self.mem_cap {
                self.mem.push_back((r, n));
            } else {
                self.mem_complete = false;
            }
        }
        self.publish_stats();
    }

    fn keep_volatile(&mut self, recs: Vec<UsageRecord>) {
        self.stats
            .spool_write_errors
            .fetch_add(recs.len() as u64, Ordering::Relaxed);
        self.volatile.extend(recs);
        self.publish_stats();
    }

    /// Starts an `fdatasync` of what was written (off this thread), at most every
    /// [`SYNC_EVERY`] and never two at once.
    pub fn sync_soon(&mut self) {
        if !self.dirty
            || self.syncing.as_ref().is_some_and(|h| !h.is_finished())
            || self.last_sync.is_some_and(|t| t.elapsed() < SYNC_EVERY)
        {
            return;
        }
        let Ok(f) = self.file.try_clone() else {
            return;
        };
        self.dirty = false;
        self.last_sync = Some(Instant::now());
        self.syncing = Some(tokio::task::spawn_blocking(move || {
            if let Err(e) = f.sync_data() {
                tracing::warn!(error = %e, "usage spool fdatasync failed");
            }
        }));
    }

    /// Written bytes wait for their `fdatasync` ([`Spool::sync_soon`]).
    pub fn needs_sync(&self) -> bool {
        self.dirty
    }

    /// The next records to insert (at most `n`): memory-only ones first, then the file's
    /// front (from the mirror, else read back from the file).
    pub fn next_batch(&mut self, n: usize) -> io::Result<Option<Batch>> {
        let n = n.max(1);
        if !self.volatile.is_empty() {
            let k = self.volatile.len().min(n);
            return Ok(Some(Batch {
                records: self.volatile.iter().take(k).cloned().collect(),
                from: Source::Volatile,
            }));
        }
        if !self.mem.is_empty() {
            let k = self.mem.len().min(n);
            let mut bytes = 0;
            let records = self
                .mem
                .iter()
                .take(k)
                .map(|(r, b)| {
                    bytes += b;
                    r.clone()
                })
                .collect();
            return Ok(Some(Batch {
                records,
                from: Source::Mem { bytes },
            }));
        }
        if self.read_off >= self.len {
            return Ok(None);
        }
        let mut f = File::open(&self.path)?;
        f.seek(SeekFrom::Start(self.read_off))?;
        let mut reader = BufReader::new(f.take(self.len - self.read_off));
        let mut records = Vec::with_capacity(n);
        let mut bytes = 0u64;
        let mut line = Vec::new();
        while records.len() < n {
            line.clear();
            let got = reader.read_until(b'\n', &mut line)?;
            if got == 0 {
                break;
            }
            bytes += got as u64;
            match parse(line.strip_suffix(b"\n").unwrap_or(&line)) {
                Some(r) => records.push(r),
                None => {
                    tracing::error!(
                        offset = self.read_off + bytes,
                        "unreadable usage spool line skipped"
                    );
                    self.records = self.records.saturating_sub(1);
                }
            }
        }
        Ok(Some(Batch {
            records,
            from: Source::Disk { bytes },
        }))
    }

    /// The database committed `batch`: drop it from the spool; truncate the file when
    /// everything in it is committed.
    pub fn committed(&mut self, batch: Batch) -> io::Result<()> {
        let k = batch.records.len();
        match batch.from {
            Source::Volatile => {
                self.volatile.drain(..k.min(self.volatile.len()));
            }
            Source::Mem { bytes } => {
                self.mem.drain(..k.min(self.mem.len()));
                self.read_off += bytes;
                self.records = self.records.saturating_sub(k as u64);
            }
            Source::Disk { bytes } => {
                self.read_off += bytes;
                self.records = self.records.saturating_sub(k as u64);
            }
        }
        if self.read_off >= self.len {
            // Everything written is in the database.
            self.file.set_len(0)?;
            self.len = 0;
            self.read_off = 0;
            self.records = 0;
            self.mem.clear();
            self.mem_complete = true;
        }
        self.publish_stats();
        Ok(())
    }

    fn publish_stats(&self) {
        self.stats
            .spooled_records
            .store(self.pending(), Ordering::Relaxed);
        self.stats.spool_bytes.store(self.len, Ordering::Relaxed);
        self.stats
            .spool_full
            .store(u64::from(!self.has_room()), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u64) -> UsageRecord {
        UsageRecord {
            id: UsageRecord::new_id(),
            key_id: 1,
            account_id: Some(2),
            route: "responses",
            model: format!("m{i}"),
            status: 200,
            stream: true,
            input_tokens: i,
            transport: Transport::Ws,
            reasoning_effort: Some("high".into()),
            request_id: format!("req_{i}"),
            ..Default::default()
        }
    }

    fn drain(s: &mut Spool, n: usize) -> Vec<UsageRecord> {
        let mut out = Vec::new();
        while let Some(b) = s.next_batch(n).unwrap() {
            if b.records.is_empty() {
                s.committed(b).unwrap();
                break;
            }
            out.extend(b.records.iter().cloned());
            s.committed(b).unwrap();
        }
        out
    }

    /// The hand-written line is byte for byte what `serde_json` writes for [`Line`], and
    /// parses back to the record: every option set and unset, every escaped byte, non-ASCII,
    /// the integer extremes.
    #[test]
    fn a_written_line_is_serde_json_s_line_and_parses_back() {
        let every_ascii: String = (0u8..=0x7f).map(char::from).collect();
        let texts = [
            String::new(),
            "gpt-5-codex".to_owned(),
            every_ascii,
            "quote \" backslash \\ tab \t nul \0 del \u{7f} é 漢字 🦀".to_owned(),
            "\\\\\"\"\u{1}\u{1f}".to_owned(),
        ];
        let mut recs = vec![UsageRecord {
            route: "responses",
            ..Default::default()
        }];
        for (i, t) in texts.iter().enumerate() {
            let i = i as u64;
            recs.push(UsageRecord {
                id: UsageRecord::new_id(),
                key_id: [i64::MIN, -1, 0, 7, i64::MAX][i as usize],
                account_id: i.is_multiple_of(2).then_some(-(i as i64) * 1_000_003),
                route: shared_state::channels::ROUTE_LABELS[i as usize],
                model: t.clone(),
                status: [0, 200, 429, 502, u16::MAX][i as usize],
                stream: i % 2 == 1,
                input_tokens: u64::MAX - i,
                cached_tokens: 10u64.pow(i as u32),
                output_tokens: 9_999_999_999 * i,
                reasoning_tokens: i,
                ttfb_ms: (i % 2 == 1).then_some(u64::MAX),
                latency_ms: 100 + i,
                error_code: (!i.is_multiple_of(3)).then(|| t.clone()),
                started_at_ms: 1_700_000_000_000 + i,
                cost_micros: i * 17,
                reasoning_effort: (i != 2).then(|| t.chars().rev().collect()),
                service_tier: i.is_multiple_of(2).then(|| "priority".into()),
                transport: [
                    Transport::None,
                    Transport::H2,
                    Transport::H1,
                    Transport::Ws,
                    Transport::HttpFallback,
                ][i as usize],
                ttft_ms: (i > 1).then_some(i),
                failovers: u32::MAX - i as u32,
                error_class: (i != 1).then(|| format!("{t}{t}")),
                request_id: t.clone(),
                bytes_out: 0,
            });
        }
        for r in &recs {
            let mut line = Vec::new();
            write_line(&mut line, r);
            let want = serde_json::to_vec(&Line::of(r)).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&line),
                String::from_utf8_lossy(&want)
            );
            assert_eq!(line, want);
            assert_eq!(parse(&line).as_ref(), Some(r));
        }
    }

    #[test]
    fn integers_are_written_as_rust_formats_them() {
        let mut vals: Vec<u64> = (0..=1_000).collect();
        for p in 0..20 {
            let t = 10u64.pow(p);
            vals.extend([t - 1, t, t + 1, t.saturating_mul(7).saturating_add(3)]);
        }
        vals.extend([u64::MAX, u64::MAX - 1, i64::MAX as u64]);
        let mut buf = Vec::new();
        for v in vals {
            buf.clear();
            push_u64(&mut buf, v);
            assert_eq!(buf, v.to_string().as_bytes());
            for i in [v as i64, (v as i64).wrapping_neg(), i64::MIN] {
                buf.clear();
                push_i64(&mut buf, i);
                assert_eq!(buf, i.to_string().as_bytes());
            }
        }
    }

    #[test]
    fn roundtrip_through_memory_and_disk_then_truncate() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Arc::new(UsageStats::default());
        // A mirror of 3: the rest is read back from the file.
        let mut s = Spool::new(dir.path(), 1 << 20, 3, Arc::clone(&stats)).unwrap();
        let recs: Vec<_> = (0..10).map(rec).collect();
        s.append(recs[..4].to_vec());
        s.append(recs[4..].to_vec());
        assert_eq!(s.pending(), 10);
        let got = drain(&mut s, 2);
        assert_eq!(got, recs, "every record once, in order");
        assert_eq!(s.pending(), 0);
        assert_eq!(std::fs::metadata(s.path()).unwrap().len(), 0, "truncated");
        assert_eq!(stats.spooled_records.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_new_spool_adopts_an_abandoned_file_and_skips_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let recs: Vec<_> = (0..5).map(rec).collect();
        let old_path;
        {
            let mut s =
                Spool::new(dir.path(), 1 << 20, 100, Arc::new(UsageStats::default())).unwrap();
            s.append(recs.clone());
            old_path = s.path().to_owned();
            // The process dies here (the lock goes with it), mid-way through a write.
            let mut f = OpenOptions::new().append(true).open(&old_path).unwrap();
            f.write_all(b"{\"id\":\"00").unwrap();
        }
        let stats = Arc::new(UsageStats::default());
        let mut s = Spool::new(dir.path(), 1 << 20, 100, Arc::clone(&stats)).unwrap();
        assert!(
            !old_path.exists(),
            "the abandoned file is removed once adopted"
        );
        assert_eq!(stats.replayed.load(Ordering::Relaxed), 5);
        assert_eq!(drain(&mut s, 100), recs);
    }

    #[test]
    fn a_live_spool_is_not_adopted() {
        let dir = tempfile::tempdir().unwrap();
        let mut live =
            Spool::new(dir.path(), 1 << 20, 100, Arc::new(UsageStats::default())).unwrap();
        live.append(vec![rec(1)]);
        let other = Spool::new(dir.path(), 1 << 20, 100, Arc::new(UsageStats::default())).unwrap();
        assert_eq!(other.pending(), 0);
        assert_eq!(live.pending(), 1);
        assert!(live.path().exists());
    }

    #[test]
    fn the_byte_bound_stops_intake_until_commit() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Arc::new(UsageStats::default());
        let mut s = Spool::new(dir.path(), 200, 100, Arc::clone(&stats)).unwrap();
        assert!(s.has_room());
        s.append(vec![rec(1)]);
        assert!(!s.has_room(), "one record passes 200 bytes");
        assert_eq!(stats.spool_full.load(Ordering::Relaxed), 1);
        drain(&mut s, 10);
        assert!(s.has_room());
        assert_eq!(stats.spool_full.load(Ordering::Relaxed), 0);
    }
}
