//! Popular-function detection: the CH-RLU paper's Algorithm 1 (SHARDS-inspired spatial sampling
//! of inter-arrival times).
//!
//! Every access updates the function's IAT estimate: the moving average of the previous estimate
//! and `(now − last_access) / R`, where `R = T / P` is the sampling rate (T = 20 of P = 100); the
//! first access has an infinite IAT. The popularity threshold is the `p`-th percentile of the
//! IATs of the functions whose name hashes into the sample (`hash mod P < T`), recomputed
//! periodically off the per-decision path. A function is popular when its IAT is at or below
//! the threshold.
//!
//! Algorithm 2's λ ("1 / avg_iat, computed from Algorithm 1") is the reciprocal of the mean of
//! the same IATs (finite ones), in seconds, recomputed with the threshold.
//!
//! Readings of the pseudo-code, documented in docs/cluster.md: every function's own IAT is kept
//! (so any function, not only a sampled one, can be found popular; the sample only builds the
//! percentile, as in SHARDS), and a function's IAT for the percentile is at least the time since
//! its last access, so "have-been popular" functions age out.

use super::hash::{mix64, FunctionKey};
use crate::time::Micros;

/// A function's access history.
#[derive(Debug, Clone, Copy)]
pub struct Iat {
    last: Option<Micros>,
    /// Seconds, scaled by 1/R as in Algorithm 1; infinite until the second access.
    estimate: f64,
}

impl Default for Iat {
    fn default() -> Self {
        Iat {
            last: None,
            estimate: f64::INFINITY,
        }
    }
}

impl Iat {
    /// The current estimate (seconds / R); infinite before the second access.
    pub fn estimate(&self) -> f64 {
        self.estimate
    }
}

const SAMPLE_SALT: u64 = 0x5348_4152_4453_0001; // "SHARDS" salt: decorrelates from ring positions

/// Algorithm 1's parameters and the current threshold.
#[derive(Debug, Clone)]
pub struct Popularity {
    /// T: per cent of functions sampled.
    sample_pct: f64,
    /// R = T / P.
    rate: f64,
    /// p: the percentile of IATs at or below which a function is popular.
    percentile: f64,
    /// Below this many sampled functions, the threshold is taken over all tracked functions
    /// (a sample that small would make it noise).
    min_sample: usize,
    refresh: Micros,
    next_refresh: Micros,
    threshold: f64,
    /// λ = 1 / the mean finite IAT (0 when there is none).
    lambda: f64,
    scratch: Vec<f64>,
}

impl Popularity {
    pub fn new(sample_pct: f64, percentile: f64, refresh: Micros) -> Self {
        Popularity {
            sample_pct,
            rate: sample_pct / 100.0,
            percentile,
            min_sample: 100,
            refresh: refresh.max(1),
            next_refresh: 0,
            threshold: f64::NEG_INFINITY,
            lambda: 0.0,
            scratch: Vec::new(),
        }
    }

    /// Whether the function's name hashes into the sample (`Ti < T`).
    pub fn sampled(&self, key: FunctionKey) -> bool {
        let ti = (mix64(key.0 ^ SAMPLE_SALT) % 10_000) as f64 / 100.0;
        ti < self.sample_pct
    }

    /// Algorithm 1, lines 7–13: an access at `now`.
    pub fn record(&self, now: Micros, iat: &mut Iat) {
        if let Some(last) = iat.last {
            let sample = now.saturating_sub(last) as f64 / 1e6 / self.rate;
            iat.estimate = if iat.estimate.is_finite() {
                (iat.estimate + sample) / 2.0
            } else {
                sample
            };
        }
        iat.last = Some(now);
    }

    /// The IAT used for ranking: never less than the time since the last access.
    pub fn effective(&self, now: Micros, iat: &Iat) -> f64 {
        match iat.last {
            None => f64::INFINITY,
            Some(last) => iat
                .estimate
                .max(now.saturating_sub(last) as f64 / 1e6 / self.rate),
        }
    }

    /// Whether a function with this history is popular now.
    pub fn is_popular(&self, now: Micros, iat: &Iat) -> bool {
        let e = self.effective(now, iat);
        e.is_finite() && e <= self.threshold
    }

    /// λ for the noisy load of Algorithm 2: 1 / the average IAT.
    pub fn arrival_rate(&self) -> f64 {
        self.lambda
    }

    pub fn refresh_due(&self, now: Micros) -> bool {
        now >= self.next_refresh
    }

    pub fn threshold(&self) -> f64 {
        self.threshold
    }

