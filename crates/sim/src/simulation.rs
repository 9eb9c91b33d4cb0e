//! The discrete-event loop: a virtual clock, one event queue, N simulated workers (each the
//! real [`WorkerEngine`] plus a CPU model: processor sharing, or a time-sliced scheduler) and one
//! router in front.
//!
//! Nothing here sleeps, spawns or reads a clock; the run is a pure function of the workload and
//! the configuration, so the same inputs give the same records in the same order.

use crate::closed_loop::Clients;
use crate::config::{Routing, SimConfig};
use crate::cpu_model::CpuModel;
use crate::error::{Result, SimError};
use crate::events::{EventQueue, Kind};
use crate::record::{worker_name, End, Record, Refusal, Sink};
use crate::router::Router;
use crate::workload::{Arrival as Scheduled, Workload};
use hearth_core::autoscale::{Autoscaler, Direction, ScaleDecision};
use hearth_core::balance::{Finished, WorkerLoad};
use hearth_core::proactive::{AllocAction, Command, Outcome};
use hearth_core::provision::ElasticController;
use hearth_core::{
    Arrival, Completion, DestroyReason, EngineAction, InvocationId, Micros, Run, SandboxId,
    WorkerEngine,
};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

/// One simulated worker: the worker's own engine and a model of its CPUs.
#[derive(Debug)]
pub struct SimWorker {
    /// The same state machine the real worker drives ([`hearth_core::WorkerEngine`]).
    pub engine: WorkerEngine,
    pub cpu: CpuModel,
    /// The workload index of each invocation waiting in the engine's queue.
    waiting: HashMap<InvocationId, u32>,
    /// The pending CPU and timer events (earlier ones are stale and skipped).
    cpu_event_at: Option<Micros>,
    timer_at: Option<Micros>,
    /// Elastic provisioning: the controller resizing this worker's memory budget.
    pub elastic: Option<ElasticController>,
    /// Where it is in the autoscaled cluster's life (always `Active` in a fixed cluster).
    pub phase: Phase,
    /// Sandboxes being created (cold starts in their init, pre-warms, generic and proactive
    /// sandboxes) and the CPUs each demands: under the contention server they slow each other
    /// and take CPU. Tracked under contention only.
    creating: HashMap<Creation, f64>,
}

/// A simulated worker's membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Added by the autoscaler, not up yet: gets no work.
    Starting,
    /// In the balancer.
    Active,
    /// Drained by the autoscaler: out of the balancer, finishing what it has.
    Draining,
    /// Drained and idle: gone.
    Gone,
}

/// One action of the simulated cluster's autoscaler.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleEvent {
    /// When it was decided (µs); added workers join `start_us` later.
    pub at_us: Micros,
    pub decision: ScaleDecision,
    /// The simulated workers it added or drained.
    pub workers: Vec<u32>,
}

impl SimWorker {
    fn new(
        config: &SimConfig,
        names: &Arc<[Arc<str>]>,
        layers: &[(Arc<str>, Arc<str>)],
        phase: Phase,
    ) -> Result<Self> {
        let mut engine = WorkerEngine::new(config.engine());
        // Functions of a layer take the pre-imported generic sandboxes of its key only.
        for (function, layer) in layers {
            engine.set_generic_key(function, None, Some(layer));
        }
        let elastic = match &config.elastic {
            Some(e) => {
                let c =
                    ElasticController::new(e.config.clone(), e.curve.clone(), config.memory_mb, 0)
                        .map_err(|err| SimError::Config(format!("elastic provisioning: {err}")))?;
                engine.set_memory_budget(0, c.size_mb());
                Some(c)
            }
            None => None,
        };
        Ok(SimWorker {
            engine,
            cpu: match config.server.contention() {
                Some(c) => CpuModel::contention(config.cpus, c),
                None => CpuModel::new(&config.cpu, config.cpus, names)?,
            },
            creating: HashMap::new(),
            waiting: HashMap::new(),
            cpu_event_at: None,
            timer_at: None,
            elastic,
            phase,
        })
    }
}

/// A sandbox being created: a cold start's (by its job) or a sandbox made ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Creation {
    Job(u32),
    Sandbox(SandboxId),
}

/// An invocation between its start and its end.
#[derive(Debug)]
struct Job {
    id: u32,
    worker: u32,
    run: Run,
    init_us: Micros,
    /// When it started executing (after its init delay).
    cpu_from: Micros,
}

/// Jobs by a small integer id, reused when freed.
#[derive(Debug, Default)]
struct Jobs {
    slots: Vec<Option<Job>>,
    free: Vec<u32>,
    live: usize,
}

impl Jobs {
    fn insert(&mut self, job: Job) -> u32 {
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(job);
                i
            }
            None => {
                self.slots.push(Some(job));
                (self.slots.len() - 1) as u32
            }
        }
    }

    fn get(&self, i: u32) -> Option<&Job> {
        self.slots.get(i as usize).and_then(Option::as_ref)
    }

    fn remove(&mut self, i: u32) -> Option<Job> {
        let job = self.slots.get_mut(i as usize)?.take()?;
        self.free.push(i);
        self.live -= 1;
        Some(job)
    }
}

