//! A worker's CPUs as an egalitarian processor-sharing server.
//!
//! With `n` jobs executing on `c` CPUs, each job progresses at rate `min(1, c / n)` (µs of work
//! per µs of time). Instead of updating every job's remaining work when `n` changes (O(n)), the
//! server keeps a *virtual time* `V`: the work any one job present all along would have received.
//! A job entering at `V₀` with work `w` finishes when `V` reaches its tag `V₀ + w`; the next
//! finisher is the smallest tag, kept in a heap, so an arrival or a departure is O(log n).
//!
//! Under the `contention` server ([`crate::contention`]) every job's rate also depends on the
//! sandboxes being created on the worker and pays an overcommit overhead; it is still one rate
//! for all jobs, so the virtual time works unchanged.
//!
//! Finish times are rounded up to whole microseconds (the core's clock), so a job never ends
//! before its work is done; a job within [`EPSILON`] of its tag counts as finished, which absorbs
//! floating-point error.

use crate::contention::Contention;
use hearth_core::Micros;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// Work (µs) below which a job is done: float error, far below the clock's 1 µs.
pub const EPSILON: f64 = 1e-3;

/// Rounds a duration up to whole µs, ignoring float noise just above an integer (10 / (2/3) is
/// 15.000000000000002 in binary floating point, and must give 15).
fn ceil_us(x: f64) -> Micros {
    (x - 1e-6).ceil().max(0.0) as Micros
}

/// A finish tag with a total order (tags are finite).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tag(f64);

impl Eq for Tag {}
impl PartialOrd for Tag {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Tag {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The processor-sharing server of one worker. Jobs are the caller's ids.
#[derive(Debug, Clone)]
pub struct ProcessorSharing {
    cpus: f64,
    virtual_time: f64,
    updated_at: Micros,
    /// (finish tag, entry order, job): equal tags finish in entry order.
    jobs: BinaryHeap<Reverse<(Tag, u64, u32)>>,
    entered: u64,
    /// The measured interference (None: ideal processor sharing).
    contention: Option<Contention>,
    /// CPUs the sandboxes being created on this worker demand (read under contention only).
    creations: f64,
}

impl ProcessorSharing {
    pub fn new(cpus: u32) -> Self {
        ProcessorSharing {
            cpus: f64::from(cpus.max(1)),
            virtual_time: 0.0,
            updated_at: 0,
            jobs: BinaryHeap::new(),
            entered: 0,
            contention: None,
            creations: 0.0,
        }
    }

    /// The `contention` server on `cpus` CPUs.
    pub fn with_contention(cpus: u32, contention: Contention) -> Self {
        ProcessorSharing {
            contention: Some(contention),
            ..ProcessorSharing::new(cpus)
        }
    }

    /// The sandboxes being created demand `creations` CPUs from `now` on (under contention;
    /// ideal processor sharing ignores them).
    pub fn set_creations(&mut self, now: Micros, creations: f64) {
        if self.contention.is_some() {
            self.advance(now);
            self.creations = creations;
        }
    }

    /// Jobs executing now.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The rate at which each job progresses now.
    pub fn rate(&self) -> f64 {
        if let Some(c) = &self.contention {
            return c.rate(self.cpus, self.jobs.len(), self.creations);
        }
        let n = self.jobs.len() as f64;
        if n <= self.cpus {
            1.0
        } else {
            self.cpus / n
        }
    }

    fn advance(&mut self, now: Micros) {
        let dt = now.saturating_sub(self.updated_at);
        if dt > 0 && !self.jobs.is_empty() {
            self.virtual_time += dt as f64 * self.rate();
        }
        self.updated_at = self.updated_at.max(now);
    }

    /// `job` starts executing `work_us` of work at `now`.
    pub fn enter(&mut self, now: Micros, job: u32, work_us: Micros) {
        self.advance(now);
        self.entered += 1;
        let tag = Tag(self.virtual_time + work_us as f64);
        self.jobs.push(Reverse((tag, self.entered, job)));
    }

    /// When the next job finishes if nothing enters before.
    pub fn next_finish(&self) -> Option<Micros> {
        let Reverse((tag, _, _)) = self.jobs.peek()?;
        let left = (tag.0 - self.virtual_time).max(0.0);
        if left <= EPSILON {
            return Some(self.updated_at);
        }
        Some(self.updated_at + ceil_us(left / self.rate()))
    }

    /// The next job whose work is done by `now`, if any (call until `None`).
    pub fn pop_finished(&mut self, now: Micros) -> Option<u32> {
        self.advance(now);
        let Reverse((tag, _, job)) = *self.jobs.peek()?;
        if tag.0 > self.virtual_time + EPSILON {
            return None;
        }
        self.jobs.pop();
        // Snap to the tag so rounding never accumulates.
        self.virtual_time = self.virtual_time.max(tag.0);
        Some(job)
    }

