//! Low-latency mode: while the worker has traffic, it asks the kernel to keep idle CPUs in
//! shallow idle states (a PM QoS request through `/dev/cpu_dma_latency`), and drops the request
//! after a quiet period.
//!
//! Why: on a virtual machine an idle vCPU halts, and waking it for the next request (an IPI and a
//! VM entry) costs tens to hundreds of microseconds, several times the control plane's own work
//! per invocation (bench/RESULTS.md). The request is what latency-sensitive servers and the
//! `latency-performance` tuned profile do; holding it only while busy keeps an idle worker idle.

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The PM QoS device: the request holds while the file stays open.
const QOS_DEVICE: &str = "/dev/cpu_dma_latency";

pub struct LowLatency {
    enabled: bool,
    quiet_after: Duration,
    epoch: Instant,
    /// Milliseconds since `epoch` of the last invocation.
    last_activity_ms: AtomicU64,
    active: AtomicBool,
    held: parking_lot::Mutex<Option<File>>,
    warned: AtomicBool,
}

impl LowLatency {
    pub fn new(enabled: bool, quiet_after: Duration) -> Self {
        LowLatency {
            enabled,
            quiet_after,
            epoch: Instant::now(),
            last_activity_ms: AtomicU64::new(0),
            active: AtomicBool::new(false),
            held: parking_lot::Mutex::new(None),
            warned: AtomicBool::new(false),
        }
    }

    /// An invocation arrived: cheap (two atomics) unless the worker was quiet.
    pub fn on_activity(&self) {
        if !self.enabled {
            return;
        }
        self.last_activity_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        if !self.active.load(Ordering::Relaxed) && !self.active.swap(true, Ordering::AcqRel) {
            self.hold();
        }
    }

    /// Called periodically: drops the request after a quiet period.
    pub fn tick(&self) {
        if !self.active.load(Ordering::Acquire) {
            return;
        }
        let now = self.epoch.elapsed().as_millis() as u64;
        let last = self.last_activity_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= self.quiet_after.as_millis() as u64 {
            *self.held.lock() = None;
            self.active.store(false, Ordering::Release);
        }
    }

    /// Whether the request is held now.
    pub fn is_held(&self) -> bool {
        self.held.lock().is_some()
    }

    fn hold(&self) {
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .open(QOS_DEVICE)
            .and_then(|mut f| f.write_all(&0i32.to_ne_bytes()).map(|_| f));
        match opened {
            Ok(f) => *self.held.lock() = Some(f),
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        error = %e,
                        "low-latency mode unavailable ({QOS_DEVICE}); idle CPUs may wake slowly"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// The kernel's current CPU latency target, µs (reading the device gives it).
    fn kernel_target() -> Option<i32> {
        let mut b = [0u8; 4];
        File::open(QOS_DEVICE).ok()?.read_exact(&mut b).ok()?;
        Some(i32::from_ne_bytes(b))
    }

    #[test]
    fn the_request_is_held_while_busy_and_dropped_when_quiet() {
        let off = LowLatency::new(false, Duration::ZERO);
        off.on_activity();
        assert!(!off.is_held());
        let l = LowLatency::new(true, Duration::from_millis(100));
        l.on_activity();
        if kernel_target().is_none() {
            // Not root or no PM QoS device: the worker runs on without it.
            assert!(!l.is_held());
            return;
        }
        assert!(l.is_held());
        assert_eq!(kernel_target(), Some(0), "the kernel sees the request");
        l.tick();
        assert!(l.is_held(), "not quiet yet");
        std::thread::sleep(Duration::from_millis(150));
        l.tick();
        assert!(!l.is_held(), "released after the quiet period");
        l.on_activity();
        assert!(l.is_held(), "taken again with new traffic");
    }
}
