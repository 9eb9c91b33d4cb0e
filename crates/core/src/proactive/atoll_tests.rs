//! Tests of the Atoll balancer: what each rung of the ladder does, routing inside a group,
//! allocation from arrivals, soft against instant eviction, and scale-out over groups.

use super::*;
use std::collections::BTreeMap;

const F: &str = "resize";
const MS: Micros = 1_000;
const SEC: Micros = 1_000_000;

fn spec() -> FunctionSpec {
    FunctionSpec {
        memory_mb: 128,
        deadline_us: Some(50 * MS),
        setup_us: Some(100 * MS),
        exec_us: Some(10 * MS),
    }
}

/// `groups` groups of `size` workers (ids 0..), each with 4 CPUs and a 4 GiB proactive pool.
fn atoll(ladder: Ladder, size: u32, groups: u32) -> Atoll {
    let config = AtollConfig {
        ladder,
        group_size: size,
        ..AtollConfig::default()
    };
    let mut a = Atoll::new(config).unwrap();
    for w in 0..size * groups {
        a.add_worker(w, 4, 4096);
    }
    a.register(F, spec());
    a
}

/// Routes `rate` requests per second of `F` over [from, to), each finishing at once with
/// `queue_us` of queueing, and ticks every 100 ms, confirming every `Create` as ready at once;
/// returns the commands and the workers used.
fn drive(
    a: &mut Atoll,
    rate: u64,
    from: Micros,
    to: Micros,
    queue_us: Micros,
) -> (Vec<Command>, BTreeMap<WorkerId, u32>) {
    let mut commands = Vec::new();
    let mut used = BTreeMap::new();
    let gap = SEC / rate;
    let mut t = from;
    while t < to {
        commands.extend(tick_ready(a, t));
        let r = a.route(t, F).unwrap();
        *used.entry(r.worker).or_insert(0) += 1;
        let outcome = Outcome {
            queue_us,
            init_us: None,
            exec_us: Some(10 * MS),
        };
        a.finished(t, r.worker, F, outcome);
        t += gap;
    }
    commands.extend(tick_ready(a, to));
    (commands, used)
}

/// Ticks and confirms the creations as ready.
fn tick_ready(a: &mut Atoll, now: Micros) -> Vec<Command> {
    let commands = a.tick(now);
    for c in &commands {
        if let AllocAction::Create { worker, function } = &c.action {
            a.on_ready(*worker, function);
        }
    }
    commands
}

fn count(commands: &[Command], pick: impl Fn(&AllocAction) -> bool) -> usize {
    commands.iter().filter(|c| pick(&c.action)).count()
}

fn is_create(a: &AllocAction) -> bool {
    matches!(a, AllocAction::Create { .. })
}

#[test]
fn the_ladder_names_each_rung_and_what_it_turns_on() {
    for l in Ladder::ALL {
        assert_eq!(Ladder::parse(l.as_str()), Some(l));
    }
    assert_eq!(Ladder::parse("atol"), None);
    assert!(!Ladder::Gfr.proactive() && !Ladder::Gdr.proactive());
    assert!(Ladder::Gdpi.proactive() && Ladder::Atoll.proactive() && Ladder::DAtoll.proactive());
    assert_eq!(Ladder::Gfr.queue(), QueueDiscipline::Fcfs);
    assert_eq!(Ladder::Gdr.queue(), QueueDiscipline::Srsf);
    assert_eq!(Ladder::Gdpi.eviction(), EvictionMode::Instant);
    assert_eq!(Ladder::Atoll.eviction(), EvictionMode::Lazy);
    assert!(!Ladder::DAtoll.global_view() && Ladder::Atoll.global_view());
}

#[test]
fn bad_settings_are_refused() {
    let bad = |c: AtollConfig| Atoll::new(c).unwrap_err();
    assert_eq!(
        bad(AtollConfig {
            group_size: 0,
            ..AtollConfig::default()
        }),
        AtollError::GroupSize(0)
    );
    assert_eq!(
        bad(AtollConfig {
            interval_us: 10,
            ..AtollConfig::default()
        }),
        AtollError::Interval(10)
    );
    let mut c = AtollConfig::default();
    c.estimator.quantile = 1.0;
    assert!(matches!(bad(c), AtollError::Estimator(_)));
}

