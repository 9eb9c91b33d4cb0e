use super::*;

fn done(function: &str, arrival_us: Micros, cpu_us: Micros) -> Completion<'_> {
    Completion {
        function,
        arrival_us,
        end_us: arrival_us + cpu_us,
        cpu_us,
    }
}

/// One CPU, 5 s: "long" (10 ms) every 20 ms and "short" (2 ms) 1 ms after each: the window of
/// `learn`'s hand-checked case, repeated. Under SRPT: short waits 0, slices [2 ms]; long waits
/// 2 ms, slices [1, 9] ms: ts = 5, stdev 4 → tsᵘ = 6 ms; short tsᵘ = 4 ms.
fn feed(a: &mut Alps, from: Micros) {
    for k in 0..250u64 {
        let t = from + k * 20_000;
        a.completed(done("long", t, 10_000));
        a.completed(done("short", t + 1_000, 2_000));
    }
}

#[test]
fn alps_trains_once_per_window_and_answers_from_the_last_one() {
    let mut a = Alps::new(AlpsConfig::default(), 1).unwrap();
    assert_eq!(a.next_tick_at(), 5_000_000);
    assert_eq!(a.policy_for("short"), Slice::FAIR, "nothing learned yet");
    feed(&mut a, 0);
    assert_eq!(a.window_len(), 500);
    assert!(a.tick(4_999_999, 10.0).is_none());
    let t = a.tick(5_000_000, 10.0).unwrap();
    assert_eq!((t.invocations, t.functions, t.ignored), (500, 2, 0));
    assert_eq!((t.window_from_us, t.at_us), (0, 5_000_000));
    // Mean SRPT wait over the window: (250 × 2 ms + 250 × 0) / 500.
    assert_eq!(t.mean_wait_us, 1_000.0);
    assert_eq!(a.next_tick_at(), 10_000_000);
    assert_eq!(a.window_len(), 0, "the window starts empty again");
    // Utilization 10 % is below θ: no penalty.
    assert_eq!(
        a.policy_for("short"),
        Slice {
            rank: 1,
            slice_us: 4_000
        }
    );
    assert_eq!(
        a.policy_for("long"),
        Slice {
            rank: 100,
            slice_us: 6_000
        }
    );
    // An unseen function: the neutral rank, the lower median of the learned slices.
    assert_eq!(
        a.policy_for("other"),
        Slice {
            rank: NEUTRAL_RANK,
            slice_us: 4_000
        }
    );
    // An empty window keeps what the last one taught.
    let t = a.tick(10_000_000, 10.0).unwrap();
    assert_eq!(t.invocations, 0);
    assert_eq!(a.policy_for("short").slice_us, 4_000);
    assert_eq!(a.trainings(), 1);
    // A window that sees only "short" forgets "long".
    for k in 0..10u64 {
        a.completed(done("short", 10_000_000 + k * 10_000, 2_000));
    }
    assert!(a.tick(15_000_000, 10.0).is_some());
    assert_eq!(a.policy_for("long").rank, NEUTRAL_RANK);
    assert_eq!(a.policy_for("long").slice_us, 4_000);
    assert_eq!(a.policies(), 1);
}

#[test]
fn eq3_follows_the_latest_utilization_between_trainings() {
    let mut a = Alps::new(AlpsConfig::default(), 1).unwrap();
    feed(&mut a, 0);
    let _ = a.tick(5_000_000, 90.0);
    // p = (100 + 50 − 90) / 100 = 0.6: short 4 ms → 2.4 ms, long 6 ms → 3.6 ms.
    assert!((a.penalty() - 0.6).abs() < 1e-12);
    assert_eq!(a.policy_for("short").slice_us, 2_400);
    assert_eq!(a.policy_for("long").slice_us, 3_600);
    // A tick before the window's end changes p only.
    assert!(a.tick(6_000_000, 30.0).is_none());
    assert_eq!(a.policy_for("short").slice_us, 4_000);
    // Not a number: p stays; beyond 100 %: as 100 % (p = 0.5).
    assert!(a.tick(6_500_000, f64::NAN).is_none());
    assert_eq!(a.penalty(), 1.0);
    assert!(a.tick(7_000_000, 250.0).is_none());
    assert_eq!(a.policy_for("short").slice_us, 2_000);
}

#[test]
fn each_fine_tuning_can_be_switched_off() {
    let run = |unpredictability: bool, overload: bool| {
        let c = AlpsConfig {
            unpredictability,
            overload,
            ..AlpsConfig::default()
        };
        let mut a = Alps::new(c, 1).unwrap();
        feed(&mut a, 0);
        let _ = a.tick(5_000_000, 90.0);
        (
            a.policy_for("short").slice_us,
            a.policy_for("long").slice_us,
        )
    };
    // Both (config 1): Eq. 2 then × 0.6.
    assert_eq!(run(true, true), (2_400, 3_600));
    // None (config 2): the basic slices, short 2 ms, long 5 ms.
    assert_eq!(run(false, false), (2_000, 5_000));
    // Eq. 2 only (config 3).
    assert_eq!(run(true, false), (4_000, 6_000));
    // Eq. 3 only (config 4): basic × 0.6.
    assert_eq!(run(false, true), (1_200, 3_000));
}

