//! `gpu`: GPU function scheduling on one server (thesis ch. 6, §6.5): MQFQ-Sticky vs FCFS vs
//! Batch across device parallelism D (Fig. 6.6), per-function latency and fairness
//! (Fig. 6.7), load (Table 6.3), flow over-run T (Fig. 6.10), flow TTL (Fig. 6.11), one vs two
//! GPUs (Fig. 6.8), CPU/GPU hybrid execution (Table 6.4), the container pool's miss rate
//! (Fig. 6.9) and the memory policies (Fig. 6.4: stock UVM, prefetch-only, prefetch-swap) on
//! the thesis' microbenchmark and on the medium trace.
//!
//! Workload as in §6.5: 24 Azure functions, each mapped onto the Table 6.1 function with the
//! longest warm GPU time not above its own execution time, arrivals redrawn from each
//! function's inter-arrival times and scaled to a target GPU utilization over 10 minutes
//! (`crate::gpu::workload`). The server is `crate::gpu::server`: the worker's GPU scheduler
//! on simulated V100s (16 GB) and 48 CPU cores.

use super::plot::{self, Axis, BarPanel, LinePanel, Series};
use super::runner::in_parallel;
use super::{azure, f, AzureSample, Options, Output, Table, AZURE_1350};
use crate::error::Result;
use crate::error::SimError;
use crate::gpu::{
    simulate_gpu, GpuRun, GpuServerConfig, GpuWorkload, Placement, Ran, StartKind, TABLE_6_1,
};
use hearth_core::gpu::{DispatchConfig, GpuMemoryPolicy, GpuPolicy, GpuSchedConfig, GpuSpec};
use hearth_core::time::secs;
use hearth_core::Micros;
use hearth_loadgen::make::{mapping::Mapping, select::Selection, Scaling};
use plotters::prelude::SeriesLabelPosition;
use serde_json::{json, Value};

/// Functions per trace (§6.5).
const FUNCTIONS: usize = 24;
/// A V100's memory.
const V100_MB: u64 = 16_384;
/// The medium-intensity trace (§6.5.1, Fig. 6.5: about 70 % utilization).
const MEDIUM: f64 = 0.70;
/// The high-intensity trace of Fig. 6.8 and Table 6.4 (of one GPU).
const HIGH: f64 = 0.90;
/// Fig. 6.4's microbenchmark (§6.4.2): 16 copies of FFT (1.5 GB each: 24 GB on a 16 GB
/// device, 50 % over), each called 20 times.
const MICRO_COPIES: usize = 16;
const MICRO_CALLS: usize = 20;
/// The memory policies in Fig. 6.4's order (its CUDA-madvise bar is not modelled).
const MEMORY_ORDER: [GpuMemoryPolicy; 3] = [
    GpuMemoryPolicy::Uvm,
    GpuMemoryPolicy::PrefetchOnly,
    GpuMemoryPolicy::PrefetchSwap,
];

/// What D a run uses: fixed, or utilization-driven (starting at 2, up to 6).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Dpar {
    Fixed(u32),
    Dynamic,
}

impl Dpar {
    fn label(self) -> String {
        match self {
            Dpar::Fixed(d) => format!("D={d}"),
            Dpar::Dynamic => "dynamic".into(),
        }
    }
}

/// The scheduler for `policy` with `d` on `gpus` V100s; everything else the defaults.
fn sched(policy: GpuPolicy, d: Dpar, gpus: usize) -> GpuSchedConfig {
    let mut c = GpuSchedConfig {
        policy,
        gpus: vec![GpuSpec { memory_mb: V100_MB }; gpus],
        ..GpuSchedConfig::default()
    };
    if let Dpar::Fixed(d) = d {
        c.d = d;
        c.d_max = d;
        c.dynamic_d = false;
    }
    c
}

fn server(sched: GpuSchedConfig) -> GpuServerConfig {
    GpuServerConfig {
        sched,
        ..GpuServerConfig::default()
    }
}

/// One simulation: which workload, which server.
struct Case {
    workload: usize,
    config: GpuServerConfig,
}

