//! Closed-loop clients: each waits for its invocation's end (and its think time) before the
//! next, so N clients never have more than N invocations in flight; runs are deterministic.

mod common;

use hearth_core::balance::BalanceKind;
use hearth_core::time::{ms, secs};
use hearth_core::{KeepAliveConfig, KeepAliveKind, Micros, RegulatorConfig};
use hearth_sim::closed_loop::REFUSED_RETRY_US;
use hearth_sim::{simulate, ClosedLoop, Collect, End, Mix, Record, SimConfig, Workload};

/// Six functions of mixed sizes, no arrivals (the clients make them).
fn functions() -> Workload {
    common::workload(
        (0..6)
            .map(|i| common::function(&format!("f{i}"), [10, 40, 150][i % 3], [0, 80][i % 2], 128))
            .collect(),
        &[],
    )
}

fn config(workers: usize, clients: ClosedLoop) -> SimConfig {
    let mut c = common::cluster(workers, 2, BalanceKind::ChRlu, 7);
    c.regulator = RegulatorConfig::Fixed(u32::MAX);
    c.keepalive = KeepAliveConfig::new(KeepAliveKind::Gdsf);
    c.clients = Some(clients);
    c
}

fn run(w: &Workload, c: &SimConfig) -> Vec<Record> {
    let mut sink = Collect::default();
    let stats = simulate(w, c, &mut sink).unwrap();
    assert_eq!(stats.invocations, sink.records.len() as u64);
    let mut r = sink.records;
    r.sort_by_key(|r| r.id);
    r
}

/// Most invocations in flight at once (an end at t frees its slot before a start at t).
fn most_in_flight(records: &[Record], from: Micros, to: Micros) -> usize {
    let mut edges: Vec<(Micros, i32)> = records
        .iter()
        .flat_map(|r| [(r.scheduled_us, 1), (r.end_us, -1)])
        .collect();
    edges.sort();
    let (mut n, mut most) = (0i32, 0i32);
    for (t, d) in edges {
        n += d;
        if (from..to).contains(&t) {
            most = most.max(n);
        }
    }
    most as usize
}

#[test]
fn one_client_invokes_again_exactly_when_its_call_ends() {
    let w = functions();
    let weights = vec![1.0; 6];
    let c = config(2, ClosedLoop::fixed(1, weights.clone(), 0, 0, secs(20), 3));
    let r = run(&w, &c);
    assert!(r.len() > 50, "{} calls", r.len());
    assert_eq!(r[0].scheduled_us, 0);
    for pair in r.windows(2) {
        assert_eq!(pair[1].scheduled_us, pair[0].end_us, "{pair:?}");
    }
    assert_eq!(most_in_flight(&r, 0, Micros::MAX), 1);
    assert!(r.last().unwrap().scheduled_us < secs(20));
    assert!(r.iter().all(|r| matches!(r.end, End::Done { .. })));

    // With a think time of exactly 30 ms, the next call goes 30 ms after the end.
    let c = config(
        2,
        ClosedLoop::fixed(1, weights.clone(), ms(30), ms(30), secs(20), 3),
    );
    let r = run(&w, &c);
    for pair in r.windows(2) {
        assert_eq!(pair[1].scheduled_us, pair[0].end_us + ms(30));
    }
    // A think range: every pause inside it, and not all the same.
    let c = config(2, ClosedLoop::fixed(1, weights, 0, ms(100), secs(20), 3));
    let r = run(&w, &c);
    let pauses: Vec<Micros> = r
        .windows(2)
        .map(|p| p[1].scheduled_us - p[0].end_us)
        .collect();
    assert!(pauses.iter().all(|p| *p <= ms(100)));
    assert!(pauses.iter().any(|p| *p > ms(50)) && pauses.iter().any(|p| *p < ms(50)));
}

#[test]
fn n_clients_keep_at_most_n_calls_in_flight_and_reach_n() {
    let w = functions();
    let c = config(
        3,
        ClosedLoop::fixed(5, vec![1.0; 6], 0, ms(20), secs(30), 9),
    );
    let r = run(&w, &c);
    assert_eq!(most_in_flight(&r, 0, Micros::MAX), 5);
    // At time 0 all five invoke at once.
    assert_eq!(r.iter().filter(|r| r.scheduled_us == 0).count(), 5);
}

