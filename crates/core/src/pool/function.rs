//! What the pool keeps per sandbox and per function: only mechanics (state, memory, the idle
//! set, counts). Whatever a keep-alive policy learns about a function lives in the policy.

use super::index::EvictKey;
use super::types::{DestroyReason, SandboxId};
use crate::policy::keepalive::FunctionFacts;
use crate::time::Micros;
use std::collections::{BTreeSet, VecDeque};

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
    /// `Some` for a proactive sandbox: never expires, never evicted for reactive memory.
    pub pro: Option<ProMark>,
}

/// A proactive sandbox's marks. On an idle one `soft` means it is in the soft set; on a
/// starting or busy one both are pending and take effect when it becomes idle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ProMark {
    pub soft: bool,
    /// Hard-evicted while starting or busy: destroyed instead of becoming idle.
    pub kill: bool,
}

/// A function's proactive sandboxes (not counted in the reactive fields of [`FunctionEntry`]).
#[derive(Debug, Default)]
pub(super) struct ProSet {
    /// Idle and usable, least recently used first.
    pub idle: VecDeque<SandboxId>,
    /// Idle and soft-evicted, oldest mark first.
    pub soft: VecDeque<SandboxId>,
    /// Starting or busy.
    pub running: BTreeSet<SandboxId>,
    pub busy: u32,
    pub starting: u32,
}

impl ProSet {
    pub fn is_empty(&self) -> bool {
        self.idle.is_empty() && self.soft.is_empty() && self.running.is_empty()
    }
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
    pub pro: ProSet,
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
            pro: ProSet::default(),
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
        !self.idle.is_empty() || self.busy > 0 || self.starting > 0 || !self.pro.is_empty()
    }
}
