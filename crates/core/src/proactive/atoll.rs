//! Atoll's load balancer with its semi-global schedulers' sandbox managers (SoCC '21 §4–§5), as
//! one state machine that the controller and the simulator drive the same way.
//!
//! The mapping (docs/atoll.md): Atoll's LBS is the controller; an SGS with its worker pool is a
//! *group* of workers; each worker keeps its own queue. Per group this keeps what the SGS keeps:
//! a [`PoissonEstimator`] fed with the arrivals routed to the group and an [`Allocator`] over
//! the group's workers. Over all groups it keeps the LBS's [`Scaler`].
//!
//! The driver:
//! * calls [`Atoll::route`] for every invocation (the group by lottery, then a worker of the
//!   group: one with a free proactive sandbox of the function first, else the least loaded;
//!   D-Atoll compares two random workers only);
//! * calls [`Atoll::finished`] with the queueing delay the worker reported for it;
//! * calls [`Atoll::tick`] periodically (off the invocation path) and carries out the
//!   [`Command`]s it returns on the workers, reporting failed creations and lost sandboxes back.
//!
//! The [`Ladder`] of Table 1 sets what is on: GFR (FIFO, reactive), GDR (deadline-aware
//! queue), GDPI (proactive, instant eviction), Atoll (soft eviction), D-Atoll (power-of-two
//! choices inside a group). The queue discipline and keep-alive are the workers'; the ladder
//! only names them ([`Ladder::queue`]).
//!
//! No clock and no I/O: time is the driver's [`Micros`]; randomness is a seeded SplitMix64.

use super::allocator::{
    AllocAction, AllocConfig, AllocConfigError, Allocator, EvictionMode, WorkerId,
};
use super::estimator::{DemandEstimator, EstimatorError, PoissonConfig, PoissonEstimator};
use super::scaling::{GroupId, ScaleAction, Scaler, ScalerConfig, ScalerError};
use crate::balance::hash64;
use crate::policy::queue::QueueDiscipline;
use crate::time::Micros;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The configurations of Atoll's Table 1, from today's platforms to Atoll.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ladder {
    /// Global view, FIFO queue, reactive sandboxes kept 15 minutes.
    Gfr,
    /// GFR with the deadline-aware (SRSF) queue.
    Gdr,
    /// GDR with proactive sandboxes, evicted as soon as the estimate drops.
    Gdpi,
    /// GDPI with soft eviction.
    #[default]
    Atoll,
    /// Atoll without the global view: a group picks the better of two random workers.
    DAtoll,
}

impl Ladder {
    pub const ALL: [Ladder; 5] = [
        Ladder::Gfr,
        Ladder::Gdr,
        Ladder::Gdpi,
        Ladder::Atoll,
        Ladder::DAtoll,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Ladder::Gfr => "gfr",
            Ladder::Gdr => "gdr",
            Ladder::Gdpi => "gdpi",
            Ladder::Atoll => "atoll",
            Ladder::DAtoll => "d-atoll",
        }
    }

    pub fn parse(s: &str) -> Option<Ladder> {
        Ladder::ALL.into_iter().find(|l| l.as_str() == s)
    }

    /// Whether sandboxes are set up ahead of demand.
    pub fn proactive(self) -> bool {
        !matches!(self, Ladder::Gfr | Ladder::Gdr)
    }

    /// The workers' queue discipline: FIFO for GFR, SRSF from GDR on.
    pub fn queue(self) -> QueueDiscipline {
        match self {
            Ladder::Gfr => QueueDiscipline::Fcfs,
            _ => QueueDiscipline::Srsf,
        }
    }

    /// How excess proactive sandboxes go: at once for GDPI, soft for Atoll.
    pub fn eviction(self) -> EvictionMode {
        match self {
            Ladder::Gdpi => EvictionMode::Instant,
            _ => EvictionMode::Lazy,
        }
    }

    /// Whether a group sees all its workers (else two random ones per request).
    pub fn global_view(self) -> bool {
        self != Ladder::DAtoll
    }
}

