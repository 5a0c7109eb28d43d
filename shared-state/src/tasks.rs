//! The sidecar's long-running tasks as `/healthz` and `/metrics` see them.
//!
//! # Key Components
//! - [`SidecarTasks`]: the board of supervised sidecar tasks (registered once each by the
//!   sidecar's supervisor, read lock-free by the data plane's `/healthz` and `/metrics`).
//! - [`TaskHealth`]: one task: its restarts and whether it keeps failing (a streak of
//!   [`FAILING_AFTER`] crashes without a stable run in between).
//! - The sidecar thread itself ([`SidecarTasks::beat`], [`SidecarTasks::thread_ended`],
//!   [`SidecarTasks::thread`]): its main loop beats every [`SIDECAR_BEAT_MS`]; a thread that
//!   died (a panic outside the supervised tasks) or whose runtime is stuck (a blocking call on
//!   the current-thread runtime) stops beating, and `/healthz` says so (`sidecar.thread`).
//!
//! # Usage
//! The supervisor (`admin::supervisor`) calls [`TaskHealth::crashed`] after each panic or
//! unexpected exit and [`TaskHealth::ran_stable`] once a run has lasted long enough; readers
//! call [`SidecarTasks::failing`] and [`SidecarTasks::render`].

use std::{
    fmt::Write,
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        Arc,
    },
};

use arc_swap::ArcSwap;

/// Crashes in a row (without a stable run between them) after which a task is "failing".
pub const FAILING_AFTER: u32 = 3;

/// How often the sidecar thread's main loop beats.
pub const SIDECAR_BEAT_MS: u64 = 500;

/// A sidecar thread whose last beat is older than this is reported stalled: its
/// current-thread runtime is blocked (every sidecar task with it: refreshes, usage, admin).
pub const SIDECAR_STALL_MS: u64 = 10_000;

/// The sidecar thread as `/healthz` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SidecarThread {
    /// No sidecar beats in this process (a data plane started without one, e.g. unit tests).
    Absent,
    /// It beat within [`SIDECAR_STALL_MS`].
    Alive,
    /// It beat once but not within [`SIDECAR_STALL_MS`]: its runtime is blocked.
    Stalled,
    /// The thread ended without being asked to stop (a panic outside the supervised tasks).
    Dead,
}

// === impl SidecarThread ===

impl SidecarThread {
    /// The `/healthz` word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Absent => "absent",
            Self::Alive => "alive",
            Self::Stalled => "stalled",
            Self::Dead => "dead",
        }
    }

    /// Whether the sidecar is not doing its work (stalled or dead).
    pub fn is_down(self) -> bool {
        matches!(self, Self::Stalled | Self::Dead)
    }
}

/// One supervised task.
#[derive(Debug)]
pub struct TaskHealth {
    name: &'static str,
    restarts: AtomicU64,
    /// Crashes since the last stable run.
    streak: AtomicU32,
    /// When it last crashed (ms since epoch; 0: never).
    last_crash_ms: AtomicU64,
    /// Test-only: panics still to inject (see [`TaskHealth::inject_panics`]).
    injected_panics: AtomicU32,
}

// === impl TaskHealth ===

