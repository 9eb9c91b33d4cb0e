//! Tests of the allocator: the paper's scenarios, then properties over random event sequences
//! checked against a plain model that replays the actions.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

const MB: u64 = 128;

fn alloc(placement: Placement, eviction: EvictionMode, victim: VictimPolicy) -> Allocator {
    Allocator::new(AllocConfig {
        placement,
        eviction,
        victim,
        // The least gap: the scenarios below count single moves.
        steal_gap: 2,
        ..AllocConfig::default()
    })
}

fn count(actions: &[AllocAction], pred: impl Fn(&AllocAction) -> bool) -> usize {
    actions.iter().filter(|a| pred(a)).count()
}

fn is_create(a: &AllocAction) -> bool {
    matches!(a, AllocAction::Create { .. })
}

#[test]
fn fig5b_even_spreads_each_function_across_workers() {
    let mut a = Allocator::new(AllocConfig::default());
    a.add_worker(1, 2 * MB);
    a.add_worker(2, 2 * MB);
    a.set_demand("f1", MB, 2, None);
    a.set_demand("f2", MB, 2, None);
    for w in [1, 2] {
        assert_eq!(a.sandboxes(w, "f1"), (1, 0));
        assert_eq!(a.sandboxes(w, "f2"), (1, 0));
    }
    assert_eq!(a.tickets("f1"), vec![(1, 1), (2, 1)]);
}

#[test]
fn fig5b_pack_fills_one_worker_first() {
    let mut a = alloc(Placement::Pack, EvictionMode::Lazy, VictimPolicy::Fair);
    a.add_worker(1, 2 * MB);
    a.add_worker(2, 2 * MB);
    let out = a.set_demand("f1", MB, 2, None);
    assert_eq!(count(&out, is_create), 2);
    a.set_demand("f2", MB, 2, None);
    assert_eq!(a.sandboxes(1, "f1"), (2, 0));
    assert_eq!(a.sandboxes(2, "f2"), (2, 0));
    assert_eq!(a.tickets("f2"), vec![(2, 2)]);
    assert_eq!(a.stats().evicts, 0);
}

#[test]
fn demand_drop_then_return_unmarks_without_create() {
    let mut a = Allocator::new(AllocConfig::default());
    a.add_worker(1, 10 * MB);
    a.add_worker(2, 10 * MB);
    a.set_demand("f", MB, 4, None);
    let out = a.set_demand("f", MB, 1, None);
    assert_eq!(
        count(&out, |x| matches!(x, AllocAction::SoftEvict { .. })),
        3
    );
    assert_eq!((a.allocation("f"), a.soft_evicted("f")), (1, 3));
    // Soft-evicted sandboxes keep their memory and are not routed to.
    assert_eq!(
        a.pool_used_mb(1).unwrap() + a.pool_used_mb(2).unwrap(),
        4 * MB
    );
    assert_eq!(a.tickets("f").iter().map(|t| t.1).sum::<u32>(), 1);
    let out = a.set_demand("f", MB, 4, None);
    assert_eq!(count(&out, is_create), 0);
    assert_eq!(count(&out, |x| matches!(x, AllocAction::Unmark { .. })), 3);
    assert_eq!((a.allocation("f"), a.soft_evicted("f")), (4, 0));
    assert_eq!(a.stats().creates, 4);
}

#[test]
fn instant_mode_evicts_outright() {
    let mut a = alloc(Placement::Even, EvictionMode::Instant, VictimPolicy::Fair);
    a.add_worker(1, 10 * MB);
    a.set_demand("f", MB, 3, None);
    let out = a.set_demand("f", MB, 1, None);
    assert_eq!(
        count(&out, |x| matches!(
            x,
            AllocAction::Evict { soft: false, .. }
        )),
        2
    );
    assert_eq!(a.soft_evicted("f"), 0);
    assert_eq!(a.pool_used_mb(1), Some(MB));
    let out = a.set_demand("f", MB, 3, None);
    assert_eq!(count(&out, is_create), 2);
}

/// One worker with room for four: a and b hold two each.
fn full_worker(victim: VictimPolicy) -> Allocator {
    let mut a = alloc(Placement::Even, EvictionMode::Lazy, victim);
    a.add_worker(0, 4 * MB);
    a.set_demand("a", MB, 2, None);
    a.set_demand("b", MB, 2, None);
    assert_eq!(a.pool_used_mb(0), Some(4 * MB));
    a
}

