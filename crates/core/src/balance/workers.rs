//! The balancer's view of the workers: membership and the (stale) load each last reported.

use crate::time::Micros;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A worker, numbered densely by the balancer in order of first join; a worker that leaves and
/// comes back under the same name keeps its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerId(pub u32);

/// What a worker reports about itself (every status push). The load is the paper's signal: the
/// 1-minute load average normalized by the number of CPUs (1.0 = every CPU busy).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerLoad {
    pub load: f64,
    #[serde(default)]
    pub queue_len: u32,
    #[serde(default)]
    pub running: u32,
    #[serde(default)]
    pub free_mb: u64,
    /// The worker's whole sandbox memory budget (0: not reported). OpenWhisk's balancer
    /// divides it into memory slots.
    #[serde(default)]
    pub memory_mb: u64,
}

impl WorkerLoad {
    /// The load a worker reports: its normalized 1-minute load average plus its queued
    /// invocations per CPU. A worker whose queue holds concurrency at its CPU count never shows a
    /// load average much above 1, however long its queue grows, so bounded-load balancing would
    /// never forward away from it: the queue is the rest of its true load (thesis ch. 5.3).
    pub fn of_worker(
        normalized_load_avg: f64,
        queue_len: u32,
        running: u32,
        cpus: f64,
        free_mb: u64,
    ) -> Self {
        WorkerLoad {
            load: normalized_load_avg + f64::from(queue_len) / cpus.max(1.0),
            queue_len,
            running,
            free_mb,
            memory_mb: 0,
        }
    }
}

#[cfg(test)]
mod load_tests {
    use super::*;

    #[test]
    fn queued_invocations_count_in_the_reported_load() {
        // 8 CPUs busy (load 1.0) and 12 more waiting: 2.5, over CH-RLU's bound of 1.2.
        let l = WorkerLoad::of_worker(1.0, 12, 8, 8.0, 512);
        assert_eq!(
            (l.load, l.queue_len, l.running, l.free_mb),
            (2.5, 12, 8, 512)
        );
        assert_eq!(WorkerLoad::of_worker(0.25, 0, 1, 4.0, 0).load, 0.25);
    }
}

/// One worker's entry.
#[derive(Debug, Clone)]
pub struct WorkerState {
    pub name: String,
    pub up: bool,
    pub report: WorkerLoad,
    /// When the last report (or the join) arrived: membership deadlines count from here.
    pub heard_at: Micros,
    /// Invocations this balancer sent there that have not finished.
    pub in_flight: u32,
    /// Their memory (MiB): OpenWhisk's memory slots in use.
    pub in_flight_mb: u64,
}

/// Every worker ever seen, and which are up.
#[derive(Debug, Default, Clone)]
pub struct Workers {
    all: Vec<WorkerState>,
    by_name: HashMap<String, WorkerId>,
    live: Vec<WorkerId>,
}

impl Workers {
    /// Marks `name` up; returns its id and whether it was down (or new) before.
    pub fn join(&mut self, now: Micros, name: &str) -> (WorkerId, bool) {
        if let Some(&id) = self.by_name.get(name) {
            let w = &mut self.all[id.0 as usize];
            w.heard_at = now;
            if w.up {
                return (id, false);
            }
            w.up = true;
            w.report = WorkerLoad::default();
            self.live.push(id);
            self.live.sort_unstable();
            return (id, true);
        }
        let id = WorkerId(self.all.len() as u32);
        self.all.push(WorkerState {
            name: name.to_string(),
            up: true,
            report: WorkerLoad::default(),
            heard_at: now,
            in_flight: 0,
            in_flight_mb: 0,
        });
        self.by_name.insert(name.to_string(), id);
        self.live.push(id);
        (id, true)
    }

    /// Marks a worker down; false if it was not up.
    pub fn leave(&mut self, id: WorkerId) -> bool {
        match self.all.get_mut(id.0 as usize) {
            Some(w) if w.up => {
                w.up = false;
                self.live.retain(|l| *l != id);
                true
            }
            _ => false,
        }
    }

    pub fn report(&mut self, now: Micros, id: WorkerId, load: WorkerLoad) {
        if let Some(w) = self.all.get_mut(id.0 as usize) {
            w.report = load;
            w.heard_at = now;
        }
    }

    /// Up workers, by id.
    pub fn live(&self) -> &[WorkerId] {
        &self.live
    }

    pub fn get(&self, id: WorkerId) -> Option<&WorkerState> {
        self.all.get(id.0 as usize)
    }

    pub fn id(&self, name: &str) -> Option<WorkerId> {
        self.by_name.get(name).copied()
    }

    pub fn name(&self, id: WorkerId) -> &str {
        self.all.get(id.0 as usize).map_or("", |w| w.name.as_str())
    }

    /// The last reported load (0 before the first report).
    pub fn load(&self, id: WorkerId) -> f64 {
        self.all.get(id.0 as usize).map_or(0.0, |w| w.report.load)
    }

    /// The least-loaded of `among` by reported load; ties go to fewer in-flight invocations,
    /// then to the lower id.
    pub fn least_loaded(&self, among: impl IntoIterator<Item = WorkerId>) -> Option<WorkerId> {
        let mut best: Option<(f64, u32, WorkerId)> = None;
        for id in among {
            let Some(w) = self.all.get(id.0 as usize) else {
                continue;
            };
            let cand = (w.report.load, w.in_flight, id);
            let better = match best {
                None => true,
                Some(b) => cand.0 < b.0 || (cand.0 == b.0 && (cand.1, cand.2) < (b.1, b.2)),
            };
            if better {
                best = Some(cand);
            }
        }
        best.map(|b| b.2)
    }

    /// Up workers not heard from for longer than `max_age`.
    pub fn silent(&self, now: Micros, max_age: Micros) -> Vec<WorkerId> {
        self.live
            .iter()
            .copied()
            .filter(|id| now.saturating_sub(self.all[id.0 as usize].heard_at) > max_age)
            .collect()
    }

    /// Every worker ever seen, up or not: OpenWhisk's invoker list, indexed by id.
    pub fn count(&self) -> usize {
        self.all.len()
    }

    /// Whether `memory_mb` more fits in the worker's memory slots (OpenWhisk's `tryAcquire`):
    /// always while it has not reported its budget.
    pub fn has_slots(&self, id: WorkerId, memory_mb: u64) -> bool {
        self.all.get(id.0 as usize).is_some_and(|w| {
            w.report.memory_mb == 0
                || w.in_flight_mb.saturating_add(memory_mb) <= w.report.memory_mb
        })
    }

    pub(crate) fn dispatched(&mut self, id: WorkerId, memory_mb: u64) {
        if let Some(w) = self.all.get_mut(id.0 as usize) {
            w.in_flight = w.in_flight.saturating_add(1);
            w.in_flight_mb = w.in_flight_mb.saturating_add(memory_mb);
        }
    }

    pub(crate) fn done(&mut self, id: WorkerId, memory_mb: u64) {
        if let Some(w) = self.all.get_mut(id.0 as usize) {
            w.in_flight = w.in_flight.saturating_sub(1);
            w.in_flight_mb = w.in_flight_mb.saturating_sub(memory_mb);
        }
    }
}