#[test]
fn workers_fill_groups_in_join_order_and_an_empty_group_leaves() {
    let mut a = atoll(Ladder::Atoll, 2, 2);
    assert_eq!(a.group_count(), 2);
    assert_eq!(a.group_of(0), a.group_of(1));
    assert_ne!(a.group_of(1), a.group_of(2));
    assert_eq!(
        a.add_worker(4, 4, 1024),
        2,
        "a fifth worker opens a third group"
    );
    assert!(a.remove_worker(4));
    assert_eq!(a.group_count(), 2);
    assert!(!a.remove_worker(4));
    for _ in 0..100 {
        let r = a.route(0, F).unwrap();
        assert_ne!(r.worker, 4);
    }
}

#[test]
fn reactive_rungs_allocate_nothing_and_spread_by_load() {
    for ladder in [Ladder::Gfr, Ladder::Gdr] {
        let mut a = atoll(ladder, 4, 1);
        let (commands, _) = drive(&mut a, 200, 0, SEC, 0);
        assert!(commands.is_empty(), "{ladder:?}: {commands:?}");
        // Requests in flight: each goes to the least loaded worker.
        let workers: Vec<WorkerId> = (0..8).map(|_| a.route(SEC, F).unwrap().worker).collect();
        let mut per = BTreeMap::new();
        for w in workers {
            *per.entry(w).or_insert(0) += 1;
        }
        assert_eq!(per.values().copied().collect::<Vec<u32>>(), [2, 2, 2, 2]);
    }
}

#[test]
fn arrivals_become_proactive_sandboxes_spread_evenly() {
    let mut a = atoll(Ladder::Atoll, 4, 1);
    let (commands, _) = drive(&mut a, 200, 0, SEC, 0);
    // 200/s over a set-up time of 100 ms: 20 expected, the 0.99 quantile of Poisson(20) is 31.
    let creates = count(&commands, is_create);
    assert_eq!(creates, 31, "{commands:?}");
    assert_eq!(a.sandboxes(F), (31, 0));
    let mut per = BTreeMap::new();
    for c in &commands {
        assert_eq!(c.memory_mb, 128);
        *per.entry(c.worker).or_insert(0u32) += 1;
    }
    let (lo, hi) = (per.values().min().unwrap(), per.values().max().unwrap());
    assert!(hi - lo <= 1, "even placement: {per:?}");
    assert_eq!(a.stats().creates, 31);
}

/// `workers` workers in one group and a function set up in 1 ms, driven (each request ending
/// at once) until it has its single proactive sandbox; returns the time reached.
fn one_sandbox(ladder: Ladder, workers: u32) -> (Atoll, Micros) {
    let mut a = atoll(ladder, workers, 1);
    a.register(
        F,
        FunctionSpec {
            setup_us: Some(MS),
            exec_us: Some(MS),
            ..spec()
        },
    );
    let mut t = 0;
    while a.sandboxes(F).0 == 0 {
        let r = a.route(t, F).unwrap();
        a.finished(t, r.worker, F, Outcome::default());
        t += 20 * MS;
        tick_ready(&mut a, t);
    }
    assert_eq!(a.sandboxes(F), (1, 0));
    (a, t)
}

#[test]
fn a_request_goes_where_a_proactive_sandbox_is_free() {
    let (mut a, t) = one_sandbox(Ladder::Atoll, 4);
    let holder = (0..4).find(|w| a.sandboxes_on(*w, F).0 > 0).unwrap();
    let r = a.route(t, F).unwrap();
    assert_eq!((r.worker, r.free_sandbox), (holder, true));
    // Its sandbox is claimed now: the next request goes to a less loaded worker.
    let r = a.route(t, F).unwrap();
    assert!(!r.free_sandbox);
    assert_ne!(r.worker, holder);
    assert_eq!(a.stats().routed_to_free, 1);
}

