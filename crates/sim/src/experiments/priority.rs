//! `priority`: k-CH-RLU with two priority pools against single-pool CH-RLU, on the full cluster
//! and on one 25 % smaller (thesis ch. 4.6.3, Figs. 4.10–4.11).
//!
//! Half the functions are high priority, chosen two ways: by work (each class as near half the
//! work as equal counts allow, so the pools, which the balancer sizes by function count, match
//! the work) and at random (whatever work split the draw gives). Pools are sized by the balancer itself:
//! 4 + 4 of 8 servers, 3 + 3 of 6; with the default parameters the low pool runs with a higher
//! b_max than the high one (8 against 6, thesis §4.4.2). OpenWhisk's default balancer is the
//! thesis's single-cluster baseline ("OW").

use super::metrics::{OfferedLoad, RunMetrics};
use super::plot::{self, quantile, Axis, BarPanel};
use super::runner::{run_all, Job};
use super::{azure, describe, f, AzureSample, Options, Output, Table, AZURE_1350};
use crate::config::{Routing, SimConfig};
use crate::error::Result;
use crate::record::worker_name;
use crate::router::Router;
use crate::workload::Workload;
use hearth_core::balance::BalanceKind;
use hearth_core::{KeepAliveConfig, KeepAliveKind, RegulatorConfig};
use hearth_loadgen::make::{mapping::Mapping, select::Selection, Scaling};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

const CPUS: u32 = 16;
const MEMORY_GB: u64 = 32;
/// Little's-law concurrency of the workload: 70 % of the full cluster's 128 CPUs (93 % of the
/// smaller one's 96), the thesis's "heavy load".
const TARGET_CONCURRENCY: f64 = 0.7 * 128.0;
/// Windows of the offered load's peaks.
const LOAD_WINDOW_US: u64 = hearth_core::time::secs(10);
const HIGH: i32 = 1;
const LOW: i32 = 0;

const CONFIGS: [(&str, usize, BalanceKind); 6] = [
    ("OpenWhisk (8)", 8, BalanceKind::OpenWhisk),
    ("CH, home only (8)", 8, BalanceKind::Ch),
    ("CH-RLU (8)", 8, BalanceKind::ChRlu),
    ("2-CH-RLU (8)", 8, BalanceKind::KChRlu),
    ("CH-RLU (6)", 6, BalanceKind::ChRlu),
    ("2-CH-RLU (6)", 6, BalanceKind::KChRlu),
];

fn cluster(servers: usize, kind: BalanceKind, seed: u64) -> SimConfig {
    SimConfig {
        workers: servers,
        cpus: CPUS,
        memory_mb: MEMORY_GB * 1024,
        regulator: RegulatorConfig::Fixed(u32::MAX),
        keepalive: KeepAliveConfig::new(KeepAliveKind::Gdsf),
        routing: Routing::seeded(kind, seed),
        ..SimConfig::default()
    }
}

/// The pools the balancer makes, highest priority first, as (size, b_max) (empty for
/// single-pool policies).
fn pool_sizes(w: &Workload, c: &SimConfig) -> Result<Vec<(usize, f64)>> {
    let router = Router::new(&c.routing, c.workers, worker_name, w)?;
    Ok(router
        .balancer()
        .map(|b| {
            b.pools()
                .iter()
                .map(|p| (p.members.len(), p.b_max))
                .collect()
        })
        .unwrap_or_default())
}

/// Each function's work: invocations × warm time.
fn work(w: &Workload) -> Vec<f64> {
    w.counts()
        .iter()
        .zip(&w.functions)
        .map(|(n, func)| *n as f64 * func.warm_us as f64)
        .collect()
}