#[test]
fn a_client_schedule_adds_clients_at_once_and_removed_ones_finish_and_stop() {
    let w = functions();
    let mut spec = ClosedLoop::fixed(1, vec![1.0; 6], 0, 0, secs(30), 4);
    spec.clients = vec![(0, 1), (secs(10), 4), (secs(20), 2)];
    let r = run(&w, &config(3, spec));
    assert_eq!(most_in_flight(&r, 0, secs(10)), 1);
    assert_eq!(r.iter().filter(|r| r.scheduled_us == secs(10)).count(), 3);
    assert_eq!(most_in_flight(&r, secs(10), secs(20)), 4);
    // The longest call is under a second: from then on only the two remaining clients invoke.
    assert_eq!(most_in_flight(&r, secs(21), Micros::MAX), 2);
    assert!(r.iter().all(|r| r.end_us < secs(32)));
}

#[test]
fn the_weights_in_force_pick_the_function() {
    let w = functions();
    let mut spec = ClosedLoop::fixed(3, vec![1.0; 6], 0, ms(5), secs(20), 5);
    let mut only_two = vec![0.0; 6];
    only_two[2] = 1.0;
    spec.mixes.push(Mix {
        from_us: secs(10),
        weights: only_two,
    });
    let r = run(&w, &config(2, spec));
    let before: std::collections::BTreeSet<u32> = r
        .iter()
        .filter(|r| r.scheduled_us < secs(10))
        .map(|r| r.function)
        .collect();
    assert_eq!(before.len(), 6, "{before:?}");
    let after: Vec<u32> = r
        .iter()
        .filter(|r| r.scheduled_us >= secs(10))
        .map(|r| r.function)
        .collect();
    assert!(after.len() > 20);
    assert!(after.iter().all(|f| *f == 2), "{after:?}");
}

#[test]
fn same_seed_same_records_another_seed_others() {
    let w = functions();
    let spec = |seed| {
        ClosedLoop::fixed(
            8,
            vec![5.0, 1.0, 1.0, 3.0, 1.0, 2.0],
            0,
            ms(50),
            secs(15),
            seed,
        )
    };
    let a = run(&w, &config(3, spec(11)));
    let b = run(&w, &config(3, spec(11)));
    assert!(a.len() > 100);
    assert_eq!(a, b);
    let other = run(&w, &config(3, spec(12)));
    assert_ne!(a, other);
}

#[test]
fn refused_calls_are_retried_after_a_round_trip_not_at_the_same_instant() {
    // A function larger than the workers' memory: the worker refuses every call at once.
    let w = common::workload(vec![common::function("big", 10, 0, 4096)], &[]);
    let r = run(
        &w,
        &config(1, ClosedLoop::fixed(1, vec![1.0], 0, 0, secs(1), 1)),
    );
    assert!(r.iter().all(|r| matches!(r.end, End::Dropped(_))));
    assert_eq!(r.len() as u64, secs(1) / REFUSED_RETRY_US);
    for pair in r.windows(2) {
        assert_eq!(
            pair[1].scheduled_us - pair[0].scheduled_us,
            REFUSED_RETRY_US
        );
    }
}

#[test]
fn a_closed_loop_refuses_arrivals_and_bad_weights() {
    let mut w = functions();
    let spec = ClosedLoop::fixed(1, vec![1.0; 6], 0, 0, secs(1), 1);
    let mut with_arrivals = w.clone();
    with_arrivals.arrivals = common::workload(vec![], &[(0, 0)]).arrivals;
    let mut sink = Collect::default();
    let err = simulate(&with_arrivals, &config(1, spec.clone()), &mut sink).unwrap_err();
    assert!(err.to_string().contains("no arrivals"), "{err}");
    w.functions.pop();
    let err = simulate(&w, &config(1, spec.clone()), &mut sink).unwrap_err();
    assert!(err.to_string().contains("one weight per function"), "{err}");
    let w = functions();
    let mut zero = spec.clone();
    zero.mixes[0].weights = vec![0.0; 6];
    assert!(simulate(&w, &config(1, zero), &mut sink).is_err());
    let mut nan = spec;
    nan.mixes[0].weights[0] = f64::NAN;
    assert!(simulate(&w, &config(1, nan), &mut sink).is_err());
}
