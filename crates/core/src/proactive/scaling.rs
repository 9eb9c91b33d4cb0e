//! The load balancer's per-function group scaling and sandbox-aware routing (Atoll §5.2,
//! Pseudocode 2), as a pure state machine.
//!
//! A *group* is one of Atoll's semi-global schedulers with its worker pool. Groups sit on a
//! consistent-hash ring with virtual nodes, placed by hashing their id with the balancer's
//! stable [`hash64`], so the ring is the same in every run. A function's
//! first group is its ring home; scaling out adds the next group clockwise not yet in use.
//!
//! Per function the scaler keeps an `active` list (in the order groups were added) and a
//! `removed` list. [`Scaler::route`] holds a lottery among both: a group's tickets are the
//! proactive sandboxes of the function it reported ([`Scaler::set_sandboxes`]), at least 1 for
//! an active group (so a group that just joined gets a trickle of requests until its sandboxes
//! exist), times [`ScalerConfig::removed_discount`] for a removed group (gradual scale-in); a
//! removed group that reports 0 sandboxes is dropped.
//!
//! [`Scaler::evaluate`] reads Pseudocode 2's garbled lines 4–5 as
//!
//! ```text
//! weightedQDelay = Σᵢ Nᵢ·qDelayᵢ / Σᵢ Nᵢ      (i over the active groups)
//! scalingMetric  = weightedQDelay / slack
//! ```
//!
//! i.e. the sandbox-weighted mean queueing delay divided by the function's slack: the text says
//! the delays are weighted by the sandboxes at each group and "normalized by the available
//! slack", and a mean (not a plain sum) keeps the metric comparable with fixed thresholds however
//! many groups are active. `Nᵢ` is the group's ticket count (`max(1, sandboxes)`), so a group that
//! has not reported sandboxes yet still counts. `qDelayᵢ` is the EWMA of the delays the group
//! reported ([`Scaler::report_delay`]). Removed groups do not count: they are on their way out.
//!
//! After a scaling action the function's delay windows reset; the next decision waits until
//! every active group reported [`ScalerConfig::min_reports`] delays since ("once the windows are
//! filled") and [`ScalerConfig::cooldown_us`] has passed.
//!
//! Randomness is the caller's: `route` takes a uniform `draw`, so the scaler is deterministic.
//! No clock and no I/O: time is the driver's [`Micros`].

use crate::balance::hash64;
use crate::time::Micros;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A group (Atoll's SGS and its workers). A small, dense number chosen by the controller.
pub type GroupId = u32;

/// Fixed-point scale of lottery tickets: a removed group's discounted tickets stay integers.
const TICKET_ONE: u64 = 1 << 16;

/// The scaler's settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScalerConfig {
    /// Scale out when the metric (weighted mean queueing delay / slack) is above this (0.3).
    pub scale_out: f64,
    /// Scale in when the metric is below this (0.05): well below `scale_out`, against
    /// oscillation.
    pub scale_in: f64,
    /// A removed group's tickets are its sandboxes times this, in (0, 1] (0.5: it keeps half
    /// the share its sandboxes would give it, so the remaining groups take its load gradually).
    pub removed_discount: f64,
    /// EWMA weight of the newest queueing-delay report, in (0, 1] (0.3).
    pub alpha: f64,
    /// Delay reports each active group must send after a scaling action before the next
    /// decision (10).
    pub min_reports: u32,
    /// Least time between two scaling actions of one function (1 s).
    pub cooldown_us: Micros,
    /// A function neither routed nor reported for this long is forgotten by
    /// [`Scaler::expire`] (10 min): it starts again from its ring home. Bounds memory.
    pub idle_forget_us: Micros,
    /// Virtual nodes per group on the ring (64): evens out the functions' homes.
    pub vnodes: u32,
    /// Lottery over proactive sandboxes (true, §5.2.3); false: every active group gets an
    /// equal share at once and removed groups none (the paper's instant, round-robin contrast).
    pub gradual: bool,
}

