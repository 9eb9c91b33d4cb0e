//! Scripted-status tests of the policies: loads are set by hand, time is virtual.

use super::*;
use crate::time::{ms, secs};
use std::collections::{BTreeSet, HashMap};

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("worker-{i}")).collect()
}

/// A balancer with `n` workers at load `load`.
fn cluster(kind: BalanceKind, n: usize, load: f64) -> (Balancer, Vec<WorkerId>) {
    let mut b = Balancer::new(kind, BalanceParams::default()).unwrap();
    let ids: Vec<WorkerId> = names(n).iter().map(|name| b.join(0, name)).collect();
    set_all(&mut b, &ids, load);
    (b, ids)
}

fn set(b: &mut Balancer, w: WorkerId, load: f64) {
    b.report(
        0,
        w,
        WorkerLoad {
            load,
            ..Default::default()
        },
    );
}

fn set_all(b: &mut Balancer, ids: &[WorkerId], load: f64) {
    for w in ids {
        set(b, *w, load);
    }
}

fn run(d: Decision) -> (WorkerId, Placement) {
    match d {
        Decision::Run { worker, how } => (worker, how),
        other => panic!("expected a placement, got {other:?}"),
    }
}

/// The ring order of workers for `key`, independently of forwarding: the home, then the home
/// once that one has left, and so on (consistent hashing's successor).
fn ring_order(n: usize, key: FunctionKey) -> Vec<WorkerId> {
    let (mut ch, _) = cluster(BalanceKind::Ch, n, 0.0);
    let mut order = Vec::new();
    while let Some(h) = ch.home(key) {
        order.push(h);
        ch.leave(0, h);
    }
    order
}

fn key(i: usize) -> FunctionKey {
    FunctionKey::of(&format!("fn-{i}"))
}

#[test]
fn a_function_stays_on_its_home_worker_while_under_the_bound() {
    for kind in [BalanceKind::ChBl, BalanceKind::ChRlu, BalanceKind::KChRlu] {
        let (mut b, _) = cluster(kind, 8, 0.5);
        let mut homes = BTreeSet::new();
        for round in 0..20u64 {
            for i in 0..50 {
                let now = secs(10) * round + ms(i as u64);
                let home = b.home(key(i)).unwrap();
                homes.insert(home);
                assert_eq!(
                    run(b.route(now, key(i))),
                    (home, Placement::Home),
                    "{kind}: fn-{i} round {round}"
                );
            }
        }
        assert!(
            homes.len() >= 6,
            "{kind}: homes spread over the ring: {homes:?}"
        );
    }
}

#[test]
fn an_overloaded_home_forwards_along_the_ring() {
    for kind in [BalanceKind::ChBl, BalanceKind::ChRlu] {
        let (mut b, _) = cluster(kind, 8, 0.2);
        let f = key(7);
        let order = ring_order(8, f);
        set(&mut b, order[0], 3.0);
        assert_eq!(
            run(b.route(secs(1), f)),
            (order[1], Placement::Forwarded { hops: 1 }),
            "{kind}"
        );
        set(&mut b, order[1], 1.2); // at the bound is not under it
        assert_eq!(
            run(b.route(secs(100), f)),
            (order[2], Placement::Forwarded { hops: 2 }),
            "{kind}"
        );
        set(&mut b, order[0], 0.2);
        assert_eq!(
            run(b.route(secs(200), f)),
            (order[0], Placement::Home),
            "{kind}"
        );
    }
}

#[test]
fn popular_functions_spread_over_more_workers_than_unpopular_ones() {
    let (mut b, _) = cluster(BalanceKind::ChRlu, 8, 1.1);
    // 50 functions; function i arrives every (i + 1) × 20 ms.
    let period = |i: usize| ms(20) * (i as u64 + 1);
    let mut placed: HashMap<usize, BTreeSet<WorkerId>> = HashMap::new();
    for t in (0..ms(20_000)).step_by(ms(20) as usize) {
        for i in 0..50 {
            if t % period(i) == 0 {
                let (w, _) = run(b.route(t, key(i)));
                if t >= secs(5) {
                    placed.entry(i).or_default().insert(w);
                }
            }
        }
    }
    let spread = |range: std::ops::Range<usize>| {
        let n = range.len() as f64;
        range.map(|i| placed[&i].len() as f64).sum::<f64>() / n
    };
    let (popular, rare) = (spread(0..10), spread(10..50));
    assert!(
        b.is_popular(ms(20_000), key(0)) && !b.is_popular(ms(20_000), key(49)),
        "the top 20 % by IAT are popular"
    );
    assert!(
        placed[&0].len() >= 4,
        "the most frequent function spreads: {:?}",
        placed[&0]
    );
    assert_eq!(placed[&49].len(), 1, "the rarest stays home");
    assert!(
        popular > 2.0 * rare,
        "popular {popular} vs unpopular {rare} workers per function"
    );
}