/// How a function's traffic moves onto a group that just joined it (§5.2.3, §7.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScaleOutMode {
    /// Lottery over proactive sandboxes: a new group gets a trickle until its sandboxes exist.
    #[default]
    Gradual,
    /// Equal shares among the active groups at once (the paper's round-robin contrast).
    Instant,
}

/// Why an [`AtollConfig`] was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AtollError {
    #[error("group_size must be between 1 and 1024, got {0}")]
    GroupSize(u32),
    #[error("interval must be between 1 ms and 10 s, got {0} µs")]
    Interval(Micros),
    #[error("estimator: {0}")]
    Estimator(#[from] EstimatorError),
    #[error("scaler: {0}")]
    Scaler(#[from] ScalerError),
    #[error("alloc: {0}")]
    Alloc(#[from] AllocConfigError),
}

/// Atoll's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AtollConfig {
    pub ladder: Ladder,
    /// Workers per group (an SGS's pool): workers fill groups in the order they join.
    pub group_size: u32,
    pub scale_out: ScaleOutMode,
    pub estimator: PoissonConfig,
    /// Placement and hard-eviction victims; the eviction mode comes from the ladder.
    pub alloc: AllocConfig,
    pub scaler: ScalerConfig,
    /// How often demand is re-estimated and sandboxes re-allocated (100 ms, the estimator's
    /// interval in the paper's prototype).
    pub interval_us: Micros,
    /// Set-up time assumed for a function until one is measured.
    pub default_setup_us: Micros,
    /// Slack assumed for a function without a deadline (scaling normalizes by it).
    pub default_slack_us: Micros,
    /// Seed of the lottery and of D-Atoll's random choices.
    pub seed: u64,
}

impl Default for AtollConfig {
    fn default() -> Self {
        AtollConfig {
            ladder: Ladder::Atoll,
            group_size: 1,
            scale_out: ScaleOutMode::Gradual,
            estimator: PoissonConfig::default(),
            alloc: AllocConfig::default(),
            scaler: ScalerConfig::default(),
            interval_us: 100_000,
            default_setup_us: 100_000,
            default_slack_us: 1_000_000,
            seed: 0x5eed_a7011,
        }
    }
}

impl AtollConfig {
    pub fn validate(&self) -> Result<(), AtollError> {
        if !(1..=1024).contains(&self.group_size) {
            return Err(AtollError::GroupSize(self.group_size));
        }
        if !(1_000..=10_000_000).contains(&self.interval_us) {
            return Err(AtollError::Interval(self.interval_us));
        }
        self.estimator.validate()?;
        self.scaler.validate()?;
        self.alloc.validate()?;
        Ok(())
    }
}

/// What a function is, as far as Atoll needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FunctionSpec {
    pub memory_mb: u64,
    /// Relative to arrival; None: [`AtollConfig::default_slack_us`] stands for its slack.
    pub deadline_us: Option<Micros>,
    /// Known set-up (cold start) time; None: learned from cold starts.
    pub setup_us: Option<Micros>,
    /// Known execution time; None: learned from runs.
    pub exec_us: Option<Micros>,
}

/// One step for a worker, as the allocator decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub worker: WorkerId,
    pub group: GroupId,
    /// `Create`, `Unmark`, `SoftEvict` or `Evict` (never `Skipped`).
    pub action: AllocAction,
    /// The function's memory (what a `Create` reserves).
    pub memory_mb: u64,
}

/// Where one invocation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub worker: WorkerId,
    pub group: GroupId,
    /// The worker held a proactive sandbox of the function not yet claimed by a request in
    /// flight (what the group's scheduler looked for first).
    pub free_sandbox: bool,
}

/// How an invocation routed by [`Atoll::route`] ended, as the worker reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Time it waited in the worker's queue.
    pub queue_us: Micros,
    /// Set-up time when it was a cold start.
    pub init_us: Option<Micros>,
    /// Execution time when it ran to the end.
    pub exec_us: Option<Micros>,
}

