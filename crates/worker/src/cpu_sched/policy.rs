//! What the enforcement consumes: a policy per invocation (rank and CPU-time slice), and the
//! source that decides it. The ALPS frontend (SRPT simulation of the recent window, ALPS §5.2)
//! is such a source; SFS's fixed slice is another.

use super::cgroup::{DEFAULT_SHARES, MAX_SHARES, MIN_SHARES};

/// How one invocation is scheduled: with `rank`, ahead of every sandbox out of its slice, until
/// its sandbox has used `slice_us` of CPU time; then with the rest (ALPS §5.3, SFS's demotion).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuPolicy {
    /// 1..=100; **higher runs first** (more CPU among the invocations in their slices).
    /// ALPS's paper numbers the other way (1 = first): map its rank `r` as `101 - r`.
    pub rank: u8,
    /// CPU time (all the sandbox's tasks together) the invocation runs boosted; 0 never boosts
    /// it (ALPS: "follow CFS").
    pub slice_us: u64,
}

impl CpuPolicy {
    pub const MIN_RANK: u8 = 1;
    pub const MAX_RANK: u8 = 100;
    /// The rank whose weight is the kernel's default (`cpu.shares` 1024).
    pub const NEUTRAL_RANK: u8 = 50;
    /// The longest slice honoured: a source's larger value is cut to this, so no policy boosts a
    /// sandbox for more than 10 s of CPU.
    pub const MAX_SLICE_US: u64 = 10_000_000;

    /// The policy with out-of-range values brought into range (a source is not trusted to).
    pub fn clamped(self) -> CpuPolicy {
        CpuPolicy {
            rank: self.rank.clamp(Self::MIN_RANK, Self::MAX_RANK),
            slice_us: self.slice_us.min(Self::MAX_SLICE_US),
        }
    }

    /// The sandbox's `cpu.shares` while in its slice: 1024 × 1.1^(rank − 50), i.e. ten ranks
    /// more is 2.6× the CPU of a competing boosted sandbox; rank 1 gets 10, rank 100 gets
    /// 120 k (of the kernel's 2..=262144). Only the proportions among boosted siblings matter:
    /// the whole tree of sandboxes weighs as one group against the worker (docs/alps-backend.md).
    pub fn shares(&self) -> u64 {
        let r = i32::from(self.rank.clamp(Self::MIN_RANK, Self::MAX_RANK))
            - i32::from(Self::NEUTRAL_RANK);
        let w = DEFAULT_SHARES as f64 * 1.1f64.powi(r);
        (w.round() as u64).clamp(MIN_SHARES, MAX_SHARES)
    }
}

/// One finished invocation with the CPU time its sandbox used, on the scheduler's clock
/// (microseconds since the worker started): ALPS's trace record ⟨function, arrival,
/// termination, CPU time⟩ (§5.1 step 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvocationCpu {
    pub function: String,
    /// When the request reached the worker.
    pub arrival_us: u64,
    /// When the sandbox answered (or the invocation was given up).
    pub end_us: u64,
    /// `cpuacct.usage` of the sandbox's cgroup: after minus before the invocation.
    pub cpu_us: u64,
}

/// Where each invocation's policy comes from. The enforcer thread owns the source: `completed`
/// and `tick` run there, never on an invocation's path; the invocation path reads the policies
/// the enforcer publishes after each tick (ALPS's eBPF maps, §5.3).
pub trait PolicySource: Send + 'static {
    /// The policy for the next invocations of `function`.
    fn policy_for(&mut self, function: &str) -> CpuPolicy;
    /// A finished invocation, with its CPU time.
    fn completed(&mut self, done: &InvocationCpu);
    /// Called every [`super::TICK`] with the host's CPU utilization over it (0..=100).
    fn tick(&mut self, now_us: u64, utilization_pct: f64);
}

/// SFS's first level: every function the same slice at the same rank; the order among boosted
/// invocations is the kernel's fair share (no FIFO among them, docs/alps-backend.md).
#[derive(Debug, Clone, Copy)]
pub struct FixedSlice {
    pub slice_us: u64,
}

