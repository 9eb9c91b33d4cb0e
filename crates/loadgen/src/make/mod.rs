//! `hearth trace make`: trace + metadata files from the Azure Functions traces or from synthetic
//! shapes. Every random choice comes from one seeded generator, so the same options make the same
//! files.

pub mod atoll;
pub mod azure;
pub mod mapping;
pub mod select;
pub mod synthetic;

use crate::error::{LoadgenError, Result};
use crate::metadata::{FunctionMeta, Metadata, BUSY, PYTHON_BASELINE_MB};
use crate::trace::{Invocation, Trace};
use azure::AzureFiles;
use mapping::Mapping;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use select::Selection;
use serde_json::json;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;
use synthetic::Shape;

/// How to stretch or compress time after generation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scaling {
    None,
    /// Multiply every inter-arrival time by this.
    Factor(f64),
    /// Scale inter-arrival times so that Σ rate × warm time (Little's law) equals this.
    Concurrency(f64),
}

/// A generated workload.
#[derive(Debug, Clone)]
pub struct Made {
    pub trace: Trace,
    pub metadata: Metadata,
    /// The intended length of the trace (s), after scaling.
    pub span_s: f64,
    /// Things the user should know (left-out functions, the scale factor…).
    pub notes: Vec<String>,
}

impl Made {
    /// Expected concurrent invocations by Little's law over the trace's span.
    pub fn expected_concurrency(&self) -> f64 {
        let span = self.span_s.max(1e-9);
        self.metadata.expected_concurrency(
            self.trace
                .counts()
                .into_iter()
                .map(|(f, n)| (f, n as f64 / span)),
        )
    }

    pub fn write(&self, trace: &Path, meta: &Path) -> Result<()> {
        self.trace.write(trace)?;
        self.metadata.write(meta)
    }

    /// A few lines for the user.
    pub fn describe(&self) -> String {
        let n = self.trace.invocations.len();
        let mut s = format!(
            "{} functions, {n} invocations over {:.1} s (mean {:.1}/s); expected concurrency (Little's law) {:.2}",
            self.metadata.functions.len(),
            self.span_s,
            n as f64 / self.span_s.max(1e-9),
            self.expected_concurrency()
        );
        for note in &self.notes {
            s.push_str("\nnote: ");
            s.push_str(note);
        }
        s
    }

    fn scale(&mut self, scaling: Scaling) -> Result<()> {
        let factor = match scaling {
            Scaling::None => return Ok(()),
            Scaling::Factor(k) => k,
            Scaling::Concurrency(target) => {
                if !(target.is_finite() && target > 0.0) {
                    return Err(LoadgenError::Config(format!(
                        "--target-concurrency must be positive, got {target}"
                    )));
                }
                let now = self.expected_concurrency();
                if now <= 0.0 {
                    return Err(LoadgenError::Config(
                        "the workload has no expected concurrency to scale (no invocation or all warm times 0)"
                            .into(),
                    ));
                }
                now / target
            }
        };
        if !(factor.is_finite() && factor > 0.0) {
            return Err(LoadgenError::Config(format!(
                "the time scale must be positive, got {factor}"
            )));
        }
        for inv in &mut self.trace.invocations {
            inv.at_us = (inv.at_us as f64 * factor).round() as u64;
        }
        self.span_s *= factor;
        self.notes.push(format!(
            "inter-arrival times scaled by {factor:.4} (rates by {:.4})",
            1.0 / factor
        ));
        Ok(())
    }
}

/// Per-minute counts to instants (µs from the window start): one invocation at the start of its
/// minute, several spread evenly over it (thesis ch. 3.6).
pub fn expand_minutes(per_minute: &[u32]) -> Vec<u64> {
    const MINUTE_US: u64 = 60_000_000;
    let mut out = Vec::new();
    for (m, &k) in per_minute.iter().enumerate() {
        let start = m as u64 * MINUTE_US;
        for i in 0..u64::from(k) {
            out.push(start + i * MINUTE_US / u64::from(k));
        }
    }
    out
}

/// Options of a trace made from Azure 2019 data.
#[derive(Debug, Clone)]
pub struct AzureOptions {
    pub files: AzureFiles,
    pub from_minute: usize,
    pub minutes: usize,
    pub selection: Selection,
    pub mapping: Mapping,
    pub scaling: Scaling,
    pub seed: u64,
}

