//! `fidelity`: one trace through a real worker (the `sim` backend) and through the simulator,
//! compared as the thesis compares Ilúvatar in situ and in silico (Fig. 5.10): latency
//! distribution, cold starts, and queue length and concurrency over time.
//!
//! Both sides are read from their results files. The queue and running counts over time are
//! rebuilt from each invocation's timing (queued from its arrival at the worker for `queue_us`,
//! then running for `init_us + exec_us`), identically for both, time-averaged per bin.

use super::plot::{self, Axis, LinePanel, Series};
use super::{f, Table};
use crate::error::Result;
use hearth_loadgen::report::plots::latency_cdf;
use hearth_loadgen::{Metadata, ResultRow, Summary, WarmReference};
use plotters::prelude::SeriesLabelPosition;
use serde_json::json;
use std::path::{Path, PathBuf};

/// Time-averaged occupancy per bin.
#[derive(Debug, Clone, PartialEq)]
pub struct Occupancy {
    pub bin_s: f64,
    pub queued: Vec<f64>,
    pub running: Vec<f64>,
}

/// Adds the time `[from, to)` µs covers of each bin to `bins`, divided by the bin width.
fn spread(bins: &mut Vec<f64>, from: u64, to: u64, bin_us: u64) {
    if to <= from {
        return;
    }
    let last = ((to - 1) / bin_us) as usize;
    if bins.len() <= last {
        bins.resize(last + 1, 0.0);
    }
    let mut t = from;
    while t < to {
        let b = t / bin_us;
        let end = ((b + 1) * bin_us).min(to);
        bins[b as usize] += (end - t) as f64 / bin_us as f64;
        t = end;
    }
}

/// Queue length and running invocations over time, from answered invocations.
pub fn occupancy(rows: &[ResultRow], bin_s: f64) -> Occupancy {
    let bin_us = ((bin_s * 1e6) as u64).max(1);
    let (mut queued, mut running) = (Vec::new(), Vec::new());
    for r in rows.iter().filter(|r| r.is_ok()) {
        let at = r.sent_us;
        let q = r.queue_us.unwrap_or(0);
        let busy = r.init_us.unwrap_or(0) + r.exec_us.unwrap_or(0);
        spread(&mut queued, at, at + q, bin_us);
        spread(&mut running, at + q, at + q + busy, bin_us);
    }
    let n = queued.len().max(running.len());
    queued.resize(n, 0.0);
    running.resize(n, 0.0);
    Occupancy {
        bin_s,
        queued,
        running,
    }
}

/// Each function's invocation rate over the run (/s), by scheduled time.
fn rates(rows: &[ResultRow]) -> Vec<(String, f64)> {
    let mut counts: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for r in rows {
        *counts.entry(r.function.as_str()).or_insert(0) += 1;
    }
    let lo = rows.iter().map(|r| r.scheduled_us).min().unwrap_or(0);
    let hi = rows.iter().map(|r| r.scheduled_us).max().unwrap_or(0);
    let span_s = ((hi - lo) as f64 / 1e6).max(1.0);
    counts
        .into_iter()
        .map(|(f, n)| (f.to_string(), n as f64 / span_s))
        .collect()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Mean absolute difference over the bins both cover.
fn mean_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    a.iter()
        .zip(b)
        .take(n)
        .map(|(x, y)| (x - y).abs())
        .sum::<f64>()
        / n.max(1) as f64
}