impl PolicySource for FixedSlice {
    fn policy_for(&mut self, _function: &str) -> CpuPolicy {
        CpuPolicy {
            rank: CpuPolicy::NEUTRAL_RANK,
            slice_us: self.slice_us,
        }
    }

    fn completed(&mut self, _done: &InvocationCpu) {}

    fn tick(&mut self, _now_us: u64, _utilization_pct: f64) {}
}

/// ALPS: the core's learning frontend as a policy source. The core ranks 1 = first; the
/// enforcer's ranks run the other way (higher weighs more), hence `101 − rank`.
pub struct LearnedSlices {
    alps: hearth_core::cpu_sched::Alps,
}

impl LearnedSlices {
    pub fn new(cpus: u32) -> Result<Self, hearth_core::cpu_sched::CpuSchedError> {
        let config = hearth_core::cpu_sched::AlpsConfig::default();
        Ok(LearnedSlices {
            alps: hearth_core::cpu_sched::Alps::new(config, cpus.max(1))?,
        })
    }
}

impl PolicySource for LearnedSlices {
    fn policy_for(&mut self, function: &str) -> CpuPolicy {
        let s = self.alps.policy_for(function);
        CpuPolicy {
            rank: 101 - s.rank.clamp(1, 100),
            slice_us: s.slice_us,
        }
    }

    fn completed(&mut self, done: &InvocationCpu) {
        self.alps.completed(hearth_core::cpu_sched::Completion {
            function: &done.function,
            arrival_us: done.arrival_us,
            end_us: done.end_us,
            cpu_us: done.cpu_us,
        });
    }

    fn tick(&mut self, now_us: u64, utilization_pct: f64) {
        let _ = self.alps.tick(now_us, utilization_pct);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alps_learns_to_weigh_a_short_function_above_a_long_one() {
        let mut src = LearnedSlices::new(2).unwrap();
        // Before any window: the same policy for both.
        assert_eq!(src.policy_for("short"), src.policy_for("long"));
        for i in 0..200u64 {
            let at = i * 20_000;
            for (f, cpu) in [("short", 2_000), ("long", 300_000)] {
                src.completed(&InvocationCpu {
                    function: f.to_string(),
                    arrival_us: at,
                    end_us: at + cpu,
                    cpu_us: cpu,
                });
            }
        }
        src.tick(5_000_000, 30.0);
        let (short, long) = (src.policy_for("short"), src.policy_for("long"));
        assert!(short.rank > long.rank, "short {short:?}, long {long:?}");
        assert!(short.slice_us > 0 && long.slice_us > 0);
    }

    #[test]
    fn rank_maps_to_shares_monotonically_within_the_kernels_bounds() {
        let p = |rank| CpuPolicy { rank, slice_us: 1 };
        assert_eq!(p(CpuPolicy::NEUTRAL_RANK).shares(), DEFAULT_SHARES);
        assert_eq!(p(1).shares(), 10);
        assert_eq!(p(100).shares(), 120_208);
        let mut last = 0;
        for r in 1..=100 {
            let s = p(r).shares();
            assert!(s > last, "rank {r}");
            assert!((MIN_SHARES..=MAX_SHARES).contains(&s));
            last = s;
        }
        // Out of range is brought into range, never past the kernel's limits.
        assert_eq!(p(0).shares(), p(1).shares());
        assert_eq!(p(255).shares(), p(100).shares());
    }

    #[test]
    fn clamping_bounds_rank_and_slice() {
        let c = CpuPolicy {
            rank: 0,
            slice_us: u64::MAX,
        }
        .clamped();
        assert_eq!(
            c,
            CpuPolicy {
                rank: 1,
                slice_us: CpuPolicy::MAX_SLICE_US
            }
        );
        assert_eq!(
            CpuPolicy {
                rank: 200,
                slice_us: 5
            }
            .clamped()
            .rank,
            100
        );
    }

    #[test]
    fn sfs_gives_every_function_the_same_slice_at_the_neutral_rank() {
        let mut s = FixedSlice { slice_us: 50_000 };
        let a = s.policy_for("a");
        assert_eq!(a, s.policy_for("b"));
        assert_eq!(a.rank, CpuPolicy::NEUTRAL_RANK);
        assert_eq!(a.slice_us, 50_000);
    }
}
