//! The worker: drives the sans-I/O [`WorkerEngine`] with real time and real sandboxes.
//!
//! Hot path of a warm invocation with room under the concurrency limit: registry lookup → one
//! short lock (admission, warm-sandbox acquire) → one request on the sandbox's persistent agent
//! connection → one short lock (completion). A queued invocation waits on a oneshot channel until
//! another invocation's completion dispatches it. Sandbox creation for pre-warms, destruction,
//! keep-alive timers and load sampling run on background tasks.

use crate::agent_client::AgentReply;
use crate::backend::{Backend, Sandbox, SandboxError};
use crate::config::{BackendKind, WorkerConfig};
use crate::error::ApiError;
use crate::in_flight::InFlightTracker;
use crate::invocations::AsyncInvocations;
use crate::metrics::{ColdLabel, FnLabel, Metrics, Outcome, QueueLabel, StateLabel};
use crate::registry::{CodeSource, Registered, Registry, RegistryError};
use crate::serving::open_data_dir;
use axum::http::StatusCode;
use bytes::Bytes;
use dashmap::DashMap;
use hearth_core::{
    Arrival, ColdReason, Completion, EngineAction, EngineConfig, EngineStats, FunctionSpec,
    InvocationId, LoadSource, Micros, PoolConfig, Reject, Run, SandboxId, WorkerEngine,
};
use parking_lot::Mutex;
use serde_json::json;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// Per-invocation timing in microseconds (DESIGN.md §4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Timing {
    pub queue: u64,
    pub init: u64,
    pub exec: u64,
    pub overhead: u64,
    pub e2e: u64,
}

/// A successful invocation.
#[derive(Debug, Clone)]
pub struct Invoked {
    /// The handler's result, as the JSON text the agent produced.
    pub result: Bytes,
    pub cold: Option<ColdReason>,
    pub timing: Timing,
}

/// What a queued invocation is woken with (moved once through a oneshot; not worth a box).
#[allow(clippy::large_enum_variant)]
enum Dispatch {
    /// Run it; a warm run carries its sandbox.
    Run(Run, Option<Sandbox>),
    Rejected(Reject),
}

/// The engine plus what the driver keeps beside it.
/// The decision engine a worker drives; the simulator drives this same type.
pub type Engine = WorkerEngine;

struct EngineState {
    engine: Engine,
    /// Idle sandboxes, and sandboxes being handed back to the pool.
    parked: HashMap<SandboxId, Sandbox>,
    /// Queued invocations waiting to be dispatched.
    waiters: HashMap<InvocationId, oneshot::Sender<Dispatch>>,
}

enum LifecycleMsg {
    Destroy(Sandbox),
    Prewarm {
        sandbox: SandboxId,
        function: String,
    },
    Flush(oneshot::Sender<()>),
}

/// The worker.
pub struct Worker {
    id: String,
    config: WorkerConfig,
    epoch: Instant,
    registry: Registry,
    backend: Backend,
    state: Mutex<EngineState>,
    lifecycle: mpsc::UnboundedSender<LifecycleMsg>,
    pub metrics: Metrics,
    pub invocations: AsyncInvocations,
    shutting_down: AtomicBool,
    in_flight: InFlightTracker,
    /// Live sandboxes per code directory, so retired code is removed once unused.
    code_users: DashMap<PathBuf, usize>,
    latency: crate::latency::LowLatency,
}

