//! The hybrid-histogram keep-alive policy of "Serverless in the Wild" (Shahrad et al., ATC '20),
//! as the thesis reproduces it (ch. 3.6.1): a per-function histogram of inter-arrival times in
//! minute buckets up to four hours; when the function is predictable (coefficient of variation of
//! its inter-arrival times, computed with Welford's algorithm, at most a threshold), the sandbox is
//! unloaded after each run, pre-warmed again at the 5th percentile and kept until the 99th
//! (with a 10 % margin each way); otherwise a generic TTL applies. The ARIMA model for
//! inter-arrival times beyond the histogram is not reproduced (the thesis skips it too; they are
//! counted as out-of-bounds and make a function unpredictable).

use crate::time::{secs, Micros};

/// HIST parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct HistConfig {
    /// Width of a histogram bucket (one minute).
    pub bucket: Micros,
    /// Number of buckets (four hours of minutes).
    pub buckets: usize,
    /// A function is predictable when its inter-arrival times' CoV is at most this.
    pub max_cov: f64,
    /// Inter-arrival samples needed before the histogram is trusted.
    pub min_samples: u64,
    /// Keep-alive of unpredictable functions.
    pub generic_ttl: Micros,
    /// Percentile of the pre-warm window (the histogram's head).
    pub head_percentile: f64,
    /// Percentile of the keep-alive window (the histogram's tail).
    pub tail_percentile: f64,
    /// The pre-warm window shrinks and the keep-alive window grows by this fraction.
    pub margin: f64,
}

impl Default for HistConfig {
    fn default() -> Self {
        HistConfig {
            bucket: secs(60),
            buckets: 240,
            max_cov: 2.0,
            min_samples: 3,
            generic_ttl: secs(2 * 3600),
            head_percentile: 5.0,
            tail_percentile: 99.0,
            margin: 0.1,
        }
    }
}

/// One function's inter-arrival history.
#[derive(Debug, Clone, Default)]
pub struct IatHistogram {
    counts: Vec<u64>,
    in_bounds: u64,
    out_of_bounds: u64,
    // Welford's running mean and sum of squared deviations.
    n: u64,
    mean: f64,
    m2: f64,
}

/// What to do with a function's sandboxes after one of its runs ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistPlan {
    /// Unload the sandbox now (it is pre-warmed again later).
    pub unload: bool,
    /// When to start a sandbox ahead of the next expected arrival.
    pub prewarm_at: Option<Micros>,
    /// When the warm (or pre-warmed) sandbox's keep-alive window ends.
    pub keep_until: Micros,
}

/// Pre-warm and keep-alive windows of a predictable function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    pub prewarm: Micros,
    pub keep_alive: Micros,
}

impl IatHistogram {
    pub fn record(&mut self, iat: Micros, cfg: &HistConfig) {
        if self.counts.len() != cfg.buckets {
            self.counts.resize(cfg.buckets, 0);
        }
        let bucket = (iat / cfg.bucket.max(1)) as usize;
        if bucket < cfg.buckets {
            self.counts[bucket] += 1;
            self.in_bounds += 1;
        } else {
            self.out_of_bounds += 1;
        }
        self.n += 1;
        let x = iat as f64;
        let delta = x - self.mean;
        self.mean += delta / self.n as f64;
        self.m2 += delta * (x - self.mean);
    }

    pub fn samples(&self) -> u64 {
        self.n
    }

    /// Coefficient of variation of the inter-arrival times (population standard deviation over
    /// the mean); `None` before two samples.
    pub fn cov(&self) -> Option<f64> {
        if self.n < 2 || self.mean <= 0.0 {
            return None;
        }
        Some((self.m2 / self.n as f64).sqrt() / self.mean)
    }

    /// The windows, when the function is predictable.
    pub fn windows(&self, cfg: &HistConfig) -> Option<Windows> {
        if self.n < cfg.min_samples || self.out_of_bounds > 0 || self.in_bounds == 0 {
            return None;
        }
        if self.cov()? > cfg.max_cov {
            return None;
        }
        let head = self.percentile_bucket(cfg.head_percentile)? as u64 * cfg.bucket;
        let tail = (self.percentile_bucket(cfg.tail_percentile)? as u64 + 1) * cfg.bucket;
        Some(Windows {
            prewarm: (head as f64 * (1.0 - cfg.margin)).round() as Micros,
            keep_alive: (tail as f64 * (1.0 + cfg.margin)).round() as Micros,
        })
    }

