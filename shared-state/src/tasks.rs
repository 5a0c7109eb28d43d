//! The sidecar's long-running tasks as `/healthz` and `/metrics` see them.
//!
//! # Key Components
//! - [`SidecarTasks`]: the board of supervised sidecar tasks (registered once each by the
//!   sidecar's supervisor, read lock-free by the data plane's `/healthz` and `/metrics`).
//! - [`TaskHealth`]: one task: its restarts and whether it keeps failing (a streak of
//!   [`FAILING_AFTER`] crashes without a stable run in between).
//!
//! # Usage
//! The supervisor (`admin::supervisor`) calls [`TaskHealth::crashed`] after each panic or
//! unexpected exit and [`TaskHealth::ran_stable`] once a run has lasted long enough; readers
//! call [`SidecarTasks::failing`] and [`SidecarTasks::render`].

use std::{
    fmt::Write,
    sync::{
        atomic::{AtomicU32, AtomicU64, Ordering},
        Arc,
    },
};

use arc_swap::ArcSwap;

/// Crashes in a row (without a stable run between them) after which a task is "failing".
pub const FAILING_AFTER: u32 = 3;

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

/// The board of supervised sidecar tasks.
#[derive(Debug, Default)]
pub struct SidecarTasks {
    tasks: ArcSwap<Vec<Arc<TaskHealth>>>,
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

    /// Appends the tasks' Prometheus series to `o`.
    pub fn render(&self, o: &mut String) {
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
    fn injected_panics_are_taken_once_each() {
        let t = SidecarTasks::default().register("x");
        assert!(!t.take_injected_panic());
        t.inject_panics(2);
        assert!(t.take_injected_panic());
        assert!(t.take_injected_panic());
        assert!(!t.take_injected_panic());
    }
}
