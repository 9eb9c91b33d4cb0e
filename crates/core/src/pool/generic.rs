//! Generic sandboxes: pre-made sandboxes of no function (namespaces, cgroups, mounts and the
//! runtime's interpreter already started) that a cold start specializes to its function instead
//! of creating a sandbox from nothing (issue 13; OpenWhisk's stem cells, SOCK's zygotes).
//!
//! Only the bookkeeping lives here: how many are ready or being made, how many the recent past
//! needed, and which one a cold start takes. Their memory counts in the pool's budget
//! ([`super::SandboxPool`]); a refill uses free memory only and never evicts. A specialized
//! sandbox belongs to its function for life and never comes back here.
//!
//! The pool is a set of pools keyed by [`GenericKey`] (runtime, dependency layer): a sandbox
//! of a key with a layer has the layer mounted and its modules imported before it is ready
//! (issue 32: the import leaves the cold path), so a cold start takes one of its own key only.
//! Each key is sized from its own recent cold starts; all keys together hold at most `max`.
//! Only the default key (default runtime, no layer) keeps `min` ready without demand, and
//! those `min` places are its own (the other keys share `max − min`); a key with no cold
//! start in the window drains and is forgotten.

use super::types::SandboxId;
use crate::time::Micros;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

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
    /// Keys with a pool now (the default one and those with recent cold starts).
    #[serde(default)]
    pub keys: u32,
}

/// What a generic sandbox is made for: a runtime and a dependency layer, by digest. `None`
/// runtime is the worker's default one; `None` layer is a bare interpreter. A cold start takes
/// a generic sandbox of its function's key only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GenericKey {
    pub runtime: Option<Arc<str>>,
    pub layer: Option<Arc<str>>,
}

impl GenericKey {
    pub fn new(runtime: Option<&str>, layer: Option<&str>) -> Self {
        GenericKey {
            runtime: runtime.map(Arc::from),
            layer: layer.map(Arc::from),
        }
    }

    /// The default runtime with no layer: the key that keeps `min` ready.
    pub fn is_default(&self) -> bool {
        self.runtime.is_none() && self.layer.is_none()
    }

    /// Whether this is the key of (`runtime`, `layer`), without building one.
    pub fn is(&self, runtime: Option<&str>, layer: Option<&str>) -> bool {
        self.runtime.as_deref() == runtime && self.layer.as_deref() == layer
    }
}

/// One key's pool.
#[derive(Debug, Default)]
struct KeyPool {
    /// Memory one sandbox of this key reserves: `memory_mb` of the config, or for a key with a
    /// layer the most memory any function of the key asked for (its imports live in the
    /// sandbox before a function does; the function's own limit bounds them honestly).
    memory_mb: u64,
    /// Ready to be specialized, oldest first (the oldest goes first when the pool shrinks).
    ready: VecDeque<SandboxId>,
    creating: HashSet<SandboxId>,
    /// Times of the latest cold starts of this key, oldest first; at most `max` are kept,
    /// which is all the sizing needs.
    recent: VecDeque<Micros>,
    /// After a failed start or a refill short of memory, no refill before this time; 0 when
    /// none is held back.
    retry_at: Micros,
}

impl KeyPool {
    fn held(&self) -> u64 {
        (self.ready.len() + self.creating.len()) as u64
    }

    fn recent_since(&self, since: Micros) -> u32 {
        self.recent.iter().filter(|t| **t >= since).count() as u32
    }
}

#[derive(Debug)]
pub(super) struct GenericPool {
    pub config: GenericConfig,
    pools: BTreeMap<GenericKey, KeyPool>,
    /// Every generic sandbox ready or being made: its key and the memory it reserves (a
    /// key's figure may grow while it is held; the sandbox keeps what it reserved).
    held: HashMap<SandboxId, (GenericKey, u64)>,
    ready_mb: u64,
    creating_mb: u64,
    taken: u64,
    missed: u64,
    failed: u64,
}

/// How long a key waits to refill after a generic sandbox failed to start (or memory was
/// short).
pub const RETRY_AFTER_FAILURE_US: Micros = 1_000_000;

impl GenericPool {
    pub fn new(config: GenericConfig) -> Self {
        GenericPool {
            config,
            pools: BTreeMap::new(),
            held: HashMap::new(),
            ready_mb: 0,
            creating_mb: 0,
            taken: 0,
            missed: 0,
            failed: 0,
        }
    }

    /// Generic sandboxes holding memory (ready or being made), all keys.
    pub fn held(&self) -> u64 {
        self.held.len() as u64
    }

    /// Memory of every generic sandbox ready or being made.
    pub fn held_mb(&self) -> u64 {
        self.ready_mb + self.creating_mb
    }

