//! The sandbox pool: which sandbox serves an invocation, which warm sandboxes expire or are
//! evicted, and the worker's memory accounting.
//!
//! A sans-I/O state machine: the driver hands it the time and events and executes the
//! [`PoolAction`]s it returns (destroying a sandbox is the driver's I/O, done off the hot path).
//! Keep-alive here is a fixed TTL with least-recently-used eviction under memory pressure,
//! OpenWhisk's behaviour.
//!
//! Memory invariant: the memory of starting, busy and idle sandboxes never exceeds the budget.

use crate::time::Micros;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// A sandbox's identity, unique within one pool for its lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SandboxId(pub u64);

impl std::fmt::Display for SandboxId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sb{}", self.0)
    }
}

/// Pool limits.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Memory that starting, running and warm sandboxes may use together.
    pub memory_budget_mb: u64,
    /// Background eviction keeps at least this much of the budget free, so that a cold start
    /// rarely has to evict on the invocation path.
    pub free_buffer_mb: u64,
    /// How long an idle sandbox stays warm.
    pub keepalive_ttl: Micros,
}

/// Why an invocation had to start a new sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum ColdReason {
    /// The function never had a sandbox on this worker (or was re-registered since).
    New,
    /// Its last warm sandbox's keep-alive window ended `ago_us` before this invocation.
    Expired { ago_us: Micros },
    /// Its last warm sandbox was evicted for memory `ago_us` before this invocation.
    Evicted { ago_us: Micros },
    /// All its warm sandboxes were busy.
    Concurrent,
    /// A prewarmed sandbox was still starting.
    PrewarmMiss,
}

impl ColdReason {
    /// The reason's name, as used in answers and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            ColdReason::New => "new",
            ColdReason::Expired { .. } => "expired",
            ColdReason::Evicted { .. } => "evicted",
            ColdReason::Concurrent => "concurrent",
            ColdReason::PrewarmMiss => "prewarm_miss",
        }
    }
}

/// What the pool decided for one invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// Run on this idle sandbox.
    Warm(SandboxId),
    /// Start this new sandbox (its memory is reserved) and run on it.
    Cold {
        sandbox: SandboxId,
        reason: ColdReason,
    },
    /// Not enough memory even after evicting every idle sandbox.
    NoMemory { needed_mb: u64, free_mb: u64 },
}

/// Why a sandbox is being destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DestroyReason {
    Expired,
    Evicted,
    /// Its function was updated or deleted.
    Retired,
    /// It timed out, crashed or could not start; never reused.
    Failed,
    Shutdown,
}

/// An action for the driver to carry out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolAction {
    Destroy {
        sandbox: SandboxId,
        reason: DestroyReason,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Starting,
    Idle,
    Busy,
}

#[derive(Debug)]
struct Slot {
    function: Arc<str>,
    memory_mb: u64,
    state: State,
    last_used: Micros,
    /// Retired: destroyed instead of becoming idle.
    doomed: bool,
}

#[derive(Debug, Default)]
struct FunctionEntry {
    /// Idle sandboxes, most recently used last (reused first: its caches are hottest).
    idle: Vec<SandboxId>,
    busy: u32,
    starting: u32,
    /// How the function's last warm sandbox went, and when.
    last_gone: Option<(DestroyReason, Micros)>,
}

/// Per-function counts for status reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FunctionPoolStats {
    pub warm: u32,
    pub running: u32,
    pub starting: u32,
}

/// Memory and sandbox counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    pub memory_budget_mb: u64,
    /// Memory of starting and busy sandboxes.
    pub memory_running_mb: u64,
    /// Memory of idle (warm) sandboxes.
    pub memory_warm_mb: u64,
    pub functions: Vec<(String, FunctionPoolStats)>,
}

/// The pool state machine.
#[derive(Debug)]
pub struct SandboxPool {
    config: PoolConfig,
    next_id: u64,
    slots: HashMap<SandboxId, Slot>,
    functions: HashMap<Arc<str>, FunctionEntry>,
    /// Idle sandboxes by last use: the front is the least recently used.
    lru: BTreeSet<(Micros, SandboxId)>,
    used_running_mb: u64,
    used_warm_mb: u64,
    actions: VecDeque<PoolAction>,
}

impl SandboxPool {
    pub fn new(config: PoolConfig) -> Self {
        SandboxPool {
            config,
            next_id: 1,
            slots: HashMap::new(),
            functions: HashMap::new(),
            lru: BTreeSet::new(),
            used_running_mb: 0,
            used_warm_mb: 0,
            actions: VecDeque::new(),
        }
    }

    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    fn free_mb(&self) -> u64 {
        self.config
            .memory_budget_mb
            .saturating_sub(self.used_running_mb + self.used_warm_mb)
    }