/// Totals of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimStats {
    pub invocations: u64,
    pub completed: u64,
    pub dropped: u64,
    /// Killed at their function's timeout (neither completed nor dropped).
    pub timed_out: u64,
    pub cold: u64,
    /// Idle sandboxes evicted for memory, all workers together.
    pub evicted: u64,
    /// Virtual time when the last invocation ended (µs).
    pub end_us: Micros,
    /// Events processed, arrivals included.
    pub events: u64,
    /// Atoll: proactive sandboxes created on the workers, and creations they refused (pool
    /// full: memory of evicted busy sandboxes not yet freed).
    pub proactive_created: u64,
    pub proactive_refused: u64,
    /// Atoll: commands the worker had nothing to apply to (un-mark, soft or hard eviction of a
    /// sandbox it does not hold); reported to Atoll as lost sandboxes where it counts one.
    pub proactive_mismatched: u64,
    /// Atoll's own counters (routing, scaling, the allocator's actions) at the end.
    pub atoll: Option<hearth_core::proactive::AtollStats>,
    /// Time-sliced CPU models, all workers together: context switches (a job put on a CPU that
    /// last ran another), preemptions, and demotions from a priority slice to fair sharing.
    /// Zero under processor sharing, which has none.
    pub context_switches: u64,
    pub preemptions: u64,
    pub demotions: u64,
    /// Elastic provisioning: every budget a worker took, as (time, worker, MiB), its initial
    /// one at time 0 first.
    pub budgets: Vec<(Micros, u32, u64)>,
    /// The autoscaler's actions, in order (empty in a fixed cluster).
    pub scaling: Vec<ScaleEvent>,
    /// Most workers active at once.
    pub peak_workers: usize,
}

/// A simulation in progress.
pub struct Simulation<'a> {
    workload: &'a Workload,
    config: SimConfig,
    workers: Vec<SimWorker>,
    router: Router,
    events: EventQueue,
    jobs: Jobs,
    /// Function index by name, for the engine's pre-warm actions.
    by_name: HashMap<Arc<str>, u32>,
    next_arrival: usize,
    /// Every invocation so far, by id: the workload's arrivals, or those closed-loop clients
    /// issued (appended as they invoke, so still in time order).
    arrivals: Cow<'a, [Scheduled]>,
    /// Closed-loop clients, if they drive the run, and their `Issue`/`Clients` events queued.
    clients: Option<Clients>,
    pending_issues: usize,
    /// Invocations arrived and not yet ended.
    outstanding: usize,
    /// Policy pre-warms still starting.
    starting: usize,
    now: Micros,
    stats: SimStats,
    sink: &'a mut dyn Sink,
    autoscaler: Option<Autoscaler>,
    /// Function names, shared by every worker's CPU model.
    names: Arc<[Arc<str>]>,
    /// (function, layer) of the functions with a dependency layer, said to every worker's
    /// engine.
    layers: Arc<[(Arc<str>, Arc<str>)]>,
    /// A pre-imported generic sandbox's import, per layer: the longest `import_us` of the
    /// layer's functions (their imports are the layer's modules).
    layer_import_us: HashMap<Arc<str>, Micros>,
}

/// Runs `workload` on the cluster `config` describes, reporting to `sink`.
pub fn simulate(workload: &Workload, config: &SimConfig, sink: &mut dyn Sink) -> Result<SimStats> {
    Simulation::new(workload, config.clone(), sink)?.run()
}

