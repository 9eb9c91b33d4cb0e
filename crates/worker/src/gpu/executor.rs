//! Runs the worker's GPU invocations (`device: gpu`, and `any` functions the CPU/GPU dispatch
//! sends to a GPU) under the core's [`GpuScheduler`] (MQFQ-Sticky, FCFS or Batch, thesis ch. 6):
//! the scheduler decides order, device, container and how it starts; this module feeds it the
//! clock, arrivals, completions and 200 ms utilization samples, and carries the decisions out.
//!
//! On simulated GPUs (`[gpu] devices = "sim"`) a GPU container is bookkeeping and an invocation
//! sleeps for what [`SimGpuModel`] says: the function's `sim_gpu_warm_ms` stretched by the
//! invocations sharing the device when it starts, plus the container's start (`Cold`:
//! `sim_gpu_cold_ms`, or the model's GPU initialization when that is 0) or the prefetch of its
//! memory (`HostWarm`). Prefetches and swaps the scheduler orders for idle containers are
//! asynchronous in the real system (`cuMemPrefetchAsync`) and cost a simulated run nothing.
//!
//! Faults can be injected on simulated GPUs only, through the arguments, to exercise what a
//! real GPU function can do to its sandbox: `{"hearth_sim_gpu": {"crash": true}}` loses the
//! CUDA context (the invocation fails, the container is discarded) and
//! `{"hearth_sim_gpu": {"leak_mb": N}}` leaves N more MiB allocated in the container (reported as
//! the shim would; past the device's memory the allocation fails and the container goes).

use super::GpuSettings;
use crate::backend::sim::SimClock;
use hearth_api::{FunctionSpec, GpuInfo};
use hearth_core::gpu::{
    ContainerId, CpuGpuDispatch, Device, GpuAction, GpuCompletion, GpuInvocationId, GpuReject,
    GpuSchedConfig, GpuScheduler, GpuSpec, GpuStatus, SimGpuModel, Start,
};
use hearth_core::Micros;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The result of a simulated GPU invocation (the `sim` backend's, for CPU runs, is the same).
pub const SIM_GPU_RESULT: &[u8] = b"{\"simulated\":true}";

/// How often device utilization is sampled and fed back to D (§6.3.4: 200 ms). Flow TTLs
/// expire on the same tick.
pub const UTILIZATION_PERIOD: Duration = Duration::from_millis(200);

/// Where an invocation runs and how it starts, as the scheduler placed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub invocation: GpuInvocationId,
    pub gpu: usize,
    pub container: ContainerId,
    pub start: Start,
    pub queued_us: Micros,
    pub memory_mb: u64,
    /// Memory moved on the critical path (the scheduler's memory policy).
    pub paging: hearth_core::gpu::GpuPaging,
}

/// A GPU invocation that ran.
#[derive(Debug, Clone, Copy)]
pub struct GpuRun {
    pub placed: Placed,
    /// Container start (cold) or memory prefetch (host-warm), µs.
    pub setup_us: Micros,
    pub exec_us: Micros,
}

/// Why a GPU invocation did not run to the end.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GpuRunError {
    #[error("{0}")]
    Rejected(GpuReject),
    /// The sandbox broke (CUDA context lost, device memory exhausted): it was discarded, the
    /// device and its other sandboxes carry on.
    #[error("{0}")]
    Failed(String),
    #[error("the invocation did not finish within its timeout of {timeout_ms} ms; its GPU sandbox was discarded")]
    Timeout { timeout_ms: u64 },
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
    waiters: HashMap<GpuInvocationId, oneshot::Sender<Result<Placed, GpuReject>>>,
    /// Invocations running on each device: the simulated device's interference and utilization.
    running: Vec<u32>,
    containers: HashMap<ContainerId, SimContainer>,
    /// Device memory of each GPU (MiB), for the simulated allocation failure.
    memory_mb: Vec<u64>,
    dispatch: CpuGpuDispatch,
}

impl Inner {
    /// Carries out the scheduler's actions: placements go to their waiters (or straight back
    /// if the caller is gone), rejections likewise; memory moves are bookkeeping here.
    fn drain(&mut self, now: Micros) -> Option<Placed> {
        let mut mine = None;
        while let Some(action) = self.sched.poll_action() {
            match action {
                GpuAction::Dispatch {
                    invocation,
                    gpu,
                    container,
                    start,
                    queued_us,
                    memory_mb,
                    paging,
                    ..
                } => {
                    let placed = Placed {
                        invocation,
                        gpu,
                        container,
                        start,
                        queued_us,
                        memory_mb,
                        paging,
                    };
                    self.running[gpu] += 1;
                    self.containers.entry(container).or_default();
                    match self.waiters.remove(&invocation) {
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
                }
                GpuAction::Prefetch { .. } | GpuAction::Swap { .. } => {}
            }
        }
        mine
    }

    /// Hands back a placement whose invocation never ran (its caller left).
    fn unrun(&mut self, now: Micros, p: Placed) {
        self.running[p.gpu] = self.running[p.gpu].saturating_sub(1);
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
    /// Sleeps of simulated runs: tokio's timer would add up to a millisecond to each.
    clock: SimClock,
    epoch: Instant,
    model: SimGpuModel,
    solo_util: f64,
}

/// A queued invocation's place in line: dropped before it runs, it leaves the queue (or hands
/// back the placement that raced with the drop).
struct Waiting<'a> {
    exec: &'a GpuExecutor,
    id: GpuInvocationId,
    rx: Option<oneshot::Receiver<Result<Placed, GpuReject>>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        let now = self.exec.now();
        let mut inner = self.exec.inner.lock();
        // Placements are sent under this lock: either it came already, or it is still queued.
        match rx.try_recv() {
            Ok(Ok(p)) => inner.unrun(now, p),
            Ok(Err(_)) => {}
            Err(_) => {
                inner.waiters.remove(&self.id);
                inner.sched.on_cancel(now, self.id);
            }
        }
        let _ = inner.drain(now);
    }
}

