//! Horizontal autoscaling: how many workers the cluster should have (CH-RLU paper §4.7, thesis
//! ch. 4.4: "a simple PID controller with hysteresis ... using server load averages as the input
//! control signal ... conservative, with a large dead-band of 5 minutes, and scaling is triggered
//! only if at least 50% of the servers are overloaded").
//!
//! [`Autoscaler`] is a synchronous state machine like the balancer: its driver hands it the time
//! and the last reported load of every *active* worker (in the ring, not draining) with
//! [`Autoscaler::observe`], and gets at most one [`ScaleDecision`] back. It never reads a clock
//! and never starts or stops anything: the simulator adds and drains simulated workers, the
//! controller runs an operator's command or webhook.
//!
//! The control signal is the mean of the workers' normalized loads (the balancer's
//! [`crate::balance::WorkerLoad::load`]). A PID term on its error from `target_load` says how far
//! and how persistently the cluster is off; three guards make it conservative:
//!
//! * **hysteresis (value band):** scaling out needs at least `overloaded_share` of the workers
//!   above `scale_out_load`; scaling in needs every worker below `scale_in_load`; and the PID
//!   output must agree in sign (half the workers overloaded while the others idle is a balancing
//!   problem, not a capacity one);
//! * **dead band (time):** no action within `dead_band_ms` of the previous one, which also covers
//!   the time a new worker takes to start and join;
//! * **bounds:** the count never leaves `[min_workers, max_workers]`; a cluster outside them is
//!   brought back (still at most one action per dead band).

use crate::time::Micros;
use serde::{Deserialize, Serialize};

/// The autoscaler's parameters (`[autoscale]` in the controller's config; `hearth sim
/// --autoscale`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutoscaleParams {
    /// Fewest active workers; below it, workers are added whatever the load.
    pub min_workers: u32,
    /// Most active workers.
    pub max_workers: u32,
    /// The set point: the mean normalized load the controller steers towards.
    pub target_load: f64,
    /// A worker above this load is overloaded (the upper edge of the value band).
    pub scale_out_load: f64,
    /// Workers are removed only while every one is below this load (the lower edge).
    pub scale_in_load: f64,
    /// Share of active workers that must be overloaded before scaling out (the paper's 50 %).
    pub overloaded_share: f64,
    /// No action within this long after the previous one (the paper's 5 minutes).
    pub dead_band_ms: u64,
    /// Proportional gain on the load error (mean − target).
    pub kp: f64,
    /// Integral gain, per second of accumulated error: a load that stays high keeps pushing.
    pub ki: f64,
    /// Derivative gain, in seconds: a load that rises fast pushes earlier.
    pub kd: f64,
    /// Most workers one action adds or removes (the paper adds one at a time).
    pub max_step: u32,
}

impl Default for AutoscaleParams {
    fn default() -> Self {
        AutoscaleParams {
            min_workers: 1,
            max_workers: 16,
            target_load: 0.7,
            scale_out_load: 1.0,
            scale_in_load: 0.3,
            overloaded_share: 0.5,
            dead_band_ms: 5 * 60 * 1000,
            kp: 1.0,
            ki: 0.005,
            kd: 0.0,
            max_step: 1,
        }
    }
}

/// Most workers an autoscaler may manage, and most one action may change.
pub const MAX_WORKERS: u32 = 10_000;
/// Largest load any threshold may be (far above any b_max that means something).
pub const MAX_LOAD: f64 = 1_000.0;
/// Longest dead band: a day.
pub const MAX_DEAD_BAND_MS: u64 = 24 * 3600 * 1000;
/// Largest gain.
pub const MAX_GAIN: f64 = 1_000.0;

/// Parameters that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AutoscaleError {
    #[error("autoscale {0} must be between {1} and {2}, got {3}")]
    OutOfRange(&'static str, u64, u64, u64),
    #[error("autoscale min_workers ({min}) must not exceed max_workers ({max})")]
    MinAboveMax { min: u32, max: u32 },
    #[error("autoscale {0} must be a finite number above 0 and at most {1}, got {2}")]
    BadLoad(&'static str, f64, f64),
    #[error(
        "autoscale loads must satisfy scale_in_load < target_load < scale_out_load, got {scale_in} < {target} < {scale_out}"
    )]
    BandOrder {
        scale_in: f64,
        target: f64,
        scale_out: f64,
    },
    #[error("autoscale overloaded_share must be above 0 and at most 1, got {0}")]
    BadShare(f64),
    #[error("autoscale gain {0} must be a finite number from 0 to {1}, got {2}")]
    BadGain(&'static str, f64, f64),
    #[error("autoscale kp must be above 0 (the proportional term decides the direction)")]
    NoProportional,
}

