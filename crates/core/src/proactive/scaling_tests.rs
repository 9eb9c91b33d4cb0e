//! Tests of the group scaler: the paper's §5.2 scenarios, then properties over random event
//! sequences.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

const F: &str = "thumbnail";
const MS: Micros = 1_000;
const SEC: Micros = 1_000_000;

fn scaler(groups: &[GroupId]) -> Scaler {
    Scaler::new(ScalerConfig::default(), groups).unwrap()
}

/// Routes 10 000 evenly spaced draws and counts the groups chosen.
fn spread(s: &mut Scaler, f: &str, now: Micros) -> BTreeMap<GroupId, u32> {
    let step = u64::MAX / 10_000;
    let mut out = BTreeMap::new();
    for i in 0..10_000u64 {
        let g = s.route(f, i * step + step / 2, now).unwrap();
        *out.entry(g).or_insert(0) += 1;
    }
    out
}

fn report_all(s: &mut Scaler, f: &str, groups: &[GroupId], delay: Micros, n: u32, now: Micros) {
    for _ in 0..n {
        for g in groups {
            assert!(s.report_delay(f, *g, delay, now));
        }
    }
}

/// The next group clockwise after `home`, found independently: the home of `f` on a ring
/// without `home`.
fn next_after(groups: &[GroupId], home: GroupId, f: &str) -> GroupId {
    let rest: Vec<GroupId> = groups.iter().copied().filter(|g| *g != home).collect();
    scaler(&rest).home(f).unwrap()
}

const GROUPS: [GroupId; 8] = [0, 1, 2, 3, 4, 5, 6, 7];

/// A scaler where `F` has scaled out once: home with 6 sandboxes, the new group just joined.
fn scaled_out() -> (Scaler, GroupId, GroupId) {
    let mut s = scaler(&GROUPS);
    let home = s.route(F, 0, 0).unwrap();
    s.set_sandboxes(F, home, 6);
    report_all(&mut s, F, &[home], 20 * MS, 10, 0);
    let Some(ScaleAction::Out { group, .. }) = s.evaluate(F, 50 * MS, 0) else {
        panic!("expected a scale-out");
    };
    (s, home, group)
}

#[test]
fn first_group_is_the_ring_home_and_stable() {
    let mut s = scaler(&GROUPS);
    let home = s.home(F).unwrap();
    for i in 0..1000u64 {
        assert_eq!(
            s.route(F, i.wrapping_mul(0x9e37_79b9_7f4a_7c15), i),
            Some(home)
        );
    }
    assert_eq!(s.active_groups(F), vec![home]);
    // Another scaler over the same groups (listed in another order) agrees: the ring is
    // placed by hashing ids.
    let mut rev = GROUPS;
    rev.reverse();
    assert_eq!(scaler(&rev).home(F), Some(home));
    // Functions spread over the groups.
    let homes: std::collections::BTreeSet<GroupId> = (0..200)
        .map(|i| s.home(&format!("fn-{i}")).unwrap())
        .collect();
    assert!(homes.len() >= 6, "{homes:?}");
}

#[test]
fn high_delay_scales_out_to_next_ring_group_and_allocates_the_average() {
    let mut s = scaler(&GROUPS);
    let home = s.route(F, 0, 0).unwrap();
    s.set_sandboxes(F, home, 6);
    report_all(&mut s, F, &[home], 20 * MS, 10, 0);
    // 20 ms / 50 ms = 0.4 > 0.3.
    assert!((s.metric(F, 50 * MS).unwrap() - 0.4).abs() < 1e-9);
    let next = next_after(&GROUPS, home, F);
    assert_eq!(
        s.evaluate(F, 50 * MS, 0),
        Some(ScaleAction::Out {
            group: next,
            allocate: 3
        })
    );
    assert_eq!(s.active_groups(F), vec![home, next]);
    // A third group: the one after both, told to allocate (6 + 3) / 3.
    s.set_sandboxes(F, next, 3);
    report_all(&mut s, F, &[home, next], 30 * MS, 10, 2 * SEC);
    let Some(ScaleAction::Out { group, allocate }) = s.evaluate(F, 50 * MS, 2 * SEC) else {
        panic!("expected a second scale-out");
    };
    assert_eq!(allocate, 3);
    let rest: Vec<GroupId> = GROUPS
        .iter()
        .copied()
        .filter(|g| *g != home && *g != next)
        .collect();
    assert_eq!(group, scaler(&rest).home(F).unwrap());
}

