//! A minimal Redis client for the workers (monoio, `!Send`): what instances must agree on and
//! a request must read on the hot path without awaiting the sidecar (today: the HTTP response
//! transcripts behind `previous_response_id`, so another instance can continue a chain).
//!
//! # Key Components
//! - [`RedisTarget`]: a parsed `redis://[user[:password]@]host[:port][/db]` URL, resolved once
//!   at start in the main thread (workers never call getaddrinfo).
//! - [`encode`] / [`parse_reply`]: RESP2, sans-IO (simple strings, errors, integers, bulk
//!   strings including null, arrays).
//! - [`RespConn`]: one connection (generic over the stream, so the read loop is tested with
//!   bytes split at every boundary); [`WorkerRedis`]: a worker's small pool of them with a
//!   connect budget, a per-call deadline and a breaker.
//! - [`WorkerRedis::submit`]: fire-and-forget commands that must reach Redis in the order they
//!   were submitted (the per-key budget settlements, `gateway::limits`): one queue per worker,
//!   sent by one task ([`WorkerRedis::start_writer`]) in pipelined batches, each command's
//!   callback told its reply or its failure exactly once, even when the task is dropped.
//!
//! # Error handling
//! Redis is an optimisation here, never a dependency: a failure (connect, timeout, an error
//! reply) fails the call, closes that connection and opens the breaker for
//! [`BREAKER_OPEN`], during which calls fail at once. Callers treat a failure as "not there".

use std::{
    cell::{Cell, RefCell},
    collections::VecDeque,
    future::Future,
    io,
    net::{SocketAddr, ToSocketAddrs},
    pin::Pin,
    rc::Rc,
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

use monoio::{
    io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt},
    net::TcpStream,
};
use shared_state::Secret;

use crate::wire::read_more;

/// Connect budget of one Redis connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
/// Deadline of one call (request written and reply read).
pub const CALL_TIMEOUT: Duration = Duration::from_millis(500);
/// How long calls fail at once after a failure.
pub const BREAKER_OPEN: Duration = Duration::from_secs(2);
/// Idle connections kept per worker.
const MAX_IDLE: usize = 4;
/// Largest reply accepted (a transcript chain link is far smaller).
const MAX_REPLY: usize = 64 << 20;
/// Commands waiting in a worker's ordered queue ([`WorkerRedis::submit`]) at most; past it a
/// command fails at once (its callback is told so).
pub const MAX_QUEUED: usize = 10_000;
/// Commands sent in one pipelined batch by the queue's writer.
const BATCH: usize = 256;

/// What a queued command's submitter is told: `Some(reply)` or `None` (not sent, failed, or
/// its outcome unknown).
pub type Done = Box<dyn FnOnce(Option<Reply>)>;

/// A queued command and its callback; a callback not called by the time it is dropped is told
/// `None` (the writer task dropped at shutdown, the queue full).
struct Queued {
    cmd: Vec<u8>,
    done: Option<Done>,
}

impl Queued {
    fn finish(mut self, r: Option<Reply>) {
        if let Some(d) = self.done.take() {
            d(r);
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if let Some(d) = self.done.take() {
            d(None);
        }
    }
}

/// Where the workers' Redis is.
#[derive(Clone)]
pub struct RedisTarget {
    /// Resolved address.
    pub addr: SocketAddr,
    /// ACL user (Redis 6+), if any.
    pub user: Option<String>,
    /// Password, if any.
    pub password: Option<Secret>,
    /// Database number.
    pub db: u32,
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTarget")
            .field("addr", &self.addr)
            .field("user", &self.user)
            .field("db", &self.db)
            .finish_non_exhaustive()
    }
}

// === impl RedisTarget ===

