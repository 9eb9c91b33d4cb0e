//! What an experiment measures of one run, aggregated as the records arrive (no per-invocation
//! rows are kept, so a day-long trace costs a few KiB per function).
//!
//! Slowdown (stretch, normalized latency) is `e2e ÷ warm time`, the warm time being the
//! metadata's: the CH-RLU paper's and the thesis's metric, and `hearth report`'s `weighted
//! normalized latency` when given `--meta`.

use crate::error::Result;
use crate::record::{End, Record, Sink};
use crate::workload::Workload;
use hearth_core::balance::WorkerLoad;
use hearth_core::Micros;
use serde::Serialize;

/// The CPU load a workload offers a cluster: its CPU work (each invocation's warm time; a
/// cold start's init is a delay in the model, not CPU work) over the CPU time the cluster has,
/// on average over the span and per window, because a mean hides the peaks that build queues.
/// A reader judges a comparison by where it ran: at 50 % or at 150 %.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OfferedLoad {
    /// CPUs of the whole cluster.
    pub cpus: u64,
    /// The span the mean is over (µs).
    pub span_us: Micros,
    /// Σ work ÷ (CPUs × span).
    pub mean: f64,
    /// Width of the windows (µs). An invocation's work is spread over the time it would run
    /// at full speed from its arrival: the CPUs it would hold if it started at once.
    pub window_us: Micros,
    /// The median, the 95th percentile and the maximum of the windows' offered loads.
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
    /// Share of the windows whose offered load exceeds the CPUs (over 100 %).
    pub over: f64,
}

/// At most this many windows: wider windows past it, so a huge span or a tiny window stays
/// cheap.
const MAX_WINDOWS: u64 = 1_000_000;

impl OfferedLoad {
    /// The load `w` offers `cpus` CPUs over `span_us` (at least up to its last arrival), with
    /// windows of `window_us` until the last invocation would end.
    pub fn of(w: &Workload, cpus: u64, span_us: Micros, window_us: Micros) -> Self {
        let last = w.arrivals.last().map_or(0, |a| a.at_us);
        let span_us = span_us.max(last + 1);
        let end_us = w
            .arrivals
            .iter()
            .map(|a| a.at_us + w.function(a.function).warm_us)
            .fold(span_us, u64::max);
        let cpus = cpus.max(1);
        let window_us = window_us.max(1).max(end_us.div_ceil(MAX_WINDOWS));
        let windows = end_us.div_ceil(window_us) as usize;
        // Work in each window: partial windows at the ends of a run directly, whole windows
        // between them through a difference array, so a long function costs O(1).
        let mut work = vec![0i128; windows + 1];
        let mut whole = vec![0i128; windows + 1];
        let mut total: u128 = 0;
        for a in &w.arrivals {
            let (from, len) = (a.at_us, w.function(a.function).warm_us);
            total += u128::from(len);
            if len == 0 {
                continue;
            }
            let to = from + len;
            let (i0, i1) = ((from / window_us) as usize, ((to - 1) / window_us) as usize);
            if i0 == i1 {
                work[i0] += i128::from(len);
                continue;
            }
            work[i0] += i128::from((i0 as u64 + 1) * window_us - from);
            work[i1] += i128::from(to - i1 as u64 * window_us);
            whole[i0 + 1] += 1;
            whole[i1] -= 1;
        }
        let mut running = 0i128;
        let mut loads: Vec<f64> = (0..windows)
            .map(|i| {
                running += whole[i];
                let start = i as u64 * window_us;
                // The last window may be cut short.
                let width = window_us.min(end_us - start);
                let us = work[i] + running * i128::from(window_us);
                us as f64 / (cpus as f64 * width as f64)
            })
            .collect();
        loads.sort_by(f64::total_cmp);
        let at =
            |q: f64| loads[((q * loads.len() as f64).ceil() as usize).clamp(1, loads.len()) - 1];
        let (p50, p95) = (at(0.5), at(0.95));
        let over = loads.iter().filter(|l| **l > 1.0).count() as f64 / loads.len() as f64;
        OfferedLoad {
            cpus,
            span_us,
            mean: total as f64 / (cpus as f64 * span_us as f64),
            window_us,
            p50,
            p95,
            max: loads[loads.len() - 1],
            over,
        }
    }