#[test]
fn the_learning_method_is_used() {
    let c = AlpsConfig {
        learning: Learning::Ewma,
        ewma_weight: 1.0,
        overload: false,
        unpredictability: false,
        ..AlpsConfig::default()
    };
    let mut a = Alps::new(c, 1).unwrap();
    feed(&mut a, 0);
    let _ = a.tick(5_000_000, 0.0);
    // EWMA weighting the newest slice wholly: long's last slice, 9 ms.
    assert_eq!(a.policy_for("long").slice_us, 9_000);
    assert_eq!(a.learned("long").unwrap().basic_us, 9_000.0);
}

#[test]
fn the_window_is_bounded() {
    let c = AlpsConfig {
        max_window: 3,
        max_functions: 2,
        ..AlpsConfig::default()
    };
    let mut a = Alps::new(c, 2).unwrap();
    a.completed(done("a", 0, 10));
    a.completed(done("b", 0, 10));
    a.completed(done("c", 0, 10)); // a third function
    a.completed(Completion {
        function: "a",
        arrival_us: 50,
        end_us: 40,
        cpu_us: 1,
    }); // ends before it arrives
    a.completed(done("a", 5, 10));
    a.completed(done("b", 6, 10)); // window full
    let t = a.tick(5_000_000, 0.0).unwrap();
    assert_eq!((t.invocations, t.functions, t.ignored), (3, 2, 3));
    assert!(a.learned("c").is_none());
    assert_eq!(a.policy_for("c").rank, NEUTRAL_RANK);
}

#[test]
fn config_ranges_are_checked_with_named_errors() {
    let bad = |edit: fn(&mut AlpsConfig)| {
        let mut c = AlpsConfig::default();
        edit(&mut c);
        c.validate().unwrap_err()
    };
    assert_eq!(bad(|c| c.window_ms = 999), CpuSchedError::Window(999));
    assert_eq!(bad(|c| c.window_ms = 30_001), CpuSchedError::Window(30_001));
    assert_eq!(bad(|c| c.alpha = -0.1), CpuSchedError::Alpha(-0.1));
    assert_eq!(bad(|c| c.alpha = 11.0), CpuSchedError::Alpha(11.0));
    assert!(matches!(
        bad(|c| c.alpha = f64::NAN),
        CpuSchedError::Alpha(_)
    ));
    assert_eq!(bad(|c| c.beta = 10.5), CpuSchedError::Beta(10.5));
    assert_eq!(bad(|c| c.gamma = 0.0), CpuSchedError::Gamma(0.0));
    assert_eq!(bad(|c| c.theta_pct = 101.0), CpuSchedError::Theta(101.0));
    assert_eq!(bad(|c| c.ewma_weight = 0.0), CpuSchedError::EwmaWeight(0.0));
    assert_eq!(bad(|c| c.max_window = 0), CpuSchedError::MaxWindow(0));
    assert_eq!(bad(|c| c.max_functions = 0), CpuSchedError::MaxFunctions(0));
    assert_eq!(bad(|c| c.max_slice_ms = 0), CpuSchedError::MaxSlice(0));
    assert_eq!(bad(|c| c.neutral_rank = 0), CpuSchedError::NeutralRank(0));
    assert_eq!(
        bad(|c| c.window_ms = 500).to_string(),
        "window_ms must be between 1000 and 30000 (1–30 s), got 500"
    );
    for ok in [1_000, 30_000] {
        let c = AlpsConfig {
            window_ms: ok,
            ..AlpsConfig::default()
        };
        assert!(c.validate().is_ok());
    }
    assert_eq!(
        Alps::new(AlpsConfig::default(), 0).unwrap_err(),
        CpuSchedError::Cpus(0)
    );
    let sfs = |edit: fn(&mut SfsConfig)| {
        let mut c = SfsConfig::default();
        edit(&mut c);
        c.validate().unwrap_err()
    };
    assert_eq!(sfs(|c| c.slice_ms = 0), CpuSchedError::SfsSlice(0));
    assert_eq!(sfs(|c| c.period = 1), CpuSchedError::SfsPeriod(1));
    assert_eq!(
        sfs(|c| c.overload_factor = 0.5),
        CpuSchedError::SfsOverload(0.5)
    );
    assert_eq!(
        sfs(|c| c.min_slice_ms = 20_000),
        CpuSchedError::SfsMinSlice {
            min: 20_000,
            max: 10_000
        }
    );
    // The unused policy's settings are checked too.
    let c = CpuSchedConfig {
        kind: CpuSchedKind::Cfs,
        alps: AlpsConfig {
            gamma: -1.0,
            ..AlpsConfig::default()
        },
        ..CpuSchedConfig::default()
    };
    assert_eq!(
        CpuScheduler::new(&c, 4).unwrap_err(),
        CpuSchedError::Gamma(-1.0)
    );
}

