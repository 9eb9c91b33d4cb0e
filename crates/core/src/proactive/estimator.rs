//! Demand estimation (Atoll §4.3.1): how many sandboxes a function needs set up ahead of time.
//!
//! The default [`PoissonEstimator`] measures each function's arrival rate over fixed intervals,
//! smooths it with an exponentially weighted moving average, models arrivals as Poisson and takes
//! the inverse CDF at a high quantile of the arrivals expected while one sandbox is being set up.
//! The [`DemandEstimator`] trait keeps the estimator pluggable, as the paper's programmable SGS
//! estimator is.

use crate::time::Micros;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A pluggable demand estimator, driven with the caller's time.
pub trait DemandEstimator {
    /// One request of `function` arrived at `now`.
    fn on_arrival(&mut self, function: &str, now: Micros);
    /// Time passed to `now`: closes elapsed intervals and forgets idle functions.
    fn tick(&mut self, now: Micros);
    /// Sandboxes `function` needs at `now`, given its sandbox set-up time and execution time.
    fn estimate(&self, function: &str, now: Micros, setup_us: Micros, exec_us: Micros) -> u32;
}

/// Why a [`PoissonConfig`] was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EstimatorError {
    #[error("quantile must lie strictly between 0 and 1, got {0}")]
    Quantile(f64),
    #[error("alpha must lie in (0, 1], got {0}")]
    Alpha(f64),
    #[error("interval must be at least 1 µs")]
    Interval,
    #[error("forget_after_intervals must be at least 1")]
    ForgetAfter,
}

/// Settings of the [`PoissonEstimator`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoissonConfig {
    /// Length of one measuring interval (the paper's prototype: 100 ms).
    pub interval_us: Micros,
    /// EWMA weight of the newest interval's rate. The paper does not give its value; 0.5 here.
    pub alpha: f64,
    /// Quantile of the Poisson distribution taken as "the maximum arrivals in T" (0.99).
    pub quantile: f64,
    /// A function with no arrival for this many whole intervals is forgotten (its estimate
    /// snaps to 0). With α = 0.5 the rate has decayed by 2^-100 by then anyway; this bounds the
    /// memory to the functions that arrived in the last `forget_after_intervals` intervals.
    pub forget_after_intervals: u32,
}

impl Default for PoissonConfig {
    fn default() -> Self {
        PoissonConfig {
            interval_us: 100_000,
            alpha: 0.5,
            quantile: 0.99,
            forget_after_intervals: 100,
        }
    }
}

impl PoissonConfig {
    pub fn validate(&self) -> Result<(), EstimatorError> {
        if !(self.quantile > 0.0 && self.quantile < 1.0) {
            return Err(EstimatorError::Quantile(self.quantile));
        }
        if !(self.alpha > 0.0 && self.alpha <= 1.0) {
            return Err(EstimatorError::Alpha(self.alpha));
        }
        if self.interval_us == 0 {
            return Err(EstimatorError::Interval);
        }
        if self.forget_after_intervals == 0 {
            return Err(EstimatorError::ForgetAfter);
        }
        Ok(())
    }
}

/// One function's measurement.
#[derive(Debug, Clone)]
struct Rate {
    /// Start of the open interval (a multiple of the interval length).
    open_at: Micros,
    /// Arrivals in the open interval.
    count: u64,
    /// Smoothed rate in requests per second as of `open_at`.
    rate: f64,
    /// Start of the interval of the latest arrival.
    last_arrival_at: Micros,
}

/// EWMA of per-interval arrival rates, Poisson inverse CDF over the set-up time.
#[derive(Debug, Clone)]
pub struct PoissonEstimator {
    config: PoissonConfig,
    rates: HashMap<String, Rate>,
}

impl PoissonEstimator {
    pub fn new(config: PoissonConfig) -> Result<Self, EstimatorError> {
        config.validate()?;
        Ok(PoissonEstimator {
            config,
            rates: HashMap::new(),
        })
    }

