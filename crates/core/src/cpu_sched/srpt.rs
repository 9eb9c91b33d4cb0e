//! The SRPT simulation of one window (ALPS §5.1 step 2): the window's invocations replayed on
//! the worker's CPUs under preemptive shortest-remaining-processing-time, with no context-switch
//! cost, recording each invocation's waiting time and its time slices.
//!
//! At any instant the `cpus` jobs with the least remaining work run. An arrival with less work
//! than the running job with the most remaining preempts that job; a completion hands its CPU to
//! the waiting job with the least remaining work. Ties keep arrival order (a newcomer never
//! preempts an equal). Running jobs all progress at rate 1, so their order by remaining work is
//! their order by finish time: the running set is kept by finish time, and each arrival or
//! completion costs O(log n).

use crate::time::Micros;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

/// One completed invocation of the window, as the simulation needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowJob {
    /// The function's index in the caller's table.
    pub function: u32,
    pub arrival_us: Micros,
    /// CPU time it used (its size for SRPT).
    pub cpu_us: Micros,
}

/// What SRPT did with the window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SrptRun {
    /// Per job (in the input order): time it spent not running between arrival and end.
    pub wait_us: Vec<Micros>,
    /// Per job: when it ended.
    pub end_us: Vec<Micros>,
    /// Every time slice, as (job index, length), in the order the slices ended. A slice is a
    /// stretch of uninterrupted running; zero-length ones (started and preempted at the same
    /// instant) are left out.
    pub slices: Vec<(u32, Micros)>,
}