impl RedisTarget {
    /// Parses and resolves `url`. `rediss://` (TLS) is not spoken by the workers: an error
    /// says so, and the caller runs without worker-side Redis.
    pub fn resolve(url: &str) -> Result<Self, String> {
        let rest = if let Some(r) = url.strip_prefix("redis://") {
            r
        } else if url.starts_with("rediss://") {
            return Err("rediss:// (TLS) is not supported by the workers' Redis client".into());
        } else {
            return Err("the Redis URL must start with redis://".into());
        };
        let (auth, hostpart) = match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        };
        let (hostport, db) = match hostpart.split_once('/') {
            Some((h, d)) if !d.is_empty() => (
                h,
                d.parse::<u32>()
                    .map_err(|_| "the Redis database must be a number".to_owned())?,
            ),
            Some((h, _)) => (h, 0),
            None => (hostpart, 0),
        };
        let (user, password) = match auth {
            None => (None, None),
            Some(a) => match a.split_once(':') {
                Some((u, p)) => (
                    (!u.is_empty()).then(|| percent_decode(u)),
                    Some(Secret::new(percent_decode(p))),
                ),
                None => (Some(percent_decode(a)), None),
            },
        };
        let hostport = if hostport.contains(':') && !hostport.ends_with(']') {
            hostport.to_owned()
        } else {
            format!("{hostport}:6379")
        };
        let addr = hostport
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve the Redis host: {e}"))?
            .next()
            .ok_or_else(|| "the Redis host resolves to nothing".to_owned())?;
        Ok(Self {
            addr,
            user,
            password,
            db,
        })
    }
}

