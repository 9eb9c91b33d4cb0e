//! The driver: owns the sans-I/O [`WorkerEngine`], feeds it events with the time, carries out
//! its actions with the sandbox backend, and wakes it exactly at [`WorkerEngine::next_timeout`].
//!
//! Hot path of a warm invocation with room under the concurrency limit: one short lock
//! (admission, warm-sandbox acquire) → the facade's request on the sandbox's persistent agent
//! connection → one short lock (completion, through [`Lease`]'s drop). A queued invocation waits
//! on a oneshot channel until another event's actions dispatch it. Sandbox creation for
//! pre-warms and destruction run on a lifecycle task; keep-alive timers on a timer task that
//! sleeps until the engine's next deadline and is woken early when an event moves it earlier.

use crate::backend::{Backend, Sandbox, SandboxError};
use crate::metrics::{Metrics, StateLabel};
use dashmap::DashMap;
use hearth_api::{ColdPath, FunctionSpec};
use hearth_core::characteristics::CharacteristicsReport;
use hearth_core::provision::ElasticController;
use hearth_core::{
    Arrival, Completion, EngineAction, EngineConfig, EngineStats, InvocationId, Micros,
    ProactiveError, ProactiveEvicted, Reject, Run, SandboxId, WorkerEngine,
};
use hearth_service::registry::{Registered, Registry};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Notify};

/// The decision engine a worker drives; the simulator drives this same type.
pub type Engine = WorkerEngine;

/// What a queued invocation is woken with (moved once through a oneshot; not worth a box).
#[allow(clippy::large_enum_variant)]
enum Dispatch {
    /// Run it; a warm run carries its sandbox.
    Run(Run, Option<Sandbox>),
    Rejected(Reject),
}

/// The engine plus what the driver keeps beside it, under one lock.
struct EngineState {
    engine: Engine,
    /// Idle sandboxes, ready generic sandboxes, and sandboxes being handed back to the pool.
    parked: HashMap<SandboxId, Sandbox>,
    /// Queued invocations waiting to be dispatched.
    waiters: HashMap<InvocationId, oneshot::Sender<Dispatch>>,
    /// The deadline the timer task sleeps until (`Micros::MAX`: none).
    armed: Micros,
    /// Elastic provisioning (`[provision] elastic`): resizes the engine's memory budget.
    elastic: Option<ElasticController>,
}

impl EngineState {
    /// Keeps a sandbox that is handed back (idle, or to be destroyed by the engine's next action).
    fn park(&mut self, id: SandboxId, sandbox: Option<Sandbox>) {
        if let Some(sb) = sandbox {
            self.parked.insert(id, sb);
        }
    }
}

enum LifecycleMsg {
    Destroy(Sandbox),
    Prewarm {
        sandbox: SandboxId,
        function: String,
    },
    CreateGeneric {
        sandbox: SandboxId,
        /// The runtime image it runs on (None: the default one), by digest.
        runtime: Option<Arc<str>>,
        /// The dependency layer it mounts and pre-imports (its key's), by digest.
        layer: Option<Arc<str>>,
        memory_mb: u64,
    },
    Flush(oneshot::Sender<()>),
}

/// Where the engine's load signal comes from, for a driver that samples it.
#[derive(Debug, Clone, Copy)]
pub enum LoadSampling {
    /// Read the kernel's 1-minute load average every second, normalized by `cpus`.
    Kernel { cpus: u32 },
    /// The engine simulates its own (the `sim` backend).
    None,
}

/// How often a real worker reads the kernel's load average.
const LOAD_SAMPLE_EVERY: Micros = 1_000_000;

/// The longest the timer task sleeps with nothing to do (an event that arms a deadline wakes it).
const MAX_SLEEP: Duration = Duration::from_secs(3600);