/// A run's numbers.
#[derive(Debug, Clone)]
struct Summary {
    mean_latency_s: f64,
    p99_latency_s: f64,
    mean_queue_s: f64,
    /// Mean (setup + exec) ÷ mean warm GPU time of the same invocations, − 1.
    exec_overhead_pct: f64,
    cold_pct: f64,
    host_warm_pct: f64,
    /// Mean setup + execution (s) of the GPU runs that found a container (not cold), and the
    /// setup part of it: what Fig. 6.4 measures.
    found_exec_s: f64,
    found_setup_s: f64,
    /// Per function: mean latency (s), `None` when it had no completed invocation.
    per_function_s: Vec<Option<f64>>,
    /// Variance of the per-function mean latencies (s²).
    variance: f64,
    measured_util_pct: f64,
    mean_d: f64,
    rejected: usize,
    on_cpu_pct: f64,
}

fn summarize(w: &GpuWorkload, run: &GpuRun) -> Summary {
    let done: Vec<_> = run
        .records
        .iter()
        .filter(|r| r.ran != Ran::Rejected)
        .collect();
    let n = done.len().max(1) as f64;
    let mut lat: Vec<f64> = done.iter().map(|r| r.latency_us() as f64 / 1e6).collect();
    lat.sort_by(f64::total_cmp);
    let gpu_runs: Vec<_> = done
        .iter()
        .filter(|r| matches!(r.ran, Ran::Gpu(_)))
        .collect();
    let g = gpu_runs.len().max(1) as f64;
    let taken: f64 = gpu_runs
        .iter()
        .map(|r| (r.setup_us + r.exec_us) as f64)
        .sum();
    let ideal: f64 = gpu_runs
        .iter()
        .map(|r| w.functions[r.function as usize].profile.gpu_warm_us() as f64)
        .sum();
    let mut sums = vec![(0.0, 0usize); w.functions.len()];
    for r in &done {
        let s = &mut sums[r.function as usize];
        s.0 += r.latency_us() as f64 / 1e6;
        s.1 += 1;
    }
    let per_function_s: Vec<Option<f64>> = sums
        .iter()
        .map(|(t, k)| (*k > 0).then(|| t / *k as f64))
        .collect();
    let means: Vec<f64> = per_function_s.iter().flatten().copied().collect();
    let m = means.iter().sum::<f64>() / means.len().max(1) as f64;
    let variance = means.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / means.len().max(1) as f64;
    let count = |k: StartKind| gpu_runs.iter().filter(|r| r.start == k).count() as f64;
    let found: Vec<_> = gpu_runs
        .iter()
        .filter(|r| r.start != StartKind::Cold)
        .collect();
    let fnum = found.len().max(1) as f64;
    let found_setup_s = found.iter().map(|r| r.setup_us as f64).sum::<f64>() / fnum / 1e6;
    let found_exec_s =
        found_setup_s + found.iter().map(|r| r.exec_us as f64).sum::<f64>() / fnum / 1e6;
    Summary {
        mean_latency_s: lat.iter().sum::<f64>() / n,
        p99_latency_s: if lat.is_empty() {
            0.0
        } else {
            plot::quantile(&lat, 0.99)
        },
        mean_queue_s: done.iter().map(|r| r.queue_us as f64).sum::<f64>() / n / 1e6,
        exec_overhead_pct: if ideal > 0.0 {
            (taken / ideal - 1.0) * 100.0
        } else {
            0.0
        },
        cold_pct: count(StartKind::Cold) / g * 100.0,
        host_warm_pct: count(StartKind::HostWarm) / g * 100.0,
        found_exec_s,
        found_setup_s,
        per_function_s,
        variance,
        measured_util_pct: run.mean_util.iter().sum::<f64>() / run.mean_util.len().max(1) as f64
            * 100.0,
        mean_d: run.mean_d.iter().sum::<f64>() / run.mean_d.len().max(1) as f64,
        rejected: run.records.len() - done.len(),
        on_cpu_pct: done.iter().filter(|r| r.ran == Ran::Cpu).count() as f64 / n * 100.0,
    }
}

