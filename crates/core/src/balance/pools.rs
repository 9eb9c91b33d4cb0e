//! k-CH-RLU: the cluster split into one pool per priority level (thesis ch. 4.4).
//!
//! Pools are sized in proportion to the functions registered at each level (at least one worker
//! each) and resized whenever registrations or membership change. Workers are laid out in a
//! fixed order (by the hash of their name) and each pool takes a contiguous run of it, so a
//! resize moves only the workers at pool boundaries, and each pool's ring keeps its locality.
//! A function runs CH-RLU in its own pool; when the chain is exhausted it overflows to the next
//! lower-priority pool, never to a higher one; when the last pool's chain is exhausted too, it
//! runs on the least-loaded worker of that pool.
//!
//! Lower-priority pools run with a higher b_max (§4.4.2: they "tolerate more overloaded
//! servers"): by default each pool's is `pool_b_max_step` above the one before it, so with the
//! defaults the high pool has the paper's 6 and the next one 8, the top of the range (2–8) over
//! which the CH-RLU paper found latency insensitive to the bound.

use super::ch_rlu::{forward, Routed};
use super::hash::hash64;
use super::ring::{Ring, Visited};
use super::workers::{WorkerId, Workers};
use super::Placement;
use rand::rngs::SmallRng;
use std::collections::BTreeMap;

/// One pool.
#[derive(Debug, Clone)]
pub struct Pool {
    /// The highest priority level it serves; the last pool also takes every lower level.
    pub level: i32,
    pub members: Vec<WorkerId>,
    pub b_max: f64,
    pub(crate) ring: Ring,
}

#[derive(Debug, Clone)]
pub(crate) struct Pools {
    pools: Vec<Pool>,
    vnodes: u32,
}

impl Pools {
    pub fn new(vnodes: u32) -> Self {
        Pools {
            pools: Vec::new(),
            vnodes,
        }
    }

    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// Recomputes the pools from the live workers and the registered functions per level.
    pub fn resize(
        &mut self,
        workers: &Workers,
        per_priority: &BTreeMap<i32, usize>,
        b_max: f64,
        pool_b_max: &[f64],
        pool_b_max_step: f64,
    ) {
        let mut levels: Vec<(i32, usize)> = per_priority
            .iter()
            .rev()
            .filter(|(_, n)| **n > 0)
            .map(|(l, n)| (*l, *n))
            .collect();
        if levels.is_empty() {
            levels.push((0, 1));
        }
        let mut order: Vec<WorkerId> = workers.live().to_vec();
        order.sort_by_key(|w| (hash64(workers.name(*w).as_bytes()), *w));
        let n = order.len();
        let k = levels.len().min(n.max(1));
        // Levels beyond the worker count share the last pool.
        let mut counts: Vec<usize> = levels[..k].iter().map(|l| l.1).collect();
        counts[k - 1] = levels[k - 1..].iter().map(|l| l.1).sum();
        let sizes = if n == 0 {
            vec![0; k]
        } else {
            pool_sizes(&counts, n)
        };
        let mut start = 0;
        let mut pools = Vec::with_capacity(k);
        for (i, size) in sizes.into_iter().enumerate() {
            let members = order[start..start + size].to_vec();
            start += size;
            let b_max = pool_b_max
                .get(i)
                .or(pool_b_max.last())
                .copied()
                .unwrap_or(b_max + pool_b_max_step * i as f64);
            // Keep the old ring where the membership did not change.
            let old = self
                .pools
                .iter()
                .position(|p| sorted(&p.members) == sorted(&members));
            let ring = match old {
                Some(j) => self.pools[j].ring.clone(),
                None => {
                    let mut r = Ring::new(self.vnodes);
                    r.rebuild(members.iter().map(|w| (*w, workers.name(*w))));
                    r
                }
            };
            pools.push(Pool {
                level: levels[i].0,
                members,
                b_max,
                ring,
            });
        }
        self.pools = pools;
    }

