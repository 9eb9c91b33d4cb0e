//! Keep-alive and eviction policies (thesis ch. 3.3): which warm sandbox goes when memory is
//! needed, and when an idle one expires.
//!
//! Priorities are computed per function and applied per sandbox (ch. 3.3.1): the pool asks for
//! the priority of each function's least recently used idle sandbox and evicts the lowest; ties
//! go to the least recently used. Caching policies (LRU, GDSF, LFU, Landlord) are resource
//! conserving: an idle sandbox stays until its memory is needed. TTL (OpenWhisk's default) and
//! HIST also end keep-alive windows on a timer.

use super::hist::HistConfig;
use crate::time::{secs, Micros};
use serde::{Deserialize, Serialize};

/// The policy's name, as chosen in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeepAliveKind {
    /// Fixed time-to-live; least recently used first under memory pressure.
    Ttl,
    /// Least recently used; no expiry.
    Lru,
    /// Greedy-Dual-Size-Frequency: clock + freq × cost / size.
    Gdsf,
    /// Least frequently used; ties least recently used.
    Lfu,
    /// Landlord: credit = init cost on each use, rent charged on eviction.
    Landlord,
    /// Hybrid histogram of inter-arrival times (pre-warm and keep-alive windows).
    Hist,
}

impl KeepAliveKind {
    pub const ALL: [KeepAliveKind; 6] = [
        KeepAliveKind::Ttl,
        KeepAliveKind::Lru,
        KeepAliveKind::Gdsf,
        KeepAliveKind::Lfu,
        KeepAliveKind::Landlord,
        KeepAliveKind::Hist,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KeepAliveKind::Ttl => "ttl",
            KeepAliveKind::Lru => "lru",
            KeepAliveKind::Gdsf => "gdsf",
            KeepAliveKind::Lfu => "lfu",
            KeepAliveKind::Landlord => "landlord",
            KeepAliveKind::Hist => "hist",
        }
    }
}

impl std::fmt::Display for KeepAliveKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KeepAliveKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        KeepAliveKind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!("unknown keep-alive policy {s:?} (expected ttl, lru, gdsf, lfu, landlord or hist)")
            })
    }
}

/// A keep-alive policy and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct KeepAliveConfig {
    pub kind: KeepAliveKind,
    /// Time-to-live of an idle sandbox under `ttl`.
    pub ttl: Micros,
    pub hist: HistConfig,
}

impl Default for KeepAliveConfig {
    fn default() -> Self {
        KeepAliveConfig {
            kind: KeepAliveKind::Ttl,
            ttl: secs(600),
            hist: HistConfig::default(),
        }
    }
}

impl KeepAliveConfig {
    pub fn new(kind: KeepAliveKind) -> Self {
        KeepAliveConfig {
            kind,
            ..KeepAliveConfig::default()
        }
    }
}

/// Function-level inputs of a priority.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FunctionFacts {
    /// Invocations since the function last had no sandbox (GDSF resets it then).
    pub freq: u64,
    /// The cost of a cold start: init time in milliseconds.
    pub cost_ms: f64,
    /// Memory of one sandbox, MiB.
    pub size_mb: u64,
    /// The policy clock when the function was last used (Landlord's credit reset).
    pub last_clock: f64,
}

/// A sandbox's inputs of a priority.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SandboxFacts {
    /// The policy clock when the sandbox was last used.
    pub clock: f64,
    pub last_used: Micros,
}

/// The running policy: its configuration and its logical clock.
#[derive(Debug, Clone)]
pub struct KeepAlive {
    config: KeepAliveConfig,
    /// GDSF's clock and Landlord's accumulated rent; the evicted priority (the maximum over a
    /// batch) becomes the clock.
    clock: f64,
}

impl KeepAlive {
    pub fn new(config: KeepAliveConfig) -> Self {
        KeepAlive { config, clock: 0.0 }
    }

    pub fn kind(&self) -> KeepAliveKind {
        self.config.kind
    }

    pub fn config(&self) -> &KeepAliveConfig {
        &self.config
    }

