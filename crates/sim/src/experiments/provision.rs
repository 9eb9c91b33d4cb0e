//! `provision`: FaasCache's provisioning (thesis §3.4) through the simulator.
//!
//! (a) Fig. 3.2: the hit-ratio curve from reuse distances (exact, and SHARDS at rate 0.1) beside
//! the hit ratio one simulated server actually sees at several memory sizes under GDSF and LRU
//! keep-alive (the keepalive experiment's server: no CPU contention, the trace at its speed).
//!
//! (b) Fig. 3.8: elastic vertical scaling over a day of the trace: the static size for a target
//! hit ratio `h` against the elastic controller (Eq. 3.3: 10-minute interval, 30 % dead band)
//! aiming at the miss speed `(1 − h) · λ̄`, both on the same server; cold starts per second over
//! time, and the server's average size.

use super::metrics::RunMetrics;
use super::plot::{self, Axis, LinePanel, Series};
use super::runner::{run_all, Job};
use super::{azure, describe, f, AzureSample, Options, Output, Table, AZURE_1350};
use crate::config::{Routing, SimConfig, SimElastic};
use crate::error::{Result, SimError};
use crate::record::{End, Record, Sink};
use crate::simulation::{simulate, SimStats};
use crate::workload::Workload;
use hearth_core::balance::BalanceKind;
use hearth_core::provision::elastic::DEFAULT_INTERVAL_US;
use hearth_core::provision::{CurveSource, ElasticConfig, HitRatioCurve, Sampler};
use hearth_core::{KeepAliveConfig, KeepAliveKind, Micros, RegulatorConfig};
use hearth_loadgen::make::{mapping::Mapping, select::Selection, Scaling};
use plotters::prelude::SeriesLabelPosition;
use serde_json::json;

/// CPUs of the server: more than ever run at once, so only caching decides.
const UNCONTENDED_CPUS: u32 = 1_000_000;
/// The SHARDS rate compared with the exact curve.
const SHARDS_RATE: f64 = 0.1;
/// The target hit ratio of static sizing and of the elastic controller's miss speed.
const TARGET_HIT_RATIO: f64 = 0.9;
/// The smallest memory simulated.
const MIN_MB: u64 = 256;

fn sample(quick: bool) -> AzureSample {
    AzureSample {
        file: AZURE_1350,
        selection: Selection::Representative(if quick { 200 } else { 400 }),
        minutes: if quick { 120 } else { 1440 },
        mapping: Mapping::Busy,
        scaling: Scaling::None,
    }
}

fn server(kind: KeepAliveKind, memory_mb: u64) -> SimConfig {
    SimConfig {
        workers: 1,
        cpus: UNCONTENDED_CPUS,
        memory_mb,
        free_buffer_mb: 0,
        regulator: RegulatorConfig::Fixed(u32::MAX),
        keepalive: KeepAliveConfig::new(kind),
        routing: Routing::seeded(BalanceKind::RoundRobin, 0),
        ..SimConfig::default()
    }
}

fn curve(w: &Workload, sampler: Sampler) -> HitRatioCurve {
    HitRatioCurve::from_trace(
        w.arrivals.iter().map(|a| {
            let f = w.function(a.function);
            (&*f.name, f.memory_mb)
        }),
        sampler,
    )
}

/// Sizes spread evenly on a log scale from [`MIN_MB`] to the curve's reach.
fn sizes(c: &HitRatioCurve, n: usize) -> Vec<u64> {
    let hi = c.max_useful_mb().max(MIN_MB * 2) as f64;
    let lo = MIN_MB as f64;
    let mut v: Vec<u64> = (0..n)
        .map(|i| (lo * (hi / lo).powf(i as f64 / (n - 1).max(1) as f64)).round() as u64)
        .collect();
    v.dedup();
    v
}

/// Observed hit ratio: warm starts among all invocations (a dropped one is a miss too).
fn observed(m: &RunMetrics) -> f64 {
    let warm = m.completed().saturating_sub(m.cold());
    warm as f64 / m.invocations().max(1) as f64
}

/// Invocations and cold starts per interval, binned by arrival.
struct Timeline {
    bin_us: Micros,
    arrivals: Vec<u64>,
    cold: Vec<u64>,
}

impl Timeline {
    fn new(bin_us: Micros) -> Self {
        Timeline {
            bin_us,
            arrivals: Vec::new(),
            cold: Vec::new(),
        }
    }
}