/// Compares `real` and `sim`; writes `fidelity_over_time.png`, `fidelity_latency_cdf.png` and
/// `results.md` into `out`. Returns the Markdown.
pub fn compare(
    real: &[ResultRow],
    sim: &[ResultRow],
    meta: Option<&Metadata>,
    bin_s: f64,
    out: &Path,
) -> Result<(String, serde_json::Value, Vec<PathBuf>)> {
    std::fs::create_dir_all(out)
        .map_err(|e| crate::SimError::Config(format!("{}: {e}", out.display())))?;
    let measured = WarmReference::from_runs([real, sim]);
    let reference = match meta {
        Some(m) => WarmReference::from_metadata(m).or(measured),
        None => measured,
    };
    let s_real = Summary::of("real worker (sim backend)", real, &reference);
    let s_sim = Summary::of("simulator", sim, &reference);
    let o_real = occupancy(real, bin_s);
    let o_sim = occupancy(sim, bin_s);
    let mut t = Table::new(&["", "real worker (sim backend)", "simulator"]);
    let both = |name: &str, a: String, b: String| vec![name.to_string(), a, b];
    t.row(both(
        "answered / dropped / errors",
        format!("{} / {} / {}", s_real.ok, s_real.dropped, s_real.errors),
        format!("{} / {} / {}", s_sim.ok, s_sim.dropped, s_sim.errors),
    ));
    t.row(both(
        "cold starts",
        s_real.cold.to_string(),
        s_sim.cold.to_string(),
    ));
    for (name, pick) in [
        ("e2e p50 (ms)", 0usize),
        ("e2e p90 (ms)", 1),
        ("e2e p99 (ms)", 2),
        ("e2e mean (ms)", 3),
    ] {
        let get = |s: &Summary| match pick {
            0 => s.e2e_ms.p50,
            1 => s.e2e_ms.p90,
            2 => s.e2e_ms.p99,
            _ => s.e2e_ms.mean,
        };
        t.row(both(name, f(get(&s_real), 2), f(get(&s_sim), 2)));
    }
    t.row(both(
        "weighted normalized latency",
        s_real.weighted_stretch.map_or("n/a".into(), |v| f(v, 3)),
        s_sim.weighted_stretch.map_or("n/a".into(), |v| f(v, 3)),
    ));
    t.row(both(
        "mean queue length",
        f(mean(&o_real.queued), 2),
        f(mean(&o_sim.queued), 2),
    ));
    t.row(both(
        "mean running",
        f(mean(&o_real.running), 2),
        f(mean(&o_sim.running), 2),
    ));
    let queue_diff = mean_abs_diff(&o_real.queued, &o_sim.queued);
    let running_diff = mean_abs_diff(&o_real.running, &o_sim.running);
    let md = format!(
        "# fidelity: a real worker (sim backend) vs the simulator\n\n{}\n\
         Per {bin_s} s bin, the mean absolute difference is {} in queue length and {} in running invocations.\n",
        t.markdown(),
        f(queue_diff, 2),
        f(running_diff, 2)
    );
    let pts = |v: &[f64]| -> Vec<(f64, f64)> {
        v.iter()
            .enumerate()
            .map(|(i, y)| (i as f64 * bin_s, *y))
            .collect()
    };
    let fig = out.join("fidelity_over_time.png");
    let series = |a: &[f64], b: &[f64]| {
        vec![
            Series {
                label: "real worker".into(),
                points: pts(a),
            },
            Series {
                label: "simulator".into(),
                points: pts(b),
            },
        ]
    };
    let mut running = series(&o_real.running, &o_sim.running);
    // Little's law's expectation of the running count (thesis Fig. 5.10), from the warm times.
    let littles_law = meta.map(|m| {
        let rates = rates(real);
        m.expected_concurrency(rates.iter().map(|(f, r)| (f.as_str(), *r)))
    });
    if let Some(l) = littles_law {
        let end = o_real.running.len().max(o_sim.running.len()) as f64 * bin_s;
        running.push(Series {
            label: format!("Little's law ({l:.2})"),
            points: vec![(0.0, l), (end, l)],
        });
    }
    plot::lines(
        &fig,
        &format!("Real worker vs simulator over time ({bin_s} s bins, time-averaged)"),
        &[
            LinePanel {
                title: "queue length".into(),
                x: Axis::linear("time (s)"),
                y: Axis::linear("invocations queued"),
                series: series(&o_real.queued, &o_sim.queued),
                markers: false,
                legend: SeriesLabelPosition::UpperRight,
            },
            LinePanel {
                title: "running (init + exec)".into(),
                x: Axis::linear("time (s)"),
                y: Axis::linear("invocations running"),
                series: running,
                markers: false,
                legend: SeriesLabelPosition::LowerLeft,
            },
        ],
        (1500, 520),
    )?;
    let cdf = out.join("fidelity_latency_cdf.png");
    let e2e = |rows: &[ResultRow]| -> Vec<u64> {
        rows.iter()
            .filter(|r| r.is_ok())
            .map(|r| r.e2e_us)
            .collect()
    };
    latency_cdf(
        &cdf,
        "End-to-end latency: real worker vs simulator",
        &[
            ("real worker (sim backend)".into(), e2e(real)),
            ("simulator".into(), e2e(sim)),
        ],
    )?;
    let json = json!({
        "experiment": "fidelity",
        "real": s_real, "sim": s_sim,
        "mean_queue": [mean(&o_real.queued), mean(&o_sim.queued)],
        "mean_running": [mean(&o_real.running), mean(&o_sim.running)],
        "queue_mean_abs_diff": queue_diff, "running_mean_abs_diff": running_diff,
        "littles_law_running": littles_law,
    });
    Ok((md, json, vec![fig, cdf]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_loadgen::Outcome;

    fn row(sent_us: u64, queue_us: u64, exec_us: u64) -> ResultRow {
        ResultRow {
            id: 0,
            function: "f".into(),
            scheduled_us: sent_us,
            sent_us,
            e2e_us: queue_us + exec_us,
            outcome: Outcome::Ok,
            status: 200,
            cold: false,
            cold_reason: String::new(),
            worker: "w1".into(),
            queue_us: Some(queue_us),
            init_us: Some(0),
            exec_us: Some(exec_us),
            overhead_us: Some(0),
            server_e2e_us: Some(queue_us + exec_us),
            error: String::new(),
        }
    }

    #[test]
    fn occupancy_is_time_averaged_per_bin() {
        // One invocation queued 0.5–1.5 s and running 1.5–3.5 s; 1 s bins.
        let o = occupancy(&[row(500_000, 1_000_000, 2_000_000)], 1.0);
        assert_eq!(o.queued, [0.5, 0.5, 0.0, 0.0]);
        assert_eq!(o.running, [0.0, 0.5, 1.0, 0.5]);
        assert_eq!(mean_abs_diff(&[1.0, 2.0], &[2.0, 2.0, 9.0]), 0.5);
    }
}
