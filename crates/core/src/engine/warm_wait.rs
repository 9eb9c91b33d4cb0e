//! Wait for a warm sandbox or start a cold one (the trade-off of the WoSC'21 seed, §5).
//!
//! An invocation that finds no idle sandbox of its function normally starts a new one. When
//! the function's busy sandboxes are expected to free sooner than a cold start would take
//! under the current load, waiting wins: the invocation is parked for the function, takes the
//! first sandbox of it that frees, and starts a cold one only if none freed within the expected
//! cold-start time (ski rental: waiting never costs more than twice the start). The busy sandboxes serve the waiters in
//! turn: with n of them, the k-th waiter's expected wait is the (k mod n)-th earliest expected
//! end among the function's running invocations (started at `s`, expected to run its warm time,
//! or its cold time if it started cold) plus k div n warm runs; the cold start's cost is
//! the function's measured cold time stretched by the creations already in progress per CPU.
//! A function with no known cold-start cost is started, as before: there is nothing to weigh
//! (a prewarm's start time counts as one). One never seen warm is expected to free at once:
//! at worst a burst of a long function pays one cold start's time per waiter before starting
//! one, at best a burst of a short one starts no sandbox at all.

use super::InvocationId;
use crate::characteristics::Characteristics;
use crate::time::Micros;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// A parked invocation.
#[derive(Debug, Clone)]
pub(super) struct Waiter {
    pub id: InvocationId,
    pub memory_mb: u64,
    pub arrival: Micros,
    pub deadline_us: Option<Micros>,
    /// Dropped rather than started once its deadline has passed.
    pub drop_late: bool,
    /// When it stops waiting and starts a sandbox.
    pub give_up_at: Micros,
}

/// The running invocations of a function (id → expected end) and its waiters.
#[derive(Debug, Default)]
struct PerFunction {
    ends: HashMap<InvocationId, Micros>,
    waiters: VecDeque<Waiter>,
}

/// The wait-or-start bookkeeping of one engine.
#[derive(Debug, Default)]
pub(super) struct WarmWait {
    functions: HashMap<Arc<str>, PerFunction>,
    /// Which function each running invocation belongs to.
    running: HashMap<InvocationId, Arc<str>>,
    /// Running invocations that started cold: the creations in progress, roughly.
    cold_running: std::collections::HashSet<InvocationId>,
    /// Waiters by give-up time.
    deadlines: BTreeSet<(Micros, InvocationId)>,
    /// Waiters served by a sandbox that freed (cold starts avoided).
    pub avoided: u64,
    /// Waiters whose wait ran out (they started a sandbox after all).
    pub gave_up: u64,
}

impl WarmWait {
    /// An invocation of `function` started now (`cold`: on a new sandbox) and is expected to
    /// run `expected_us`.
    pub fn started(
        &mut self,
        function: &Arc<str>,
        id: InvocationId,
        now: Micros,
        expected_us: Micros,
        cold: bool,
    ) {
        if cold {
            self.cold_running.insert(id);
        }
        self.functions
            .entry(function.clone())
            .or_default()
            .ends
            .insert(id, now.saturating_add(expected_us));
        self.running.insert(id, function.clone());
    }

    /// A running invocation ended.
    pub fn ended(&mut self, id: InvocationId) {
        self.cold_running.remove(&id);
        if let Some(f) = self.running.remove(&id) {
            if let Some(p) = self.functions.get_mut(&f) {
                p.ends.remove(&id);
                if p.ends.is_empty() && p.waiters.is_empty() {
                    self.functions.remove(&f);
                }
            }
        }
    }

    /// The give-up time of a new waiter of `function`, if waiting beats a cold start; None to
    /// start one now. The worker has `cpus` CPUs.
    pub fn decide(
        &self,
        now: Micros,
        function: &str,
        chars: Option<&Characteristics>,
        cpus: u32,
    ) -> Option<Micros> {
        let starting = self.cold_running.len();
        let chars = chars.filter(|c| c.has_cold_samples())?;
        let p = self.functions.get(function)?;
        let ahead = p.waiters.len();
        let busy = p.ends.len();
        if busy == 0 {
            return None;
        }
        let mut ends: Vec<Micros> = p.ends.values().copied().collect();
        ends.sort_unstable();
        // The busy sandboxes serve the waiters in turn: the k-th waiter gets the (k mod n)-th
        // to free, after k div n warm runs of the waiters before it on that sandbox.
        let warm = chars.warm_us();
        let rounds = (ahead / busy) as Micros;
        let wait = ends[ahead % busy]
            .saturating_sub(now)
            .saturating_add(rounds.saturating_mul(warm));
        let stretch = 1.0 + starting as f64 / f64::from(cpus.max(1));
        let cold = (chars.cold_us() as f64 * stretch) as Micros;
        // Ski rental: a waiter gives up only once it has waited as long as a cold start would
        // take, so waiting never costs more than twice the start it hoped to avoid, however
        // wrong the estimate of when a sandbox frees (a function's exec time leaves out the
        // platform's turnaround, which a loaded worker stretches).
        (wait.saturating_add(warm) < cold).then(|| now + cold.max(wait + warm).max(1_000))
    }

    pub fn park(&mut self, function: &Arc<str>, w: Waiter) {
        self.deadlines.insert((w.give_up_at, w.id));
        self.functions
            .entry(function.clone())
            .or_default()
            .waiters
            .push_back(w);
    }

    /// Whether `function` has waiters and no running invocation left to free a sandbox for
    /// them (its busy sandboxes failed or were given up).
    pub fn stranded(&self, function: &str) -> bool {
        self.functions
            .get(function)
            .is_some_and(|p| p.ends.is_empty() && !p.waiters.is_empty())
    }

    /// The first waiter of `function`, if any.
    pub fn take(&mut self, function: &str) -> Option<Waiter> {
        let w = self.functions.get_mut(function)?.waiters.pop_front()?;
        self.deadlines.remove(&(w.give_up_at, w.id));
        Some(w)
    }

    /// Waiters whose wait ran out by `now`, with their functions.
    pub fn expired(&mut self, now: Micros) -> Vec<(Arc<str>, Waiter)> {
        let mut out = Vec::new();
        while let Some(&(t, id)) = self.deadlines.first() {
            if t > now {
                break;
            }
            self.deadlines.remove(&(t, id));
            for (f, p) in self.functions.iter_mut() {
                if let Some(i) = p.waiters.iter().position(|w| w.id == id) {
                    if let Some(w) = p.waiters.remove(i) {
                        out.push((f.clone(), w));
                    }
                    break;
                }
            }
        }
        out
    }

    /// Removes a waiter whose caller went away; false if it was not waiting.
    pub fn cancel(&mut self, id: InvocationId) -> bool {
        for p in self.functions.values_mut() {
            if let Some(i) = p.waiters.iter().position(|w| w.id == id) {
                if let Some(w) = p.waiters.remove(i) {
                    self.deadlines.remove(&(w.give_up_at, w.id));
                }
                return true;
            }
        }
        false
    }

    /// Every waiter (shutdown).
    pub fn drain(&mut self) -> Vec<Waiter> {
        self.deadlines.clear();
        self.functions
            .values_mut()
            .flat_map(|p| p.waiters.drain(..))
            .collect()
    }

    pub fn next_deadline(&self) -> Option<Micros> {
        self.deadlines.first().map(|(t, _)| *t)
    }

    /// Invocations waiting for a warm sandbox now.
    pub fn parked(&self) -> usize {
        self.deadlines.len()
    }
}
