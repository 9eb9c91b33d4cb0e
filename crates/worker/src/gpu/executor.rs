//! Runs the worker's GPU invocations (`device: gpu`, and `any` functions the CPU/GPU dispatch
//! sends to a GPU) under the core's [`GpuScheduler`] (MQFQ-Sticky, FCFS or Batch, thesis ch. 6):
//! the scheduler decides order, device, container and how it starts; this module feeds it the
//! clock, arrivals, completions and 200 ms utilization samples, and carries the decisions out.
//!
//! On simulated GPUs (`[gpu] devices = "sim"`) a GPU container is bookkeeping and an invocation
//! sleeps for what [`SimGpuModel`] says: the function's `sim_gpu_warm_ms` stretched by the
//! invocations sharing the device when it starts, plus the container's start (`Cold`:
//! `sim_gpu_cold_ms`, or the model's GPU initialization when that is 0) and
//! the paging the scheduler charged the dispatch (`GpuPaging`: a bulk prefetch for a host-warm
//! start, on-demand fault-in and eviction under the `prefetch-only` and `uvm` memory policies).
//! Prefetches and swaps the scheduler orders for idle containers are asynchronous in the real
//! system (`cuMemPrefetchAsync`) and cost a simulated run nothing.
//!
//! On real GPUs (found through NVML) each GPU container is a runc GPU sandbox
//! (`Backend::create_gpu`: the GPU's device nodes, the driver's libraries, the CUDA shim): a cold
//! start creates one, a host-warm start prefetches its memory first (the agent's `P`), and the
//! scheduler's Prefetch, Swap and Destroy of idle containers run in the background on the
//! sandbox (`P`, `S`, destroy), each under the container's own lock, so an invocation that
//! finds a move under way waits for it. The shim's report of the sandbox's device memory goes
//! back to the scheduler with every completion, and NVML's utilization feeds D.
//!
//! Faults can be injected on simulated GPUs only, through the arguments, to exercise what a
//! real GPU function can do to its sandbox: `{"hearth_sim_gpu": {"crash": true}}` loses the
//! CUDA context (the invocation fails, the container is discarded) and
//! `{"hearth_sim_gpu": {"leak_mb": N}}` leaves N more MiB allocated in the container (reported as
//! the shim would; past the device's memory the allocation fails and the container goes).

use super::GpuSettings;
use crate::agent_client::AgentReply;
use crate::backend::sim::SimClock;
use crate::backend::{Sandbox, SandboxError};
use crate::driver::Driver;
use hearth_api::{FunctionSpec, GpuInfo};
use hearth_core::gpu::{
    ContainerId, CpuGpuDispatch, Device, GpuAction, GpuCompletion, GpuGauges, GpuInvocationId,
    GpuPlacement, GpuReject, GpuSchedConfig, GpuScheduler, GpuSpec, GpuStatus, SimGpuModel,
};
use hearth_core::Micros;
use hearth_core::SandboxId;
use hearth_service::registry::Registered;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The result of a simulated GPU invocation (the `sim` backend's, for CPU runs, is the same).
pub const SIM_GPU_RESULT: &[u8] = b"{\"simulated\":true}";

/// How often device utilization is sampled and fed back to D (§6.3.4: 200 ms). Flow TTLs
/// expire on the same tick.
pub const UTILIZATION_PERIOD: Duration = Duration::from_millis(200);

/// A GPU invocation that ran.
#[derive(Debug, Clone)]
pub struct GpuRun {
    pub placed: GpuPlacement,
    /// Container start (cold) and the paging charged to the dispatch (prefetch, fault-in,
    /// on-demand eviction), µs.
    pub setup_us: Micros,
    pub exec_us: Micros,
    /// The sandbox's answer (a real GPU sandbox; `None` for a simulated run, whose result is
    /// [`SIM_GPU_RESULT`]).
    pub reply: Option<AgentReply>,
}

/// Why a GPU invocation did not run to the end.
#[derive(Debug, thiserror::Error)]
pub enum GpuRunError {
    #[error("{0}")]
    Rejected(GpuReject),
    /// The sandbox broke (CUDA context lost, device memory exhausted): it was discarded, the
    /// device and its other sandboxes carry on.
    #[error("{0}")]
    Failed(String),
    #[error("the invocation did not finish within its timeout of {timeout_ms} ms; its GPU sandbox was discarded")]
    Timeout { timeout_ms: u64 },
    /// A real GPU sandbox could not start, or broke while running (discarded).
    #[error("{0}")]
    Sandbox(SandboxError),
}

/// GPU sandbox ids live far above the CPU engine's (which count up from 1), so the two never
/// name the same container.
const GPU_SANDBOX_ID_BASE: u64 = 1 << 48;

/// A real GPU container: its sandbox while idle (taken by the invocation that runs on it), under
/// a lock that background memory moves also take.
type Slot = Arc<tokio::sync::Mutex<Option<GpuSandbox>>>;

struct GpuSandbox {
    sandbox: Sandbox,
    /// The function version it was made for: a newer one gets a new sandbox.
    version: u64,
    code_dir: Option<PathBuf>,
}

/// How the devices are driven.
enum Runtime {
    /// Simulated devices: sleeps on a precise clock.
    Sim { clock: SimClock },
    /// Real GPUs: runc GPU sandboxes, NVML utilization.
    Sandboxes {
        driver: Arc<Driver>,
        gpus: Vec<GpuInfo>,
        slots: Mutex<HashMap<ContainerId, Slot>>,
        nvml: Option<Arc<nvml_wrapper::Nvml>>,
    },
}

/// A memory move or removal the scheduler ordered for an idle container.
#[derive(Debug, Clone, Copy)]
enum Move {
    Prefetch(ContainerId),
    Swap(ContainerId),
    Destroy(ContainerId),
}

/// A fault asked for in a simulated invocation's arguments.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct SimFault {
    crash: bool,
    leak_mb: u64,
}

