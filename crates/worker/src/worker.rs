//! The worker: drives the sans-I/O [`SandboxPool`] with real time and real sandboxes.
//!
//! Hot path of a warm invocation: registry lookup → one short lock to acquire a parked sandbox →
//! one request on its persistent agent connection → one short lock to park it again. Sandbox
//! destruction and keep-alive maintenance run on background tasks.

use crate::agent_client::AgentReply;
use crate::backend::{Backend, Sandbox, SandboxError};
use crate::config::WorkerConfig;
use crate::error::ApiError;
use crate::invocations::AsyncInvocations;
use crate::metrics::{ColdLabel, FnLabel, Metrics, Outcome, StateLabel};
use crate::registry::{CodeSource, Registered, Registry, RegistryError};
use axum::http::StatusCode;
use bytes::Bytes;
use dashmap::DashMap;
use hearth_core::{
    Acquire, ColdReason, FunctionSpec, Micros, PoolAction, PoolConfig, PoolStats, SandboxId,
    SandboxPool,
};
use parking_lot::Mutex;
use serde_json::json;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Notify};

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

/// What the pool tracks plus the sandboxes not currently running an invocation.
struct PoolState {
    pool: SandboxPool,
    /// Idle sandboxes, and sandboxes being handed back to the pool.
    parked: HashMap<SandboxId, Sandbox>,
}

enum ReaperMsg {
    Destroy(Sandbox),
    Flush(oneshot::Sender<()>),
}

/// The worker.
pub struct Worker {
    id: String,
    config: WorkerConfig,
    epoch: Instant,
    registry: Registry,
    backend: Backend,
    state: Mutex<PoolState>,
    reaper: mpsc::UnboundedSender<ReaperMsg>,
    pub metrics: Metrics,
    pub invocations: AsyncInvocations,
    shutting_down: AtomicBool,
    in_flight: AtomicUsize,
    in_flight_done: Notify,
    /// Live sandboxes per code directory, so retired code is removed once unused.
    code_users: DashMap<PathBuf, usize>,
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
}

