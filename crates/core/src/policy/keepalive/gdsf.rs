//! Greedy-Dual-Size-Frequency (thesis ch. 3.3.1): priority = clock + freq × cost / size, where
//! the clock is the last evicted priority, so long-idle sandboxes age out.

use super::{
    size, FnId, FunctionFacts, GreedyDualClock, IdleAfter, IdlePlan, KeepAliveKind,
    KeepAlivePolicy, SandboxFacts,
};
use crate::time::Micros;

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

    fn on_idle(&mut self, _now: Micros, _function: FnId, _after: IdleAfter) -> IdlePlan {
        IdlePlan::default()
    }
}
