use super::reuse::{naive_distances, Reuse, ReuseTracker};
use super::*;
use crate::time::secs;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn tracked(trace: &[(u32, u64)]) -> Vec<Reuse> {
    let mut t = ReuseTracker::new();
    trace.iter().map(|&(k, s)| t.record(k, s)).collect()
}

#[test]
fn the_thesis_example_abcbca() {
    // A=0 (100 MiB), B=1 (200), C=2 (300): A's reuse distance is size(B) + size(C).
    let trace = [(0, 100), (1, 200), (2, 300), (1, 200), (2, 300), (0, 100)];
    let d = tracked(&trace);
    use Reuse::*;
    assert_eq!(
        d,
        [
            First,
            First,
            First,
            Distance(300),
            Distance(200),
            Distance(500)
        ]
    );
    assert_eq!(d, naive_distances(&trace));
}

#[test]
fn compaction_keeps_distances_exact() {
    // Far more invocations than the tree's first size, with a long-lived rare function.
    let mut rng = SmallRng::seed_from_u64(7);
    let trace: Vec<(u32, u64)> = (0..6000)
        .map(|i| {
            let k = if i % 1500 == 0 {
                99
            } else {
                rng.gen_range(0..60)
            };
            (k, 32 + u64::from(k) * 16)
        })
        .collect();
    assert_eq!(tracked(&trace), naive_distances(&trace));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn tracker_matches_the_naive_scan(
        keys in proptest::collection::vec(0u32..12, 0..400),
        sizes in proptest::collection::vec(1u64..2048, 12),
    ) {
        let trace: Vec<(u32, u64)> = keys.iter().map(|&k| (k, sizes[k as usize])).collect();
        prop_assert_eq!(tracked(&trace), naive_distances(&trace));
    }

    #[test]
    fn curve_is_a_cdf_and_sizing_inverts_it(
        keys in proptest::collection::vec(0u32..20, 1..300),
        target in 0.01f64..1.0,
    ) {
        let names: Vec<String> = (0..20).map(|k| format!("f{k}")).collect();
        let trace: Vec<(&str, u64)> =
            keys.iter().map(|&k| (names[k as usize].as_str(), 64 + u64::from(k) * 32)).collect();
        let c = HitRatioCurve::from_trace(trace.iter().copied(), Sampler::all());
        prop_assert_eq!(c.sampled as usize, keys.len());
        let mut last = 0.0;
        for p in &c.points {
            prop_assert!(p.hit_ratio >= last && p.hit_ratio <= 1.0);
            last = p.hit_ratio;
        }
        let distinct = keys.iter().collect::<std::collections::BTreeSet<_>>().len();
        let best = 1.0 - distinct as f64 / keys.len() as f64;
        prop_assert!((c.max_hit_ratio() - best).abs() < 1e-9);
        match c.size_for(target).unwrap() {
            Some(mb) => {
                prop_assert!(c.hit_ratio(mb) >= target - 1e-9);
                prop_assert!(mb == 0 || c.hit_ratio(mb - 1) < target);
            }
            None => prop_assert!(c.max_hit_ratio() < target),
        }
    }
}

/// A Zipf-like synthetic trace: `functions` functions, popularity ∝ 1/rank, sizes 64–1024 MiB.
fn synthetic(functions: usize, invocations: usize, seed: u64) -> Vec<(String, u64)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let weights: Vec<f64> = (1..=functions).map(|r| 1.0 / r as f64).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(functions);
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cdf.push(acc);
    }
    let sizes: Vec<u64> = (0..functions)
        .map(|_| 64 * rng.gen_range(1..=16u64))
        .collect();
    (0..invocations)
        .map(|_| {
            let u: f64 = rng.gen();
            let i = cdf.partition_point(|c| *c < u).min(functions - 1);
            (format!("fn-{i}"), sizes[i])
        })
        .collect()
}

