//! The sandbox pool: which sandbox serves an invocation, which warm sandboxes expire or are
//! evicted, and the worker's memory accounting.
//!
//! A sans-I/O state machine: the driver hands it the time and events and carries out the
//! [`PoolAction`]s it returns (destroying or pre-warming a sandbox is the driver's I/O, done off
//! the hot path). Which idle sandbox goes first, and when one expires, is the keep-alive policy's
//! decision ([`crate::policy::keepalive`]): priorities are kept per function in an ordered index
//! (the function's least recently used idle sandbox represents it), so choosing a victim is
//! O(log functions).
//!
//! Memory invariant: the memory of starting, busy and idle sandboxes never exceeds the budget,
//! except while a budget cut at run time ([`SandboxPool::set_memory_budget`]) is below what is
//! starting and running: then no sandbox is kept idle and none starts until it is back under.
//! Proactive sandboxes ([`proactive`]) live in their own part of it, `proactive_mb`, which
//! reactive and generic sandboxes never use.

mod function;
mod generic;
mod index;
mod proactive;
mod types;

pub use function::FnId;
pub use generic::{GenericConfig, GenericKey, GenericStats};
pub use types::{
    Acquire, ColdReason, DestroyReason, FunctionPoolStats, PoolAction, PoolConfig, PoolConfigError,
    PoolStats, ProactiveError, ProactiveEvicted, SandboxId,
};

use crate::policy::keepalive::{new_policy, IdleAfter, KeepAlivePolicy, SandboxFacts};
#[cfg(test)]
use crate::policy::keepalive::{KeepAliveConfig, KeepAliveKind};
use crate::time::Micros;
use function::{FunctionEntry, Slot, State};
use index::{EvictKey, Prio};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// The pool state machine.
#[derive(Debug)]
pub struct SandboxPool {
    config: PoolConfig,
    policy: Box<dyn KeepAlivePolicy>,
    next_id: u64,
    slots: HashMap<SandboxId, Slot>,
    ids: HashMap<Arc<str>, FnId>,
    names: Vec<Arc<str>>,
    functions: HashMap<FnId, FunctionEntry>,
    evict_index: BTreeSet<EvictKey>,
    /// Idle sandboxes with a keep-alive deadline, by deadline.
    expiry: BTreeSet<(Micros, SandboxId)>,
    /// Policy pre-warms, by time.
    prewarms: BTreeSet<(Micros, FnId)>,
    used_running_mb: u64,
    used_warm_mb: u64,
    generic: generic::GenericPool,
    /// Memory of generic sandboxes, ready or being made.
    used_generic_mb: u64,
    /// The generic pool's target when it was last refilled (for stats, which have no clock).
    generic_target: u32,
    /// Functions whose generic sandboxes are not the default key's (a layer, another runtime).
    generic_keys: HashMap<FnId, GenericKey>,
    /// The proactive pool's size (clamped to the budget) and the memory of its sandboxes.
    proactive_mb: u64,
    used_proactive_mb: u64,
    /// The budget was cut at run time (what is running may exceed it until it ends).
    budget_cut: bool,
    actions: VecDeque<PoolAction>,
}

impl SandboxPool {
    pub fn new(config: PoolConfig) -> Self {
        SandboxPool {
            policy: new_policy(&config.keepalive),
            generic: generic::GenericPool::new(config.generic.clone()),
            proactive_mb: config.proactive_mb.min(config.memory_budget_mb),
            config,
            next_id: 1,
            slots: HashMap::new(),
            ids: HashMap::new(),
            names: Vec::new(),
            functions: HashMap::new(),
            evict_index: BTreeSet::new(),
            expiry: BTreeSet::new(),
            prewarms: BTreeSet::new(),
            used_running_mb: 0,
            used_warm_mb: 0,
            used_generic_mb: 0,
            generic_target: 0,
            generic_keys: HashMap::new(),
            used_proactive_mb: 0,
            budget_cut: false,
            actions: VecDeque::new(),
        }
    }

    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    pub fn policy(&self) -> &dyn KeepAlivePolicy {
        &*self.policy
    }

    /// Free memory for reactive and generic sandboxes (the proactive pool's part excluded).
    pub fn free_mb(&self) -> u64 {
        self.reactive_budget_mb()
            .saturating_sub(self.used_running_mb + self.used_warm_mb + self.used_generic_mb)
    }

    /// Memory held by starting and busy sandboxes: it comes back when they finish.
    pub fn running_mb(&self) -> u64 {
        self.used_running_mb
    }

