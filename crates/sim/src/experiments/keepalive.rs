//! `keepalive`: cold-start overhead and cold ratio vs memory size for the six keep-alive
//! policies on representative, rare and random samples of the Azure trace (thesis Fig. 3.4).
//!
//! As in the thesis's keep-alive simulator, one server whose CPUs never contend (unlimited
//! concurrency on more CPUs than ever run at once), so only caching decides: running sandboxes
//! hold memory, idle ones stay or go by the policy. The trace plays at its real speed.

use super::metrics::RunMetrics;
use super::plot::{self, Axis, LinePanel, Series};
use super::runner::{run_all, Job};
use super::{azure, describe, f, AzureSample, Options, Output, Table, AZURE_1350};
use crate::config::{Routing, SimConfig};
use crate::error::Result;
use hearth_core::balance::BalanceKind;
use hearth_core::{KeepAliveConfig, KeepAliveKind, RegulatorConfig};
use hearth_loadgen::make::{mapping::Mapping, select::Selection, Scaling};
use plotters::prelude::SeriesLabelPosition;
use serde_json::json;

/// CPUs of the keep-alive server: more than ever run at once, so nothing stretches.
const UNCONTENDED_CPUS: u32 = 1_000_000;

fn samples(quick: bool) -> Vec<(&'static str, AzureSample)> {
    let minutes = if quick { 120 } else { 1440 };
    let s = |selection| AzureSample {
        file: AZURE_1350,
        selection,
        minutes,
        mapping: Mapping::Busy,
        scaling: Scaling::None,
    };
    vec![
        ("representative", s(Selection::Representative(400))),
        ("rare", s(Selection::Rare(1000))),
        ("random", s(Selection::Random(200))),
    ]
}

fn memory_gb(quick: bool) -> Vec<u64> {
    if quick {
        vec![4, 16, 64]
    } else {
        vec![8, 16, 24, 32, 48, 64, 96, 128]
    }
}

fn config(kind: KeepAliveKind, memory_gb: u64) -> SimConfig {
    SimConfig {
        workers: 1,
        cpus: UNCONTENDED_CPUS,
        memory_mb: memory_gb * 1024,
        free_buffer_mb: 0,
        regulator: RegulatorConfig::Fixed(u32::MAX),
        keepalive: KeepAliveConfig::new(kind),
        routing: Routing::seeded(BalanceKind::RoundRobin, 0),
        ..SimConfig::default()
    }
}

pub(super) fn run(o: &Options) -> Result<Output> {
    let sizes = memory_gb(o.quick);
    let mut md = String::from(
        "# keepalive: cold-start overhead vs memory (thesis Fig. 3.4)\n\n\
         One server, no CPU contention, the trace at its real speed; TTL is OpenWhisk's 10 minutes.\n\
         Overhead = Σ init time of cold starts ÷ Σ warm time of all completed invocations.\n\n",
    );
    let mut panels = Vec::new();
    let mut ratio_panels = Vec::new();
    let mut json_samples = Vec::new();
    let mut files = Vec::new();
    for (name, sample) in samples(o.quick) {
        let (workload, made) = azure(o, &sample)?;
        md.push_str(&format!("* {}\n", describe(name, &made, &workload)));
        let mut jobs = Vec::new();
        for kind in KeepAliveKind::ALL {
            for gb in &sizes {
                jobs.push(Job {
                    label: format!("{name} {kind} {gb} GiB"),
                    workload: &workload,
                    config: config(kind, *gb),
                });
            }
        }
        let results = run_all(&jobs, o.jobs)?;
        let at = |k: usize, s: usize| -> &RunMetrics { &results[k * sizes.len() + s] };
        let mut table = Table::with_header(
            std::iter::once("overhead % (cold %)".to_string())
                .chain(sizes.iter().map(|g| format!("{g} GiB")))
                .collect(),
        );
        let mut series = Vec::new();
        let mut ratio_series = Vec::new();
        let mut json_rows = Vec::new();
        for (k, kind) in KeepAliveKind::ALL.iter().enumerate() {
            let mut row = vec![kind.to_string()];
            let mut pts = Vec::new();
            let mut ratio_pts = Vec::new();
            for (s, gb) in sizes.iter().enumerate() {
                let m = at(k, s);
                row.push(format!(
                    "{} ({}){}",
                    f(m.cold_overhead_pct(), 2),
                    f(100.0 * m.cold_ratio(), 1),
                    if m.dropped() > 0 {
                        format!(" [{} dropped]", m.dropped())
                    } else {
                        String::new()
                    }
                ));
                pts.push((*gb as f64, m.cold_overhead_pct()));
                ratio_pts.push((*gb as f64, 100.0 * m.cold_ratio()));
                json_rows.push(json!({
                    "policy": kind.name(), "memory_gib": gb,
                    "overhead_pct": m.cold_overhead_pct(), "cold_ratio": m.cold_ratio(),
                    "cold": m.cold(), "completed": m.completed(), "dropped": m.dropped(),
                }));
            }
            table.row(row);
            series.push(Series {
                label: kind.to_string(),
                points: pts,
            });
            ratio_series.push(Series {
                label: kind.to_string(),
                points: ratio_pts,
            });
        }
        md.push_str(&format!("\n## {name}\n\n{}\n", table.markdown()));
        panels.push(LinePanel {
            title: format!("{name} ({} functions)", workload.functions.len()),
            x: Axis::log("memory (GiB)"),
            y: Axis::log("increase in execution time (%)"),
            series,
            markers: true,
            legend: SeriesLabelPosition::LowerLeft,
        });
        ratio_panels.push(LinePanel {
            title: format!("{name} ({} functions)", workload.functions.len()),
            x: Axis::log("memory (GiB)"),
            y: Axis::linear("cold starts (% of invocations)"),
            series: ratio_series,
            markers: true,
            legend: SeriesLabelPosition::LowerLeft,
        });
        json_samples.push(
            json!({"sample": name, "functions": workload.functions.len(),
            "invocations": workload.arrivals.len(), "runs": json_rows}),
        );
    }
    let fig = o.out.join("keepalive_overhead.png");
    plot::lines(
        &fig,
        "Cold-start overhead vs memory, per keep-alive policy (log-log)",
        &panels,
        (1500, 520),
    )?;
    files.push(fig);
    let fig = o.out.join("keepalive_cold_ratio.png");
    plot::lines(
        &fig,
        "Cold-start ratio vs memory, per keep-alive policy",
        &ratio_panels,
        (1500, 520),
    )?;
    files.push(fig);
    Ok((
        md,
        json!({"experiment": "keepalive", "samples": json_samples}),
        files,
    ))
}
