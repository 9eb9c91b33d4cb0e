//! Freezing idle sandboxes (cgroup v1 freezer), so that nothing a handler leaves behind
//! (processes, threads, signal handlers in the agent) runs while its sandbox is idle.
//!
//! A sandbox is frozen once it has been idle for `idle_freeze` and thawed when its next
//! invocation begins. Freezing lazily rather than after every invocation matters: writing
//! `FROZEN` and `THAWED` wakes every task of the sandbox twice, which cost a fifth of the
//! no-op throughput on a 2-CPU machine (bench/RESULTS.md). A sandbox in steady use is never
//! frozen; one that goes idle is frozen within `idle_freeze` (plus half of it, the sweep period).
//! `idle_freeze` 0 freezes right after every invocation.

use parking_lot::Mutex;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// One sandbox's freezer, kept open: freezing and thawing are one `pwrite` each.
pub struct Freezer {
    file: std::fs::File,
    state: Mutex<State>,
}

struct State {
    frozen: bool,
    /// Since when no invocation runs; None while one does.
    idle_since: Option<Instant>,
}

impl Freezer {
    /// Opens `freezer.state` and freezes the sandbox (nothing its import started runs before
    /// its first invocation).
    pub fn open_frozen(state_file: &std::path::Path) -> std::io::Result<Arc<Freezer>> {
        let file = std::fs::OpenOptions::new().write(true).open(state_file)?;
        let f = Freezer {
            file,
            state: Mutex::new(State {
                frozen: false,
                idle_since: None,
            }),
        };
        f.write(true)?;
        f.state.lock().frozen = true;
        Ok(Arc::new(f))
    }

    /// Stops (`true`) or resumes every task of the sandbox; each stops at its next kernel entry.
    fn write(&self, frozen: bool) -> std::io::Result<()> {
        let state: &[u8] = if frozen { b"FROZEN" } else { b"THAWED" };
        self.file.write_all_at(state, 0)
    }

    /// Before an invocation: busy from now, thawed if it was frozen.
    pub fn begin(&self) -> std::io::Result<()> {
        let mut s = self.state.lock();
        s.idle_since = None;
        if s.frozen {
            self.write(false)?;
            s.frozen = false;
        }
        Ok(())
    }

    /// After an invocation: idle from `now`.
    fn end(&self, now: Instant) {
        self.state.lock().idle_since = Some(now);
    }

    /// Freezes it if idle for `after` at `now`; whether it is idle and still running.
    fn sweep(&self, now: Instant, after: Duration) -> bool {
        let mut s = self.state.lock();
        match s.idle_since {
            Some(t) if !s.frozen => {
                if now.saturating_duration_since(t) < after {
                    return true;
                }
                match self.write(true) {
                    Ok(()) => s.frozen = true,
                    // The sandbox is gone (its cgroup with it); its owner finds out.
                    Err(e) => tracing::debug!(error = %e, "freezing an idle sandbox failed"),
                }
                false
            }
            _ => false,
        }
    }
}

/// Every sandbox's freezer, and the task that freezes the idle ones.
pub struct IdleFreezer {
    after: Duration,
    sandboxes: Mutex<Vec<Weak<Freezer>>>,
    wake: Arc<Notify>,
}

impl IdleFreezer {
    /// Starts the sweeping task (on the current tokio runtime); it ends with the returned value.
    pub fn start(after: Duration) -> Arc<IdleFreezer> {
        let wake = Arc::new(Notify::new());
        let me = Arc::new(IdleFreezer {
            after,
            sandboxes: Mutex::new(Vec::new()),
            wake: Arc::clone(&wake),
        });
        if !after.is_zero() {
            tokio::spawn(sweep_loop(Arc::downgrade(&me), wake, after));
        }
        me
    }

    pub fn track(&self, f: &Arc<Freezer>) {
        self.sandboxes.lock().push(Arc::downgrade(f));
    }

    /// After an invocation on `f`: frozen at once with `idle_freeze` 0, else by the sweeper.
    pub fn invocation_ended(&self, f: &Freezer) -> std::io::Result<()> {
        if self.after.is_zero() {
            let mut s = f.state.lock();
            f.write(true)?;
            s.frozen = true;
            return Ok(());
        }
        f.end(Instant::now());
        self.wake.notify_one();
        Ok(())
    }

    /// Freezes the sandboxes idle long enough; forgets destroyed ones. Whether some idle one is
    /// still running (so another sweep is due).
    fn sweep(&self, now: Instant) -> bool {
        let mut pending = false;
        self.sandboxes.lock().retain(|w| match w.upgrade() {
            Some(f) => {
                pending |= f.sweep(now, self.after);
                true
            }
            None => false,
        });
        pending
    }
}

/// Sleeps until an invocation ends, then sweeps every half period while an idle sandbox is
/// still running: one wake-up per half period at most, none while nothing happens.
async fn sweep_loop(reg: Weak<IdleFreezer>, wake: Arc<Notify>, after: Duration) {
    loop {
        let pending = match reg.upgrade() {
            Some(r) => r.sweep(Instant::now()),
            None => return,
        };
        if pending {
            tokio::time::sleep(after / 2).await;
        } else {
            wake.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn freezer(dir: &std::path::Path) -> Arc<Freezer> {
        let path = dir.join("freezer.state");
        std::fs::write(&path, "").unwrap();
        Freezer::open_frozen(&path).unwrap()
    }

    fn written(dir: &std::path::Path) -> String {
        std::fs::read_to_string(dir.join("freezer.state")).unwrap()
    }

    #[test]
    fn an_idle_sandbox_is_frozen_only_after_the_idle_period_and_thawed_on_the_next_call() {
        let dir = tempfile::tempdir().unwrap();
        let f = freezer(dir.path());
        assert_eq!(written(dir.path()), "FROZEN");
        f.begin().unwrap();
        assert_eq!(written(dir.path()), "THAWED");
        let t0 = Instant::now();
        f.end(t0);
        let after = Duration::from_millis(20);
        assert!(
            f.sweep(t0 + Duration::from_millis(5), after),
            "still pending"
        );
        assert_eq!(written(dir.path()), "THAWED");
        assert!(!f.sweep(t0 + after, after));
        assert_eq!(written(dir.path()), "FROZEN");
        // A busy sandbox is never frozen by a sweep.
        f.begin().unwrap();
        assert_eq!(written(dir.path()), "THAWED");
        assert!(!f.sweep(t0 + Duration::from_secs(60), after));
        assert_eq!(written(dir.path()), "THAWED");
    }

    #[tokio::test]
    async fn the_sweeper_freezes_idle_sandboxes_and_zero_freezes_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let f = freezer(dir.path());
        let reg = IdleFreezer::start(Duration::from_millis(10));
        reg.track(&f);
        f.begin().unwrap();
        reg.invocation_ended(&f).unwrap();
        assert_eq!(written(dir.path()), "THAWED");
        for _ in 0..200 {
            if written(dir.path()) == "FROZEN" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(written(dir.path()), "FROZEN");
        let eager = IdleFreezer::start(Duration::ZERO);
        f.begin().unwrap();
        eager.invocation_ended(&f).unwrap();
        assert_eq!(written(dir.path()), "FROZEN");
    }
}