    /// "52 % offered CPU load on 16 CPUs (per 10 s window: median 50 %, p95 80 %, max 130 %,
    /// 4.0 % of windows over 100 %)", for results headers.
    pub fn describe(&self) -> String {
        format!(
            "{:.0} % offered CPU load on {} CPUs (per {} window: median {:.0} %, p95 {:.0} %, max {:.0} %, {:.1} % of windows over 100 %)",
            100.0 * self.mean,
            self.cpus,
            window_name(self.window_us),
            100.0 * self.p50,
            100.0 * self.p95,
            100.0 * self.max,
            100.0 * self.over,
        )
    }
}

/// "10 s", "500 ms", "2 min": a window's width for a reader.
fn window_name(us: Micros) -> String {
    if us >= 60_000_000 && us.is_multiple_of(60_000_000) {
        format!("{} min", us / 60_000_000)
    } else if us >= 1_000_000 && us.is_multiple_of(1_000_000) {
        format!("{} s", us / 1_000_000)
    } else {
        format!("{} ms", us / 1000)
    }
}

/// Totals of one function.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FunctionMetrics {
    pub invocations: u64,
    pub completed: u64,
    pub dropped: u64,
    /// Killed at their function's timeout.
    pub timed_out: u64,
    pub cold: u64,
    /// Σ e2e ÷ warm over completed invocations (functions with a warm time).
    pub sum_stretch: f64,
    pub sum_queue_us: u64,
    pub sum_init_us: u64,
    pub sum_exec_us: u64,
    pub sum_e2e_us: u64,
    /// Completed after the function's deadline (functions with one).
    pub missed_deadline: u64,
    /// Cold starts that paid less than the function's init: they specialized a generic
    /// sandbox (the only way the simulator shortens an init) …
    pub specialized: u64,
    /// … and the init time that saved them.
    pub sum_init_saved_us: u64,
}

impl FunctionMetrics {
    pub fn mean_stretch(&self) -> Option<f64> {
        (self.completed > 0).then(|| self.sum_stretch / self.completed as f64)
    }

    fn mean(&self, v: u64) -> f64 {
        v as f64 / self.completed.max(1) as f64
    }

    pub fn mean_queue_ms(&self) -> f64 {
        self.mean(self.sum_queue_us) / 1000.0
    }

    pub fn mean_init_ms(&self) -> f64 {
        self.mean(self.sum_init_us) / 1000.0
    }

    pub fn mean_exec_ms(&self) -> f64 {
        self.mean(self.sum_exec_us) / 1000.0
    }
}

/// A run's metrics: per function, and the spread of load across workers.
#[derive(Debug, Clone, Serialize)]
pub struct RunMetrics {
    /// Unloaded warm time of each function (µs), from the workload.
    #[serde(skip)]
    warm_us: Vec<Micros>,
    #[serde(skip)]
    deadline_us: Vec<Option<Micros>>,
    /// Full init time of each function (µs), to tell specialized cold starts apart.
    #[serde(skip)]
    init_us: Vec<Micros>,
    pub functions: Vec<FunctionMetrics>,
    /// The latest reported normalized load of each worker.
    #[serde(skip)]
    latest_load: Vec<f64>,
    /// Σ over status rounds of the variance of load across workers, and the rounds.
    sum_load_variance: f64,
    load_rounds: u64,
    /// End-to-end times of completed invocations in buckets 1 % wide (see [`e2e_bucket`]),
    /// for tail quantiles without keeping every invocation.
    #[serde(skip)]
    e2e_hist: Vec<u64>,
    /// The first arrival and the last end seen (µs), and the CPU work of completed
    /// invocations (Σ warm time), for the measured busy fraction.
    #[serde(skip)]
    first_arrival_us: Option<Micros>,
    #[serde(skip)]
    last_end_us: Micros,
    #[serde(skip)]
    work_done_us: u128,
}

