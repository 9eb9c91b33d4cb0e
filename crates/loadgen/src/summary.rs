//! What a run amounts to: throughput, latency percentiles, overhead, cold starts, drops and
//! stretch (DESIGN.md §7), computed from result rows alone so any producer of results can use it.

use crate::metadata::Metadata;
use crate::results::{Outcome, ResultRow};
use serde::Serialize;
use std::collections::BTreeMap;

/// A send that left this much after its scheduled instant counts as late.
pub const LATE_US: u64 = 1000;

/// The p-th percentile (0–100) of sorted values, nearest-rank.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Percentiles of a latency, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Latency {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Latency {
    /// From samples in µs.
    pub fn of(mut us: Vec<u64>) -> Self {
        if us.is_empty() {
            return Latency::default();
        }
        us.sort_unstable();
        let ms = |v: u64| v as f64 / 1000.0;
        Latency {
            count: us.len(),
            mean: us.iter().sum::<u64>() as f64 / us.len() as f64 / 1000.0,
            p50: ms(percentile(&us, 50.0)),
            p90: ms(percentile(&us, 90.0)),
            p99: ms(percentile(&us, 99.0)),
            max: ms(*us.last().unwrap_or(&0)),
        }
    }
}

/// Each function's unloaded warm time (ms), the denominator of stretch.
#[derive(Debug, Clone, Default)]
pub struct WarmReference {
    ms: BTreeMap<String, f64>,
}

impl WarmReference {
    /// From a metadata file's `warm_ms`.
    pub fn from_metadata(meta: &Metadata) -> Self {
        WarmReference {
            ms: meta
                .functions
                .values()
                .map(|f| (f.function.clone(), f.warm_ms))
                .collect(),
        }
    }

    /// Without metadata: the median `exec_us` of each function's warm invocations across all the
    /// given runs (so runs compared side by side share one reference).
    pub fn from_runs<'a>(runs: impl IntoIterator<Item = &'a [ResultRow]>) -> Self {
        let mut execs: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for rows in runs {
            for r in rows.iter().filter(|r| r.is_ok() && !r.cold) {
                if let Some(e) = r.exec_us {
                    execs.entry(&r.function).or_default().push(e);
                }
            }
        }
        WarmReference {
            ms: execs
                .into_iter()
                .map(|(f, mut v)| {
                    v.sort_unstable();
                    (f.to_string(), percentile(&v, 50.0) as f64 / 1000.0)
                })
                .collect(),
        }
    }

    /// Fills functions missing from `self` from `other`.
    pub fn or(mut self, other: WarmReference) -> Self {
        for (f, v) in other.ms {
            self.ms.entry(f).or_insert(v);
        }
        self
    }

    pub fn get(&self, function: &str) -> Option<f64> {
        self.ms.get(function).copied().filter(|v| *v > 0.0)
    }
}

/// One function's share of a run.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionSummary {
    pub function: String,
    pub invocations: usize,
    pub ok: usize,
    pub dropped: usize,
    pub errors: usize,
    pub cold: usize,
    /// The stretch denominator (ms); absent when unknown.
    pub warm_ref_ms: Option<f64>,
    pub e2e_ms: Latency,
    /// Mean e2e ÷ warm reference over the function's answered invocations.
    pub mean_stretch: Option<f64>,
    /// Mean parts of e2e (ms) over answered invocations: the server's queue, init, exec and
    /// overhead, and `client` — the rest (network, client, generator lag).
    pub mean_queue_ms: f64,
    pub mean_init_ms: f64,
    pub mean_exec_ms: f64,
    pub mean_overhead_ms: f64,
    pub mean_client_ms: f64,
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub label: String,
    pub invocations: usize,
    pub ok: usize,
    pub dropped: usize,
    pub errors: usize,
    /// From the first scheduled send to the last answer (s).
    pub duration_s: f64,
    /// Invocations ÷ the span of scheduled send times (/s).
    pub offered_rate: f64,
    /// Answered (200) invocations ÷ `duration_s` (/s).
    pub throughput: f64,
    /// From the scheduled send to the answer, answered invocations.
    pub e2e_ms: Latency,
    /// Control-plane overhead of warm invocations: response time seen by the client − exec.
    pub overhead_ms: Latency,
    /// The worker's own `timing.overhead`, answered invocations.
    pub server_overhead_ms: Latency,
    /// Actual − scheduled send time, all invocations.
    pub send_lag_ms: Latency,
    /// Sends more than [`LATE_US`] late.
    pub late_sends: usize,
    pub cold: usize,
    /// Cold starts ÷ answered invocations.
    pub cold_ratio: f64,
    /// Weighted normalized latency: the mean stretch over all answered invocations, i.e. each
    /// function's mean stretch weighted by its invocation count (DESIGN.md §7).
    pub weighted_stretch: Option<f64>,
    pub functions: Vec<FunctionSummary>,
}