/// The worker's driver.
pub struct Driver {
    epoch: Instant,
    backend: Backend,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    state: Mutex<EngineState>,
    lifecycle: mpsc::UnboundedSender<LifecycleMsg>,
    /// Wakes the timer task when the engine's next deadline moved earlier (or the driver goes).
    timer: Arc<Notify>,
    load: LoadSampling,
    /// Live sandboxes per code directory, so retired code is removed once unused.
    code_users: DashMap<PathBuf, usize>,
    /// Turns to create a sandbox (None: no cap).
    creations: Option<tokio::sync::Semaphore>,
    /// Sandbox creations under way, so that shutdown removes sandboxes only once none is
    /// still coming into being (runc would finish one after the cleanup, and it would outlive
    /// the worker).
    in_creation: Arc<InCreation>,
    /// The memory budget in force, readable without the engine's lock (every invocation's
    /// admission reads it for the namespaces' memory share).
    budget_mb: std::sync::atomic::AtomicU64,
}

/// Counts creations under way; wakes a waiter when the last one ends.
#[derive(Default)]
struct InCreation {
    count: std::sync::atomic::AtomicUsize,
    none: Notify,
}

/// One creation under way, for as long as it lives.
struct Creating(Arc<InCreation>);

impl InCreation {
    fn begin(self: &Arc<Self>) -> Creating {
        self.count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Creating(Arc::clone(self))
    }

    /// Waits until no creation is under way, at most `limit`.
    async fn settle(&self, limit: Duration) {
        let wait = async {
            loop {
                // Registered before the check: a wake-up between the two is not lost.
                let none = self.none.notified();
                if self.count.load(std::sync::atomic::Ordering::Acquire) == 0 {
                    return;
                }
                none.await;
            }
        };
        let _ = tokio::time::timeout(limit, wait).await;
    }
}

impl Drop for Creating {
    fn drop(&mut self) {
        if self
            .0
            .count
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            self.0.none.notify_waiters();
        }
    }
}

/// How long shutdown waits for sandbox creations under way before it removes what exists.
const CREATIONS_SETTLE: Duration = Duration::from_secs(10);

impl Driver {
    /// Starts the driver and its lifecycle and timer tasks.
    pub fn start(
        config: EngineConfig,
        backend: Backend,
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        load: LoadSampling,
        creation_cap: Option<usize>,
        elastic: Option<ElasticController>,
    ) -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let engine = WorkerEngine::new(config);
        let budget_mb = engine.pool().config().memory_budget_mb;
        let driver = Arc::new(Driver {
            epoch: Instant::now(),
            backend,
            registry,
            metrics,
            state: Mutex::new(EngineState {
                engine,
                parked: HashMap::new(),
                waiters: HashMap::new(),
                armed: Micros::MAX,
                elastic,
            }),
            lifecycle: tx,
            timer: Arc::new(Notify::new()),
            load,
            code_users: DashMap::new(),
            creations: creation_cap.map(|n| tokio::sync::Semaphore::new(n.max(1))),
            in_creation: Arc::default(),
            budget_mb: std::sync::atomic::AtomicU64::new(budget_mb),
        });
        tokio::spawn(lifecycle(Arc::clone(&driver), rx));
        tokio::spawn(timers(Arc::downgrade(&driver), Arc::clone(&driver.timer)));
        driver
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Microseconds since the driver started: the core's clock.
    pub fn now(&self) -> Micros {
        self.epoch.elapsed().as_micros() as Micros
    }

    /// Carries out the engine's actions and re-arms the timer if its deadline moved earlier.
    /// Called with the state locked, right after every event.
    fn drain(&self, st: &mut EngineState) {
        self.drain_for(st, None);
    }

