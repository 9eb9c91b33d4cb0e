//! `alps`: CPU scheduling of invocations on one worker (ALPS, USENIX ATC '24, §7): CFS, SFS,
//! ALPS and the SRPT oracle on the time-sliced CPU model, with processor sharing for
//! reference (Figs. 5–6 by duration group and load, Fig. 7 context switches, Fig. 9 the
//! ablation of the fine-tunings, §7.5 the sensitivity to W, α, β, γ and the learning method).
//!
//! Workloads as §7.1 and Table 1 make them: 50 function deployments spread over the four
//! duration groups, each invocation's CPU work its deployment's mean ± up to 25 %, Poisson
//! arrivals scaled to 70, 80 and 90 % average CPU utilization of 16 CPUs, every invocation on
//! the CPUs at once (the kernel scheduler decides, nothing queues in front of it).
//!
//! * Azure-like: Table 1's Azure shares (the paper's sample of the 2019 trace); within each
//!   group, each deployment's mean is the mean duration of a function drawn by invocation count
//!   from day 1 of the Azure 2019 sample of 1,350 functions, kept within the group (the ≥400 ms
//!   group capped at 1.28 s: the paper's benchmark functions run for at most about a second).
//!   That sample's own shares (reported) lean far more to long functions than Table 1's.
//! * Huawei-like: the Huawei trace is not available here, so the mix is synthetic: Table 1's
//!   Huawei shares, deployment means log-uniform within each group.

use super::plot::{self, Axis, BarPanel, LinePanel, Series};
use super::{f, Options, Output, Table};
use crate::config::{Routing, SimConfig};
use crate::cpu_model::{CpuConfig, CpuSched};
use crate::error::{Result, SimError};
use crate::record::{End, Record, Sink};
use crate::simulation::{simulate, SimStats};
use crate::workload::{Arrival, SimFunction, Workload};
use hearth_core::balance::BalanceKind;
use hearth_core::cpu_sched::{AlpsConfig, Learning};
use hearth_core::{Micros, RegulatorConfig};
use hearth_loadgen::make::azure::{self, AzureFiles};
use plotters::prelude::SeriesLabelPosition;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::time::Instant;

const CPUS: u32 = 16;
const DEPLOYMENTS: usize = 50;
/// §7.1: 15,000 invocations sampled per workload.
const INVOCATIONS: usize = 15_000;
const QUICK_INVOCATIONS: usize = 2_000;
/// Each invocation's work: its deployment's mean ± up to this (§7.1: "up to 25 %").
const SPREAD: f64 = 0.25;
/// Table 3: a CFS process context switch costs 3.5 µs.
const SWITCH_COST_US: Micros = 4;
const LOADS: [f64; 3] = [0.7, 0.8, 0.9];
/// The Azure 2019 day the paper samples from (day 1 of the in-vitro sample).
const AZURE_FILE: &str = "azure2019-invitro-sample/1350_inv.csv";

/// Table 1's groups: (0, 50], (50, 200], (200, 400], above 400 ms.
const GROUPS: [&str; 4] = ["G1 0–50 ms", "G2 50–200 ms", "G3 200–400 ms", "G4 ≥400 ms"];
const TABLE1_HUAWEI: [f64; 4] = [0.698, 0.232, 0.06, 0.01];
const TABLE1_AZURE: [f64; 4] = [0.429, 0.172, 0.167, 0.232];
/// Deployment means that keep all of ±25 % inside their group (µs).
const MEAN_RANGE: [(f64, f64); 4] = [
    (4_000.0, 40_000.0),
    (67_000.0, 160_000.0),
    (267_000.0, 320_000.0),
    (534_000.0, 1_280_000.0),
];

fn group_of(work_us: Micros) -> usize {
    match work_us {
        0..=50_000 => 0,
        50_001..=200_000 => 1,
        200_001..=400_000 => 2,
        _ => 3,
    }
}

/// A workload's make-up: group shares and the deployments' (group, mean work).
#[derive(Debug, Clone)]
struct Mix {
    name: &'static str,
    shares: [f64; 4],
    deployments: Vec<(usize, f64)>,
    /// How it was made, for the report.
    note: String,
}