fn summary_json(s: &Summary) -> Value {
    json!({
        "mean_latency_s": s.mean_latency_s,
        "p99_latency_s": s.p99_latency_s,
        "mean_queue_s": s.mean_queue_s,
        "exec_overhead_pct": s.exec_overhead_pct,
        "cold_pct": s.cold_pct,
        "host_warm_pct": s.host_warm_pct,
        "found_exec_s": s.found_exec_s,
        "found_setup_s": s.found_setup_s,
        "function_variance_s2": s.variance,
        "measured_util_pct": s.measured_util_pct,
        "mean_d": s.mean_d,
        "rejected": s.rejected,
        "on_cpu_pct": s.on_cpu_pct,
    })
}

/// The sweeps' points (quick: a few).
struct Points {
    span_us: Micros,
    minutes: usize,
    ds: Vec<Dpar>,
    utils: Vec<f64>,
    ts: Vec<f64>,
    fixed_ttls_s: Vec<f64>,
    alphas: Vec<f64>,
    pools: Vec<u32>,
    multi_ds: Vec<Dpar>,
}

fn points(quick: bool) -> Points {
    if quick {
        Points {
            span_us: secs(60),
            minutes: 30,
            ds: vec![Dpar::Fixed(1), Dpar::Dynamic],
            utils: vec![0.4, MEDIUM],
            ts: vec![0.0, 10.0],
            fixed_ttls_s: vec![0.0, 1.0],
            alphas: vec![1.5],
            pools: vec![2, 16],
            multi_ds: vec![Dpar::Fixed(1), Dpar::Dynamic],
        }
    } else {
        Points {
            span_us: secs(600),
            minutes: 60,
            ds: vec![
                Dpar::Fixed(1),
                Dpar::Fixed(2),
                Dpar::Fixed(3),
                Dpar::Dynamic,
            ],
            utils: vec![0.30, 0.40, 0.50, 0.60, MEDIUM, 0.75],
            ts: vec![0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0],
            fixed_ttls_s: vec![0.0, 0.1, 0.5, 1.0, 2.0, 4.0],
            alphas: vec![0.5, 1.0, 1.5, 2.0, 3.0, 4.0],
            pools: vec![1, 2, 4, 8, 16, 32],
            multi_ds: vec![
                Dpar::Fixed(1),
                Dpar::Fixed(2),
                Dpar::Fixed(3),
                Dpar::Fixed(4),
                Dpar::Dynamic,
            ],
        }
    }
}