    /// Picks a sandbox for an invocation of `function` needing `memory_mb`.
    pub fn acquire(&mut self, now: Micros, function: &str, memory_mb: u64) -> Acquire {
        if let Some(entry) = self.functions.get_mut(function) {
            if let Some(id) = entry.idle.pop() {
                entry.busy += 1;
                if let Some(slot) = self.slots.get_mut(&id) {
                    self.lru.remove(&(slot.last_used, id));
                    slot.state = State::Busy;
                    slot.last_used = now;
                    self.used_warm_mb -= slot.memory_mb;
                    self.used_running_mb += slot.memory_mb;
                }
                return Acquire::Warm(id);
            }
        }
        let reason = self.cold_reason(now, function);
        match self.reserve(now, function, memory_mb, false) {
            Ok(sandbox) => Acquire::Cold { sandbox, reason },
            Err(free_mb) => Acquire::NoMemory {
                needed_mb: memory_mb,
                free_mb,
            },
        }
    }

    fn cold_reason(&self, now: Micros, function: &str) -> ColdReason {
        match self.functions.get(function) {
            None => ColdReason::New,
            Some(e) if e.busy > 0 && e.starting == 0 => ColdReason::Concurrent,
            Some(e) if e.starting > 0 => ColdReason::PrewarmMiss,
            Some(FunctionEntry {
                last_gone: Some((DestroyReason::Evicted, at)),
                ..
            }) => ColdReason::Evicted {
                ago_us: now.saturating_sub(*at),
            },
            Some(FunctionEntry {
                last_gone: Some((DestroyReason::Expired, at)),
                ..
            }) => ColdReason::Expired {
                ago_us: now.saturating_sub(*at),
            },
            Some(_) => ColdReason::New,
        }
    }

    /// Reserves memory for a new sandbox (busy, or starting if `prewarm`). An invocation may evict
    /// LRU idle sandboxes to make room; a prewarm may not. Returns the free memory on failure
    /// (nothing is evicted then).
    fn reserve(
        &mut self,
        now: Micros,
        function: &str,
        memory_mb: u64,
        prewarm: bool,
    ) -> Result<SandboxId, u64> {
        let free = self.free_mb();
        if free < memory_mb {
            if prewarm || free + self.used_warm_mb < memory_mb {
                return Err(free);
            }
            while self.free_mb() < memory_mb && self.evict_lru(now) {}
        }
        let id = SandboxId(self.next_id);
        self.next_id += 1;
        let name = match self.functions.get_key_value(function) {
            Some((name, _)) => name.clone(),
            None => Arc::from(function),
        };
        let entry = self.functions.entry(name.clone()).or_default();
        let state = if prewarm {
            entry.starting += 1;
            State::Starting
        } else {
            entry.busy += 1;
            State::Busy
        };
        self.slots.insert(
            id,
            Slot {
                function: name,
                memory_mb,
                state,
                last_used: now,
                doomed: false,
            },
        );
        self.used_running_mb += memory_mb;
        Ok(id)
    }

    /// Evicts the least recently used idle sandbox; false when none is idle.
    fn evict_lru(&mut self, now: Micros) -> bool {
        match self.lru.first().copied() {
            Some((_, id)) => {
                self.destroy_idle(now, id, DestroyReason::Evicted);
                true
            }
            None => false,
        }
    }

    fn destroy_idle(&mut self, now: Micros, id: SandboxId, reason: DestroyReason) {
        let Some(slot) = self.slots.remove(&id) else {
            return;
        };
        self.lru.remove(&(slot.last_used, id));
        self.used_warm_mb -= slot.memory_mb;
        if let Some(entry) = self.functions.get_mut(&*slot.function) {
            entry.idle.retain(|s| *s != id);
            entry.last_gone = Some((reason, now));
        }
        self.actions.push_back(PoolAction::Destroy {
            sandbox: id,
            reason,
        });
    }

    /// Starts a sandbox for `function` ahead of demand, using free memory only (a prewarm never
    /// evicts). It becomes idle when [`Self::on_sandbox_ready`] is called.
    pub fn prewarm(
        &mut self,
        now: Micros,
        function: &str,
        memory_mb: u64,
    ) -> Result<SandboxId, u64> {
        self.reserve(now, function, memory_mb, true)
    }