    /// [`Self::drain`], but the Run or Reject of `mine` (the invocation being admitted, which has
    /// no waiter) is handed to the caller instead of sent.
    fn drain_for(&self, st: &mut EngineState, mine: Option<InvocationId>) -> Option<Dispatch> {
        let mut own = None;
        while let Some(action) = st.engine.poll_action() {
            match action {
                EngineAction::Run(run) => {
                    if let (Some(_), Some(e)) = (run.cold, st.elastic.as_mut()) {
                        e.on_cold_start();
                    }
                    // A warm run's sandbox, or the generic sandbox a cold run specializes.
                    let sandbox = match (run.cold, run.generic) {
                        (None, _) => st.parked.remove(&run.sandbox),
                        (Some(_), Some(g)) => st.parked.remove(&g),
                        (Some(_), None) => None,
                    };
                    if mine == Some(run.invocation) {
                        own = Some(Dispatch::Run(run, sandbox));
                        continue;
                    }
                    let waiter = st.waiters.remove(&run.invocation);
                    let undelivered = match waiter {
                        Some(tx) => tx.send(Dispatch::Run(run, sandbox)).err(),
                        None => Some(Dispatch::Run(run, sandbox)),
                    };
                    // Its caller left between dispatch and delivery: give the run back.
                    if let Some(Dispatch::Run(run, sandbox)) = undelivered {
                        st.park(run.sandbox, sandbox);
                        st.engine.on_abandoned(self.now(), &run);
                    }
                }
                EngineAction::Reject { invocation, reason } => {
                    if mine == Some(invocation) {
                        own = Some(Dispatch::Rejected(reason));
                        continue;
                    }
                    if let Some(tx) = st.waiters.remove(&invocation) {
                        let _ = tx.send(Dispatch::Rejected(reason));
                    }
                }
                EngineAction::Destroy { sandbox, reason } => {
                    let label = StateLabel {
                        state: reason.as_str(),
                    };
                    self.metrics.sandboxes_destroyed.get_or_create(&label).inc();
                    if let Some(sb) = st.parked.remove(&sandbox) {
                        let _ = self.lifecycle.send(LifecycleMsg::Destroy(sb));
                    }
                }
                EngineAction::Prewarm { sandbox, function } => {
                    let _ = self.lifecycle.send(LifecycleMsg::Prewarm {
                        sandbox,
                        function: function.to_string(),
                    });
                }
                EngineAction::CreateGeneric {
                    sandbox,
                    key,
                    memory_mb,
                } => {
                    let _ = self.lifecycle.send(LifecycleMsg::CreateGeneric {
                        sandbox,
                        runtime: key.runtime,
                        layer: key.layer,
                        memory_mb,
                    });
                }
            }
        }
        let next = st.engine.next_timeout().unwrap_or(Micros::MAX);
        if next < st.armed {
            st.armed = next;
            self.timer.notify_one();
        }
        own
    }

    /// Runs `event` under the lock with the time, then carries out the engine's actions.
    fn with_state<T>(&self, event: impl FnOnce(&mut EngineState, Micros) -> T) -> T {
        let now = self.now();
        let mut st = self.state.lock();
        let out = event(&mut st, now);
        self.drain(&mut st);
        out
    }

    /// [`Self::with_state`] for an event that only the engine sees.
    fn with_engine<T>(&self, event: impl FnOnce(&mut Engine, Micros) -> T) -> T {
        self.with_state(|st, now| event(&mut st.engine, now))
    }

    /// Reports the end of a run and hands its sandbox back.
    fn complete(&self, run: &Run, sandbox: Option<Sandbox>, c: Completion) {
        self.with_state(|st, now| {
            st.park(run.sandbox, sandbox);
            st.engine.on_completed(now, run, c);
        });
    }