fn mean(sum: u64, n: usize) -> f64 {
    if n == 0 {
        0.0
    } else {
        sum as f64 / n as f64 / 1000.0
    }
}

impl Summary {
    pub fn of(label: &str, rows: &[ResultRow], reference: &WarmReference) -> Summary {
        let count = |o: Outcome| rows.iter().filter(|r| r.outcome == o).count();
        let ok_rows: Vec<&ResultRow> = rows.iter().filter(|r| r.is_ok()).collect();
        let first = rows.iter().map(|r| r.scheduled_us).min().unwrap_or(0);
        let last_sched = rows.iter().map(|r| r.scheduled_us).max().unwrap_or(0);
        let last_done = rows.iter().map(|r| r.done_us()).max().unwrap_or(0);
        let duration_s = (last_done.saturating_sub(first)) as f64 / 1e6;
        let sched_span_s = (last_sched.saturating_sub(first)) as f64 / 1e6;
        let cold = ok_rows.iter().filter(|r| r.cold).count();
        let overhead: Vec<u64> = ok_rows
            .iter()
            .filter(|r| !r.cold)
            .map(|r| r.response_us().saturating_sub(r.exec_us.unwrap_or(0)))
            .collect();
        let stretches: Vec<f64> = ok_rows
            .iter()
            .filter_map(|r| {
                reference
                    .get(&r.function)
                    .map(|w| r.e2e_us as f64 / 1000.0 / w)
            })
            .collect();
        let lags: Vec<u64> = rows.iter().map(ResultRow::lag_us).collect();
        let mut functions = Self::per_function(rows, reference);
        functions.sort_by(|a, b| {
            b.invocations
                .cmp(&a.invocations)
                .then(a.function.cmp(&b.function))
        });
        Summary {
            label: label.to_string(),
            invocations: rows.len(),
            ok: ok_rows.len(),
            dropped: count(Outcome::Dropped),
            errors: count(Outcome::Error),
            duration_s,
            offered_rate: if sched_span_s > 0.0 {
                rows.len() as f64 / sched_span_s
            } else {
                0.0
            },
            throughput: if duration_s > 0.0 {
                ok_rows.len() as f64 / duration_s
            } else {
                0.0
            },
            e2e_ms: Latency::of(ok_rows.iter().map(|r| r.e2e_us).collect()),
            overhead_ms: Latency::of(overhead),
            server_overhead_ms: Latency::of(ok_rows.iter().filter_map(|r| r.overhead_us).collect()),
            late_sends: lags.iter().filter(|l| **l > LATE_US).count(),
            send_lag_ms: Latency::of(lags),
            cold,
            cold_ratio: if ok_rows.is_empty() {
                0.0
            } else {
                cold as f64 / ok_rows.len() as f64
            },
            weighted_stretch: (!stretches.is_empty())
                .then(|| stretches.iter().sum::<f64>() / stretches.len() as f64),
            functions,
        }
    }