#[test]
fn the_bound_scales_with_cold_over_warm_time_up_to_b_max() {
    let (mut b, ids) = cluster(BalanceKind::ChRlu, 8, 0.2);
    let (slow_start, plain, extreme, learned) = (key(1), key(2), key(3), key(4));
    let times = |warm_ms: u64, cold_ms: u64| FunctionInfo {
        priority: 0,
        warm_us: Some(ms(warm_ms)),
        cold_us: Some(ms(cold_ms)),
        memory_mb: 128,
    };
    b.register(0, slow_start, times(100, 400)); // bound min(4 × 1.2, 6) = 4.8
    b.register(0, plain, FunctionInfo::default()); // unknown times: bound b = 1.2
    b.register(0, extreme, times(1, 1_000)); // bound capped at b_max = 6
    b.register(0, learned, FunctionInfo::default());
    set_all(&mut b, &ids, 3.0);
    assert_eq!(run(b.route(secs(1), slow_start)).1, Placement::Home);
    assert_ne!(run(b.route(secs(1), plain)).1, Placement::Home);
    set_all(&mut b, &ids, 5.9);
    assert_eq!(run(b.route(secs(1), extreme)).1, Placement::Home);
    assert_ne!(run(b.route(secs(1), slow_start)).1, Placement::Home);
    set_all(&mut b, &ids, 6.1);
    let home = b.home(extreme).unwrap();
    let other = *ids.iter().find(|w| **w != home).unwrap();
    set(&mut b, other, 0.5);
    assert_ne!(
        run(b.route(secs(2), extreme)).0,
        home,
        "over b_max even for c/w = 1000"
    );
    // Times learned from results raise the bound the same way: c = init + exec = 500 ms,
    // w = exec = 100 ms, bound min(5 × 1.2, 6) = 6.
    set_all(&mut b, &ids, 3.0);
    let (w, how) = run(b.route(secs(10), learned));
    assert_ne!(how, Placement::Home);
    let cold = Finished::Cold {
        init_us: ms(400),
        exec_us: ms(100),
    };
    b.finished(secs(10), w, learned, cold);
    b.finished(secs(10), w, learned, Finished::Warm { exec_us: ms(100) });
    assert!((b.function(learned).unwrap().bound(1.2, 6.0) - 6.0).abs() < 1e-9);
    assert_eq!(b.load_bound(learned), Some(6.0));
    assert_eq!(run(b.route(secs(1_000), learned)).1, Placement::Home);
}

#[test]
fn an_exhausted_chain_goes_to_the_least_loaded_worker_then_is_rejected_over_b_max() {
    let f = key(11);
    let order = ring_order(8, f);
    let script = |b: &mut Balancer| {
        for (pos, w) in order.iter().enumerate() {
            let load = match pos {
                0..=3 => 2.0, // home + 3 forwards, all over b = 1.2
                4 => 1.0,     // the 5th on the ring: under the bound
                _ => 0.8,     // further on: under the bound and less loaded
            };
            set(b, *w, load);
        }
    };
    let (mut rlu, _) = cluster(BalanceKind::ChRlu, 8, 0.0);
    script(&mut rlu);
    let (w, how) = run(rlu.route(secs(1), f));
    assert_eq!(
        how,
        Placement::LeastLoaded,
        "max_chain_len = 3 forwards, then least-loaded"
    );
    assert!(order[5..].contains(&w));
    // Everything over b_max: CH-RLU rejects.
    for (i, w) in order.iter().enumerate() {
        set(&mut rlu, *w, 6.5 + i as f64);
    }
    assert_eq!(
        rlu.route(secs(2), f),
        Decision::Reject(Rejection::Overloaded {
            load: 6.5,
            b_max: 6.0
        })
    );
}

