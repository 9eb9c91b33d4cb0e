//! Proactive sandboxes (Atoll, SoCC'21 §4.3): set up ahead of demand by the controller's
//! allocator ([`crate::proactive::allocator`]) and held in a bounded proactive memory pool.
//!
//! Memory: the pool's `proactive_mb` is reserved within the budget. Proactive sandboxes (in any
//! state) use at most that much, reactive and generic sandboxes at most the rest, so neither
//! side ever evicts the other: the controller's plan is not undone by a burst of cold starts,
//! and a proactive creation never costs a reactive function its warm sandbox. Proactive
//! sandboxes never expire by keep-alive and are never picked by reactive eviction; they are
//! soft-evicted (kept, not scheduled), un-marked, or hard-evicted (destroyed) by the controller
//! only, and destroyed like the others on retirement and shutdown.

use super::function::{FnId, ProMark, Slot, State};
use super::types::{DestroyReason, PoolAction, ProactiveError, ProactiveEvicted, SandboxId};
use super::SandboxPool;
use crate::time::Micros;

impl SandboxPool {
    /// The proactive pool's size (the configured size, at most the budget).
    pub fn proactive_pool_mb(&self) -> u64 {
        self.proactive_mb
    }

    /// Memory of proactive sandboxes in every state.
    pub fn proactive_used_mb(&self) -> u64 {
        self.used_proactive_mb
    }

    /// Room left in the proactive pool.
    pub fn proactive_free_mb(&self) -> u64 {
        self.proactive_mb.saturating_sub(self.used_proactive_mb)
    }

    /// The part of the budget reactive and generic sandboxes may use.
    pub fn reactive_budget_mb(&self) -> u64 {
        self.config
            .memory_budget_mb
            .saturating_sub(self.proactive_mb)
    }

    /// Starts a proactive sandbox of `function` in the proactive pool's free room (it never
    /// evicts anything). The driver starts it and reports [`Self::on_sandbox_ready`] or
    /// [`Self::on_start_failed`], exactly as for [`Self::prewarm`].
    pub fn proactive_create(
        &mut self,
        now: Micros,
        function: &str,
        memory_mb: u64,
    ) -> Result<SandboxId, ProactiveError> {
        if self.proactive_mb == 0 {
            return Err(ProactiveError::Disabled);
        }
        let free_mb = self.proactive_free_mb();
        if free_mb < memory_mb {
            return Err(ProactiveError::PoolFull {
                needed_mb: memory_mb,
                free_mb,
            });
        }
        let fid = self.intern(function);
        let id = SandboxId(self.next_id);
        self.next_id += 1;
        let clock = self.policy.clock();
        let e = self.entry(fid, memory_mb);
        e.pro.starting += 1;
        e.pro.running.insert(id);
        self.slots.insert(
            id,
            Slot {
                function: fid,
                memory_mb,
                state: State::Starting,
                last_used: now,
                clock,
                deadline: None,
                doomed: false,
                pro: Some(ProMark::default()),
            },
        );
        self.used_proactive_mb += memory_mb;
        Ok(id)
    }

    /// Stops scheduling on one proactive sandbox of `function` (kept warm, at no cost to undo):
    /// the least recently used idle one, else a starting or busy one, which becomes soft when
    /// it is ready or its run ends. `None` when there is none to mark.
    pub fn proactive_soft_evict(&mut self, function: &str) -> Option<SandboxId> {
        self.set_soft(function, true)
    }

    /// Makes one soft-evicted sandbox of `function` usable again (the most recently marked),
    /// or cancels a pending soft mark. `None` when there is none.
    pub fn proactive_unmark(&mut self, function: &str) -> Option<SandboxId> {
        self.set_soft(function, false)
    }

    /// Moves one sandbox of `function` between the idle and soft lists (`soft`: idle → soft,
    /// the least recently used; else soft → idle, the most recently marked), or, with none
    /// there, marks a starting or busy one to move when it is ready or its run ends.
    fn set_soft(&mut self, function: &str, soft: bool) -> Option<SandboxId> {
        let fid = *self.ids.get(function)?;
        let e = self.functions.get_mut(&fid)?;
        let moved = if soft {
            e.pro.idle.pop_front()
        } else {
            e.pro.soft.pop_back()
        };
        if let Some(id) = moved {
            if soft {
                e.pro.soft.push_back(id);
            } else {
                e.pro.idle.push_back(id);
            }
            self.mark(id, |m| m.soft = soft);
            return Some(id);
        }
        let slots = &self.slots;
        let id = e.pro.running.iter().copied().find(|id| {
            slots
                .get(id)
                .and_then(|s| s.pro)
                .is_some_and(|m| m.soft != soft && !m.kill)
        })?;
        self.mark(id, |m| m.soft = soft);
        Some(id)
    }

