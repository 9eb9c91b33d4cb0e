//! Settings of the CPU-priority policies, with their bounds.
//!
//! Every number a config file or a flag can set is range-checked by `validate`, which names the
//! field and the range in a typed error, so a worker refuses to start on a setting the policy
//! cannot honour rather than clamping it silently.

use crate::time::Micros;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// Why a CPU-scheduling setting was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CpuSchedError {
    #[error("window_ms must be between 1000 and 30000 (1–30 s), got {0}")]
    Window(u64),
    #[error("alpha must be between 0 and 10, got {0}")]
    Alpha(f64),
    #[error("beta must be between 0 and 10, got {0}")]
    Beta(f64),
    #[error("gamma must be above 0 and at most 10, got {0}")]
    Gamma(f64),
    #[error("theta_pct must be between 0 and 100, got {0}")]
    Theta(f64),
    #[error("ewma_weight must lie in (0, 1], got {0}")]
    EwmaWeight(f64),
    #[error("max_window must be between 1 and 1000000 completions, got {0}")]
    MaxWindow(usize),
    #[error("max_functions must be between 1 and 100000, got {0}")]
    MaxFunctions(usize),
    #[error("max_slice_ms must be between 1 and 60000, got {0}")]
    MaxSlice(u64),
    #[error("neutral_rank must be between 1 and 100, got {0}")]
    NeutralRank(u8),
    #[error("sfs slice_ms must be between 1 and 10000, got {0}")]
    SfsSlice(u64),
    #[error("sfs min_slice_ms must be between 1 and max_slice_ms ({max}), got {min}")]
    SfsMinSlice { min: u64, max: u64 },
    #[error("sfs period must be between 2 and 100000 arrivals, got {0}")]
    SfsPeriod(u32),
    #[error("sfs overload_factor must be 0 (off) or between 1 and 100, got {0}")]
    SfsOverload(f64),
    #[error("cpus must be between 1 and 4096, got {0}")]
    Cpus(u32),
    #[error("unknown {what} {got:?} (expected {expected})")]
    Name {
        what: &'static str,
        got: String,
        expected: &'static str,
    },
}

/// How a function's vector of SRPT time slices becomes one slice (Eq. 1, `train_ts`; §7.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Learning {
    /// The mean (ALPS' default).
    #[default]
    Average,
    /// Exponentially weighted moving average in time order, newest weighted `ewma_weight`.
    Ewma,
    /// Least-squares line through the slices in time order, read at the next index and kept
    /// within the slices' range (a trend, never an extrapolation past what SRPT gave).
    Linear,
}

impl Learning {
    pub const ALL: [Learning; 3] = [Learning::Average, Learning::Ewma, Learning::Linear];

    pub fn as_str(self) -> &'static str {
        match self {
            Learning::Average => "average",
            Learning::Ewma => "ewma",
            Learning::Linear => "linear",
        }
    }
}

impl FromStr for Learning {
    type Err = CpuSchedError;
    fn from_str(s: &str) -> Result<Self, CpuSchedError> {
        Learning::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| CpuSchedError::Name {
                what: "learning method",
                got: s.chars().take(40).collect(),
                expected: "average, ewma or linear",
            })
    }
}

/// ALPS' frontend settings (§5.2, §7.1 defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlpsConfig {
    /// The window W: completions are collected for this long, then an SRPT simulation of them
    /// trains the policies and the window starts empty again (5 s; 1–30 s).
    pub window_ms: u64,
    pub learning: Learning,
    /// EWMA weight of the newest slice (`learning = "ewma"`).
    pub ewma_weight: f64,
    /// Eq. 2's reward factor α (2).
    pub alpha: f64,
    /// Eq. 2's penalty factor β on the slices' standard deviation (1).
    pub beta: f64,
    /// Eq. 3's utilization threshold θ in per cent (50).
    pub theta_pct: f64,
    /// Eq. 3's reaction γ to high load (1).
    pub gamma: f64,
    /// Eq. 2 on (the "unpredictability" fine-tuning; off for the §7.4 ablation).
    pub unpredictability: bool,
    /// Eq. 3 on (the "system overload" fine-tuning; off for the §7.4 ablation).
    pub overload: bool,
    /// Rank of a function the last window did not see (ranks run 1–100, lower runs first).
    pub neutral_rank: u8,
    /// Completions one window keeps; later ones in the same window are counted and left out.
    pub max_window: usize,
    /// Distinct functions one window keeps; completions of further ones are left out.
    pub max_functions: usize,
    /// No learned slice exceeds this (a bound on what a misbehaving window can grant).
    pub max_slice_ms: u64,
}

impl Default for AlpsConfig {
    fn default() -> Self {
        AlpsConfig {
            window_ms: 5_000,
            learning: Learning::Average,
            ewma_weight: 0.5,
            alpha: 2.0,
            beta: 1.0,
            theta_pct: 50.0,
            gamma: 1.0,
            unpredictability: true,
            overload: true,
            neutral_rank: NEUTRAL_RANK,
            max_window: 200_000,
            max_functions: 10_000,
            max_slice_ms: 10_000,
        }
    }
}

/// The middle of the rank range: what a function without a learned rank gets.
pub const NEUTRAL_RANK: u8 = 50;

fn within(v: f64, lo: f64, hi: f64) -> bool {
    v.is_finite() && v >= lo && v <= hi
}

