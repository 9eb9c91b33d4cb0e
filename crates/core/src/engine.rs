//! The worker engine: invocation queue, concurrency regulator, bypass, function
//! characteristics and the sandbox pool, glued into one sans-I/O state machine (DESIGN.md §1).
//!
//! The real worker and the discrete-event simulator drive the same engine: events in, each with
//! the time; [`EngineAction`]s out of [`WorkerEngine::poll_action`], the one exit for decisions
//! (the whole driver loop is in the crate docs). [`WorkerEngine::on_invocation`] returns the
//! arriving invocation's id; its [`EngineAction::Run`] or [`EngineAction::Reject`] comes out
//! first among the actions that call queued, or nothing comes for it and it waits in the queue.
//! Queued invocations are started later by [`EngineAction::Run`] when a completion, a higher
//! limit or freed memory lets them, or rejected (no memory will ever come, shutdown).
//!
//! Every invocation the engine gave an id gets exactly one Run or Reject over its life, unless
//! its caller cancels it while queued ([`WorkerEngine::on_cancel`]).

use crate::bypass::BypassConfig;
use crate::characteristics::{Characteristics, CharacteristicsReport};
use crate::load::LoadAverage;
use crate::policy::queue::{InvocationQueue, KeyInputs, QueueDiscipline};
use crate::pool::{
    Acquire, ColdReason, DestroyReason, GenericKey, PoolAction, PoolConfig, PoolStats,
    ProactiveError, ProactiveEvicted, SandboxId, SandboxPool,
};
use crate::regulator::{Regulator, RegulatorConfig};
use crate::time::Micros;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Where the engine's load signal comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadSource {
    /// The driver reports it with [`WorkerEngine::on_load`] (a real worker reads the kernel's).
    External,
    /// A Linux-style load average of the engine's own running invocations (the `sim` backend
    /// and the simulator, where the machine's load means nothing).
    Simulated,
}

/// Everything the engine is configured with.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub pool: PoolConfig,
    pub queue: QueueDiscipline,
    /// Queued invocations beyond this are rejected.
    pub max_queue: usize,
    pub regulator: RegulatorConfig,
    pub bypass: BypassConfig,
    /// CPUs of the worker: normalizes the load and seeds the AIMD limit.
    pub cpus: u32,
    pub load_source: LoadSource,
    /// Wait for a busy sandbox of the function to free rather than start a new one when that
    /// is expected to be sooner (the `warm_wait` module).
    pub warm_wait: bool,
}

/// An invocation's identity within one engine (arrival order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct InvocationId(pub u64);

/// An arriving invocation.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'a> {
    pub function: &'a str,
    pub memory_mb: u64,
    /// Deadline relative to arrival (SRSF).
    pub deadline_us: Option<Micros>,
    /// Reject it with [`Reject::Late`] rather than start it once its deadline has passed (the
    /// caller's `Hearth-Drop-Late`); without a deadline it changes nothing.
    pub drop_late: bool,
}

/// Permission to run an invocation on a sandbox. The driver keeps it and hands it back with the
/// invocation's end ([`WorkerEngine::on_completed`] and friends).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub invocation: InvocationId,
    pub function: Arc<str>,
    pub sandbox: SandboxId,
    /// `Some` when the sandbox must be started first (its memory is reserved).
    pub cold: Option<ColdReason>,
    /// For a cold run: the ready generic sandbox to specialize into `sandbox`; `None` means
    /// the sandbox is created from nothing.
    pub generic: Option<SandboxId>,
    /// Time spent in the queue.
    pub queued_us: Micros,
    /// It skipped the queue and the concurrency limit.
    pub bypass: bool,
}

/// Why an invocation cannot run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    QueueFull {
        length: usize,
    },
    /// Memory for a new sandbox cannot be found even after evicting every idle sandbox, and
    /// nothing running will free any.
    NoMemory {
        needed_mb: u64,
        free_mb: u64,
    },
    /// The function needs more memory than the whole budget.
    TooLarge {
        needed_mb: u64,
        budget_mb: u64,
    },
    ShuttingDown,
    /// Its deadline had passed when it would have started, and its caller asked to drop late
    /// work rather than run it: `late_by_us` past the deadline (0 when it arrived with none
    /// left).
    Late {
        late_by_us: Micros,
    },
}