    /// Admission: the invocation runs at once, waits in the queue until dispatched, or is
    /// refused. A warm run carries its sandbox; a cold one must start it ([`Self::cold_start`]).
    /// `deadline_us` is the time left to the invocation's deadline as it arrives here;
    /// `drop_late` refuses it ([`Reject::Late`]) rather than start it once that has passed.
    pub async fn admit(
        self: &Arc<Self>,
        spec: &FunctionSpec,
        deadline_us: Option<u64>,
        drop_late: bool,
    ) -> Result<Admitted<'_>, Reject> {
        let (id, admission, rx) = {
            let now = self.now();
            let mut st = self.state.lock();
            if let Some(e) = st.elastic.as_mut() {
                e.on_arrival(&spec.name, spec.memory_mb);
            }
            // A function takes generic sandboxes of its own runtime image (the default one's
            // key names none) and, with a layer, pre-imported ones of that layer only (no
            // allocation unless its key changed).
            let runtime = spec
                .runtime_digest
                .as_deref()
                .filter(|d| Some(*d) != self.backend.default_runtime_digest());
            st.engine
                .set_generic_key(&spec.name, runtime, spec.layer.as_deref());
            let id = st.engine.on_invocation(
                now,
                Arrival {
                    function: &spec.name,
                    memory_mb: spec.memory_mb,
                    deadline_us,
                    drop_late,
                },
            );
            let admission = self.drain_for(&mut st, Some(id));
            // No Run or Reject for it: it is queued. Its waiter is registered under the same
            // lock, before any later event can dispatch it.
            let rx = admission.is_none().then(|| {
                let (tx, rx) = oneshot::channel();
                st.waiters.insert(id, tx);
                rx
            });
            (id, admission, rx)
        };
        let dispatch = match (admission, rx) {
            (Some(d), _) => Some(d),
            (None, Some(rx)) => {
                let mut wait = QueueWait {
                    driver: self,
                    id,
                    rx: Some(rx),
                };
                wait.wait().await
            }
            (None, None) => None,
        };
        let (run, sandbox) = match dispatch {
            Some(Dispatch::Run(run, sb)) => (run, sb),
            Some(Dispatch::Rejected(reason)) => return Err(reason),
            // The engine ends every queued invocation with a run or a rejection; a dropped
            // sender means the driver is gone, i.e. shutting down.
            None => return Err(Reject::ShuttingDown),
        };
        Ok(Admitted {
            driver: self,
            run: Some(run),
            sandbox,
        })
    }

    /// Starts the sandbox of a cold run on a task of its own, so that a caller that goes away
    /// (client disconnect) cannot leave a half-created sandbox behind: the task parks it. A
    /// generic sandbox handed with the run is specialized; if that fails for want of the
    /// platform (not the function's own init error), the sandbox is created from nothing.
    async fn cold_start(
        self: &Arc<Self>,
        run: Run,
        reg: &Registered,
        generic: Option<Sandbox>,
    ) -> Result<(Sandbox, ColdPath), StartFailure> {
        let (tx, rx) = oneshot::channel();
        let me = Arc::clone(self);
        let reg = reg.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let made = match generic {
                Some(g) => match me
                    .backend
                    .specialize(g, &reg.spec, reg.code_dir.as_deref())
                    .await
                {
                    Err(SandboxError::StartFailed(e)) => {
                        tracing::warn!(function = %reg.spec.name, error = %e,
                            "specializing a generic sandbox failed; creating one instead");
                        me.create(run.sandbox, &reg)
                            .await
                            .map(|s| (s, ColdPath::Fresh))
                    }
                    // A generic sandbox of the function's layer had its modules imported.
                    other => other.map(|s| {
                        let path = if reg.spec.layer.is_some() {
                            ColdPath::Preimported
                        } else {
                            ColdPath::Generic
                        };
                        (s, path)
                    }),
                },
                None => me
                    .create(run.sandbox, &reg)
                    .await
                    .map(|s| (s, ColdPath::Fresh)),
            };
            match made {
                Ok((sb, path)) => {
                    me.sandbox_created(&sb);
                    if let Err(Ok((sb, _))) = tx.send(Ok((sb, path))) {
                        let c = Completion {
                            exec_us: None,
                            init_us: Some(started.elapsed().as_micros() as u64),
                            reusable: true,
                        };
                        me.complete(&run, Some(sb), c);
                    }
                }
                Err(e) => {
                    me.with_engine(|engine, now| engine.on_start_failed(now, &run));
                    let _ = tx.send(Err(e));
                }
            }
        });
        match rx.await {
            Ok(result) => result.map_err(StartFailure::Sandbox),
            Err(_) => Err(StartFailure::TaskFailed),
        }
    }

    /// Creates a sandbox when a creation turn is free (the wait counts as start-up time).
    async fn create(&self, id: SandboxId, reg: &Registered) -> Result<Sandbox, SandboxError> {
        let _creating = self.in_creation.begin();
        let _turn = match &self.creations {
            Some(s) => s.acquire().await.ok(),
            None => None,
        };
        self.backend
            .create(id, &reg.spec, reg.code_dir.as_deref())
            .await
    }

    fn sandbox_created(&self, sb: &Sandbox) {
        if let Some(dir) = self.backend.code_dir(sb) {
            self.count_code_user(dir, 1);
        }
    }

    /// Tracks live sandboxes per code directory; retired code goes when its last sandbox does.
    pub(crate) fn count_code_user(&self, dir: &Path, delta: isize) {
        let mut remove = false;
        {
            let mut n = self.code_users.entry(dir.to_path_buf()).or_insert(0);
            *n = n.saturating_add_signed(delta);
            if *n == 0 {
                remove = true;
            }
        }
        if remove {
            self.code_users.remove_if(dir, |_, n| *n == 0);
            self.registry.remove_code_dir(dir);
        }
    }

    /// Creates a prewarmed sandbox and reports it to the engine with its start time (the
    /// function's cold-start cost, known before any invocation paid it).
    async fn create_prewarmed(&self, id: SandboxId, reg: &Registered) -> Result<(), SandboxError> {
        let started = Instant::now();
        match self.create(id, reg).await {
            Ok(sb) => {
                self.sandbox_created(&sb);
                let init_us = started.elapsed().as_micros() as Micros;
                self.with_state(|st, now| {
                    st.park(id, Some(sb));
                    st.engine.on_sandbox_ready(now, id, Some(init_us));
                });
                Ok(())
            }
            Err(e) => {
                self.with_engine(|engine, now| engine.on_prewarm_failed(now, id));
                Err(e)
            }
        }
    }

    /// Makes a generic sandbox for the pool (a creation turn like any sandbox) and reports it:
    /// with `layer`, the layer mounted and its modules imported before it is ready.
    async fn create_generic(
        &self,
        id: SandboxId,
        memory_mb: u64,
        runtime: Option<Arc<str>>,
        layer: Option<Arc<str>>,
    ) {
        let made = {
            let _creating = self.in_creation.begin();
            let _turn = match &self.creations {
                Some(s) => s.acquire().await.ok(),
                None => None,
            };
            self.backend
                .create_generic(id, memory_mb, runtime.as_deref(), layer.as_deref())
                .await
        };
        match made {
            Ok(sb) => self.with_state(|st, now| {
                st.park(id, Some(sb));
                st.engine.on_generic_ready(now, id);
            }),
            Err(e) => {
                tracing::warn!(error = %e, "making a generic sandbox failed");
                self.metrics.generic_failures.inc();
                self.with_engine(|engine, now| engine.on_generic_failed(now, id));
            }
        }
    }

    /// Starts up to `count` sandboxes of a function ahead of demand (free memory only) and waits
    /// until they are ready. Returns how many are ready, how many found no memory, and the
    /// errors of those that failed.
    pub async fn prewarm(self: &Arc<Self>, reg: &Registered, count: u32) -> Prewarmed {
        let (ids, no_memory) = self.with_engine(|engine, now| {
            engine.prewarm(now, &reg.spec.name, reg.spec.memory_mb, count)
        });
        let tasks: Vec<_> = ids
            .into_iter()
            .map(|id| {
                let me = Arc::clone(self);
                let reg = reg.clone();
                tokio::spawn(async move { me.create_prewarmed(id, &reg).await })
            })
            .collect();
        let mut out = Prewarmed {
            ready: 0,
            no_memory,
            errors: Vec::new(),
        };
        for t in tasks {
            match t.await {
                Ok(Ok(())) => out.ready += 1,
                Ok(Err(e)) => out.errors.push(e.to_string()),
                Err(e) => out.errors.push(e.to_string()),
            }
        }
        out
    }

    /// Starts a proactive sandbox of a function (Atoll's allocator decided it): the engine
    /// reserves its memory in the proactive pool now, and the returned task starts it exactly
    /// as a prewarm, through the creation cap, and reports it ready or failed.
    pub fn proactive_create(
        self: &Arc<Self>,
        reg: &Registered,
    ) -> Result<tokio::task::JoinHandle<Result<(), SandboxError>>, ProactiveError> {
        let id = self.with_engine(|engine, now| {
            engine.proactive_create(now, &reg.spec.name, reg.spec.memory_mb)
        })?;
        let me = Arc::clone(self);
        let reg = reg.clone();
        // Counted from here, so that a shutdown now waits for it (as for policy pre-warms).
        let creating = self.in_creation.begin();
        Ok(tokio::spawn(async move {
            let _creating = creating;
            me.create_prewarmed(id, &reg).await
        }))
    }

    /// Un-marks one soft-evicted proactive sandbox of `function`; false when it has none.
    pub fn proactive_unmark(&self, function: &str) -> bool {
        self.with_engine(|engine, now| engine.proactive_unmark(now, function).is_some())
    }

    /// Soft-evicts one proactive sandbox of `function`; false when it has none to mark.
    pub fn proactive_soft_evict(&self, function: &str) -> bool {
        self.with_engine(|engine, _| engine.proactive_soft_evict(function).is_some())
    }

    /// Destroys one proactive sandbox of `function` (now, or when its run or start ends);
    /// `None` when it has none left.
    pub fn proactive_evict(&self, function: &str) -> Option<ProactiveEvicted> {
        self.with_engine(|engine, now| engine.proactive_evict(now, function))
    }

    /// A function was updated or deleted: its sandboxes are retired, and its code directory is
    /// removed now if no sandbox uses it (else when the last one goes).
    pub fn retire(&self, old: &Registered) {
        self.with_engine(|engine, _| engine.retire(&old.spec.name));
        if let Some(dir) = &old.code_dir {
            if self.code_users.get(dir).is_none_or(|n| *n == 0) {
                self.registry.remove_code_dir(dir);
            }
        }
    }

    pub fn stats(&self) -> EngineStats {
        self.state.lock().engine.stats()
    }

    /// What the engine has learned about a function.
    pub fn characteristics(&self, name: &str) -> Option<CharacteristicsReport> {
        let now = self.now();
        self.state.lock().engine.characteristics(name, now)
    }

    /// Rejects the queued invocations, removes idle sandboxes and the rest as they finish, waits
    /// for the lifecycle task to carry that out, then removes whatever the backend still has.
    pub async fn shutdown(&self) {
        self.with_engine(|engine, _| engine.shutdown());
        let (tx, rx) = oneshot::channel();
        if self.lifecycle.send(LifecycleMsg::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
        self.in_creation.settle(CREATIONS_SETTLE).await;
        self.backend.cleanup_all().await;
    }

    /// Elastic provisioning's step: closes the controller's interval when it is due and hands a
    /// new size to the engine (a cut evicts idle sandboxes only; running ones finish).
    fn provision(&self, st: &mut EngineState, now: Micros) {
        let Some(decision) = st.elastic.as_mut().and_then(|e| e.on_timeout(now)) else {
            return;
        };
        let applied = st.engine.set_memory_budget(now, decision.to_mb);
        self.budget_mb
            .store(applied, std::sync::atomic::Ordering::Relaxed);
        self.metrics.memory_budget_mb.set(applied as i64);
        tracing::info!(
            from_mb = decision.from_mb,
            to_mb = applied,
            miss_speed = decision.miss_speed,
            arrival_rate = decision.arrival_rate,
            "elastic provisioning resized the memory budget"
        );
    }

    /// The memory budget in force (elastic provisioning may have changed it).
    pub fn memory_budget_mb(&self) -> u64 {
        self.budget_mb.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The timer task's step: feeds a load sample if one is due, fires the engine's timers, and
    /// says how long to sleep.
    fn on_timer(&self, next_sample: &mut Micros) -> Duration {
        let now = self.now();
        let sample = match self.load {
            LoadSampling::Kernel { cpus } if now >= *next_sample => {
                *next_sample = now + LOAD_SAMPLE_EVERY;
                kernel_load_avg().map(|l| l / f64::from(cpus.max(1)))
            }
            _ => None,
        };
        let mut st = self.state.lock();
        if let Some(load) = sample {
            st.engine.on_load(now, load);
        }
        st.engine.on_timeout(now);
        self.provision(&mut st, now);
        // This task re-arms itself below: the drain must not notify it.
        st.armed = 0;
        self.drain(&mut st);
        let mut wake = st.engine.next_timeout().unwrap_or(Micros::MAX);
        if let LoadSampling::Kernel { .. } = self.load {
            wake = wake.min(*next_sample);
        }
        if let Some(e) = &st.elastic {
            wake = wake.min(e.next_timeout());
        }
        st.armed = wake;
        Duration::from_micros(wake.saturating_sub(now)).min(MAX_SLEEP)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Lets the timer task see that the driver is gone.
        self.timer.notify_one();
    }
}

/// What a prewarm achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prewarmed {
    pub ready: u32,
    pub no_memory: u32,
    pub errors: Vec<String>,
}

