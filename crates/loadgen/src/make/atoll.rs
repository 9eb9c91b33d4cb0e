//! Atoll's evaluation workloads (Singhvi et al., SoCC '21, §7.1, Tables 2–3).
//!
//! Workloads 1 and 2: `apps` single-function apps, dealt round-robin over the classes C1–C4;
//! each draws its execution time and slack uniformly from its class's range (Table 2) and is
//! driven by the sum of one to three arrival patterns drawn from Table 3 (workload 1: on/off,
//! constant, sine; workload 2: those and Poisson). C4's multi-function diamond apps are modelled
//! as single functions whose execution time is the diamond's critical path (the class's range is
//! already the app's time). Workload 3: the most invoked functions of an Azure trace whose mean
//! execution is 18–124 ms, with slack 15–25 % of the execution time.
//!
//! The paper lists no allocation (cold start) overheads, so every function draws one from
//! [`SETUP_MS`]: from Hearth's measured runc sandbox creation (40 ms, docs/experiments.md) to
//! the synthetic traces' default cold cost (500 ms). Memory is [`MEM_MB`] for synthetic apps.
//! Each function's class is its metadata `source`: `atoll:C1`…`atoll:C4`, `atoll:W3:<hash>`.

use super::azure::{self, AzureFiles, SourceFunction};
use super::mapping::{self, Mapping};
use super::synthetic::{self, Shape};
use super::{expand_minutes, Made, Scaling};
use crate::error::{LoadgenError, Result};
use crate::metadata::{FunctionMeta, Metadata};
use crate::trace::{Invocation, Trace};
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;
use std::ops::RangeInclusive;
use std::time::Duration;

/// Execution time and slack ranges (ms) of the classes C1–C4 (Table 2).
pub const CLASSES: [(&str, RangeInclusive<f64>, RangeInclusive<f64>); 4] = [
    ("C1", 10.0..=20.0, 30.0..=40.0),
    ("C2", 300.0..=500.0, 200.0..=300.0),
    ("C3", 100.0..=200.0, 800.0..=1000.0),
    ("C4", 100.0..=1500.0, 900.0..=4000.0),
];
/// Sandbox set-up (cold start) cost range (ms); the paper gives none (see the module doc).
pub const SETUP_MS: RangeInclusive<f64> = 40.0..=500.0;
/// Memory of a synthetic app (MiB): the synthetic traces' default.
pub const MEM_MB: f64 = 128.0;
/// Workload 3: mean execution range (ms) and slack as a fraction of execution.
pub const W3_EXEC_MS: RangeInclusive<f64> = 18.0..=124.0;
pub const W3_SLACK: RangeInclusive<f64> = 0.15..=0.25;
/// Most arrival patterns summed for one app.
pub const MAX_PATTERNS: usize = 3;
/// Largest number of apps accepted (bounds the work a command line can ask for).
pub const MAX_APPS: usize = 10_000;

/// Options of `hearth trace make atoll`.
#[derive(Debug, Clone)]
pub struct AtollOptions {
    /// 1, 2 or 3.
    pub workload: u8,
    pub apps: usize,
    pub duration: Duration,
    /// Workload 3's Azure files.
    pub azure: Option<AzureFiles>,
    pub scaling: Scaling,
    pub seed: u64,
}

fn uniform(rng: &mut impl Rng, r: &RangeInclusive<f64>) -> f64 {
    // Two decimals keep the files readable; the range still holds.
    let v = rng.gen_range(r.clone());
    ((v * 100.0).round() / 100.0).clamp(*r.start(), *r.end())
}

fn secs(rng: &mut impl Rng, lo: f64, hi: f64) -> Duration {
    Duration::from_secs_f64(rng.gen_range(lo..=hi))
}

/// One Table 3 pattern: 0 on/off, 1 constant, 2 sine, 3 Poisson.
fn pattern(rng: &mut impl Rng, kind: usize) -> Shape {
    match kind {
        0 => {
            // Period 5–20 s, split in equal mean on and off times.
            let half = secs(rng, 5.0, 20.0) / 2;
            Shape::OnOffRequests {
                requests: rng.gen_range(200..=800),
                mean_on: half,
                mean_off: half,
            }
        }
        1 => Shape::Constant {
            rate: rng.gen_range(100.0..=200.0),
        },
        2 => {
            let rate: f64 = rng.gen_range(300.0..=1000.0);
            let amplitude: f64 = rng.gen_range(100.0..=500.0);
            // The paper's amplitude is in requests/s; a rate cannot go below 0.
            Shape::Sine {
                rate,
                amplitude: (amplitude / rate).min(1.0),
                period: secs(rng, 10.0, 30.0),
            }
        }
        _ => Shape::Poisson {
            rate: rng.gen_range(300.0..=1000.0),
        },
    }
}