    /// Destroys one proactive sandbox of `function`: a soft one first, then the least recently
    /// used idle one (its Destroy action is out now), else marks a starting or busy one to be
    /// destroyed when done. `None` when the function has none left to evict.
    pub fn proactive_evict(&mut self, now: Micros, function: &str) -> Option<ProactiveEvicted> {
        let fid = *self.ids.get(function)?;
        let e = self.functions.get_mut(&fid)?;
        if let Some(id) = e.pro.soft.pop_front().or_else(|| e.pro.idle.pop_front()) {
            e.last_gone = Some((DestroyReason::Evicted, now));
            if let Some(slot) = self.slots.remove(&id) {
                self.used_proactive_mb -= slot.memory_mb;
            }
            self.after_removal(fid);
            self.actions.push_back(PoolAction::Destroy {
                sandbox: id,
                reason: DestroyReason::Evicted,
            });
            return Some(ProactiveEvicted::Now(id));
        }
        let slots = &self.slots;
        let id = e
            .pro
            .running
            .iter()
            .copied()
            .find(|id| slots.get(id).and_then(|s| s.pro).is_some_and(|m| !m.kill))?;
        self.mark(id, |m| m.kill = true);
        Some(ProactiveEvicted::WhenDone(id))
    }

    fn mark(&mut self, id: SandboxId, f: impl FnOnce(&mut ProMark)) {
        if let Some(m) = self.slots.get_mut(&id).and_then(|s| s.pro.as_mut()) {
            f(m);
        }
    }

    /// Hands out the most recently used idle proactive sandbox of `fid`, if any (the hot path
    /// of [`Self::acquire`]: O(log n)).
    pub(super) fn acquire_proactive(&mut self, now: Micros, fid: FnId) -> Option<SandboxId> {
        let clock = self.policy.clock();
        let e = self.functions.get_mut(&fid)?;
        let id = e.pro.idle.pop_back()?;
        e.pro.busy += 1;
        e.pro.running.insert(id);
        e.freq += 1;
        e.last_clock = clock;
        if let Some(slot) = self.slots.get_mut(&id) {
            slot.state = State::Busy;
            slot.last_used = now;
            slot.clock = clock;
        }
        Some(id)
    }

    /// A proactive sandbox became idle (ready, or its run ended): back to the proactive idle
    /// set, or the soft set, or destroyed when marked so or retired. The slot is out of
    /// `self.slots` and was starting or busy.
    pub(super) fn proactive_to_idle(&mut self, now: Micros, id: SandboxId, mut slot: Slot) {
        let was = slot.state;
        let mark = slot.pro.unwrap_or_default();
        let fid = slot.function;
        if !slot.doomed {
            self.stop_running(fid, id, was);
        }
        if slot.doomed || mark.kill {
            self.used_proactive_mb -= slot.memory_mb;
            let reason = if slot.doomed {
                DestroyReason::Retired
            } else {
                if let Some(e) = self.functions.get_mut(&fid) {
                    e.last_gone = Some((DestroyReason::Evicted, now));
                }
                self.after_removal(fid);
                DestroyReason::Evicted
            };
            self.actions.push_back(PoolAction::Destroy {
                sandbox: id,
                reason,
            });
            return;
        }
        slot.state = State::Idle;
        slot.last_used = now;
        slot.clock = self.policy.clock();
        self.slots.insert(id, slot);
        if let Some(e) = self.functions.get_mut(&fid) {
            if mark.soft {
                e.pro.soft.push_back(id);
            } else {
                e.pro.idle.push_back(id);
            }
        }
    }

    /// A proactive sandbox failed to start, or its run failed: its memory is released. The
    /// slot is out of `self.slots`; `destroy` says whether the driver needs a Destroy action.
    pub(super) fn proactive_gone(&mut self, id: SandboxId, slot: &Slot, destroy: bool) {
        self.used_proactive_mb -= slot.memory_mb;
        if !slot.doomed {
            self.stop_running(slot.function, id, slot.state);
            self.after_removal(slot.function);
        }
        if destroy {
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

    /// `id`, a proactive sandbox of `fid` that was starting or busy (`was`), is no longer.
    fn stop_running(&mut self, fid: FnId, id: SandboxId, was: State) {
        if let Some(e) = self.functions.get_mut(&fid) {
            e.pro.running.remove(&id);
            match was {
                State::Starting => e.pro.starting -= 1,
                State::Busy => e.pro.busy -= 1,
                State::Idle => {}
            }
        }
    }

    /// Whether `id` is a proactive sandbox that is soft-evicted (idle in the soft set, or
    /// marked to become soft); `None` for an unknown or reactive sandbox. For tests and
    /// property checks.
    #[doc(hidden)]
    pub fn is_soft(&self, id: SandboxId) -> Option<bool> {
        self.slots.get(&id)?.pro.map(|m| m.soft)
    }

    /// Whether `id` is a proactive sandbox (`None` when unknown). For tests and property checks.
    #[doc(hidden)]
    pub fn is_proactive(&self, id: SandboxId) -> Option<bool> {
        self.slots.get(&id).map(|s| s.pro.is_some())
    }
}