#[test]
fn d_atoll_sees_two_random_workers_only() {
    // One free sandbox among 8 workers: the global view always finds it, two random picks
    // find it about a quarter of the time (1 − (7/8)²).
    let found = |ladder: Ladder| {
        let (mut a, t) = one_sandbox(ladder, 8);
        let mut hits = 0;
        for _ in 0..400 {
            let r = a.route(t, F).unwrap();
            hits += u32::from(r.free_sandbox);
            a.finished(t, r.worker, F, Outcome::default());
        }
        hits
    };
    assert_eq!(found(Ladder::Atoll), 400);
    let d = found(Ladder::DAtoll);
    assert!(
        (60..=150).contains(&d),
        "d-atoll found a free sandbox {d} times"
    );
}

#[test]
fn a_drop_in_demand_soft_evicts_under_atoll_and_destroys_under_gdpi() {
    for (ladder, soft) in [(Ladder::Atoll, true), (Ladder::Gdpi, false)] {
        let mut a = atoll(ladder, 2, 1);
        drive(&mut a, 200, 0, SEC, 0);
        let before = a.sandboxes(F).0;
        // Demand falls to 20/s.
        let (commands, _) = drive(&mut a, 20, SEC, 3 * SEC, 0);
        let softs = count(&commands, |x| matches!(x, AllocAction::SoftEvict { .. }));
        let evicts = count(&commands, |x| matches!(x, AllocAction::Evict { .. }));
        let (active, held) = a.sandboxes(F);
        assert!(active < before / 2, "{ladder:?}: {active} of {before}");
        if soft {
            assert_eq!((softs as u32, evicts), (before - active, 0));
            assert_eq!(held, before - active, "kept, soft-evicted");
        } else {
            assert_eq!((softs, evicts as u32), (0, before - active));
            assert_eq!(held, 0);
        }
        // Demand comes back: Atoll un-marks at no cost, GDPI creates anew.
        let (commands, _) = drive(&mut a, 200, 3 * SEC, 4 * SEC, 0);
        let unmarks = count(&commands, |x| matches!(x, AllocAction::Unmark { .. }));
        let creates = count(&commands, is_create);
        if soft {
            assert!(
                unmarks > 0 && creates == 0,
                "{unmarks} unmarks, {creates} creates"
            );
        } else {
            assert!(
                unmarks == 0 && creates > 0,
                "{unmarks} unmarks, {creates} creates"
            );
        }
    }
}

#[test]
fn queueing_past_the_slack_scales_out_to_the_next_group_which_ramps_up_gradually() {
    // Two groups of one worker. Returns the new group's share of 1000 requests right after the
    // scale-out, and again once its sandboxes are ready.
    let shares = |mode: ScaleOutMode| {
        let config = AtollConfig {
            scale_out: mode,
            ..AtollConfig::default()
        };
        let mut a = Atoll::new(config).unwrap();
        for w in 0..2 {
            a.add_worker(w, 4, 4096);
        }
        a.register(F, spec());
        // A second of 200/s without queueing sets up the home's sandboxes; then queueing 30 ms
        // against a slack of 40 ms (metric 0.75 > 0.3) scales out.
        drive(&mut a, 200, 0, SEC, 0);
        assert_eq!(a.stats().scale_outs, 0);
        let mut t = SEC;
        let mut last = Vec::new();
        while a.stats().scale_outs == 0 {
            assert!(t < 3 * SEC, "no scale-out");
            last = a.tick(t);
            if a.stats().scale_outs > 0 {
                break;
            }
            for c in &last {
                if let AllocAction::Create { worker, function } = &c.action {
                    a.on_ready(*worker, function);
                }
            }
            let r = a.route(t, F).unwrap();
            let slow = Outcome {
                queue_us: 30 * MS,
                ..Outcome::default()
            };
            a.finished(t, r.worker, F, slow);
            t += 5 * MS;
        }
        let (active, _) = a.groups_of(F);
        assert_eq!(active.len(), 2);
        let (home, new) = (active[0], active[1]);
        let home_count = a.sandboxes_on(home, F).0;
        assert!(home_count > 10, "{home_count}");
        // Told to allocate the average, counting itself.
        let new_creates: Vec<&Command> = last
            .iter()
            .filter(|c| c.group == new && is_create(&c.action))
            .collect();
        assert_eq!(new_creates.len() as u32, home_count.div_ceil(2));
        let share = |a: &mut Atoll| {
            let mut to_new = 0;
            for _ in 0..1000 {
                let r = a.route(t, F).unwrap();
                to_new += u32::from(r.group == new);
                a.finished(t, r.worker, F, Outcome::default());
            }
            to_new
        };
        let before = share(&mut a);
        for c in &last {
            if let AllocAction::Create { worker, function } = &c.action {
                a.on_ready(*worker, function);
            }
        }
        a.tick(t + 100 * MS);
        (before, share(&mut a), home_count)
    };
    let (instant, instant_later, _) = shares(ScaleOutMode::Instant);
    assert!(
        (430..=570).contains(&instant),
        "instant: {instant} of 1000 at once"
    );
    assert!((430..=570).contains(&instant_later), "{instant_later}");
    let (gradual, gradual_later, home) = shares(ScaleOutMode::Gradual);
    // One ticket against the home's sandboxes, until the new ones are ready.
    let expected = 1000 / (home + 1);
    assert!(
        gradual <= expected * 2 + 10,
        "gradual: {gradual} of 1000 at once"
    );
    let ready_share = 1000 * home.div_ceil(2) / (home + home.div_ceil(2));
    assert!(
        gradual_later + 60 >= ready_share && gradual_later <= ready_share + 60,
        "gradual later: {gradual_later}, expected about {ready_share}"
    );
}

