//! The GPU scheduler's settings (thesis Table 6.2, §6.3–6.5) and their range checks.
//!
//! Every number is checked ([`GpuSchedConfig::check`]) before a scheduler is built: a worker's
//! configuration file and a simulator's command line are both hostile input.

use crate::time::Micros;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// Most GPUs one scheduler drives (one dispatcher for all of a machine's devices, §6.3.4).
pub const MAX_GPUS: usize = 16;
/// Largest device parallelism an operator may allow.
pub const MAX_D: u32 = 64;
/// Largest container pool per device.
pub const MAX_CONTAINERS_PER_GPU: u32 = 256;
/// Largest queue (all flows together).
pub const MAX_QUEUE: usize = 1_000_000;
/// Largest device memory (1 TiB), so that sums of memory can never overflow.
pub const MAX_GPU_MEMORY_MB: u64 = 1 << 20;
/// Largest T and fixed TTL-ish knobs, so that virtual time stays far from f64's precision loss.
const MAX_T: f64 = 1e6;
const MAX_ALPHA: f64 = 1e3;
/// A fixed TTL longer than a day is a mistake, not a keep-alive.
const MAX_TTL_US: Micros = 86_400 * 1_000_000;

/// Which dispatch policy the scheduler runs (§6.5 "Scheduling Policies").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuPolicy {
    /// Locality-enhanced fair queuing (§6.3.2, Algorithm 3).
    #[default]
    MqfqSticky,
    /// One queue in arrival order, with the container pool; memory is moved onto the device
    /// before each run and off it after each completion.
    Fcfs,
    /// Per-function flows; the flow holding the oldest invocation is drained whole, then the
    /// next oldest.
    Batch,
}

impl GpuPolicy {
    pub const ALL: [GpuPolicy; 3] = [GpuPolicy::MqfqSticky, GpuPolicy::Fcfs, GpuPolicy::Batch];

    pub fn as_str(self) -> &'static str {
        match self {
            GpuPolicy::MqfqSticky => "mqfq-sticky",
            GpuPolicy::Fcfs => "fcfs",
            GpuPolicy::Batch => "batch",
        }
    }
}

impl std::fmt::Display for GpuPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for GpuPolicy {
    type Err = GpuConfigError;
    fn from_str(s: &str) -> Result<Self, GpuConfigError> {
        GpuPolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| GpuConfigError::Policy(s.chars().take(40).collect()))
    }
}

/// How container memory moves between host and device (§6.3.3, §6.4.2, Fig. 6.4). Every
/// policy keeps the container pool; they differ in who moves memory, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuMemoryPolicy {
    /// The thesis' default: a flow becoming active has its idle containers prefetched, one
    /// going throttled or inactive has them swapped out, and a dispatch runs only when its
    /// container fits on the device. Swaps are asynchronous, off the critical path.
    #[default]
    PrefetchSwap,
    /// Prefetch as above, but nothing is swapped out proactively: when a dispatch needs room,
    /// the driver evicts least recently used pages on demand, on that dispatch's critical path.
    PrefetchOnly,
    /// Stock unified memory: no prefetch, no swap, and no gating on device memory (UVM
    /// oversubscribes). A container's pages come back on demand when it runs, evicting the
    /// least recently used ones; the scheduler tracks residency as the driver would so the
    /// dispatch can say what it faults in and evicts.
    Uvm,
}

impl GpuMemoryPolicy {
    pub const ALL: [GpuMemoryPolicy; 3] = [
        GpuMemoryPolicy::PrefetchSwap,
        GpuMemoryPolicy::PrefetchOnly,
        GpuMemoryPolicy::Uvm,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            GpuMemoryPolicy::PrefetchSwap => "prefetch-swap",
            GpuMemoryPolicy::PrefetchOnly => "prefetch-only",
            GpuMemoryPolicy::Uvm => "uvm",
        }
    }
}

impl std::fmt::Display for GpuMemoryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One device the scheduler places containers on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// Physical device memory that resident container memory may fill.
    pub memory_mb: u64,
}

/// The scheduler's settings. Defaults follow the thesis' evaluation (V100, 16 GiB).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpuSchedConfig {
    pub policy: GpuPolicy,
    /// Who moves container memory, and when ([`GpuMemoryPolicy`]).
    pub memory: GpuMemoryPolicy,
    /// Flow over-run T: how far (in virtual time: seconds of device service per unit weight)
    /// a flow may run ahead of Global_VT before it is throttled. Default 10: Fig. 6.10 shows
    /// latency falling with T with diminishing returns; 10 s is about four executions of the
    /// Table 6.1 functions, a mini-batch that keeps locality without starving the rest.
    pub t: f64,
    /// Flow TTL factor α: an empty flow stays active for α × its mean inter-arrival time
    /// (Fig. 6.11: the minimum lies between 1 and 2; 1.5).
    pub alpha: f64,
    /// One TTL for every flow instead of α × IAT (Fig. 6.11's solid line).
    pub fixed_ttl_us: Option<Micros>,
    /// Classical fair queuing: each dispatch costs 1/weight instead of τ/weight (Fig. 6.10's
    /// "1.0" line).
    pub uniform_cost: bool,
    /// Initial device parallelism D per GPU (Fig. 6.13's sweet spot: 2).
    pub d: u32,
    /// Upper bound on D under utilization feedback (Fig. 6.12 goes to 6).
    pub d_max: u32,
    /// Adjust D from utilization samples (§6.3.4); off: D stays `d`.
    pub dynamic_d: bool,
    /// Utilization above which D is lowered and dispatch held back (90 %).
    pub util_threshold: f64,
    /// Cap on GPU containers per device, idle or busy: a GPU context takes memory the shim
    /// cannot see (§6.3.4).
    pub containers_per_gpu: u32,
    /// Queued invocations (all flows) beyond this are rejected.
    pub max_queue: usize,
    /// τ of a function never seen to complete: one second, the order of Table 6.1's warm GPU
    /// times, so an unknown function neither hoards nor starves on its first dispatches.
    pub default_exec_us: Micros,
    /// The devices: set by the driver (the worker from the GPUs it found or declared, the
    /// simulator from its setup), never read from a settings file.
    #[serde(skip)]
    pub gpus: Vec<GpuSpec>,
}

