//! CH-RLU: consistent hashing with random load updates (CH-RLU paper §4.7, Algorithm 2).

use super::ring::{Ring, Visited};
use super::workers::{WorkerId, Workers};
use rand::rngs::SmallRng;
use rand::Rng;

/// The function being placed, as Algorithm 2 sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Routed {
    pub key: u64,
    /// c / w (≥ 1): scales the load bound.
    pub ratio: f64,
    /// λ when the function is popular: its loads get `N(λ, 0.1)` noise.
    pub noise_mean: Option<f64>,
}

/// Standard deviation of the load noise (the paper's σ = 0.1).
pub const NOISE_SD: f64 = 0.1;

/// Algorithm 2 within one ring: from the function's home, forward clockwise to the next distinct
/// worker while the (noisy, for popular functions) stale load is not below `bound`. Returns the
/// worker and the number of forwards, or None once `max_chain_len` forwards (or every member)
/// are exhausted — the caller then falls back (least-loaded, or the next pool).
pub(crate) fn forward(
    ring: &Ring,
    f: &Routed,
    bound: f64,
    max_chain_len: u32,
    workers: &Workers,
    rng: &mut SmallRng,
    visited: &mut Visited,
) -> Option<(WorkerId, u32)> {
    let (mut pos, mut server) = ring.home(f.key)?;
    visited.clear();
    visited.mark(server);
    let mut chain_len = 0u32;
    loop {
        let mut load = workers.load(server);
        if let Some(mean) = f.noise_mean {
            load += gaussian(rng, mean, NOISE_SD);
        }
        if load < bound {
            return Some((server, chain_len));
        }
        chain_len += 1;
        if chain_len > max_chain_len {
            return None;
        }
        server = ring.next_distinct(&mut pos, visited)?;
    }
}

/// A normal sample (Box–Muller), from the balancer's own seeded generator.
pub(crate) fn gaussian(rng: &mut SmallRng, mean: f64, sd: f64) -> f64 {
    let u1: f64 = rng.gen();
    let u2: f64 = rng.gen();
    let r = (-2.0 * (1.0 - u1).ln()).sqrt();
    mean + sd * r * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn gaussian_has_the_requested_mean_and_spread() {
        let mut rng = SmallRng::seed_from_u64(7);
        let n = 20_000;
        let xs: Vec<f64> = (0..n).map(|_| gaussian(&mut rng, 2.0, 0.1)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((mean - 2.0).abs() < 0.01, "{mean}");
        assert!((var.sqrt() - 0.1).abs() < 0.01, "{}", var.sqrt());
    }
}
