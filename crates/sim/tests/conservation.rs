//! Every invocation of the workload ends exactly once, completed or dropped, whatever the
//! policies and however overloaded the cluster.

mod common;

use hearth_core::balance::{BalanceKind, BalanceParams};
use hearth_core::{AimdConfig, KeepAliveConfig, KeepAliveKind, QueueDiscipline, RegulatorConfig};
use hearth_sim::{simulate, Collect, End, Routing, SimConfig};

fn check(config: &SimConfig, w: &hearth_sim::Workload) -> (u64, u64) {
    let mut out = Collect::default();
    let stats = simulate(w, config, &mut out).unwrap();
    let mut seen = vec![0u32; w.arrivals.len()];
    for r in &out.records {
        seen[r.id as usize] += 1;
        let a = w.arrivals[r.id as usize];
        assert_eq!((r.scheduled_us, r.function), (a.at_us, a.function));
        assert!(r.end_us >= r.scheduled_us);
        if let End::Done {
            queue_us,
            init_us,
            exec_us,
            ..
        } = r.end
        {
            let f = w.function(r.function);
            assert_eq!(queue_us + init_us + exec_us, r.e2e_us(), "{r:?}");
            assert!(exec_us >= f.warm_us, "processor sharing only slows: {r:?}");
        }
    }
    assert!(seen.iter().all(|n| *n == 1), "each invocation ends once");
    assert_eq!(
        stats.completed + stats.dropped + stats.timed_out,
        w.arrivals.len() as u64
    );
    assert_eq!(stats.invocations, w.arrivals.len() as u64);
    (stats.completed, stats.dropped)
}

#[test]
fn every_invocation_ends_once_under_every_policy() {
    let w = common::random_workload(3000, 400.0, 7);
    for kind in KeepAliveKind::ALL {
        for queue in QueueDiscipline::ALL {
            let mut c = common::cluster(3, 2, BalanceKind::ChRlu, 3);
            c.memory_mb = 1024;
            c.keepalive = KeepAliveConfig::new(kind);
            c.queue = queue;
            check(&c, &w);
        }
    }
    for kind in BalanceKind::ALL {
        check(&common::cluster(4, 2, kind, 5), &w);
    }
    let mut greedy = common::cluster(4, 2, BalanceKind::ChRlu, 5);
    greedy.routing = Routing::Greedy;
    check(&greedy, &w);
}

#[test]
fn overload_drops_at_the_balancer_and_the_worker_and_still_conserves() {
    let w = common::random_workload(3000, 2000.0, 11);
    // A tight queue and little memory: workers refuse.
    let mut c = common::cluster(2, 1, BalanceKind::LeastLoaded, 1);
    c.max_queue = 5;
    c.memory_mb = 600;
    c.free_buffer_mb = 0;
    let (_, dropped) = check(&c, &w);
    assert!(dropped > 0, "the workers refused some");
    // A low b_max: CH-RLU refuses at the balancer once the load average (sampled every 5 s)
    // has risen, so this workload lasts 30 s.
    let w = common::random_workload(3000, 100.0, 11);
    let mut c = common::cluster(2, 1, BalanceKind::ChRlu, 1);
    c.routing = Routing::Balancer(
        BalanceKind::ChRlu,
        BalanceParams {
            b: 0.1,
            b_max: 0.2,
            ..BalanceParams::default()
        },
    );
    c.status_interval_us = 100_000;
    let (_, dropped) = check(&c, &w);
    assert!(dropped > 0, "the balancer refused some");
    // AIMD and a bypass.
    let mut c = common::cluster(2, 2, BalanceKind::ChBl, 1);
    c.regulator = RegulatorConfig::Aimd(AimdConfig::default());
    c.bypass.threshold_us = 10_000;
    check(&c, &w);
}