#[test]
fn shards_at_one_is_exact_and_at_a_tenth_stays_close() {
    let trace = synthetic(4000, 200_000, 3);
    let it = || trace.iter().map(|(f, m)| (f.as_str(), *m));
    let exact = HitRatioCurve::from_trace(it(), Sampler::all());
    let one = HitRatioCurve::from_trace(it(), Sampler::new(1.0).unwrap());
    assert_eq!(exact, one);
    let tenth = HitRatioCurve::from_trace(it(), Sampler::new(0.1).unwrap());
    assert!((tenth.sample_rate - 0.1).abs() < 1e-6);
    // About a tenth of the functions, and of the work.
    assert!(
        (250..600).contains(&tenth.functions),
        "{} sampled functions",
        tenth.functions
    );
    let max = exact.max_useful_mb();
    let mut worst: f64 = 0.0;
    for i in 1..=40 {
        let mb = max * i / 40;
        worst = worst.max((exact.hit_ratio(mb) - tenth.hit_ratio(mb)).abs());
    }
    assert!(worst < 0.04, "SHARDS at 0.1 is off by {worst}");
    // Sizing from the sample lands near sizing from the whole trace.
    let (e, s) = (
        exact.size_for(0.8).unwrap().unwrap(),
        tenth.size_for(0.8).unwrap().unwrap(),
    );
    assert!(
        (e as f64 - s as f64).abs() / (e as f64) < 0.15,
        "exact {e} MiB, sampled {s} MiB"
    );
}

#[test]
fn bad_rates_and_targets_are_refused() {
    for r in [0.0, -0.1, 1.5, f64::NAN] {
        assert_eq!(
            Sampler::new(r).unwrap_err().to_string(),
            ProvisionError::BadSampleRate(r).to_string()
        );
    }
    let c = HitRatioCurve::from_trace([("a", 10), ("a", 10)], Sampler::all());
    for t in [0.0, 1.01, f64::NAN, -1.0] {
        assert!(c.size_for(t).is_err(), "{t}");
    }
    // Half the invocations are compulsory misses: 0.5 is reachable, 0.6 is not.
    assert_eq!(c.size_for(0.5).unwrap(), Some(10));
    assert_eq!(c.size_for(0.6).unwrap(), None);
    assert_eq!(c.size_for(1.0).unwrap(), None);
}

#[test]
fn the_knee_is_where_the_curve_flattens() {
    // Hot functions a..d (64 MiB each) invoked round robin, and a cold tail of 1 GiB functions
    // coming back rarely: the knee is the hot set's footprint.
    let mut trace = Vec::new();
    for round in 0..200 {
        for f in ["a", "b", "c", "d"] {
            trace.push((f.to_string(), 64));
        }
        if round % 20 == 0 {
            for t in 0..4 {
                trace.push((format!("tail{}", (round / 20 + t) % 6), 1024));
            }
        }
    }
    let c = HitRatioCurve::from_trace(trace.iter().map(|(f, m)| (f.as_str(), *m)), Sampler::all());
    let knee = c.knee().unwrap();
    assert_eq!(knee.memory_mb, 256, "{c:?}");
    assert!(knee.hit_ratio >= 0.89, "{knee:?}");
    assert!(c.max_useful_mb() > 4 * 1024);
    let s = StaticSizing::of(&c, 0.9).unwrap();
    assert_eq!(s.target_mb, Some(256));
    assert!(HitRatioCurve::default().knee().is_none());
}

/// A curve where `mb` of memory gives hit ratio `mb / 1000` up to 1000 MiB.
fn linear_curve() -> HitRatioCurve {
    HitRatioCurve {
        points: (1..=1000)
            .map(|mb| CurvePoint {
                memory_mb: mb,
                hit_ratio: mb as f64 / 1000.0,
            })
            .collect(),
        sampled: 1_000_000,
        compulsory: 0,
        offered: 1_000_000,
        functions: 1000,
        skipped: 0,
        sample_rate: 1.0,
    }
}

fn controller(target: f64) -> ElasticController {
    let mut cfg = ElasticConfig::new(target, 50, 900);
    cfg.smoothing = 1.0;
    ElasticController::new(cfg, CurveSource::Fixed(linear_curve()), 500, 0).unwrap()
}

/// One interval of `arrivals` invocations of which `misses` were cold.
fn interval(c: &mut ElasticController, arrivals: u64, misses: u64) -> Option<Decision> {
    for i in 0..arrivals {
        c.on_arrival("f", 1);
        if i < misses {
            c.on_cold_start();
        }
    }
    let at = c.next_timeout();
    assert_eq!(c.on_timeout(at - 1), None, "early");
    c.on_timeout(at)
}