#[test]
fn new_group_gets_a_trickle_then_a_share_proportional_to_its_sandboxes() {
    let (mut s, home, new) = scaled_out();
    // 1 ticket against 6: 1/7 of the draws.
    let c = spread(&mut s, F, 0);
    assert!((1427..=1430).contains(&c[&new]), "{c:?}");
    assert_eq!(c[&home] + c[&new], 10_000);
    s.set_sandboxes(F, new, 2);
    let c = spread(&mut s, F, 0);
    assert!((2499..=2501).contains(&c[&new]), "{c:?}");
    s.set_sandboxes(F, new, 6);
    let c = spread(&mut s, F, 0);
    assert!((4999..=5001).contains(&c[&new]), "{c:?}");
    // An active group reporting 0 sandboxes keeps its minimum ticket.
    s.set_sandboxes(F, new, 0);
    let c = spread(&mut s, F, 0);
    assert!((1427..=1430).contains(&c[&new]), "{c:?}");
}

#[test]
fn scale_in_discounts_the_last_group_then_drops_it_at_zero_sandboxes() {
    let (mut s, home, new) = scaled_out();
    s.set_sandboxes(F, new, 6);
    // Low delay: 1 ms / 50 ms = 0.02 < 0.05, once the cooldown has passed.
    report_all(&mut s, F, &[home, new], MS, 10, 2 * SEC);
    assert_eq!(
        s.evaluate(F, 50 * MS, 2 * SEC),
        Some(ScaleAction::In { group: new })
    );
    assert_eq!(s.active_groups(F), vec![home]);
    assert_eq!(s.removed_groups(F), vec![new]);
    // 6 tickets against 6 × 0.5: a third instead of a half.
    let c = spread(&mut s, F, 2 * SEC);
    assert!((3332..=3334).contains(&c[&new]), "{c:?}");
    s.set_sandboxes(F, new, 2);
    let c = spread(&mut s, F, 2 * SEC);
    assert!((1428..=1430).contains(&c[&new]), "{c:?}");
    assert!(s.set_sandboxes(F, new, 0));
    assert!(s.removed_groups(F).is_empty());
    let c = spread(&mut s, F, 2 * SEC);
    assert_eq!(c.get(&home), Some(&10_000));
    // Never below one group.
    report_all(&mut s, F, &[home], 0, 10, 4 * SEC);
    assert_eq!(s.evaluate(F, 50 * MS, 4 * SEC), None);
    assert_eq!(s.active_groups(F), vec![home]);
}

#[test]
fn no_decision_before_the_windows_refill_and_the_cooldown_passes() {
    let (mut s, home, new) = scaled_out();
    // Windows were reset: the old 20 ms reports no longer count.
    let t = 5 * SEC;
    assert_eq!(s.evaluate(F, 50 * MS, t), None);
    report_all(&mut s, F, &[home, new], 40 * MS, 9, t);
    assert_eq!(s.evaluate(F, 50 * MS, t), None);
    report_all(&mut s, F, &[home], 40 * MS, 1, t);
    assert_eq!(
        s.evaluate(F, 50 * MS, t),
        None,
        "the new group has 9 reports"
    );
    report_all(&mut s, F, &[new], 40 * MS, 1, t);
    assert!(matches!(
        s.evaluate(F, 50 * MS, t),
        Some(ScaleAction::Out { .. })
    ));
    // Filled windows but within the cooldown: no decision.
    let active = s.active_groups(F);
    report_all(&mut s, F, &active, 40 * MS, 10, t + SEC / 2);
    assert_eq!(s.evaluate(F, 50 * MS, t + SEC / 2), None);
    assert!(s.evaluate(F, 50 * MS, t + SEC).is_some());
}

#[test]
fn same_delays_with_less_slack_scale_out() {
    let mut s = scaler(&GROUPS);
    let home = s.route(F, 0, 0).unwrap();
    report_all(&mut s, F, &[home], 10 * MS, 10, 0);
    // 10 ms over 100 ms of slack: 0.1, between the thresholds.
    assert_eq!(s.evaluate(F, 100 * MS, 0), None);
    // Over 20 ms: 0.5, a latency-sensitive function scales out.
    assert!(matches!(
        s.evaluate(F, 20 * MS, 0),
        Some(ScaleAction::Out { .. })
    ));
}