impl Worker {
    /// Opens the registry, prepares the backend (removing leftovers of a crashed run) and starts
    /// the background tasks.
    pub async fn start(config: WorkerConfig) -> Result<Arc<Self>, StartError> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| StartError::DataDir(config.data_dir.clone(), e))?;
        let data_dir = std::fs::canonicalize(&config.data_dir)
            .map_err(|e| StartError::DataDir(config.data_dir.clone(), e))?;
        let id = config.worker_id();
        let registry = Registry::open(&data_dir)?;
        let backend = match config.backend {
            crate::config::BackendKind::Runc => Backend::Runc(
                crate::backend::runc::RuncBackend::new(config.runc.clone(), &data_dir, &id).await?,
            ),
            crate::config::BackendKind::Sim => Backend::Sim(crate::backend::sim::SimBackend),
        };
        backend.cleanup_all().await;
        let pool = SandboxPool::new(PoolConfig {
            memory_budget_mb: config.memory_mb,
            free_buffer_mb: config.free_buffer_mb,
            keepalive_ttl: config.keepalive_ttl_s.saturating_mul(1_000_000),
        });
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
            state: Mutex::new(PoolState {
                pool,
                parked: HashMap::new(),
            }),
            reaper: tx,
            metrics: Metrics::default(),
            shutting_down: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            in_flight_done: Notify::new(),
            code_users: DashMap::new(),
        });
        tokio::spawn(reaper(Arc::clone(&worker), rx));
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

    /// Carries out the pool's actions. Called with the state locked, right after every event.
    fn drain(&self, st: &mut PoolState) {
        while let Some(PoolAction::Destroy { sandbox, reason }) = st.pool.poll_action() {
            let label = StateLabel {
                state: match reason {
                    hearth_core::DestroyReason::Expired => "expired",
                    hearth_core::DestroyReason::Evicted => "evicted",
                    hearth_core::DestroyReason::Retired => "retired",
                    hearth_core::DestroyReason::Failed => "failed",
                    hearth_core::DestroyReason::Shutdown => "shutdown",
                },
            };
            self.metrics.sandboxes_destroyed.get_or_create(&label).inc();
            if let Some(sb) = st.parked.remove(&sandbox) {
                let _ = self.reaper.send(ReaperMsg::Destroy(sb));
            }
        }
    }

    /// Hands a sandbox back to the pool after an invocation.
    fn release(&self, id: SandboxId, sandbox: Sandbox, reusable: bool) {
        let now = self.now();
        let mut st = self.state.lock();
        st.parked.insert(id, sandbox);
        st.pool.release(now, id, reusable);
        self.drain(&mut st);
    }

    fn in_flight(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self)
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
        let _guard = self.in_flight();
        let reg = self
            .registry
            .get(name)
            .ok_or_else(|| ApiError::unknown_function(name))?;
        let spec = &reg.spec;
        let (acquired, parked) = {
            let now = self.now();
            let mut st = self.state.lock();
            let a = st.pool.acquire(now, &spec.name, spec.memory_mb);
            let parked = match a {
                Acquire::Warm(id) => st.parked.remove(&id),
                _ => None,
            };
            self.drain(&mut st);
            (a, parked)
        };
        let (mut lease, cold, init_us) = match (acquired, parked) {
            (Acquire::Warm(id), Some(sb)) => {
                self.metrics
                    .warm_starts
                    .get_or_create(&FnLabel {
                        function: spec.name.clone(),
                    })
                    .inc();
                (Lease::new(self, id, sb), None, 0)
            }
            (Acquire::Warm(id), None) => {
                // The pool and the parked map disagree: never expected; fail safe.
                self.state.lock().pool.release(self.now(), id, false);
                return Err(ApiError::internal("warm sandbox missing"));
            }
            (Acquire::Cold { sandbox, reason }, _) => {
                let started = Instant::now();
                let sb = self.cold_start(sandbox, &reg).await.inspect_err(|_| {
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
                (Lease::new(self, sandbox, sb), Some(reason), init_us)
            }
            (Acquire::NoMemory { needed_mb, free_mb }, _) => {
                self.metrics.outcome(&spec.name, Outcome::rejected);
                return Err(ApiError::overloaded(format!(
                    "no memory for a new sandbox of {name}: it needs {needed_mb} MiB and {free_mb} MiB \
                     are free after evicting every idle sandbox (budget {} MiB)",
                    self.config.memory_mb
                )));
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
        // The agent answered, so the sandbox is healthy whatever the handler did.
        lease.reusable = true;
        drop(lease);
        let exec = reply.exec_us.unwrap_or(0);
        let e2e = t0.elapsed().as_micros() as u64;
        let timing = Timing {
            queue: 0,
            init: init_us,
            exec,
            overhead: e2e.saturating_sub(exec + init_us),
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
                    cold,
                    timing,
                })
            }
            _ => {
                self.metrics.outcome(&spec.name, Outcome::handler_error);
                Err(handler_error(name, &reply, cold, &timing, &self.id))
            }
        }
    }

    /// Starts a sandbox on a task of its own, so that a caller that goes away (client
    /// disconnect) cannot leave a half-created sandbox behind: the task parks it instead.
    async fn cold_start(
        self: &Arc<Self>,
        id: SandboxId,
        reg: &Registered,
    ) -> Result<Sandbox, ApiError> {
        let (tx, rx) = oneshot::channel();
        let me = Arc::clone(self);
        let name = reg.spec.name.clone();
        let reg = reg.clone();
        tokio::spawn(async move {
            let res = me
                .backend
                .create(id, &reg.spec, reg.code_dir.as_deref())
                .await;
            match res {
                Ok(sb) => {
                    me.sandbox_created(&sb);
                    if let Err(Ok(sb)) = tx.send(Ok(sb)) {
                        me.release(id, sb, true);
                    }
                }
                Err(e) => {
                    let mut st = me.state.lock();
                    st.pool.on_start_failed(id);
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
        let mut ids = Vec::new();
        let mut no_memory = 0;
        {
            let now = self.now();
            let mut st = self.state.lock();
            for _ in 0..count {
                match st.pool.prewarm(now, &reg.spec.name, reg.spec.memory_mb) {
                    Ok(id) => ids.push(id),
                    Err(_) => no_memory += 1,
                }
            }
        }
        let tasks: Vec<_> = ids
            .into_iter()
            .map(|id| {
                let me = Arc::clone(self);
                let reg = reg.clone();
                tokio::spawn(async move {
                    match me
                        .backend
                        .create(id, &reg.spec, reg.code_dir.as_deref())
                        .await
                    {
                        Ok(sb) => {
                            me.sandbox_created(&sb);
                            let now = me.now();
                            let mut st = me.state.lock();
                            st.parked.insert(id, sb);
                            st.pool.on_sandbox_ready(now, id);
                            me.drain(&mut st);
                            Ok(())
                        }
                        Err(e) => {
                            me.state.lock().pool.on_start_failed(id);
                            Err(e.to_string())
                        }
                    }
                })
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
            st.pool.retire(&old.spec.name);
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

    pub fn pool_stats(&self) -> PoolStats {
        self.state.lock().pool.stats()
    }

    /// `GET /v1/status`.
    pub fn status(&self) -> serde_json::Value {
        let stats = self.pool_stats();
        let functions: serde_json::Map<String, serde_json::Value> = stats
            .functions
            .iter()
            .map(|(name, f)| (name.clone(), json!(f)))
            .collect();
        let used = stats.memory_running_mb + stats.memory_warm_mb;
        json!({
            "worker": self.id,
            "backend": self.backend.name(),
            "uptime_s": self.epoch.elapsed().as_secs(),
            "shutting_down": self.shutting_down.load(Ordering::Acquire),
            "in_flight": self.in_flight.load(Ordering::Acquire),
            "async_running": self.invocations.running(),
            "memory": {
                "budget_mb": stats.memory_budget_mb,
                "running_mb": stats.memory_running_mb,
                "warm_mb": stats.memory_warm_mb,
                "free_mb": stats.memory_budget_mb.saturating_sub(used),
            },
            "functions": functions,
            "policies": {
                "keepalive": "ttl",
                "keepalive_ttl_s": self.config.keepalive_ttl_s,
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
        while self.in_flight.load(Ordering::Acquire) > 0 {
            let notified = self.in_flight_done.notified();
            if self.in_flight.load(Ordering::Acquire) == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                tracing::warn!(
                    in_flight = self.in_flight.load(Ordering::Acquire),
                    "grace period over; killing the remaining sandboxes"
                );
                break;
            }
        }
        {
            let mut st = self.state.lock();
            st.pool.shutdown();
            self.drain(&mut st);
        }
        let (tx, rx) = oneshot::channel();
        if self.reaper.send(ReaperMsg::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
        self.backend.cleanup_all().await;
        tracing::info!("all sandboxes removed");
    }
}

/// Counts an invocation in flight until dropped.
struct InFlight<'a>(&'a Worker);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.in_flight_done.notify_waiters();
        }
    }
}

/// Exclusive use of a sandbox for one invocation. Dropping it hands the sandbox back; unless the
/// invocation finished cleanly (`reusable`), the sandbox is destroyed, so a cancelled or
/// timed-out request can never leave a sandbox in an unknown state in the pool.
struct Lease<'a> {
    worker: &'a Worker,
    id: SandboxId,
    sandbox: Option<Sandbox>,
    reusable: bool,
}

impl<'a> Lease<'a> {
    fn new(worker: &'a Worker, id: SandboxId, sandbox: Sandbox) -> Self {
        Lease {
            worker,
            id,
            sandbox: Some(sandbox),
            reusable: false,
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
        if let Some(sb) = self.sandbox.take() {
            self.worker.release(self.id, sb, self.reusable);
        }
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

/// Destroys sandboxes off the invocation path.
async fn reaper(worker: Arc<Worker>, mut rx: mpsc::UnboundedReceiver<ReaperMsg>) {
    while let Some(msg) = rx.recv().await {
        match msg {
            ReaperMsg::Destroy(sb) => {
                let dir = worker.backend.code_dir(&sb).map(|d| d.to_path_buf());
                worker.backend.destroy(sb).await;
                if let Some(dir) = dir {
                    worker.count_code_user(&dir, -1);
                }
            }
            ReaperMsg::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Keep-alive expiry, the free-memory buffer and async-result retention, in the background.
async fn maintenance(worker: std::sync::Weak<Worker>) {
    loop {
        let wait = {
            let Some(w) = worker.upgrade() else { return };
            let now = w.now();
            let mut st = w.state.lock();
            st.pool.on_timeout(now);
            w.drain(&mut st);
            let next = st.pool.next_timeout().unwrap_or(Micros::MAX);
            drop(st);
            w.invocations.expire(Instant::now());
            Duration::from_micros(next.saturating_sub(now).clamp(1_000, 1_000_000))
        };
        tokio::time::sleep(wait).await;
    }
}