impl AutoscaleParams {
    pub fn check(&self) -> Result<(), AutoscaleError> {
        let range = |name, v: u64, lo, hi| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(AutoscaleError::OutOfRange(name, lo, hi, v))
            }
        };
        range(
            "max_workers",
            self.max_workers.into(),
            1,
            MAX_WORKERS.into(),
        )?;
        range(
            "min_workers",
            self.min_workers.into(),
            0,
            MAX_WORKERS.into(),
        )?;
        if self.min_workers > self.max_workers {
            return Err(AutoscaleError::MinAboveMax {
                min: self.min_workers,
                max: self.max_workers,
            });
        }
        range("max_step", self.max_step.into(), 1, MAX_WORKERS.into())?;
        range("dead_band_ms", self.dead_band_ms, 0, MAX_DEAD_BAND_MS)?;
        for (name, v) in [
            ("target_load", self.target_load),
            ("scale_out_load", self.scale_out_load),
            ("scale_in_load", self.scale_in_load),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= MAX_LOAD) {
                return Err(AutoscaleError::BadLoad(name, MAX_LOAD, v));
            }
        }
        if !(self.scale_in_load < self.target_load && self.target_load < self.scale_out_load) {
            return Err(AutoscaleError::BandOrder {
                scale_in: self.scale_in_load,
                target: self.target_load,
                scale_out: self.scale_out_load,
            });
        }
        let s = self.overloaded_share;
        if !(s.is_finite() && s > 0.0 && s <= 1.0) {
            return Err(AutoscaleError::BadShare(s));
        }
        for (name, v) in [("kp", self.kp), ("ki", self.ki), ("kd", self.kd)] {
            if !(v.is_finite() && (0.0..=MAX_GAIN).contains(&v)) {
                return Err(AutoscaleError::BadGain(name, MAX_GAIN, v));
            }
        }
        if self.kp == 0.0 {
            return Err(AutoscaleError::NoProportional);
        }
        Ok(())
    }

    pub fn dead_band_us(&self) -> Micros {
        self.dead_band_ms.saturating_mul(1_000)
    }
}

/// One active worker's last reported load. `worker` is the driver's own id for it, handed back
/// in [`ScaleDecision::remove`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub worker: u32,
    pub load: f64,
}

/// Which way to scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Out,
    In,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Out => "out",
            Direction::In => "in",
        }
    }
}

/// What triggered a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// The load: enough workers over `scale_out_load`, or all under `scale_in_load`.
    Load,
    /// Fewer active workers than `min_workers`.
    BelowMin,
    /// More active workers than `max_workers`.
    AboveMax,
}

/// A decision, with what it was based on (for the operator's command, logs and plots).
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleDecision {
    pub direction: Direction,
    /// Workers to add or remove (≥ 1).
    pub count: u32,
    /// Active workers when it was taken.
    pub workers: u32,
    /// Active workers once it is carried out: within `[min_workers, max_workers]`.
    pub target_workers: u32,
    /// Scaling in: the workers to drain, least loaded first (ties: the highest id, the newest).
    /// Empty when scaling out.
    pub remove: Vec<u32>,
    pub trigger: Trigger,
    pub mean_load: f64,
    /// Workers over `scale_out_load`.
    pub overloaded: u32,
    /// The PID output (in load units, like the error).
    pub control: f64,
}

impl ScaleDecision {
    /// One line saying why, for logs and the operator's hook.
    pub fn reason(&self) -> String {
        let what = match self.trigger {
            Trigger::Load => match self.direction {
                Direction::Out => "overloaded workers",
                Direction::In => "every worker under the scale-in load",
            },
            Trigger::BelowMin => "fewer workers than min_workers",
            Trigger::AboveMax => "more workers than max_workers",
        };
        format!(
            "{what}: {} of {} over the scale-out load, mean load {:.2}, control {:+.2}",
            self.overloaded, self.workers, self.mean_load, self.control
        )
    }
}

/// The controller's state: the PID's memory and the last action.
#[derive(Debug, Clone)]
pub struct Autoscaler {
    params: AutoscaleParams,
    /// ∫ error dt, in load × seconds, clamped so that `ki × integral` stays within ±target.
    integral: f64,
    last_error: Option<f64>,
    last_sample: Option<Micros>,
    last_action: Option<Micros>,
}

/// Longest gap between two samples the integral counts (a driver that paused must not wind it
/// up by the whole pause).
const MAX_SAMPLE_GAP_S: f64 = 60.0;

impl Autoscaler {
    pub fn new(params: AutoscaleParams) -> Result<Self, AutoscaleError> {
        params.check()?;
        Ok(Autoscaler {
            params,
            integral: 0.0,
            last_error: None,
            last_sample: None,
            last_action: None,
        })
    }

