//! Counts the invocations in flight, so that a graceful shutdown can wait for them (the worker's
//! and the controller's). Entering and leaving cost one atomic add and one atomic sub: it sits on
//! the invocation hot path.

use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Notify;

/// The number of invocations in flight, and a wake-up when it drops to zero.
#[derive(Debug, Default)]
pub struct InFlightTracker {
    count: AtomicUsize,
    idle: Notify,
}

impl InFlightTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one invocation in flight until the guard is dropped.
    #[inline]
    pub fn enter(&self) -> InFlightGuard<'_> {
        self.count.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(self)
    }

    /// Invocations in flight now.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Waits until no invocation is in flight; false if `deadline` came first.
    pub async fn wait_idle(&self, deadline: tokio::time::Instant) -> bool {
        while self.count() > 0 {
            // Registered before the second look, so a drop to zero in between still wakes it.
            let notified = self.idle.notified();
            if self.count() == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
        true
    }
}

/// One invocation in flight; dropping it ends it.
#[derive(Debug)]
#[must_use = "the invocation counts as in flight only while the guard lives"]
pub struct InFlightGuard<'a>(&'a InFlightTracker);

impl Drop for InFlightGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn waits_for_the_last_guard() {
        let t = Arc::new(InFlightTracker::new());
        let (a, b) = (t.enter(), t.enter());
        assert_eq!(t.count(), 2);
        drop(a);
        assert_eq!(t.count(), 1);
        let t2 = Arc::clone(&t);
        let waiter = tokio::spawn(async move {
            t2.wait_idle(tokio::time::Instant::now() + Duration::from_secs(10))
                .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(b);
        assert!(waiter.await.unwrap());
        assert_eq!(t.count(), 0);
    }

    #[tokio::test]
    async fn gives_up_at_the_deadline() {
        let t = InFlightTracker::new();
        assert!(
            t.wait_idle(tokio::time::Instant::now()).await,
            "idle at once"
        );
        let _g = t.enter();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(20);
        assert!(!t.wait_idle(deadline).await);
        assert_eq!(t.count(), 1);
    }
}