/// Growth factor of the latency histogram's buckets: quantiles within 1 %.
const HIST_GROWTH: f64 = 1.01;
/// Buckets up to about 3 × 10⁹ µs (almost an hour); later ends go in the last.
const HIST_BUCKETS: usize = 2200;

/// The bucket of an end-to-end time: ⌊log₁.₀₁(µs)⌋.
fn e2e_bucket(us: Micros) -> usize {
    let b = (us.max(1) as f64).ln() / HIST_GROWTH.ln();
    (b.floor() as usize).min(HIST_BUCKETS - 1)
}

impl RunMetrics {
    pub fn new(w: &Workload, workers: usize) -> Self {
        RunMetrics {
            warm_us: w.functions.iter().map(|f| f.warm_us).collect(),
            deadline_us: w.functions.iter().map(|f| f.deadline_us).collect(),
            init_us: w.functions.iter().map(|f| f.init_us).collect(),
            functions: vec![FunctionMetrics::default(); w.functions.len()],
            latest_load: vec![0.0; workers],
            sum_load_variance: 0.0,
            load_rounds: 0,
            e2e_hist: vec![0; HIST_BUCKETS],
            first_arrival_us: None,
            last_end_us: 0,
            work_done_us: 0,
        }
    }

    /// The share of `cpus` CPUs the run kept busy: the CPU work of completed invocations
    /// (their warm times) over the CPU time from the first arrival to the last end. Below the
    /// offered load when the run drops or times out work; at most 1 under processor sharing,
    /// where the CPUs are busy whenever work is waiting for them.
    pub fn busy_fraction(&self, cpus: u64) -> f64 {
        let Some(first) = self.first_arrival_us else {
            return 0.0;
        };
        let span = self.last_end_us.saturating_sub(first).max(1);
        self.work_done_us as f64 / (cpus.max(1) as f64 * span as f64)
    }

