//! Elastic provisioning in the simulator: each worker's budget follows the core's elastic
//! controller, the same one the worker runs, and a cut never costs a running invocation.

use hearth_core::provision::{CurveSource, ElasticConfig, HitRatioCurve, Sampler};
use hearth_core::time::secs;
use hearth_core::{KeepAliveConfig, KeepAliveKind, RegulatorConfig};
use hearth_sim::workload::Arrival;
use hearth_sim::{simulate, Collect, End, SimConfig, SimElastic, SimFunction, Workload};

/// A busy hour then a quiet one: twenty 128 MiB functions in turn every 50 ms, then two.
fn day() -> Workload {
    let functions: Vec<SimFunction> = (0..20)
        .map(|i| SimFunction::new(&format!("f{i}"), 5_000, 100_000, 128))
        .collect();
    let mut arrivals = Vec::new();
    let mut t = 0;
    let mut i = 0u32;
    while t < secs(7200) {
        let n = if t < secs(3600) { 20 } else { 2 };
        arrivals.push(Arrival {
            at_us: t,
            function: i % n,
        });
        i += 1;
        t += 50_000;
    }
    Workload {
        functions,
        arrivals,
    }
}

fn config(w: &Workload, elastic: bool) -> SimConfig {
    let curve = HitRatioCurve::from_trace(
        w.arrivals
            .iter()
            .map(|a| (&*w.functions[a.function as usize].name, 128)),
        Sampler::all(),
    );
    SimConfig {
        workers: 1,
        cpus: 64,
        memory_mb: 8192,
        free_buffer_mb: 0,
        regulator: RegulatorConfig::Fixed(64),
        keepalive: KeepAliveConfig::new(KeepAliveKind::Lru),
        elastic: elastic.then(|| SimElastic {
            config: ElasticConfig {
                interval_us: secs(300),
                smoothing: 1.0,
                ..ElasticConfig::new(0.05, 256, 8192)
            },
            curve: CurveSource::Fixed(curve),
        }),
        ..SimConfig::default()
    }
}

#[test]
fn the_budget_follows_the_load_and_no_invocation_is_lost() {
    let w = day();
    let mut sink = Collect::default();
    let stats = simulate(&w, &config(&w, true), &mut sink).unwrap();
    assert_eq!(stats.completed, w.arrivals.len() as u64);
    assert_eq!(stats.dropped, 0);
    assert!(sink
        .records
        .iter()
        .all(|r| matches!(r.end, End::Done { .. })));
    // It starts at 8 GiB and, once an interval passes without misses, comes down to the
    // working set the trace's curve shows (20 × 128 MiB: the curve is of the whole trace, so
    // the quiet hour's two functions do not change it; the thesis assumes as much).
    let b = &stats.budgets;
    assert_eq!(b[0], (0, 0, 8192));
    assert_eq!(b[1..], [(secs(600), 0, 2560)], "{b:?}");
    // Few cold starts beyond the first of each function: the cuts followed the working set.
    let fixed = simulate(&w, &config(&w, false), &mut Collect::default()).unwrap();
    assert_eq!(fixed.cold, 20);
    assert!(stats.cold < 200, "{} cold starts", stats.cold);
    assert!(fixed.budgets.is_empty());
}