/// The most a simulated leak may add per call (bounded input).
const MAX_SIM_LEAK_MB: u64 = 1 << 20;

impl SimFault {
    /// The fault in `args`, if they carry `hearth_sim_gpu`; anything else is the handler's.
    fn parse(args: &[u8]) -> SimFault {
        const KEY: &[u8] = b"hearth_sim_gpu";
        if !args.windows(KEY.len()).any(|w| w == KEY) {
            return SimFault::default();
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(args) else {
            return SimFault::default();
        };
        let f = &v["hearth_sim_gpu"];
        SimFault {
            crash: f["crash"].as_bool().unwrap_or(false),
            leak_mb: f["leak_mb"].as_u64().unwrap_or(0).min(MAX_SIM_LEAK_MB),
        }
    }
}

/// A simulated container: what it holds beyond its declared memory.
#[derive(Debug, Default)]
struct SimContainer {
    leaked_mb: u64,
}

struct Inner {
    sched: GpuScheduler,
    waiters: HashMap<GpuInvocationId, oneshot::Sender<Result<GpuPlacement, GpuReject>>>,
    containers: HashMap<ContainerId, SimContainer>,
    dispatch: CpuGpuDispatch,
}

impl Inner {
    /// Carries out the scheduler's actions: placements go to their waiters (or straight back
    /// if the caller is gone), rejections likewise; memory moves and removals of idle
    /// containers are collected in `moves` for the runtime.
    fn drain(&mut self, now: Micros, moves: &mut Vec<Move>) -> Option<GpuPlacement> {
        let mut mine = None;
        while let Some(action) = self.sched.poll_action() {
            match action {
                GpuAction::Dispatch {
                    placement: placed, ..
                } => {
                    self.containers.entry(placed.container).or_default();
                    match self.waiters.remove(&placed.invocation) {
                        Some(tx) => {
                            if let Err(Ok(p)) = tx.send(Ok(placed)) {
                                // Its caller left between queueing and now: nothing ran.
                                self.unrun(now, p);
                            }
                        }
                        None => mine = Some(placed),
                    }
                }
                GpuAction::Reject { invocation, reason } => {
                    if let Some(tx) = self.waiters.remove(&invocation) {
                        let _ = tx.send(Err(reason));
                    }
                }
                GpuAction::Destroy { container, .. } => {
                    self.containers.remove(&container);
                    moves.push(Move::Destroy(container));
                }
                GpuAction::Prefetch { container, .. } => moves.push(Move::Prefetch(container)),
                GpuAction::Swap { container, .. } => moves.push(Move::Swap(container)),
            }
        }
        mine
    }

