//! Keep-alive and eviction policies (thesis ch. 3.3): which warm sandbox goes when memory is
//! needed, and when an idle one expires.
//!
//! Priorities are computed per function and applied per sandbox (ch. 3.3.1): the pool asks for
//! the priority of each function's least recently used idle sandbox and evicts the lowest; ties
//! go to the least recently used. Caching policies (LRU, GDSF, LFU, Landlord) are resource
//! conserving: an idle sandbox stays until its memory is needed. TTL (OpenWhisk's default) and
//! HIST also end keep-alive windows on a timer.
//!
//! Each policy is a [`KeepAlivePolicy`] in its own module and owns whatever it learns per
//! function; the pool ([`crate::pool`]) keeps only the mechanics and calls the policy's hooks.
//! They are dispatched through a `Box<dyn KeepAlivePolicy>`: one indirect call per hook, which
//! does not show in the simulator's run time (the pool's index updates dominate).

pub mod gdsf;
pub mod hist;
pub mod landlord;
pub mod lfu;
pub mod lru;
pub mod ttl;

use super::hist::HistConfig;
pub use crate::pool::FnId;
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

/// How a sandbox became idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleAfter {
    /// An invocation ended on it.
    Run,
    /// It was pre-warmed and finished starting.
    Prewarm,
}

/// What the policy decides for a sandbox that just became idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IdlePlan {
    /// When its keep-alive window ends; `None`: it stays until its memory is needed.
    pub deadline: Option<Micros>,
    /// Unload it now (destroyed as expired; HIST pre-warms it again later).
    pub unload: bool,
    /// Start a sandbox of the function at this time, ahead of its next expected arrival. The pool
    /// asks [`KeepAlivePolicy::take_prewarm`] when the time comes.
    pub prewarm_at: Option<Micros>,
}

/// A keep-alive and eviction policy. It owns whatever per-function state it needs, keyed by the
/// pool's interned function index; the pool keeps only the mechanics (slots, memory, the
/// eviction and expiry indexes, the pre-warm schedule) and asks the policy at these hooks.
///
/// Implementations: [`ttl`], [`lru`], [`gdsf`], [`lfu`], [`landlord`], [`hist`]; [`new_policy`]
/// picks one by [`KeepAliveKind`].
pub trait KeepAlivePolicy: std::fmt::Debug + Send + Sync {
    fn kind(&self) -> KeepAliveKind;

    /// The logical clock a sandbox is stamped with when used (Greedy-Dual policies move it).
    fn clock(&self) -> f64 {
        0.0
    }

    /// Eviction priority of an idle sandbox: the lowest is evicted first.
    fn priority(&self, f: &FunctionFacts, sb: &SandboxFacts) -> f64;

    /// Whether priorities depend on frequency or cost, so the pool must recompute them when
    /// those change (not only when the function's idle set changes).
    fn uses_function_facts(&self) -> bool {
        false
    }

    /// A sandbox with `priority` was evicted (the Greedy-Dual clock).
    fn on_evicted(&mut self, _priority: f64) {}

    /// Whether [`Self::on_arrival`] is worth calling: the pool skips the lookup otherwise.
    fn observes_arrivals(&self) -> bool {
        false
    }

    /// An invocation of `function` arrived.
    fn on_arrival(&mut self, _now: Micros, _function: FnId) {}

    /// The function's cold-start cost, its init time, is now `init_us` (HIST starts its
    /// pre-warms that long before the sandbox is wanted).
    fn on_cost(&mut self, _function: FnId, _init_us: Micros) {}

    /// A sandbox of `function` became idle at `now`: its keep-alive plan. By default none: a
    /// caching policy keeps an idle sandbox until its memory is needed.
    fn on_idle(&mut self, _now: Micros, _function: FnId, _after: IdleAfter) -> IdlePlan {
        IdlePlan::default()
    }

    /// A pre-warm of `function` scheduled for `at` is due: whether it still applies (it may have
    /// been rescheduled since, or its window passed). Consumes the schedule when it applies.
    fn take_prewarm(&mut self, _now: Micros, _function: FnId, _at: Micros) -> bool {
        false
    }

    /// The function was retired (updated or deleted): forget what was learned about it.
    fn forget(&mut self, _function: FnId) {}

    /// Landlord's remaining credit of a function's sandbox (its priority above the rent paid so
    /// far), scaled back to milliseconds of init cost: size × (priority − clock).
    fn credit(&self, f: &FunctionFacts) -> f64 {
        size(f)
            * (self.priority(
                f,
                &SandboxFacts {
                    clock: 0.0,
                    last_used: 0,
                },
            ) - self.clock())
    }
}

/// The policy `config` names.
pub fn new_policy(config: &KeepAliveConfig) -> Box<dyn KeepAlivePolicy> {
    match config.kind {
        KeepAliveKind::Ttl => Box::new(ttl::Ttl::new(config.ttl)),
        KeepAliveKind::Lru => Box::new(lru::Lru),
        KeepAliveKind::Gdsf => Box::new(gdsf::Gdsf::default()),
        KeepAliveKind::Lfu => Box::new(lfu::Lfu),
        KeepAliveKind::Landlord => Box::new(landlord::Landlord::default()),
        KeepAliveKind::Hist => Box::new(hist::Hist::new(config.hist.clone())),
    }
}

/// Greedy-Dual's logical clock (GDSF, Landlord): the evicted priority (the maximum over a batch)
/// becomes the clock, so it never goes back.
#[derive(Debug, Clone, Copy, Default)]
struct GreedyDualClock(f64);

impl GreedyDualClock {
    fn on_evicted(&mut self, priority: f64) {
        self.0 = self.0.max(priority);
    }
}

/// A sandbox's size in MiB as a divisor.
fn size(f: &FunctionFacts) -> f64 {
    f.size_mb.max(1) as f64
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
        let prio = |k| new_policy(&KeepAliveConfig::new(k)).priority(&f, &sb);
        assert_eq!(prio(KeepAliveKind::Lru), 7.0);
        assert_eq!(prio(KeepAliveKind::Ttl), 7.0);
        assert_eq!(prio(KeepAliveKind::Gdsf), 1.5 + 4.0 * 300.0 / 100.0);
        assert_eq!(prio(KeepAliveKind::Lfu), 4.0);
        assert_eq!(prio(KeepAliveKind::Landlord), 2.0 + 300.0 / 100.0);
    }

    #[test]
    fn the_clock_only_moves_for_greedy_dual_policies_and_never_back() {
        let ttl_deadline =
            |p: &mut dyn KeepAlivePolicy, now| p.on_idle(now, FnId(0), IdleAfter::Run).deadline;
        let mut g = new_policy(&KeepAliveConfig::new(KeepAliveKind::Gdsf));
        g.on_evicted(3.0);
        g.on_evicted(2.0);
        assert_eq!(g.clock(), 3.0);
        let mut l = new_policy(&KeepAliveConfig::new(KeepAliveKind::Lru));
        l.on_evicted(3.0);
        assert_eq!(l.clock(), 0.0);
        assert_eq!(ttl_deadline(&mut *l, 5), None);
        let mut t = new_policy(&KeepAliveConfig::new(KeepAliveKind::Ttl));
        assert_eq!(ttl_deadline(&mut *t, 5), Some(5 + secs(600)));
    }
}
