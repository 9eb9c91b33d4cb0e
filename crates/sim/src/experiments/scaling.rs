//! `scaling`: bursty traffic and horizontal scaling (CH-RLU paper §6.2.1–6.2.2, Figs. 9–11;
//! thesis §4.6.2.1–4.6.2.2, Figs. 4.7–4.9).
//!
//! The paper's workload (§6.1): 12 FunctionBench functions, ten clones of each (120 functions),
//! invoked with skewed weights. Here the 12 are FunctionBench-like functions with warm times from
//! 50 ms to 6 s and inits of 0.5–4 s (this experiment's values), and the weights are a Zipf law
//! over the 120 in a seeded random order. Every workload is an **open-loop** arrival process
//! (non-homogeneous Poisson, the function of each arrival drawn by the weights in force then):
//!
//! * Fig. 9, bursty weights: every 30 s two of the ten top-weighted functions get 25× their
//!   weight, then revert and two others are chosen; the rate of each 30-s window is set so that
//!   the offered CPU load stays at 75 % of the cluster (a burst of a long function lowers the
//!   rate, as it lowers a closed loop's). The paper drove this one with a closed loop (Locust
//!   threads); an open loop keeps the rate whatever the latency, which is the harsher of the two
//!   for a policy that overloads a worker.
//! * Fig. 10, a 30-minute rising burst: from a sixth of the peak rate, rising quadratically to
//!   the peak at minute 25 and held there; the peak offers 95 % of the cluster's CPUs (the paper's
//!   "roughly 18 invocations per second" on its OpenWhisk cluster, scaled to this one).
//! * Fig. 11, scaling: 3 workers to start, the rate rising linearly for 12 minutes (the paper's
//!   one more client thread every 6 s) to the load of about nine workers at the target, held,
//!   then falling to a fifth from minute 20 to 24; the core's autoscaler adds and drains workers.
//!
//! The workers run every invocation at once (processor sharing, as OpenWhisk's invokers), as in
//! `balance`, so a worker's normalized load can pass 1.

use super::metrics::RunMetrics;
use super::plot::{self, Axis, BarPanel, LinePanel, Series};
use super::runner::Job;
use super::{f, Options, Output, Table};
use crate::closed_loop::{ClosedLoop, Mix};
use crate::config::{Routing, SimAutoscale, SimConfig};
use crate::error::Result;
use crate::record::{End, Record, Sink};
use crate::simulation::{simulate, SimStats};
use crate::workload::{Arrival, SimFunction, Workload};
use hearth_core::autoscale::{AutoscaleParams, Direction, ScaleDecision};
use hearth_core::balance::{BalanceKind, WorkerLoad};
use hearth_core::pool::ColdReason;
use hearth_core::time::secs;
use hearth_core::{KeepAliveConfig, KeepAliveKind, Micros, QueueDiscipline, RegulatorConfig};
use plotters::prelude::SeriesLabelPosition;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

/// A FunctionBench-like function: name, warm time, init (the extra of a cold start), memory.
const BENCH: [(&str, f64, f64, u64); 12] = [
    ("float", 50.0, 500.0, 128),
    ("json", 120.0, 600.0, 128),
    ("chameleon", 250.0, 900.0, 192),
    ("pyaes", 400.0, 700.0, 128),
    ("linpack", 600.0, 1_200.0, 256),
    ("gzip", 800.0, 800.0, 256),
    ("matmul", 1_000.0, 1_500.0, 256),
    ("image", 1_500.0, 2_000.0, 384),
    ("lr-serve", 2_000.0, 3_500.0, 512),
    ("rnn", 3_000.0, 3_000.0, 512),
    ("video", 4_500.0, 2_500.0, 512),
    ("train", 6_000.0, 4_000.0, 1024),
];
/// Clones of each (the paper's ten).
const CLONES: usize = 10;
/// Zipf exponent of the weights over the 120 functions.
const ZIPF_S: f64 = 0.9;
/// Fig. 9: the burst's length, the weight multiplier, and the pool the two are drawn from.
const BURST_S: f64 = 30.0;
const BURST_FACTOR: f64 = 25.0;
const BURST_POOL: usize = 10;
/// Fig. 9's offered CPU load (share of the cluster's CPUs), and Fig. 10's at its peak.
const LOAD_FIG9: f64 = 0.75;
const LOAD_FIG10: f64 = 0.95;
/// Fig. 11's scale-in load: CH-RLU keeps the hottest functions on their homes, so the busiest
/// worker stays well above the mean when the cluster is idle (at a mean of 0.1, one worker near
/// 0.5): the default 0.3 would never see every worker under it.
const SCALE_IN_FIG11: f64 = 0.6;
/// The paper's closed loop (§6.1): Locust threads that wait 0–1 s after each answer, 120 of
/// them for its heavy load on its 8 × 16 CPUs (scaled to the cluster's CPUs in quick runs).
const THINK_MAX_US: Micros = 1_000_000;
const PAPER_THREADS: f64 = 120.0;
const PAPER_CPUS: f64 = 128.0;

/// The policies Fig. 9 runs on scarce memory: OpenWhisk's placement with both keep-alives
/// (the paper's OW+GD against OW+TTL), and CH-RLU; the first is the reference.
const SCARCE_POLICIES: [&str; 3] = ["openwhisk (GDSF)", "openwhisk (TTL)", "ch-rlu"];

/// The cluster and spans of a run.
#[derive(Debug, Clone, Copy)]
struct Size {
    workers: usize,
    cpus: u32,
    memory_mb: u64,
    /// Figs. 9 and 10, seconds.
    burst_span_s: f64,
    rising_span_s: f64,
    /// Fig. 11: seconds per paper minute (60 in full runs).
    minute_s: f64,
    start_workers: usize,
    max_workers: u32,
    /// Fig. 11: autoscaler's interval, dead band, and a new worker's start time.
    interval_us: Micros,
    dead_band_ms: u64,
    start_us: Micros,
    /// Fig. 11: width of the latency-over-time buckets.
    bucket_s: f64,
}

fn size(quick: bool) -> Size {
    if quick {
        Size {
            workers: 4,
            cpus: 4,
            memory_mb: 8 * 1024,
            burst_span_s: 120.0,
            rising_span_s: 180.0,
            minute_s: 8.0,
            start_workers: 2,
            max_workers: 6,
            interval_us: secs(1),
            dead_band_ms: 15_000,
            start_us: secs(3),
            bucket_s: 8.0,
        }
    } else {
        Size {
            workers: 8,
            cpus: 16,
            memory_mb: 32 * 1024,
            burst_span_s: 1800.0,
            rising_span_s: 1800.0,
            minute_s: 60.0,
            start_workers: 3,
            max_workers: 12,
            interval_us: secs(5),
            dead_band_ms: 120_000,
            start_us: secs(30),
            bucket_s: 30.0,
        }
    }
}

