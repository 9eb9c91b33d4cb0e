//! What the pool keeps per sandbox and per function: only mechanics (state, memory, the idle
//! set, counts). Whatever a keep-alive policy learns about a function lives in the policy.

use super::index::EvictKey;
use super::types::{DestroyReason, SandboxId};
use crate::policy::keepalive::FunctionFacts;
use crate::time::Micros;
use std::collections::VecDeque;

/// A function's index in the pool (its interned name). Dense from 0, so policies may keep
/// per-function state in a `Vec`; a retired function keeps its index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FnId(pub u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Starting,
    Idle,
    Busy,
}

#[derive(Debug)]
pub(super) struct Slot {
    pub function: FnId,
    pub memory_mb: u64,
    pub state: State,
    pub last_used: Micros,
    /// The policy clock when last used.
    pub clock: f64,
    /// When its keep-alive window ends, while idle.
    pub deadline: Option<Micros>,
    /// Retired: destroyed instead of becoming idle.
    pub doomed: bool,
}

#[derive(Debug)]
pub(super) struct FunctionEntry {
    /// Idle sandboxes, least recently used first; the most recent is reused first (its caches
    /// are hottest) and the least recent is the eviction candidate.
    pub idle: VecDeque<SandboxId>,
    pub busy: u32,
    pub starting: u32,
    /// How the function's last warm sandbox went, and when.
    pub last_gone: Option<(DestroyReason, Micros)>,
    /// Invocations since the function last had no sandbox at all.
    pub freq: u64,
    pub cost_ms: f64,
    pub memory_mb: u64,
    pub last_clock: f64,
    pub evict_key: Option<EvictKey>,
}

impl FunctionEntry {
    pub fn new(memory_mb: u64) -> Self {
        FunctionEntry {
            idle: VecDeque::new(),
            busy: 0,
            starting: 0,
            last_gone: None,
            freq: 0,
            cost_ms: 0.0,
            memory_mb,
            last_clock: 0.0,
            evict_key: None,
        }
    }

    pub fn facts(&self) -> FunctionFacts {
        FunctionFacts {
            freq: self.freq,
            cost_ms: self.cost_ms,
            size_mb: self.memory_mb,
            last_clock: self.last_clock,
        }
    }

    pub fn has_sandboxes(&self) -> bool {
        !self.idle.is_empty() || self.busy > 0 || self.starting > 0
    }
}
