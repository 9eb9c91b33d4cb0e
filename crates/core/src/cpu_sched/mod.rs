//! CPU priority for invocations: which invocation a worker's CPUs should favour, and for how
//! long, learned from the recent past (ALPS, USENIX ATC '24) or set by SFS' rule (SC '22).
//!
//! Both policies answer the same question for an invocation that starts: a [`Slice`], the
//! CPU time it may use at a raised priority (ordered among raised invocations by `rank`, lower
//! first) before it goes back to the kernel's fair sharing. A slice of 0 means fair sharing
//! from the start. The worker enforces it (real-time priority or cgroup weight while within
//! the slice, then back; no `sched_ext` on the target kernel); the simulator models it.
//!
//! * [`Alps`]: the frontend of §5. Completed invocations ⟨function, arrival, end, CPU time⟩
//!   collect in a window of W (5 s); when W has passed, an SRPT simulation of the window on
//!   the worker's CPUs ([`srpt`]) gives each function its mean waiting time, which orders the
//!   functions onto ranks 1–100, and its time slices, which train its slice (Eq. 1: average,
//!   EWMA or linear regression) and are fine-tuned by Eq. 2 (α·ts − β·stdev). Eq. 3's overload
//!   penalty follows the utilization handed to every tick. Both fine-tunings can be switched
//!   off (§7.4's ablation). A function the last window did not see gets the neutral rank and
//!   the median learned slice.
//! * [`Sfs`]: one FIFO slice for all functions, fixed or adapted to the arrival rate.
//! * [`CpuScheduler`]: `cfs` (no priority), `sfs` or `alps` behind one interface, chosen by
//!   [`CpuSchedConfig::kind`].
//!
//! Time is the driver's (microseconds from its start), handed in with every call: nothing here
//! reads a clock.
//!
//! ```
//! use hearth_core::cpu_sched::{Completion, CpuSchedConfig, CpuSchedKind, CpuScheduler};
//!
//! let config = CpuSchedConfig { kind: CpuSchedKind::Alps, ..CpuSchedConfig::default() };
//! let mut sched = CpuScheduler::new(&config, 1).unwrap();
//! // A long function and a short one share one CPU for 5 s.
//! for k in 0..100u64 {
//!     let t = k * 50_000;
//!     sched.completed(Completion { function: "long", arrival_us: t, end_us: t + 30_000, cpu_us: 20_000 });
//!     sched.completed(Completion { function: "short", arrival_us: t + 1_000, end_us: t + 3_000, cpu_us: 2_000 });
//! }
//! assert!(sched.tick(1_000_000, 80.0).is_none(), "the window is still open");
//! let trained = sched.tick(5_000_000, 80.0).unwrap();
//! assert_eq!((trained.invocations, trained.functions), (200, 2));
//! let (short, long) = (sched.policy_for("short"), sched.policy_for("long"));
//! assert!(short.rank < long.rank);
//! assert!(short.slice_us > 0);
//! // A function the window did not see: the neutral rank, a typical (median) slice.
//! assert_eq!(sched.policy_for("unseen").rank, hearth_core::cpu_sched::NEUTRAL_RANK);
//! ```

mod alps;
pub mod config;
pub mod learn;
mod sfs;
pub mod srpt;

pub use alps::Alps;
pub use config::{
    AlpsConfig, CpuSchedConfig, CpuSchedError, CpuSchedKind, Learning, SfsConfig, SfsMode,
    NEUTRAL_RANK,
};
pub use learn::{Learned, MAX_RANK};
pub use sfs::Sfs;

use crate::time::Micros;

/// One finished invocation, as the worker measured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion<'a> {
    pub function: &'a str,
    /// When it became runnable (its execution started).
    pub arrival_us: Micros,
    pub end_us: Micros,
    /// CPU time it used (the sandbox's cgroup CPU accounting): its size for SRPT.
    pub cpu_us: Micros,
}