    pub fn config(&self) -> &PoissonConfig {
        &self.config
    }

    /// Functions currently remembered (the memory bound in [`PoissonConfig`]).
    pub fn tracked(&self) -> usize {
        self.rates.len()
    }

    /// The smoothed arrival rate (per second) of `function` as of `now`, counting the intervals
    /// closed by `now` (the open one is not counted yet).
    pub fn rate(&self, function: &str, now: Micros) -> f64 {
        self.rates
            .get(function)
            .filter(|r| !self.forgotten(r, now))
            .map_or(0.0, |r| self.advanced(r, now).rate)
    }

    fn align(&self, now: Micros) -> Micros {
        now - now % self.config.interval_us
    }

    /// `r` rolled forward to the interval holding `now`, in O(1) whatever the gap: the first
    /// closed interval has its count, every further one is empty, so the rate decays by
    /// (1 − α)^k.
    fn advanced(&self, r: &Rate, now: Micros) -> Rate {
        let interval = self.config.interval_us;
        if now < r.open_at + interval {
            return r.clone();
        }
        let alpha = self.config.alpha;
        let measured = r.count as f64 * 1e6 / interval as f64;
        let mut rate = alpha * measured + (1.0 - alpha) * r.rate;
        let open_at = self.align(now);
        let empty = (open_at - r.open_at) / interval - 1;
        if empty > 0 {
            let k = i32::try_from(empty).unwrap_or(i32::MAX);
            rate *= (1.0 - alpha).powi(k);
        }
        Rate {
            open_at,
            count: 0,
            rate,
            last_arrival_at: r.last_arrival_at,
        }
    }

    fn forgotten(&self, r: &Rate, now: Micros) -> bool {
        let idle = self.align(now).saturating_sub(r.last_arrival_at) / self.config.interval_us;
        idle > u64::from(self.config.forget_after_intervals)
    }
}

impl DemandEstimator for PoissonEstimator {
    fn on_arrival(&mut self, function: &str, now: Micros) {
        // Updated in place: no key allocation for a function already measured.
        if let Some(r) = self.rates.get(function).filter(|r| !self.forgotten(r, now)) {
            // An arrival stamped before the open interval (a late report) counts in it.
            let mut next = self.advanced(r, now);
            next.count += 1;
            next.last_arrival_at = next.open_at;
            if let Some(slot) = self.rates.get_mut(function) {
                *slot = next;
            }
            return;
        }
        let open_at = self.align(now);
        let fresh = Rate {
            open_at,
            count: 1,
            rate: 0.0,
            last_arrival_at: open_at,
        };
        self.rates.insert(function.to_owned(), fresh);
    }

    fn tick(&mut self, now: Micros) {
        let mut rates = std::mem::take(&mut self.rates);
        rates.retain(|_, r| !self.forgotten(r, now));
        for r in rates.values_mut() {
            *r = self.advanced(r, now);
        }
        self.rates = rates;
    }

    /// Reading of "scale up … to account for requests that overflow from the current time
    /// interval to the next": a sandbox serving a request that runs longer than the set-up
    /// time T is still busy when the next T's arrivals come, so the window whose arrivals need
    /// a sandbox each is the execution time, not T: the quantile is taken over
    /// rate × max(T, exec) (by Little's law its mean is the busy sandboxes). Multiplying the
    /// quantile over T by ⌈exec / T⌉ instead asked 38 sandboxes of a 1.5 s function set up in
    /// 40 ms called once a second (`hearth experiment atoll`). A zero set-up time needs no
    /// proactive sandboxes.
    fn estimate(&self, function: &str, now: Micros, setup_us: Micros, exec_us: Micros) -> u32 {
        if setup_us == 0 {
            return 0;
        }
        let window = setup_us.max(exec_us);
        let mean = self.rate(function, now) * window as f64 / 1e6;
        poisson_quantile(mean, self.config.quantile)
    }
}

