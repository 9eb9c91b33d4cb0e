//! The enforcer thread: boosts a sandbox when an invocation begins, demotes it when the
//! invocation has used its slice of CPU time or ends, measures each invocation's CPU time, and
//! ticks the policy source. Every cgroup read and write of the CPU scheduling happens here, on
//! a dedicated OS thread, never on the async threads.

use super::cgroup::Writes;
use super::{InvocationCpu, Msg, Policies, PolicySource, SandboxCpu, MIN_POLL, TICK};
use crate::metrics::{FnLabel, Metrics};
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Functions not seen for this many ticks are no longer republished.
const FORGET_AFTER_TICKS: u64 = 600;
/// The most functions whose policies are published; more get the default policy.
const MAX_KNOWN_FUNCTIONS: usize = 65_536;

pub(super) struct Enforcer {
    source: Box<dyn PolicySource>,
    policies: Policies,
    metrics: Arc<Metrics>,
    epoch: Instant,
    cpus: u32,
    active: HashMap<u64, Active>,
    /// Function → the tick it was last seen in.
    known: HashMap<String, u64>,
    ticks: u64,
    next_tick: Instant,
    last_stat: Option<CpuTimes>,
}

/// An invocation running on a sandbox.
struct Active {
    sandbox: Arc<SandboxCpu>,
    /// `cpuacct.usage` when it began (None: unreadable, the cgroup is gone).
    start_ns: Option<u64>,
    slice_ns: u64,
    parallel: u32,
    /// When to read its CPU time next; None once demoted (or never boosted).
    next_check: Option<Instant>,
}

impl Enforcer {
    pub(super) fn new(
        source: Box<dyn PolicySource>,
        policies: Policies,
        metrics: Arc<Metrics>,
        epoch: Instant,
        cpus: u32,
    ) -> Enforcer {
        Enforcer {
            source,
            policies,
            metrics,
            epoch,
            cpus: cpus.max(1),
            active: HashMap::new(),
            known: HashMap::new(),
            ticks: 0,
            next_tick: Instant::now() + TICK,
            last_stat: read_cpu_times(),
        }
    }

    pub(super) fn run(mut self, rx: Receiver<Msg>) {
        loop {
            let wake = self
                .active
                .values()
                .filter_map(|a| a.next_check)
                .fold(self.next_tick, Instant::min);
            match rx.recv_timeout(wake.saturating_duration_since(Instant::now())) {
                Ok(msg) => self.handle(msg),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    // The worker is going: leave nothing boosted.
                    for (_, a) in self.active.drain() {
                        let _ = a.sandbox.demote();
                    }
                    return;
                }
            }
            let now = Instant::now();
            self.check_slices(now);
            if now >= self.next_tick {
                self.tick(now);
            }
        }
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Begin {
                id,
                sandbox,
                policy,
                parallel,
            } => self.begin(id, sandbox, policy, parallel),
            Msg::End {
                id,
                function,
                arrival_us,
                end_us,
            } => self.end(id, function, arrival_us, end_us),
        }
    }

    fn count_writes(&self, w: Writes) {
        self.metrics.cpu_sched_writes.inc_by(u64::from(w.0));
    }

    fn begin(
        &mut self,
        id: u64,
        sandbox: Arc<SandboxCpu>,
        policy: super::CpuPolicy,
        parallel: u32,
    ) {
        sandbox.claim(id);
        let start_ns = self.read(&sandbox);
        let slice_ns = policy.slice_us.saturating_mul(1000);
        let parallel = parallel.clamp(1, self.cpus);
        let mut next_check = None;
        if slice_ns > 0 && start_ns.is_some() {
            match sandbox.boost(policy.shares()) {
                Ok(w) => {
                    self.count_writes(w);
                    self.metrics.cpu_sched_boosts.inc();
                    next_check = Some(Instant::now() + wait_for(slice_ns, parallel));
                }
                Err(e) => tracing::debug!(error = %e, "boosting a sandbox failed"),
            }
        } else {
            self.demote(&sandbox);
        }
        self.active.insert(
            id,
            Active {
                sandbox,
                start_ns,
                slice_ns,
                parallel,
                next_check,
            },
        );
    }

    fn end(&mut self, id: u64, function: String, arrival_us: u64, end_us: u64) {
        let Some(a) = self.active.remove(&id) else {
            return;
        };
        let cpu_ns = match (a.start_ns, self.read(&a.sandbox)) {
            (Some(start), Some(now)) => Some(now.saturating_sub(start)),
            _ => None,
        };
        // Unless another invocation has the sandbox already (never expected: the invocation
        // path ends a boost before it hands the sandbox back).
        if a.sandbox.owned_by(id) {
            self.demote(&a.sandbox);
        }
        let Some(cpu_ns) = cpu_ns else { return };
        let done = InvocationCpu {
            function,
            arrival_us,
            end_us,
            cpu_us: cpu_ns / 1000,
        };
        self.metrics
            .invocation_cpu
            .get_or_create(&FnLabel {
                function: done.function.clone(),
            })
            .observe(cpu_ns as f64 / 1e9);
        self.source.completed(&done);
        let ticks = self.ticks;
        if let Some(seen) = self.known.get_mut(&done.function) {
            *seen = ticks;
        } else if self.known.len() < MAX_KNOWN_FUNCTIONS {
            self.known.insert(done.function, ticks);
        }
    }

    fn read(&self, sandbox: &SandboxCpu) -> Option<u64> {
        self.metrics.cpu_sched_reads.inc();
        match sandbox.usage_ns() {
            Ok(ns) => Some(ns),
            Err(e) => {
                tracing::debug!(error = %e, "reading a sandbox's CPU time failed");
                None
            }
        }
    }

    fn demote(&self, sandbox: &SandboxCpu) {
        match sandbox.demote() {
            Ok(w) => self.count_writes(w),
            Err(e) => tracing::debug!(error = %e, "demoting a sandbox failed"),
        }
    }

    /// Reads the CPU time of every invocation whose check is due; demotes those past their
    /// slice and schedules the next read of the others.
    fn check_slices(&mut self, now: Instant) {
        let due: Vec<u64> = self
            .active
            .iter()
            .filter(|(_, a)| a.next_check.is_some_and(|t| t <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some(a) = self.active.get(&id) else {
                continue;
            };
            let used = match (a.start_ns, self.read(&a.sandbox)) {
                (Some(start), Some(u)) => Some(u.saturating_sub(start)),
                _ => None,
            };
            let (slice_ns, parallel) = (a.slice_ns, a.parallel);
            let next = match used {
                Some(used) if used < slice_ns => {
                    Some(Instant::now() + wait_for(slice_ns - used, parallel))
                }
                Some(used) => {
                    let sandbox = Arc::clone(&a.sandbox);
                    self.demote(&sandbox);
                    self.metrics.cpu_sched_expired.inc();
                    self.metrics
                        .cpu_slice_overshoot
                        .observe((used - slice_ns) as f64 / 1e9);
                    None
                }
                None => None,
            };
            if let Some(a) = self.active.get_mut(&id) {
                a.next_check = next;
            }
        }
    }

    /// Ticks the source with the host's utilization and republishes the known functions'
    /// policies.
    fn tick(&mut self, now: Instant) {
        let times = read_cpu_times();
        let utilization = match (&self.last_stat, &times) {
            (Some(a), Some(b)) => b.utilization_since(a),
            _ => 0.0,
        };
        self.last_stat = times;
        let now_us = now.saturating_duration_since(self.epoch).as_micros() as u64;
        self.source.tick(now_us, utilization);
        let ticks = self.ticks;
        self.known
            .retain(|_, seen| ticks.saturating_sub(*seen) <= FORGET_AFTER_TICKS);
        let published: HashMap<String, super::CpuPolicy> = self
            .known
            .keys()
            .map(|f| (f.clone(), self.source.policy_for(f).clamped()))
            .collect();
        *self.policies.write() = published;
        self.ticks += 1;
        self.next_tick = now + TICK;
    }
}