fn evicted(out: &[AllocAction]) -> Vec<(&str, bool)> {
    out.iter()
        .filter_map(|x| match x {
            AllocAction::Evict { function, soft, .. } => Some((&**function, *soft)),
            _ => None,
        })
        .collect()
}

#[test]
fn fair_hard_eviction_picks_the_function_closest_to_its_estimate() {
    let mut a = full_worker(VictimPolicy::Fair);
    // a loses a sandbox: it is one short of its estimate, b is at its estimate, and the
    // pool has room for one.
    assert!(a.on_lost(0, "a"));
    let out = a.set_demand("c", MB, 3, None);
    // c's first fits; its second takes b's (c two short, b at its estimate); a third would
    // leave a or b two short while c is one short: not fairer, so it is skipped.
    assert_eq!(evicted(&out), vec![("b", false)]);
    assert_eq!(count(&out, |x| matches!(x, AllocAction::Skipped { .. })), 1);
    assert_eq!(a.sandboxes(0, "c"), (2, 0));
    assert_eq!((a.allocation("a"), a.allocation("b")), (1, 1));
    // c three short against a and b one short: it takes one, ties by name.
    let out = a.set_demand("c", MB, 5, None);
    assert_eq!(evicted(&out), vec![("a", false)]);
    assert_eq!(a.allocation("c"), 3);
}

#[test]
fn a_pool_too_small_for_every_estimate_settles_instead_of_passing_sandboxes_around() {
    for victim in [VictimPolicy::Fair, VictimPolicy::Lru] {
        let mut a = alloc(Placement::Even, EvictionMode::Lazy, victim);
        a.add_worker(0, 6 * MB);
        // Three functions each estimated at 4 sandboxes, room for 6 in all.
        let mut actions = 0;
        for tick in 0..50u64 {
            for f in ["a", "b", "c"] {
                a.on_used(0, f, tick);
                let out = a.set_demand(f, MB, 4, None);
                if tick >= 2 {
                    actions += out
                        .iter()
                        .filter(|x| !matches!(x, AllocAction::Skipped { .. }))
                        .count();
                }
            }
        }
        assert_eq!(actions, 0, "{victim:?}: the allocation kept moving");
        let mut shares: Vec<u32> = ["a", "b", "c"].iter().map(|f| a.allocation(f)).collect();
        shares.sort_unstable();
        assert_eq!(shares, vec![2, 2, 2], "{victim:?}: shortfalls even out");
    }
}

#[test]
fn a_wider_steal_gap_leaves_small_differences_alone() {
    for (gap, moved) in [(2, true), (4, false)] {
        let mut a = Allocator::new(AllocConfig {
            steal_gap: gap,
            ..AllocConfig::default()
        });
        a.add_worker(0, 4 * MB);
        a.set_demand("a", MB, 4, None);
        // b three short, a at its estimate: a move closes a gap of 3.
        let out = a.set_demand("b", MB, 3, None);
        assert_eq!(!evicted(&out).is_empty(), moved, "gap {gap}");
    }
    let bad = AllocConfig {
        steal_gap: 1,
        ..AllocConfig::default()
    };
    assert_eq!(
        bad.validate().unwrap_err().to_string(),
        "steal_gap must be between 2 and 1024 sandboxes, got 1"
    );
    assert!(AllocConfig::default().validate().is_ok());
}

#[test]
fn lru_hard_eviction_picks_the_least_recently_used_function() {
    for (a_used, b_used, victim) in [(10, 5, "b"), (5, 10, "a")] {
        let mut a = full_worker(VictimPolicy::Lru);
        a.on_used(0, "a", a_used);
        a.on_used(0, "b", b_used);
        // c two short against a and b at their estimates: one move evens them out.
        let out = a.set_demand("c", MB, 2, None);
        assert_eq!(evicted(&out), vec![(victim, false)]);
    }
}

#[test]
fn soft_evicted_sandboxes_go_before_active_ones() {
    let mut a = full_worker(VictimPolicy::Fair);
    a.set_demand("b", MB, 1, None); // one of b soft-evicted
    let out = a.set_demand("c", MB, 3, None);
    assert_eq!(evicted(&out), vec![("b", true), ("a", false)]);
    assert_eq!(a.worker_soft_evicted(0), 0);
}

