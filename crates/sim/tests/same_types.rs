//! The simulator drives the very policy objects the real worker and controller hold: a
//! compile-time check (this file does not compile if the types differ).

mod common;

use hearth_core::balance::BalanceKind;
use hearth_sim::router::Router;
use hearth_sim::{Collect, Simulation};

/// Accepts only the worker's engine type.
fn worker_engine(e: &hearth_worker::driver::Engine) -> usize {
    e.queue_length()
}

/// Accepts only the controller's policy type.
fn controller_policy(b: &hearth_controller::driver::RoutingPolicy) -> usize {
    b.workers().live().len()
}

#[test]
fn the_simulator_holds_the_workers_engine_and_the_controllers_balancer() {
    let w = common::random_workload(10, 10.0, 1);
    let mut sink = Collect::default();
    let sim = Simulation::new(&w, common::cluster(3, 2, BalanceKind::ChRlu, 1), &mut sink).unwrap();
    assert_eq!(worker_engine(&sim.workers()[0].engine), 0);
    let Router::Balancer { balancer, .. } = sim.router() else {
        panic!("a balancer policy");
    };
    assert_eq!(controller_policy(balancer), 3);
}
