//! `queue`: the queue disciplines and the concurrency limit on one worker, with a stationary
//! and a bursty workload (thesis ch. 5.5: Figs. 5.7, 5.8, 5.9), at several offered CPU loads.
//!
//! As in the thesis: 21 random Azure functions paired with the FunctionBench-like function of
//! the closest warm time, 16 CPUs, sandboxes prewarmed by Little's law; the bursty workload adds
//! one minute of its smallest function at 45 % of the mean rate (the thesis's 18/s on 40/s).
//! The thesis's 30 minutes at 40/s cannot be cut from this sample (21 random functions invoke
//! a few hundred times in 30 minutes), so the whole day is taken and its time compressed to
//! each offered load. The compressed day keeps the trace's diurnal swing and its minute-scale
//! bursts, so a mean load hides peaks far above it: every load is reported with the peaks of
//! its 10 s windows and the busy fraction the run measured. Deadlines for SRSF (and the missed
//! share of every discipline) follow Atoll's trace workload: 15–25 % slack over the warm time.

use super::metrics::{OfferedLoad, RunMetrics};
use super::plot::{self, Axis, BarPanel, LinePanel, Series};
use super::runner::{run_all, Job};
use super::{azure, describe, f, AzureSample, Options, Output, Table, AZURE_1350};
use crate::config::{Routing, SimConfig};
use crate::error::Result;
use crate::workload::{Arrival, SimFunction, Workload};
use hearth_core::balance::BalanceKind;
use hearth_core::time::secs;
use hearth_core::{Micros, QueueDiscipline, RegulatorConfig};
use hearth_loadgen::make::{mapping::Mapping, select::Selection, Made, Scaling};
use plotters::prelude::SeriesLabelPosition;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

const CPUS: u32 = 16;
/// The offered CPU loads (mean over the compressed day, share of the 16 CPUs) the disciplines
/// are compared at: moderate to high, the range the thesis and Atoll (70–110 %) evaluate, in
/// steps fine enough to see where the compressed day's peaks begin to overload the worker.
const LOADS: [f64; 5] = [0.5, 0.6, 0.7, 0.8, 0.9];
const QUICK_LOADS: [f64; 2] = [0.5, 0.8];
/// The one point this experiment ran at until issue 17: Little's-law concurrency 14 (87.5 %
/// offered), where the compressed day's peaks overload the worker for long stretches. Kept as a
/// labelled extra, and the workload of the CPU sweep (Fig. 5.8), whose knee it was chosen at.
const THESIS_POINT: f64 = 14.0 / CPUS as f64;
/// Width of the windows an offered load's peaks are measured over.
const WINDOW_US: Micros = secs(10);
/// The headline (EEDF against FCFS) is stated at the highest load where the best discipline
/// meets at least this share of deadlines.
const SERVED: f64 = 0.9;
/// The burst's rate relative to the workload's mean rate (the thesis: 18/s on 40/s).
const BURST_SHARE: f64 = 18.0 / 40.0;
const BURST_S: u64 = 60;

fn worker(cpus: u32, queue: QueueDiscipline, limit: u32) -> SimConfig {
    SimConfig {
        workers: 1,
        cpus,
        memory_mb: 64 * 1024,
        queue,
        regulator: RegulatorConfig::Fixed(limit),
        routing: Routing::seeded(BalanceKind::RoundRobin, 0),
        ..SimConfig::default()
    }
}

/// Adds `BURST_S` seconds of function `f` at `rate`/s, evenly spaced, from a third of the span.
fn with_burst(w: &Workload, f: u32, rate: f64, span_s: f64) -> Workload {
    let mut out = w.clone();
    let start = secs((span_s / 3.0) as u64);
    let n = (rate * BURST_S as f64).round().max(1.0) as u64;
    out.arrivals.extend((0..n).map(|i| Arrival {
        at_us: start + i * secs(BURST_S) / n,
        function: f,
    }));
    out.arrivals.sort_by_key(|a| a.at_us);
    out
}

/// A table header: the first column, the shared ones, maybe one more.
fn columns(first: &str, shared: &[&str], last: Option<String>) -> Vec<String> {
    std::iter::once(first.to_string())
        .chain(shared.iter().map(|s| s.to_string()))
        .chain(last)
        .collect()
}

