//! Coarse per-worker deadlines for the long waits of open streams: the upstream idle timeout
//! between two chunks of a committed stream.
//!
//! A monoio `Sleep` is 640 bytes aligned to 128 (its timer entry is cache-padded), and a
//! `timeout` around every awaited chunk inserts and cancels one in the runtime's timer wheel
//! per forwarded batch. An open stream spends its life waiting for its next chunk, so that
//! timer was the largest single item a slow stream held (768 bytes, boxed) and a wheel insert
//! and cancel per event.
//!
//! # Key Components
//! - [`install`]: gives the current worker thread its wheel and spawns the wheel's driver (one
//!   task with one `Sleep`, set to the earliest filed tick). The returned guard uninstalls it.
//! - [`Idle`]: one stream's idle deadline. [`Idle::touch`] moves it forward (a field write, the
//!   entry is not refiled); [`Idle::poll_expired`] files it the first time the stream waits.
//!   When its filed tick comes the driver compares it with the current deadline: it refiles
//!   the entry when the stream made progress since, and wakes the stream when it did not. An
//!   entry is about 48 bytes in the wheel, and dropping an [`Idle`] removes it at once.
//! - A quiet stage ([`Idle::with_quiet`]): the same entry is filed at the earlier quiet
//!   deadline first; when it passes without progress [`Idle::poll_expired`] says
//!   [`Expired::Quiet`] once and the entry moves on to the idle deadline. One entry and one
//!   clock read per chunk serve both (a committed stream gives back its buffers when quiet).
//! - On a thread without a wheel (unit tests on a bare runtime) [`Idle`] uses a boxed `Sleep`.
//!
//! Deadlines are rounded up to [`TICK`]: a timeout fires no earlier than asked and at most
//! one tick later.
//!
//! # Error handling
//! None: an expired deadline is a value (`Poll::Ready`), the caller maps it to its timeout.

use std::{
    cell::RefCell,
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    rc::Rc,
    task::{Context, Poll, Waker},
    time::Duration,
};

use monoio::time::Instant;

/// Resolution of the wheel.
pub const TICK: Duration = Duration::from_millis(10);

thread_local! {
    static WHEEL: RefCell<Option<Rc<Wheel>>> = const { RefCell::new(None) };
}

/// One filed deadline.
struct Entry {
    /// The current deadline, in ticks since the wheel's epoch (rounded up).
    due: u64,
    /// The tick it is filed under (`None`: not filed: expired, or its slot is free).
    filed: Option<u64>,
    waker: Option<Waker>,
    expired: bool,
}

struct Inner {
    epoch: Instant,
    entries: Vec<Entry>,
    free: Vec<u32>,
    /// Entry indexes by the tick they are filed under.
    filed: BTreeMap<u64, Vec<u32>>,
    /// The driver's waker (woken when an entry is filed before `armed`).
    driver: Option<Waker>,
    /// The tick the driver's sleep is set for (`u64::MAX`: none).
    armed: u64,
}

/// A worker thread's deadline wheel.
pub struct Wheel {
    inner: RefCell<Inner>,
}

/// Uninstalls the thread's wheel when dropped (the end of the worker).
pub struct Installed(());

impl Drop for Installed {
    fn drop(&mut self) {
        WHEEL.with(|w| w.borrow_mut().take());
    }
}

/// Installs a wheel for the current thread and spawns its driver on the current monoio
/// runtime.
pub fn install() -> Installed {
    let wheel = Rc::new(Wheel::new(Instant::now()));
    WHEEL.with(|w| *w.borrow_mut() = Some(Rc::clone(&wheel)));
    monoio::spawn(drive(wheel));
    Installed(())
}

fn current() -> Option<Rc<Wheel>> {
    WHEEL.with(|w| w.borrow().clone())
}

// === impl Wheel ===

impl Wheel {
    fn new(epoch: Instant) -> Self {
        Self {
            inner: RefCell::new(Inner {
                epoch,
                entries: Vec::new(),
                free: Vec::new(),
                filed: BTreeMap::new(),
                driver: None,
                armed: u64::MAX,
            }),
        }
    }