/// A running invocation: ended exactly once, as completed or failed, even if its caller leaves
/// mid-run (the sandbox is then treated as lost).
struct Running<'a> {
    exec: &'a GpuExecutor,
    placed: Placed,
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
            // The caller left mid-run: the simulated run stops with it, the sandbox is kept.
            let kept = GpuCompletion {
                exec_us: None,
                reusable: true,
                device_memory_mb: None,
            };
            self.exec.end(self.placed, Some(kept));
        }
    }
}

impl GpuExecutor {
    /// An executor over `gpus` with the scheduler, dispatch and device model of `settings`.
    pub fn new(gpus: &[GpuInfo], settings: &GpuSettings) -> Result<Arc<Self>, String> {
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
                running: vec![0; gpus.len()],
                containers: HashMap::new(),
                memory_mb: gpus.iter().map(|g| g.memory_mb).collect(),
                dispatch,
            }),
            clock: SimClock::start(),
            epoch: Instant::now(),
            model: settings.sim_model,
            solo_util: settings.sim_solo_util,
        }))
    }

    fn now(&self) -> Micros {
        self.epoch.elapsed().as_micros() as Micros
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
                exec.sample();
            }
        });
    }

    /// One utilization sample per device (the simulated device: the running invocations'
    /// solo shares, at most 1), then the TTL timers.
    fn sample(&self) {
        let now = self.now();
        let mut inner = self.inner.lock();
        for gpu in 0..inner.running.len() {
            let shares = vec![self.solo_util; inner.running[gpu] as usize];
            let util = self.model.utilization(&shares);
            if let Err(e) = inner.sched.on_utilization(now, gpu, util) {
                tracing::warn!(error = %e, gpu, "GPU utilization sample refused");
            }
        }
        inner.sched.on_timeout(now);
        let _ = inner.drain(now);
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

    /// Rejects what is queued and every later GPU invocation; running ones finish.
    pub fn shutdown(&self) {
        let now = self.now();
        let mut inner = self.inner.lock();
        inner.sched.shutdown();
        let _ = inner.drain(now);
    }

    /// Queues `spec`'s invocation, waits for its turn, and runs it on its simulated device.
    pub async fn run(&self, spec: &FunctionSpec, args: &[u8]) -> Result<GpuRun, GpuRunError> {
        let placed = self.place(spec).await?;
        let running = Running {
            exec: self,
            placed,
            done: false,
        };
        let fault = SimFault::parse(args);
        let (setup_us, exec_us, concurrent) = {
            let inner = self.inner.lock();
            let setup_us = match placed.start {
                Start::Warm | Start::HostWarm => 0,
                Start::Cold if spec.sim_gpu_cold_ms > 0.0 => ms_to_us(spec.sim_gpu_cold_ms),
                Start::Cold => self.model.gpu_init_us,
            }
            .saturating_add(self.model.paging_us(&placed.paging));
            let concurrent = inner.running[placed.gpu];
            let exec_us = self
                .model
                .exec_us(ms_to_us(spec.sim_gpu_warm_ms), concurrent);
            (setup_us, exec_us, concurrent)
        };
        let timeout = Duration::from_millis(spec.timeout_ms);
        let total = Duration::from_micros(setup_us.saturating_add(exec_us));
        if total > timeout {
            self.clock.sleep(timeout).await;
            running.end(None);
            return Err(GpuRunError::Timeout {
                timeout_ms: spec.timeout_ms,
            });
        }
        self.clock.sleep(total).await;
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
            let capacity = inner.memory_mb[placed.gpu];
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
                tracing::trace!(concurrent, "GPU invocation ran");
                Ok(GpuRun {
                    placed,
                    setup_us,
                    exec_us,
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

    /// Queues the invocation and waits until the scheduler places it.
    async fn place(&self, spec: &FunctionSpec) -> Result<Placed, GpuRunError> {
        let now = self.now();
        let (id, rx) = {
            let mut inner = self.inner.lock();
            let id = inner
                .sched
                .on_arrival(
                    now,
                    hearth_core::gpu::GpuArrival {
                        function: &spec.name,
                        weight: 1.0,
                        gpu_memory_mb: spec.gpu_memory_mb,
                    },
                )
                .map_err(GpuRunError::Rejected)?;
            if let Some(p) = inner.drain(now).filter(|p| p.invocation == id) {
                return Ok(p);
            }
            let (tx, rx) = oneshot::channel();
            inner.waiters.insert(id, tx);
            (id, rx)
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
    fn end(&self, placed: Placed, completion: Option<GpuCompletion>) {
        let now = self.now();
        let mut inner = self.inner.lock();
        inner.running[placed.gpu] = inner.running[placed.gpu].saturating_sub(1);
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
        let _ = inner.drain(now);
    }
}

fn ms_to_us(ms: f64) -> Micros {
    (ms.max(0.0) * 1000.0) as Micros
}

#[cfg(test)]
mod tests {
    use super::*;

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