    /// The logical clock a sandbox is stamped with when used.
    pub fn clock(&self) -> f64 {
        self.clock
    }

    /// Eviction priority of an idle sandbox: the lowest is evicted first.
    pub fn priority(&self, f: &FunctionFacts, sb: &SandboxFacts) -> f64 {
        let size = f.size_mb.max(1) as f64;
        match self.config.kind {
            KeepAliveKind::Ttl | KeepAliveKind::Lru | KeepAliveKind::Hist => sb.last_used as f64,
            KeepAliveKind::Gdsf => sb.clock + f.freq as f64 * f.cost_ms / size,
            KeepAliveKind::Lfu => f.freq as f64,
            KeepAliveKind::Landlord => f.last_clock + f.cost_ms / size,
        }
    }

    /// A sandbox with `priority` was evicted.
    pub fn on_evicted(&mut self, priority: f64) {
        if matches!(
            self.config.kind,
            KeepAliveKind::Gdsf | KeepAliveKind::Landlord
        ) {
            self.clock = self.clock.max(priority);
        }
    }

    /// Landlord's remaining credit of a sandbox (its priority above the rent paid so far),
    /// scaled back to milliseconds of init cost: size × (priority − clock).
    pub fn landlord_credit(&self, f: &FunctionFacts) -> f64 {
        let size = f.size_mb.max(1) as f64;
        size * (self.priority(
            f,
            &SandboxFacts {
                clock: 0.0,
                last_used: 0,
            },
        ) - self.clock)
    }

    /// When a sandbox idle since `now` expires under a fixed TTL.
    pub fn ttl_deadline(&self, now: Micros) -> Option<Micros> {
        (self.config.kind == KeepAliveKind::Ttl).then(|| now.saturating_add(self.config.ttl))
    }

    /// Whether priorities depend on frequency or cost (so they change on every invocation).
    pub fn uses_function_facts(&self) -> bool {
        matches!(
            self.config.kind,
            KeepAliveKind::Gdsf | KeepAliveKind::Lfu | KeepAliveKind::Landlord
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for k in KeepAliveKind::ALL {
            assert_eq!(k.name().parse::<KeepAliveKind>(), Ok(k));
        }
        let err = "mru".parse::<KeepAliveKind>().unwrap_err();
        assert!(err.contains("gdsf"), "{err}");
    }

    #[test]
    fn priorities_follow_the_thesis_formulas() {
        let f = FunctionFacts {
            freq: 4,
            cost_ms: 300.0,
            size_mb: 100,
            last_clock: 2.0,
        };
        let sb = SandboxFacts {
            clock: 1.5,
            last_used: 7,
        };
        let prio = |k| KeepAlive::new(KeepAliveConfig::new(k)).priority(&f, &sb);
        assert_eq!(prio(KeepAliveKind::Lru), 7.0);
        assert_eq!(prio(KeepAliveKind::Ttl), 7.0);
        assert_eq!(prio(KeepAliveKind::Gdsf), 1.5 + 4.0 * 300.0 / 100.0);
        assert_eq!(prio(KeepAliveKind::Lfu), 4.0);
        assert_eq!(prio(KeepAliveKind::Landlord), 2.0 + 300.0 / 100.0);
    }

    #[test]
    fn the_clock_only_moves_for_greedy_dual_policies_and_never_back() {
        let mut g = KeepAlive::new(KeepAliveConfig::new(KeepAliveKind::Gdsf));
        g.on_evicted(3.0);
        g.on_evicted(2.0);
        assert_eq!(g.clock(), 3.0);
        let mut l = KeepAlive::new(KeepAliveConfig::new(KeepAliveKind::Lru));
        l.on_evicted(3.0);
        assert_eq!(l.clock(), 0.0);
        assert_eq!(l.ttl_deadline(5), None);
        let t = KeepAlive::new(KeepAliveConfig::new(KeepAliveKind::Ttl));
        assert_eq!(t.ttl_deadline(5), Some(5 + secs(600)));
    }
}