/// Above this mean the normal approximation is used instead of summing the pmf.
const NORMAL_ABOVE: f64 = 1000.0;

/// The smallest k with P(X ≤ k) ≥ q for X ~ Poisson(mean); 0 for a mean of 0 (or not finite and
/// negative). Sums the pmf by its recurrence in log space (no underflow of e^-mean) up to a mean
/// of 1000, then uses the normal approximation with continuity correction and the
/// Cornish–Fisher skewness term.
pub fn poisson_quantile(mean: f64, q: f64) -> u32 {
    if mean.is_nan() || mean <= 0.0 || q <= 0.0 {
        return 0;
    }
    if mean > NORMAL_ABOVE {
        let z = normal_quantile(q.min(1.0 - 1e-15));
        let k = (mean + z * mean.sqrt() + (z * z - 1.0) / 6.0 - 0.5).ceil();
        return if k <= 0.0 {
            0
        } else if k >= f64::from(u32::MAX) {
            u32::MAX
        } else {
            k as u32
        };
    }
    let ln_mean = mean.ln();
    // Far enough into the tail that the cdf is 1 to double precision.
    let cap = (mean + 40.0 * mean.sqrt() + 60.0) as u32;
    let mut ln_pmf = -mean;
    let mut cdf = ln_pmf.exp();
    let mut k = 0u32;
    while cdf < q && k < cap {
        k += 1;
        ln_pmf += ln_mean - f64::from(k).ln();
        cdf += ln_pmf.exp();
    }
    k
}

