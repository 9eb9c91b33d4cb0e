//! `hearth bench alps`: what one ALPS training costs (the paper's frontend: ~11 ms per window
//! in Python, Table 2). A window of a busy worker is made up (Table 1's Huawei mix of 50
//! functions, Poisson arrivals at 90 % of the CPUs, work ± 25 %), fed to the core's
//! [`Alps`] as completions, and the window's training (`tick`: SRPT simulation, ranks, Eq. 1–3)
//! timed; then Table 2's window sizes, for each learning method, through `learn` alone.

use anyhow::{bail, Result};
use hearth_core::cpu_sched::{learn, srpt, Alps, AlpsConfig, Completion, Learning};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::time::Instant;

/// Table 1's Huawei shares and the duration range of each group's functions (µs).
const GROUPS: [(f64, f64, f64); 4] = [
    (0.698, 4_000.0, 40_000.0),
    (0.232, 67_000.0, 160_000.0),
    (0.06, 267_000.0, 320_000.0),
    (0.01, 534_000.0, 1_280_000.0),
];
const FUNCTIONS: usize = 50;
const SIZES: [usize; 6] = [100, 200, 500, 1_000, 2_000, 5_000];

/// (function, arrival µs, CPU µs) of `n` invocations at `load` of `cpus`.
fn window(n: usize, cpus: u32, load: f64, seed: u64) -> (Vec<String>, Vec<(u32, u64, u64)>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut means = Vec::new();
    for (share, lo, hi) in GROUPS {
        let k = ((share * FUNCTIONS as f64).round() as usize).max(1);
        for _ in 0..k {
            let x: f64 = rng.gen();
            means.push((lo.ln() + x * (hi / lo).ln()).exp());
        }
    }
    let names: Vec<String> = (0..means.len()).map(|i| format!("fn-{i:02}")).collect();
    let group_start: Vec<usize> = GROUPS
        .iter()
        .scan(0, |acc, (share, _, _)| {
            let s = *acc;
            *acc += ((share * FUNCTIONS as f64).round() as usize).max(1);
            Some(s)
        })
        .collect();
    let mean_work: f64 = GROUPS
        .iter()
        .enumerate()
        .map(|(g, (share, _, _))| {
            let end = group_start.get(g + 1).copied().unwrap_or(means.len());
            let ms = &means[group_start[g]..end];
            share * ms.iter().sum::<f64>() / ms.len() as f64
        })
        .sum();
    let rate_per_us = load * f64::from(cpus) / mean_work;
    let mut t = 0.0;
    let jobs = (0..n)
        .map(|_| {
            t += -(1.0 - rng.gen::<f64>()).ln() / rate_per_us;
            let mut x: f64 = rng.gen();
            let mut g = 0;
            while g < 3 && x >= GROUPS[g].0 {
                x -= GROUPS[g].0;
                g += 1;
            }
            let end = group_start.get(g + 1).copied().unwrap_or(means.len());
            let f = rng.gen_range(group_start[g]..end);
            let work = means[f] * rng.gen_range(0.75..1.25);
            (f as u32, t as u64, work as u64)
        })
        .collect();
    (names, jobs)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times one window's training `rounds` times on `cpus` CPUs; prints medians.
pub fn run(cpus: u32, window_s: u64, rounds: usize, as_json: bool) -> Result<()> {
    if !(1..=4096).contains(&cpus)
        || !(1..=30).contains(&window_s)
        || !(1..=10_000).contains(&rounds)
    {
        bail!("--cpus must be 1–4096, --window-s 1–30 and --rounds 1–10000");
    }
    let config = AlpsConfig {
        window_ms: window_s * 1000,
        ..AlpsConfig::default()
    };
    // The busy worker's window: as many invocations as arrive in W at 90 %.
    let (names, long) = window(200_000, cpus, 0.9, 1);
    let w_us = window_s * 1_000_000;
    let in_window: Vec<(u32, u64, u64)> = long.iter().copied().filter(|j| j.1 < w_us).collect();
    let mut feed = Vec::with_capacity(rounds);
    let mut train = Vec::with_capacity(rounds);
    let mut functions = 0;
    for _ in 0..rounds {
        let mut alps = Alps::new(config.clone(), cpus)?;
        let t0 = Instant::now();
        for &(f, at, cpu) in &in_window {
            alps.completed(Completion {
                function: &names[f as usize],
                arrival_us: at,
                end_us: at + cpu,
                cpu_us: cpu,
            });
        }
        let t1 = Instant::now();
        let trained = alps.tick(w_us, 90.0);
        let t2 = Instant::now();
        functions = trained.map_or(0, |t| t.functions);
        feed.push((t1 - t0).as_secs_f64() * 1e9 / in_window.len().max(1) as f64);
        train.push((t2 - t1).as_secs_f64() * 1e3);
    }
    let (feed_ns, train_ms) = (median(feed), median(train));
    let mut sizes = Vec::new();
    for n in SIZES {
        let jobs: Vec<srpt::WindowJob> = long[..n]
            .iter()
            .map(|&(function, arrival_us, cpu_us)| srpt::WindowJob {
                function,
                arrival_us,
                cpu_us,
            })
            .collect();
        let time = |f: &dyn Fn()| {
            median(
                (0..rounds)
                    .map(|_| {
                        let t0 = Instant::now();
                        f();
                        t0.elapsed().as_secs_f64() * 1e3
                    })
                    .collect(),
            )
        };
        let simulation = time(&|| {
            std::hint::black_box(srpt::simulate(std::hint::black_box(&jobs), cpus));
        });
        let mut methods = serde_json::Map::new();
        for m in Learning::ALL {
            let c = AlpsConfig {
                learning: m,
                ..config.clone()
            };
            let ms = time(&|| {
                std::hint::black_box(learn::learn(&jobs, names.len(), cpus, &c));
            });
            methods.insert(m.as_str().into(), json!(ms));
        }
        sizes.push(json!({"invocations": n, "srpt_ms": simulation, "learn_ms": methods}));
    }
    let j = json!({
        "cpus": cpus, "window_s": window_s, "rounds": rounds,
        "window": {"invocations": in_window.len(), "functions": functions,
                   "train_ms": train_ms, "feed_ns_per_completion": feed_ns},
        "sizes": sizes,
    });
    if as_json {
        println!("{j}");
        return Ok(());
    }
    println!(
        "bench alps: one {window_s} s window of a busy {cpus}-CPU worker (Huawei-like mix at 90 %): \
         {} invocations of {functions} functions",
        in_window.len()
    );
    println!(
        "training (SRPT simulation + ranks + slices, average): median {train_ms:.3} ms over {rounds} rounds; \
         feeding completions {feed_ns:.0} ns each"
    );
    println!("window size  SRPT ms   learn ms: average    ewma  linear   (SRPT included; medians)");
    for s in &sizes {
        let l = |m: &str| s["learn_ms"][m].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:>11}  {:>7.3}   {:>16.3} {:>7.3} {:>7.3}",
            s["invocations"].as_u64().unwrap_or(0),
            s["srpt_ms"].as_f64().unwrap_or(f64::NAN),
            l("average"),
            l("ewma"),
            l("linear")
        );
    }
    Ok(())
}
