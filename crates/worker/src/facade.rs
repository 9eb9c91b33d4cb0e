//! The worker's domain operations: invoke, register, delete, prewarm, status. Each returns a
//! domain result or a domain error ([`crate::errors`]); none knows about HTTP. The engine and
//! its sandboxes are the [`Driver`]'s.

use crate::agent_client::AgentReply;
use crate::backend::{Backend, SandboxError};
use crate::config::{BackendKind, WorkerConfig};
use crate::cpu_sched::CpuScheduler;
use crate::driver::{Driver, LoadSampling, StartFailure};
use crate::errors::{
    HandlerFailure, InvokeError, PrewarmError, ProactiveBatchError, RegisterError, UnregisterError,
};
use crate::gpu::executor::SIM_GPU_RESULT;
use crate::gpu::{GpuExecutor, GpuRefusal, GpuRunError};
use crate::layers::build::Builder;
use crate::layers::requirements::{self, REQUIREMENTS_FILE};
use crate::layers::LayerStore;
use crate::metrics::{
    start_label, ColdLabel, FnLabel, GpuStartLabel, Metrics, Outcome, QueueLabel,
};
use crate::runtimes::{Runtime, RuntimeStore, DEFAULT_RUNTIME};
use bytes::Bytes;
use hearth_api::{
    raw_json, ColdPath, Device, FunctionSpec, GpuInfo, GpuPlacement, InvokeAnswer, LoadStatus,
    LowLatencyStatus, MemoryStatus, PolicyStatus, PrewarmAnswer, ProactiveAnswer, ProactiveCommand,
    ProactiveCounts, ProactiveFailure, ProactiveOp, ProactivePoolStatus, ProactiveResult,
    QueueStatus, Timing, WorkerStatus,
};
use hearth_core::characteristics::CharacteristicsReport;
use hearth_core::gpu::{GpuReject, Start};
use hearth_core::pool::FunctionPoolStats;
use hearth_core::{
    EngineConfig, EngineStats, LoadSource, Micros, PoolConfig, PoolConfigError, ProactiveError,
    Reject,
};
use hearth_service::auth::{Auth, AuthError, AuthSettings, WorkerSecret};
use hearth_service::dedup::Dedup;
use hearth_service::delivery::{Accepted, Attempted, Delivery, DeliverySettings, Runner};
use hearth_service::in_flight::InFlightTracker;
use hearth_service::quota::{MemoryClaim, QuotaError, QuotaGuard, Quotas};
use hearth_service::registry::{CodeSource, FunctionState, Registered, Registry, RegistryError};
use hearth_service::serving::open_data_dir;
use hearth_service::store::sqlite::SqliteAsyncStore;
use hearth_service::store::{StoreError, StoredInvocation};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The worker.
pub struct Worker {
    id: String,
    config: WorkerConfig,
    epoch: Instant,
    registry: Arc<Registry>,
    driver: Arc<Driver>,
    pub metrics: Arc<Metrics>,
    /// Async invocations, durable in `async.db`.
    delivery: Arc<Delivery>,
    /// Invocation ids a controller sent: each runs once here.
    dedup: Dedup,
    /// The cluster-wide version each function was registered with by a controller.
    cluster_versions: dashmap::DashMap<String, u64>,
    shutting_down: AtomicBool,
    in_flight: InFlightTracker,
    latency: crate::latency::LowLatency,
    auth: Arc<Auth>,
    quotas: Quotas,
    /// Namespaces with functions registered here: with two or more, each gets a fair share.
    namespaces: AtomicUsize,
    /// The CPU scheduling of sandboxes (None with `cpu_sched = cfs`).
    cpu_sched: Option<Arc<CpuScheduler>>,
    /// The GPUs found or declared at start (`[gpu]`); fixed for the process's life.
    gpus: Vec<GpuInfo>,
    /// The GPU scheduler and its devices; `None` without GPUs.
    gpu_exec: Option<Arc<GpuExecutor>>,
    /// Builds dependency layers and bytecode (runc workers); None: a function is ready as
    /// soon as it is registered.
    builder: Option<Arc<Builder>>,
    /// The runtime images builds run on.
    runtimes: RuntimeStore,
    /// Held by a collection of unused layers from reading which are in use until it removed
    /// the others; taken and let go by a build before it looks for its layer, so that a layer
    /// a registration just started to use is never removed under it.
    layers_gc: Arc<tokio::sync::Mutex<()>>,
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
    #[error("authentication: {0}")]
    Auth(#[from] AuthError),
    #[error("async store: {0}")]
    Store(#[from] StoreError),
    #[error("configuration: {0}")]
    Pool(#[from] PoolConfigError),
    #[error("{0}")]
    CpuSched(#[from] crate::cpu_sched::CpuSchedError),
    #[error("configuration: {0}")]
    Gpu(String),
}

impl Worker {
    /// Opens the registry, prepares the backend (removing leftovers of a crashed run) and starts
    /// the driver and the housekeeping task.
    pub async fn start(config: WorkerConfig) -> Result<Arc<Self>, StartError> {
        config.check_gpu_backend()?;
        let data_dir = open_data_dir(&config.data_dir)
            .map_err(|e| StartError::DataDir(config.data_dir.clone(), e))?;
        let id = config.worker_id();
        let registry = Arc::new(Registry::open_with(&data_dir, config.code_intake())?);
        // A worker holds its own credential, never the controllers' cluster key.
        let worker_secret = match &config.cluster_key_file {
            Some(path) => Some(WorkerSecret::read(path)?),
            None => None,
        };
        let auth = Auth::open(AuthSettings {
            enabled: config.auth,
            data_dir: &data_dir,
            cluster_key: None,
            worker_secret,
        })?;
        let backend = match config.backend {
            BackendKind::Runc => Backend::Runc(
                crate::backend::runc::RuncBackend::new(
                    config.runc.clone(),
                    &data_dir,
                    &id,
                    config.max_result_bytes,
                    config.cpu_sched != crate::cpu_sched::CpuSchedKind::Cfs,
                )
                .await?,
            ),
            BackendKind::Sim => Backend::Sim(crate::backend::sim::SimBackend::new()),
        };
        backend.cleanup_all().await;
        let runtimes = RuntimeStore::new(&config.runc.runtime_store);
        let builder = match config.backend {
            BackendKind::Runc => {
                let mut build = config.build.clone();
                build.runtime_store = Some(config.runc.runtime_store.clone());
                let b = Builder::new(
                    build,
                    &config.runc.runc_path,
                    &data_dir,
                    &id,
                    config.runc.uid_base,
                    LayerStore::new(data_dir.join("layers")),
                )
                .await
                .map_err(|e| {
                    SandboxError::StartFailed(format!("preparing the build sandboxes: {e}"))
                })?;
                let rts = runtimes.clone();
                registry.set_code_check(Arc::new(
                    move |spec: &FunctionSpec, dir: &std::path::Path| code_layer(&rts, spec, dir),
                ));
                Some(b)
            }
            BackendKind::Sim => None,
        };
        let (gpus, nvml) = {
            // NVML loads a library and initializes the driver: not on an async thread.
            let settings = config.gpu.clone();
            match tokio::task::spawn_blocking(move || crate::gpu::discover_nvml(&settings)).await {
                Ok(found) => (found.gpus, found.nvml),
                Err(_) => (Vec::new(), None),
            }
        };
        let cpus = config.effective_cpus();
        let pool = PoolConfig {
            memory_budget_mb: config.memory_mb,
            free_buffer_mb: config.free_buffer_mb,
            keepalive: config.keepalive_config(),
            generic: config.generic_config(),
            // Atoll's proactive pool, filled by a controller (`POST /v1/cluster/proactive`).
            proactive_mb: config.proactive_mb,
        };
        pool.validate()?;
        let engine = EngineConfig {
            pool,
            queue: config.queue,
            max_queue: config.max_queue,
            regulator: config.regulator()?,
            bypass: hearth_core::bypass::BypassConfig {
                threshold_us: (config.bypass_ms * 1000.0).round() as Micros,
                max_load: config.bypass_load,
            },
            cpus,
            // Sim workers share one machine: their load is their own simulated one.
            load_source: match config.backend {
                BackendKind::Runc => LoadSource::External,
                BackendKind::Sim => LoadSource::Simulated,
            },
            warm_wait: config.warm_wait,
        };
        let load = match config.backend {
            BackendKind::Runc => LoadSampling::Kernel { cpus },
            BackendKind::Sim => LoadSampling::None,
        };
        let metrics = Arc::new(Metrics::default());
        let cpu_sched = CpuScheduler::start(
            config.cpu_sched,
            config.sfs_slice_ms,
            config.effective_cpus(),
            Arc::clone(&metrics),
        )?;
        let driver = Driver::start(
            engine,
            backend,
            Arc::clone(&registry),
            Arc::clone(&metrics),
            load,
            config.creation_cap(),
            config.elastic_controller(0)?,
        );
        let gpu_exec = match (gpus.is_empty(), config.backend) {
            (true, _) => None,
            // The sim backend runs no processes: its GPUs (declared, or even real ones) are
            // simulated too.
            (false, BackendKind::Sim) => Some(GpuExecutor::simulated(&gpus, &config.gpu)),
            (false, BackendKind::Runc) => Some(GpuExecutor::real(
                &gpus,
                &config.gpu,
                Arc::clone(&driver),
                nvml,
            )),
        };
        let gpu_exec = match gpu_exec.transpose().map_err(StartError::Gpu)? {
            Some(exec) => {
                exec.start_sampling();
                Some(exec)
            }
            None => None,
        };
        let latency = crate::latency::LowLatency::new(
            config.low_latency,
            Duration::from_millis(config.low_latency_quiet_ms),
        );
        let config_quota = (config.quota, config.quotas.clone());
        let store = Arc::new(SqliteAsyncStore::open_with(
            &data_dir,
            config.async_limits(),
        )?);
        let runner = Arc::new(WorkerRunner(std::sync::OnceLock::new()));
        let delivery = Delivery::new(
            store,
            Arc::clone(&runner) as Arc<dyn Runner>,
            DeliverySettings {
                retry_backoff: Duration::from_millis(config.async_retry_backoff_ms),
                orphan_scan: None,
                first_scan_after: Duration::ZERO,
                retention: Duration::from_secs(config.async_retention_s),
                // An answer larger than a namespace's share would only evict itself.
                max_answer_bytes: config
                    .async_max_bytes
                    .min(config.async_limits().max_bytes_per_namespace),
            },
        );
        let worker = Arc::new(Worker {
            id,
            delivery,
            dedup: Dedup::new(DEDUP_TTL, DEDUP_MAX_BYTES),
            cluster_versions: dashmap::DashMap::new(),
            config,
            epoch: Instant::now(),
            registry,
            driver,
            metrics,
            shutting_down: AtomicBool::new(false),
            in_flight: InFlightTracker::new(),
            latency,
            auth,
            quotas: Quotas::new(config_quota.0, config_quota.1),
            namespaces: AtomicUsize::new(0),
            cpu_sched,
            gpus,
            gpu_exec,
            builder,
            runtimes,
            layers_gc: Arc::new(tokio::sync::Mutex::new(())),
        });
        worker.recount_namespaces();
        worker.warn_unrunnable_gpu_functions();
        let _ = runner.0.set(Arc::downgrade(&worker));
        // Async invocations a crash left unfinished run again now.
        worker.delivery.start_background();
        // Builds a restart interrupted run again: their inputs (code, requirements) are all
        // on disk, so the function gets ready without its owner registering it again.
        for reg in worker.registry.list() {
            if reg.state == FunctionState::Building {
                worker.start_build(reg);
            }
        }
        worker.collect_layers();
        tokio::spawn(housekeeping(Arc::downgrade(&worker)));
        Ok(worker)
    }

    /// The worker's authentication (keys, the cluster credential).
    pub fn auth(&self) -> &Arc<Auth> {
        &self.auth
    }

    /// Admits one invocation of `function` against its namespace's quota and its fair share of
    /// this worker's slots and sandbox memory (so that one tenant's big calls cannot make
    /// another's cold start wait for memory); the slot and the memory are held until the guard
    /// drops.
    pub fn admit_call(&self, function: &str) -> Result<QuotaGuard, QuotaError> {
        let namespaces = self.namespaces.load(Ordering::Relaxed);
        let share = hearth_service::quota::fair_share(
            self.config.slots(),
            namespaces,
            self.config.namespace_share,
        );
        // Counted always, so that the share holds from the moment a second namespace comes.
        let memory = MemoryClaim {
            mb: self.registry.memory_mb(function).unwrap_or(0),
            share_mb: (namespaces >= 2)
                .then(|| {
                    hearth_service::quota::memory_share(
                        self.driver.memory_budget_mb(),
                        namespaces,
                        self.config.namespace_memory_share,
                    )
                })
                .flatten(),
        };
        self.quotas.admit_call(
            hearth_api::namespace::namespace_of(function),
            share,
            memory,
            Instant::now(),
        )
    }

    /// Counts the namespaces that have functions here (after every registry change).
    fn recount_namespaces(&self) {
        let namespaces: std::collections::BTreeSet<String> = self
            .registry
            .list()
            .iter()
            .map(|r| hearth_api::namespace::namespace_of(&r.spec.name).to_string())
            .collect();
        self.namespaces.store(namespaces.len(), Ordering::Relaxed);
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The worker's GPUs (`[gpu]`), in device order; empty when it has none.
    pub fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    /// The GPU scheduler's state; `None` without GPUs.
    pub fn gpu_status(&self) -> Option<hearth_core::gpu::GpuStatus> {
        self.gpu_exec.as_ref().map(|g| g.status())
    }

    /// The GPU queue and devices for `/metrics`; `None` without GPUs.
    pub fn gpu_gauges(&self) -> Option<hearth_core::gpu::GpuGauges> {
        self.gpu_exec.as_ref().map(|g| g.gauges())
    }

    /// `Ok` when this worker's GPUs can take `spec` (a `gpu` function needs a device with its
    /// `gpu_memory_mb`).
    pub fn admit_gpu(&self, spec: &FunctionSpec) -> Result<(), GpuRefusal> {
        crate::gpu::admit(&self.gpus, self.config.gpu.devices, spec)
    }

    /// Functions registered earlier that these GPUs cannot run: said once at start (their
    /// invocations are refused until the GPUs come back or the function changes).
    fn warn_unrunnable_gpu_functions(&self) {
        for r in self.registry.list() {
            if let Err(e) = self.admit_gpu(&r.spec) {
                tracing::warn!(function = %r.spec.name, "registered function cannot run here: {e}");
            }
        }
    }

    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    pub fn backend_name(&self) -> &'static str {
        self.driver.backend().name()
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn driver(&self) -> &Driver {
        &self.driver
    }

    fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// `deadline_ms` and `elapsed_us` are the call's, for a late one's answer.
    fn rejected(
        &self,
        name: &str,
        reason: Reject,
        deadline_ms: Option<u64>,
        elapsed_us: u64,
    ) -> InvokeError {
        self.metrics.outcome(name, Outcome::rejected);
        match reason {
            Reject::QueueFull { length } => InvokeError::QueueFull { length },
            Reject::NoMemory { needed_mb, free_mb } => InvokeError::NoMemory {
                function: name.to_string(),
                needed_mb,
                free_mb,
                budget_mb: self.driver.memory_budget_mb(),
            },
            Reject::TooLarge {
                needed_mb,
                budget_mb,
            } => InvokeError::TooLarge {
                function: name.to_string(),
                needed_mb,
                budget_mb,
            },
            Reject::ShuttingDown => InvokeError::ShuttingDown,
            Reject::Late { late_by_us } => {
                self.metrics
                    .deadlines_dropped
                    .get_or_create(&FnLabel {
                        function: name.to_string(),
                    })
                    .inc();
                // One that arrived with nothing left is late by what was spent before it came.
                let deadline_ms = deadline_ms.unwrap_or(0);
                let overspent = elapsed_us.saturating_sub(deadline_ms.saturating_mul(1000));
                InvokeError::DeadlinePassed {
                    function: name.to_string(),
                    deadline_ms,
                    late_by_us: late_by_us.max(overspent),
                }
            }
        }
    }

    /// Runs one invocation of `name` with JSON `args`; `t0` is when the request arrived.
    pub async fn invoke(
        &self,
        name: &str,
        args: &[u8],
        t0: Instant,
        call: CallDeadline,
    ) -> Result<InvokeAnswer, InvokeError> {
        if self.is_shutting_down() {
            return Err(InvokeError::ShuttingDown);
        }
        let _guard = self.in_flight.enter();
        self.latency.on_activity();
        let reg = self
            .registry
            .get(name)
            .ok_or_else(|| InvokeError::UnknownFunction(name.to_string()))?;
        ready(&reg)?;
        let spec = &reg.spec;
        self.admit_gpu(spec).map_err(|e| {
            self.metrics.outcome(&spec.name, Outcome::rejected);
            InvokeError::Gpu(e)
        })?;
        let deadline_ms = call.deadline_ms.or(spec.deadline_ms);
        if let Some(exec) = self.gpu_target(spec) {
            return self
                .invoke_gpu(exec, &reg, args, t0, call, deadline_ms)
                .await;
        }
        let left_us = deadline_ms.map(|d| (d * 1000).saturating_sub(call.elapsed_us));
        let admitted = self
            .driver
            .admit(spec, left_us, call.drop_late)
            .await
            .map_err(|r| self.rejected(&spec.name, r, deadline_ms, call.elapsed_us))?;
        let run = admitted.run().clone();
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
        let mut lease = match admitted.lease(&reg).await {
            Ok(lease) => lease,
            Err(failure) => {
                self.metrics.outcome(&spec.name, Outcome::init_error);
                return Err(match failure {
                    StartFailure::Sandbox(error) => InvokeError::Start {
                        function: spec.name.clone(),
                        error,
                    },
                    StartFailure::TaskFailed => InvokeError::Internal("sandbox start task failed"),
                    StartFailure::WarmSandboxMissing => {
                        InvokeError::Internal("warm sandbox missing")
                    }
                });
            }
        };
        let init_us = lease.completion.init_us.unwrap_or(0);
        let cold_path = lease.cold_path;
        let fn_label = || FnLabel {
            function: spec.name.clone(),
        };
        match run.cold {
            None => {
                self.metrics.warm_starts.get_or_create(&fn_label()).inc();
            }
            Some(reason) => {
                self.metrics
                    .cold_starts
                    .get_or_create(&ColdLabel {
                        function: spec.name.clone(),
                        reason: reason.as_str(),
                        path: cold_path.map_or("fresh", ColdPath::as_str),
                    })
                    .inc();
                self.metrics
                    .init
                    .get_or_create(&fn_label())
                    .observe(init_us as f64 / 1e6);
            }
        }
        let timeout = Duration::from_millis(spec.timeout_ms);
        let backend = self.driver.backend();
        // Boosted for its slice; ended (and its CPU time measured) when dropped, which every
        // exit below does before the lease hands the sandbox back.
        let boost = match (&self.cpu_sched, backend.cpu_controls(lease.sandbox())) {
            (Some(sched), Some(cpu)) => {
                Some(sched.begin(Arc::clone(cpu), &spec.name, spec.cpus, t0))
            }
            _ => None,
        };
        let reply = tokio::time::timeout(timeout, backend.invoke(lease.sandbox(), args)).await;
        drop(boost);
        let reply = match reply {
            Err(_) => {
                self.metrics.outcome(&spec.name, Outcome::timeout);
                return Err(InvokeError::Timeout {
                    function: name.to_string(),
                    timeout_ms: spec.timeout_ms,
                });
            }
            Ok(Err(e)) => {
                let outcome = match e {
                    SandboxError::OutOfMemory { .. } => Outcome::out_of_memory,
                    _ => Outcome::crashed,
                };
                self.metrics.outcome(&spec.name, outcome);
                return Err(InvokeError::Sandbox(e));
            }
            Ok(Ok(reply)) => reply,
        };
        let exec = reply.exec_us.unwrap_or(0);
        if spec.device == Device::Any {
            if let Some(g) = &self.gpu_exec {
                g.record(&spec.name, hearth_core::gpu::Device::Cpu, exec);
            }
        }
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
            controller: None,
        };
        self.metrics
            .exec
            .get_or_create(&fn_label())
            .observe(exec as f64 / 1e6);
        self.metrics.overhead.observe(timing.overhead as f64 / 1e6);
        let result = self.handler_result(name, &reply, run.cold.is_some(), timing)?;
        let mut answer = InvokeAnswer {
            result,
            cold: false,
            cold_reason: None,
            cold_reason_policy: None,
            cold_reason_ago_us: None,
            cold_path,
            worker: self.id.clone(),
            timing,
            deadline_ms,
            deadline_missed: None,
            deadline_margin_us: None,
            gpu: None,
        };
        self.judge_deadline(&mut answer, &spec.name, call.elapsed_us.saturating_add(e2e));
        if let Some(reason) = run.cold {
            answer = answer.with_cold_reason(reason, self.config.keepalive.name());
        }
        Ok(answer)
    }

    /// The handler's result in a sandbox's answer, or the handler's failure (it raised, or wrote
    /// something that is not JSON in place of its result), counted in the metrics either way.
    fn handler_result(
        &self,
        name: &str,
        reply: &AgentReply,
        cold: bool,
        timing: Timing,
    ) -> Result<Box<serde_json::value::RawValue>, InvokeError> {
        let failure = |agent_status: u16, kind: String, message: String, traceback: String| {
            InvokeError::Handler(Box::new(HandlerFailure {
                function: name.to_string(),
                agent_status,
                kind,
                message,
                traceback,
                cold,
                worker: self.id.clone(),
                timing,
            }))
        };
        if reply.status != 200 {
            self.metrics.outcome(name, Outcome::handler_error);
            let (kind, message, traceback) = handler_fault(&reply.body);
            return Err(failure(reply.status, kind, message, traceback));
        }
        let Ok(result) = raw_json(&reply.body) else {
            // Code in the sandbox wrote something that is not JSON in place of its result.
            self.metrics.outcome(name, Outcome::handler_error);
            return Err(failure(
                502,
                "InvalidResult".into(),
                "the sandbox's result is not valid JSON".into(),
                String::new(),
            ));
        };
        self.metrics.outcome(name, Outcome::success);
        Ok(result)
    }

    /// The GPU executor when `spec` runs on a GPU now: a `gpu` function always (admission
    /// checked this worker has one), an `any` function when one of this worker's GPUs can hold
    /// it and the speedup dispatch says so (else its CPU variant runs).
    fn gpu_target(&self, spec: &FunctionSpec) -> Option<&Arc<GpuExecutor>> {
        let exec = self.gpu_exec.as_ref()?;
        let fits =
            || hearth_api::largest_gpu_mb(&self.gpus).is_some_and(|mb| spec.gpu_memory_mb <= mb);
        match spec.device {
            Device::Gpu => Some(exec),
            Device::Any if fits() && exec.choose(&spec.name) == hearth_core::gpu::Device::Gpu => {
                Some(exec)
            }
            Device::Any | Device::Cpu => None,
        }
    }

    /// Runs one invocation on a GPU under the GPU scheduler (the CPU engine's queue, limit and
    /// pool are not involved: the GPU has its own, `gpu::executor`).
    async fn invoke_gpu(
        &self,
        exec: &GpuExecutor,
        reg: &Registered,
        args: &[u8],
        t0: Instant,
        call: CallDeadline,
        deadline_ms: Option<u64>,
    ) -> Result<InvokeAnswer, InvokeError> {
        let spec = &reg.spec;
        let run = match exec.run(reg, args).await {
            Ok(run) => run,
            Err(e) => {
                let (outcome, err) = match e {
                    GpuRunError::Rejected(GpuReject::QueueFull { length }) => {
                        (Outcome::rejected, InvokeError::QueueFull { length })
                    }
                    GpuRunError::Rejected(GpuReject::ShuttingDown) => {
                        (Outcome::rejected, InvokeError::ShuttingDown)
                    }
                    GpuRunError::Rejected(reason) => (
                        Outcome::rejected,
                        InvokeError::Gpu(GpuRefusal::Scheduler {
                            function: spec.name.clone(),
                            reason,
                        }),
                    ),
                    GpuRunError::Failed(why) => (
                        Outcome::crashed,
                        InvokeError::Sandbox(SandboxError::Crashed(why)),
                    ),
                    GpuRunError::Timeout { timeout_ms } => (
                        Outcome::timeout,
                        InvokeError::Timeout {
                            function: spec.name.clone(),
                            timeout_ms,
                        },
                    ),
                    GpuRunError::Sandbox(e @ SandboxError::OutOfMemory { .. }) => {
                        (Outcome::out_of_memory, InvokeError::Sandbox(e))
                    }
                    GpuRunError::Sandbox(
                        e @ (SandboxError::InitFailed { .. }
                        | SandboxError::StartFailed(_)
                        | SandboxError::Unsupported(_)),
                    ) => (
                        Outcome::init_error,
                        InvokeError::Start {
                            function: spec.name.clone(),
                            error: e,
                        },
                    ),
                    GpuRunError::Sandbox(e) => (Outcome::crashed, InvokeError::Sandbox(e)),
                };
                self.metrics.outcome(&spec.name, outcome);
                return Err(err);
            }
        };
        if spec.device == Device::Any {
            exec.record(&spec.name, hearth_core::gpu::Device::Gpu, run.exec_us);
        }
        let start = run.placed.start;
        self.metrics
            .gpu_starts
            .get_or_create(&GpuStartLabel {
                gpu: run.placed.gpu.to_string(),
                start: start_label(start),
            })
            .inc();
        let fn_label = || FnLabel {
            function: spec.name.clone(),
        };
        self.metrics
            .exec
            .get_or_create(&fn_label())
            .observe(run.exec_us as f64 / 1e6);
        let e2e = t0.elapsed().as_micros() as u64;
        let busy = run.placed.queued_us + run.setup_us + run.exec_us;
        let timing = Timing {
            queue: run.placed.queued_us,
            init: run.setup_us,
            exec: run.exec_us,
            overhead: e2e.saturating_sub(busy),
            e2e,
            controller: None,
        };
        let cold = start == Start::Cold;
        let result = match &run.reply {
            Some(reply) => self.handler_result(&spec.name, reply, cold, timing)?,
            None => {
                self.metrics.outcome(&spec.name, Outcome::success);
                raw_json(SIM_GPU_RESULT).map_err(|_| InvokeError::Internal("sim result"))?
            }
        };
        let mut answer = InvokeAnswer {
            result,
            cold,
            cold_reason: None,
            cold_reason_policy: None,
            cold_reason_ago_us: None,
            cold_path: None,
            worker: self.id.clone(),
            timing,
            deadline_ms,
            deadline_missed: None,
            deadline_margin_us: None,
            gpu: Some(GpuPlacement {
                index: run.placed.gpu as u32,
                start,
            }),
        };
        self.judge_deadline(&mut answer, &spec.name, call.elapsed_us.saturating_add(e2e));
        Ok(answer)
    }

    /// Judges `answer` against its deadline, `total_us` after the platform accepted the call,
    /// and counts a miss in the metrics (CPU and GPU invocations alike).
    fn judge_deadline(&self, answer: &mut InvokeAnswer, function: &str, total_us: u64) {
        answer.judge_deadline(total_us);
        if answer.deadline_missed == Some(true) {
            self.metrics
                .deadlines_missed
                .get_or_create(&FnLabel {
                    function: function.to_string(),
                })
                .inc();
        }
    }

    /// Accepts an async invocation: stored durably, then run (with the function's retries).
    /// `owner` (a key id) may read the result; `slot` is the namespace's quota slot, held until
    /// the invocation ends. A repeated `idempotency_key` returns the first call's id.
    pub async fn invoke_async(
        self: &Arc<Self>,
        name: String,
        args: Bytes,
        owner: &str,
        idempotency_key: Option<String>,
        retries: Option<u32>,
        slot: QuotaGuard,
    ) -> Result<Accepted, InvokeError> {
        if self.is_shutting_down() {
            return Err(InvokeError::ShuttingDown);
        }
        let reg = self
            .registry
            .get(&name)
            .ok_or_else(|| InvokeError::UnknownFunction(name.clone()))?;
        ready(&reg)?;
        self.admit_gpu(&reg.spec).map_err(InvokeError::Gpu)?;
        let retries = retries.unwrap_or(reg.spec.retries);
        self.delivery
            .accept(&name, owner, args, retries, idempotency_key, slot)
            .await
            .map_err(InvokeError::from)
    }

    /// Async delivery (records, waiting for one, dead letters).
    pub fn delivery(&self) -> &Arc<Delivery> {
        &self.delivery
    }

    /// Runs an invocation a controller sent with id `id` once, however often it is sent.
    pub async fn invoke_once(
        self: &Arc<Self>,
        name: String,
        id: &str,
        args: Bytes,
        call: CallDeadline,
    ) -> hearth_service::dedup::Kept {
        let me = Arc::clone(self);
        let key = format!("{name}/{id}");
        self.dedup
            .run_once(key, async move {
                match me.invoke(&name, &args, Instant::now(), call).await {
                    Ok(answer) => (200, Bytes::from(answer.to_vec())),
                    Err(e) => {
                        let e = crate::api::api_error(e);
                        let body = serde_json::to_vec(&e.error_body()).unwrap_or_default();
                        (e.status.as_u16(), Bytes::from(body))
                    }
                }
            })
            .await
    }

    /// Starts up to `count` sandboxes for `name` and waits until they are warm.
    pub async fn prewarm(&self, name: &str, count: u32) -> Result<PrewarmAnswer, PrewarmError> {
        if self.is_shutting_down() {
            return Err(PrewarmError::ShuttingDown);
        }
        if count == 0 || count > hearth_service::http::MAX_PREWARM_COUNT {
            return Err(PrewarmError::BadCount);
        }
        let reg = self
            .registry
            .get(name)
            .ok_or_else(|| PrewarmError::UnknownFunction(name.to_string()))?;
        ready(&reg).map_err(PrewarmError::NotReady)?;
        self.admit_gpu(&reg.spec).map_err(PrewarmError::Gpu)?;
        if reg.spec.device == Device::Gpu {
            return Err(PrewarmError::OnGpu(name.to_string()));
        }
        let done = self.driver.prewarm(&reg, count).await;
        if done.ready == 0 && done.no_memory > 0 {
            return Err(PrewarmError::NoMemory {
                function: name.to_string(),
                no_memory: done.no_memory,
            });
        }
        if done.ready == 0 && !done.errors.is_empty() {
            return Err(PrewarmError::StartFailed(done.errors.join("; ")));
        }
        Ok(PrewarmAnswer {
            function: name.to_string(),
            requested: count,
            ready: done.ready,
            no_memory: done.no_memory,
            errors: done.errors,
            worker: None,
        })
    }

    /// Registers or updates a function; sandboxes of the previous version are retired. Returns
    /// the registration and whether the function is new. The code is copied or unpacked on a
    /// blocking thread.
    pub async fn register(
        self: &Arc<Self>,
        spec: FunctionSpec,
        code: Option<CodeSource>,
    ) -> Result<(Registered, bool), RegisterError> {
        if spec.memory_mb > self.config.memory_mb {
            return Err(RegisterError::TooMuchMemory {
                memory_mb: spec.memory_mb,
                budget_mb: self.config.memory_mb,
            });
        }
        self.admit_gpu(&spec)?;
        let spec = self.pin_runtime(spec)?;
        let (reg, previous) = self
            .registry
            .put_blocking(spec, code, self.driver.backend().needs_code())
            .await?;
        let created = previous.is_none();
        if let Some(prev) = previous {
            self.driver.retire(&prev);
        }
        self.recount_namespaces();
        let reg = self.build_at_registration(reg).await;
        if reg.state != FunctionState::Building {
            self.collect_layers();
        }
        Ok((reg, created))
    }

    /// Records the digest of the runtime image `spec.runtime` names now (`python3`: the
    /// worker's default runtime), replacing whatever the client sent: a function keeps
    /// running on that image even when the name is rebuilt later.
    fn pin_runtime(&self, mut spec: FunctionSpec) -> Result<FunctionSpec, RegisterError> {
        if !self.driver.backend().needs_code() {
            spec.runtime_digest = None;
            return Ok(spec);
        }
        let name = if spec.runtime == "python3" {
            self.config.runc.default_runtime.as_str()
        } else {
            spec.runtime.as_str()
        };
        let rt = self
            .runtimes
            .resolve(name)
            .ok_or_else(|| RegisterError::UnknownRuntime {
                name: spec.runtime.clone(),
                available: {
                    let names: Vec<String> =
                        self.runtimes.list().into_iter().map(|r| r.name).collect();
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        format!("python3, {}", names.join(", "))
                    }
                },
            })?;
        spec.runtime_digest = Some(rt.digest);
        Ok(spec)
    }

    /// The runtime images of this host (`GET /v1/runtimes`).
    pub fn runtimes(&self) -> Vec<Runtime> {
        self.runtimes.list()
    }

    /// [`Self::register`] from a controller that names the function's cluster-wide
    /// `version`: a version already registered here (by this or another controller), or an
    /// older one, changes nothing, so its warm sandboxes stay.
    pub async fn register_versioned(
        self: &Arc<Self>,
        spec: FunctionSpec,
        code: Option<CodeSource>,
        version: Option<u64>,
    ) -> Result<(Registered, bool), RegisterError> {
        let Some(version) = version else {
            return self.register(spec, code).await;
        };
        let have = self.cluster_versions.get(&spec.name).map(|v| *v);
        if let (Some(have), Some(reg)) = (have, self.registry.get(&spec.name)) {
            if have >= version {
                return Ok((reg, false));
            }
        }
        let name = spec.name.clone();
        let done = self.register(spec, code).await?;
        self.cluster_versions.insert(name, version);
        Ok(done)
    }

    /// Deletes a function: running invocations finish, then its sandboxes go.
    pub fn unregister(&self, name: &str) -> Result<(), UnregisterError> {
        self.cluster_versions.remove(name);
        let removed = self
            .registry
            .remove(name)
            .map_err(|e| UnregisterError::Storage(e.to_string()))?
            .ok_or_else(|| UnregisterError::UnknownFunction(name.to_string()))?;
        self.driver.retire(&removed);
        self.recount_namespaces();
        self.collect_layers();
        Ok(())
    }

    pub fn stats(&self) -> EngineStats {
        self.driver.stats()
    }

    /// What the worker has learned about a function (`GET /v1/functions/{name}`).
    pub fn characteristics(&self, name: &str) -> Option<CharacteristicsReport> {
        self.driver.characteristics(name)
    }

    /// `GET /v1/status`.
    pub fn status(&self) -> WorkerStatus {
        let stats = self.stats();
        let pool = &stats.pool;
        // What a reactive sandbox can still get: the proactive pool is reserved whole.
        let used = pool.memory_running_mb
            + pool.memory_warm_mb
            + pool.memory_generic_mb
            + pool.proactive_pool_mb.max(pool.memory_proactive_mb);
        let ttl = self.config.keepalive == hearth_core::KeepAliveKind::Ttl;
        let bypass = self.config.bypass_ms > 0.0;
        WorkerStatus {
            worker: self.id.clone(),
            backend: self.backend_name().to_string(),
            uptime_s: self.epoch.elapsed().as_secs(),
            shutting_down: self.is_shutting_down(),
            in_flight: self.in_flight.count() as u64,
            async_running: self.delivery.running() as u64,
            memory: MemoryStatus {
                budget_mb: pool.memory_budget_mb,
                running_mb: pool.memory_running_mb,
                warm_mb: pool.memory_warm_mb,
                free_mb: pool.memory_budget_mb.saturating_sub(used),
                generic_mb: pool.memory_generic_mb,
            },
            load: Some(LoadStatus {
                cpus: stats.cpus,
                load_avg_1m: stats.load_avg,
                normalized: stats.normalized_load,
            }),
            queue: Some(QueueStatus {
                length: stats.queue_length as u32,
                running: stats.running + stats.running_bypass,
                running_bypass: stats.running_bypass,
                limit: stats.limit,
                queued: stats.queued.clone(),
                warm_waiting: stats.warm_waiting as u32,
                warm_waits_avoided: stats.warm_waits_avoided,
                warm_waits_gave_up: stats.warm_waits_gave_up,
            }),
            functions: pool
                .functions
                .iter()
                .map(|(name, f)| {
                    let counts = proactive_counts(f);
                    let sandboxes = hearth_api::FunctionSandboxes {
                        warm: f.warm,
                        running: f.running,
                        starting: f.starting,
                        proactive: (counts != ProactiveCounts::default()).then_some(counts),
                    };
                    (name.clone(), sandboxes)
                })
                .collect(),
            policies: Some(PolicyStatus {
                queue: self.config.queue.name().to_string(),
                keepalive: self.config.keepalive.name().to_string(),
                regulator: match self.config.regulator() {
                    Ok(r) => r.name(),
                    Err(_) => "invalid".into(),
                },
                keepalive_ttl_s: ttl.then_some(self.config.keepalive_ttl_s),
                bypass_ms: bypass.then_some(self.config.bypass_ms),
                bypass_load: bypass.then_some(self.config.bypass_load),
            }),
            low_latency: Some(LowLatencyStatus {
                enabled: self.config.low_latency,
                held: self.latency.is_held(),
            }),
            generic_pool: self
                .config
                .generic_config()
                .enabled()
                .then_some(pool.generic),
            proactive: (pool.proactive_pool_mb > 0).then_some(ProactivePoolStatus {
                pool_mb: pool.proactive_pool_mb,
                used_mb: pool.memory_proactive_mb,
                free_mb: pool
                    .proactive_pool_mb
                    .saturating_sub(pool.memory_proactive_mb),
            }),
            gpus: self.gpus.clone(),
            gpu_scheduler: self.gpu_status(),
        }
    }

    /// Runs a controller's proactive commands in order (Atoll §4.3): creates start like
    /// prewarms, through the creation cap, and the answer waits until each has started or
    /// failed, at most [`PROACTIVE_CREATE_WAIT`]. One command's failure is in its result.
    pub async fn proactive(
        &self,
        commands: &[ProactiveCommand],
    ) -> Result<ProactiveAnswer, ProactiveBatchError> {
        let mut batch = self.proactive_begin(commands)?;
        let deadline = tokio::time::Instant::now() + PROACTIVE_CREATE_WAIT;
        for (i, task) in std::mem::take(&mut batch.creating) {
            let name = &commands[i].function;
            batch.answer.results[i] = match tokio::time::timeout_at(deadline, task).await {
                Ok(done) => started(name, done),
                // It goes on starting; the counts show it, and a failure shows in later ones.
                Err(_) => batch.answer.results[i].clone(),
            };
        }
        batch.answer.functions = self.proactive_counts_of(&batch.answer.functions);
        Ok(batch.answer)
    }

    /// Applies a controller's proactive commands in order, without waiting for creates: the
    /// answer says `still_starting` for each create under way, whose task is in `creating`
    /// (the streamed answer reports each as it ends, [`proactive`](Self::proactive) waits).
    pub fn proactive_begin(
        &self,
        commands: &[ProactiveCommand],
    ) -> Result<ProactiveBatch, ProactiveBatchError> {
        if self.config.proactive_mb == 0 {
            return Err(ProactiveBatchError::Disabled);
        }
        if self.is_shutting_down() {
            return Err(ProactiveBatchError::ShuttingDown);
        }
        let max = hearth_api::MAX_PROACTIVE_COMMANDS;
        if commands.len() > max {
            return Err(ProactiveBatchError::TooManyCommands {
                count: commands.len(),
                max,
            });
        }
        let max_key = MAX_FUNCTION_KEY_LEN;
        if let Some((index, c)) = commands
            .iter()
            .enumerate()
            .find(|(_, c)| c.function.is_empty() || c.function.len() > max_key)
        {
            return Err(ProactiveBatchError::BadFunctionName {
                index,
                len: c.function.len(),
                max: max_key,
            });
        }
        let mut results = vec![ProactiveResult::ok(); commands.len()];
        let mut creating = Vec::new();
        let mut touched = BTreeMap::new();
        for (i, c) in commands.iter().enumerate() {
            let name = c.function.as_str();
            touched.insert(name.to_string(), ProactiveCounts::default());
            let Some(reg) = self.registry.get(name) else {
                results[i] = ProactiveResult::failed(
                    ProactiveFailure::UnknownFunction,
                    format!("unknown function {name:?}: not registered on this worker"),
                );
                continue;
            };
            if let Err(e) = ready(&reg) {
                // Nothing of it may start before its build is over.
                results[i] = ProactiveResult::failed(ProactiveFailure::StartFailed, e.to_string());
                continue;
            }
            let nothing = |what: &str, has: &str| {
                ProactiveResult::failed(
                    ProactiveFailure::NothingToDo,
                    format!("nothing to {what}: {name} has no {has} proactive sandbox"),
                )
            };
            match c.op {
                ProactiveOp::Create => match self.driver.proactive_create(&reg) {
                    Ok(task) => {
                        results[i].still_starting = true;
                        creating.push((i, task));
                    }
                    Err(e) => results[i] = create_refused(e),
                },
                ProactiveOp::Unmark => {
                    if !self.driver.proactive_unmark(name) {
                        results[i] = nothing("unmark", "soft-evicted");
                    }
                }
                ProactiveOp::SoftEvict => {
                    if !self.driver.proactive_soft_evict(name) {
                        results[i] = nothing("soft-evict", "usable");
                    }
                }
                ProactiveOp::Evict => {
                    if self.driver.proactive_evict(name).is_none() {
                        results[i] = nothing("evict", "remaining");
                    }
                }
            }
        }
        let functions = self.proactive_counts_of(&touched);
        Ok(ProactiveBatch {
            answer: ProactiveAnswer { results, functions },
            creating,
        })
    }

    /// The proactive counts now of each function named in `functions`.
    fn proactive_counts_of(
        &self,
        functions: &BTreeMap<String, ProactiveCounts>,
    ) -> BTreeMap<String, ProactiveCounts> {
        let pool = self.stats().pool;
        functions
            .keys()
            .map(|name| {
                let counts = pool
                    .function(name)
                    .map(proactive_counts)
                    .unwrap_or_default();
                (name.clone(), counts)
            })
            .collect()
    }

    /// New invocations are refused with 503 from now on.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    /// Graceful stop: refuse new work, let in-flight invocations finish within the grace period,
    /// then remove every sandbox.
    pub async fn shutdown(&self, grace: Duration) {
        self.shutting_down.store(true, Ordering::Release);
        if let Some(g) = &self.gpu_exec {
            // Queued GPU invocations are answered now; running ones finish within the grace.
            g.shutdown();
        }
        let deadline = tokio::time::Instant::now() + grace;
        if !self.in_flight.wait_idle(deadline).await {
            tracing::warn!(
                in_flight = self.in_flight.count(),
                "grace period over; killing the remaining sandboxes"
            );
        }
        // Let answered async invocations store their results (an unstored one runs again in
        // the next life); those waiting to retry are left to it.
        let now = tokio::time::Instant::now();
        let stored = deadline
            .min(now + Duration::from_secs(2))
            .max(now + Duration::from_millis(200));
        while self.delivery.running() > 0 && tokio::time::Instant::now() < stored {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.driver.shutdown().await;
        tracing::info!("all sandboxes removed");
    }
}

/// How long an answer to proactive commands waits for its creates to start.
pub const PROACTIVE_CREATE_WAIT: Duration = Duration::from_secs(30);

/// Longest function key: a namespace, a dot and a name of at most 64 characters.
const MAX_FUNCTION_KEY_LEN: usize = hearth_api::namespace::MAX_NAMESPACE_LEN + 1 + 64;

/// A function's proactive sandboxes as the wire counts them.
/// Function builds (issue 32 §2, docs/dependencies.md): a function with code is `building`
/// from its registration until its bytecode and its dependency layer are there.
impl Worker {
    /// Right after a registration: the code's bytecode is compiled while the request waits
    /// (a build sandbox, a fraction of a second); a layer that is already stored makes the
    /// function ready at once, one to build is built in the background (`building`).
    async fn build_at_registration(self: &Arc<Self>, reg: Registered) -> Registered {
        if reg.state != FunctionState::Building {
            return reg;
        }
        self.after_layer_collection().await;
        let needs_layer = reg.spec.layer.as_ref().is_some_and(|d| {
            self.builder
                .as_ref()
                .is_none_or(|b| b.store().get(d).is_none())
        });
        if needs_layer {
            self.start_build(reg.clone());
            return reg;
        }
        let result = self.build(&reg).await;
        self.end_build(&reg, result);
        self.registry.get(&reg.spec.name).unwrap_or(reg)
    }

    /// Builds `reg` in the background and records the outcome.
    fn start_build(self: &Arc<Self>, reg: Registered) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let result = me.build(&reg).await;
            me.end_build(&reg, result);
            me.collect_layers();
        });
    }

    fn end_build(&self, reg: &Registered, result: Result<(), String>) {
        let name = &reg.spec.name;
        if let Err(log) = &result {
            tracing::info!(function = %name, version = reg.spec.version, error = %log.lines().last().unwrap_or(""), "build failed");
        }
        match self.registry.finish_build(name, reg.spec.version, result) {
            Ok(true) => {}
            Ok(false) => tracing::debug!(function = %name, version = reg.spec.version,
                "a build ended after its version was replaced: its result is dropped"),
            Err(e) => {
                tracing::warn!(function = %name, error = %e, "could not record a build's end")
            }
        }
    }

    /// The bytecode of `reg`'s code, then its layer. `Err` holds the build log to show.
    async fn build(&self, reg: &Registered) -> Result<(), String> {
        let Some(builder) = &self.builder else {
            return Ok(());
        };
        let spec = &reg.spec;
        let runtime = runtime_of(&self.runtimes, spec);
        let Some(runtime) = runtime else {
            if spec.layer.is_some() {
                return Err(no_runtime(spec));
            }
            tracing::warn!(function = %spec.name, "no runtime image: the code is not byte-compiled");
            return Ok(());
        };
        if let Some(dir) = &reg.code_dir {
            let bytes = builder
                .compile_code(&runtime, dir)
                .await
                .map_err(|f| f.log())?;
            self.registry
                .add_code_bytes(&spec.name, spec.version, bytes)
                .map_err(|e| format!("the bytecode does not fit: {e}"))?;
        }
        let Some(digest) = &spec.layer else {
            return Ok(());
        };
        let normalized = match &reg.code_dir {
            Some(dir) => {
                let dir = dir.clone();
                tokio::task::spawn_blocking(move || read_requirements(&dir))
                    .await
                    .map_err(|e| format!("reading requirements.txt failed: {e}"))??
            }
            None => return Err("the function has no code to read requirements.txt from".into()),
        };
        if requirements::layer_digest(&runtime.digest, &normalized) != *digest {
            return Err("requirements.txt or the runtime changed since registration; register the function again".into());
        }
        self.after_layer_collection().await;
        builder
            .layer(digest, &runtime, &normalized)
            .await
            .map_err(|f| f.log())?;
        self.check_layer_quota(&spec.name, digest)
    }

    /// Refuses a layer that takes its namespace's layers over `max_layer_bytes_per_namespace`
    /// (each distinct layer its functions use counts once; a layer shared with another
    /// namespace counts for both).
    fn check_layer_quota(&self, name: &str, digest: &str) -> Result<(), String> {
        let Some(builder) = &self.builder else {
            return Ok(());
        };
        let ns = hearth_api::namespace::namespace_of(name);
        let mut layers: std::collections::BTreeSet<String> = self
            .registry
            .list()
            .into_iter()
            .filter(|r| {
                hearth_api::namespace::namespace_of(&r.spec.name) == ns
                    && r.state != FunctionState::Failed
            })
            .filter_map(|r| r.spec.layer.clone())
            .collect();
        layers.insert(digest.to_string());
        let bytes: u64 = layers
            .iter()
            .filter_map(|d| builder.store().get(d))
            .map(|l| l.bytes)
            .sum();
        let max = builder.settings().max_layer_bytes_per_namespace;
        if bytes > max {
            return Err(format!(
                "the dependency layers of namespace {ns:?} would take {bytes} bytes, over its \
                 limit of {max} bytes (build.max_layer_bytes_per_namespace)"
            ));
        }
        Ok(())
    }

    /// Removes the layers no function refers to any more (after an unregistration, an
    /// update, a build's end, and at start), on a blocking thread.
    fn collect_layers(&self) {
        let Some(builder) = &self.builder else {
            return;
        };
        let store = builder.store().clone();
        let registry = Arc::clone(&self.registry);
        let lock = Arc::clone(&self.layers_gc);
        tokio::task::spawn_blocking(move || {
            let _collecting = lock.blocking_lock();
            let keep = registry.layers_in_use();
            crate::layers::gc::remove_unreferenced(&store, &keep);
        });
    }

    /// Waits for a collection of layers that is under way (it may have read the functions'
    /// layers before this one was registered); one starting later sees it in use.
    async fn after_layer_collection(&self) {
        drop(self.layers_gc.lock().await);
    }

    /// Waits until `name`'s version `version` is no longer building (`PUT …?wait=true`),
    /// at most `build.timeout_s` and a margin; returns what is registered then.
    pub async fn wait_built(&self, name: &str, version: u64) -> Option<Registered> {
        let limit = self
            .builder
            .as_ref()
            .map_or(0, |b| b.settings().timeout_s.saturating_mul(2) + 30);
        let until = Instant::now() + Duration::from_secs(limit);
        loop {
            let reg = self.registry.get(name)?;
            if reg.state != FunctionState::Building
                || reg.spec.version != version
                || Instant::now() >= until
            {
                return Some(reg);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The build sandboxes (tests probe what a build can reach).
    pub fn builder(&self) -> Option<&Arc<Builder>> {
        self.builder.as_ref()
    }

    /// The runtime a function's builds run on.
    pub fn runtime_for(&self, spec: &FunctionSpec) -> Option<Runtime> {
        runtime_of(&self.runtimes, spec)
    }
}

/// `Ok` when `reg` may run: not building, not failed.
fn ready(reg: &Registered) -> Result<(), InvokeError> {
    match reg.state {
        FunctionState::Ready => Ok(()),
        FunctionState::Building => Err(InvokeError::Building(display_name(&reg.spec.name))),
        FunctionState::Failed => Err(InvokeError::BuildFailed(display_name(&reg.spec.name))),
    }
}

/// A function's name as its owner wrote it (without the default namespace).
fn display_name(key: &str) -> String {
    let (ns, name) = hearth_api::namespace::split_key(key);
    if ns == hearth_api::namespace::DEFAULT_NAMESPACE {
        name.to_string()
    } else {
        format!("{ns}/{name}")
    }
}

/// The runtime image a function's builds use: the one it was registered with, else the
/// default one.
fn runtime_of(store: &RuntimeStore, spec: &FunctionSpec) -> Option<Runtime> {
    match &spec.runtime_digest {
        Some(d) => store.by_digest(d),
        None => store.resolve(DEFAULT_RUNTIME),
    }
}

fn no_runtime(spec: &FunctionSpec) -> String {
    format!(
        "the runtime image {} is not installed on this worker (`hearth runtime build`): \
         requirements.txt cannot be installed without it",
        spec.runtime_digest.as_deref().unwrap_or(DEFAULT_RUNTIME)
    )
}

/// The normalized `requirements.txt` at the top of `dir` ("" when there is none): a regular
/// file, bounded, checked by [`requirements::normalize`].
fn read_requirements(dir: &std::path::Path) -> Result<String, String> {
    let path = dir.join(REQUIREMENTS_FILE);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(format!("requirements.txt cannot be read ({})", e.kind())),
    };
    if !meta.is_file() {
        return Err("requirements.txt must be a regular file".into());
    }
    if meta.len() > requirements::MAX_REQUIREMENTS_BYTES as u64 {
        return Err(requirements::RequirementsError::TooLarge.to_string());
    }
    let text = std::fs::read(&path)
        .map_err(|e| format!("requirements.txt cannot be read ({})", e.kind()))?;
    requirements::normalize(&text).map_err(|e| e.to_string())
}

/// The registry's code check on a runc worker: which layer the staged code in `dir` needs.
fn code_layer(
    store: &RuntimeStore,
    spec: &FunctionSpec,
    dir: &std::path::Path,
) -> Result<Option<String>, String> {
    let normalized = read_requirements(dir)?;
    if normalized.is_empty() {
        return Ok(None);
    }
    let runtime = runtime_of(store, spec).ok_or_else(|| no_runtime(spec))?;
    Ok(Some(requirements::layer_digest(
        &runtime.digest,
        &normalized,
    )))
}

fn proactive_counts(f: &FunctionPoolStats) -> ProactiveCounts {
    ProactiveCounts {
        active: f.proactive_idle + f.proactive_busy,
        soft: f.proactive_soft,
        starting: f.proactive_starting,
    }
}

/// Proactive commands applied, and the creates still starting.
pub struct ProactiveBatch {
    /// Every command's result; creates under way say `still_starting`.
    pub answer: ProactiveAnswer,
    /// (index of the command, its start task) for each create under way.
    pub creating: Vec<(usize, ProactiveStart)>,
}

/// A proactive sandbox's start: ready, or why not.
pub type ProactiveStart = tokio::task::JoinHandle<Result<(), SandboxError>>;

/// The result of a proactive create whose start ended.
pub fn started(
    name: &str,
    done: Result<Result<(), SandboxError>, tokio::task::JoinError>,
) -> ProactiveResult {
    match done {
        Ok(Ok(())) => ProactiveResult::ok(),
        Ok(Err(e)) => {
            tracing::warn!(function = %name, error = %e, "proactive sandbox failed to start");
            ProactiveResult::failed(
                ProactiveFailure::StartFailed,
                format!("the proactive sandbox of {name} failed to start: {e}"),
            )
        }
        Err(_) => ProactiveResult::failed(
            ProactiveFailure::StartFailed,
            format!("the start of {name}'s proactive sandbox ended without an answer"),
        ),
    }
}

/// The result of a create the engine refused.
fn create_refused(e: ProactiveError) -> ProactiveResult {
    match e {
        ProactiveError::PoolFull { needed_mb, free_mb } => ProactiveResult::failed(
            ProactiveFailure::PoolFull,
            format!("proactive pool full: needs {needed_mb} MiB, {free_mb} free"),
        ),
        ProactiveError::Disabled => {
            ProactiveResult::failed(ProactiveFailure::Disabled, "proactive pool disabled")
        }
        ProactiveError::ShuttingDown => ProactiveResult::failed(
            ProactiveFailure::ShuttingDown,
            "the worker is shutting down",
        ),
    }
}

/// The `type`, `message` and `traceback` of a handler's error answer from the agent.
fn handler_fault(body: &[u8]) -> (String, String, String) {
    #[derive(serde::Deserialize, Default)]
    #[serde(default)]
    struct Fault {
        #[serde(rename = "type")]
        kind: String,
        message: String,
        traceback: String,
    }
    let f: Fault = serde_json::from_slice(body).unwrap_or_default();
    (f.kind, f.message, f.traceback)
}

/// How often the housekeeping task runs.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(1);

/// Drops the low-latency request after a quiet period and forgets expired async results.
async fn housekeeping(worker: std::sync::Weak<Worker>) {
    loop {
        {
            let Some(w) = worker.upgrade() else { return };
            w.latency.tick();
        }
        tokio::time::sleep(HOUSEKEEPING_EVERY).await;
    }
}

/// An invocation's deadline as the call sets it (Atoll: deadlines count from platform entry).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallDeadline {
    /// The call's own deadline (`Hearth-Deadline-Ms`); the function's `deadline_ms` otherwise.
    pub deadline_ms: Option<u64>,
    /// Time a controller had already spent on it (`Hearth-Elapsed-Us`).
    pub elapsed_us: u64,
    /// Refuse it rather than start it once the deadline has passed (`Hearth-Drop-Late`);
    /// nothing without a deadline.
    pub drop_late: bool,
}

/// How long a controller's repeated invocation id gets the first run's answer, and the bytes
/// of answers kept for it.
const DEDUP_TTL: Duration = Duration::from_secs(600);
const DEDUP_MAX_BYTES: usize = 64 * 1024 * 1024;

/// The worker runs its own async invocations.
struct WorkerRunner(std::sync::OnceLock<std::sync::Weak<Worker>>);

#[hearth_service::async_trait]
impl Runner for WorkerRunner {
    async fn run(&self, inv: &StoredInvocation) -> Attempted {
        let Some(w) = self.0.get().and_then(|w| w.upgrade()) else {
            return Attempted::abandoned();
        };
        if w.is_shutting_down() {
            return Attempted::abandoned();
        }
        let args = Bytes::from(inv.args.clone());
        // The function's deadline counts from this attempt (records keep no monotonic time).
        match w
            .invoke(
                &inv.function,
                &args,
                Instant::now(),
                CallDeadline::default(),
            )
            .await
        {
            Ok(answer) => Attempted::answer(200, Bytes::from(answer.to_vec())),
            Err(InvokeError::ShuttingDown) => Attempted::abandoned(),
            Err(e) => Attempted::error(&crate::api::api_error(e)),
        }
    }
}