/// The 120 functions and their base weights (a Zipf law in a seeded order).
fn functions(rng: &mut ChaCha8Rng) -> (Vec<SimFunction>, Vec<f64>) {
    let mut fns = Vec::new();
    for (name, warm, init, mem) in BENCH {
        for c in 0..CLONES {
            let ms = |v: f64| (v * 1000.0).round() as Micros;
            fns.push(SimFunction::new(
                &format!("{name}-{c}"),
                ms(warm),
                ms(init),
                mem,
            ));
        }
    }
    let mut rank: Vec<usize> = (0..fns.len()).collect();
    rank.shuffle(rng);
    let mut weights = vec![0.0; fns.len()];
    for (r, i) in rank.into_iter().enumerate() {
        weights[i] = 1.0 / ((r + 1) as f64).powf(ZIPF_S);
    }
    (fns, weights)
}

/// Mean warm time (s) of an invocation under `weights`.
fn mean_warm_s(fns: &[SimFunction], weights: &[f64]) -> f64 {
    let total: f64 = weights.iter().sum();
    fns.iter()
        .zip(weights)
        .map(|(f, w)| f.warm_us as f64 / 1e6 * w)
        .sum::<f64>()
        / total
}

fn cumulative(weights: &[f64]) -> Vec<f64> {
    let mut acc = 0.0;
    weights
        .iter()
        .map(|w| {
            acc += w;
            acc
        })
        .collect()
}

/// An open-loop arrival process over `span_s`: rate `rate(t)` per second (thinning against
/// `peak`), each arrival's function drawn from the cumulative weights `mix(t)`.
fn open_loop(
    span_s: f64,
    peak: f64,
    rate: impl Fn(f64) -> f64,
    mix: impl Fn(f64) -> usize,
    mixes: &[Vec<f64>],
    rng: &mut ChaCha8Rng,
) -> Vec<Arrival> {
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        let u: f64 = rng.gen();
        t += -(1.0 - u).ln() / peak;
        if t >= span_s {
            return out;
        }
        if rng.gen::<f64>() * peak > rate(t) {
            continue;
        }
        let cum = &mixes[mix(t)];
        let total = cum.last().copied().unwrap_or(0.0);
        let x = rng.gen::<f64>() * total;
        let i = cum.partition_point(|c| *c <= x).min(cum.len() - 1);
        out.push(Arrival {
            at_us: (t * 1e6) as Micros,
            function: i as u32,
        });
    }
}

/// OpenWhisk-like invokers: every invocation runs at once, GDSF unless `keepalive` says.
fn cluster(s: &Size, workers: usize, routing: Routing, keepalive: KeepAliveKind) -> SimConfig {
    SimConfig {
        workers,
        cpus: s.cpus,
        memory_mb: s.memory_mb,
        queue: QueueDiscipline::Fcfs,
        regulator: RegulatorConfig::Fixed(u32::MAX),
        keepalive: KeepAliveConfig::new(keepalive),
        routing,
        ..SimConfig::default()
    }
}

/// The policies Figs. 9–10 compare: the paper's OW+GD, OW+TTL, LL, CH-BL and RLU.
fn policies(seed: u64) -> Vec<(&'static str, Routing, KeepAliveKind)> {
    let p = |k| Routing::seeded(k, seed);
    vec![
        (
            "openwhisk (GDSF)",
            p(BalanceKind::OpenWhisk),
            KeepAliveKind::Gdsf,
        ),
        (
            "openwhisk (TTL)",
            p(BalanceKind::OpenWhisk),
            KeepAliveKind::Ttl,
        ),
        (
            "least-loaded",
            p(BalanceKind::LeastLoaded),
            KeepAliveKind::Gdsf,
        ),
        ("ch-bl", p(BalanceKind::ChBl), KeepAliveKind::Gdsf),
        ("ch-rlu", p(BalanceKind::ChRlu), KeepAliveKind::Gdsf),
    ]
}

