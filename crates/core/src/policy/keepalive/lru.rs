//! LRU: idle sandboxes stay until their memory is needed; the least recently used goes first.

use super::{
    FnId, FunctionFacts, IdleAfter, IdlePlan, KeepAliveKind, KeepAlivePolicy, SandboxFacts,
};
use crate::time::Micros;

#[derive(Debug, Clone, Copy, Default)]
pub struct Lru;

impl KeepAlivePolicy for Lru {
    fn kind(&self) -> KeepAliveKind {
        KeepAliveKind::Lru
    }

    fn priority(&self, _f: &FunctionFacts, sb: &SandboxFacts) -> f64 {
        sb.last_used as f64
    }

    fn on_idle(&mut self, _now: Micros, _function: FnId, _after: IdleAfter) -> IdlePlan {
        IdlePlan::default()
    }
}