/// The patterns of one app of workload 1 or 2.
pub fn patterns(rng: &mut impl Rng, workload: u8) -> Vec<Shape> {
    let kinds = if workload == 1 { 3 } else { 4 };
    let n = rng.gen_range(1..=MAX_PATTERNS);
    (0..n)
        .map(|_| {
            let kind = rng.gen_range(0..kinds);
            pattern(rng, kind)
        })
        .collect()
}

fn meta(
    name: String,
    warm_ms: f64,
    cold_ms: f64,
    mem_mb: f64,
    slack: f64,
    source: String,
) -> FunctionMeta {
    FunctionMeta {
        source,
        // Both terms have two decimals; rounding drops the float noise of the sum.
        deadline_ms: Some(((warm_ms + slack) * 100.0).round() / 100.0),
        ..super::busy_meta(name, warm_ms, cold_ms, mem_mb)
    }
}

/// Makes Atoll workload `o.workload`.
pub fn make(o: &AtollOptions) -> Result<Made> {
    let bad = |m: String| Err(LoadgenError::Config(m));
    if !(1..=3).contains(&o.workload) {
        return bad(format!("--workload must be 1, 2 or 3, got {}", o.workload));
    }
    if o.apps == 0 || o.apps > MAX_APPS {
        return bad(format!("--apps must be 1..={MAX_APPS}, got {}", o.apps));
    }
    if o.duration.is_zero() {
        return bad("--duration must be positive".into());
    }
    let mut rng = ChaCha8Rng::seed_from_u64(o.seed);
    let mut made = if o.workload == 3 {
        workload3(o, &mut rng)?
    } else {
        synthetic_apps(o, &mut rng)?
    };
    made.scale(o.scaling)?;
    Ok(made)
}

fn synthetic_apps(o: &AtollOptions, rng: &mut ChaCha8Rng) -> Result<Made> {
    let mut metadata = Metadata::default();
    let mut invocations = Vec::new();
    let width = (o.apps - 1).to_string().len();
    for i in 0..o.apps {
        let (class, exec, slack) = &CLASSES[i % CLASSES.len()];
        let name = format!("{}-{i:0width$}", class.to_lowercase());
        let warm = uniform(rng, exec);
        let slack = uniform(rng, slack);
        let cold = uniform(rng, &SETUP_MS);
        metadata.insert(meta(
            name.clone(),
            warm,
            cold,
            MEM_MB,
            slack,
            format!("atoll:{class}"),
        ));
        for shape in patterns(rng, o.workload) {
            let at = synthetic::instants(&shape, o.duration, rng).map_err(LoadgenError::Config)?;
            invocations.extend(at.into_iter().map(|at_us| Invocation {
                at_us,
                function: name.clone(),
            }));
        }
    }
    Ok(Made {
        trace: Trace::from_invocations(invocations),
        metadata,
        span_s: o.duration.as_secs_f64(),
        notes: vec![format!(
            "Atoll workload {}: {} apps over C1–C4, 1–{MAX_PATTERNS} patterns each; rates are the paper's (a 64-machine cluster): scale with --target-concurrency or --time-scale",
            o.workload, o.apps
        )],
    })
}

