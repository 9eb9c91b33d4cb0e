//! Property tests of the worker engine and its sandbox pool: random sequences of events (arrivals
//! of a few functions, completions, start failures, abandoned runs, prewarms and their outcome,
//! cancellations, retirements, timers, load samples) under every keep-alive policy and queue
//! discipline, driven the way the worker and the simulator drive it. After every step:
//!
//! * memory: starting + running + warm never exceeds the budget, and the pool's own accounting
//!   agrees with its sandboxes ([`SandboxPool::check_invariants`]);
//! * ends: every invocation the engine gave an id gets exactly one Run or Reject over its life
//!   (or was cancelled by its caller while queued, and then gets neither); when the queue drains,
//!   or at shutdown, none is left without one;
//! * sandboxes: one handed out in a Run is never handed out again before it is given back, is
//!   never in the pool's idle set meanwhile, and is never destroyed while in use;
//! * retirement: no Run is ever emitted on a sandbox of a retired function version;
//! * elastic provisioning (the budget changed at random): a cut destroys idle sandboxes only;
//!   while what runs exceeds the new budget nothing is kept warm;
//! * proactive sandboxes (created, soft-evicted, un-marked and evicted at random): their memory
//!   stays within the proactive pool and the total within the budget, a soft-evicted sandbox is
//!   never handed to a Run, and every Run's sandbox was idle (warm) or new (cold) before it.

use hearth_core::bypass::BypassConfig;
use hearth_core::policy::hist::HistConfig;
use hearth_core::{
    AimdConfig, Arrival, Completion, EngineAction, EngineConfig, GenericConfig, InvocationId,
    KeepAliveConfig, KeepAliveKind, LoadSource, Micros, PoolConfig, ProactiveError,
    ProactiveEvicted, QueueDiscipline, RegulatorConfig, Run, SandboxId, SandboxPool, WorkerEngine,
};
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

const FUNCTIONS: [&str; 4] = ["f0", "f1", "f2", "f3"];
/// Each function's dependency layer: two share one (their generic sandboxes are one key's),
/// one has its own, one has none (the default key).
const LAYERS: [Option<&str>; 4] = [
    None,
    Some("sha256:np"),
    Some("sha256:np"),
    Some("sha256:pil"),
];
const MS: Micros = 1000;

#[derive(Debug, Clone)]
enum Op {
    Arrive {
        f: usize,
        /// The caller asked to drop it once its deadline passes (`Hearth-Drop-Late`).
        drop_late: bool,
    },
    Complete {
        pick: usize,
        reusable: bool,
        exec_ms: Option<u64>,
        init_ms: Option<u64>,
    },
    StartFailed {
        pick: usize,
    },
    Abandon {
        pick: usize,
    },
    Prewarm {
        f: usize,
        count: u32,
    },
    PrewarmReady {
        pick: usize,
    },
    PrewarmFailed {
        pick: usize,
    },
    Cancel {
        pick: usize,
    },
    /// The function is updated (new memory size) or deleted: the worker calls `retire`.
    Retire {
        f: usize,
        memory_mb: u64,
    },
    Advance {
        ms: u64,
    },
    Load {
        normalized: f64,
    },
    /// The controller's allocator: create, soft-evict, un-mark or evict a proactive sandbox.
    ProCreate {
        f: usize,
    },
    SoftEvict {
        f: usize,
    },
    Unmark {
        f: usize,
    },
    ProEvict {
        f: usize,
    },
    /// Elastic provisioning resizes the memory budget.
    SetBudget {
        mb: u64,
    },
}

fn memory() -> impl Strategy<Value = u64> {
    // Mostly fits; 1536 MiB is sometimes more than the whole budget.
    prop_oneof![6 => Just(64u64), 6 => Just(128), 4 => Just(256), 2 => Just(512), 1 => Just(1536)]
}