/// Φ⁻¹(p) by Acklam's rational approximation (relative error below 1.2e-9), for 0 < p < 1.
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    const LOW: f64 = 0.02425;
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < LOW {
        tail((-2.0 * p.ln()).sqrt())
    } else if p <= 1.0 - LOW {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn est(alpha: f64) -> PoissonEstimator {
        PoissonEstimator::new(PoissonConfig {
            alpha,
            ..PoissonConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn poisson_quantile_known_values() {
        assert_eq!(poisson_quantile(1.0, 0.5), 1);
        assert_eq!(poisson_quantile(10.0, 0.99), 18);
        assert_eq!(poisson_quantile(0.0, 0.99), 0);
        assert_eq!(poisson_quantile(1.0, 0.3), 0); // P(0) = 0.368
        assert_eq!(poisson_quantile(2.0, 0.99), 6); // P(≤5) = 0.983, P(≤6) = 0.9955
        assert_eq!(poisson_quantile(100.0, 0.5), 100);
        assert_eq!(poisson_quantile(100.0, 0.99), 124);
        // e^-800 underflows; the log-space recurrence does not.
        let k = poisson_quantile(800.0, 0.99);
        assert!((860..=868).contains(&k), "{k}");
    }

    #[test]
    fn poisson_quantile_normal_branch_agrees_with_exact_at_the_switch() {
        for q in [0.5, 0.9, 0.99, 0.999] {
            let exact = poisson_quantile(NORMAL_ABOVE, q);
            let approx = poisson_quantile(NORMAL_ABOVE + 1e-9, q);
            assert!(exact.abs_diff(approx) <= 1, "q={q}: {exact} vs {approx}");
        }
        assert!(poisson_quantile(1e9, 0.99) > 1_000_000_000);
        // Exact values (summed in Python) on both sides of the switch: within one.
        for (mean, exact) in [
            (1000.0, 1074),
            (5000.0, 5165),
            (20000.0, 20330),
            (1e5, 100736),
        ] {
            let k = poisson_quantile(mean, 0.99);
            assert!(k.abs_diff(exact) <= 1, "mean {mean}: {k} vs {exact}");
        }
    }

    #[test]
    fn poisson_quantile_is_monotone() {
        let mut prev = 0;
        for i in 0..3000 {
            let k = poisson_quantile(f64::from(i) * 0.7, 0.99);
            assert!(k >= prev, "mean {}: {k} < {prev}", f64::from(i) * 0.7);
            prev = k;
        }
        let mut prev = 0;
        for i in 1..100 {
            let k = poisson_quantile(25.0, f64::from(i) / 100.0);
            assert!(k >= prev);
            prev = k;
        }
    }

    #[test]
    fn config_is_validated() {
        for q in [0.0, 1.0, -0.1, 1.5, f64::NAN] {
            let c = PoissonConfig {
                quantile: q,
                ..PoissonConfig::default()
            };
            assert!(matches!(
                PoissonEstimator::new(c),
                Err(EstimatorError::Quantile(_))
            ));
        }
        let c = PoissonConfig {
            alpha: 0.0,
            ..PoissonConfig::default()
        };
        assert_eq!(
            PoissonEstimator::new(c).err(),
            Some(EstimatorError::Alpha(0.0))
        );
        let c = PoissonConfig {
            interval_us: 0,
            ..PoissonConfig::default()
        };
        assert_eq!(
            PoissonEstimator::new(c).err(),
            Some(EstimatorError::Interval)
        );
    }

    #[test]
    fn rate_is_an_ewma_of_interval_rates() {
        let mut e = est(0.5);
        for i in 0..10 {
            e.on_arrival("f", i * 10_000); // 10 arrivals in [0, 100 ms) = 100/s
        }
        assert_eq!(e.rate("f", 99_999), 0.0); // the open interval does not count yet
        assert!((e.rate("f", 100_000) - 50.0).abs() < 1e-9);
        for i in 0..10 {
            e.on_arrival("f", 100_000 + i * 10_000);
        }
        e.tick(200_000);
        assert!((e.rate("f", 200_000) - 75.0).abs() < 1e-9);
        // Two empty intervals halve it twice.
        e.tick(400_000);
        assert!((e.rate("f", 400_000) - 18.75).abs() < 1e-9);
    }

    #[test]
    fn huge_gaps_decay_in_constant_time_and_functions_are_forgotten() {
        let mut e = est(0.5);
        for i in 0..10 {
            e.on_arrival("f", i);
        }
        e.tick(300_000);
        assert!(e.rate("f", 300_000) > 0.0);
        assert_eq!(e.tracked(), 1);
        // 10^12 intervals later: closes in O(1), and the function is forgotten.
        e.tick(100_000 * 1_000_000_000_000);
        assert_eq!(e.tracked(), 0);
        assert_eq!(e.estimate("f", 100_000 * 1_000_000_000_000, 500_000, 0), 0);
        // Within the bound it is kept but decayed to nothing.
        let mut e = est(0.5);
        e.on_arrival("g", 0);
        e.tick(100 * 100_000);
        assert_eq!(e.tracked(), 1);
        assert_eq!(e.estimate("g", 100 * 100_000, 1_000_000, 0), 0);
        e.tick(102 * 100_000);
        assert_eq!(e.tracked(), 0);
    }

    #[test]
    fn estimate_covers_the_setup_time_and_scales_for_long_executions() {
        let mut e = est(1.0); // rate = the last interval's rate exactly
        for i in 0..10 {
            e.on_arrival("f", i * 10_000); // 100/s
        }
        let now = 100_000;
        // T = 100 ms: mean 10 -> 18 at q = 0.99.
        assert_eq!(e.estimate("f", now, 100_000, 50_000), 18);
        assert_eq!(e.estimate("f", now, 100_000, 100_000), 18);
        // Execution of 2.5 T: the arrivals during one execution, mean 25 -> 37 (not 3 × 18).
        assert_eq!(e.estimate("f", now, 100_000, 250_000), 37);
        assert_eq!(e.estimate("f", now, 0, 250_000), 0);
        assert_eq!(e.estimate("unknown", now, 100_000, 0), 0);
    }
}