impl Sink for Timeline {
    fn record(&mut self, r: &Record) -> Result<()> {
        let i = (r.scheduled_us / self.bin_us) as usize;
        if self.arrivals.len() <= i {
            self.arrivals.resize(i + 1, 0);
            self.cold.resize(i + 1, 0);
        }
        self.arrivals[i] += 1;
        let cold = match r.end {
            End::Done { cold, .. } | End::TimedOut { cold, .. } => cold.is_some(),
            // A dropped invocation is a miss.
            End::Dropped(_) => true,
        };
        self.cold[i] += u64::from(cold);
        Ok(())
    }
}

/// Time-weighted mean budget (MiB) over `[0, end)` from a worker's budget changes.
fn mean_budget(changes: &[(Micros, u32, u64)], end: Micros) -> f64 {
    let mut sum = 0.0;
    for (i, &(t, _, mb)) in changes.iter().enumerate() {
        let until = changes.get(i + 1).map_or(end, |c| c.0).min(end);
        sum += mb as f64 * until.saturating_sub(t) as f64;
    }
    sum / end.max(1) as f64
}

/// Runs servers side by side (one thread each), recording their timelines.
fn timelines(w: &Workload, configs: &[SimConfig]) -> Result<Vec<(SimStats, Timeline)>> {
    let run = |c: &SimConfig| -> Result<(SimStats, Timeline)> {
        let mut t = Timeline::new(DEFAULT_INTERVAL_US);
        let s = simulate(w, c, &mut t)?;
        Ok((s, t))
    };
    super::runner::side_by_side(configs, run)
}