pub(super) fn run(o: &Options) -> Result<Output> {
    let s = size(o.quick);
    let mut rng = ChaCha8Rng::seed_from_u64(o.seed);
    let (fns, weights) = functions(&mut rng);
    let warm_s = mean_warm_s(&fns, &weights);
    let capacity = (s.workers as u32 * s.cpus) as f64;
    let cpus = u64::from(s.workers as u32 * s.cpus);
    let mut md = format!(
        "# scaling: bursty traffic and horizontal scaling (CH-RLU paper Figs. 9–11)\n\n\
         * {} functions (12 FunctionBench-like × {CLONES} clones, Zipf({ZIPF_S}) weights), mean warm \
         time {} s per invocation; open-loop arrivals, then closed-loop clients as the paper's \
         Locust threads (each waits for its answer, thinks 0–1 s, invokes again).\n\
         * Figs. 9–10: {} workers × {} CPUs × {} GiB; every invocation runs at once (processor \
         sharing, as OpenWhisk invokers); status pushes every 1 s.\n\
         * Global slowdown = mean of e2e ÷ warm time over completed invocations; impact = \
         slowdown − 1 (the paper's \"global latency impact\").\n\n",
        fns.len(),
        f(warm_s, 2),
        s.workers,
        s.cpus,
        s.memory_mb / 1024,
    );
    let mut files = Vec::new();

    // ---- Fig. 9: bursty weights at a constant offered CPU load ----
    let mut top: Vec<usize> = (0..fns.len()).collect();
    top.sort_by(|a, b| weights[*b].total_cmp(&weights[*a]));
    top.truncate(BURST_POOL);
    let windows = (s.burst_span_s / BURST_S).ceil() as usize;
    let mut mixes = Vec::with_capacity(windows);
    let mut closed_mixes = Vec::with_capacity(windows);
    let mut rates = Vec::with_capacity(windows);
    let mut bursts = Vec::with_capacity(windows);
    for i in 0..windows {
        let pair: Vec<usize> = top.choose_multiple(&mut rng, 2).copied().collect();
        let mut w = weights.clone();
        for i in &pair {
            w[*i] *= BURST_FACTOR;
        }
        // A burst of a long function lowers the rate, as it would a closed loop's.
        rates.push(LOAD_FIG9 * capacity / mean_warm_s(&fns, &w));
        mixes.push(cumulative(&w));
        closed_mixes.push(Mix {
            from_us: (i as f64 * BURST_S * 1e6) as Micros,
            weights: w,
        });
        bursts.push(pair);
    }
    let window = |t: f64| ((t / BURST_S) as usize).min(windows - 1);
    let rate9_max = rates.iter().copied().fold(0.0, f64::max);
    let rate9 = rates.iter().sum::<f64>() / windows as f64;
    let bursty = Workload {
        functions: fns.clone(),
        arrivals: open_loop(
            s.burst_span_s,
            rate9_max,
            |t| rates[window(t)],
            window,
            &mixes,
            &mut rng,
        ),
    };
    // ---- Fig. 10: the rising burst ----
    let peak10 = LOAD_FIG10 * capacity / warm_s;
    let low10 = peak10 / 6.0;
    let peak_at = s.rising_span_s * 25.0 / 30.0;
    let rise = |t: f64| {
        let x = (t / peak_at).min(1.0);
        low10 + (peak10 - low10) * x * x
    };
    let rising = Workload {
        functions: fns.clone(),
        arrivals: open_loop(
            s.rising_span_s,
            peak10,
            rise,
            |_| 0,
            &[cumulative(&weights)],
            &mut rng,
        ),
    };
    let pols = policies(o.seed);
    let mut jobs: Vec<Job> = Vec::new();
    for (name, routing, ka) in &pols {
        jobs.push(Job {
            label: format!("fig9 {name}"),
            workload: &bursty,
            config: cluster(&s, s.workers, routing.clone(), *ka),
        });
    }
    for (name, routing, ka) in &pols {
        jobs.push(Job {
            label: format!("fig10 {name}"),
            workload: &rising,
            config: cluster(&s, s.workers, routing.clone(), *ka),
        });
    }
    let watched = run_watched(o.with_server(&mut jobs), o.jobs)?;
    let (w9, w10) = watched.split_at(pols.len());
    let r9: Vec<RunMetrics> = w9.iter().map(|w| w.metrics.clone()).collect();
    let r10: Vec<RunMetrics> = w10.iter().map(|w| w.metrics.clone()).collect();
    let (r9, r10) = (&r9[..], &r10[..]);
    // Fig. 9's sandbox memory demand: one sandbox of each function a worker ran, under OW+GD.
    let distinct9 = w9[0].distinct_mb();
    let demand_mb = distinct9.iter().sum::<u64>() / distinct9.len().max(1) as u64;
    let largest_mb = fns.iter().map(|f| f.memory_mb).max().unwrap_or(0);
    let scarce = scarce_sizes(demand_mb, largest_mb);
    let ow = |r: &[RunMetrics]| r[0].weighted_slowdown();
    let mut json9 = Vec::new();
    let mut json10 = Vec::new();
    let mut t9 = compare_table();
    let mut t10 = compare_table();
    for ((name, _, _), m) in pols.iter().zip(r9) {
        t9.row(compare_row(name, m, ow(r9), cpus));
        json9.push(compare_json(name, m, cpus));
    }
    for ((name, _, _), m) in pols.iter().zip(r10) {
        t10.row(compare_row(name, m, ow(r10), cpus));
        json10.push(compare_json(name, m, cpus));
    }
    md.push_str(&format!(
        "## Fig. 9: bursty weights ({} s, {} invocations, {}/s on average; every {BURST_S:.0} s two \
         of the top {BURST_POOL} functions get {BURST_FACTOR:.0}× their weight, the rate set so \
         that the offered CPU load stays at {LOAD_FIG9} of the cluster)\n\n{}\n",
        s.burst_span_s,
        bursty.arrivals.len(),
        f(rate9, 1),
        t9.markdown()
    ));
    md.push_str(&format!(
        "## Fig. 10: rising burst ({} s, {} invocations, {}/s rising to {}/s at {:.0} s, then held)\n\n{}\n",
        s.rising_span_s,
        rising.arrivals.len(),
        f(low10, 1),
        f(peak10, 1),
        peak_at,
        t10.markdown()
    ));

    // ---- Fig. 9 again, driven by closed-loop clients as the paper drove it ----
    // N by Little's law: the clients that offer the open loop's rate at OW+GD's open-loop
    // latency plus the mean think time; and the paper's own thread count.
    let think_s = THINK_MAX_US as f64 / 2e6;
    let matched = (rate9 * (mean_e2e_s(&r9[0]) + think_s)).round().max(1.0) as u32;
    let paper = (PAPER_THREADS * capacity / PAPER_CPUS).round().max(1.0) as u32;
    let span_us = (s.burst_span_s * 1e6) as Micros;
    let functions_only = Workload {
        functions: fns.clone(),
        arrivals: Vec::new(),
    };
    let closed = |clients: u32| ClosedLoop {
        clients: vec![(0, clients)],
        think_min_us: 0,
        think_max_us: THINK_MAX_US,
        mixes: closed_mixes.clone(),
        span_us,
        seed: o.seed,
    };
    // Fig. 9's open loop again on workers with scarce memory, in the same batch (first: they
    // are the longest): OW+GD, OW+TTL and CH-RLU only, to keep the run time.
    let scarce_pols: Vec<_> = pols
        .iter()
        .filter(|(name, _, _)| SCARCE_POLICIES.contains(name))
        .cloned()
        .collect();
    let mut jobs: Vec<Job> = Vec::new();
    for mb in &scarce {
        for (name, routing, ka) in &scarce_pols {
            let mut config = cluster(&s, s.workers, routing.clone(), *ka);
            config.memory_mb = *mb;
            jobs.push(Job {
                label: format!("fig9 {mb} MiB {name}"),
                workload: &bursty,
                config,
            });
        }
    }
    let scarce_jobs = jobs.len();
    for n in [matched, paper] {
        for (name, routing, ka) in &pols {
            let mut config = cluster(&s, s.workers, routing.clone(), *ka);
            config.clients = Some(closed(n));
            jobs.push(Job {
                label: format!("fig9 closed {n} {name}"),
                workload: &functions_only,
                config,
            });
        }
    }
    let watched = run_watched(o.with_server(&mut jobs), o.jobs)?;
    let (scarce_runs, closed_runs) = watched.split_at(scarce_jobs);
    let results: Vec<RunMetrics> = closed_runs.iter().map(|w| w.metrics.clone()).collect();
    let (c9, c9_paper) = results.split_at(pols.len());
    let mut json9c = Vec::new();
    for (n, runs, what) in [
        (
            matched,
            c9,
            "N chosen by Little's law to offer the open loop's rate at OW+GD's open-loop latency",
        ),
        (paper, c9_paper, "the paper's thread count"),
    ] {
        let mut t = compare_table();
        let mut rows = Vec::new();
        for ((name, _, _), m) in pols.iter().zip(runs) {
            t.row(compare_row(name, m, ow(runs), cpus));
            rows.push(compare_json(name, m, cpus));
        }
        let invocations: u64 = runs.iter().map(RunMetrics::invocations).sum();
        md.push_str(&format!(
            "## Fig. 9, closed loop: {n} clients ({what}; each picks a function by the weights in \
             force, waits for the answer, thinks 0–{} s and invokes again; the same bursts; {} \
             invocations per run on average)\n\n{}\n",
            THINK_MAX_US / 1_000_000,
            invocations / runs.len().max(1) as u64,
            t.markdown()
        ));
        json9c.push(json!({"clients": n, "think_s": [0.0, THINK_MAX_US as f64 / 1e6], "choice": what, "policies": rows}));
    }
    let (md9m, json9m) = memory_section(
        &pols,
        &scarce_pols,
        &s,
        &MemoryStudy {
            invocations: bursty.arrivals.len(),
            demand_mb,
            distinct: &distinct9,
            burst_pool: &top,
            full: w9,
            scarce: &scarce,
            runs: scarce_runs,
        },
        cpus,
    );
    md.push_str(&md9m);
    let fig = o.out.join("scaling_bursts.png");
    // The paper's short names, so that the bars' labels fit.
    let labels: Vec<String> = ["OW+GD", "OW+TTL", "LL", "CH-BL", "RLU"]
        .iter()
        .map(|l| l.to_string())
        .collect();
    let impact = |r: &[RunMetrics]| -> Vec<f64> {
        r.iter()
            .map(|m| 100.0 * (m.weighted_slowdown() - 1.0))
            .collect()
    };
    plot::bars(
        &fig,
        "Global latency impact under bursts",
        &[
            BarPanel {
                title: "Fig. 9: bursty weights".into(),
                categories: labels.clone(),
                y: Axis::linear("impact (slowdown − 1, %)"),
                series: vec![
                    ("open loop".into(), impact(r9)),
                    (format!("closed, {matched} clients"), impact(c9)),
                    (format!("closed, {paper} clients"), impact(c9_paper)),
                ],
            },
            BarPanel {
                title: "Fig. 9: worker load variance".into(),
                categories: labels.clone(),
                y: Axis::linear("variance of load across workers"),
                series: [
                    ("open loop".to_string(), r9),
                    (format!("closed, {matched} clients"), c9),
                    (format!("closed, {paper} clients"), c9_paper),
                ]
                .into_iter()
                .map(|(l, r)| (l, r.iter().map(RunMetrics::mean_load_variance).collect()))
                .collect(),
            },
            BarPanel {
                title: "Fig. 10: 30-minute rising burst".into(),
                categories: labels,
                y: Axis::linear("impact (slowdown − 1, %)"),
                series: vec![("impact".into(), impact(r10))],
            },
        ],
        (1700, 520),
    )?;
    files.push(fig);

    // ---- Fig. 11: scaling, open loop, then closed loop as the paper ran it ----
    let (md11, json11, fig) = fig11(o, &s, &fns, &weights, warm_s, Source::Open, &mut rng)?;
    md.push_str(&md11);
    files.push(fig);
    let (md11c, json11c, fig) = fig11(o, &s, &fns, &weights, warm_s, Source::Closed, &mut rng)?;
    md.push_str(&md11c);
    files.push(fig);
    md.push_str(&format!(
        "Burst windows of Fig. 9 (function indices): first {:?}.\n",
        bursts.iter().take(3).collect::<Vec<_>>()
    ));
    let json = json!({
        "experiment": "scaling",
        "functions": fns.len(),
        "mean_warm_s": warm_s,
        "fig9": {"invocations": bursty.arrivals.len(), "rate_per_s": rate9, "policies": json9},
        "fig9_closed": json9c,
        "fig9_memory": json9m,
        "fig10": {"invocations": rising.arrivals.len(), "low_per_s": low10, "peak_per_s": peak10, "policies": json10},
        "fig11": json11,
        "fig11_closed": json11c,
    });
    Ok((md, json, files))
}