    /// Memory that comes back without anyone giving it up: starting and busy sandboxes, and
    /// generic sandboxes being made (a ready one can be reclaimed). An invocation short of
    /// memory waits for it rather than being refused.
    pub fn returning_mb(&self) -> u64 {
        self.used_running_mb + self.generic.creating_mb()
    }

    fn intern(&mut self, name: &str) -> FnId {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = FnId(self.names.len() as u32);
        let name: Arc<str> = Arc::from(name);
        self.names.push(name.clone());
        self.ids.insert(name, id);
        id
    }

    fn entry(&mut self, fid: FnId, memory_mb: u64) -> &mut FunctionEntry {
        let e = self
            .functions
            .entry(fid)
            .or_insert_with(|| FunctionEntry::new(memory_mb));
        e.memory_mb = memory_mb;
        e
    }

    /// Whether an invocation of `function` could start now without waiting for memory:
    /// `Some(true)` on an idle sandbox of its own, `Some(false)` with a cold start (in free
    /// memory, or in what evicting idle and ready generic sandboxes frees, as
    /// [`Self::acquire`] would), `None` when it must wait.
    pub fn can_acquire(&self, function: &str, memory_mb: u64) -> Option<bool> {
        if self.idle_count(function) > 0 {
            return Some(true);
        }
        let ready_generic = self.generic.ready_mb();
        (self.free_mb() + self.used_warm_mb + ready_generic >= memory_mb).then_some(false)
    }

    /// Sandboxes of `function` an invocation may take right now: idle reactive ones and idle
    /// proactive ones that are not soft-evicted.
    pub fn idle_count(&self, function: &str) -> usize {
        self.ids
            .get(function)
            .and_then(|f| self.functions.get(f))
            .map_or(0, |e| e.idle.len() + e.pro.idle.len())
    }

    /// An invocation of `function` arrived (HIST learns inter-arrival times from this).
    pub fn on_arrival(&mut self, now: Micros, function: &str, memory_mb: u64) {
        if !self.policy.observes_arrivals() {
            return;
        }
        let fid = self.intern(function);
        self.entry(fid, memory_mb);
        self.policy.on_arrival(now, fid);
    }

    /// The cost of a cold start of `function` (its init time) changed.
    pub fn set_cost(&mut self, function: &str, init_us: Micros) {
        let Some(&fid) = self.ids.get(function) else {
            return;
        };
        if let Some(e) = self.functions.get_mut(&fid) {
            e.cost_ms = init_us as f64 / 1000.0;
        }
        self.policy.on_cost(fid, init_us);
        if self.policy.uses_function_facts() {
            self.reindex(fid);
        }
    }

    /// Picks a sandbox for an invocation of `function` needing `memory_mb`: an idle proactive
    /// one (not soft-evicted), else an idle reactive one, else a new one.
    pub fn acquire(&mut self, now: Micros, function: &str, memory_mb: u64) -> Acquire {
        let fid = self.intern(function);
        if let Some(id) = self.acquire_proactive(now, fid) {
            return Acquire::Warm(id);
        }
        let clock = self.policy.clock();
        let e = self.entry(fid, memory_mb);
        if let Some(id) = e.idle.pop_back() {
            e.busy += 1;
            e.freq += 1;
            e.last_clock = clock;
            if let Some(slot) = self.slots.get_mut(&id) {
                if let Some(d) = slot.deadline.take() {
                    self.expiry.remove(&(d, id));
                }
                slot.state = State::Busy;
                slot.last_used = now;
                self.used_warm_mb -= slot.memory_mb;
                self.used_running_mb += slot.memory_mb;
            }
            self.reindex(fid);
            return Acquire::Warm(id);
        }
        let reason = self.cold_reason(now, fid);
        // The generic sandbox's memory becomes part of the function's reservation. Only one of
        // the function's own key serves it (another layer or runtime would not).
        let key = self.generic_keys.get(&fid).cloned().unwrap_or_default();
        let generic = self.generic.take(now, &key, memory_mb);
        if let Some((_, mb)) = generic {
            self.used_generic_mb -= mb;
        }
        let acquired = match self.reserve(now, fid, memory_mb, false) {
            Ok(sandbox) => {
                if let Some(e) = self.functions.get_mut(&fid) {
                    e.freq += 1;
                    e.last_clock = self.policy.clock();
                }
                Acquire::Cold {
                    sandbox,
                    reason,
                    generic: generic.map(|(g, _)| g),
                }
            }
            Err(free_mb) => {
                if let Some((g, mb)) = generic {
                    self.generic.put_back(&key, g, mb);
                    self.used_generic_mb += mb;
                }
                Acquire::NoMemory {
                    needed_mb: memory_mb,
                    free_mb,
                }
            }
        };
        self.refill_generic(now);
        acquired
    }

