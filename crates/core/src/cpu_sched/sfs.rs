//! SFS (Fu et al., SC '22): every invocation first runs FIFO at a high priority for one slice,
//! the same for all functions; an invocation still running after it is demoted to fair
//! sharing. The adaptive slice follows SFS' published prototype: the mean inter-arrival time of
//! the last `period` arrivals times the CPU count, never below `min_slice_ms`; an invocation
//! that waited more than `overload_factor` slices for the FIFO level skips it.

use super::config::{CpuSchedError, SfsConfig, SfsMode, NEUTRAL_RANK};
use super::Slice;
use crate::time::Micros;

#[derive(Debug, Clone)]
pub struct Sfs {
    config: SfsConfig,
    cpus: u32,
    slice_us: Micros,
    /// Arrivals counted towards the next adaptive update, and when the first of them came.
    batch: u32,
    batch_from: Option<Micros>,
    updates: u64,
}

impl Sfs {
    pub fn new(config: SfsConfig, cpus: u32) -> Result<Self, CpuSchedError> {
        config.validate()?;
        if !(1..=4096).contains(&cpus) {
            return Err(CpuSchedError::Cpus(cpus));
        }
        let slice_us = config.slice_ms * 1_000;
        Ok(Sfs {
            config,
            cpus,
            slice_us,
            batch: 0,
            batch_from: None,
            updates: 0,
        })
    }

    pub fn config(&self) -> &SfsConfig {
        &self.config
    }

    /// An invocation arrived at `now` (the adaptive slice follows the arrival rate).
    pub fn arrived(&mut self, now: Micros) {
        if self.config.mode == SfsMode::Fixed {
            return;
        }
        let Some(from) = self.batch_from else {
            self.batch_from = Some(now);
            return;
        };
        self.batch += 1;
        if self.batch < self.config.period {
            return;
        }
        // `period` inter-arrival times ended at `now`.
        let mean_iat = now.saturating_sub(from) as f64 / f64::from(self.batch);
        let lo = self.config.min_slice_ms * 1_000;
        let hi = self.config.max_slice_ms * 1_000;
        self.slice_us = ((mean_iat * f64::from(self.cpus)).round() as Micros).clamp(lo, hi);
        self.batch = 0;
        self.batch_from = Some(now);
        self.updates += 1;
    }

    /// The current slice.
    pub fn slice_us(&self) -> Micros {
        self.slice_us
    }

    /// Every function: the neutral rank (FIFO among equals) and the current slice.
    pub fn policy_for(&self, _function: &str) -> Slice {
        Slice {
            rank: NEUTRAL_RANK,
            slice_us: self.slice_us,
        }
    }

    /// How long an invocation may wait for the FIFO level before it goes to fair sharing
    /// directly (None: never).
    pub fn overload_wait_us(&self) -> Option<Micros> {
        (self.config.overload_factor > 0.0)
            .then(|| (self.slice_us as f64 * self.config.overload_factor).round() as Micros)
    }

    /// Adaptive updates so far.
    pub fn updates(&self) -> u64 {
        self.updates
    }
}