/// The scarce memories Fig. 9 runs again on, as divisors of the distinct sandbox memory a worker
/// needs: a half. A quarter was tried: the cluster cannot keep up (the wait for memory grows
/// through the run) and every OpenWhisk variant ties, and it would add a fifth to the run time.
const SCARCE_DIVISORS: [u64; 1] = [2];

/// The scarce memories: `demand_mb` over each of [`SCARCE_DIVISORS`], in whole 256 MiB, never
/// under the largest function.
fn scarce_sizes(demand_mb: u64, largest_mb: u64) -> Vec<u64> {
    SCARCE_DIVISORS
        .iter()
        .map(|d| (demand_mb / d / 256 * 256).max(largest_mb))
        .collect()
}

/// Fig. 9's open loop by memory per worker.
struct MemoryStudy<'a> {
    invocations: usize,
    /// OW+GD's mean distinct sandbox memory per worker, and each worker's (MiB).
    demand_mb: u64,
    distinct: &'a [u64],
    /// The functions the bursts are drawn from.
    burst_pool: &'a [usize],
    /// The runs at the Fig. 9 size, one per policy.
    full: &'a [Watched],
    /// The scarce sizes (MiB) and their runs: one per policy for each size, in order.
    scarce: &'a [u64],
    runs: &'a [Watched],
}

