//! Generic sandboxes: pre-made sandboxes of no function (namespaces, cgroups, mounts and the
//! runtime's interpreter already started) that a cold start specializes to its function instead
//! of creating a sandbox from nothing (issue 13; OpenWhisk's stem cells, SOCK's zygotes).
//!
//! Only the bookkeeping lives here: how many are ready or being made, how many the recent past
//! needed, and which one a cold start takes. Their memory counts in the pool's budget
//! ([`super::SandboxPool`]); a refill uses free memory only and never evicts. A specialized
//! sandbox belongs to its function for life and never comes back here.

use super::types::SandboxId;
use crate::time::Micros;
use serde::{Deserialize, Serialize};
use std::collections::{HashSet, VecDeque};

/// How the generic pool is sized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenericConfig {
    /// The most generic sandboxes kept ready or being made; 0 turns the pool off.
    pub max: u32,
    /// Kept ready even when no cold start happened lately (at most `max`).
    pub min: u32,
    /// Memory one generic sandbox reserves until it is specialized.
    pub memory_mb: u64,
    /// The pool holds as many as there were cold starts in this recent window (between `min`
    /// and `max`).
    pub window_us: Micros,
}

impl GenericConfig {
    /// No generic sandboxes: every cold start creates its sandbox from nothing.
    pub const OFF: GenericConfig = GenericConfig {
        max: 0,
        min: 0,
        memory_mb: 0,
        window_us: 0,
    };

    pub fn enabled(&self) -> bool {
        self.max > 0
    }
}

impl Default for GenericConfig {
    fn default() -> Self {
        GenericConfig::OFF
    }
}

/// Counts for status pages and metrics (also `GET /v1/status`'s `generic_pool`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenericStats {
    pub ready: u32,
    pub creating: u32,
    /// How many the pool aims to hold now.
    pub target: u32,
    /// Cold starts that specialized a generic sandbox …
    pub taken: u64,
    /// … and cold starts that found none ready (they created their sandbox from nothing).
    pub missed: u64,
    /// Generic sandboxes that failed to start.
    pub failed: u64,
}

#[derive(Debug)]
pub(super) struct GenericPool {
    pub config: GenericConfig,
    /// Ready to be specialized, oldest first (the oldest goes first when the pool shrinks).
    ready: VecDeque<SandboxId>,
    creating: HashSet<SandboxId>,
    /// Times of the latest cold starts, oldest first; at most `max` are kept, which is all the
    /// sizing needs.
    recent: VecDeque<Micros>,
    taken: u64,
    missed: u64,
    failed: u64,
    /// After a failed start, no refill before this time (a broken runtime must not make the
    /// pool retry in a loop); 0 when no refill is held back.
    retry_at: Micros,
}

/// How long the pool waits to refill after a generic sandbox failed to start.
pub const RETRY_AFTER_FAILURE_US: Micros = 1_000_000;

impl GenericPool {
    pub fn new(config: GenericConfig) -> Self {
        GenericPool {
            config,
            ready: VecDeque::new(),
            creating: HashSet::new(),
            recent: VecDeque::new(),
            taken: 0,
            missed: 0,
            failed: 0,
            retry_at: 0,
        }
    }

    /// Generic sandboxes holding memory (ready or being made).
    pub fn held(&self) -> u64 {
        (self.ready.len() + self.creating.len()) as u64
    }

    /// How many the pool should hold at `now`.
    pub fn target(&self, now: Micros) -> u32 {
        let since = now.saturating_sub(self.config.window_us);
        let recent = self.recent.iter().filter(|t| **t >= since).count() as u32;
        recent.max(self.config.min).min(self.config.max)
    }

    /// Whether the pool is below its floor with nothing holding a refill back: the driver
    /// should call the pool's timer now.
    pub fn wants_refill(&self) -> bool {
        self.retry_at == 0 && self.held() < self.config.min.min(self.config.max) as u64
    }

