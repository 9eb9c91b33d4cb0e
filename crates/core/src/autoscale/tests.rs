use super::*;
use crate::time::secs;
use proptest::prelude::*;

fn samples(loads: &[f64]) -> Vec<Sample> {
    loads
        .iter()
        .enumerate()
        .map(|(i, l)| Sample {
            worker: i as u32,
            load: *l,
        })
        .collect()
}

fn params() -> AutoscaleParams {
    AutoscaleParams {
        min_workers: 2,
        max_workers: 6,
        dead_band_ms: 60_000,
        ki: 0.0,
        ..AutoscaleParams::default()
    }
}

#[test]
fn half_the_workers_overloaded_scales_out_by_one() {
    let mut a = Autoscaler::new(params()).unwrap();
    let d = a.observe(0, &samples(&[1.6, 1.5, 0.9, 0.8])).unwrap();
    assert_eq!(d.direction, Direction::Out);
    assert_eq!((d.count, d.workers, d.target_workers), (1, 4, 5));
    assert_eq!(d.trigger, Trigger::Load);
    assert_eq!(d.overloaded, 2);
    assert!((d.mean_load - 1.2).abs() < 1e-9);
    assert!(d.remove.is_empty());
    assert!(d.reason().contains("2 of 4"), "{}", d.reason());
}

#[test]
fn fewer_than_half_overloaded_does_nothing_however_high_the_mean() {
    let mut a = Autoscaler::new(params()).unwrap();
    // Mean 2.6, far above the target, but only one worker of four is over 1.0: a balancing
    // problem, not a capacity one.
    assert_eq!(a.observe(0, &samples(&[9.0, 0.5, 0.5, 0.4])), None);
    assert_eq!(a.last_action(), None);
}

#[test]
fn half_overloaded_with_a_low_mean_does_nothing() {
    let mut a = Autoscaler::new(params()).unwrap();
    // Two of four just over the bound, two idle: mean 0.55 < target 0.7.
    assert_eq!(a.observe(0, &samples(&[1.05, 1.05, 0.05, 0.05])), None);
}

#[test]
fn the_dead_band_holds_the_next_action_back() {
    let mut a = Autoscaler::new(params()).unwrap();
    let hot = samples(&[1.5, 1.5, 1.5]);
    assert!(a.observe(0, &hot).is_some());
    for t in [1, secs(10), secs(59)] {
        assert_eq!(a.observe(t, &hot), None, "at {t} µs");
    }
    let d = a.observe(secs(60), &hot).unwrap();
    assert_eq!(d.direction, Direction::Out);
}

#[test]
fn scale_in_needs_every_worker_under_the_low_load_and_drains_the_least_loaded() {
    let mut a = Autoscaler::new(params()).unwrap();
    assert_eq!(a.observe(0, &samples(&[0.1, 0.2, 0.35, 0.1])), None);
    let d = a
        .observe(secs(1), &samples(&[0.1, 0.2, 0.25, 0.1]))
        .unwrap();
    assert_eq!(d.direction, Direction::In);
    assert_eq!((d.count, d.target_workers), (1, 3));
    // Workers 0 and 3 tie at 0.1: the newest (highest id) goes.
    assert_eq!(d.remove, vec![3]);
}

#[test]
fn the_bounds_are_restored_one_step_per_dead_band() {
    let mut a = Autoscaler::new(AutoscaleParams {
        max_step: 2,
        ..params()
    })
    .unwrap();
    let d = a.observe(0, &[]).unwrap();
    assert_eq!(
        (d.direction, d.count, d.trigger),
        (Direction::Out, 2, Trigger::BelowMin)
    );
    let d = a.observe(secs(60), &samples(&[0.5; 9])).expect("above max");
    assert_eq!(
        (d.direction, d.count, d.trigger),
        (Direction::In, 2, Trigger::AboveMax)
    );
    assert_eq!(d.remove.len(), 2);
    // At the maximum, overloaded workers add none.
    let mut a = Autoscaler::new(params()).unwrap();
    assert_eq!(a.observe(0, &samples(&[3.0; 6])), None);
    // At the minimum, idle workers remove none.
    assert_eq!(a.observe(secs(1), &samples(&[0.0; 2])), None);
}

#[test]
fn a_large_step_follows_the_pid_output() {
    let mut a = Autoscaler::new(AutoscaleParams {
        max_step: 10,
        max_workers: 100,
        ..params()
    })
    .unwrap();
    // Four workers at 1.4 with target 0.7: twice the target, so four more.
    let d = a.observe(0, &samples(&[1.4; 4])).unwrap();
    assert_eq!(d.count, 4);
}

#[test]
fn the_integral_makes_a_persistent_overload_count_more() {
    let p = AutoscaleParams {
        ki: 0.01,
        max_step: 10,
        max_workers: 100,
        dead_band_ms: 200_000,
        ..params()
    };
    // Same final sample, one after 5 minutes of it, one fresh.
    let hot = samples(&[1.05; 4]);
    let mut fresh = Autoscaler::new(p.clone()).unwrap();
    let fresh_d = fresh.observe(secs(300), &hot).unwrap();
    let mut persistent = Autoscaler::new(p).unwrap();
    // Held back by a min-workers action at t = 0 and its dead band.
    persistent.observe(0, &samples(&[0.5])).unwrap();
    for t in (1..=300).map(secs) {
        if let Some(d) = persistent.observe(t, &hot) {
            assert!(d.control > fresh_d.control);
            assert!(d.count > fresh_d.count);
            return;
        }
    }
    panic!("the persistent overload never scaled out");
}

