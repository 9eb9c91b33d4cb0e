//! OpenWhisk's default load balancer (the `ShardingContainerPoolBalancer`, CH-RLU paper §2.3),
//! the baseline of the seeds' comparisons ("OW+GD", "OW+TTL").
//!
//! Each worker's sandbox memory is a pool of memory slots (MiB) that this balancer alone
//! accounts: an invocation takes its function's memory there when it is placed and gives it
//! back when it ends; reported loads are never looked at. A function's home is its hash modulo
//! the number of workers ever seen (OpenWhisk's invoker list, which keeps offline invokers so
//! that homes do not move when one goes down), and its probe step is one of the numbers
//! co-prime with that count (chosen by the same hash), so probing visits every worker once.
//! The first live worker from the home whose slots hold the function's memory gets it; when
//! none does, a uniformly random live worker gets it anyway (OpenWhisk's `forceAcquire`: "system
//! is overloaded").
//!
//! Readings (docs/seed-readings.md): a worker that has not reported its memory budget has
//! unlimited slots; a function of unknown memory takes OpenWhisk's default action memory,
//! [`DEFAULT_MEMORY_MB`]; with several controllers each accounts its own invocations against
//! the whole budget (OpenWhisk divides the invoker's memory by the number of controllers).

use super::hash::FunctionKey;
use super::workers::{WorkerId, Workers};
use super::Placement;
use rand::rngs::SmallRng;
use rand::Rng;

/// OpenWhisk's default action memory limit: what a function of unknown memory takes.
pub(crate) const DEFAULT_MEMORY_MB: u64 = 256;

/// The invoker count the step sizes were made for, and the step sizes.
#[derive(Debug, Clone, Default)]
pub(crate) struct OpenWhisk {
    invokers: usize,
    steps: Vec<usize>,
}

impl OpenWhisk {
    /// Makes the step sizes for `invokers` workers (every worker ever seen).
    pub fn resize(&mut self, invokers: usize) {
        if invokers != self.invokers || self.steps.is_empty() {
            self.invokers = invokers;
            self.steps = coprime_steps(invokers);
        }
    }

    /// The function's home: its hash modulo the invoker count (up or not).
    pub fn home(&self, key: FunctionKey) -> Option<WorkerId> {
        (self.invokers > 0).then(|| WorkerId((key.0 % self.invokers as u64) as u32))
    }

    /// Places an invocation needing `memory_mb` of slots; None when no worker is live.
    pub fn route(
        &mut self,
        key: FunctionKey,
        memory_mb: u64,
        workers: &Workers,
        rng: &mut SmallRng,
    ) -> Option<(WorkerId, Placement)> {
        self.resize(workers.count());
        let n = self.invokers;
        if n == 0 || self.steps.is_empty() {
            return None;
        }
        let mut index = (key.0 % n as u64) as usize;
        let step = self.steps[(key.0 % self.steps.len() as u64) as usize];
        for hops in 0..n as u32 {
            let w = WorkerId(index as u32);
            if workers.get(w).is_some_and(|s| s.up) && workers.has_slots(w, memory_mb) {
                let how = if hops == 0 {
                    Placement::Home
                } else {
                    Placement::Forwarded { hops }
                };
                return Some((w, how));
            }
            index = (index + step) % n;
        }
        let live = workers.live();
        if live.is_empty() {
            return None;
        }
        Some((live[rng.gen_range(0..live.len())], Placement::Random))
    }
}

/// OpenWhisk's `pairwiseCoprimeNumbersUntil(n)`: the numbers 1..=n co-prime with n and with
/// each one taken before them. Any of them as a step visits all n positions before repeating.
pub(crate) fn coprime_steps(n: usize) -> Vec<usize> {
    let mut steps: Vec<usize> = Vec::new();
    for cur in 1..=n {
        if gcd(cur, n) == 1 && steps.iter().all(|s| gcd(*s, cur) == 1) {
            steps.push(cur);
        }
    }
    steps
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_pairwise_coprime_with_the_count_and_each_other() {
        assert_eq!(coprime_steps(1), [1]);
        assert_eq!(coprime_steps(6), [1, 5]);
        assert_eq!(coprime_steps(8), [1, 3, 5, 7]);
        assert_eq!(coprime_steps(12), [1, 5, 7, 11]);
        assert_eq!(coprime_steps(9), [1, 2, 5, 7]);
        assert!(coprime_steps(0).is_empty());
        // Every step visits every position once in n steps.
        for n in 1..40 {
            for step in coprime_steps(n) {
                let mut seen = vec![false; n];
                let mut i = 0;
                for _ in 0..n {
                    assert!(!seen[i], "n {n} step {step} revisits {i}");
                    seen[i] = true;
                    i = (i + step) % n;
                }
            }
        }
    }
}
