//! `send-floor`: what the kernel charges for forwarding one SSE event on loopback, with nothing
//! else in the way (benches/README.md, "The floor of CPU per forwarded event").
//!
//! A measured thread sends `--rate` events per second of `--event-bytes` bytes, paced in 1 ms
//! ticks, round-robin over `--conns` loopback TCP connections (`TCP_NODELAY`, as the gateway's
//! and nginx's client sockets); a reader thread drains them with epoll, as loadgen does. The
//! measured thread's CPU (`getrusage(RUSAGE_THREAD)`, user + system) per event is the floor of
//! a proxy that writes every event as it comes, for the way it writes:
//!
//! - `write`: one `send(2)` per event (what a plain epoll proxy does);
//! - `uring-single`: one io_uring `SEND` per event, one `io_uring_enter` each;
//! - `uring-batch`: every send of a tick in one submission (what monoio does: one
//!   `io_uring_enter` per loop turn);
//! - `uring-fixed`: as `uring-batch`, from a registered buffer (`WRITE_FIXED`);
//! - `more`: `--k` events in a row to one connection, all but the last with `MSG_MORE`;
//! - `coalesce`: `--k` events in a row to one connection in one `send` (what writing the
//!   events that arrived together in one write gives);
//! - `relay`: a feeder thread (not measured) writes each event to an upstream connection of
//!   its own, and the measured thread waits with epoll, reads it and sends it on: the least a
//!   proxy with one upstream connection per stream (nginx) does per event.
//!
//! Prints one JSON line: the mode, the events sent, CPU µs per event of the measured thread
//! (user and system) and of the reader.
#![allow(unsafe_code)] // raw socket and io_uring calls are what is measured

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd,
    sync::{
        atomic::{
            AtomicBool, AtomicU64,
            Ordering::{Relaxed, SeqCst},
        },
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Kernel CPU per forwarded event on loopback, by way of writing")]
struct Args {
    /// write | uring-single | uring-batch | uring-fixed | more | coalesce | relay
    #[arg(long, default_value = "write")]
    mode: String,
    /// Client connections.
    #[arg(long, default_value_t = 1000)]
    conns: usize,
    /// Events per second, all connections together.
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
    /// Bytes per event (the `sse` workload's frames are about 300).
    #[arg(long, default_value_t = 300)]
    event_bytes: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0)]
    secs: f64,
    /// Events per group for `more` and `coalesce`.
    #[arg(long, default_value_t = 4)]
    k: usize,
}

/// user, system CPU seconds of the calling thread.
fn thread_cpu() -> (f64, f64) {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (s(ru.ru_utime), s(ru.ru_stime))
}

fn pairs(n: usize, nonblocking_reader: bool) -> Result<Vec<(TcpStream, TcpStream)>> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let c = TcpStream::connect(addr)?;
        let (s, _) = l.accept()?;
        c.set_nodelay(true)?;
        s.set_nodelay(true)?;
        c.set_nonblocking(nonblocking_reader)?;
        // (writer end, reader end)
        out.push((s, c));
    }
    Ok(out)
}

/// An epoll instance watching `socks` for input, each tagged with its index.
fn epoll_over(socks: &[TcpStream]) -> Result<i32> {
    let ep = unsafe { libc::epoll_create1(0) };
    if ep < 0 {
        bail!("epoll_create1: {}", std::io::Error::last_os_error());
    }
    for (i, s) in socks.iter().enumerate() {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: i as u64,
        };
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) };
    }
    Ok(ep)
}

/// Drains `socks` with epoll until `stop`; returns its CPU (user, system) and bytes read.
fn drain(socks: Vec<TcpStream>, stop: Arc<AtomicBool>) -> Result<(f64, f64, u64)> {
    let ep = epoll_over(&socks)?;
    let mut socks = socks;
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    let start = thread_cpu();
    while !stop.load(Relaxed) {
        let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), evs.len() as i32, 50) };
        for ev in evs.iter().take(n.max(0) as usize) {
            let s = &mut socks[ev.u64 as usize];
            while let Ok(got) = s.read(&mut buf) {
                if got == 0 {
                    break;
                }
                total += got as u64;
            }
        }
    }
    let end = thread_cpu();
    unsafe { libc::close(ep) };
    Ok((end.0 - start.0, end.1 - start.1, total))
}