    /// Holds refills back for a while (a failed start, or no free memory).
    pub fn back_off(&mut self, now: Micros) {
        self.retry_at = now.saturating_add(RETRY_AFTER_FAILURE_US);
    }

    /// A cold start happens now: counts it and hands out the oldest ready sandbox, if any.
    pub fn take(&mut self, now: Micros) -> Option<SandboxId> {
        if !self.config.enabled() {
            return None;
        }
        self.recent.push_back(now);
        while self.recent.len() > self.config.max as usize {
            self.recent.pop_front();
        }
        let got = self.ready.pop_front();
        if got.is_some() {
            self.taken += 1;
        } else {
            self.missed += 1;
        }
        got
    }

    /// A cold start could not go ahead after all (no memory): its sandbox is ready again.
    pub fn put_back(&mut self, id: SandboxId) {
        self.taken = self.taken.saturating_sub(1);
        self.ready.push_front(id);
    }

    /// How many more to make now to reach the target.
    pub fn deficit(&mut self, now: Micros) -> u32 {
        if now < self.retry_at {
            return 0;
        }
        self.retry_at = 0;
        (self.target(now) as u64).saturating_sub(self.held()) as u32
    }

    /// Forgets cold starts that left the window.
    pub fn prune(&mut self, now: Micros) {
        let since = now.saturating_sub(self.config.window_us);
        while self.recent.front().is_some_and(|t| *t < since) {
            self.recent.pop_front();
        }
    }

    pub fn creating(&mut self, id: SandboxId) {
        self.creating.insert(id);
    }

    /// A generic sandbox finished starting; false if the pool did not expect it.
    pub fn on_ready(&mut self, id: SandboxId) -> bool {
        if self.creating.remove(&id) {
            self.ready.push_back(id);
            true
        } else {
            false
        }
    }

    /// A generic sandbox failed to start; false if the pool did not expect it.
    pub fn on_failed(&mut self, now: Micros, id: SandboxId) -> bool {
        let known = self.creating.remove(&id);
        if known {
            self.failed += 1;
            self.back_off(now);
        }
        known
    }

    /// One ready sandbox beyond the target at `now`, to destroy (the oldest).
    pub fn surplus(&mut self, now: Micros) -> Option<SandboxId> {
        if self.held() > self.target(now) as u64 {
            self.ready.pop_front()
        } else {
            None
        }
    }

    /// Every ready sandbox, to destroy at shutdown; ones still being made are destroyed by
    /// [`Self::on_ready`]'s caller when they arrive.
    pub fn drain(&mut self) -> Vec<SandboxId> {
        self.config.max = 0;
        self.config.min = 0;
        self.ready.drain(..).collect()
    }

    /// When the pool next has work: the oldest counted cold start leaves the window (the
    /// target may shrink), or a refill held back after a failure may go ahead.
    pub fn next_change(&self) -> Option<Micros> {
        let shrink = (self.held() > self.config.min as u64)
            .then(|| self.recent.front())
            .flatten()
            .map(|t| t.saturating_add(self.config.window_us).saturating_add(1));
        let retry = (self.retry_at > 0).then_some(self.retry_at);
        match (shrink, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Counts, with the target the caller last computed.
    pub fn stats(&self, target: u32) -> GenericStats {
        GenericStats {
            ready: self.ready.len() as u32,
            creating: self.creating.len() as u32,
            target,
            taken: self.taken,
            missed: self.missed,
            failed: self.failed,
        }
    }

    pub fn ready_count(&self) -> u64 {
        self.ready.len() as u64
    }

    pub fn creating_count(&self) -> u64 {
        self.creating.len() as u64
    }

    /// A ready sandbox to destroy for memory (the oldest), not counted as taken.
    pub fn pop_ready(&mut self) -> Option<SandboxId> {
        self.ready.pop_front()
    }

    /// Whether `id` is a generic sandbox ready or being made.
    pub fn holds(&self, id: SandboxId) -> bool {
        self.creating.contains(&id) || self.ready.contains(&id)
    }
}