#[test]
fn a_deleted_function_loses_every_sandbox() {
    let mut a = atoll(Ladder::Atoll, 2, 1);
    drive(&mut a, 200, 0, SEC, 0);
    drive(&mut a, 20, SEC, 3 * SEC, 0);
    let (active, soft) = a.sandboxes(F);
    assert!(active > 0 && soft > 0);
    let commands = a.unregister(F);
    assert_eq!(
        count(&commands, |x| matches!(x, AllocAction::Evict { .. })) as u32,
        active + soft
    );
    assert_eq!(a.sandboxes(F), (0, 0));
    assert!(a.tick(4 * SEC).is_empty());
}

#[test]
fn learned_times_drive_the_estimate_when_none_is_given() {
    let mut a = atoll(Ladder::Atoll, 1, 1);
    a.register(
        F,
        FunctionSpec {
            setup_us: None,
            exec_us: None,
            ..spec()
        },
    );
    // One cold start of 200 ms teaches the set-up time: 100/s × 0.2 s = 20 → 31 sandboxes.
    let r = a.route(0, F).unwrap();
    let cold = Outcome {
        queue_us: 0,
        init_us: Some(200 * MS),
        exec_us: Some(MS),
    };
    a.finished(0, r.worker, F, cold);
    let (commands, _) = drive(&mut a, 100, 0, SEC, 0);
    assert_eq!(count(&commands, is_create), 31);
}

#[test]
fn groups_active_for_a_function_keep_the_average_so_its_load_spreads_evenly() {
    let mut a = Atoll::new(AtollConfig::default()).unwrap();
    for w in 0..2 {
        a.add_worker(w, 4, 8192);
    }
    a.register(F, spec());
    drive(&mut a, 200, 0, SEC, 0);
    // Queueing 30 ms of 40 ms slack scales out once (both groups are then active).
    drive(&mut a, 200, SEC, 2 * SEC, 30 * MS);
    assert_eq!(a.stats().scale_outs, 1);
    // 10 ms of queueing: between the thresholds, no further scaling, for 3 s.
    let (_, used) = drive(&mut a, 200, 2 * SEC, 5 * SEC, 10 * MS);
    assert_eq!((a.stats().scale_outs, a.stats().scale_ins), (1, 0));
    let (home, new) = (a.sandboxes_on(0, F).0, a.sandboxes_on(1, F).0);
    assert!(home.abs_diff(new) <= 1, "home {home}, new {new}");
    // And the traffic follows the sandboxes: about half each.
    let (u0, u1) = (used[&0], used[&1]);
    assert!(u0.abs_diff(u1) < (u0 + u1) / 5, "{used:?}");
}