    /// Brings the generic pool to its target: destroys ready ones beyond it, and starts new
    /// ones with free memory only (a refill never evicts).
    fn refill_generic(&mut self, now: Micros) {
        if !self.generic.config.enabled() && self.generic.held() == 0 {
            return;
        }
        self.generic.prune(now);
        self.generic_target = self.generic.target(now);
        for (id, mb) in self.generic.surplus(now) {
            self.used_generic_mb -= mb;
            self.actions.push_back(PoolAction::Destroy {
                sandbox: id,
                reason: DestroyReason::Expired,
            });
        }
        // Keys emptied by the surplus are forgotten now.
        self.generic.prune(now);
        // Each round makes one sandbox or holds one key back, so the loop ends.
        while let Some((key, memory_mb)) = self.generic.next_deficit(now) {
            if self.free_mb() < memory_mb {
                self.generic.back_off(&key, now);
                continue;
            }
            let sandbox = SandboxId(self.next_id);
            self.next_id += 1;
            self.used_generic_mb += memory_mb;
            self.generic.creating(&key, sandbox, memory_mb);
            self.actions.push_back(PoolAction::CreateGeneric {
                sandbox,
                key,
                memory_mb,
            });
        }
    }

    /// A generic sandbox is ready to be specialized.
    pub fn on_generic_ready(&mut self, now: Micros, id: SandboxId) {
        if self.generic.on_ready(id) {
            self.shed(now);
            self.refill_generic(now);
        }
    }

    /// A generic sandbox failed to start: its memory is released; the driver cleans up what
    /// exists of it, and the pool waits a while before trying again.
    pub fn on_generic_failed(&mut self, now: Micros, id: SandboxId) {
        if let Some(mb) = self.generic.on_failed(now, id) {
            self.used_generic_mb -= mb;
        }
    }

    /// The function a (non-generic) sandbox belongs to.
    pub fn function_of(&self, id: SandboxId) -> Option<Arc<str>> {
        let slot = self.slots.get(&id)?;
        self.names.get(slot.function.0 as usize).cloned()
    }

    /// The generic sandboxes a cold start of `function` takes: those of its runtime
    /// (`None`: the worker's default) and dependency layer (`None`: a bare interpreter). The
    /// driver says it before the function's invocations; without a word, the default key.
    /// Allocates nothing when nothing changes, so it may be said on every invocation.
    pub fn set_generic_key(&mut self, function: &str, runtime: Option<&str>, layer: Option<&str>) {
        let default = runtime.is_none() && layer.is_none();
        let fid = match self.ids.get(function) {
            Some(fid) => *fid,
            None if default => return,
            None => self.intern(function),
        };
        match self.generic_keys.get(&fid) {
            Some(k) if k.is(runtime, layer) => {}
            None if default => {}
            _ if default => {
                self.generic_keys.remove(&fid);
            }
            _ => {
                self.generic_keys
                    .insert(fid, GenericKey::new(runtime, layer));
            }
        }
    }

    /// The key of a generic sandbox ready or being made.
    pub fn generic_key_of(&self, id: SandboxId) -> Option<&GenericKey> {
        self.generic.key_of(id)
    }

    /// Whether `id` is a generic sandbox (ready or being made). For tests.
    #[doc(hidden)]
    pub fn is_generic(&self, id: SandboxId) -> bool {
        self.generic.holds(id)
    }

    /// Changes the memory budget at run time (elastic provisioning, thesis §3.4.2): the pool's
    /// part of cascade deflation. Growing frees room at once. Shrinking destroys idle sandboxes
    /// (ready generic ones first, then warm ones in the keep-alive policy's eviction order)
    /// until the reactive memory fits; starting and busy sandboxes are never touched, so if they
    /// alone exceed the new budget the pool stays over it, starts nothing and keeps nothing idle
    /// until enough of them end. The proactive pool keeps its size: the budget never goes under
    /// it. Returns the budget applied.
    pub fn set_memory_budget(&mut self, now: Micros, budget_mb: u64) -> u64 {
        let budget_mb = budget_mb.max(self.proactive_mb);
        self.budget_cut |= budget_mb < self.config.memory_budget_mb;
        self.config.memory_budget_mb = budget_mb;
        self.shed(now);
        budget_mb
    }

