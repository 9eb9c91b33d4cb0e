//! What the balancer knows about each function: priority, cold and warm times, access history.

use super::hash::{FunctionKey, KeyMap};
use super::popularity::Iat;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A function as announced by the driver at registration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionInfo {
    /// Higher is more important (k-CH-RLU pools).
    pub priority: i32,
    /// Known warm (exec) and cold (init + exec) running times, e.g. from a sim spec or a trace;
    /// learned from results otherwise.
    pub warm_us: Option<u64>,
    pub cold_us: Option<u64>,
    /// Memory of one sandbox (MiB; 0: unknown): OpenWhisk's balancer takes this many memory
    /// slots on the worker it picks.
    #[serde(default)]
    pub memory_mb: u64,
}

/// An exponential moving average; empty until the first sample.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ema {
    value: Option<f64>,
}

const EMA_WEIGHT: f64 = 0.2;

impl Ema {
    pub fn seeded(v: Option<u64>) -> Self {
        Ema {
            value: v.map(|v| v as f64),
        }
    }
    pub fn add(&mut self, sample: f64) {
        self.value = Some(match self.value {
            None => sample,
            Some(v) => v + EMA_WEIGHT * (sample - v),
        });
    }
    pub fn get(&self) -> Option<f64> {
        self.value
    }
}

/// One function's state.
#[derive(Debug, Clone, Default)]
pub struct FunctionState {
    pub priority: i32,
    /// Announced with `register` (routed-only functions do not size pools).
    pub registered: bool,
    /// Running times: exec of warm runs (w), init + exec of cold runs (c); queueing excluded.
    pub warm_us: Ema,
    pub cold_us: Ema,
    pub iat: Iat,
    /// Memory of one sandbox (MiB; 0: unknown).
    pub memory_mb: u64,
}

impl FunctionState {
    /// Section 4.5: the load bound `min(c·b/w, b_max)`; with unknown times, `b` (plain bounded
    /// loads). A cold time below the warm time is measurement noise and counts as equal.
    pub fn bound(&self, b: f64, b_max: f64) -> f64 {
        (self.cold_warm_ratio() * b).min(b_max)
    }

    /// c / w, at least 1; 1 while either time is unknown.
    pub fn cold_warm_ratio(&self) -> f64 {
        match (self.cold_us.get(), self.warm_us.get()) {
            (Some(c), Some(w)) if w > 0.0 => (c / w).max(1.0),
            _ => 1.0,
        }
    }
}

/// The function table.
#[derive(Debug, Default, Clone)]
pub struct Functions {
    map: KeyMap<FunctionState>,
    /// Functions in the popularity sample (Algorithm 1's `Ti < T`).
    sampled: Vec<FunctionKey>,
    /// Registered functions per priority level.
    per_priority: BTreeMap<i32, usize>,
}

impl Functions {
    pub fn get(&self, key: FunctionKey) -> Option<&FunctionState> {
        self.map.get(&key)
    }

    pub fn get_mut(&mut self, key: FunctionKey) -> Option<&mut FunctionState> {
        self.map.get_mut(&key)
    }

    /// The function's state, created (unregistered, priority 0) on first sight.
    pub fn entry(&mut self, key: FunctionKey, sampled: bool) -> &mut FunctionState {
        let map = &mut self.map;
        if !map.contains_key(&key) && sampled {
            self.sampled.push(key);
        }
        map.entry(key).or_default()
    }

    /// Registers or updates; true when the per-priority counts changed.
    pub fn register(&mut self, key: FunctionKey, info: FunctionInfo, sampled: bool) -> bool {
        let f = self.entry(key, sampled);
        let old = f.registered.then_some(f.priority);
        f.registered = true;
        f.priority = info.priority;
        f.memory_mb = info.memory_mb;
        if info.warm_us.is_some() {
            f.warm_us = Ema::seeded(info.warm_us);
        }
        if info.cold_us.is_some() {
            f.cold_us = Ema::seeded(info.cold_us);
        }
        if old == Some(info.priority) {
            return false;
        }
        if let Some(p) = old {
            self.decrement(p);
        }
        *self.per_priority.entry(info.priority).or_insert(0) += 1;
        true
    }

    /// Forgets a function; true when the per-priority counts changed.
    pub fn unregister(&mut self, key: FunctionKey) -> bool {
        let Some(f) = self.map.remove(&key) else {
            return false;
        };
        self.sampled.retain(|k| *k != key);
        if f.registered {
            self.decrement(f.priority);
            return true;
        }
        false
    }

    fn decrement(&mut self, priority: i32) {
        if let Some(n) = self.per_priority.get_mut(&priority) {
            *n -= 1;
            if *n == 0 {
                self.per_priority.remove(&priority);
            }
        }
    }

    /// Registered functions per priority level, lowest level first.
    pub fn per_priority(&self) -> &BTreeMap<i32, usize> {
        &self.per_priority
    }

    pub fn sampled_iats(&self) -> impl Iterator<Item = &Iat> {
        self.sampled
            .iter()
            .filter_map(|k| self.map.get(k).map(|f| &f.iat))
    }

    pub fn all_iats(&self) -> impl Iterator<Item = &Iat> {
        self.map.values().map(|f| &f.iat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_scales_with_cold_over_warm_up_to_b_max() {
        let mut f = FunctionState::default();
        assert_eq!(f.bound(1.2, 6.0), 1.2, "unknown times: plain b");
        f.warm_us = Ema::seeded(Some(100_000));
        f.cold_us = Ema::seeded(Some(300_000));
        assert!((f.bound(1.2, 6.0) - 3.6).abs() < 1e-9, "c/w = 3");
        f.cold_us = Ema::seeded(Some(10_000_000));
        assert_eq!(f.bound(1.2, 6.0), 6.0, "capped at b_max");
        f.cold_us = Ema::seeded(Some(50_000));
        assert_eq!(
            f.bound(1.2, 6.0),
            1.2,
            "a cold time below warm counts as equal"
        );
    }

    #[test]
    fn priority_counts_follow_registrations() {
        let mut t = Functions::default();
        let info = |priority| FunctionInfo {
            priority,
            ..Default::default()
        };
        assert!(t.register(FunctionKey(1), info(1), false));
        assert!(t.register(FunctionKey(2), info(0), true));
        assert!(
            !t.register(FunctionKey(2), info(0), true),
            "same level: no change"
        );
        assert!(t.register(FunctionKey(2), info(1), true));
        assert_eq!(t.per_priority().get(&1), Some(&2));
        assert_eq!(t.per_priority().get(&0), None);
        assert!(t.unregister(FunctionKey(1)));
        assert_eq!(t.per_priority().get(&1), Some(&1));
        assert_eq!(t.sampled_iats().count(), 1);
    }
}
