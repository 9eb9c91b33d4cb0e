//! Greedy-Dual-Size-Frequency (thesis ch. 3.3.1): priority = clock + freq × cost / size, where
//! the clock is the last evicted priority, so long-idle sandboxes age out.

use super::{size, FunctionFacts, GreedyDualClock, KeepAliveKind, KeepAlivePolicy, SandboxFacts};

#[derive(Debug, Clone, Default)]
pub struct Gdsf {
    clock: GreedyDualClock,
}

impl KeepAlivePolicy for Gdsf {
    fn kind(&self) -> KeepAliveKind {
        KeepAliveKind::Gdsf
    }

    fn clock(&self) -> f64 {
        self.clock.0
    }

    fn priority(&self, f: &FunctionFacts, sb: &SandboxFacts) -> f64 {
        sb.clock + f.freq as f64 * f.cost_ms / size(f)
    }

    fn uses_function_facts(&self) -> bool {
        true
    }

    fn on_evicted(&mut self, priority: f64) {
        self.clock.on_evicted(priority);
    }
}