#[test]
fn never_evicts_its_own_function_and_skips_when_no_room() {
    let mut a = Allocator::new(AllocConfig::default());
    a.add_worker(0, 2 * MB);
    a.set_demand("a", MB, 2, None);
    let out = a.set_demand("a", MB, 5, None);
    assert_eq!(count(&out, |x| matches!(x, AllocAction::Skipped { .. })), 3);
    assert_eq!(a.stats().skipped, 3);
    assert_eq!(a.allocation("a"), 2);
    // Larger than any pool: nothing is evicted for nothing.
    let out = a.set_demand("big", 3 * MB, 1, None);
    assert_eq!(out.len(), 1);
    assert!(matches!(out[0], AllocAction::Skipped { .. }));
    assert_eq!(a.allocation("a"), 2);
}

#[test]
fn demand_is_clamped() {
    let mut a = Allocator::new(AllocConfig {
        max_demand: 10,
        ..AllocConfig::default()
    });
    a.add_worker(0, MB);
    let out = a.set_demand("free", 0, u32::MAX, None);
    assert_eq!(count(&out, is_create), 10);
    assert_eq!((a.allocation("free"), a.demand("free")), (10, 10));
}

#[test]
fn allowed_workers_limit_placement() {
    let mut a = Allocator::new(AllocConfig::default());
    for w in 0..3 {
        a.add_worker(w, 10 * MB);
    }
    a.set_demand("f", MB, 4, Some(&[1, 2]));
    assert_eq!(a.tickets("f"), vec![(1, 2), (2, 2)]);
    a.set_demand("g", MB, 1, Some(&[]));
    assert_eq!(a.allocation("g"), 0);
}

#[test]
fn failures_losses_and_removed_workers_are_forgotten() {
    let mut a = Allocator::new(AllocConfig::default());
    a.add_worker(0, 10 * MB);
    a.add_worker(1, 10 * MB);
    a.set_demand("f", MB, 4, None);
    assert!(a.on_create_failed(0, "f"));
    assert_eq!(a.allocation("f"), 3);
    assert_eq!(a.pool_used_mb(0), Some(MB));
    assert!(!a.on_lost(0, "nope"));
    assert!(a.remove_worker(1));
    assert_eq!(a.allocation("f"), 1);
    assert_eq!(a.tickets("f"), vec![(0, 1)]);
    // The next demand update makes up the difference.
    let out = a.set_demand("f", MB, 4, None);
    assert_eq!(count(&out, is_create), 3);
    assert!(!a.add_worker(0, MB));
    a.set_demand("f", MB, 0, None);
    a.on_lost(0, "f");
    a.on_lost(0, "f");
    a.on_lost(0, "f");
    a.on_lost(0, "f");
    assert_eq!(a.functions().count(), 0);
}

#[test]
fn reconciling_with_a_report_forgets_the_sandboxes_a_worker_lost() {
    let mut a = Allocator::new(AllocConfig::default());
    a.add_worker(0, 10 * MB);
    a.add_worker(1, 10 * MB);
    // Four active on each worker, then one on each soft-evicted: (3 active, 1 soft) each.
    a.set_demand("f", MB, 8, None);
    a.set_demand("f", MB, 6, None);
    a.set_demand("g", MB, 1, Some(&[1]));
    assert_eq!(a.sandboxes(0, "f"), (3, 1));
    // Worker 0 reports one active f (two active and the soft one were killed); worker 1
    // reports all it has.
    let lost = a.reconcile(0, |f| if f == "f" { (1, 0) } else { (0, 0) });
    assert_eq!(lost, 3);
    assert_eq!(a.sandboxes(0, "f"), (1, 0));
    assert_eq!(a.pool_used_mb(0), Some(MB));
    assert_eq!(
        a.reconcile(1, |f| if f == "f" { (3, 1) } else { (1, 0) }),
        0
    );
    assert_eq!(a.sandboxes(1, "f"), (3, 1));
    // A report with more than counted changes nothing; an unknown worker neither.
    assert_eq!(a.reconcile(1, |_| (9, 9)), 0);
    assert_eq!(a.reconcile(7, |_| (0, 0)), 0);
    assert_eq!(
        a.stats().evicts,
        0,
        "a loss is not an eviction of the allocator's"
    );
    // The next demand update makes up the two lost active sandboxes.
    let out = a.set_demand("f", MB, 6, None);
    let unmarks = count(&out, |x| matches!(x, AllocAction::Unmark { .. }));
    assert_eq!(count(&out, is_create) + unmarks, 2);
    assert_eq!(a.allocation("f"), 6);
}