    /// Memory of reactive and generic sandboxes beyond their part of the budget (after a cut).
    pub fn over_budget_mb(&self) -> u64 {
        (self.used_running_mb + self.used_warm_mb + self.used_generic_mb)
            .saturating_sub(self.reactive_budget_mb())
    }

    /// Destroys idle sandboxes while the pool is over its budget.
    fn shed(&mut self, now: Micros) {
        while self.over_budget_mb() > 0 {
            if let Some((g, mb)) = self.generic.pop_ready() {
                self.used_generic_mb -= mb;
                self.actions.push_back(PoolAction::Destroy {
                    sandbox: g,
                    reason: DestroyReason::Evicted,
                });
            } else if !self.evict_one(now) {
                break;
            }
        }
    }

    fn cold_reason(&self, now: Micros, fid: FnId) -> ColdReason {
        let Some(e) = self.functions.get(&fid) else {
            return ColdReason::New;
        };
        if e.starting > 0 || e.pro.starting > 0 {
            return ColdReason::PrewarmMiss;
        }
        if e.busy > 0 || e.pro.busy > 0 {
            return ColdReason::Concurrent;
        }
        match e.last_gone {
            Some((DestroyReason::Evicted, at)) => ColdReason::Evicted {
                ago_us: now.saturating_sub(at),
            },
            Some((DestroyReason::Expired, at)) => ColdReason::Expired {
                ago_us: now.saturating_sub(at),
            },
            _ => ColdReason::New,
        }
    }

    /// Reserves memory for a new sandbox (busy, or starting if `prewarm`). An invocation may evict
    /// idle sandboxes in the policy's order to make room; a prewarm may not. Returns the free
    /// memory on failure (nothing is evicted then).
    fn reserve(
        &mut self,
        now: Micros,
        fid: FnId,
        memory_mb: u64,
        prewarm: bool,
    ) -> Result<SandboxId, u64> {
        let free = self.free_mb();
        if free < memory_mb {
            let ready_generic = self.generic.ready_mb();
            if prewarm || free + self.used_warm_mb + ready_generic < memory_mb {
                return Err(free);
            }
            // Ready generic sandboxes first: remade in the background for the price of a
            // creation, where an evicted warm sandbox costs its function a cold start.
            while self.free_mb() < memory_mb {
                let Some((g, mb)) = self.generic.pop_ready() else {
                    break;
                };
                self.used_generic_mb -= mb;
                self.actions.push_back(PoolAction::Destroy {
                    sandbox: g,
                    reason: DestroyReason::Evicted,
                });
            }
            while self.free_mb() < memory_mb && self.evict_one(now) {}
        }
        let id = SandboxId(self.next_id);
        self.next_id += 1;
        let e = self.entry(fid, memory_mb);
        let state = if prewarm {
            e.starting += 1;
            State::Starting
        } else {
            e.busy += 1;
            State::Busy
        };
        self.slots.insert(
            id,
            Slot {
                function: fid,
                memory_mb,
                state,
                last_used: now,
                clock: self.policy.clock(),
                deadline: None,
                doomed: false,
                pro: None,
            },
        );
        self.used_running_mb += memory_mb;
        Ok(id)
    }

    /// Recomputes a function's place in the eviction index.
    fn reindex(&mut self, fid: FnId) {
        let Some(e) = self.functions.get_mut(&fid) else {
            return;
        };
        if let Some(old) = e.evict_key.take() {
            self.evict_index.remove(&old);
        }
        let Some(slot) = e.idle.front().and_then(|id| self.slots.get(id)) else {
            return;
        };
        let sb = SandboxFacts {
            clock: slot.clock,
            last_used: slot.last_used,
        };
        let key = EvictKey {
            prio: Prio(self.policy.priority(&e.facts(), &sb)),
            last_used: slot.last_used,
            function: fid,
        };
        e.evict_key = Some(key);
        self.evict_index.insert(key);
    }

    /// Evicts the idle sandbox with the lowest priority; false when none is idle.
    fn evict_one(&mut self, now: Micros) -> bool {
        let Some(key) = self.evict_index.first().copied() else {
            return false;
        };
        let Some(id) = self
            .functions
            .get(&key.function)
            .and_then(|e| e.idle.front().copied())
        else {
            self.evict_index.remove(&key);
            return true;
        };
        self.policy.on_evicted(key.prio.0);
        self.destroy_idle(now, id, DestroyReason::Evicted);
        true
    }

