//! `hearth bench route`: the cost of one routing decision of each balancing policy, measured on
//! the core's `Balancer` alone (no I/O), with a synthetic cluster: `workers` workers reporting a
//! drifting load (starting uniform in [0, 2 × mean_load]) and 8 GiB of sandbox memory once per
//! virtual second, `functions` functions of three priority levels with cold/warm times and
//! 128–512 MiB each, and Zipf(1)-popular arrivals every 50 µs of virtual time.

use crate::stats::percentile;
use hearth_core::balance::{
    BalanceKind, BalanceParams, Balancer, Decision, Finished, FunctionInfo, FunctionKey, Placement,
    WorkerId, WorkerLoad,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Instant;

/// The synthetic cluster.
pub struct Setup {
    pub workers: usize,
    pub functions: usize,
    pub decisions: usize,
    /// Mean of the workers' initial loads (1.0 = every CPU busy).
    pub mean_load: f64,
}

/// One policy's numbers.
pub struct Report {
    pub name: &'static str,
    /// Sorted decision times, ns (timer overhead included).
    pub ns: Vec<u64>,
    pub placements: BTreeMap<&'static str, usize>,
    pub rejected: usize,
}

const ARRIVAL_US: u64 = 50;
/// Each worker's sandbox memory: OpenWhisk's slots (256 in flight at 128–512 MiB over the
/// workers keep some of them full).
const WORKER_MEMORY_MB: u64 = 8 * 1024;
const IN_FLIGHT: usize = 256;

/// Runs `setup` for one policy.
pub fn run(setup: &Setup, kind: BalanceKind) -> Result<Report, String> {
    let mut b = Balancer::new(kind, BalanceParams::default()).map_err(|e| e.to_string())?;
    let mut rng = SmallRng::seed_from_u64(42);
    let ids: Vec<WorkerId> = (0..setup.workers)
        .map(|i| b.join(0, &format!("worker-{i}")))
        .collect();
    let top = (2.0 * setup.mean_load).max(f64::MIN_POSITIVE);
    let mut loads: Vec<f64> = (0..setup.workers)
        .map(|_| rng.gen_range(0.0..top))
        .collect();
    let keys: Vec<FunctionKey> = (0..setup.functions)
        .map(|i| FunctionKey::of(&format!("function-{i}")))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        let warm = rng.gen_range(1_000..1_000_000);
        b.register(
            0,
            *k,
            FunctionInfo {
                priority: (i % 3) as i32,
                warm_us: Some(warm),
                cold_us: Some(warm * rng.gen_range(1..10)),
                memory_mb: 128 << (i % 3),
            },
        );
    }
    let (cdf, total) = zipf_cdf(keys.len());
    let warmup = setup.decisions / 10;
    let mut ns = Vec::with_capacity(setup.decisions);
    let mut placements = BTreeMap::new();
    let mut rejected = 0;
    let mut pending: std::collections::VecDeque<(WorkerId, FunctionKey)> =
        std::collections::VecDeque::with_capacity(IN_FLIGHT + 1);
    // Decisions between two reports, so that each worker reports about once a second.
    let per_report = (1_000_000 / ARRIVAL_US / setup.workers as u64).max(1);
    let mut until_report = 0;
    let mut next_reporter = 0;
    for n in 0..warmup + setup.decisions {
        let now = n as u64 * ARRIVAL_US;
        until_report = if until_report == 0 {
            per_report
        } else {
            until_report
        } - 1;
        if until_report == 0 {
            let w = next_reporter % ids.len();
            next_reporter += 1;
            loads[w] = (loads[w] + rng.gen_range(-0.3..0.3)).clamp(0.0, 7.0);
            b.report(
                now,
                ids[w],
                WorkerLoad {
                    load: loads[w],
                    memory_mb: WORKER_MEMORY_MB,
                    ..Default::default()
                },
            );
        }
        let u = rng.gen_range(0.0..total);
        let key = keys[cdf.partition_point(|c| *c < u).min(keys.len() - 1)];
        let t = Instant::now();
        let d = b.route(now, key);
        let took = t.elapsed().as_nanos() as u64;
        match d {
            Decision::Run { worker, how } => {
                pending.push_back((worker, key));
                if n >= warmup {
                    *placements.entry(placement_name(how)).or_insert(0) += 1;
                }
            }
            Decision::Reject(_) => rejected += usize::from(n >= warmup),
        }
        if pending.len() > IN_FLIGHT {
            if let Some((w, k)) = pending.pop_front() {
                b.finished(now, w, k, Finished::Warm { exec_us: 10_000 });
            }
        }
        if n >= warmup {
            ns.push(took);
        }
    }
    ns.sort_unstable();
    Ok(Report {
        name: kind.as_str(),
        ns,
        placements,
        rejected,
    })
}