    /// A prewarmed sandbox finished starting.
    pub fn on_sandbox_ready(&mut self, now: Micros, id: SandboxId) {
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        if slot.state != State::Starting {
            return;
        }
        self.used_running_mb -= slot.memory_mb;
        if slot.doomed {
            self.slots.remove(&id);
            self.actions.push_back(PoolAction::Destroy {
                sandbox: id,
                reason: DestroyReason::Retired,
            });
            return;
        }
        slot.state = State::Idle;
        slot.last_used = now;
        self.used_warm_mb += slot.memory_mb;
        self.lru.insert((now, id));
        if let Some(entry) = self.functions.get_mut(&*slot.function) {
            entry.starting -= 1;
            entry.idle.push(id);
        }
    }

    /// A sandbox could not be started (cold or prewarm): its memory is released. The driver
    /// cleans up whatever part of it exists, so no action is emitted.
    pub fn on_start_failed(&mut self, id: SandboxId) {
        let Some(slot) = self.slots.remove(&id) else {
            return;
        };
        self.used_running_mb -= slot.memory_mb;
        if let Some(entry) = self.entry_of(&slot) {
            match slot.state {
                State::Starting => entry.starting -= 1,
                State::Busy => entry.busy -= 1,
                State::Idle => {}
            }
        }
    }

    /// The function entry a slot counts in; retired (doomed) slots count nowhere.
    fn entry_of(&mut self, slot: &Slot) -> Option<&mut FunctionEntry> {
        if slot.doomed {
            None
        } else {
            self.functions.get_mut(&*slot.function)
        }
    }

    /// An invocation finished on sandbox `id`. A reusable sandbox becomes idle (warm); one that
    /// timed out or crashed is destroyed.
    pub fn release(&mut self, now: Micros, id: SandboxId, reusable: bool) {
        let Some(mut slot) = self.slots.remove(&id) else {
            return;
        };
        if slot.state != State::Busy {
            self.slots.insert(id, slot);
            return;
        }
        self.used_running_mb -= slot.memory_mb;
        let keep = reusable && !slot.doomed;
        if let Some(entry) = self.entry_of(&slot) {
            entry.busy -= 1;
            if keep {
                entry.idle.push(id);
            }
        }
        if keep {
            slot.state = State::Idle;
            slot.last_used = now;
            self.used_warm_mb += slot.memory_mb;
            self.lru.insert((now, id));
            self.slots.insert(id, slot);
        } else {
            let reason = if slot.doomed {
                DestroyReason::Retired
            } else {
                DestroyReason::Failed
            };
            self.actions.push_back(PoolAction::Destroy {
                sandbox: id,
                reason,
            });
        }
    }

    /// Background maintenance: ends expired keep-alive windows and evicts LRU sandboxes until the
    /// free-memory buffer is restored.
    pub fn on_timeout(&mut self, now: Micros) {
        let ttl = self.config.keepalive_ttl;
        while let Some(&(last_used, id)) = self.lru.first() {
            if last_used.saturating_add(ttl) > now {
                break;
            }
            self.destroy_idle(now, id, DestroyReason::Expired);
        }
        while self.free_mb() < self.config.free_buffer_mb && self.evict_lru(now) {}
    }

    /// When [`Self::on_timeout`] next has work to do, if ever.
    pub fn next_timeout(&self) -> Option<Micros> {
        self.lru
            .first()
            .map(|(last_used, _)| last_used.saturating_add(self.config.keepalive_ttl))
    }

    /// The function was updated or deleted: its idle sandboxes go now, busy and starting ones
    /// when they finish (they keep counting against memory until then). Its next invocation is
    /// cold with reason `new`.
    pub fn retire(&mut self, function: &str) {
        let Some(entry) = self.functions.remove(function) else {
            return;
        };
        for id in entry.idle {
            if let Some(slot) = self.slots.remove(&id) {
                self.lru.remove(&(slot.last_used, id));
                self.used_warm_mb -= slot.memory_mb;
            }
            self.actions.push_back(PoolAction::Destroy {
                sandbox: id,
                reason: DestroyReason::Retired,
            });
        }
        for slot in self.slots.values_mut() {
            if &*slot.function == function {
                slot.doomed = true;
            }
        }
    }

    /// Shutting down: every idle sandbox is destroyed now and the others as they finish.
    pub fn shutdown(&mut self) {
        let names: Vec<Arc<str>> = self.functions.keys().cloned().collect();
        for name in names {
            self.retire(&name);
        }
        for action in self.actions.iter_mut() {
            let PoolAction::Destroy { reason, .. } = action;
            *reason = DestroyReason::Shutdown;
        }
    }

    /// The next action for the driver.
    pub fn poll_action(&mut self) -> Option<PoolAction> {
        self.actions.pop_front()
    }

    /// Sandboxes alive in any state.
    pub fn sandbox_count(&self) -> usize {
        self.slots.len()
    }