#[test]
fn a_memory_change_replaces_the_sandboxes() {
    let mut a = Allocator::new(AllocConfig::default());
    a.add_worker(0, 10 * MB);
    a.set_demand("f", MB, 3, None);
    a.set_demand("f", MB, 2, None);
    let out = a.set_demand("f", 2 * MB, 2, None);
    assert_eq!(evicted(&out).len(), 3);
    assert_eq!(count(&out, is_create), 2);
    assert_eq!(a.pool_used_mb(0), Some(4 * MB));
}

#[test]
fn config_serde_defaults() {
    let c: AllocConfig = serde_json::from_str(r#"{"placement":"pack"}"#).unwrap();
    assert_eq!(c.placement, Placement::Pack);
    assert_eq!(c.eviction, EvictionMode::Lazy);
    assert_eq!(c.victim, VictimPolicy::Fair);
    assert_eq!(c.max_demand, AllocConfig::default().max_demand);
    assert_eq!(c.steal_gap, 4);
    let c: crate::proactive::PoissonConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(c, crate::proactive::PoissonConfig::default());
}

// ---- properties ----

const FUNCS: [&str; 4] = ["f0", "f1", "f2", "f3"];
const MEM: [u64; 4] = [128, 256, 128, 384];

#[derive(Debug, Clone)]
enum Op {
    AddWorker(WorkerId, u64),
    RemoveWorker(WorkerId),
    SetDemand {
        f: usize,
        demand: u32,
        double_mem: bool,
        allowed: Option<Vec<WorkerId>>,
    },
    CreateFailed(WorkerId, usize),
    Lost(WorkerId, usize),
    Used(WorkerId, usize, Micros),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u32..4, 0u64..12).prop_map(|(w, n)| Op::AddWorker(w, n * 128)),
        1 => (0u32..4).prop_map(Op::RemoveWorker),
        6 => (
            0usize..4,
            0u32..10,
            prop::bool::weighted(0.05),
            prop::option::weighted(0.2, prop::collection::vec(0u32..5, 0..3)),
        )
            .prop_map(|(f, demand, double_mem, allowed)| Op::SetDemand {
                f,
                demand,
                double_mem,
                allowed
            }),
        1 => (0u32..4, 0usize..4).prop_map(|(w, f)| Op::CreateFailed(w, f)),
        1 => (0u32..4, 0usize..4).prop_map(|(w, f)| Op::Lost(w, f)),
        1 => (0u32..4, 0usize..4, 0u64..1000).prop_map(|(w, f, t)| Op::Used(w, f, t)),
    ]
}

/// Counts of (active, soft) per (worker, function), rebuilt from the actions alone.
#[derive(Default)]
struct Model {
    slots: BTreeMap<(WorkerId, String), (u32, u32)>,
    mem: BTreeMap<String, u64>,
}

impl Model {
    fn apply(&mut self, action: &AllocAction) {
        match action {
            AllocAction::Create { worker, function } => {
                self.slots
                    .entry((*worker, function.to_string()))
                    .or_default()
                    .0 += 1;
            }
            AllocAction::Unmark { worker, function } => {
                let s = self
                    .slots
                    .entry((*worker, function.to_string()))
                    .or_default();
                assert!(s.1 > 0, "unmark without a soft-evicted sandbox");
                s.1 -= 1;
                s.0 += 1;
            }
            AllocAction::SoftEvict { worker, function } => {
                let s = self
                    .slots
                    .entry((*worker, function.to_string()))
                    .or_default();
                assert!(s.0 > 0, "soft-evict without an active sandbox");
                s.0 -= 1;
                s.1 += 1;
            }
            AllocAction::Evict {
                worker,
                function,
                soft,
            } => {
                let s = self
                    .slots
                    .entry((*worker, function.to_string()))
                    .or_default();
                if *soft {
                    assert!(s.1 > 0);
                    s.1 -= 1;
                } else {
                    assert!(s.0 > 0);
                    s.0 -= 1;
                }
            }
            AllocAction::Skipped { .. } => {}
        }
    }

    fn forget(&mut self, worker: WorkerId, function: &str) {
        if let Some(s) = self.slots.get_mut(&(worker, function.to_owned())) {
            if s.0 > 0 {
                s.0 -= 1;
            } else if s.1 > 0 {
                s.1 -= 1;
            }
        }
    }
}