/// Half the functions high priority with as near half the work as equal counts allow: by
/// work, largest first, each function joins the class with less work unless it is full.
fn balanced(w: &Workload) -> Vec<bool> {
    let work = work(w);
    let mut order: Vec<usize> = (0..work.len()).collect();
    order.sort_by(|a, b| work[*b].total_cmp(&work[*a]).then(a.cmp(b)));
    let half = work.len() / 2;
    let mut high = vec![false; work.len()];
    let (mut hi, mut lo) = ((0usize, 0.0), (0usize, 0.0));
    for i in order {
        let to_high = if hi.0 == half {
            false
        } else if lo.0 == work.len() - half {
            true
        } else {
            hi.1 <= lo.1
        };
        let class = if to_high { &mut hi } else { &mut lo };
        class.0 += 1;
        class.1 += work[i];
        high[i] = to_high;
    }
    high
}

/// Half the functions high priority, at random.
fn random(w: &Workload, seed: u64) -> Vec<bool> {
    let mut order: Vec<usize> = (0..w.functions.len()).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    let mut high = vec![false; order.len()];
    for i in &order[..order.len() / 2] {
        high[*i] = true;
    }
    high
}

fn with_priorities(w: &Workload, high: &[bool]) -> Workload {
    let mut out = w.clone();
    for (func, h) in out.functions.iter_mut().zip(high) {
        func.priority = if *h { HIGH } else { LOW };
    }
    out
}

