//! LRU: idle sandboxes stay until their memory is needed; the least recently used goes first.

use super::{FunctionFacts, KeepAliveKind, KeepAlivePolicy, SandboxFacts};

#[derive(Debug, Clone, Copy, Default)]
pub struct Lru;

impl KeepAlivePolicy for Lru {
    fn kind(&self) -> KeepAliveKind {
        KeepAliveKind::Lru
    }

    fn priority(&self, _f: &FunctionFacts, sb: &SandboxFacts) -> f64 {
        sb.last_used as f64
    }
}