/// An admitted invocation: permission to run, with its sandbox if warm. Dropping it unused hands
/// the run back (a cold run's reservation is released).
pub struct Admitted<'a> {
    driver: &'a Arc<Driver>,
    run: Option<Run>,
    sandbox: Option<Sandbox>,
}

impl<'a> Admitted<'a> {
    pub fn run(&self) -> &Run {
        self.run
            .as_ref()
            .unwrap_or_else(|| unreachable!("an admission holds its run until taken"))
    }

    /// The exclusive use of the sandbox, starting it first for a cold run.
    pub async fn lease(mut self, reg: &Registered) -> Result<Lease<'a>, StartFailure> {
        let run = self
            .run
            .take()
            .unwrap_or_else(|| unreachable!("an admission holds its run until taken"));
        match (run.cold, self.sandbox.take()) {
            (None, Some(sb)) => Ok(Lease::new(self.driver, run, sb, None)),
            (None, None) => {
                // The engine and the parked map disagree: never expected; fail safe.
                self.driver
                    .with_engine(|engine, now| engine.on_start_failed(now, &run));
                Err(StartFailure::WarmSandboxMissing)
            }
            (Some(_), generic) => {
                let started = Instant::now();
                let (sb, path) = self.driver.cold_start(run.clone(), reg, generic).await?;
                let init_us = started.elapsed().as_micros() as u64;
                let mut lease = Lease::new(self.driver, run, sb, Some(init_us));
                lease.cold_path = Some(path);
                Ok(lease)
            }
        }
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let Some(run) = self.run.take() else { return };
        let sandbox = self.sandbox.take();
        self.driver.with_state(|st, now| {
            st.park(run.sandbox, sandbox);
            st.engine.on_abandoned(now, &run);
        });
    }
}