/// How long a sandbox that may use `parallel` CPUs at once cannot possibly use `left_ns` of CPU
/// time in: the wait before its next read, never shorter than [`MIN_POLL`].
fn wait_for(left_ns: u64, parallel: u32) -> Duration {
    Duration::from_nanos(left_ns / u64::from(parallel.max(1))).max(MIN_POLL)
}

/// The host's CPU time counters (the first line of /proc/stat), in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CpuTimes {
    busy: u64,
    total: u64,
}

impl CpuTimes {
    /// `cpu  user nice system idle iowait irq softirq steal ...`: idle and iowait are not busy.
    fn parse(stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().next()?;
        let mut it = line.split_whitespace();
        if it.next()? != "cpu" {
            return None;
        }
        let v: Vec<u64> = it.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
        if v.len() < 5 {
            return None;
        }
        let total: u64 = v.iter().sum();
        let idle = v[3] + v[4];
        Some(CpuTimes {
            busy: total - idle,
            total,
        })
    }

    /// Percent of CPU time busy between `earlier` and `self`.
    fn utilization_since(&self, earlier: &CpuTimes) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 {
            return 0.0;
        }
        let busy = self.busy.saturating_sub(earlier.busy);
        (busy as f64 * 100.0 / total as f64).clamp(0.0, 100.0)
    }
}

fn read_cpu_times() -> Option<CpuTimes> {
    CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_before_a_read_cannot_overshoot_the_slice() {
        // 40 ms left on 2 CPUs: 20 ms of wall time cannot use more than 40 ms of CPU.
        assert_eq!(wait_for(40_000_000, 2), Duration::from_millis(20));
        assert_eq!(wait_for(40_000_000, 1), Duration::from_millis(40));
        // Never closer than MIN_POLL; a bad parallelism is read as 1.
        assert_eq!(wait_for(10, 4), MIN_POLL);
        assert_eq!(wait_for(5_000_000, 0), Duration::from_millis(5));
    }

    #[test]
    fn utilization_comes_from_the_busy_share_of_proc_stat() {
        let a = CpuTimes::parse("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n").unwrap();
        assert_eq!(
            a,
            CpuTimes {
                busy: 200,
                total: 1000
            }
        );
        let b = CpuTimes::parse("cpu  400 0 100 800 100 0 0 0 0 0\n").unwrap();
        assert_eq!(b.utilization_since(&a), 75.0);
        assert_eq!(a.utilization_since(&a), 0.0);
        assert!(CpuTimes::parse("intr 1 2 3\n").is_none());
        assert!(CpuTimes::parse("cpu  1 x 3 4 5\n").is_none());
        assert!(read_cpu_times().is_some(), "this host has /proc/stat");
    }
}
