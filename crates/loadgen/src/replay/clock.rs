//! Waiting for a scheduled instant with microsecond precision. Tokio's timers tick in whole
//! milliseconds, so the dispatcher is a plain thread: it sleeps with the kernel's timer slack
//! set to 1 ns and spins through the last few microseconds.

use std::time::{Duration, Instant};

/// The last stretch before a deadline is spun rather than slept: a wake-up can be this late.
const SPIN: Duration = Duration::from_micros(20);

/// Asks the kernel to wake this thread's sleeps on time (the default slack is 50 µs).
pub fn precise_timers_for_this_thread() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and affects only the calling thread.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    if rc != 0 {
        tracing::debug!(
            "PR_SET_TIMERSLACK failed: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Returns at `deadline` (or at once if it has passed).
pub fn sleep_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > SPIN {
            std::thread::sleep(left - SPIN);
        } else {
            std::hint::spin_loop();
        }
    }
}