/// Calls `tick(n)` every millisecond with the events due, for `secs`; returns events sent.
fn paced(rate: u64, secs: f64, mut tick: impl FnMut(usize) -> Result<()>) -> Result<u64> {
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut sent = 0u64;
    let mut next = start;
    while Instant::now() < end {
        let due = ((start.elapsed().as_secs_f64() * rate as f64) as u64).saturating_sub(sent);
        if due > 0 {
            tick(due as usize)?;
            sent += due;
        }
        next += Duration::from_millis(1);
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            thread::sleep(d);
        }
    }
    Ok(sent)
}

fn send_all(fd: i32, buf: &[u8], flags: i32) -> Result<()> {
    let mut off = 0;
    while off < buf.len() {
        let n = unsafe { libc::send(fd, buf[off..].as_ptr().cast(), buf.len() - off, flags) };
        if n < 0 {
            bail!("send: {}", std::io::Error::last_os_error());
        }
        off += n as usize;
    }
    Ok(())
}

struct Ring {
    ring: io_uring::IoUring,
}

impl Ring {
    fn new() -> Result<Self> {
        Ok(Self {
            ring: io_uring::IoUring::new(4096).context("io_uring")?,
        })
    }

    /// Queues one entry, submitting first when the queue is full.
    fn push(&mut self, e: io_uring::squeue::Entry) -> Result<()> {
        loop {
            let pushed = unsafe { self.ring.submission().push(&e).is_ok() };
            if pushed {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    /// Submits what is queued and waits for `n` completions, checking each.
    fn finish(&mut self, n: usize) -> Result<()> {
        let mut done = 0;
        while done < n {
            self.ring.submit_and_wait(n - done)?;
            for c in self.ring.completion() {
                if c.result() < 0 {
                    bail!(
                        "io_uring op: {}",
                        std::io::Error::from_raw_os_error(-c.result())
                    );
                }
                done += 1;
            }
        }
        Ok(())
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    let frame: Vec<u8> = {
        let mut f = b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"".to_vec();
        while f.len() + 5 < a.event_bytes {
            f.push(b'x');
        }
        f.extend_from_slice(b"\"}\n\n");
        f
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (writers, readers): (Vec<_>, Vec<_>) = pairs(a.conns, true)?.into_iter().unzip();
    let reader = {
        let stop = Arc::clone(&stop);
        thread::Builder::new()
            .name("reader".into())
            .spawn(move || drain(readers, stop))?
    };
    let fds: Vec<i32> = writers.iter().map(|w| w.as_raw_fd()).collect();
    let n = fds.len();
    let mode = a.mode.clone();
    let k = a.k.max(1);
    let (cpu, sent) = match mode.as_str() {
        "relay" => relay(&a, &fds, &frame)?,
        _ => {
            let mut cursor = 0usize;
            let mut ring = Ring::new()?;
            let group: Vec<u8> = frame.repeat(k);
            if mode == "uring-fixed" {
                let iov = libc::iovec {
                    iov_base: frame.as_ptr() as *mut _,
                    iov_len: frame.len(),
                };
                unsafe { ring.ring.submitter().register_buffers(&[iov])? };
            }
            let start = thread_cpu();
            let sent = paced(a.rate, a.secs, |due| {
                match mode.as_str() {
                    "write" => {
                        for _ in 0..due {
                            send_all(fds[cursor % n], &frame, 0)?;
                            cursor += 1;
                        }
                    }
                    "uring-single" | "uring-batch" | "uring-fixed" => {
                        for i in 0..due {
                            let fd = io_uring::types::Fd(fds[cursor % n]);
                            cursor += 1;
                            let e = if mode == "uring-fixed" {
                                io_uring::opcode::WriteFixed::new(
                                    fd,
                                    frame.as_ptr(),
                                    frame.len() as u32,
                                    0,
                                )
                                .build()
                            } else {
                                io_uring::opcode::Send::new(fd, frame.as_ptr(), frame.len() as u32)
                                    .build()
                            };
                            ring.push(e.user_data(i as u64))?;
                            if mode == "uring-single" {
                                ring.finish(1)?;
                            }
                        }
                        if mode != "uring-single" {
                            ring.finish(due)?;
                        }
                    }
                    "more" | "coalesce" => {
                        // `due` events in groups of k to one connection each (a last,
                        // smaller group when due is not a multiple of k).
                        let mut left = due;
                        while left > 0 {
                            let g = left.min(k);
                            let fd = fds[cursor % n];
                            cursor += 1;
                            if mode == "coalesce" {
                                send_all(fd, &group[..g * frame.len()], 0)?;
                            } else {
                                for j in 0..g {
                                    let flags = if j + 1 < g { libc::MSG_MORE } else { 0 };
                                    send_all(fd, &frame, flags)?;
                                }
                            }
                            left -= g;
                        }
                    }
                    other => bail!("unknown mode {other}"),
                }
                Ok(())
            })?;
            let end = thread_cpu();
            ((end.0 - start.0, end.1 - start.1), sent)
        }
    };
    // Let the reader take the last bytes.
    thread::sleep(Duration::from_millis(200));
    stop.store(true, Relaxed);
    let (ru, rs, bytes) = match reader.join() {
        Ok(r) => r?,
        Err(_) => bail!("reader panicked"),
    };
    let expected = sent * frame.len() as u64;
    let per = |s: f64| s * 1e6 / sent.max(1) as f64;
    let line = serde_json::json!({
        "mode": mode,
        "k": if matches!(mode.as_str(), "more" | "coalesce") { k } else { 1 },
        "conns": a.conns,
        "rate": a.rate,
        "event_bytes": frame.len(),
        "events": sent,
        "bytes_read": bytes,
        "all_read": bytes == expected,
        "cpu_us_per_event": per(cpu.0 + cpu.1),
        "user_us_per_event": per(cpu.0),
        "sys_us_per_event": per(cpu.1),
        "reader_cpu_us_per_event": per(ru + rs),
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    drop(writers);
    Ok(())
}

/// `relay`: a feeder writes each event to the upstream connection of its stream; the measured
/// thread waits with epoll, reads and sends it on to the client connection.
fn relay(a: &Args, client_fds: &[i32], frame: &[u8]) -> Result<((f64, f64), u64)> {
    let (up_w, up_r): (Vec<_>, Vec<_>) = pairs(a.conns, true)?.into_iter().unzip();
    let fed = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let feeder = {
        let fed = Arc::clone(&fed);
        let done = Arc::clone(&done);
        let frame = frame.to_vec();
        let (rate, secs) = (a.rate, a.secs);
        thread::Builder::new()
            .name("feeder".into())
            .spawn(move || {
                let fds: Vec<i32> = up_w.iter().map(|w| w.as_raw_fd()).collect();
                let mut cursor = 0usize;
                let r = paced(rate, secs, |due| {
                    for _ in 0..due {
                        send_all(fds[cursor % fds.len()], &frame, 0)?;
                        cursor += 1;
                    }
                    Ok(())
                });
                if let Ok(n) = &r {
                    fed.store(*n, SeqCst);
                }
                done.store(true, SeqCst);
                drop(up_w);
                r
            })?
    };
    let ep = epoll_over(&up_r)?;
    let mut up_r = up_r;
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    let mut buf = vec![0u8; 64 * 1024];
    let mut relayed = 0u64;
    let expected = |fed: u64| fed * frame.len() as u64;
    let start = thread_cpu();
    loop {
        let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), evs.len() as i32, 50) };
        for ev in evs.iter().take(n.max(0) as usize) {
            let i = ev.u64 as usize;
            while let Ok(got) = up_r[i].read(&mut buf) {
                if got == 0 {
                    break;
                }
                send_all(client_fds[i], &buf[..got], 0)?;
                relayed += got as u64;
            }
        }
        if done.load(SeqCst) && relayed >= expected(fed.load(SeqCst)) {
            break;
        }
    }
    let end = thread_cpu();
    unsafe { libc::close(ep) };
    let sent = match feeder.join() {
        Ok(r) => r?,
        Err(_) => bail!("feeder panicked"),
    };
    Ok(((end.0 - start.0, end.1 - start.1), sent))
}