fn workload3(o: &AtollOptions, rng: &mut ChaCha8Rng) -> Result<Made> {
    let Some(files) = &o.azure else {
        return Err(LoadgenError::Config(
            "workload 3 replays an Azure trace: give --invocations (e.g. ../shared/traces/azure2019-invitro-sample/1350_inv.csv)".into(),
        ));
    };
    if !files.invocations.is_file() {
        return Err(LoadgenError::Config(format!(
            "workload 3: the Azure invocations file {} is missing (see ../shared/traces/SOURCES.md)",
            files.invocations.display()
        )));
    }
    let minutes = (o.duration.as_secs_f64() / 60.0).ceil().max(1.0) as usize;
    let (functions, mut notes) = azure::read(files, 0, minutes)?;
    let available = functions.len();
    let mut eligible: Vec<SourceFunction> = functions
        .into_iter()
        .filter(|f| W3_EXEC_MS.contains(&f.avg_ms) && f.invocations() >= 2)
        .collect();
    if eligible.is_empty() {
        return Err(LoadgenError::Config(format!(
            "workload 3: no function of {} has a mean execution of 18–124 ms and 2 invocations in the first {minutes} minutes",
            files.invocations.display()
        )));
    }
    // The most invoked ("popular") ones; the stable sort keeps file order among ties.
    eligible.sort_by_key(|f| std::cmp::Reverse(f.invocations()));
    eligible.truncate(o.apps);
    notes.insert(
        0,
        format!(
            "Atoll workload 3: the {} most invoked of {available} functions with a mean execution of 18–124 ms",
            eligible.len()
        ),
    );
    let span_us = o.duration.as_micros() as u64;
    let mut taken = HashSet::new();
    let mut metadata = Metadata::default();
    let mut invocations = Vec::new();
    for f in &eligible {
        let name = mapping::function_name(&f.id, &mut taken);
        let mut m = mapping::map(f, name.clone(), Mapping::Busy);
        // Two decimals, as the synthetic apps, so that the deadline is exactly exec + slack.
        m.warm_ms = (m.warm_ms * 100.0).round() / 100.0;
        let slack = uniform(
            rng,
            &(m.warm_ms * W3_SLACK.start()..=m.warm_ms * W3_SLACK.end()),
        );
        let cold = uniform(rng, &SETUP_MS);
        metadata.insert(meta(
            name.clone(),
            m.warm_ms,
            cold,
            m.mem_mb,
            slack,
            format!("atoll:W3:{}", f.id),
        ));
        invocations.extend(
            expand_minutes(&f.per_minute)
                .into_iter()
                .filter(|at| *at < span_us)
                .map(|at_us| Invocation {
                    at_us,
                    function: name.clone(),
                }),
        );
    }
    Ok(Made {
        trace: Trace::from_invocations(invocations),
        metadata,
        span_s: o.duration.as_secs_f64(),
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(workload: u8, apps: usize, secs: u64, seed: u64) -> AtollOptions {
        AtollOptions {
            workload,
            apps,
            duration: Duration::from_secs(secs),
            azure: None,
            scaling: Scaling::None,
            seed,
        }
    }

    #[test]
    fn classes_and_deadlines_follow_table_2() {
        for w in [1, 2] {
            let made = make(&opts(w, 8, 3, 11)).unwrap();
            assert_eq!(made.metadata.functions.len(), 8);
            let mut per_class = std::collections::BTreeMap::new();
            for f in made.metadata.functions.values() {
                let class = f.class().unwrap();
                *per_class.entry(class.to_string()).or_insert(0) += 1;
                let (_, exec, slack) = CLASSES.iter().find(|(c, _, _)| *c == class).unwrap();
                let d = f.deadline_ms.unwrap();
                let s = d - f.warm_ms;
                assert!(exec.contains(&f.warm_ms), "{f:?}");
                assert!(
                    s >= slack.start() - 1e-9 && s <= slack.end() + 1e-9,
                    "{f:?}"
                );
                assert!(SETUP_MS.contains(&f.cold_ms), "{f:?}");
                assert!(f.function.starts_with(&class.to_lowercase()), "{f:?}");
            }
            // Split evenly: two apps per class.
            assert!(per_class.values().all(|n| *n == 2), "{per_class:?}");
            assert!(!made.trace.invocations.is_empty());
        }
    }

    #[test]
    fn the_same_seed_makes_the_same_files() {
        let dir = tempfile::tempdir().unwrap();
        let write = |seed: u64, n: &str| {
            let made = make(&opts(2, 6, 4, seed)).unwrap();
            let (t, m) = (
                dir.path().join(format!("{n}.csv")),
                dir.path().join(format!("{n}.meta.csv")),
            );
            made.write(&t, &m).unwrap();
            (std::fs::read(t).unwrap(), std::fs::read(m).unwrap())
        };
        let a = write(5, "a");
        assert_eq!(a, write(5, "b"));
        assert_ne!(a, write(6, "c"));
        let back = Metadata::read(&dir.path().join("a.meta.csv")).unwrap();
        assert!(back.functions.values().all(|f| f.deadline_ms.is_some()));
    }

    #[test]
    fn workload_1_has_no_poisson_and_workload_2_does() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let w1: Vec<Shape> = (0..200).flat_map(|_| patterns(&mut rng, 1)).collect();
        assert!(!w1.iter().any(|s| matches!(s, Shape::Poisson { .. })));
        for kind in [0, 1, 2] {
            assert!(w1
                .iter()
                .any(|s| std::mem::discriminant(s)
                    == std::mem::discriminant(&pattern(&mut rng, kind))));
        }
        let w2: Vec<Shape> = (0..200).flat_map(|_| patterns(&mut rng, 2)).collect();
        assert!(w2.iter().any(|s| matches!(s, Shape::Poisson { .. })));
        for s in w1.iter().chain(&w2) {
            match *s {
                Shape::Constant { rate } => assert!((100.0..=200.0).contains(&rate)),
                Shape::Poisson { rate } => assert!((300.0..=1000.0).contains(&rate)),
                Shape::Sine { rate, period, .. } => {
                    assert!((300.0..=1000.0).contains(&rate));
                    assert!((10.0..=30.0).contains(&period.as_secs_f64()));
                }
                Shape::OnOffRequests {
                    requests,
                    mean_on,
                    mean_off,
                } => {
                    assert!((200..=800).contains(&requests));
                    assert_eq!(mean_on, mean_off);
                    assert!((5.0..=20.0).contains(&(mean_on + mean_off).as_secs_f64()));
                }
                _ => panic!("not a Table 3 pattern: {s:?}"),
            }
        }
    }

    #[test]
    fn scaling_to_a_concurrency_applies() {
        let mut o = opts(1, 4, 5, 2);
        o.scaling = Scaling::Concurrency(2.0);
        let made = make(&o).unwrap();
        assert!((made.expected_concurrency() - 2.0).abs() < 1e-6);
    }

    #[test]
    fn bad_options_are_refused_with_the_reason() {
        for (o, needle) in [
            (opts(4, 4, 5, 1), "--workload"),
            (opts(0, 4, 5, 1), "--workload"),
            (opts(1, 0, 5, 1), "--apps"),
            (opts(1, 4, 0, 1), "--duration"),
            (opts(3, 4, 5, 1), "--invocations"),
        ] {
            let err = make(&o).unwrap_err().to_string();
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
        let mut o = opts(3, 4, 5, 1);
        o.azure = Some(AzureFiles {
            invocations: "/nonexistent/x_inv.csv".into(),
            durations: "/nonexistent/x_run.csv".into(),
            memory: "/nonexistent/x_mem.csv".into(),
        });
        assert!(make(&o).unwrap_err().to_string().contains("missing"));
    }

    #[test]
    fn workload_3_keeps_the_popular_functions_of_18_to_124_ms() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // a: 50 ms, invoked 10 times; b: 200 ms (too long); c: 20 ms, 4 times; e: 30 ms, 6 times.
        std::fs::write(
            d.join("1_inv.csv"),
            "HashOwner,HashApp,HashFunction,Trigger,1,2\no,x,a,http,5,5\no,x,b,http,9,9\no,x,c,http,2,2\no,x,e,http,3,3\n",
        )
        .unwrap();
        std::fs::write(
            d.join("1_run.csv"),
            "HashFunction,Average,Count,Minimum,Maximum\na,50,1,1,90\nb,200,1,1,300\nc,20,1,1,30\ne,30,1,1,40\n",
        )
        .unwrap();
        std::fs::write(d.join("1_mem.csv"), "HashApp,AverageAllocatedMb\nx,150\n").unwrap();
        let mut o = opts(3, 2, 120, 1);
        o.azure = Some(AzureFiles::beside(&d.join("1_inv.csv")).unwrap());
        let made = make(&o).unwrap();
        let fns: Vec<&FunctionMeta> = made.metadata.functions.values().collect();
        let sources: HashSet<&str> = fns.iter().map(|f| f.source.as_str()).collect();
        assert_eq!(sources, HashSet::from(["atoll:W3:a", "atoll:W3:e"]));
        for f in fns {
            assert_eq!(f.class(), Some("W3"));
            let slack = f.deadline_ms.unwrap() - f.warm_ms;
            assert!(
                slack >= 0.15 * f.warm_ms - 1e-9 && slack <= 0.25 * f.warm_ms + 1e-9,
                "{f:?}"
            );
            assert!(SETUP_MS.contains(&f.cold_ms));
        }
        assert_eq!(made.trace.invocations.len(), 16);
        // A one-minute duration keeps only the first minute.
        let mut short = o.clone();
        short.duration = Duration::from_secs(60);
        assert_eq!(make(&short).unwrap().trace.invocations.len(), 8);
    }
}