/// An action for the driver: the engine's one exit for decisions.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineAction {
    /// An invocation (arriving or queued) may start.
    Run(Run),
    /// An invocation (arriving or queued) will never run.
    Reject {
        invocation: InvocationId,
        reason: Reject,
    },
    Destroy {
        sandbox: SandboxId,
        reason: DestroyReason,
    },
    /// Start a sandbox ahead of demand (report it ready or failed).
    Prewarm {
        sandbox: SandboxId,
        function: Arc<str>,
    },
    /// Make a generic sandbox for the pool that cold starts specialize (report it with
    /// [`WorkerEngine::on_generic_ready`] or [`WorkerEngine::on_generic_failed`]).
    /// Of `key` (its runtime; with a layer, mounted and its modules imported before it is
    /// ready), with the memory limit `memory_mb` (what it reserves).
    CreateGeneric {
        sandbox: SandboxId,
        key: GenericKey,
        memory_mb: u64,
    },
}

/// How an invocation ended, as far as the engine cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The handler's time, when the sandbox answered.
    pub exec_us: Option<Micros>,
    /// Sandbox start and import, for a cold invocation that got that far.
    pub init_us: Option<Micros>,
    /// The sandbox is healthy and may serve again.
    pub reusable: bool,
}

#[derive(Debug)]
struct Queued {
    function: Arc<str>,
    memory_mb: u64,
    arrival: Micros,
    /// Absolute deadline, for SRSF: arrival + deadline, or arrival + twice the expected time
    /// without one (its EEDF key, as the static key has it).
    due: Micros,
    /// Absolute deadline past which it is dropped rather than started (drop-late calls only).
    drop_after: Option<Micros>,
}

/// The engine.
#[derive(Debug)]
pub struct WorkerEngine {
    config: EngineConfig,
    pool: SandboxPool,
    queue: InvocationQueue<Queued>,
    /// SRSF's dispatch order (only kept with that discipline).
    srsf: srsf::SrsfIndex,
    queued_per_fn: HashMap<Arc<str>, u32>,
    regulator: Regulator,
    characteristics: HashMap<Arc<str>, Characteristics>,
    load: LoadAverage,
    external_load: f64,
    next_invocation: u64,
    /// Running invocations admitted under the concurrency limit, and bypasses.
    running: u32,
    running_bypass: u32,
    actions: VecDeque<EngineAction>,
    shutting_down: bool,
    warm_wait: warm_wait::WarmWait,
}