    /// Hands back a placement whose invocation never ran (its caller left).
    fn unrun(&mut self, now: Micros, p: GpuPlacement) {
        let done = GpuCompletion {
            exec_us: None,
            reusable: true,
            device_memory_mb: None,
        };
        if let Err(e) = self.sched.on_completed(now, p.invocation, done) {
            tracing::warn!(error = %e, "GPU scheduler lost track of an unrun invocation");
        }
    }
}

/// The worker's GPU scheduler and its simulated devices.
pub struct GpuExecutor {
    inner: Mutex<Inner>,
    runtime: Runtime,
    epoch: Instant,
    model: SimGpuModel,
    solo_util: f64,
}

/// A queued invocation's place in line: dropped before it runs, it leaves the queue (or hands
/// back the placement that raced with the drop).
struct Waiting<'a> {
    exec: &'a GpuExecutor,
    id: GpuInvocationId,
    rx: Option<oneshot::Receiver<Result<GpuPlacement, GpuReject>>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        let id = self.id;
        self.exec.event(|inner, now, moves| {
            // Placements are sent under this lock: either it came already, or it is still
            // queued.
            match rx.try_recv() {
                Ok(Ok(p)) => inner.unrun(now, p),
                Ok(Err(_)) => {}
                Err(_) => {
                    inner.waiters.remove(&id);
                    inner.sched.on_cancel(now, id);
                }
            }
            let _ = inner.drain(now, moves);
        });
    }
}

/// A running invocation: ended exactly once, as completed or failed, even if its caller leaves
/// mid-run.
struct Running<'a> {
    exec: &'a GpuExecutor,
    placed: GpuPlacement,
    done: bool,
}

impl Running<'_> {
    fn end(mut self, completion: Option<GpuCompletion>) {
        self.done = true;
        self.exec.end(self.placed, completion);
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.done {
            // The caller left mid-run. A simulated run stops with it and its container is
            // kept; a real sandbox taken out of its slot was dropped with the future, so the
            // container is gone.
            let kept = match self.exec.runtime {
                Runtime::Sim { .. } => Some(GpuCompletion {
                    exec_us: None,
                    reusable: true,
                    device_memory_mb: None,
                }),
                Runtime::Sandboxes { .. } => None,
            };
            self.exec.end(self.placed, kept);
        }
    }
}

impl GpuExecutor {
    /// An executor over simulated `gpus` (`[gpu] devices = "sim"`).
    pub fn simulated(gpus: &[GpuInfo], settings: &GpuSettings) -> Result<Arc<Self>, String> {
        Self::new(
            gpus,
            settings,
            Runtime::Sim {
                clock: SimClock::start(),
            },
        )
    }

    /// An executor over real `gpus`, running GPU sandboxes through `driver`'s backend, with
    /// `nvml` for utilization (without it, D stays at its start).
    pub fn real(
        gpus: &[GpuInfo],
        settings: &GpuSettings,
        driver: Arc<Driver>,
        nvml: Option<nvml_wrapper::Nvml>,
    ) -> Result<Arc<Self>, String> {
        Self::new(
            gpus,
            settings,
            Runtime::Sandboxes {
                driver,
                gpus: gpus.to_vec(),
                slots: Mutex::new(HashMap::new()),
                nvml: nvml.map(Arc::new),
            },
        )
    }

    fn new(
        gpus: &[GpuInfo],
        settings: &GpuSettings,
        runtime: Runtime,
    ) -> Result<Arc<Self>, String> {
        let config = GpuSchedConfig {
            gpus: gpus
                .iter()
                .map(|g| GpuSpec {
                    memory_mb: g.memory_mb,
                })
                .collect(),
            ..settings.scheduler.clone()
        };
        let sched = GpuScheduler::new(config).map_err(|e| format!("gpu.scheduler: {e}"))?;
        let dispatch =
            CpuGpuDispatch::new(settings.dispatch).map_err(|e| format!("gpu.dispatch: {e}"))?;
        settings
            .sim_model
            .check()
            .map_err(|e| format!("gpu.sim_model: {e}"))?;
        Ok(Arc::new(GpuExecutor {
            inner: Mutex::new(Inner {
                sched,
                waiters: HashMap::new(),
                containers: HashMap::new(),
                dispatch,
            }),
            runtime,
            epoch: Instant::now(),
            model: settings.sim_model,
            solo_util: settings.sim_solo_util,
        }))
    }

    fn now(&self) -> Micros {
        self.epoch.elapsed().as_micros() as Micros
    }

    /// Runs one event on the scheduler under its lock, then carries out the memory moves and
    /// removals it ordered, outside the lock.
    fn event<T>(&self, f: impl FnOnce(&mut Inner, Micros, &mut Vec<Move>) -> T) -> T {
        let now = self.now();
        let mut moves = Vec::new();
        let out = f(&mut self.inner.lock(), now, &mut moves);
        self.apply(moves);
        out
    }