    /// Entries in use (for tests and metrics).
    pub fn len(&self) -> usize {
        let i = self.inner.borrow();
        i.entries.len() - i.free.len()
    }

    /// True when no entry is in use.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tick at or after `t` (deadlines round up).
    fn tick_after(inner: &Inner, t: Instant) -> u64 {
        let d = t.saturating_duration_since(inner.epoch);
        let tick = TICK.as_nanos();
        (d.as_nanos().div_ceil(tick)) as u64
    }

    /// The tick `t` is in (what has passed rounds down).
    fn tick_at(inner: &Inner, t: Instant) -> u64 {
        (t.saturating_duration_since(inner.epoch).as_nanos() / TICK.as_nanos()) as u64
    }

    fn file(inner: &mut Inner, idx: u32, due: u64) {
        inner.filed.entry(due).or_default().push(idx);
        inner.entries[idx as usize].filed = Some(due);
        if due < inner.armed {
            if let Some(w) = inner.driver.take() {
                w.wake();
            }
        }
    }

    fn unfile(inner: &mut Inner, idx: u32) {
        let Some(t) = inner.entries[idx as usize].filed.take() else {
            return;
        };
        if let Some(v) = inner.filed.get_mut(&t) {
            if let Some(p) = v.iter().position(|&i| i == idx) {
                v.swap_remove(p);
            }
            if v.is_empty() {
                inner.filed.remove(&t);
            }
        }
    }

    fn register(&self, due_at: Instant, waker: &Waker) -> u32 {
        let mut inner = self.inner.borrow_mut();
        let due = Self::tick_after(&inner, due_at);
        let entry = Entry {
            due,
            filed: None,
            waker: Some(waker.clone()),
            expired: false,
        };
        let idx = match inner.free.pop() {
            Some(i) => {
                inner.entries[i as usize] = entry;
                i
            }
            None => {
                inner.entries.push(entry);
                (inner.entries.len() - 1) as u32
            }
        };
        Self::file(&mut inner, idx, due);
        idx
    }

    fn release(&self, idx: u32) {
        let mut inner = self.inner.borrow_mut();
        Self::unfile(&mut inner, idx);
        let e = &mut inner.entries[idx as usize];
        e.waker = None;
        e.expired = false;
        inner.free.push(idx);
    }

    /// Moves an entry's deadline: later is a field write (the driver refiles it when its
    /// filed tick comes), earlier refiles it (a quiet stage armed again), and an expired entry
    /// is filed again.
    fn set_due(&self, idx: u32, due_at: Instant) {
        let mut inner = self.inner.borrow_mut();
        let due = Self::tick_after(&inner, due_at);
        let e = &mut inner.entries[idx as usize];
        e.due = due;
        if e.expired {
            e.expired = false;
            Self::file(&mut inner, idx, due);
        } else if e.filed.is_some_and(|t| due < t) {
            Self::unfile(&mut inner, idx);
            Self::file(&mut inner, idx, due);
        }
    }