    /// Algorithm 1, lines 14–15: the threshold is the p-th percentile (nearest rank) of the
    /// effective IATs of the sampled functions (`sampled`), or of all tracked functions (`all`)
    /// when the sample is too small; λ is 1 / their finite mean. Functions never accessed are
    /// not tracked.
    pub fn recompute<'a>(
        &mut self,
        now: Micros,
        sampled: impl Iterator<Item = &'a Iat>,
        all: impl Iterator<Item = &'a Iat>,
    ) {
        self.next_refresh = now.saturating_add(self.refresh);
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend(
            sampled
                .filter(|i| i.last.is_some())
                .map(|i| self.effective(now, i)),
        );
        if scratch.len() < self.min_sample {
            scratch.clear();
            scratch.extend(
                all.filter(|i| i.last.is_some())
                    .map(|i| self.effective(now, i)),
            );
        }
        let (sum, n) = scratch
            .iter()
            .filter(|v| v.is_finite())
            .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
        self.lambda = if n > 0 && sum > 0.0 {
            n as f64 / sum
        } else {
            0.0
        };
        self.threshold = if scratch.is_empty() {
            f64::NEG_INFINITY
        } else {
            let rank = ((self.percentile / 100.0) * scratch.len() as f64).ceil() as usize;
            let k = rank.clamp(1, scratch.len()) - 1;
            let (_, v, _) = scratch.select_nth_unstable_by(k, f64::total_cmp);
            *v
        };
        self.scratch = scratch;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{ms, secs};

    #[test]
    fn iat_is_the_moving_average_scaled_by_the_sampling_rate() {
        let p = Popularity::new(20.0, 20.0, secs(1));
        let mut i = Iat::default();
        p.record(secs(10), &mut i);
        assert!(i.estimate().is_infinite(), "first access: iat is inf");
        p.record(secs(11), &mut i);
        assert!((i.estimate() - 5.0).abs() < 1e-9, "1 s / R(0.2) = 5");
        p.record(secs(11) + ms(200), &mut i);
        assert!((i.estimate() - 3.0).abs() < 1e-9, "(5 + 1) / 2");
        // Silence raises the effective IAT: a have-been popular function ages out.
        assert!((p.effective(secs(21) + ms(200), &i) - 50.0).abs() < 1e-9);
    }

    #[test]
    fn threshold_is_the_pth_percentile_and_first_accesses_count_as_infinite() {
        let mut p = Popularity::new(20.0, 20.0, secs(1));
        // 10 functions with IATs 1..=10 s (×5 after scaling), accessed up to now.
        let mut fns: Vec<Iat> = Vec::new();
        for k in 1..=10u64 {
            let mut i = Iat::default();
            p.record(secs(100) - secs(k) * 2, &mut i);
            p.record(secs(100) - secs(k), &mut i);
            p.record(secs(100), &mut i);
            fns.push(i);
        }
        p.recompute(secs(100), [].iter(), fns.iter());
        // 20th percentile of 10 values = the 2nd smallest.
        let mut e: Vec<f64> = fns.iter().map(|i| p.effective(secs(100), i)).collect();
        e.sort_by(f64::total_cmp);
        assert_eq!(p.threshold(), e[1]);
        assert!(p.is_popular(secs(100), &fns[0]) && p.is_popular(secs(100), &fns[1]));
        assert!(!p.is_popular(secs(100), &fns[2]));
        let mean = e.iter().sum::<f64>() / e.len() as f64;
        assert!(
            (p.arrival_rate() - 1.0 / mean).abs() < 1e-12,
            "λ = 1 / mean IAT"
        );
        // 90 functions seen once: the top 20 % now holds all ten with a finite IAT.
        let once: Vec<Iat> = (0..90)
            .map(|_| {
                let mut i = Iat::default();
                p.record(secs(50), &mut i);
                i
            })
            .collect();
        p.recompute(secs(100), [].iter(), fns.iter().chain(once.iter()));
        assert!(fns.iter().all(|i| p.is_popular(secs(100), i)));
        assert!(
            !p.is_popular(secs(100), &once[0]),
            "a single access is never popular"
        );
    }

    #[test]
    fn about_t_percent_of_functions_are_sampled() {
        let p = Popularity::new(20.0, 20.0, secs(1));
        let n = (0..10_000)
            .filter(|i| p.sampled(FunctionKey::of(&format!("f{i}"))))
            .count();
        assert!((1_800..2_200).contains(&n), "{n}");
    }
}