/// What an invocation gets when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    /// 1..=100: order among invocations within their slice, lower first.
    pub rank: u8,
    /// CPU time at the raised priority before fair sharing (0: fair sharing from the start).
    pub slice_us: Micros,
}

impl Slice {
    /// Fair sharing: no slice, the neutral rank.
    pub const FAIR: Slice = Slice {
        rank: NEUTRAL_RANK,
        slice_us: 0,
    };
}

/// One ALPS training, for logs and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Trained {
    pub at_us: Micros,
    pub window_from_us: Micros,
    /// Completions the SRPT simulation replayed.
    pub invocations: usize,
    /// Functions with a policy from this window.
    pub functions: usize,
    /// Completions left out (bounds, bad times).
    pub ignored: u64,
    /// Mean SRPT waiting time over the window's invocations (µs).
    pub mean_wait_us: f64,
}

/// The worker's CPU-priority policy, by [`CpuSchedKind`].
#[derive(Debug, Clone)]
pub enum CpuScheduler {
    Cfs,
    Sfs(Sfs),
    Alps(Box<Alps>),
}

impl CpuScheduler {
    /// The configured policy for a worker of `cpus` CPUs (both policies' settings checked).
    pub fn new(config: &CpuSchedConfig, cpus: u32) -> Result<Self, CpuSchedError> {
        config.validate()?;
        if !(1..=4096).contains(&cpus) {
            return Err(CpuSchedError::Cpus(cpus));
        }
        Ok(match config.kind {
            CpuSchedKind::Cfs => CpuScheduler::Cfs,
            CpuSchedKind::Sfs => CpuScheduler::Sfs(Sfs::new(config.sfs.clone(), cpus)?),
            CpuSchedKind::Alps => {
                CpuScheduler::Alps(Box::new(Alps::new(config.alps.clone(), cpus)?))
            }
        })
    }

    pub fn kind(&self) -> CpuSchedKind {
        match self {
            CpuScheduler::Cfs => CpuSchedKind::Cfs,
            CpuScheduler::Sfs(_) => CpuSchedKind::Sfs,
            CpuScheduler::Alps(_) => CpuSchedKind::Alps,
        }
    }

    /// An invocation became runnable at `now`.
    pub fn arrived(&mut self, now: Micros) {
        if let CpuScheduler::Sfs(s) = self {
            s.arrived(now);
        }
    }

    /// An invocation ended.
    pub fn completed(&mut self, c: Completion<'_>) {
        if let CpuScheduler::Alps(a) = self {
            a.completed(c);
        }
    }

    /// Time passed; the CPUs are `utilization_pct` busy. ALPS trains when its window is over.
    #[must_use = "a training is worth logging"]
    pub fn tick(&mut self, now: Micros, utilization_pct: f64) -> Option<Trained> {
        match self {
            CpuScheduler::Alps(a) => a.tick(now, utilization_pct),
            _ => None,
        }
    }

    /// When the next tick is due (ALPS' window end); None: ticks change nothing.
    pub fn next_tick_at(&self) -> Option<Micros> {
        match self {
            CpuScheduler::Alps(a) => Some(a.next_tick_at()),
            _ => None,
        }
    }

    /// What an invocation of `function` starting now gets.
    pub fn policy_for(&self, function: &str) -> Slice {
        match self {
            CpuScheduler::Cfs => Slice::FAIR,
            CpuScheduler::Sfs(s) => s.policy_for(function),
            CpuScheduler::Alps(a) => a.policy_for(function),
        }
    }

    /// SFS' overload rule: an invocation that waited this long for its slice goes to fair
    /// sharing without it. None for the others.
    pub fn overload_wait_us(&self) -> Option<Micros> {
        match self {
            CpuScheduler::Sfs(s) => s.overload_wait_us(),
            _ => None,
        }
    }

    pub fn alps(&self) -> Option<&Alps> {
        match self {
            CpuScheduler::Alps(a) => Some(a),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