    fn poll_entry(&self, idx: u32, cx: &Context<'_>) -> Poll<()> {
        let mut inner = self.inner.borrow_mut();
        let e = &mut inner.entries[idx as usize];
        if e.expired {
            return Poll::Ready(());
        }
        match &e.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => e.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Expires what is due at `now` (waking its waiters) and refiles what moved since.
    fn fire(&self, now: Instant) {
        let mut wake = Vec::new();
        {
            let mut inner = self.inner.borrow_mut();
            let now_tick = Self::tick_at(&inner, now);
            while let Some(entry) = inner.filed.first_entry() {
                if *entry.key() > now_tick {
                    break;
                }
                let (_, idxs) = entry.remove_entry();
                for idx in idxs {
                    let e = &mut inner.entries[idx as usize];
                    e.filed = None;
                    if e.due > now_tick {
                        let due = e.due;
                        Self::file(&mut inner, idx, due);
                    } else {
                        e.expired = true;
                        if let Some(w) = e.waker.take() {
                            wake.push(w);
                        }
                    }
                }
            }
        }
        for w in wake {
            w.wake();
        }
    }

    /// The instant of the earliest filed tick.
    fn next_due(&self) -> Option<(u64, Instant)> {
        let inner = self.inner.borrow();
        inner.filed.first_key_value().map(|(&t, _)| {
            (
                t,
                inner.epoch + Duration::from_nanos(t * TICK.as_nanos() as u64),
            )
        })
    }
}

/// The wheel's driver: sleeps until the earliest filed tick, then fires it.
async fn drive(wheel: Rc<Wheel>) {
    let mut sleep = Box::pin(monoio::time::sleep(Duration::from_secs(3600)));
    loop {
        std::future::poll_fn(|cx| {
            let next = wheel.next_due();
            let mut inner = wheel.inner.borrow_mut();
            match &inner.driver {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => inner.driver = Some(cx.waker().clone()),
            }
            let Some((tick, at)) = next else {
                inner.armed = u64::MAX;
                return Poll::Pending;
            };
            if at <= Instant::now() {
                return Poll::Ready(());
            }
            if inner.armed != tick {
                inner.armed = tick;
                sleep.as_mut().reset(at);
            }
            drop(inner);
            sleep.as_mut().poll(cx)
        })
        .await;
        wheel.fire(Instant::now());
    }
}

/// One stream's idle deadline (see the module documentation), with an optional earlier
/// *quiet* stage: one wheel entry serves both, filed at the quiet deadline while that stage is
/// armed and at the idle deadline after it passed.
pub struct Idle {
    idle: Duration,
    /// The quiet span (`Duration::ZERO`: none; never at or past `idle`).
    quiet: Duration,
    /// The last progress ([`Idle::touch`]; the creation before the first).
    touched: Instant,
    /// The quiet stage is armed: the next expiry reports [`Expired::Quiet`].
    quiet_armed: bool,
    mode: Mode,
}

/// Which deadline passed without progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// The quiet span: reported once per [`Idle::touch`]; the idle deadline stays armed.
    Quiet,
    /// The idle timeout.
    Idle,
}

enum Mode {
    /// Filed in the thread's wheel once the stream first waits.
    Wheel(Rc<Wheel>, Option<u32>),
    /// No wheel on this thread: a timer of the runtime, made when first waited on.
    Sleep(Option<Pin<Box<monoio::time::Sleep>>>),
}

// === impl Idle ===

impl Idle {
    /// A deadline `idle` from now, renewed by every [`Idle::touch`].
    pub fn new(idle: Duration) -> Self {
        Self::with_quiet(idle, Duration::ZERO)
    }

    /// A deadline `idle` from now, and before it a quiet stage of `quiet` (ignored when it
    /// is zero or not shorter than `idle`), both renewed by every [`Idle::touch`].
    pub fn with_quiet(idle: Duration, quiet: Duration) -> Self {
        let mode = match current() {
            Some(w) => Mode::Wheel(w, None),
            None => Mode::Sleep(None),
        };
        let quiet = if quiet < idle { quiet } else { Duration::ZERO };
        Self {
            idle,
            quiet,
            touched: Instant::now(),
            quiet_armed: !quiet.is_zero(),
            mode,
        }
    }

    /// The idle span this deadline renews by.
    pub fn span(&self) -> Duration {
        self.idle
    }

    /// The deadline of the armed stage.
    fn due_at(&self) -> Instant {
        self.touched
            + if self.quiet_armed {
                self.quiet
            } else {
                self.idle
            }
    }

    /// Points the filed entry (or the fallback timer) at the armed stage's deadline.
    fn rearm(&mut self) {
        let due_at = self.due_at();
        match &mut self.mode {
            Mode::Wheel(w, Some(idx)) => w.set_due(*idx, due_at),
            Mode::Wheel(_, None) => {}
            Mode::Sleep(Some(s)) => s.as_mut().reset(due_at),
            Mode::Sleep(None) => {}
        }
    }

    /// The stream made progress: the deadline is `idle` from now (and the quiet stage, when
    /// there is one, `quiet` from now).
    pub fn touch(&mut self) {
        self.touched = Instant::now();
        self.quiet_armed = !self.quiet.is_zero();
        self.rearm();
    }