#[test]
fn priority_pools_are_sized_by_registrations_and_overflow_downwards_only() {
    let (mut b, ids) = cluster(BalanceKind::KChRlu, 6, 0.2);
    let info = |priority| FunctionInfo {
        priority,
        ..Default::default()
    };
    let (high, mid, low) = (key(100), key(101), key(102));
    b.register(0, high, info(10));
    b.register(0, key(103), info(10));
    b.register(0, key(104), info(10));
    b.register(0, mid, info(5));
    b.register(0, low, info(0));
    b.register(0, key(105), info(0));
    // 3 : 1 : 2 functions over 6 workers.
    let sizes: Vec<usize> = b.pools().iter().map(|p| p.members.len()).collect();
    assert_eq!(sizes, vec![3, 1, 2]);
    let levels: Vec<i32> = b.pools().iter().map(|p| p.level).collect();
    assert_eq!(levels, vec![10, 5, 0]);
    let members: Vec<BTreeSet<WorkerId>> = b
        .pools()
        .iter()
        .map(|p| p.members.iter().copied().collect())
        .collect();
    let pool_of = |w: WorkerId| members.iter().position(|m| m.contains(&w)).unwrap();
    let set_pool = |b: &mut Balancer, pool: usize, load: f64| {
        for w in &members[pool] {
            set(b, *w, load);
        }
    };
    let mut t = secs(1);
    let mut route = |b: &mut Balancer, k| {
        t += secs(100);
        run(b.route(t, k))
    };
    // Each function starts in its own pool.
    for (k, pool) in [(high, 0), (mid, 1), (low, 2)] {
        assert_eq!(pool_of(route(&mut b, k).0), pool);
    }
    // The high pool is full: high overflows to the next lower pool first…
    set_pool(&mut b, 0, 5.0);
    let (w, how) = route(&mut b, high);
    assert_eq!(
        (pool_of(w), how),
        (1, Placement::Overflow { pool: 1, hops: 0 })
    );
    // …then to the one after.
    set_pool(&mut b, 1, 5.0);
    let (w, how) = route(&mut b, high);
    assert_eq!(pool_of(w), 2);
    assert!(matches!(how, Placement::Overflow { pool: 2, .. }));
    // Everything full: the least-loaded worker of the last pool (the worker queues it).
    set_pool(&mut b, 2, 7.0);
    let last: Vec<WorkerId> = members[2].iter().copied().collect();
    set(&mut b, last[1], 6.5);
    assert_eq!(route(&mut b, high), (last[1], Placement::LeastLoaded));
    // A low-priority function never uses a higher pool, even an idle one.
    set_pool(&mut b, 0, 0.0);
    set_pool(&mut b, 1, 0.0);
    let (w, how) = route(&mut b, low);
    assert_eq!((pool_of(w), how), (2, Placement::LeastLoaded));
    // More low-priority functions: the low pool grows, moving only boundary workers.
    for i in 0..2 {
        b.register(0, key(200 + i), info(0));
    }
    let sizes: Vec<usize> = b.pools().iter().map(|p| p.members.len()).collect();
    assert_eq!(sizes, vec![2, 1, 3], "3 : 1 : 4 functions");
    let moved = ids
        .iter()
        .filter(|w| {
            let now = b
                .pools()
                .iter()
                .position(|p| p.members.contains(w))
                .unwrap();
            now != pool_of(**w)
        })
        .count();
    assert_eq!(moved, 2, "one worker per shifted boundary");
}