#[test]
fn delays_are_weighted_by_sandboxes_and_smoothed() {
    let (mut s, home, new) = scaled_out();
    s.set_sandboxes(F, new, 2);
    // One report sets the average, later ones move it by alpha.
    s.report_delay(F, home, 10 * MS, 0);
    s.report_delay(F, new, 50 * MS, 0);
    s.report_delay(F, new, 100 * MS, 0);
    // new: 0.3·100 + 0.7·50 = 65 ms; weighted: (6·10 + 2·65) / 8 = 23.75 ms.
    let m = s.metric(F, MS).unwrap();
    assert!((m - 23.75).abs() < 1e-9, "{m}");
}

#[test]
fn scale_out_stops_when_every_group_is_active() {
    let mut s = scaler(&[3, 9]);
    let mut t = 0;
    let mut added = Vec::new();
    for _ in 0..3 {
        let active = s.active_groups(F);
        if active.is_empty() {
            s.route(F, 0, t);
            continue;
        }
        report_all(&mut s, F, &active, 100 * MS, 10, t);
        if let Some(ScaleAction::Out { group, .. }) = s.evaluate(F, MS, t) {
            added.push(group);
        }
        t += 2 * SEC;
    }
    assert_eq!(added.len(), 1);
    let mut a = s.active_groups(F);
    a.sort();
    assert_eq!(a, vec![3, 9]);
}

#[test]
fn removed_cluster_group_leaves_lists_and_functions_fall_back_to_the_ring_home() {
    let (mut s, home, new) = scaled_out();
    assert!(s.remove_group(new));
    assert_eq!(s.active_groups(F), vec![home]);
    assert!(!s.remove_group(new));
    // The home goes: the function restarts on its new home, the old next group.
    assert!(s.remove_group(home));
    let fallback = s.home(F).unwrap();
    assert_ne!(fallback, home);
    assert_eq!(s.active_groups(F), vec![fallback]);
    assert_eq!(s.route(F, u64::MAX, 0), Some(fallback));
    // Reports from groups no longer associated are ignored.
    assert!(!s.report_delay(F, home, 5, 0));
    assert!(!s.set_sandboxes(F, home, 5));
    // An empty cluster routes nowhere; a group coming back takes over.
    for g in GROUPS {
        s.remove_group(g);
    }
    assert_eq!(s.route(F, 0, 0), None);
    s.add_group(4);
    assert_eq!(s.route(F, 0, 0), Some(4));
    assert_eq!(s.active_groups(F), vec![4]);
}

#[test]
fn idle_functions_are_forgotten() {
    let mut s = scaler(&GROUPS);
    s.route("a", 0, 0);
    s.route("b", 0, 0);
    let idle = s.config().idle_forget_us;
    s.route("b", 0, idle - 1);
    assert_eq!(s.expire(idle - 1), 0);
    assert_eq!(s.expire(idle), 1);
    assert_eq!(s.len(), 1);
    assert!(s.active_groups("a").is_empty());
    // Delay reports keep a function alive too.
    let hb = s.home("b").unwrap();
    s.report_delay("b", hb, 1, 2 * idle - 2);
    assert_eq!(s.expire(2 * idle - 1), 0);
    assert_eq!(s.expire(3 * idle), 1);
    assert!(s.is_empty());
}