    /// The `q` quantile (0–1) of completed invocations' end-to-end times, in ms (within 1 %:
    /// the upper edge of its bucket); 0 when none completed.
    pub fn e2e_quantile_ms(&self, q: f64) -> f64 {
        let n: u64 = self.e2e_hist.iter().sum();
        if n == 0 {
            return 0.0;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, c) in self.e2e_hist.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return HIST_GROWTH.powi(b as i32 + 1) / 1000.0;
            }
        }
        HIST_GROWTH.powi(HIST_BUCKETS as i32) / 1000.0
    }

    /// Invocations of functions with a deadline that missed it, over those invocations
    /// (the paper's "% deadlines missed"), for the functions `select` picks: late completions,
    /// and drops and timeouts, which never meet one. Returns (missed, invocations).
    pub fn deadlines_missed_of(&self, select: impl Fn(usize) -> bool) -> (u64, u64) {
        self.functions
            .iter()
            .zip(&self.deadline_us)
            .enumerate()
            .filter(|(i, (_, d))| d.is_some() && select(*i))
            .fold((0, 0), |(m, n), (_, (f, _))| {
                (
                    m + f.missed_deadline + f.dropped + f.timed_out,
                    n + f.invocations,
                )
            })
    }

    fn total(&self, pick: impl Fn(&FunctionMetrics) -> u64) -> u64 {
        self.functions.iter().map(pick).sum()
    }

    pub fn invocations(&self) -> u64 {
        self.total(|f| f.invocations)
    }

    pub fn completed(&self) -> u64 {
        self.total(|f| f.completed)
    }

    pub fn dropped(&self) -> u64 {
        self.total(|f| f.dropped)
    }

    pub fn cold(&self) -> u64 {
        self.total(|f| f.cold)
    }

    /// Cold starts that specialized a generic sandbox.
    pub fn specialized(&self) -> u64 {
        self.total(|f| f.specialized)
    }

    /// Init time generic sandboxes saved (µs).
    pub fn init_saved_us(&self) -> u64 {
        self.total(|f| f.sum_init_saved_us)
    }

    /// Init time cold starts paid (µs).
    pub fn init_us(&self) -> u64 {
        self.total(|f| f.sum_init_us)
    }

    pub fn cold_ratio(&self) -> f64 {
        self.cold() as f64 / self.completed().max(1) as f64
    }

    /// Mean slowdown over completed invocations: each function's mean weighted by its
    /// completed invocations (the papers' "weighted normalized latency", "global slowdown").
    pub fn weighted_slowdown(&self) -> f64 {
        let (sum, n) = self
            .functions
            .iter()
            .zip(&self.warm_us)
            .filter(|(_, w)| **w > 0)
            .fold((0.0, 0u64), |(s, n), (f, _)| {
                (s + f.sum_stretch, n + f.completed)
            });
        sum / n.max(1) as f64
    }

    /// Weighted slowdown of the functions `select` picks (by index).
    pub fn weighted_slowdown_of(&self, select: impl Fn(usize) -> bool) -> f64 {
        let (sum, n) = self
            .functions
            .iter()
            .enumerate()
            .filter(|(i, _)| select(*i) && self.warm_us[*i] > 0)
            .fold((0.0, 0u64), |(s, n), (_, f)| {
                (s + f.sum_stretch, n + f.completed)
            });
        sum / n.max(1) as f64
    }

    /// Each function's mean slowdown (functions that completed something), unsorted.
    pub fn per_function_slowdown(&self) -> Vec<f64> {
        self.functions
            .iter()
            .zip(&self.warm_us)
            .filter(|(_, w)| **w > 0)
            .filter_map(|(f, _)| f.mean_stretch())
            .collect()
    }

    /// The thesis's keep-alive metric (ch. 3.6): time added by cold starts as a percentage of
    /// the warm execution time of all completed invocations.
    pub fn cold_overhead_pct(&self) -> f64 {
        let init: u64 = self.total(|f| f.sum_init_us);
        let warm: u64 = self
            .functions
            .iter()
            .zip(&self.warm_us)
            .map(|(f, w)| f.completed * w)
            .sum();
        100.0 * init as f64 / warm.max(1) as f64
    }

    /// Completed invocations that missed their function's deadline, as a share of those
    /// completed with a deadline.
    pub fn missed_deadline_ratio(&self) -> f64 {
        let with: u64 = self
            .functions
            .iter()
            .zip(&self.deadline_us)
            .filter(|(_, d)| d.is_some())
            .map(|(f, _)| f.completed)
            .sum();
        self.total(|f| f.missed_deadline) as f64 / with.max(1) as f64
    }

    /// Mean time in the worker queue (ms) over completed invocations.
    pub fn mean_queue_ms(&self) -> f64 {
        self.total(|f| f.sum_queue_us) as f64 / self.completed().max(1) as f64 / 1000.0
    }

    /// Mean execution time (ms), stretched by processor sharing.
    pub fn mean_exec_ms(&self) -> f64 {
        self.total(|f| f.sum_exec_us) as f64 / self.completed().max(1) as f64 / 1000.0
    }

    /// Mean over status rounds of the variance of the normalized load across workers
    /// (the CH-RLU paper's Fig. 8c).
    pub fn mean_load_variance(&self) -> f64 {
        self.sum_load_variance / self.load_rounds.max(1) as f64
    }
}