/// Errors of [`Worker::start`].
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("data directory {0}: {1}")]
    DataDir(PathBuf, std::io::Error),
    #[error("registry: {0}")]
    Registry(#[from] RegistryError),
    #[error("{0}")]
    Backend(#[from] SandboxError),
    #[error("configuration: {0}")]
    Config(#[from] crate::config::ConfigError),
}

impl Worker {
    /// Opens the registry, prepares the backend (removing leftovers of a crashed run) and starts
    /// the background tasks.
    pub async fn start(config: WorkerConfig) -> Result<Arc<Self>, StartError> {
        let data_dir = open_data_dir(&config.data_dir)
            .map_err(|e| StartError::DataDir(config.data_dir.clone(), e))?;
        let id = config.worker_id();
        let registry = Registry::open(&data_dir)?;
        let backend = match config.backend {
            BackendKind::Runc => Backend::Runc(
                crate::backend::runc::RuncBackend::new(config.runc.clone(), &data_dir, &id).await?,
            ),
            BackendKind::Sim => Backend::Sim(crate::backend::sim::SimBackend::new()),
        };
        backend.cleanup_all().await;
        let engine = WorkerEngine::new(EngineConfig {
            pool: PoolConfig {
                memory_budget_mb: config.memory_mb,
                free_buffer_mb: config.free_buffer_mb,
                keepalive: config.keepalive_config(),
            },
            queue: config.queue,
            max_queue: config.max_queue,
            regulator: config.regulator()?,
            bypass: hearth_core::bypass::BypassConfig {
                threshold_us: (config.bypass_ms * 1000.0).round() as Micros,
                max_load: config.bypass_load,
            },
            cpus: config.effective_cpus(),
            // Sim workers share one machine: their load is their own simulated one.
            load_source: match config.backend {
                BackendKind::Runc => LoadSource::External,
                BackendKind::Sim => LoadSource::Simulated,
            },
        });
        let latency = crate::latency::LowLatency::new(
            config.low_latency,
            Duration::from_millis(config.low_latency_quiet_ms),
        );
        let (tx, rx) = mpsc::unbounded_channel();
        let worker = Arc::new(Worker {
            id,
            invocations: AsyncInvocations::new(
                Duration::from_secs(config.async_retention_s),
                config.async_max_records,
            ),
            config,
            epoch: Instant::now(),
            registry,
            backend,
            state: Mutex::new(EngineState {
                engine,
                parked: HashMap::new(),
                waiters: HashMap::new(),
            }),
            lifecycle: tx,
            metrics: Metrics::default(),
            shutting_down: AtomicBool::new(false),
            in_flight: InFlightTracker::new(),
            code_users: DashMap::new(),
            latency,
        });
        tokio::spawn(lifecycle(Arc::clone(&worker), rx));
        tokio::spawn(maintenance(Arc::downgrade(&worker)));
        Ok(worker)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// Microseconds since the worker started: the core's clock.
    fn now(&self) -> Micros {
        self.epoch.elapsed().as_micros() as Micros
    }

    /// Carries out the engine's actions. Called with the state locked, right after every event.
    fn drain(&self, st: &mut EngineState) {
        self.drain_for(st, None);
    }

    /// [`Self::drain`], but the Run or Reject of `mine` (the invocation being admitted, which
    /// has no waiter) is returned to the caller instead of sent.
    fn drain_for(&self, st: &mut EngineState, mine: Option<InvocationId>) -> Option<Dispatch> {
        let mut own = None;
        while let Some(action) = st.engine.poll_action() {
            match action {
                EngineAction::Run(run) => {
                    let sandbox = match run.cold {
                        None => st.parked.remove(&run.sandbox),
                        Some(_) => None,
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
                        if let Some(sb) = sandbox {
                            st.parked.insert(run.sandbox, sb);
                        }
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
            }
        }
        own
    }

    /// Reports the end of a run and hands its sandbox back.
    fn complete(&self, run: &Run, sandbox: Option<Sandbox>, c: Completion) {
        let now = self.now();
        let mut st = self.state.lock();
        if let Some(sb) = sandbox {
            st.parked.insert(run.sandbox, sb);
        }
        st.engine.on_completed(now, run, c);
        self.drain(&mut st);
    }

    /// Admission: runs at once, waits in the queue, or is refused.
    async fn admit(&self, spec: &FunctionSpec) -> Result<(Run, Option<Sandbox>), ApiError> {
        let (id, admission, rx) = {
            let now = self.now();
            let mut st = self.state.lock();
            let id = st.engine.on_invocation(
                now,
                Arrival {
                    function: &spec.name,
                    memory_mb: spec.memory_mb,
                    deadline_us: spec.deadline_ms.map(|d| d * 1000),
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
                    worker: self,
                    id,
                    rx: Some(rx),
                };
                wait.wait().await
            }
            (None, None) => None,
        };
        match dispatch {
            Some(Dispatch::Run(run, sb)) => Ok((run, sb)),
            Some(Dispatch::Rejected(reason)) => Err(self.rejected(&spec.name, reason)),
            None => Err(ApiError::internal("the queue dropped an invocation")),
        }
    }

    fn rejected(&self, name: &str, reason: Reject) -> ApiError {
        self.metrics.outcome(name, Outcome::rejected);
        match reason {
            Reject::QueueFull { length } => {
                let mut e = ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "queue_full",
                    format!(
                        "the worker's invocation queue is full ({length} waiting); retry later"
                    ),
                );
                e.retry_after_s = Some(1);
                e
            }
            Reject::NoMemory { needed_mb, free_mb } => ApiError::overloaded(format!(
                "no memory for a new sandbox of {name}: it needs {needed_mb} MiB and {free_mb} MiB \
                 are free after evicting every idle sandbox (budget {} MiB)",
                self.config.memory_mb
            )),
            Reject::TooLarge {
                needed_mb,
                budget_mb,
            } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "insufficient_memory",
                format!(
                    "{name} needs {needed_mb} MiB per sandbox but this worker's whole budget is \
                     {budget_mb} MiB"
                ),
            ),
            Reject::ShuttingDown => ApiError::shutting_down(),
        }
    }

    /// Runs one invocation of `name` with JSON `args`; `t0` is when the request arrived.
    pub async fn invoke(
        self: &Arc<Self>,
        name: &str,
        args: &[u8],
        t0: Instant,
    ) -> Result<Invoked, ApiError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(ApiError::shutting_down());
        }
        let _guard = self.in_flight.enter();
        self.latency.on_activity();
        let reg = self
            .registry
            .get(name)
            .ok_or_else(|| ApiError::unknown_function(name))?;
        let spec = &reg.spec;
        let (run, parked) = self.admit(spec).await?;
        if run.queued_us > 0 {
            self.metrics
                .queue_wait
                .get_or_create(&QueueLabel {
                    discipline: self.config.queue.name(),
                })
                .observe(run.queued_us as f64 / 1e6);
        }
        if run.bypass {
            self.metrics.bypassed.inc();
        }
        let (mut lease, init_us) = match (run.cold, parked) {
            (None, Some(sb)) => {
                self.metrics
                    .warm_starts
                    .get_or_create(&FnLabel {
                        function: spec.name.clone(),
                    })
                    .inc();
                (Lease::new(self, run.clone(), sb), 0)
            }
            (None, None) => {
                // The engine and the parked map disagree: never expected; fail safe.
                let now = self.now();
                let mut st = self.state.lock();
                st.engine.on_start_failed(now, &run);
                self.drain(&mut st);
                return Err(ApiError::internal("warm sandbox missing"));
            }
            (Some(reason), _) => {
                let started = Instant::now();
                let sb = self.cold_start(&run, &reg).await.inspect_err(|_| {
                    self.metrics.outcome(&spec.name, Outcome::init_error);
                })?;
                let init_us = started.elapsed().as_micros() as u64;
                self.metrics
                    .cold_starts
                    .get_or_create(&ColdLabel {
                        function: spec.name.clone(),
                        reason: reason.as_str(),
                    })
                    .inc();
                self.metrics
                    .init
                    .get_or_create(&FnLabel {
                        function: spec.name.clone(),
                    })
                    .observe(init_us as f64 / 1e6);
                let mut lease = Lease::new(self, run.clone(), sb);
                lease.completion.init_us = Some(init_us);
                (lease, init_us)
            }
        };
        let timeout = Duration::from_millis(spec.timeout_ms);
        let reply = tokio::time::timeout(timeout, self.backend.invoke(lease.sandbox(), args)).await;
        let reply = match reply {
            Err(_) => {
                self.metrics.outcome(&spec.name, Outcome::timeout);
                return Err(ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "timeout",
                    format!(
                        "{name} did not finish within its timeout of {} ms; its sandbox was killed",
                        spec.timeout_ms
                    ),
                ));
            }
            Ok(Err(e)) => {
                let (outcome, code) = match e {
                    SandboxError::OutOfMemory { .. } => (Outcome::out_of_memory, "out_of_memory"),
                    _ => (Outcome::crashed, "sandbox_crashed"),
                };
                self.metrics.outcome(&spec.name, outcome);
                return Err(ApiError::new(StatusCode::BAD_GATEWAY, code, e.to_string()));
            }
            Ok(Ok(reply)) => reply,
        };
        let exec = reply.exec_us.unwrap_or(0);
        // The agent answered, so the sandbox is healthy whatever the handler did.
        lease.completion.reusable = true;
        lease.completion.exec_us = Some(exec);
        drop(lease);
        let e2e = t0.elapsed().as_micros() as u64;
        let timing = Timing {
            queue: run.queued_us,
            init: init_us,
            exec,
            overhead: e2e.saturating_sub(exec + init_us + run.queued_us),
            e2e,
        };
        self.metrics
            .exec
            .get_or_create(&FnLabel {
                function: spec.name.clone(),
            })
            .observe(exec as f64 / 1e6);
        self.metrics.overhead.observe(timing.overhead as f64 / 1e6);
        match reply.status {
            200 => {
                self.metrics.outcome(&spec.name, Outcome::success);
                Ok(Invoked {
                    result: reply.body,
                    cold: run.cold,
                    timing,
                })
            }
            _ => {
                self.metrics.outcome(&spec.name, Outcome::handler_error);
                Err(handler_error(name, &reply, run.cold, &timing, &self.id))
            }
        }
    }

    /// Starts a sandbox on a task of its own, so that a caller that goes away (client
    /// disconnect) cannot leave a half-created sandbox behind: the task parks it instead.
    async fn cold_start(
        self: &Arc<Self>,
        run: &Run,
        reg: &Registered,
    ) -> Result<Sandbox, ApiError> {
        let (tx, rx) = oneshot::channel();
        let me = Arc::clone(self);
        let name = reg.spec.name.clone();
        let reg = reg.clone();
        let run = run.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let res = me
                .backend
                .create(run.sandbox, &reg.spec, reg.code_dir.as_deref())
                .await;
            match res {
                Ok(sb) => {
                    me.sandbox_created(&sb);
                    if let Err(Ok(sb)) = tx.send(Ok(sb)) {
                        let c = Completion {
                            exec_us: None,
                            init_us: Some(started.elapsed().as_micros() as u64),
                            reusable: true,
                        };
                        me.complete(&run, Some(sb), c);
                    }
                }
                Err(e) => {
                    let now = me.now();
                    let mut st = me.state.lock();
                    st.engine.on_start_failed(now, &run);
                    me.drain(&mut st);
                    drop(st);
                    let _ = tx.send(Err(e));
                }
            }
        });
        match rx.await {
            Ok(Ok(sb)) => Ok(sb),
            Ok(Err(e)) => Err(start_error(&name, e)),
            Err(_) => Err(ApiError::internal("sandbox start task failed")),
        }
    }

    fn sandbox_created(&self, sb: &Sandbox) {
        if let Some(dir) = self.backend.code_dir(sb) {
            self.count_code_user(dir, 1);
        }
    }

    /// Tracks live sandboxes per code directory; retired code goes when its last sandbox does.
    fn count_code_user(&self, dir: &std::path::Path, delta: isize) {
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

    /// Creates a prewarmed sandbox and reports it to the engine. Returns an error message on
    /// failure.
    async fn create_prewarmed(&self, id: SandboxId, reg: &Registered) -> Result<(), String> {
        match self
            .backend
            .create(id, &reg.spec, reg.code_dir.as_deref())
            .await
        {
            Ok(sb) => {
                self.sandbox_created(&sb);
                let now = self.now();
                let mut st = self.state.lock();
                st.parked.insert(id, sb);
                st.engine.on_sandbox_ready(now, id);
                self.drain(&mut st);
                Ok(())
            }
            Err(e) => {
                let now = self.now();
                let mut st = self.state.lock();
                st.engine.on_prewarm_failed(now, id);
                self.drain(&mut st);
                Err(e.to_string())
            }
        }
    }

    /// Starts up to `count` sandboxes for `name` and waits until they are warm.
    pub async fn prewarm(
        self: &Arc<Self>,
        name: &str,
        count: u32,
    ) -> Result<serde_json::Value, ApiError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(ApiError::shutting_down());
        }
        if count == 0 || count > 1000 {
            return Err(ApiError::bad_request("count must be between 1 and 1000"));
        }
        let reg = self
            .registry
            .get(name)
            .ok_or_else(|| ApiError::unknown_function(name))?;
        let (ids, no_memory) = {
            let now = self.now();
            let mut st = self.state.lock();
            st.engine
                .prewarm(now, &reg.spec.name, reg.spec.memory_mb, count)
        };
        let tasks: Vec<_> = ids
            .into_iter()
            .map(|id| {
                let me = Arc::clone(self);
                let reg = reg.clone();
                tokio::spawn(async move { me.create_prewarmed(id, &reg).await })
            })
            .collect();
        let mut ready = 0;
        let mut errors = Vec::new();
        for t in tasks {
            match t.await {
                Ok(Ok(())) => ready += 1,
                Ok(Err(e)) => errors.push(e),
                Err(e) => errors.push(e.to_string()),
            }
        }
        if ready == 0 && (no_memory > 0 || !errors.is_empty()) {
            let msg = if no_memory > 0 {
                format!(
                    "no free memory for {no_memory} sandbox(es) of {name} (prewarm never evicts)"
                )
            } else {
                errors.join("; ")
            };
            return Err(if no_memory > 0 {
                ApiError::overloaded(msg)
            } else {
                ApiError::new(StatusCode::BAD_GATEWAY, "sandbox_start_failed", msg)
            });
        }
        Ok(json!({
            "function": name,
            "requested": count,
            "ready": ready,
            "no_memory": no_memory,
            "errors": errors,
        }))
    }

    /// Registers or updates a function; sandboxes of the previous version are retired.
    pub fn register(
        &self,
        spec: FunctionSpec,
        code: Option<CodeSource>,
    ) -> Result<(Registered, bool), ApiError> {
        if spec.memory_mb > self.config.memory_mb {
            return Err(ApiError::bad_request(format!(
                "memory_mb {} exceeds this worker's memory budget of {} MiB",
                spec.memory_mb, self.config.memory_mb
            )));
        }
        let (reg, previous) = self
            .registry
            .put(spec, code, self.backend.needs_code())
            .map_err(|e| match e {
                RegistryError::BadCode(m) => ApiError::bad_request(m),
                RegistryError::Storage(m) => ApiError::internal(m),
            })?;
        let created = previous.is_none();
        if let Some(prev) = previous {
            self.retire(&prev);
        }
        Ok((reg, created))
    }

    /// Deletes a function: running invocations finish, then its sandboxes go.
    pub fn unregister(&self, name: &str) -> Result<(), ApiError> {
        let removed = self
            .registry
            .remove(name)
            .map_err(|e| ApiError::internal(e.to_string()))?
            .ok_or_else(|| ApiError::unknown_function(name))?;
        self.retire(&removed);
        Ok(())
    }

    fn retire(&self, old: &Registered) {
        {
            let mut st = self.state.lock();
            st.engine.retire(&old.spec.name);
            self.drain(&mut st);
        }
        if let Some(dir) = &old.code_dir {
            if self.code_users.get(dir).is_none_or(|n| *n == 0) {
                self.registry.remove_code_dir(dir);
            }
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn stats(&self) -> EngineStats {
        self.state.lock().engine.stats()
    }

    /// What the worker has learned about a function (`GET /v1/functions/{name}`).
    pub fn characteristics(&self, name: &str) -> Option<serde_json::Value> {
        let now = self.now();
        self.state
            .lock()
            .engine
            .characteristics(name, now)
            .map(|c| json!(c))
    }

    /// `GET /v1/status`.
    pub fn status(&self) -> serde_json::Value {
        let stats = self.stats();
        let pool = &stats.pool;
        let functions: serde_json::Map<String, serde_json::Value> = pool
            .functions
            .iter()
            .map(|(name, f)| (name.clone(), json!(f)))
            .collect();
        let used = pool.memory_running_mb + pool.memory_warm_mb;
        let mut policies = json!({
            "queue": self.config.queue.name(),
            "keepalive": self.config.keepalive.name(),
            "regulator": match self.config.regulator() {
                Ok(r) => r.name(),
                Err(_) => "invalid".into(),
            },
        });
        if self.config.keepalive == hearth_core::KeepAliveKind::Ttl {
            policies["keepalive_ttl_s"] = json!(self.config.keepalive_ttl_s);
        }
        if self.config.bypass_ms > 0.0 {
            policies["bypass_ms"] = json!(self.config.bypass_ms);
            policies["bypass_load"] = json!(self.config.bypass_load);
        }
        json!({
            "worker": self.id,
            "backend": self.backend.name(),
            "uptime_s": self.epoch.elapsed().as_secs(),
            "shutting_down": self.shutting_down.load(Ordering::Acquire),
            "in_flight": self.in_flight.count(),
            "async_running": self.invocations.running(),
            "memory": {
                "budget_mb": pool.memory_budget_mb,
                "running_mb": pool.memory_running_mb,
                "warm_mb": pool.memory_warm_mb,
                "free_mb": pool.memory_budget_mb.saturating_sub(used),
            },
            "load": {
                "cpus": stats.cpus,
                "load_avg_1m": stats.load_avg,
                "normalized": stats.normalized_load,
            },
            "queue": {
                "length": stats.queue_length,
                "running": stats.running + stats.running_bypass,
                "running_bypass": stats.running_bypass,
                "limit": stats.limit,
                "queued": stats.queued,
            },
            "functions": functions,
            "policies": policies,
            "low_latency": {
                "enabled": self.config.low_latency,
                "held": self.latency.is_held(),
            },
        })
    }

    /// New invocations are refused with 503 from now on.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    /// Graceful stop: refuse new work, let in-flight invocations finish within the grace period,
    /// then remove every sandbox.
    pub async fn shutdown(&self, grace: Duration) {
        self.shutting_down.store(true, Ordering::Release);
        let deadline = tokio::time::Instant::now() + grace;
        if !self.in_flight.wait_idle(deadline).await {
            tracing::warn!(
                in_flight = self.in_flight.count(),
                "grace period over; killing the remaining sandboxes"
            );
        }
        {
            let mut st = self.state.lock();
            st.engine.shutdown();
            self.drain(&mut st);
        }
        let (tx, rx) = oneshot::channel();
        if self.lifecycle.send(LifecycleMsg::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
        self.backend.cleanup_all().await;
        tracing::info!("all sandboxes removed");
    }
}

/// A queued invocation's wait. Dropping it early (the client went away) takes the invocation out
/// of the queue, or, if it was dispatched meanwhile, hands its run back unused.
struct QueueWait<'a> {
    worker: &'a Worker,
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
        let w = self.worker;
        let now = w.now();
        let mut st = w.state.lock();
        if st.waiters.remove(&self.id).is_some() {
            st.engine.on_cancel(now, self.id);
        } else if let Ok(Dispatch::Run(run, sandbox)) = rx.try_recv() {
            if let Some(sb) = sandbox {
                st.parked.insert(run.sandbox, sb);
            }
            st.engine.on_abandoned(now, &run);
        }
        w.drain(&mut st);
    }
}