/// Zipf(1) over `n` functions: the cumulative weights 1/rank and their total.
fn zipf_cdf(n: usize) -> (Vec<f64>, f64) {
    let mut cdf = Vec::with_capacity(n);
    let mut total = 0.0;
    for r in 1..=n {
        total += 1.0 / r as f64;
        cdf.push(total);
    }
    (cdf, total)
}

fn placement_name(p: Placement) -> &'static str {
    p.as_str()
}

/// The cost of reading the clock twice, to read the numbers against.
fn timer_overhead_ns() -> u64 {
    let mut v: Vec<u64> = (0..100_000)
        .map(|_| {
            let t = Instant::now();
            t.elapsed().as_nanos() as u64
        })
        .collect();
    v.sort_unstable();
    percentile(&v, 50.0)
}

impl Report {
    pub fn to_json(&self) -> Value {
        let mean = self.ns.iter().sum::<u64>() as f64 / self.ns.len().max(1) as f64;
        json!({
            "balance": self.name,
            "decisions": self.ns.len(),
            "ns": {
                "p50": percentile(&self.ns, 50.0),
                "p99": percentile(&self.ns, 99.0),
                "p99.9": percentile(&self.ns, 99.9),
                "max": self.ns.last().copied().unwrap_or(0),
                "mean": mean.round(),
            },
            "placements": self.placements,
            "rejected": self.rejected,
        })
    }
}

/// Atoll's routing decision (`[atoll]` in the controller) on the same synthetic load: groups of
/// 8 workers, every function registered with its times and a deadline of 2 × its cold time,
/// a tick (re-estimation and allocation, off the invocation path in the controller) every
/// 100 ms of virtual time, untimed. Loads are Atoll's own in-flight counts.
pub fn run_atoll(setup: &Setup) -> Result<Report, String> {
    use hearth_core::proactive::{Atoll, AtollConfig, FunctionSpec, Outcome};
    let config = AtollConfig {
        group_size: 8,
        ..AtollConfig::default()
    };
    let mut a = Atoll::new(config).map_err(|e| e.to_string())?;
    let mut rng = SmallRng::seed_from_u64(42);
    for w in 0..setup.workers as u32 {
        a.add_worker(w, 16, 16 * 1024);
    }
    let names: Vec<String> = (0..setup.functions)
        .map(|i| format!("function-{i}"))
        .collect();
    for name in &names {
        let warm = rng.gen_range(1_000..1_000_000);
        let cold = warm * rng.gen_range(1..10);
        a.register(
            name,
            FunctionSpec {
                memory_mb: 128,
                deadline_us: Some(2 * cold),
                setup_us: Some(cold - warm + 1),
                exec_us: Some(warm),
            },
        );
    }
    let (cdf, total) = zipf_cdf(names.len());
    let warmup = setup.decisions / 10;
    let mut ns = Vec::with_capacity(setup.decisions);
    let mut placements = BTreeMap::new();
    let mut pending: std::collections::VecDeque<(u32, usize)> =
        std::collections::VecDeque::with_capacity(IN_FLIGHT + 1);
    for n in 0..warmup + setup.decisions {
        let now = n as u64 * ARRIVAL_US;
        if now >= a.next_tick() {
            for c in a.tick(now) {
                if let hearth_core::proactive::AllocAction::Create { worker, function } = &c.action
                {
                    a.on_ready(*worker, function);
                }
            }
        }
        let u = rng.gen_range(0.0..total);
        let f = cdf.partition_point(|c| *c < u).min(names.len() - 1);
        let t = Instant::now();
        let r = a.route(now, &names[f]);
        let took = t.elapsed().as_nanos() as u64;
        let Some(r) = r else {
            return Err("atoll placed nothing".into());
        };
        pending.push_back((r.worker, f));
        if n >= warmup {
            let how = if r.free_sandbox {
                "proactive"
            } else {
                "least_loaded"
            };
            *placements.entry(how).or_insert(0) += 1;
            ns.push(took);
        }
        if pending.len() > IN_FLIGHT {
            if let Some((w, f)) = pending.pop_front() {
                let done = Outcome {
                    queue_us: 0,
                    init_us: None,
                    exec_us: Some(10_000),
                };
                a.finished(now, w, &names[f], done);
            }
        }
    }
    ns.sort_unstable();
    Ok(Report {
        name: "atoll",
        ns,
        placements,
        rejected: 0,
    })
}

