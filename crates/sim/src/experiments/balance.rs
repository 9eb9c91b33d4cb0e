//! `balance`: OpenWhisk's default balancer (the paper's "OW+GD" baseline: the workers keep
//! GDSF), least-loaded, CH-BL, CH-RLU and the omniscient greedy policy on 1,000 random Azure
//! functions (CH-RLU paper §6.3, Figs. 12–13), and the slowdown as the same 256 CPUs and 512 GiB
//! are split into more, smaller servers (Fig. 14).
//!
//! The paper's invokers are OpenWhisk's, which run every invocation at once (no worker queue):
//! the workers here do the same (unlimited concurrency, pure processor sharing), so their
//! normalized load can exceed 1 and load bounds mean what they meant there. One extra row runs
//! CH-RLU on workers with Hearth's queue (concurrency = CPUs), where the load cannot exceed 1.

use super::metrics::{OfferedLoad, RunMetrics};
use super::plot::{self, quantile, Axis, BarPanel, LinePanel, Series};
use super::runner::{run_all, Job};
use super::{azure, describe, f, AzureSample, Options, Output, Table, AZURE_1350};
use crate::config::{Routing, SimConfig};
use crate::error::Result;
use hearth_core::balance::BalanceKind;
use hearth_core::{KeepAliveConfig, KeepAliveKind, QueueDiscipline, RegulatorConfig};
use hearth_loadgen::make::{mapping::Mapping, select::Selection, Scaling};
use plotters::prelude::SeriesLabelPosition;
use serde_json::json;

/// The paper's cluster totals (Fig. 14): 256 CPUs, 512 GiB.
const TOTAL_CPUS: u32 = 256;
const TOTAL_MEMORY_GB: u64 = 512;
/// Figs. 12–13 use eight servers of the same totals.
const SERVERS: usize = 8;
/// Windows of the offered load's peaks: the trace's own minutes.
const LOAD_WINDOW_US: u64 = hearth_core::time::secs(60);

fn cluster(servers: usize, routing: Routing) -> SimConfig {
    let cpus = TOTAL_CPUS / servers as u32;
    SimConfig {
        workers: servers,
        cpus,
        memory_mb: TOTAL_MEMORY_GB * 1024 / servers as u64,
        queue: QueueDiscipline::Fcfs,
        regulator: RegulatorConfig::Fixed(u32::MAX),
        keepalive: KeepAliveConfig::new(KeepAliveKind::Gdsf),
        routing,
        ..SimConfig::default()
    }
}