    pub fn ready_mb(&self) -> u64 {
        self.ready_mb
    }

    pub fn creating_mb(&self) -> u64 {
        self.creating_mb
    }

    /// A key's floor: `min` for the default key, none for the others.
    fn floor(&self, key: &GenericKey) -> u32 {
        if key.is_default() {
            self.config.min.min(self.config.max)
        } else {
            0
        }
    }

    /// A key's share: as many as its cold starts in the window (at least its floor), but
    /// leaving a place for every other key that had a cold start in the window too: one busy
    /// key (the default one, say, under many plain functions) must not hold every place while
    /// a layer's functions start fresh for want of a single pre-imported sandbox.
    fn key_target(&self, key: &GenericKey, kp: &KeyPool, now: Micros) -> u32 {
        let since = now.saturating_sub(self.config.window_us);
        let recent = kp.recent_since(since);
        let others_active = self
            .pools
            .iter()
            .filter(|(k, p)| *k != key && p.recent_since(since) > 0)
            .count() as u32;
        let share = self.config.max.saturating_sub(others_active).max(1);
        recent.min(share).max(self.floor(key)).min(self.config.max)
    }

    /// How many all keys together should hold at `now` (at most `max`).
    pub fn target(&self, now: Micros) -> u32 {
        let sum: u32 = self
            .pools
            .iter()
            .map(|(k, kp)| self.key_target(k, kp, now))
            .fold(0u32, u32::saturating_add);
        // The default key's floor holds even before it has a pool.
        let floor = if self.pools.contains_key(&GenericKey::default()) {
            0
        } else {
            self.floor(&GenericKey::default())
        };
        sum.saturating_add(floor).min(self.config.max)
    }

    /// Whether the default key is below its floor with nothing holding a refill back: the
    /// driver should call the pool's timer now.
    pub fn wants_refill(&self) -> bool {
        let key = GenericKey::default();
        let floor = self.floor(&key) as u64;
        match self.pools.get(&key) {
            Some(kp) => kp.retry_at == 0 && kp.held() < floor,
            None => floor > 0,
        }
    }

    /// Holds `key`'s refills back for a while (a failed start, or no free memory).
    pub fn back_off(&mut self, key: &GenericKey, now: Micros) {
        if let Some(kp) = self.pools.get_mut(key) {
            kp.retry_at = now.saturating_add(RETRY_AFTER_FAILURE_US);
        }
    }

    /// A cold start of a function of `key` needing `memory_mb` happens now: counts it (the
    /// key's sandboxes reserve at least that from now on, when it has a layer) and hands out
    /// the oldest ready sandbox of that key, if any, with the memory it reserved.
    pub fn take(
        &mut self,
        now: Micros,
        key: &GenericKey,
        memory_mb: u64,
    ) -> Option<(SandboxId, u64)> {
        if !self.config.enabled() {
            return None;
        }
        let max = self.config.max as usize;
        let base = self.config.memory_mb;
        let kp = match self.pools.get_mut(key) {
            Some(kp) => kp,
            None => self.pools.entry(key.clone()).or_insert_with(|| KeyPool {
                memory_mb: base,
                ..KeyPool::default()
            }),
        };
        if key.layer.is_some() {
            kp.memory_mb = kp.memory_mb.max(memory_mb);
        }
        kp.recent.push_back(now);
        while kp.recent.len() > max {
            kp.recent.pop_front();
        }
        let got = kp.ready.pop_front();
        match got {
            Some(id) => {
                self.taken += 1;
                let mb = self.held.remove(&id).map_or(0, |(_, mb)| mb);
                self.ready_mb -= mb;
                Some((id, mb))
            }
            None => {
                self.missed += 1;
                None
            }
        }
    }

    /// A cold start could not go ahead after all (no memory): its sandbox is ready again.
    pub fn put_back(&mut self, key: &GenericKey, id: SandboxId, memory_mb: u64) {
        self.taken = self.taken.saturating_sub(1);
        let kp = self.pools.entry(key.clone()).or_default();
        kp.ready.push_front(id);
        self.held.insert(id, (key.clone(), memory_mb));
        self.ready_mb += memory_mb;
    }