/// The smallest static size (within `[lo, hi]`, bisected on a log scale `steps` times) whose
/// simulated miss speed over the whole trace meets `target`; `hi` when none does.
fn static_meeting(
    w: &Workload,
    lo: u64,
    hi: u64,
    target: f64,
    span_s: f64,
    steps: usize,
) -> Result<u64> {
    let meets = |mb: u64| -> Result<bool> {
        let job = Job {
            label: format!("provision static {mb} MiB"),
            workload: w,
            config: server(KeepAliveKind::Gdsf, mb),
        };
        let m = &run_all(std::slice::from_ref(&job), 1)?[0];
        let misses = m.invocations() - m.completed().saturating_sub(m.cold());
        Ok(misses as f64 / span_s <= target)
    };
    if meets(lo)? {
        return Ok(lo);
    }
    let (mut lo, mut hi) = (lo, hi);
    for _ in 0..steps {
        let mid = ((lo as f64 * hi as f64).sqrt()).round() as u64;
        if mid <= lo || mid >= hi {
            break;
        }
        if meets(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}

pub(super) fn run(o: &Options) -> Result<Output> {
    let (w, made) = azure(o, &sample(o.quick))?;
    let mut md = format!(
        "# provision: hit-ratio curves and elastic scaling (thesis Figs. 3.2, 3.8)\n\n\
         * {}\n\
         * One server, no CPU contention, the trace at its real speed (as `keepalive`). \
         Hit ratio = warm starts ÷ invocations.\n\n",
        describe("representative", &made, &w)
    );
    // (a) The curve against simulation.
    let exact = curve(&w, Sampler::all());
    let bad = |e: hearth_core::provision::ProvisionError| SimError::Config(e.to_string());
    let shards = curve(&w, Sampler::new(SHARDS_RATE).map_err(bad)?);
    let memory = sizes(&exact, if o.quick { 4 } else { 8 });
    let kinds = [KeepAliveKind::Gdsf, KeepAliveKind::Lru];
    let mut jobs = Vec::new();
    for kind in kinds {
        for mb in &memory {
            jobs.push(Job {
                label: format!("provision {kind} {mb} MiB"),
                workload: &w,
                config: server(kind, *mb),
            });
        }
    }
    let results = run_all(&jobs, o.jobs)?;
    let mut table = Table::new(&[
        "memory (MiB)",
        "curve (exact)",
        "curve (SHARDS 0.1)",
        "simulated GDSF",
        "simulated LRU",
    ]);
    let mut rows = Vec::new();
    let mut sim_series: Vec<Series> = kinds
        .iter()
        .map(|k| Series {
            label: format!("simulated {k}"),
            points: Vec::new(),
        })
        .collect();
    for (i, mb) in memory.iter().enumerate() {
        let obs: Vec<f64> = (0..kinds.len())
            .map(|k| observed(&results[k * memory.len() + i]))
            .collect();
        let dropped: Vec<u64> = (0..kinds.len())
            .map(|k| results[k * memory.len() + i].dropped())
            .collect();
        table.row(vec![
            mb.to_string(),
            f(exact.hit_ratio(*mb), 3),
            f(shards.hit_ratio(*mb), 3),
            f(obs[0], 3),
            f(obs[1], 3),
        ]);
        for (k, s) in sim_series.iter_mut().enumerate() {
            s.points.push((*mb as f64 / 1024.0, obs[k]));
        }
        rows.push(json!({
            "memory_mb": mb, "curve_exact": exact.hit_ratio(*mb),
            "curve_shards": shards.hit_ratio(*mb), "gdsf": obs[0], "lru": obs[1],
            "dropped_gdsf": dropped[0], "dropped_lru": dropped[1],
        }));
    }
    let worst_shards = (1..=200)
        .map(|i| exact.max_useful_mb() * i / 200)
        .map(|mb| (exact.hit_ratio(mb) - shards.hit_ratio(mb)).abs())
        .fold(0.0, f64::max);
    let shards_errors: Vec<(f64, f64)> = [0.5, 0.25, SHARDS_RATE]
        .into_iter()
        .map(|r| -> Result<(f64, f64)> {
            let c = curve(&w, Sampler::new(r).map_err(bad)?);
            let err = (1..=200)
                .map(|i| exact.max_useful_mb() * i / 200)
                .map(|mb| (exact.hit_ratio(mb) - c.hit_ratio(mb)).abs())
                .fold(0.0, f64::max);
            Ok((r, err))
        })
        .collect::<Result<_>>()?;
    let knee = exact.knee();
    let static_mb = exact
        .size_for(TARGET_HIT_RATIO)
        .map_err(bad)?
        .unwrap_or(exact.max_useful_mb())
        .max(MIN_MB);
    md.push_str(&format!(
        "## (a) Hit-ratio curve vs simulation (Fig. 3.2)\n\n\
         Curve from {} invocations of {} functions ({} compulsory misses, best hit ratio {}); \
         SHARDS at rate {SHARDS_RATE} read {} of them ({} functions) and stays within {} of the \
         exact curve (largest error over 200 sizes; at other rates: {}). Knee: {}; {} of hits \
         needs {static_mb} MiB.\n\n{}\n",
        exact.sampled,
        exact.functions,
        exact.compulsory,
        f(exact.max_hit_ratio(), 3),
        shards.sampled,
        shards.functions,
        f(worst_shards, 3),
        shards_errors
            .iter()
            .map(|(r, e)| format!("{r} → {}", f(*e, 3)))
            .collect::<Vec<_>>()
            .join(", "),
        knee.map_or("none".to_string(), |k| format!(
            "{} MiB (hit ratio {})",
            k.memory_mb,
            f(k.hit_ratio, 3)
        )),
        TARGET_HIT_RATIO,
        table.markdown()
    ));
    let curve_series = |label: &str, c: &HitRatioCurve| Series {
        label: label.to_string(),
        points: (0..=120)
            .map(|i| {
                let mb = MIN_MB as f64
                    * (memory[memory.len() - 1] as f64 / MIN_MB as f64).powf(i as f64 / 120.0);
                (mb / 1024.0, c.hit_ratio(mb as u64))
            })
            .collect(),
    };
    let mut series = vec![
        curve_series("reuse distances (exact)", &exact),
        curve_series("reuse distances (SHARDS 0.1)", &shards),
    ];
    series.extend(sim_series);
    let fig_a = o.out.join("provision_hit_ratio.png");
    plot::lines(
        &fig_a,
        "Hit ratio vs memory: reuse-distance curve and simulation",
        &[LinePanel {
            title: format!("representative ({} functions)", w.functions.len()),
            x: Axis::log("memory (GiB)"),
            y: Axis::linear("hit ratio"),
            series,
            markers: false,
            legend: SeriesLabelPosition::LowerRight,
        }],
        (900, 560),
    )?;

    // (b) Elastic vs static.
    let span_s = w
        .arrivals
        .last()
        .map_or(1.0, |a| a.at_us as f64 / 1e6)
        .max(1.0);
    let mean_rate = w.arrivals.len() as f64 / span_s;
    let target = ((1.0 - TARGET_HIT_RATIO) * mean_rate).max(1e-6);
    let elastic = ElasticConfig {
        min_mb: MIN_MB,
        max_mb: (static_mb * 4).max(MIN_MB),
        ..ElasticConfig::new(target, MIN_MB, static_mb * 4)
    };
    let static_cfg = server(KeepAliveKind::Gdsf, static_mb);
    let elastic_cfg = SimConfig {
        elastic: Some(SimElastic {
            config: elastic.clone(),
            curve: CurveSource::Fixed(exact.clone()),
        }),
        ..server(KeepAliveKind::Gdsf, static_mb)
    };
    let steps = if o.quick { 2 } else { 5 };
    let met_mb = static_meeting(&w, static_mb, elastic.max_mb, target, span_s, steps)?;
    let mut runs = timelines(
        &w,
        &[static_cfg, server(KeepAliveKind::Gdsf, met_mb), elastic_cfg],
    )?
    .into_iter();
    let (Some((s_static, t_static)), Some((s_met, t_met)), Some((s_elastic, t_elastic))) =
        (runs.next(), runs.next(), runs.next())
    else {
        return Err(SimError::Internal("a provisioning run is missing".into()));
    };
    let end = s_elastic.end_us.max(1);
    let avg_mb = mean_budget(&s_elastic.budgets, end);
    let interval_s = DEFAULT_INTERVAL_US as f64 / 1e6;
    let per_s = |t: &Timeline| -> Vec<(f64, f64)> {
        t.cold
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    (i as f64 + 0.5) * interval_s / 3600.0,
                    *c as f64 / interval_s,
                )
            })
            .collect()
    };
    let within = |t: &Timeline| -> f64 {
        let n = t.cold.len().max(1);
        let ok = t
            .cold
            .iter()
            .filter(|c| ((**c as f64 / interval_s) - target).abs() <= 0.3 * target)
            .count();
        ok as f64 / n as f64
    };
    let cold_ratio = |s: &SimStats| (s.cold + s.dropped) as f64 / s.invocations.max(1) as f64;
    let mut t2 = Table::new(&[
        "server",
        "mean size (MiB)",
        "cold starts",
        "cold ratio",
        "cold/s (target)",
        "intervals within ±30 %",
        "resizes",
    ]);
    for (name, s, t, mb) in [
        ("static, curve size", &s_static, &t_static, static_mb as f64),
        ("static, meets target", &s_met, &t_met, met_mb as f64),
        ("elastic", &s_elastic, &t_elastic, avg_mb),
    ] {
        t2.row(vec![
            name.into(),
            f(mb, 0),
            (s.cold + s.dropped).to_string(),
            f(cold_ratio(s), 4),
            format!(
                "{} ({})",
                f((s.cold + s.dropped) as f64 / span_s, 3),
                f(target, 3)
            ),
            f(100.0 * within(t), 0) + " %",
            (s.budgets.len().saturating_sub(1)).to_string(),
        ]);
    }
    let saving = 100.0 * (1.0 - avg_mb / met_mb as f64);
    let saving_curve = 100.0 * (1.0 - avg_mb / static_mb as f64);
    md.push_str(&format!(
        "\n## (b) Elastic vs static provisioning (Fig. 3.8)\n\n\
         Static: the curve's size for hit ratio {TARGET_HIT_RATIO} ({static_mb} MiB). Elastic: \
         starts there, target miss speed (1 − {TARGET_HIT_RATIO}) × λ̄ = {} cold starts/s \
         (λ̄ = {} invocations/s), every {} min, dead band {} %, between {} and {} MiB. \
         `static, meets target`: the smallest static size whose simulated miss speed over the \
         whole trace meets the target (bisected, {steps} steps, from the curve's size up to the \
         elastic maximum). The elastic server's mean size is {} it ({} the curve's \
         size).\n\n{}\n",
        f(target, 3),
        f(mean_rate, 2),
        DEFAULT_INTERVAL_US / 60_000_000,
        f(100.0 * elastic.dead_band, 0),
        elastic.min_mb,
        elastic.max_mb,
        relative(saving),
        relative(saving_curve),
        t2.markdown()
    ));
    let size_points: Vec<(f64, f64)> = {
        let mut pts = Vec::new();
        for (i, &(t, _, mb)) in s_elastic.budgets.iter().enumerate() {
            let until = s_elastic.budgets.get(i + 1).map_or(end, |c| c.0);
            pts.push((t as f64 / 3.6e9, mb as f64 / 1024.0));
            pts.push((until as f64 / 3.6e9, mb as f64 / 1024.0));
        }
        pts
    };
    let hours = end as f64 / 3.6e9;
    let fig_b = o.out.join("provision_elastic.png");
    plot::lines(
        &fig_b,
        "Elastic vertical scaling (10-minute interval, 30 % dead band)",
        &[
            LinePanel {
                title: "cold starts per second".into(),
                x: Axis::linear("time (hours)"),
                y: Axis::linear("cold starts / s"),
                series: vec![
                    Series {
                        label: "static, curve size".into(),
                        points: per_s(&t_static),
                    },
                    Series {
                        label: "static, meets target".into(),
                        points: per_s(&t_met),
                    },
                    Series {
                        label: "elastic".into(),
                        points: per_s(&t_elastic),
                    },
                    Series {
                        label: "target".into(),
                        points: vec![(0.0, target), (hours, target)],
                    },
                ],
                markers: false,
                legend: SeriesLabelPosition::UpperRight,
            },
            LinePanel {
                title: "server memory".into(),
                x: Axis::linear("time (hours)"),
                y: Axis::linear("memory (GiB)"),
                series: vec![
                    Series {
                        label: "static, curve size".into(),
                        points: vec![
                            (0.0, static_mb as f64 / 1024.0),
                            (hours, static_mb as f64 / 1024.0),
                        ],
                    },
                    Series {
                        label: "static, meets target".into(),
                        points: vec![
                            (0.0, met_mb as f64 / 1024.0),
                            (hours, met_mb as f64 / 1024.0),
                        ],
                    },
                    Series {
                        label: "elastic".into(),
                        points: size_points,
                    },
                ],
                markers: false,
                legend: SeriesLabelPosition::UpperRight,
            },
        ],
        (1500, 520),
    )?;
    let json = json!({
        "experiment": "provision",
        "functions": w.functions.len(),
        "invocations": w.arrivals.len(),
        "curve": {
            "exact_functions": exact.functions, "compulsory": exact.compulsory,
            "max_hit_ratio": exact.max_hit_ratio(), "max_useful_mb": exact.max_useful_mb(),
            "knee": knee, "target_hit_ratio": TARGET_HIT_RATIO, "target_mb": static_mb,
            "shards_rate": SHARDS_RATE, "shards_functions": shards.functions,
            "shards_max_error": worst_shards,
            "shards_errors": shards_errors.iter().map(|(r, e)| json!({"rate": r, "max_error": e}))
                .collect::<Vec<_>>(),
        },
        "hit_ratio": rows,
        "elastic": {
            "target_miss_speed": target, "mean_rate": mean_rate,
            "static_mb": static_mb, "static_meeting_target_mb": met_mb,
            "elastic_mean_mb": avg_mb, "saving_pct": saving, "saving_vs_curve_pct": saving_curve,
            "static_cold": s_static.cold + s_static.dropped,
            "static_meeting_target_cold": s_met.cold + s_met.dropped,
            "elastic_cold": s_elastic.cold + s_elastic.dropped,
            "static_within_pct": 100.0 * within(&t_static),
            "elastic_within_pct": 100.0 * within(&t_elastic),
            "budgets": s_elastic.budgets.iter().map(|(t, _, mb)| json!([*t as f64 / 1e6, mb]))
                .collect::<Vec<_>>(),
            "cold_per_s_static": per_s(&t_static).iter().map(|p| p.1).collect::<Vec<_>>(),
            "cold_per_s_elastic": per_s(&t_elastic).iter().map(|p| p.1).collect::<Vec<_>>(),
        },
    });
    Ok((md, json, vec![fig_a, fig_b]))
}

/// "12.3 % below" for a saving of 12.3 %, "4.5 % above" for a negative one.
fn relative(saving_pct: f64) -> String {
    if saving_pct >= 0.0 {
        format!("{} % below", f(saving_pct, 1))
    } else {
        format!("{} % above", f(-saving_pct, 1))
    }
}