/// Replays `jobs` under SRPT on `cpus` CPUs (at least 1).
pub fn simulate(jobs: &[WindowJob], cpus: u32) -> SrptRun {
    let n = jobs.len();
    let cpus = cpus.max(1) as usize;
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by_key(|&j| (jobs[j as usize].arrival_us, j));
    let mut run = SrptRun {
        wait_us: vec![0; n],
        end_us: vec![0; n],
        slices: Vec::with_capacity(n + n / 2),
    };
    // Running jobs by (finish time, job): the last one has the most work left.
    let mut running: BTreeSet<(Micros, u32)> = BTreeSet::new();
    // When each running job's current slice began.
    let mut started: Vec<Micros> = vec![0; n];
    // Waiting jobs by (remaining work, job): ties go to the earlier arrival (smaller index in
    // arrival order, see `rank`).
    let mut waiting: BinaryHeap<Reverse<(Micros, u32, u32)>> = BinaryHeap::new();
    // Position of each job in arrival order, the tie-breaker among equal remaining work.
    let mut rank = vec![0u32; n];
    for (pos, &j) in order.iter().enumerate() {
        rank[j as usize] = pos as u32;
    }
    let mut next = 0;
    loop {
        let arrival = order.get(next).map(|&j| jobs[j as usize].arrival_us);
        let finish = running.first().map(|&(t, _)| t);
        // Completions first at equal times: the freed CPU is there for the newcomer.
        let completion = match (finish, arrival) {
            (None, None) => break,
            (Some(tf), Some(ta)) => tf <= ta,
            (Some(_), None) => true,
            (None, Some(_)) => false,
        };
        if completion {
            let Some((t, j)) = running.pop_first() else {
                break;
            };
            let len = t - started[j as usize];
            if len > 0 {
                run.slices.push((j, len));
            }
            run.end_us[j as usize] = t;
            if let Some(Reverse((left, _, k))) = waiting.pop() {
                started[k as usize] = t;
                running.insert((t + left, k));
            }
            continue;
        }
        let j = order[next];
        next += 1;
        let ta = jobs[j as usize].arrival_us;
        let work = jobs[j as usize].cpu_us;
        if work == 0 {
            run.end_us[j as usize] = ta;
            continue;
        }
        if running.len() < cpus {
            started[j as usize] = ta;
            running.insert((ta + work, j));
            continue;
        }
        let Some(&(t_last, k)) = running.last() else {
            continue;
        };
        let left = t_last - ta;
        if work < left {
            running.pop_last();
            let len = ta - started[k as usize];
            if len > 0 {
                run.slices.push((k, len));
            }
            waiting.push(Reverse((left, rank[k as usize], k)));
            started[j as usize] = ta;
            running.insert((ta + work, j));
        } else {
            waiting.push(Reverse((work, rank[j as usize], j)));
        }
    }
    for (j, job) in jobs.iter().enumerate() {
        let span = run.end_us[j] - job.arrival_us;
        run.wait_us[j] = span.saturating_sub(job.cpu_us);
    }
    run
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(function: u32, arrival_us: Micros, cpu_us: Micros) -> WindowJob {
        WindowJob {
            function,
            arrival_us,
            cpu_us,
        }
    }

    /// Slices of each job, in the order they ended.
    fn slices_of(run: &SrptRun, j: u32) -> Vec<Micros> {
        run.slices
            .iter()
            .filter(|(k, _)| *k == j)
            .map(|(_, l)| *l)
            .collect()
    }

    #[test]
    fn a_short_arrival_preempts_a_long_job_on_one_cpu() {
        // A (10) at 0; B (3) at 2: B has less left than A's 8, runs 2–5; A resumes 5–13.
        let run = simulate(&[job(0, 0, 10), job(1, 2, 3)], 1);
        assert_eq!(run.end_us, [13, 5]);
        assert_eq!(run.wait_us, [3, 0]);
        assert_eq!(slices_of(&run, 0), [2, 8]);
        assert_eq!(slices_of(&run, 1), [3]);
        assert_eq!(run.slices, [(0, 2), (1, 3), (0, 8)]);
    }

    #[test]
    fn on_two_cpus_the_job_with_most_work_left_is_preempted() {
        // A and B (10 each) at 0 on two CPUs; C (2) at 1 preempts the later of the equals (B),
        // runs 1–3; B resumes 3–12.
        let run = simulate(&[job(0, 0, 10), job(0, 0, 10), job(1, 1, 2)], 2);
        assert_eq!(run.end_us, [10, 12, 3]);
        assert_eq!(run.wait_us, [0, 2, 0]);
        assert_eq!(slices_of(&run, 0), [10]);
        assert_eq!(slices_of(&run, 1), [1, 9]);
        assert_eq!(slices_of(&run, 2), [2]);
    }

    #[test]
    fn equal_work_does_not_preempt_and_waiting_jobs_run_shortest_first() {
        // One CPU: A (5) at 0; B (5) at 1 does not preempt (4 left < 5); C (2) at 2 preempts
        // A (3 left), runs 2–4; then A (3 left) before B (5): A 4–7, B 7–12.
        let run = simulate(&[job(0, 0, 5), job(1, 1, 5), job(2, 2, 2)], 1);
        assert_eq!(run.end_us, [7, 12, 4]);
        assert_eq!(run.wait_us, [2, 6, 0]);
        assert_eq!(slices_of(&run, 0), [2, 3]);
        assert_eq!(slices_of(&run, 1), [5]);
        // Two equal waiting jobs: the earlier arrival first.
        let run = simulate(&[job(0, 0, 4), job(1, 1, 3), job(2, 1, 3)], 1);
        assert_eq!(run.end_us, [4, 7, 10]);
    }

    #[test]
    fn input_order_does_not_matter_and_zero_work_ends_at_arrival() {
        let run = simulate(&[job(1, 2, 3), job(0, 0, 10), job(2, 4, 0)], 1);
        assert_eq!(run.end_us, [5, 13, 4]);
        assert_eq!(run.wait_us, [0, 3, 0]);
        assert!(slices_of(&run, 2).is_empty());
        assert_eq!(simulate(&[], 4), SrptRun::default());
    }

    #[test]
    fn slices_add_up_to_the_work_and_no_cpu_idles_while_jobs_wait() {
        // A pseudo-random window on 3 CPUs: every job's slices sum to its work, and the last
        // end is what a work-conserving schedule gives when the CPUs never run dry.
        let mut x: u64 = 7;
        let mut jobs = Vec::new();
        for i in 0..400u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            jobs.push(job((x >> 60) as u32, i * 3, 1 + (x >> 33) % 40));
        }
        let run = simulate(&jobs, 3);
        for (j, jb) in jobs.iter().enumerate() {
            let sum: Micros = slices_of(&run, j as u32).iter().sum();
            assert_eq!(sum, jb.cpu_us, "job {j}");
            assert_eq!(run.end_us[j], jb.arrival_us + jb.cpu_us + run.wait_us[j]);
        }
        let total: Micros = jobs.iter().map(|j| j.cpu_us).sum();
        assert_eq!(run.slices.iter().map(|s| s.1).sum::<Micros>(), total);
    }
}