/// Counters over the balancer's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AtollStats {
    pub routed: u64,
    /// Routed to a worker holding a free proactive sandbox of the function.
    pub routed_to_free: u64,
    pub scale_outs: u64,
    pub scale_ins: u64,
    pub creates: u64,
    pub unmarks: u64,
    pub soft_evicts: u64,
    pub evicts: u64,
    pub skipped: u64,
    /// Sandboxes a worker no longer held when it reported (crashed, killed): forgotten and
    /// allocated again.
    #[serde(default)]
    pub lost: u64,
}

#[derive(Debug, Clone)]
struct Func {
    spec: FunctionSpec,
    /// EWMA of measured set-up and execution times (µs), 0 until measured.
    setup_seen: f64,
    exec_seen: f64,
    /// Spreads a function's preferred worker order inside a group (warm reuse under light
    /// load, as a consistent hash would).
    key: u64,
}

impl Func {
    fn setup_us(&self, default: Micros) -> Micros {
        self.spec.setup_us.unwrap_or(if self.setup_seen > 0.0 {
            self.setup_seen as Micros
        } else {
            default
        })
    }

    fn exec_us(&self) -> Micros {
        self.spec.exec_us.unwrap_or(self.exec_seen as Micros)
    }

    fn slack_us(&self, default: Micros) -> Micros {
        match self.spec.deadline_us {
            Some(d) => d.saturating_sub(self.exec_us()),
            None => default,
        }
    }
}

#[derive(Debug, Clone)]
struct Member {
    group: GroupId,
    cpus: u32,
    in_flight: u32,
    /// Requests in flight per function (entries removed at 0).
    per_fn: HashMap<Arc<str>, u32>,
    /// Proactive sandboxes being created per function (entries removed at 0): allocated, not
    /// yet usable.
    pending: HashMap<Arc<str>, u32>,
}