#[test]
fn bad_parameters_are_typed_errors() {
    let bad = [
        AutoscaleParams {
            min_workers: 5,
            max_workers: 4,
            ..params()
        },
        AutoscaleParams {
            max_workers: 0,
            min_workers: 0,
            ..params()
        },
        AutoscaleParams {
            scale_in_load: 0.8,
            ..params()
        },
        AutoscaleParams {
            target_load: f64::NAN,
            ..params()
        },
        AutoscaleParams {
            overloaded_share: 0.0,
            ..params()
        },
        AutoscaleParams {
            ki: -1.0,
            ..params()
        },
        AutoscaleParams {
            kp: 0.0,
            ..params()
        },
        AutoscaleParams {
            max_step: 0,
            ..params()
        },
        AutoscaleParams {
            dead_band_ms: MAX_DEAD_BAND_MS + 1,
            ..params()
        },
    ];
    for p in bad {
        assert!(Autoscaler::new(p.clone()).is_err(), "{p:?}");
    }
    assert!(matches!(
        AutoscaleParams {
            scale_out_load: 0.5,
            ..params()
        }
        .check(),
        Err(AutoscaleError::BandOrder { .. })
    ));
    assert!(AutoscaleParams::default().check().is_ok());
}

fn arb_params() -> impl Strategy<Value = AutoscaleParams> {
    (
        0u32..6,
        1u32..12,
        1u32..4,
        0u64..120_000,
        0.0f64..0.05,
        0.0f64..5.0,
        prop_oneof![Just(0.5), Just(0.25), Just(1.0)],
    )
        .prop_map(|(min, extra, step, band, ki, kd, share)| AutoscaleParams {
            min_workers: min,
            max_workers: min + extra,
            max_step: step,
            dead_band_ms: band,
            ki,
            kd,
            overloaded_share: share,
            ..AutoscaleParams::default()
        })
}

proptest! {
    /// Driven by any loads, with the cluster following every decision: the count a decision
    /// aims at never leaves [min, max] once inside, no two decisions fall inside one dead band,
    /// and a load-triggered scale-out always had at least half the workers overloaded.
    #[test]
    fn decisions_respect_bounds_dead_band_and_the_overloaded_share(
        p in arb_params(),
        start in 0u32..16,
        steps in proptest::collection::vec(
            (1u64..20_000_000, proptest::collection::vec(0.0f64..4.0, 16)), 1..80),
    ) {
        let mut a = Autoscaler::new(p.clone()).unwrap();
        let mut n = start;
        let mut now = 0u64;
        let mut last: Option<u64> = None;
        for (dt, loads) in steps {
            now += dt;
            let s = samples(&loads[..n.min(16) as usize]);
            let s = &s[..];
            let was_inside = (p.min_workers..=p.max_workers).contains(&n);
            if let Some(d) = a.observe(now, s) {
                if let Some(t) = last {
                    prop_assert!(now - t >= p.dead_band_us(), "two actions {t} and {now}");
                }
                last = Some(now);
                prop_assert!(d.count >= 1 && d.count <= p.max_step);
                prop_assert_eq!(d.workers, s.len() as u32);
                if was_inside {
                    prop_assert!(d.target_workers >= p.min_workers);
                    prop_assert!(d.target_workers <= p.max_workers);
                }
                match d.direction {
                    Direction::Out => {
                        prop_assert!(d.target_workers > d.workers);
                        if d.trigger == Trigger::Load {
                            let over = s.iter().filter(|x| x.load > p.scale_out_load).count();
                            prop_assert!(over as f64 >= p.overloaded_share * s.len() as f64);
                            prop_assert!(d.mean_load > 0.0);
                        }
                    }
                    Direction::In => {
                        prop_assert_eq!(d.remove.len() as u32, d.count);
                        if d.trigger == Trigger::Load {
                            prop_assert!(s.iter().all(|x| x.load < p.scale_in_load));
                        }
                    }
                }
                n = d.target_workers.min(16);
            }
        }
    }

    /// With fewer than half the workers over the scale-out load (and the count inside its
    /// bounds), no load ever scales out.
    #[test]
    fn no_scale_out_without_half_overloaded(
        loads in proptest::collection::vec(0.0f64..0.99, 2..10),
        hot in 0.0f64..50.0,
    ) {
        let mut loads = loads;
        // One worker far over, the rest under: fewer than half when n ≥ 3.
        loads[0] = 1.0 + hot;
        let n = loads.len() as u32;
        let mut a = Autoscaler::new(AutoscaleParams {
            min_workers: 1,
            max_workers: 20,
            ..AutoscaleParams::default()
        }).unwrap();
        let s = samples(&loads);
        for t in 0..50 {
            if let Some(d) = a.observe(secs(t), &s) {
                prop_assert!(n <= 2, "{d:?}");
            }
        }
    }
}