#[test]
fn a_leaving_worker_remaps_only_its_own_functions_and_rejoining_restores_them() {
    for kind in [BalanceKind::Ch, BalanceKind::ChRlu] {
        let (mut b, ids) = cluster(kind, 10, 0.0);
        let keys: Vec<FunctionKey> = (0..10_000).map(key).collect();
        let before: Vec<WorkerId> = keys.iter().map(|k| b.home(*k).unwrap()).collect();
        let gone = ids[3];
        assert!(b.leave(secs(1), gone));
        let mut moved = 0;
        for (k, old) in keys.iter().zip(&before) {
            let new = b.home(*k).unwrap();
            assert_ne!(new, gone);
            if *old == gone {
                moved += 1;
            } else {
                assert_eq!(
                    new, *old,
                    "{kind}: a function not on the leaving worker moved"
                );
            }
        }
        assert!(
            (500..1_600).contains(&moved),
            "{kind}: about a tenth moved: {moved}"
        );
        assert_eq!(
            b.join(secs(2), "worker-3"),
            gone,
            "a rejoining worker keeps its id"
        );
        let after: Vec<WorkerId> = keys.iter().map(|k| b.home(*k).unwrap()).collect();
        assert_eq!(after, before, "{kind}: rejoining restores every home");
    }
}

#[test]
fn simple_policies_round_robin_random_and_least_loaded() {
    let (mut rr, ids) = cluster(BalanceKind::RoundRobin, 3, 0.0);
    let got: Vec<WorkerId> = (0..6).map(|i| run(rr.route(i, key(0))).0).collect();
    assert_eq!(got, [ids[0], ids[1], ids[2], ids[0], ids[1], ids[2]]);

    let picks = |seed| {
        let p = BalanceParams {
            seed,
            ..Default::default()
        };
        let mut b = Balancer::new(BalanceKind::Random, p).unwrap();
        for n in names(4) {
            b.join(0, &n);
        }
        (0..200)
            .map(|i| run(b.route(i, key(0))).0)
            .collect::<Vec<_>>()
    };
    assert_eq!(picks(1), picks(1), "same seed, same choices");
    assert_ne!(picks(1), picks(2));
    assert_eq!(picks(1).iter().collect::<BTreeSet<_>>().len(), 4);

    let (mut ll, ids) = cluster(BalanceKind::LeastLoaded, 3, 1.0);
    set(&mut ll, ids[2], 0.4);
    assert_eq!(run(ll.route(0, key(0))).0, ids[2]);
    // Equal loads: the one with fewer invocations in flight from this balancer.
    set(&mut ll, ids[2], 1.0);
    let a = run(ll.route(1, key(0))).0;
    let b2 = run(ll.route(2, key(0))).0;
    assert_ne!(a, b2);
    ll.finished(3, a, key(0), Finished::Failed);
    assert_eq!(run(ll.route(4, key(0))).0, a);
}

#[test]
fn silent_workers_expire_and_an_empty_cluster_rejects() {
    let (mut b, ids) = cluster(BalanceKind::ChRlu, 3, 0.0);
    b.report(secs(5), ids[0], WorkerLoad::default());
    let gone = b.expire(secs(6), secs(3));
    assert_eq!(gone, vec![ids[1], ids[2]]);
    assert_eq!(b.workers().live(), &[ids[0]]);
    assert_eq!(run(b.route(secs(6), key(1))).0, ids[0]);
    b.leave(secs(7), ids[0]);
    assert_eq!(
        b.route(secs(7), key(1)),
        Decision::Reject(Rejection::NoWorkers)
    );
}

#[test]
fn the_same_events_give_the_same_decisions() {
    let script = || {
        let (mut b, ids) = cluster(BalanceKind::ChRlu, 16, 1.0);
        let mut out = Vec::new();
        for t in 0..5_000u64 {
            if t % 100 == 0 {
                set(
                    &mut b,
                    ids[(t / 100) as usize % 16],
                    0.5 + (t % 7) as f64 * 0.2,
                );
            }
            out.push(b.route(ms(t), key((t % 13) as usize)));
        }
        out
    };
    assert_eq!(script(), script());
}

#[test]
fn bad_parameters_and_names_are_refused() {
    let p = BalanceParams {
        b_max: 0.0,
        ..Default::default()
    };
    assert!(Balancer::new(BalanceKind::ChRlu, p).is_err());
    let p = BalanceParams {
        popular_pct: 120.0,
        ..Default::default()
    };
    assert!(Balancer::new(BalanceKind::ChRlu, p)
        .unwrap_err()
        .to_string()
        .contains("popular_pct"));
    let err = "chrlu".parse::<BalanceKind>().unwrap_err();
    assert!(err.contains("ch-rlu"), "{err}");
    for k in BalanceKind::ALL {
        assert_eq!(k.as_str().parse::<BalanceKind>().unwrap(), k);
    }
}

