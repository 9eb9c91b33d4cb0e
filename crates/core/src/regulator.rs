//! The concurrency regulator (thesis ch. 5.3.1): how many queued invocations may run at once.
//!
//! Either a fixed limit, or TCP-like AIMD on the load: every adjustment period, the limit grows
//! by a constant while the normalized load stays under the threshold and is cut by a factor when
//! it crosses it.

use crate::time::Micros;
use serde::{Deserialize, Serialize};

/// AIMD parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AimdConfig {
    /// The limit never goes below this.
    pub min: u32,
    /// Nor above this (0: four times the CPUs).
    pub max: u32,
    /// Congestion: normalized 1-minute load average (load / CPUs) above this.
    pub threshold: f64,
    /// Added per period without congestion.
    pub increase: u32,
    /// Multiplied in on congestion.
    pub decrease: f64,
    /// Time between adjustments (the kernel's load average moves every 5 s).
    pub period_ms: u64,
}

impl Default for AimdConfig {
    fn default() -> Self {
        AimdConfig {
            min: 1,
            max: 0,
            threshold: 1.0,
            increase: 1,
            decrease: 0.5,
            period_ms: 5_000,
        }
    }
}

/// Fixed or dynamic concurrency.
#[derive(Debug, Clone, PartialEq)]
pub enum RegulatorConfig {
    Fixed(u32),
    Aimd(AimdConfig),
}

impl RegulatorConfig {
    pub fn name(&self) -> String {
        match self {
            RegulatorConfig::Fixed(n) => format!("fixed({n})"),
            RegulatorConfig::Aimd(_) => "aimd".into(),
        }
    }
}

/// The regulator's state.
#[derive(Debug, Clone)]
pub struct Regulator {
    config: RegulatorConfig,
    limit: u32,
    max: u32,
    next_adjust: Micros,
}

impl Regulator {
    /// `cpus` sets the starting AIMD limit and its default maximum.
    pub fn new(config: RegulatorConfig, cpus: u32) -> Self {
        let cpus = cpus.max(1);
        let (limit, max) = match &config {
            RegulatorConfig::Fixed(n) => ((*n).max(1), (*n).max(1)),
            RegulatorConfig::Aimd(a) => {
                let max = if a.max == 0 { 4 * cpus } else { a.max };
                (cpus.clamp(a.min.max(1), max.max(1)), max.max(1))
            }
        };
        Regulator {
            config,
            limit,
            max,
            next_adjust: 0,
        }
    }

    pub fn config(&self) -> &RegulatorConfig {
        &self.config
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// A load sample (normalized: load average / CPUs). AIMD adjusts at most once per period.
    pub fn on_load(&mut self, now: Micros, normalized_load: f64) {
        let RegulatorConfig::Aimd(a) = &self.config else {
            return;
        };
        if now < self.next_adjust {
            return;
        }
        self.next_adjust = now + a.period_ms * 1_000;
        self.limit = if normalized_load > a.threshold {
            ((self.limit as f64 * a.decrease).floor() as u32).max(a.min.max(1))
        } else {
            (self.limit + a.increase).min(self.max)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::secs;

    #[test]
    fn a_fixed_limit_ignores_the_load() {
        let mut r = Regulator::new(RegulatorConfig::Fixed(3), 8);
        r.on_load(secs(10), 50.0);
        assert_eq!(r.limit(), 3);
    }

    #[test]
    fn aimd_trajectory_under_a_scripted_load() {
        let cfg = AimdConfig {
            min: 1,
            max: 8,
            threshold: 1.0,
            increase: 1,
            decrease: 0.5,
            period_ms: 5_000,
        };
        let mut r = Regulator::new(RegulatorConfig::Aimd(cfg), 2);
        assert_eq!(r.limit(), 2, "starts at the CPU count");
        // One sample per second; the limit moves at most every 5 s.
        let loads = [
            0.2, 0.3, 0.4, 0.4, 0.5, // t=0: +1 → 3
            0.6, 0.7, 0.8, 0.9, 0.9, // t=5: +1 → 4
            1.5, 1.6, 1.4, 1.2, 1.1, // t=10: congestion → 2
            1.2, 1.0, 0.9, 0.8, 0.7, // t=15: still over → 1
            0.5, 0.4, 0.3, 0.2, 0.1, // t=20: +1 → 2
            0.1, 0.1, 0.1, 0.1, 0.1, // t=25: 3
            0.1, 0.1, 0.1, 0.1, 0.1, // t=30: 4
        ];
        let mut trajectory = Vec::new();
        for (t, load) in loads.iter().enumerate() {
            r.on_load(secs(t as u64), *load);
            if t % 5 == 0 {
                trajectory.push(r.limit());
            }
        }
        assert_eq!(trajectory, [3, 4, 2, 1, 2, 3, 4]);
        for t in 35..200 {
            r.on_load(secs(t), 0.0);
        }
        assert_eq!(r.limit(), 8, "capped at max");
    }
}
