//! The hybrid-histogram keep-alive policy of "Serverless in the Wild" (Shahrad et al., ATC '20),
//! as the thesis reproduces it (ch. 3.6.1): a function's inter-arrival times ("its execution
//! time plus the subsequent idle time": arrival to arrival) are recorded in minute buckets up to
//! four hours; "from these buckets" their coefficient of variation is computed with Welford's
//! online algorithm, each gap counting as its bucket's midpoint. When the function is
//! predictable (CoV at most a threshold), its sandbox is unloaded after each run, brought back
//! into memory by the 5th percentile after the arrival and kept until the 99th (with a 10 %
//! margin each way); otherwise a generic TTL applies. The ARIMA model for inter-arrival times
//! beyond the histogram is not reproduced (the thesis skips it too; they are counted as
//! out-of-bounds and make a function unpredictable).
//!
//! Two readings (docs/seed-readings.md). The windows count from the function's last arrival,
//! since that is what the gaps are measured from. "Brought into memory" at the head of the
//! window means *ready* then: a sandbox takes its init time to start, so the pre-warm starts
//! that much earlier, and a function whose init does not fit between the end of its run and the
//! head of the window is kept warm instead of being unloaded and missed.

use crate::time::{secs, Micros};

/// HIST parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct HistConfig {
    /// Width of a histogram bucket (one minute).
    pub bucket: Micros,
    /// Number of buckets (four hours of minutes).
    pub buckets: usize,
    /// A function is predictable when the CoV of its bucketed inter-arrival times is at most
    /// this.
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
    // Welford's running mean and sum of squared deviations of the in-bounds gaps, each at its
    // bucket's midpoint (µs).
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
        let width = cfg.bucket.max(1);
        let bucket = (iat / width) as usize;
        if bucket >= cfg.buckets {
            self.out_of_bounds += 1;
            return;
        }
        self.counts[bucket] += 1;
        self.in_bounds += 1;
        let x = (bucket as f64 + 0.5) * width as f64;
        let delta = x - self.mean;
        self.mean += delta / self.in_bounds as f64;
        self.m2 += delta * (x - self.mean);
    }

    /// Inter-arrival times recorded, in and out of the histogram's range.
    pub fn samples(&self) -> u64 {
        self.in_bounds + self.out_of_bounds
    }

    /// Coefficient of variation of the bucketed inter-arrival times (population standard
    /// deviation over the mean); `None` before two in-bounds samples.
    pub fn cov(&self) -> Option<f64> {
        if self.in_bounds < 2 || self.mean <= 0.0 {
            return None;
        }
        Some((self.m2 / self.in_bounds as f64).sqrt() / self.mean)
    }

    /// The windows, when the function is predictable.
    pub fn windows(&self, cfg: &HistConfig) -> Option<Windows> {
        if self.samples() < cfg.min_samples || self.out_of_bounds > 0 || self.in_bounds == 0 {
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

    /// The plan after a run ending at `now`, for a function last invoked at `last_arrival`
    /// whose sandbox takes `init_us` to start.
    pub fn plan(
        &self,
        now: Micros,
        last_arrival: Micros,
        init_us: Micros,
        cfg: &HistConfig,
    ) -> HistPlan {
        let generic = HistPlan {
            unload: false,
            prewarm_at: None,
            keep_until: now.saturating_add(cfg.generic_ttl),
        };
        let Some(w) = self.windows(cfg) else {
            return generic;
        };
        let base = last_arrival.min(now);
        let keep_until = base.saturating_add(w.keep_alive).max(now);
        // Ready at the head of the window: started its init time before it.
        let start = base.saturating_add(w.prewarm).saturating_sub(init_us);
        if w.prewarm == 0 || start <= now {
            return HistPlan {
                unload: false,
                prewarm_at: None,
                keep_until,
            };
        }
        HistPlan {
            unload: true,
            prewarm_at: Some(start),
            keep_until,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{ms, secs};

    const MIN: Micros = secs(60);

    #[test]
    fn a_regular_function_is_unloaded_then_ready_again_before_its_next_arrival() {
        // Arrivals every 10 minutes, give or take 30 s: gaps 9.5, 10, 10.5, 10, 10 min.
        let cfg = HistConfig::default();
        let mut h = IatHistogram::default();
        for iat in [570, 600, 630, 600, 600] {
            h.record(secs(iat), &cfg);
        }
        // Bucket midpoints 9.5, 10.5 × 4 min: CoV 0.04.
        assert!(h.cov().unwrap() < 0.05);
        // 5th percentile: bucket 9 (9.5 min) → head 9 min, pre-warm 0.9 × 9 = 8.1 min.
        // 99th percentile: bucket 10 (10–11 min) → tail 11 min, keep-alive 1.1 × 11 = 12.1 min.
        let w = h.windows(&cfg).unwrap();
        assert_eq!(w.prewarm, 9 * MIN * 9 / 10);
        assert_eq!(w.keep_alive, 11 * MIN * 11 / 10);
        // It arrived at 10 000 s and ran 2 s; starting takes 6 s: the pre-warm starts 6 s
        // before the window's head (both count from the arrival).
        let arrived = secs(10_000);
        assert_eq!(
            h.plan(arrived + secs(2), arrived, secs(6), &cfg),
            HistPlan {
                unload: true,
                prewarm_at: Some(arrived + secs(486 - 6)),
                keep_until: arrived + secs(726),
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
        assert_eq!(h.cov(), Some(0.0));
        let p = h.plan(secs(1), 0, 0, &cfg);
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
    fn the_cov_is_taken_over_the_minute_buckets_not_the_raw_gaps() {
        // Bursts: 99 gaps of 100 ms and one of 50 s. The raw gaps' CoV is 8.3, but every gap
        // falls in the first one-minute bucket: CoV 0, predictable, kept 1.1 minutes.
        let cfg = HistConfig::default();
        let mut h = IatHistogram::default();
        for _ in 0..99 {
            h.record(ms(100), &cfg);
        }
        h.record(secs(50), &cfg);
        assert_eq!(h.cov(), Some(0.0));
        assert_eq!(
            h.plan(secs(100), secs(99), 0, &cfg),
            HistPlan {
                unload: false,
                prewarm_at: None,
                keep_until: secs(99) + MIN * 11 / 10,
            }
        );
    }

    #[test]
    fn a_function_whose_init_does_not_fit_before_the_window_stays_warm() {
        // Every 5 minutes: gaps of 300 s sit in bucket 5 (5–6 min), head and tail alike:
        // pre-warm window 0.9 × 5 min = 270 s, keep-alive 1.1 × 6 min = 396 s.
        let cfg = HistConfig::default();
        let mut h = IatHistogram::default();
        for _ in 0..10 {
            h.record(secs(300), &cfg);
        }
        let w = h.windows(&cfg).unwrap();
        assert_eq!((w.prewarm, w.keep_alive), (secs(270), secs(396)));
        let arrived = secs(1_000);
        // Init 60 s, run 10 s (ends at +70 s): start the pre-warm at +210 s, ready at +270 s.
        let p = h.plan(arrived + secs(70), arrived, secs(60), &cfg);
        assert_eq!(p.prewarm_at, Some(arrived + secs(210)));
        assert!(p.unload);
        // Init 179 s: it would have to start at +91 s, before the run (cold, +189 s) ended.
        let p = h.plan(arrived + secs(189), arrived, secs(179), &cfg);
        assert_eq!(
            p,
            HistPlan {
                unload: false,
                prewarm_at: None,
                keep_until: arrived + secs(396),
            }
        );
    }

    #[test]
    fn unpredictable_or_unknown_functions_get_the_generic_ttl() {
        let cfg = HistConfig::default();
        let generic = HistPlan {
            unload: false,
            prewarm_at: None,
            keep_until: secs(1) + cfg.generic_ttl,
        };
        let plan = |h: &IatHistogram| h.plan(secs(1), 0, 0, &cfg);
        let mut h = IatHistogram::default();
        assert_eq!(plan(&h), generic, "no history");
        h.record(secs(60), &cfg);
        h.record(secs(60), &cfg);
        assert_eq!(plan(&h), generic, "too few samples");
        // Mostly 1 s gaps and one of 3 h 50 min: at bucket midpoints (30 s and 230.5 min) the
        // CoV is 2.9 > 2.
        let mut bursty = IatHistogram::default();
        for _ in 0..9 {
            bursty.record(secs(1), &cfg);
        }
        bursty.record(secs(13_800), &cfg);
        assert!(bursty.cov().unwrap() > 2.0, "{:?}", bursty.cov());
        assert_eq!(plan(&bursty), generic);
        // Beyond four hours: out of bounds, no ARIMA here.
        let mut rare = IatHistogram::default();
        for _ in 0..5 {
            rare.record(secs(5 * 3600), &cfg);
        }
        assert_eq!(rare.samples(), 5);
        assert_eq!(plan(&rare), generic);
    }
}
