//! A simulated GPU: how long invocations take on it, as pure functions. The simulator and the
//! worker's `sim` GPU backend both use it, so both see the same device.
//!
//! Calibration (thesis ch. 6, V100): execution stretches linearly with the invocations running
//! together, `interference` per extra one; Fig. 6.12 shows a fixed D = 6 costing up to +100 %,
//! so 0.2 per extra invocation. Moving memory between host and device costs `memory /
//! pcie_mb_per_s` (PCIe 3 x16, about 12 GB/s). Creating a GPU container adds `gpu_init_us`:
//! Fig. 6.1 puts the NVIDIA hook and GPU library start at about 3 s over a CPU container, and
//! Table 6.1's cold − warm GPU times range from under 1 s to 16 s; 1.5 s is the hook alone.
//! Utilization is the sum of the running invocations' solo shares, at most 1 (a device is
//! never more than fully busy; beyond that, work stretches instead).
//!
//! On-demand paging (stock unified memory, §6.4.2) is slower than a bulk prefetch: the
//! kernels stall on page faults that the driver serves in small batches. A fault-in of `mb`
//! costs `mb / (pcie_mb_per_s × uvm_fault_efficiency)`; eviction on demand moves the pages
//! out at PCIe speed, `mb / pcie_mb_per_s`, before the faulted ones can land.
//! `uvm_fault_efficiency` = 0.55 is **calibrated on the thesis' Fig. 6.4, not measured here**:
//! 16 FFT containers of 1.5 GB on a 16 GB V100, invoked in turn, run 40 % over Table 6.1's
//! 0.897 s warm time under stock UVM. Invoked in turn, LRU keeps none of them resident, so
//! each run faults in and evicts 1,536 MB: 0.4 × 0.897 s = 0.359 s = 1,536 MB / 12 GB/s
//! (0.128 s eviction) + 1,536 MB / (12 GB/s × e), so e = 0.555, rounded to 0.55 (+40.2 %).

use super::scheduler::{GpuPaging, Start};
use crate::time::Micros;
use serde::{Deserialize, Serialize};

/// The model's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimGpuModel {
    /// Relative slowdown per extra concurrent invocation.
    pub interference: f64,
    /// Host↔device copy bandwidth, MB/s.
    pub pcie_mb_per_s: f64,
    /// Creating a GPU container (context, hooks, libraries), on top of a CPU cold start.
    pub gpu_init_us: Micros,
    /// On-demand fault-in speed as a share of `pcie_mb_per_s` (module docs: calibrated on
    /// Fig. 6.4).
    pub uvm_fault_efficiency: f64,
}

impl Default for SimGpuModel {
    fn default() -> Self {
        SimGpuModel {
            interference: 0.2,
            pcie_mb_per_s: 12_000.0,
            gpu_init_us: 1_500_000,
            uvm_fault_efficiency: 0.55,
        }
    }
}

/// A model parameter out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimGpuModelError {
    #[error("interference must be finite and within 0..=10, got {0}")]
    Interference(f64),
    #[error("pcie_mb_per_s must be finite and within 1..=1e7, got {0}")]
    Pcie(f64),
    #[error("gpu_init_us must be at most 10 minutes, got {0}")]
    GpuInit(Micros),
    #[error("uvm_fault_efficiency must be finite and within 0.01..=1, got {0}")]
    UvmFaultEfficiency(f64),
}

impl SimGpuModel {
    pub fn check(&self) -> Result<(), SimGpuModelError> {
        if !(self.interference.is_finite() && (0.0..=10.0).contains(&self.interference)) {
            return Err(SimGpuModelError::Interference(self.interference));
        }
        if !(self.pcie_mb_per_s.is_finite() && (1.0..=1e7).contains(&self.pcie_mb_per_s)) {
            return Err(SimGpuModelError::Pcie(self.pcie_mb_per_s));
        }
        if self.gpu_init_us > 600_000_000 {
            return Err(SimGpuModelError::GpuInit(self.gpu_init_us));
        }
        if !(self.uvm_fault_efficiency.is_finite()
            && (0.01..=1.0).contains(&self.uvm_fault_efficiency))
        {
            return Err(SimGpuModelError::UvmFaultEfficiency(
                self.uvm_fault_efficiency,
            ));
        }
        Ok(())
    }

    /// A warm execution of `warm_exec_us` alone, stretched by `concurrent` invocations running
    /// at once on the device (itself included; 0 counts as 1).
    pub fn exec_us(&self, warm_exec_us: Micros, concurrent: u32) -> Micros {
        let extra = f64::from(concurrent.max(1) - 1);
        let stretched = warm_exec_us as f64 * (1.0 + self.interference * extra);
        stretched.min(u64::MAX as f64) as Micros
    }

    /// Moving `memory_mb` between host and device.
    pub fn prefetch_us(&self, memory_mb: u64) -> Micros {
        (memory_mb as f64 / self.pcie_mb_per_s * 1e6).min(u64::MAX as f64) as Micros
    }

    /// Paging `memory_mb` in on demand (stock UVM): slower than [`SimGpuModel::prefetch_us`].
    pub fn fault_in_us(&self, memory_mb: u64) -> Micros {
        let rate = self.pcie_mb_per_s * self.uvm_fault_efficiency;
        (memory_mb as f64 / rate * 1e6).round().min(u64::MAX as f64) as Micros
    }

    /// Evicting `memory_mb` on demand, before faulted or prefetched pages can land.
    pub fn evict_us(&self, memory_mb: u64) -> Micros {
        self.prefetch_us(memory_mb)
    }

    /// What a dispatch's memory movement adds to its critical path.
    pub fn paging_us(&self, paging: &GpuPaging) -> Micros {
        self.prefetch_us(paging.prefetch_mb)
            .saturating_add(self.fault_in_us(paging.fault_in_mb))
            .saturating_add(self.evict_us(paging.evict_mb))
    }

    /// A dispatched invocation on the device: its setup (the GPU sandbox's start `cold_us` when
    /// it starts cold, plus the paging charged to it) and its execution (`warm_us` stretched by
    /// the `concurrent` invocations on the device, itself included). The simulator and the
    /// worker's simulated GPUs time every run with this.
    pub fn run_us(
        &self,
        start: Start,
        cold_us: Micros,
        paging: &GpuPaging,
        warm_us: Micros,
        concurrent: u32,
    ) -> (Micros, Micros) {
        let started = match start {
            Start::Warm | Start::HostWarm => 0,
            Start::Cold => cold_us,
        };
        let setup_us = started.saturating_add(self.paging_us(paging));
        (setup_us, self.exec_us(warm_us, concurrent))
    }

    /// Device utilization with these invocations running, each given by its solo share
    /// (non-finite or negative shares count as 0).
    pub fn utilization(&self, running: &[f64]) -> f64 {
        let sum: f64 = running
            .iter()
            .map(|u| if u.is_finite() { u.max(0.0) } else { 0.0 })
            .sum();
        sum.min(1.0)
    }
}