/// The table and JSON of the memory study: evictions and cold starts by reason at each size,
/// and how the sizes were chosen.
fn memory_section(
    pols: &[(&'static str, Routing, KeepAliveKind)],
    scarce_pols: &[(&'static str, Routing, KeepAliveKind)],
    s: &Size,
    study: &MemoryStudy<'_>,
    cpus: u64,
) -> (String, serde_json::Value) {
    let MemoryStudy {
        invocations,
        demand_mb,
        distinct,
        burst_pool,
        full,
        scarce,
        runs,
    } = *study;
    let gib = |mb: u64| format!("{} GiB", f(mb as f64 / 1024.0, 2));
    let mut t = Table::new(&[
        "memory per worker",
        "policy",
        "global slowdown",
        "impact",
        "vs openwhisk (GDSF)",
        "cold %",
        "cold: evicted / all busy / expired",
        "evictions",
        "dropped",
        "mean queue (s)",
        "CPU load",
    ]);
    let mut rows = Vec::new();
    let blocks = std::iter::once((s.memory_mb, pols, full)).chain(
        scarce
            .iter()
            .zip(runs.chunks(scarce_pols.len().max(1)))
            .map(|(mb, block)| (*mb, scarce_pols, block)),
    );
    for (mb, names, block) in blocks {
        let ow = block.first().map_or(1.0, |w| w.metrics.weighted_slowdown());
        for ((name, _, _), w) in names.iter().zip(block) {
            let m = &w.metrics;
            let sd = m.weighted_slowdown();
            let queue_s = {
                let (q, n) = m.functions.iter().fold((0u64, 0u64), |(q, n), f| {
                    (q + f.sum_queue_us, n + f.completed)
                });
                q as f64 / n.max(1) as f64 / 1e6
            };
            t.row(vec![
                gib(mb),
                name.to_string(),
                f(sd, 3),
                format!("{} %", f(100.0 * (sd - 1.0), 1)),
                format!("{:+.1} %", 100.0 * (sd / ow - 1.0)),
                f(100.0 * m.cold_ratio(), 2),
                format!(
                    "{} / {} / {}",
                    w.cold.evicted, w.cold.concurrent, w.cold.expired
                ),
                w.evicted.to_string(),
                m.dropped().to_string(),
                f(queue_s, 2),
                f(m.busy_fraction(cpus), 2),
            ]);
            rows.push(json!({
                "memory_mb": mb,
                "policy": name,
                "global_slowdown": sd,
                "cold_ratio": m.cold_ratio(),
                "cold_evicted": w.cold.evicted,
                "cold_concurrent": w.cold.concurrent,
                "cold_expired": w.cold.expired,
                "cold_new": w.cold.new,
                "cold_evicted_burst_pool": burst_pool.iter().map(|i| w.evicted_cold.get(*i).copied().unwrap_or(0)).sum::<u64>(),
                "evictions": w.evicted,
                "dropped": m.dropped(),
                "mean_queue_s": queue_s,
                "peak_memory_mb": w.peak_worker_mb(),
                "cpu_load": m.busy_fraction(cpus),
            }));
        }
    }
    // The emptiest worker's fullest moment, over every policy at the Fig. 9 size.
    let held = full
        .iter()
        .flat_map(|w| w.peak_mb.iter().copied())
        .min()
        .unwrap_or(0);
    let md = format!(
        "## Fig. 9 by memory per worker (open loop, the same {invocations} invocations)\n\n\
         The distinct sandbox memory a worker needs (one sandbox of every function it ran) was \
         {} on average under OW+GD at {} per worker ({} to {} across workers); the scarce runs \
         have {} of it ({}). At {} the emptiest worker under any policy held \
         {} % of its memory at its fullest (busy + idle sandboxes, sampled every second). \
         Cold starts by the pool's reason: after an eviction for memory, every warm sandbox \
         busy, a keep-alive window expired (TTL's 10 min); the rest were first starts.\n\n{}\n",
        gib(demand_mb),
        gib(s.memory_mb),
        gib(distinct.iter().copied().min().unwrap_or(0)),
        gib(distinct.iter().copied().max().unwrap_or(0)),
        SCARCE_DIVISORS
            .iter()
            .map(|d| format!("1/{d}"))
            .collect::<Vec<_>>()
            .join(", "),
        scarce
            .iter()
            .map(|m| gib(*m))
            .collect::<Vec<_>>()
            .join(", "),
        gib(s.memory_mb),
        f(100.0 * held as f64 / s.memory_mb.max(1) as f64, 0),
        t.markdown()
    );
    let json = json!({
        "distinct_mb_per_worker": distinct,
        "demand_mb": demand_mb,
        "emptiest_worker_peak_mb": held,
        "sizes_mb": std::iter::once(s.memory_mb).chain(scarce.iter().copied()).collect::<Vec<_>>(),
        "runs": rows,
    });
    (md, json)
}

fn compare_table() -> Table {
    Table::new(&[
        "policy",
        "global slowdown",
        "impact",
        "vs openwhisk (GDSF)",
        "cold %",
        "dropped",
        "p99 e2e (ms)",
        "load variance",
        "invocations",
        "CPU load",
    ])
}

/// Mean end-to-end time (s) of a run's completed invocations.
fn mean_e2e_s(m: &RunMetrics) -> f64 {
    let (sum, n) = m.functions.iter().fold((0u64, 0u64), |(s, n), f| {
        (s + f.sum_e2e_us, n + f.completed)
    });
    sum as f64 / n.max(1) as f64 / 1e6
}

/// One policy's row; `cpus`: the cluster's, for the CPU load it kept busy.
fn compare_row(name: &str, m: &RunMetrics, ow: f64, cpus: u64) -> Vec<String> {
    let sd = m.weighted_slowdown();
    vec![
        name.to_string(),
        f(sd, 3),
        format!("{} %", f(100.0 * (sd - 1.0), 1)),
        format!("{:+.1} %", 100.0 * (sd / ow - 1.0)),
        f(100.0 * m.cold_ratio(), 2),
        m.dropped().to_string(),
        f(m.e2e_quantile_ms(0.99), 0),
        f(m.mean_load_variance(), 3),
        m.invocations().to_string(),
        f(m.busy_fraction(cpus), 2),
    ]
}

fn compare_json(name: &str, m: &RunMetrics, cpus: u64) -> serde_json::Value {
    json!({
        "policy": name,
        "global_slowdown": m.weighted_slowdown(),
        "cold_ratio": m.cold_ratio(),
        "dropped": m.dropped(),
        "completed": m.completed(),
        "p99_e2e_ms": m.e2e_quantile_ms(0.99),
        "load_variance": m.mean_load_variance(),
        "invocations": m.invocations(),
        "mean_e2e_s": mean_e2e_s(m),
        "cpu_load": m.busy_fraction(cpus),
    })
}

/// A run's metrics with what the scarce-memory study reads beside them: each worker's peak
/// sandbox memory (busy + idle, at its status pushes), the cold starts by reason, and (from the
/// run's totals) the idle sandboxes evicted for memory.
struct Watched {
    metrics: RunMetrics,
    peak_mb: Vec<u64>,
    /// Memory of one sandbox of each function (MiB), and which functions each worker ran.
    size_mb: Vec<u64>,
    served: Vec<Vec<bool>>,
    cold: ColdCounts,
    /// Cold starts after an eviction, per function.
    evicted_cold: Vec<u64>,
    evicted: u64,
}

/// Cold starts by the pool's reason: the first on a worker, after a keep-alive window ended,
/// after an eviction for memory, and because every warm sandbox was busy.
#[derive(Debug, Clone, Copy, Default)]
struct ColdCounts {
    new: u64,
    expired: u64,
    evicted: u64,
    concurrent: u64,
}

impl Watched {
    fn new(w: &Workload, workers: usize) -> Self {
        Watched {
            metrics: RunMetrics::new(w, workers),
            peak_mb: vec![0; workers],
            size_mb: w.functions.iter().map(|f| f.memory_mb).collect(),
            served: vec![vec![false; w.functions.len()]; workers],
            cold: ColdCounts::default(),
            evicted_cold: vec![0; w.functions.len()],
            evicted: 0,
        }
    }

    /// The most sandbox memory any worker held.
    fn peak_worker_mb(&self) -> u64 {
        self.peak_mb.iter().copied().max().unwrap_or(0)
    }

    /// Each worker's distinct sandbox memory: one sandbox of every function it ran (MiB).
    fn distinct_mb(&self) -> Vec<u64> {
        self.served
            .iter()
            .map(|ran| {
                ran.iter()
                    .zip(&self.size_mb)
                    .filter(|(r, _)| **r)
                    .map(|(_, m)| m)
                    .sum()
            })
            .collect()
    }
}

impl Sink for Watched {
    fn record(&mut self, r: &Record) -> Result<()> {
        if let Some(ran) = r
            .worker
            .and_then(|w| self.served.get_mut(w as usize))
            .and_then(|ran| ran.get_mut(r.function as usize))
        {
            *ran = true;
        }
        if let End::Done {
            cold: Some(reason), ..
        }
        | End::TimedOut {
            cold: Some(reason), ..
        } = r.end
        {
            let c = &mut self.cold;
            match reason {
                ColdReason::New => c.new += 1,
                ColdReason::Expired { .. } => c.expired += 1,
                ColdReason::Evicted { .. } => {
                    c.evicted += 1;
                    if let Some(n) = self.evicted_cold.get_mut(r.function as usize) {
                        *n += 1;
                    }
                }
                ColdReason::Concurrent => c.concurrent += 1,
                // GDSF and TTL never pre-warm.
                ColdReason::PrewarmMiss => {}
            }
        }
        self.metrics.record(r)
    }

    fn status(&mut self, now: Micros, worker: u32, load: &WorkerLoad) {
        if let Some(p) = self.peak_mb.get_mut(worker as usize) {
            *p = (*p).max(load.memory_mb.saturating_sub(load.free_mb));
        }
        self.metrics.status(now, worker, load);
    }
}

/// Runs `jobs` as [`super::runner::run_all`] does, also watching memory and cold starts.
fn run_watched(jobs: &[Job<'_>], threads: usize) -> Result<Vec<Watched>> {
    super::runner::in_parallel(jobs, threads, |job| {
        let t0 = std::time::Instant::now();
        let mut w = Watched::new(job.workload, job.config.workers);
        let stats = simulate(job.workload, &job.config, &mut w)?;
        w.evicted = stats.evicted;
        tracing::info!(
            job = %job.label,
            invocations = job.workload.arrivals.len(),
            seconds = format!("{:.2}", t0.elapsed().as_secs_f64()),
            "simulated"
        );
        Ok(w)
    })
}

/// Slowdown over time, by arrival time, on top of the run's totals.
struct Timeline {
    warm_us: Vec<Micros>,
    bucket_us: Micros,
    sum: Vec<f64>,
    done: Vec<u64>,
    dropped: Vec<u64>,
    totals: RunMetrics,
}

impl Timeline {
    fn new(w: &Workload, workers: usize, bucket_s: f64) -> Self {
        Timeline {
            warm_us: w.functions.iter().map(|f| f.warm_us).collect(),
            bucket_us: (bucket_s * 1e6) as Micros,
            sum: Vec::new(),
            done: Vec::new(),
            dropped: Vec::new(),
            totals: RunMetrics::new(w, workers),
        }
    }

    fn slot(&mut self, at: Micros) -> usize {
        let b = (at / self.bucket_us.max(1)) as usize;
        if self.sum.len() <= b {
            self.sum.resize(b + 1, 0.0);
            self.done.resize(b + 1, 0);
            self.dropped.resize(b + 1, 0);
        }
        b
    }

    /// (bucket middle in minutes, mean slowdown) for buckets with completions.
    fn points(&self) -> Vec<(f64, f64)> {
        let w = self.bucket_us as f64 / 60e6;
        self.sum
            .iter()
            .zip(&self.done)
            .enumerate()
            .filter(|(_, (_, n))| **n > 0)
            .map(|(i, (s, n))| ((i as f64 + 0.5) * w, s / *n as f64))
            .collect()
    }
}

impl Sink for Timeline {
    fn record(&mut self, r: &Record) -> Result<()> {
        let b = self.slot(r.scheduled_us);
        match r.end {
            End::Done { .. } => {
                let warm = self.warm_us[r.function as usize].max(1);
                self.sum[b] += r.e2e_us() as f64 / warm as f64;
                self.done[b] += 1;
            }
            End::Dropped(_) | End::TimedOut { .. } => self.dropped[b] += 1,
        }
        self.totals.record(r)
    }

    fn status(&mut self, now: Micros, worker: u32, load: &WorkerLoad) {
        self.totals.status(now, worker, load);
    }

    fn scaled(&mut self, _now: Micros, _d: &ScaleDecision, _workers: &[u32]) {}
}

/// Active workers over time (minutes): steps at each join (decision + start time) and drain.
fn workers_over_time(
    start: usize,
    stats: &SimStats,
    start_us: Micros,
    end_us: Micros,
) -> Vec<(f64, f64)> {
    let mut changes: Vec<(Micros, i64)> = stats
        .scaling
        .iter()
        .map(|e| match e.decision.direction {
            Direction::Out => (e.at_us + start_us, i64::from(e.decision.count)),
            Direction::In => (e.at_us, -i64::from(e.decision.count)),
        })
        .collect();
    changes.sort();
    let min = |t: Micros| t as f64 / 60e6;
    let mut n = start as i64;
    let mut pts = vec![(0.0, n as f64)];
    for (t, d) in changes {
        pts.push((min(t), n as f64));
        n += d;
        pts.push((min(t), n as f64));
    }
    pts.push((min(end_us), n as f64));
    pts
}

type Fig11 = (String, serde_json::Value, std::path::PathBuf);

/// Who offers Fig. 11's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A rate rising linearly (the earlier stand-in for the paper's threads).
    Open,
    /// The paper's threads: one more every 6 s up to its count.
    Closed,
}

/// Fig. 11's client schedule: one more client every `12 min ÷ n` (6 s for the paper's 120)
/// until `n` at minute 12, held to minute 20, then one fewer at a time down to a fifth by
/// minute 24 (each removed client finishes its call first).
fn fig11_clients(n: u32, minute_s: f64) -> Vec<(Micros, u32)> {
    let at = |min: f64| (min * minute_s * 1e6) as Micros;
    let mut steps: Vec<(Micros, u32)> = (1..=n)
        .map(|k| (at(12.0 * f64::from(k - 1) / f64::from(n)), k))
        .collect();
    let low = (n / 5).max(1);
    let fall = n.saturating_sub(low);
    for j in 1..=fall {
        steps.push((at(20.0 + 4.0 * f64::from(j) / f64::from(fall)), n - j));
    }
    steps
}

fn fig11(
    o: &Options,
    s: &Size,
    fns: &[SimFunction],
    weights: &[f64],
    warm_s: f64,
    source: Source,
    rng: &mut ChaCha8Rng,
) -> Result<Fig11> {
    let m = s.minute_s;
    let params = AutoscaleParams {
        min_workers: s.start_workers as u32,
        max_workers: s.max_workers,
        dead_band_ms: s.dead_band_ms,
        scale_in_load: SCALE_IN_FIG11,
        ..AutoscaleParams::default()
    };
    // At the top, the load of three quarters of max_workers at the autoscaler's target.
    let peak_workers = (s.max_workers as f64 * 0.75).round();
    let peak = peak_workers * s.cpus as f64 * params.target_load / warm_s;
    let low = peak / 120.0;
    let rate = |t: f64| {
        let minute = t / m;
        if minute < 12.0 {
            low + (peak - low) * minute / 12.0
        } else if minute < 20.0 {
            peak
        } else if minute < 24.0 {
            peak - (peak - 0.2 * peak) * (minute - 20.0) / 4.0
        } else {
            0.2 * peak
        }
    };
    let span_s = 30.0 * m;
    let threads = (PAPER_THREADS * (s.workers as u32 * s.cpus) as f64 / PAPER_CPUS)
        .round()
        .max(1.0) as u32;
    let (workload, clients) = match source {
        Source::Open => (
            Workload {
                functions: fns.to_vec(),
                arrivals: open_loop(span_s, peak, rate, |_| 0, &[cumulative(weights)], rng),
            },
            None,
        ),
        Source::Closed => (
            Workload {
                functions: fns.to_vec(),
                arrivals: Vec::new(),
            },
            Some(ClosedLoop {
                clients: fig11_clients(threads, m),
                think_min_us: 0,
                think_max_us: THINK_MAX_US,
                mixes: vec![Mix {
                    from_us: 0,
                    weights: weights.to_vec(),
                }],
                span_us: (span_s * 1e6) as Micros,
                seed: o.seed,
            }),
        ),
    };
    let chrlu = Routing::seeded(BalanceKind::ChRlu, o.seed);
    let autoscaled = |max_step: u32| SimAutoscale {
        params: AutoscaleParams {
            max_step,
            ..params.clone()
        },
        interval_us: s.interval_us,
        start_us: s.start_us,
    };
    let runs: Vec<(String, usize, Option<SimAutoscale>)> = vec![
        (
            "autoscaled, one worker per step".into(),
            s.start_workers,
            Some(autoscaled(1)),
        ),
        (
            "autoscaled, PID step (≤ 4)".into(),
            s.start_workers,
            Some(autoscaled(4)),
        ),
        (
            format!("fixed {} workers", s.start_workers),
            s.start_workers,
            None,
        ),
        (
            format!("fixed {} workers", s.max_workers),
            s.max_workers as usize,
            None,
        ),
    ];
    let (bucket_s, max) = (s.bucket_s, s.max_workers as usize);
    let outcomes = super::runner::side_by_side(&runs, |(_, start, auto)| {
        let mut config = cluster(s, *start, chrlu.clone(), KeepAliveKind::Gdsf);
        config.autoscale = auto.clone();
        config.clients = clients.clone();
        o.apply_server(&mut config);
        let mut t = Timeline::new(&workload, max, bucket_s);
        let stats = simulate(&workload, &config, &mut t)?;
        Ok((t, stats))
    })?;
    let mut table = Table::new(&[
        "cluster (ch-rlu)",
        "global slowdown",
        "dropped",
        "p99 e2e (ms)",
        "scale-outs",
        "scale-ins",
        "peak workers",
        "worker-minutes",
        "invocations",
    ]);
    let mut lat_series = Vec::new();
    let mut worker_series = Vec::new();
    let mut json_runs = Vec::new();
    let mut joins_text = String::new();
    for ((label, start, auto), (t, stats)) in runs.iter().zip(&outcomes) {
        let steps = workers_over_time(*start, stats, s.start_us, stats.end_us);
        let worker_min: f64 = steps
            .windows(2)
            .map(|w| (w[1].0 - w[0].0) * w[0].1)
            .sum::<f64>()
            * (60.0 / m);
        let outs = stats
            .scaling
            .iter()
            .filter(|e| e.decision.direction == Direction::Out)
            .count();
        let ins = stats.scaling.len() - outs;
        table.row(vec![
            label.clone(),
            f(t.totals.weighted_slowdown(), 3),
            t.totals.dropped().to_string(),
            f(t.totals.e2e_quantile_ms(0.99), 0),
            outs.to_string(),
            ins.to_string(),
            stats.peak_workers.to_string(),
            f(worker_min, 0),
            t.totals.invocations().to_string(),
        ]);
        if auto.is_some() && joins_text.is_empty() {
            let instants: Vec<String> = stats
                .scaling
                .iter()
                .map(|e| {
                    let (at, sign) = match e.decision.direction {
                        Direction::Out => (e.at_us + s.start_us, "+"),
                        Direction::In => (e.at_us, "−"),
                    };
                    format!(
                        "{sign}{} at {:.1} min",
                        e.decision.count,
                        at as f64 / 60e6 * 60.0 / m
                    )
                })
                .collect();
            joins_text = format!(
                "Workers of \"{label}\" joined / drained (in paper minutes): {}.\n\n",
                instants.join(", ")
            );
        }
        let to_paper = |pts: Vec<(f64, f64)>| -> Vec<(f64, f64)> {
            pts.into_iter().map(|(x, y)| (x * 60.0 / m, y)).collect()
        };
        lat_series.push(Series {
            label: label.clone(),
            points: to_paper(t.points()),
        });
        worker_series.push(Series {
            label: label.clone(),
            points: to_paper(steps),
        });
        json_runs.push(json!({
            "cluster": label,
            "global_slowdown": t.totals.weighted_slowdown(),
            "dropped": t.totals.dropped(),
            "p99_e2e_ms": t.totals.e2e_quantile_ms(0.99),
            "peak_workers": stats.peak_workers,
            "worker_minutes": worker_min,
            "invocations": t.totals.invocations(),
            "scaling": stats.scaling.iter().map(|e| json!({
                "at_s": e.at_us as f64 / 1e6,
                "direction": e.decision.direction.as_str(),
                "count": e.decision.count,
                "workers": e.decision.workers,
                "mean_load": e.decision.mean_load,
                "overloaded": e.decision.overloaded,
                "reason": e.decision.reason(),
            })).collect::<Vec<_>>(),
            "slowdown_over_time": t.points(),
        }));
    }
    let load = match source {
        Source::Open => format!(
            "open loop, {} invocations; rate rising for 12 min to {}/s, held to min 20, falling \
             to a fifth by min 24",
            workload.arrivals.len(),
            f(peak, 1)
        ),
        Source::Closed => format!(
            "closed loop: one more client every {} s up to {threads} at min 12 (the paper's \
             threads, thinking 0–{} s), held to min 20, one fewer at a time down to {} by min 24",
            f(12.0 * 60.0 / f64::from(threads), 1),
            THINK_MAX_US / 1_000_000,
            (threads / 5).max(1)
        ),
    };
    let md = format!(
        "## Fig. 11{}: horizontal scaling ({load}; autoscaler: min {}, max {}, target load {}, \
         scale-out load {} on ≥ {} % of workers, scale-in load {} on all, dead band {} s, workers up {} s after the \
         decision{})\n\n{}\n{joins_text}",
        if source == Source::Closed { ", closed loop" } else { "" },
        params.min_workers,
        params.max_workers,
        params.target_load,
        params.scale_out_load,
        params.overloaded_share * 100.0,
        params.scale_in_load,
        params.dead_band_ms / 1000,
        s.start_us / 1_000_000,
        if o.quick {
            format!("; quick: one paper minute is {m} s")
        } else {
            String::new()
        },
        table.markdown()
    );
    let (fig, title) = match source {
        Source::Open => (
            o.out.join("scaling_autoscale.png"),
            "Fig. 11: CH-RLU with the autoscaler as the load rises (open loop; x: minutes)",
        ),
        Source::Closed => (
            o.out.join("scaling_autoscale_closed.png"),
            "Fig. 11: CH-RLU with the autoscaler, one more client every 6 s (closed loop; x: minutes)",
        ),
    };
    plot::lines(
        &fig,
        title,
        &[
            LinePanel {
                title: "mean normalized latency by arrival time".into(),
                x: Axis::linear("minute"),
                y: Axis::log("slowdown (e2e ÷ warm, log)"),
                series: lat_series,
                markers: false,
                legend: SeriesLabelPosition::UpperLeft,
            },
            LinePanel {
                title: "active workers".into(),
                x: Axis::linear("minute"),
                y: Axis::linear("workers"),
                series: worker_series,
                markers: false,
                legend: SeriesLabelPosition::UpperLeft,
            },
        ],
        (1500, 560),
    )?;
    Ok((
        md,
        match source {
            Source::Open => {
                json!({"invocations": workload.arrivals.len(), "peak_per_s": peak, "runs": json_runs})
            }
            Source::Closed => json!({"clients": threads, "runs": json_runs}),
        },
        fig,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scarce_sizes_are_a_half_of_the_demand_in_whole_256_mib_never_under_the_largest_function() {
        assert_eq!(scarce_sizes(23_232, 1024), vec![11_520]);
        assert_eq!(scarce_sizes(10_000, 1024), vec![4_864]);
        assert_eq!(scarce_sizes(1_500, 1024), vec![1024]);
    }

    /// One worker with room for one sandbox; a, b, a: b's sandbox takes a's memory, and the
    /// second a finds its sandbox evicted.
    #[test]
    fn watched_counts_evictions_the_cold_starts_they_cause_and_each_workers_memory() {
        for ka in [KeepAliveKind::Gdsf, KeepAliveKind::Ttl] {
            let w = Workload {
                functions: vec![
                    SimFunction::new("a", 100_000, 200_000, 768),
                    SimFunction::new("b", 100_000, 200_000, 768),
                ],
                arrivals: [(0, 0), (secs(2), 1), (secs(4), 0)]
                    .into_iter()
                    .map(|(at_us, function)| Arrival { at_us, function })
                    .collect(),
            };
            let mut config = cluster(
                &size(true),
                1,
                Routing::seeded(BalanceKind::LeastLoaded, 1),
                ka,
            );
            config.memory_mb = 1024;
            config.free_buffer_mb = 0;
            let jobs = [Job {
                label: "a b a".into(),
                workload: &w,
                config,
            }];
            let runs = run_watched(&jobs, 1).unwrap();
            let r = &runs[0];
            assert_eq!(r.evicted, 2, "{ka}");
            let c = r.cold;
            assert_eq!(
                (c.new, c.evicted, c.concurrent, c.expired),
                (2, 1, 0, 0),
                "{ka}"
            );
            assert_eq!(r.metrics.cold(), 3, "{ka}");
            assert_eq!(r.distinct_mb(), vec![1536], "{ka}");
            assert_eq!(r.peak_mb, vec![768], "{ka}");
            assert_eq!(r.peak_worker_mb(), 768, "{ka}");
        }
    }

    #[test]
    fn fig11_adds_the_papers_threads_one_every_6_s_then_removes_four_fifths() {
        let steps = fig11_clients(120, 60.0);
        assert_eq!(steps[0], (0, 1));
        assert_eq!(steps[1], (secs(6), 2));
        assert_eq!(steps[119], (secs(714), 120));
        assert!(steps.windows(2).all(|w| w[0].0 < w[1].0));
        let last = *steps.last().unwrap();
        assert_eq!(last, (secs(24 * 60), 24));
        assert_eq!(steps.len(), 120 + 96);
    }
}