impl Mix {
    fn mean_work_us(&self) -> f64 {
        (0..4)
            .map(|g| {
                let ds: Vec<f64> = self
                    .deployments
                    .iter()
                    .filter(|d| d.0 == g)
                    .map(|d| d.1)
                    .collect();
                if ds.is_empty() {
                    0.0
                } else {
                    self.shares[g] * ds.iter().sum::<f64>() / ds.len() as f64
                }
            })
            .sum()
    }
}

/// Deployments per group: in proportion to the shares, at least one per group with a share,
/// `DEPLOYMENTS` in all.
fn allocate(shares: &[f64; 4]) -> [usize; 4] {
    let mut n = [0usize; 4];
    for g in 0..4 {
        if shares[g] > 0.0 {
            n[g] = ((shares[g] * DEPLOYMENTS as f64).round() as usize).max(1);
        }
    }
    loop {
        let total: usize = n.iter().sum();
        let largest = (0..4).max_by_key(|&g| (n[g], 4 - g)).unwrap_or(0);
        match total.cmp(&DEPLOYMENTS) {
            std::cmp::Ordering::Greater => n[largest] -= 1,
            std::cmp::Ordering::Less => n[largest] += 1,
            std::cmp::Ordering::Equal => return n,
        }
    }
}

fn log_uniform(rng: &mut ChaCha8Rng, (lo, hi): (f64, f64)) -> f64 {
    (lo.ln() + rng.gen::<f64>() * (hi.ln() - lo.ln())).exp()
}

fn huawei(rng: &mut ChaCha8Rng) -> Mix {
    let n = allocate(&TABLE1_HUAWEI);
    let mut deployments = Vec::new();
    for g in 0..4 {
        for _ in 0..n[g] {
            deployments.push((g, log_uniform(rng, MEAN_RANGE[g])));
        }
    }
    Mix {
        name: "huawei-like",
        shares: TABLE1_HUAWEI,
        deployments,
        note: "synthetic (the Huawei trace is not available): Table 1's Huawei shares, \
               deployment means log-uniform within each group"
            .into(),
    }
}

fn azure_mix(o: &Options, rng: &mut ChaCha8Rng, sample: usize) -> Result<Mix> {
    let path = o.traces.join(AZURE_FILE);
    if !path.is_file() {
        return Err(SimError::Config(format!(
            "trace data not found: {} (pass --traces with the folder of the shared traces, ../shared/traces)",
            path.display()
        )));
    }
    let (functions, _) = azure::read(&AzureFiles::beside(&path)?, 0, 1440)?;
    let counts: Vec<u64> = functions.iter().map(|f| f.invocations()).collect();
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return Err(SimError::Config(
            "the Azure sample has no invocation on day 1".into(),
        ));
    }
    let mut cumulative = Vec::with_capacity(counts.len());
    let mut acc = 0u64;
    for c in &counts {
        acc += c;
        cumulative.push(acc);
    }
    // Invocations sampled by count; each takes its function's mean duration.
    let mut by_group: [Vec<f64>; 4] = Default::default();
    for _ in 0..sample {
        let x = rng.gen_range(0..total);
        let i = cumulative.partition_point(|&c| c <= x);
        let us = functions[i].avg_ms * 1000.0;
        by_group[group_of(us.round() as Micros)].push(us);
    }
    let own: Vec<String> = (0..4)
        .map(|g| format!("{:.1}", 100.0 * by_group[g].len() as f64 / sample as f64))
        .collect();
    // Table 1's shares (the paper's sample); the durations within each group are the trace's.
    let shares = TABLE1_AZURE;
    let n = allocate(&shares);
    let mut deployments = Vec::new();
    let (mut clamped, mut synthetic) = (0, 0);
    for g in 0..4 {
        for _ in 0..n[g] {
            let (lo, hi) = MEAN_RANGE[g];
            let mean = if by_group[g].is_empty() {
                synthetic += 1;
                log_uniform(rng, MEAN_RANGE[g])
            } else {
                let pick = by_group[g][rng.gen_range(0..by_group[g].len())];
                clamped += usize::from(pick < lo || pick > hi);
                pick.clamp(lo, hi)
            };
            deployments.push((g, mean));
        }
    }
    let mut note = format!(
        "Table 1's Azure shares; {sample} invocations sampled by count from day 1 of \
         `{AZURE_FILE}` ({} functions) give the durations within each group (the sample's own \
         shares: {} %); deployment means are sampled functions' mean durations, {clamped} of \
         {DEPLOYMENTS} moved into their group's range",
        functions.len(),
        own.join(" / ")
    );
    if synthetic > 0 {
        note.push_str(&format!(
            "; {synthetic} drawn log-uniform in a group the sample has no function of"
        ));
    }
    Ok(Mix {
        name: "azure-like",
        shares,
        deployments,
        note,
    })
}