    /// `Ready` once a deadline has passed without a [`Idle::touch`]: the quiet stage first
    /// (once; the idle deadline is armed next), then the idle one. Registers `cx`'s waker
    /// otherwise.
    pub fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<Expired> {
        let due_at = self.due_at();
        let ready = match &mut self.mode {
            Mode::Wheel(w, slot) => {
                let idx = *slot.get_or_insert_with(|| w.register(due_at, cx.waker()));
                w.poll_entry(idx, cx)
            }
            Mode::Sleep(s) => s
                .get_or_insert_with(|| Box::pin(monoio::time::sleep_until(due_at)))
                .as_mut()
                .poll(cx),
        };
        if ready.is_pending() {
            return Poll::Pending;
        }
        if self.quiet_armed {
            self.quiet_armed = false;
            self.rearm();
            return Poll::Ready(Expired::Quiet);
        }
        Poll::Ready(Expired::Idle)
    }
}

/// Awaits `fut` under `idle`'s idle deadline: `None` once it passes first (`fut` is dropped).
/// A quiet stage is waited through: a read in flight that is not cancel-safe (an HTTP/1.1
/// body, an upstream WebSocket) cannot be set aside to give buffers back. The wheel entry
/// serves every wait of the stream, where a runtime timeout would insert and cancel a timer
/// per awaited chunk. The caller touches `idle` on progress.
pub async fn within<F: Future>(idle: &mut Idle, fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(r));
        }
        loop {
            match idle.poll_expired(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Expired::Quiet) => continue,
                Poll::Ready(Expired::Idle) => return Poll::Ready(None),
            }
        }
    })
    .await
}