impl Default for ScalerConfig {
    fn default() -> Self {
        ScalerConfig {
            scale_out: 0.3,
            scale_in: 0.05,
            removed_discount: 0.5,
            alpha: 0.3,
            min_reports: 10,
            cooldown_us: 1_000_000,
            idle_forget_us: 600_000_000,
            vnodes: 64,
            gradual: true,
        }
    }
}

/// Why a [`ScalerConfig`] or a group id was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScalerError {
    #[error("thresholds must satisfy 0 <= scale_in < scale_out, got scale_in {scale_in}, scale_out {scale_out}")]
    Thresholds { scale_in: f64, scale_out: f64 },
    #[error("removed_discount must lie in (0, 1], got {0}")]
    Discount(f64),
    #[error("alpha must lie in (0, 1], got {0}")]
    Alpha(f64),
    #[error("min_reports must be at least 1")]
    MinReports,
    #[error("vnodes must be at least 1")]
    Vnodes,
    #[error("idle_forget_us must be positive")]
    IdleForget,
}

impl ScalerConfig {
    pub fn validate(&self) -> Result<(), ScalerError> {
        // Written so that NaN fails every check.
        if !(self.scale_in >= 0.0 && self.scale_in < self.scale_out && self.scale_out.is_finite()) {
            return Err(ScalerError::Thresholds {
                scale_in: self.scale_in,
                scale_out: self.scale_out,
            });
        }
        if !(self.removed_discount > 0.0 && self.removed_discount <= 1.0) {
            return Err(ScalerError::Discount(self.removed_discount));
        }
        if !(self.alpha > 0.0 && self.alpha <= 1.0) {
            return Err(ScalerError::Alpha(self.alpha));
        }
        if self.min_reports == 0 {
            return Err(ScalerError::MinReports);
        }
        if self.vnodes == 0 {
            return Err(ScalerError::Vnodes);
        }
        if self.idle_forget_us == 0 {
            return Err(ScalerError::IdleForget);
        }
        Ok(())
    }
}

/// A scaling decision for one function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleAction {
    /// `group` joins the function's active groups; the caller tells it to allocate `allocate`
    /// proactive sandboxes (the average per active group, the new one included).
    Out { group: GroupId, allocate: u32 },
    /// `group` (the last added) moved to the removed list; its tickets are discounted until it
    /// reports 0 sandboxes.
    In { group: GroupId },
}

#[derive(Debug, Clone)]
struct Entry {
    group: GroupId,
    sandboxes: u32,
    /// EWMA of reported queueing delay (µs) since the last window reset.
    delay: f64,
    /// Reports since the last window reset.
    reports: u32,
}

impl Entry {
    fn new(group: GroupId, sandboxes: u32) -> Self {
        Entry {
            group,
            sandboxes,
            delay: 0.0,
            reports: 0,
        }
    }

    fn reset(&mut self) {
        self.delay = 0.0;
        self.reports = 0;
    }

    fn active_tickets(&self) -> u64 {
        u64::from(self.sandboxes.max(1)) * TICKET_ONE
    }

    fn removed_tickets(&self, discount: u64) -> u64 {
        (u64::from(self.sandboxes) * discount).max(1)
    }
}

#[derive(Debug, Clone)]
struct FnState {
    key: u64,
    active: Vec<Entry>,
    removed: Vec<Entry>,
    last_seen: Micros,
    last_action: Option<Micros>,
}

impl FnState {
    fn entry_mut(&mut self, group: GroupId) -> Option<&mut Entry> {
        self.active
            .iter_mut()
            .chain(self.removed.iter_mut())
            .find(|e| e.group == group)
    }

    fn reset_windows(&mut self) {
        for e in self.active.iter_mut().chain(self.removed.iter_mut()) {
            e.reset();
        }
    }
}

