//! CPU scheduling of sandboxes from user space (ALPS's backend, SFS's baseline), on a kernel with
//! neither sched_ext nor ALPS's eBPF hooks. docs/alps-backend.md has the measurements.
//!
//! Mechanism: each sandbox has its own `cpu` cgroup under `/hearth/<worker>`. While an
//! invocation is within its slice of CPU time its cgroup is a normal group with `cpu.shares`
//! from its rank; otherwise (slice used up, or between invocations) it is `cpu.idle`, which the
//! kernel schedules only when no non-idle sibling wants the CPU and preempts at once when one
//! wakes. That is SFS's two levels (first level ahead, then demoted to a fair share) and
//! ALPS's rank and slice, with three properties a per-task real-time priority lacks:
//! * a sandbox's tasks cannot escape it: forks stay in the cgroup, and the cgroup files are
//!   read-only inside;
//! * the whole sandbox tree weighs as one group (`/hearth`, 1024 shares) against the worker,
//!   the controller and everything else at the root, so no sandbox, boosted or not, can starve
//!   them, and nothing needs undoing if the worker dies (a restart removes the old cgroups);
//! * no task ever gets a real-time policy (sandbox cgroups keep `cpu.rt_runtime_us` 0, so the
//!   kernel refuses one to a sandbox even if asked).
//!
//! Slice expiry: the enforcer thread reads the sandbox's `cpuacct.usage`. A sandbox can use at
//! most `p` CPUs at once (its quota, or the host's CPUs), so after reading `used` it sleeps
//! `(slice − used) / p` of wall time, which cannot overshoot; a handful of reads per slice
//! (never closer than [`MIN_POLL`]) instead of polling at a fixed fine interval.
//!
//! With `cpu_sched = cfs` none of this exists: no thread, no message, no syscall.

pub mod cgroup;
mod enforcer;
pub mod policy;

pub use cgroup::SandboxCpu;
pub use policy::{CpuPolicy, FixedSlice, InvocationCpu, LearnedSlices, PolicySource};

use crate::metrics::Metrics;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// How often the policy source is ticked and its policies republished.
pub const TICK: Duration = Duration::from_secs(1);
/// The closest two reads of one sandbox's CPU time: a demotion is late by at most this much
/// wall time times the sandbox's CPUs.
pub const MIN_POLL: Duration = Duration::from_millis(1);
/// SFS's slice when none is configured (`sfs_slice_ms`).
pub const DEFAULT_SFS_SLICE_MS: u64 = 50;

/// The worker's CPU scheduling of sandboxes: the core's names (`cfs`, `sfs`, `alps`).
pub use hearth_core::cpu_sched::CpuSchedKind;

/// The policy source for `kind` (None for `cfs`: nothing to enforce).
pub fn source_for(
    kind: CpuSchedKind,
    sfs_slice_ms: u64,
    cpus: u32,
) -> Result<Option<Box<dyn PolicySource>>, CpuSchedError> {
    let slice_us = sfs_slice_ms.saturating_mul(1000);
    Ok(match kind {
        CpuSchedKind::Cfs => None,
        CpuSchedKind::Sfs => Some(Box::new(FixedSlice { slice_us })),
        // The core's learning frontend (hearth_core::cpu_sched::Alps, docs/alps.md) with its
        // default settings (W = 5 s, α = 2, β = 1, γ = 1, θ = 50 %).
        CpuSchedKind::Alps => Some(Box::new(LearnedSlices::new(cpus)?)),
    })
}

/// What the invocation path sends the enforcer thread.
enum Msg {
    Begin {
        id: u64,
        sandbox: Arc<SandboxCpu>,
        policy: CpuPolicy,
        /// The most CPUs the sandbox's tasks can use at once.
        parallel: u32,
    },
    End {
        id: u64,
        function: String,
        arrival_us: u64,
        end_us: u64,
    },
}

/// The published policies: function → policy, replaced by the enforcer after each tick.
type Policies = Arc<RwLock<HashMap<String, CpuPolicy>>>;

/// The handle the invocation path uses; the enforcer thread does the work. Dropping the last
/// handle ends the thread.
pub struct CpuScheduler {
    kind: CpuSchedKind,
    tx: mpsc::Sender<Msg>,
    policies: Policies,
    /// The policy of a function the source has not spoken for yet.
    default: CpuPolicy,
    epoch: Instant,
    next_id: AtomicU64,
    cpus: u32,
}