impl Default for GpuSchedConfig {
    fn default() -> Self {
        GpuSchedConfig {
            policy: GpuPolicy::MqfqSticky,
            memory: GpuMemoryPolicy::PrefetchSwap,
            t: 10.0,
            alpha: 1.5,
            fixed_ttl_us: None,
            uniform_cost: false,
            d: 2,
            d_max: 6,
            dynamic_d: true,
            util_threshold: 0.9,
            containers_per_gpu: 16,
            max_queue: 10_000,
            default_exec_us: 1_000_000,
            gpus: vec![GpuSpec { memory_mb: 16_384 }],
        }
    }
}

/// A setting out of range; the variant names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GpuConfigError {
    #[error("unknown GPU policy {0:?} (expected mqfq-sticky, fcfs or batch)")]
    Policy(String),
    #[error("t must be finite and within 0..={MAX_T}, got {0}")]
    T(f64),
    #[error("alpha must be finite and within 0..={MAX_ALPHA}, got {0}")]
    Alpha(f64),
    #[error("fixed_ttl_us must be at most one day, got {0}")]
    FixedTtl(Micros),
    #[error("d must be between 1 and d_max ({d_max}), got {d}")]
    D { d: u32, d_max: u32 },
    #[error("d_max must be between 1 and {MAX_D}, got {0}")]
    DMax(u32),
    #[error("util_threshold must be finite and within (0, 1], got {0}")]
    UtilThreshold(f64),
    #[error("containers_per_gpu must be between 1 and {MAX_CONTAINERS_PER_GPU}, got {0}")]
    ContainersPerGpu(u32),
    #[error("max_queue must be between 1 and {MAX_QUEUE}, got {0}")]
    MaxQueue(usize),
    #[error("default_exec_us must be between 1 µs and one day, got {0}")]
    DefaultExec(Micros),
    #[error("gpus must list between 1 and {MAX_GPUS} devices, got {0}")]
    Gpus(usize),
    #[error("gpus[{index}].memory_mb must be between 1 and {MAX_GPU_MEMORY_MB}, got {memory_mb}")]
    GpuMemory { index: usize, memory_mb: u64 },
}

impl GpuSchedConfig {
    /// Checks every field; the error names the first one out of range.
    pub fn check(&self) -> Result<(), GpuConfigError> {
        if !(self.t.is_finite() && (0.0..=MAX_T).contains(&self.t)) {
            return Err(GpuConfigError::T(self.t));
        }
        if !(self.alpha.is_finite() && (0.0..=MAX_ALPHA).contains(&self.alpha)) {
            return Err(GpuConfigError::Alpha(self.alpha));
        }
        if let Some(ttl) = self.fixed_ttl_us {
            if ttl > MAX_TTL_US {
                return Err(GpuConfigError::FixedTtl(ttl));
            }
        }
        if !(1..=MAX_D).contains(&self.d_max) {
            return Err(GpuConfigError::DMax(self.d_max));
        }
        if self.d < 1 || self.d > self.d_max {
            return Err(GpuConfigError::D {
                d: self.d,
                d_max: self.d_max,
            });
        }
        if !(self.util_threshold.is_finite()
            && self.util_threshold > 0.0
            && self.util_threshold <= 1.0)
        {
            return Err(GpuConfigError::UtilThreshold(self.util_threshold));
        }
        if !(1..=MAX_CONTAINERS_PER_GPU).contains(&self.containers_per_gpu) {
            return Err(GpuConfigError::ContainersPerGpu(self.containers_per_gpu));
        }
        if !(1..=MAX_QUEUE).contains(&self.max_queue) {
            return Err(GpuConfigError::MaxQueue(self.max_queue));
        }
        if !(1..=MAX_TTL_US).contains(&self.default_exec_us) {
            return Err(GpuConfigError::DefaultExec(self.default_exec_us));
        }
        if self.gpus.is_empty() || self.gpus.len() > MAX_GPUS {
            return Err(GpuConfigError::Gpus(self.gpus.len()));
        }
        for (index, gpu) in self.gpus.iter().enumerate() {
            if !(1..=MAX_GPU_MEMORY_MB).contains(&gpu.memory_mb) {
                return Err(GpuConfigError::GpuMemory {
                    index,
                    memory_mb: gpu.memory_mb,
                });
            }
        }
        Ok(())
    }

    /// The TTL of a flow whose mean inter-arrival time is `iat_us` (none seen yet: 0).
    pub fn ttl_us(&self, iat_us: Option<f64>) -> Micros {
        match self.fixed_ttl_us {
            Some(ttl) => ttl,
            None => iat_us.map_or(0, |iat| {
                (self.alpha * iat).clamp(0.0, MAX_TTL_US as f64) as Micros
            }),
        }
    }
}