/// Runs every policy in `kinds` (and Atoll with `atoll`) and prints a table (or JSON lines).
pub fn print(
    setup: &Setup,
    kinds: &[BalanceKind],
    atoll: bool,
    as_json: bool,
) -> Result<(), String> {
    let timer = timer_overhead_ns();
    if !as_json {
        println!(
            "bench route: {} workers (mean load {}), {} functions, {} timed decisions per policy (timer overhead ≈ {timer} ns, included)",
            setup.workers, setup.mean_load, setup.functions, setup.decisions
        );
        println!(
            "{:<13} {:>8} {:>8} {:>8} {:>9} {:>8}   placements",
            "policy", "p50 ns", "p99 ns", "p99.9 ns", "max ns", "mean ns"
        );
    }
    let mut runs: Vec<Box<dyn Fn() -> Result<Report, String>>> = kinds
        .iter()
        .map(|k| {
            let k = *k;
            Box::new(move || run(setup, k)) as Box<dyn Fn() -> Result<Report, String>>
        })
        .collect();
    if atoll {
        runs.push(Box::new(|| run_atoll(setup)));
    }
    for go in runs {
        let r = go()?;
        let j = r.to_json();
        if as_json {
            let mut j = j;
            j["timer_overhead_ns"] = json!(timer);
            println!("{j}");
            continue;
        }
        let n = &j["ns"];
        let mut places: Vec<String> = r
            .placements
            .iter()
            .map(|(k, v)| format!("{k} {:.1}%", 100.0 * *v as f64 / r.ns.len() as f64))
            .collect();
        if r.rejected > 0 {
            places.push(format!("rejected {}", r.rejected));
        }
        let v = |k: &str| n[k].as_f64().unwrap_or(0.0);
        println!(
            "{:<13} {:>8} {:>8} {:>8} {:>9} {:>8}   {}",
            r.name,
            v("p50"),
            v("p99"),
            v("p99.9"),
            v("max"),
            v("mean"),
            places.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_places_the_synthetic_load() {
        let setup = Setup {
            workers: 8,
            functions: 200,
            decisions: 2_000,
            mean_load: 1.0,
        };
        for kind in BalanceKind::ALL {
            let r = run(&setup, kind).unwrap();
            assert_eq!(r.ns.len(), 2_000);
            let placed: usize = r.placements.values().sum();
            assert_eq!(placed + r.rejected, 2_000, "{kind}");
            assert!(placed > 1_000, "{kind}: most invocations are placed");
        }
    }

    #[test]
    fn atoll_places_every_invocation_and_uses_its_proactive_sandboxes() {
        let setup = Setup {
            workers: 16,
            functions: 200,
            decisions: 20_000,
            mean_load: 1.0,
        };
        let r = run_atoll(&setup).unwrap();
        assert_eq!(r.ns.len(), 20_000);
        let placed: usize = r.placements.values().sum();
        assert_eq!(placed, 20_000);
        // The synthetic load asks for far more sandboxes than the pools hold (set-up times of
        // up to seconds at thousands of calls a second): some calls still find one free.
        let proactive = r.placements.get("proactive").copied().unwrap_or(0);
        assert!(proactive > 0, "{:?}", r.placements);
    }
}