    /// The pool of a priority level: the first (highest) pool whose level it reaches; levels
    /// below every pool go to the last.
    pub fn pool_of(&self, priority: i32) -> usize {
        self.pools
            .iter()
            .position(|p| priority >= p.level)
            .unwrap_or(self.pools.len().saturating_sub(1))
    }

    /// Places a function of `priority`; None when no pool has a worker.
    #[allow(clippy::too_many_arguments)]
    pub fn route(
        &self,
        f: &Routed,
        priority: i32,
        b: f64,
        max_chain_len: u32,
        workers: &Workers,
        rng: &mut SmallRng,
        visited: &mut Visited,
    ) -> Option<(WorkerId, Placement)> {
        let last = self.pools.iter().rposition(|p| !p.members.is_empty())?;
        let start = self.pool_of(priority);
        for (i, pool) in self.pools.iter().enumerate().skip(start) {
            if pool.members.is_empty() {
                continue;
            }
            let bound = (f.ratio * b).min(pool.b_max);
            if let Some((w, hops)) =
                forward(&pool.ring, f, bound, max_chain_len, workers, rng, visited)
            {
                let how = if i != start {
                    Placement::Overflow {
                        pool: i as u32,
                        hops,
                    }
                } else if hops == 0 {
                    Placement::Home
                } else {
                    Placement::Forwarded { hops }
                };
                return Some((w, how));
            }
        }
        let w = workers.least_loaded(self.pools[last].members.iter().copied())?;
        Some((w, Placement::LeastLoaded))
    }
}

fn sorted(v: &[WorkerId]) -> Vec<WorkerId> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v
}

/// Splits `n` workers (n ≥ counts.len()) in proportion to `counts`, at least one each, by
/// largest remainder.
pub(crate) fn pool_sizes(counts: &[usize], n: usize) -> Vec<usize> {
    let k = counts.len();
    let total: usize = counts.iter().sum::<usize>().max(1);
    let extra = n.saturating_sub(k);
    let mut want: Vec<f64> = counts
        .iter()
        .map(|c| (*c as f64 / total as f64 * n as f64 - 1.0).max(0.0))
        .collect();
    let sum: f64 = want.iter().sum();
    if sum > 0.0 {
        want.iter_mut().for_each(|w| *w *= extra as f64 / sum);
    } else {
        want = counts
            .iter()
            .map(|c| *c as f64 / total as f64 * extra as f64)
            .collect();
    }
    let mut sizes: Vec<usize> = want.iter().map(|w| w.floor() as usize).collect();
    let mut left = extra - sizes.iter().sum::<usize>().min(extra);
    let mut by_remainder: Vec<usize> = (0..k).collect();
    by_remainder.sort_by(|a, b| {
        let (ra, rb) = (want[*a] - want[*a].floor(), want[*b] - want[*b].floor());
        rb.total_cmp(&ra).then(a.cmp(b))
    });
    for i in by_remainder {
        if left == 0 {
            break;
        }
        sizes[i] += 1;
        left -= 1;
    }
    sizes.iter().map(|s| s + 1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_are_proportional_to_registered_functions_with_one_worker_at_least() {
        assert_eq!(pool_sizes(&[1, 1], 8), vec![4, 4]);
        assert_eq!(pool_sizes(&[3, 1], 8), vec![6, 2]);
        assert_eq!(pool_sizes(&[1, 99], 4), vec![1, 3]);
        assert_eq!(pool_sizes(&[5], 3), vec![3]);
        assert_eq!(pool_sizes(&[1, 1, 1], 3), vec![1, 1, 1]);
        for n in 3..40 {
            let s = pool_sizes(&[7, 2, 11], n);
            assert_eq!(s.iter().sum::<usize>(), n);
            assert!(s.iter().all(|x| *x >= 1));
        }
    }
}