impl AlpsConfig {
    pub fn validate(&self) -> Result<(), CpuSchedError> {
        if !(1_000..=30_000).contains(&self.window_ms) {
            return Err(CpuSchedError::Window(self.window_ms));
        }
        if !within(self.alpha, 0.0, 10.0) {
            return Err(CpuSchedError::Alpha(self.alpha));
        }
        if !within(self.beta, 0.0, 10.0) {
            return Err(CpuSchedError::Beta(self.beta));
        }
        if !(within(self.gamma, 0.0, 10.0) && self.gamma > 0.0) {
            return Err(CpuSchedError::Gamma(self.gamma));
        }
        if !within(self.theta_pct, 0.0, 100.0) {
            return Err(CpuSchedError::Theta(self.theta_pct));
        }
        if !(within(self.ewma_weight, 0.0, 1.0) && self.ewma_weight > 0.0) {
            return Err(CpuSchedError::EwmaWeight(self.ewma_weight));
        }
        if !(1..=1_000_000).contains(&self.max_window) {
            return Err(CpuSchedError::MaxWindow(self.max_window));
        }
        if !(1..=100_000).contains(&self.max_functions) {
            return Err(CpuSchedError::MaxFunctions(self.max_functions));
        }
        if !(1..=60_000).contains(&self.max_slice_ms) {
            return Err(CpuSchedError::MaxSlice(self.max_slice_ms));
        }
        if !(1..=100).contains(&self.neutral_rank) {
            return Err(CpuSchedError::NeutralRank(self.neutral_rank));
        }
        Ok(())
    }

    pub fn window_us(&self) -> Micros {
        self.window_ms * 1_000
    }
}

/// How SFS sets its FILTER slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SfsMode {
    /// `slice_ms` for every invocation.
    Fixed,
    /// SFS' adaptive slice: the mean inter-arrival time of the last `period` arrivals times the
    /// CPU count (the time each CPU has, on average, before the next invocation needs it),
    /// within `min_slice_ms`..=`max_slice_ms`; `slice_ms` until the first `period` arrivals.
    #[default]
    Adaptive,
}

/// SFS' settings (SC '22; the defaults are its published prototype's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SfsConfig {
    pub mode: SfsMode,
    /// The fixed slice, and the adaptive one's starting value (20 ms).
    pub slice_ms: u64,
    /// Arrivals per adaptive update (200).
    pub period: u32,
    /// Floor of the adaptive slice (6 ms).
    pub min_slice_ms: u64,
    /// Ceiling of the adaptive slice (a bound, 10 s).
    pub max_slice_ms: u64,
    /// SFS' overload ("hybrid") rule: an invocation that waited longer than this many slices
    /// for the FILTER level goes to fair sharing without it (3; 0 turns it off).
    pub overload_factor: f64,
}

impl Default for SfsConfig {
    fn default() -> Self {
        SfsConfig {
            mode: SfsMode::Adaptive,
            slice_ms: 20,
            period: 200,
            min_slice_ms: 6,
            max_slice_ms: 10_000,
            overload_factor: 3.0,
        }
    }
}

impl SfsConfig {
    pub fn validate(&self) -> Result<(), CpuSchedError> {
        if !(1..=10_000).contains(&self.slice_ms) {
            return Err(CpuSchedError::SfsSlice(self.slice_ms));
        }
        if !(1..=10_000).contains(&self.max_slice_ms) {
            return Err(CpuSchedError::SfsSlice(self.max_slice_ms));
        }
        if !(1..=self.max_slice_ms).contains(&self.min_slice_ms) {
            return Err(CpuSchedError::SfsMinSlice {
                min: self.min_slice_ms,
                max: self.max_slice_ms,
            });
        }
        if !(2..=100_000).contains(&self.period) {
            return Err(CpuSchedError::SfsPeriod(self.period));
        }
        let f = self.overload_factor;
        if !(f == 0.0 || within(f, 1.0, 100.0)) {
            return Err(CpuSchedError::SfsOverload(f));
        }
        Ok(())
    }
}

/// Which CPU-priority policy a worker applies to its invocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuSchedKind {
    /// The kernel's fair sharing alone: no priority, no slice.
    #[default]
    Cfs,
    /// SFS: FIFO within one slice for all, then fair sharing.
    Sfs,
    /// ALPS: learned rank and per-function slice, then fair sharing.
    Alps,
}

impl CpuSchedKind {
    pub const ALL: [CpuSchedKind; 3] = [CpuSchedKind::Cfs, CpuSchedKind::Sfs, CpuSchedKind::Alps];

    pub fn as_str(self) -> &'static str {
        match self {
            CpuSchedKind::Cfs => "cfs",
            CpuSchedKind::Sfs => "sfs",
            CpuSchedKind::Alps => "alps",
        }
    }
}

impl std::fmt::Display for CpuSchedKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CpuSchedKind {
    type Err = CpuSchedError;
    fn from_str(s: &str) -> Result<Self, CpuSchedError> {
        CpuSchedKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| CpuSchedError::Name {
                what: "CPU scheduler",
                got: s.chars().take(40).collect(),
                expected: "cfs, sfs or alps",
            })
    }
}

/// The policy and both policies' settings, as a worker's `[cpu_sched]` table holds them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CpuSchedConfig {
    pub kind: CpuSchedKind,
    pub alps: AlpsConfig,
    pub sfs: SfsConfig,
}

impl CpuSchedConfig {
    /// Checks both policies' settings (the unused one too: a typo should not wait for the
    /// day someone switches to it).
    pub fn validate(&self) -> Result<(), CpuSchedError> {
        self.alps.validate()?;
        self.sfs.validate()
    }
}