impl WorkerEngine {
    pub fn new(config: EngineConfig) -> Self {
        WorkerEngine {
            pool: SandboxPool::new(config.pool.clone()),
            queue: InvocationQueue::new(config.queue),
            srsf: srsf::SrsfIndex::default(),
            queued_per_fn: HashMap::new(),
            regulator: Regulator::new(config.regulator.clone(), config.cpus),
            characteristics: HashMap::new(),
            load: LoadAverage::default(),
            external_load: 0.0,
            next_invocation: 1,
            running: 0,
            running_bypass: 0,
            actions: VecDeque::new(),
            shutting_down: false,
            warm_wait: warm_wait::WarmWait::default(),
            config,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn pool(&self) -> &SandboxPool {
        &self.pool
    }

    /// Load average divided by CPUs.
    pub fn normalized_load(&self) -> f64 {
        match self.config.load_source {
            LoadSource::External => self.external_load,
            LoadSource::Simulated => self.load.value() / self.config.cpus.max(1) as f64,
        }
    }

    fn intern(&mut self, name: &str) -> Arc<str> {
        match self.characteristics.get_key_value(name) {
            Some((k, _)) => k.clone(),
            None => {
                let k: Arc<str> = Arc::from(name);
                self.characteristics
                    .insert(k.clone(), Characteristics::default());
                k
            }
        }
    }

    /// An invocation arrives. Its fate comes out of [`Self::poll_action`] under the returned id,
    /// like every other decision: [`EngineAction::Run`] (it runs now: the fast path of an empty
    /// queue with room under the limit, or a bypass) or [`EngineAction::Reject`]; when neither
    /// comes for it, it waits in the queue and a later event starts or rejects it. Its own Run
    /// or Reject is always the first action this call queues, before the pool's actions it caused
    /// (evictions to make room).
    #[must_use = "the invocation's Run or Reject comes out of poll_action under this id"]
    pub fn on_invocation(&mut self, now: Micros, a: Arrival<'_>) -> InvocationId {
        let id = InvocationId(self.next_invocation);
        self.next_invocation += 1;
        if let Some(action) = self.admit(now, id, a) {
            self.actions.push_back(action);
            self.absorb_pool_actions();
        }
        id
    }

    /// Runs, rejects or queues an arriving invocation; `None` when it was queued.
    fn admit(&mut self, now: Micros, id: InvocationId, a: Arrival<'_>) -> Option<EngineAction> {
        self.advance_load(now);
        let reject = |reason| {
            Some(EngineAction::Reject {
                invocation: id,
                reason,
            })
        };
        if self.shutting_down {
            return reject(Reject::ShuttingDown);
        }
        // No deadline left on arrival: a drop-late call is refused before it costs anything.
        if a.drop_late && a.deadline_us == Some(0) {
            return reject(Reject::Late { late_by_us: 0 });
        }
        let function = self.intern(a.function);
        let queued_here = self.queued_per_fn.get(&function).copied().unwrap_or(0) as usize;
        let warm_expected = self.pool.idle_count(&function) > queued_here;
        let (known, expected, iat) = match self.characteristics.get_mut(&function) {
            Some(c) => {
                c.on_arrival(now, a.memory_mb);
                (
                    c.has_warm_samples(),
                    c.expected_us(warm_expected),
                    c.iat_us(),
                )
            }
            None => (false, 0, 0),
        };
        self.pool.on_arrival(now, &function, a.memory_mb);
        // Reactive sandboxes never use the proactive pool's part of the budget; an idle
        // proactive sandbox may still serve a function larger than the rest.
        let budget = self.pool.reactive_budget_mb();
        if a.memory_mb > budget && self.pool.idle_count(&function) == 0 {
            return reject(Reject::TooLarge {
                needed_mb: a.memory_mb,
                budget_mb: budget,
            });
        }
        if self
            .config
            .bypass
            .allows(known, expected, self.normalized_load())
        {
            if let Some(run) = self.try_start(now, id, &function, a.memory_mb, now, true) {
                return Some(EngineAction::Run(run));
            }
        }
        if self.config.warm_wait
            && self.queue.is_empty()
            && self.running < self.regulator.limit()
            && self.pool.idle_count(&function) == 0
        {
            let chars = self.characteristics.get(&function);
            if let Some(give_up_at) = self
                .warm_wait
                .decide(now, &function, chars, self.config.cpus)
            {
                self.warm_wait.park(
                    &function,
                    warm_wait::Waiter {
                        id,
                        memory_mb: a.memory_mb,
                        arrival: now,
                        deadline_us: a.deadline_us,
                        drop_late: a.drop_late,
                        give_up_at,
                    },
                );
                return None;
            }
        }
        // SRSF starts an arrival that fits past queued invocations that do not (they wait
        // for memory; whatever fits is started as soon as it does, so nothing queued fits now).
        let srsf = self.config.queue == QueueDiscipline::Srsf;
        if (self.queue.is_empty() || srsf) && self.running < self.regulator.limit() {
            let fits =
                self.queue.is_empty() || self.pool.can_acquire(&function, a.memory_mb).is_some();
            if fits {
                if let Some(run) = self.try_start(now, id, &function, a.memory_mb, now, false) {
                    return Some(EngineAction::Run(run));
                }
            }
            if self.pool.returning_mb() == 0 {
                return reject(self.no_memory(a.memory_mb));
            }
        }
        if self.queue.len() >= self.config.max_queue {
            return reject(Reject::QueueFull {
                length: self.queue.len(),
            });
        }
        let keys = KeyInputs {
            arrival: now,
            expected_us: expected,
            iat_us: iat,
            deadline_us: a.deadline_us,
        };
        self.enqueue(id, function, a.memory_mb, now, &keys, a.drop_late);
        None
    }

    fn enqueue(
        &mut self,
        id: InvocationId,
        function: Arc<str>,
        memory_mb: u64,
        arrival: Micros,
        keys: &KeyInputs,
        drop_late: bool,
    ) {
        *self.queued_per_fn.entry(function.clone()).or_insert(0) += 1;
        let due = arrival.saturating_add(
            keys.deadline_us
                .unwrap_or(keys.expected_us.saturating_mul(2)),
        );
        if self.config.queue == QueueDiscipline::Srsf {
            self.srsf.push(&function, due, id.0);
        }
        self.queue.push(
            id.0,
            keys,
            Queued {
                function,
                memory_mb,
                arrival,
                due,
                drop_after: late_at(arrival, keys.deadline_us, drop_late),
            },
        );
    }

    /// A waiter whose wait ran out, or that found no sandbox free when one should have:
    /// started now if it can be, queued otherwise.
    fn start_waiter(&mut self, now: Micros, function: Arc<str>, w: warm_wait::Waiter) {
        if self.refuse_if_late(now, w.id, late_at(w.arrival, w.deadline_us, w.drop_late)) {
            return;
        }
        if self.queue.is_empty() && self.running < self.regulator.limit() {
            if let Some(run) = self.try_start(now, w.id, &function, w.memory_mb, w.arrival, false) {
                self.actions.push_back(EngineAction::Run(run));
                return;
            }
        }
        if self.queue.len() >= self.config.max_queue {
            self.actions.push_back(EngineAction::Reject {
                invocation: w.id,
                reason: Reject::QueueFull {
                    length: self.queue.len(),
                },
            });
            return;
        }
        let (expected, iat) = self
            .characteristics
            .get(&function)
            .map_or((0, 0), |c| (c.cold_us(), c.iat_us()));
        let keys = KeyInputs {
            arrival: w.arrival,
            expected_us: expected,
            iat_us: iat,
            deadline_us: w.deadline_us,
        };
        self.enqueue(w.id, function, w.memory_mb, w.arrival, &keys, w.drop_late);
    }

    /// Waiters of `function` that nothing running will serve (its last busy sandbox failed, or
    /// its run was given up) start now instead of at their give-up time.
    fn restart_stranded(&mut self, now: Micros, function: &Arc<str>) {
        while self.warm_wait.stranded(function) {
            let Some(w) = self.warm_wait.take(function) else {
                break;
            };
            self.start_waiter(now, function.clone(), w);
        }
    }

    /// Hands sandboxes of `function` that are idle now to its waiters.
    fn serve_waiters(&mut self, now: Micros, function: &Arc<str>) {
        while self.pool.idle_count(function) > 0 && self.running < self.regulator.limit() {
            let Some(w) = self.warm_wait.take(function) else {
                break;
            };
            if self.refuse_if_late(now, w.id, late_at(w.arrival, w.deadline_us, w.drop_late)) {
                continue;
            }
            match self.try_start(now, w.id, function, w.memory_mb, w.arrival, false) {
                Some(run) => {
                    if run.cold.is_none() {
                        self.warm_wait.avoided += 1;
                    }
                    self.actions.push_back(EngineAction::Run(run));
                }
                None => {
                    self.start_waiter(now, function.clone(), w);
                    break;
                }
            }
        }
    }

    fn no_memory(&self, needed_mb: u64) -> Reject {
        Reject::NoMemory {
            needed_mb,
            free_mb: self.pool.free_mb(),
        }
    }

    /// Acquires a sandbox and counts the invocation as running; `None` when memory is short.
    fn try_start(
        &mut self,
        now: Micros,
        id: InvocationId,
        function: &Arc<str>,
        memory_mb: u64,
        arrival: Micros,
        bypass: bool,
    ) -> Option<Run> {
        let (sandbox, cold, generic) = match self.pool.acquire(now, function, memory_mb) {
            Acquire::Warm(sb) => (sb, None, None),
            Acquire::Cold {
                sandbox,
                reason,
                generic,
            } => (sandbox, Some(reason), generic),
            Acquire::NoMemory { .. } => return None,
        };
        if bypass {
            self.running_bypass += 1;
        } else {
            self.running += 1;
        }
        if self.config.warm_wait {
            let expected = self
                .characteristics
                .get(function)
                .map_or(0, |c| c.expected_us(cold.is_none()));
            self.warm_wait
                .started(function, id, now, expected, cold.is_some());
        }
        Some(Run {
            invocation: id,
            function: function.clone(),
            sandbox,
            cold,
            generic,
            queued_us: now.saturating_sub(arrival),
            bypass,
        })
    }

    /// Starts queued invocations while the regulator and memory allow.
    fn dispatch(&mut self, now: Micros) {
        if self.config.queue == QueueDiscipline::Srsf {
            self.dispatch_srsf(now);
            return;
        }
        while self.running < self.regulator.limit() {
            let Some((seq, q)) = self.queue.peek() else {
                break;
            };
            let (function, memory_mb, arrival) = (q.function.clone(), q.memory_mb, q.arrival);
            let id = InvocationId(seq);
            if self.refuse_if_late(now, id, q.drop_after) {
                self.unqueue(seq);
                continue;
            }
            match self.try_start(now, id, &function, memory_mb, arrival, false) {
                Some(run) => {
                    self.unqueue(seq);
                    self.actions.push_back(EngineAction::Run(run));
                }
                // Running invocations will free memory: wait for them, in order.
                None if self.pool.returning_mb() > 0 => break,
                None => {
                    self.unqueue(seq);
                    self.refuse_no_memory(id, memory_mb);
                }
            }
        }
        self.absorb_pool_actions();
    }

    /// SRSF's dispatch ([`srsf`]): the least remaining slack among the invocations that fit
    /// now; one waiting for memory blocks nothing behind it.
    fn dispatch_srsf(&mut self, now: Micros) {
        while self.running < self.regulator.limit() && !self.queue.is_empty() {
            let (pool, chars, queue) = (&self.pool, &self.characteristics, &self.queue);
            let work = |f: &str, warm: bool| chars.get(f).map_or(0, |c| c.expected_us(warm));
            let fits = self.srsf.pick(now, |f, seq| {
                let memory_mb = queue.get(seq).map_or(0, |q| q.memory_mb);
                pool.can_acquire(f, memory_mb).map(|warm| work(f, warm))
            });
            let Some(pick) = fits else {
                // Nothing fits: running invocations will free memory, or nothing ever will.
                if self.pool.returning_mb() > 0 {
                    break;
                }
                let Some(pick) = self.srsf.pick(now, |f, _| Some(work(f, false))) else {
                    break;
                };
                if let Some(q) = self.unqueue(pick.seq) {
                    let id = InvocationId(pick.seq);
                    if !self.refuse_if_late(now, id, q.drop_after) {
                        self.refuse_no_memory(id, q.memory_mb);
                    }
                }
                continue;
            };
            let Some(q) = self.unqueue(pick.seq) else {
                break;
            };
            let id = InvocationId(pick.seq);
            if self.refuse_if_late(now, id, q.drop_after) {
                continue;
            }
            match self.try_start(now, id, &q.function, q.memory_mb, q.arrival, false) {
                Some(run) => self.actions.push_back(EngineAction::Run(run)),
                None => {
                    // can_acquire said it fits: a disagreement with the pool is a bug; the
                    // invocation is refused rather than spun on.
                    debug_assert!(false, "SRSF picked an invocation that did not fit");
                    self.refuse_no_memory(id, q.memory_mb);
                }
            }
        }
        self.absorb_pool_actions();
    }

    /// Rejects `id` (out of the queue or parked) with [`Reject::Late`] when `drop_after` is set
    /// and `now` is past it; true when it did.
    fn refuse_if_late(
        &mut self,
        now: Micros,
        id: InvocationId,
        drop_after: Option<Micros>,
    ) -> bool {
        let Some(late_by_us) = drop_after
            .and_then(|d| now.checked_sub(d))
            .filter(|&l| l > 0)
        else {
            return false;
        };
        self.actions.push_back(EngineAction::Reject {
            invocation: id,
            reason: Reject::Late { late_by_us },
        });
        true
    }

    /// Rejects `id` (out of the queue) for memory that nothing will free.
    fn refuse_no_memory(&mut self, id: InvocationId, memory_mb: u64) {
        let reason = self.no_memory(memory_mb);
        self.actions.push_back(EngineAction::Reject {
            invocation: id,
            reason,
        });
    }

    fn unqueue(&mut self, seq: u64) -> Option<Queued> {
        let q = self.queue.remove(seq)?;
        if self.config.queue == QueueDiscipline::Srsf {
            self.srsf.remove(&q.function, q.due, seq);
        }
        if let Some(n) = self.queued_per_fn.get_mut(&q.function) {
            *n -= 1;
            if *n == 0 {
                self.queued_per_fn.remove(&q.function);
            }
        }
        Some(q)
    }

    fn absorb_pool_actions(&mut self) {
        while let Some(a) = self.pool.poll_action() {
            self.actions.push_back(match a {
                PoolAction::Destroy { sandbox, reason } => {
                    EngineAction::Destroy { sandbox, reason }
                }
                PoolAction::Prewarm { sandbox, function } => {
                    EngineAction::Prewarm { sandbox, function }
                }
                PoolAction::CreateGeneric {
                    sandbox,
                    key,
                    memory_mb,
                } => EngineAction::CreateGeneric {
                    sandbox,
                    key,
                    memory_mb,
                },
            });
        }
    }

    fn finish(&mut self, run: &Run) {
        if self.config.warm_wait {
            self.warm_wait.ended(run.invocation);
        }
        if run.bypass {
            self.running_bypass = self.running_bypass.saturating_sub(1);
        } else {
            self.running = self.running.saturating_sub(1);
        }
    }

    /// An invocation ended (successfully or not) on its sandbox.
    pub fn on_completed(&mut self, now: Micros, run: &Run, c: Completion) {
        self.advance_load(now);
        self.finish(run);
        if let (Some(chars), Some(exec)) = (self.characteristics.get_mut(&run.function), c.exec_us)
        {
            match (run.cold, c.init_us) {
                (Some(_), Some(init)) => chars.on_cold(init + exec),
                (None, _) => chars.on_warm(exec),
                (Some(_), None) => {}
            }
            let init = chars.init_us();
            self.pool.set_cost(&run.function, init);
        }
        self.pool.release(now, run.sandbox, c.reusable);
        if self.config.warm_wait {
            self.serve_waiters(now, &run.function);
            self.restart_stranded(now, &run.function);
        }
        self.dispatch(now);
    }

    /// The sandbox of a cold run could not be started.
    pub fn on_start_failed(&mut self, now: Micros, run: &Run) {
        self.finish(run);
        self.pool.on_start_failed(run.sandbox);
        self.restart_stranded(now, &run.function);
        self.dispatch(now);
    }

    /// A run was granted but its invocation is gone (the client left before it started): the
    /// sandbox goes back unused, or its reservation is dropped if it was never started.
    pub fn on_abandoned(&mut self, now: Micros, run: &Run) {
        self.finish(run);
        if run.cold.is_some() {
            self.pool.on_start_failed(run.sandbox);
        } else {
            self.pool.release(now, run.sandbox, true);
            self.serve_waiters(now, &run.function);
        }
        self.restart_stranded(now, &run.function);
        self.dispatch(now);
    }

    /// A queued invocation's caller went away; false if it was no longer queued.
    pub fn on_cancel(&mut self, now: Micros, id: InvocationId) -> bool {
        let removed = self.unqueue(id.0).is_some() || self.warm_wait.cancel(id);
        if removed {
            self.dispatch(now);
        }
        removed
    }

    /// Starts up to `count` sandboxes of `function` ahead of demand, with free memory only.
    /// Returns the sandboxes to start and how many found no memory. The driver starts each and
    /// reports [`Self::on_sandbox_ready`] or [`Self::on_prewarm_failed`]; until then their
    /// memory stays reserved.
    #[must_use = "each returned sandbox must be started and reported ready or failed"]
    pub fn prewarm(
        &mut self,
        now: Micros,
        function: &str,
        memory_mb: u64,
        count: u32,
    ) -> (Vec<SandboxId>, u32) {
        let mut ids = Vec::new();
        let mut no_memory = 0;
        self.intern(function);
        for _ in 0..count {
            match self.pool.prewarm(now, function, memory_mb) {
                Ok(id) => ids.push(id),
                Err(_) => no_memory += 1,
            }
        }
        (ids, no_memory)
    }

    /// Starts a proactive sandbox of `function` (Atoll's allocator decided it) in the proactive
    /// pool's free room; it never evicts. The driver starts it and reports
    /// [`Self::on_sandbox_ready`] or [`Self::on_prewarm_failed`], as for [`Self::prewarm`].
    #[must_use = "the returned sandbox must be started and reported ready or failed"]
    pub fn proactive_create(
        &mut self,
        now: Micros,
        function: &str,
        memory_mb: u64,
    ) -> Result<SandboxId, ProactiveError> {
        if self.shutting_down {
            return Err(ProactiveError::ShuttingDown);
        }
        self.intern(function);
        self.pool.proactive_create(now, function, memory_mb)
    }

    /// Stops scheduling on one proactive sandbox of `function` without destroying it (see
    /// [`SandboxPool::proactive_soft_evict`]); `None` when it has none to mark.
    pub fn proactive_soft_evict(&mut self, function: &str) -> Option<SandboxId> {
        self.pool.proactive_soft_evict(function)
    }

    /// Makes a soft-evicted sandbox of `function` usable again, at no cost (queued
    /// invocations of it may start on it at once); `None` when it has none.
    pub fn proactive_unmark(&mut self, now: Micros, function: &str) -> Option<SandboxId> {
        let id = self.pool.proactive_unmark(function);
        if id.is_some() {
            self.dispatch(now);
        }
        id
    }

    /// Destroys one proactive sandbox of `function`, soft-evicted ones first (see
    /// [`SandboxPool::proactive_evict`]); its Destroy comes out of [`Self::poll_action`].
    pub fn proactive_evict(&mut self, now: Micros, function: &str) -> Option<ProactiveEvicted> {
        let evicted = self.pool.proactive_evict(now, function);
        self.absorb_pool_actions();
        evicted
    }

    /// A prewarmed sandbox is ready; `init_us` is how long it took to start (the function's
    /// cold-start cost, learned before any invocation paid it).
    pub fn on_sandbox_ready(&mut self, now: Micros, sandbox: SandboxId, init_us: Option<Micros>) {
        if let Some(init) = init_us {
            let function = self.pool.function_of(sandbox);
            if let Some(c) = function.and_then(|f| self.characteristics.get_mut(&*f)) {
                if !c.has_cold_samples() {
                    c.on_cold(init.saturating_add(c.warm_us()));
                }
            }
        }
        self.pool.on_sandbox_ready(now, sandbox);
        self.dispatch(now);
    }

    /// A generic sandbox is ready to be specialized (an invocation waiting for memory may now
    /// take it).
    pub fn on_generic_ready(&mut self, now: Micros, sandbox: SandboxId) {
        self.pool.on_generic_ready(now, sandbox);
        self.dispatch(now);
    }

    /// Which generic sandboxes `function`'s cold starts take
    /// ([`crate::pool::SandboxPool::set_generic_key`]).
    pub fn set_generic_key(&mut self, function: &str, runtime: Option<&str>, layer: Option<&str>) {
        self.pool.set_generic_key(function, runtime, layer);
    }

    /// The key of a generic sandbox ready or being made.
    pub fn generic_key_of(&self, sandbox: SandboxId) -> Option<&GenericKey> {
        self.pool.generic_key_of(sandbox)
    }

    /// A generic sandbox failed to start (the driver cleaned up what existed of it).
    pub fn on_generic_failed(&mut self, now: Micros, sandbox: SandboxId) {
        self.pool.on_generic_failed(now, sandbox);
        self.dispatch(now);
    }

    /// A prewarmed sandbox failed to start.
    pub fn on_prewarm_failed(&mut self, now: Micros, sandbox: SandboxId) {
        self.pool.on_start_failed(sandbox);
        self.dispatch(now);
    }

    /// Resizes the worker's memory budget (elastic provisioning,
    /// [`crate::provision::elastic`]): a cut evicts idle sandboxes only, never running ones
    /// ([`SandboxPool::set_memory_budget`]); room that grows lets queued invocations start.
    /// Returns the budget applied.
    pub fn set_memory_budget(&mut self, now: Micros, budget_mb: u64) -> u64 {
        let applied = self.pool.set_memory_budget(now, budget_mb);
        self.dispatch(now);
        applied
    }

    /// A load sample from the driver (normalized: load average / CPUs).
    pub fn on_load(&mut self, now: Micros, normalized: f64) {
        self.external_load = normalized;
        self.regulator.on_load(now, normalized);
        self.dispatch(now);
    }

    fn advance_load(&mut self, now: Micros) {
        if self.config.load_source == LoadSource::Simulated && now >= self.load.next_sample() {
            let running = (self.running + self.running_bypass) as usize;
            self.load.advance(now, running);
            let normalized = self.normalized_load();
            self.regulator.on_load(now, normalized);
        }
    }

    /// Timers: keep-alive expiry, policy pre-warms, the free-memory buffer, the simulated load.
    pub fn on_timeout(&mut self, now: Micros) {
        self.advance_load(now);
        self.pool.on_timeout(now);
        for (function, w) in self.warm_wait.expired(now) {
            self.warm_wait.gave_up += 1;
            self.start_waiter(now, function, w);
        }
        self.dispatch(now);
    }

    /// When [`Self::on_timeout`] next has work, if ever.
    pub fn next_timeout(&self) -> Option<Micros> {
        let pool = self.pool.next_timeout();
        let load =
            (self.config.load_source == LoadSource::Simulated).then(|| self.load.next_sample());
        [pool, load, self.warm_wait.next_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// The function was updated or deleted: its sandboxes are retired and what was learned about
    /// it is forgotten (new code, new behaviour).
    pub fn retire(&mut self, function: &str) {
        self.pool.retire(function);
        if let Some(c) = self.characteristics.get_mut(function) {
            *c = Characteristics::default();
        }
        self.absorb_pool_actions();
    }

    /// Refuses new invocations and rejects the queued ones; idle sandboxes go now, the others as
    /// their invocations end.
    pub fn shutdown(&mut self) {
        self.shutting_down = true;
        for w in self.warm_wait.drain() {
            self.actions.push_back(EngineAction::Reject {
                invocation: w.id,
                reason: Reject::ShuttingDown,
            });
        }
        self.srsf.clear();
        while let Some((seq, q)) = self.queue.pop() {
            self.queued_per_fn.remove(&q.function);
            self.actions.push_back(EngineAction::Reject {
                invocation: InvocationId(seq),
                reason: Reject::ShuttingDown,
            });
        }
        self.pool.shutdown();
        self.absorb_pool_actions();
    }

    pub fn poll_action(&mut self) -> Option<EngineAction> {
        self.actions.pop_front()
    }

    pub fn characteristics(&self, function: &str, now: Micros) -> Option<CharacteristicsReport> {
        self.characteristics.get(function).map(|c| c.report(now))
    }

    pub fn function_characteristics(&self, function: &str) -> Option<&Characteristics> {
        self.characteristics.get(function)
    }

    /// Invocations waiting in the queue (cheap, unlike [`Self::stats`], for frequent status
    /// reports such as the simulator's).
    pub fn queue_length(&self) -> usize {
        self.queue.len()
    }

    /// Invocations running now: admitted under the limit plus bypasses.
    pub fn running(&self) -> u32 {
        self.running + self.running_bypass
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats {
            queue_length: self.queue.len(),
            running: self.running,
            running_bypass: self.running_bypass,
            limit: self.regulator.limit(),
            load_avg: match self.config.load_source {
                LoadSource::Simulated => self.load.value(),
                LoadSource::External => self.external_load * self.config.cpus as f64,
            },
            normalized_load: self.normalized_load(),
            cpus: self.config.cpus,
            queued: self
                .queued_per_fn
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            pool: self.pool.stats(),
            warm_waiting: self.warm_wait.parked(),
            warm_waits_avoided: self.warm_wait.avoided,
            warm_waits_gave_up: self.warm_wait.gave_up,
        }
    }
}

/// The absolute time past which an invocation that arrived at `arrival` is dropped rather than
/// started: only for a drop-late call with a deadline.
fn late_at(arrival: Micros, deadline_us: Option<Micros>, drop_late: bool) -> Option<Micros> {
    deadline_us
        .filter(|_| drop_late)
        .map(|d| arrival.saturating_add(d))
}

/// A snapshot for status pages and status pushes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineStats {
    pub queue_length: usize,
    pub running: u32,
    pub running_bypass: u32,
    pub limit: u32,
    pub load_avg: f64,
    pub normalized_load: f64,
    pub cpus: u32,
    pub queued: HashMap<String, u32>,
    pub pool: PoolStats,
    /// Invocations waiting for a busy sandbox of their function to free.
    pub warm_waiting: usize,
    /// Cold starts avoided by waiting, and waits that ran out (and started one after all).
    pub warm_waits_avoided: u64,
    pub warm_waits_gave_up: u64,
}

mod srsf;
#[cfg(test)]
mod tests;
mod warm_wait;