/// Exclusive use of a sandbox for one run. Dropping it reports the run's end and hands the
/// sandbox back; unless the invocation finished cleanly (`completion.reusable`), the sandbox is
/// destroyed, so a cancelled or timed-out request can never leave a sandbox in an unknown state
/// in the pool.
struct Lease<'a> {
    worker: &'a Worker,
    run: Run,
    sandbox: Option<Sandbox>,
    completion: Completion,
}

impl<'a> Lease<'a> {
    fn new(worker: &'a Worker, run: Run, sandbox: Sandbox) -> Self {
        Lease {
            worker,
            run,
            sandbox: Some(sandbox),
            completion: Completion {
                exec_us: None,
                init_us: None,
                reusable: false,
            },
        }
    }

    fn sandbox(&mut self) -> &mut Sandbox {
        self.sandbox
            .as_mut()
            .unwrap_or_else(|| unreachable!("a lease holds its sandbox until dropped"))
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let sb = self.sandbox.take();
        self.worker.complete(&self.run, sb, self.completion);
    }
}

fn start_error(name: &str, e: SandboxError) -> ApiError {
    match e {
        SandboxError::InitFailed {
            kind,
            message,
            traceback,
        } => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "init_error",
            format!("{name} failed to initialize: {kind}: {message}"),
        )
        .with("type", json!(kind))
        .with("traceback", json!(traceback)),
        SandboxError::OutOfMemory { .. } => {
            ApiError::new(StatusCode::BAD_GATEWAY, "out_of_memory", e.to_string())
        }
        other => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "sandbox_start_failed",
            other.to_string(),
        ),
    }
}

