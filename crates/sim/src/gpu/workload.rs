//! The GPU experiments' workload (§6.5 "Setup and Workloads"): functions sampled from the Azure
//! trace, each mapped onto a Table 6.1 function by its execution time, their arrivals redrawn
//! from each function's empirical inter-arrival distribution and time-scaled to a target
//! GPU utilization over a fixed span (the thesis: 24 functions, 10 minutes).
//!
//! Scaling: every function's gaps are drawn once from its own trace gaps (a seeded stream per
//! function), then all arrival times are multiplied by one factor `s`. The same draws at any
//! `s` give the same arrivals stretched, so the offered load falls monotonically with `s` and a
//! bisection finds the `s` whose offered GPU work ÷ (GPUs × span) is closest to the target
//! from below.

use super::profile::{closest, GpuProfile};
use crate::error::{Result, SimError};
use crate::workload::{Arrival, Workload};
use hearth_core::Micros;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// Most arrivals one GPU workload may hold (the experiments make a few thousand).
pub const MAX_ARRIVALS: usize = 2_000_000;
/// Longest span (one day).
pub const MAX_SPAN_US: Micros = 86_400_000_000;

/// A function of the GPU workload.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuFunction {
    pub name: Arc<str>,
    pub profile: GpuProfile,
    /// The trace function's own mean execution time, which chose the profile.
    pub trace_exec_us: Micros,
}

/// Functions and arrivals (time order) of one GPU run.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuWorkload {
    pub functions: Vec<GpuFunction>,
    pub arrivals: Vec<Arrival>,
    /// The span the arrivals fall in; offered utilization is measured over it.
    pub span_us: Micros,
}

impl GpuWorkload {
    /// A workload from explicit functions and arrivals (tests, hand-made cases).
    pub fn new(
        functions: Vec<GpuFunction>,
        mut arrivals: Vec<Arrival>,
        span_us: Micros,
    ) -> Result<Self> {
        if arrivals.len() > MAX_ARRIVALS || span_us == 0 || span_us > MAX_SPAN_US {
            return Err(SimError::Config(format!(
                "a GPU workload needs at most {MAX_ARRIVALS} arrivals and a span of 1 µs to one day"
            )));
        }
        if arrivals
            .iter()
            .any(|a| a.function as usize >= functions.len())
        {
            return Err(SimError::Config(
                "an arrival names no function of the workload".into(),
            ));
        }
        arrivals.sort_by_key(|a| (a.at_us, a.function));
        Ok(GpuWorkload {
            functions,
            arrivals,
            span_us,
        })
    }

    /// Offered GPU work (warm GPU times) ÷ (GPUs × span).
    pub fn offered_util(&self, gpus: usize) -> f64 {
        let work: f64 = self
            .arrivals
            .iter()
            .map(|a| self.functions[a.function as usize].profile.gpu_warm_s)
            .sum();
        work / (gpus.max(1) as f64 * self.span_us as f64 / 1e6)
    }

    /// Arrivals per second.
    pub fn rate(&self) -> f64 {
        self.arrivals.len() as f64 / (self.span_us as f64 / 1e6)
    }

    /// `copies` copies of one Table 6.1 function (`name-01`, `name-02`, …), each called
    /// `calls` times, every call queued at the start, copy after copy in turn (1 µs apart):
    /// Fig. 6.4's memory microbenchmark. With one token the scheduler then serves the copies
    /// in turn, as it would clients that each call their copy again once the last call
    /// returned (every flow has one call waiting, and the one just served has the highest VT).
    pub fn copies_in_turn(profile: GpuProfile, copies: usize, calls: usize) -> Result<Self> {
        if copies == 0 || calls == 0 || copies > 4096 || copies * calls > MAX_ARRIVALS {
            return Err(SimError::Config(format!(
                "copies must be 1 to 4096 and copies × calls at most {MAX_ARRIVALS}"
            )));
        }
        let functions = (0..copies)
            .map(|k| GpuFunction {
                name: Arc::from(format!("{}-{:02}", profile.name, k + 1)),
                profile,
                trace_exec_us: profile.gpu_warm_us(),
            })
            .collect();
        let arrivals = (0..copies * calls)
            .map(|i| Arrival {
                at_us: i as Micros,
                function: (i % copies) as u32,
            })
            .collect();
        let work = profile
            .gpu_warm_us()
            .saturating_mul((copies * calls) as Micros);
        GpuWorkload::new(functions, arrivals, work.clamp(1, MAX_SPAN_US))
    }