    /// Real GPUs: each move runs in the background on its container's sandbox, under the
    /// container's lock. Simulated ones: nothing to do (the moves cost a simulated run nothing).
    ///
    /// A move and a later dispatch of the same container meet at its lock in the order they
    /// reach it, which need not be the order the scheduler decided them: a swap can land after
    /// the run that followed it. That costs speed (the next run pages its memory back in on
    /// demand), never correctness: unified memory is valid wherever it is.
    fn apply(&self, moves: Vec<Move>) {
        let Runtime::Sandboxes { driver, slots, .. } = &self.runtime else {
            return;
        };
        for m in moves {
            let (id, slot) = match m {
                Move::Destroy(id) => (id, slots.lock().remove(&id)),
                Move::Prefetch(id) | Move::Swap(id) => (id, slots.lock().get(&id).cloned()),
            };
            let Some(slot) = slot else { continue };
            let driver = Arc::clone(driver);
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                tracing::warn!(
                    container = id.0,
                    "no runtime to move a GPU sandbox's memory on"
                );
                continue;
            };
            rt.spawn(async move {
                let mut held = slot.lock().await;
                let backend = driver.backend();
                let result = match (m, held.as_mut()) {
                    (Move::Destroy(_), _) => {
                        if let Some(gs) = held.take() {
                            discard(&driver, gs).await;
                        }
                        return;
                    }
                    (Move::Prefetch(_), Some(gs)) => backend.gpu_prefetch(&mut gs.sandbox).await,
                    (Move::Swap(_), Some(gs)) => backend.gpu_swap_out(&mut gs.sandbox).await,
                    (_, None) => return,
                };
                if let Err(e) = result {
                    tracing::warn!(container = id.0, error = %e, "moving a GPU sandbox's memory failed");
                    if e.is_fatal() {
                        if let Some(gs) = held.take() {
                            discard(&driver, gs).await;
                        }
                    }
                }
            });
        }
    }

    /// Samples the devices and expires flow TTLs every [`UTILIZATION_PERIOD`] until the
    /// executor is gone.
    pub fn start_sampling(self: &Arc<Self>) {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(UTILIZATION_PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(exec) = weak.upgrade() else { return };
                let measured = exec.measure().await;
                exec.sample(measured);
            }
        });
    }

    /// Real GPUs' utilization from NVML (off the async threads), one per device; `None` where
    /// there is nothing to read.
    async fn measure(&self) -> Vec<Option<f64>> {
        let Runtime::Sandboxes {
            nvml: Some(nvml),
            gpus,
            ..
        } = &self.runtime
        else {
            return Vec::new();
        };
        let (nvml, gpus) = (Arc::clone(nvml), gpus.clone());
        tokio::task::spawn_blocking(move || {
            gpus.iter()
                .map(|g| {
                    let d = nvml.device_by_uuid(g.uuid.as_str()).ok()?;
                    let rates = d.utilization_rates().ok()?;
                    Some(f64::from(rates.gpu.min(100)) / 100.0)
                })
                .collect()
        })
        .await
        .unwrap_or_default()
    }

    /// One utilization sample per device (the simulated device: the running invocations'
    /// solo shares, at most 1; a real one: NVML's, when read), then the TTL timers.
    fn sample(&self, measured: Vec<Option<f64>>) {
        let sim = matches!(self.runtime, Runtime::Sim { .. });
        self.event(|inner, now, moves| {
            for gpu in 0..inner.sched.config().gpus.len() {
                let util = if sim {
                    let shares = vec![self.solo_util; inner.sched.running_on(gpu) as usize];
                    Some(self.model.utilization(&shares))
                } else {
                    measured.get(gpu).copied().flatten()
                };
                let Some(util) = util else { continue };
                if let Err(e) = inner.sched.on_utilization(now, gpu, util) {
                    tracing::warn!(error = %e, gpu, "GPU utilization sample refused");
                }
            }
            inner.sched.on_timeout(now);
            let _ = inner.drain(now, moves);
        });
    }

    /// Whether an `any` function should run on the GPU now (the speedup dispatch).
    pub fn choose(&self, function: &str) -> Device {
        self.inner.lock().dispatch.choose(function)
    }

    /// Records an `any` function's execution time on `device` for the speedup dispatch.
    pub fn record(&self, function: &str, device: Device, exec_us: Micros) {
        if let Err(e) = self.inner.lock().dispatch.record(function, device, exec_us) {
            tracing::debug!(error = %e, function, "CPU/GPU dispatch did not record a run");
        }
    }

    pub fn status(&self) -> GpuStatus {
        self.inner.lock().sched.status()
    }

    /// The queue and the devices, for `/metrics` (no per-function list, so a scrape holds the
    /// scheduler's lock for a pass over its containers only).
    pub fn gauges(&self) -> GpuGauges {
        self.inner.lock().sched.gauges()
    }

    /// Rejects what is queued and every later GPU invocation; running ones finish.
    pub fn shutdown(&self) {
        self.event(|inner, now, moves| {
            inner.sched.shutdown();
            let _ = inner.drain(now, moves);
        });
    }

    /// Queues `reg`'s invocation, waits for its turn, and runs it on its device.
    pub async fn run(&self, reg: &Registered, args: &[u8]) -> Result<GpuRun, GpuRunError> {
        let spec = &reg.spec;
        let placed = self.place(spec).await?;
        let running = Running {
            exec: self,
            placed,
            done: false,
        };
        match &self.runtime {
            Runtime::Sim { clock } => self.run_simulated(clock, running, spec, args).await,
            Runtime::Sandboxes {
                driver,
                gpus,
                slots,
                ..
            } => {
                let slot = Arc::clone(slots.lock().entry(placed.container).or_default());
                let gpu = gpus.get(placed.gpu).ok_or_else(|| {
                    GpuRunError::Failed(format!(
                        "the scheduler placed it on GPU {}, unknown here",
                        placed.gpu
                    ))
                })?;
                self.run_in_sandbox(driver, &slot, gpu, running, reg, args)
                    .await
            }
        }
    }

    async fn run_simulated(
        &self,
        clock: &SimClock,
        running: Running<'_>,
        spec: &FunctionSpec,
        args: &[u8],
    ) -> Result<GpuRun, GpuRunError> {
        let placed = running.placed;
        let fault = SimFault::parse(args);
        let cold_us = match spec.sim_gpu_cold_ms {
            ms if ms > 0.0 => ms_to_us(ms),
            _ => self.model.gpu_init_us,
        };
        let concurrent = self.inner.lock().sched.running_on(placed.gpu);
        let (setup_us, exec_us) = self.model.run_us(
            placed.start,
            cold_us,
            &placed.paging,
            ms_to_us(spec.sim_gpu_warm_ms),
            concurrent,
        );
        let timeout = Duration::from_millis(spec.timeout_ms);
        let total = Duration::from_micros(setup_us.saturating_add(exec_us));
        if total > timeout {
            clock.sleep(timeout).await;
            running.end(None);
            return Err(GpuRunError::Timeout {
                timeout_ms: spec.timeout_ms,
            });
        }
        clock.sleep(total).await;
        if fault.crash {
            running.end(None);
            return Err(GpuRunError::Failed(
                "the GPU sandbox lost its CUDA context (simulated crash); it was discarded and \
                 the device serves the next invocation"
                    .into(),
            ));
        }
        let held_mb = {
            let mut inner = self.inner.lock();
            let capacity = inner
                .sched
                .config()
                .gpus
                .get(placed.gpu)
                .map_or(0, |g| g.memory_mb);
            let c = inner.containers.entry(placed.container).or_default();
            c.leaked_mb = c.leaked_mb.saturating_add(fault.leak_mb);
            let held = placed.memory_mb.saturating_add(c.leaked_mb);
            (held <= capacity).then_some(held).ok_or((held, capacity))
        };
        match held_mb {
            Ok(held) => {
                running.end(Some(GpuCompletion {
                    exec_us: Some(exec_us),
                    reusable: true,
                    device_memory_mb: Some(held),
                }));
                Ok(GpuRun {
                    placed,
                    setup_us,
                    exec_us,
                    reply: None,
                })
            }
            Err((held, capacity)) => {
                running.end(None);
                Err(GpuRunError::Failed(format!(
                    "the GPU sandbox ran out of device memory: it holds {held} MiB of a \
                     {capacity} MiB device (simulated leak); it was discarded and the device \
                     serves the next invocation"
                )))
            }
        }
    }

    /// Runs the invocation in its container's GPU sandbox: created for a cold start (or when
    /// the function changed since), its memory prefetched first for a host-warm one.
    async fn run_in_sandbox(
        &self,
        driver: &Arc<Driver>,
        slot: &Slot,
        gpu: &GpuInfo,
        running: Running<'_>,
        reg: &Registered,
        args: &[u8],
    ) -> Result<GpuRun, GpuRunError> {
        let placed = running.placed;
        let spec = &reg.spec;
        let backend = driver.backend();
        let setup = Instant::now();
        // Waits for a background move of this container's memory that is under way.
        let mut held = slot.lock().await;
        if held.as_ref().is_some_and(|gs| gs.version != spec.version) {
            if let Some(old) = held.take() {
                discard(driver, old).await;
            }
        }
        let mut gs = match held.take() {
            Some(mut gs) => {
                // Under stock unified memory (`memory = "uvm"`) nothing is prefetched: the run
                // pages its memory in on demand.
                if placed.paging.prefetch_mb > 0 {
                    if let Err(e) = backend.gpu_prefetch(&mut gs.sandbox).await {
                        if e.is_fatal() {
                            discard(driver, gs).await;
                            running.end(None);
                            return Err(GpuRunError::Failed(e.to_string()));
                        }
                        // Unified memory still pages it in on demand.
                        tracing::debug!(error = %e, "prefetch before a run failed");
                    }
                }
                gs
            }
            None => {
                let id = SandboxId(GPU_SANDBOX_ID_BASE + placed.container.0);
                match backend
                    .create_gpu(id, spec, reg.code_dir.as_deref(), gpu)
                    .await
                {
                    Ok(sandbox) => {
                        if let Some(dir) = &reg.code_dir {
                            driver.count_code_user(dir, 1);
                        }
                        GpuSandbox {
                            sandbox,
                            version: spec.version,
                            code_dir: reg.code_dir.clone(),
                        }
                    }
                    Err(e) => {
                        running.end(None);
                        return Err(GpuRunError::Sandbox(e));
                    }
                }
            }
        };
        let setup_us = setup.elapsed().as_micros() as Micros;
        let timeout = Duration::from_millis(spec.timeout_ms);
        match tokio::time::timeout(timeout, backend.invoke(&mut gs.sandbox, args)).await {
            Err(_) => {
                discard(driver, gs).await;
                running.end(None);
                Err(GpuRunError::Timeout {
                    timeout_ms: spec.timeout_ms,
                })
            }
            Ok(Err(e)) => {
                discard(driver, gs).await;
                running.end(None);
                Err(GpuRunError::Sandbox(e))
            }
            Ok(Ok(reply)) => {
                let exec_us = reply.exec_us.unwrap_or(0);
                let device_memory_mb = reply.device_memory_bytes.map(|b| b.div_ceil(1 << 20));
                *held = Some(gs);
                drop(held);
                running.end(Some(GpuCompletion {
                    exec_us: Some(exec_us),
                    reusable: true,
                    device_memory_mb,
                }));
                Ok(GpuRun {
                    placed,
                    setup_us,
                    exec_us,
                    reply: Some(reply),
                })
            }
        }
    }

    /// Queues the invocation and waits until the scheduler places it.
    async fn place(&self, spec: &FunctionSpec) -> Result<GpuPlacement, GpuRunError> {
        let arrived = self.event(|inner, now, moves| {
            let id = inner.sched.on_arrival(
                now,
                hearth_core::gpu::GpuArrival {
                    function: &spec.name,
                    weight: 1.0,
                    gpu_memory_mb: spec.gpu_memory_mb,
                },
            )?;
            if let Some(p) = inner.drain(now, moves).filter(|p| p.invocation == id) {
                return Ok(Err(p));
            }
            let (tx, rx) = oneshot::channel();
            inner.waiters.insert(id, tx);
            Ok(Ok((id, rx)))
        });
        let (id, rx) = match arrived.map_err(GpuRunError::Rejected)? {
            Err(placed) => return Ok(placed),
            Ok(queued) => queued,
        };
        let mut waiting = Waiting {
            exec: self,
            id,
            rx: Some(rx),
        };
        let answer = match waiting.rx.as_mut() {
            Some(rx) => rx.await,
            None => return Err(GpuRunError::Failed("GPU waiter lost".into())),
        };
        waiting.rx = None;
        match answer {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(reason)) => Err(GpuRunError::Rejected(reason)),
            Err(_) => Err(GpuRunError::Rejected(GpuReject::ShuttingDown)),
        }
    }

    /// Ends a placed invocation: completed, or failed (its container is discarded).
    fn end(&self, placed: GpuPlacement, completion: Option<GpuCompletion>) {
        self.event(|inner, now, moves| {
            let result = match completion {
                Some(c) => inner.sched.on_completed(now, placed.invocation, c),
                None => {
                    inner.containers.remove(&placed.container);
                    inner.sched.on_failed(now, placed.invocation)
                }
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, "GPU scheduler lost track of a running invocation");
            }
            let _ = inner.drain(now, moves);
        });
    }
}

