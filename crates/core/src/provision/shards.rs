//! SHARDS (Waldspurger et al., FAST '15): spatial sampling of references by a hash of their key.
//!
//! A function is sampled when `hash(name) mod P < T`, so either every invocation of it is in the
//! sample or none is, and the reuse distances seen among sampled functions are those of the full
//! trace scaled by the rate `R = T / P`; dividing them by `R` estimates the full distances.
//! Fixed-rate SHARDS: `R` is chosen up front.

use super::ProvisionError;

/// The modulus `P` (2^24, as in the paper).
pub const MODULUS: u64 = 1 << 24;

/// A fixed-rate spatial sampler.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    threshold: u64,
}

impl Sampler {
    /// Samples at `rate` in (0, 1]; 1 keeps every function (exact distances).
    pub fn new(rate: f64) -> Result<Self, ProvisionError> {
        if !(rate > 0.0 && rate <= 1.0) {
            return Err(ProvisionError::BadSampleRate(rate));
        }
        let threshold = ((rate * MODULUS as f64).round() as u64).clamp(1, MODULUS);
        Ok(Sampler { threshold })
    }

    /// Every function.
    pub fn all() -> Self {
        Sampler { threshold: MODULUS }
    }

    /// The sampling rate `R = T / P` actually used.
    pub fn rate(&self) -> f64 {
        self.threshold as f64 / MODULUS as f64
    }

    /// Whether `key`'s invocations are in the sample.
    pub fn sampled(&self, key: &str) -> bool {
        self.threshold >= MODULUS || hash(key) % MODULUS < self.threshold
    }
}

/// FNV-1a over the bytes, then SplitMix64's finalizer so that the low bits (taken mod P) mix
/// well. Stable across runs and platforms: the same functions are sampled every time.
pub fn hash(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}