fn percent_decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`
    Error(String),
    /// `:1`
    Integer(i64),
    /// `$n` bulk string; `None` for the null bulk string (`$-1`).
    Bulk(Option<Vec<u8>>),
    /// `*n`; `None` for the null array.
    Array(Option<Vec<Reply>>),
}

/// A command as RESP2 (an array of bulk strings).
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Parses one reply at the start of `buf`: `Ok(None)` when more bytes are needed, else the
/// reply and the bytes it used.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, &'static str> {
    parse_at(buf, 0, 0)
}

fn line_at(buf: &[u8], at: usize) -> Result<Option<(&[u8], usize)>, &'static str> {
    let Some(rel) = buf[at..].iter().position(|&c| c == b'\n') else {
        return Ok(None);
    };
    let end = at + rel;
    if end == at || buf[end - 1] != b'\r' {
        return Err("a RESP line without CRLF");
    }
    Ok(Some((&buf[at..end - 1], end + 1)))
}

fn int_of(line: &[u8]) -> Result<i64, &'static str> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or("a RESP length or integer that is not a number")
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Reply, usize)>, &'static str> {
    if depth > 8 {
        return Err("RESP arrays nested too deep");
    }
    if at >= buf.len() {
        return Ok(None);
    }
    let kind = buf[at];
    let Some((line, next)) = line_at(buf, at + 1)? else {
        return Ok(None);
    };
    let text = || String::from_utf8_lossy(line).into_owned();
    match kind {
        b'+' => Ok(Some((Reply::Simple(text()), next))),
        b'-' => Ok(Some((Reply::Error(text()), next))),
        b':' => Ok(Some((Reply::Integer(int_of(line)?), next))),
        b'$' => {
            let n = int_of(line)?;
            if n < 0 {
                return Ok(Some((Reply::Bulk(None), next)));
            }
            let n = usize::try_from(n).map_err(|_| "a RESP length out of range")?;
            if n > MAX_REPLY {
                return Err("a RESP reply larger than accepted");
            }
            let end = next.checked_add(n).ok_or("a RESP length out of range")?;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err("a RESP bulk string without its CRLF");
            }
            Ok(Some((Reply::Bulk(Some(buf[next..end].to_vec())), end + 2)))
        }
        b'*' => {
            let n = int_of(line)?;
            if n < 0 {
                return Ok(Some((Reply::Array(None), next)));
            }
            let n = usize::try_from(n).map_err(|_| "a RESP length out of range")?;
            let mut items = Vec::with_capacity(n.min(64));
            let mut pos = next;
            for _ in 0..n {
                match parse_at(buf, pos, depth + 1)? {
                    Some((r, p)) => {
                        items.push(r);
                        pos = p;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Reply::Array(Some(items)), pos)))
        }
        _ => Err("an unknown RESP reply type"),
    }
}

/// One Redis connection over any monoio stream.
pub struct RespConn<S> {
    io: S,
    buf: Vec<u8>,
}

// === impl RespConn ===

impl<S: AsyncReadRent + AsyncWriteRent> RespConn<S> {
    /// Wraps a connected stream.
    pub fn new(io: S) -> Self {
        Self {
            io,
            buf: Vec::with_capacity(4096),
        }
    }

    /// Writes the commands at once (one write) and reads one reply per command.
    pub async fn pipeline(&mut self, cmds: &[Vec<u8>]) -> io::Result<Vec<Reply>> {
        let out: Vec<u8> = cmds.concat();
        let (res, _) = self.io.write_all(out).await;
        res?;
        let mut replies = Vec::with_capacity(cmds.len());
        while replies.len() < cmds.len() {
            match parse_reply(&self.buf) {
                Ok(Some((r, used))) => {
                    self.buf.drain(..used);
                    replies.push(r);
                }
                Ok(None) => {
                    if read_more(&mut self.io, &mut self.buf, 4096).await? == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "Redis closed the connection",
                        ));
                    }
                }
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
        }
        Ok(replies)
    }

    /// One command, one reply.
    pub async fn call(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        let mut r = self.pipeline(&[encode(args)]).await?;
        r.pop()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no reply"))
    }
}

fn error_reply(r: &Reply) -> Option<io::Error> {
    match r {
        Reply::Error(e) => Some(io::Error::other(format!("Redis: {e}"))),
        _ => None,
    }
}

/// A worker's Redis: a few pooled connections, a connect budget, a call deadline, a breaker.
pub struct WorkerRedis {
    target: RedisTarget,
    idle: RefCell<Vec<RespConn<TcpStream>>>,
    open_until: Cell<Option<Instant>>,
    queue: RefCell<VecDeque<Queued>>,
    writer_waker: Cell<Option<Waker>>,
    writer_running: Cell<bool>,
}

impl std::fmt::Debug for WorkerRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerRedis")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

// === impl WorkerRedis ===

impl WorkerRedis {
    /// A client for `target` (connects lazily).
    pub fn new(target: RedisTarget) -> Self {
        Self {
            target,
            idle: RefCell::new(Vec::new()),
            open_until: Cell::new(None),
            queue: RefCell::new(VecDeque::new()),
            writer_waker: Cell::new(None),
            writer_running: Cell::new(false),
        }
    }

    /// Starts this worker's queue writer unless it runs (call from a task: it spawns one).
    pub fn start_writer(self: &Rc<Self>) {
        if self.writer_running.replace(true) {
            return;
        }
        let me = Rc::clone(self);
        monoio::spawn(async move {
            // Cleared however the task ends (dropped at shutdown included).
            struct Running(Rc<WorkerRedis>);
            impl Drop for Running {
                fn drop(&mut self) {
                    self.0.writer_running.set(false);
                    // Whatever is still queued is told it was not sent.
                    let left: Vec<Queued> = self.0.queue.borrow_mut().drain(..).collect();
                    drop(left);
                }
            }
            let running = Running(me);
            let me = &running.0;
            loop {
                QueueReady(me).await;
                let batch: Vec<Queued> = {
                    let mut q = me.queue.borrow_mut();
                    let n = q.len().min(BATCH);
                    q.drain(..n).collect()
                };
                let cmds: Vec<Vec<u8>> = batch.iter().map(|q| q.cmd.clone()).collect();
                match me.pipeline(&cmds).await {
                    Ok(replies) => {
                        let mut replies = replies.into_iter();
                        for q in batch {
                            let r = replies.next();
                            q.finish(r);
                        }
                    }
                    Err(_) => batch.into_iter().for_each(|q| q.finish(None)),
                }
            }
        });
    }

    /// Queues `cmd` behind every command submitted before it on this worker; `done` is told
    /// its reply (or `None`) exactly once. Without a running writer ([`Self::start_writer`]),
    /// with the queue full or the breaker open, `done` is told `None` at once.
    pub fn submit(&self, cmd: Vec<u8>, done: Done) {
        let q = Queued {
            cmd,
            done: Some(done),
        };
        if !self.writer_running.get() || self.breaker_open() {
            q.finish(None);
            return;
        }
        {
            let mut queue = self.queue.borrow_mut();
            if queue.len() >= MAX_QUEUED {
                drop(queue);
                q.finish(None);
                return;
            }
            queue.push_back(q);
        }
        if let Some(w) = self.writer_waker.take() {
            w.wake();
        }
    }

    /// Whether this worker's queue writer runs (so [`Self::submit`] can send).
    pub fn writer_running(&self) -> bool {
        self.writer_running.get()
    }

    async fn connect(&self) -> io::Result<RespConn<TcpStream>> {
        let stream = monoio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(self.target.addr))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "Redis connect timed out"))??;
        let _ = stream.set_nodelay(true);
        let mut conn = RespConn::new(stream);
        let mut setup = Vec::new();
        if let Some(p) = &self.target.password {
            setup.push(match &self.target.user {
                Some(u) => encode(&[b"AUTH", u.as_bytes(), p.expose().as_bytes()]),
                None => encode(&[b"AUTH", p.expose().as_bytes()]),
            });
        }
        if self.target.db != 0 {
            setup.push(encode(&[b"SELECT", self.target.db.to_string().as_bytes()]));
        }
        if !setup.is_empty() {
            for r in conn.pipeline(&setup).await? {
                if let Some(e) = error_reply(&r) {
                    return Err(e);
                }
            }
        }
        Ok(conn)
    }

    /// True while calls fail at once after a failure.
    pub fn breaker_open(&self) -> bool {
        self.open_until.get().is_some_and(|t| Instant::now() < t)
    }

    /// Runs the commands on one connection (pipelined) within [`CALL_TIMEOUT`].
    pub async fn pipeline(&self, cmds: &[Vec<u8>]) -> io::Result<Vec<Reply>> {
        self.pipeline_within(cmds, CALL_TIMEOUT).await
    }

    /// Runs the commands on one connection (pipelined) within `deadline` (connect included).
    pub async fn pipeline_within(
        &self,
        cmds: &[Vec<u8>],
        deadline: Duration,
    ) -> io::Result<Vec<Reply>> {
        if self.breaker_open() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "Redis breaker open",
            ));
        }
        let pooled = self.idle.borrow_mut().pop();
        let res = monoio::time::timeout(deadline, async {
            let mut conn = match pooled {
                Some(c) => c,
                None => self.connect().await?,
            };
            let replies = conn.pipeline(cmds).await?;
            Ok::<_, io::Error>((conn, replies))
        })
        .await
        .unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "Redis call timed out",
            ))
        });
        match res {
            Ok((conn, replies)) => {
                self.open_until.set(None);
                let mut idle = self.idle.borrow_mut();
                if idle.len() < MAX_IDLE {
                    idle.push(conn);
                }
                Ok(replies)
            }
            Err(e) => {
                if self.open_until.get().is_none() {
                    tracing::warn!(error = %e, "worker Redis call failed; not using Redis for a moment");
                }
                self.open_until.set(Some(Instant::now() + BREAKER_OPEN));
                Err(e)
            }
        }
    }

    /// `GET key` refreshing its time to live (`GETEX key PX ttl`); `None` when absent.
    pub async fn get_ex(&self, key: &[u8], ttl: Duration) -> io::Result<Option<Vec<u8>>> {
        let ms = ttl.as_millis().max(1).to_string();
        let mut r = self
            .pipeline(&[encode(&[b"GETEX", key, b"PX", ms.as_bytes()])])
            .await?;
        match r.pop() {
            Some(Reply::Bulk(v)) => Ok(v),
            Some(other) => Err(error_reply(&other)
                .unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unexpected reply"))),
            None => Ok(None),
        }
    }

    /// `SET key value PX ttl`.
    pub async fn set_px(&self, key: &[u8], value: &[u8], ttl: Duration) -> io::Result<()> {
        let ms = ttl.as_millis().max(1).to_string();
        let r = self
            .pipeline(&[encode(&[b"SET", key, value, b"PX", ms.as_bytes()])])
            .await?;
        match r.first() {
            Some(Reply::Simple(_)) => Ok(()),
            Some(other) => Err(error_reply(other)
                .unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unexpected reply"))),
            None => Ok(()),
        }
    }

    /// `PEXPIRE key ttl` for each key, pipelined (missing keys are skipped by Redis).
    pub async fn pexpire_many(&self, keys: &[Vec<u8>], ttl: Duration) -> io::Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let ms = ttl.as_millis().max(1).to_string();
        let cmds: Vec<Vec<u8>> = keys
            .iter()
            .map(|k| encode(&[b"PEXPIRE", k, ms.as_bytes()]))
            .collect();
        self.pipeline(&cmds).await.map(|_| ())
    }
}

/// Resolves when the ordered queue holds something (the writer's wait).
struct QueueReady<'a>(&'a WorkerRedis);

impl Future for QueueReady<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.queue.borrow().is_empty() {
            self.0.writer_waker.set(Some(cx.waker().clone()));
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

#[cfg(test)]
mod tests;
