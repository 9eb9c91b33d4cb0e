//! Server provisioning (thesis ch. 3.4, FaasCache): how much memory a worker needs for a
//! workload, and how to resize it as the load changes.
//!
//! * [`reuse`]: reuse distances (Eq. 3.2) in O(log M) per invocation.
//! * [`shards`]: SHARDS spatial sampling, so a long trace costs a fraction of the work.
//! * [`curve`]: the hit-ratio curve (the CDF of the memory each invocation needs to hit),
//!   static sizing at a target hit ratio, and the curve's knee.
//! * [`elastic`]: the elastic vertical-scaling controller (Eq. 3.3), a sans-I/O state machine.
//!
//! Like the rest of the core: no I/O, no clocks; times are the driver's [`crate::Micros`].

pub mod curve;
pub mod elastic;
pub mod reuse;
pub mod shards;

pub use curve::{CurveBuilder, CurvePoint, HitRatioCurve, Knee};
pub use elastic::{CurveSource, Decision, ElasticConfig, ElasticConfigError, ElasticController};
pub use shards::Sampler;

use serde::Serialize;

/// A provisioning input out of range.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum ProvisionError {
    #[error("the target hit ratio must be in (0, 1], got {0}")]
    BadHitRatio(f64),
    #[error("the sample rate must be in (0, 1], got {0}")]
    BadSampleRate(f64),
}

/// Static provisioning's two answers for one curve (thesis §3.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StaticSizing {
    /// The target hit ratio asked for.
    pub target_hit_ratio: f64,
    /// The smallest memory reaching it; `None` when compulsory misses put it out of reach.
    pub target_mb: Option<u64>,
    /// The curve's knee.
    pub knee: Option<Knee>,
    /// The best hit ratio at any size, and the memory past which nothing more is gained.
    pub max_hit_ratio: f64,
    pub max_useful_mb: u64,
}

impl StaticSizing {
    pub fn of(curve: &HitRatioCurve, target_hit_ratio: f64) -> Result<Self, ProvisionError> {
        Ok(StaticSizing {
            target_hit_ratio,
            target_mb: curve.size_for(target_hit_ratio)?,
            knee: curve.knee(),
            max_hit_ratio: curve.max_hit_ratio(),
            max_useful_mb: curve.max_useful_mb(),
        })
    }
}

#[cfg(test)]
mod tests;
