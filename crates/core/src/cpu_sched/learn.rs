//! Turning one window's SRPT run into per-function policies (ALPS §5.2): a rank from the
//! function's mean waiting time, a basic slice from its slice vector (Eq. 1), fine-tuned for
//! unpredictability (Eq. 2); the overload penalty (Eq. 3) is applied when a policy is read,
//! with the utilization of that moment.

use super::config::{AlpsConfig, Learning};
use super::srpt::{self, WindowJob};
use crate::time::Micros;

/// Ranks run from 1 (runs first) to this.
pub const MAX_RANK: u8 = 100;

/// What one window taught about one function.
#[derive(Debug, Clone, PartialEq)]
pub struct Learned {
    /// 1..=100, lower runs first.
    pub rank: u8,
    /// Mean SRPT waiting time of its invocations (µs).
    pub mean_wait_us: f64,
    /// Mean CPU time of its invocations (µs): the tie-breaker between equal waits.
    pub mean_cpu_us: f64,
    /// Invocations of the window.
    pub invocations: u32,
    /// Its SRPT slices.
    pub slices: u32,
    /// ts: the basic slice (Eq. 1), µs.
    pub basic_us: f64,
    /// stdev(ts⃗), µs (population).
    pub stdev_us: f64,
    /// tsᵘ: after Eq. 2 (equal to `basic_us` with `unpredictability` off), µs.
    pub tuned_us: f64,
}

/// ts = train_ts(ts⃗) (Eq. 1). Empty: 0 (fair sharing).
pub fn train(slices: &[f64], method: Learning, ewma_weight: f64) -> f64 {
    if slices.is_empty() {
        return 0.0;
    }
    match method {
        Learning::Average => mean(slices),
        Learning::Ewma => {
            let mut s = slices[0];
            for &x in &slices[1..] {
                s = ewma_weight * x + (1.0 - ewma_weight) * s;
            }
            s
        }
        Learning::Linear => {
            let n = slices.len() as f64;
            if slices.len() < 2 {
                return slices[0];
            }
            // y = a + b·i over i = 0..n-1, read at i = n.
            let mean_i = (n - 1.0) / 2.0;
            let mean_y = mean(slices);
            let (mut sxy, mut sxx) = (0.0, 0.0);
            for (i, &y) in slices.iter().enumerate() {
                let dx = i as f64 - mean_i;
                sxy += dx * (y - mean_y);
                sxx += dx * dx;
            }
            let b = if sxx > 0.0 { sxy / sxx } else { 0.0 };
            let predicted = mean_y + b * (n - mean_i);
            let lo = slices.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = slices.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            predicted.clamp(lo, hi)
        }
    }
}

pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Population standard deviation (0 for fewer than two values).
pub fn stdev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64).sqrt()
}

/// Eq. 2: tsᵘ = max(α·ts − β·stdev(ts⃗), 0).
pub fn unpredictability(ts: f64, stdev: f64, alpha: f64, beta: f64) -> f64 {
    (alpha * ts - beta * stdev).max(0.0)
}

/// Eq. 3's penalty factor: 1 below θ, else (100 + θ − l) / (100·γ).
pub fn penalty(utilization_pct: f64, theta_pct: f64, gamma: f64) -> f64 {
    if utilization_pct < theta_pct {
        1.0
    } else {
        (100.0 + theta_pct - utilization_pct) / (100.0 * gamma)
    }
}

/// tsˢ = min(p·tsᵘ, tsᵘ) (Eq. 3), never negative.
pub fn overload(tuned: f64, p: f64) -> f64 {
    (p * tuned).min(tuned).max(0.0)
}

/// Ranks over `keys` (mean wait, mean CPU time; lower runs first): sorted, spread evenly over
/// 1..=100 by position (the first 1, the last 100), equal keys sharing the first one's rank.
/// Positions beyond 100 functions share ranks, as the paper's relative ranks do.
pub fn ranks(keys: &[(Micros, Micros)]) -> Vec<u8> {
    let n = keys.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (keys[i], i));
    let mut out = vec![1u8; n];
    let mut group_pos = 0;
    for (pos, &i) in order.iter().enumerate() {
        if pos > 0 && keys[i] != keys[order[pos - 1]] {
            group_pos = pos;
        }
        out[i] = if n <= 1 {
            1
        } else {
            1 + (group_pos * usize::from(MAX_RANK - 1) / (n - 1)) as u8
        };
    }
    out
}

