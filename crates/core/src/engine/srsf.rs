//! Shortest remaining slack first, as Atoll defines it (SoCC'21 §4.2): whenever a CPU slot
//! frees, consider only the queued invocations whose resources fit now, and start the one with
//! the least remaining slack computed at that moment — its deadline, minus now, minus the work
//! it needs now (a warm run if one of its function's sandboxes is idle now, else a cold start) —
//! ties to the least remaining work.
//!
//! A static key frozen at enqueue would keep a warm/cold guess that has gone stale by dispatch
//! (a sandbox freed, or was evicted), and a queue that stops at the first invocation waiting
//! for memory blocks the ones behind it that would fit. Within one function every queued
//! invocation needs the same work at a given moment, so the least slack of a function is that
//! of its earliest deadline: a pick looks at one entry per queued function, not at the queue.

use crate::time::Micros;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Queued invocations per function, by absolute deadline.
#[derive(Debug, Default)]
pub(super) struct SrsfIndex {
    by_function: HashMap<Arc<str>, BTreeSet<(Micros, u64)>>,
}

/// The invocation [`SrsfIndex::pick`] chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pick {
    pub seq: u64,
    /// Remaining slack at the pick (negative once the deadline cannot be met).
    pub slack_us: i64,
}

impl SrsfIndex {
    /// Indexes queued invocation `seq` of `function`, due at `due` (absolute).
    pub fn push(&mut self, function: &Arc<str>, due: Micros, seq: u64) {
        self.by_function
            .entry(function.clone())
            .or_default()
            .insert((due, seq));
    }

    pub fn remove(&mut self, function: &str, due: Micros, seq: u64) {
        if let Some(set) = self.by_function.get_mut(function) {
            set.remove(&(due, seq));
            if set.is_empty() {
                self.by_function.remove(function);
            }
        }
    }

    pub fn clear(&mut self) {
        self.by_function.clear();
    }

    /// The queued invocation with the least remaining slack at `now` among the functions for
    /// which `work(function, seq of its first)` says what an invocation needs now (`None`: its
    /// resources do not fit now). Ties go to the least work, then to the earlier arrival.
    pub fn pick(
        &self,
        now: Micros,
        mut work: impl FnMut(&str, u64) -> Option<Micros>,
    ) -> Option<Pick> {
        let mut best: Option<(i64, Micros, u64)> = None;
        for (function, set) in &self.by_function {
            let Some(&(due, seq)) = set.first() else {
                continue;
            };
            let Some(w) = work(function, seq) else {
                continue;
            };
            let slack = due as i64 - now as i64 - w as i64;
            let key = (slack, w, seq);
            if best.is_none_or(|b| key < b) {
                best = Some(key);
            }
        }
        best.map(|(slack_us, _, seq)| Pick { seq, slack_us })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_least_slack_now_among_the_functions_that_fit() {
        let mut ix = SrsfIndex::default();
        let (a, b, c): (Arc<str>, Arc<str>, Arc<str>) = ("a".into(), "b".into(), "c".into());
        ix.push(&a, 1_000, 1);
        ix.push(&a, 500, 4); // a's earliest deadline
        ix.push(&b, 700, 2);
        ix.push(&c, 300, 3);
        // Work now: a 100 (slack 500-0-100 = 400), b 400 (300), c does not fit.
        let work = |f: &str, _| match f {
            "a" => Some(100),
            "b" => Some(400),
            _ => None,
        };
        assert_eq!(
            ix.pick(0, work),
            Some(Pick {
                seq: 2,
                slack_us: 300
            })
        );
        // The same queue when a's sandbox is cold (work 450): a's slack is 50.
        let cold_a = |f: &str, s| if f == "a" { Some(450) } else { work(f, s) };
        assert_eq!(ix.pick(0, cold_a).map(|p| p.seq), Some(4));
        // Equal slack: the least work first.
        let tie = |f: &str, _| match f {
            "a" => Some(200), // 500-200 = 300
            "b" => Some(400), // 700-400 = 300
            _ => None,
        };
        assert_eq!(ix.pick(0, tie).map(|p| p.seq), Some(4));
        ix.remove("a", 500, 4);
        ix.remove("a", 1_000, 1);
        ix.remove("b", 700, 2);
        assert_eq!(ix.pick(0, work), None, "c alone does not fit");
        assert_eq!(
            ix.pick(400, |_, _| Some(0)),
            Some(Pick {
                seq: 3,
                slack_us: -100
            })
        );
        ix.remove("c", 300, 3);
        assert!(ix.by_function.is_empty());
    }
}