impl Sink for RunMetrics {
    fn record(&mut self, r: &Record) -> Result<()> {
        let i = r.function as usize;
        let warm = self.warm_us[i];
        let deadline = self.deadline_us[i];
        let full_init = self.init_us[i];
        self.first_arrival_us = Some(
            self.first_arrival_us
                .map_or(r.scheduled_us, |t| t.min(r.scheduled_us)),
        );
        self.last_end_us = self.last_end_us.max(r.end_us);
        if matches!(r.end, End::Done { .. }) {
            self.work_done_us += u128::from(warm);
        }
        let f = &mut self.functions[i];
        f.invocations += 1;
        match r.end {
            End::Done {
                cold,
                queue_us,
                init_us,
                exec_us,
            } => {
                f.completed += 1;
                f.cold += u64::from(cold.is_some());
                f.sum_queue_us += queue_us;
                f.sum_init_us += init_us;
                if cold.is_some() && init_us < full_init {
                    f.specialized += 1;
                    f.sum_init_saved_us += full_init - init_us;
                }
                f.sum_exec_us += exec_us;
                f.sum_e2e_us += r.e2e_us();
                self.e2e_hist[e2e_bucket(r.e2e_us())] += 1;
                f.missed_deadline += u64::from(deadline.is_some_and(|d| r.e2e_us() > d));
                if warm > 0 {
                    f.sum_stretch += r.e2e_us() as f64 / warm as f64;
                }
            }
            End::Dropped(_) => f.dropped += 1,
            End::TimedOut { .. } => f.timed_out += 1,
        }
        Ok(())
    }

