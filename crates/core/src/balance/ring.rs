//! A consistent-hashing ring with virtual nodes (CH-RLU paper §2.3).
//!
//! Each worker owns `vnodes` points, placed by hashing its name, so the ring is the same in every
//! run. A function's home is the first point clockwise from its key; forwarding walks on to the
//! next *distinct* worker. Removing a worker removes only its points: only the functions that
//! lived on it move.

use super::hash::{hash64, mix64};
use super::workers::WorkerId;

#[derive(Debug, Clone)]
pub struct Ring {
    /// (position, worker), sorted by position.
    points: Vec<(u64, WorkerId)>,
    vnodes: u32,
    members: usize,
}

impl Ring {
    pub fn new(vnodes: u32) -> Self {
        Ring {
            points: Vec::new(),
            vnodes: vnodes.max(1),
            members: 0,
        }
    }

    /// Distinct workers on the ring.
    pub fn len(&self) -> usize {
        self.members
    }

    pub fn is_empty(&self) -> bool {
        self.members == 0
    }

    pub fn contains(&self, worker: WorkerId) -> bool {
        self.points.iter().any(|p| p.1 == worker)
    }

    /// Adds a worker's virtual nodes (no-op if present).
    pub fn insert(&mut self, worker: WorkerId, name: &str) {
        if self.contains(worker) {
            return;
        }
        self.push_points(worker, name);
        self.points.sort_unstable();
        self.members += 1;
    }

    /// Replaces the members at once (one sort instead of one per worker).
    pub fn rebuild<'a>(&mut self, members: impl IntoIterator<Item = (WorkerId, &'a str)>) {
        self.points.clear();
        self.members = 0;
        for (w, name) in members {
            self.push_points(w, name);
            self.members += 1;
        }
        self.points.sort_unstable();
    }

    fn push_points(&mut self, worker: WorkerId, name: &str) {
        let base = hash64(name.as_bytes());
        for i in 0..u64::from(self.vnodes) {
            let pos = mix64(base ^ mix64(i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
            self.points.push((pos, worker));
        }
    }

    /// Removes a worker's virtual nodes; returns whether it was there.
    pub fn remove(&mut self, worker: WorkerId) -> bool {
        let before = self.points.len();
        self.points.retain(|p| p.1 != worker);
        let removed = self.points.len() != before;
        if removed {
            self.members -= 1;
        }
        removed
    }

    /// The members, in no particular order.
    pub fn members(&self) -> Vec<WorkerId> {
        let mut m: Vec<WorkerId> = self.points.iter().map(|p| p.1).collect();
        m.sort_unstable();
        m.dedup();
        m
    }

    /// The first point clockwise from `key`: (index of the point, its worker).
    pub fn home(&self, key: u64) -> Option<(usize, WorkerId)> {
        if self.points.is_empty() {
            return None;
        }
        let i = self.points.partition_point(|p| p.0 < key);
        let i = if i == self.points.len() { 0 } else { i };
        Some((i, self.points[i].1))
    }

    /// Walks clockwise from point `*pos` (exclusive) to the next worker not yet in `visited`,
    /// marking it; None once every member has been visited.
    pub fn next_distinct(&self, pos: &mut usize, visited: &mut Visited) -> Option<WorkerId> {
        if visited.count() >= self.members {
            return None;
        }
        for _ in 0..self.points.len() {
            *pos = (*pos + 1) % self.points.len();
            let w = self.points[*pos].1;
            if visited.mark(w) {
                return Some(w);
            }
        }
        None
    }
}

/// A reusable set of visited workers: marking and clearing are O(1) and never allocate once the
/// largest worker id has been seen.
#[derive(Debug, Default, Clone)]
pub struct Visited {
    stamp: Vec<u32>,
    generation: u32,
    count: usize,
}

impl Visited {
    /// Empties the set.
    pub fn clear(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.stamp.iter_mut().for_each(|s| *s = 0);
            self.generation = 1;
        }
        self.count = 0;
    }

    /// Adds `w`; false if it was already in.
    pub fn mark(&mut self, w: WorkerId) -> bool {
        let i = w.0 as usize;
        if i >= self.stamp.len() {
            self.stamp.resize(i + 1, 0);
        }
        if self.stamp[i] == self.generation {
            return false;
        }
        self.stamp[i] = self.generation;
        self.count += 1;
        true
    }

    pub fn count(&self) -> usize {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_visits_each_member_once_in_ring_order() {
        let mut r = Ring::new(16);
        for i in 0..5 {
            r.insert(WorkerId(i), &format!("w{i}"));
        }
        assert_eq!(r.len(), 5);
        let (mut pos, home) = r.home(12345).unwrap();
        let mut v = Visited::default();
        v.clear();
        v.mark(home);
        let mut seen = vec![home];
        while let Some(w) = r.next_distinct(&mut pos, &mut v) {
            seen.push(w);
        }
        seen.sort();
        assert_eq!(seen, (0..5).map(WorkerId).collect::<Vec<_>>());
        assert!(r.remove(WorkerId(2)));
        assert!(!r.remove(WorkerId(2)));
        assert_eq!(r.len(), 4);
        assert!(!r.contains(WorkerId(2)));
    }
}