#[test]
fn ch_bl_forwards_at_most_max_chain_len_times_then_takes_the_least_loaded_worker() {
    let f = key(11);
    let order = ring_order(8, f);
    let (mut bl, _) = cluster(BalanceKind::ChBl, 8, 0.0);
    // Home and the next three on the ring over b = 1.2; the fifth under it; the rest lighter.
    for (pos, w) in order.iter().enumerate() {
        let load = match pos {
            0..=3 => 2.0,
            4 => 1.0,
            _ => 0.8,
        };
        set(&mut bl, *w, load);
    }
    // max_chain_len = 3 (paper §6.1, for CH-BL as for CH-RLU): home + 3 forwards are tried,
    // then the least-loaded worker, not the fifth one on the ring.
    let (w, how) = run(bl.route(secs(1), f));
    assert_eq!(how, Placement::LeastLoaded);
    assert!(order[5..].contains(&w), "{w:?} is not among the lightest");
    // Within the limit it still forwards along the ring.
    set(&mut bl, order[3], 1.0);
    assert_eq!(
        run(bl.route(secs(2), f)),
        (order[3], Placement::Forwarded { hops: 3 })
    );
    // A longer chain reaches further.
    let p = BalanceParams {
        max_chain_len: 4,
        ..Default::default()
    };
    let mut long = Balancer::new(BalanceKind::ChBl, p).unwrap();
    for n in names(8) {
        long.join(0, &n);
    }
    for (pos, w) in order.iter().enumerate() {
        set(&mut long, *w, if pos <= 3 { 2.0 } else { 1.0 });
    }
    assert_eq!(
        run(long.route(secs(1), f)),
        (order[4], Placement::Forwarded { hops: 4 })
    );
    // CH-BL has no b_max: with every worker over it, the least-loaded still takes it.
    for (i, w) in order.iter().enumerate() {
        set(&mut bl, *w, 7.0 + i as f64);
    }
    assert_eq!(
        run(bl.route(secs(3), f)),
        (order[0], Placement::LeastLoaded)
    );
}

#[test]
fn lower_priority_pools_run_with_a_higher_b_max_by_default() {
    let (mut b, _) = cluster(BalanceKind::KChRlu, 4, 0.2);
    let info = |priority| FunctionInfo {
        priority,
        warm_us: Some(ms(10)),
        cold_us: Some(ms(10_000)), // c/w = 1000: the bound is b_max itself
        memory_mb: 128,
    };
    let (high, low) = (key(1), key(2));
    b.register(0, high, info(1));
    b.register(0, low, info(0));
    let b_max: Vec<f64> = b.pools().iter().map(|p| p.b_max).collect();
    assert_eq!(b_max, vec![6.0, 8.0], "the paper's 6, then one step higher");
    assert_eq!(b.load_bound(high), Some(6.0));
    assert_eq!(b.load_bound(low), Some(8.0));
    // At load 7 everywhere a low-priority function stays home; a high one overflows.
    let members: Vec<Vec<WorkerId>> = b.pools().iter().map(|p| p.members.clone()).collect();
    for w in members.iter().flatten() {
        set(&mut b, *w, 7.0);
    }
    assert_eq!(run(b.route(secs(1), low)).1, Placement::Home);
    let (w, how) = run(b.route(secs(2), high));
    assert!(members[1].contains(&w), "{how:?}");
    assert!(matches!(how, Placement::Overflow { pool: 1, hops: 0 }));
    // Explicit bounds and the step are configurable; bad ones are refused.
    let p = BalanceParams {
        pool_b_max_step: 0.0,
        ..Default::default()
    };
    let mut flat = Balancer::new(BalanceKind::KChRlu, p).unwrap();
    for n in names(4) {
        flat.join(0, &n);
    }
    flat.register(0, high, info(1));
    flat.register(0, low, info(0));
    assert!(flat.pools().iter().all(|p| p.b_max == 6.0));
    for bad in [-1.0, f64::NAN, 1e9] {
        let p = BalanceParams {
            pool_b_max_step: bad,
            ..Default::default()
        };
        assert!(Balancer::new(BalanceKind::KChRlu, p).is_err(), "{bad}");
    }
}