#[test]
fn config_validation_and_serde_defaults() {
    assert_eq!(ScalerConfig::default().validate(), Ok(()));
    let bad = |f: fn(&mut ScalerConfig)| {
        let mut c = ScalerConfig::default();
        f(&mut c);
        c.validate().err()
    };
    assert!(matches!(
        bad(|c| c.scale_in = 0.3),
        Some(ScalerError::Thresholds { .. })
    ));
    assert!(matches!(
        bad(|c| c.scale_in = -0.1),
        Some(ScalerError::Thresholds { .. })
    ));
    assert!(matches!(
        bad(|c| c.scale_out = f64::NAN),
        Some(ScalerError::Thresholds { .. })
    ));
    assert_eq!(bad(|c| c.scale_in = 0.0), None);
    assert_eq!(
        bad(|c| c.removed_discount = 0.0),
        Some(ScalerError::Discount(0.0))
    );
    assert_eq!(
        bad(|c| c.removed_discount = 1.5),
        Some(ScalerError::Discount(1.5))
    );
    assert_eq!(bad(|c| c.removed_discount = 1.0), None);
    assert_eq!(bad(|c| c.alpha = 0.0), Some(ScalerError::Alpha(0.0)));
    assert_eq!(bad(|c| c.alpha = 1.01), Some(ScalerError::Alpha(1.01)));
    assert_eq!(bad(|c| c.min_reports = 0), Some(ScalerError::MinReports));
    assert_eq!(bad(|c| c.vnodes = 0), Some(ScalerError::Vnodes));
    assert_eq!(bad(|c| c.idle_forget_us = 0), Some(ScalerError::IdleForget));
    assert!(Scaler::new(
        ScalerConfig {
            alpha: 2.0,
            ..ScalerConfig::default()
        },
        &GROUPS
    )
    .is_err());
    let c: ScalerConfig = serde_json::from_str(r#"{"scale_out": 0.5}"#).unwrap();
    assert_eq!(
        c,
        ScalerConfig {
            scale_out: 0.5,
            ..ScalerConfig::default()
        }
    );
    let back: ScalerConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
}

#[derive(Debug, Clone)]
enum Op {
    Route(usize, u64),
    Sandboxes(usize, GroupId, u32),
    Delay(usize, GroupId, Micros),
    Evaluate(usize, Micros),
    Remove(GroupId),
    Add(GroupId),
    Tick,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, any::<u64>()).prop_map(|(f, d)| Op::Route(f, d)),
        2 => (0..3usize, 0..6u32, 0..5u32).prop_map(|(f, g, n)| Op::Sandboxes(f, g, n)),
        4 => (0..3usize, 0..6u32, 0..200_000u64).prop_map(|(f, g, d)| Op::Delay(f, g, d)),
        2 => (0..3usize, 1..200_000u64).prop_map(|(f, s)| Op::Evaluate(f, s)),
        1 => (0..6u32).prop_map(Op::Remove),
        1 => (0..6u32).prop_map(Op::Add),
        1 => Just(Op::Tick),
    ]
}

proptest! {
    #[test]
    fn routes_stay_within_the_lists_and_lists_have_no_duplicates(
        ops in proptest::collection::vec(op(), 1..300)
    ) {
        let names = ["a", "b", "c"];
        let config = ScalerConfig { min_reports: 2, ..ScalerConfig::default() };
        let mut s = Scaler::new(config, &[0, 1, 2, 3]).unwrap();
        let mut now = 0;
        for op in ops {
            match op {
                Op::Route(f, d) => {
                    let g = s.route(names[f], d, now);
                    let active = s.active_groups(names[f]);
                    let removed = s.removed_groups(names[f]);
                    match g {
                        Some(g) => prop_assert!(active.contains(&g) || removed.contains(&g)),
                        None => prop_assert!(active.is_empty()),
                    }
                }
                Op::Sandboxes(f, g, n) => {
                    s.set_sandboxes(names[f], g, n);
                }
                Op::Delay(f, g, d) => {
                    s.report_delay(names[f], g, d, now);
                }
                Op::Evaluate(f, slack) => {
                    let before = s.active_groups(names[f]);
                    match s.evaluate(names[f], slack, now) {
                        Some(ScaleAction::Out { group, allocate }) => {
                            prop_assert!(!before.contains(&group));
                            prop_assert!(allocate >= 1);
                            prop_assert_eq!(s.active_groups(names[f]).last().copied(), Some(group));
                        }
                        Some(ScaleAction::In { group }) => {
                            prop_assert!(before.len() > 1);
                            prop_assert_eq!(before.last(), Some(&group));
                            prop_assert!(!s.active_groups(names[f]).contains(&group));
                        }
                        None => {}
                    }
                }
                Op::Remove(g) => {
                    s.remove_group(g);
                    for f in names {
                        prop_assert!(!s.active_groups(f).contains(&g));
                        prop_assert!(!s.removed_groups(f).contains(&g));
                    }
                }
                Op::Add(g) => s.add_group(g),
                Op::Tick => now += 700_000,
            }
            for f in names {
                let mut all = s.active_groups(f);
                all.extend(s.removed_groups(f));
                let n = all.len();
                all.sort_unstable();
                all.dedup();
                prop_assert_eq!(all.len(), n, "duplicates for {}", f);
            }
        }
    }
}