    /// The §6.5 workload from a trace sample `trace` (which spans `trace_span_us`): each of
    /// its functions mapped onto Table 6.1, arrivals redrawn and scaled so that the offered
    /// utilization of `gpus` GPUs over `span_us` is `target_util` (module docs).
    pub fn from_trace(
        trace: &Workload,
        trace_span_us: Micros,
        span_us: Micros,
        target_util: f64,
        gpus: usize,
        seed: u64,
    ) -> Result<Self> {
        if !(target_util.is_finite() && target_util > 0.0 && target_util <= 10.0) {
            return Err(SimError::Config(format!(
                "target utilization must be in (0, 10], got {target_util}"
            )));
        }
        if span_us == 0 || span_us > MAX_SPAN_US || trace_span_us == 0 {
            return Err(SimError::Config(
                "the GPU workload's span must be 1 µs to one day".into(),
            ));
        }
        let functions: Vec<GpuFunction> = trace
            .functions
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let profile = *closest(f.warm_us);
                GpuFunction {
                    name: Arc::from(format!("{}-{i:02}", profile.name)),
                    profile,
                    trace_exec_us: f.warm_us,
                }
            })
            .collect();
        let gaps = gaps_per_function(trace, trace_span_us);
        // Grow the unscaled horizon until compressing it into the span can reach the target.
        let mut horizon = trace_span_us.max(span_us);
        let base = loop {
            let base = draw(&gaps, horizon, seed)?;
            let s_min = span_us as f64 / horizon as f64;
            if offered(&base, &functions, s_min, span_us, gpus) >= target_util {
                break base;
            }
            if horizon >= MAX_SPAN_US * 16 {
                return Err(SimError::Config(format!(
                    "utilization {target_util} cannot be reached with these functions"
                )));
            }
            horizon = horizon.saturating_mul(2);
        };
        // Smallest factor s whose offered load is at most the target.
        let (mut lo, mut hi) = ((span_us as f64 / horizon as f64).ln(), 1e6f64.ln());
        for _ in 0..80 {
            let mid = 0.5 * (lo + hi);
            if offered(&base, &functions, mid.exp(), span_us, gpus) > target_util {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let s = hi.exp();
        let arrivals = scaled(&base, s, span_us);
        GpuWorkload::new(functions, arrivals, span_us)
    }
}

/// Each function's inter-arrival gaps in the trace; one arrival or none: the trace span.
fn gaps_per_function(trace: &Workload, span_us: Micros) -> Vec<Vec<Micros>> {
    let mut last: Vec<Option<Micros>> = vec![None; trace.functions.len()];
    let mut gaps: Vec<Vec<Micros>> = vec![Vec::new(); trace.functions.len()];
    for a in &trace.arrivals {
        let i = a.function as usize;
        if let Some(prev) = last[i] {
            gaps[i].push(a.at_us.saturating_sub(prev).max(1));
        }
        last[i] = Some(a.at_us);
    }
    for g in &mut gaps {
        if g.is_empty() {
            g.push(span_us.max(1));
        }
    }
    gaps
}

/// Unscaled arrivals up to `horizon`: a random phase, then gaps drawn from each function's
/// own empirical distribution, one seeded stream per function.
fn draw(gaps: &[Vec<Micros>], horizon: Micros, seed: u64) -> Result<Vec<Arrival>> {
    let mut out = Vec::new();
    for (i, g) in gaps.iter().enumerate() {
        let mut rng =
            ChaCha8Rng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let first = g[rng.gen_range(0..g.len())];
        let mut t = (rng.gen::<f64>() * first as f64) as Micros;
        while t < horizon {
            out.push(Arrival {
                at_us: t,
                function: i as u32,
            });
            if out.len() > MAX_ARRIVALS * 4 {
                return Err(SimError::Config(
                    "the GPU workload would have too many arrivals".into(),
                ));
            }
            t = t.saturating_add(g[rng.gen_range(0..g.len())]);
        }
    }
    Ok(out)
}

fn scaled(base: &[Arrival], s: f64, span_us: Micros) -> Vec<Arrival> {
    base.iter()
        .filter_map(|a| {
            let at = (a.at_us as f64 * s).round();
            (at < span_us as f64).then_some(Arrival {
                at_us: at as Micros,
                function: a.function,
            })
        })
        .collect()
}

fn offered(
    base: &[Arrival],
    functions: &[GpuFunction],
    s: f64,
    span_us: Micros,
    gpus: usize,
) -> f64 {
    let limit = span_us as f64;
    let work: f64 = base
        .iter()
        .filter(|a| (a.at_us as f64 * s).round() < limit)
        .map(|a| functions[a.function as usize].profile.gpu_warm_s)
        .sum();
    work / (gpus.max(1) as f64 * limit / 1e6)
}