/// Why a leased run has no sandbox.
#[derive(Debug)]
pub enum StartFailure {
    Sandbox(SandboxError),
    /// The task starting it ended without an answer.
    TaskFailed,
    /// The engine granted a warm run whose sandbox is not parked (never expected).
    WarmSandboxMissing,
}

/// A queued invocation's wait. Dropping it early (the client went away) takes the invocation out
/// of the queue, or, if it was dispatched meanwhile, hands its run back unused.
struct QueueWait<'a> {
    driver: &'a Driver,
    id: InvocationId,
    rx: Option<oneshot::Receiver<Dispatch>>,
}

impl QueueWait<'_> {
    async fn wait(&mut self) -> Option<Dispatch> {
        let rx = self.rx.as_mut()?;
        let got = rx.await.ok();
        self.rx = None;
        got
    }
}

impl Drop for QueueWait<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let id = self.id;
        self.driver.with_state(|st, now| {
            if st.waiters.remove(&id).is_some() {
                st.engine.on_cancel(now, id);
            } else if let Ok(Dispatch::Run(run, sandbox)) = rx.try_recv() {
                st.park(run.sandbox, sandbox);
                st.engine.on_abandoned(now, &run);
            }
        });
    }
}

/// Exclusive use of a sandbox for one run. Dropping it reports the run's end and hands the
/// sandbox back; unless the invocation finished cleanly (`completion.reusable`), the sandbox is
/// destroyed, so a cancelled or timed-out request can never leave a sandbox in an unknown state
/// in the pool.
pub struct Lease<'a> {
    driver: &'a Driver,
    run: Run,
    sandbox: Option<Sandbox>,
    /// What the driver reports to the engine when the lease is dropped.
    pub completion: Completion,
    /// How a cold run's sandbox was made.
    pub cold_path: Option<ColdPath>,
}