fn check(a: &Allocator, model: &Model, mode: EvictionMode) {
    let mut used: BTreeMap<WorkerId, u64> = BTreeMap::new();
    for ((w, f), &(active, soft)) in &model.slots {
        if !a.workers().any(|x| x == *w) {
            continue;
        }
        assert_eq!(
            a.sandboxes(*w, f),
            (active, soft),
            "worker {w} function {f}"
        );
        *used.entry(*w).or_default() += u64::from(active + soft) * model.mem[f];
        if mode == EvictionMode::Instant {
            assert_eq!(soft, 0);
        }
    }
    for w in a.workers() {
        let pool_used = a.pool_used_mb(w).unwrap();
        assert!(
            pool_used <= a.pool_mb(w).unwrap(),
            "worker {w} over its pool"
        );
        assert_eq!(pool_used, used.get(&w).copied().unwrap_or(0));
    }
    for f in FUNCS {
        let tickets: u32 = a.tickets(f).iter().map(|t| t.1).sum();
        assert_eq!(tickets, a.allocation(f));
    }
}

fn config() -> impl Strategy<Value = AllocConfig> {
    (
        prop_oneof![Just(Placement::Even), Just(Placement::Pack)],
        prop_oneof![Just(EvictionMode::Lazy), Just(EvictionMode::Instant)],
        prop_oneof![Just(VictimPolicy::Fair), Just(VictimPolicy::Lru)],
    )
        .prop_map(|(placement, eviction, victim)| AllocConfig {
            placement,
            eviction,
            victim,
            ..AllocConfig::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Pools never overflow, the actions replayed onto the model give the allocator's counts,
    /// demand is met whenever nothing was skipped, soft-evicted sandboxes on a worker are
    /// un-marked before a new one is created there, and Instant mode never soft-evicts.
    #[test]
    fn allocator_matches_a_replay_of_its_actions(
        config in config(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut a = Allocator::new(config);
        let mut model = Model::default();
        for op in ops {
            match op {
                Op::AddWorker(w, pool) => { a.add_worker(w, pool); }
                Op::RemoveWorker(w) => {
                    a.remove_worker(w);
                    model.slots.retain(|(x, _), _| *x != w);
                }
                Op::SetDemand { f, demand, double_mem, allowed } => {
                    let mem = MEM[f] * if double_mem { 2 } else { 1 };
                    let out = a.set_demand(FUNCS[f], mem, demand, allowed.as_deref());
                    for action in &out {
                        if let AllocAction::Create { worker, function } = action {
                            let s = model.slots.get(&(*worker, function.to_string()));
                            prop_assert_eq!(s.map_or(0, |s| s.1), 0, "create before unmark");
                            model.mem.insert(function.to_string(), mem);
                        }
                        model.apply(action);
                    }
                    let skipped = out.iter().any(|x| matches!(x, AllocAction::Skipped { .. }));
                    if !skipped {
                        prop_assert_eq!(a.allocation(FUNCS[f]), demand);
                    }
                    prop_assert_eq!(a.demand(FUNCS[f]), demand);
                }
                Op::CreateFailed(w, f) => {
                    a.on_create_failed(w, FUNCS[f]);
                    model.forget(w, FUNCS[f]);
                }
                Op::Lost(w, f) => {
                    a.on_lost(w, FUNCS[f]);
                    model.forget(w, FUNCS[f]);
                }
                Op::Used(w, f, t) => a.on_used(w, FUNCS[f], t),
            }
            check(&a, &model, config.eviction);
        }
    }

    /// With pools that never bind, Even placement keeps every function's active sandboxes
    /// within one of each other across workers, and meets every demand.
    #[test]
    fn even_placement_stays_balanced(
        workers in 1u32..6,
        demands in prop::collection::vec((0usize..4, 0u32..20), 1..40),
    ) {
        let mut a = Allocator::new(AllocConfig::default());
        for w in 0..workers {
            a.add_worker(w, 1 << 40);
        }
        for (f, d) in demands {
            a.set_demand(FUNCS[f], MEM[f], d, None);
            prop_assert_eq!(a.allocation(FUNCS[f]), d);
            for g in FUNCS {
                let counts: Vec<u32> = (0..workers).map(|w| a.sandboxes(w, g).0).collect();
                let (min, max) = (counts.iter().min(), counts.iter().max());
                prop_assert!(max.zip(min).is_none_or(|(x, n)| x - n <= 1), "{g}: {counts:?}");
            }
        }
    }
}
