//! Landlord: a function's credit is reset to its init cost on each use; each eviction charges
//! rent in proportion to size (the clock), and the sandbox left with no credit goes.

use super::{size, FunctionFacts, GreedyDualClock, KeepAliveKind, KeepAlivePolicy, SandboxFacts};

#[derive(Debug, Clone, Default)]
pub struct Landlord {
    /// The rent accumulated so far.
    clock: GreedyDualClock,
}

impl KeepAlivePolicy for Landlord {
    fn kind(&self) -> KeepAliveKind {
        KeepAliveKind::Landlord
    }

    fn clock(&self) -> f64 {
        self.clock.0
    }

    fn priority(&self, f: &FunctionFacts, _sb: &SandboxFacts) -> f64 {
        f.last_clock + f.cost_ms / size(f)
    }

    fn uses_function_facts(&self) -> bool {
        true
    }

    fn on_evicted(&mut self, priority: f64) {
        self.clock.on_evicted(priority);
    }
}