    /// The next sandbox to make to bring a key to its target, with the memory it reserves:
    /// the default key first (its floor), then the keys whose latest cold start is the most
    /// recent. `None` when every key is at its target, held back, or `max` is reached.
    pub fn next_deficit(&mut self, now: Micros) -> Option<(GenericKey, u64)> {
        if self.held() >= self.config.max as u64 {
            return None;
        }
        let default = GenericKey::default();
        if self.floor(&default) > 0 {
            let base = self.config.memory_mb;
            self.pools.entry(default).or_insert_with(|| KeyPool {
                memory_mb: base,
                ..KeyPool::default()
            });
        }
        // The default key's floor is kept free for it: the other keys share the rest.
        let others_max = u64::from(self.config.max.saturating_sub(self.config.min));
        let others_held: u64 = self
            .pools
            .iter()
            .filter(|(k, _)| !k.is_default())
            .map(|(_, kp)| kp.held())
            .sum();
        let mut best: Option<(bool, Micros, &GenericKey)> = None;
        for (key, kp) in &self.pools {
            if now < kp.retry_at
                || kp.held() >= self.key_target(key, kp, now) as u64
                || (!key.is_default() && others_held >= others_max)
            {
                continue;
            }
            let rank = (
                key.is_default(),
                kp.recent.back().copied().unwrap_or(0),
                key,
            );
            if best.as_ref().is_none_or(|b| (rank.0, rank.1) > (b.0, b.1)) {
                best = Some(rank);
            }
        }
        let key = best?.2.clone();
        let memory_mb = self.pools.get(&key)?.memory_mb;
        Some((key, memory_mb))
    }

    /// Forgets cold starts that left the window, and keys with nothing left (a key that
    /// stays is held back, or the default one).
    pub fn prune(&mut self, now: Micros) {
        let since = now.saturating_sub(self.config.window_us);
        self.pools.retain(|key, kp| {
            while kp.recent.front().is_some_and(|t| *t < since) {
                kp.recent.pop_front();
            }
            if kp.retry_at <= now {
                kp.retry_at = 0;
            }
            kp.held() > 0 || !kp.recent.is_empty() || kp.retry_at > now || key.is_default()
        });
    }

    pub fn creating(&mut self, key: &GenericKey, id: SandboxId, memory_mb: u64) {
        self.pools
            .entry(key.clone())
            .or_default()
            .creating
            .insert(id);
        self.held.insert(id, (key.clone(), memory_mb));
        self.creating_mb += memory_mb;
    }

    /// A generic sandbox finished starting; false if the pool did not expect it.
    pub fn on_ready(&mut self, id: SandboxId) -> bool {
        let Some((key, mb)) = self.held.get(&id).cloned() else {
            return false;
        };
        let Some(kp) = self.pools.get_mut(&key) else {
            return false;
        };
        if !kp.creating.remove(&id) {
            return false;
        }
        kp.ready.push_back(id);
        self.creating_mb -= mb;
        self.ready_mb += mb;
        true
    }

    /// A generic sandbox failed to start: the memory it reserved, `None` if the pool did not
    /// expect it. Its key waits before it tries again.
    pub fn on_failed(&mut self, now: Micros, id: SandboxId) -> Option<u64> {
        let (key, mb) = self.held.get(&id).cloned()?;
        let kp = self.pools.get_mut(&key)?;
        if !kp.creating.remove(&id) {
            return None;
        }
        self.held.remove(&id);
        self.creating_mb -= mb;
        self.failed += 1;
        kp.retry_at = now.saturating_add(RETRY_AFTER_FAILURE_US);
        Some(mb)
    }

    /// Ready sandboxes beyond their key's target at `now`, to destroy (the oldest of each
    /// key), with the memory each reserved.
    pub fn surplus(&mut self, now: Micros) -> Vec<(SandboxId, u64)> {
        let targets: Vec<(GenericKey, u64)> = self
            .pools
            .iter()
            .map(|(k, kp)| (k.clone(), self.key_target(k, kp, now) as u64))
            .collect();
        let mut out = Vec::new();
        for (key, target) in targets {
            let Some(kp) = self.pools.get_mut(&key) else {
                continue;
            };
            while kp.held() > target {
                let Some(id) = kp.ready.pop_front() else {
                    break;
                };
                out.push(id);
            }
        }
        out.into_iter()
            .map(|id| (id, self.forget_ready(id)))
            .collect()
    }

    /// Drops a ready sandbox (already out of its key's queue) from the accounting.
    fn forget_ready(&mut self, id: SandboxId) -> u64 {
        let mb = self.held.remove(&id).map_or(0, |(_, mb)| mb);
        self.ready_mb -= mb;
        mb
    }

    /// Every ready sandbox, to destroy at shutdown; ones still being made are destroyed by
    /// [`Self::on_ready`]'s caller when they arrive.
    pub fn drain(&mut self) -> Vec<(SandboxId, u64)> {
        self.config.max = 0;
        self.config.min = 0;
        let ids: Vec<SandboxId> = self
            .pools
            .values_mut()
            .flat_map(|kp| kp.ready.drain(..).collect::<Vec<_>>())
            .collect();
        ids.into_iter()
            .map(|id| (id, self.forget_ready(id)))
            .collect()
    }

