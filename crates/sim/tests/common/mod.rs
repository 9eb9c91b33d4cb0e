//! Small workloads built in code, for the simulator's tests.

#![allow(dead_code)]

use hearth_core::balance::BalanceKind;
use hearth_core::time::ms;
use hearth_core::RegulatorConfig;
use hearth_sim::workload::Arrival;
use hearth_sim::{Routing, SimConfig, SimFunction, Workload};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A function with times in ms.
pub fn function(name: &str, warm_ms: u64, init_ms: u64, memory_mb: u64) -> SimFunction {
    SimFunction::new(name, ms(warm_ms), ms(init_ms), memory_mb)
}

/// `(at_us, function index)` pairs, already in time order.
pub fn workload(functions: Vec<SimFunction>, arrivals: &[(u64, u32)]) -> Workload {
    Workload {
        functions,
        arrivals: arrivals
            .iter()
            .map(|&(at_us, function)| Arrival { at_us, function })
            .collect(),
    }
}

/// `n` Poisson arrivals at `rate_per_s` over 20 functions of mixed sizes, skewed popularity.
pub fn random_workload(n: usize, rate_per_s: f64, seed: u64) -> Workload {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let functions: Vec<SimFunction> = (0..20)
        .map(|i| {
            function(
                &format!("f{i}"),
                [5, 20, 80, 300][i % 4],
                [0, 50, 400][i % 3],
                128 + 64 * (i as u64 % 5),
            )
        })
        .collect();
    let mut t = 0.0;
    let arrivals: Vec<(u64, u32)> = (0..n)
        .map(|_| {
            t += -(1.0 - rng.gen::<f64>()).ln() / rate_per_s;
            // Zipf-like: low indices are popular.
            let f = ((rng.gen::<f64>().powi(3)) * 20.0) as u32;
            ((t * 1e6) as u64, f.min(19))
        })
        .collect();
    workload(functions, &arrivals)
}

/// A small cluster with the given balancing policy.
pub fn cluster(workers: usize, cpus: u32, kind: BalanceKind, seed: u64) -> SimConfig {
    SimConfig {
        workers,
        cpus,
        memory_mb: 2048,
        regulator: RegulatorConfig::Fixed(cpus),
        routing: Routing::seeded(kind, seed),
        ..SimConfig::default()
    }
}