impl<'a> Lease<'a> {
    fn new(driver: &'a Driver, run: Run, sandbox: Sandbox, init_us: Option<u64>) -> Self {
        Lease {
            driver,
            run,
            sandbox: Some(sandbox),
            completion: Completion {
                exec_us: None,
                init_us,
                reusable: false,
            },
            cold_path: None,
        }
    }

    pub fn run(&self) -> &Run {
        &self.run
    }

    pub fn sandbox(&mut self) -> &mut Sandbox {
        self.sandbox
            .as_mut()
            .unwrap_or_else(|| unreachable!("a lease holds its sandbox until dropped"))
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let sb = self.sandbox.take();
        self.driver.complete(&self.run, sb, self.completion);
    }
}

/// Destroys sandboxes and starts the policy's pre-warms, off the invocation path.
async fn lifecycle(driver: Arc<Driver>, mut rx: mpsc::UnboundedReceiver<LifecycleMsg>) {
    while let Some(msg) = rx.recv().await {
        match msg {
            LifecycleMsg::Destroy(sb) => {
                let dir = driver.backend.code_dir(&sb).map(Path::to_path_buf);
                driver.backend.destroy(sb).await;
                if let Some(dir) = dir {
                    driver.count_code_user(&dir, -1);
                }
            }
            LifecycleMsg::Prewarm { sandbox, function } => {
                let d = Arc::clone(&driver);
                // Counted from here: shutdown, flushing this task's messages, then waits for it.
                let creating = driver.in_creation.begin();
                tokio::spawn(async move {
                    let _creating = creating;
                    match d.registry.get(&function) {
                        Some(reg) => {
                            if let Err(e) = d.create_prewarmed(sandbox, &reg).await {
                                tracing::warn!(%function, error = %e, "policy pre-warm failed");
                            }
                        }
                        None => d.with_engine(|engine, now| engine.on_prewarm_failed(now, sandbox)),
                    }
                });
            }
            LifecycleMsg::CreateGeneric {
                sandbox,
                runtime,
                layer,
                memory_mb,
            } => {
                let d = Arc::clone(&driver);
                let creating = driver.in_creation.begin();
                tokio::spawn(async move {
                    let _creating = creating;
                    d.create_generic(sandbox, memory_mb, runtime, layer).await
                });
            }
            LifecycleMsg::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// The timer task: sleeps until the engine's next deadline (or the next load sample), or until
/// an event moves that deadline earlier.
async fn timers(driver: Weak<Driver>, wake: Arc<Notify>) {
    let mut next_sample: Micros = 0;
    loop {
        let Some(d) = driver.upgrade() else { return };
        let sleep = d.on_timer(&mut next_sample);
        drop(d);
        // An event that arms an earlier deadline notifies; a notification sent before this
        // wait begins is kept as a permit, so none is lost.
        let notified = wake.notified();
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = notified => {}
        }
    }
}

/// The kernel's 1-minute load average.
fn kernel_load_avg() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().next()?.parse().ok()
}
