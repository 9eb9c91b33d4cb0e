//! The `sim` backend: no process. A sandbox costs the function's `sim_cold_ms` to start and each
//! invocation `sim_warm_ms`, spent sleeping, so one machine can emulate many busy workers while
//! the pool, accounting, API and metrics run exactly as with real sandboxes.
//!
//! The sleeps run on a timer thread of their own rather than tokio's timer wheel, whose 1 ms
//! ticks would lengthen every simulated execution by up to a millisecond (8 % of a 13 ms
//! function); this one wakes within tens of microseconds of the deadline.

use super::SandboxError;
use crate::agent_client::AgentReply;
use bytes::Bytes;
use hearth_api::FunctionSpec;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The constant result of a simulated invocation.
const SIM_RESULT: &[u8] = b"{\"simulated\":true}";

pub struct SimBackend {
    clock: SimClock,
}

pub struct SimSandbox {
    warm: Duration,
}

fn duration_ms(ms: f64) -> Duration {
    Duration::from_secs_f64(ms.max(0.0) / 1000.0)
}

impl Default for SimBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl SimBackend {
    pub fn new() -> Self {
        SimBackend {
            clock: SimClock::start(),
        }
    }

    pub async fn create(&self, spec: &FunctionSpec) -> Result<SimSandbox, SandboxError> {
        self.clock.sleep(duration_ms(spec.sim_cold_ms)).await;
        Ok(SimSandbox {
            warm: duration_ms(spec.sim_warm_ms),
        })
    }

    pub async fn invoke(&self, sb: &mut SimSandbox) -> AgentReply {
        let start = Instant::now();
        self.clock.sleep(sb.warm).await;
        AgentReply {
            status: 200,
            exec_us: Some(start.elapsed().as_micros() as u64),
            device_memory_bytes: None,
            body: Bytes::from_static(SIM_RESULT),
        }
    }
}

type Timer = (Reverse<(Instant, u64)>, TimerSlot);

/// A oneshot in a heap entry (ordering only looks at the deadline and sequence number).
struct TimerSlot(oneshot::Sender<()>);

impl PartialEq for TimerSlot {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for TimerSlot {}
impl PartialOrd for TimerSlot {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for TimerSlot {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// A precise sleep service: one thread, a heap of deadlines (also the simulated GPUs').
pub(crate) struct SimClock {
    tx: mpsc::Sender<(Instant, oneshot::Sender<()>)>,
}

impl SimClock {
    pub(crate) fn start() -> Self {
        let (tx, rx) = mpsc::channel::<(Instant, oneshot::Sender<()>)>();
        let spawned = std::thread::Builder::new()
            .name("hearth-sim-clock".into())
            .spawn(move || run_clock(rx));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the sim clock thread; sleeps end at once");
        }
        SimClock { tx }
    }

    pub(crate) async fn sleep(&self, d: Duration) {
        if d.is_zero() {
            return;
        }
        let (done_tx, done_rx) = oneshot::channel();
        if self.tx.send((Instant::now() + d, done_tx)).is_err() {
            // No clock thread: fall back on tokio's timer rather than not sleeping.
            tokio::time::sleep(d).await;
            return;
        }
        let _ = done_rx.await;
    }
}

fn run_clock(rx: mpsc::Receiver<(Instant, oneshot::Sender<()>)>) {
    // The default 50 µs timer slack would be added to every wake-up.
    // SAFETY: PR_SET_TIMERSLACK takes an integer and affects only the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
    let mut heap: BinaryHeap<Timer> = BinaryHeap::new();
    let mut seq = 0u64;
    loop {
        let now = Instant::now();
        while let Some((Reverse((at, _)), _)) = heap.peek() {
            if *at > now {
                break;
            }
            if let Some((_, TimerSlot(tx))) = heap.pop() {
                let _ = tx.send(());
            }
        }
        let next = match heap.peek() {
            Some((Reverse((at, _)), _)) => rx.recv_timeout(at.saturating_duration_since(now)),
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match next {
            Ok((at, tx)) => {
                seq += 1;
                heap.push((Reverse((at, seq)), TimerSlot(tx)));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sleeps_never_end_early_and_end_in_deadline_order() {
        let b = SimBackend::new();
        let mut spec = FunctionSpec::new("f");
        spec.sim_warm_ms = 13.0;
        let mut sb = b.create(&spec).await.unwrap();
        let r = b.invoke(&mut sb).await;
        let exec = r.exec_us.unwrap();
        assert!(exec >= 13_000, "never early: {exec}");
        let clock = &b.clock;
        let (a, c) = tokio::join!(
            async {
                clock.sleep(Duration::from_millis(30)).await;
                Instant::now()
            },
            async {
                clock.sleep(Duration::from_millis(10)).await;
                Instant::now()
            }
        );
        assert!(c < a, "the shorter sleep ends first");
    }
}