impl Drop for Idle {
    fn drop(&mut self) {
        if let Mode::Wheel(w, Some(idx)) = &self.mode {
            w.release(*idx);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::Cell, future::poll_fn};

    use super::*;

    async fn expired(idle: &mut Idle) -> Expired {
        poll_fn(|cx| idle.poll_expired(cx)).await
    }

    /// `within` returns what the future gives before the deadline, waits through the quiet
    /// stage, and gives `None` at the idle deadline (on the wheel and on a bare runtime).
    #[monoio::test_all(timer_enabled = true)]
    async fn within_waits_through_the_quiet_stage_until_the_idle_deadline() {
        for wheel in [true, false] {
            let _w = wheel.then(install);
            let mut idle = Idle::with_quiet(Duration::from_millis(120), Duration::from_millis(20));
            let quick = within(&mut idle, async {
                monoio::time::sleep(Duration::from_millis(50)).await;
                7
            })
            .await;
            assert_eq!(
                quick,
                Some(7),
                "wheel={wheel}: past the quiet stage, before idle"
            );
            idle.touch();
            let t0 = std::time::Instant::now();
            let never = within(&mut idle, std::future::pending::<()>()).await;
            assert_eq!(never, None, "wheel={wheel}");
            let took = t0.elapsed();
            assert!(
                took >= Duration::from_millis(120),
                "wheel={wheel}: {took:?}"
            );
        }
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn fires_after_the_deadline_and_not_before() {
        {
            let _w = install();
            let t0 = std::time::Instant::now();
            let mut idle = Idle::new(Duration::from_millis(60));
            expired(&mut idle).await;
            let took = t0.elapsed();
            assert!(took >= Duration::from_millis(60), "{took:?}");
            assert!(matches!(idle.mode, Mode::Wheel(_, Some(_))));
        }
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn touches_move_the_deadline_without_refiling_each_time() {
        {
            let _w = install();
            let wheel = current().expect("installed");
            let mut idle = Idle::new(Duration::from_millis(80));
            let fired = Rc::new(Cell::new(false));
            let t0 = std::time::Instant::now();
            // Progress every 20 ms for 200 ms: never expires meanwhile.
            let mut polls = 0;
            while t0.elapsed() < Duration::from_millis(200) {
                let r = monoio::time::timeout(Duration::from_millis(20), expired(&mut idle)).await;
                assert!(r.is_err(), "expired while making progress");
                idle.touch();
                polls += 1;
            }
            assert!(polls >= 5);
            assert_eq!(wheel.len(), 1);
            assert!(
                wheel
                    .inner
                    .borrow()
                    .filed
                    .values()
                    .map(Vec::len)
                    .sum::<usize>()
                    <= 1
            );
            // Then silence: it expires about 80 ms after the last touch.
            let t1 = std::time::Instant::now();
            expired(&mut idle).await;
            fired.set(true);
            let waited = t1.elapsed();
            assert!(waited >= Duration::from_millis(80), "{waited:?}");
            assert!(waited < Duration::from_millis(80) + TICK * 20, "{waited:?}");
            // A touch after expiry arms it again.
            idle.touch();
            let r = monoio::time::timeout(Duration::from_millis(30), expired(&mut idle)).await;
            assert!(r.is_err(), "re-armed by the touch");
            expired(&mut idle).await;
            assert!(fired.get());
        }
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn many_deadlines_fire_in_order_and_dropped_ones_leave_nothing() {
        {
            let _w = install();
            let wheel = current().expect("installed");
            let order = Rc::new(RefCell::new(Vec::new()));
            let mut tasks = Vec::new();
            for (i, ms) in [90u64, 30, 60, 10, 120].into_iter().enumerate() {
                let order = Rc::clone(&order);
                tasks.push(monoio::spawn(async move {
                    let mut idle = Idle::new(Duration::from_millis(ms));
                    expired(&mut idle).await;
                    order.borrow_mut().push(i);
                }));
            }
            // Dropped before their deadlines: removed from the wheel at once.
            for _ in 0..100 {
                let mut idle = Idle::new(Duration::from_secs(300));
                let _ = monoio::time::timeout(Duration::from_micros(10), expired(&mut idle)).await;
            }
            for t in tasks {
                t.await;
            }
            assert_eq!(*order.borrow(), vec![3, 1, 2, 0, 4]);
            assert!(wheel.is_empty(), "{} entries left", wheel.len());
            assert!(wheel.inner.borrow().filed.is_empty());
        }
    }

    /// The quiet stage passes first (once), then the idle deadline, both counted from the
    /// last touch; a touch after a pause arms the quiet stage again at its own, earlier
    /// deadline (not at the idle one the entry was filed under). With and without a wheel.
    async fn two_stages(wheel: bool) {
        let _w = wheel.then(install);
        let (quiet, idle) = (Duration::from_millis(40), Duration::from_millis(200));
        let mut d = Idle::with_quiet(idle, quiet);
        for round in 0..2 {
            let t0 = std::time::Instant::now();
            assert_eq!(expired(&mut d).await, Expired::Quiet, "round {round}");
            let q = t0.elapsed();
            assert!(q >= quiet && q < quiet + TICK * 10, "quiet after {q:?}");
            if round == 0 {
                // Progress after the pause: the quiet stage again, 40 ms from now.
                d.touch();
                continue;
            }
            assert_eq!(expired(&mut d).await, Expired::Idle);
            let i = t0.elapsed();
            assert!(i >= idle && i < idle + TICK * 10, "idle after {i:?}");
        }
        // A quiet span not shorter than the idle one is ignored.
        let mut d = Idle::with_quiet(quiet, idle);
        assert_eq!(expired(&mut d).await, Expired::Idle);
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn a_quiet_stage_passes_before_the_idle_deadline() {
        two_stages(true).await;
        two_stages(false).await;
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn without_a_wheel_it_falls_back_to_a_runtime_timer() {
        {
            let mut idle = Idle::new(Duration::from_millis(30));
            assert!(matches!(idle.mode, Mode::Sleep(None)));
            let t0 = std::time::Instant::now();
            let r = monoio::time::timeout(Duration::from_millis(10), expired(&mut idle)).await;
            assert!(r.is_err());
            idle.touch();
            expired(&mut idle).await;
            assert!(t0.elapsed() >= Duration::from_millis(30));
        }
    }
}