impl Member {
    fn pending(&self, function: &str) -> u32 {
        self.pending.get(function).copied().unwrap_or(0)
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Floor {
    /// Sandboxes the LBS told this group to allocate when it joined the function.
    count: u32,
    until: Micros,
}

#[derive(Debug, Clone)]
struct Group {
    members: Vec<WorkerId>,
    alloc: Allocator,
    estimator: PoissonEstimator,
    /// Functions routed here or holding sandboxes here, with their scale-out floor.
    fns: BTreeMap<Arc<str>, Floor>,
}

/// The controller's (or simulator's) Atoll state: see the module docs.
#[derive(Debug, Clone)]
pub struct Atoll {
    config: AtollConfig,
    functions: HashMap<Arc<str>, Func>,
    members: BTreeMap<WorkerId, Member>,
    groups: BTreeMap<GroupId, Group>,
    scaler: Scaler,
    next_group: GroupId,
    next_tick: Micros,
    rng: u64,
    stats: AtollStats,
}

impl Atoll {
    pub fn new(config: AtollConfig) -> Result<Self, AtollError> {
        config.validate()?;
        let mut scaler_config = config.scaler;
        scaler_config.gradual = config.scale_out == ScaleOutMode::Gradual;
        let scaler = Scaler::new(scaler_config, &[])?;
        Ok(Atoll {
            rng: config.seed,
            config,
            functions: HashMap::new(),
            members: BTreeMap::new(),
            groups: BTreeMap::new(),
            scaler,
            next_group: 0,
            next_tick: 0,
            stats: AtollStats::default(),
        })
    }

    pub fn config(&self) -> &AtollConfig {
        &self.config
    }

    pub fn stats(&self) -> &AtollStats {
        &self.stats
    }

    /// Registers (or updates) a function. A changed memory size re-allocates its sandboxes at
    /// the next tick.
    pub fn register(&mut self, name: &str, spec: FunctionSpec) {
        match self.functions.get_mut(name) {
            Some(f) => f.spec = spec,
            None => {
                self.functions.insert(
                    Arc::from(name),
                    Func {
                        spec,
                        setup_seen: 0.0,
                        exec_seen: 0.0,
                        key: hash64(name.as_bytes()),
                    },
                );
            }
        }
    }

    /// Forgets a function; its sandboxes are evicted by the commands returned.
    pub fn unregister(&mut self, name: &str) -> Vec<Command> {
        let mut out = Vec::new();
        if self.functions.remove(name).is_none() {
            return out;
        }
        for (gid, g) in &mut self.groups {
            g.fns.remove(name);
            let actions = g.alloc.forget(name);
            push_commands(&mut out, &mut self.stats, *gid, 0, actions);
        }
        out
    }

    /// A worker with `cpus` CPUs lending `pool_mb` of proactive memory joins; it fills the
    /// first group with room, or starts a new one. Returns its group (the same if known).
    pub fn add_worker(&mut self, id: WorkerId, cpus: u32, pool_mb: u64) -> GroupId {
        if let Some(m) = self.members.get(&id) {
            return m.group;
        }
        let size = self.config.group_size as usize;
        let group = match self.groups.iter().find(|(_, g)| g.members.len() < size) {
            Some((gid, _)) => *gid,
            None => {
                let gid = self.next_group;
                self.next_group += 1;
                let mut alloc_config = self.config.alloc;
                alloc_config.eviction = self.config.ladder.eviction();
                let estimator = PoissonEstimator::new(self.config.estimator.clone());
                let Ok(estimator) = estimator else {
                    // Validated in `new`; unreachable.
                    return gid;
                };
                self.groups.insert(
                    gid,
                    Group {
                        members: Vec::new(),
                        alloc: Allocator::new(alloc_config),
                        estimator,
                        fns: BTreeMap::new(),
                    },
                );
                self.scaler.add_group(gid);
                gid
            }
        };
        if let Some(g) = self.groups.get_mut(&group) {
            g.members.push(id);
            g.alloc.add_worker(id, pool_mb);
        }
        self.members.insert(
            id,
            Member {
                group,
                cpus: cpus.max(1),
                in_flight: 0,
                per_fn: HashMap::new(),
                pending: HashMap::new(),
            },
        );
        group
    }

    /// A worker left or died: its sandboxes are forgotten; an emptied group leaves the ring.
    pub fn remove_worker(&mut self, id: WorkerId) -> bool {
        let Some(m) = self.members.remove(&id) else {
            return false;
        };
        if let Some(g) = self.groups.get_mut(&m.group) {
            g.members.retain(|w| *w != id);
            g.alloc.remove_worker(id);
            if g.members.is_empty() {
                self.groups.remove(&m.group);
                self.scaler.remove_group(m.group);
            }
        }
        true
    }

    /// The group of a worker.
    pub fn group_of(&self, worker: WorkerId) -> Option<GroupId> {
        self.members.get(&worker).map(|m| m.group)
    }

    fn draw(&mut self) -> u64 {
        // SplitMix64.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Places one invocation of `function` arriving at `now`; None when no worker is known.
    pub fn route(&mut self, now: Micros, function: &str) -> Option<Route> {
        let draw = self.draw();
        let group = self.scaler.route(function, draw, now)?;
        let (a, b) = (self.draw(), self.draw());
        let (name, fkey): (Arc<str>, u64) = match self.functions.get_key_value(function) {
            Some((k, f)) => (k.clone(), f.key),
            None => (Arc::from(function), 0),
        };
        let g = self.groups.get_mut(&group)?;
        g.estimator.on_arrival(function, now);
        if !g.fns.contains_key(function) {
            g.fns.insert(name.clone(), Floor::default());
        }
        let members = &self.members;
        let score = |w: WorkerId| -> Option<(bool, u64, u64, WorkerId)> {
            let m = members.get(&w)?;
            let busy = m.per_fn.get(function).copied().unwrap_or(0);
            let ready = g
                .alloc
                .sandboxes(w, function)
                .0
                .saturating_sub(m.pending(function));
            let free = ready > busy;
            // Load in thousandths of a request per CPU; ties by the function's own order.
            let load = u64::from(m.in_flight) * 1000 / u64::from(m.cpus);
            let order = (fkey ^ u64::from(w)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            Some((!free, load, order, w))
        };
        let best = if self.config.ladder.global_view() {
            g.members.iter().filter_map(|w| score(*w)).min()
        } else {
            let n = g.members.len() as u64;
            let pick = |d: u64| g.members[((u128::from(d) * u128::from(n)) >> 64) as usize];
            [score(pick(a)), score(pick(b))].into_iter().flatten().min()
        }?;
        let (busy_flag, _, _, worker) = best;
        let m = self.members.get_mut(&worker)?;
        m.in_flight += 1;
        match m.per_fn.get_mut(function) {
            Some(c) => *c += 1,
            None => {
                m.per_fn.insert(name, 1);
            }
        }
        self.stats.routed += 1;
        self.stats.routed_to_free += u64::from(!busy_flag);
        Some(Route {
            worker,
            group,
            free_sandbox: !busy_flag,
        })
    }

    /// An invocation routed to `worker` ended without an answer to learn from (refused,
    /// failed, timed out): it only stops counting as in flight.
    pub fn abandoned(&mut self, worker: WorkerId, function: &str) -> Option<GroupId> {
        let m = self.members.get_mut(&worker)?;
        m.in_flight = m.in_flight.saturating_sub(1);
        if let Some(c) = m.per_fn.get_mut(function) {
            *c -= 1;
            if *c == 0 {
                m.per_fn.remove(function);
            }
        }
        Some(m.group)
    }

    /// An invocation routed to `worker` ended at `now`: its queueing delay feeds the scaling
    /// metric of the worker's group, its times the function's learned set-up and run times.
    pub fn finished(&mut self, now: Micros, worker: WorkerId, function: &str, outcome: Outcome) {
        let Some(group) = self.abandoned(worker, function) else {
            return;
        };
        self.scaler
            .report_delay(function, group, outcome.queue_us, now);
        if let Some(g) = self.groups.get_mut(&group) {
            g.alloc.on_used(worker, function, now);
        }
        if let Some(f) = self.functions.get_mut(function) {
            const A: f64 = 0.3;
            let fold = |old: f64, x: Micros| {
                if old == 0.0 {
                    x as f64
                } else {
                    A * x as f64 + (1.0 - A) * old
                }
            };
            if let Some(i) = outcome.init_us {
                f.setup_seen = fold(f.setup_seen, i);
            }
            if let Some(e) = outcome.exec_us {
                f.exec_seen = fold(f.exec_seen, e);
            }
        }
    }

    /// A `Create` finished on the worker: the sandbox is usable (or, evicted meanwhile, gone).
    /// Until then it neither attracts requests nor counts as a lottery ticket.
    pub fn on_ready(&mut self, worker: WorkerId, function: &str) {
        if let Some(m) = self.members.get_mut(&worker) {
            if let Some(c) = m.pending.get_mut(function) {
                *c -= 1;
                if *c == 0 {
                    m.pending.remove(function);
                }
            }
        }
    }

    /// A `Create` failed on the worker (no room, the sandbox did not start).
    pub fn on_create_failed(&mut self, worker: WorkerId, function: &str) {
        self.on_ready(worker, function);
        if let Some(g) = self.group_mut_of(worker) {
            g.alloc.on_create_failed(worker, function);
        }
    }

    /// A proactive sandbox of `function` on `worker` is gone (crashed, timed out).
    pub fn on_lost(&mut self, worker: WorkerId, function: &str) {
        if let Some(g) = self.group_mut_of(worker) {
            g.alloc.on_lost(worker, function);
        }
    }

    /// Brings Atoll's view of `worker` in line with the worker's own report, taken while no
    /// command to it was under way: `reported(f)` is (active or starting, soft-evicted)
    /// sandboxes of `f` there. Sandboxes the worker lost are forgotten, so the next tick
    /// allocates them again; returns how many.
    pub fn reconcile(&mut self, worker: WorkerId, reported: impl Fn(&str) -> (u32, u32)) -> u32 {
        let lost = self
            .group_mut_of(worker)
            .map_or(0, |g| g.alloc.reconcile(worker, reported));
        self.stats.lost += u64::from(lost);
        lost
    }

    fn group_mut_of(&mut self, worker: WorkerId) -> Option<&mut Group> {
        let group = self.members.get(&worker)?.group;
        self.groups.get_mut(&group)
    }

    /// When [`Self::tick`] next has work (the driver's timer).
    pub fn next_tick(&self) -> Micros {
        self.next_tick
    }

    /// Re-estimates demand, re-allocates sandboxes and scales functions over groups, once per
    /// [`AtollConfig::interval_us`] (earlier calls return nothing). The commands are for the
    /// workers, in order.
    pub fn tick(&mut self, now: Micros) -> Vec<Command> {
        let mut out = Vec::new();
        if now < self.next_tick {
            return out;
        }
        self.next_tick = now - now % self.config.interval_us + self.config.interval_us;
        let proactive = self.config.ladder.proactive();
        let (default_setup, default_slack) =
            (self.config.default_setup_us, self.config.default_slack_us);
        let shares = if proactive {
            self.shares()
        } else {
            HashMap::new()
        };
        let mut first = 0;
        for (gid, g) in &mut self.groups {
            g.estimator.tick(now);
            let mut gone = Vec::new();
            for (name, floor) in &mut g.fns {
                let Some(f) = self.functions.get(name) else {
                    gone.push(name.clone());
                    continue;
                };
                let estimate = if proactive {
                    g.estimator
                        .estimate(name, now, f.setup_us(default_setup), f.exec_us())
                } else {
                    0
                };
                if now >= floor.until {
                    floor.count = 0;
                }
                // A group active for a function keeps at least the average of its active
                // groups (what it was told to allocate when it joined): its estimator sees
                // only the share the lottery gives it, which its sandboxes set, so without
                // this floor a new group's share shrinks back towards nothing.
                let share = shares
                    .get(name)
                    .and_then(|(groups, avg)| groups.contains(gid).then_some(*avg))
                    .unwrap_or(0);
                let demand = estimate.max(floor.count).max(share);
                if proactive {
                    let actions = g.alloc.set_demand(name, f.spec.memory_mb, demand, None);
                    push_commands(&mut out, &mut self.stats, *gid, f.spec.memory_mb, actions);
                    track_pending(&mut self.members, &out[first..]);
                    first = out.len();
                    let ready = ready_in(&g.alloc, &g.members, &self.members, name);
                    self.scaler.set_sandboxes(name, *gid, ready);
                }
                let idle = demand == 0
                    && g.alloc.allocation(name) == 0
                    && g.alloc.soft_evicted(name) == 0
                    && g.estimator.rate(name, now) == 0.0;
                if idle {
                    gone.push(name.clone());
                }
            }
            for name in gone {
                g.fns.remove(&name);
            }
        }
        // Scaling: every function some group serves.
        let mut names: Vec<Arc<str>> = self
            .groups
            .values()
            .flat_map(|g| g.fns.keys().cloned())
            .collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let Some(f) = self.functions.get(&name) else {
                continue;
            };
            let (slack, memory_mb) = (f.slack_us(default_slack), f.spec.memory_mb);
            match self.scaler.evaluate(&name, slack, now) {
                Some(ScaleAction::Out { group, allocate }) => {
                    self.stats.scale_outs += 1;
                    let Some(g) = self.groups.get_mut(&group) else {
                        continue;
                    };
                    let hold = self.config.scaler.cooldown_us.max(self.config.interval_us);
                    g.fns.insert(
                        name.clone(),
                        Floor {
                            count: allocate,
                            until: now.saturating_add(hold),
                        },
                    );
                    if proactive {
                        let have = g.alloc.allocation(&name);
                        let actions =
                            g.alloc
                                .set_demand(&name, memory_mb, allocate.max(have), None);
                        push_commands(&mut out, &mut self.stats, group, memory_mb, actions);
                        track_pending(&mut self.members, &out[first..]);
                        first = out.len();
                        let ready = ready_in(&g.alloc, &g.members, &self.members, &name);
                        self.scaler.set_sandboxes(&name, group, ready);
                    }
                }
                Some(ScaleAction::In { .. }) => self.stats.scale_ins += 1,
                None => {}
            }
        }
        self.scaler.expire(now);
        out
    }

    /// For each function active on several groups: those groups and the average allocation
    /// over them (rounded up), the floor each keeps while it stays active.
    fn shares(&self) -> HashMap<Arc<str>, (Vec<GroupId>, u32)> {
        let mut out = HashMap::new();
        for name in self.functions.keys() {
            let active = self.scaler.active_groups(name);
            if active.len() < 2 {
                continue;
            }
            let sum: u64 = active
                .iter()
                .filter_map(|g| self.groups.get(g))
                .map(|g| u64::from(g.alloc.allocation(name)))
                .sum();
            let avg = sum.div_ceil(active.len() as u64);
            out.insert(
                name.clone(),
                (active, u32::try_from(avg).unwrap_or(u32::MAX)),
            );
        }
        out
    }

    /// The groups serving `function` now: active ones, then removed ones still draining.
    pub fn groups_of(&self, function: &str) -> (Vec<GroupId>, Vec<GroupId>) {
        (
            self.scaler.active_groups(function),
            self.scaler.removed_groups(function),
        )
    }

    /// (active, soft-evicted) proactive sandboxes of `function` over all groups.
    pub fn sandboxes(&self, function: &str) -> (u32, u32) {
        self.groups.values().fold((0, 0), |(a, s), g| {
            (
                a + g.alloc.allocation(function),
                s + g.alloc.soft_evicted(function),
            )
        })
    }

    /// (active, soft-evicted) proactive sandboxes of `function` on `worker`.
    pub fn sandboxes_on(&self, worker: WorkerId, function: &str) -> (u32, u32) {
        self.members
            .get(&worker)
            .and_then(|m| self.groups.get(&m.group))
            .map_or((0, 0), |g| g.alloc.sandboxes(worker, function))
    }

    /// Requests in flight on `worker`.
    pub fn in_flight(&self, worker: WorkerId) -> u32 {
        self.members.get(&worker).map_or(0, |m| m.in_flight)
    }

    /// Number of groups.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }
}

/// Counts the new `Create`s as pending on their workers.
fn track_pending(members: &mut BTreeMap<WorkerId, Member>, commands: &[Command]) {
    for c in commands {
        if let AllocAction::Create { worker, function } = &c.action {
            if let Some(m) = members.get_mut(worker) {
                *m.pending.entry(function.clone()).or_insert(0) += 1;
            }
        }
    }
}

/// Usable proactive sandboxes of `function` in a group: allocated minus being created.
fn ready_in(
    alloc: &Allocator,
    group: &[WorkerId],
    members: &BTreeMap<WorkerId, Member>,
    function: &str,
) -> u32 {
    let pending: u32 = group
        .iter()
        .filter_map(|w| members.get(w))
        .map(|m| m.pending(function))
        .sum();
    alloc.allocation(function).saturating_sub(pending)
}

/// Turns allocator actions into commands and counts them.
fn push_commands(
    out: &mut Vec<Command>,
    stats: &mut AtollStats,
    group: GroupId,
    memory_mb: u64,
    actions: Vec<AllocAction>,
) {
    for action in actions {
        let worker = match &action {
            AllocAction::Create { worker, .. } => {
                stats.creates += 1;
                *worker
            }
            AllocAction::Unmark { worker, .. } => {
                stats.unmarks += 1;
                *worker
            }
            AllocAction::SoftEvict { worker, .. } => {
                stats.soft_evicts += 1;
                *worker
            }
            AllocAction::Evict { worker, .. } => {
                stats.evicts += 1;
                *worker
            }
            AllocAction::Skipped { .. } => {
                stats.skipped += 1;
                continue;
            }
        };
        out.push(Command {
            worker,
            group,
            action,
            memory_mb,
        });
    }
}

#[cfg(test)]
#[path = "atoll_tests.rs"]
mod tests;
