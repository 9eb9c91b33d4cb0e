//! `keepalive`: cold-start overhead and cold ratio vs memory size for the six keep-alive
//! policies on representative, rare and random samples of the Azure trace (thesis Fig. 3.4).
//!
//! As in the thesis's keep-alive simulator, one server whose CPUs never contend (unlimited
//! concurrency on more CPUs than ever run at once), so only caching decides: running sandboxes
//! hold memory, idle ones stay or go by the policy. The trace plays at its real speed.
//!
//! One more row, `gdsf+generic`: the best caching policy with a pool of generic sandboxes
//! (issue 13), whose cold starts pay their init minus the sandbox creation time when they find
//! one ready; it shows what the pool saves in cost, as the policies differ in count.

use super::metrics::{OfferedLoad, RunMetrics};
use super::plot::{self, Axis, LinePanel, Series};
use super::runner::{run_all, Job};
use super::{azure, describe, f, AzureSample, Options, Output, Table, AZURE_1350};
use crate::config::{Routing, SimConfig, GENERIC_CREATE_US};
use crate::error::Result;
use hearth_core::balance::BalanceKind;
use hearth_core::pool::GenericConfig;
use hearth_core::time::secs;
use hearth_core::{KeepAliveConfig, KeepAliveKind, RegulatorConfig};
use hearth_loadgen::make::{mapping::Mapping, select::Selection, Scaling};
use plotters::prelude::SeriesLabelPosition;
use serde_json::json;

/// CPUs of the keep-alive server: more than ever run at once, so nothing stretches.
const UNCONTENDED_CPUS: u32 = 1_000_000;
/// Windows of the CPU demand's peaks: the trace's own minutes.
const DEMAND_WINDOW_US: u64 = secs(60);

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

/// The generic pool of the `gdsf+generic` row: the worker's defaults (up to 4 kept, at least
/// one, 64 MiB each, sized by the cold starts of the last 30 s).
const GENERIC: GenericConfig = GenericConfig {
    max: 4,
    min: 1,
    memory_mb: 64,
    window_us: secs(30),
};

/// The policy the generic pool is shown with: the thesis's best.
const GENERIC_WITH: KeepAliveKind = KeepAliveKind::Gdsf;

/// The rows: each policy alone, then the best one with generic sandboxes.
fn rows() -> Vec<(KeepAliveKind, bool)> {
    KeepAliveKind::ALL
        .iter()
        .map(|k| (*k, false))
        .chain(std::iter::once((GENERIC_WITH, true)))
        .collect()
}

fn row_label(kind: KeepAliveKind, generic: bool) -> String {
    if generic {
        format!("{kind}+generic")
    } else {
        kind.to_string()
    }
}

fn config(kind: KeepAliveKind, memory_gb: u64, generic: bool) -> SimConfig {
    SimConfig {
        workers: 1,
        cpus: UNCONTENDED_CPUS,
        memory_mb: memory_gb * 1024,
        free_buffer_mb: 0,
        regulator: RegulatorConfig::Fixed(u32::MAX),
        keepalive: KeepAliveConfig::new(kind),
        routing: Routing::seeded(BalanceKind::RoundRobin, 0),
        generic: if generic { GENERIC } else { GenericConfig::OFF },
        ..SimConfig::default()
    }
}

pub(super) fn run(o: &Options) -> Result<Output> {
    let sizes = memory_gb(o.quick);
    let mut md = format!(
        "# keepalive: cold-start overhead vs memory (thesis Fig. 3.4)\n\n\
         One server, no CPU contention, the trace at its real speed; TTL is OpenWhisk's 10 minutes.\n\
         Overhead = Σ init time of cold starts ÷ Σ warm time of all completed invocations.\n\
         `gdsf+generic` is GDSF with generic sandboxes (at most {}, at least {}, {} MiB each): a \
         cold start that finds one ready pays its init minus {} ms (making the sandbox).\n\n",
        GENERIC.max,
        GENERIC.min,
        GENERIC.memory_mb,
        GENERIC_CREATE_US / 1000,
    );
    let mut panels = Vec::new();
    let mut ratio_panels = Vec::new();
    let mut json_samples = Vec::new();
    let mut files = Vec::new();
    for (name, sample) in samples(o.quick) {
        let (workload, made) = azure(o, &sample)?;
        md.push_str(&format!("* {}\n", describe(name, &made, &workload)));
        // The CPU work it offers, in CPUs: the server has more than ever run, so no CPU load.
        let demand = OfferedLoad::of(
            &workload,
            1,
            (made.span_s * 1e6).round() as u64,
            DEMAND_WINDOW_US,
        );
        md.push_str(&format!(
            "  * CPU work offered: {} CPUs busy on average (per minute: median {}, p95 {}, max {}); \
             the server never runs out of CPUs, so it runs at no CPU load limit\n",
            f(demand.mean, 1),
            f(demand.p50, 1),
            f(demand.p95, 1),
            f(demand.max, 1),
        ));
        let mut jobs = Vec::new();
        let rows = rows();
        for (kind, generic) in &rows {
            for gb in &sizes {
                jobs.push(Job {
                    label: format!("{name} {} {gb} GiB", row_label(*kind, *generic)),
                    workload: &workload,
                    config: config(*kind, *gb, *generic),
                });
            }
        }
        let results = run_all(o.with_server(&mut jobs), o.jobs)?;
        let at = |k: usize, s: usize| -> &RunMetrics { &results[k * sizes.len() + s] };
        let mut table = Table::with_header(
            std::iter::once("overhead % (cold %)".to_string())
                .chain(sizes.iter().map(|g| format!("{g} GiB")))
                .collect(),
        );
        let mut series = Vec::new();
        let mut ratio_series = Vec::new();
        let mut json_rows = Vec::new();
        for (k, (kind, generic)) in rows.iter().enumerate() {
            let label = row_label(*kind, *generic);
            let mut row = vec![label.clone()];
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
                    "policy": kind.name(), "generic": generic, "memory_gib": gb,
                    "overhead_pct": m.cold_overhead_pct(), "cold_ratio": m.cold_ratio(),
                    "cold": m.cold(), "completed": m.completed(), "dropped": m.dropped(),
                    "specialized": m.specialized(), "init_saved_s": m.init_saved_us() as f64 / 1e6,
                    "init_s": m.init_us() as f64 / 1e6,
                }));
            }
            table.row(row);
            series.push(Series {
                label: label.clone(),
                points: pts,
            });
            ratio_series.push(Series {
                label,
                points: ratio_pts,
            });
        }
        md.push_str(&format!("\n## {name}\n\n{}\n", table.markdown()));
        let g = rows.len() - 1;
        let saved: Vec<String> = sizes
            .iter()
            .enumerate()
            .map(|(s, gb)| {
                let m = at(g, s);
                format!(
                    "{gb} GiB: {} of {} cold starts ({} %) specialized one, saving {} s of init \
                     ({} s paid)",
                    m.specialized(),
                    m.cold(),
                    f(100.0 * m.specialized() as f64 / m.cold().max(1) as f64, 1),
                    f(m.init_saved_us() as f64 / 1e6, 1),
                    f(m.init_us() as f64 / 1e6, 0),
                )
            })
            .collect();
        md.push_str(&format!(
            "`{}` — {}.\n",
            row_label(rows[g].0, rows[g].1),
            saved.join("; ")
        ));
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
            "invocations": workload.arrivals.len(), "offered_cpus": demand, "runs": json_rows}),
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