fn limit_name(limit: u32) -> String {
    if limit == u32::MAX {
        "none (no queue)".into()
    } else {
        limit.to_string()
    }
}

/// One offered load: its two workloads and what they offer the worker.
struct Point {
    /// Mean offered load (share of the CPUs) the day was compressed to.
    load: f64,
    /// The point the experiment ran at alone before issue 17.
    thesis: bool,
    made: Made,
    stationary: Workload,
    bursty: Workload,
    burst_rate: f64,
    /// What the stationary and the bursty workload offer.
    offered: [OfferedLoad; 2],
}

impl Point {
    fn label(&self) -> String {
        let pct = 100.0 * self.offered[0].mean;
        if self.thesis {
            format!("{pct:.1} % (pre-issue-17 point, overloaded)")
        } else {
            format!("{pct:.0} %")
        }
    }

    fn workloads(&self) -> [(&'static str, &Workload); 2] {
        [("stationary", &self.stationary), ("bursty", &self.bursty)]
    }
}

/// The function that bursts: the smallest (the thesis's bursty function is its small "web"
/// one), ties by index.
fn smallest(w: &Workload) -> Result<(u32, SimFunction)> {
    w.functions
        .iter()
        .enumerate()
        .min_by_key(|(i, func)| (func.warm_us, *i))
        .map(|(i, func)| (i as u32, func.clone()))
        .ok_or_else(|| crate::SimError::Config("the sample has no function".into()))
}

/// The workloads at a mean offered load of `load` × the CPUs (the same functions, slacks and
/// burst at every load: only time is compressed more or less).
fn point(o: &Options, load: f64, thesis: bool) -> Result<Point> {
    let sample = AzureSample {
        file: AZURE_1350,
        selection: Selection::Random(21),
        minutes: 1440,
        mapping: Mapping::FunctionBench,
        scaling: Scaling::Concurrency(load * f64::from(CPUS)),
    };
    let (mut stationary, made) = azure(o, &sample)?;
    stationary.prewarm_by_littles_law(&made.trace, &made.metadata);
    let mut rng = ChaCha8Rng::seed_from_u64(o.seed);
    for func in &mut stationary.functions {
        let slack = rng.gen_range(0.15..0.25);
        func.deadline_us = Some((func.warm_us as f64 * (1.0 + slack)).round() as u64);
    }
    let (small, _) = smallest(&stationary)?;
    let burst_rate = BURST_SHARE * stationary.arrivals.len() as f64 / made.span_s.max(1e-9);
    let bursty = with_burst(&stationary, small, burst_rate, made.span_s);
    let span_us = (made.span_s * 1e6).round() as Micros;
    let offered = [
        OfferedLoad::of(&stationary, u64::from(CPUS), span_us, WINDOW_US),
        OfferedLoad::of(&bursty, u64::from(CPUS), span_us, WINDOW_US),
    ];
    Ok(Point {
        load,
        thesis,
        made,
        stationary,
        bursty,
        burst_rate,
        offered,
    })
}

/// The paper's "% deadlines missed": late completions, drops and timeouts over invocations.
fn missed(m: &RunMetrics) -> f64 {
    let (missed, n) = m.deadlines_missed_of(|_| true);
    missed as f64 / n.max(1) as f64
}

/// A run's numbers for the tables: normalized latency, queue, execution, cold, dropped, missed.
fn cells(m: &RunMetrics) -> Vec<String> {
    vec![
        f(m.weighted_slowdown(), 2),
        f(m.mean_queue_ms(), 1),
        f(m.mean_exec_ms(), 1),
        m.cold().to_string(),
        m.dropped().to_string(),
        f(100.0 * missed(m), 1),
    ]
}

const CELLS: [&str; 6] = [
    "weighted normalized latency",
    "mean queue ms",
    "mean exec ms",
    "cold",
    "dropped",
    "missed deadlines %",
];

fn run_json(label: &str, point: &Point, m: &RunMetrics) -> Value {
    json!({
        "run": label, "offered_load": point.offered[0].mean, "thesis_point": point.thesis,
        "weighted_normalized_latency": m.weighted_slowdown(),
        "mean_queue_ms": m.mean_queue_ms(), "mean_exec_ms": m.mean_exec_ms(),
        "cold": m.cold(), "dropped": m.dropped(),
        "missed_deadlines": missed(m), "busy": m.busy_fraction(u64::from(CPUS)),
    })
}

pub(super) fn run(o: &Options) -> Result<Output> {
    let loads: &[f64] = if o.quick { &QUICK_LOADS } else { &LOADS };
    let mut points = loads
        .iter()
        .map(|l| point(o, *l, false))
        .collect::<Result<Vec<_>>>()?;
    points.push(point(o, THESIS_POINT, true)?);
    let thesis = points.len() - 1;
    let (small, small_fn) = smallest(&points[0].stationary)?;
    let limits: Vec<u32> = if o.quick {
        vec![16, u32::MAX]
    } else {
        vec![16, 20, 24, 32, u32::MAX]
    };
    let cpus: Vec<u32> = if o.quick {
        vec![12, 16, 24]
    } else {
        vec![10, 12, 14, 16, 18, 24, 32, 48]
    };
    let disciplines = QueueDiscipline::ALL;
    let per_workload = limits.len() + disciplines.len();
    let mut jobs = Vec::new();
    for p in &points {
        for (name, w) in p.workloads() {
            for limit in &limits {
                jobs.push(Job {
                    label: format!("{name} at {} eedf limit {}", p.label(), limit_name(*limit)),
                    workload: w,
                    config: worker(CPUS, QueueDiscipline::Eedf, *limit),
                });
            }
            for q in disciplines {
                jobs.push(Job {
                    label: format!("{name} at {} {} limit {CPUS}", p.label(), q.name()),
                    workload: w,
                    config: worker(CPUS, q, CPUS),
                });
            }
        }
    }
    let first_cpu = jobs.len();
    for c in &cpus {
        jobs.push(Job {
            label: format!(
                "stationary at {}, no queue, {c} CPUs",
                points[thesis].label()
            ),
            workload: &points[thesis].stationary,
            config: worker(*c, QueueDiscipline::Eedf, u32::MAX),
        });
    }
    let results = run_all(o.with_server(&mut jobs), o.jobs)?;
    let index = |p: usize, wi: usize, k: usize| (p * 2 + wi) * per_workload + k;
    let at_limit = |p: usize, wi: usize, li: usize| &results[index(p, wi, li)];
    let with = |p: usize, wi: usize, q: QueueDiscipline| {
        let qi = disciplines.iter().position(|d| *d == q).unwrap_or(0);
        &results[index(p, wi, limits.len() + qi)]
    };

    let p0 = &points[0];
    let mut md = format!(
        "# queue: queue disciplines and the concurrency limit (thesis Figs. 5.7–5.9)\n\n\
         * stationary: 21 random Azure functions, the whole day compressed to each offered load; at {}: {}\n\
         * bursty: the same plus {:.0} % of its mean rate of `{}` (warm {:.1} ms) for {BURST_S} s from a third of the span\n\
         * one worker, {CPUS} CPUs, 64 GiB; sandboxes prewarmed by Little's law; TTL keep-alive\n\
         * offered CPU load = Σ warm time of the arrivals ÷ ({CPUS} CPUs × span), its mean and its {} s windows; \
         busy = warm time of completed invocations ÷ ({CPUS} CPUs × first arrival to last end)\n\
         * normalized latency = e2e ÷ warm time; weighted = mean over completed invocations; \
         deadlines = warm time + 15–25 % slack, missed % counts drops\n\n",
        p0.label(),
        describe("stationary", &p0.made, &p0.stationary),
        100.0 * BURST_SHARE,
        small_fn.name,
        small_fn.warm_us as f64 / 1000.0,
        WINDOW_US / 1_000_000,
    );
    // The loads.
    let mut loads_table = Table::new(&[
        "offered load (mean)",
        "invocations",
        "span s",
        "p95 of 10 s windows %",
        "max %",
        "windows over 100 %",
        "bursty: mean %",
        "busy % (EEDF, limit 16)",
    ]);
    let mut json_loads = Vec::new();
    for (pi, p) in points.iter().enumerate() {
        let s = &p.offered[0];
        let busy = with(pi, 0, QueueDiscipline::Eedf).busy_fraction(u64::from(CPUS));
        loads_table.row(vec![
            p.label(),
            p.stationary.arrivals.len().to_string(),
            f(p.made.span_s, 0),
            f(100.0 * s.p95, 0),
            f(100.0 * s.max, 0),
            f(100.0 * s.over, 1),
            f(100.0 * p.offered[1].mean, 0),
            f(100.0 * busy, 1),
        ]);
        json_loads.push(json!({
            "label": p.label(), "target": p.load, "thesis_point": p.thesis,
            "stationary": s, "bursty": p.offered[1], "burst_rate": p.burst_rate,
            "busy_eedf_limit_16": busy,
        }));
    }
    md.push_str(&format!(
        "## Offered loads\n\n{}\nAt {}, {}.\n\n",
        loads_table.markdown(),
        p0.label(),
        p0.offered[0].describe()
    ));

    // The headline: EEDF against FCFS where the best discipline still meets most deadlines.
    let mut headline_table = Table::new(&[
        "offered load",
        "best discipline (missed %)",
        "FCFS: latency / missed %",
        "EEDF: latency / missed %",
        "FCFS ÷ EEDF latency",
        "bursty: FCFS ÷ EEDF",
    ]);
    // The disciplines that miss the fewest deadlines (ties named together), and that share.
    let best = |pi: usize| {
        let low = disciplines
            .iter()
            .map(|q| missed(with(pi, 0, *q)))
            .fold(1.0, f64::min);
        let names: Vec<&str> = disciplines
            .iter()
            .filter(|q| missed(with(pi, 0, **q)) <= low)
            .map(|q| q.name())
            .collect();
        let names = if names.len() == disciplines.len() {
            "all alike".to_string()
        } else {
            names.join(", ")
        };
        (names, low)
    };
    let ratio = |pi: usize, wi: usize| {
        with(pi, wi, QueueDiscipline::Fcfs).weighted_slowdown()
            / with(pi, wi, QueueDiscipline::Eedf)
                .weighted_slowdown()
                .max(1e-9)
    };
    for (pi, p) in points.iter().enumerate() {
        let (bq, bm) = best(pi);
        let fcfs = with(pi, 0, QueueDiscipline::Fcfs);
        let eedf = with(pi, 0, QueueDiscipline::Eedf);
        headline_table.row(vec![
            p.label(),
            format!("{bq} ({})", f(100.0 * bm, 1)),
            format!(
                "{} / {}",
                f(fcfs.weighted_slowdown(), 2),
                f(100.0 * missed(fcfs), 1)
            ),
            format!(
                "{} / {}",
                f(eedf.weighted_slowdown(), 2),
                f(100.0 * missed(eedf), 1)
            ),
            f(ratio(pi, 0), 2),
            f(ratio(pi, 1), 2),
        ]);
    }
    // The highest load (of the regular ones) where the best discipline meets `SERVED`; the
    // lowest when none does.
    let headline = (0..thesis)
        .filter(|pi| 1.0 - best(*pi).1 >= SERVED)
        .max_by(|a, b| points[*a].load.total_cmp(&points[*b].load))
        .unwrap_or(0);
    let served_any = 1.0 - best(headline).1 >= SERVED;
    let (hq, hm) = best(headline);
    md.push_str(&format!(
        "## Headline: EEDF against FCFS (stationary, limit {CPUS})\n\n{}\n{}: the best ({}) meets {} % of deadlines; \
         there FCFS's weighted normalized latency is {}× EEDF's (bursty: {}×).\n\n",
        headline_table.markdown(),
        if served_any {
            format!(
                "The highest load where the best discipline meets at least {:.0} % of deadlines is {}",
                100.0 * SERVED,
                points[headline].label()
            )
        } else {
            format!(
                "No load lets the best discipline meet {:.0} % of deadlines; the lowest is {}",
                100.0 * SERVED,
                points[headline].label()
            )
        },
        hq,
        f(100.0 * (1.0 - hm), 1),
        f(ratio(headline, 0), 2),
        f(ratio(headline, 1), 2),
    ));

    let mut json_runs = Vec::new();
    let mut policy_panels = Vec::new();
    let mut over_panels = Vec::new();
    for (wi, name) in ["stationary", "bursty"].iter().enumerate() {
        let mut d = Table::with_header(columns(
            "offered load",
            &std::iter::once("discipline (limit 16)")
                .chain(CELLS)
                .collect::<Vec<_>>(),
            Some(format!("`{}` normalized latency", small_fn.name)),
        ));
        let mut l = Table::with_header(columns(
            "offered load",
            &std::iter::once("concurrency limit (EEDF)")
                .chain(CELLS)
                .collect::<Vec<_>>(),
            None,
        ));
        let mut over_series = Vec::new();
        for (pi, p) in points.iter().enumerate() {
            for q in disciplines {
                let m = with(pi, wi, q);
                let mut row = vec![p.label(), q.name().to_string()];
                row.extend(cells(m));
                row.push(f(
                    m.functions[small as usize]
                        .mean_stretch()
                        .unwrap_or(f64::NAN),
                    1,
                ));
                d.row(row);
            }
            for (li, limit) in limits.iter().enumerate() {
                let mut row = vec![p.label(), limit_name(*limit)];
                row.extend(cells(at_limit(pi, wi, li)));
                l.row(row);
            }
            over_series.push((
                p.label(),
                (0..limits.len())
                    .map(|li| at_limit(pi, wi, li).weighted_slowdown())
                    .collect(),
            ));
            for k in 0..per_workload {
                let i = index(pi, wi, k);
                json_runs.push(run_json(&jobs[i].label, p, &results[i]));
            }
        }
        md.push_str(&format!(
            "## {name}: disciplines by load (Figs. {})\n\n{}\n## {name}: concurrency limit by load (Fig. {})\n\n{}\n",
            if wi == 0 { "5.7b–c" } else { "5.9b–c" },
            d.markdown(),
            if wi == 0 { "5.7a" } else { "5.9a" },
            l.markdown(),
        ));
        over_panels.push(BarPanel {
            title: format!("{name}: weighted normalized latency (EEDF)"),
            categories: limits
                .iter()
                .map(|l| {
                    if *l == u32::MAX {
                        "none".into()
                    } else {
                        l.to_string()
                    }
                })
                .collect(),
            y: Axis::log("normalized latency (log)"),
            series: over_series,
        });
        // Per function size at the headline load.
        let w = points[headline].workloads()[wi].1;
        let mut sizes: Vec<u64> = w.functions.iter().map(|func| func.warm_us).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let series = disciplines
            .iter()
            .map(|q| {
                let m = with(headline, wi, *q);
                Series {
                    label: format!("{} (weighted {})", q.name(), f(m.weighted_slowdown(), 2)),
                    points: by_size(w, m, &sizes),
                }
            })
            .collect();
        policy_panels.push(LinePanel {
            title: format!("{name} at {}: by function size", points[headline].label()),
            x: Axis::log("the function's warm time (ms, log)"),
            y: Axis::log("mean normalized latency of its invocations (log)"),
            series,
            markers: true,
            legend: SeriesLabelPosition::UpperLeft,
        });
    }

    // Fig. 5.8 on the pre-issue-17 point.
    let mut cpu_table = Table::new(&["CPUs (no queue)", "weighted normalized latency", "cold"]);
    let mut cpu_pts = Vec::new();
    for (i, c) in cpus.iter().enumerate() {
        let m = &results[first_cpu + i];
        cpu_table.row(vec![
            c.to_string(),
            f(m.weighted_slowdown(), 2),
            m.cold().to_string(),
        ]);
        cpu_pts.push((f64::from(*c), m.weighted_slowdown()));
        json_runs.push(json!({"run": jobs[first_cpu + i].label, "cpus": c,
            "weighted_normalized_latency": m.weighted_slowdown(), "cold": m.cold()}));
    }
    md.push_str(&format!(
        "## stationary at {}: CPUs without a queue (Fig. 5.8)\n\n{}\n",
        points[thesis].label(),
        cpu_table.markdown()
    ));

    let mut files = Vec::new();
    let fig = o.out.join("queue_load.png");
    plot::lines(
        &fig,
        &format!("Queue disciplines vs offered CPU load (stationary, limit {CPUS})"),
        &load_panels(&points, &disciplines, |pi, q| with(pi, 0, q)),
        (1400, 520),
    )?;
    files.push(fig);
    let fig = o.out.join("queue_overcommit.png");
    plot::bars(
        &fig,
        &format!("Concurrency limit on {CPUS} CPUs (EEDF) by offered load; none = pure processor sharing"),
        &over_panels,
        (1400, 520),
    )?;
    files.push(fig);
    let fig = o.out.join("queue_disciplines.png");
    plot::lines(
        &fig,
        &format!("Normalized latency per function by queue discipline (limit {CPUS})"),
        &policy_panels,
        (1500, 560),
    )?;
    files.push(fig);
    let fig = o.out.join("queue_cpus.png");
    plot::lines(
        &fig,
        &format!(
            "Stationary workload at {} without a queue: normalized latency vs CPUs",
            points[thesis].label()
        ),
        &[LinePanel {
            title: "pure processor sharing".into(),
            x: Axis::linear("CPUs"),
            y: Axis::log("weighted normalized latency (log)"),
            series: vec![Series {
                label: "stationary".into(),
                points: cpu_pts,
            }],
            markers: true,
            legend: SeriesLabelPosition::UpperRight,
        }],
        (900, 480),
    )?;
    files.push(fig);
    let json = json!({
        "experiment": "queue",
        "loads": json_loads,
        "headline": {
            "load": points[headline].offered[0].mean, "label": points[headline].label(),
            "best": hq, "best_met": 1.0 - hm, "served": served_any,
            "fcfs_over_eedf": ratio(headline, 0), "bursty_fcfs_over_eedf": ratio(headline, 1),
        },
        "runs": json_runs,
    });
    Ok((md, json, files))
}

/// Mean normalized latency of each function size (functions of the same warm time, the same
/// FunctionBench stand-in, make one point).
fn by_size(w: &Workload, m: &RunMetrics, sizes: &[u64]) -> Vec<(f64, f64)> {
    sizes
        .iter()
        .filter_map(|size| {
            let (sum, n) = w
                .functions
                .iter()
                .zip(&m.functions)
                .filter(|(func, _)| func.warm_us == *size)
                .fold((0.0, 0), |(s, n), (_, fm)| {
                    (s + fm.sum_stretch, n + fm.completed)
                });
            (n > 0).then(|| (*size as f64 / 1000.0, sum / n as f64))
        })
        .collect()
}

/// Normalized latency and missed deadlines against the offered load, a line per discipline.
fn load_panels<'m>(
    points: &[Point],
    disciplines: &[QueueDiscipline],
    with: impl Fn(usize, QueueDiscipline) -> &'m RunMetrics,
) -> [LinePanel; 2] {
    let line = |value: &dyn Fn(&RunMetrics) -> f64| -> Vec<Series> {
        disciplines
            .iter()
            .map(|q| {
                let mut pts: Vec<(f64, f64)> = (0..points.len())
                    .map(|pi| (100.0 * points[pi].offered[0].mean, value(with(pi, *q))))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series {
                    label: q.name().to_string(),
                    points: pts,
                }
            })
            .collect()
    };
    [
        LinePanel {
            title: "weighted normalized latency".into(),
            x: Axis::linear("offered CPU load, mean over the day (%)"),
            y: Axis::log("normalized latency (log)"),
            series: line(&|m| m.weighted_slowdown()),
            markers: true,
            legend: SeriesLabelPosition::UpperLeft,
        },
        LinePanel {
            title: "deadlines missed (15–25 % slack)".into(),
            x: Axis::linear("offered CPU load, mean over the day (%)"),
            y: Axis::linear("% of invocations"),
            series: line(&|m| 100.0 * missed(m)),
            markers: true,
            legend: SeriesLabelPosition::UpperLeft,
        },
    ]
}
