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
    in_parallel(jobs, threads, |job| {
        let t0 = Instant::now();
        let mut m = RunMetrics::new(job.workload, job.config.workers);
        let r = simulate(job.workload, &job.config, &mut m).map(|_| m);
        tracing::info!(
            job = %job.label,
            invocations = job.workload.arrivals.len(),
            seconds = format!("{:.2}", t0.elapsed().as_secs_f64()),
            "simulated"
        );
        r
    })
}

/// Runs `f` on every item at once, one thread each (for a few simulations whose own sinks the
/// caller needs back); the results come back in item order.
pub fn side_by_side<I: Sync, T: Send>(
    items: &[I],
    f: impl Fn(&I) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    in_parallel(items, items.len(), f)
}

/// Runs `f` on every item, on up to `threads` threads taking the next item as they finish
/// one; the results come back in item order, so the thread count never changes them.
pub fn in_parallel<I: Sync, T: Send>(
    items: &[I],
    threads: usize,
    f: impl Fn(&I) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<T>>>> =
        Mutex::new((0..items.len()).map(|_| None).collect());
    let threads = threads.clamp(1, items.len().max(1));
    let panicked = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let r = f(item);
                    if let Ok(mut slots) = results.lock() {
                        slots[i] = Some(r);
                    }
                })
            })
            .collect();
        // Joined here, so a panicking simulation is an error, not a panic of the caller.
        handles
            .into_iter()
            .map(|h| h.join().is_err())
            .fold(false, |any, this| any | this)
    });
    let slots = results
        .into_inner()
        .ok()
        .filter(|_| !panicked)
        .ok_or_else(|| SimError::Internal("a simulation thread panicked".into()))?;
    slots
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(SimError::Internal("a simulation did not run".into()))))
        .collect()
}