impl TaskHealth {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            restarts: AtomicU64::new(0),
            streak: AtomicU32::new(0),
            last_crash_ms: AtomicU64::new(0),
            injected_panics: AtomicU32::new(0),
        }
    }

    /// The task's name (the `task` label).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The task panicked or returned unexpectedly at `now_ms` and is being restarted.
    pub fn crashed(&self, now_ms: u64) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        self.streak.fetch_add(1, Ordering::AcqRel);
        self.last_crash_ms.store(now_ms.max(1), Ordering::Release);
    }

    /// The current run has lasted long enough to count as stable: the crash streak ends.
    pub fn ran_stable(&self) {
        self.streak.store(0, Ordering::Release);
    }

    /// Restarts since the process started.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Whether the task keeps failing: [`FAILING_AFTER`] crashes without a stable run.
    pub fn is_failing(&self) -> bool {
        self.streak.load(Ordering::Acquire) >= FAILING_AFTER
    }

    /// When it last crashed (ms since epoch).
    pub fn last_crash_ms(&self) -> Option<u64> {
        Some(self.last_crash_ms.load(Ordering::Acquire)).filter(|&t| t != 0)
    }

    /// Test-only fault hook: the task's next `n` runs panic. The supervisor consults it only
    /// when the admin crate is built with its `fault-injection` feature.
    pub fn inject_panics(&self, n: u32) {
        self.injected_panics.store(n, Ordering::Release);
    }

    /// Takes one injected panic, if any is left.
    pub fn take_injected_panic(&self) -> bool {
        self.injected_panics
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// The board of supervised sidecar tasks, and the sidecar thread's own liveness.
#[derive(Debug, Default)]
pub struct SidecarTasks {
    tasks: ArcSwap<Vec<Arc<TaskHealth>>>,
    /// The sidecar thread's last beat (ms since epoch; 0: never beat).
    beat_ms: AtomicU64,
    /// The sidecar thread ended without being asked to stop.
    dead: AtomicBool,
    /// Test-only: the sidecar thread's main loop panics at its next beat.
    injected_thread_panic: AtomicBool,
}

// === impl SidecarTasks ===

impl SidecarTasks {
    /// The entry of task `name`, registered on first use (a restarted sidecar keeps counting
    /// on the same entry).
    pub fn register(&self, name: &'static str) -> Arc<TaskHealth> {
        if let Some(t) = self.get(name) {
            return t;
        }
        let new = Arc::new(TaskHealth::new(name));
        self.tasks.rcu(|cur| {
            let mut v = Vec::clone(cur);
            if !v.iter().any(|t| t.name == name) {
                v.push(Arc::clone(&new));
            }
            v
        });
        self.get(name).unwrap_or(new)
    }

    /// The entry of task `name`, if registered.
    pub fn get(&self, name: &str) -> Option<Arc<TaskHealth>> {
        self.tasks.load().iter().find(|t| t.name == name).cloned()
    }

    /// Every registered task.
    pub fn all(&self) -> Arc<Vec<Arc<TaskHealth>>> {
        self.tasks.load_full()
    }

    /// Names of the tasks that keep failing.
    pub fn failing(&self) -> Vec<&'static str> {
        self.tasks
            .load()
            .iter()
            .filter(|t| t.is_failing())
            .map(|t| t.name)
            .collect()
    }

    /// Restarts of every task together.
    pub fn restarts(&self) -> u64 {
        self.tasks.load().iter().map(|t| t.restarts()).sum()
    }

    /// The sidecar thread is alive at `now_ms` (its main loop calls this every
    /// [`SIDECAR_BEAT_MS`]).
    pub fn beat(&self, now_ms: u64) {
        self.beat_ms.store(now_ms.max(1), Ordering::Release);
    }

    /// The sidecar thread ended without being asked to stop (called from its exit guard).
    pub fn thread_ended(&self) {
        self.dead.store(true, Ordering::Release);
    }

    /// The sidecar thread at `now_ms`.
    pub fn thread(&self, now_ms: u64) -> SidecarThread {
        if self.dead.load(Ordering::Acquire) {
            return SidecarThread::Dead;
        }
        match self.beat_ms.load(Ordering::Acquire) {
            0 => SidecarThread::Absent,
            t if now_ms.saturating_sub(t) > SIDECAR_STALL_MS => SidecarThread::Stalled,
            _ => SidecarThread::Alive,
        }
    }

    /// Test-only fault hook: the sidecar thread's main loop panics at its next beat (outside
    /// every supervised task, so the thread dies). Consulted only when the admin crate is
    /// built with its `fault-injection` feature.
    pub fn inject_thread_panic(&self) {
        self.injected_thread_panic.store(true, Ordering::Release);
    }

    /// Takes the injected thread panic, if any.
    pub fn take_injected_thread_panic(&self) -> bool {
        self.injected_thread_panic.swap(false, Ordering::AcqRel)
    }

    /// Appends the tasks' Prometheus series to `o`.
    pub fn render(&self, o: &mut String) {
        let up = !self.thread(crate::now_ms()).is_down();
        let _ = writeln!(
            o,
            "# HELP codex_gateway_sidecar_up 1 while the sidecar thread beats (0: dead or its runtime blocked; refreshes, usage persistence and the admin API stop with it).\n# TYPE codex_gateway_sidecar_up gauge\ncodex_gateway_sidecar_up {}",
            u8::from(up)
        );
        let tasks = self.tasks.load();
        let _ = writeln!(
            o,
            "# HELP codex_gateway_sidecar_task_restarts_total Sidecar tasks restarted by the supervisor after a panic or an unexpected exit.\n# TYPE codex_gateway_sidecar_task_restarts_total counter"
        );
        for t in tasks.iter() {
            let _ = writeln!(
                o,
                "codex_gateway_sidecar_task_restarts_total{{task=\"{}\"}} {}",
                t.name,
                t.restarts()
            );
        }
        let _ = writeln!(
            o,
            "# HELP codex_gateway_sidecar_task_failing 1 while a sidecar task keeps failing (crashes in a row without a stable run).\n# TYPE codex_gateway_sidecar_task_failing gauge"
        );
        for t in tasks.iter() {
            let _ = writeln!(
                o,
                "codex_gateway_sidecar_task_failing{{task=\"{}\"}} {}",
                t.name,
                u8::from(t.is_failing())
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streak_of_crashes_is_failing_until_a_stable_run() {
        let board = SidecarTasks::default();
        let t = board.register("reload");
        assert!(Arc::ptr_eq(&t, &board.register("reload")));
        board.register("events.usage");
        assert_eq!(board.all().len(), 2);
        for i in 1..FAILING_AFTER {
            t.crashed(1_000 * u64::from(i));
            assert!(!t.is_failing());
        }
        t.crashed(9_000);
        assert!(t.is_failing());
        assert_eq!(board.failing(), vec!["reload"]);
        assert_eq!(t.last_crash_ms(), Some(9_000));
        t.ran_stable();
        assert!(board.failing().is_empty());
        assert_eq!(board.restarts(), u64::from(FAILING_AFTER));
        let mut o = String::new();
        board.render(&mut o);
        assert!(o.contains("codex_gateway_sidecar_task_restarts_total{task=\"reload\"} 3\n"));
        assert!(o.contains("codex_gateway_sidecar_task_restarts_total{task=\"events.usage\"} 0\n"));
        assert!(o.contains("codex_gateway_sidecar_task_failing{task=\"reload\"} 0\n"));
    }

    #[test]
    fn the_thread_is_alive_while_it_beats_and_dead_once_ended() {
        let board = SidecarTasks::default();
        assert_eq!(board.thread(5_000), SidecarThread::Absent);
        board.beat(5_000);
        assert_eq!(board.thread(5_000 + SIDECAR_STALL_MS), SidecarThread::Alive);
        assert_eq!(
            board.thread(5_001 + SIDECAR_STALL_MS),
            SidecarThread::Stalled
        );
        board.beat(5_001 + SIDECAR_STALL_MS);
        assert_eq!(board.thread(5_001 + SIDECAR_STALL_MS), SidecarThread::Alive);
        board.thread_ended();
        assert_eq!(board.thread(5_001 + SIDECAR_STALL_MS), SidecarThread::Dead);
        assert!(board.thread(0).is_down());
        let mut o = String::new();
        board.render(&mut o);
        assert!(o.contains("codex_gateway_sidecar_up 0\n"), "{o}");
        assert!(!board.take_injected_thread_panic());
        board.inject_thread_panic();
        assert!(board.take_injected_thread_panic());
        assert!(!board.take_injected_thread_panic());
    }

    #[test]
    fn injected_panics_are_taken_once_each() {
        let t = SidecarTasks::default().register("x");
        assert!(!t.take_injected_panic());
        t.inject_panics(2);
        assert!(t.take_injected_panic());
        assert!(t.take_injected_panic());
        assert!(!t.take_injected_panic());
    }
}