    /// Takes `job` off the CPUs at `now` before its work is done (its invocation timed out);
    /// the others share the CPUs from then on. O(n), but only for jobs that are killed.
    pub fn remove(&mut self, now: Micros, job: u32) -> bool {
        self.advance(now);
        let before = self.jobs.len();
        self.jobs.retain(|Reverse((_, _, j))| *j != job);
        self.jobs.len() < before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the server until empty; returns (job, finish time) in finish order.
    fn drain(ps: &mut ProcessorSharing) -> Vec<(u32, Micros)> {
        let mut out = Vec::new();
        while let Some(t) = ps.next_finish() {
            while let Some(j) = ps.pop_finished(t) {
                out.push((j, t));
            }
        }
        out
    }

    #[test]
    fn one_cpu_shares_equally() {
        // 100 and 50 units at t=0 on 1 CPU: both at rate 1/2 until the short one ends at 100,
        // then the long one alone finishes its last 50 at 150.
        let mut ps = ProcessorSharing::new(1);
        ps.enter(0, 1, 100);
        ps.enter(0, 2, 50);
        assert_eq!(drain(&mut ps), [(2, 100), (1, 150)]);
    }

    #[test]
    fn no_slowdown_up_to_the_cpu_count() {
        let mut ps = ProcessorSharing::new(2);
        ps.enter(0, 1, 30);
        ps.enter(10, 2, 5);
        assert_eq!(drain(&mut ps), [(2, 15), (1, 30)]);
    }

    #[test]
    fn a_late_arrival_slows_the_running_job_from_then_on() {
        // 1 CPU: job 1 (100) alone for 40, then shares with job 2 (30): both at 1/2; job 2
        // needs 60 more µs (done at 100), job 1 has 60 left, 30 of them by 100, the other 30
        // alone: done at 130.
        let mut ps = ProcessorSharing::new(1);
        ps.enter(0, 1, 100);
        assert_eq!(ps.next_finish(), Some(100));
        ps.enter(40, 2, 30);
        assert_eq!(ps.next_finish(), Some(100));
        assert_eq!(drain(&mut ps), [(2, 100), (1, 130)]);
    }

    #[test]
    fn three_jobs_on_two_cpus_round_up_to_whole_microseconds() {
        // 3 × 10 units on 2 CPUs: rate 2/3, all done at 15.
        let mut ps = ProcessorSharing::new(2);
        for j in 0..3 {
            ps.enter(0, j, 10);
        }
        assert_eq!(drain(&mut ps), [(0, 15), (1, 15), (2, 15)]);
        // 3 × 1 unit on 2 CPUs: 1.5 µs exactly, reported at 2.
        for j in 0..3 {
            ps.enter(100, j, 1);
        }
        assert_eq!(drain(&mut ps), [(0, 102), (1, 102), (2, 102)]);
    }

    #[test]
    fn a_removed_job_stops_sharing_from_then_on() {
        // 1 CPU: 100 and 100 units at 0, both at 1/2; job 1 removed at 40 (20 done each), job 2
        // alone does its last 80 by 120.
        let mut ps = ProcessorSharing::new(1);
        ps.enter(0, 1, 100);
        ps.enter(0, 2, 100);
        assert!(ps.remove(40, 1));
        assert!(!ps.remove(40, 1));
        assert_eq!(drain(&mut ps), [(2, 120)]);
    }

    #[test]
    fn contention_is_processor_sharing_while_jobs_fit_the_cpus() {
        let mut ps = ProcessorSharing::new(2);
        let mut cs = ProcessorSharing::with_contention(2, Contention::default());
        for s in [&mut ps, &mut cs] {
            s.enter(0, 1, 30);
            s.enter(10, 2, 5);
        }
        assert_eq!(drain(&mut cs), drain(&mut ps));
    }

    #[test]
    fn overcommitted_jobs_run_slower_than_processor_sharing_by_the_fitted_overhead() {
        // 4 × 100 units on 2 CPUs: PS ends all at 200; contention at 200 × 1.05 = 210.
        let mut ps = ProcessorSharing::new(2);
        let mut cs = ProcessorSharing::with_contention(2, Contention::default());
        for j in 0..4 {
            ps.enter(0, j, 100);
            cs.enter(0, j, 100);
        }
        assert!(drain(&mut ps).iter().all(|&(_, t)| t == 200));
        assert!(drain(&mut cs).iter().all(|&(_, t)| t == 210));
    }

    #[test]
    fn creations_in_flight_slow_the_running_jobs_under_contention_only() {
        // 2 jobs of 100 on 2 CPUs with 5 short creations (0.6 CPU each) from 0 to 50: a
        // demand of 5 on 2 CPUs,
        // rate 2 / 5 / 1.05; by 50 each job has 50 × 0.381 = 19.05 done, the other 80.95 at
        // full speed: done at 130.95 → 131. Ideal processor sharing ignores the creations.
        let mut ps = ProcessorSharing::new(2);
        let mut cs = ProcessorSharing::with_contention(2, Contention::default());
        for s in [&mut ps, &mut cs] {
            s.enter(0, 1, 100);
            s.enter(0, 2, 100);
            s.set_creations(0, 3.0);
        }
        assert_eq!(drain(&mut ps), [(1, 100), (2, 100)]);
        assert_eq!(cs.next_finish(), Some(263));
        cs.set_creations(50, 0.0);
        assert_eq!(drain(&mut cs), [(1, 131), (2, 131)]);
    }

    #[test]
    fn zero_work_finishes_at_once() {
        let mut ps = ProcessorSharing::new(1);
        ps.enter(7, 3, 0);
        assert_eq!(ps.next_finish(), Some(7));
        assert_eq!(ps.pop_finished(7), Some(3));
        assert!(ps.is_empty());
    }
}