fn op() -> impl Strategy<Value = Op> {
    let f = 0..FUNCTIONS.len();
    prop_oneof![
        10 => (f.clone(), any::<bool>()).prop_map(|(f, drop_late)| Op::Arrive { f, drop_late }),
        6 => (any::<usize>(), prop::bool::weighted(0.85), prop::option::of(1..200u64),
              prop::option::of(1..500u64))
            .prop_map(|(pick, reusable, exec_ms, init_ms)| Op::Complete { pick, reusable, exec_ms, init_ms }),
        1 => any::<usize>().prop_map(|pick| Op::StartFailed { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Abandon { pick }),
        1 => (f.clone(), 1..3u32).prop_map(|(f, count)| Op::Prewarm { f, count }),
        2 => any::<usize>().prop_map(|pick| Op::PrewarmReady { pick }),
        1 => any::<usize>().prop_map(|pick| Op::PrewarmFailed { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        1 => (f.clone(), memory()).prop_map(|(f, memory_mb)| Op::Retire { f, memory_mb }),
        2 => f.clone().prop_map(|f| Op::ProCreate { f }),
        1 => f.clone().prop_map(|f| Op::SoftEvict { f }),
        1 => f.clone().prop_map(|f| Op::Unmark { f }),
        1 => f.prop_map(|f| Op::ProEvict { f }),
        1 => prop::sample::select(vec![64u64, 192, 256, 512, 1024, 2048])
            .prop_map(|mb| Op::SetBudget { mb }),
        5 => prop_oneof![0..50u64, 0..2_000u64, 0..60_000u64].prop_map(|ms| Op::Advance { ms }),
        1 => (0.0..2.0f64).prop_map(|normalized| Op::Load { normalized }),
    ]
}

fn engine_config() -> impl Strategy<Value = EngineConfig> {
    (
        prop::sample::select(KeepAliveKind::ALL.to_vec()),
        prop::sample::select(QueueDiscipline::ALL.to_vec()),
        prop::sample::select(vec![256u64, 512, 1024]),
        prop::sample::select(vec![0u64, 128]),
        1..8usize,
        prop_oneof![
            (1..4u32).prop_map(RegulatorConfig::Fixed),
            (1..3u32, 2..6u32).prop_map(|(min, max)| RegulatorConfig::Aimd(AimdConfig {
                min,
                max,
                period_ms: 500,
                ..AimdConfig::default()
            })),
        ],
        prop::sample::select(vec![0, 20 * MS]),
        any::<bool>(),
        any::<bool>(),
        prop::sample::select(vec![0u64, 128, 256]),
    )
        .prop_map(
            |(
                kind,
                queue,
                budget,
                buffer,
                max_queue,
                regulator,
                bypass_us,
                simulated,
                generic,
                proactive_mb,
            )| {
                EngineConfig {
                    pool: PoolConfig {
                        memory_budget_mb: budget,
                        free_buffer_mb: buffer,
                        keepalive: KeepAliveConfig {
                            kind,
                            ttl: 5_000 * MS,
                            // Short buckets, so that HIST finds functions predictable, unloads
                            // and pre-warms within a case.
                            hist: HistConfig {
                                bucket: 200 * MS,
                                buckets: 100,
                                min_samples: 2,
                                generic_ttl: 10_000 * MS,
                                ..HistConfig::default()
                            },
                        },
                        // Generic sandboxes share the budget with the function sandboxes.
                        generic: if generic {
                            GenericConfig {
                                max: 3,
                                min: 1,
                                memory_mb: 64,
                                window_us: 2_000 * MS,
                            }
                        } else {
                            GenericConfig::OFF
                        },
                        // Up to the whole 256 MiB budget: then no reactive sandbox fits.
                        proactive_mb,
                    },
                    queue,
                    max_queue,
                    regulator,
                    bypass: BypassConfig {
                        threshold_us: bypass_us,
                        max_load: 0.8,
                    },
                    cpus: 2,
                    load_source: if simulated {
                        LoadSource::Simulated
                    } else {
                        LoadSource::External
                    },
                    // Both ways of meeting a busy function are held to the same invariants.
                    warm_wait: simulated,
                }
            },
        )
}

/// A driver that checks the engine's promises as it carries out its actions.
struct Driver {
    engine: WorkerEngine,
    now: Micros,
    memory: [u64; 4],
    /// Invocations with an id and no Run or Reject yet (queued).
    waiting: Vec<InvocationId>,
    /// Ids that got their Run or Reject, or were cancelled.
    ended: HashSet<InvocationId>,
    issued: u64,
    in_flight: Vec<Run>,
    busy: HashSet<SandboxId>,
    prewarming: Vec<SandboxId>,
    /// Generic sandboxes being made, and ready ones (neither taken nor destroyed).
    generic_creating: Vec<SandboxId>,
    generic_ready: HashSet<SandboxId>,
    /// The layer of each generic sandbox made (its key's).
    generic_layer: HashMap<SandboxId, Option<String>>,
    /// Sandboxes of function versions that were retired: never to run anything again.
    retired: HashSet<SandboxId>,
    /// The function each known sandbox serves.
    owner: HashMap<SandboxId, usize>,
    /// Proactive sandboxes soft-evicted (or marked so while busy or starting), by the
    /// driver's own account of what it asked for.
    soft: HashSet<SandboxId>,
}

impl Driver {
    fn new(config: EngineConfig, memory: [u64; 4]) -> Self {
        let mut engine = WorkerEngine::new(config);
        for (f, layer) in FUNCTIONS.iter().zip(LAYERS) {
            engine.set_generic_key(f, None, layer);
        }
        Driver {
            engine,
            now: 0,
            memory,
            waiting: Vec::new(),
            ended: HashSet::new(),
            issued: 0,
            in_flight: Vec::new(),
            busy: HashSet::new(),
            prewarming: Vec::new(),
            generic_creating: Vec::new(),
            generic_ready: HashSet::new(),
            generic_layer: HashMap::new(),
            retired: HashSet::new(),
            owner: HashMap::new(),
            soft: HashSet::new(),
        }
    }

    fn end(&mut self, id: InvocationId) -> Result<(), TestCaseError> {
        let pos = self.waiting.iter().position(|w| *w == id);
        prop_assert!(pos.is_some(), "{id:?} ended twice or was never issued");
        if let Some(pos) = pos {
            self.waiting.swap_remove(pos);
        }
        prop_assert!(self.ended.insert(id), "{id:?} ended twice");
        Ok(())
    }

    /// Carries out every action and checks the invariants.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        while let Some(action) = self.engine.poll_action() {
            match action {
                EngineAction::Run(run) => {
                    self.end(run.invocation)?;
                    let sb = run.sandbox;
                    prop_assert!(self.busy.insert(sb), "{sb} handed out twice");
                    prop_assert!(!self.retired.contains(&sb), "a Run on retired {sb}");
                    let f = FUNCTIONS
                        .iter()
                        .position(|n| *n == &*run.function)
                        .unwrap_or(usize::MAX);
                    prop_assert!(!self.soft.contains(&sb), "a Run on soft-evicted {sb}");
                    prop_assert!(!self.prewarming.contains(&sb), "a Run on starting {sb}");
                    if run.cold.is_some() {
                        prop_assert!(!self.owner.contains_key(&sb), "cold Run on old {sb}");
                    } else {
                        prop_assert!(self.owner.contains_key(&sb), "warm Run on unknown {sb}");
                    }
                    let owner = *self.owner.entry(sb).or_insert(f);
                    prop_assert_eq!(owner, f, "{} runs on a sandbox of another function", sb);
                    if run.cold.is_none() {
                        prop_assert_eq!(self.engine.pool().is_retired(sb), Some(false));
                        prop_assert!(run.generic.is_none(), "a warm run with a generic sandbox");
                    }
                    if let Some(g) = run.generic {
                        prop_assert!(self.generic_ready.remove(&g), "{g} is not a ready generic");
                        prop_assert!(!self.owner.contains_key(&g), "{g} belongs to a function");
                        let layer = self.generic_layer.remove(&g).flatten();
                        prop_assert_eq!(
                            layer.as_deref(),
                            LAYERS.get(f).copied().flatten(),
                            "{} specialized a generic sandbox of another layer",
                            &run.function
                        );
                    }
                    self.in_flight.push(run);
                }
                EngineAction::Reject { invocation, .. } => self.end(invocation)?,
                EngineAction::Destroy { sandbox, .. } => {
                    prop_assert!(
                        !self.generic_creating.contains(&sandbox),
                        "generic {sandbox} destroyed while being made"
                    );
                    if self.generic_ready.remove(&sandbox) {
                        continue;
                    }
                    prop_assert!(!self.busy.contains(&sandbox), "{sandbox} destroyed in use");
                    prop_assert!(
                        !self.prewarming.contains(&sandbox),
                        "{sandbox} destroyed while starting"
                    );
                    self.owner.remove(&sandbox);
                    self.soft.remove(&sandbox);
                }
                EngineAction::Prewarm { sandbox, function } => {
                    let f = FUNCTIONS.iter().position(|n| *n == &*function);
                    prop_assert!(f.is_some());
                    self.owner.insert(sandbox, f.unwrap_or(usize::MAX));
                    self.prewarming.push(sandbox);
                }
                EngineAction::CreateGeneric { sandbox, key, .. } => {
                    prop_assert!(key.runtime.is_none(), "a runtime nobody asked for");
                    self.generic_layer
                        .insert(sandbox, key.layer.as_deref().map(str::to_string));
                    prop_assert!(
                        !self.owner.contains_key(&sandbox)
                            && !self.generic_ready.contains(&sandbox),
                        "generic {sandbox} reuses an id"
                    );
                    self.generic_creating.push(sandbox);
                }
            }
        }
        self.check()
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let pool: &SandboxPool = self.engine.pool();
        let s = pool.stats();
        // Over the budget only after a cut below what runs, and then with nothing warm.
        let over = pool.over_budget_mb() > 0;
        prop_assert!(
            over || s.memory_running_mb
                + s.memory_warm_mb
                + s.memory_generic_mb
                + s.memory_proactive_mb
                <= s.memory_budget_mb,
            "over budget: {s:?}"
        );
        prop_assert!(
            !over || s.memory_warm_mb == 0,
            "warm while over budget: {s:?}"
        );
        prop_assert!(s.memory_budget_mb >= s.proactive_pool_mb, "{s:?}");
        prop_assert!(
            s.memory_proactive_mb <= s.proactive_pool_mb,
            "proactive pool over its size: {s:?}"
        );
        prop_assert!(
            over || s.memory_running_mb + s.memory_warm_mb + s.memory_generic_mb
                <= s.memory_budget_mb - s.proactive_pool_mb,
            "reactive sandboxes in the proactive pool: {s:?}"
        );
        for sb in &self.soft {
            prop_assert_eq!(pool.is_soft(*sb), Some(true), "{} should be soft", sb);
        }
        for sb in pool.idle_sandboxes() {
            if pool.is_soft(sb) == Some(true) {
                prop_assert!(self.soft.contains(&sb), "{sb} is soft unasked");
            }
        }
        if let Err(e) = pool.check_invariants() {
            return Err(TestCaseError::fail(e));
        }
        for sb in pool.idle_sandboxes() {
            prop_assert!(!self.busy.contains(&sb), "{sb} is idle and busy");
        }
        Ok(())
    }

    fn take_run(&mut self, pick: usize, cold_only: bool) -> Option<Run> {
        let candidates: Vec<usize> = (0..self.in_flight.len())
            .filter(|i| !cold_only || self.in_flight[*i].cold.is_some())
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let run = self
            .in_flight
            .swap_remove(candidates[pick % candidates.len()]);
        self.busy.remove(&run.sandbox);
        Some(run)
    }

    fn take_prewarm(&mut self, pick: usize) -> Option<SandboxId> {
        if self.prewarming.is_empty() {
            return None;
        }
        let i = pick % self.prewarming.len();
        Some(self.prewarming.swap_remove(i))
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.now;
        match op {
            Op::Arrive { f, drop_late } => {
                let id = self.engine.on_invocation(
                    now,
                    Arrival {
                        function: FUNCTIONS[*f],
                        memory_mb: self.memory[*f],
                        deadline_us: Some(500 * MS),
                        drop_late: *drop_late,
                    },
                );
                self.issued += 1;
                prop_assert_eq!(id, InvocationId(self.issued), "ids in arrival order");
                self.waiting.push(id);
            }
            Op::Complete {
                pick,
                reusable,
                exec_ms,
                init_ms,
            } => {
                if let Some(run) = self.take_run(*pick, false) {
                    let c = Completion {
                        exec_us: exec_ms.map(|m| m * MS),
                        init_us: run.cold.and(*init_ms).map(|m| m * MS),
                        reusable: *reusable,
                    };
                    self.engine.on_completed(now, &run, c);
                }
            }
            Op::StartFailed { pick } => {
                if let Some(run) = self.take_run(*pick, true) {
                    self.engine.on_start_failed(now, &run);
                }
            }
            Op::Abandon { pick } => {
                if let Some(run) = self.take_run(*pick, false) {
                    self.engine.on_abandoned(now, &run);
                }
            }
            Op::Prewarm { f, count } => {
                let (ids, _) = self
                    .engine
                    .prewarm(now, FUNCTIONS[*f], self.memory[*f], *count);
                for id in ids {
                    self.owner.insert(id, *f);
                    self.prewarming.push(id);
                }
            }
            Op::PrewarmReady { pick } => {
                if let Some(sb) = self.take_prewarm(*pick) {
                    let init = (pick % 2 == 0).then_some(MS);
                    self.engine.on_sandbox_ready(now, sb, init);
                }
                if let Some(g) = self.generic_creating.pop() {
                    self.generic_ready.insert(g);
                    self.engine.on_generic_ready(now, g);
                }
            }
            Op::PrewarmFailed { pick } => {
                if let Some(sb) = self.take_prewarm(*pick) {
                    self.engine.on_prewarm_failed(now, sb);
                    self.owner.remove(&sb);
                    self.soft.remove(&sb);
                }
                if let Some(g) = self.generic_creating.pop() {
                    self.engine.on_generic_failed(now, g);
                }
            }
            Op::Cancel { pick } => {
                if !self.waiting.is_empty() {
                    let id = self.waiting[pick % self.waiting.len()];
                    // No Run or Reject came for it, so it must be in the queue.
                    prop_assert!(self.engine.on_cancel(now, id), "{id:?} was not queued");
                    self.end(id)?;
                    prop_assert!(!self.engine.on_cancel(now, id), "{id:?} cancelled twice");
                }
            }
            Op::Retire { f, memory_mb } => {
                self.engine.retire(FUNCTIONS[*f]);
                self.memory[*f] = *memory_mb;
                for (sb, owner) in &self.owner {
                    if owner == f {
                        self.retired.insert(*sb);
                    }
                }
            }
            Op::Advance { ms } => {
                let until = now + ms * MS;
                while let Some(t) = self.engine.next_timeout().filter(|t| *t <= until) {
                    self.now = t.max(self.now);
                    self.engine.on_timeout(self.now);
                    self.drain()?;
                }
                self.now = until;
            }
            Op::Load { normalized } => self.engine.on_load(now, *normalized),
            Op::ProCreate { f } => {
                let free = self.engine.pool().proactive_free_mb();
                match self
                    .engine
                    .proactive_create(now, FUNCTIONS[*f], self.memory[*f])
                {
                    Ok(sb) => {
                        prop_assert!(!self.owner.contains_key(&sb), "{sb} reuses an id");
                        self.owner.insert(sb, *f);
                        self.prewarming.push(sb);
                    }
                    Err(ProactiveError::PoolFull { needed_mb, free_mb }) => {
                        prop_assert_eq!(free_mb, free);
                        prop_assert!(needed_mb > free_mb);
                    }
                    Err(ProactiveError::Disabled) => {
                        prop_assert_eq!(self.engine.pool().proactive_pool_mb(), 0);
                    }
                    Err(e) => prop_assert!(false, "unexpected {e}"),
                }
            }
            Op::SoftEvict { f } => {
                if let Some(sb) = self.engine.proactive_soft_evict(FUNCTIONS[*f]) {
                    prop_assert_eq!(self.owner.get(&sb), Some(f));
                    prop_assert!(self.soft.insert(sb), "{} soft-evicted twice", sb);
                }
            }
            Op::Unmark { f } => {
                if let Some(sb) = self.engine.proactive_unmark(now, FUNCTIONS[*f]) {
                    prop_assert!(self.soft.remove(&sb), "{} un-marked but not soft", sb);
                }
            }
            Op::ProEvict { f } => {
                let had_soft = self.soft.iter().any(|sb| {
                    self.owner.get(sb) == Some(f)
                        && !self.busy.contains(sb)
                        && !self.prewarming.contains(sb)
                });
                match self.engine.proactive_evict(now, FUNCTIONS[*f]) {
                    Some(ProactiveEvicted::Now(sb)) => {
                        prop_assert!(
                            !had_soft || self.soft.contains(&sb),
                            "evicted {} before a soft one",
                            sb
                        );
                        prop_assert_eq!(self.engine.pool().is_proactive(sb), None);
                    }
                    Some(ProactiveEvicted::WhenDone(sb)) => {
                        prop_assert!(!had_soft, "a busy one evicted before an idle soft one");
                        prop_assert!(self.busy.contains(&sb) || self.prewarming.contains(&sb));
                    }
                    None => prop_assert!(!had_soft, "a soft one was left"),
                }
            }
            Op::SetBudget { mb } => {
                let applied = self.engine.set_memory_budget(now, *mb);
                prop_assert_eq!(applied, (*mb).max(self.engine.pool().proactive_pool_mb()));
                prop_assert_eq!(self.engine.pool().stats().memory_budget_mb, applied);
            }
        }
        self.drain()
    }

    /// Ends the case: either every run and prewarm finishes and the queue drains, or the engine
    /// shuts down first. Then every id has ended exactly once.
    fn finish(&mut self, shutdown: bool) -> Result<(), TestCaseError> {
        if shutdown {
            self.engine.shutdown();
            self.drain()?;
            prop_assert!(self.waiting.is_empty(), "shutdown left {:?}", self.waiting);
        }
        let mut steps = 0;
        loop {
            while !self.in_flight.is_empty()
                || !self.prewarming.is_empty()
                || !self.generic_creating.is_empty()
            {
                steps += 1;
                prop_assert!(steps < 10_000, "the queue does not drain");
                self.now += MS;
                if let Some(g) = self.generic_creating.pop() {
                    self.generic_ready.insert(g);
                    self.engine.on_generic_ready(self.now, g);
                } else if let Some(sb) = self.prewarming.pop() {
                    self.engine.on_sandbox_ready(self.now, sb, None);
                } else if let Some(run) = self.in_flight.pop() {
                    self.busy.remove(&run.sandbox);
                    let c = Completion {
                        exec_us: Some(MS),
                        init_us: run.cold.map(|_| MS),
                        reusable: true,
                    };
                    self.engine.on_completed(self.now, &run, c);
                }
                self.drain()?;
            }
            // Whatever still waits (for a warm sandbox) ends by a timer, as a driver fires
            // them: at its give-up time at the latest.
            if self.waiting.is_empty() {
                break;
            }
            let Some(t) = self.engine.next_timeout() else {
                break;
            };
            steps += 1;
            prop_assert!(steps < 10_000, "the waiters never end");
            self.now = self.now.max(t);
            self.engine.on_timeout(self.now);
            self.drain()?;
        }
        prop_assert!(self.waiting.is_empty(), "never ended: {:?}", self.waiting);
        if shutdown {
            prop_assert!(
                self.generic_ready.is_empty(),
                "generic sandboxes outlived shutdown: {:?}",
                self.generic_ready
            );
        }
        prop_assert_eq!(self.engine.queue_length(), 0);
        prop_assert_eq!(self.engine.running(), 0);
        prop_assert_eq!(self.ended.len() as u64, self.issued);
        let s = self.engine.pool().stats();
        prop_assert_eq!(s.memory_running_mb, 0);
        if shutdown {
            prop_assert_eq!(
                self.engine.pool().sandbox_count(),
                0,
                "shutdown leaves nothing"
            );
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Memory stays within budget, every invocation ends exactly once, a sandbox is never both
    /// idle and busy (nor handed out twice, nor destroyed in use), after every step of a random
    /// sequence and when the case ends (queue drained or shut down).
    ///
    /// Retirement: `WorkerEngine::retire` (the worker calls it when a function is updated or
    /// deleted) leaves the function's queued invocations in the queue: they run later on a
    /// fresh sandbox of the current version (correct for an update; a deleted function gets no
    /// new arrivals, and those already accepted still end once). What a user relies on is that
    /// code retired is never run again: no Run after `retire(f)` uses a sandbox that served or
    /// was starting for `f` before it, which this checks on every Run.
    #[test]
    fn engine_keeps_its_promises(
        config in engine_config(),
        memory in prop::array::uniform4(memory()),
        ops in prop::collection::vec(op(), 1..120),
        shutdown in any::<bool>(),
    ) {
        let mut d = Driver::new(config, memory);
        for op in &ops {
            d.apply(op)?;
        }
        d.finish(shutdown)?;
    }
}

/// HIST with regular arrivals unloads, pre-warms, and keeps its promises (the random sequences
/// above rarely make a function predictable).
#[test]
fn hist_with_regular_arrivals_keeps_its_promises() {
    let config = EngineConfig {
        pool: PoolConfig {
            memory_budget_mb: 512,
            free_buffer_mb: 0,
            keepalive: KeepAliveConfig {
                kind: KeepAliveKind::Hist,
                hist: HistConfig {
                    bucket: 200 * MS,
                    buckets: 100,
                    min_samples: 2,
                    ..HistConfig::default()
                },
                ..KeepAliveConfig::default()
            },
            generic: GenericConfig::OFF,
            proactive_mb: 0,
        },
        queue: QueueDiscipline::Fcfs,
        max_queue: 10,
        regulator: RegulatorConfig::Fixed(2),
        bypass: BypassConfig::default(),
        cpus: 2,
        load_source: LoadSource::External,
        warm_wait: false,
    };
    let mut d = Driver::new(config, [128; 4]);
    let mut prewarms = 0;
    for i in 0..40 {
        let f = i % 2;
        d.apply(&Op::Arrive {
            f,
            drop_late: false,
        })
        .unwrap();
        d.apply(&Op::Advance { ms: 5 }).unwrap();
        d.apply(&Op::Complete {
            pick: 0,
            reusable: true,
            exec_ms: Some(5),
            init_ms: Some(50),
        })
        .unwrap();
        d.apply(&Op::Advance { ms: 1_000 }).unwrap();
        prewarms += d.prewarming.len();
        while !d.prewarming.is_empty() {
            d.apply(&Op::PrewarmReady { pick: 0 }).unwrap();
        }
        if i == 30 {
            d.apply(&Op::Retire {
                f: 0,
                memory_mb: 128,
            })
            .unwrap();
        }
    }
    assert!(prewarms > 0, "HIST pre-warmed");
    d.finish(false).unwrap();
}