    fn per_function(rows: &[ResultRow], reference: &WarmReference) -> Vec<FunctionSummary> {
        let mut by_fn: BTreeMap<&str, Vec<&ResultRow>> = BTreeMap::new();
        for r in rows {
            by_fn.entry(&r.function).or_default().push(r);
        }
        by_fn
            .into_iter()
            .map(|(f, rs)| {
                let ok: Vec<&&ResultRow> = rs.iter().filter(|r| r.is_ok()).collect();
                let sum = |get: fn(&ResultRow) -> Option<u64>| -> u64 {
                    ok.iter().filter_map(|r| get(r)).sum()
                };
                let client: u64 = ok
                    .iter()
                    .map(|r| r.e2e_us.saturating_sub(r.server_e2e_us.unwrap_or(0)))
                    .sum();
                let warm_ref_ms = reference.get(f);
                let mean_stretch = warm_ref_ms.filter(|_| !ok.is_empty()).map(|w| {
                    ok.iter().map(|r| r.e2e_us as f64 / 1000.0 / w).sum::<f64>() / ok.len() as f64
                });
                FunctionSummary {
                    function: f.to_string(),
                    invocations: rs.len(),
                    ok: ok.len(),
                    dropped: rs.iter().filter(|r| r.outcome == Outcome::Dropped).count(),
                    errors: rs.iter().filter(|r| r.outcome == Outcome::Error).count(),
                    cold: ok.iter().filter(|r| r.cold).count(),
                    warm_ref_ms,
                    e2e_ms: Latency::of(ok.iter().map(|r| r.e2e_us).collect()),
                    mean_stretch,
                    mean_queue_ms: mean(sum(|r| r.queue_us), ok.len()),
                    mean_init_ms: mean(sum(|r| r.init_us), ok.len()),
                    mean_exec_ms: mean(sum(|r| r.exec_us), ok.len()),
                    mean_overhead_ms: mean(sum(|r| r.overhead_us), ok.len()),
                    mean_client_ms: mean(client, ok.len()),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::ResultRow;

    fn row(id: u64, f: &str, e2e: u64, exec: u64, outcome: Outcome, cold: bool) -> ResultRow {
        ResultRow {
            id,
            function: f.into(),
            scheduled_us: id * 100_000,
            sent_us: id * 100_000 + 100,
            e2e_us: e2e,
            outcome,
            status: if outcome == Outcome::Ok { 200 } else { 429 },
            cold,
            cold_reason: if cold { "new".into() } else { String::new() },
            worker: "w".into(),
            queue_us: Some(0),
            init_us: Some(if cold { e2e / 2 } else { 0 }),
            exec_us: Some(exec),
            overhead_us: Some(50),
            server_e2e_us: Some(e2e - 200),
            error: String::new(),
        }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn summary_counts_drops_colds_and_weights_stretch_by_invocations() {
        // a: warm 10 ms, three invocations at 20 ms (stretch 2); b: warm 100 ms, one at 400 ms
        // (stretch 4) → weighted (2+2+2+4)/4 = 2.5, not the unweighted (2+4)/2 = 3.
        let rows = vec![
            row(0, "a", 20_000, 10_000, Outcome::Ok, false),
            row(1, "a", 20_000, 10_000, Outcome::Ok, false),
            row(2, "a", 20_000, 10_000, Outcome::Ok, false),
            row(3, "b", 400_000, 100_000, Outcome::Ok, true),
            row(4, "b", 300, 0, Outcome::Dropped, false),
        ];
        let mut meta = Metadata::default();
        for (f, w) in [("a", 10.0), ("b", 100.0)] {
            meta.insert(crate::metadata::FunctionMeta {
                function: f.into(),
                warm_ms: w,
                cold_ms: 0.0,
                mem_mb: 64.0,
                sample: String::new(),
                args: String::new(),
                source: String::new(),
                deadline_ms: None,
            });
        }
        let s = Summary::of("run", &rows, &WarmReference::from_metadata(&meta));
        assert_eq!((s.invocations, s.ok, s.dropped, s.errors), (5, 4, 1, 0));
        assert_eq!(s.cold, 1);
        assert!((s.cold_ratio - 0.25).abs() < 1e-9);
        assert!((s.weighted_stretch.unwrap() - 2.5).abs() < 1e-9);
        // Warm overhead = response (e2e − 100 µs lag) − exec = 20000 − 100 − 10000.
        assert_eq!(s.overhead_ms.p50, 9.9);
        assert_eq!(s.send_lag_ms.p50, 0.1);
        assert_eq!(s.late_sends, 0);
        let a = &s.functions[0];
        assert_eq!((a.function.as_str(), a.invocations), ("a", 3));
        assert_eq!(a.mean_stretch, Some(2.0));
        assert_eq!(a.mean_exec_ms, 10.0);
        assert_eq!(a.mean_client_ms, 0.2);
        // Without metadata the reference is the median warm exec: b has no warm answer.
        let s = Summary::of("run", &rows, &WarmReference::from_runs([&rows[..]]));
        assert_eq!(s.functions[0].mean_stretch, Some(2.0));
        assert_eq!(s.functions[1].mean_stretch, None);
    }
}