/// An OpenWhisk balancer over `n` workers, each reporting `memory_mb` of sandbox memory.
fn openwhisk(n: usize, memory_mb: u64) -> (Balancer, Vec<WorkerId>) {
    let mut b = Balancer::new(BalanceKind::OpenWhisk, BalanceParams::default()).unwrap();
    let ids: Vec<WorkerId> = names(n).iter().map(|name| b.join(0, name)).collect();
    for w in &ids {
        b.report(
            0,
            *w,
            WorkerLoad {
                memory_mb,
                ..Default::default()
            },
        );
    }
    (b, ids)
}

#[test]
fn openwhisk_fills_the_home_then_probes_by_its_coprime_step_then_picks_at_random() {
    // 8 workers: steps 1, 3, 5, 7; 1 GiB each: four 256 MiB invocations fill one.
    let (mut b, ids) = openwhisk(8, 1024);
    let f = key(5);
    b.register(
        0,
        f,
        FunctionInfo {
            memory_mb: 256,
            ..Default::default()
        },
    );
    let home = (f.0 % 8) as usize;
    let step = [1, 3, 5, 7][(f.0 % 4) as usize];
    assert_eq!(b.home(f), Some(ids[home]));
    let mut placed = Vec::new();
    for i in 0..32 {
        placed.push(run(b.route(secs(1) + i, f)));
    }
    // Four on each worker, in probe order: home, home + step, home + 2·step, …
    for (probe, chunk) in placed.chunks(4).enumerate() {
        let want = ids[(home + probe * step) % 8];
        let how = if probe == 0 {
            Placement::Home
        } else {
            Placement::Forwarded { hops: probe as u32 }
        };
        assert!(
            chunk.iter().all(|p| *p == (want, how)),
            "probe {probe}: {chunk:?}"
        );
    }
    // Every slot taken: a random live worker, over its memory.
    let mut random = BTreeSet::new();
    for i in 0..64 {
        let (w, how) = run(b.route(secs(2) + i, f));
        assert_eq!(how, Placement::Random);
        random.insert(w);
    }
    assert!(
        random.len() >= 6,
        "random over the live workers: {random:?}"
    );
    // Reported loads play no part; finished invocations free their slots.
    let home_w = ids[home];
    set(&mut b, home_w, 50.0);
    b.finished(secs(3), home_w, f, Finished::Warm { exec_us: ms(5) });
    assert_eq!(run(b.route(secs(3), f)), (home_w, Placement::Home));
}

#[test]
fn openwhisk_skips_down_workers_without_moving_homes_and_sizes_unknown_functions() {
    let (mut b, ids) = openwhisk(6, 512);
    let f = key(9);
    let home = ids[(f.0 % 6) as usize];
    b.leave(secs(1), home);
    let (w, how) = run(b.route(secs(1), f));
    assert_ne!(w, home);
    assert!(matches!(how, Placement::Forwarded { .. }), "{how:?}");
    assert_eq!(
        b.home(f),
        Some(home),
        "the home is the invoker index, up or not"
    );
    b.finished(secs(1), w, f, Finished::Failed);
    b.join(secs(2), b.workers().name(home).to_string().as_str());
    b.report(
        secs(2),
        home,
        WorkerLoad {
            memory_mb: 512,
            ..Default::default()
        },
    );
    // An unregistered function takes OpenWhisk's default 256 MiB: two fill 512 MiB.
    let got: Vec<(WorkerId, Placement)> = (0..3).map(|i| run(b.route(secs(3) + i, f))).collect();
    assert_eq!(got[0], (home, Placement::Home));
    assert_eq!(got[1], (home, Placement::Home));
    assert_ne!(got[2].0, home);
    // A worker that never reported its memory has unlimited slots.
    let mut unknown = Balancer::new(BalanceKind::OpenWhisk, BalanceParams::default()).unwrap();
    let ids: Vec<WorkerId> = names(3).iter().map(|n| unknown.join(0, n)).collect();
    let home = ids[(f.0 % 3) as usize];
    for i in 0..100 {
        assert_eq!(run(unknown.route(i, f)), (home, Placement::Home));
    }
}
