//! Hit-ratio curves (thesis §3.4.1): the fraction of invocations that find a warm sandbox as a
//! function of the server's memory, read off the CDF of reuse distances (Eq. 3.2).
//!
//! An invocation whose reuse distance is `d` needs `d + own size` of memory to have kept its
//! sandbox under LRU-like keep-alive: the other functions met since, plus itself. The curve is
//! the CDF of that need over all invocations; first invocations are compulsory misses (they
//! count in the total, never as hits), so the curve tops out below 1.

use super::reuse::{Reuse, ReuseTracker};
use super::shards::Sampler;
use super::ProvisionError;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// Builds a hit-ratio curve from invocations, one at a time (offline from a trace, or online
/// from a worker's arrivals).
#[derive(Debug, Clone)]
pub struct CurveBuilder {
    sampler: Sampler,
    ids: HashMap<Box<str>, u32>,
    tracker: ReuseTracker,
    /// Memory need (MiB, rounded up to `bucket_mb`) → sampled invocations with that need.
    hist: BTreeMap<u64, u64>,
    compulsory: u64,
    offered: u64,
    /// Invocations of functions past `max_functions` (left out of the curve).
    skipped: u64,
    max_functions: usize,
    bucket_mb: u64,
}

/// The most functions a builder tracks unless told otherwise: bounds its memory.
pub const DEFAULT_MAX_FUNCTIONS: usize = 1_000_000;

impl CurveBuilder {
    /// A builder sampling functions with `sampler`, exact to the MiB.
    pub fn new(sampler: Sampler) -> Self {
        CurveBuilder {
            sampler,
            ids: HashMap::new(),
            tracker: ReuseTracker::new(),
            hist: BTreeMap::new(),
            compulsory: 0,
            offered: 0,
            skipped: 0,
            max_functions: DEFAULT_MAX_FUNCTIONS,
            bucket_mb: 1,
        }
    }

    /// Tracks at most `n` functions (the sampled ones); later functions are left out.
    pub fn max_functions(mut self, n: usize) -> Self {
        self.max_functions = n;
        self
    }

    /// Rounds memory needs up to multiples of `mb` (at least 1), bounding the histogram.
    pub fn bucket_mb(mut self, mb: u64) -> Self {
        self.bucket_mb = mb.max(1);
        self
    }

    pub fn sample_rate(&self) -> f64 {
        self.sampler.rate()
    }

    /// Invocations offered so far, sampled or not.
    pub fn offered(&self) -> u64 {
        self.offered
    }

    /// One invocation of `function`, whose sandbox needs `memory_mb`.
    pub fn record(&mut self, function: &str, memory_mb: u64) {
        self.offered += 1;
        if !self.sampler.sampled(function) {
            return;
        }
        let key = match self.ids.get(function) {
            Some(k) => *k,
            None if self.ids.len() >= self.max_functions => {
                self.skipped += 1;
                return;
            }
            None => {
                let k = self.ids.len() as u32;
                self.ids.insert(function.into(), k);
                k
            }
        };
        match self.tracker.record(key, memory_mb) {
            Reuse::First => self.compulsory += 1,
            Reuse::Distance(d) => {
                let scaled = (d as f64 / self.sampler.rate()).round() as u64;
                let need = scaled.saturating_add(memory_mb);
                let bucket = need.div_ceil(self.bucket_mb).saturating_mul(self.bucket_mb);
                *self.hist.entry(bucket).or_insert(0) += 1;
            }
        }
    }

    /// The curve of what was recorded so far. Sampled, it applies SHARDS_adj (the paper's
    /// §4.3): the difference between the expected number of sampled invocations (offered × R)
    /// and the actual one, which comes mostly from whether a few very hot functions fell in
    /// the sample, is added to (or taken from) the smallest-need step, so that the total is the
    /// expected one. At rate 1 the difference is 0 and the curve is exact.
    pub fn curve(&self) -> HitRatioCurve {
        let reuses: u64 = self.hist.values().sum();
        let sampled = reuses + self.compulsory;
        let mut counts: Vec<(u64, f64)> = self.hist.iter().map(|(k, v)| (*k, *v as f64)).collect();
        let mut total = sampled as f64;
        if self.sampler.rate() < 1.0 && !counts.is_empty() {
            let diff = self.offered as f64 * self.sampler.rate() - sampled as f64;
            let first = &mut counts[0].1;
            let adj = diff.max(-*first);
            *first += adj;
            total += adj;
        }
        let mut points = Vec::with_capacity(counts.len());
        let mut hits = 0.0;
        for (need, n) in counts {
            hits += n;
            points.push(CurvePoint {
                memory_mb: need,
                hit_ratio: if total > 0.0 {
                    (hits / total).min(1.0)
                } else {
                    0.0
                },
            });
        }
        HitRatioCurve {
            points,
            sampled,
            compulsory: self.compulsory,
            offered: self.offered,
            functions: self.ids.len(),
            skipped: self.skipped,
            sample_rate: self.sampler.rate(),
        }
    }
}