#[test]
fn inside_the_dead_band_nothing_changes() {
    // Target 1 miss/s over 600 s intervals; 1.25 and 0.75 misses/s are within 30 %.
    let mut c = controller(1.0);
    assert_eq!(interval(&mut c, 1200, 750), None);
    assert_eq!(interval(&mut c, 1200, 450), None);
    assert_eq!(c.size_mb(), 500);
    let last = c.last().unwrap();
    assert!((last.error + 0.25).abs() < 1e-9, "{last:?}");
    assert_eq!(c.resizes(), 0);
}

#[test]
fn too_many_misses_grow_too_few_shrink_within_bounds() {
    // At 500 MiB the curve's miss ratio is 0.5. Twice the target miss speed: m' = 0.25, so
    // 750 MiB.
    let mut c = controller(1.0);
    let d = interval(&mut c, 2400, 1200).unwrap();
    assert_eq!((d.from_mb, d.to_mb), (500, 750));
    assert!((d.miss_ratio.unwrap() - 0.25).abs() < 1e-9);
    // Far too many: bounded by the step (×1/4) and by max_mb.
    let d = interval(&mut c, 60_000, 60_000).unwrap();
    assert_eq!(d.to_mb, 900);
    // Half the target: m' doubles to 0.2 → 800 MiB.
    let d = interval(&mut c, 600, 300).unwrap();
    assert_eq!(d.to_mb, 800);
    // Nothing arrives (night): the miss ratio may grow ×4 per step, down to min_mb.
    let sizes: Vec<u64> = (0..4)
        .filter_map(|_| interval(&mut c, 0, 0))
        .map(|d| d.to_mb)
        .collect();
    assert_eq!(sizes, [200, 50]);
    assert_eq!(c.size_mb(), 50);
}

#[test]
fn an_online_curve_learns_from_arrivals() {
    let cfg = ElasticConfig {
        interval_us: secs(60),
        smoothing: 1.0,
        ..ElasticConfig::new(0.01, 64, 4096)
    };
    let b = CurveBuilder::new(Sampler::all()).bucket_mb(16);
    let mut c = ElasticController::new(cfg, CurveSource::Online(b), 4096, 0).unwrap();
    // Before any reuse the curve is empty: no basis to resize on.
    c.on_arrival("a", 128);
    c.on_cold_start();
    assert_eq!(c.on_timeout(secs(60)), None);
    // Two functions alternate: 256 MiB holds both; misses stop, so the size comes down to it.
    for _ in 0..100 {
        c.on_arrival("a", 128);
        c.on_arrival("b", 128);
    }
    let d = c.on_timeout(secs(120)).unwrap();
    assert_eq!(d.to_mb, 256, "{d:?}");
}

#[test]
fn bad_configs_are_typed_errors() {
    let ok = ElasticConfig::new(1.0, 64, 1024);
    assert_eq!(ok.validate(), Ok(()));
    let bad = [
        (
            ElasticConfig {
                interval_us: 0,
                ..ok.clone()
            },
            "interval",
        ),
        (
            ElasticConfig {
                target_miss_speed: 0.0,
                ..ok.clone()
            },
            "target",
        ),
        (
            ElasticConfig {
                target_miss_speed: f64::NAN,
                ..ok.clone()
            },
            "target",
        ),
        (
            ElasticConfig {
                dead_band: 1.0,
                ..ok.clone()
            },
            "dead band",
        ),
        (
            ElasticConfig {
                smoothing: 0.0,
                ..ok.clone()
            },
            "smoothing",
        ),
        (
            ElasticConfig {
                min_mb: 0,
                ..ok.clone()
            },
            "bounds",
        ),
        (
            ElasticConfig {
                min_mb: 2048,
                ..ok.clone()
            },
            "bounds",
        ),
    ];
    for (cfg, what) in bad {
        let err = ElasticController::new(cfg, CurveSource::Fixed(linear_curve()), 100, 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains(what), "{what}: {err}");
    }
}