/// `n` invocations of `mix` at unit rate: (gap in mean inter-arrival times, deployment).
fn sequence(mix: &Mix, n: usize, rng: &mut ChaCha8Rng) -> Vec<(f64, u32)> {
    let in_group: Vec<Vec<u32>> = (0..4)
        .map(|g| {
            (0..mix.deployments.len() as u32)
                .filter(|&d| mix.deployments[d as usize].0 == g)
                .collect()
        })
        .collect();
    (0..n)
        .map(|_| {
            let gap = -(1.0 - rng.gen::<f64>()).ln();
            let mut x = rng.gen::<f64>();
            let mut g = 0;
            while g < 3 && (x >= mix.shares[g] || in_group[g].is_empty()) {
                x -= mix.shares[g];
                g += 1;
            }
            // Float rounding can leave g on an empty last group: the nearest one with
            // deployments.
            while in_group[g].is_empty() && g > 0 {
                g -= 1;
            }
            let ds = &in_group[g];
            (gap, ds[rng.gen_range(0..ds.len())])
        })
        .collect()
}

/// The sequence at `load` average utilization of the CPUs.
fn workload(mix: &Mix, seq: &[(f64, u32)], load: f64) -> Workload {
    let functions = mix
        .deployments
        .iter()
        .enumerate()
        .map(|(i, (g, mean))| {
            let name = format!("g{}-d{i:02}", g + 1);
            SimFunction::new(&name, mean.round().max(1.0) as Micros, 0, 64)
        })
        .collect();
    let rate_per_us = load * f64::from(CPUS) / mix.mean_work_us();
    let mut t = 0.0;
    let arrivals = seq
        .iter()
        .map(|&(gap, d)| {
            t += gap / rate_per_us;
            Arrival {
                at_us: t.round() as Micros,
                function: d,
            }
        })
        .collect();
    Workload {
        functions,
        arrivals,
    }
}

fn config(sched: CpuSched, alps: AlpsConfig, seed: u64) -> SimConfig {
    let mut cpu = CpuConfig::new(sched);
    cpu.params.switch_cost_us = SWITCH_COST_US;
    cpu.frontend.alps = alps;
    SimConfig {
        workers: 1,
        cpus: CPUS,
        memory_mb: 1 << 20,
        regulator: RegulatorConfig::Fixed(u32::MAX),
        routing: Routing::seeded(BalanceKind::RoundRobin, 0),
        cpu,
        work_spread: SPREAD,
        work_seed: seed,
        ..SimConfig::default()
    }
}

/// Execution durations by duration group (of each invocation's own work).
struct Durations<'a> {
    workload: &'a Workload,
    config: &'a SimConfig,
    by_group: [Vec<Micros>; 4],
    not_done: u64,
}

impl Sink for Durations<'_> {
    fn record(&mut self, r: &Record) -> Result<()> {
        match r.end {
            End::Done { exec_us, .. } => {
                let warm = self.workload.function(r.function).warm_us;
                let g = group_of(self.config.work_us(r.id, warm));
                self.by_group[g].push(exec_us);
            }
            _ => self.not_done += 1,
        }
        Ok(())
    }
}

/// Mean and p99 (ms) of one set of durations.
#[derive(Debug, Clone, Copy, Default)]
struct Stat {
    n: usize,
    mean_ms: f64,
    p99_ms: f64,
}