    fn destroy_idle(&mut self, now: Micros, id: SandboxId, reason: DestroyReason) {
        let Some(slot) = self.slots.remove(&id) else {
            return;
        };
        if let Some(d) = slot.deadline {
            self.expiry.remove(&(d, id));
        }
        self.used_warm_mb -= slot.memory_mb;
        if let Some(e) = self.functions.get_mut(&slot.function) {
            e.idle.retain(|s| *s != id);
            e.last_gone = Some((reason, now));
        }
        self.after_removal(slot.function);
        self.actions.push_back(PoolAction::Destroy {
            sandbox: id,
            reason,
        });
    }

    /// A function lost a sandbox: GDSF's frequency resets when its last one goes.
    fn after_removal(&mut self, fid: FnId) {
        if let Some(e) = self.functions.get_mut(&fid) {
            if !e.has_sandboxes() {
                e.freq = 0;
            }
        }
        self.reindex(fid);
    }

    /// Starts a sandbox for `function` ahead of demand, using free memory only (a prewarm never
    /// evicts). It becomes idle when [`Self::on_sandbox_ready`] is called.
    pub fn prewarm(
        &mut self,
        now: Micros,
        function: &str,
        memory_mb: u64,
    ) -> Result<SandboxId, u64> {
        let fid = self.intern(function);
        self.reserve(now, fid, memory_mb, true)
    }