/// Per-function group scaling and lottery routing (see the module docs).
#[derive(Debug, Clone)]
pub struct Scaler {
    config: ScalerConfig,
    /// `removed_discount` in units of [`TICKET_ONE`].
    discount: u64,
    ring: GroupRing,
    functions: HashMap<Box<str>, FnState>,
}

impl Scaler {
    /// A scaler over `groups` (any order: the ring places them by hashing their ids).
    pub fn new(config: ScalerConfig, groups: &[GroupId]) -> Result<Self, ScalerError> {
        config.validate()?;
        let mut ring = GroupRing {
            points: Vec::new(),
            vnodes: config.vnodes,
        };
        for g in groups {
            ring.insert(*g);
        }
        let discount = ((config.removed_discount * TICKET_ONE as f64).round() as u64).max(1);
        Ok(Scaler {
            config,
            discount,
            ring,
            functions: HashMap::new(),
        })
    }

    pub fn config(&self) -> &ScalerConfig {
        &self.config
    }

    /// Functions currently tracked.
    pub fn len(&self) -> usize {
        self.functions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }

    /// The group `function` hashes to on the ring (None when the cluster has no group).
    pub fn home(&self, function: &str) -> Option<GroupId> {
        self.ring
            .home(hash64(function.as_bytes()))
            .map(|i| self.ring.points[i].1)
    }

    /// Adds a group to the cluster (no-op if present). Functions already spread keep their
    /// groups; new functions (and scale-outs) may land on it.
    pub fn add_group(&mut self, group: GroupId) {
        self.ring.insert(group);
    }

    /// Removes a group from the cluster: it leaves every function's lists; a function left
    /// without an active group restarts on its (new) ring home. Returns whether it was there.
    pub fn remove_group(&mut self, group: GroupId) -> bool {
        let was = self.ring.remove(group);
        for st in self.functions.values_mut() {
            st.active.retain(|e| e.group != group);
            st.removed.retain(|e| e.group != group);
            if st.active.is_empty() {
                if let Some(home) = self.ring.home_group(st.key) {
                    // The home may be a removed group of this function: reactivate it.
                    let sandboxes = match st.removed.iter().position(|e| e.group == home) {
                        Some(i) => st.removed.remove(i).sandboxes,
                        None => 0,
                    };
                    st.active.push(Entry::new(home, sandboxes));
                    st.reset_windows();
                }
            }
        }
        was
    }

    /// Picks the group for one request of `function`: a lottery among its active and removed
    /// groups, `draw` being a uniform random number from the caller. A function seen for the
    /// first time starts on its ring home. `now` marks it as in use (see
    /// [`ScalerConfig::idle_forget_us`]). None only when the cluster has no group.
    pub fn route(&mut self, function: &str, draw: u64, now: Micros) -> Option<GroupId> {
        let st = match self.functions.get_mut(function) {
            Some(st) => st,
            None => {
                let key = hash64(function.as_bytes());
                let home = self.ring.home_group(key)?;
                self.functions
                    .entry(function.into())
                    .or_insert_with(|| FnState {
                        key,
                        active: vec![Entry::new(home, 0)],
                        removed: Vec::new(),
                        last_seen: now,
                        last_action: None,
                    })
            }
        };
        st.last_seen = st.last_seen.max(now);
        if st.active.is_empty() {
            // The cluster emptied since; restart on the home if groups came back.
            let home = self.ring.home_group(st.key)?;
            st.removed.retain(|e| e.group != home);
            st.active.push(Entry::new(home, 0));
            st.reset_windows();
        }
        if !self.config.gradual {
            let n = st.active.len() as u64;
            let i = ((u128::from(draw) * u128::from(n)) >> 64) as usize;
            return st.active.get(i).map(|e| e.group);
        }
        let discount = self.discount;
        let total: u64 = st
            .active
            .iter()
            .map(Entry::active_tickets)
            .chain(st.removed.iter().map(|e| e.removed_tickets(discount)))
            .fold(0u64, u64::saturating_add);
        // Maps the draw onto [0, total) without modulo bias beyond 2^-64.
        let mut pick = ((u128::from(draw) * u128::from(total)) >> 64) as u64;
        for e in &st.active {
            let t = e.active_tickets();
            if pick < t {
                return Some(e.group);
            }
            pick -= t;
        }
        for e in &st.removed {
            let t = e.removed_tickets(discount);
            if pick < t {
                return Some(e.group);
            }
            pick -= t;
        }
        // Unreachable unless the total saturated; the home is as good as any.
        st.active.first().map(|e| e.group)
    }