    /// When the pool next has work: a key's oldest counted cold start leaves the window (its
    /// target may shrink), or a refill held back may go ahead.
    pub fn next_change(&self) -> Option<Micros> {
        self.pools
            .iter()
            .flat_map(|(key, kp)| {
                let shrink = (kp.held() > self.floor(key) as u64)
                    .then(|| kp.recent.front())
                    .flatten()
                    .map(|t| t.saturating_add(self.config.window_us).saturating_add(1));
                let retry = (kp.retry_at > 0).then_some(kp.retry_at);
                [shrink, retry]
            })
            .flatten()
            .min()
    }

    /// Counts, with the target the caller last computed.
    pub fn stats(&self, target: u32) -> GenericStats {
        GenericStats {
            ready: self.pools.values().map(|kp| kp.ready.len() as u32).sum(),
            creating: self.pools.values().map(|kp| kp.creating.len() as u32).sum(),
            target,
            taken: self.taken,
            missed: self.missed,
            failed: self.failed,
            keys: self.pools.len() as u32,
        }
    }

    pub fn ready_count(&self) -> u64 {
        self.pools.values().map(|kp| kp.ready.len() as u64).sum()
    }

    pub fn creating_count(&self) -> u64 {
        self.pools.values().map(|kp| kp.creating.len() as u64).sum()
    }

    /// A ready sandbox to destroy for memory, not counted as taken: the oldest of the key
    /// with the most ready (a popular key keeps one the longest), with its memory.
    pub fn pop_ready(&mut self) -> Option<(SandboxId, u64)> {
        let kp = self
            .pools
            .values_mut()
            .filter(|kp| !kp.ready.is_empty())
            .max_by_key(|kp| kp.ready.len())?;
        let id = kp.ready.pop_front()?;
        Some((id, self.forget_ready(id)))
    }

    /// Whether `id` is a generic sandbox ready or being made.
    pub fn holds(&self, id: SandboxId) -> bool {
        self.held.contains_key(&id)
    }

    /// The key of a generic sandbox ready or being made.
    pub fn key_of(&self, id: SandboxId) -> Option<&GenericKey> {
        self.held.get(&id).map(|(k, _)| k)
    }

    /// Sums kept against the sandboxes held, for invariant checks.
    pub fn check(&self) -> Result<(), String> {
        let (mut ready, mut creating) = (0u64, 0u64);
        for (key, kp) in &self.pools {
            for id in kp.ready.iter().chain(kp.creating.iter()) {
                match self.held.get(id) {
                    Some((k, mb)) if k == key => {
                        if kp.ready.contains(id) {
                            ready += mb;
                        } else {
                            creating += mb;
                        }
                    }
                    _ => return Err(format!("generic {id} held under the wrong key")),
                }
            }
        }
        if self.held.len() as u64 != self.ready_count() + self.creating_count() {
            return Err("generic sandboxes held but in no key's pool".into());
        }
        if (ready, creating) != (self.ready_mb, self.creating_mb) {
            return Err(format!(
                "generic memory: ready {ready} creating {creating}, kept {} and {}",
                self.ready_mb, self.creating_mb
            ));
        }
        if self.held() > u64::from(self.config.max) && self.config.max > 0 {
            return Err(format!(
                "{} generic sandboxes over max {}",
                self.held(),
                self.config.max
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod share_tests {
    use super::*;

    /// Many cold starts of plain functions must not keep a layer's functions from their one
    /// pre-imported sandbox: each key active in the window keeps a place.
    #[test]
    fn a_busy_key_leaves_a_place_for_every_other_active_key() {
        let mut p = GenericPool::new(GenericConfig {
            max: 4,
            min: 1,
            memory_mb: 64,
            window_us: 60_000_000,
        });
        let plain = GenericKey::default();
        let layer = GenericKey::new(None, Some("sha256:ab"));
        for t in 0..10 {
            p.take(t, &plain, 128);
        }
        assert_eq!(p.target(20), 4);
        p.take(30, &layer, 256);
        let since = |k: &GenericKey| p.key_target(k, &p.pools[k], 40);
        assert_eq!((since(&plain), since(&layer)), (3, 1));
        assert_eq!(p.target(40), 4);
        // The layer's sandbox is the next one made, at the layer's memory.
        for i in 0..3 {
            let (k, mb) = p.next_deficit(40).unwrap();
            assert!(k.is_default());
            p.creating(&k, SandboxId(i), mb);
        }
        let (k, mb) = p.next_deficit(40).unwrap();
        assert_eq!((k, mb), (layer, 256));
    }
}