/// 502 for a handler that raised (or returned something unserializable).
fn handler_error(
    name: &str,
    reply: &AgentReply,
    cold: Option<ColdReason>,
    timing: &Timing,
    worker: &str,
) -> ApiError {
    let v: serde_json::Value = serde_json::from_slice(&reply.body).unwrap_or_default();
    let field = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
    let (kind, message) = (field("type"), field("message"));
    let (status, code) = match reply.status {
        400 => (StatusCode::BAD_REQUEST, "bad_request"),
        _ => (StatusCode::BAD_GATEWAY, "handler_error"),
    };
    ApiError::new(status, code, format!("{name} raised {kind}: {message}"))
        .with("type", json!(kind))
        .with("traceback", json!(field("traceback")))
        .with("cold", json!(cold.is_some()))
        .with("worker", json!(worker))
        .with("timing", json!(timing))
}

/// Destroys sandboxes and starts the policy's pre-warms, off the invocation path.
async fn lifecycle(worker: Arc<Worker>, mut rx: mpsc::UnboundedReceiver<LifecycleMsg>) {
    while let Some(msg) = rx.recv().await {
        match msg {
            LifecycleMsg::Destroy(sb) => {
                let dir = worker.backend.code_dir(&sb).map(|d| d.to_path_buf());
                worker.backend.destroy(sb).await;
                if let Some(dir) = dir {
                    worker.count_code_user(&dir, -1);
                }
            }
            LifecycleMsg::Prewarm { sandbox, function } => {
                let w = Arc::clone(&worker);
                tokio::spawn(async move {
                    match w.registry.get(&function) {
                        Some(reg) => {
                            if let Err(e) = w.create_prewarmed(sandbox, &reg).await {
                                tracing::warn!(%function, error = %e, "policy pre-warm failed");
                            }
                        }
                        None => {
                            let now = w.now();
                            let mut st = w.state.lock();
                            st.engine.on_prewarm_failed(now, sandbox);
                            w.drain(&mut st);
                        }
                    }
                });
            }
            LifecycleMsg::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// How often a real worker reads the kernel's load average.
const LOAD_SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Keep-alive timers, the free-memory buffer, load sampling and async-result retention, in the
/// background.
async fn maintenance(worker: std::sync::Weak<Worker>) {
    let mut last_load = Instant::now() - LOAD_SAMPLE_EVERY;
    loop {
        let wait = {
            let Some(w) = worker.upgrade() else { return };
            let sample = match w.config.backend {
                BackendKind::Runc if last_load.elapsed() >= LOAD_SAMPLE_EVERY => {
                    last_load = Instant::now();
                    kernel_load_avg().map(|l| l / f64::from(w.config.effective_cpus().max(1)))
                }
                _ => None,
            };
            let now = w.now();
            let mut st = w.state.lock();
            if let Some(load) = sample {
                st.engine.on_load(now, load);
            }
            st.engine.on_timeout(now);
            w.drain(&mut st);
            let next = st.engine.next_timeout().unwrap_or(Micros::MAX);
            drop(st);
            w.latency.tick();
            w.invocations.expire(Instant::now());
            Duration::from_micros(next.saturating_sub(now).clamp(1_000, 1_000_000))
        };
        tokio::time::sleep(wait).await;
    }
}

/// The kernel's 1-minute load average.
fn kernel_load_avg() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().next()?.parse().ok()
}