fn stat(v: &mut [Micros]) -> Stat {
    if v.is_empty() {
        return Stat {
            n: 0,
            mean_ms: f64::NAN,
            p99_ms: f64::NAN,
        };
    }
    v.sort_unstable();
    let rank = ((0.99 * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Stat {
        n: v.len(),
        mean_ms: v.iter().sum::<u64>() as f64 / v.len() as f64 / 1000.0,
        p99_ms: v[rank - 1] as f64 / 1000.0,
    }
}

/// What one run gave.
#[derive(Debug, Clone)]
struct RunResult {
    groups: [Stat; 4],
    all: Stat,
    stats: SimStats,
}

impl RunResult {
    fn switches_per_invocation(&self) -> f64 {
        self.stats.context_switches as f64 / self.stats.completed.max(1) as f64
    }

    fn json(&self) -> Value {
        let g: Vec<Value> = self
            .groups
            .iter()
            .zip(GROUPS)
            .map(|(s, name)| json!({"group": name, "n": s.n, "mean_ms": s.mean_ms, "p99_ms": s.p99_ms}))
            .collect();
        json!({
            "groups": g, "n": self.all.n, "mean_ms": self.all.mean_ms, "p99_ms": self.all.p99_ms,
            "context_switches": self.stats.context_switches, "preemptions": self.stats.preemptions,
            "demotions": self.stats.demotions,
            "switches_per_invocation": self.switches_per_invocation(),
        })
    }
}

/// One simulation of the experiment.
struct Job<'w> {
    label: String,
    workload: &'w Workload,
    config: SimConfig,
}

fn run_one(job: &Job<'_>) -> Result<RunResult> {
    let mut d = Durations {
        workload: job.workload,
        config: &job.config,
        by_group: Default::default(),
        not_done: 0,
    };
    let stats = simulate(job.workload, &job.config, &mut d)?;
    if d.not_done > 0 {
        return Err(SimError::Internal(format!(
            "{}: {} invocations did not complete",
            job.label, d.not_done
        )));
    }
    let mut all: Vec<Micros> = d.by_group.iter().flatten().copied().collect();
    let groups = [
        stat(&mut d.by_group[0]),
        stat(&mut d.by_group[1]),
        stat(&mut d.by_group[2]),
        stat(&mut d.by_group[3]),
    ];
    Ok(RunResult {
        groups,
        all: stat(&mut all),
        stats,
    })
}

/// Runs `jobs` on up to `threads` threads; results in job order.
fn run_all(jobs: &[Job<'_>], threads: usize) -> Result<Vec<RunResult>> {
    super::runner::in_parallel(jobs, threads, |job| {
        let t0 = Instant::now();
        let r = run_one(job);
        tracing::info!(job = %job.label, seconds = format!("{:.2}", t0.elapsed().as_secs_f64()), "simulated");
        r
    })
}

/// The schedulers of Figs. 5–7, with processor sharing (the fluid ideal of CFS) for reference.
const SCHEDULERS: [CpuSched; 5] = [
    CpuSched::Cfs,
    CpuSched::Sfs,
    CpuSched::Alps,
    CpuSched::Srpt,
    CpuSched::Ps,
];

/// A variant of ALPS' settings: (table label, what it sets).
type Variant = (String, AlpsConfig);

fn ablation() -> Vec<Variant> {
    let v = |name: &str, unpredictability, overload| {
        (
            name.to_string(),
            AlpsConfig {
                unpredictability,
                overload,
                ..AlpsConfig::default()
            },
        )
    };
    vec![
        v("(1) both fine-tunings", true, true),
        v("(2) no fine-tuning", false, false),
        v("(3) unpredictability (Eq. 2) only", true, false),
        v("(4) overload (Eq. 3) only", false, true),
    ]
}

/// §7.5's sweeps: (parameter, variants); the defaults are among them.
fn sensitivity(quick: bool) -> Vec<(&'static str, Vec<Variant>)> {
    let d = AlpsConfig::default;
    let pick = |all: Vec<Variant>| -> Vec<Variant> {
        if quick {
            all.into_iter().take(2).collect()
        } else {
            all
        }
    };
    vec![
        (
            "window W",
            pick(
                [5_000, 10_000, 20_000, 30_000]
                    .iter()
                    .map(|&w| {
                        (
                            format!("{} s", w / 1000),
                            AlpsConfig {
                                window_ms: w,
                                ..d()
                            },
                        )
                    })
                    .collect(),
            ),
        ),
        (
            "learning method",
            pick(
                Learning::ALL
                    .iter()
                    .map(|&l| (l.as_str().to_string(), AlpsConfig { learning: l, ..d() }))
                    .collect(),
            ),
        ),
        (
            "α",
            pick(
                [2.0, 1.0, 3.0, 4.0]
                    .iter()
                    .map(|&a| (f(a, 1), AlpsConfig { alpha: a, ..d() }))
                    .collect(),
            ),
        ),
        (
            "β",
            pick(
                [1.0, 0.0, 2.0, 3.0]
                    .iter()
                    .map(|&b| (f(b, 1), AlpsConfig { beta: b, ..d() }))
                    .collect(),
            ),
        ),
        (
            "γ",
            pick(
                [1.0, 0.5, 1.5, 2.0]
                    .iter()
                    .map(|&g| (f(g, 1), AlpsConfig { gamma: g, ..d() }))
                    .collect(),
            ),
        ),
    ]
}

/// Change of `b` relative to `a`, in per cent (negative: `b` is lower).
fn change(a: f64, b: f64) -> f64 {
    100.0 * (b - a) / a
}

pub(super) fn run(o: &Options) -> Result<Output> {
    let n = if o.quick {
        QUICK_INVOCATIONS
    } else {
        INVOCATIONS
    };
    let loads: Vec<f64> = if o.quick { vec![0.9] } else { LOADS.to_vec() };
    let mut rng = ChaCha8Rng::seed_from_u64(o.seed);
    let mixes = [huawei(&mut rng), azure_mix(o, &mut rng, INVOCATIONS)?];
    let seqs: Vec<Vec<(f64, u32)>> = mixes.iter().map(|m| sequence(m, n, &mut rng)).collect();
    // workloads[m][l]
    let workloads: Vec<Vec<Workload>> = mixes
        .iter()
        .zip(&seqs)
        .map(|(m, s)| loads.iter().map(|&l| workload(m, s, l)).collect())
        .collect();
    let high = loads.len() - 1;
    let mut jobs = Vec::new();
    for (mi, m) in mixes.iter().enumerate() {
        for (li, l) in loads.iter().enumerate() {
            for s in SCHEDULERS {
                jobs.push(Job {
                    label: format!("{} {:.0}% {s}", m.name, l * 100.0),
                    workload: &workloads[mi][li],
                    config: config(s, AlpsConfig::default(), o.seed),
                });
            }
        }
    }
    let main_jobs = jobs.len();
    let ablations = ablation();
    let sweeps = sensitivity(o.quick);
    for (mi, m) in mixes.iter().enumerate() {
        // Variant (1) and each sweep's first value are the default ALPS: run once, above.
        for (name, a) in ablations.iter().skip(1) {
            jobs.push(Job {
                label: format!("{} ablation {name}", m.name),
                workload: &workloads[mi][high],
                config: config(CpuSched::Alps, a.clone(), o.seed),
            });
        }
        for (param, variants) in &sweeps {
            for (value, a) in variants.iter().skip(1) {
                jobs.push(Job {
                    label: format!("{} {param} = {value}", m.name),
                    workload: &workloads[mi][high],
                    config: config(CpuSched::Alps, a.clone(), o.seed),
                });
            }
        }
    }
    let t0 = Instant::now();
    let results = run_all(&jobs, o.jobs)?;
    let took = t0.elapsed().as_secs_f64();
    let main = |mi: usize, li: usize, s: CpuSched| -> &RunResult {
        let si = SCHEDULERS.iter().position(|&x| x == s).unwrap_or(0);
        &results[(mi * loads.len() + li) * SCHEDULERS.len() + si]
    };
    let default_alps = |mi: usize| main(mi, high, CpuSched::Alps);

    let mut md = String::from(
        "# alps: CPU scheduling of invocations (ALPS, USENIX ATC '24, Figs. 5–7, 9, §7.5)\n\n",
    );
    md.push_str(&format!(
        "* one worker, {CPUS} CPUs; every invocation on the CPUs at once (no queue, no cold-start \
         delay); {n} invocations per workload, Poisson arrivals scaled to {} % average utilization\n\
         * each invocation's work is its deployment's mean ± up to {:.0} %; groups are by the \
         invocation's own work; duration = execution duration (start to end, the paper's metric)\n\
         * time-sliced CPU model: CFS latency 24 ms, minimum slice 3 ms, wakeup granularity 4 ms, \
         {SWITCH_COST_US} µs per context switch; ALPS defaults W = 5 s, α = 2, β = 1, γ = 1, \
         θ = 50 %, average; SFS adaptive (mean inter-arrival time of 200 × CPUs, ≥ 6 ms, overload \
         rule 3 slices); SRPT an oracle; ps = processor sharing\n\n",
        loads
            .iter()
            .map(|l| format!("{:.0}", l * 100.0))
            .collect::<Vec<_>>()
            .join(", "),
        SPREAD * 100.0
    ));
    let mut shares = Table::new(&[
        "workload",
        GROUPS[0],
        GROUPS[1],
        GROUPS[2],
        GROUPS[3],
        "mean work ms",
        "made",
    ]);
    for m in &mixes {
        let paper = if m.name == "azure-like" {
            TABLE1_AZURE
        } else {
            TABLE1_HUAWEI
        };
        let mut row = vec![m.name.to_string()];
        for (ours, theirs) in m.shares.iter().zip(paper) {
            row.push(format!("{:.1} % ({:.1})", ours * 100.0, theirs * 100.0));
        }
        row.push(f(m.mean_work_us() / 1000.0, 1));
        row.push(m.note.clone());
        shares.row(row);
    }
    md.push_str(&format!(
        "## Workloads (Table 1: share of invocations per group, the paper's in brackets)\n\n{}\n",
        shares.markdown()
    ));

    // Figs. 5–6: mean and p99 by group, per load and scheduler.
    let mut json_runs = Vec::new();
    for (mi, m) in mixes.iter().enumerate() {
        let mut header = vec!["load", "scheduler"];
        header.extend(GROUPS.iter().map(|g| &g[..2]));
        header.extend([
            "all",
            "p99 G1",
            "p99 G2",
            "p99 G3",
            "p99 G4",
            "p99 all",
            "switches / inv",
        ]);
        let mut t = Table::new(&header);
        for (li, l) in loads.iter().enumerate() {
            for s in SCHEDULERS {
                let r = main(mi, li, s);
                let mut row = vec![format!("{:.0} %", l * 100.0), s.to_string()];
                row.extend(r.groups.iter().map(|g| f(g.mean_ms, 1)));
                row.push(f(r.all.mean_ms, 1));
                row.extend(r.groups.iter().map(|g| f(g.p99_ms, 0)));
                row.push(f(r.all.p99_ms, 0));
                row.push(f(r.switches_per_invocation(), 2));
                t.row(row);
                let mut j = r.json();
                j["workload"] = json!(m.name);
                j["load"] = json!(l);
                j["scheduler"] = json!(s.as_str());
                json_runs.push(j);
            }
        }
        md.push_str(&format!(
            "## {}: execution duration (ms) by group — mean, then p99 (Figs. 5–6, 7)\n\n{}\n",
            m.name,
            t.markdown()
        ));
    }

    // The paper's headline: ALPS' mean against CFS and SFS.
    let mut head = Table::new(&[
        "workload",
        "load",
        "ALPS vs CFS",
        "ALPS vs SFS",
        "ALPS vs SRPT",
        "ALPS G4 p99 vs SRPT",
    ]);
    let mut json_head = Vec::new();
    for (mi, m) in mixes.iter().enumerate() {
        for (li, l) in loads.iter().enumerate() {
            let (a, c, s, o_) = (
                main(mi, li, CpuSched::Alps),
                main(mi, li, CpuSched::Cfs),
                main(mi, li, CpuSched::Sfs),
                main(mi, li, CpuSched::Srpt),
            );
            let vs_cfs = change(c.all.mean_ms, a.all.mean_ms);
            let vs_sfs = change(s.all.mean_ms, a.all.mean_ms);
            let vs_srpt = change(o_.all.mean_ms, a.all.mean_ms);
            let tail = change(o_.groups[3].p99_ms, a.groups[3].p99_ms);
            head.row(vec![
                m.name.to_string(),
                format!("{:.0} %", l * 100.0),
                format!("{:+.1} %", vs_cfs),
                format!("{:+.1} %", vs_sfs),
                format!("{:+.1} %", vs_srpt),
                format!("{:+.1} %", tail),
            ]);
            json_head.push(json!({"workload": m.name, "load": l, "vs_cfs_change_pct": vs_cfs,
                "vs_sfs_change_pct": vs_sfs, "vs_srpt_change_pct": vs_srpt, "g4_p99_vs_srpt_change_pct": tail}));
        }
    }
    md.push_str(&format!(
        "## ALPS against the others: change of the mean execution duration, and of G4's p99 \
         against SRPT (negative: ALPS lower; paper: 34.1–57.2 % lower than CFS, 20.6–27.3 % lower \
         than SFS)\n\n{}\n",
        head.markdown()
    ));

    // Fig. 9: the ablation, at the highest load.
    let mut next = main_jobs;
    let mut abl = Table::new(&[
        "workload",
        "configuration",
        "mean all",
        "p99 all",
        "mean G1",
        "mean G4",
        "p99 G4",
    ]);
    let mut json_abl = Vec::new();
    let mut json_sens = Vec::new();
    let mut sens_tables: Vec<(String, Table)> = sweeps
        .iter()
        .map(|(p, _)| {
            (
                p.to_string(),
                Table::new(&[p, "workload", "mean all", "p99 all", "mean G1", "p99 G4"]),
            )
        })
        .collect();
    for (mi, m) in mixes.iter().enumerate() {
        for (ai, (name, _)) in ablations.iter().enumerate() {
            let r = if ai == 0 {
                default_alps(mi)
            } else {
                next += 1;
                &results[next - 1]
            };
            abl.row(vec![
                m.name.to_string(),
                name.clone(),
                f(r.all.mean_ms, 1),
                f(r.all.p99_ms, 0),
                f(r.groups[0].mean_ms, 1),
                f(r.groups[3].mean_ms, 1),
                f(r.groups[3].p99_ms, 0),
            ]);
            let mut j = r.json();
            j["workload"] = json!(m.name);
            j["configuration"] = json!(name);
            json_abl.push(j);
        }
        for (pi, (param, variants)) in sweeps.iter().enumerate() {
            for (vi, (value, _)) in variants.iter().enumerate() {
                let r = if vi == 0 {
                    default_alps(mi)
                } else {
                    next += 1;
                    &results[next - 1]
                };
                sens_tables[pi].1.row(vec![
                    value.clone(),
                    m.name.to_string(),
                    f(r.all.mean_ms, 1),
                    f(r.all.p99_ms, 0),
                    f(r.groups[0].mean_ms, 1),
                    f(r.groups[3].p99_ms, 0),
                ]);
                let mut j = r.json();
                j["workload"] = json!(m.name);
                j["parameter"] = json!(param);
                j["value"] = json!(value);
                json_sens.push(j);
            }
        }
    }
    let high_pct = loads[high] * 100.0;
    md.push_str(&format!(
        "## Ablation of the fine-tunings at {high_pct:.0} % (Fig. 9; ms)\n\n{}\n",
        abl.markdown()
    ));
    md.push_str(&format!(
        "## Sensitivity at {high_pct:.0} % (§7.5, Figs. 10–14; ms; the first value is the default)\n\n"
    ));
    for (_, t) in &sens_tables {
        md.push_str(&t.markdown());
        md.push('\n');
    }
    md.push_str(&format!(
        "{} simulations in {took:.1} s ({} threads).\n",
        jobs.len(),
        o.jobs
    ));

    // Figures: Fig. 6-like bars at the highest load, Fig. 7-like context switches.
    let mut files = Vec::new();
    // Short labels under the bars (the groups' ranges are in the tables).
    let categories: Vec<String> = GROUPS
        .iter()
        .map(|g| g[..2].to_string())
        .chain(["all".into()])
        .collect();
    let panels: Vec<BarPanel> = mixes
        .iter()
        .enumerate()
        .flat_map(|(mi, m)| {
            let series = |p99: bool| -> Vec<(String, Vec<f64>)> {
                SCHEDULERS
                    .iter()
                    .map(|&s| {
                        let r = main(mi, high, s);
                        let v = r
                            .groups
                            .iter()
                            .chain(std::iter::once(&r.all))
                            .map(|g| if p99 { g.p99_ms } else { g.mean_ms })
                            .collect();
                        (s.to_string(), v)
                    })
                    .collect()
            };
            [
                BarPanel {
                    title: format!("{}: mean", m.name),
                    categories: categories.clone(),
                    y: Axis::log("execution duration (ms, log)"),
                    series: series(false),
                },
                BarPanel {
                    title: format!("{}: p99", m.name),
                    categories: categories.clone(),
                    y: Axis::log("execution duration (ms, log)"),
                    series: series(true),
                },
            ]
        })
        .collect();
    let fig = o.out.join("alps_duration.png");
    plot::bars(
        &fig,
        &format!("Execution duration by group at {high_pct:.0} % load (Figs. 5–6)"),
        &panels,
        (2000, 520),
    )?;
    files.push(fig);
    let switch_panels: Vec<BarPanel> = mixes
        .iter()
        .enumerate()
        .map(|(mi, m)| BarPanel {
            title: m.name.to_string(),
            categories: loads
                .iter()
                .map(|l| format!("{:.0} %", l * 100.0))
                .collect(),
            y: Axis::linear("context switches per invocation"),
            series: SCHEDULERS
                .iter()
                .filter(|&&s| s != CpuSched::Ps)
                .map(|&s| {
                    (
                        s.to_string(),
                        (0..loads.len())
                            .map(|li| main(mi, li, s).switches_per_invocation())
                            .collect(),
                    )
                })
                .collect(),
        })
        .collect();
    let fig = o.out.join("alps_switches.png");
    plot::bars(
        &fig,
        "Context switches (Fig. 7)",
        &switch_panels,
        (1100, 480),
    )?;
    files.push(fig);
    let load_panels: Vec<LinePanel> = mixes
        .iter()
        .enumerate()
        .map(|(mi, m)| LinePanel {
            title: format!("{}: mean over all groups", m.name),
            x: Axis::linear("average CPU utilization (%)"),
            y: Axis::log("mean execution duration (ms, log)"),
            series: SCHEDULERS
                .iter()
                .map(|&s| Series {
                    label: s.to_string(),
                    points: loads
                        .iter()
                        .enumerate()
                        .map(|(li, l)| (l * 100.0, main(mi, li, s).all.mean_ms))
                        .collect(),
                })
                .collect(),
            markers: true,
            legend: SeriesLabelPosition::UpperLeft,
        })
        .collect();
    let fig = o.out.join("alps_load.png");
    plot::lines(
        &fig,
        "Mean execution duration vs load",
        &load_panels,
        (1100, 480),
    )?;
    files.push(fig);

    let json = json!({
        "experiment": "alps",
        "cpus": CPUS, "invocations": n, "loads": loads,
        "workloads": mixes.iter().map(|m| json!({"name": m.name, "shares": m.shares,
            "mean_work_ms": m.mean_work_us() / 1000.0, "note": m.note})).collect::<Vec<_>>(),
        "runs": json_runs,
        "headline": json_head,
        "ablation": json_abl,
        "sensitivity": json_sens,
    });
    Ok((md, json, files))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_allocation_follow_table_1() {
        assert_eq!(group_of(50_000), 0);
        assert_eq!(group_of(50_001), 1);
        assert_eq!(group_of(400_000), 2);
        assert_eq!(group_of(400_001), 3);
        assert_eq!(allocate(&TABLE1_HUAWEI), [34, 12, 3, 1]);
        assert_eq!(allocate(&TABLE1_AZURE), [21, 9, 8, 12]);
        assert_eq!(allocate(&[0.5, 0.5, 0.0, 0.0]), [25, 25, 0, 0]);
        // Every deployment mean keeps ±25 % inside its group.
        for (g, (lo, hi)) in MEAN_RANGE.iter().enumerate() {
            assert_eq!(group_of((lo * 0.75) as Micros), g);
            assert_eq!(group_of((hi * 1.25) as Micros), g);
        }
    }

    #[test]
    fn a_workload_hits_its_load_and_its_shares() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mix = huawei(&mut rng);
        let seq = sequence(&mix, 20_000, &mut rng);
        let w = workload(&mix, &seq, 0.8);
        let work: f64 = w
            .arrivals
            .iter()
            .map(|a| w.function(a.function).warm_us as f64)
            .sum();
        let span = w.arrivals.last().unwrap().at_us as f64;
        let load = work / span / f64::from(CPUS);
        assert!((load - 0.8).abs() < 0.05, "{load}");
        let g1 = w
            .arrivals
            .iter()
            .filter(|a| group_of(w.function(a.function).warm_us) == 0)
            .count() as f64
            / w.arrivals.len() as f64;
        assert!((g1 - 0.698).abs() < 0.02, "{g1}");
        // The same sequence at another load is the same invocations, closer together.
        let w9 = workload(&mix, &seq, 0.9);
        assert_eq!(w9.arrivals.len(), w.arrivals.len());
        assert!(w9.arrivals.last().unwrap().at_us < w.arrivals.last().unwrap().at_us);
    }
}
