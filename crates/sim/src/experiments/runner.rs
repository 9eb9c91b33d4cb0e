//! Runs an experiment's simulations, several at once on separate threads. Each simulation is
//! single-threaded and deterministic; results come back in the order the jobs were given, so the
//! thread count never changes an experiment's output.

use super::metrics::RunMetrics;
use crate::config::SimConfig;
use crate::error::{Result, SimError};
use crate::simulation::simulate;
use crate::workload::Workload;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// One simulation of an experiment.
pub struct Job<'w> {
    pub label: String,
    pub workload: &'w Workload,
    pub config: SimConfig,
}

/// Runs `jobs` on up to `threads` threads; the metrics come back in job order.
pub fn run_all(jobs: &[Job<'_>], threads: usize) -> Result<Vec<RunMetrics>> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<RunMetrics>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    let threads = threads.clamp(1, jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let t0 = Instant::now();
                let mut m = RunMetrics::new(job.workload, job.config.workers);
                let r = simulate(job.workload, &job.config, &mut m).map(|_| m);
                tracing::info!(
                    job = %job.label,
                    invocations = job.workload.arrivals.len(),
                    seconds = format!("{:.2}", t0.elapsed().as_secs_f64()),
                    "simulated"
                );
                if let Ok(mut slots) = results.lock() {
                    slots[i] = Some(r);
                }
            });
        }
    });
    let slots = results
        .into_inner()
        .map_err(|_| SimError::Internal("a simulation thread panicked".into()))?;
    slots
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(SimError::Internal("a simulation did not run".into()))))
        .collect()
}

/// Runs `f` on every item at once, one thread each (for a few simulations whose own sinks the
/// caller needs back); the results come back in item order.
pub fn side_by_side<I: Sync, T: Send>(
    items: &[I],
    f: impl Fn(&I) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items.iter().map(|i| scope.spawn(move || f(i))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| SimError::Internal("a simulation thread panicked".into()))?
            })
            .collect()
    })
}