pub(super) fn run(o: &Options) -> Result<Output> {
    let policy = |kind| Routing::seeded(kind, o.seed);
    let sample = AzureSample {
        file: AZURE_1350,
        selection: Selection::Random(1000),
        minutes: if o.quick { 120 } else { 1440 },
        mapping: Mapping::Busy,
        scaling: Scaling::None,
    };
    let (workload, made) = azure(o, &sample)?;
    let offered = OfferedLoad::of(
        &workload,
        u64::from(TOTAL_CPUS),
        (made.span_s * 1e6).round() as u64,
        LOAD_WINDOW_US,
    );
    let mut md = format!(
        "# balance: load balancing policies (CH-RLU paper Figs. 12–14)\n\n\
         * {}\n* runs at {}\n* {SERVERS} servers × {} CPUs × {} GiB (256 CPUs, 512 GiB in all); GDSF keep-alive; \
         every invocation runs at once (processor sharing, as OpenWhisk invokers); status pushes every 1 s.\n\
         * Slowdown = e2e ÷ the function's warm time. Global = mean over completed invocations.\n\n",
        describe("random:1000", &made, &workload),
        offered.describe(),
        TOTAL_CPUS / SERVERS as u32,
        TOTAL_MEMORY_GB / SERVERS as u64,
    );
    let policies: Vec<(&str, Routing)> = vec![
        ("openwhisk", policy(BalanceKind::OpenWhisk)),
        ("least-loaded", policy(BalanceKind::LeastLoaded)),
        ("ch-bl", policy(BalanceKind::ChBl)),
        ("ch-rlu", policy(BalanceKind::ChRlu)),
        ("greedy", Routing::Greedy),
    ];
    let mut jobs: Vec<Job> = policies
        .iter()
        .map(|(name, r)| Job {
            label: name.to_string(),
            workload: &workload,
            config: cluster(SERVERS, r.clone()),
        })
        .collect();
    let mut queued = cluster(SERVERS, policy(BalanceKind::ChRlu));
    queued.regulator = RegulatorConfig::Fixed(queued.cpus);
    jobs.push(Job {
        label: "ch-rlu, Hearth queue".into(),
        workload: &workload,
        config: queued,
    });
    let scale_servers: Vec<usize> = if o.quick {
        vec![4, 16]
    } else {
        vec![4, 8, 16, 32, 64]
    };
    let scale_policies = [
        ("least-loaded", policy(BalanceKind::LeastLoaded)),
        ("ch-rlu", policy(BalanceKind::ChRlu)),
        ("greedy", Routing::Greedy),
    ];
    let first_scale = jobs.len();
    for (name, r) in &scale_policies {
        for n in &scale_servers {
            jobs.push(Job {
                label: format!("{name} on {n} servers"),
                workload: &workload,
                config: cluster(*n, r.clone()),
            });
        }
    }
    let results = run_all(o.with_server(&mut jobs), o.jobs)?;

    let mut table = Table::new(&[
        "policy",
        "global slowdown",
        "median function slowdown",
        "p90 function slowdown",
        "cold starts",
        "cold %",
        "dropped",
        "load variance",
    ]);
    let mut json_rows = Vec::new();
    let mut cdf_series = Vec::new();
    for (job, m) in jobs.iter().zip(&results).take(first_scale) {
        let per = m.per_function_slowdown();
        table.row(vec![
            job.label.clone(),
            f(m.weighted_slowdown(), 2),
            f(quantile(&per, 0.5), 2),
            f(quantile(&per, 0.9), 2),
            m.cold().to_string(),
            f(100.0 * m.cold_ratio(), 2),
            m.dropped().to_string(),
            f(m.mean_load_variance(), 3),
        ]);
        json_rows.push(row_json(&job.label, m, &per));
        cdf_series.push(Series {
            label: format!("{} (global {})", job.label, f(m.weighted_slowdown(), 2)),
            points: plot::cdf(&per),
        });
    }
    md.push_str(&format!(
        "## Figs. 12–13: {SERVERS} servers\n\n{}\n",
        table.markdown()
    ));
    let mut scale_table = Table::with_header(
        std::iter::once("global slowdown (cold %)".to_string())
            .chain(
                scale_servers
                    .iter()
                    .map(|n| format!("{n} × {} CPUs", TOTAL_CPUS / *n as u32)),
            )
            .collect(),
    );
    let mut scale_series = Vec::new();
    let mut scale_json = Vec::new();
    for (p, (name, _)) in scale_policies.iter().enumerate() {
        let mut row = vec![name.to_string()];
        let mut pts = Vec::new();
        for (s, n) in scale_servers.iter().enumerate() {
            let m = &results[first_scale + p * scale_servers.len() + s];
            row.push(format!(
                "{} ({})",
                f(m.weighted_slowdown(), 2),
                f(100.0 * m.cold_ratio(), 1)
            ));
            pts.push((*n as f64, m.weighted_slowdown()));
            let mut j = row_json(name, m, &m.per_function_slowdown());
            j["servers"] = json!(n);
            scale_json.push(j);
        }
        scale_table.row(row);
        scale_series.push(Series {
            label: name.to_string(),
            points: pts,
        });
    }
    md.push_str(&format!(
        "## Fig. 14: the same 256 CPUs and 512 GiB in more, smaller servers\n\n{}\n",
        scale_table.markdown()
    ));

    let mut files = Vec::new();
    let fig = o.out.join("balance_slowdown.png");
    let main = &results[..first_scale];
    let labels: Vec<String> = jobs[..first_scale]
        .iter()
        .map(|j| j.label.replace(", Hearth queue", "+queue"))
        .collect();
    plot::lines(
        &fig,
        &format!("Per-function slowdown, {SERVERS} servers (CDF over functions)"),
        &[LinePanel {
            title: "mean slowdown of each function".into(),
            x: Axis::log("slowdown (e2e ÷ warm time, log)"),
            y: Axis::linear("fraction of functions"),
            series: cdf_series,
            markers: false,
            legend: SeriesLabelPosition::LowerRight,
        }],
        (1000, 560),
    )?;
    files.push(fig);
    let fig = o.out.join("balance_cold_dropped.png");
    plot::bars(
        &fig,
        &format!("Cold starts and drops, {SERVERS} servers"),
        &[
            BarPanel {
                title: "cold starts".into(),
                categories: labels.clone(),
                y: Axis::linear("cold starts"),
                series: vec![(
                    "cold".into(),
                    main.iter().map(|m| m.cold() as f64).collect(),
                )],
            },
            BarPanel {
                title: "dropped".into(),
                categories: labels,
                y: Axis::linear("dropped invocations"),
                series: vec![(
                    "dropped".into(),
                    main.iter().map(|m| m.dropped() as f64).collect(),
                )],
            },
        ],
        (1300, 480),
    )?;
    files.push(fig);
    let fig = o.out.join("balance_servers.png");
    plot::lines(
        &fig,
        "Global slowdown vs servers at constant totals (256 CPUs, 512 GiB)",
        &[LinePanel {
            title: "more, smaller servers →".into(),
            x: Axis::log("servers (log)"),
            y: Axis::log("global slowdown (log)"),
            series: scale_series,
            markers: true,
            legend: SeriesLabelPosition::UpperLeft,
        }],
        (1000, 520),
    )?;
    files.push(fig);
    let json = json!({
        "experiment": "balance",
        "functions": workload.functions.len(),
        "invocations": workload.arrivals.len(),
        "offered_load": offered,
        "policies": json_rows,
        "servers": scale_json,
    });
    Ok((md, json, files))
}

fn row_json(label: &str, m: &RunMetrics, per: &[f64]) -> serde_json::Value {
    json!({
        "policy": label,
        "global_slowdown": m.weighted_slowdown(),
        "median_function_slowdown": quantile(per, 0.5),
        "p90_function_slowdown": quantile(per, 0.9),
        "cold": m.cold(), "cold_ratio": m.cold_ratio(), "dropped": m.dropped(),
        "completed": m.completed(), "load_variance": m.mean_load_variance(),
    })
}