/// Destroys a GPU sandbox and releases its code directory.
async fn discard(driver: &Driver, gs: GpuSandbox) {
    driver.backend().destroy(gs.sandbox).await;
    if let Some(dir) = &gs.code_dir {
        driver.count_code_user(dir, -1);
    }
}

fn ms_to_us(ms: f64) -> Micros {
    (ms.max(0.0) * 1000.0) as Micros
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::gpu_host::DriverFiles;
    use crate::backend::runc::{gpu_tests, RuncBackend};
    use crate::backend::Backend;
    use crate::config::RuncConfig;
    use crate::driver::LoadSampling;
    use crate::metrics::Metrics;
    use hearth_core::bypass::BypassConfig;
    use hearth_core::gpu::Start;
    use hearth_core::{
        EngineConfig, GenericConfig, KeepAliveConfig, LoadSource, PoolConfig, QueueDiscipline,
        RegulatorConfig,
    };
    use hearth_service::registry::Registry;
    use std::path::Path;

    /// A handler that allocates `bytes` of device memory through the driver API each call,
    /// keeping it (the shim records it).
    const HANDLER: &str = r#"
import ctypes

cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
glob = ctypes.CDLL(None)
cuda.cuCtxSetCurrent(ctypes.c_void_p(0x1000))
held = []

def main(args):
    ptr = ctypes.c_uint64(0)
    rc = glob.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(args["bytes"]))
    held.append(ptr)
    return {"alloc": rc, "resident": glob.hearth_shim_resident_bytes()}
