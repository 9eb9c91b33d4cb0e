//! TTL (OpenWhisk's default): an idle sandbox expires a fixed time after its last use; under
//! memory pressure the least recently used goes first.

use super::{
    FnId, FunctionFacts, IdleAfter, IdlePlan, KeepAliveKind, KeepAlivePolicy, SandboxFacts,
};
use crate::time::Micros;

#[derive(Debug, Clone)]
pub struct Ttl {
    ttl: Micros,
}

impl Ttl {
    pub fn new(ttl: Micros) -> Self {
        Ttl { ttl }
    }
}

impl KeepAlivePolicy for Ttl {
    fn kind(&self) -> KeepAliveKind {
        KeepAliveKind::Ttl
    }

    fn priority(&self, _f: &FunctionFacts, sb: &SandboxFacts) -> f64 {
        sb.last_used as f64
    }

    fn on_idle(&mut self, now: Micros, _function: FnId, _after: IdleAfter) -> IdlePlan {
        IdlePlan {
            deadline: Some(now.saturating_add(self.ttl)),
            ..IdlePlan::default()
        }
    }
}
