//! Elastic vertical scaling (thesis §3.4.2, Eq. 3.3): every interval, resize the worker's memory
//! so that its cold starts per second (the *miss speed*) approach a target.
//!
//! A sans-I/O state machine: the driver reports arrivals ([`ElasticController::on_arrival`]) and
//! cold starts ([`ElasticController::on_cold_start`]), calls
//! [`ElasticController::on_timeout`] at [`ElasticController::next_timeout`], and applies the
//! [`Decision`] it may return (the worker and the simulator hand it to
//! [`crate::WorkerEngine::set_memory_budget`]).
//!
//! The rule, at the end of each interval, with `s` the observed miss speed (smoothed over
//! intervals), `s*` the target and `c` the current size:
//! * if `|s − s*| ≤ dead_band · s*`, nothing changes (the thesis's 30 % dead band);
//! * otherwise the new miss ratio is `m' = m(c) · s*/s`, `m(c) = 1 − HR(c)` read off the
//!   hit-ratio curve: the miss ratio is corrected in proportion to the relative error in miss
//!   speed (the factor `s*/s` is bounded to [1/4, 4] per step; no miss at all counts as 4);
//! * the new size `c'` is the smallest with `HR(c') ≥ 1 − m'` (the curve inverted, Eq. 3.3),
//!   bounded to `[min_mb, max_mb]`.
//!
//! When the curve matches what the worker sees (`s = λ·m(c)`, λ the arrival rate), `m' = s*/λ`,
//! which is Eq. 3.3 with `s* = (1 − h)·λ̄`; where the curve is off (concurrent sandboxes,
//! dropped requests: thesis Fig. 3.2) the correction still moves the size the right way.

use super::curve::{CurveBuilder, HitRatioCurve};
use crate::time::{secs, Micros};
use serde::Serialize;

/// The thesis's controller period: 10 minutes.
pub const DEFAULT_INTERVAL_US: Micros = secs(600);
/// The thesis's dead band: no change unless the miss speed is off by more than 30 %.
pub const DEFAULT_DEAD_BAND: f64 = 0.3;
/// Weight of the newest interval in the smoothed rates.
pub const DEFAULT_SMOOTHING: f64 = 0.5;
/// The most the miss ratio is multiplied or divided by in one step.
pub const MAX_STEP: f64 = 4.0;

/// Bounds on what a configuration may say.
const MIN_INTERVAL_US: Micros = secs(1);
const MAX_INTERVAL_US: Micros = secs(7 * 86_400);
const MAX_TARGET_MISS_SPEED: f64 = 1e6;
/// 1 PiB in MiB.
pub const MAX_MEMORY_MB: u64 = 1 << 30;

/// The controller's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ElasticConfig {
    /// How often the size is reconsidered.
    pub interval_us: Micros,
    /// Cold starts per second to aim at (> 0).
    pub target_miss_speed: f64,
    /// Relative error tolerated without a change, in [0, 1).
    pub dead_band: f64,
    /// The size never goes below or above these (MiB).
    pub min_mb: u64,
    pub max_mb: u64,
    /// Weight of the newest interval in the smoothed miss speed and arrival rate, in (0, 1]
    /// (1: no smoothing).
    pub smoothing: f64,
}

/// A configuration the controller cannot work with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ElasticConfigError {
    #[error("the interval must be between 1 s and 7 days, got {0} µs")]
    Interval(Micros),
    #[error("the target miss speed must be a positive number of cold starts per second (at most 1e6), got {0}")]
    Target(f64),
    #[error("the dead band must be in [0, 1), got {0}")]
    DeadBand(f64),
    #[error("the smoothing weight must be in (0, 1], got {0}")]
    Smoothing(f64),
    #[error("the size bounds must satisfy 0 < min ≤ max ≤ {MAX_MEMORY_MB} MiB, got min {min_mb} and max {max_mb}")]
    Bounds { min_mb: u64, max_mb: u64 },
}

impl ElasticConfig {
    /// The thesis's settings (10 minutes, 30 % dead band) around `target_miss_speed`.
    pub fn new(target_miss_speed: f64, min_mb: u64, max_mb: u64) -> Self {
        ElasticConfig {
            interval_us: DEFAULT_INTERVAL_US,
            target_miss_speed,
            dead_band: DEFAULT_DEAD_BAND,
            min_mb,
            max_mb,
            smoothing: DEFAULT_SMOOTHING,
        }
    }

    pub fn validate(&self) -> Result<(), ElasticConfigError> {
        if !(MIN_INTERVAL_US..=MAX_INTERVAL_US).contains(&self.interval_us) {
            return Err(ElasticConfigError::Interval(self.interval_us));
        }
        let t = self.target_miss_speed;
        if !(t > 0.0 && t <= MAX_TARGET_MISS_SPEED) {
            return Err(ElasticConfigError::Target(t));
        }
        if !(self.dead_band >= 0.0 && self.dead_band < 1.0) {
            return Err(ElasticConfigError::DeadBand(self.dead_band));
        }
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return Err(ElasticConfigError::Smoothing(self.smoothing));
        }
        if self.min_mb == 0 || self.min_mb > self.max_mb || self.max_mb > MAX_MEMORY_MB {
            return Err(ElasticConfigError::Bounds {
                min_mb: self.min_mb,
                max_mb: self.max_mb,
            });
        }
        Ok(())
    }
}

