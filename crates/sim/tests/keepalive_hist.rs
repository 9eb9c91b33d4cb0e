//! HIST (thesis ch. 3.6.1) on regular functions whose sandboxes take long to start: the
//! pre-warm must make the sandbox ready by the head of the window, counted from the arrival.

mod common;

use common::{function, workload};
use hearth_core::balance::BalanceKind;
use hearth_core::time::secs;
use hearth_core::{KeepAliveConfig, KeepAliveKind, RegulatorConfig};
use hearth_sim::{simulate, Collect, SimConfig, SimStats, Workload};

fn one_server(kind: KeepAliveKind) -> SimConfig {
    SimConfig {
        workers: 1,
        cpus: 64,
        memory_mb: 4096,
        free_buffer_mb: 0,
        regulator: RegulatorConfig::Fixed(u32::MAX),
        keepalive: KeepAliveConfig::new(kind),
        ..common::cluster(1, 64, BalanceKind::RoundRobin, 1)
    }
}

/// `n` arrivals of function 0 every `every_s` seconds.
fn regular(warm_ms: u64, init_ms: u64, every_s: u64, n: u64) -> Workload {
    let arrivals: Vec<(u64, u32)> = (0..n).map(|i| (secs(i * every_s), 0)).collect();
    workload(vec![function("f", warm_ms, init_ms, 256)], &arrivals)
}

fn run(w: &Workload, kind: KeepAliveKind) -> SimStats {
    simulate(w, &one_server(kind), &mut Collect::default()).unwrap()
}

#[test]
fn a_function_whose_init_outlasts_the_prewarm_lead_is_kept_warm() {
    // Every minute, 100 ms of work, 120 s to start: the pre-warm window (0.9 minute after the
    // arrival) leaves no room to unload and start again. Unloading after every run made every
    // invocation a cold start.
    let w = regular(100, 120_000, 60, 200);
    let ttl = run(&w, KeepAliveKind::Ttl);
    let hist = run(&w, KeepAliveKind::Hist);
    assert_eq!(hist.completed, 200);
    assert!(ttl.cold <= 3, "ttl: {ttl:?}");
    assert!(
        hist.cold <= ttl.cold + 2,
        "hist {} cold starts against ttl's {}",
        hist.cold,
        ttl.cold
    );
}

#[test]
fn a_long_running_function_is_prewarmed_before_its_next_arrival() {
    // Every 5 minutes, 60 s of work, 10 s to start. The gaps are arrival to arrival, so the
    // pre-warm (0.9 × 5 min = 270 s) counts from the arrival: started at +260 s, ready at
    // +270 s. Counted from the end of the run it came 60 s after the next arrival.
    let w = regular(60_000, 10_000, 300, 60);
    let hist = run(&w, KeepAliveKind::Hist);
    assert_eq!(hist.completed, 60);
    // The first arrivals are cold while the histogram fills (min_samples = 3).
    assert!(hist.cold <= 4, "{hist:?}");
}