"#;

    fn engine_config() -> EngineConfig {
        EngineConfig {
            pool: PoolConfig {
                memory_budget_mb: 4096,
                free_buffer_mb: 0,
                keepalive: KeepAliveConfig::default(),
                generic: GenericConfig::OFF,
                proactive_mb: 0,
            },
            queue: QueueDiscipline::Fcfs,
            max_queue: 100,
            regulator: RegulatorConfig::Fixed(2),
            bypass: BypassConfig::default(),
            cpus: 2,
            load_source: LoadSource::External,
            warm_wait: false,
        }
    }

    fn container_exists(data: &Path, worker: &str, container: ContainerId) -> bool {
        let id = GPU_SANDBOX_ID_BASE + container.0;
        data.join("runc")
            .join(format!("hearth-{worker}-{id}"))
            .exists()
    }

    /// The real-GPU path end to end, on any machine with root, runc and gcc: runc GPU sandboxes
    /// with the shim and its mock driver (`/dev/null`, `/dev/zero` as the nodes) under the
    /// executor: a cold start, the shim's memory report reaching the scheduler, the swap the
    /// scheduler orders in the background, a host-warm start that prefetches first, a warm one,
    /// and the sandbox the container cap evicts destroyed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real_gpu_sandboxes_run_under_the_scheduler() {
        if !gpu_tests::usable() {
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::Builder::new()
            .prefix("hgx")
            .tempdir_in("/tmp")
            .unwrap();
        let (shim, mock) = gpu_tests::build(&tmp.path().join("b"));
        let dev = tmp.path().join("dev");
        std::fs::create_dir(&dev).unwrap();
        for (name, target) in [
            ("nvidiactl", "/dev/null"),
            ("nvidia-uvm", "/dev/zero"),
            ("nvidia0", "/dev/zero"),
        ] {
            std::os::unix::fs::symlink(target, dev.join(name)).unwrap();
        }
        let code = tmp.path().join("code");
        std::fs::create_dir(&code).unwrap();
        std::fs::write(code.join("main.py"), HANDLER).unwrap();
        for p in [tmp.path(), &code] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let data = tmp.path().join("d");
        let worker = format!("gx{}", std::process::id());
        let runc = RuncBackend::new(RuncConfig::default(), &data, &worker, 1 << 20, false)
            .await
            .unwrap();
        runc.preset_gpu_files(DriverFiles {
            libraries: vec![("libcuda.so.1".to_string(), mock)],
            shim,
            dev_dir: dev,
            proc_gpus: tmp.path().join("no-proc"),
        });
        let reg_dir = tmp.path().join("r");
        std::fs::create_dir(&reg_dir).unwrap();
        let registry = Arc::new(Registry::open(&reg_dir).unwrap());
        let driver = Driver::start(
            engine_config(),
            Backend::Runc(runc),
            registry,
            Arc::new(Metrics::default()),
            LoadSampling::None,
            None,
            None,
        );
        let gpu = GpuInfo {
            index: 0,
            name: "mock".into(),
            uuid: "GPU-mock".into(),
            memory_mb: 1024,
        };
        let mut settings = GpuSettings::default();
        settings.scheduler.containers_per_gpu = 1;
        settings.scheduler.dynamic_d = false;
        settings.scheduler.d = 1;
        settings.scheduler.d_max = 1;
        let exec = GpuExecutor::real(
            std::slice::from_ref(&gpu),
            &settings,
            Arc::clone(&driver),
            None,
        )
        .unwrap();
        let reg = |name: &str| {
            let mut spec = FunctionSpec::new(name);
            spec.memory_mb = 256;
            spec.device = hearth_api::Device::Gpu;
            spec.gpu_memory_mb = 64;
            spec.version = 1;
            Registered {
                spec: Arc::new(spec),
                code_dir: Some(code.clone()),
                state: hearth_service::registry::FunctionState::Ready,
                build_log: None,
            }
        };
        let (f, g) = (reg("f"), reg("g"));
        // Run in a task so that a failed assertion still removes the sandboxes below.
        let outcome = tokio::spawn(async move {
            check_real_path(&exec, &f, &g, &data, &worker).await;
        })
        .await;
        driver.backend().cleanup_all().await;
        if let Err(e) = outcome {
            std::panic::resume_unwind(e.into_panic());
        }
    }

    async fn check_real_path(
        exec: &GpuExecutor,
        f: &Registered,
        g: &Registered,
        data: &Path,
        worker: &str,
    ) {
        let mib: &[u8] = br#"{"bytes": 3145728}"#;

        let first = exec.run(f, mib).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(first.placed.start, Start::Cold);
        let reply = first.reply.as_ref().unwrap();
        let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(body["alloc"], 0, "{body}");
        assert_eq!(reply.device_memory_bytes, Some(3 << 20));
        let st = exec.status();
        assert_eq!(st.counters.dispatched_cold, 1);
        assert_eq!(
            st.gpus[0].containers, 1,
            "seen once, f's flow expires and its memory is swapped out: {st:?}"
        );
        assert_eq!(st.counters.swaps, 1, "{st:?}");
        let f_container = first.placed.container;
        assert!(container_exists(data, worker, f_container));

        // Host-warm: prefetched, then run in the same sandbox, whose memory keeps growing.
        let second = exec.run(f, mib).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(second.placed.start, Start::HostWarm);
        assert_eq!(second.placed.container, f_container);
        assert_eq!(
            second.reply.as_ref().unwrap().device_memory_bytes,
            Some(6 << 20)
        );
        // Seen twice, f's flow now stays active: warm, on the device.
        let third = exec.run(f, mib).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(third.placed.start, Start::Warm, "{:?}", exec.status());
        assert_eq!(exec.status().gpus[0].memory_resident_mb, 9);

        // g needs the only container slot: f's sandbox is destroyed in the background.
        let other = exec.run(g, mib).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(other.placed.start, Start::Cold);
        let deadline = Instant::now() + Duration::from_secs(20);
        while container_exists(data, worker, f_container) {
            assert!(
                Instant::now() < deadline,
                "f's evicted sandbox is still there"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(container_exists(data, worker, other.placed.container));
    }

    #[test]
    fn faults_are_read_only_from_their_key_and_bounded() {
        assert_eq!(SimFault::parse(b"{}"), SimFault::default());
        assert_eq!(
            SimFault::parse(br#"{"crash":true}"#),
            SimFault::default(),
            "a handler's own argument is not a fault"
        );
        assert!(SimFault::parse(br#"{"hearth_sim_gpu":{"crash":true}}"#).crash);
        assert_eq!(
            SimFault::parse(br#"{"hearth_sim_gpu":{"leak_mb":99999999999}}"#).leak_mb,
            MAX_SIM_LEAK_MB
        );
        assert_eq!(
            SimFault::parse(br#"{"hearth_sim_gpu": not json"#),
            SimFault::default()
        );
    }
}