/// One window's training: the SRPT run of `jobs` on `cpus` CPUs, then each of the
/// `functions` functions' rank, basic slice and Eq. 2 slice. A function without a job in the
/// window gets `None`.
pub fn learn(
    jobs: &[WindowJob],
    functions: usize,
    cpus: u32,
    config: &AlpsConfig,
) -> Vec<Option<Learned>> {
    let run = srpt::simulate(jobs, cpus);
    let mut wait_sum = vec![0u128; functions];
    let mut cpu_sum = vec![0u128; functions];
    let mut count = vec![0u32; functions];
    for (j, job) in jobs.iter().enumerate() {
        let f = job.function as usize;
        if f < functions {
            wait_sum[f] += u128::from(run.wait_us[j]);
            cpu_sum[f] += u128::from(job.cpu_us);
            count[f] += 1;
        }
    }
    // Each function's slices in time order, bucketed without a vector per function.
    let mut start = vec![0usize; functions + 1];
    for &(j, _) in &run.slices {
        let f = jobs[j as usize].function as usize;
        if f < functions {
            start[f + 1] += 1;
        }
    }
    for f in 0..functions {
        start[f + 1] += start[f];
    }
    let mut fill = start.clone();
    let mut flat = vec![0f64; start[functions]];
    for &(j, len) in &run.slices {
        let f = jobs[j as usize].function as usize;
        if f < functions {
            flat[fill[f]] = len as f64;
            fill[f] += 1;
        }
    }
    let seen: Vec<usize> = (0..functions).filter(|&f| count[f] > 0).collect();
    let keys: Vec<(Micros, Micros)> = seen
        .iter()
        .map(|&f| {
            let n = u128::from(count[f]);
            ((wait_sum[f] / n) as Micros, (cpu_sum[f] / n) as Micros)
        })
        .collect();
    let rank = ranks(&keys);
    let mut out = vec![None; functions];
    for (k, &f) in seen.iter().enumerate() {
        let slices = &flat[start[f]..start[f + 1]];
        let basic = train(slices, config.learning, config.ewma_weight);
        let sd = stdev(slices);
        let tuned = if config.unpredictability {
            unpredictability(basic, sd, config.alpha, config.beta)
        } else {
            basic
        };
        let n = f64::from(count[f]);
        out[f] = Some(Learned {
            rank: rank[k],
            mean_wait_us: wait_sum[f] as f64 / n,
            mean_cpu_us: cpu_sum[f] as f64 / n,
            invocations: count[f],
            slices: slices.len() as u32,
            basic_us: basic,
            stdev_us: sd,
            tuned_us: tuned.min(config.max_slice_ms as f64 * 1000.0),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn training_methods_on_a_rising_vector() {
        let v = [10.0, 20.0, 30.0];
        assert!(close(train(&v, Learning::Average, 0.5), 20.0));
        // EWMA, newest weighted 0.5: 10 → 15 → 22.5.
        assert!(close(train(&v, Learning::Ewma, 0.5), 22.5));
        // Weight 1: the newest alone.
        assert!(close(train(&v, Learning::Ewma, 1.0), 30.0));
        // The line 10 + 10·i read at i = 3 gives 40, kept within the slices' range: 30.
        assert!(close(train(&v, Learning::Linear, 0.5), 30.0));
        // A falling then flat vector: the line through [30, 10, 10, 10] (slope −6) read at
        // i = 4 is 15 − 6 × 2.5 = 0 → kept at the smallest slice, 10.
        assert!(close(
            train(&[30.0, 10.0, 10.0, 10.0], Learning::Linear, 0.5),
            10.0
        ));
        // A noisy vector without trend: the fitted line is flat at its mean.
        assert!(close(
            train(&[10.0, 30.0, 20.0, 30.0, 10.0], Learning::Linear, 0.5),
            20.0
        ));
        for m in Learning::ALL {
            assert_eq!(train(&[], m, 0.5), 0.0);
            assert!(close(train(&[7.0], m, 0.5), 7.0));
        }
    }

    #[test]
    fn eq2_rewards_the_mean_and_penalizes_spread() {
        // ts⃗ = [10, 20, 30] ms: ts = 20, stdev = √(200/3) = 8.165; α = 2, β = 1:
        // tsᵘ = 40 − 8.165 = 31.835.
        let v = [10.0, 20.0, 30.0];
        let sd = stdev(&v);
        assert!(close(sd, (200.0f64 / 3.0).sqrt()));
        assert!(close(unpredictability(20.0, sd, 2.0, 1.0), 40.0 - sd));
        // A wide spread floors at 0 (the function follows fair sharing).
        assert_eq!(unpredictability(5.0, 20.0, 2.0, 1.0), 0.0);
        // α = 1, β = 0: the basic slice itself.
        assert!(close(unpredictability(20.0, sd, 1.0, 0.0), 20.0));
    }

    #[test]
    fn eq3_penalizes_only_above_theta_and_never_lengthens() {
        // θ = 50 %, γ = 1: below θ no penalty; at 90 % p = (150 − 90) / 100 = 0.6.
        assert_eq!(penalty(40.0, 50.0, 1.0), 1.0);
        assert!(close(penalty(90.0, 50.0, 1.0), 0.6));
        assert!(close(penalty(50.0, 50.0, 1.0), 1.0));
        assert!(close(penalty(100.0, 50.0, 1.0), 0.5));
        assert!(close(overload(31.835, 0.6), 19.101));
        // γ = 2 halves p (0.3): a stronger reaction.
        assert!(close(penalty(90.0, 50.0, 2.0), 0.3));
        // γ = 0.5 makes p = 1.2: min() keeps tsᵘ.
        assert!(close(penalty(90.0, 50.0, 0.5), 1.2));
        assert!(close(overload(31.835, 1.2), 31.835));
    }

    #[test]
    fn ranks_spread_over_the_range_and_ties_share() {
        // Four functions by mean wait: 0 (cpu 5), 0 (cpu 5), 3, 9 → positions 0, 0, 2, 3 of 4.
        let r = ranks(&[(9, 1), (0, 5), (3, 2), (0, 5)]);
        assert_eq!(r, [100, 1, 67, 1]);
        // Equal waits are ordered by CPU time.
        assert_eq!(ranks(&[(0, 50), (0, 5)]), [100, 1]);
        assert_eq!(ranks(&[(4, 4)]), [1]);
        assert!(ranks(&[]).is_empty());
        // 250 functions: still within 1..=100, monotone in the wait.
        let keys: Vec<(Micros, Micros)> = (0..250).map(|i| (i, 0)).collect();
        let r = ranks(&keys);
        assert_eq!((r[0], r[249]), (1, 100));
        assert!(r.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn learn_ranks_the_short_function_first_and_slices_it_whole() {
        // One CPU; a long function L (10 ms) at 0, 20, 40 ms; a short one S (2 ms) at 1, 21,
        // 41 ms. Under SRPT each S preempts L at once and never waits: S's slices are [2, 2, 2]
        // ms, L's [1, 9, 1, 9, 1, 9] ms, L waits 2 ms each time.
        let mut jobs = Vec::new();
        for k in 0..3u64 {
            jobs.push(WindowJob {
                function: 0,
                arrival_us: k * 20_000,
                cpu_us: 10_000,
            });
            jobs.push(WindowJob {
                function: 1,
                arrival_us: k * 20_000 + 1_000,
                cpu_us: 2_000,
            });
        }
        let c = AlpsConfig::default();
        let out = learn(&jobs, 3, 1, &c);
        assert!(out[2].is_none(), "no job, no policy");
        let (l, s) = (out[0].clone().unwrap(), out[1].clone().unwrap());
        assert_eq!((s.rank, l.rank), (1, 100));
        assert_eq!((s.mean_wait_us, l.mean_wait_us), (0.0, 2_000.0));
        assert_eq!((s.slices, l.slices), (3, 6));
        // S: ts = 2 ms, stdev 0 → tsᵘ = 4 ms. L: ts = 5 ms, stdev 4 ms → tsᵘ = 2·5 − 4 = 6 ms.
        assert_eq!((s.basic_us, s.tuned_us), (2_000.0, 4_000.0));
        assert_eq!(
            (l.basic_us, l.stdev_us, l.tuned_us),
            (5_000.0, 4_000.0, 6_000.0)
        );
        // Without Eq. 2 the slices are the basic ones.
        let off = AlpsConfig {
            unpredictability: false,
            ..c.clone()
        };
        let out = learn(&jobs, 2, 1, &off);
        assert_eq!(out[0].as_ref().unwrap().tuned_us, 5_000.0);
        assert_eq!(out[1].as_ref().unwrap().tuned_us, 2_000.0);
        // The slice bound holds.
        let capped = AlpsConfig {
            max_slice_ms: 5,
            ..c
        };
        assert_eq!(
            learn(&jobs, 2, 1, &capped)[0].as_ref().unwrap().tuned_us,
            5_000.0
        );
    }
}
