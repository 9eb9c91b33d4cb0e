//! CPU or GPU for a polymorphic (`device: any`) function (§6.4 "policies for dispatching
//! functions to both CPUs and GPUs based on speedup", Table 6.4).
//!
//! The thesis profiles offline and runs the top 50 % of functions by GPU speedup on the GPU,
//! which in its mix meant a speedup above 3×. [`CpuGpuDispatch`] does the same online: it keeps
//! the mean execution time of each function on each side, and a function goes to the GPU when
//! its speedup (CPU time / GPU time) is at least `min_speedup` AND it ranks within the top
//! `gpu_fraction` of the functions with a known speedup. Known means measured on both sides, or
//! else seeded by the caller ([`CpuGpuDispatch::seed_speedup`], the offline profile).
//!
//! Exploration: a function with no known speedup is sent to a side it has no measurement on,
//! the GPU first (the accelerator is the side worth discovering), then the CPU, so each side
//! is measured once before the rule decides.

use crate::time::Micros;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most functions the dispatcher remembers.
pub const MAX_DISPATCH_FUNCTIONS: usize = 4096;

/// Where a polymorphic function runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    Cpu,
    Gpu,
}

/// The dispatch rule's settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatchConfig {
    /// Smallest speedup that earns the GPU (3×, §6.5.2).
    pub min_speedup: f64,
    /// Share of the functions with a known speedup, best first, that may use the GPU (0.5).
    pub gpu_fraction: f64,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            min_speedup: 3.0,
            gpu_fraction: 0.5,
        }
    }
}

/// A dispatch setting or input out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DispatchError {
    #[error("min_speedup must be finite and within 0..=1e6, got {0}")]
    MinSpeedup(f64),
    #[error("gpu_fraction must be finite and within 0..=1, got {0}")]
    GpuFraction(f64),
    #[error("a speedup must be finite and within (0, 1e6], got {0}")]
    Speedup(f64),
    #[error("too many functions (at most {MAX_DISPATCH_FUNCTIONS})")]
    TooManyFunctions,
}

impl DispatchConfig {
    pub fn check(&self) -> Result<(), DispatchError> {
        if !(self.min_speedup.is_finite() && (0.0..=1e6).contains(&self.min_speedup)) {
            return Err(DispatchError::MinSpeedup(self.min_speedup));
        }
        if !(self.gpu_fraction.is_finite() && (0.0..=1.0).contains(&self.gpu_fraction)) {
            return Err(DispatchError::GpuFraction(self.gpu_fraction));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Mean {
    sum_us: f64,
    count: u64,
}

impl Mean {
    fn get(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_us / self.count as f64)
    }
}

#[derive(Debug, Clone, Default)]
struct Profile {
    cpu: Mean,
    gpu: Mean,
    seeded: Option<f64>,
}

impl Profile {
    /// Measured on both sides, else seeded.
    fn speedup(&self) -> Option<f64> {
        match (self.cpu.get(), self.gpu.get()) {
            (Some(cpu), Some(gpu)) if gpu > 0.0 => Some(cpu / gpu),
            (Some(_), Some(_)) => Some(f64::INFINITY),
            _ => self.seeded,
        }
    }
}

/// The CPU/GPU dispatcher (module docs).
#[derive(Debug, Clone)]
pub struct CpuGpuDispatch {
    config: DispatchConfig,
    functions: BTreeMap<String, Profile>,
}

impl CpuGpuDispatch {
    pub fn new(config: DispatchConfig) -> Result<Self, DispatchError> {
        config.check()?;
        Ok(CpuGpuDispatch {
            config,
            functions: BTreeMap::new(),
        })
    }

    fn profile(&mut self, function: &str) -> Result<&mut Profile, DispatchError> {
        if !self.functions.contains_key(function) {
            if self.functions.len() >= MAX_DISPATCH_FUNCTIONS {
                return Err(DispatchError::TooManyFunctions);
            }
            self.functions
                .insert(function.to_string(), Profile::default());
        }
        self.functions
            .get_mut(function)
            .ok_or(DispatchError::TooManyFunctions)
    }

    /// Records a measured execution time of `function` on `device`.
    pub fn record(
        &mut self,
        function: &str,
        device: Device,
        exec_us: Micros,
    ) -> Result<(), DispatchError> {
        let profile = self.profile(function)?;
        let mean = match device {
            Device::Cpu => &mut profile.cpu,
            Device::Gpu => &mut profile.gpu,
        };
        mean.sum_us += exec_us as f64;
        mean.count += 1;
        Ok(())
    }

    /// Seeds a speedup from offline profiling; used until both sides are measured.
    pub fn seed_speedup(&mut self, function: &str, speedup: f64) -> Result<(), DispatchError> {
        if !(speedup.is_finite() && speedup > 0.0 && speedup <= 1e6) {
            return Err(DispatchError::Speedup(speedup));
        }
        self.profile(function)?.seeded = Some(speedup);
        Ok(())
    }

    /// The known speedup of `function` (module docs).
    pub fn speedup(&self, function: &str) -> Option<f64> {
        self.functions.get(function).and_then(Profile::speedup)
    }

    /// Where `function` should run next.
    pub fn choose(&self, function: &str) -> Device {
        let profile = self.functions.get(function);
        let Some(mine) = profile.and_then(Profile::speedup) else {
            // Explore: the side without a measurement, GPU first.
            return match profile {
                Some(p) if p.gpu.count > 0 => Device::Cpu,
                _ => Device::Gpu,
            };
        };
        if mine < self.config.min_speedup {
            return Device::Cpu;
        }
        // Rank among the known speedups, ties broken by name so the split is stable.
        let mut known = 0usize;
        let mut ahead = 0usize;
        for (name, p) in &self.functions {
            let Some(s) = p.speedup() else { continue };
            known += 1;
            if s > mine || (s == mine && name.as_str() < function) {
                ahead += 1;
            }
        }
        let slots = (self.config.gpu_fraction * known as f64).ceil() as usize;
        if ahead < slots {
            Device::Gpu
        } else {
            Device::Cpu
        }
    }
}