    /// `group` reports it holds `sandboxes` proactive sandboxes of `function` (piggybacked on
    /// its answers). A removed group reporting 0 is dropped. Unknown functions or groups not
    /// associated with the function are ignored; returns whether the report was taken.
    pub fn set_sandboxes(&mut self, function: &str, group: GroupId, sandboxes: u32) -> bool {
        let Some(st) = self.functions.get_mut(function) else {
            return false;
        };
        if let Some(i) = st.removed.iter().position(|e| e.group == group) {
            if sandboxes == 0 {
                st.removed.remove(i);
            } else {
                st.removed[i].sandboxes = sandboxes;
            }
            return true;
        }
        match st.active.iter_mut().find(|e| e.group == group) {
            Some(e) => {
                e.sandboxes = sandboxes;
                true
            }
            None => false,
        }
    }

    /// `group` reports the queueing delay a request of `function` saw there (piggybacked on
    /// the answer), folded into that pair's EWMA. Counts as activity of the function at `now`.
    /// Ignored (false) for unknown functions and groups not associated with it.
    pub fn report_delay(
        &mut self,
        function: &str,
        group: GroupId,
        queue_delay_us: Micros,
        now: Micros,
    ) -> bool {
        let alpha = self.config.alpha;
        let Some(st) = self.functions.get_mut(function) else {
            return false;
        };
        let Some(e) = st.entry_mut(group) else {
            return false;
        };
        let x = queue_delay_us as f64;
        e.delay = if e.reports == 0 {
            x
        } else {
            alpha * x + (1.0 - alpha) * e.delay
        };
        e.reports = e.reports.saturating_add(1);
        st.last_seen = st.last_seen.max(now);
        true
    }

    /// The scaling metric of `function` now: sandbox-weighted mean queueing delay of its active
    /// groups over `slack_us` (a slack of 0 counts as 1 µs). None for an unknown function.
    pub fn metric(&self, function: &str, slack_us: Micros) -> Option<f64> {
        self.functions
            .get(function)
            .map(|st| metric_of(st, slack_us))
    }

    /// Decides whether `function` scales out, in, or stays (Pseudocode 2), given its slack (the
    /// deadline minus the execution time): less slack scales out sooner. No decision until every
    /// active group has filled its window since the last action and the cooldown has passed.
    pub fn evaluate(
        &mut self,
        function: &str,
        slack_us: Micros,
        now: Micros,
    ) -> Option<ScaleAction> {
        let cfg = self.config;
        let st = self.functions.get_mut(function)?;
        if let Some(t) = st.last_action {
            if now < t.saturating_add(cfg.cooldown_us) {
                return None;
            }
        }
        if st.active.is_empty() || st.active.iter().any(|e| e.reports < cfg.min_reports) {
            return None;
        }
        let m = metric_of(st, slack_us);
        let action = if m > cfg.scale_out {
            let group = self.ring.next_inactive(st)?;
            let sandboxes = match st.removed.iter().position(|e| e.group == group) {
                Some(i) => st.removed.remove(i).sandboxes,
                None => 0,
            };
            let sum: u64 = st
                .active
                .iter()
                .map(|e| u64::from(e.sandboxes))
                .sum::<u64>()
                + u64::from(sandboxes);
            let n = st.active.len() as u64 + 1;
            let allocate = u32::try_from(sum.div_ceil(n)).unwrap_or(u32::MAX).max(1);
            st.active.push(Entry::new(group, sandboxes));
            ScaleAction::Out { group, allocate }
        } else if m < cfg.scale_in && st.active.len() > 1 {
            let e = st.active.pop()?;
            let group = e.group;
            if e.sandboxes > 0 {
                st.removed.push(e);
            }
            ScaleAction::In { group }
        } else {
            return None;
        };
        st.reset_windows();
        st.last_action = Some(now);
        Some(action)
    }

