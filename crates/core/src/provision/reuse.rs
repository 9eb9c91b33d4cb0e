//! Reuse distances (thesis Eq. 3.2): the total memory of the *unique* functions invoked between
//! two successive invocations of the same function.
//!
//! Each function's size sits in a Fenwick tree at the position of its latest invocation, so the
//! unique functions seen since position `p` are exactly the weights after `p`: one invocation
//! costs O(log M) (a prefix sum, a removal, an insertion), not the O(M) scan of the naive
//! method. Positions are compacted when the tree fills, so memory stays O(functions).

use std::collections::HashMap;

/// What one invocation's reuse distance was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// The function's first invocation: a compulsory miss at any size.
    First,
    /// Memory (MiB) of the unique other functions invoked since its previous invocation.
    Distance(u64),
}

/// A Fenwick (binary indexed) tree of sums over positions.
#[derive(Debug, Clone, Default)]
struct Fenwick {
    tree: Vec<u64>,
}

impl Fenwick {
    fn with_len(n: usize) -> Self {
        Fenwick { tree: vec![0; n] }
    }

    fn len(&self) -> usize {
        self.tree.len()
    }

    fn add(&mut self, mut i: usize, v: u64) {
        while i < self.tree.len() {
            self.tree[i] += v;
            i |= i + 1;
        }
    }

    fn sub(&mut self, mut i: usize, v: u64) {
        while i < self.tree.len() {
            self.tree[i] -= v;
            i |= i + 1;
        }
    }

    /// Sum of positions `0..=i`.
    fn prefix(&self, i: usize) -> u64 {
        let mut s = 0;
        let mut i = i as isize;
        while i >= 0 {
            s += self.tree[i as usize];
            i = (i & (i + 1)) - 1;
        }
        s
    }
}

/// The smallest tree; it doubles while more than half of it is live functions.
const MIN_POSITIONS: usize = 1024;

/// Computes reuse distances one invocation at a time, keys being dense ids (`0..`).
#[derive(Debug, Clone)]
pub struct ReuseTracker {
    /// Per key: its latest position and the size it was weighted with there.
    last: Vec<Option<(usize, u64)>>,
    /// The key at each position (`u32::MAX`: none live there).
    owner: Vec<u32>,
    tree: Fenwick,
    next: usize,
    live: usize,
}

impl Default for ReuseTracker {
    fn default() -> Self {
        Self::new()
    }
}

impl ReuseTracker {
    pub fn new() -> Self {
        ReuseTracker {
            last: Vec::new(),
            owner: vec![u32::MAX; MIN_POSITIONS],
            tree: Fenwick::with_len(MIN_POSITIONS),
            next: 0,
            live: 0,
        }
    }

    /// Functions seen so far.
    pub fn functions(&self) -> usize {
        self.live
    }

    /// Records an invocation of `key` needing `size_mb`, returning its reuse distance.
    pub fn record(&mut self, key: u32, size_mb: u64) -> Reuse {
        if self.next == self.tree.len() {
            self.compact();
        }
        let k = key as usize;
        if k >= self.last.len() {
            self.last.resize(k + 1, None);
        }
        let reuse = match self.last[k] {
            Some((pos, weight)) => {
                let since = self.tree.prefix(self.next - 1) - self.tree.prefix(pos);
                self.tree.sub(pos, weight);
                self.owner[pos] = u32::MAX;
                Reuse::Distance(since)
            }
            None => {
                self.live += 1;
                Reuse::First
            }
        };
        let pos = self.next;
        self.next += 1;
        self.tree.add(pos, size_mb);
        self.owner[pos] = key;
        self.last[k] = Some((pos, size_mb));
        reuse
    }

    /// Renumbers the live positions `0..live` in order (distances only depend on order), and
    /// grows the tree when live functions fill more than half of it.
    fn compact(&mut self) {
        let mut len = self.tree.len().max(MIN_POSITIONS);
        while self.live * 2 > len {
            len *= 2;
        }
        let mut owner = vec![u32::MAX; len];
        let mut tree = Fenwick::with_len(len);
        let mut pos = 0;
        for &key in self.owner.iter().filter(|k| **k != u32::MAX) {
            if let Some((p, w)) = self.last[key as usize].as_mut() {
                *p = pos;
                tree.add(pos, *w);
            }
            owner[pos] = key;
            pos += 1;
        }
        self.owner = owner;
        self.tree = tree;
        self.next = pos;
    }
}

/// The naive O(N·M) computation, as the thesis describes it: for each invocation, scan back to
/// the previous invocation of the same function and add up the sizes of the distinct functions
/// met on the way. The reference the fast tracker is tested against.
pub fn naive_distances(trace: &[(u32, u64)]) -> Vec<Reuse> {
    let mut out = Vec::with_capacity(trace.len());
    for (i, &(key, _)) in trace.iter().enumerate() {
        let mut seen: HashMap<u32, u64> = HashMap::new();
        let mut found = false;
        for &(other, size) in trace[..i].iter().rev() {
            if other == key {
                found = true;
                break;
            }
            seen.entry(other).or_insert(size);
        }
        out.push(if found {
            Reuse::Distance(seen.values().sum())
        } else {
            Reuse::First
        });
    }
    out
}