    /// A prewarmed sandbox finished starting.
    pub fn on_sandbox_ready(&mut self, now: Micros, id: SandboxId) {
        let clock = self.policy.clock();
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        if slot.state != State::Starting {
            return;
        }
        if slot.pro.is_some() {
            if let Some(slot) = self.slots.remove(&id) {
                self.proactive_to_idle(now, id, slot);
            }
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
        slot.clock = clock;
        self.used_warm_mb += slot.memory_mb;
        let fid = slot.function;
        let mut plan = None;
        if let Some(e) = self.functions.get_mut(&fid) {
            e.starting -= 1;
            e.idle.push_back(id);
            plan = Some(self.policy.on_idle(now, fid, IdleAfter::Prewarm));
        }
        let plan = plan.unwrap_or_default();
        if let Some(d) = plan.deadline {
            slot.deadline = Some(d);
            self.expiry.insert((d, id));
        }
        if let Some(at) = plan.prewarm_at {
            self.prewarms.insert((at, fid));
        }
        if plan.unload {
            self.destroy_idle(now, id, DestroyReason::Expired);
        } else {
            self.reindex(fid);
        }
        self.shed(now);
    }

    /// A sandbox could not be started (cold or prewarm): its memory is released. The driver
    /// cleans up whatever part of it exists, so no action is emitted.
    pub fn on_start_failed(&mut self, id: SandboxId) {
        let Some(slot) = self.slots.remove(&id) else {
            return;
        };
        if slot.pro.is_some() {
            if slot.state == State::Idle {
                self.slots.insert(id, slot);
            } else {
                self.proactive_gone(id, &slot, false);
            }
            return;
        }
        self.used_running_mb -= slot.memory_mb;
        if let Some(entry) = self.entry_of(&slot) {
            match slot.state {
                State::Starting => entry.starting -= 1,
                State::Busy => entry.busy -= 1,
                State::Idle => {}
            }
        }
        if !slot.doomed {
            self.after_removal(slot.function);
        }
    }

    /// The function entry a slot counts in; retired (doomed) slots count nowhere.
    fn entry_of(&mut self, slot: &Slot) -> Option<&mut FunctionEntry> {
        if slot.doomed {
            None
        } else {
            self.functions.get_mut(&slot.function)
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
        if slot.pro.is_some() {
            if reusable {
                self.proactive_to_idle(now, id, slot);
            } else {
                self.proactive_gone(id, &slot, true);
            }
            return;
        }
        self.used_running_mb -= slot.memory_mb;
        let fid = slot.function;
        let keep = reusable && !slot.doomed;
        if let Some(entry) = self.entry_of(&slot) {
            entry.busy -= 1;
        }
        if !keep {
            let reason = if slot.doomed {
                DestroyReason::Retired
            } else {
                DestroyReason::Failed
            };
            if !slot.doomed {
                self.after_removal(fid);
            }
            self.actions.push_back(PoolAction::Destroy {
                sandbox: id,
                reason,
            });
            return;
        }
        let clock = self.policy.clock();
        slot.state = State::Idle;
        slot.last_used = now;
        slot.clock = clock;
        let plan = self.policy.on_idle(now, fid, IdleAfter::Run);
        slot.deadline = plan.deadline;
        let unload = plan.unload;
        if let Some(at) = plan.prewarm_at {
            self.prewarms.insert((at, fid));
        }
        if let Some(d) = slot.deadline {
            self.expiry.insert((d, id));
        }
        self.used_warm_mb += slot.memory_mb;
        self.slots.insert(id, slot);
        if let Some(e) = self.functions.get_mut(&fid) {
            e.last_clock = clock;
            e.idle.push_back(id);
        }
        if unload {
            // The policy unloads it (HIST: gone until its pre-warm, before the next arrival).
            self.destroy_idle(now, id, DestroyReason::Expired);
        } else {
            self.reindex(fid);
        }
        self.shed(now);
    }

    /// Background maintenance: ends keep-alive windows, starts the policy's pre-warms and evicts
    /// idle sandboxes until the free-memory buffer is restored.
    pub fn on_timeout(&mut self, now: Micros) {
        while let Some(&(deadline, id)) = self.expiry.first() {
            if deadline > now {
                break;
            }
            self.expiry.remove(&(deadline, id));
            if let Some(slot) = self.slots.get_mut(&id) {
                slot.deadline = None;
            }
            self.destroy_idle(now, id, DestroyReason::Expired);
        }
        while let Some(&(at, fid)) = self.prewarms.first() {
            if at > now {
                break;
            }
            self.prewarms.remove(&(at, fid));
            self.start_policy_prewarm(now, at, fid);
        }
        while self.free_mb() < self.config.free_buffer_mb && self.evict_one(now) {}
        self.shed(now);
        self.refill_generic(now);
    }

    /// Starts a scheduled pre-warm unless the function is gone, rescheduled, or already has a
    /// sandbox.
    fn start_policy_prewarm(&mut self, now: Micros, at: Micros, fid: FnId) {
        let Some(e) = self.functions.get(&fid) else {
            return;
        };
        if !self.policy.take_prewarm(now, fid, at) || e.has_sandboxes() {
            return;
        }
        let memory_mb = e.memory_mb;
        if let Ok(sandbox) = self.reserve(now, fid, memory_mb, true) {
            self.actions.push_back(PoolAction::Prewarm {
                sandbox,
                function: self.names[fid.0 as usize].clone(),
            });
        }
    }

    /// When [`Self::on_timeout`] next has work to do, if ever.
    pub fn next_timeout(&self) -> Option<Micros> {
        let expiry = self.expiry.first().map(|(d, _)| *d);
        let prewarm = self.prewarms.first().map(|(t, _)| *t);
        // Below its floor (at start-up): at once.
        let generic = if self.generic.wants_refill() {
            Some(0)
        } else {
            self.generic.next_change()
        };
        [expiry, prewarm, generic].into_iter().flatten().min()
    }

    /// The function was updated or deleted: its idle sandboxes go now, busy and starting ones
    /// when they finish (they keep counting against memory until then). Its next invocation is
    /// cold with reason `new`.
    pub fn retire(&mut self, function: &str) {
        let Some(&fid) = self.ids.get(function) else {
            return;
        };
        let Some(entry) = self.functions.remove(&fid) else {
            return;
        };
        self.policy.forget(fid);
        if let Some(k) = entry.evict_key {
            self.evict_index.remove(&k);
        }
        for id in entry.pro.idle.iter().chain(&entry.pro.soft) {
            if let Some(slot) = self.slots.remove(id) {
                self.used_proactive_mb -= slot.memory_mb;
            }
            self.actions.push_back(PoolAction::Destroy {
                sandbox: *id,
                reason: DestroyReason::Retired,
            });
        }
        for id in entry.idle {
            if let Some(slot) = self.slots.remove(&id) {
                if let Some(d) = slot.deadline {
                    self.expiry.remove(&(d, id));
                }
                self.used_warm_mb -= slot.memory_mb;
            }
            self.actions.push_back(PoolAction::Destroy {
                sandbox: id,
                reason: DestroyReason::Retired,
            });
        }
        for slot in self.slots.values_mut() {
            if slot.function == fid {
                slot.doomed = true;
            }
        }
    }

    /// Shutting down: every idle sandbox is destroyed now and the others as they finish.
    pub fn shutdown(&mut self) {
        let names: Vec<Arc<str>> = self.ids.keys().cloned().collect();
        for name in names {
            self.retire(&name);
        }
        self.prewarms.clear();
        for (id, mb) in self.generic.drain() {
            self.used_generic_mb -= mb;
            self.actions.push_back(PoolAction::Destroy {
                sandbox: id,
                reason: DestroyReason::Shutdown,
            });
        }
        for action in self.actions.iter_mut() {
            if let PoolAction::Destroy { reason, .. } = action {
                *reason = DestroyReason::Shutdown;
            }
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
        let mut per: HashMap<FnId, FunctionPoolStats> = HashMap::new();
        for slot in self.slots.values() {
            let s = per.entry(slot.function).or_default();
            match (slot.state, slot.pro) {
                (State::Idle, None) => s.warm += 1,
                (State::Busy, None) => s.running += 1,
                (State::Starting, None) => s.starting += 1,
                (State::Idle, Some(m)) if m.soft => s.proactive_soft += 1,
                (State::Idle, Some(_)) => s.proactive_idle += 1,
                (State::Busy, Some(_)) => s.proactive_busy += 1,
                (State::Starting, Some(_)) => s.proactive_starting += 1,
            }
        }
        let mut functions: Vec<(String, FunctionPoolStats)> = per
            .into_iter()
            .map(|(k, v)| (self.names[k.0 as usize].to_string(), v))
            .collect();
        functions.sort_by(|a, b| a.0.cmp(&b.0));
        PoolStats {
            memory_budget_mb: self.config.memory_budget_mb,
            memory_running_mb: self.used_running_mb,
            memory_warm_mb: self.used_warm_mb,
            memory_generic_mb: self.used_generic_mb,
            proactive_pool_mb: self.proactive_mb,
            memory_proactive_mb: self.used_proactive_mb,
            generic: self.generic.stats(self.generic_target),
            functions,
        }
    }

    /// Idle (warm) sandboxes, in no particular order. For tests and property checks.
    #[doc(hidden)]
    pub fn idle_sandboxes(&self) -> Vec<SandboxId> {
        self.slots
            .iter()
            .filter(|(_, s)| s.state == State::Idle)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether `id` belongs to a retired function version (it is destroyed, never reused, when
    /// it finishes); `None` for an unknown sandbox. For tests and property checks.
    #[doc(hidden)]
    pub fn is_retired(&self, id: SandboxId) -> Option<bool> {
        self.slots.get(&id).map(|s| s.doomed)
    }

    /// Checks the pool's internal consistency (memory accounting, the idle sets, per-function
    /// counts, the eviction and expiry indexes); O(sandboxes). For tests and property checks.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let (mut running, mut warm, mut proactive) = (0, 0, 0);
        let mut counts: HashMap<FnId, (usize, u32, u32)> = HashMap::new();
        // Proactive idle, soft, busy, starting per function.
        let mut pro_counts: HashMap<FnId, (usize, usize, u32, u32)> = HashMap::new();
        for (id, s) in &self.slots {
            if let Some(m) = s.pro {
                proactive += s.memory_mb;
                if s.deadline.is_some() {
                    return Err(format!("proactive {id} has a keep-alive deadline"));
                }
                if s.doomed {
                    if s.state == State::Idle {
                        return Err(format!("proactive {id} is idle but retired"));
                    }
                    continue;
                }
                let Some(e) = self.functions.get(&s.function) else {
                    return Err(format!("proactive {id} has no function entry"));
                };
                let c = pro_counts.entry(s.function).or_default();
                match s.state {
                    State::Idle => {
                        let (listed, other) = if m.soft {
                            c.1 += 1;
                            (&e.pro.soft, &e.pro.idle)
                        } else {
                            c.0 += 1;
                            (&e.pro.idle, &e.pro.soft)
                        };
                        if !listed.contains(id) || other.contains(id) || m.kill {
                            return Err(format!("proactive {id} (soft {}) misfiled", m.soft));
                        }
                    }
                    State::Busy | State::Starting => {
                        if s.state == State::Busy {
                            c.2 += 1;
                        } else {
                            c.3 += 1;
                        }
                        if !e.pro.running.contains(id) {
                            return Err(format!("proactive {id} is running but not listed"));
                        }
                    }
                }
                continue;
            }
            let c = counts.entry(s.function).or_default();
            match s.state {
                State::Idle => {
                    warm += s.memory_mb;
                    if s.doomed {
                        return Err(format!("{id} is idle but retired"));
                    }
                    c.0 += 1;
                    let listed = self
                        .functions
                        .get(&s.function)
                        .is_some_and(|e| e.idle.contains(id));
                    if !listed {
                        return Err(format!("{id} is idle but not in its function's idle set"));
                    }
                    if let Some(d) = s.deadline {
                        if !self.expiry.contains(&(d, *id)) {
                            return Err(format!("{id}'s deadline is not in the expiry index"));
                        }
                    }
                }
                State::Busy | State::Starting => {
                    running += s.memory_mb;
                    if s.deadline.is_some() {
                        return Err(format!("{id} is {:?} with a deadline", s.state));
                    }
                    if !s.doomed {
                        if s.state == State::Busy {
                            c.1 += 1;
                        } else {
                            c.2 += 1;
                        }
                    }
                }
            }
        }
        if (running, warm) != (self.used_running_mb, self.used_warm_mb) {
            return Err(format!(
                "memory accounting: counted running {running} warm {warm}, kept {} and {}",
                self.used_running_mb, self.used_warm_mb
            ));
        }
        self.generic.check()?;
        let generic = self.generic.held_mb();
        if generic != self.used_generic_mb {
            return Err(format!(
                "generic memory: {} held ({generic} MiB), kept {}",
                self.generic.held(),
                self.used_generic_mb
            ));
        }
        if proactive != self.used_proactive_mb {
            return Err(format!(
                "proactive memory: counted {proactive}, kept {}",
                self.used_proactive_mb
            ));
        }
        if proactive > self.proactive_mb {
            return Err(format!(
                "proactive pool over its size: {proactive} > {}",
                self.proactive_mb
            ));
        }
        // Over budget only after a cut below what is running, and then with nothing idle.
        let over = running + warm + generic > self.reactive_budget_mb();
        if over && (warm > 0 || self.generic.ready_count() > 0) {
            return Err(format!(
                "over the reactive budget with idle sandboxes: {running} + {warm} + {generic} > {}",
                self.reactive_budget_mb()
            ));
        }
        if over && (!self.budget_cut || running + self.generic.creating_count() == 0) {
            return Err(format!(
                "reactive memory in the proactive pool: {running} + {warm} + {generic} > {}",
                self.reactive_budget_mb()
            ));
        }
        if !over && running + warm + generic + proactive > self.config.memory_budget_mb {
            return Err(format!(
                "over budget: {running} + {warm} + {generic} + {proactive} > {}",
                self.config.memory_budget_mb
            ));
        }
        for (fid, e) in &self.functions {
            let (idle, busy, starting) = counts.get(fid).copied().unwrap_or_default();
            if (e.idle.len(), e.busy, e.starting) != (idle, busy, starting) {
                return Err(format!(
                    "function {}: kept idle/busy/starting {}/{}/{}, counted {idle}/{busy}/{starting}",
                    self.names[fid.0 as usize],
                    e.idle.len(),
                    e.busy,
                    e.starting
                ));
            }
            let pro = pro_counts.get(fid).copied().unwrap_or_default();
            let kept = (
                e.pro.idle.len(),
                e.pro.soft.len(),
                e.pro.busy,
                e.pro.starting,
            );
            if kept != pro || e.pro.running.len() != (e.pro.busy + e.pro.starting) as usize {
                return Err(format!(
                    "function {}: kept proactive idle/soft/busy/starting {kept:?} ({} running), \
                     counted {pro:?}",
                    self.names[fid.0 as usize],
                    e.pro.running.len()
                ));
            }
            match e.evict_key {
                Some(k) if !self.evict_index.contains(&k) || e.idle.is_empty() => {
                    return Err(format!("function {} has a stale eviction key", fid.0));
                }
                None if !e.idle.is_empty() => {
                    return Err(format!(
                        "function {} is idle but not in the eviction index",
                        fid.0
                    ));
                }
                _ => {}
            }
        }
        if self.evict_index.len()
            != self
                .functions
                .values()
                .filter(|e| !e.idle.is_empty())
                .count()
        {
            return Err("the eviction index has entries of no idle function".into());
        }
        for (_, id) in &self.expiry {
            if self
                .slots
                .get(id)
                .is_none_or(|s| s.state != State::Idle || s.pro.is_some())
            {
                return Err(format!("{id} is in the expiry index but not idle"));
            }
        }
        Ok(())
    }

    /// Landlord's remaining credit of `function`'s idle sandboxes (ms of init cost), for tests
    /// and status pages.
    pub fn credit(&self, function: &str) -> Option<f64> {
        let e = self.functions.get(self.ids.get(function)?)?;
        Some(self.policy.credit(&e.facts()))
    }
}

#[cfg(test)]
mod tests;
