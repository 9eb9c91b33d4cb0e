//! Stable hashing for rings and sampling.
//!
//! The ring must be the same in every controller run and in the simulator, so the hash is fixed
//! (FNV-1a over the bytes, then MurmurHash3's 64-bit finalizer for avalanche), not std's
//! `DefaultHasher`, whose algorithm may change between Rust releases.

use std::hash::{BuildHasherDefault, Hasher};

/// A stable 64-bit hash of `bytes`.
pub fn hash64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h)
}

/// MurmurHash3's fmix64: every input bit affects every output bit.
pub const fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// A function as the balancer knows it: the stable hash of its name. Drivers compute it once
/// per function (at registration), so a routing decision never hashes a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionKey(pub u64);

impl FunctionKey {
    pub fn of(name: &str) -> Self {
        FunctionKey(hash64(name.as_bytes()))
    }
}

/// Keys are already uniformly mixed, so the map uses them as their own hash.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only reached for non-u64 keys; fold them in so the hasher stays correct.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

pub(crate) type KeyMap<V> =
    std::collections::HashMap<FunctionKey, V, BuildHasherDefault<KeyHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_stable_across_runs_and_releases() {
        // Fixed values: a change here would reshuffle every ring and every sample.
        assert_eq!(hash64(b""), 0xefd0_1f60_ba99_2926);
        assert_eq!(hash64(b"hello"), 0xe9c5_62c0_fdb2_3244);
        assert_ne!(FunctionKey::of("hello"), FunctionKey::of("hellp"));
    }
}