/// Where the controller's hit-ratio curve comes from.
#[derive(Debug, Clone)]
pub enum CurveSource {
    /// Made beforehand from a trace (the thesis's preparation phase).
    Fixed(HitRatioCurve),
    /// Made as invocations arrive (every arrival is recorded; sample to bound the cost).
    Online(CurveBuilder),
}

/// One interval's reading and what came of it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Decision {
    /// When the interval ended.
    pub at: Micros,
    pub from_mb: u64,
    pub to_mb: u64,
    /// Smoothed cold starts per second and arrivals per second.
    pub miss_speed: f64,
    pub arrival_rate: f64,
    /// `(s − s*) / s*`.
    pub error: f64,
    /// The miss ratio aimed at (`m'`); `None` inside the dead band.
    pub miss_ratio: Option<f64>,
}

/// The elastic controller.
#[derive(Debug, Clone)]
pub struct ElasticController {
    config: ElasticConfig,
    curve: CurveSource,
    size_mb: u64,
    window_start: Micros,
    next_at: Micros,
    arrivals: u64,
    misses: u64,
    miss_speed: Option<f64>,
    arrival_rate: Option<f64>,
    last: Option<Decision>,
    resizes: u64,
}

impl ElasticController {
    /// A controller starting at `initial_mb` (bounded to the config's range) at time `now`.
    pub fn new(
        config: ElasticConfig,
        curve: CurveSource,
        initial_mb: u64,
        now: Micros,
    ) -> Result<Self, ElasticConfigError> {
        config.validate()?;
        Ok(ElasticController {
            size_mb: initial_mb.clamp(config.min_mb, config.max_mb),
            next_at: now.saturating_add(config.interval_us),
            window_start: now,
            config,
            curve,
            arrivals: 0,
            misses: 0,
            miss_speed: None,
            arrival_rate: None,
            last: None,
            resizes: 0,
        })
    }

    pub fn config(&self) -> &ElasticConfig {
        &self.config
    }

    /// The size the controller wants now (MiB).
    pub fn size_mb(&self) -> u64 {
        self.size_mb
    }

    /// The last interval's reading, if one ended.
    pub fn last(&self) -> Option<&Decision> {
        self.last.as_ref()
    }

    /// Times the size changed.
    pub fn resizes(&self) -> u64 {
        self.resizes
    }

    /// The curve the controller reads now.
    pub fn curve(&self) -> HitRatioCurve {
        match &self.curve {
            CurveSource::Fixed(c) => c.clone(),
            CurveSource::Online(b) => b.curve(),
        }
    }

    /// An invocation of `function` (needing `memory_mb`) arrived.
    pub fn on_arrival(&mut self, function: &str, memory_mb: u64) {
        self.arrivals += 1;
        if let CurveSource::Online(b) = &mut self.curve {
            b.record(function, memory_mb);
        }
    }

    /// An invocation started cold (a miss).
    pub fn on_cold_start(&mut self) {
        self.misses += 1;
    }

    /// When [`Self::on_timeout`] next has an interval to close.
    pub fn next_timeout(&self) -> Micros {
        self.next_at
    }

    /// Closes the interval if it is over; returns the reading when the size changed.
    pub fn on_timeout(&mut self, now: Micros) -> Option<Decision> {
        if now < self.next_at {
            return None;
        }
        let elapsed_s = (now.saturating_sub(self.window_start)).max(1) as f64 / 1e6;
        let (speed, rate) = (
            self.misses as f64 / elapsed_s,
            self.arrivals as f64 / elapsed_s,
        );
        let w = self.config.smoothing;
        let smooth = |old: Option<f64>, new: f64| old.map_or(new, |o| w * new + (1.0 - w) * o);
        let s = smooth(self.miss_speed, speed);
        let lambda = smooth(self.arrival_rate, rate);
        self.miss_speed = Some(s);
        self.arrival_rate = Some(lambda);
        self.arrivals = 0;
        self.misses = 0;
        self.window_start = now;
        self.next_at = now.saturating_add(self.config.interval_us);
        let target = self.config.target_miss_speed;
        let error = (s - target) / target;
        let from_mb = self.size_mb;
        let mut decision = Decision {
            at: now,
            from_mb,
            to_mb: from_mb,
            miss_speed: s,
            arrival_rate: lambda,
            error,
            miss_ratio: None,
        };
        let curve = self.curve();
        if error.abs() > self.config.dead_band && !curve.is_empty() {
            let factor = if s > 0.0 {
                (target / s).clamp(1.0 / MAX_STEP, MAX_STEP)
            } else {
                MAX_STEP
            };
            // The curve's own miss ratio here, never 0 (every sample has misses somewhere).
            let floor = 1.0 / curve.sampled.max(1) as f64;
            let m_now = (1.0 - curve.hit_ratio(from_mb)).max(floor);
            let m_new = (m_now * factor).clamp(0.0, 1.0);
            decision.miss_ratio = Some(m_new);
            // Past the curve's reach: the size at which it stops growing.
            let want = curve
                .size_reaching(1.0 - m_new)
                .unwrap_or_else(|| curve.max_useful_mb().max(from_mb));
            decision.to_mb = want.clamp(self.config.min_mb, self.config.max_mb);
        }
        self.last = Some(decision);
        if decision.to_mb == from_mb {
            return None;
        }
        self.size_mb = decision.to_mb;
        self.resizes += 1;
        Some(decision)
    }
}