    fn status(&mut self, _now: Micros, worker: u32, load: &WorkerLoad) {
        if let Some(l) = self.latest_load.get_mut(worker as usize) {
            *l = load.load;
        }
        // One round per push of the first worker (pushes are staggered over the interval).
        if worker == 0 && self.latest_load.len() > 1 {
            let n = self.latest_load.len() as f64;
            let mean = self.latest_load.iter().sum::<f64>() / n;
            let var = self
                .latest_load
                .iter()
                .map(|l| (l - mean) * (l - mean))
                .sum::<f64>()
                / n;
            self.sum_load_variance += var;
            self.load_rounds += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Refusal;
    use crate::workload::{Arrival, SimFunction};
    use hearth_core::{ColdReason, Reject};

    fn workload() -> Workload {
        let f = |name: &str, warm_us| SimFunction::new(name, warm_us, 0, 64);
        Workload {
            functions: vec![f("a", 100), f("b", 1000)],
            arrivals: vec![Arrival {
                at_us: 0,
                function: 0,
            }],
        }
    }

    fn done(function: u32, e2e: u64, init: u64, cold: bool) -> Record {
        Record {
            id: 0,
            function,
            worker: Some(0),
            scheduled_us: 10,
            end_us: 10 + e2e,
            end: End::Done {
                cold: cold.then_some(ColdReason::New),
                queue_us: 0,
                init_us: init,
                exec_us: e2e - init,
            },
        }
    }

    #[test]
    fn cold_starts_shorter_than_the_init_count_as_specialized() {
        let mut w = workload();
        w.functions[0].init_us = 50;
        let mut m = RunMetrics::new(&w, 1);
        m.record(&done(0, 150, 50, true)).unwrap();
        m.record(&done(0, 110, 10, true)).unwrap();
        m.record(&done(0, 100, 0, true)).unwrap();
        m.record(&done(0, 100, 0, false)).unwrap();
        assert_eq!(
            (m.cold(), m.specialized(), m.init_saved_us()),
            (3, 2, 40 + 50)
        );
    }

    #[test]
    fn offered_load_by_hand() {
        let mut w = workload();
        // b (1000 µs) and a (100 µs) at 0, b again at 1500: 1100 µs of work in [0, 1000), 500
        // in [1000, 2000) and 500 in [2000, 2500), after the span, where the last b ends.
        w.arrivals = [(0, 1), (0, 0), (1500, 1)]
            .into_iter()
            .map(|(at_us, function)| Arrival { at_us, function })
            .collect();
        let l = OfferedLoad::of(&w, 1, 2000, 1000);
        assert!((l.mean - 2100.0 / 2000.0).abs() < 1e-12, "{l:?}");
        assert!(
            (l.max - 1.1).abs() < 1e-12 && (l.p95 - 1.1).abs() < 1e-12,
            "{l:?}"
        );
        // Sorted 0.5, 1.0 (the short last window, full), 1.1.
        assert!((l.p50 - 1.0).abs() < 1e-12, "{l:?}");
        assert!((l.over - 1.0 / 3.0).abs() < 1e-12, "{l:?}");
        // Twice the CPUs halve every load; a span shorter than the trace reaches its last arrival.
        let two = OfferedLoad::of(&w, 2, 0, 1000);
        assert_eq!(two.span_us, 1501);
        assert!(
            (two.mean - 2100.0 / (2.0 * 1501.0)).abs() < 1e-12,
            "{two:?}"
        );
        assert!((two.max - 0.55).abs() < 1e-12 && two.over == 0.0, "{two:?}");
        assert!(l
            .describe()
            .starts_with("105 % offered CPU load on 1 CPUs (per 1 ms window"));
        // Work is spread over the windows it runs in: b alone over 10 windows of 100 µs.
        w.arrivals.truncate(1);
        let spread = OfferedLoad::of(&w, 1, 1000, 100);
        assert_eq!((spread.p50, spread.max, spread.over), (1.0, 1.0, 0.0));
        // A window far narrower than the span is widened to keep the count bounded.
        let fine = OfferedLoad::of(&w, 1, 10_000_000_000, 1);
        assert_eq!(fine.window_us, 10_000);
    }

    #[test]
    fn busy_fraction_is_completed_work_over_the_run() {
        let mut m = RunMetrics::new(&workload(), 1);
        assert_eq!(m.busy_fraction(4), 0.0);
        // a (100 µs warm) arrives at 10 and ends at 110; b (1000) ends at 2010.
        m.record(&done(0, 100, 0, false)).unwrap();
        m.record(&done(1, 2000, 0, false)).unwrap();
        let mut dropped = done(1, 5, 0, false);
        dropped.end = End::Dropped(Refusal::Worker(Reject::QueueFull { length: 1 }));
        m.record(&dropped).unwrap();
        // 1100 µs of work over 2000 µs: dropped work is not done.
        assert!((m.busy_fraction(1) - 0.55).abs() < 1e-12);
        assert!((m.busy_fraction(2) - 0.275).abs() < 1e-12);
    }

    #[test]
    fn slowdowns_and_overheads_by_hand() {
        let mut m = RunMetrics::new(&workload(), 2);
        // a: 100 µs warm; ran 100 (×1) and 300 (×3, 200 of them init). b: 1000 warm, ran 2000.
        m.record(&done(0, 100, 0, false)).unwrap();
        m.record(&done(0, 300, 200, true)).unwrap();
        m.record(&done(1, 2000, 0, false)).unwrap();
        let mut dropped = done(1, 5, 0, false);
        dropped.end = End::Dropped(Refusal::Worker(Reject::QueueFull { length: 1 }));
        m.record(&dropped).unwrap();
        assert_eq!(
            (m.invocations(), m.completed(), m.dropped(), m.cold()),
            (4, 3, 1, 1)
        );
        // (1 + 3 + 2) / 3 invocations.
        assert!((m.weighted_slowdown() - 2.0).abs() < 1e-12);
        assert!((m.weighted_slowdown_of(|i| i == 0) - 2.0).abs() < 1e-12);
        let mut per = m.per_function_slowdown();
        per.sort_by(f64::total_cmp);
        assert_eq!(per, [2.0, 2.0]);
        // 200 µs of init over 100 + 100 + 1000 µs of warm work.
        assert!((m.cold_overhead_pct() - 100.0 * 200.0 / 1200.0).abs() < 1e-9);
        assert_eq!((m.specialized(), m.init_saved_us()), (0, 0));
        m.status(
            0,
            1,
            &WorkerLoad {
                load: 2.0,
                ..WorkerLoad::default()
            },
        );
        m.status(
            1,
            0,
            &WorkerLoad {
                load: 0.0,
                ..WorkerLoad::default()
            },
        );
        assert!((m.mean_load_variance() - 1.0).abs() < 1e-12);
    }
}