pub(super) fn run(o: &Options) -> Result<Output> {
    let sample = AzureSample {
        file: AZURE_1350,
        selection: Selection::Random(200),
        minutes: if o.quick { 30 } else { 120 },
        mapping: Mapping::FunctionBench,
        scaling: Scaling::Concurrency(TARGET_CONCURRENCY),
    };
    let (base, made) = azure(o, &sample)?;
    let splits = [
        ("split by work", balanced(&base)),
        ("random split", random(&base, o.seed)),
    ];
    let workloads: Vec<Workload> = splits
        .iter()
        .map(|(_, high)| with_priorities(&base, high))
        .collect();
    let mut jobs = Vec::new();
    for ((split, _), w) in splits.iter().zip(&workloads) {
        for (label, n, kind) in CONFIGS {
            jobs.push(Job {
                label: format!("{label}, {split}"),
                workload: w,
                config: cluster(n, kind, o.seed),
            });
        }
    }
    let results = run_all(o.with_server(&mut jobs), o.jobs)?;
    let total_work: f64 = work(&base).iter().sum();
    let span_us = (made.span_s * 1e6).round() as u64;
    // The full cluster (8 servers) and the 25 % smaller one (6).
    let offered: Vec<OfferedLoad> = [8u64, 6]
        .iter()
        .map(|n| OfferedLoad::of(&base, n * u64::from(CPUS), span_us, LOAD_WINDOW_US))
        .collect();
    let mut md = format!(
        "# priority: k-CH-RLU's priority pools (thesis Figs. 4.10–4.11)\n\n\
         * {}\n* 8 servers: {}\n* 6 servers: {}\n* servers of {CPUS} CPUs and {MEMORY_GB} GiB; GDSF; every invocation runs at once \
         (processor sharing); status every 1 s\n\
         * half the functions high priority; normalized latency = e2e ÷ warm time, mean over each \
         class's completed invocations (and the median of the functions' means)\n\n",
        describe("random:200", &made, &base),
        offered[0].describe(),
        offered[1].describe(),
    );
    let mut json_splits = Vec::new();
    let mut panels = Vec::new();
    for (s, (split, high)) in splits.iter().enumerate() {
        let share = work(&base)
            .iter()
            .zip(high)
            .filter(|(_, h)| **h)
            .map(|(x, _)| x)
            .sum::<f64>()
            / total_work.max(1.0);
        let class = |m: &RunMetrics, want: bool| -> (f64, f64, u64) {
            let per: Vec<f64> = m
                .functions
                .iter()
                .zip(high)
                .filter(|(_, h)| **h == want)
                .filter_map(|(fm, _)| fm.mean_stretch())
                .collect();
            let dropped = m
                .functions
                .iter()
                .zip(high)
                .filter(|(_, h)| **h == want)
                .map(|(fm, _)| fm.dropped)
                .sum();
            (
                m.weighted_slowdown_of(|i| high[i] == want),
                quantile(&per, 0.5),
                dropped,
            )
        };
        let mut t = Table::new(&[
            "policy (servers)",
            "pools (high + low)",
            "high: normalized latency",
            "low: normalized latency",
            "high: median function",
            "low: median function",
            "high: dropped",
            "low: dropped",
            "cold %",
        ]);
        let (mut hi, mut lo) = (Vec::new(), Vec::new());
        let mut json_rows = Vec::new();
        for (c, (label, _, _)) in CONFIGS.iter().enumerate() {
            let i = s * CONFIGS.len() + c;
            let m = &results[i];
            let pools = pool_sizes(&workloads[s], &jobs[i].config)?;
            let (h, h_med, h_drop) = class(m, true);
            let (l, l_med, l_drop) = class(m, false);
            hi.push(h);
            lo.push(l);
            t.row(vec![
                label.to_string(),
                if pools.is_empty() {
                    "one pool".into()
                } else {
                    let sizes: Vec<String> = pools.iter().map(|p| p.0.to_string()).collect();
                    let bounds: Vec<String> = pools.iter().map(|p| f(p.1, 0)).collect();
                    format!("{} (b_max {})", sizes.join(" + "), bounds.join(", "))
                },
                f(h, 2),
                f(l, 2),
                f(h_med, 2),
                f(l_med, 2),
                h_drop.to_string(),
                l_drop.to_string(),
                f(100.0 * m.cold_ratio(), 2),
            ]);
            json_rows.push(json!({
                "policy": label,
                "pools": pools.iter().map(|p| p.0).collect::<Vec<_>>(),
                "pool_b_max": pools.iter().map(|p| p.1).collect::<Vec<_>>(),
                "high_normalized_latency": h, "low_normalized_latency": l,
                "high_median_function": h_med, "low_median_function": l_med,
                "high_dropped": h_drop, "low_dropped": l_drop,
                "completed": m.completed(), "cold_ratio": m.cold_ratio(),
            }));
        }
        md.push_str(&format!(
            "## {split}: high-priority functions carry {:.0} % of the work\n\n{}\n",
            100.0 * share,
            t.markdown()
        ));
        json_splits.push(json!({"split": split, "high_work_share": share, "runs": json_rows}));
        panels.push(BarPanel {
            title: format!("{split} (high: {:.0} % of the work)", 100.0 * share),
            categories: CONFIGS
                .iter()
                .map(|c| c.0.replace(", home only", ""))
                .collect(),
            y: Axis::log("normalized latency (e2e ÷ warm, log)"),
            series: vec![("high priority".into(), hi), ("low priority".into(), lo)],
        });
    }
    let fig = o.out.join("priority.png");
    plot::bars(
        &fig,
        "Normalized latency of high- and low-priority functions (servers in parentheses)",
        &panels,
        (1600, 560),
    )?;
    Ok((
        md,
        json!({"experiment": "priority", "offered_load": offered, "splits": json_splits}),
        vec![fig],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Arrival, SimFunction};

    #[test]
    fn a_balanced_split_halves_functions_and_work() {
        let func = |i: usize, warm_us| SimFunction::new(&format!("f{i}"), warm_us, 0, 64);
        // Work 100, 60, 50, 40, 10, 0 (one invocation each): 100 high; 60, 50 low (110);
        // 40 high (140); 10 low (120); the last must go high (low is full).
        let warm = [50, 100, 10, 60, 40, 0];
        let w = Workload {
            functions: warm.iter().enumerate().map(|(i, w)| func(i, *w)).collect(),
            arrivals: (0..6)
                .map(|i| Arrival {
                    at_us: i,
                    function: i as u32,
                })
                .collect(),
        };
        let high = balanced(&w);
        assert_eq!(high, [false, true, false, false, true, true]);
        assert_eq!(random(&w, 1).iter().filter(|h| **h).count(), 3);
    }
}