impl<'a> Simulation<'a> {
    pub fn new(workload: &'a Workload, config: SimConfig, sink: &'a mut dyn Sink) -> Result<Self> {
        config.check()?;
        let router = match &config.routing {
            Routing::Atoll(a) => Router::new_atoll(
                a,
                config.workers,
                config.cpus,
                config.proactive_mb(),
                workload,
            )?,
            other => Router::new(other, config.workers, worker_name, workload)?,
        };
        let names: Arc<[Arc<str>]> = workload.functions.iter().map(|f| f.name.clone()).collect();
        let layers: Arc<[(Arc<str>, Arc<str>)]> = workload
            .functions
            .iter()
            .filter_map(|f| Some((f.name.clone(), f.layer.clone()?)))
            .collect();
        let mut layer_import_us: HashMap<Arc<str>, Micros> = HashMap::new();
        for f in &workload.functions {
            if f.import_us > f.init_us {
                return Err(SimError::Config(format!(
                    "function {}: import_us {} exceeds its init_us {} (the import is part of it)",
                    f.name, f.import_us, f.init_us
                )));
            }
            if let Some(l) = &f.layer {
                let e = layer_import_us.entry(l.clone()).or_insert(0);
                *e = (*e).max(f.import_us);
            }
        }
        let workers = (0..config.workers)
            .map(|_| SimWorker::new(&config, &names, &layers, Phase::Active))
            .collect::<Result<Vec<_>>>()?;
        if config.elastic.is_some() && config.autoscale.is_some() {
            return Err(SimError::Config(
                "elastic provisioning and autoscaling cannot be combined (a worker added during \
                 the run has no elastic controller)"
                    .into(),
            ));
        }
        let autoscaler = match &config.autoscale {
            Some(a) => Some(
                Autoscaler::new(a.params.clone()).map_err(|e| SimError::Config(e.to_string()))?,
            ),
            None => None,
        };
        let mut events = EventQueue::default();
        let mut budgets = Vec::new();
        for (w, worker) in workers.iter().enumerate() {
            if let Some(c) = &worker.elastic {
                events.push(c.next_timeout(), Kind::Resize { worker: w as u32 });
                budgets.push((0, w as u32, worker.engine.pool().config().memory_budget_mb));
            }
        }
        // Pushes are spread over the interval, as independent workers' would be.
        let n = config.workers as u64;
        for w in 0..config.workers {
            let offset = config.status_interval_us * w as u64 / n;
            events.push(offset, Kind::Status { worker: w as u32 });
        }
        if let Some(a) = router.atoll() {
            events.push(a.next_tick(), Kind::AtollTick);
        }
        if let Some(a) = &config.autoscale {
            events.push(a.interval_us, Kind::Autoscale);
        }
        let clients = match &config.clients {
            Some(_) if !workload.arrivals.is_empty() => {
                return Err(SimError::Config(
                    "a closed loop issues its own invocations: the workload must have no arrivals"
                        .into(),
                ));
            }
            Some(c) => Some(Clients::new(c.clone(), workload.functions.len())?),
            None => None,
        };
        let mut pending_issues = 0;
        if let Some(c) = &clients {
            for (at, step) in c.steps() {
                events.push(at, Kind::Clients { step: step as u32 });
                pending_issues += 1;
            }
        }
        let by_name = workload
            .functions
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.clone(), i as u32))
            .collect();
        let mut sim = Simulation {
            workload,
            config,
            workers,
            router,
            events,
            jobs: Jobs::default(),
            by_name,
            next_arrival: 0,
            arrivals: Cow::Borrowed(&workload.arrivals),
            clients,
            pending_issues,
            outstanding: 0,
            starting: 0,
            now: 0,
            stats: SimStats {
                budgets,
                peak_workers: n as usize,
                ..SimStats::default()
            },
            sink,
            autoscaler,
            names,
            layers,
            layer_import_us,
        };
        for w in 0..sim.workers.len() {
            sim.prewarm(w)?;
        }
        Ok(sim)
    }

    /// Starts the functions' pre-warmed sandboxes; they are ready when the trace begins.
    fn prewarm(&mut self, w: usize) -> Result<()> {
        for f in self.workload.functions.iter().filter(|f| f.prewarm > 0) {
            let engine = &mut self.workers[w].engine;
            let (ids, _no_memory) = engine.prewarm(0, &f.name, f.memory_mb, f.prewarm);
            for id in ids {
                engine.on_sandbox_ready(0, id, Some(f.init_us));
            }
        }
        self.after_engine(w)
    }

    /// The simulated workers (their engines hold the pools, queues and learned state).
    pub fn workers(&self) -> &[SimWorker] {
        &self.workers
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Runs until every invocation of the workload has ended.
    pub fn run(mut self) -> Result<SimStats> {
        self.run_to_end()
    }

    fn run_to_end(&mut self) -> Result<SimStats> {
        let arrivals = self.workload.arrivals.len();
        loop {
            let next = self.workload.arrivals.get(self.next_arrival);
            // No invocation is still to come: the trace is done and no client will invoke.
            let issued_all = self.next_arrival == arrivals && self.pending_issues == 0;
            // Arrivals go after every queued event of the same instant.
            let take_arrival = match (next, self.events.peek()) {
                (Some(a), Some((t, _))) => a.at_us < t,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if take_arrival {
                self.arrive()?;
                continue;
            }
            if issued_all && self.outstanding == 0 {
                break;
            }
            if issued_all && self.jobs.live == 0 && self.starting == 0 {
                // Nothing runs or starts, yet invocations wait: nothing could ever end them.
                return Err(SimError::Stalled {
                    at_s: self.now as f64 / 1e6,
                    outstanding: self.outstanding,
                });
            }
            let Some((t, kind)) = self.events.pop() else {
                return Err(SimError::Stalled {
                    at_s: self.now as f64 / 1e6,
                    outstanding: self.outstanding,
                });
            };
            self.now = t;
            self.stats.events += 1;
            match kind {
                Kind::Cpu { worker } => self.on_cpu(worker as usize)?,
                Kind::Timeout { job, id } => self.on_exec_timeout(job, id)?,
                Kind::InitDone { job } => self.on_init_done(job)?,
                Kind::SandboxReady {
                    worker,
                    sandbox,
                    generic,
                } => self.on_ready(worker as usize, sandbox, generic)?,
                Kind::ProactiveReady {
                    worker,
                    sandbox,
                    function,
                } => self.on_proactive_ready(worker as usize, sandbox, function)?,
                Kind::Timer { worker } => self.on_timer(worker as usize)?,
                Kind::AtollTick => self.on_atoll_tick()?,
                Kind::Resize { worker } => self.on_resize(worker as usize)?,
                Kind::Autoscale => self.on_autoscale()?,
                Kind::WorkerUp { worker } => self.on_worker_up(worker as usize)?,
                Kind::Status { worker } => self.on_status(worker as usize),
                Kind::Issue { client } => self.on_issue(client)?,
                Kind::Clients { step } => self.on_clients(step),
            }
        }
        self.stats.invocations = self.arrivals.len() as u64;
        self.stats.atoll = self.router.atoll().map(|a| *a.stats());
        for w in &self.workers {
            let c = w.cpu.stats();
            self.stats.context_switches += c.switches;
            self.stats.preemptions += c.preemptions;
            self.stats.demotions += c.demotions;
        }
        Ok(self.stats.clone())
    }

    /// The workload's next (open-loop) arrival.
    fn arrive(&mut self) -> Result<()> {
        let id = self.next_arrival as u32;
        let a = self.workload.arrivals[self.next_arrival];
        self.next_arrival += 1;
        self.now = a.at_us;
        self.stats.events += 1;
        self.invoke(id, a)
    }

    /// The closed loop's client count changes: the idle clients it adds invoke now.
    fn on_clients(&mut self, step: u32) {
        self.pending_issues -= 1;
        let Some(c) = self.clients.as_mut() else {
            return;
        };
        for client in c.start(step as usize) {
            self.events.push(self.now, Kind::Issue { client });
            self.pending_issues += 1;
        }
    }

    /// A closed-loop client's turn: it invokes, unless the span is over or the schedule no
    /// longer runs it.
    fn on_issue(&mut self, client: u32) -> Result<()> {
        self.pending_issues -= 1;
        let now = self.now;
        let id = u32::try_from(self.arrivals.len())
            .map_err(|_| SimError::Config("a closed loop of over 4 billion invocations".into()))?;
        let Some(c) = self.clients.as_mut() else {
            return Ok(());
        };
        if !c.may_invoke(client, now) {
            return Ok(());
        }
        let function = c.pick(client, id, now);
        let a = Scheduled {
            at_us: now,
            function,
        };
        self.arrivals.to_mut().push(a);
        self.invoke(id, a)
    }

    /// Invocation `id` arrives now: routed, then handed to its worker's engine.
    fn invoke(&mut self, id: u32, a: Scheduled) -> Result<()> {
        self.outstanding += 1;
        let f = self.workload.function(a.function);
        let engines = self.workers.iter().map(|w| &w.engine);
        let w = match self.router.route(self.now, f, engines) {
            Ok(w) => w,
            Err(r) => return self.refuse(id, None, Refusal::Balancer(r)),
        };
        if let Some(c) = &mut self.workers[w].elastic {
            c.on_arrival(&f.name, f.memory_mb);
        }
        let inv = self.workers[w].engine.on_invocation(
            self.now,
            Arrival {
                function: &f.name,
                memory_mb: f.memory_mb,
                deadline_us: f.deadline_us,
                drop_late: false,
            },
        );
        self.carry_out(w, Some((inv, id)))
    }

    /// Carries out the engine's actions, then re-arms its timer.
    fn after_engine(&mut self, w: usize) -> Result<()> {
        self.carry_out(w, None)
    }

    /// Carries out the engine's actions after an event; `arriving` is the invocation that event
    /// brought, if any: its Run or Reject is among them, or it was queued.
    fn carry_out(&mut self, w: usize, mut arriving: Option<(InvocationId, u32)>) -> Result<()> {
        while let Some(action) = self.workers[w].engine.poll_action() {
            match action {
                EngineAction::Run(run) => {
                    let id = self.ended_wait(w, &mut arriving, run.invocation)?;
                    self.start(w, id, run);
                }
                EngineAction::Reject { invocation, reason } => {
                    let id = self.ended_wait(w, &mut arriving, invocation)?;
                    self.refuse(id, Some(w), Refusal::Worker(reason))?;
                }
                // Memory is the engine's to account; a destroyed sandbox costs nothing here but
                // its count.
                EngineAction::Destroy { reason, .. } => {
                    if reason == DestroyReason::Evicted {
                        self.stats.evicted += 1;
                    }
                }
                EngineAction::Prewarm { sandbox, function } => {
                    let f = self.by_name.get(&function).copied().ok_or_else(|| {
                        SimError::Internal(format!("pre-warm of unknown function {function}"))
                    })?;
                    let took = self.workload.function(f).init_us;
                    self.start_sandbox(w, sandbox, took, false);
                }
                EngineAction::CreateGeneric { sandbox, key, .. } => {
                    // A pre-imported one imports its layer's modules before it is ready.
                    let import = key
                        .layer
                        .as_ref()
                        .and_then(|l| self.layer_import_us.get(l))
                        .copied()
                        .unwrap_or(0);
                    let took = self.config.generic_create_us.saturating_add(import);
                    self.start_sandbox(w, sandbox, took, true);
                }
            }
        }
        if let Some((inv, id)) = arriving {
            self.workers[w].waiting.insert(inv, id);
        }
        self.schedule_timer(w);
        Ok(())
    }

    /// The workload index of an invocation the engine just started or refused: the arriving one
    /// (never queued, so not in `waiting`), or a queued one.
    fn ended_wait(
        &mut self,
        w: usize,
        arriving: &mut Option<(InvocationId, u32)>,
        inv: InvocationId,
    ) -> Result<u32> {
        match *arriving {
            Some((a, id)) if a == inv => {
                *arriving = None;
                Ok(id)
            }
            _ => self.unqueue(w, inv),
        }
    }

    fn unqueue(&mut self, w: usize, inv: InvocationId) -> Result<u32> {
        self.workers[w].waiting.remove(&inv).ok_or_else(|| {
            SimError::Internal(format!("worker {w} dispatched unknown invocation {inv:?}"))
        })
    }

    /// An invocation starts on its sandbox: after the init delay if cold.
    fn start(&mut self, w: usize, id: u32, run: Run) {
        if run.cold.is_some() {
            if let Some(c) = &mut self.workers[w].elastic {
                c.on_cold_start();
            }
        }
        let f = self.workload.function(self.arrivals[id as usize].function);
        // A generic sandbox has the sandbox made already: only the rest of the init is left;
        // one of the function's layer (the pool hands out its own key's only) has the
        // dependencies imported too: only the specialization is left.
        let init_us = match (run.cold, run.generic) {
            (None, _) => 0,
            (Some(_), None) => f.init_us,
            (Some(_), Some(_)) => {
                let rest = f.init_us.saturating_sub(self.config.generic_create_us);
                if f.layer.is_some() {
                    rest.saturating_sub(f.import_us)
                } else {
                    rest
                }
            }
        };
        let job = self.jobs.insert(Job {
            id,
            worker: w as u32,
            run,
            init_us,
            cpu_from: 0,
        });
        if init_us > 0 {
            let init_us = self.creation_starts(w, Creation::Job(job), init_us);
            if let Some(j) = self
                .jobs
                .slots
                .get_mut(job as usize)
                .and_then(Option::as_mut)
            {
                j.init_us = init_us;
            }
            self.events.push(self.now + init_us, Kind::InitDone { job });
        } else {
            self.execute(job);
        }
    }

    fn execute(&mut self, job: u32) {
        let Some(j) = self
            .jobs
            .slots
            .get_mut(job as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        j.cpu_from = self.now;
        let (w, id) = (j.worker as usize, j.id);
        let function = self.arrivals[id as usize].function;
        let f = self.workload.function(function);
        let (work, timeout) = (self.config.work_us(id, f.warm_us), f.timeout_us);
        self.workers[w].cpu.enter(self.now, job, work, function);
        // Functions without a timeout pay nothing; with one, one event that is stale (skipped) if
        // the execution ends in time.
        if let Some(t) = timeout {
            self.events.push(self.now + t, Kind::Timeout { job, id });
        }
        self.schedule_cpu(w);
    }

    fn schedule_cpu(&mut self, w: usize) {
        let worker = &mut self.workers[w];
        match worker.cpu.next_finish() {
            Some(t) if worker.cpu_event_at != Some(t) => {
                worker.cpu_event_at = Some(t);
                self.events.push(t, Kind::Cpu { worker: w as u32 });
            }
            Some(_) => {}
            None => worker.cpu_event_at = None,
        }
    }

    fn schedule_timer(&mut self, w: usize) {
        let worker = &mut self.workers[w];
        if let Some(t) = worker.engine.next_timeout() {
            let t = t.max(self.now);
            if worker.timer_at != Some(t) {
                worker.timer_at = Some(t);
                self.events.push(t, Kind::Timer { worker: w as u32 });
            }
        }
    }

    fn on_cpu(&mut self, w: usize) -> Result<()> {
        if self.workers[w].cpu_event_at != Some(self.now) {
            return Ok(());
        }
        self.workers[w].cpu_event_at = None;
        while let Some(job) = self.workers[w].cpu.pop_finished(self.now) {
            self.complete(job)?;
        }
        self.schedule_cpu(w);
        Ok(())
    }

    fn on_init_done(&mut self, job: u32) -> Result<()> {
        let Some(j) = self.jobs.get(job) else {
            return Err(SimError::Internal(format!("init of unknown job {job}")));
        };
        self.creation_ends(j.worker as usize, Creation::Job(job));
        self.execute(job);
        Ok(())
    }

    fn complete(&mut self, job: u32) -> Result<()> {
        let j = self
            .jobs
            .remove(job)
            .ok_or_else(|| SimError::Internal(format!("completion of unknown job {job}")))?;
        let w = j.worker as usize;
        let arrival = self.arrivals[j.id as usize];
        let f = self.workload.function(arrival.function);
        let exec_us = self.now - j.cpu_from;
        let cold = j.run.cold;
        self.workers[w].engine.on_completed(
            self.now,
            &j.run,
            Completion {
                exec_us: Some(exec_us),
                init_us: cold.map(|_| j.init_us),
                reusable: true,
            },
        );
        // The balancer learns running times (CH-RLU's c and w), never the queue wait.
        let how = if cold.is_some() {
            Finished::Cold {
                init_us: j.init_us,
                exec_us,
            }
        } else {
            Finished::Warm { exec_us }
        };
        let outcome = Outcome {
            queue_us: j.run.queued_us,
            init_us: cold.map(|_| j.init_us),
            exec_us: Some(exec_us),
        };
        self.router.finished(self.now, w, f, how, outcome);
        self.stats.completed += 1;
        self.stats.cold += u64::from(cold.is_some());
        self.end(Record {
            id: j.id,
            function: arrival.function,
            worker: Some(j.worker),
            scheduled_us: arrival.at_us,
            end_us: self.now,
            end: End::Done {
                cold,
                queue_us: j.run.queued_us,
                init_us: j.init_us,
                exec_us,
            },
        })?;
        self.after_engine(w)
    }

    /// An execution reached its function's timeout, as the worker's `tokio::time::timeout`
    /// around the handler: the invocation ends in a 504, its sandbox is destroyed, never reused.
    fn on_exec_timeout(&mut self, job: u32, id: u32) -> Result<()> {
        // Stale if the job ended in time (its slot may hold another invocation by now).
        if self.jobs.get(job).map(|j| j.id) != Some(id) {
            return Ok(());
        }
        let j = self
            .jobs
            .remove(job)
            .ok_or_else(|| SimError::Internal(format!("timeout of unknown job {job}")))?;
        let w = j.worker as usize;
        if !self.workers[w].cpu.remove(self.now, job) {
            return Err(SimError::Internal(format!(
                "timed-out job {job} not executing"
            )));
        }
        self.schedule_cpu(w);
        let arrival = self.arrivals[id as usize];
        let f = self.workload.function(arrival.function);
        let cold = j.run.cold;
        let proactive = self.workers[w].engine.pool().is_proactive(j.run.sandbox) == Some(true);
        self.workers[w].engine.on_completed(
            self.now,
            &j.run,
            Completion {
                exec_us: None,
                init_us: cold.map(|_| j.init_us),
                reusable: false,
            },
        );
        let outcome = Outcome {
            queue_us: j.run.queued_us,
            init_us: cold.map(|_| j.init_us),
            exec_us: None,
        };
        self.router
            .finished(self.now, w, f, Finished::Failed, outcome);
        if proactive {
            // Its proactive sandbox is destroyed with it, never reused.
            if let Some(a) = self.router.atoll_mut() {
                a.on_lost(w as u32, &f.name);
            }
        }
        self.stats.timed_out += 1;
        self.end(Record {
            id,
            function: arrival.function,
            worker: Some(j.worker),
            scheduled_us: arrival.at_us,
            end_us: self.now,
            end: End::TimedOut {
                cold,
                queue_us: j.run.queued_us,
                init_us: j.init_us,
                exec_us: self.now - j.cpu_from,
            },
        })?;
        self.after_engine(w)
    }

    fn refuse(&mut self, id: u32, w: Option<usize>, why: Refusal) -> Result<()> {
        let arrival = self.arrivals[id as usize];
        if let Some(w) = w {
            let f = self.workload.function(arrival.function);
            self.router
                .finished(self.now, w, f, Finished::Failed, Outcome::default());
        }
        self.stats.dropped += 1;
        self.end(Record {
            id,
            function: arrival.function,
            worker: w.map(|w| w as u32),
            scheduled_us: arrival.at_us,
            end_us: self.now,
            end: End::Dropped(why),
        })
    }

    fn end(&mut self, r: Record) -> Result<()> {
        self.outstanding -= 1;
        self.stats.end_us = self.stats.end_us.max(r.end_us);
        if let Some(c) = self.clients.as_mut() {
            // Its client thinks, then invokes again.
            if let Some((client, at)) = c.ended(r.id, r.scheduled_us, self.now) {
                self.events.push(at, Kind::Issue { client });
                self.pending_issues += 1;
            }
        }
        self.sink.record(&r)
    }

    /// Under the contention server, a creation of `took` µs starts on worker `w` now: it takes
    /// longer for the creations already in flight, and takes CPU from the running jobs until
    /// [`Self::creation_ends`]. Returns how long it takes (`took` unchanged otherwise).
    fn creation_starts(&mut self, w: usize, what: Creation, took: Micros) -> Micros {
        let Some(c) = self.config.server.contention() else {
            return took;
        };
        let worker = &mut self.workers[w];
        let others = u32::try_from(worker.creating.len()).unwrap_or(u32::MAX);
        let stretched = c.init_us(took, others);
        worker.creating.insert(what, c.creation_demand(took));
        let demand = worker.creating.values().sum();
        worker.cpu.set_creations(self.now, demand);
        self.schedule_cpu(w);
        stretched
    }

    /// A creation [`Self::creation_starts`] counted is done.
    fn creation_ends(&mut self, w: usize, what: Creation) {
        if self.config.server.contention().is_none() {
            return;
        }
        let worker = &mut self.workers[w];
        worker.creating.remove(&what);
        // Summed afresh, so no float error accumulates over a run.
        let demand = worker.creating.values().sum();
        worker.cpu.set_creations(self.now, demand);
        self.schedule_cpu(w);
    }

    /// A sandbox (a pre-warm, or a generic one) starts now and is ready after `took`.
    fn start_sandbox(&mut self, w: usize, sandbox: SandboxId, took: Micros, generic: bool) {
        let took = self.creation_starts(w, Creation::Sandbox(sandbox), took);
        self.starting += 1;
        let ready = Kind::SandboxReady {
            worker: w as u32,
            sandbox,
            generic,
        };
        self.events.push(self.now + took, ready);
    }

    fn on_ready(&mut self, w: usize, sandbox: SandboxId, generic: bool) -> Result<()> {
        self.starting -= 1;
        self.creation_ends(w, Creation::Sandbox(sandbox));
        let engine = &mut self.workers[w].engine;
        if generic {
            engine.on_generic_ready(self.now, sandbox);
        } else {
            engine.on_sandbox_ready(self.now, sandbox, None);
        }
        self.after_engine(w)
    }

    /// A proactive sandbox finished its set-up: the worker may run on it, and Atoll counts it
    /// usable (or, evicted meanwhile, the engine destroys it now).
    fn on_proactive_ready(&mut self, w: usize, sandbox: SandboxId, function: u32) -> Result<()> {
        self.starting -= 1;
        self.creation_ends(w, Creation::Sandbox(sandbox));
        let f = self.workload.function(function);
        self.workers[w]
            .engine
            .on_sandbox_ready(self.now, sandbox, Some(f.init_us));
        if let Some(a) = self.router.atoll_mut() {
            a.on_ready(w as u32, &f.name);
        }
        self.after_engine(w)
    }

    /// Atoll's periodic tick: its commands are carried out on the workers, in order; a
    /// creation the worker refuses is reported back at once.
    fn on_atoll_tick(&mut self) -> Result<()> {
        let Some(a) = self.router.atoll_mut() else {
            return Ok(());
        };
        let commands = a.tick(self.now);
        let next = a.next_tick();
        let mut touched = Vec::new();
        for c in commands {
            let w = c.worker as usize;
            if w >= self.workers.len() {
                return Err(SimError::Internal(format!(
                    "atoll addressed unknown worker {w}"
                )));
            }
            self.command(w, c)?;
            if !touched.contains(&w) {
                touched.push(w);
            }
        }
        for w in touched {
            self.after_engine(w)?;
        }
        self.events.push(next.max(self.now + 1), Kind::AtollTick);
        Ok(())
    }

    fn command(&mut self, w: usize, c: Command) -> Result<()> {
        let now = self.now;
        let engine = &mut self.workers[w].engine;
        let (function, lost) = match &c.action {
            AllocAction::Create { function, .. } => {
                match engine.proactive_create(now, function, c.memory_mb) {
                    Ok(sandbox) => {
                        let f = self.by_name.get(function).copied().ok_or_else(|| {
                            SimError::Internal(format!("atoll created unknown function {function}"))
                        })?;
                        let took = self.workload.function(f).init_us;
                        let took = self.creation_starts(w, Creation::Sandbox(sandbox), took);
                        self.starting += 1;
                        self.stats.proactive_created += 1;
                        let ready = Kind::ProactiveReady {
                            worker: w as u32,
                            sandbox,
                            function: f,
                        };
                        self.events.push(now + took, ready);
                    }
                    Err(_) => {
                        self.stats.proactive_refused += 1;
                        if let Some(a) = self.router.atoll_mut() {
                            a.on_create_failed(w as u32, function);
                        }
                    }
                }
                return Ok(());
            }
            AllocAction::Unmark { function, .. } => {
                (function, engine.proactive_unmark(now, function).is_none())
            }
            AllocAction::SoftEvict { function, .. } => {
                (function, engine.proactive_soft_evict(function).is_none())
            }
            AllocAction::Evict { function, .. } => {
                (function, engine.proactive_evict(now, function).is_none())
            }
            AllocAction::Skipped { .. } => return Ok(()),
        };
        if lost {
            // Atoll counts a sandbox the worker does not hold: it forgets one.
            self.stats.proactive_mismatched += 1;
            if let Some(a) = self.router.atoll_mut() {
                a.on_lost(w as u32, function);
            }
        }
        Ok(())
    }

    fn on_timer(&mut self, w: usize) -> Result<()> {
        if self.workers[w].timer_at != Some(self.now) {
            return Ok(());
        }
        self.workers[w].timer_at = None;
        self.workers[w].engine.on_timeout(self.now);
        self.after_engine(w)
    }

    /// The worker's elastic controller closes an interval; a new size goes to its engine (a
    /// cut evicts idle sandboxes only).
    fn on_resize(&mut self, w: usize) -> Result<()> {
        let now = self.now;
        let worker = &mut self.workers[w];
        let Some(c) = worker.elastic.as_mut() else {
            return Ok(());
        };
        let decision = c.on_timeout(now);
        self.events
            .push(c.next_timeout(), Kind::Resize { worker: w as u32 });
        if let Some(d) = decision {
            let applied = worker.engine.set_memory_budget(now, d.to_mb);
            self.stats.budgets.push((now, w as u32, applied));
        }
        self.after_engine(w)
    }

    /// The autoscaler's periodic look at the active workers' reported loads; its decision is
    /// carried out at once: added workers start (and join `start_us` later), drained ones
    /// leave the balancer and finish their work.
    fn on_autoscale(&mut self) -> Result<()> {
        let (Some(a), Some(setup)) = (self.autoscaler.as_mut(), self.config.autoscale.as_ref())
        else {
            return Ok(());
        };
        let samples = self.router.active_loads();
        let next = self.now + setup.interval_us;
        let start_us = setup.start_us;
        if let Some(d) = a.observe(self.now, &samples) {
            let mut touched = Vec::new();
            match d.direction {
                Direction::Out => {
                    for _ in 0..d.count {
                        let w = self.workers.len();
                        let worker = SimWorker::new(
                            &self.config,
                            &self.names,
                            &self.layers,
                            Phase::Starting,
                        )?;
                        self.workers.push(worker);
                        self.events
                            .push(self.now + start_us, Kind::WorkerUp { worker: w as u32 });
                        touched.push(w as u32);
                    }
                }
                Direction::In => {
                    for &w in &d.remove {
                        let Some(worker) = self.workers.get_mut(w as usize) else {
                            continue;
                        };
                        if worker.phase == Phase::Active {
                            worker.phase = Phase::Draining;
                            self.router.drain_worker(self.now, w as usize);
                            touched.push(w);
                        }
                    }
                }
            }
            self.sink.scaled(self.now, &d, &touched);
            self.stats.scaling.push(ScaleEvent {
                at_us: self.now,
                decision: d,
                workers: touched,
            });
        }
        self.events.push(next, Kind::Autoscale);
        Ok(())
    }

    /// A worker the autoscaler added is up: it joins the balancer and starts pushing status.
    fn on_worker_up(&mut self, w: usize) -> Result<()> {
        self.router
            .add_worker(self.now, w, &worker_name(w as u32))?;
        self.workers[w].phase = Phase::Active;
        let active = self
            .workers
            .iter()
            .filter(|x| x.phase == Phase::Active)
            .count();
        self.stats.peak_workers = self.stats.peak_workers.max(active);
        self.events
            .push(self.now, Kind::Status { worker: w as u32 });
        Ok(())
    }

    /// The worker's status push, built as the real worker builds it from its status.
    fn on_status(&mut self, w: usize) {
        if self.workers[w].phase == Phase::Draining
            && self.workers[w].engine.running() == 0
            && self.workers[w].engine.queue_length() == 0
        {
            // Drained and idle: it is gone, and pushes no more.
            self.workers[w].phase = Phase::Gone;
            return;
        }
        let e = &self.workers[w].engine;
        let load = WorkerLoad {
            // The sandbox memory budget (as resized, if elastic), as the worker's status
            // reports it.
            memory_mb: e.pool().config().memory_budget_mb,
            ..WorkerLoad::of_worker(
                e.normalized_load(),
                e.queue_length() as u32,
                e.running(),
                f64::from(e.config().cpus),
                e.pool().free_mb(),
            )
        };
        self.router.report(self.now, w, load);
        self.sink.status(self.now, w as u32, &load);
        let next = self.now + self.config.status_interval_us;
        self.events.push(next, Kind::Status { worker: w as u32 });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Collect;
    use crate::workload::{Arrival as At, SimFunction};
    use hearth_core::balance::BalanceKind;
    use hearth_core::time::ms;
    use hearth_core::RegulatorConfig;

    /// `n` calls of `f` arriving 1 µs apart from time 0.
    fn at_once(f: SimFunction, n: u64) -> Workload {
        Workload {
            functions: vec![f],
            arrivals: (0..n)
                .map(|i| At {
                    at_us: i,
                    function: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn the_balancer_learns_running_times_not_queue_waits() {
        // One worker that runs one invocation at a time; 40 calls of a 100 ms function with
        // 300 ms of init arrive at once, so all but the first wait in the queue (up to 4 s).
        let f = SimFunction::new("f", ms(100), ms(300), 128);
        let key = f.key;
        let workload = at_once(f, 40);
        let config = SimConfig {
            workers: 1,
            cpus: 1,
            regulator: RegulatorConfig::Fixed(1),
            routing: Routing::seeded(BalanceKind::ChRlu, 1),
            ..SimConfig::default()
        };
        let mut sink = Collect::default();
        let mut sim = Simulation::new(&workload, config, &mut sink).unwrap();
        let stats = sim.run_to_end().unwrap();
        assert_eq!((stats.completed, stats.cold), (40, 1));
        let learned = sim.router().balancer().unwrap().function(key).unwrap();
        // c = init + exec = 400 ms, w = exec = 100 ms: the declared ratio of 4 holds. From
        // end-to-end times (queue waits of up to 4 s in w) it would have fallen to 1.
        let (c, w) = (
            learned.cold_us.get().unwrap(),
            learned.warm_us.get().unwrap(),
        );
        assert!((w - 100_000.0).abs() < 1.0, "warm {w}");
        assert!((c - 400_000.0).abs() < 1.0, "cold {c}");
        assert!((learned.cold_warm_ratio() - 4.0).abs() < 1e-6);
    }

    /// 12 calls at once of a 100 ms function with a 65 ms init on one 2-CPU worker with no
    /// concurrency limit (bench/contention.sh's concurrent creations): the end time and each
    /// call's init under `server`.
    fn twelve_cold_starts(server: crate::Server) -> (Micros, Vec<Micros>) {
        let workload = at_once(SimFunction::new("f", ms(100), ms(65), 64), 12);
        let config = SimConfig {
            workers: 1,
            cpus: 2,
            regulator: RegulatorConfig::Fixed(64),
            routing: Routing::seeded(BalanceKind::LeastLoaded, 1),
            server,
            ..SimConfig::default()
        };
        let mut sink = Collect::default();
        let stats = simulate(&workload, &config, &mut sink).unwrap();
        assert_eq!((stats.completed, stats.cold), (12, 12));
        let mut inits: Vec<Micros> = sink
            .records
            .iter()
            .map(|r| match r.end {
                End::Done { init_us, .. } => init_us,
                _ => panic!("not done: {r:?}"),
            })
            .collect();
        inits.sort_unstable();
        (stats.end_us, inits)
    }

    #[test]
    fn contention_makes_concurrent_cold_starts_slow_each_other_and_the_running_calls() {
        // Ideal processor sharing: every init 65 ms, then 12 × 100 ms on 2 CPUs: 665 ms.
        let (ps_end, ps_inits) = twelve_cold_starts(crate::Server::Ps);
        assert!(ps_inits.iter().all(|&i| i == 65_000));
        assert!((665_000..665_020).contains(&ps_end), "{ps_end}");
        // Contention: the k-th creation in flight takes 65 × (1 + 0.3 k) ms, and the
        // creations and the overcommit take CPU from the calls running meanwhile.
        let (end, inits) = twelve_cold_starts(crate::Server::Contention(Default::default()));
        let want: Vec<Micros> = (0..12).map(|k| 65_000 + 19_500 * k).collect();
        assert_eq!(inits, want);
        assert!(end > ps_end + 50_000, "{end} vs {ps_end}");
    }

    #[test]
    fn the_autoscaler_adds_workers_that_take_work_and_drained_ones_take_none() {
        use crate::config::SimAutoscale;
        use hearth_core::autoscale::{AutoscaleParams, Direction};
        use hearth_core::time::secs;
        // 2 workers of 2 CPUs running everything at once; 200 s of 1-s invocations at 6/s
        // (one and a half times their CPUs), then 400 s of one call every 5 s.
        let f = SimFunction::new("f", secs(1), ms(100), 64);
        let mut arrivals: Vec<At> = (0..1200)
            .map(|i| At {
                at_us: i * 1_000_000 / 6,
                function: 0,
            })
            .collect();
        arrivals.extend((0..80).map(|i| At {
            at_us: secs(200) + i * secs(5),
            function: 0,
        }));
        let workload = Workload {
            functions: vec![f],
            arrivals,
        };
        let config = SimConfig {
            workers: 2,
            cpus: 2,
            regulator: RegulatorConfig::Fixed(u32::MAX),
            routing: Routing::seeded(BalanceKind::LeastLoaded, 1),
            autoscale: Some(SimAutoscale {
                params: AutoscaleParams {
                    min_workers: 2,
                    max_workers: 5,
                    dead_band_ms: 20_000,
                    ..AutoscaleParams::default()
                },
                interval_us: secs(1),
                start_us: secs(5),
            }),
            ..SimConfig::default()
        };
        let mut sink = Collect::default();
        let stats = simulate(&workload, &config, &mut sink).unwrap();
        assert_eq!(stats.completed + stats.dropped, stats.invocations);
        let outs: Vec<&ScaleEvent> = stats
            .scaling
            .iter()
            .filter(|e| e.decision.direction == Direction::Out)
            .collect();
        let ins: Vec<&ScaleEvent> = stats
            .scaling
            .iter()
            .filter(|e| e.decision.direction == Direction::In)
            .collect();
        assert!(
            !outs.is_empty() && stats.peak_workers >= 3,
            "{:?}",
            stats.scaling
        );
        assert!(stats.peak_workers <= 5);
        assert!(
            !ins.is_empty(),
            "the quiet end drains workers: {:?} {:?}",
            stats
                .scaling
                .iter()
                .map(|e| (e.at_us / 1_000_000, e.decision.reason()))
                .collect::<Vec<_>>(),
            stats.end_us
        );
        for pair in stats.scaling.windows(2) {
            assert!(pair[1].at_us - pair[0].at_us >= secs(20), "dead band");
        }
        // An added worker gets work only once it is up.
        for e in &outs {
            let w = e.workers[0];
            let first = sink
                .records
                .iter()
                .filter(|r| r.worker == Some(w))
                .map(|r| r.scheduled_us)
                .min()
                .expect("the added worker took work");
            assert!(first >= e.at_us + secs(5));
        }
        // A drained worker gets none after its drain.
        for e in &ins {
            for w in &e.workers {
                assert!(!sink
                    .records
                    .iter()
                    .any(|r| r.worker == Some(*w) && r.scheduled_us > e.at_us));
            }
        }
    }
}