pub fn from_azure(o: &AzureOptions) -> Result<Made> {
    if o.minutes == 0 {
        return Err(LoadgenError::Config("--minutes must be at least 1".into()));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(o.seed);
    let (functions, mut notes) = azure::read(&o.files, o.from_minute, o.minutes)?;
    let available = functions.len();
    let chosen = select::select(functions, o.selection, &mut rng);
    if chosen.is_empty() {
        return Err(LoadgenError::Config(format!(
            "no function of {} is invoked at least twice in minutes {}..{}",
            o.files.invocations.display(),
            o.from_minute,
            o.from_minute + o.minutes
        )));
    }
    notes.insert(
        0,
        format!(
            "chose {} of {available} functions ({}); functions invoked fewer than 2 times in the window are never chosen",
            chosen.len(),
            o.selection
        ),
    );
    let mut taken = HashSet::new();
    let mut metadata = Metadata::default();
    let mut invocations = Vec::new();
    for f in &chosen {
        let name = mapping::function_name(&f.id, &mut taken);
        invocations.extend(
            expand_minutes(&f.per_minute)
                .into_iter()
                .map(|at_us| Invocation {
                    at_us,
                    function: name.clone(),
                }),
        );
        metadata.insert(mapping::map(f, name, o.mapping));
    }
    let minutes = chosen.iter().map(|f| f.per_minute.len()).max().unwrap_or(0);
    let mut made = Made {
        trace: Trace::from_invocations(invocations),
        metadata,
        span_s: minutes as f64 * 60.0,
        notes,
    };
    made.scale(o.scaling)?;
    Ok(made)
}

/// The synthetic functions: all `busy`, warm times cycling through `warm_ms`.
#[derive(Debug, Clone)]
pub struct SyntheticFunctions {
    pub count: usize,
    pub warm_ms: Vec<f64>,
    pub cold_ms: f64,
    pub mem_mb: f64,
}

fn busy_meta(name: String, warm_ms: f64, cold_ms: f64, mem_mb: f64) -> FunctionMeta {
    FunctionMeta {
        function: name,
        warm_ms,
        cold_ms,
        mem_mb,
        sample: BUSY.into(),
        args: json!({"ms": warm_ms, "mb": (mem_mb - PYTHON_BASELINE_MB).max(0.0)}).to_string(),
        source: "synthetic".into(),
        deadline_ms: None,
    }
}

/// A synthetic workload of `shape` over `span`. Background functions are `syn-0…`; a burst's
/// function is `burst`.
pub fn synthetic(
    shape: &Shape,
    span: Duration,
    fns: &SyntheticFunctions,
    scaling: Scaling,
    seed: u64,
) -> Result<Made> {
    let bad_time = |v: f64| !v.is_finite() || v < 0.0;
    if fns.warm_ms.is_empty() || fns.warm_ms.iter().any(|v| bad_time(*v)) {
        return Err(LoadgenError::Config(
            "--warm-ms must list non-negative times".into(),
        ));
    }
    if bad_time(fns.cold_ms) || bad_time(fns.mem_mb) {
        return Err(LoadgenError::Config(
            "--cold-ms and --mem-mb must be non-negative".into(),
        ));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let arrivals =
        synthetic::arrivals(shape, span, fns.count, &mut rng).map_err(LoadgenError::Config)?;
    let mut names: Vec<String> = (0..fns.count).map(|i| format!("syn-{i}")).collect();
    let mut metadata = Metadata::default();
    for (i, name) in names.iter().enumerate() {
        let warm = fns.warm_ms[i % fns.warm_ms.len()];
        metadata.insert(busy_meta(name.clone(), warm, fns.cold_ms, fns.mem_mb));
    }
    if matches!(shape, Shape::Burst { .. }) {
        names.push("burst".into());
        metadata.insert(busy_meta(
            "burst".into(),
            fns.warm_ms[0],
            fns.cold_ms,
            fns.mem_mb,
        ));
    }
    let invocations = arrivals
        .into_iter()
        .map(|(at_us, f)| Invocation {
            at_us,
            function: names[f].clone(),
        })
        .collect();
    let mut made = Made {
        trace: Trace::from_invocations(invocations),
        metadata,
        span_s: span.as_secs_f64(),
        notes: Vec::new(),
    };
    if made.trace.invocations.is_empty() {
        return Err(LoadgenError::Config(
            "the shape produced no invocation: raise --rate or --duration".into(),
        ));
    }
    made.scale(scaling)?;
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_expand_to_the_start_or_evenly() {
        assert_eq!(
            expand_minutes(&[1, 0, 3]),
            vec![0, 120_000_000, 140_000_000, 160_000_000]
        );
    }

    #[test]
    fn scaling_to_a_target_concurrency_follows_littles_law() {
        // 100/s of a 50 ms function: concurrency 5. Target 1 → inter-arrivals × 5.
        let fns = SyntheticFunctions {
            count: 1,
            warm_ms: vec![50.0],
            cold_ms: 0.0,
            mem_mb: 64.0,
        };
        let shape = Shape::Poisson { rate: 100.0 };
        let span = Duration::from_secs(20);
        let base = synthetic(&shape, span, &fns, Scaling::None, 9).unwrap();
        let c = base.expected_concurrency();
        assert!((c - 5.0).abs() < 0.3, "{c}");
        let scaled = synthetic(&shape, span, &fns, Scaling::Concurrency(1.0), 9).unwrap();
        assert!((scaled.expected_concurrency() - 1.0).abs() < 1e-9);
        let k = scaled.span_s / base.span_s;
        assert!((k - c).abs() < 1e-9);
        assert_eq!(
            scaled.trace.invocations[10].at_us,
            (base.trace.invocations[10].at_us as f64 * k).round() as u64
        );
    }
}