/// Errors of [`CpuScheduler::start`].
#[derive(Debug, thiserror::Error)]
pub enum CpuSchedError {
    #[error("cpu_sched alps: {0}")]
    Frontend(#[from] hearth_core::cpu_sched::CpuSchedError),
    #[error("starting the CPU scheduler thread: {0}")]
    Thread(std::io::Error),
    #[error(
        "cpu_sched {0} needs cgroup v1 `cpu` with cpu.idle (Linux 5.15 or later) and `cpuacct` \
         mounted under /sys/fs/cgroup; use cpu_sched = \"cfs\""
    )]
    Unsupported(CpuSchedKind),
}

impl CpuScheduler {
    /// Starts the enforcer thread for `kind`; None for `cfs`.
    pub fn start(
        kind: CpuSchedKind,
        sfs_slice_ms: u64,
        cpus: u32,
        metrics: Arc<Metrics>,
    ) -> Result<Option<Arc<CpuScheduler>>, CpuSchedError> {
        let Some(mut source) = source_for(kind, sfs_slice_ms, cpus)? else {
            return Ok(None);
        };
        if !cgroup::host_supported() {
            return Err(CpuSchedError::Unsupported(kind));
        }
        let default = source.policy_for("").clamped();
        Self::start_with(kind, source, default, metrics, cpus).map(Some)
    }

    /// Starts the enforcer thread with any source (tests, other frontends).
    pub fn start_with(
        kind: CpuSchedKind,
        source: Box<dyn PolicySource>,
        default: CpuPolicy,
        metrics: Arc<Metrics>,
        cpus: u32,
    ) -> Result<Arc<CpuScheduler>, CpuSchedError> {
        let (tx, rx) = mpsc::channel();
        let policies: Policies = Arc::default();
        let epoch = Instant::now();
        let e = enforcer::Enforcer::new(source, Arc::clone(&policies), metrics, epoch, cpus);
        std::thread::Builder::new()
            .name("hearth-cpu-sched".into())
            .spawn(move || e.run(rx))
            .map_err(CpuSchedError::Thread)?;
        Ok(Arc::new(CpuScheduler {
            kind,
            tx,
            policies,
            default: default.clamped(),
            epoch,
            next_id: AtomicU64::new(0),
            cpus,
        }))
    }

    pub fn kind(&self) -> CpuSchedKind {
        self.kind
    }

    /// Microseconds since the scheduler started: the clock of [`InvocationCpu`] and `tick`.
    fn micros(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_micros() as u64
    }

    /// The policy an invocation of `function` gets now.
    pub fn policy_for(&self, function: &str) -> CpuPolicy {
        self.policies
            .read()
            .get(function)
            .copied()
            .unwrap_or(self.default)
    }

    /// An invocation of `function` (arrived at `arrival`, limited to `cpus` CPUs; 0: no quota)
    /// starts on `sandbox`. The boost is applied by the enforcer thread moments later; the
    /// returned guard ends it (and accounts the invocation's CPU time) when dropped.
    pub fn begin(
        self: &Arc<Self>,
        sandbox: Arc<SandboxCpu>,
        function: &str,
        cpus: f64,
        arrival: Instant,
    ) -> Boost {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let policy = self.policy_for(function);
        let parallel = if cpus > 0.0 && cpus.is_finite() {
            (cpus.ceil() as u32).clamp(1, self.cpus)
        } else {
            self.cpus
        };
        self.send(Msg::Begin {
            id,
            sandbox,
            policy,
            parallel,
        });
        Boost {
            sched: Arc::clone(self),
            id,
            function: function.to_string(),
            arrival_us: self.micros(arrival),
        }
    }

    fn send(&self, msg: Msg) {
        // The thread ends only when the last handle goes, so a failed send is never expected.
        if self.tx.send(msg).is_err() {
            tracing::warn!("the CPU scheduler thread is gone");
        }
    }
}

/// One invocation's boost; dropping it ends the boost (the sandbox is demoted if still in its
/// slice) and has its CPU time measured and handed to the policy source. Every exit of the
/// invocation path (answer, error, timeout, cancelled request) drops it.
#[must_use = "the boost ends when this is dropped"]
pub struct Boost {
    sched: Arc<CpuScheduler>,
    id: u64,
    function: String,
    arrival_us: u64,
}