/// One step of the curve: from `memory_mb` on, `hit_ratio` of invocations hit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CurvePoint {
    pub memory_mb: u64,
    pub hit_ratio: f64,
}

/// A hit-ratio curve: a non-decreasing step function of memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HitRatioCurve {
    /// Steps in increasing memory.
    pub points: Vec<CurvePoint>,
    /// Invocations the curve is made of (the sampled ones).
    pub sampled: u64,
    /// Of those, first invocations of their function.
    pub compulsory: u64,
    /// Invocations offered, sampled or not.
    pub offered: u64,
    /// Functions in the sample.
    pub functions: usize,
    /// Invocations left out past the function cap.
    pub skipped: u64,
    pub sample_rate: f64,
}

/// The knee of a curve (see [`HitRatioCurve::knee`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Knee {
    pub memory_mb: u64,
    pub hit_ratio: f64,
}

impl HitRatioCurve {
    /// The curve of `trace` (function, MiB), sampled at `sampler`'s rate.
    pub fn from_trace<'a>(
        trace: impl IntoIterator<Item = (&'a str, u64)>,
        sampler: Sampler,
    ) -> HitRatioCurve {
        let mut b = CurveBuilder::new(sampler);
        for (f, mb) in trace {
            b.record(f, mb);
        }
        b.curve()
    }

    pub fn is_empty(&self) -> bool {
        self.sampled == 0
    }

    /// The fraction of invocations that hit with `memory_mb` of memory (Eq. 3.2).
    pub fn hit_ratio(&self, memory_mb: u64) -> f64 {
        let n = self.points.partition_point(|p| p.memory_mb <= memory_mb);
        if n == 0 {
            0.0
        } else {
            self.points[n - 1].hit_ratio
        }
    }

    /// The best hit ratio at any size (compulsory misses never hit).
    pub fn max_hit_ratio(&self) -> f64 {
        self.points.last().map_or(0.0, |p| p.hit_ratio)
    }

    /// The memory past which more memory buys nothing.
    pub fn max_useful_mb(&self) -> u64 {
        self.points.last().map_or(0, |p| p.memory_mb)
    }

    /// The smallest memory whose hit ratio reaches `target` in (0, 1]; `None` when no size
    /// does (compulsory misses cap the curve at [`Self::max_hit_ratio`]).
    pub fn size_for(&self, target: f64) -> Result<Option<u64>, ProvisionError> {
        if !(target > 0.0 && target <= 1.0) {
            return Err(ProvisionError::BadHitRatio(target));
        }
        Ok(self.size_reaching(target))
    }

    /// [`Self::size_for`] without the range check: 0 for a target of 0 or less.
    pub(crate) fn size_reaching(&self, target: f64) -> Option<u64> {
        if target <= 0.0 {
            return Some(0);
        }
        // A tolerance so that a target read back from the curve finds its own step.
        let i = self
            .points
            .partition_point(|p| p.hit_ratio < target - 1e-12);
        self.points.get(i).map(|p| p.memory_mb)
    }

    /// The knee (inflection point) of the curve: with memory scaled by
    /// [`Self::max_useful_mb`] and hit ratio by [`Self::max_hit_ratio`], the step whose corner
    /// lies furthest above the diagonal from (0, 0) to (1, 1), i.e. maximizes
    /// `hit/max_hit − memory/max_memory` (the chord method of Kneedle, Satopää et al. 2011).
    /// Past it, a MiB buys less than the curve's average; ties go to the smaller memory.
    /// `None` for an empty curve (no reuse at all).
    pub fn knee(&self) -> Option<Knee> {
        let (x_max, y_max) = (self.max_useful_mb() as f64, self.max_hit_ratio());
        if self.points.is_empty() || y_max <= 0.0 || x_max <= 0.0 {
            return None;
        }
        let mut best: Option<(f64, &CurvePoint)> = None;
        for p in &self.points {
            let score = p.hit_ratio / y_max - p.memory_mb as f64 / x_max;
            if best.is_none_or(|(s, _)| score > s + 1e-12) {
                best = Some((score, p));
            }
        }
        best.map(|(_, p)| Knee {
            memory_mb: p.memory_mb,
            hit_ratio: p.hit_ratio,
        })
    }
}