    pub fn params(&self) -> &AutoscaleParams {
        &self.params
    }

    /// When the last action was taken.
    pub fn last_action(&self) -> Option<Micros> {
        self.last_action
    }

    /// Whether `now` is still within the dead band of the last action.
    pub fn in_dead_band(&self, now: Micros) -> bool {
        self.last_action
            .is_some_and(|t| now.saturating_sub(t) < self.params.dead_band_us())
    }

    /// One control step with the active workers' last reported loads (non-finite or negative
    /// loads count as 0). Returns a decision, which the driver is expected to carry out: the
    /// dead band starts now.
    pub fn observe(&mut self, now: Micros, samples: &[Sample]) -> Option<ScaleDecision> {
        let p = &self.params;
        let n = samples.len() as u32;
        let load = |s: &Sample| {
            if s.load.is_finite() {
                s.load.clamp(0.0, MAX_LOAD)
            } else {
                0.0
            }
        };
        let mean = if n == 0 {
            0.0
        } else {
            samples.iter().map(load).sum::<f64>() / f64::from(n)
        };
        let overloaded = samples
            .iter()
            .filter(|s| load(s) > p.scale_out_load)
            .count() as u32;
        let all_under = samples.iter().all(|s| load(s) < p.scale_in_load);

        // The PID step (time in seconds).
        let error = mean - p.target_load;
        let dt = self
            .last_sample
            .map(|t| (now.saturating_sub(t) as f64 / 1e6).min(MAX_SAMPLE_GAP_S));
        // Anti-windup: at a bound the cluster cannot follow the error, so it is not summed
        // (else a long overload at max_workers would hold back the scale-in that follows).
        let saturated = (n >= p.max_workers && error > 0.0) || (n <= p.min_workers && error < 0.0);
        if let (Some(dt), false) = (dt, saturated) {
            self.integral += error * dt;
            if p.ki > 0.0 {
                let limit = p.target_load / p.ki;
                self.integral = self.integral.clamp(-limit, limit);
            }
        }
        let derivative = match (dt, self.last_error) {
            (Some(dt), Some(prev)) if dt > 0.0 => (error - prev) / dt,
            _ => 0.0,
        };
        self.last_error = Some(error);
        self.last_sample = Some(now);
        let control = p.kp * error + p.ki * self.integral + p.kd * derivative;

        if self.in_dead_band(now) {
            return None;
        }
        let decision = |direction, count: u32, trigger, remove| ScaleDecision {
            direction,
            count,
            workers: n,
            target_workers: match direction {
                Direction::Out => n + count,
                Direction::In => n - count,
            },
            remove,
            trigger,
            mean_load: mean,
            overloaded,
            control,
        };
        let least_loaded = |count: u32| {
            let mut by_load: Vec<(f64, u32)> =
                samples.iter().map(|s| (load(s), s.worker)).collect();
            by_load.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
            by_load
                .into_iter()
                .take(count as usize)
                .map(|(_, w)| w)
                .collect::<Vec<u32>>()
        };
        let out = if n < p.min_workers {
            Some(decision(
                Direction::Out,
                (p.min_workers - n).min(p.max_step),
                Trigger::BelowMin,
                Vec::new(),
            ))
        } else if n > p.max_workers {
            let count = (n - p.max_workers).min(p.max_step);
            Some(decision(
                Direction::In,
                count,
                Trigger::AboveMax,
                least_loaded(count),
            ))
        } else if n > 0
            && n < p.max_workers
            && control > 0.0
            && f64::from(overloaded) >= p.overloaded_share * f64::from(n)
        {
            // The workers that would bring the mean to the target with the same total work,
            // n × mean / target − n, is n × error / target: the PID output in workers.
            let want = (f64::from(n) * control / p.target_load).ceil();
            let count = (want.clamp(1.0, f64::from(p.max_step)) as u32).min(p.max_workers - n);
            Some(decision(Direction::Out, count, Trigger::Load, Vec::new()))
        } else if n > p.min_workers && control < 0.0 && all_under {
            let want = (f64::from(n) * -control / p.target_load).floor();
            let count = (want.clamp(1.0, f64::from(p.max_step)) as u32).min(n - p.min_workers);
            Some(decision(
                Direction::In,
                count,
                Trigger::Load,
                least_loaded(count),
            ))
        } else {
            None
        };
        if out.is_some() {
            self.last_action = Some(now);
            // The error that led here is acted on: do not let it push the next action too.
            self.integral = 0.0;
        }
        out
    }
}

#[cfg(test)]
mod tests;