impl Drop for Boost {
    fn drop(&mut self) {
        let end_us = self.sched.micros(Instant::now());
        self.sched.send(Msg::End {
            id: self.id,
            function: std::mem::take(&mut self.function),
            arrival_us: self.arrival_us,
            end_us,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::oci::cgroup_v1_dir;
    use std::sync::Mutex;

    /// A source that has learned one function ("hot": first rank, a 200 ms slice, long enough
    /// for the test to see it boosted on a loaded machine) and records
    /// what the enforcer hands it.
    struct Recording {
        done: Arc<Mutex<Vec<InvocationCpu>>>,
        ticks: Arc<Mutex<Vec<f64>>>,
    }

    impl PolicySource for Recording {
        fn policy_for(&mut self, function: &str) -> CpuPolicy {
            match function {
                "hot" => CpuPolicy {
                    rank: 100,
                    slice_us: 200_000,
                },
                _ => CpuPolicy {
                    rank: CpuPolicy::NEUTRAL_RANK,
                    slice_us: 50_000,
                },
            }
        }
        fn completed(&mut self, done: &InvocationCpu) {
            self.done.lock().unwrap().push(done.clone());
        }
        fn tick(&mut self, _now_us: u64, utilization_pct: f64) {
            self.ticks.lock().unwrap().push(utilization_pct);
        }
    }

    fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out: {what}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn read(ctl: &str, path: &str, file: &str) -> String {
        std::fs::read_to_string(cgroup_v1_dir(ctl, path).join(file))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    #[test]
    fn a_source_learns_from_completions_and_its_published_policy_is_enforced() {
        let root = unsafe { libc::geteuid() } == 0;
        if !root || !std::path::Path::new("/sys/fs/cgroup/cpu/cpu.idle").exists() {
            eprintln!("skipping: needs root and cgroup v1 `cpu` with cpu.idle");
            return;
        }
        let path = format!("/hearth-cpu-sched-unit-{}", std::process::id());
        for ctl in ["cpu", "cpuacct"] {
            std::fs::create_dir_all(cgroup_v1_dir(ctl, &path)).unwrap();
        }
        // A process that spins forever, in the cgroup; killed and the cgroup removed on every
        // way out of the test.
        struct Spinner(std::process::Child, String);
        impl Drop for Spinner {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
                for ctl in ["cpu", "cpuacct"] {
                    let _ = std::fs::remove_dir(cgroup_v1_dir(ctl, &self.1));
                }
            }
        }
        let spinner = Spinner(
            std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .current_dir("/")
                .spawn()
                .unwrap(),
            path.clone(),
        );
        for ctl in ["cpu", "cpuacct"] {
            std::fs::write(
                cgroup_v1_dir(ctl, &path).join("cgroup.procs"),
                spinner.0.id().to_string(),
            )
            .unwrap();
        }
        let done = Arc::new(Mutex::new(Vec::new()));
        let ticks = Arc::new(Mutex::new(Vec::new()));
        let source = Recording {
            done: Arc::clone(&done),
            ticks: Arc::clone(&ticks),
        };
        let default = CpuPolicy {
            rank: CpuPolicy::NEUTRAL_RANK,
            slice_us: 50_000,
        };
        let metrics = Arc::new(Metrics::default());
        let sched =
            CpuScheduler::start_with(CpuSchedKind::Alps, Box::new(source), default, metrics, 2)
                .unwrap();
        let cpu = Arc::new(SandboxCpu::new(&path));
        // Not yet published: the default.
        assert_eq!(sched.policy_for("hot"), default);
        let boost = sched.begin(Arc::clone(&cpu), "hot", 1.0, Instant::now());
        wait_until("boosted", || read("cpu", &path, "cpu.idle") == "0");
        std::thread::sleep(Duration::from_millis(20));
        drop(boost);
        wait_until("the completion reaches the source", || {
            !done.lock().unwrap().is_empty()
        });
        {
            let d = done.lock().unwrap();
            assert_eq!(d[0].function, "hot");
            assert!(
                d[0].cpu_us > 0 && d[0].end_us >= d[0].arrival_us,
                "{:?}",
                d[0]
            );
        }
        assert_eq!(read("cpu", &path, "cpu.idle"), "1", "demoted when it ended");
        // After a tick the learned policy is what invocations get.
        wait_until("published", || sched.policy_for("hot").rank == 100);
        assert!(!ticks.lock().unwrap().is_empty());
        assert_eq!(sched.policy_for("cold").slice_us, 50_000);
        let boost = sched.begin(Arc::clone(&cpu), "hot", 1.0, Instant::now());
        wait_until("boosted at the first rank", || {
            read("cpu", &path, "cpu.idle") == "0" && read("cpu", &path, "cpu.shares") == "120208"
        });
        // The spinner uses its 200 ms slice and is demoted while still running.
        wait_until("demoted after its slice", || {
            read("cpu", &path, "cpu.idle") == "1"
        });
        drop(boost);
        drop(sched);
        drop(spinner);
    }
}
