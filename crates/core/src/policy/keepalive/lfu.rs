//! LFU: the function invoked least often since it last had no sandbox goes first (ties: the
//! least recently used, by the pool's index).

use super::{FunctionFacts, KeepAliveKind, KeepAlivePolicy, SandboxFacts};

#[derive(Debug, Clone, Copy, Default)]
pub struct Lfu;

impl KeepAlivePolicy for Lfu {
    fn kind(&self) -> KeepAliveKind {
        KeepAliveKind::Lfu
    }

    fn priority(&self, f: &FunctionFacts, _sb: &SandboxFacts) -> f64 {
        f.freq as f64
    }

    fn uses_function_facts(&self) -> bool {
        true
    }
}