    /// Forgets functions neither routed nor reported for [`ScalerConfig::idle_forget_us`];
    /// returns how many. The driver calls it periodically.
    pub fn expire(&mut self, now: Micros) -> usize {
        let idle = self.config.idle_forget_us;
        let before = self.functions.len();
        self.functions
            .retain(|_, st| now.saturating_sub(st.last_seen) < idle);
        before - self.functions.len()
    }

    /// The active groups of `function`, in the order they were added (empty if unknown).
    pub fn active_groups(&self, function: &str) -> Vec<GroupId> {
        self.functions
            .get(function)
            .map(|st| st.active.iter().map(|e| e.group).collect())
            .unwrap_or_default()
    }

    /// The removed groups of `function` still draining (empty if unknown).
    pub fn removed_groups(&self, function: &str) -> Vec<GroupId> {
        self.functions
            .get(function)
            .map(|st| st.removed.iter().map(|e| e.group).collect())
            .unwrap_or_default()
    }
}

fn metric_of(st: &FnState, slack_us: Micros) -> f64 {
    let (num, den) = st.active.iter().fold((0.0, 0.0), |(num, den), e| {
        let n = f64::from(e.sandboxes.max(1));
        (num + n * e.delay, den + n)
    });
    if den == 0.0 {
        return 0.0;
    }
    num / den / slack_us.max(1) as f64
}

/// The consistent-hash ring of groups: `vnodes` points per group, sorted by position.
#[derive(Debug, Clone)]
struct GroupRing {
    points: Vec<(u64, GroupId)>,
    vnodes: u32,
}

impl GroupRing {
    fn contains(&self, group: GroupId) -> bool {
        self.points.iter().any(|p| p.1 == group)
    }

    fn insert(&mut self, group: GroupId) {
        if self.contains(group) {
            return;
        }
        for i in 0..self.vnodes {
            // Hashed by id (as the paper hashes SGS ids) and virtual-node index.
            let mut bytes = [0u8; 8];
            bytes[..4].copy_from_slice(&group.to_le_bytes());
            bytes[4..].copy_from_slice(&i.to_le_bytes());
            self.points.push((hash64(&bytes), group));
        }
        self.points.sort_unstable();
    }

    fn remove(&mut self, group: GroupId) -> bool {
        let before = self.points.len();
        self.points.retain(|p| p.1 != group);
        self.points.len() != before
    }

    /// Index of the first point clockwise from `key`.
    fn home(&self, key: u64) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let i = self.points.partition_point(|p| p.0 < key);
        Some(if i == self.points.len() { 0 } else { i })
    }

    fn home_group(&self, key: u64) -> Option<GroupId> {
        self.home(key).map(|i| self.points[i].1)
    }

    /// The first group clockwise from the function's home (included) that is not active.
    /// At most one lap over the points; no allocation.
    fn next_inactive(&self, st: &FnState) -> Option<GroupId> {
        let start = self.home(st.key)?;
        let n = self.points.len();
        (0..n)
            .map(|k| self.points[(start + k) % n].1)
            .find(|g| !st.active.iter().any(|e| e.group == *g))
    }
}

#[cfg(test)]
#[path = "scaling_tests.rs"]
mod tests;
