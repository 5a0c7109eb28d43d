//! Supervision of the sidecar's long-running tasks.
//!
//! # Key Components
//! - [`Supervisor`]: spawns a task from a factory and keeps it running: a panic or a return
//!   before the sidecar stops is logged, counted ([`shared_state::TaskHealth::crashed`]:
//!   `codex_gateway_sidecar_task_restarts_total{task}`) and followed by a fresh run from the
//!   factory after a backoff ([`MIN_BACKOFF`] doubling up to [`MAX_BACKOFF`]; a run that lasted
//!   [`STABLE_AFTER`] resets both the backoff and the crash streak). A task that crashes
//!   [`shared_state::tasks::FAILING_AFTER`] times in a row is reported by `/healthz`
//!   (`sidecar.failing`, status `degraded`) until one of its runs lasts [`STABLE_AFTER`].
//!
//! # Usage
//! ```ignore
//! let sup = Supervisor::new(Arc::clone(&health), stop.clone());
//! let reload = sup.spawn("reload", {
//!     let refresh = Arc::clone(&services.refresh);
//!     move || reload_loop(Arc::clone(&refresh), every, stop.clone())
//! });
//! ```
//! The factory builds everything a run needs (a run's state dies with it); what must outlive a
//! crash (queues, the spool's file, the admin listener's socket) is shared by the factory.
//!
//! # Error handling
//! A task's return after `stop` is its normal end. With the `fault-injection` feature a test
//! makes a task's next runs panic ([`shared_state::TaskHealth::inject_panics`]); without it
//! the hook is never consulted.

use std::{future::Future, panic::AssertUnwindSafe, sync::Arc, time::Duration};

use futures_util::FutureExt;
use shared_state::{Health, TaskHealth};
use tokio::{sync::watch, task::JoinHandle, time::Instant};

/// First restart delay.
pub const MIN_BACKOFF: Duration = Duration::from_millis(250);
/// Longest restart delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A run this long counts as stable: the backoff and the crash streak start over.
pub const STABLE_AFTER: Duration = Duration::from_secs(30);

/// The supervisor's delays (the constants above; shorter in unit tests).
#[derive(Debug, Clone, Copy)]
struct Timing {
    min_backoff: Duration,
    max_backoff: Duration,
    stable_after: Duration,
}

const TIMING: Timing = Timing {
    min_backoff: MIN_BACKOFF,
    max_backoff: MAX_BACKOFF,
    stable_after: STABLE_AFTER,
};

/// Spawns and restarts the sidecar's tasks (see the module docs).
#[derive(Clone)]
pub(crate) struct Supervisor {
    health: Arc<Health>,
    stop: watch::Receiver<bool>,
    timing: Timing,
}

// === impl Supervisor ===

impl Supervisor {
    pub fn new(health: Arc<Health>, stop: watch::Receiver<bool>) -> Self {
        Self {
            health,
            stop,
            timing: TIMING,
        }
    }

    /// Spawns task `name`, run by `make` and restarted until the sidecar stops. Aborting the
    /// returned handle ends the current run too (it runs inside the supervising task).
    pub fn spawn<F, Fut>(&self, name: &'static str, make: F) -> JoinHandle<()>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let slot = self.health.sidecar_tasks().register(name);
        tokio::spawn(supervise(slot, self.stop.clone(), self.timing, make))
    }
}

async fn supervise<F, Fut>(
    slot: Arc<TaskHealth>,
    mut stop: watch::Receiver<bool>,
    timing: Timing,
    mut make: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut backoff = timing.min_backoff;
    loop {
        let started = Instant::now();
        let run = AssertUnwindSafe(with_faults(Arc::clone(&slot), make())).catch_unwind();
        tokio::pin!(run);
        let stable = tokio::time::sleep(timing.stable_after);
        tokio::pin!(stable);
        let mut marked = false;
        let outcome = loop {
            tokio::select! {
                r = &mut run => break r,
                _ = &mut stable, if !marked => {
                    slot.ran_stable();
                    marked = true;
                }
            }
        };
        if *stop.borrow() {
            return;
        }
        if started.elapsed() >= timing.stable_after {
            backoff = timing.min_backoff;
        }
        slot.crashed(shared_state::now_ms());
        let reason = match &outcome {
            Ok(()) => "returned".to_owned(),
            Err(p) => format!("panicked: {}", panic_message(p.as_ref())),
        };
        tracing::error!(
            task = slot.name(),
            reason,
            restarts = slot.restarts(),
            failing = slot.is_failing(),
            backoff_ms = backoff.as_millis() as u64,
            "sidecar task failed; restarting it"
        );
        drop(outcome);
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        backoff = backoff.saturating_mul(2).min(timing.max_backoff);
    }
}

/// Runs `fut`; with the `fault-injection` feature, panics instead when a panic was injected
/// for this task (checked at the start and then every 50 ms).
async fn with_faults<Fut: Future<Output = ()>>(slot: Arc<TaskHealth>, fut: Fut) {
    if !crate::TEST_HOOKS {
        return fut.await;
    }
    let injected = async {
        loop {
            if slot.take_injected_panic() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        _ = fut => {}
        _ = injected => {
            #[allow(clippy::panic)]
            {
                panic!("injected fault in sidecar task {}", slot.name());
            }
        }
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(no message)".to_owned())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A task that panics twice and then returns once is restarted three times, counted, and
    /// runs again; stopping ends it without a restart.
    const FAST: Timing = Timing {
        min_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
        stable_after: Duration::from_millis(1500),
    };

    #[tokio::test]
    async fn panics_and_returns_are_restarted_and_counted() {
        let health = Arc::new(Health::default());
        let (stop_tx, stop) = watch::channel(false);
        let runs = Arc::new(AtomicU32::new(0));
        let sup = Supervisor {
            timing: FAST,
            ..Supervisor::new(Arc::clone(&health), stop.clone())
        };
        let h = sup.spawn("flaky", {
            let runs = Arc::clone(&runs);
            let stop = stop.clone();
            move || {
                let n = runs.fetch_add(1, Ordering::SeqCst);
                let mut stop = stop.clone();
                async move {
                    match n {
                        0 | 1 => std::panic::panic_any(format!("run {n} fails")),
                        2 => {}
                        _ => {
                            let _ = stop.wait_for(|s| *s).await;
                        }
                    }
                }
            }
        });
        let slot = health.sidecar_tasks().get("flaky").unwrap();
        // Polled, not slept: printing a panic's backtrace can stall this thread for a while.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while runs.load(Ordering::SeqCst) < 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "never ran a fourth time"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        assert_eq!(slot.restarts(), 3);
        assert!(slot.is_failing(), "three crashes in a row");
        tokio::time::sleep(FAST.stable_after + Duration::from_millis(200)).await;
        assert!(!slot.is_failing(), "a stable run clears it");
        stop_tx.send(true).unwrap();
        h.await.unwrap();
        assert_eq!(slot.restarts(), 3, "a return after stop is no crash");
    }

    /// Aborting the supervisor ends the run it supervises.
    #[tokio::test]
    async fn abort_ends_the_run() {
        let (_stop_tx, stop) = watch::channel(false);
        let sup = Supervisor::new(Arc::new(Health::default()), stop);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        let h = sup.spawn("holder", move || {
            let tx = tx.clone();
            async move {
                let _held = tx;
                std::future::pending::<()>().await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        h.abort();
        let _ = h.await;
        assert!(rx.recv().await.is_none(), "the run's state was dropped");
    }
}
