//! The eviction index: one entry per function with idle sandboxes, ordered by the policy's
//! priority of its least recently used idle sandbox, so choosing a victim is O(log functions).

use super::function::FnId;
use crate::time::Micros;
use std::cmp::Ordering;

/// A total order on priorities (they are finite and non-negative).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Prio(pub f64);

impl Eq for Prio {}
impl PartialOrd for Prio {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Prio {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A function in the eviction index: its priority, then the age of its LRU idle sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct EvictKey {
    pub prio: Prio,
    pub last_used: Micros,
    pub function: FnId,
}