    /// Index of the bucket holding the `p`-th percentile of in-bounds samples.
    fn percentile_bucket(&self, p: f64) -> Option<usize> {
        let rank = ((p / 100.0) * self.in_bounds as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(i);
            }
        }
        None
    }

    /// The plan after a run ending at `now`.
    pub fn plan(&self, now: Micros, cfg: &HistConfig) -> HistPlan {
        match self.windows(cfg) {
            None => HistPlan {
                unload: false,
                prewarm_at: None,
                keep_until: now.saturating_add(cfg.generic_ttl),
            },
            Some(w) if w.prewarm == 0 => HistPlan {
                unload: false,
                prewarm_at: None,
                keep_until: now.saturating_add(w.keep_alive),
            },
            Some(w) => HistPlan {
                unload: true,
                prewarm_at: Some(now.saturating_add(w.prewarm)),
                keep_until: now.saturating_add(w.keep_alive),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::secs;

    const MIN: Micros = secs(60);

    #[test]
    fn a_regular_function_is_unloaded_then_prewarmed_before_its_next_arrival() {
        // Arrivals every 10 minutes, give or take 30 s: IATs 9.5, 10, 10.5, 10, 10 min.
        let cfg = HistConfig::default();
        let mut h = IatHistogram::default();
        for iat in [570, 600, 630, 600, 600] {
            h.record(secs(iat), &cfg);
        }
        assert!(h.cov().unwrap() < 0.05);
        // 5th percentile: bucket 9 (9.5 min) → head 9 min, pre-warm 0.9 × 9 = 8.1 min.
        // 99th percentile: bucket 10 (10–11 min) → tail 11 min, keep-alive 1.1 × 11 = 12.1 min.
        let w = h.windows(&cfg).unwrap();
        assert_eq!(w.prewarm, 9 * MIN * 9 / 10);
        assert_eq!(w.keep_alive, 11 * MIN * 11 / 10);
        let end = secs(10_000);
        assert_eq!(
            h.plan(end, &cfg),
            HistPlan {
                unload: true,
                prewarm_at: Some(end + 486 * 1_000_000),
                keep_until: end + 726 * 1_000_000,
            }
        );
    }

    #[test]
    fn short_gaps_keep_the_sandbox_warm_without_unloading() {
        let cfg = HistConfig::default();
        let mut h = IatHistogram::default();
        for iat in [20, 40, 30, 25] {
            h.record(secs(iat), &cfg); // all in bucket 0
        }
        let p = h.plan(0, &cfg);
        assert_eq!(
            p,
            HistPlan {
                unload: false,
                prewarm_at: None,
                keep_until: MIN * 11 / 10
            }
        );
    }

    #[test]
    fn unpredictable_or_unknown_functions_get_the_generic_ttl() {
        let cfg = HistConfig::default();
        let generic = HistPlan {
            unload: false,
            prewarm_at: None,
            keep_until: cfg.generic_ttl,
        };
        let mut h = IatHistogram::default();
        assert_eq!(h.plan(0, &cfg), generic, "no history");
        h.record(secs(60), &cfg);
        h.record(secs(60), &cfg);
        assert_eq!(h.plan(0, &cfg), generic, "too few samples");
        // Mostly 1 s gaps and one of 3 h 50 min: CoV = 2.6 > 2.
        let mut bursty = IatHistogram::default();
        for _ in 0..9 {
            bursty.record(secs(1), &cfg);
        }
        bursty.record(secs(13_800), &cfg);
        assert!(bursty.cov().unwrap() > 2.0, "{:?}", bursty.cov());
        assert_eq!(bursty.plan(0, &cfg), generic);
        // Beyond four hours: out of bounds, no ARIMA here.
        let mut rare = IatHistogram::default();
        for _ in 0..5 {
            rare.record(secs(5 * 3600), &cfg);
        }
        assert_eq!(rare.plan(0, &cfg), generic);
    }
}