#[test]
fn config_files_name_every_field_and_refuse_unknown_ones() {
    let c: CpuSchedConfig = serde_json::from_str(
        r#"{"kind": "alps", "alps": {"window_ms": 10000, "learning": "linear", "overload": false}}"#,
    )
    .unwrap();
    assert_eq!(c.kind, CpuSchedKind::Alps);
    assert_eq!(c.alps.window_ms, 10_000);
    assert_eq!(c.alps.learning, Learning::Linear);
    assert!(!c.alps.overload && c.alps.unpredictability);
    assert_eq!(c.alps.alpha, 2.0, "defaults fill the rest");
    let err = serde_json::from_str::<CpuSchedConfig>(r#"{"alps": {"windw_ms": 1}}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field"), "{err}");
    assert!(serde_json::from_str::<CpuSchedConfig>(r#"{"kind": "eevdf"}"#).is_err());
    assert_eq!("sfs".parse::<CpuSchedKind>(), Ok(CpuSchedKind::Sfs));
    assert!("rr"
        .parse::<CpuSchedKind>()
        .unwrap_err()
        .to_string()
        .contains("cfs, sfs or alps"));
    assert_eq!("ewma".parse::<Learning>(), Ok(Learning::Ewma));
    assert!("forest".parse::<Learning>().is_err());
}

#[test]
fn sfs_adapts_its_slice_to_the_arrival_rate() {
    let c = SfsConfig {
        period: 4,
        ..SfsConfig::default()
    };
    let mut s = Sfs::new(c, 4).unwrap();
    assert_eq!(s.slice_us(), 20_000, "the starting slice");
    // Arrivals 10 ms apart: after 4 intervals, 10 ms × 4 CPUs = 40 ms.
    for k in 0..5u64 {
        s.arrived(k * 10_000);
    }
    assert_eq!(s.slice_us(), 40_000);
    assert_eq!(
        s.policy_for("any"),
        Slice {
            rank: NEUTRAL_RANK,
            slice_us: 40_000
        }
    );
    assert_eq!(s.overload_wait_us(), Some(120_000));
    // 1 ms apart: 4 ms, below the 6 ms floor.
    for k in 1..=4u64 {
        s.arrived(40_000 + k * 1_000);
    }
    assert_eq!(s.slice_us(), 6_000);
    assert_eq!(s.updates(), 2);
    // Fixed: arrivals change nothing; no overload rule when its factor is 0.
    let mut f = Sfs::new(
        SfsConfig {
            mode: SfsMode::Fixed,
            slice_ms: 15,
            overload_factor: 0.0,
            ..SfsConfig::default()
        },
        4,
    )
    .unwrap();
    for k in 0..1000u64 {
        f.arrived(k);
    }
    assert_eq!(f.slice_us(), 15_000);
    assert_eq!(f.overload_wait_us(), None);
}

#[test]
fn the_scheduler_picks_by_kind() {
    let mut cfs = CpuScheduler::new(&CpuSchedConfig::default(), 4).unwrap();
    assert_eq!(cfs.kind(), CpuSchedKind::Cfs);
    cfs.arrived(0);
    cfs.completed(done("f", 0, 5));
    assert!(cfs.tick(10_000_000, 99.0).is_none());
    assert_eq!(cfs.policy_for("f"), Slice::FAIR);
    assert_eq!(cfs.next_tick_at(), None);
    let sfs = CpuScheduler::new(
        &CpuSchedConfig {
            kind: CpuSchedKind::Sfs,
            ..CpuSchedConfig::default()
        },
        4,
    )
    .unwrap();
    assert_eq!(sfs.policy_for("f").slice_us, 20_000);
    assert_eq!(sfs.overload_wait_us(), Some(60_000));
    let alps = CpuScheduler::new(
        &CpuSchedConfig {
            kind: CpuSchedKind::Alps,
            ..CpuSchedConfig::default()
        },
        4,
    )
    .unwrap();
    assert_eq!(alps.next_tick_at(), Some(5_000_000));
    assert!(alps.alps().is_some() && cfs.alps().is_none());
    assert_eq!(
        CpuScheduler::new(&CpuSchedConfig::default(), 0).unwrap_err(),
        CpuSchedError::Cpus(0)
    );
}
