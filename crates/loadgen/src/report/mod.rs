//! `hearth report`: the summary table and the plots of one or more result files.

pub mod canvas;
mod font;
pub mod plots;

use crate::error::{LoadgenError, Result};
use crate::results::ResultRow;
use crate::summary::{Latency, Summary};
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Functions shown in per-function tables and breakdowns.
pub const TOP_FUNCTIONS: usize = 20;

/// A labelled run.
pub struct Run {
    pub label: String,
    pub rows: Vec<ResultRow>,
}

fn three(l: &Latency) -> String {
    format!("{:.3} / {:.3} / {:.3}", l.p50, l.p90, l.p99)
}

/// Metrics as rows, runs as columns.
/// A table row: its name and how to compute its cell for a run.
type Metric = (&'static str, Box<dyn Fn(&Summary) -> String>);

pub fn summary_table(summaries: &[Summary]) -> String {
    let rows: Vec<Metric> = vec![
        ("invocations", Box::new(|s| s.invocations.to_string())),
        (
            "answered / dropped (429) / errors",
            Box::new(|s| format!("{} / {} / {}", s.ok, s.dropped, s.errors)),
        ),
        (
            "offered rate (/s)",
            Box::new(|s| format!("{:.1}", s.offered_rate)),
        ),
        (
            "throughput, answered (/s)",
            Box::new(|s| format!("{:.1}", s.throughput)),
        ),
        ("e2e p50 / p90 / p99 (ms)", Box::new(|s| three(&s.e2e_ms))),
        (
            "e2e mean / max (ms)",
            Box::new(|s| format!("{:.3} / {:.3}", s.e2e_ms.mean, s.e2e_ms.max)),
        ),
        (
            "warm overhead p50 / p90 / p99 (ms)",
            Box::new(|s| three(&s.overhead_ms)),
        ),
        (
            "worker overhead p50 / p90 / p99 (ms)",
            Box::new(|s| three(&s.server_overhead_ms)),
        ),
        (
            "cold starts (ratio)",
            Box::new(|s| format!("{} ({:.2}%)", s.cold, 100.0 * s.cold_ratio)),
        ),
        (
            "weighted normalized latency",
            Box::new(|s| {
                s.weighted_stretch
                    .map_or("n/a".into(), |v| format!("{v:.3}"))
            }),
        ),
        (
            "send lag p50 / p99 / max (ms)",
            Box::new(|s| {
                format!(
                    "{:.3} / {:.3} / {:.3}",
                    s.send_lag_ms.p50, s.send_lag_ms.p99, s.send_lag_ms.max
                )
            }),
        ),
        ("sends > 1 ms late", Box::new(|s| s.late_sends.to_string())),
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(_, f)| summaries.iter().map(f).collect())
        .collect();
    let name_w = rows
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(0);
    let col_w: Vec<usize> = (0..summaries.len())
        .map(|j| {
            cells
                .iter()
                .map(|r| r[j].chars().count())
                .chain([summaries[j].label.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = format!("{:name_w$}", "");
    for (s, w) in summaries.iter().zip(&col_w) {
        let _ = write!(out, "   {:>w$}", s.label);
    }
    out.push('\n');
    for ((name, _), row) in rows.iter().zip(&cells) {
        let _ = write!(out, "{name:name_w$}");
        for (c, w) in row.iter().zip(&col_w) {
            let _ = write!(out, "   {c:>w$}");
        }
        out.push('\n');
    }
    out.push_str(
        "e2e runs from the scheduled send to the answer; warm overhead = response time seen by the client − exec;\n\
         weighted normalized latency = mean over answered invocations of e2e ÷ the function's warm time.\n",
    );
    out
}

/// Per-function lines of one run: the most invoked first.
pub fn function_table(s: &Summary, top: usize) -> String {
    let mut out = format!(
        "{} — per function (top {} of {} by invocations)\n{:<28} {:>8} {:>6} {:>7} {:>10} {:>10} {:>10} {:>8}\n",
        s.label,
        top.min(s.functions.len()),
        s.functions.len(),
        "function",
        "invoked",
        "cold",
        "dropped",
        "warm ms",
        "mean ms",
        "p99 ms",
        "stretch"
    );
    for f in s.functions.iter().take(top) {
        let _ = writeln!(
            out,
            "{:<28} {:>8} {:>6} {:>7} {:>10} {:>10.3} {:>10.3} {:>8}",
            f.function,
            f.invocations,
            f.cold,
            f.dropped + f.errors,
            f.warm_ref_ms.map_or("-".into(), |w| format!("{w:.3}")),
            f.e2e_ms.mean,
            f.e2e_ms.p99,
            f.mean_stretch.map_or("-".into(), |v| format!("{v:.2}")),
        );
    }
    out
}

/// A file-name-safe form of a run label.
fn slug(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A bin width giving ≤ 300 bins over the runs (0.1 s for short runs, whole seconds otherwise)
/// and, on average, at least 10 invocations per bin so a bin's p99 means something.
fn bin_width(runs: &[Run]) -> f64 {
    let rows = runs.iter().map(|r| r.rows.len()).max().unwrap_or(1).max(1);
    let span_s = runs
        .iter()
        .flat_map(|r| {
            let lo = r.rows.iter().map(|x| x.scheduled_us).min();
            let hi = r.rows.iter().map(|x| x.scheduled_us).max();
            lo.zip(hi).map(|(a, b)| (b - a) as f64 / 1e6)
        })
        .fold(0.0, f64::max);
    let width = (span_s / 300.0).max(10.0 * span_s / rows as f64);
    if width < 1.0 {
        (width * 10.0).ceil().max(1.0) / 10.0
    } else {
        width.ceil()
    }
}

/// Writes the plots into `dir`: `latency_cdf.png`, `latency_over_time.png`, and one
/// breakdown per run (`breakdown.png` for a single run, `breakdown-LABEL.png` otherwise).
pub fn write_plots(runs: &[Run], summaries: &[Summary], dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| LoadgenError::io(dir, e))?;
    let mut written = Vec::new();
    let cdf = dir.join("latency_cdf.png");
    if runs.len() == 1 {
        let rows = &runs[0].rows;
        let e2e = |pick: &dyn Fn(&ResultRow) -> bool| -> Vec<u64> {
            rows.iter()
                .filter(|r| r.is_ok() && pick(r))
                .map(|r| r.e2e_us)
                .collect()
        };
        plots::latency_cdf(
            &cdf,
            &format!("End-to-end latency CDF — {}", runs[0].label),
            &[
                ("all answered".into(), e2e(&|_| true)),
                ("warm".into(), e2e(&|r| !r.cold)),
                ("cold".into(), e2e(&|r| r.cold)),
            ],
        )?;
    } else {
        let series: Vec<(String, Vec<u64>)> = runs
            .iter()
            .map(|r| {
                let v = r
                    .rows
                    .iter()
                    .filter(|x| x.is_ok())
                    .map(|x| x.e2e_us)
                    .collect();
                (r.label.clone(), v)
            })
            .collect();
        plots::latency_cdf(
            &cdf,
            "End-to-end latency CDF (answered invocations)",
            &series,
        )?;
    }
    written.push(cdf);
    let bin_s = bin_width(runs);
    let timelines: Vec<plots::Timeline> = runs
        .iter()
        .map(|r| plots::Timeline::of(&r.label, &r.rows, bin_s))
        .collect();
    let over_time = dir.join("latency_over_time.png");
    plots::over_time(
        &over_time,
        "Latency and throughput over time",
        bin_s,
        &timelines,
    )?;
    written.push(over_time);
    for s in summaries {
        let path = if summaries.len() == 1 {
            dir.join("breakdown.png")
        } else {
            dir.join(format!("breakdown-{}.png", slug(&s.label)))
        };
        let fns: Vec<_> = s
            .functions
            .iter()
            .filter(|f| f.ok > 0)
            .take(TOP_FUNCTIONS)
            .collect();
        let title = format!(
            "Where the time goes — {} (mean per invocation; {} most invoked of {} functions)",
            s.label,
            fns.len(),
            s.functions.len()
        );
        plots::breakdown(&path, &title, &fns)?;
        written.push(path);
    }
    Ok(written)
}