pub(super) fn run(o: &Options) -> Result<Output> {
    let p = points(o.quick);
    let sample = AzureSample {
        file: AZURE_1350,
        selection: Selection::Representative(FUNCTIONS),
        minutes: p.minutes,
        mapping: Mapping::Busy,
        scaling: Scaling::None,
    };
    let (trace, made) = azure(o, &sample)?;
    let trace_span = ((made.span_s * 1e6).round() as Micros).max(1);
    let make = |util: f64| GpuWorkload::from_trace(&trace, trace_span, p.span_us, util, 1, o.seed);
    // Workloads: 0 = medium, 1 = high, then the load sweep.
    let mut workloads = vec![make(MEDIUM)?, make(HIGH)?];
    for u in &p.utils {
        workloads.push(make(*u)?);
    }
    let (medium, high) = (0usize, 1usize);
    let load_at = |k: usize| 2 + k;
    let fft = TABLE_6_1
        .iter()
        .find(|p| p.name == "fft")
        .ok_or_else(|| SimError::Internal("Table 6.1 has no fft row".into()))?;
    let micro = workloads.len();
    workloads.push(GpuWorkload::copies_in_turn(
        *fft,
        MICRO_COPIES,
        MICRO_CALLS,
    )?);

    let mut cases: Vec<Case> = Vec::new();
    let mut add = |workload: usize, config: GpuServerConfig| {
        cases.push(Case { workload, config });
        cases.len() - 1
    };
    // Fig. 6.6 / 6.7.
    let fig66: Vec<Vec<usize>> = GpuPolicy::ALL
        .iter()
        .map(|pol| {
            p.ds.iter()
                .map(|d| add(medium, server(sched(*pol, *d, 1))))
                .collect()
        })
        .collect();
    // Table 6.3.
    let load: Vec<Vec<usize>> = (0..p.utils.len())
        .map(|k| {
            GpuPolicy::ALL
                .iter()
                .map(|pol| add(load_at(k), server(sched(*pol, Dpar::Dynamic, 1))))
                .collect()
        })
        .collect();
    // Fig. 6.10: T, with τ-cost and uniform cost.
    let t_sweep: Vec<[usize; 2]> =
        p.ts.iter()
            .map(|t| {
                [false, true].map(|uniform| {
                    let mut s = sched(GpuPolicy::MqfqSticky, Dpar::Dynamic, 1);
                    s.t = *t;
                    s.uniform_cost = uniform;
                    add(medium, server(s))
                })
            })
            .collect();
    // Fig. 6.11: fixed TTL vs α × IAT.
    let fixed_ttl: Vec<usize> = p
        .fixed_ttls_s
        .iter()
        .map(|ttl| {
            let mut s = sched(GpuPolicy::MqfqSticky, Dpar::Dynamic, 1);
            s.fixed_ttl_us = Some((ttl * 1e6).round() as Micros);
            add(medium, server(s))
        })
        .collect();
    let alpha: Vec<usize> = p
        .alphas
        .iter()
        .map(|a| {
            let mut s = sched(GpuPolicy::MqfqSticky, Dpar::Dynamic, 1);
            s.alpha = *a;
            s.fixed_ttl_us = None;
            add(medium, server(s))
        })
        .collect();
    // Fig. 6.8: one vs two GPUs on the high trace.
    let multi: Vec<Vec<usize>> = [1usize, 2]
        .iter()
        .map(|g| {
            p.multi_ds
                .iter()
                .map(|d| add(high, server(sched(GpuPolicy::MqfqSticky, *d, *g))))
                .collect()
        })
        .collect();
    // Table 6.4 on the high trace.
    let hybrid_rows = ["CPU-only", "1 GPU", "2 GPUs", "CPU+GPU"];
    let hybrid: Vec<usize> = hybrid_rows
        .iter()
        .map(|row| {
            let gpus = if *row == "2 GPUs" { 2 } else { 1 };
            let mut c = server(sched(GpuPolicy::MqfqSticky, Dpar::Dynamic, gpus));
            c.placement = match *row {
                "CPU-only" => Placement::Cpu,
                "CPU+GPU" => Placement::Hybrid(DispatchConfig::default()),
                _ => Placement::Gpu,
            };
            add(high, c)
        })
        .collect();
    // Fig. 6.9: pool size.
    let pool_policies = [GpuPolicy::MqfqSticky, GpuPolicy::Fcfs];
    let pool: Vec<Vec<usize>> = pool_policies
        .iter()
        .map(|pol| {
            p.pools
                .iter()
                .map(|n| {
                    let mut s = sched(*pol, Dpar::Dynamic, 1);
                    s.containers_per_gpu = *n;
                    add(medium, server(s))
                })
                .collect()
        })
        .collect();

    // Fig. 6.4: memory policies on the microbenchmark (D = 1) and on the medium trace.
    let with_memory = |mut s: GpuSchedConfig, m: GpuMemoryPolicy| {
        s.memory = m;
        server(s)
    };
    let mem_micro: Vec<usize> = MEMORY_ORDER
        .iter()
        .map(|m| {
            add(
                micro,
                with_memory(sched(GpuPolicy::MqfqSticky, Dpar::Fixed(1), 1), *m),
            )
        })
        .collect();
    let mem_medium: Vec<usize> = MEMORY_ORDER
        .iter()
        .map(|m| {
            add(
                medium,
                with_memory(sched(GpuPolicy::MqfqSticky, Dpar::Dynamic, 1), *m),
            )
        })
        .collect();

    let results: Vec<Summary> = in_parallel(&cases, o.jobs, |c| {
        let w = &workloads[c.workload];
        simulate_gpu(w, &c.config).map(|run| summarize(w, &run))
    })?;
    let at = |i: usize| &results[i];
    let util = |k: usize| workloads[k].offered_util(1) * 100.0;

    let mut md =
        String::from("# gpu: GPU function scheduling on one server (thesis ch. 6, §6.5)\n\n");
    md.push_str(&format!(
        "One server, simulated V100s ({V100_MB} MB each) scheduled by hearth_core::gpu, 48 CPU cores. \
         {FUNCTIONS} Azure functions (representative sample, {} minutes of the trace), each mapped onto \
         Table 6.1 by execution time; arrivals redrawn from each function's gaps and scaled to a target \
         utilization over {:.0} s. Defaults: T = 10, flow TTL α × IAT with α = 1.5, dynamic D (2, up to 6, 90 % threshold), \
         16 containers per GPU. Latency = queue + setup (cold start or prefetch) + execution.\n\n",
        p.minutes,
        p.span_us as f64 / 1e6
    ));
    let functions_line = |w: &GpuWorkload| {
        let mut kinds: std::collections::BTreeMap<&str, usize> = Default::default();
        for fun in &w.functions {
            *kinds.entry(fun.profile.name).or_default() += 1;
        }
        kinds
            .iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    md.push_str(&format!(
        "* medium trace: offered GPU utilization {}% of one GPU, {} req/s, {} invocations\n\
         * high trace: offered {}% of one GPU, {} req/s, {} invocations\n\
         * functions by Table 6.1 row: {}\n\n",
        f(util(medium), 1),
        f(workloads[medium].rate(), 2),
        workloads[medium].arrivals.len(),
        f(util(high), 1),
        f(workloads[high].rate(), 2),
        workloads[high].arrivals.len(),
        functions_line(&workloads[medium]),
    ));

    // Fig. 6.6
    md.push_str(&format!(
        "## Average latency vs D (Fig. 6.6), medium trace ({}% offered)\n\n",
        f(util(medium), 1)
    ));
    let mut t = Table::with_header(
        std::iter::once("mean latency s (cold %)".to_string())
            .chain(p.ds.iter().map(|d| d.label()))
            .collect(),
    );
    let mut json66 = Vec::new();
    for (pi, pol) in GpuPolicy::ALL.iter().enumerate() {
        let mut row = vec![pol.to_string()];
        for (di, d) in p.ds.iter().enumerate() {
            let s = at(fig66[pi][di]);
            row.push(format!("{} ({})", f(s.mean_latency_s, 2), f(s.cold_pct, 1)));
            json66
                .push(json!({"policy": pol.as_str(), "d": d.label(), "summary": summary_json(s)}));
        }
        t.row(row);
    }
    md.push_str(&t.markdown());

    // Fig. 6.7 at the default (dynamic D).
    let dyn_i = p.ds.len() - 1;
    md.push_str(&format!(
        "\n## Per-function mean latency and fairness (Fig. 6.7), medium trace ({}% offered), dynamic D\n\n",
        f(util(medium), 1)
    ));
    let mut t = Table::new(&["function", "mqfq-sticky s", "fcfs s", "batch s"]);
    let w = &workloads[medium];
    let mut json67 = Vec::new();
    for (fi, fun) in w.functions.iter().enumerate() {
        let cell = |pi: usize| at(fig66[pi][dyn_i]).per_function_s[fi];
        if (0..3).all(|pi| cell(pi).is_none()) {
            continue;
        }
        let show = |v: Option<f64>| v.map_or("-".to_string(), |x| f(x, 2));
        t.row(vec![
            fun.name.to_string(),
            show(cell(0)),
            show(cell(1)),
            show(cell(2)),
        ]);
        json67.push(json!({"function": fun.name.as_ref(), "mqfq_sticky_s": cell(0), "fcfs_s": cell(1), "batch_s": cell(2)}));
    }
    let var = |pi: usize| at(fig66[pi][dyn_i]).variance;
    t.row(vec![
        "**inter-function variance (s²)**".into(),
        f(var(0), 1),
        f(var(1), 1),
        f(var(2), 1),
    ]);
    md.push_str(&t.markdown());

    // Table 6.3
    md.push_str("\n## Latency vs load (Table 6.3), dynamic D\n\n");
    let mut t = Table::new(&[
        "offered util %",
        "req/s",
        "measured util %",
        "MQFQ-Sticky s",
        "FCFS s",
        "Batch s",
        "FCFS/MQFQ",
        "Batch/MQFQ",
    ]);
    let mut json63 = Vec::new();
    for (k, row) in load.iter().enumerate() {
        let (m, fc, b) = (at(row[0]), at(row[1]), at(row[2]));
        let wk = &workloads[load_at(k)];
        t.row(vec![
            f(util(load_at(k)), 1),
            f(wk.rate(), 2),
            f(m.measured_util_pct, 1),
            f(m.mean_latency_s, 2),
            f(fc.mean_latency_s, 2),
            f(b.mean_latency_s, 2),
            f(fc.mean_latency_s / m.mean_latency_s.max(1e-9), 2),
            f(b.mean_latency_s / m.mean_latency_s.max(1e-9), 2),
        ]);
        json63.push(
            json!({"offered_util_pct": util(load_at(k)), "req_per_s": wk.rate(),
            "mqfq_sticky": summary_json(m), "fcfs": summary_json(fc), "batch": summary_json(b)}),
        );
    }
    md.push_str(&t.markdown());

    // Fig. 6.10
    md.push_str(&format!(
        "\n## Flow over-run T (Fig. 6.10), MQFQ-Sticky, medium trace ({}% offered)\n\n",
        f(util(medium), 1)
    ));
    let mut t = Table::new(&[
        "T",
        "τ cost: mean latency s",
        "τ cost: cold %",
        "uniform cost (1.0): mean latency s",
        "uniform: cold %",
    ]);
    let mut json610 = Vec::new();
    for (k, tv) in p.ts.iter().enumerate() {
        let (a, b) = (at(t_sweep[k][0]), at(t_sweep[k][1]));
        t.row(vec![
            f(*tv, 0),
            f(a.mean_latency_s, 2),
            f(a.cold_pct, 1),
            f(b.mean_latency_s, 2),
            f(b.cold_pct, 1),
        ]);
        json610
            .push(json!({"t": tv, "tau_cost": summary_json(a), "uniform_cost": summary_json(b)}));
    }
    md.push_str(&t.markdown());

    // Fig. 6.11
    md.push_str(&format!(
        "\n## Flow TTL (Fig. 6.11), MQFQ-Sticky, medium trace ({}% offered)\n\n\
         Execution overhead = (setup + execution) ÷ warm solo GPU time − 1.\n\n",
        f(util(medium), 1)
    ));
    let mut t = Table::new(&["TTL", "mean latency s", "execution overhead %", "cold %"]);
    let mut json611 = Vec::new();
    for (k, ttl) in p.fixed_ttls_s.iter().enumerate() {
        let s = at(fixed_ttl[k]);
        t.row(vec![
            format!("fixed {ttl} s"),
            f(s.mean_latency_s, 2),
            f(s.exec_overhead_pct, 1),
            f(s.cold_pct, 1),
        ]);
        json611.push(json!({"fixed_ttl_s": ttl, "summary": summary_json(s)}));
    }
    for (k, a) in p.alphas.iter().enumerate() {
        let s = at(alpha[k]);
        t.row(vec![
            format!("α = {a} × IAT"),
            f(s.mean_latency_s, 2),
            f(s.exec_overhead_pct, 1),
            f(s.cold_pct, 1),
        ]);
        json611.push(json!({"alpha": a, "summary": summary_json(s)}));
    }
    md.push_str(&t.markdown());

    // Fig. 6.8
    md.push_str(&format!(
        "\n## One vs two GPUs (Fig. 6.8), MQFQ-Sticky, high trace ({}% of one GPU offered)\n\n",
        f(util(high), 1)
    ));
    let mut t = Table::with_header(
        std::iter::once("mean latency s".to_string())
            .chain(p.multi_ds.iter().map(|d| d.label()))
            .collect(),
    );
    let mut json68 = Vec::new();
    for (gi, g) in [1usize, 2].iter().enumerate() {
        let mut row = vec![format!("{g} GPU{}", if *g > 1 { "s" } else { "" })];
        for (di, d) in p.multi_ds.iter().enumerate() {
            let s = at(multi[gi][di]);
            row.push(f(s.mean_latency_s, 2));
            json68.push(json!({"gpus": g, "d": d.label(), "summary": summary_json(s)}));
        }
        t.row(row);
    }
    md.push_str(&t.markdown());

    // Table 6.4
    md.push_str(&format!(
        "\n## CPU, GPU and hybrid execution (Table 6.4), high trace ({}% of one GPU offered)\n\n\
         CPU+GPU: the speedup dispatch (Table 6.1 speedups as the offline profile; GPU when ≥ 3× \
         and in the top half).\n\n",
        f(util(high), 1)
    ));
    let mut t = Table::new(&["case", "mean latency s", "p99 s", "on CPU %"]);
    let mut json64 = Vec::new();
    for (k, row) in hybrid_rows.iter().enumerate() {
        let s = at(hybrid[k]);
        t.row(vec![
            row.to_string(),
            f(s.mean_latency_s, 2),
            f(s.p99_latency_s, 2),
            f(s.on_cpu_pct, 1),
        ]);
        json64.push(json!({"case": row, "summary": summary_json(s)}));
    }
    md.push_str(&t.markdown());

    // Fig. 6.9
    md.push_str(&format!(
        "\n## Container pool size vs cold starts (Fig. 6.9), medium trace ({}% offered)\n\n",
        f(util(medium), 1)
    ));
    let mut t = Table::with_header(
        std::iter::once("cold % (mean latency s)".to_string())
            .chain(p.pools.iter().map(|n| format!("{n}/GPU")))
            .collect(),
    );
    let mut json69 = Vec::new();
    for (pi, pol) in pool_policies.iter().enumerate() {
        let mut row = vec![pol.to_string()];
        for (ni, n) in p.pools.iter().enumerate() {
            let s = at(pool[pi][ni]);
            row.push(format!("{} ({})", f(s.cold_pct, 1), f(s.mean_latency_s, 2)));
            json69.push(json!({"policy": pol.as_str(), "containers_per_gpu": n, "summary": summary_json(s)}));
        }
        t.row(row);
    }
    md.push_str(&t.markdown());

    // Fig. 6.4
    let ideal_s = fft.gpu_warm_s;
    md.push_str(&format!(
        "\n## Memory policies (Fig. 6.4): {MICRO_COPIES} FFT copies × {} MB on one {V100_MB} MB GPU, \
         {MICRO_CALLS} calls each in turn, D = 1, MQFQ-Sticky\n\n\
         Execution = setup (paging) + run, over the calls that found a container (the {MICRO_COPIES} \
         first calls start cold); ideal = Table 6.1's warm {ideal_s} s.\n\n",
        fft.memory_mb
    ));
    let mut t = Table::new(&[
        "memory policy",
        "mean execution s",
        "of which paging s",
        "vs ideal",
        "vs stock UVM",
        "host-warm %",
    ]);
    let uvm_s = at(mem_micro[0]).found_exec_s;
    let mut json64m = Vec::new();
    for (k, m) in MEMORY_ORDER.iter().enumerate() {
        let s = at(mem_micro[k]);
        t.row(vec![
            m.to_string(),
            f(s.found_exec_s, 3),
            f(s.found_setup_s, 3),
            format!("{:+.1} %", (s.found_exec_s / ideal_s - 1.0) * 100.0),
            format!("{:+.1} %", (s.found_exec_s / uvm_s.max(1e-9) - 1.0) * 100.0),
            f(s.host_warm_pct, 1),
        ]);
        json64m.push(json!({"memory": m.as_str(), "summary": summary_json(s)}));
    }
    md.push_str(&t.markdown());
    md.push_str(&format!(
        "\n## Memory policies on the medium trace ({}% offered), MQFQ-Sticky, dynamic D\n\n",
        f(util(medium), 1)
    ));
    let mut t = Table::new(&[
        "memory policy",
        "mean latency s",
        "p99 s",
        "cold %",
        "host-warm %",
        "execution overhead %",
    ]);
    let mut json64t = Vec::new();
    for (k, m) in MEMORY_ORDER.iter().enumerate() {
        let s = at(mem_medium[k]);
        t.row(vec![
            m.to_string(),
            f(s.mean_latency_s, 2),
            f(s.p99_latency_s, 2),
            f(s.cold_pct, 1),
            f(s.host_warm_pct, 1),
            f(s.exec_overhead_pct, 1),
        ]);
        json64t.push(json!({"memory": m.as_str(), "summary": summary_json(s)}));
    }
    md.push_str(&t.markdown());

    // Figures.
    let mut files = Vec::new();
    let fig = o.out.join("gpu_latency_vs_d.png");
    plot::bars(
        &fig,
        "Average latency vs D (Fig. 6.6)",
        &[BarPanel {
            title: format!("medium trace, {}% offered", f(util(medium), 0)),
            categories: p.ds.iter().map(|d| d.label()).collect(),
            y: Axis::linear("mean latency (s)"),
            series: GpuPolicy::ALL
                .iter()
                .enumerate()
                .map(|(pi, pol)| {
                    (
                        pol.to_string(),
                        fig66[pi].iter().map(|i| at(*i).mean_latency_s).collect(),
                    )
                })
                .collect(),
        }],
        (800, 500),
    )?;
    files.push(fig);
    let fig = o.out.join("gpu_pool_cold.png");
    plot::lines(
        &fig,
        "Container pool miss rate (Fig. 6.9)",
        &[LinePanel {
            title: format!("medium trace, {}% offered", f(util(medium), 0)),
            x: Axis::log("containers per GPU"),
            y: Axis::linear("cold starts (%)"),
            series: pool_policies
                .iter()
                .enumerate()
                .map(|(pi, pol)| Series {
                    label: pol.to_string(),
                    points: p
                        .pools
                        .iter()
                        .zip(&pool[pi])
                        .map(|(n, i)| (f64::from(*n), at(*i).cold_pct))
                        .collect(),
                })
                .collect(),
            markers: true,
            legend: SeriesLabelPosition::UpperRight,
        }],
        (800, 500),
    )?;
    files.push(fig);
    let fig = o.out.join("gpu_memory_policies.png");
    plot::bars(
        &fig,
        "Memory policies (Fig. 6.4)",
        &[BarPanel {
            title: format!(
                "{MICRO_COPIES} FFT × {} MB on {V100_MB} MB, D = 1; ideal {ideal_s} s",
                fft.memory_mb
            ),
            categories: MEMORY_ORDER.iter().map(|m| m.to_string()).collect(),
            y: Axis::linear("mean execution time (s)"),
            series: vec![
                (
                    "paging + run".to_string(),
                    mem_micro.iter().map(|i| at(*i).found_exec_s).collect(),
                ),
                (
                    "of which paging".to_string(),
                    mem_micro.iter().map(|i| at(*i).found_setup_s).collect(),
                ),
            ],
        }],
        (800, 500),
    )?;
    files.push(fig);

    let json = json!({
        "experiment": "gpu",
        "medium": {"offered_util_pct": util(medium), "req_per_s": workloads[medium].rate(), "invocations": workloads[medium].arrivals.len()},
        "high": {"offered_util_pct": util(high), "req_per_s": workloads[high].rate(), "invocations": workloads[high].arrivals.len()},
        "latency_vs_d": json66,
        "per_function": json67,
        "load": json63,
        "t_sweep": json610,
        "ttl": json611,
        "multi_gpu": json68,
        "hybrid": json64,
        "pool": json69,
        "memory_microbenchmark": json64m,
        "memory_medium": json64t,
    });
    Ok((md, json, files))
}