    pub fn stats(&self) -> PoolStats {
        let mut per: HashMap<&str, FunctionPoolStats> = HashMap::new();
        for slot in self.slots.values() {
            let s = per.entry(&slot.function).or_default();
            match slot.state {
                State::Idle => s.warm += 1,
                State::Busy => s.running += 1,
                State::Starting => s.starting += 1,
            }
        }
        let mut functions: Vec<(String, FunctionPoolStats)> =
            per.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        functions.sort_by(|a, b| a.0.cmp(&b.0));
        PoolStats {
            memory_budget_mb: self.config.memory_budget_mb,
            memory_running_mb: self.used_running_mb,
            memory_warm_mb: self.used_warm_mb,
            functions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{ms, secs};

    fn pool(budget: u64, buffer: u64) -> SandboxPool {
        SandboxPool::new(PoolConfig {
            memory_budget_mb: budget,
            free_buffer_mb: buffer,
            keepalive_ttl: secs(10),
        })
    }

    fn cold(a: Acquire) -> (SandboxId, ColdReason) {
        match a {
            Acquire::Cold { sandbox, reason } => (sandbox, reason),
            other => panic!("expected a cold start, got {other:?}"),
        }
    }

    fn drain(p: &mut SandboxPool) -> Vec<PoolAction> {
        std::iter::from_fn(|| p.poll_action()).collect()
    }

    #[test]
    fn warm_reuse_and_concurrent_cold_starts() {
        let mut p = pool(1024, 0);
        let (a, why) = cold(p.acquire(0, "f", 128));
        assert_eq!(why, ColdReason::New);
        p.release(ms(5), a, true);
        assert_eq!(p.acquire(ms(6), "f", 128), Acquire::Warm(a));
        // `a` is busy, so a second concurrent invocation needs its own sandbox.
        let (b, why) = cold(p.acquire(ms(7), "f", 128));
        assert_eq!(why, ColdReason::Concurrent);
        assert_ne!(a, b);
        let s = p.stats();
        assert_eq!((s.memory_running_mb, s.memory_warm_mb), (256, 0));
        p.release(ms(8), a, true);
        p.release(ms(9), b, true);
        // The most recently used idle sandbox is reused first.
        assert_eq!(p.acquire(ms(10), "f", 128), Acquire::Warm(b));
        assert!(drain(&mut p).is_empty());
    }

    #[test]
    fn memory_pressure_evicts_least_recently_used_and_says_so() {
        // Budget 512 MiB = four 128 MiB sandboxes. a, b, c, d idle from t = 1, 2, 3, 4 ms.
        let mut p = pool(512, 0);
        let mut ids = HashMap::new();
        for (i, f) in ["a", "b", "c", "d"].iter().enumerate() {
            let (id, _) = cold(p.acquire(0, f, 128));
            ids.insert(*f, id);
            p.release(ms(i as u64 + 1), id, true);
        }
        // A fifth function at t = 10 ms must evict the LRU sandbox: a's (idle since 1 ms).
        let (_e, why) = cold(p.acquire(ms(10), "e", 128));
        assert_eq!(why, ColdReason::New);
        assert_eq!(
            drain(&mut p),
            vec![PoolAction::Destroy {
                sandbox: ids["a"],
                reason: DestroyReason::Evicted
            }]
        );
        // a comes back 30 ms later: cold, evicted 30 ms ago; this evicts b (idle since 2 ms).
        let (_, why) = cold(p.acquire(ms(40), "a", 128));
        assert_eq!(why, ColdReason::Evicted { ago_us: ms(30) });
        assert_eq!(
            drain(&mut p),
            vec![PoolAction::Destroy {
                sandbox: ids["b"],
                reason: DestroyReason::Evicted
            }]
        );
        let s = p.stats();
        assert_eq!((s.memory_running_mb, s.memory_warm_mb), (256, 256));
    }

    #[test]
    fn no_memory_when_busy_sandboxes_fill_the_budget_and_nothing_is_evicted() {
        let mut p = pool(300, 0);
        let (a, _) = cold(p.acquire(0, "a", 128));
        let (b, _) = cold(p.acquire(0, "b", 128));
        p.release(ms(1), b, true); // b idle: 128 warm, 128 running, 44 free
        assert_eq!(
            p.acquire(ms(2), "c", 256),
            Acquire::NoMemory {
                needed_mb: 256,
                free_mb: 44
            }
        );
        assert!(
            drain(&mut p).is_empty(),
            "a failed reservation evicts nothing"
        );
        // 128 fits once b's idle sandbox is evicted.
        let (_, _) = cold(p.acquire(ms(3), "c", 128));
        assert_eq!(drain(&mut p).len(), 1);
        p.release(ms(4), a, true);
    }

    #[test]
    fn ttl_expires_idle_sandboxes_exactly_at_the_deadline() {
        let mut p = pool(1024, 0);
        let (a, _) = cold(p.acquire(0, "f", 128));
        p.release(ms(100), a, true);
        assert_eq!(p.next_timeout(), Some(ms(100) + secs(10)));
        p.on_timeout(ms(100) + secs(10) - 1);
        assert!(drain(&mut p).is_empty());
        p.on_timeout(ms(100) + secs(10));
        assert_eq!(
            drain(&mut p),
            vec![PoolAction::Destroy {
                sandbox: a,
                reason: DestroyReason::Expired
            }]
        );
        assert_eq!(p.next_timeout(), None);
        let (_, why) = cold(p.acquire(ms(100) + secs(12), "f", 128));
        assert_eq!(why, ColdReason::Expired { ago_us: secs(2) });
    }

    #[test]
    fn background_eviction_keeps_the_free_buffer() {
        let mut p = pool(512, 128);
        for (i, f) in ["a", "b", "c", "d"].iter().enumerate() {
            let (id, _) = cold(p.acquire(0, f, 128));
            p.release(ms(i as u64), id, true);
        }
        p.on_timeout(ms(5));
        let actions = drain(&mut p);
        assert_eq!(actions.len(), 1, "one eviction restores 128 MiB free");
        assert_eq!(p.stats().memory_warm_mb, 384);
    }

    #[test]
    fn failed_sandboxes_are_destroyed_not_reused() {
        let mut p = pool(1024, 0);
        let (a, _) = cold(p.acquire(0, "f", 128));
        p.release(ms(1), a, false);
        assert_eq!(
            drain(&mut p),
            vec![PoolAction::Destroy {
                sandbox: a,
                reason: DestroyReason::Failed
            }]
        );
        assert_eq!(p.stats().memory_running_mb, 0);
        let (b, _) = cold(p.acquire(ms(2), "f", 128));
        assert_ne!(a, b);
        p.on_start_failed(b);
        assert_eq!(p.sandbox_count(), 0);
        assert_eq!(p.stats(), pool(1024, 0).stats());
    }

    #[test]
    fn retire_destroys_idle_now_and_busy_when_done() {
        let mut p = pool(1024, 0);
        let (a, _) = cold(p.acquire(0, "f", 128));
        let (b, _) = cold(p.acquire(0, "f", 128));
        p.release(ms(1), a, true);
        p.retire("f");
        assert_eq!(
            drain(&mut p),
            vec![PoolAction::Destroy {
                sandbox: a,
                reason: DestroyReason::Retired
            }]
        );
        // The new version never reuses b, even though b finishes fine.
        let (c, why) = cold(p.acquire(ms(2), "f", 128));
        assert_eq!(why, ColdReason::New);
        p.release(ms(3), b, true);
        assert_eq!(
            drain(&mut p),
            vec![PoolAction::Destroy {
                sandbox: b,
                reason: DestroyReason::Retired
            }]
        );
        p.release(ms(4), c, true);
        assert_eq!(p.acquire(ms(5), "f", 128), Acquire::Warm(c));
        let s = p.stats();
        assert_eq!((s.memory_running_mb, s.memory_warm_mb), (128, 0));
    }

    #[test]
    fn prewarm_uses_free_memory_only_and_becomes_warm_when_ready() {
        let mut p = pool(256, 0);
        let w = p.prewarm(0, "f", 128).unwrap();
        let (_, why) = cold(p.acquire(ms(1), "f", 128));
        assert_eq!(why, ColdReason::PrewarmMiss);
        assert_eq!(p.prewarm(ms(2), "f", 128), Err(0), "prewarm never evicts");
        p.on_sandbox_ready(ms(3), w);
        assert_eq!(p.acquire(ms(4), "f", 128), Acquire::Warm(w));
    }

    #[test]
    fn shutdown_destroys_everything_idle_and_busy_on_release() {
        let mut p = pool(1024, 0);
        let (a, _) = cold(p.acquire(0, "f", 128));
        let (b, _) = cold(p.acquire(0, "g", 128));
        p.release(ms(1), a, true);
        p.shutdown();
        assert_eq!(
            drain(&mut p),
            vec![PoolAction::Destroy {
                sandbox: a,
                reason: DestroyReason::Shutdown
            }]
        );
        p.release(ms(2), b, true);
        assert_eq!(drain(&mut p).len(), 1);
        assert_eq!(p.sandbox_count(), 0);
    }
}
